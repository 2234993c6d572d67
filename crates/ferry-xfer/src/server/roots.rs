//! The exported roots and their sandbox (`openat2` beneath each root), and part files.

use std::fs::File;
use std::os::fd::OwnedFd;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::beneath::{mkdir_in, open_beneath, open_dir_beneath};
use crate::config::ServerConfig;
use crate::error::{Result, XferError};
use crate::journal::{journal_name, open_part, Found, Ident, OpenHow, Progress};
use crate::proto::{Entry, EntryKind, ErrorCode};

/// An exported directory, held open.
struct Root {
    name: String,
    dir: OwnedFd,
}

/// Why a path operation failed, as the ERROR frame the client gets.
#[derive(Debug)]
pub struct Refusal {
    /// The code.
    pub code: ErrorCode,
    /// The message.
    pub message: String,
}

pub(super) type PResult<T> = std::result::Result<T, Refusal>;

pub(crate) fn refuse(code: ErrorCode, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

fn errno_refusal(path: &str, e: Errno) -> Refusal {
    let code = match e {
        Errno::NOENT => ErrorCode::NotFound,
        Errno::XDEV | Errno::LOOP => {
            return refuse(
                ErrorCode::PermissionDenied,
                format!("{path}: refused, the path leads outside its root"),
            )
        }
        Errno::ACCESS | Errno::PERM => ErrorCode::PermissionDenied,
        Errno::NOSPC | Errno::DQUOT => ErrorCode::NoSpace,
        Errno::NOTDIR => ErrorCode::NotADirectory,
        Errno::ISDIR => ErrorCode::IsADirectory,
        _ => ErrorCode::Io,
    };
    refuse(code, format!("{path}: {}", std::io::Error::from(e)))
}

/// The exported roots and the sandboxed operations on them.
pub struct Roots {
    roots: Vec<Root>,
}

fn kind_of(st: &rustix::fs::Stat) -> EntryKind {
    match rustix::fs::FileType::from_raw_mode(st.st_mode) {
        rustix::fs::FileType::RegularFile => EntryKind::File,
        rustix::fs::FileType::Directory => EntryKind::Dir,
        rustix::fs::FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

fn entry_of(name: &str, st: &rustix::fs::Stat) -> Entry {
    let kind = kind_of(st);
    Entry {
        kind,
        mode: st.st_mode & 0o7777,
        size: if kind == EntryKind::File {
            st.st_size as u64
        } else {
            0
        },
        mtime: st.st_mtime,
        name: name.to_string(),
    }
}

impl Roots {
    /// Opens every root directory of `cfg`.
    pub fn open(cfg: &ServerConfig) -> Result<Roots> {
        let mut roots = Vec::new();
        for r in &cfg.roots {
            let dir = rustix::fs::open(
                &r.path,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| {
                XferError::io(format!("root {} ({})", r.name, r.path.display()), &e.into())
            })?;
            roots.push(Root {
                name: r.name.clone(),
                dir,
            });
        }
        Ok(Roots { roots })
    }

    /// Splits `root/rel` and finds the root; `rel` is "." for the root itself.
    fn split<'p>(&self, path: &'p str) -> PResult<(&Root, &'p str)> {
        if path.starts_with('/') {
            return Err(refuse(
                ErrorCode::PermissionDenied,
                format!("{path}: refused, paths are root/relative/path, never absolute"),
            ));
        }
        if path.contains('\0') {
            return Err(refuse(ErrorCode::BadRequest, "path contains a NUL byte"));
        }
        let (name, rel) = path.split_once('/').unwrap_or((path, ""));
        let root = self.roots.iter().find(|r| r.name == name).ok_or_else(|| {
            refuse(
                ErrorCode::NotFound,
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
                ErrorCode::PermissionDenied,
                format!("{path}: refused, absolute path inside a root"),
            ));
        }
        Ok((root, if rel.is_empty() { "." } else { rel }))
    }

    fn open_at(&self, path: &str, flags: OFlags) -> PResult<OwnedFd> {
        let (root, rel) = self.split(path)?;
        open_beneath(&root.dir, rel, flags).map_err(|e| errno_refusal(path, e))
    }

    /// Opens a regular file for reading.
    pub fn open_read(&self, path: &str) -> PResult<(File, rustix::fs::Stat)> {
        let fd = self.open_at(path, OFlags::RDONLY)?;
        let st = rustix::fs::fstat(&fd).map_err(|e| errno_refusal(path, e))?;
        if kind_of(&st) != EntryKind::File {
            return Err(refuse(
                ErrorCode::IsADirectory,
                format!("{path}: not a regular file (use -r for directories)"),
            ));
        }
        Ok((File::from(fd), st))
    }

    /// Describes a path. Symlinks are followed as long as they stay inside the root.
    pub fn stat(&self, path: &str) -> PResult<Entry> {
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
    pub fn list(&self, path: &str) -> PResult<Vec<Entry>> {
        if path.trim_matches('/').is_empty() {
            return Ok(self
                .roots
                .iter()
                .map(|r| Entry {
                    kind: EntryKind::Dir,
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
            let st =
                rustix::fs::statat(&fd, ent.file_name(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| errno_refusal(path, e))?;
            out.push(entry_of(&name, &st));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The directory holding `path`'s last component, opened inside the sandbox, and that
    /// component (None when the path is a root itself).
    fn parent(&self, path: &str) -> PResult<(OwnedFd, Option<String>)> {
        let (root, rel) = self.split(path)?;
        if rel == "." {
            let fd = rustix::io::dup(&root.dir).map_err(|e| errno_refusal(path, e))?;
            return Ok((fd, None));
        }
        let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        if name == "." || name == ".." || name.is_empty() {
            return Err(refuse(
                ErrorCode::PermissionDenied,
                format!("{path}: refused, the last component must be a plain name"),
            ));
        }
        let fd = open_dir_beneath(&root.dir, dir).map_err(|e| errno_refusal(path, e))?;
        Ok((fd, Some(name.to_string())))
    }

    /// Creates a directory (an existing directory is fine).
    pub fn mkdir(&self, path: &str, mode: u32) -> PResult<()> {
        let (parent, name) = self.parent(path)?;
        let Some(name) = name else { return Ok(()) };
        match mkdir_in(&parent, &name, mode) {
            Ok(()) => Ok(()),
            Err(Errno::NOTDIR) => Err(refuse(
                ErrorCode::NotADirectory,
                format!("{path}: exists and is not a directory"),
            )),
            Err(e) => Err(errno_refusal(path, e)),
        }
    }
}

/// A file being written: `.<name>.ferry-part` in its directory until committed, with its
/// resume journal `.<name>.ferry-part.journal` next to it ([`crate::journal`]).
pub struct PartFile {
    dir: OwnedFd,
    name: String,
    tmp: String,
    /// Whether a journal may sit next to the part (not for a file that arrived whole).
    journaled: bool,
    /// The open temporary file.
    pub file: File,
}

/// The directory `path` lies in (open) and its last component; a root itself is refused.
fn file_parent(roots: &Roots, path: &str) -> PResult<(OwnedFd, String)> {
    match roots.parent(path)? {
        (dir, Some(name)) => Ok((dir, name)),
        (_, None) => Err(refuse(
            ErrorCode::IsADirectory,
            format!("{path}: is a root directory"),
        )),
    }
}

/// The temporary name a file is written under before its rename.
pub fn part_name(name: &str) -> String {
    format!(".{name}.ferry-part")
}

impl PartFile {
    /// Creates the temporary file for `path` (truncating a stale one) with a fresh journal.
    pub fn create(roots: &Roots, path: &str) -> PResult<PartFile> {
        let ident = Ident { size: 0, mtime: 0 };
        Self::open(roots, path, ident, 0, false).map(|(p, _, _)| p)
    }

    /// Creates an empty temporary file for a file of `path` that arrived whole (no journal:
    /// nothing to resume). A stale part of an earlier upload is truncated, and its journal
    /// removed first (a journal only means something with its part).
    pub fn whole(roots: &Roots, path: &str) -> PResult<PartFile> {
        let (dir, name) = file_parent(roots, path)?;
        let tmp = part_name(&name);
        let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::CREATE;
        let mode = Mode::from_raw_mode(0o600);
        let fd = match rustix::fs::openat(&dir, tmp.as_str(), flags | OFlags::EXCL, mode) {
            Err(Errno::EXIST) => {
                match rustix::fs::unlinkat(
                    &dir,
                    journal_name(&tmp).as_str(),
                    rustix::fs::AtFlags::empty(),
                ) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(e) => return Err(io_refusal(path, &e.into())),
                }
                rustix::fs::openat(&dir, tmp.as_str(), flags | OFlags::TRUNC, mode)
            }
            r => r,
        }
        .map_err(|e| io_refusal(path, &e.into()))?;
        Ok(PartFile {
            dir,
            name,
            tmp,
            journaled: false,
            file: File::from(fd),
        })
    }

    /// Opens the temporary file for a transfer of `ident` into `path`: with `resume`, a
    /// journaled part of the same source is continued (see [`crate::journal::open_part`]);
    /// otherwise it starts empty. Returns the part, its verified-prefix tracker and what was
    /// found.
    pub fn open(
        roots: &Roots,
        path: &str,
        ident: Ident,
        block: u32,
        resume: bool,
    ) -> PResult<(PartFile, Progress, Found)> {
        let (dir, name) = file_parent(roots, path)?;
        let tmp = part_name(&name);
        let open = |n: &str, how: OpenHow| -> std::io::Result<File> {
            let mut flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            if how == OpenHow::Truncate {
                flags |= OFlags::CREATE | OFlags::TRUNC;
            }
            let fd = rustix::fs::openat(&dir, n, flags, Mode::from_raw_mode(0o600))?;
            Ok(File::from(fd))
        };
        let (file, progress, found) =
            open_part(&open, &tmp, ident, block, resume).map_err(|e| io_refusal(path, &e))?;
        Ok((
            PartFile {
                dir,
                name,
                tmp,
                journaled: true,
                file,
            },
            progress,
            found,
        ))
    }

    /// Sets the mode (and the source's mtime, when known), fsyncs, drops the journal,
    /// renames into place and fsyncs the directory.
    pub fn commit(self, mode: u32, mtime: Option<std::time::SystemTime>) -> std::io::Result<()> {
        self.settle(mode, mtime)?;
        let dir = self.place()?;
        rustix::fs::fsync(&dir)?;
        Ok(())
    }

    /// The first half of [`PartFile::commit`]: sets the mode (and mtime) and fsyncs the file.
    pub fn settle(&self, mode: u32, mtime: Option<std::time::SystemTime>) -> std::io::Result<()> {
        rustix::fs::fchmod(&self.file, Mode::from_raw_mode(mode & 0o7777))?;
        if let Some(t) = mtime {
            self.file.set_modified(t)?;
        }
        self.file.sync_all()
    }

    /// The second half of [`PartFile::commit`] but the directory's fsync: drops the journal
    /// and renames into place; returns the directory, for the caller to fsync.
    pub fn place(self) -> std::io::Result<OwnedFd> {
        // The journal goes first: a crash before the rename leaves a part with no journal,
        // which is never trusted.
        if self.journaled {
            match rustix::fs::unlinkat(
                &self.dir,
                journal_name(&self.tmp).as_str(),
                rustix::fs::AtFlags::empty(),
            ) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
        rustix::fs::renameat(&self.dir, self.tmp.as_str(), &self.dir, self.name.as_str())?;
        Ok(self.dir)
    }

    /// Removes the temporary file and its journal.
    pub fn discard(self) {
        let _ = rustix::fs::unlinkat(
            &self.dir,
            journal_name(&self.tmp).as_str(),
            rustix::fs::AtFlags::empty(),
        );
        let _ = rustix::fs::unlinkat(&self.dir, self.tmp.as_str(), rustix::fs::AtFlags::empty());
    }
}

pub(super) fn io_refusal(path: &str, e: &std::io::Error) -> Refusal {
    match e.raw_os_error() {
        Some(n) => errno_refusal(path, Errno::from_raw_os_error(n)),
        None => refuse(ErrorCode::Io, format!("{path}: {e}")),
    }
}
