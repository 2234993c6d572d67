//! Durable landing of a part file: opening it with its journal ([`open_part`]) and the
//! receiver's checkpoints ([`Progress`], [`SharedProgress`]), which fsync the part before
//! the journal records it ([`crate::writeback`] runs them off the receiving thread). A
//! single stream's checkpoints come when its writer's staging ring asks for them
//! ([`crate::writer`]); a parallel transfer's streams share one cadence here.

use std::fs::File;
use std::time::{Duration, Instant};

use crate::journal::{journal_name, Ident, Journal, RangeSet};
use crate::ring::Cadence;

/// A receiver checkpoints at least this often (bytes written from good blocks) in a file
/// up to [`CHECKPOINTS_PER_FILE`] times this size...
pub const CHECKPOINT_BYTES: u64 = 8 << 20;
/// ...in a larger file after each this share of it ([`checkpoint_bytes`]), up to
/// [`MAX_CHECKPOINT_BYTES`]...
pub const CHECKPOINTS_PER_FILE: u64 = 32;
/// ...(the most bytes between two checkpoints)...
pub const MAX_CHECKPOINT_BYTES: u64 = 256 << 20;
/// ...or this often (time), whichever comes first: a killed receiver loses at most that.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// Bytes between a receiver's checkpoints of a file of `size` bytes: a checkpoint fsyncs
/// the part, and one every 8 MiB of a 4 GiB file (512 of them) kept a disk writing in small
/// flushes; a kill loses at most a thirty-second of the file (and at most
/// [`CHECKPOINT_EVERY`] of time).
pub fn checkpoint_bytes(size: u64) -> u64 {
    (size / CHECKPOINTS_PER_FILE).clamp(CHECKPOINT_BYTES, MAX_CHECKPOINT_BYTES)
}

/// How [`open_part`] wants a file opened (read-write, never following a symlink).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenHow {
    /// Only if it exists, as it is.
    Existing,
    /// Created if missing, emptied.
    Truncate,
    /// Created; an error if it exists.
    New,
}

/// What [`open_part`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// A journaled part of the same source: the transfer continues at its verified prefix.
    Resumed,
    /// Nothing usable to resume (or resume not asked): a new, empty part.
    Fresh,
    /// A journaled part of another source (size or mtime differ): started over.
    Restarted,
}

/// Opens the part file `part` and its journal for a transfer of `ident` through `open`
/// (which resolves a name next to the destination). With `resume`, a part whose journal is
/// valid, names the same source and whose file holds at least the journaled prefix is
/// continued; otherwise both start empty (the journal first, so it never vouches for the
/// old bytes).
pub fn open_part(
    open: &dyn Fn(&str, OpenHow) -> std::io::Result<File>,
    part: &str,
    ident: Ident,
    block: u32,
    resume: bool,
) -> std::io::Result<(File, Progress, Found)> {
    let jname = journal_name(part);
    let mut found = Found::Fresh;
    if resume {
        if let Some(j) = open(&jname, OpenHow::Existing).ok().and_then(Journal::load) {
            if j.ident() != ident {
                found = Found::Restarted;
            } else if let Ok(f) = open(part, OpenHow::Existing) {
                if f.metadata()?.len() >= j.ranges().end() {
                    return Ok((f, Progress::new(j), Found::Resumed));
                }
            }
        }
    }
    let journal = Journal::create(open(&jname, OpenHow::Truncate)?, ident, block)?;
    let f = open(part, OpenHow::Truncate)?;
    Ok((f, Progress::new(journal), found))
}

/// What of a part file is verified (journaled or not yet) and its journal, which the
/// receiver's checkpoints bring up to date. *When* to checkpoint is not decided here: a
/// writer's staging ring asks ([`crate::ring::LandRing`], an `Fsync` at its
/// [`Cadence`]), or the streams of a parallel transfer together ([`SharedProgress`]).
/// Checkpoints while data flows run on a thread of their own
/// ([`Progress::checkpoint_in_background`]); the final one ([`Progress::checkpoint`]) waits
/// for them and runs on the caller's.
#[derive(Debug)]
pub struct Progress {
    /// `None` while the checkpoint thread holds it.
    journal: Option<Journal>,
    /// The journal's block size.
    block: u32,
    background: Option<crate::writeback::Checkpointer>,
    good: RangeSet,
}

fn journal_lost() -> std::io::Error {
    std::io::Error::other("the resume journal was lost with its checkpoint thread")
}

impl Progress {
    /// Tracks a part whose journaled ranges are already good.
    pub fn new(journal: Journal) -> Progress {
        Progress {
            good: journal.ranges().clone(),
            block: journal.block(),
            journal: Some(journal),
            background: None,
        }
    }

    /// A block `[offset, offset + len)` was written and verified: the bytes of it not
    /// verified before.
    pub fn good(&mut self, offset: u64, len: u64) -> u64 {
        let before = self.good.total();
        self.good.insert(offset, offset.saturating_add(len));
        self.good.total().saturating_sub(before)
    }

    /// fsyncs the part file, then records the verified ranges in the journal, on this
    /// thread, after the background checkpoints asked for (reporting their first error).
    pub fn checkpoint(&mut self, part: &File) -> std::io::Result<()> {
        self.settle()?;
        let journal = self.journal.as_mut().ok_or_else(journal_lost)?;
        if self.good != *journal.ranges() {
            part.sync_data()?;
            journal.record(&self.good)?;
        }
        Ok(())
    }

    /// Asks the checkpoint thread (started on first use) to fsync the part file and record
    /// the verified ranges, without waiting for it; it waits only for the previous
    /// checkpoint, if that is still running. Returns the thread's first error, if any.
    pub fn checkpoint_in_background(&mut self, part: &File) -> std::io::Result<()> {
        if self.background.is_none() {
            let journal = self.journal.take().ok_or_else(journal_lost)?;
            self.background = Some(crate::writeback::Checkpointer::start(part, journal)?);
        }
        if let Some(bg) = &mut self.background {
            bg.request(self.good.clone())?;
        }
        Ok(())
    }

    /// Waits for the background checkpoints asked for and stops their thread; its first
    /// error, if it met one (an fsync error must reach the transfer: the fsync before the
    /// rename shares the open file and would not report it again).
    pub fn settle(&mut self) -> std::io::Result<()> {
        match self.background.take() {
            Some(bg) => {
                let (journal, res) = bg.stop();
                self.journal = journal;
                res
            }
            None => Ok(()),
        }
    }

    /// The block size the journal was made for (its ranges are whole blocks of it, but for
    /// the file's last).
    pub fn block(&self) -> u32 {
        self.block
    }

    /// The size of the file being received (as its journal names it; 0 if the journal is
    /// with its checkpoint thread).
    pub fn size(&self) -> u64 {
        self.journal.as_ref().map_or(0, |j| j.ident().size)
    }

    /// The verified prefix (journaled or not yet).
    pub fn prefix(&self) -> u64 {
        self.good.prefix()
    }

    /// Every verified range (journaled or not yet).
    pub fn ranges(&self) -> &RangeSet {
        &self.good
    }

    /// The prefix the journal holds.
    pub fn journaled(&self) -> u64 {
        match (&self.background, &self.journal) {
            (Some(bg), _) => bg.journaled(),
            (None, Some(j)) => j.done(),
            (None, None) => 0,
        }
    }
}

/// The journal of a part file that several writers fill at once (the streams of a parallel
/// transfer, `ferry cp -p N`). Each stream's sink reports every block as soon as it has
/// written it ([`SharedProgress::good`]), and checkpoints follow the bytes of all streams
/// together, exactly as with one stream: a kill loses what one stream would (two intervals)
/// plus at most the block each other stream was writing, whatever the chunk size. (Reporting
/// only whole chunks, as before, lost every chunk in flight: up to 132 MiB with `-p 4`.)
///
/// This is the one cadence of a file several streams fill: each stream's writer ring has
/// none of its own (its sink keeps no journal, [`Cadence::never`]), since a ring sees only
/// its stream's bytes.
#[derive(Debug)]
pub struct SharedProgress {
    /// A handle on the part for the checkpoints' fsync.
    part: File,
    /// `None` once the part is committed, discarded or let go: later reports are ignored.
    progress: std::sync::Mutex<Option<Journaling>>,
}

/// A shared part's progress and when its next checkpoint is due: bytes newly verified by
/// any stream, against [`checkpoint_bytes`] and [`CHECKPOINT_EVERY`].
#[derive(Debug)]
struct Journaling {
    progress: Progress,
    cadence: Cadence,
}

impl SharedProgress {
    /// Shares `progress`, the journal of `part` (a duplicate handle is kept).
    pub fn new(part: &File, progress: Progress) -> std::io::Result<SharedProgress> {
        let every = checkpoint_bytes(progress.size());
        Ok(SharedProgress {
            part: part.try_clone()?,
            progress: std::sync::Mutex::new(Some(Journaling {
                progress,
                cadence: Cadence::new(every, CHECKPOINT_EVERY, Instant::now()),
            })),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Journaling>> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `[offset, offset + len)` was written from a good block; checkpoints (in the
    /// background) when due. Handing a checkpoint over waits for the previous one, and the
    /// other streams wait for this lock meanwhile: a disk slower than the network paces
    /// them all. `Err`: a checkpoint failed (the transfer must fail).
    pub fn good(&self, offset: u64, len: u64) -> std::io::Result<()> {
        let mut g = self.lock();
        let Some(j) = g.as_mut() else {
            return Ok(());
        };
        j.cadence.wrote(j.progress.good(offset, len));
        let now = Instant::now();
        if j.cadence.due(now) {
            j.progress.checkpoint_in_background(&self.part)?;
            j.cadence.synced(j.cadence.unsynced(), now);
        }
        Ok(())
    }

    /// Records everything verified so far (after the background checkpoints), on this
    /// thread: a transfer that stops keeps its part for a resume.
    pub fn checkpoint(&self) -> std::io::Result<()> {
        match self.lock().as_mut() {
            Some(j) => j.progress.checkpoint(&self.part),
            None => Ok(()),
        }
    }

    /// The last checkpoint ([`SharedProgress::checkpoint`]), after which the journal is
    /// never written again (the part is let go; a new transfer may take it over).
    pub fn finish(&self) -> std::io::Result<()> {
        let mut g = self.lock();
        let res = match g.as_mut() {
            Some(j) => j.progress.checkpoint(&self.part),
            None => Ok(()),
        };
        *g = None;
        res
    }

    /// Stops journaling without a checkpoint (the part is being committed or discarded):
    /// waits for a background checkpoint in flight, so none lands after.
    pub fn close(&self) {
        if let Some(mut j) = self.lock().take() {
            let _ = j.progress.settle();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::journal::tests::{open, set, tmp};

    #[test]
    fn checkpoints_scale_with_the_file() {
        assert_eq!(checkpoint_bytes(0), CHECKPOINT_BYTES);
        assert_eq!(checkpoint_bytes(100 << 20), CHECKPOINT_BYTES);
        assert_eq!(checkpoint_bytes(4 << 30), 128 << 20);
        assert_eq!(checkpoint_bytes(1 << 40), MAX_CHECKPOINT_BYTES);
        let p = tmp("scale");
        let ident = Ident {
            size: 4 << 30,
            mtime: 0,
        };
        let j = Journal::create(open(&p), ident, 4 << 20).unwrap();
        assert_eq!(Progress::new(j).size(), 4 << 30);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn prefix_waits_for_holes() {
        let p = tmp("prefix");
        let j = Journal::create(open(&p), Ident { size: 40, mtime: 0 }, 10).unwrap();
        let mut pr = Progress::new(j);
        pr.good(0, 10);
        pr.good(20, 10);
        pr.good(30, 10);
        assert_eq!(pr.prefix(), 10, "the hole at 10 stops the prefix");
        let part = open(&tmp("prefix-part"));
        pr.checkpoint(&part).unwrap();
        assert_eq!(
            Journal::load(open(&p)).unwrap().ranges(),
            &set(&[(0, 10), (20, 40)])
        );
        pr.good(10, 10);
        assert_eq!(pr.prefix(), 40);
        pr.checkpoint(&part).unwrap();
        assert_eq!(Journal::load(open(&p)).unwrap().done(), 40);
        let _ = std::fs::remove_file(&p);
        let _ = std::fs::remove_file(tmp("prefix-part"));
    }

    #[test]
    fn background_checkpoints_record_what_was_handed_over() {
        let p = tmp("bg");
        let part_path = tmp("bg-part");
        let part = open(&part_path);
        let size = 3 * CHECKPOINT_BYTES;
        let j = Journal::create(open(&p), Ident { size, mtime: 1 }, 10).unwrap();
        let mut pr = Progress::new(j);
        assert_eq!(pr.good(0, CHECKPOINT_BYTES), CHECKPOINT_BYTES);
        assert_eq!(pr.good(0, 10), 0, "verified again: nothing new");
        pr.checkpoint_in_background(&part).unwrap();
        pr.good(CHECKPOINT_BYTES, CHECKPOINT_BYTES);
        pr.checkpoint_in_background(&part).unwrap();
        // Handing the second over waited for the first; settling waits for the second.
        pr.settle().unwrap();
        let done = Journal::load(open(&p)).unwrap().done();
        assert_eq!(done, 2 * CHECKPOINT_BYTES);
        assert_eq!(pr.journaled(), done);
        // The final checkpoint runs here and records everything verified.
        pr.good(2 * CHECKPOINT_BYTES, 5);
        pr.checkpoint(&part).unwrap();
        assert_eq!(
            Journal::load(open(&p)).unwrap().done(),
            2 * CHECKPOINT_BYTES + 5
        );
        assert_eq!(pr.journaled(), 2 * CHECKPOINT_BYTES + 5);
        let _ = std::fs::remove_file(&p);
        let _ = std::fs::remove_file(&part_path);
    }
}
