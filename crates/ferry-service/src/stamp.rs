//! Catching a source file that changes while it is being sent.
//!
//! The whole-file BLAKE3 covers the bytes that were read, so it cannot tell a file written
//! to during the copy from one that was not: the receiver would commit a mix of both
//! versions. The sender therefore takes the file's [`Stamp`] (device, inode, size, mtime and
//! ctime, to the nanosecond) when it opens the file and compares it again after reading
//! and before it lets the receiver commit (FILE_DONE with the hash, CLOSE, a FILE or
//! PUT_FILE frame). Any write moves ctime, which no one can set back (utimes can reset
//! mtime, not ctime), so a change in between is seen unless it falls within one tick of the
//! filesystem's timestamp clock as the first stamp *and* keeps the size. `docs/xfer.md`
//! lists what this cannot see.

use std::fs::File;

use crate::error::{Error, Kind, Result};

/// What identifies one version of a file's content, as `fstat` tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    /// The stamp of a file that `st` describes.
    pub fn of(st: &rustix::fs::Stat) -> Stamp {
        Stamp {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mtime: (st.st_mtime, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime, st.st_ctime_nsec as i64),
        }
    }

    /// The stamp of a file that `md` describes (what `std` returns, to save an `fstat`).
    pub fn of_metadata(md: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            dev: md.dev(),
            ino: md.ino(),
            size: md.size(),
            mtime: (md.mtime(), md.mtime_nsec()),
            ctime: (md.ctime(), md.ctime_nsec()),
        }
    }

    /// The stamp of `file` now.
    pub fn now(file: &File) -> std::io::Result<Stamp> {
        Ok(Stamp::of(&rustix::fs::fstat(file)?))
    }

    /// Fails (exit 4, integrity) if `file`, named `what` in the message, no longer has this
    /// stamp: its content may have changed since the stamp was taken.
    pub fn check(&self, file: &File, what: &str) -> Result<()> {
        let now = Stamp::now(file).map_err(|e| Error::io(what, &e))?;
        if now == *self {
            return Ok(());
        }
        Err(Error::new(Kind::Integrity, changed(what, self, &now)))
    }

    /// The ctime (seconds, nanoseconds).
    pub fn ctime(&self) -> (i64, i64) {
        self.ctime
    }

    /// [`Stamp::check`], except that a file whose only change is its ctime, from ours to
    /// one `moved(ours, now)` vouches for (a change of the file's metadata the caller made
    /// itself, such as the checksum cache's attribute), passes, and the stamp takes the
    /// new ctime.
    pub fn check_allowing(
        &mut self,
        file: &File,
        what: &str,
        moved: &dyn Fn((i64, i64), (i64, i64)) -> bool,
    ) -> Result<()> {
        let now = Stamp::now(file).map_err(|e| Error::io(what, &e))?;
        let only_ctime = Stamp {
            ctime: self.ctime,
            ..now
        } == *self;
        if now == *self || (only_ctime && moved(self.ctime, now.ctime)) {
            *self = now;
            return Ok(());
        }
        Err(Error::new(Kind::Integrity, changed(what, self, &now)))
    }
}

/// The message for a source that changed while being read.
fn changed(what: &str, before: &Stamp, now: &Stamp) -> String {
    let how = if now.size != before.size {
        format!("its size went from {} to {} bytes", before.size, now.size)
    } else if now.mtime != before.mtime {
        "it was modified".to_string()
    } else {
        "its inode changed (written, or its times were reset)".to_string()
    };
    format!(
        "{what}: the source changed while it was being copied ({how}); nothing was committed under its name. Copy it again once nothing writes to it"
    )
}

/// Test hook: with `FERRY_TEST_PAUSE_READ=PATH` set, the first time this process has read
/// the first block of a file range it sends, it creates the file PATH and waits until
/// PATH is removed again (at most 30 s), so a test can change the source at a known point
/// of the copy. Unset in normal use.
pub fn test_pause_after_read() {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    pause_once("FERRY_TEST_PAUSE_READ", &DONE);
}

/// Test hook: `FERRY_TEST_PAUSE_UNREAD=PATH` is [`test_pause_after_read`] for the first
/// block of a range sent unread (from the checksum cache's checks, see
/// `crate::ring::sender::Source::Vouched`), after that block's send was prepared. Unset in
/// normal use.
pub fn test_pause_after_unread() {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    pause_once("FERRY_TEST_PAUSE_UNREAD", &DONE);
}

/// The first time it is called with `done`, if the variable `var` names a file: creates it
/// and waits until it is removed (at most 30 s).
fn pause_once(var: &str, done: &std::sync::atomic::AtomicBool) {
    let Some(marker) = std::env::var_os(var) else {
        return;
    };
    if done.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    if std::fs::write(&marker, b"paused\n").is_err() {
        return;
    }
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::path::Path::new(&marker).exists() && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn a_write_or_a_reset_mtime_is_seen() {
        let path = std::env::temp_dir().join(format!("ferry-stamp-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        let f = File::open(&path).unwrap();
        let stamp = Stamp::now(&f).unwrap();
        assert_eq!(stamp, Stamp::of_metadata(&f.metadata().unwrap()));
        stamp.check(&f, "x").unwrap();
        let mtime = f.metadata().unwrap().modified().unwrap();
        // Same size, mtime put back: ctime still moved.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        w.write_all_at(&[1u8; 16], 100).unwrap();
        w.set_modified(mtime).unwrap();
        let e = stamp.check(&f, "x").unwrap_err();
        assert_eq!(e.kind, Kind::Integrity);
        assert!(e.msg.starts_with("x: the source changed"), "{}", e.msg);
        std::fs::remove_file(&path).unwrap();
    }
}
