//! Resume journals: what part of a `.<name>.ferry-part` file is known good.
//!
//! Next to every part file the receiving side (the client for downloads, the server for
//! uploads) keeps `.<name>.ferry-part.journal`: the identity of the source (size and
//! modification time) and `done`, the length of the prefix of the part file that was written
//! from blocks whose CRC-32C matched and then fsynced. The order is always: write the data,
//! `fdatasync` the part file, then record the new `done` and `fdatasync` the journal, so the
//! journal never claims bytes that are not on disk.
//!
//! The journal is 128 bytes: two 64-byte slots written alternately, each with a sequence
//! number and its own CRC-32C. A torn write damages only the slot being written; the reader
//! takes the valid slot with the higher sequence number (the previous checkpoint), and with
//! no valid slot the part file is not trusted at all. Slot layout (little-endian):
//! `magic "FERRYJ01"`, `seq u64`, `size u64`, `mtime i64`, `block u32`, 4 zero bytes,
//! `done u64`, 12 zero bytes, `crc32c u32` of the 60 bytes before it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

const MAGIC: &[u8; 8] = b"FERRYJ01";
const SLOT: usize = 64;

/// A receiver checkpoints at least this often (bytes of verified prefix)...
pub const CHECKPOINT_BYTES: u64 = 8 << 20;
/// ...or this often (time), whichever comes first: a killed receiver loses at most that.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// The journal's file name for a part file's name.
pub fn journal_name(part: &str) -> String {
    format!("{part}.journal")
}

/// Which source a part file holds bytes of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ident {
    /// The source's size.
    pub size: u64,
    /// The source's modification time (seconds for downloads, as STAT reports it;
    /// nanoseconds for uploads, as the client sends it; 0 when unknown).
    pub mtime: i64,
}

/// An open journal.
#[derive(Debug)]
pub struct Journal {
    file: File,
    seq: u64,
    ident: Ident,
    block: u32,
    done: u64,
}

fn encode(seq: u64, ident: Ident, block: u32, done: u64) -> [u8; SLOT] {
    let mut s = [0u8; SLOT];
    s[..8].copy_from_slice(MAGIC);
    s[8..16].copy_from_slice(&seq.to_le_bytes());
    s[16..24].copy_from_slice(&ident.size.to_le_bytes());
    s[24..32].copy_from_slice(&ident.mtime.to_le_bytes());
    s[32..36].copy_from_slice(&block.to_le_bytes());
    s[40..48].copy_from_slice(&done.to_le_bytes());
    let crc = crc32c::crc32c(&s[..60]);
    s[60..].copy_from_slice(&crc.to_le_bytes());
    s
}

/// (seq, ident, block, done) of a valid slot.
fn decode(s: &[u8]) -> Option<(u64, Ident, u32, u64)> {
    if s.len() != SLOT || &s[..8] != MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(s[60..64].try_into().ok()?);
    if crc32c::crc32c(&s[..60]) != crc {
        return None;
    }
    let u64_at = |i: usize| s[i..i + 8].try_into().ok().map(u64::from_le_bytes);
    let ident = Ident {
        size: u64_at(16)?,
        mtime: u64_at(24)? as i64,
    };
    let block = u32::from_le_bytes(s[32..36].try_into().ok()?);
    let done = u64_at(40)?;
    (done <= ident.size).then_some((u64_at(8)?, ident, block, done))
}

impl Journal {
    /// Starts a journal of `ident` with nothing done, replacing whatever `file` held. It
    /// stays empty (trusted for nothing, costing no fsync) until the first [`Journal::record`],
    /// so small files that never reach a checkpoint pay only its creation.
    pub fn create(file: File, ident: Ident, block: u32) -> std::io::Result<Journal> {
        file.set_len(0)?;
        Ok(Journal {
            file,
            seq: 0,
            ident,
            block,
            done: 0,
        })
    }

    /// Reads a journal; `None` if neither slot is valid.
    pub fn load(file: File) -> Option<Journal> {
        let mut b = [0u8; 2 * SLOT];
        let n = read_up_to(&file, &mut b).ok()?;
        let best = b[..n].chunks(SLOT).filter_map(decode).max_by_key(|s| s.0)?;
        let (seq, ident, block, done) = best;
        Some(Journal {
            file,
            seq,
            ident,
            block,
            done,
        })
    }

    /// The source this journal is about.
    pub fn ident(&self) -> Ident {
        self.ident
    }

    /// The block size the part was written with (informational).
    pub fn block(&self) -> u32 {
        self.block
    }

    /// Verified, fsynced prefix length.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// Records that the first `done` bytes of the part file are good. The caller has
    /// fsynced them already; this writes the next slot and fsyncs the journal.
    pub fn record(&mut self, done: u64) -> std::io::Result<()> {
        let seq = self.seq + 1;
        let slot = encode(seq, self.ident, self.block, done.min(self.ident.size));
        self.file.write_all_at(&slot, (seq % 2) * SLOT as u64)?;
        self.file.sync_data()?;
        self.seq = seq;
        self.done = done.min(self.ident.size);
        Ok(())
    }
}

/// How [`open_part`] wants a file opened (read-write, never following a symlink).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenHow {
    /// Only if it exists, as it is.
    Existing,
    /// Created if missing, emptied.
    Truncate,
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
                if f.metadata()?.len() >= j.done() {
                    return Ok((f, Progress::new(j), Found::Resumed));
                }
            }
        }
    }
    let journal = Journal::create(open(&jname, OpenHow::Truncate)?, ident, block)?;
    let f = open(part, OpenHow::Truncate)?;
    Ok((f, Progress::new(journal), found))
}

fn read_up_to(f: &File, b: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < b.len() {
        match f.read_at(&mut b[n..], n as u64)? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// A receiver's view of its part file: the verified contiguous prefix, blocks verified
/// beyond it (after a hole a bad block left), and when to checkpoint next. Checkpoints
/// while data flows run on a thread of their own ([`Progress::checkpoint_in_background`]);
/// the final one ([`Progress::checkpoint`]) waits for them and runs on the caller's.
#[derive(Debug)]
pub struct Progress {
    /// `None` while the checkpoint thread holds it.
    journal: Option<Journal>,
    background: Option<crate::writeback::Checkpointer>,
    /// The prefix last handed to a checkpoint.
    requested: u64,
    prefix: u64,
    ahead: std::collections::BTreeMap<u64, u64>,
    last: Instant,
}

fn journal_lost() -> std::io::Error {
    std::io::Error::other("the resume journal was lost with its checkpoint thread")
}

impl Progress {
    /// Tracks a part whose first `journal.done()` bytes are already good.
    pub fn new(journal: Journal) -> Progress {
        Progress {
            prefix: journal.done(),
            requested: journal.done(),
            journal: Some(journal),
            background: None,
            ahead: Default::default(),
            last: Instant::now(),
        }
    }

    /// A block `[offset, offset + len)` was written and verified.
    pub fn good(&mut self, offset: u64, len: u64) {
        if offset <= self.prefix {
            self.prefix = self.prefix.max(offset + len);
        } else {
            self.ahead.insert(offset, offset + len);
        }
        while let Some((&start, &end)) = self.ahead.first_key_value() {
            if start > self.prefix {
                break;
            }
            self.ahead.remove(&start);
            self.prefix = self.prefix.max(end);
        }
    }

    /// Whether enough arrived since the last checkpoint to take another.
    pub fn due(&self) -> bool {
        self.prefix > self.requested
            && (self.prefix - self.requested >= CHECKPOINT_BYTES
                || self.last.elapsed() >= CHECKPOINT_EVERY)
    }

    /// fsyncs the part file, then records the verified prefix in the journal, on this
    /// thread, after the background checkpoints asked for (reporting their first error).
    pub fn checkpoint(&mut self, part: &File) -> std::io::Result<()> {
        self.last = Instant::now();
        self.settle()?;
        let journal = self.journal.as_mut().ok_or_else(journal_lost)?;
        if self.prefix == journal.done() {
            return Ok(());
        }
        part.sync_data()?;
        journal.record(self.prefix)?;
        self.requested = self.prefix;
        Ok(())
    }

    /// Asks the checkpoint thread (started on first use) to fsync the part file and record
    /// the verified prefix, without waiting for it; it waits only for the previous
    /// checkpoint, if that is still running. Returns the thread's first error, if any.
    pub fn checkpoint_in_background(&mut self, part: &File) -> std::io::Result<()> {
        self.last = Instant::now();
        if self.background.is_none() {
            let journal = self.journal.take().ok_or_else(journal_lost)?;
            self.background = Some(crate::writeback::Checkpointer::start(part, journal)?);
        }
        if let Some(bg) = &mut self.background {
            bg.request(self.prefix)?;
            self.requested = self.prefix;
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

    /// The verified prefix (journaled or not yet).
    pub fn prefix(&self) -> u64 {
        self.prefix
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("ferry-journal-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    fn open(p: &std::path::Path) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(p)
            .unwrap()
    }

    #[test]
    fn records_survive_and_torn_slots_fall_back() {
        let p = tmp("torn");
        let id = Ident {
            size: 1000,
            mtime: 7,
        };
        let mut j = Journal::create(open(&p), id, 4096).unwrap();
        assert!(Journal::load(open(&p)).is_none(), "nothing recorded yet");
        j.record(0).unwrap();
        j.record(100).unwrap();
        j.record(300).unwrap();
        let back = Journal::load(open(&p)).unwrap();
        assert_eq!((back.ident(), back.done(), back.block()), (id, 300, 4096));
        // Tear the newest slot (seq 3 lives in slot 1): the previous checkpoint wins.
        open(&p)
            .write_all_at(&[0xAA; 10], SLOT as u64 + 40)
            .unwrap();
        assert_eq!(Journal::load(open(&p)).unwrap().done(), 100);
        // Both torn: nothing is trusted.
        open(&p).write_all_at(&[0xAA; 10], 40).unwrap();
        assert!(Journal::load(open(&p)).is_none());
        // A claim past the source's size is never accepted.
        let slot = encode(9, id, 4096, 2000);
        open(&p).write_all_at(&slot, 0).unwrap();
        assert!(Journal::load(open(&p)).is_none());
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
        pr.good(10, 10);
        assert_eq!(pr.prefix(), 40);
        let part = open(&tmp("prefix-part"));
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
        assert!(!pr.due(), "nothing verified yet");
        pr.good(0, CHECKPOINT_BYTES);
        assert!(pr.due(), "an interval verified");
        pr.checkpoint_in_background(&part).unwrap();
        assert!(!pr.due(), "handed over: not due again at once");
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
