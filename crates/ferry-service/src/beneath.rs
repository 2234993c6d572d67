//! Opening and creating files beneath a directory held open, the one discipline both ends
//! follow: the server inside its exported roots ([`crate::roots::Roots`]), the client
//! inside the destination of a download. Every path is resolved by `openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` (no `..` above the directory, no absolute
//! path, no symlink leading out of it, no `/proc` magic link); the last component is then
//! created or opened relative to its parent's descriptor without following a symlink.
//!
//! Names that come from the network are checked with [`check_name`] first: one plain path
//! component.

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Resolve flags for every path taken beneath a directory.
pub const BENEATH: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

/// Opens `rel` (relative, "." for `dir` itself) beneath `dir` with `flags` (close-on-exec
/// added).
pub fn open_beneath(dir: impl AsFd, rel: &str, flags: OFlags) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(dir, rel, flags | OFlags::CLOEXEC, Mode::empty(), BENEATH)
}

/// Opens the directory `rel` beneath `dir` ("" or "." is `dir` itself).
pub fn open_dir_beneath(dir: impl AsFd, rel: &str) -> Result<OwnedFd, Errno> {
    let rel = if rel.is_empty() { "." } else { rel };
    open_beneath(dir, rel, OFlags::RDONLY | OFlags::DIRECTORY)
}

/// Splits `rel` into the directory holding its last component ("" for none) and that
/// component.
pub fn split_last(rel: &str) -> (&str, &str) {
    rel.rsplit_once('/').unwrap_or(("", rel))
}

/// Creates directory `name` in `parent` with `mode`; an existing directory is fine. An
/// existing entry of another kind (a symlink too: it is not followed) is `NOTDIR`.
pub fn mkdir_in(parent: impl AsFd, name: &str, mode: u32) -> Result<(), Errno> {
    let parent = parent.as_fd();
    match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(mode & 0o7777)) {
        Err(Errno::EXIST) => {
            let st = rustix::fs::statat(parent, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
            match rustix::fs::FileType::from_raw_mode(st.st_mode) {
                rustix::fs::FileType::Directory => Ok(()),
                _ => Err(Errno::NOTDIR),
            }
        }
        r => r,
    }
}

/// Checks that `name`, a name a peer listed, is one plain path component: not empty, not
/// `.` or `..`, without `/` or NUL. Other control characters are allowed: they are legal
/// in Linux file names (a server exports such files and an upload sends them), and they
/// cannot change where a file lands, only how a terminal shows it.
pub fn check_name(name: &str) -> Result<(), String> {
    let why = if name.is_empty() {
        "an empty name"
    } else if name == "." || name == ".." {
        "a relative directory, not a name"
    } else if name.contains('/') {
        "a path, not a name (it contains '/')"
    } else if name.contains('\0') {
        "a name containing a NUL byte"
    } else {
        return Ok(());
    };
    Err(format!("{name:?} is {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_pass() {
        for bad in ["", ".", "..", "../x", "/abs/path", "a/b", "a\0b", "x/", "/"] {
            assert!(check_name(bad).is_err(), "{bad:?} passed");
        }
        for good in ["a", "..a", "a..", ".hidden", "with space", "new\nline", "é"] {
            assert!(check_name(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn nothing_leaves_the_directory() {
        let base = std::env::temp_dir().join(format!("ferry-beneath-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let inside = base.join("in");
        std::fs::create_dir_all(&inside).unwrap();
        std::os::unix::fs::symlink(&base, inside.join("up")).unwrap();
        let dir =
            rustix::fs::open(&inside, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        for escape in ["..", "../in", "/tmp", "up", "up/in"] {
            assert_eq!(
                open_dir_beneath(&dir, escape).err(),
                Some(Errno::XDEV),
                "{escape}"
            );
        }
        mkdir_in(&dir, "d", 0o755).unwrap();
        mkdir_in(&dir, "d", 0o755).unwrap();
        assert_eq!(mkdir_in(&dir, "up", 0o755), Err(Errno::NOTDIR));
        assert!(open_dir_beneath(&dir, "d").is_ok() && open_dir_beneath(&dir, "").is_ok());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
