//! Resume journals: which ranges of a `.<name>.ferry-part` file are known good.
//!
//! Next to every part file the receiving side (the client for downloads, the server for
//! uploads) keeps `.<name>.ferry-part.journal`: the identity of the source (size and
//! modification time) and a set of byte ranges of the part file that were written from
//! blocks whose CRC-32C matched and then fsynced. The order is always: write the data,
//! `fdatasync` the part file, then record the new ranges and `fdatasync` the journal, so the
//! journal never claims bytes that are not on disk. With one stream the set is a single
//! prefix; with parallel streams (`ferry cp -p N`) blocks land out of order and the set has
//! a few islands.
//!
//! The journal (format 2) is 2048 bytes: two 1024-byte slots written alternately, each with
//! a sequence number and its own CRC-32C. A torn write damages only the slot being written;
//! the reader takes the valid slot with the higher sequence number (the previous
//! checkpoint), and with no valid slot the part file is not trusted at all. Slot layout
//! (little-endian): `magic "FERRYJ02"`, `seq u64`, `size u64`, `mtime i64`, `block u32`,
//! `count u32`, `count` × (`start u64`, `end u64`) sorted, disjoint and not touching, each
//! `start < end <= size`; zero bytes up to the last 4, then `crc32c u32` of the 1020 bytes
//! before it. At most [`MAX_RANGES`] ranges are recorded: beyond that the last ones are left
//! out (the journal then vouches for less than was verified, never for more).
//!
//! Format 1 journals (`FERRYJ01`, two 64-byte slots holding one verified prefix `done`, as
//! ferry before parallel streams wrote them) are still read, as the range `[0, done)`.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

const MAGIC: &[u8; 8] = b"FERRYJ02";
const SLOT: usize = 1024;
const HEAD: usize = 48;
const MAGIC_V1: &[u8; 8] = b"FERRYJ01";
const SLOT_V1: usize = 64;
/// The most ranges a journal slot records.
pub const MAX_RANGES: usize = (SLOT - HEAD - 4) / 16;

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

/// A set of byte ranges `[start, end)`, kept sorted and coalesced (ranges that overlap or
/// touch are merged).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start → end.
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    /// An empty set.
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// Adds `[start, end)` (empty ranges are ignored), merging with its neighbours.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        // A range starting at or before `end` may overlap or touch; walk back from there.
        let touching: Vec<(u64, u64)> = self
            .map
            .range(..=end)
            .rev()
            .take_while(|(_, &re)| re >= start)
            .map(|(&a, &b)| (a, b))
            .collect();
        for (a, b) in touching {
            self.map.remove(&a);
            s = s.min(a);
            e = e.max(b);
        }
        self.map.insert(s, e);
    }

    /// Whether every byte of `[start, end)` is in the set.
    pub fn contains(&self, start: u64, end: u64) -> bool {
        start >= end
            || self
                .map
                .range(..=start)
                .next_back()
                .is_some_and(|(_, &e)| e >= end)
    }

    /// The end of the range that starts at 0 (0 if none does).
    pub fn prefix(&self) -> u64 {
        self.map.get(&0).copied().unwrap_or(0)
    }

    /// The end of the last range (0 if empty).
    pub fn end(&self) -> u64 {
        self.map.last_key_value().map_or(0, |(_, &e)| e)
    }

    /// Bytes in the set.
    pub fn total(&self) -> u64 {
        self.map.iter().map(|(s, e)| e - s).sum()
    }

    /// Number of ranges.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The ranges, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(&s, &e)| (s, e))
    }

    /// The ranges of `[0, size)` not in the set, in order.
    pub fn missing(&self, size: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut pos = 0;
        for (s, e) in self.iter() {
            if s >= size {
                break;
            }
            if s > pos {
                out.push((pos, s));
            }
            pos = pos.max(e);
        }
        if pos < size {
            out.push((pos, size));
        }
        out
    }

    /// The set limited to its first `n` ranges (what a journal slot can vouch for).
    pub fn first(&self, n: usize) -> RangeSet {
        RangeSet {
            map: self.map.iter().take(n).map(|(&s, &e)| (s, e)).collect(),
        }
    }
}

/// Opens (creating) a journal's file when its first record needs one.
pub type Opener = Box<dyn FnOnce() -> std::io::Result<File> + Send>;

/// A journal's file: open, or to be created by the first record.
enum JournalFile {
    Open(File),
    Later(Option<Opener>),
}

impl std::fmt::Debug for JournalFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JournalFile::Open(file) => file.fmt(f),
            JournalFile::Later(_) => f.write_str("not created yet"),
        }
    }
}

/// An open journal.
#[derive(Debug)]
pub struct Journal {
    file: JournalFile,
    seq: u64,
    ident: Ident,
    block: u32,
    done: RangeSet,
}

fn encode(seq: u64, ident: Ident, block: u32, done: &RangeSet) -> Vec<u8> {
    let mut s = vec![0u8; SLOT];
    s[..8].copy_from_slice(MAGIC);
    s[8..16].copy_from_slice(&seq.to_le_bytes());
    s[16..24].copy_from_slice(&ident.size.to_le_bytes());
    s[24..32].copy_from_slice(&ident.mtime.to_le_bytes());
    s[32..36].copy_from_slice(&block.to_le_bytes());
    let mut n = 0u32;
    for (i, (a, b)) in done.iter().take(MAX_RANGES).enumerate() {
        let at = HEAD + 16 * i;
        s[at..at + 8].copy_from_slice(&a.to_le_bytes());
        s[at + 8..at + 16].copy_from_slice(&b.to_le_bytes());
        n += 1;
    }
    s[36..40].copy_from_slice(&n.to_le_bytes());
    let crc = crc32c::crc32c(&s[..SLOT - 4]);
    s[SLOT - 4..].copy_from_slice(&crc.to_le_bytes());
    s
}

/// One valid slot's contents.
type Slot = (u64, Ident, u32, RangeSet);

fn u64_at(s: &[u8], i: usize) -> Option<u64> {
    s.get(i..i + 8)?.try_into().ok().map(u64::from_le_bytes)
}

fn u32_at(s: &[u8], i: usize) -> Option<u32> {
    s.get(i..i + 4)?.try_into().ok().map(u32::from_le_bytes)
}

/// A valid format-2 slot.
fn decode(s: &[u8]) -> Option<Slot> {
    if s.len() != SLOT || &s[..8] != MAGIC {
        return None;
    }
    if crc32c::crc32c(&s[..SLOT - 4]) != u32_at(s, SLOT - 4)? {
        return None;
    }
    let ident = Ident {
        size: u64_at(s, 16)?,
        mtime: u64_at(s, 24)? as i64,
    };
    let n = u32_at(s, 36)? as usize;
    if n > MAX_RANGES {
        return None;
    }
    let mut done = RangeSet::new();
    let mut last = None;
    for i in 0..n {
        let (a, b) = (u64_at(s, HEAD + 16 * i)?, u64_at(s, HEAD + 16 * i + 8)?);
        // Sorted, disjoint, not touching, inside the source: exactly what `encode` writes.
        if a >= b || b > ident.size || last.is_some_and(|l| a <= l) {
            return None;
        }
        last = Some(b);
        done.insert(a, b);
    }
    Some((u64_at(s, 8)?, ident, u32_at(s, 32)?, done))
}

/// A valid format-1 slot (one verified prefix).
fn decode_v1(s: &[u8]) -> Option<Slot> {
    if s.len() != SLOT_V1 || &s[..8] != MAGIC_V1 {
        return None;
    }
    if crc32c::crc32c(&s[..60]) != u32_at(s, 60)? {
        return None;
    }
    let ident = Ident {
        size: u64_at(s, 16)?,
        mtime: u64_at(s, 24)? as i64,
    };
    let done = u64_at(s, 40)?;
    if done > ident.size {
        return None;
    }
    let mut set = RangeSet::new();
    set.insert(0, done);
    Some((u64_at(s, 8)?, ident, u32_at(s, 32)?, set))
}

impl Journal {
    /// Starts a journal of `ident` with nothing done, replacing whatever `file` held. It
    /// stays empty (trusted for nothing, costing no fsync) until the first [`Journal::record`],
    /// so small files that never reach a checkpoint pay only its creation.
    pub fn create(file: File, ident: Ident, block: u32) -> std::io::Result<Journal> {
        file.set_len(0)?;
        Ok(Journal {
            file: JournalFile::Open(file),
            seq: 0,
            ident,
            block,
            done: RangeSet::new(),
        })
    }

    /// A journal of `ident` with nothing done whose file `open` creates (empty) at the first
    /// [`Journal::record`]: a part that never reaches a checkpoint (a file of one block)
    /// costs no journal file at all. The caller removes any stale journal of the part first.
    pub fn deferred(open: Opener, ident: Ident, block: u32) -> Journal {
        Journal {
            file: JournalFile::Later(Some(open)),
            seq: 0,
            ident,
            block,
            done: RangeSet::new(),
        }
    }

    /// Reads a journal (format 2, else format 1); `None` if no slot is valid.
    pub fn load(file: File) -> Option<Journal> {
        let mut b = vec![0u8; 2 * SLOT];
        let n = read_up_to(&file, &mut b).ok()?;
        let b = &b[..n];
        let best = b
            .chunks(SLOT)
            .filter_map(decode)
            .max_by_key(|s| s.0)
            .or_else(|| {
                b[..n.min(2 * SLOT_V1)]
                    .chunks(SLOT_V1)
                    .filter_map(decode_v1)
                    .max_by_key(|s| s.0)
            })?;
        let (seq, ident, block, done) = best;
        Some(Journal {
            file: JournalFile::Open(file),
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

    /// The verified, fsynced ranges.
    pub fn ranges(&self) -> &RangeSet {
        &self.done
    }

    /// Verified, fsynced prefix length.
    pub fn done(&self) -> u64 {
        self.done.prefix()
    }

    /// Records that `done` (clipped to the source's size, at most [`MAX_RANGES`] ranges) of
    /// the part file is good. The caller has fsynced those bytes already; this writes the
    /// next slot and fsyncs the journal.
    pub fn record(&mut self, done: &RangeSet) -> std::io::Result<()> {
        let mut kept = RangeSet::new();
        for (a, b) in done.first(MAX_RANGES).iter() {
            kept.insert(a.min(self.ident.size), b.min(self.ident.size));
        }
        let seq = self.seq + 1;
        let slot = encode(seq, self.ident, self.block, &kept);
        if let JournalFile::Later(open) = &mut self.file {
            let open = open
                .take()
                .ok_or_else(|| std::io::Error::other("the journal could not be created"))?;
            let file = open()?;
            file.set_len(0)?;
            self.file = JournalFile::Open(file);
        }
        let JournalFile::Open(file) = &self.file else {
            return Err(std::io::Error::other("the journal could not be created"));
        };
        file.write_all_at(&slot, (seq % 2) * SLOT as u64)?;
        file.sync_data()?;
        self.seq = seq;
        self.done = kept;
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

/// A receiver's view of its part file: the verified ranges (journaled or not yet) and when
/// to checkpoint next. Checkpoints while data flows run on a thread of their own
/// ([`Progress::checkpoint_in_background`]); the final one ([`Progress::checkpoint`]) waits
/// for them and runs on the caller's.
#[derive(Debug)]
pub struct Progress {
    /// `None` while the checkpoint thread holds it.
    journal: Option<Journal>,
    background: Option<crate::writeback::Checkpointer>,
    good: RangeSet,
    /// Bytes verified when the last checkpoint was asked for.
    requested: u64,
    last: Instant,
}

fn journal_lost() -> std::io::Error {
    std::io::Error::other("the resume journal was lost with its checkpoint thread")
}

impl Progress {
    /// Tracks a part whose journaled ranges are already good.
    pub fn new(journal: Journal) -> Progress {
        Progress {
            good: journal.ranges().clone(),
            requested: journal.ranges().total(),
            journal: Some(journal),
            background: None,
            last: Instant::now(),
        }
    }

    /// A block `[offset, offset + len)` was written and verified.
    pub fn good(&mut self, offset: u64, len: u64) {
        self.good.insert(offset, offset.saturating_add(len));
    }

    /// Whether enough arrived since the last checkpoint to take another.
    pub fn due(&self) -> bool {
        let now = self.good.total();
        now > self.requested
            && (now - self.requested >= CHECKPOINT_BYTES || self.last.elapsed() >= CHECKPOINT_EVERY)
    }

    /// fsyncs the part file, then records the verified ranges in the journal, on this
    /// thread, after the background checkpoints asked for (reporting their first error).
    pub fn checkpoint(&mut self, part: &File) -> std::io::Result<()> {
        self.last = Instant::now();
        self.settle()?;
        let journal = self.journal.as_mut().ok_or_else(journal_lost)?;
        if self.good == *journal.ranges() {
            return Ok(());
        }
        part.sync_data()?;
        journal.record(&self.good)?;
        self.requested = self.good.total();
        Ok(())
    }

    /// Asks the checkpoint thread (started on first use) to fsync the part file and record
    /// the verified ranges, without waiting for it; it waits only for the previous
    /// checkpoint, if that is still running. Returns the thread's first error, if any.
    pub fn checkpoint_in_background(&mut self, part: &File) -> std::io::Result<()> {
        self.last = Instant::now();
        if self.background.is_none() {
            let journal = self.journal.take().ok_or_else(journal_lost)?;
            self.background = Some(crate::writeback::Checkpointer::start(part, journal)?);
        }
        if let Some(bg) = &mut self.background {
            bg.request(self.good.clone())?;
            self.requested = self.good.total();
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
#[derive(Debug)]
pub struct SharedProgress {
    /// A handle on the part for the checkpoints' fsync.
    part: File,
    /// `None` once the part is committed, discarded or let go: later reports are ignored.
    progress: std::sync::Mutex<Option<Progress>>,
}

impl SharedProgress {
    /// Shares `progress`, the journal of `part` (a duplicate handle is kept).
    pub fn new(part: &File, progress: Progress) -> std::io::Result<SharedProgress> {
        Ok(SharedProgress {
            part: part.try_clone()?,
            progress: std::sync::Mutex::new(Some(progress)),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Progress>> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `[offset, offset + len)` was written from a good block; checkpoints (in the
    /// background) when due. Handing a checkpoint over waits for the previous one, and the
    /// other streams wait for this lock meanwhile: a disk slower than the network paces
    /// them all. `Err`: a checkpoint failed (the transfer must fail).
    pub fn good(&self, offset: u64, len: u64) -> std::io::Result<()> {
        let mut g = self.lock();
        let Some(p) = g.as_mut() else {
            return Ok(());
        };
        p.good(offset, len);
        if p.due() {
            p.checkpoint_in_background(&self.part)?;
        }
        Ok(())
    }

    /// Records everything verified so far (after the background checkpoints), on this
    /// thread: a transfer that stops keeps its part for a resume.
    pub fn checkpoint(&self) -> std::io::Result<()> {
        match self.lock().as_mut() {
            Some(p) => p.checkpoint(&self.part),
            None => Ok(()),
        }
    }

    /// The last checkpoint ([`SharedProgress::checkpoint`]), after which the journal is
    /// never written again (the part is let go; a new transfer may take it over).
    pub fn finish(&self) -> std::io::Result<()> {
        let mut g = self.lock();
        let res = match g.as_mut() {
            Some(p) => p.checkpoint(&self.part),
            None => Ok(()),
        };
        *g = None;
        res
    }

    /// Stops journaling without a checkpoint (the part is being committed or discarded):
    /// waits for a background checkpoint in flight, so none lands after.
    pub fn close(&self) {
        if let Some(mut p) = self.lock().take() {
            let _ = p.settle();
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

    fn set(r: &[(u64, u64)]) -> RangeSet {
        let mut s = RangeSet::new();
        for &(a, b) in r {
            s.insert(a, b);
        }
        s
    }

    #[test]
    fn a_deferred_journal_has_no_file_until_its_first_record() {
        let p = tmp("deferred");
        let id = Ident {
            size: 100,
            mtime: 3,
        };
        let later = p.clone();
        let mut j = Journal::deferred(Box::new(move || Ok(open(&later))), id, 4096);
        assert!(!p.exists(), "no file before a record");
        assert_eq!(j.done(), 0);
        j.record(&set(&[(0, 60)])).unwrap();
        let back = Journal::load(open(&p)).unwrap();
        assert_eq!((back.ident(), back.done()), (id, 60));
        j.record(&set(&[(0, 100)])).unwrap();
        assert_eq!(Journal::load(open(&p)).unwrap().done(), 100);
        // A journal whose file cannot be created fails its record, and stays failed.
        let mut bad = Journal::deferred(
            Box::new(|| Err(std::io::ErrorKind::PermissionDenied.into())),
            id,
            4096,
        );
        assert!(bad.record(&set(&[(0, 10)])).is_err());
        assert!(bad.record(&set(&[(0, 10)])).is_err());
        let _ = std::fs::remove_file(&p);
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
        j.record(&set(&[])).unwrap();
        j.record(&set(&[(0, 100), (500, 600)])).unwrap();
        j.record(&set(&[(0, 300), (500, 700)])).unwrap();
        let back = Journal::load(open(&p)).unwrap();
        assert_eq!((back.ident(), back.done(), back.block()), (id, 300, 4096));
        assert_eq!(back.ranges(), &set(&[(0, 300), (500, 700)]));
        // Tear the newest slot (seq 3 lives in slot 1): the previous checkpoint wins.
        open(&p)
            .write_all_at(&[0xAA; 10], SLOT as u64 + 50)
            .unwrap();
        let back = Journal::load(open(&p)).unwrap();
        assert_eq!(back.ranges(), &set(&[(0, 100), (500, 600)]));
        // Both torn: nothing is trusted.
        open(&p).write_all_at(&[0xAA; 10], 50).unwrap();
        assert!(Journal::load(open(&p)).is_none());
        // A claim past the source's size is never accepted, nor unsorted ranges.
        let mut slot = encode(9, id, 4096, &set(&[(0, 10)]));
        slot[HEAD + 8..HEAD + 16].copy_from_slice(&2000u64.to_le_bytes());
        let crc = crc32c::crc32c(&slot[..SLOT - 4]);
        slot[SLOT - 4..].copy_from_slice(&crc.to_le_bytes());
        open(&p).write_all_at(&slot, 0).unwrap();
        assert!(Journal::load(open(&p)).is_none());
        let mut slot = encode(9, id, 4096, &set(&[(0, 10), (20, 30)]));
        slot[HEAD + 16..HEAD + 24].copy_from_slice(&5u64.to_le_bytes());
        let crc = crc32c::crc32c(&slot[..SLOT - 4]);
        slot[SLOT - 4..].copy_from_slice(&crc.to_le_bytes());
        open(&p).write_all_at(&slot, 0).unwrap();
        assert!(Journal::load(open(&p)).is_none());
        let _ = std::fs::remove_file(&p);
    }

    /// A format-1 journal (as ferry before parallel streams wrote it) reads as its prefix,
    /// torn slots included, and the next record continues in format 2.
    #[test]
    fn old_format_still_reads() {
        let p = tmp("v1");
        let id = Ident {
            size: 900,
            mtime: 3,
        };
        let v1 = |seq: u64, done: u64| {
            let mut s = [0u8; SLOT_V1];
            s[..8].copy_from_slice(MAGIC_V1);
            s[8..16].copy_from_slice(&seq.to_le_bytes());
            s[16..24].copy_from_slice(&id.size.to_le_bytes());
            s[24..32].copy_from_slice(&id.mtime.to_le_bytes());
            s[32..36].copy_from_slice(&4096u32.to_le_bytes());
            s[40..48].copy_from_slice(&done.to_le_bytes());
            let crc = crc32c::crc32c(&s[..60]);
            s[60..].copy_from_slice(&crc.to_le_bytes());
            s
        };
        let f = open(&p);
        f.write_all_at(&v1(2, 200), 0).unwrap();
        f.write_all_at(&v1(3, 300), SLOT_V1 as u64).unwrap();
        let j = Journal::load(open(&p)).unwrap();
        assert_eq!((j.ident(), j.done(), j.block()), (id, 300, 4096));
        open(&p)
            .write_all_at(&[0xAA; 4], SLOT_V1 as u64 + 40)
            .unwrap();
        let mut j = Journal::load(open(&p)).unwrap();
        assert_eq!(j.done(), 200, "torn v1 slot falls back");
        j.record(&set(&[(0, 200), (400, 500)])).unwrap();
        let j = Journal::load(open(&p)).unwrap();
        assert_eq!(j.ranges(), &set(&[(0, 200), (400, 500)]));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn coalesces_and_bounds_ranges() {
        let mut s = set(&[(10, 20), (30, 40), (20, 30)]);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(10, 40)]);
        s.insert(0, 5);
        s.insert(5, 10);
        assert_eq!((s.prefix(), s.len(), s.total()), (40, 1, 40));
        assert_eq!(s.missing(50), vec![(40, 50)]);
        assert!(s.contains(3, 39) && !s.contains(39, 41));
        // More islands than a slot holds: the journal keeps the first ones only.
        let p = tmp("many");
        let size = 10 * MAX_RANGES as u64 + 100;
        let mut j = Journal::create(open(&p), Ident { size, mtime: 0 }, 10).unwrap();
        let many = set(&(0..MAX_RANGES as u64 + 5)
            .map(|i| (10 * i, 10 * i + 5))
            .collect::<Vec<_>>());
        j.record(&many).unwrap();
        let back = Journal::load(open(&p)).unwrap();
        assert_eq!(back.ranges(), &many.first(MAX_RANGES));
        assert_eq!(back.ranges().len(), MAX_RANGES);
        let _ = std::fs::remove_file(&p);
    }

    proptest::proptest! {
        /// Random insertions against a byte map: same bytes covered, ranges disjoint and
        /// not touching, `missing` the exact complement; and a journal round trip keeps it.
        #[test]
        fn range_set_matches_a_naive_model(
            ins in proptest::collection::vec((0u64..200, 0u64..40), 0..40)
        ) {
            let mut s = RangeSet::new();
            let mut model = [false; 240];
            for &(a, l) in &ins {
                s.insert(a, a + l);
                for b in &mut model[a as usize..(a + l) as usize] {
                    *b = true;
                }
            }
            let mut covered = [false; 240];
            let mut prev: Option<u64> = None;
            for (a, b) in s.iter() {
                proptest::prop_assert!(a < b);
                proptest::prop_assert!(prev.is_none_or(|p| p < a), "touching or overlapping");
                prev = Some(b);
                for c in &mut covered[a as usize..b as usize] {
                    *c = true;
                }
            }
            proptest::prop_assert_eq!(covered, model);
            for (a, b) in s.missing(240) {
                proptest::prop_assert!(model[a as usize..b as usize].iter().all(|c| !c));
            }
            let holes: u64 = s.missing(240).iter().map(|(a, b)| b - a).sum();
            proptest::prop_assert_eq!(holes + s.total(), 240);
            let p = tmp(&format!("prop-{}", ins.len()));
            let mut j = Journal::create(open(&p), Ident { size: 240, mtime: 1 }, 10).unwrap();
            j.record(&s).unwrap();
            let back = Journal::load(open(&p)).unwrap();
            proptest::prop_assert_eq!(back.ranges(), &s);
            let _ = std::fs::remove_file(&p);
        }
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
