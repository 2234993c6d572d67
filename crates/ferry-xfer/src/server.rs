//! `ferry serve`: exported roots behind a sandbox, token auth, a thread per connection.
//!
//! Every path a client names is `root/relative/path`. The relative part is opened with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` relative to the root's directory
//! descriptor, so `..`, absolute paths and symlinks that lead outside the root are refused
//! by the kernel, whatever races happen meanwhile. New files are created inside a directory
//! opened that way, under a temporary name, and renamed into place only after their BLAKE3
//! matched and they were fsynced.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_exs::runtime::{default_config, EventQueue, ExsListener};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::config::ServerConfig;
use crate::error::{Kind, Result, XferError};
use crate::journal::{journal_name, open_part, Found, Ident, OpenHow, Progress, RangeSet};
use crate::link::{BlockSender, BlockWriter, Link, Source, Span, HANDSHAKE_TIMEOUT};
use crate::mem::{Virtual, MEM_ROOT};
use crate::proto::{self, BlockHeader, Entry, EntryKind, ErrorCode, Msg, BLOCK_HEADER_LEN};
use crate::session::{Session, Upload};

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

type PResult<T> = std::result::Result<T, Refusal>;

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

/// Resolve flags for every client path.
const BENEATH: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

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
        rustix::fs::openat2(
            &root.dir,
            rel,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
            BENEATH,
        )
        .map_err(|e| errno_refusal(path, e))
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
        let dir = if dir.is_empty() { "." } else { dir };
        let fd = rustix::fs::openat2(
            &root.dir,
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            BENEATH,
        )
        .map_err(|e| errno_refusal(path, e))?;
        Ok((fd, Some(name.to_string())))
    }

    /// Creates a directory (an existing directory is fine).
    pub fn mkdir(&self, path: &str, mode: u32) -> PResult<()> {
        let (parent, name) = self.parent(path)?;
        let Some(name) = name else { return Ok(()) };
        match rustix::fs::mkdirat(&parent, name.as_str(), Mode::from_raw_mode(mode & 0o7777)) {
            Ok(()) => Ok(()),
            Err(Errno::EXIST) => {
                let st = rustix::fs::statat(
                    &parent,
                    name.as_str(),
                    rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(|e| errno_refusal(path, e))?;
                if kind_of(&st) == EntryKind::Dir {
                    Ok(())
                } else {
                    Err(refuse(
                        ErrorCode::NotADirectory,
                        format!("{path}: exists and is not a directory"),
                    ))
                }
            }
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
    /// The open temporary file.
    pub file: File,
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
        let (dir, name) = roots.parent(path)?;
        let Some(name) = name else {
            return Err(refuse(
                ErrorCode::IsADirectory,
                format!("{path}: is a root directory"),
            ));
        };
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
                file,
            },
            progress,
            found,
        ))
    }

    /// Sets the mode (and the source's mtime, when known), fsyncs, drops the journal,
    /// renames into place and fsyncs the directory.
    pub fn commit(self, mode: u32, mtime: Option<std::time::SystemTime>) -> std::io::Result<()> {
        rustix::fs::fchmod(&self.file, Mode::from_raw_mode(mode & 0o7777))?;
        if let Some(t) = mtime {
            self.file.set_modified(t)?;
        }
        self.file.sync_all()?;
        // The journal goes first: a crash before the rename leaves a part with no journal,
        // which is never trusted.
        match rustix::fs::unlinkat(
            &self.dir,
            journal_name(&self.tmp).as_str(),
            rustix::fs::AtFlags::empty(),
        ) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
        rustix::fs::renameat(&self.dir, self.tmp.as_str(), &self.dir, self.name.as_str())?;
        rustix::fs::fsync(&self.dir)?;
        Ok(())
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

fn io_refusal(path: &str, e: &std::io::Error) -> Refusal {
    match e.raw_os_error() {
        Some(n) => errno_refusal(path, Errno::from_raw_os_error(n)),
        None => refuse(ErrorCode::Io, format!("{path}: {e}")),
    }
}

/// Receives the BLOCKs and FILE_DONE of one transfer into `file`: verifies each block's
/// CRC-32C, writes the good ones and hashes the file in order. Shared by the server (PUT)
/// and the client (GET).
pub struct BlockSink {
    file_id: u32,
    size: u64,
    hasher: blake3::Hasher,
    hashed: u64,
    rehash: bool,
    /// Ranges whose CRC failed in the current round.
    pub bad: Vec<(u64, u32)>,
    /// Blocks that failed their CRC, over all rounds.
    pub bad_total: u64,
    /// The first write error (the transfer keeps draining blocks, then reports it).
    pub io_error: Option<std::io::Error>,
    /// The resume journal's view of the part file, when the receiver keeps one.
    pub journal: Option<Progress>,
    /// For one range of a parallel transfer: the range blocks must lie in.
    window: Option<(u64, u64)>,
    /// For one range of a parallel transfer: what was written from good blocks.
    pub got: RangeSet,
    /// A direct-I/O (`O_DIRECT`) handle on the file, when asked for and allowed.
    direct: Option<File>,
    /// An aligned copy of a payload that arrived unaligned, for direct writes.
    bounce: Vec<u8>,
}

impl BlockSink {
    /// A sink for transfer `file_id` of a file of `size` bytes.
    pub fn new(file_id: u32, size: u64) -> Self {
        BlockSink {
            file_id,
            size,
            hasher: blake3::Hasher::new(),
            hashed: 0,
            rehash: false,
            bad: Vec::new(),
            bad_total: 0,
            io_error: None,
            journal: None,
            window: None,
            got: RangeSet::new(),
            direct: None,
            bounce: Vec::new(),
        }
    }

    /// Writes aligned blocks of `file` with direct I/O (`O_DIRECT`, bypassing the page
    /// cache) where its filesystem allows it; unaligned ones (a file's tail) go through the
    /// cache. Without direct I/O there (a warning says so) every write goes through the cache.
    pub fn set_direct(&mut self, file: &File) {
        self.direct = crate::link::open_direct_or_warn(file, true);
    }

    /// A sink for the range `[lo, hi)` of a file of `size` bytes, one piece of a parallel
    /// transfer: blocks outside it are refused, nothing is hashed (the whole file is hashed
    /// in order as its ranges complete), and [`BlockSink::got`] records what was written.
    pub fn range(file_id: u32, size: u64, lo: u64, hi: u64) -> Self {
        let mut s = Self::new(file_id, size);
        s.rehash = true;
        s.window = Some((lo, hi));
        s
    }

    /// A sink that journals its verified prefix as it goes ([`crate::journal`]) and starts
    /// where the journal's prefix ends (those bytes are not expected again; the final hash
    /// then re-reads the whole file).
    pub fn journaled(file_id: u32, size: u64, journal: Progress) -> Self {
        let mut s = Self::new(file_id, size);
        s.rehash = journal.prefix() > 0;
        s.journal = Some(journal);
        s
    }

    /// The transfer's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Records what is verified so far in the journal (fsync first), e.g. before giving up
    /// on a broken connection.
    pub fn checkpoint(&mut self, file: &File) -> std::io::Result<()> {
        match &mut self.journal {
            Some(j) => j.checkpoint(file),
            None => Ok(()),
        }
    }

    /// Waits for the background checkpoints and stops their thread; an error they met
    /// becomes the transfer's write error.
    pub fn settle(&mut self) {
        if let Some(j) = &mut self.journal {
            if let Err(e) = j.settle() {
                self.io_error.get_or_insert(e);
            }
        }
    }

    /// Checks one BLOCK against its CRC-32C and the transfer's bounds; writes it if good
    /// (to `file`; `None` is the null sink of memory mode: nothing is written or hashed),
    /// remembers its range for a re-fetch if not.
    pub fn block(&mut self, file: Option<&File>, h: &BlockHeader, payload: &[u8]) -> Result<()> {
        let end = h.offset.saturating_add(u64::from(h.len));
        let outside = self
            .window
            .is_some_and(|(lo, hi)| h.offset < lo || end > hi);
        if h.file_id != self.file_id || end > self.size || outside {
            return Err(XferError::conn(format!(
                "the peer sent a block outside the transfer (file {} offset {} len {})",
                h.file_id, h.offset, h.len
            )));
        }
        if crc32c::crc32c(payload) != h.crc32c {
            tracing::warn!(
                offset = h.offset,
                len = h.len,
                "block CRC mismatch; it will be sent again"
            );
            self.bad.push((h.offset, h.len));
            self.bad_total += 1;
            return Ok(());
        }
        let Some(file) = file else {
            if self.window.is_some() {
                self.got.insert(h.offset, end);
            }
            return Ok(());
        };
        if self.io_error.is_none() {
            match write_at(file, &mut self.direct, &mut self.bounce, payload, h.offset) {
                Err(e) => self.io_error = Some(e),
                Ok(()) => {
                    if self.window.is_some() {
                        self.got.insert(h.offset, end);
                    }
                    if let Some(j) = &mut self.journal {
                        j.good(h.offset, u64::from(h.len));
                        if j.due() {
                            if let Err(e) = j.checkpoint_in_background(file) {
                                self.io_error = Some(e);
                            }
                        }
                    }
                }
            }
        }
        if h.offset == self.hashed && !self.rehash {
            self.hasher.update(payload);
            self.hashed += u64::from(h.len);
        } else {
            self.rehash = true;
        }
        Ok(())
    }

    /// The BLAKE3 of what was written (re-reading the file if blocks arrived out of order).
    pub fn hash(&mut self, file: &File) -> std::io::Result<[u8; 32]> {
        if !self.rehash && self.hashed == self.size {
            return Ok(*self.hasher.finalize().as_bytes());
        }
        hash_file(file, self.size)
    }
}

/// Writes `payload` at `offset` of `file`: through `direct` when the block is aligned (from
/// an aligned copy in `bounce` if the payload itself is not), else through the page cache. A
/// filesystem that refuses a direct write (`EINVAL`) gets this and later blocks cached.
fn write_at(
    file: &File,
    direct: &mut Option<File>,
    bounce: &mut Vec<u8>,
    payload: &[u8],
    offset: u64,
) -> std::io::Result<()> {
    use crate::link::{direct_aligned, DIRECT_ALIGN};
    let Some(d) = direct.as_ref() else {
        return file.write_all_at(payload, offset);
    };
    if !direct_aligned(0, offset, payload.len()) {
        return file.write_all_at(payload, offset);
    }
    let res = if direct_aligned(payload.as_ptr() as usize, offset, payload.len()) {
        d.write_all_at(payload, offset)
    } else {
        if bounce.len() < payload.len() + DIRECT_ALIGN {
            bounce.resize(payload.len() + DIRECT_ALIGN, 0);
        }
        let start = bounce.as_ptr().align_offset(DIRECT_ALIGN);
        let copy = &mut bounce[start..start + payload.len()];
        copy.copy_from_slice(payload);
        d.write_all_at(copy, offset)
    };
    match res {
        Err(e) if e.raw_os_error() == Some(Errno::INVAL.raw_os_error()) => {
            tracing::warn!("direct I/O write refused ({e}): going through the page cache");
            *direct = None;
            file.write_all_at(payload, offset)
        }
        r => r,
    }
}

/// BLAKE3 of the first `size` bytes of `file`.
pub fn hash_file(file: &File, size: u64) -> std::io::Result<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    while pos < size {
        let n = (size - pos).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], pos)?;
        h.update(&buf[..n]);
        pos += n as u64;
    }
    Ok(*h.finalize().as_bytes())
}

/// A running server's shared state.
pub struct Server {
    cfg: ServerConfig,
    roots: Roots,
    sessions: AtomicU64,
    /// Files a PUT is writing (their `root/path`), so a resumed PUT never shares a part file
    /// with the connection of a client that vanished but is not noticed gone yet.
    /// A newer PUT of the same file raises the holder's flag: the holder journals and lets go
    /// (the usual holder is a vanished client's connection the fabric has not noticed).
    busy: Arc<Mutex<HashMap<String, Arc<AtomicBool>>>>,
    /// Live sessions (parallel streams join them by id).
    live: Mutex<HashMap<u64, Arc<Session>>>,
    /// Set once a drain starts: new requests are refused with Unavailable.
    draining: AtomicBool,
    /// Set when the drain's grace period is over: transfers in flight journal and stop.
    stop: AtomicBool,
    /// GETs and PUTs being served.
    in_flight: AtomicUsize,
    /// Transfers stopped by [`Server::drain`].
    interrupted: AtomicUsize,
    /// Transfers in flight when the drain began (`usize::MAX` before).
    at_drain: AtomicUsize,
}

/// What [`Server::drain`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainReport {
    /// Transfers in flight when the drain began.
    pub in_flight: usize,
    /// Transfers stopped after the grace period (uploads journaled here; downloads are
    /// journaled by their clients).
    pub interrupted: usize,
    /// Transfers that neither finished nor stopped in time (their journals hold their last
    /// checkpoint).
    pub abandoned: usize,
}

/// How long a PUT waits for another connection to let go of the same file.
const BUSY_WAIT: Duration = Duration::from_secs(20);

/// A PUT's receive loop looks at the drain and takeover flags this often while idle.
const RECV_SLICE: Duration = Duration::from_millis(250);

/// A GET is sent in pieces of this many bytes, so a drain can stop it between them.
const GET_PIECE: u64 = 32 << 20;

/// Counts a transfer in flight while it lives.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        InFlight(n)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A claim on a file being written; released on drop.
pub(crate) struct Claim {
    busy: Arc<Mutex<HashMap<String, Arc<AtomicBool>>>>,
    key: String,
    /// Raised when a newer PUT of the same file wants it.
    pub(crate) yield_to_newer: Arc<AtomicBool>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.busy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}

impl Server {
    /// Validates `cfg` and opens its roots.
    pub fn new(cfg: ServerConfig) -> Result<Arc<Server>> {
        cfg.validate()?;
        let roots = Roots::open(&cfg)?;
        Ok(Arc::new(Server {
            cfg,
            roots,
            sessions: AtomicU64::new(1),
            busy: Arc::new(Mutex::new(HashMap::new())),
            live: Mutex::new(HashMap::new()),
            draining: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            interrupted: AtomicUsize::new(0),
            at_drain: AtomicUsize::new(usize::MAX),
        }))
    }

    /// Binds the configured address.
    pub fn bind(&self) -> Result<ExsListener> {
        let addr: ferry_fabric::Address = self.cfg.listen.parse().map_err(|e| {
            XferError::new(
                Kind::Usage,
                format!("bad listen address {}: {e}", self.cfg.listen),
            )
        })?;
        ExsListener::bind(&self.cfg.listen, default_config(&addr)).map_err(|e| {
            XferError::conn(format!(
                "cannot listen on {}: {e} (is another server using it? pick another with --listen)",
                self.cfg.listen
            ))
        })
    }

    /// Accepts connections forever, serving each on its own thread. A failing connection
    /// ends only itself.
    pub fn serve(self: &Arc<Self>, listener: &ExsListener) -> Result<()> {
        self.serve_until(listener, &AtomicBool::new(false))
    }

    /// Like [`Server::serve`], until `quit` is set (checked a few times a second); then it
    /// stops accepting and returns, leaving the connections running (see [`Server::drain`]).
    pub fn serve_until(self: &Arc<Self>, listener: &ExsListener, quit: &AtomicBool) -> Result<()> {
        loop {
            if quit.load(Ordering::SeqCst) {
                return Ok(());
            }
            let inc = match listener.accept_incoming(Duration::from_millis(100)) {
                Ok(i) => i,
                Err(ferry_exs::runtime::Error::Timeout) => continue,
                Err(e) => {
                    tracing::debug!("accept: {e}");
                    continue;
                }
            };
            let me = self.clone();
            let peer = inc.peer_addr();
            let spawned = std::thread::Builder::new()
                .name("ferry-conn".into())
                .spawn(move || {
                    let q = match EventQueue::new() {
                        Ok(q) => q,
                        Err(e) => return tracing::warn!("{peer}: event queue: {e}"),
                    };
                    let sock = match inc.start(&q, HANDSHAKE_TIMEOUT) {
                        Ok(s) => s,
                        Err(e) => return tracing::info!("{peer}: handshake failed: {e}"),
                    };
                    let mut link = Link::new(sock, q);
                    match me.connection(&mut link) {
                        Ok(()) => tracing::debug!("{peer}: done"),
                        Err(e) => tracing::info!("{peer}: connection ended: {e}"),
                    }
                    link.close();
                });
            if let Err(e) = spawned {
                tracing::warn!("cannot start a connection thread: {e}");
            }
        }
    }

    /// Ends service gracefully: refuses new requests, lets the transfers in flight run for
    /// up to `grace`, then tells the rest to stop (an upload fsyncs its part file and
    /// journals its verified prefix; a download just ends, its client journals) and waits a
    /// little for them. The caller exits afterwards.
    pub fn drain(&self, grace: Duration) -> DrainReport {
        self.begin_drain();
        let in_flight = self.at_drain.load(Ordering::SeqCst);
        let wait = |limit: Duration| {
            let end = std::time::Instant::now() + limit;
            while self.in_flight.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        wait(grace);
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            self.stop.store(true, Ordering::SeqCst);
            wait(Duration::from_secs(5));
        }
        DrainReport {
            in_flight,
            interrupted: self.interrupted.load(Ordering::SeqCst),
            abandoned: self.in_flight.load(Ordering::SeqCst),
        }
    }

    /// Starts refusing new requests (with Unavailable) and notes how many transfers are in
    /// flight; cheap and callable from any thread (e.g. a signal-watching one) before
    /// [`Server::drain`]. Idempotent.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
        let n = self.in_flight.load(Ordering::SeqCst);
        let _ = self
            .at_drain
            .compare_exchange(usize::MAX, n, Ordering::SeqCst, Ordering::SeqCst);
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn stopped(&self, what: &str) -> XferError {
        self.interrupted.fetch_add(1, Ordering::SeqCst);
        XferError::conn(format!("{what}: the server is shutting down"))
    }

    /// Claims `path` for writing. If another connection holds it, asks that one to journal
    /// and let go (a PUT of a file supersedes an older one still writing it), waiting up
    /// to [`BUSY_WAIT`].
    fn claim(&self, path: &str) -> Option<Claim> {
        let key = path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect::<Vec<_>>()
            .join("/");
        let end = std::time::Instant::now() + BUSY_WAIT;
        loop {
            {
                let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
                match busy.get(&key) {
                    Some(holder) => holder.store(true, Ordering::SeqCst),
                    None => {
                        let flag = Arc::new(AtomicBool::new(false));
                        busy.insert(key.clone(), flag.clone());
                        return Some(Claim {
                            busy: self.busy.clone(),
                            key,
                            yield_to_newer: flag,
                        });
                    }
                }
            }
            if std::time::Instant::now() >= end || self.stopping() {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn authorized(&self, token: &str) -> bool {
        let mut ok = self.cfg.auth.anonymous;
        for t in &self.cfg.auth.tokens {
            ok |= crate::ct_eq(t.as_bytes(), token.as_bytes());
        }
        ok
    }

    /// Serves one connection: handshake, then requests in order until BYE or close.
    pub fn connection(&self, link: &mut Link) -> Result<()> {
        link.timeout = HANDSHAKE_TIMEOUT;
        link.post_ring(1, proto::MAX_CONTROL)?;
        let (major, block_size, token, join, stream) = match link.recv_msg()? {
            Msg::Hello {
                major,
                block_size,
                token,
                session,
                stream,
                ..
            } => (major, block_size, token, session, stream),
            m => return Err(XferError::conn(format!("expected HELLO, got {m:?}"))),
        };
        if major != proto::VERSION_MAJOR {
            let message = format!(
                "this server speaks ferry transfer protocol {}.{}, the client {major}.x: upgrade the older side",
                proto::VERSION_MAJOR,
                proto::VERSION_MINOR
            );
            link.send(&Msg::Error {
                code: ErrorCode::VersionMismatch,
                file_id: 0,
                message: message.clone(),
            })?;
            return Err(XferError::conn(message));
        }
        if !self.authorized(&token) {
            let message = if token.is_empty() {
                "this server needs a token: pass --token or set FERRY_TOKEN"
            } else {
                "the token was not accepted: check --token / FERRY_TOKEN against the server's [auth] tokens"
            };
            link.send(&Msg::Error {
                code: ErrorCode::AuthRefused,
                file_id: 0,
                message: message.into(),
            })?;
            // Let the refusal reach the client before the connection goes.
            std::thread::sleep(Duration::from_millis(50));
            return Err(XferError::new(Kind::Auth, "client refused: bad token"));
        }
        let session = match self.join(join, stream, &token) {
            Ok(s) => s,
            Err(r) => {
                let message = r.message.clone();
                reply_refusal(link, 0, r)?;
                std::thread::sleep(Duration::from_millis(50));
                return Err(XferError::conn(message));
            }
        };
        let _stream = StreamGuard {
            server: self,
            session: session.clone(),
        };
        let block = block_size.clamp(proto::MIN_BLOCK, self.cfg.block_size);
        link.send(&Msg::Welcome {
            major: proto::VERSION_MAJOR,
            minor: proto::VERSION_MINOR,
            block_size: block,
            session: session.id,
        })?;
        link.timeout = Duration::from_secs(600);
        link.post_ring(self.cfg.ring, BLOCK_HEADER_LEN + block as usize)?;
        let mut tx = BlockSender::new(block, self.cfg.ring, link.timeout)?;
        tx.direct = self.cfg.direct;
        loop {
            let msg = next_request(link, &session)?;
            if self.draining.load(Ordering::SeqCst) && msg != Msg::Bye {
                let file_id = match &msg {
                    Msg::Get { file_id, .. }
                    | Msg::Put { file_id, .. }
                    | Msg::Open { file_id, .. }
                    | Msg::PutRange { file_id, .. }
                    | Msg::Close { file_id, .. } => *file_id,
                    _ => 0,
                };
                reply_refusal(
                    link,
                    file_id,
                    refuse(
                        ErrorCode::Unavailable,
                        "the server is shutting down; try again shortly (ferry cp --retries does)",
                    ),
                )?;
                continue;
            }
            if self.cfg.mem && self.virtual_request(link, &mut tx, &msg, &session)? {
                continue;
            }
            match msg {
                Msg::Bye => return Ok(()),
                Msg::Stat { path } => match self.roots.stat(&path) {
                    Ok(e) => link.send(&Msg::Entry(e))?,
                    Err(r) => reply_refusal(link, 0, r)?,
                },
                Msg::List { path } => match self.roots.list(&path) {
                    Ok(entries) => send_entries(link, entries)?,
                    Err(r) => reply_refusal(link, 0, r)?,
                },
                Msg::Mkdir { mode, path } => match self.roots.mkdir(&path, mode) {
                    Ok(()) => link.send(&Msg::Ok { file_id: 0 })?,
                    Err(r) => reply_refusal(link, 0, r)?,
                },
                Msg::Sum { path } => match self.roots.open_read(&path) {
                    Ok((f, st)) => match hash_file(&f, st.st_size as u64) {
                        Ok(h) => link.send(&Msg::SumReply {
                            size: st.st_size as u64,
                            blake3: h,
                        })?,
                        Err(e) => {
                            reply_refusal(link, 0, refuse(ErrorCode::Io, format!("{path}: {e}")))?
                        }
                    },
                    Err(r) => reply_refusal(link, 0, r)?,
                },
                Msg::Get {
                    file_id,
                    offset,
                    length,
                    path,
                } => {
                    let _counted = InFlight::new(&self.in_flight);
                    self.get(link, &mut tx, file_id, offset, length, &path)?
                }
                Msg::Put {
                    file_id,
                    flags,
                    mode,
                    size,
                    mtime,
                    path,
                } => {
                    let _counted = InFlight::new(&self.in_flight);
                    let req = PutReq {
                        file_id,
                        resume: flags & proto::PUT_RESUME != 0,
                        mode,
                        size,
                        mtime,
                        block,
                    };
                    self.put(link, &req, &path)?
                }
                Msg::Open {
                    flags,
                    file_id,
                    mode,
                    size,
                    mtime,
                    path,
                } => {
                    let req = PutReq {
                        file_id,
                        resume: flags & proto::OPEN_RESUME != 0,
                        mode,
                        size,
                        mtime: Some(mtime),
                        block,
                    };
                    self.open(link, &session, &req, &path)?
                }
                Msg::PutRange {
                    file_id,
                    offset,
                    length,
                } => {
                    let _counted = InFlight::new(&self.in_flight);
                    self.put_range(link, &session, file_id, offset, length)?
                }
                Msg::Close {
                    file_id,
                    length,
                    blake3,
                } => self.close(link, &session, file_id, length, blake3)?,
                Msg::SendTo {
                    flags,
                    file_id,
                    path,
                    dest,
                    dest_path,
                    token,
                } => crate::third_party::serve(
                    &self.cfg,
                    &self.roots,
                    link,
                    crate::third_party::SendTo {
                        file_id,
                        recursive: flags & proto::SEND_RECURSIVE != 0,
                        path: &path,
                        dest: &dest,
                        dest_path: &dest_path,
                        token: &token,
                    },
                )?,
                m => return Err(XferError::conn(format!("unexpected request {m:?}"))),
            }
        }
    }

    /// Answers a request on the memory root (`mem/...`, see [`crate::mem`]); false if
    /// `msg` is not about it.
    fn virtual_request(
        &self,
        link: &mut Link,
        tx: &mut BlockSender,
        msg: &Msg,
        session: &Session,
    ) -> Result<bool> {
        let (path, file_id) = match msg {
            Msg::Stat { path } | Msg::List { path } | Msg::Sum { path } => (path, 0),
            Msg::Mkdir { path, .. } => (path, 0),
            Msg::Get { path, file_id, .. }
            | Msg::Put { path, file_id, .. }
            | Msg::Open { path, file_id, .. } => (path, *file_id),
            _ => return Ok(false),
        };
        let v = match crate::mem::classify(path) {
            None => return Ok(false),
            Some(Ok(v)) => v,
            Some(Err(m)) => {
                reply_refusal(link, file_id, refuse(ErrorCode::NotFound, m))?;
                return Ok(true);
            }
        };
        let entry = |kind, mode, size, name: &str| Entry {
            kind,
            mode,
            size,
            mtime: 0,
            name: name.into(),
        };
        let denied = |what: &str| refuse(ErrorCode::PermissionDenied, format!("{path}: {what}"));
        match (msg, v) {
            (Msg::Stat { .. }, Virtual::Root) => {
                link.send(&Msg::Entry(entry(EntryKind::Dir, 0o555, 0, MEM_ROOT)))?
            }
            (Msg::Stat { .. }, Virtual::ZeroDir) => {
                link.send(&Msg::Entry(entry(EntryKind::Dir, 0o555, 0, "zero")))?
            }
            (Msg::Stat { .. }, Virtual::Zero(n)) => {
                let name = path.trim_end_matches('/').rsplit('/').next().unwrap_or("");
                link.send(&Msg::Entry(entry(EntryKind::File, 0o444, n, name)))?
            }
            (Msg::Stat { .. }, Virtual::Null) => {
                link.send(&Msg::Entry(entry(EntryKind::Other, 0o222, 0, "null")))?
            }
            (Msg::List { .. }, Virtual::Root) => send_entries(
                link,
                vec![
                    entry(EntryKind::Other, 0o222, 0, "null"),
                    entry(EntryKind::Dir, 0o555, 0, "zero"),
                ],
            )?,
            (Msg::List { .. }, Virtual::ZeroDir) => send_entries(link, vec![])?,
            (Msg::Get { offset, length, .. }, Virtual::Zero(size)) => {
                self.send_zero(link, tx, file_id, *offset, *length, size)?
            }
            (Msg::Put { size, .. }, Virtual::Null) => {
                link.send(&Msg::Ready {
                    file_id,
                    size: *size,
                    mode: 0o222,
                    offset: 0,
                })?;
                let mut sink = BlockWriter::null(file_id, *size);
                match self.receive_into(link, &mut sink, file_id, path)? {
                    None => {}
                    Some((_, Err(r))) => reply_refusal(link, file_id, r)?,
                    Some((length, Ok(_))) if length != *size => reply_refusal(
                        link,
                        file_id,
                        refuse(
                            ErrorCode::Integrity,
                            format!("{path}: {length} bytes announced, {size} received"),
                        ),
                    )?,
                    Some((_, Ok(_))) => link.send(&Msg::Ok { file_id })?,
                }
            }
            (Msg::Open { size, mode, .. }, Virtual::Null) => {
                let up = Upload::new(path, *size, *mode, 0, None)
                    .map_err(|e| XferError::io(path, &e))?;
                if session.add_upload(file_id, up) {
                    link.send(&Msg::Have {
                        file_id,
                        ranges: vec![],
                    })?
                } else {
                    reply_refusal(link, file_id, id_in_use(file_id))?
                }
            }
            (Msg::Put { .. } | Msg::Open { .. }, _) => {
                reply_refusal(link, file_id, denied("read-only (write to mem/null)"))?
            }
            (Msg::Get { .. }, Virtual::Null) => reply_refusal(
                link,
                file_id,
                denied("write-only (read from mem/zero/SIZE)"),
            )?,
            (Msg::Sum { .. }, _) => reply_refusal(
                link,
                0,
                refuse(
                    ErrorCode::Unsupported,
                    format!("{path}: no checksums on the memory root (nothing is stored)"),
                ),
            )?,
            (Msg::Get { .. }, _) => reply_refusal(
                link,
                file_id,
                refuse(
                    ErrorCode::IsADirectory,
                    format!("{path}: not a file; read mem/zero/SIZE, e.g. mem/zero/4G"),
                ),
            )?,
            (Msg::List { .. }, _) => reply_refusal(
                link,
                0,
                refuse(ErrorCode::NotADirectory, format!("{path}: not a directory")),
            )?,
            (Msg::Mkdir { .. }, _) => reply_refusal(link, 0, denied("the memory root is fixed"))?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Answers a GET of `mem/zero/SIZE`: READY, zero BLOCKs (each with its CRC-32C),
    /// FILE_DONE without a hash.
    fn send_zero(
        &self,
        link: &mut Link,
        tx: &mut BlockSender,
        file_id: u32,
        offset: u64,
        length: u64,
        size: u64,
    ) -> Result<()> {
        let Some(len) = ready(link, file_id, "mem/zero", offset, length, size, 0o444)? else {
            return Ok(());
        };
        let span = Span {
            file_id,
            offset,
            len,
        };
        tx.send_range(link, Source::Zero, span, None, &|_| {})?;
        link.send(&Msg::FileDone {
            file_id,
            length: len,
            blake3: None,
        })
    }

    fn get(
        &self,
        link: &mut Link,
        tx: &mut BlockSender,
        file_id: u32,
        offset: u64,
        length: u64,
        path: &str,
    ) -> Result<()> {
        let (file, st) = match self.roots.open_read(path) {
            Ok(f) => f,
            Err(r) => return reply_refusal(link, file_id, r),
        };
        let size = st.st_size as u64;
        let mode = st.st_mode & 0o7777;
        let Some(len) = ready(link, file_id, path, offset, length, size, mode)? else {
            return Ok(());
        };
        let whole = offset == 0 && len == size;
        let mut hasher = whole.then(blake3::Hasher::new);
        let end = offset + len;
        let mut pos = offset;
        let sent = loop {
            let n = (end - pos).min(GET_PIECE);
            let span = Span {
                file_id,
                offset: pos,
                len: n,
            };
            if let Err(e) = tx.send_range(link, Source::File(&file), span, hasher.as_mut(), &|_| {})
            {
                break Err(e);
            }
            pos += n;
            if pos >= end {
                break Ok(());
            }
            if self.stopping() {
                return Err(self.stopped(path));
            }
        };
        // A broken connection ends here (waiting for the completions of blocks sent to a
        // dead peer could take the whole link timeout on some providers).
        if let Err(e) = sent.as_ref() {
            if e.kind == Kind::Connection {
                return Err(e.clone());
            }
        }
        if let Err(e) = sent {
            tx.flush().ok();
            // Mid-file read failure: tell the client, keep the connection.
            return reply_refusal(
                link,
                file_id,
                refuse(ErrorCode::Io, format!("{path}: {}", e.msg)),
            );
        }
        // No flush: blocks and FILE_DONE leave in order; blocks are reaped as the ring needs them.
        link.send(&Msg::FileDone {
            file_id,
            length: len,
            blake3: hasher.map(|h| *h.finalize().as_bytes()),
        })
    }

    fn put(&self, link: &mut Link, req: &PutReq, path: &str) -> Result<()> {
        let file_id = req.file_id;
        let Some(claim) = self.claim(path) else {
            return reply_refusal(
                link,
                file_id,
                refuse(
                    ErrorCode::Unavailable,
                    format!("{path}: another connection is still writing this file; try again"),
                ),
            );
        };
        let ident = Ident {
            size: req.size,
            mtime: req.mtime.unwrap_or(0),
        };
        let (part, progress, found) =
            match PartFile::open(&self.roots, path, ident, req.block, req.resume) {
                Ok(p) => p,
                Err(r) => return reply_refusal(link, file_id, r),
            };
        let offset = progress.prefix();
        match found {
            Found::Resumed => tracing::info!("{path}: resuming an upload at byte {offset}"),
            Found::Restarted => tracing::info!(
                "{path}: the partial upload is of another source (size or mtime differ); starting over"
            ),
            Found::Fresh => {}
        }
        link.send(&Msg::Ready {
            file_id,
            size: req.size,
            mode: req.mode,
            offset,
        })?;
        let mut sink = BlockSink::journaled(file_id, req.size, progress);
        if self.cfg.direct {
            sink.set_direct(&part.file);
        }
        match self.receive(link, &part, sink, &claim.yield_to_newer, path) {
            // Connection-level failure: the connection ends; the part and its journal stay
            // for a resume.
            Err(e) => Err(e),
            // The client gave up on this file.
            Ok(None) => {
                part.discard();
                Ok(())
            }
            Ok(Some(Err(r))) => {
                part.discard();
                reply_refusal(link, file_id, r)
            }
            Ok(Some(Ok(()))) => {
                let mtime = req.mtime.and_then(|ns| {
                    let ns = u64::try_from(ns).ok()?;
                    std::time::UNIX_EPOCH.checked_add(Duration::from_nanos(ns))
                });
                match part.commit(req.mode, mtime) {
                    Ok(()) => link.send(&Msg::Ok { file_id }),
                    Err(e) => reply_refusal(
                        link,
                        file_id,
                        refuse(ErrorCode::Io, format!("{path}: commit failed: {e}")),
                    ),
                }
            }
        }
    }

    /// Receives a PUT's blocks through the staging ring's writer until the file is whole
    /// and verified (`Some(Ok)`), refused (`Some(Err)`) or abandoned by the client (`None`).
    /// If the connection fails or the server stops, the verified prefix is journaled first.
    fn receive(
        &self,
        link: &mut Link,
        part: &PartFile,
        sink: BlockSink,
        superseded: &AtomicBool,
        path: &str,
    ) -> Result<Option<PResult<()>>> {
        let (file_id, size) = (sink.file_id, sink.size());
        let writer = BlockWriter::with_sink(sink, &part.file, self.cfg.ring)?;
        let file = Some(&part.file);
        let (mut sink, length, blake3) =
            match self.receive_blocks(link, writer, file_id, file, superseded, path)? {
                None => return Ok(None),
                Some(Err(r)) => return Ok(Some(Err(r))),
                Some(Ok(got)) => got,
            };
        if let Some(e) = sink.io_error.take() {
            return Ok(Some(Err(write_refusal(path, &e))));
        }
        let got = match sink.hash(&part.file) {
            Ok(h) => h,
            Err(e) => return Ok(Some(Err(refuse(ErrorCode::Io, format!("{path}: {e}"))))),
        };
        if length != size || blake3 != Some(got) {
            return Ok(Some(Err(refuse(
                ErrorCode::Integrity,
                format!("{path}: the whole-file BLAKE3 does not match what was sent; nothing was written, try again"),
            ))));
        }
        Ok(Some(Ok(())))
    }

    /// Feeds BLOCKs to `writer` until a FILE_DONE finds every block good (`Some(Ok)`: the
    /// sink, FILE_DONE's `length` and hash), the CRC rounds run out (`Some(Err)`) or the
    /// client gives up (`None`). Bad blocks are asked for again with RESEND. If the
    /// connection fails, the server stops or a newer PUT takes the file over, the sink's
    /// journal (if any) is checkpointed into `file` first.
    fn receive_blocks(
        &self,
        link: &mut Link,
        mut writer: BlockWriter,
        file_id: u32,
        file: Option<&File>,
        superseded: &AtomicBool,
        path: &str,
    ) -> Result<Option<PResult<Received2>>> {
        let keep = |w: BlockWriter, e: XferError| -> Result<Option<PResult<Received2>>> {
            if let Some(file) = file {
                match w.finish().map(|mut s| s.checkpoint(file)) {
                    Ok(Ok(())) => {}
                    Ok(Err(io)) => tracing::warn!("{path}: journal: {io}"),
                    Err(f) => tracing::warn!("{path}: journal: {f}"),
                }
            }
            Err(e)
        };
        let mut rounds = 0;
        let mut buf = Vec::new();
        let mut idle = Duration::ZERO;
        loop {
            if self.stopping() {
                return keep(writer, self.stopped(path));
            }
            if superseded.load(Ordering::SeqCst) {
                let e = XferError::conn(format!("{path}: a newer PUT of this file took over"));
                return keep(writer, e);
            }
            if buf.capacity() == 0 {
                buf = writer.spare();
            }
            match link.recv_within(&mut buf, RECV_SLICE) {
                Ok(true) => idle = Duration::ZERO,
                Ok(false) => {
                    idle += RECV_SLICE;
                    if idle >= link.timeout {
                        let e = XferError::conn(format!(
                            "the client sent nothing for {} s; giving up",
                            idle.as_secs()
                        ));
                        return keep(writer, e);
                    }
                    continue;
                }
                Err(e) => return keep(writer, e),
            }
            let (blake3, length) = match proto::decode(&buf) {
                Ok((Msg::Block(_), _)) => {
                    if let Err(e) = writer.push(std::mem::take(&mut buf)) {
                        return keep(writer, e);
                    }
                    continue;
                }
                Ok((Msg::FileDone { blake3, length, .. }, _)) => (blake3, length),
                Ok((Msg::Error { .. }, _)) => return Ok(None),
                Ok((m, _)) => {
                    let e = XferError::conn(format!("unexpected frame during a PUT: {m:?}"));
                    return keep(writer, e);
                }
                Err(e) => {
                    let e = XferError::conn(format!("the peer sent a bad frame: {e}"));
                    return keep(writer, e);
                }
            };
            let bad = match writer.sync() {
                Ok(b) => b,
                Err(e) => return keep(writer, e),
            };
            if !bad.is_empty() {
                rounds += 1;
                if rounds > crate::BLOCK_RETRIES {
                    return Ok(Some(Err(refuse(
                        ErrorCode::Integrity,
                        format!(
                            "{path}: blocks kept failing their CRC after {} retries; nothing was written. Check the network path (NIC, cable, memory) and try again",
                            crate::BLOCK_RETRIES
                        ),
                    ))));
                }
                link.send(&Msg::Resend {
                    file_id,
                    ranges: bad,
                })?;
                continue;
            }
            let sink = writer.finish()?;
            return Ok(Some(Ok((sink, length, blake3))));
        }
    }

    /// OPEN (1.2): starts a parallel upload of `path` in `session` and answers HAVE with
    /// the ranges a resumed part already holds.
    fn open(&self, link: &mut Link, session: &Session, req: &PutReq, path: &str) -> Result<()> {
        let file_id = req.file_id;
        if session.upload(file_id).is_some() {
            return reply_refusal(link, file_id, id_in_use(file_id));
        }
        let Some(claim) = self.claim(path) else {
            return reply_refusal(
                link,
                file_id,
                refuse(
                    ErrorCode::Unavailable,
                    format!("{path}: another connection is still writing this file; try again"),
                ),
            );
        };
        let mtime = req.mtime.unwrap_or(0);
        let ident = Ident {
            size: req.size,
            mtime,
        };
        let (part, progress, found) =
            match PartFile::open(&self.roots, path, ident, req.block, req.resume) {
                Ok(p) => p,
                Err(r) => return reply_refusal(link, file_id, r),
            };
        if found == Found::Resumed {
            tracing::info!(
                "{path}: resuming a parallel upload, {} bytes in place",
                progress.ranges().total()
            );
        }
        let up = Upload::new(
            path,
            req.size,
            req.mode,
            mtime,
            Some((part, progress, claim)),
        )
        .map_err(|e| XferError::io(path, &e))?;
        let ranges = up.have();
        if !session.add_upload(file_id, up) {
            return reply_refusal(link, file_id, id_in_use(file_id));
        }
        link.send(&Msg::Have { file_id, ranges })
    }

    /// PUT_RANGE (1.2): receives `[offset, offset + length)` of an OPENed upload on this
    /// stream, into the shared part file.
    fn put_range(
        &self,
        link: &mut Link,
        session: &Session,
        file_id: u32,
        offset: u64,
        length: u64,
    ) -> Result<()> {
        let Some(up) = session.upload(file_id) else {
            let why =
                format!("PUT_RANGE of transfer {file_id}, which no OPEN of this session started");
            return reply_refusal(link, file_id, refuse(ErrorCode::BadRequest, why));
        };
        let Some(end) = offset.checked_add(length).filter(|&e| e <= up.size) else {
            let why = format!(
                "{}: range {offset}+{length} past the end ({} bytes)",
                up.path, up.size
            );
            return reply_refusal(link, file_id, refuse(ErrorCode::BadRequest, why));
        };
        link.send(&Msg::Ready {
            file_id,
            size: up.size,
            mode: up.mode,
            offset,
        })?;
        let sink = BlockSink::range(file_id, up.size, offset, end);
        let writer = match &up.file {
            Some(f) => BlockWriter::with_sink(sink, f, self.cfg.ring)?,
            None => BlockWriter::null_sink(sink),
        };
        let path = up.path.clone();
        let (mut sink, _, _) =
            match self.receive_blocks(link, writer, file_id, None, up.superseded(), &path)? {
                None => return Ok(()),
                Some(Err(r)) => return reply_refusal(link, file_id, r),
                Some(Ok(got)) => got,
            };
        if let Some(e) = sink.io_error.take() {
            return reply_refusal(link, file_id, write_refusal(&path, &e));
        }
        if !sink.got.contains(offset, end) {
            let why = format!("{path}: FILE_DONE before every block of range {offset}+{length}");
            return reply_refusal(link, file_id, refuse(ErrorCode::Integrity, why));
        }
        up.mark(offset, end);
        if let Some(e) = up.io_error() {
            return reply_refusal(link, file_id, write_refusal(&path, &e));
        }
        link.send(&Msg::Ok { file_id })
    }

    /// CLOSE (1.2): every range of an OPENed upload arrived; check its BLAKE3 and commit.
    fn close(
        &self,
        link: &mut Link,
        session: &Session,
        file_id: u32,
        length: u64,
        blake3: Option<[u8; 32]>,
    ) -> Result<()> {
        let mut up = match session.take_upload(file_id) {
            Some(Ok(u)) => u,
            Some(Err(())) => {
                let why = "CLOSE while a range of the file is still being sent";
                return reply_refusal(link, file_id, refuse(ErrorCode::BadRequest, why));
            }
            None => {
                let why =
                    format!("CLOSE of transfer {file_id}, which no OPEN of this session started");
                return reply_refusal(link, file_id, refuse(ErrorCode::BadRequest, why));
            }
        };
        let path = up.path.clone();
        if !up.complete() {
            // Dropping the upload journals it: a resume sends the rest.
            let why = format!("{path}: CLOSE before every range arrived; resume the copy");
            return reply_refusal(link, file_id, refuse(ErrorCode::Integrity, why));
        }
        if length != up.size {
            let why = format!("{path}: {length} bytes announced, {} opened", up.size);
            if let Some(p) = up.take_part() {
                p.discard();
            }
            return reply_refusal(link, file_id, refuse(ErrorCode::Integrity, why));
        }
        let got = up.hash();
        let Some(part) = up.take_part() else {
            // The null sink: nothing to hash or commit.
            return link.send(&Msg::Ok { file_id });
        };
        let matched = match got {
            Some(Ok(h)) => blake3 == Some(h),
            Some(Err(e)) => {
                part.discard();
                let why = format!("{path}: hashing the part: {e}");
                return reply_refusal(link, file_id, refuse(ErrorCode::Io, why));
            }
            None => false,
        };
        if !matched {
            part.discard();
            let why = format!("{path}: the whole-file BLAKE3 does not match what was sent; nothing was written, try again");
            return reply_refusal(link, file_id, refuse(ErrorCode::Integrity, why));
        }
        let mtime = u64::try_from(up.mtime)
            .ok()
            .filter(|&ns| ns > 0)
            .and_then(|ns| std::time::UNIX_EPOCH.checked_add(Duration::from_nanos(ns)));
        match part.commit(up.mode, mtime) {
            Ok(()) => link.send(&Msg::Ok { file_id }),
            Err(e) => reply_refusal(
                link,
                file_id,
                refuse(ErrorCode::Io, format!("{path}: commit failed: {e}")),
            ),
        }
    }

    /// Admits a stream: stream 0 of a new session (`join` 0), or stream `stream` of the live
    /// session `join`, which must have been opened with the same token.
    fn join(&self, join: u64, stream: u16, token: &str) -> PResult<Arc<Session>> {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if join == 0 {
            if stream != 0 {
                return Err(refuse(
                    ErrorCode::BadRequest,
                    format!("stream {stream} of no session: stream 0 opens the session"),
                ));
            }
            let id = loop {
                let id = random_id(self.sessions.fetch_add(1, Ordering::Relaxed));
                if id != 0 && !live.contains_key(&id) {
                    break id;
                }
            };
            let s = Arc::new(Session::new(id, token.to_string()));
            live.insert(id, s.clone());
            return Ok(s);
        }
        if stream == 0 || stream >= proto::MAX_STREAMS {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!(
                    "stream {stream}: a joining stream is numbered 1 to {}",
                    proto::MAX_STREAMS - 1
                ),
            ));
        }
        let s = live.get(&join).ok_or_else(|| {
            refuse(
                ErrorCode::BadRequest,
                format!("unknown session {join:#x}: it ended or never existed (a stream joins while stream 0 is connected)"),
            )
        })?;
        if !crate::ct_eq(s.token.as_bytes(), token.as_bytes()) {
            return Err(refuse(
                ErrorCode::AuthRefused,
                "the token differs from the one session was opened with",
            ));
        }
        s.streams.fetch_add(1, Ordering::SeqCst);
        Ok(s.clone())
    }

    /// Feeds a PUT's BLOCKs to `writer` (checked in place in the receive buffers) until a
    /// FILE_DONE finds every block good: its `length` and hash. Bad blocks are asked for
    /// again (RESEND) up to the retry limit (then `Err`); `None` if the client gave up.
    fn receive_into(
        &self,
        link: &mut Link,
        writer: &mut BlockWriter,
        file_id: u32,
        path: &str,
    ) -> Result<Option<Received>> {
        let mut rounds = 0;
        loop {
            let step = link.recv_with(|buf| match proto::decode(buf) {
                Ok((Msg::Block(_), _)) => writer.push_slice(buf).map(|()| None),
                Ok((Msg::FileDone { blake3, length, .. }, _)) => Ok(Some(Some((blake3, length)))),
                Ok((Msg::Error { .. }, _)) => Ok(Some(None)),
                Ok((m, _)) => Err(XferError::conn(format!(
                    "unexpected frame during a PUT: {m:?}"
                ))),
                Err(e) => Err(XferError::conn(format!("the peer sent a bad frame: {e}"))),
            })??;
            let (blake3, length) = match step {
                None => continue,
                Some(None) => return Ok(None),
                Some(Some(done)) => done,
            };
            let bad = writer.sync()?;
            if !bad.is_empty() {
                rounds += 1;
                if rounds > crate::BLOCK_RETRIES {
                    return Ok(Some((length, Err(refuse(
                        ErrorCode::Integrity,
                        format!(
                            "{path}: blocks kept failing their CRC after {} retries; nothing was written. Check the network path (NIC, cable, memory) and try again",
                            crate::BLOCK_RETRIES
                        ),
                    )))));
                }
                link.send(&Msg::Resend {
                    file_id,
                    ranges: bad,
                })?;
                continue;
            }
            return Ok(Some((length, Ok(blake3))));
        }
    }
}

/// A PUT as the server handles it.
struct PutReq {
    file_id: u32,
    resume: bool,
    mode: u32,
    size: u64,
    mtime: Option<i64>,
    block: u32,
}

/// The next request on a connection. While it waits, the session lets go of uploads a newer
/// OPEN or PUT of the same file asked for and no stream is receiving (their client is
/// usually gone without the fabric noticing yet).
fn next_request(link: &mut Link, session: &Session) -> Result<Msg> {
    let mut buf = Vec::new();
    let mut idle = Duration::ZERO;
    while !link.recv_within(&mut buf, RECV_SLICE)? {
        session.release_superseded();
        idle += RECV_SLICE;
        if idle >= link.timeout {
            return Err(XferError::conn(format!(
                "the client sent nothing for {} s; giving up",
                idle.as_secs()
            )));
        }
    }
    let (msg, _) = proto::decode(&buf)
        .map_err(|e| XferError::conn(format!("the peer sent a bad frame: {e}")))?;
    if matches!(msg, Msg::Block(_)) {
        return Err(XferError::conn("unexpected BLOCK frame"));
    }
    Ok(msg)
}

/// A PUT's blocks all good: the sink, FILE_DONE's `length` and hash.
type Received2 = (BlockSink, u64, Option<[u8; 32]>);

/// The refusal for a failed write.
fn write_refusal(path: &str, e: &std::io::Error) -> Refusal {
    let code = if e.raw_os_error() == Some(Errno::NOSPC.raw_os_error()) {
        ErrorCode::NoSpace
    } else {
        ErrorCode::Io
    };
    refuse(code, format!("{path}: write failed: {e}"))
}

fn id_in_use(file_id: u32) -> Refusal {
    refuse(
        ErrorCode::BadRequest,
        format!("transfer id {file_id} is already open in this session"),
    )
}

/// A session id: unpredictable (a joining stream must also present the session's token).
fn random_id(n: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(n);
    h.finish()
}

/// A stream of a session; the last one to end ends the session.
struct StreamGuard<'a> {
    server: &'a Server,
    session: Arc<Session>,
}

impl Drop for StreamGuard<'_> {
    fn drop(&mut self) {
        let mut live = self.server.live.lock().unwrap_or_else(|p| p.into_inner());
        if self.session.streams.fetch_sub(1, Ordering::SeqCst) == 1 {
            live.remove(&self.session.id);
            drop(live);
            self.session.end();
        }
    }
}

/// How a PUT's blocks ended: FILE_DONE's `length`, and its hash once every block was good
/// (or the refusal after too many CRC rounds).
type Received = (u64, PResult<Option<[u8; 32]>>);

/// Answers a GET of `length` bytes at `offset` from a source of `size` bytes: READY and the
/// length that will travel (clipped to the end), or a refusal (`None`) if `offset` lies past
/// the end.
fn ready(
    link: &Link,
    file_id: u32,
    path: &str,
    offset: u64,
    length: u64,
    size: u64,
    mode: u32,
) -> Result<Option<u64>> {
    if offset > size {
        let why = format!("{path}: offset {offset} past the end ({size} bytes)");
        reply_refusal(link, file_id, refuse(ErrorCode::BadRequest, why))?;
        return Ok(None);
    }
    link.send(&Msg::Ready {
        file_id,
        size,
        mode,
        offset,
    })?;
    Ok(Some(length.min(size - offset)))
}

fn reply_refusal(link: &Link, file_id: u32, r: Refusal) -> Result<()> {
    tracing::debug!("refused: {}", r.message);
    link.send(&Msg::Error {
        code: r.code,
        file_id,
        message: r.message,
    })
}

fn send_entries(link: &Link, entries: Vec<Entry>) -> Result<()> {
    let mut batch: Vec<Entry> = Vec::new();
    let mut bytes = 0;
    for e in entries {
        let sz = e.name.len() + 32;
        if bytes + sz > proto::MAX_CONTROL - 64 {
            link.send(&Msg::Entries {
                more: true,
                entries: std::mem::take(&mut batch),
            })?;
            bytes = 0;
        }
        bytes += sz;
        batch.push(e);
    }
    link.send(&Msg::Entries {
        more: false,
        entries: batch,
    })
}
