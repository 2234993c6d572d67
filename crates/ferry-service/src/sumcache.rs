//! The checksum cache: a file's whole BLAKE3 kept in an extended attribute
//! ([`XATTR`], `user.ferry.blake3`), so a server that sends or sums an unchanged file again
//! does not hash it again.
//!
//! The entry is keyed by what `fstat` says of the file: size, mtime (to the nanosecond),
//! inode and device. Read with a key that differs in any of them, it is ignored (and
//! rewritten once the file has been hashed again). It holds only the root: the per-block
//! chaining values ([`crate::tree`]) would be 32 bytes per block, kilobytes for large files,
//! and only ranged reads could use them, which the whole-file checks ferry makes never need.
//!
//! **What it cannot see.** ctime is not in the key (setting the attribute moves it), so
//! content rewritten with the same size and the mtime set back (`touch -d`, `utimes`)
//! keeps a stale entry: the sender then announces the old hash, and the receiver, which
//! hashes what it got, refuses the file (exit 4, integrity) rather than commit it; the
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

/// Files smaller than this are hashed every time and get no entry: below it hashing costs
/// about what the attribute's system calls cost, and small-file copies pay per file.
pub const MIN_CACHED: u64 = 1 << 20;

/// The extended attribute holding the entry.
pub const XATTR: &str = "user.ferry.blake3";

/// The entry's first bytes (format 1).
const MAGIC: [u8; 8] = *b"FERRYB31";

/// Bytes of an entry: magic, size, mtime seconds and nanoseconds, inode, device, root.
const ENTRY_LEN: usize = 8 + 8 + 8 + 8 + 8 + 8 + 32;

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

    fn encode(&self, root: &[u8; 32]) -> Vec<u8> {
        let mut v = Vec::with_capacity(ENTRY_LEN);
        let mut w = Writer::new(&mut v);
        w.bytes(&MAGIC);
        w.u64(self.size);
        w.i64(self.mtime.0);
        w.i64(self.mtime.1);
        w.u64(self.ino);
        w.u64(self.dev);
        w.bytes(root);
        v
    }

    /// The root of `entry` if it is a well-formed entry of this key.
    fn matches(&self, entry: &[u8]) -> Option<[u8; 32]> {
        let mut r = Reader::new(entry);
        let ok = r.array::<8>().ok()? == MAGIC
            && r.u64().ok()? == self.size
            && (r.i64().ok()?, r.i64().ok()?) == self.mtime
            && r.u64().ok()? == self.ino
            && r.u64().ok()? == self.dev;
        let root = r.array::<32>().ok()?;
        (ok && r.finish().is_ok()).then_some(root)
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
        if !self.enabled {
            return None;
        }
        let mut buf = [0u8; ENTRY_LEN + 1];
        let n = rustix::fs::fgetxattr(file, XATTR, &mut buf[..]).ok()?;
        self.key.matches(&buf[..n])
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
        let mut guard = readers();
        let Ok(before) = Stamp::now(file) else { return };
        if before != *stamp {
            return;
        }
        WRITES.fetch_add(1, Ordering::SeqCst);
        let entry = self.key.encode(root);
        let flags = rustix::fs::XattrFlags::empty();
        if let Err(e) = rustix::fs::fsetxattr(file, XATTR, &entry, flags) {
            tracing::debug!("no checksum cache for this file: {e}");
            return;
        }
        let Ok(after) = Stamp::now(file) else { return };
        if let Some(r) = guard.as_mut().and_then(|m| m.get_mut(&self.id)) {
            r.moves.push((before.ctime(), after.ctime()));
        }
        *stamp = after;
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
        assert_eq!(key.matches(&entry), Some(root));
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
