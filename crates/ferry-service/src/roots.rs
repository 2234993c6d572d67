//! The exported roots and their sandbox (`openat2` beneath each root), and part files.
//!
//! Face-neutral: a refusal says what class of failure it is ([`Denial`]) and a face maps
//! that to its own error codes; an entry is a [`Meta`], which a face turns into its own
//! listing format.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use rustix::fs::{Access, AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::beneath::{mkdir_in, open_beneath, open_dir_beneath};
use crate::error::{refuse, Denial, Error, PResult, Refusal, Result};
use crate::journal::{journal_name, Ident, Journal};
use crate::landing::{open_part, Found, OpenHow, Progress};
use crate::rights::Rights;

/// An exported directory, held open.
struct Root {
    name: String,
    dir: OwnedFd,
    /// Nothing may be created or written under it.
    read_only: bool,
}

/// One exported root: the name clients use, its directory, and whether it is read-only.
#[derive(Debug, Clone, Copy)]
pub struct RootSpec<'a> {
    /// The name clients write as the first path component.
    pub name: &'a str,
    /// The directory on this host.
    pub path: &'a std::path::Path,
    /// Refuse every write (uploads, directories, parts) under it.
    pub read_only: bool,
}

fn errno_refusal(path: &str, e: Errno) -> Refusal {
    let code = match e {
        Errno::NOENT => Denial::NotFound,
        Errno::XDEV | Errno::LOOP => {
            return refuse(
                Denial::PermissionDenied,
                format!("{path}: refused, the path leads outside its root"),
            )
        }
        Errno::ACCESS | Errno::PERM => Denial::PermissionDenied,
        Errno::NOSPC | Errno::DQUOT => Denial::NoSpace,
        Errno::NOTDIR => Denial::NotADirectory,
        Errno::ISDIR => Denial::IsADirectory,
        _ => Denial::Io,
    };
    refuse(code, format!("{path}: {}", std::io::Error::from(e)))
}

/// The exported roots and the sandboxed operations on them.
pub struct Roots {
    roots: Vec<Root>,
    /// Whether uploads keep setuid, setgid and sticky bits (`keep_special_bits`).
    keep_special: bool,
}

/// What a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// Anything else (a FIFO, a device, a socket).
    Other,
}

/// One entry of a listing, or what a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// What it is.
    pub kind: FileKind,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Size in bytes (0 for anything but a regular file).
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Its name (the last component).
    pub name: String,
}

fn kind_of(st: &rustix::fs::Stat) -> FileKind {
    match rustix::fs::FileType::from_raw_mode(st.st_mode) {
        rustix::fs::FileType::RegularFile => FileKind::File,
        rustix::fs::FileType::Directory => FileKind::Dir,
        rustix::fs::FileType::Symlink => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

fn entry_of(name: &str, st: &rustix::fs::Stat) -> Meta {
    let kind = kind_of(st);
    Meta {
        kind,
        mode: st.st_mode & 0o7777,
        size: if kind == FileKind::File {
            st.st_size as u64
        } else {
            0
        },
        mtime: st.st_mtime,
        name: name.to_string(),
    }
}

impl Roots {
    /// Opens every root directory of `roots`; uploads keep setuid, setgid and sticky bits
    /// only with `keep_special`.
    pub fn open<'a>(
        roots: impl IntoIterator<Item = RootSpec<'a>>,
        keep_special: bool,
    ) -> Result<Roots> {
        let mut open = Vec::new();
        for RootSpec {
            name,
            path,
            read_only,
        } in roots
        {
            let dir = rustix::fs::open(
                path,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| Error::io(format!("root {name} ({})", path.display()), &e.into()))?;
            open.push(Root {
                name: name.to_string(),
                dir,
                read_only,
            });
        }
        Ok(Roots {
            roots: open,
            keep_special,
        })
    }

    /// Whether a credential with `rights` may use `path` (`write`: create, change or remove
    /// something there): a root it is not granted is "no root named ..." (as a root that
    /// does not exist: it learns nothing of it), a write by a read-only credential is
    /// refused, and a grant's holder only writes its scope ([`crate::rights::Scope`]).
    /// Every face calls this where it resolves a client's path; the roots' own
    /// read-only setting is checked on top, by every write.
    pub fn permit(&self, rights: &Rights, path: &str, write: bool) -> PResult<()> {
        if let Some(scope) = &rights.scope {
            // A grant writes its path and nothing else; it reads nothing.
            if !write || !scope.covers(path) {
                return Err(refuse(
                    Denial::PermissionDenied,
                    format!(
                        "{path}: refused, the grant used covers only writing {}{}",
                        scope.path,
                        if scope.tree { " and beneath it" } else { "" }
                    ),
                ));
            }
        }
        let name = path.split('/').next().unwrap_or("");
        // "" is the list of roots (which the face filters), or an absolute path, which
        // every resolution refuses.
        if name.is_empty() {
            return Ok(());
        }
        if !rights.grants(name) {
            let granted: Vec<&str> = self
                .roots
                .iter()
                .map(|r| r.name.as_str())
                .filter(|n| rights.grants(n))
                .collect();
            return Err(refuse(
                Denial::NotFound,
                format!("no root named {name:?} (exported: {})", granted.join(", ")),
            ));
        }
        if write && rights.read_only {
            return Err(refuse(
                Denial::PermissionDenied,
                format!("{path}: refused, your credential is read-only on this server"),
            ));
        }
        Ok(())
    }

    /// Splits `root/rel` and finds the root; `rel` is "." for the root itself.
    fn split<'p>(&self, path: &'p str) -> PResult<(&Root, &'p str)> {
        if path.starts_with('/') {
            return Err(refuse(
                Denial::PermissionDenied,
                format!("{path}: refused, paths are root/relative/path, never absolute"),
            ));
        }
        if path.contains('\0') {
            return Err(refuse(Denial::BadRequest, "path contains a NUL byte"));
        }
        let (name, rel) = path.split_once('/').unwrap_or((path, ""));
        let root = self.roots.iter().find(|r| r.name == name).ok_or_else(|| {
            refuse(
                Denial::NotFound,
                format!(
                    "no root named {name:?} (exported: {})",
                    self.roots
                        .iter()
                        .map(|r| r.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })?;
        let rel = rel.trim_end_matches('/');
        if rel.starts_with('/') {
            return Err(refuse(
                Denial::PermissionDenied,
                format!("{path}: refused, absolute path inside a root"),
            ));
        }
        Ok((root, if rel.is_empty() { "." } else { rel }))
    }

    fn open_at(&self, path: &str, flags: OFlags) -> PResult<OwnedFd> {
        let (root, rel) = self.split(path)?;
        open_beneath(&root.dir, rel, flags).map_err(|e| errno_refusal(path, e))
    }

    /// Opens a regular file for reading. Anything else is refused before a byte is read:
    /// the open itself is non-blocking (opening a FIFO for reading would wait for a writer
    /// forever), and the open descriptor is checked, so a swap between a check and the open
    /// cannot slip a FIFO or a device through.
    pub fn open_read(&self, path: &str) -> PResult<(File, rustix::fs::Stat)> {
        let fd = self.open_at(path, OFlags::RDONLY | OFlags::NONBLOCK)?;
        let st = rustix::fs::fstat(&fd).map_err(|e| errno_refusal(path, e))?;
        match kind_of(&st) {
            FileKind::File => {}
            FileKind::Dir => {
                return Err(refuse(
                    Denial::IsADirectory,
                    format!("{path}: is a directory, not a file"),
                ))
            }
            _ => return Err(not_regular(path, &st)),
        }
        // Left non-blocking: reads of regular files ignore O_NONBLOCK (a syscall a file saved).
        Ok((File::from(fd), st))
    }

    /// Describes a path. Symlinks are followed as long as they stay inside the root.
    pub fn stat(&self, path: &str) -> PResult<Meta> {
        let fd = self.open_at(path, OFlags::PATH)?;
        let st = rustix::fs::fstat(&fd).map_err(|e| errno_refusal(path, e))?;
        let shown = path
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or(path);
        Ok(entry_of(shown, &st))
    }

    /// Lists a directory ("" lists the roots).
    pub fn list(&self, path: &str) -> PResult<Vec<Meta>> {
        if path.trim_matches('/').is_empty() {
            return Ok(self
                .roots
                .iter()
                .map(|r| Meta {
                    kind: FileKind::Dir,
                    mode: 0o755,
                    size: 0,
                    mtime: 0,
                    name: r.name.clone(),
                })
                .collect());
        }
        let fd = self.open_at(path, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let mut dir = rustix::fs::Dir::read_from(&fd).map_err(|e| errno_refusal(path, e))?;
        let mut out = Vec::new();
        while let Some(ent) = dir.read() {
            let ent = ent.map_err(|e| errno_refusal(path, e))?;
            let name = ent.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            // Names that are not UTF-8 cannot be named back; skip them visibly.
            if std::str::from_utf8(ent.file_name().to_bytes()).is_err() {
                tracing::warn!("{path}: skipping a name that is not UTF-8");
                continue;
            }
            let st = rustix::fs::statat(&fd, ent.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| errno_refusal(path, e))?;
            out.push(entry_of(&name, &st));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The directory holding `path`'s last component, opened inside the sandbox, and that
    /// component (None when the path is a root itself), for creating or writing it: refused
    /// under a read-only root.
    fn parent(&self, path: &str) -> PResult<(OwnedFd, Option<String>)> {
        let (root, rel) = self.split(path)?;
        // Every write goes through here: a read-only root takes none.
        if root.read_only {
            return Err(refuse(
                Denial::PermissionDenied,
                format!("{path}: refused, root {} is read-only", root.name),
            ));
        }
        if rel == "." {
            let fd = rustix::io::dup(&root.dir).map_err(|e| errno_refusal(path, e))?;
            return Ok((fd, None));
        }
        let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        if name == "." || name == ".." || name.is_empty() {
            return Err(refuse(
                Denial::PermissionDenied,
                format!("{path}: refused, the last component must be a plain name"),
            ));
        }
        let fd = open_dir_beneath(&root.dir, dir).map_err(|e| errno_refusal(path, e))?;
        Ok((fd, Some(name.to_string())))
    }

    /// Removes the file, symlink or empty directory `path` beneath its root (a read-only
    /// root refuses, a root itself is never removed).
    pub fn remove(&self, path: &str) -> PResult<()> {
        let (parent, name) = self.parent(path)?;
        let Some(name) = name else {
            return Err(refuse(
                Denial::PermissionDenied,
                format!("{path}: a root is not removed"),
            ));
        };
        // unlinkat never follows a symlink: a link is removed, not what it points to.
        match rustix::fs::unlinkat(&parent, name.as_str(), AtFlags::empty()) {
            Err(Errno::ISDIR) => rustix::fs::unlinkat(&parent, name.as_str(), AtFlags::REMOVEDIR),
            r => r,
        }
        .map_err(|e| errno_refusal(path, e))
    }

    /// Creates a directory (an existing directory is fine).
    pub fn mkdir(&self, path: &str, mode: u32) -> PResult<()> {
        let (parent, name) = self.parent(path)?;
        let Some(name) = name else { return Ok(()) };
        let mode = crate::commit::file_mode(mode, self.keep_special);
        match mkdir_in(&parent, &name, mode) {
            Ok(()) => Ok(()),
            Err(Errno::NOTDIR) => Err(refuse(
                Denial::NotADirectory,
                format!("{path}: exists and is not a directory"),
            )),
            Err(e) => Err(errno_refusal(path, e)),
        }
    }
}

/// A file being written: `.<name>.ferry-part` in its directory until committed, with its
/// resume journal `.<name>.ferry-part.journal` next to it ([`crate::journal`]).
///
/// It is its own cleanup guard: dropped without [`PartFile::commit`] / [`PartFile::place`],
/// the part and its journal are removed, unless the journal vouches for verified bytes (a
/// connection that broke mid-upload keeps its verified prefix for `--resume`).
/// [`PartFile::discard`] removes them whatever the journal says (a refusal, a full disk, a
/// failed check: nothing there is worth resuming).
pub struct PartFile {
    dir: Arc<OwnedFd>,
    name: String,
    tmp: String,
    /// Whether a journal may sit next to the part (not for a file that arrived whole).
    journaled: bool,
    /// Whether the mode keeps setuid, setgid and sticky bits (the server's config).
    keep_special: bool,
    /// Set once the part was renamed into place or removed: nothing left to clean up.
    settled: bool,
    /// The open temporary file.
    pub file: File,
}

/// The directory `path` lies in (open) and its last component; a root itself is refused.
fn file_parent(roots: &Roots, path: &str) -> PResult<(OwnedFd, String)> {
    match roots.parent(path)? {
        (dir, Some(name)) => Ok((dir, name)),
        (_, None) => Err(refuse(
            Denial::IsADirectory,
            format!("{path}: is a root directory"),
        )),
    }
}

/// The refusal of something that is neither a regular file nor a directory.
fn not_regular(path: &str, st: &rustix::fs::Stat) -> Refusal {
    use rustix::fs::FileType;
    let what = match FileType::from_raw_mode(st.st_mode) {
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Symlink => "a symbolic link",
        _ => "not a regular file",
    };
    refuse(
        Denial::Unsupported,
        format!("{path}: {what}; only regular files are copied"),
    )
}

/// Checks what an upload would replace at `name` in `dir`, before any data moves: nothing,
/// a regular file that is writable (or any regular file with `force`), or a symbolic link
/// (the rename replaces the link, never what it points to). A directory, a FIFO, a device,
/// a socket or (without `force`) a read-only file is refused.
fn check_target(dir: &OwnedFd, name: &str, path: &str, force: bool) -> PResult<()> {
    let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(errno_refusal(path, e)),
    };
    match kind_of(&st) {
        FileKind::File => {}
        FileKind::Symlink => return Ok(()),
        FileKind::Dir => {
            return Err(refuse(
                Denial::IsADirectory,
                format!("{path}: is a directory; nothing was written (name a path inside it)"),
            ))
        }
        FileKind::Other => return Err(not_regular(path, &st)),
    }
    let read_only = st.st_mode & 0o222 == 0
        || rustix::fs::accessat(dir, name, Access::WRITE_OK, AtFlags::EACCESS).is_err();
    if read_only && !force {
        return Err(refuse(
            Denial::PermissionDenied,
            format!(
                "{path}: the file there is read-only; not replaced (ferry cp --force replaces it)"
            ),
        ));
    }
    Ok(())
}

/// The temporary name a file is written under before its rename.
pub fn part_name(name: &str) -> String {
    format!(".{name}.ferry-part")
}

impl PartFile {
    /// Creates an empty temporary file for a file of `path` that arrived whole (no journal:
    /// nothing to resume). A stale part of an earlier upload is truncated, and its journal
    /// removed first (a journal only means something with its part). What `path` names now
    /// is checked first (see `check_target`).
    pub fn whole(roots: &Roots, path: &str, force: bool) -> PResult<PartFile> {
        let (dir, name) = file_parent(roots, path)?;
        check_target(&dir, &name, path, force)?;
        let tmp = part_name(&name);
        let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::CREATE;
        let mode = Mode::from_raw_mode(0o600);
        let flags = flags | OFlags::NONBLOCK;
        let fd = match rustix::fs::openat(&dir, tmp.as_str(), flags | OFlags::EXCL, mode) {
            Err(Errno::EXIST) => {
                match rustix::fs::unlinkat(&dir, journal_name(&tmp).as_str(), AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(e) => return Err(io_refusal(path, &e.into())),
                }
                rustix::fs::openat(&dir, tmp.as_str(), flags | OFlags::TRUNC, mode)
            }
            r => r,
        }
        .map_err(std::io::Error::from)
        .and_then(regular_part)
        .map_err(|e| io_refusal(path, &e))?;
        Ok(PartFile {
            dir: Arc::new(dir),
            name,
            tmp,
            journaled: false,
            keep_special: roots.keep_special,
            settled: false,
            file: File::from(fd),
        })
    }

    /// Opens the temporary file for a transfer of `ident` into `path`: with `resume`, a
    /// journaled part of the same source is continued (see [`crate::landing::open_part`]);
    /// otherwise it starts empty. What `path` names now is checked first (see
    /// `check_target`). Returns the part, its verified-prefix tracker and what was found.
    pub fn open(
        roots: &Roots,
        path: &str,
        ident: Ident,
        block: u32,
        how: Target,
    ) -> PResult<(PartFile, Progress, Found)> {
        let (dir, name) = file_parent(roots, path)?;
        check_target(&dir, &name, path, how.force)?;
        let tmp = part_name(&name);
        let open = |n: &str, how: OpenHow| -> std::io::Result<File> {
            let mut flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            if how == OpenHow::Truncate {
                flags |= OFlags::CREATE | OFlags::TRUNC;
            }
            let fd = rustix::fs::openat(
                &dir,
                n,
                flags | OFlags::NONBLOCK,
                Mode::from_raw_mode(0o600),
            )?;
            regular_part(fd).map(File::from)
        };
        let (file, progress, found) = match open_part(&open, &tmp, ident, block, how.resume) {
            Ok(p) => p,
            Err(e) => {
                // A journal or part created before the failure (a full disk) goes too.
                remove_temp(&dir, &tmp);
                return Err(io_refusal(path, &e));
            }
        };
        let part = PartFile {
            dir: Arc::new(dir),
            name,
            tmp,
            journaled: true,
            keep_special: roots.keep_special,
            settled: false,
            file,
        };
        Ok((part, progress, found))
    }

    /// Sets the mode (and the source's mtime, when known), fsyncs, drops the journal,
    /// renames into place and fsyncs the directory.
    /// A part that cannot be settled (a full disk at the fsync) is removed.
    pub fn commit(self, mode: u32, mtime: Option<std::time::SystemTime>) -> std::io::Result<()> {
        if let Err(e) = self.settle(mode, mtime) {
            self.discard();
            return Err(e);
        }
        let dir = self.place()?;
        rustix::fs::fsync(&*dir)?;
        Ok(())
    }

    /// The first half of [`PartFile::commit`]: sets the mode (the sender's, through the
    /// umask and without special bits unless the config keeps them; see
    /// [`crate::commit::file_mode`]) and the mtime, and fsyncs the file.
    pub fn settle(&self, mode: u32, mtime: Option<std::time::SystemTime>) -> std::io::Result<()> {
        let mode = crate::commit::file_mode(mode, self.keep_special);
        rustix::fs::fchmod(&self.file, Mode::from_raw_mode(mode))?;
        if let Some(t) = mtime {
            self.file.set_modified(t)?;
        }
        self.file.sync_all()
    }

    /// The second half of [`PartFile::commit`] but the directory's fsync: drops the journal
    /// and renames into place; returns the directory, for the caller to fsync. If it fails,
    /// the part and its journal are removed (the data is not worth a resume: it was whole).
    pub fn place(mut self) -> std::io::Result<Arc<OwnedFd>> {
        // The journal goes first: a crash before the rename leaves a part with no journal,
        // which is never trusted.
        if self.journaled {
            match rustix::fs::unlinkat(
                &*self.dir,
                journal_name(&self.tmp).as_str(),
                AtFlags::empty(),
            ) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
        rustix::fs::renameat(
            &*self.dir,
            self.tmp.as_str(),
            &*self.dir,
            self.name.as_str(),
        )?;
        self.settled = true;
        Ok(self.dir.clone())
    }

    /// Removes the temporary file and its journal.
    pub fn discard(mut self) {
        remove_temp(&self.dir, &self.tmp);
        self.settled = true;
    }

    /// Whether the journal vouches for verified bytes a resume would not send again.
    fn resumable(&self) -> bool {
        if !self.journaled {
            return false;
        }
        // Non-blocking: a FIFO under the journal's name must not stall a drop.
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        rustix::fs::openat(
            &*self.dir,
            journal_name(&self.tmp).as_str(),
            flags,
            Mode::empty(),
        )
        .ok()
        .and_then(|fd| Journal::load(File::from(fd)))
        .is_some_and(|j| j.ranges().total() > 0)
    }
}

impl Drop for PartFile {
    /// The cleanup guard: an unsettled part goes, unless its journal holds verified bytes.
    fn drop(&mut self) {
        if !self.settled && !self.resumable() {
            remove_temp(&self.dir, &self.tmp);
        }
    }
}

/// How an upload may treat its destination.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Target {
    /// Continue a journaled part of the same source.
    pub resume: bool,
    /// Replace a read-only file (the client's `--force`).
    pub force: bool,
}

/// `fd`, a part file or journal just opened (non-blocking, so a FIFO planted under that
/// name did not stall the open), if it is a regular file; blocking again.
fn regular_part(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    let st = rustix::fs::fstat(&fd)?;
    if kind_of(&st) != FileKind::File {
        return Err(std::io::Error::other(
            "a temporary file's name is taken by something that is not a regular file",
        ));
    }
    rustix::fs::fcntl_setfl(&fd, OFlags::empty())?;
    Ok(fd)
}

/// Removes part file `tmp` in `dir` and its journal (either may be missing).
fn remove_temp(dir: &OwnedFd, tmp: &str) {
    let _ = rustix::fs::unlinkat(dir, journal_name(tmp).as_str(), AtFlags::empty());
    let _ = rustix::fs::unlinkat(dir, tmp, AtFlags::empty());
}

/// The refusal of an I/O error on `path`, classified by errno.
pub fn io_refusal(path: &str, e: &std::io::Error) -> Refusal {
    match e.raw_os_error() {
        Some(n) => errno_refusal(path, Errno::from_raw_os_error(n)),
        None => refuse(Denial::Io, format!("{path}: {e}")),
    }
}
