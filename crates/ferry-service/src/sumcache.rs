//! The checksum cache: a file's whole BLAKE3 kept in an extended attribute
//! ([`XATTR`], `user.ferry.blake3`), so a server that sends or sums an unchanged file again
//! does not hash it again.
//!
//! The entry is keyed by what `fstat` says of the file: size, mtime (to the nanosecond),
//! inode and device. Read with a key that differs in any of them, it is ignored (and
//! rewritten once the file has been hashed again).
//!
//! **Formats.** Format 1 ([`MAGIC`], 80 bytes) holds only the root. Format 2 ([`MAGIC2`])
//! holds the root and, for one block size per kind of check, every block's check as a sender
//! computes it ([`Blocks`]: the CRC-32C of each block at data protection `clear`, 4 bytes a
//! block; the 32 bytes the `integrity` tag is keyed over otherwise; both kinds when the file
//! was sent at both levels and the attribute holds them): a server whose block size and
//! check match sends the file's blocks without reading them (`sendfile`-like, straight from
//! the page cache), taking each header's check from the entry. It is written when a server
//! sent the whole file in blocks of one size and hashed it (or had its root from a format 1
//! entry) in that pass, and bounded by [`MAX_ENTRY`] (Linux's limit on one attribute's
//! value: 2,000 blocks of hashes, 16,000 of CRCs; 8 or 64 GiB at 4 MiB blocks); a file
//! system that keeps less (ext4 about 4 KiB) gets format 1 instead. Both are read. The
//! per-block chaining values of the file's tree ([`crate::tree`]) are not kept: ranged
//! reads alone could use them.
//!
//! **What it cannot see.** ctime is not in the key (setting the attribute moves it), so
//! content rewritten with the same size and the mtime set back (`touch -d`, `utimes`)
//! keeps a stale entry: the sender then announces the old hash (and, from a format 2 entry,
//! the old blocks' checks, which the receiver's checks fail: it fetches those blocks again,
//! and a GET of one block is always read), and the receiver, which hashes what it got,
//! refuses the file (exit 4, integrity) rather than commit it; the
//! entry stays wrong until the file's size or mtime changes, or the cache is turned off
//! (`checksum_cache = false`, `ferry serve --no-checksum-cache`), or the attribute removed
//! (`setfattr -x user.ferry.blake3 FILE`). A change made *while* ferry reads is caught by
//! the source stamp ([`crate::stamp`]), which does include ctime.
//!
//! **Writing it without upsetting readers.** The attribute moves ctime, and every sender of
//! the file holds it to its [`Stamp`](crate::stamp::Stamp), ctime included. So this
//! process's readers register while they hold a file ([`Reading`]); an entry is written only
//! if the file still has the stamp its hash was read under, and the ctime move it makes is
//! recorded for the file's other readers, whose checks follow it ([`Reading::check`]); a
//! reader that opened the file while an entry was being written takes its stamp again once
//! registered. (Another process writing the attribute of a file this one is sending makes
//! that copy fail as changed: exit 4, and the next try succeeds. A write with the mtime set
//! back landing in the microseconds between the attribute's write and the `fstat` after it
//! would be taken for the attribute's move.)
//! Where the attribute cannot be read or written (a filesystem without user attributes,
//! a file of another user, a read-only mount), there is no cache and nothing fails.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ferry_wire::{Reader, Writer};

use crate::error::Result;
use crate::stamp::Stamp;

/// Files smaller than this are hashed every time and get no entry. A first serve pays the
/// attribute's calls (a read that misses, a write, two `fstat`s: about 2 µs a file more
/// in a 10,000 × 64 KiB download from tmpfs here), and a later one reads it (under 1 µs)
/// instead of hashing: BLAKE3 takes about 5 µs for 32 KiB on one AVX-512 core, so below
/// this size an entry would not pay back.
pub const MIN_CACHED: u64 = 32 << 10;

/// The extended attribute holding the entry.
pub const XATTR: &str = "user.ferry.blake3";

/// The entry's first bytes (format 1: the root).
const MAGIC: [u8; 8] = *b"FERRYB31";

/// The entry's first bytes (format 2: the root and the blocks' checks, [`Blocks`]).
const MAGIC2: [u8; 8] = *b"FERRYB32";

/// Bytes of a format 1 entry: magic, size, mtime seconds and nanoseconds, inode, device,
/// root. A format 2 entry follows the same fields with the number of lists of checks (1 or
/// 2, 1 byte), each the check's kind (1 byte: 1 CRC-32C, 2 span digests), the block size and
/// the number of blocks (4 bytes each) and the checks.
const ENTRY_LEN: usize = 8 + 8 + 8 + 8 + 8 + 8 + 32;

/// The most bytes of an entry: Linux's limit on one extended attribute's value.
pub const MAX_ENTRY: usize = 64 << 10;

/// An entry read first into this many bytes (a format 1 entry, or a format 2 one of a few
/// blocks); a longer one is read again whole.
const SMALL_ENTRY: usize = 256;

/// The checks of a file's blocks, as a sender's check computes them (see
/// `ferry_service::secure::protect::BlockCheck`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checks {
    /// Each block's CRC-32C (data protection `clear`).
    Crc(Vec<u32>),
    /// Each block's digest of its spans of the file's tree ([`crate::tree::BlockSpans`]),
    /// what the `integrity` tag is keyed over for a block flagged so.
    Spans(Vec<[u8; 32]>),
}

impl Checks {
    fn kind(&self) -> u8 {
        match self {
            Checks::Crc(_) => 1,
            Checks::Spans(_) => 2,
        }
    }

    /// Blocks checked.
    pub fn len(&self) -> usize {
        match self {
            Checks::Crc(v) => v.len(),
            Checks::Spans(v) => v.len(),
        }
    }

    /// Whether no block is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn bytes_each(&self) -> usize {
        match self {
            Checks::Crc(_) => 4,
            Checks::Spans(_) => 32,
        }
    }
}

/// A whole file's blocks of `block` bytes (from offset 0; the last one shorter) and each
/// one's check: what a format 2 entry keeps besides the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocks {
    /// The block size.
    pub block: u64,
    /// The checks, one per block.
    pub checks: Checks,
}

impl Blocks {
    /// Whether these are the checks of every block of a file of `size` bytes.
    pub fn covers(&self, size: u64) -> bool {
        self.block > 0 && size.div_ceil(self.block) == self.checks.len() as u64
    }
}

/// What an entry says of the file it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The whole file's BLAKE3.
    pub root: [u8; 32],
    /// Its blocks' checks (format 2): a list per kind of check (CRC-32C, span digests), each
    /// for one block size.
    pub blocks: Vec<Blocks>,
}

/// The key of an entry: what `fstat` says of the version of the file it hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    size: u64,
    mtime: (i64, i64),
    ino: u64,
    dev: u64,
}

impl Key {
    fn of(st: &rustix::fs::Stat) -> Key {
        Key {
            size: st.st_size as u64,
            mtime: (st.st_mtime, st.st_mtime_nsec as i64),
            ino: st.st_ino,
            dev: st.st_dev,
        }
    }

    fn encode_head(&self, magic: &[u8; 8], root: &[u8; 32], w: &mut Writer<'_>) {
        w.bytes(magic);
        w.u64(self.size);
        w.i64(self.mtime.0);
        w.i64(self.mtime.1);
        w.u64(self.ino);
        w.u64(self.dev);
        w.bytes(root);
    }

    /// A format 1 entry.
    fn encode(&self, root: &[u8; 32]) -> Vec<u8> {
        let mut v = Vec::with_capacity(ENTRY_LEN);
        self.encode_head(&MAGIC, root, &mut Writer::new(&mut v));
        v
    }

    /// A format 2 entry with the checks of each of `all` (at most one list per kind), or
    /// `None` if it would not fit [`MAX_ENTRY`] or a list is not of the file's every block.
    fn encode2(&self, root: &[u8; 32], all: &[Blocks]) -> Option<Vec<u8>> {
        let len = ENTRY_LEN
            + 1
            + all
                .iter()
                .map(|b| 9 + b.checks.len() * b.checks.bytes_each())
                .sum::<usize>();
        if len > MAX_ENTRY || all.is_empty() || all.iter().any(|b| !b.covers(self.size)) {
            return None;
        }
        let mut v = Vec::with_capacity(len);
        let mut w = Writer::new(&mut v);
        self.encode_head(&MAGIC2, root, &mut w);
        w.u8(u8::try_from(all.len()).ok()?);
        for blocks in all {
            let c = &blocks.checks;
            w.u8(c.kind());
            w.u32(u32::try_from(blocks.block).ok()?);
            w.u32(u32::try_from(c.len()).ok()?);
            match c {
                Checks::Crc(v) => v.iter().for_each(|x| w.u32(*x)),
                Checks::Spans(v) => v.iter().for_each(|x| w.bytes(x)),
            }
        }
        Some(v)
    }

    /// One list of checks of a format 2 entry.
    fn read_blocks(&self, r: &mut Reader<'_>) -> Option<Blocks> {
        let kind = r.u8().ok()?;
        let block = u64::from(r.u32().ok()?);
        let n = r.u32().ok()? as usize;
        // The count is checked against the file before anything is allocated for it.
        if block == 0 || self.size.div_ceil(block) != n as u64 {
            return None;
        }
        let checks = match kind {
            1 => Checks::Crc(
                (0..n)
                    .map(|_| r.u32())
                    .collect::<std::result::Result<_, _>>()
                    .ok()?,
            ),
            2 => Checks::Spans(
                (0..n)
                    .map(|_| r.array::<32>())
                    .collect::<std::result::Result<_, _>>()
                    .ok()?,
            ),
            _ => return None,
        };
        Some(Blocks { block, checks })
    }

    /// What `entry` says if it is a well-formed entry (either format) of this key.
    fn matches(&self, entry: &[u8]) -> Option<Entry> {
        let mut r = Reader::new(entry);
        let magic = r.array::<8>().ok()?;
        let ok = (magic == MAGIC || magic == MAGIC2)
            && r.u64().ok()? == self.size
            && (r.i64().ok()?, r.i64().ok()?) == self.mtime
            && r.u64().ok()? == self.ino
            && r.u64().ok()? == self.dev;
        let root = r.array::<32>().ok()?;
        if !ok {
            return None;
        }
        let mut blocks = Vec::new();
        if magic == MAGIC2 {
            // One list per kind of check at most.
            let n = r.u8().ok()?;
            if n == 0 || n > 2 {
                return None;
            }
            for _ in 0..n {
                blocks.push(self.read_blocks(&mut r)?);
            }
        }
        r.finish().ok()?;
        Some(Entry { root, blocks })
    }
}

/// This process's readers of one file, and the ctime moves its own entries made.
#[derive(Debug, Default)]
struct Readers {
    count: usize,
    /// (ctime before, ctime after) of each entry written while readers held the file.
    moves: Vec<((i64, i64), (i64, i64))>,
}

/// Readers of this process per file (device, inode).
static READERS: Mutex<Option<HashMap<(u64, u64), Readers>>> = Mutex::new(None);
/// Entries written so far by this process (a reader compares it across its registration).
static WRITES: AtomicU64 = AtomicU64::new(0);

fn readers() -> std::sync::MutexGuard<'static, Option<HashMap<(u64, u64), Readers>>> {
    READERS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Call before opening a file to read it: what [`Reading::start`] compares against.
pub fn epoch() -> u64 {
    WRITES.load(Ordering::SeqCst)
}

/// One reader of a file, registered while it lives (see the module notes), with the cache
/// enabled or not.
#[derive(Debug)]
pub struct Reading {
    id: (u64, u64),
    key: Key,
    enabled: bool,
}

impl Reading {
    /// Registers a reader of `file` (opened after [`epoch`] returned `epoch`, `st` its
    /// `fstat` then); the stamp to hold it to: `st`'s, or a fresh one if an entry was
    /// written meanwhile (that moved its ctime, not its content).
    pub fn start(
        file: &File,
        st: &rustix::fs::Stat,
        epoch: u64,
        enabled: bool,
    ) -> std::io::Result<(Reading, Stamp)> {
        let id = (st.st_dev, st.st_ino);
        readers()
            .get_or_insert_with(HashMap::new)
            .entry(id)
            .or_default()
            .count += 1;
        let reading = Reading {
            id,
            key: Key::of(st),
            enabled,
        };
        let stamp = if WRITES.load(Ordering::SeqCst) == epoch {
            Stamp::of(st)
        } else {
            Stamp::now(file)?
        };
        Ok((reading, stamp))
    }

    /// The cached BLAKE3 of the file, if its entry matches the file as opened.
    pub fn cached(&self, file: &File) -> Option<[u8; 32]> {
        self.entry(file).map(|e| e.root)
    }

    /// The file's entry (either format), if it matches the file as opened.
    pub fn entry(&self, file: &File) -> Option<Entry> {
        if !self.enabled {
            return None;
        }
        // Most entries are a root alone (a file of a few blocks, or one sent whole as a
        // FILE frame): read into a small buffer first, as small files are served often.
        let mut small = [0u8; SMALL_ENTRY];
        match rustix::fs::fgetxattr(file, XATTR, &mut small[..]) {
            Ok(n) => return self.key.matches(small.get(..n)?),
            Err(rustix::io::Errno::RANGE) => {}
            Err(_) => return None,
        }
        let mut buf = vec![0u8; MAX_ENTRY];
        let n = rustix::fs::fgetxattr(file, XATTR, &mut buf[..]).ok()?;
        self.key.matches(buf.get(..n)?)
    }

    /// [`Stamp::check`], except that a ctime moved only by entries this process wrote
    /// while this reader held the file is no change (the stamp follows it).
    pub fn check(&self, stamp: &mut Stamp, file: &File, what: &str) -> Result<()> {
        stamp.check_allowing(file, what, &|from, to| {
            let guard = readers();
            let moves = match guard.as_ref().and_then(|m| m.get(&self.id)) {
                Some(r) => &r.moves,
                None => return false,
            };
            let mut at = from;
            // Each step follows one write; there are no more steps than writes.
            for _ in 0..moves.len() {
                match moves.iter().find(|(a, _)| *a == at) {
                    Some((_, b)) if *b == to => return true,
                    Some((_, b)) => at = *b,
                    None => return false,
                }
            }
            false
        })
    }

    /// Records `root` as the file's BLAKE3, hashed from the version `stamp` names, unless
    /// the entry already says so or the file no longer has that stamp. Readers of this
    /// process holding the file are told of the ctime this moves ([`Reading::check`]).
    /// Best effort: a failure only means no cache.
    pub fn store(&self, stamp: &mut Stamp, file: &File, root: &[u8; 32]) {
        if !self.enabled || self.cached(file) == Some(*root) {
            return;
        }
        let entry = self.key.encode(root);
        self.write(stamp, file, &entry);
    }

    /// [`Reading::store`] with the file's blocks' checks too (format 2), read from the same
    /// version: unless the entry already holds them. Checks of the other kind the entry
    /// holds for the same root stay (a file served at `clear` and at `integrity` keeps both),
    /// if the attribute can hold both. Where the file system cannot keep that much, the root
    /// alone (format 1).
    pub fn store_blocks(&self, stamp: &mut Stamp, file: &File, root: &[u8; 32], blocks: &Blocks) {
        if !self.enabled {
            return;
        }
        let mut all = vec![blocks.clone()];
        if let Some(e) = self.entry(file).filter(|e| e.root == *root) {
            if e.blocks.contains(blocks) {
                return;
            }
            let kind = blocks.checks.kind();
            all.extend(e.blocks.into_iter().filter(|b| b.checks.kind() != kind));
        }
        let entry = self.key.encode2(root, &all);
        let entry = entry.or_else(|| self.key.encode2(root, &all[..1]));
        match entry {
            Some(entry) if self.write(stamp, file, &entry) => {}
            _ => self.store(stamp, file, root),
        }
    }

    /// Writes `entry` if the file still has `stamp` (see [`Reading::store`]); whether it
    /// did.
    fn write(&self, stamp: &mut Stamp, file: &File, entry: &[u8]) -> bool {
        let mut guard = readers();
        let Ok(before) = Stamp::now(file) else {
            return false;
        };
        if before != *stamp {
            return false;
        }
        let flags = rustix::fs::XattrFlags::empty();
        if let Err(e) = rustix::fs::fsetxattr(file, XATTR, entry, flags) {
            tracing::debug!(
                "no checksum cache entry of {} bytes for this file: {e}",
                entry.len()
            );
            return false;
        }
        // Counted once the attribute is written, not before: a reader whose epoch came
        // between the count and the write could otherwise have taken its stamp before the
        // write, registered after this writer (the file's last reader) let go of the moves,
        // and found the epoch unchanged — then the attribute's ctime move would fail its
        // copy as a changed source (seen as a rare failure of four concurrent GETs).
        WRITES.fetch_add(1, Ordering::SeqCst);
        let Ok(after) = Stamp::now(file) else {
            return true;
        };
        if let Some(r) = guard.as_mut().and_then(|m| m.get_mut(&self.id)) {
            r.moves.push((before.ctime(), after.ctime()));
        }
        *stamp = after;
        true
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut guard = readers();
        if let Some(m) = guard.as_mut() {
            if let Some(r) = m.get_mut(&self.id) {
                r.count -= 1;
                if r.count == 0 {
                    m.remove(&self.id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn file(tag: &str, len: usize) -> (std::path::PathBuf, File) {
        let p = std::env::temp_dir().join(format!("ferry-sumcache-{tag}-{}", std::process::id()));
        std::fs::write(&p, vec![9u8; len]).unwrap();
        let f = File::open(&p).unwrap();
        (p, f)
    }

    /// An entry is taken only with every part of its key equal.
    #[test]
    fn every_key_field_counts() {
        let key = Key {
            size: 1 << 20,
            mtime: (1_700_000_000, 123),
            ino: 42,
            dev: 7,
        };
        let root = [3u8; 32];
        let entry = key.encode(&root);
        assert_eq!(entry.len(), ENTRY_LEN);
        assert_eq!(key.matches(&entry).map(|e| e.root), Some(root));
        let others = [
            Key {
                size: key.size + 1,
                ..key
            },
            Key {
                mtime: (key.mtime.0, 124),
                ..key
            },
            Key {
                mtime: (key.mtime.0 + 1, 123),
                ..key
            },
            Key { ino: 43, ..key },
            Key { dev: 8, ..key },
        ];
        for k in others {
            assert_eq!(k.matches(&entry), None, "{k:?}");
        }
        assert_eq!(key.matches(&entry[..ENTRY_LEN - 1]), None);
        let mut longer = entry.clone();
        longer.push(0);
        assert_eq!(key.matches(&longer), None);
    }

    /// A format 2 entry keeps the blocks' checks of one block size, is refused if they are
    /// not the file's every block or would not fit an attribute, and a format 1 entry still
    /// reads (root alone).
    #[test]
    fn format_2_keeps_the_blocks_checks() {
        let key = Key {
            size: (8 << 20) + 1,
            mtime: (1_700_000_000, 5),
            ino: 9,
            dev: 3,
        };
        let root = [7u8; 32];
        for checks in [
            Checks::Crc(vec![1, 2, 3]),
            Checks::Spans(vec![[4u8; 32], [5u8; 32], [6u8; 32]]),
        ] {
            let blocks = Blocks {
                block: 4 << 20,
                checks,
            };
            let entry = key
                .encode2(&root, std::slice::from_ref(&blocks))
                .expect("fits");
            let got = key.matches(&entry).expect("matches");
            assert_eq!(got.root, root);
            assert_eq!(got.blocks, std::slice::from_ref(&blocks));
            // Cut short or longer, or another size: refused.
            assert_eq!(key.matches(&entry[..entry.len() - 1]), None);
            let mut longer = entry.clone();
            longer.push(0);
            assert_eq!(key.matches(&longer), None);
            let bigger = Key {
                size: 12 << 20 | 1,
                ..key
            };
            assert_eq!(bigger.matches(&entry), None);
        }
        // Two checks for a file of three blocks: not written.
        let short = Blocks {
            block: 4 << 20,
            checks: Checks::Crc(vec![1, 2]),
        };
        assert_eq!(key.encode2(&root, &[short]), None);
        // More than an attribute holds: not written.
        let huge = Key {
            size: 4096 << 20,
            ..key
        };
        let many = Blocks {
            block: 1 << 20,
            checks: Checks::Spans(vec![[0u8; 32]; 4096]),
        };
        assert_eq!(huge.encode2(&root, &[many]), None);
        let v1 = key.encode(&root);
        assert_eq!(
            key.matches(&v1),
            Some(Entry {
                root,
                blocks: vec![]
            })
        );
    }

    /// Two readers of one file: the entry one of them writes moves ctime, and the other's
    /// check follows the move; a real write after it is still a change to both.
    #[test]
    fn a_reader_follows_the_entry_another_wrote() {
        let (p, f) = file("two", 1 << 20);
        let st = rustix::fs::fstat(&f).unwrap();
        let (a, mut sa) = Reading::start(&f, &st, epoch(), true).unwrap();
        let (b, mut sb) = Reading::start(&f, &st, epoch(), true).unwrap();
        assert_eq!(a.cached(&f), None);
        std::thread::sleep(std::time::Duration::from_millis(20));
        a.store(&mut sa, &f, &[1u8; 32]);
        assert_eq!(b.cached(&f), Some([1u8; 32]));
        b.check(&mut sb, &f, "f").unwrap();
        a.check(&mut sa, &f, "f").unwrap();
        // A write with the mtime set back is no move of ours.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let w = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        let mtime = w.metadata().unwrap().modified().unwrap();
        w.write_all_at(b"x", 5).unwrap();
        w.set_modified(mtime).unwrap();
        assert!(b.check(&mut sb, &f, "f").is_err());
        assert!(a.check(&mut sa, &f, "f").is_err());
        drop((a, b));
        // The blind spot: same size and mtime, so the entry still matches.
        let st = rustix::fs::fstat(&f).unwrap();
        let (c, _) = Reading::start(&f, &st, epoch(), true).unwrap();
        assert_eq!(c.cached(&f), Some([1u8; 32]));
        // Turned off, the cache is neither read nor written.
        let (off, _) = Reading::start(&f, &st, epoch(), false).unwrap();
        assert_eq!(off.cached(&f), None);
        drop((c, off));
        let (p2, f2) = file("off", 1 << 20);
        let st2 = rustix::fs::fstat(&f2).unwrap();
        let (off2, mut so2) = Reading::start(&f2, &st2, epoch(), false).unwrap();
        off2.store(&mut so2, &f2, &[2u8; 32]);
        let mut buf = [0u8; 8];
        assert!(rustix::fs::fgetxattr(&f2, XATTR, &mut buf[..]).is_err());
        let _ = std::fs::remove_file(&p);
        let _ = std::fs::remove_file(&p2);
    }

    /// Stored with blocks' checks: format 2, read back whole; checks of the other kind join
    /// them, of the same kind replace them; a later store of the same root alone keeps them;
    /// checks too many for an attribute store the root alone (format 1).
    #[test]
    fn store_blocks_writes_format_2_or_falls_back() {
        let (p, f) = file("blocks", 3000);
        let st = rustix::fs::fstat(&f).unwrap();
        let (r, mut s) = Reading::start(&f, &st, epoch(), true).unwrap();
        let crc = Blocks {
            block: 1024,
            checks: Checks::Crc(vec![10, 20, 30]),
        };
        let root = [8u8; 32];
        r.store_blocks(&mut s, &f, &root, &crc);
        let entry = |blocks: Vec<Blocks>| Some(Entry { root, blocks });
        assert_eq!(r.entry(&f), entry(vec![crc.clone()]));
        let spans = Blocks {
            block: 1024,
            checks: Checks::Spans(vec![[1u8; 32]; 3]),
        };
        r.store_blocks(&mut s, &f, &root, &spans);
        assert_eq!(r.entry(&f), entry(vec![spans.clone(), crc.clone()]));
        let crc2 = Blocks {
            block: 1000,
            checks: Checks::Crc(vec![1, 2, 3]),
        };
        r.store_blocks(&mut s, &f, &root, &crc2);
        assert_eq!(r.entry(&f), entry(vec![crc2.clone(), spans]));
        r.store(&mut s, &f, &root);
        assert_eq!(
            r.entry(&f).map(|e| e.blocks.len()),
            Some(2),
            "the root alone replaced them"
        );
        r.check(&mut s, &f, "f").unwrap();
        let many = Blocks {
            block: 1,
            checks: Checks::Spans(vec![[1u8; 32]; 3000]),
        };
        r.store_blocks(&mut s, &f, &[9u8; 32], &many);
        assert_eq!(
            r.entry(&f),
            Some(Entry {
                root: [9u8; 32],
                blocks: vec![]
            })
        );
        drop(r);
        let _ = std::fs::remove_file(&p);
    }

    /// A reader that opened the file before another wrote an entry, and registered after,
    /// holds the file to its stamp as of after the write.
    #[test]
    fn a_reader_registered_after_a_write_restamps() {
        let (p, f) = file("late", 1 << 20);
        let before = epoch();
        let st_early = rustix::fs::fstat(&f).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (w, mut sw) = Reading::start(&f, &st_early, epoch(), true).unwrap();
        w.store(&mut sw, &f, &[5u8; 32]);
        drop(w);
        let (late, mut sl) = Reading::start(&f, &st_early, before, true).unwrap();
        late.check(&mut sl, &f, "f").unwrap();
        let _ = std::fs::remove_file(&p);
    }
}
