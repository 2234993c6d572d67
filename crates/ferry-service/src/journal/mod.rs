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
//!
//! Layers: [`codec`] (the slot format) and [`ranges`] (the range set) are pure (no I/O, no
//! clocks, no threads); this module reads and writes the journal's file;
//! [`crate::landing`] opens part files with their journals and checkpoints them.

pub mod codec;
pub mod ranges;

use std::fs::File;
use std::os::unix::fs::FileExt;

use codec::{encode, SLOT};
pub use codec::{journal_name, Ident, MAX_RANGES};
pub use ranges::RangeSet;

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
        let best = codec::best_slot(&b[..n])?;
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

#[cfg(test)]
pub(crate) mod tests {
    use super::codec::{HEAD, MAGIC_V1, SLOT_V1};
    use super::*;

    /// A fresh path in the temporary directory for the test named `tag`.
    pub(crate) fn tmp(tag: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("ferry-journal-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    /// Opens (creating) `p` for reading and writing, keeping its contents.
    pub(crate) fn open(p: &std::path::Path) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(p)
            .unwrap()
    }

    /// The range set of `r`.
    pub(crate) fn set(r: &[(u64, u64)]) -> RangeSet {
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
}
