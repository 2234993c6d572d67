//! The client side of `ferry cp`, `ferry ls` and `ferry sum`.
//!
//! Downloads are pipelined: up to [`GET_WINDOW`] GETs are outstanding, the server answers
//! them in order, and every message names its transfer, so a tree of small files costs
//! little more than its bytes. Each received block is checked against its CRC-32C; bad
//! blocks are fetched again by ranged GETs (up to [`crate::BLOCK_RETRIES`] rounds) and the
//! whole file's BLAKE3 is compared before `.<name>.ferry-part` is fsynced and renamed.
//! Uploads stream a file's blocks, then FILE_DONE with its BLAKE3; the server answers OK,
//! RESEND (blocks that failed their CRC) or ERROR.
//!
//! Resume ([`Options::resume`], [`Options::retries`]): the receiving side journals the
//! verified prefix of every part file ([`crate::journal`]). A resumed download continues
//! its part with a ranged GET (and asks for the source's BLAKE3 with SUM, since a ranged
//! GET brings none); a resumed upload sends PUT with RESUME and the server's READY says
//! where to continue. Either way the file lands only if its whole BLAKE3 matches the
//! source's. Trees skip files already at the destination with the same size and mtime.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::commit::CommitPool;
use crate::error::{Kind, Result, XferError};
use crate::journal::{open_part, Found, Ident, OpenHow, Progress as Journaled};
use crate::link::{BlockSender, BlockWriter, Link, Source, Span, HANDSHAKE_TIMEOUT};
use crate::proto::{self, Entry, EntryKind, Msg, BLOCK_HEADER_LEN};
use crate::server::{part_name, BlockSink};
use crate::url::{Location, Remote};

/// A tree: its directories (relative, parents first) and its files with their sizes and
/// mtimes (seconds).
pub(crate) type Tree = (Vec<String>, Vec<(String, u64, i64)>);

/// Walks the tree under `path` with `list` (which lists one directory). Symlinks and
/// special files are skipped with a warning.
pub(crate) fn walk_entries<E>(
    path: &str,
    mut list: impl FnMut(&str) -> std::result::Result<Vec<Entry>, E>,
) -> std::result::Result<Tree, E> {
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    let mut todo = vec![String::new()];
    while let Some(rel) = todo.pop() {
        for e in list(&join(path, &rel))? {
            let r = join(&rel, &e.name);
            match e.kind {
                EntryKind::Dir => {
                    dirs.push(r.clone());
                    todo.push(r);
                }
                EntryKind::File => files.push((r, e.size, e.mtime)),
                _ => tracing::warn!("{}: skipping (not a file or directory)", join(path, &r)),
            }
        }
    }
    dirs.sort();
    Ok((dirs, files))
}

/// First pause before a retry; it doubles up to [`RETRY_MAX_DELAY`].
pub const RETRY_DELAY: Duration = Duration::from_millis(200);
/// Longest pause between retries.
pub const RETRY_MAX_DELAY: Duration = Duration::from_secs(5);

/// GETs a download keeps outstanding.
pub const GET_WINDOW: usize = 16;

/// Client settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Token ("" for anonymous).
    pub token: String,
    /// Proposed block size.
    pub block_size: u32,
    /// Staging blocks in flight.
    pub ring: usize,
    /// Connect timeout.
    pub timeout: Duration,
    /// How long to wait for a server that sends nothing before the connection counts as
    /// broken (and, with `retries`, is replaced).
    pub idle_timeout: Duration,
    /// Continue interrupted transfers: partial files (their journaled, verified prefix)
    /// and, for trees, files already complete at the destination (same size and mtime).
    pub resume: bool,
    /// Reconnect and resume this many times after a connection failure (exit class 6),
    /// pausing [`RETRY_DELAY`], doubling up to [`RETRY_MAX_DELAY`].
    pub retries: u32,
    /// Token for the destination server of a third-party copy (`None`: the same token).
    pub dest_token: Option<String>,
    /// Parallel streams (connections) per copy, 1 to [`proto::MAX_STREAMS`]; more than one
    /// needs a protocol 1.2 server (an older one gets one stream and a note).
    pub streams: u16,
    /// With several streams, files are split into chunks of about this many bytes (rounded
    /// to the block size), handed to whichever stream is free.
    pub chunk: u64,
    /// Read (uploads) and write (downloads) local files with direct I/O (`O_DIRECT`),
    /// bypassing the page cache, where the filesystem allows it. The server's side follows
    /// its own configuration (`direct` in `ferry serve`'s config).
    pub direct: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: String::new(),
            block_size: crate::DEFAULT_BLOCK,
            ring: crate::DEFAULT_RING,
            timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            resume: false,
            retries: 0,
            dest_token: None,
            streams: 1,
            chunk: crate::parallel::DEFAULT_CHUNK,
            direct: false,
        }
    }
}

/// What a copy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Files copied (including files found complete and skipped).
    pub files: u64,
    /// File bytes copied (the whole size of each file, however much of it moved).
    pub bytes: u64,
    /// Blocks sent again after a CRC mismatch.
    pub blocks_resent: u64,
    /// File bytes that crossed the network (less than `bytes` after a resume).
    pub wire_bytes: u64,
    /// Bytes a resume found already in place (journaled prefixes of partial files).
    pub resumed_bytes: u64,
    /// Files a resumed tree copy found complete at the destination and skipped.
    pub files_skipped: u64,
    /// Reconnections after a connection failure.
    pub retries: u64,
}

impl Stats {
    pub(crate) fn add(&mut self, o: &Stats) {
        self.files += o.files;
        self.bytes += o.bytes;
        self.blocks_resent += o.blocks_resent;
        self.wire_bytes += o.wire_bytes;
        self.resumed_bytes += o.resumed_bytes;
        self.files_skipped += o.files_skipped;
        self.retries += o.retries;
    }
}

/// Receives progress reports.
pub trait Progress {
    /// The total number of bytes, once known.
    fn total(&self, _bytes: u64) {}
    /// `bytes` more moved.
    fn add(&self, _bytes: u64) {}
    /// Starting over (a retry): the next attempt reports what is already there again.
    fn restart(&self) {}
}

impl Progress for () {}

/// A connection to a `ferry serve`.
pub struct Client {
    pub(crate) link: Link,
    block: u32,
    pub(crate) minor: u16,
    resume: bool,
    pub(crate) tx: BlockSender,
    /// Direct I/O for local files ([`Options::direct`]).
    direct: bool,
    ring: usize,
    next_id: u32,
    /// The session WELCOME named (parallel streams join it).
    pub(crate) session: u64,
    /// Counters so far.
    pub stats: Stats,
}

pub(crate) fn remote_err(code: proto::ErrorCode, message: &str) -> XferError {
    XferError::remote(code, message)
}

pub(crate) fn unexpected(m: &Msg) -> XferError {
    XferError::conn(format!("the server sent an unexpected frame: {m:?}"))
}

/// A local file being written under its temporary name, with its resume journal.
pub(crate) struct LocalPart {
    dest: PathBuf,
    tmp: PathBuf,
    pub(crate) file: File,
}

fn journal_path(tmp: &Path) -> PathBuf {
    let mut p = tmp.as_os_str().to_owned();
    p.push(".journal");
    PathBuf::from(p)
}

impl LocalPart {
    /// Opens `.<name>.ferry-part` next to `dest` for a download of `ident` (see
    /// [`crate::journal::open_part`]).
    pub(crate) fn open(
        dest: &Path,
        ident: Ident,
        block: u32,
        resume: bool,
    ) -> Result<(LocalPart, Journaled, Found)> {
        use std::os::unix::fs::OpenOptionsExt;
        let name = dest
            .file_name()
            .ok_or_else(|| {
                XferError::new(Kind::Usage, format!("{}: not a file name", dest.display()))
            })?
            .to_string_lossy()
            .into_owned();
        let tmp = dest.with_file_name(part_name(&name));
        let dir = tmp.parent().map(Path::to_path_buf).unwrap_or_default();
        let open = |n: &str, how: OpenHow| {
            let mut o = std::fs::OpenOptions::new();
            o.read(true)
                .write(true)
                .mode(0o600)
                .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32);
            if how == OpenHow::Truncate {
                o.create(true).truncate(true);
            }
            o.open(dir.join(n))
        };
        let (file, progress, found) = open_part(&open, &part_name(&name), ident, block, resume)
            .map_err(|e| XferError::io(tmp.display(), &e))?;
        Ok((
            LocalPart {
                dest: dest.to_path_buf(),
                tmp,
                file,
            },
            progress,
            found,
        ))
    }

    /// Sets mode and mtime, fsyncs, drops the journal and renames into place; returns the
    /// directory, which the caller fsyncs (once for all the files committed into it) before
    /// it reports success. If any step fails the temporary file goes too (nothing to
    /// resume: the data was whole and verified, the failure is the destination's).
    pub(crate) fn commit(self, mode: u32, mtime: Option<SystemTime>) -> Result<PathBuf> {
        let res = self.try_commit(mode, mtime);
        if res.is_err() {
            self.discard();
        }
        res
    }

    fn try_commit(&self, mode: u32, mtime: Option<SystemTime>) -> Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let io = |e: std::io::Error| XferError::io(self.dest.display(), &e);
        self.file
            .set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))
            .map_err(io)?;
        if let Some(t) = mtime {
            self.file.set_modified(t).map_err(io)?;
        }
        self.file.sync_all().map_err(io)?;
        // The journal first: a part without one is never trusted.
        match std::fs::remove_file(journal_path(&self.tmp)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
            _ => {}
        }
        std::fs::rename(&self.tmp, &self.dest).map_err(io)?;
        Ok(match self.dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        })
    }

    pub(crate) fn discard(self) {
        let _ = std::fs::remove_file(journal_path(&self.tmp));
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// One file to download: the remote path, where it goes, and the source's identity as
/// STAT or LIST reported it.
#[derive(Debug, Clone)]
pub struct DlJob {
    /// `root/relative/path` on the server.
    pub path: String,
    /// Local destination (`None`: the null sink of memory mode, nothing is written).
    pub dest: Option<PathBuf>,
    /// Size and mtime (seconds) of the source.
    pub ident: Ident,
    /// One range of a file that parallel streams share (`None`: the whole file).
    pub(crate) chunk: Option<crate::parallel::Chunk>,
}

pub(crate) fn system_time(secs: i64) -> Option<SystemTime> {
    let s = u64::try_from(secs).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(s))
}

fn mtime_secs(md: &std::fs::Metadata) -> i64 {
    use std::os::unix::fs::MetadataExt;
    md.mtime()
}

/// Whether `dest` already holds a complete copy by the quick check (size and mtime).
fn complete_at(dest: &Path, ident: Ident) -> bool {
    std::fs::metadata(dest)
        .is_ok_and(|m| m.is_file() && m.len() == ident.size && mtime_secs(&m) == ident.mtime)
}

/// One file of a download.
struct Dl {
    path: String,
    /// Discard the data (the null sink): CRCs are checked, nothing is written.
    null: bool,
    dest: PathBuf,
    ident: Ident,
    part: Option<LocalPart>,
    /// The journal's view until READY hands it to the writer.
    journal: Option<Journaled>,
    writer: Option<BlockWriter>,
    size: u64,
    mode: u32,
    hash: Option<[u8; 32]>,
    outstanding: u32,
    rounds: u32,
    chunk: Option<crate::parallel::Chunk>,
}

impl Client {
    /// Connects and authenticates.
    pub fn connect(addr: &str, opts: &Options) -> Result<Client> {
        Self::connect_as(addr, opts, 0, 0)
    }

    /// Connects as stream `stream` of `session` (0, 0: a new session).
    pub(crate) fn connect_as(
        addr: &str,
        opts: &Options,
        session: u64,
        stream: u16,
    ) -> Result<Client> {
        let mut link = Link::connect(addr, opts.timeout)?;
        link.timeout = HANDSHAKE_TIMEOUT;
        link.post_ring(1, proto::MAX_CONTROL)?;
        link.send(&Msg::Hello {
            major: proto::VERSION_MAJOR,
            minor: proto::VERSION_MINOR,
            block_size: opts.block_size.clamp(proto::MIN_BLOCK, proto::MAX_BLOCK),
            session,
            stream,
            token: opts.token.clone(),
        })?;
        let (block, minor, session) = match link.recv_msg() {
            Ok(Msg::Welcome {
                block_size,
                minor,
                session,
                ..
            }) => (block_size, minor, session),
            Ok(Msg::Error { code, message, .. }) => return Err(remote_err(code, &message)),
            Ok(m) => return Err(unexpected(&m)),
            Err(e) => return Err(e),
        };
        if !(proto::MIN_BLOCK..=proto::MAX_BLOCK).contains(&block) {
            return Err(XferError::conn(format!(
                "the server chose a bad block size {block}"
            )));
        }
        link.timeout = opts.idle_timeout;
        link.post_ring(opts.ring.max(2), BLOCK_HEADER_LEN + block as usize)?;
        let mut tx = BlockSender::new(block, opts.ring.max(1), opts.idle_timeout)?;
        tx.direct = opts.direct;
        Ok(Client {
            link,
            block,
            minor,
            resume: opts.resume,
            tx,
            direct: opts.direct,
            ring: opts.ring.max(1),
            next_id: 1,
            session,
            stats: Stats::default(),
        })
    }

    /// The negotiated block size.
    pub fn block_size(&self) -> u32 {
        self.block
    }

    fn id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        id
    }

    /// Describes a remote path.
    pub fn stat(&mut self, path: &str) -> Result<Entry> {
        self.link.send(&Msg::Stat { path: path.into() })?;
        match self.link.recv_msg()? {
            Msg::Entry(e) => Ok(e),
            Msg::Error { code, message, .. } => Err(remote_err(code, &message)),
            m => Err(unexpected(&m)),
        }
    }

    /// Lists a remote directory ("" lists the roots).
    pub fn list(&mut self, path: &str) -> Result<Vec<Entry>> {
        self.link.send(&Msg::List { path: path.into() })?;
        let mut out = Vec::new();
        loop {
            match self.link.recv_msg()? {
                Msg::Entries { more, entries } => {
                    out.extend(entries);
                    if !more {
                        return Ok(out);
                    }
                }
                Msg::Error { code, message, .. } => return Err(remote_err(code, &message)),
                m => return Err(unexpected(&m)),
            }
        }
    }

    /// BLAKE3 and size of a remote file, computed by the server.
    pub fn sum(&mut self, path: &str) -> Result<(u64, [u8; 32])> {
        self.link.send(&Msg::Sum { path: path.into() })?;
        match self.link.recv_msg()? {
            Msg::SumReply { size, blake3 } => Ok((size, blake3)),
            Msg::Error { code, message, .. } => Err(remote_err(code, &message)),
            m => Err(unexpected(&m)),
        }
    }

    /// Creates a remote directory (existing is fine).
    pub fn mkdir(&mut self, path: &str, mode: u32) -> Result<()> {
        self.link.send(&Msg::Mkdir {
            mode,
            path: path.into(),
        })?;
        match self.link.recv_msg()? {
            Msg::Ok { .. } => Ok(()),
            Msg::Error { code, message, .. } => Err(remote_err(code, &message)),
            m => Err(unexpected(&m)),
        }
    }

    /// Downloads remote files to local paths, pipelined. Without [`Options::resume`] (as
    /// given to [`Client::set_resume`]) each file starts from zero; with it, a journaled
    /// part of the same source continues where its verified prefix ends. When the
    /// connection fails the parts stay, journaled, for a later resume; any other failure
    /// removes them.
    pub fn download_files(&mut self, jobs: Vec<DlJob>, progress: &dyn Progress) -> Result<()> {
        self.download_from(&mut jobs.into_iter(), progress)
    }

    /// [`Client::download_files`] of the jobs `jobs` yields (a parallel copy's streams pull
    /// theirs from a shared queue, whole files and chunks of shared ones).
    pub(crate) fn download_from(
        &mut self,
        jobs: &mut dyn Iterator<Item = DlJob>,
        progress: &dyn Progress,
    ) -> Result<()> {
        let mut live: HashMap<u32, Dl> = HashMap::new();
        let mut commits = CommitPool::new();
        let res = self.download_loop(jobs, &mut live, &mut commits, progress);
        // Every file handed to the pool is complete and verified: let its commit finish.
        let committed = commits.finish();
        if let Err(e) = &res {
            let keep = e.kind == Kind::Connection;
            for (_, dl) in live.drain() {
                let Some(part) = dl.part else { continue };
                if !keep {
                    part.discard();
                    continue;
                }
                if let Some(w) = dl.writer {
                    let saved = w.finish().map(|mut s| s.checkpoint(&part.file));
                    if !matches!(saved, Ok(Ok(()))) {
                        tracing::warn!("{}: could not journal the partial file", dl.path);
                    }
                }
            }
        }
        res.and(committed)
    }

    /// Resume partial files in later downloads on this connection.
    pub fn set_resume(&mut self, on: bool) {
        self.resume = on;
    }

    fn start_download(
        &mut self,
        job: DlJob,
        live: &mut HashMap<u32, Dl>,
        sums: &mut VecDeque<u32>,
        progress: &dyn Progress,
    ) -> Result<()> {
        let file_id = self.id();
        if let Some(ch) = job.chunk {
            // A range of a file the streams share: its part is open already.
            if ch.sum {
                self.link.send(&Msg::Sum {
                    path: job.path.clone(),
                })?;
                sums.push_back(file_id);
            }
            self.link.send(&Msg::Get {
                file_id,
                offset: ch.lo,
                length: ch.hi - ch.lo,
                path: job.path.clone(),
            })?;
            live.insert(
                file_id,
                Dl {
                    path: job.path,
                    null: job.dest.is_none(),
                    dest: job.dest.unwrap_or_default(),
                    ident: job.ident,
                    part: None,
                    journal: None,
                    writer: None,
                    size: 0,
                    mode: 0o644,
                    hash: None,
                    outstanding: 1,
                    rounds: 0,
                    chunk: Some(ch),
                },
            );
            return Ok(());
        }
        // No destination: the null sink, nothing to open or resume.
        let (part, journal, offset) = match &job.dest {
            None => (None, None, 0),
            Some(dest) => {
                let (part, journal, found) =
                    LocalPart::open(dest, job.ident, self.block, self.resume)?;
                let offset = journal.prefix();
                match found {
                    Found::Resumed => {
                        tracing::info!("{}: resuming at byte {offset}", job.path);
                        self.stats.resumed_bytes += offset;
                        progress.add(offset);
                    }
                    Found::Restarted => tracing::warn!(
                        "{}: the source changed since the interrupted copy (size or mtime differ); starting over",
                        job.path
                    ),
                    Found::Fresh => {}
                }
                (Some(part), Some(journal), offset)
            }
        };
        if offset > 0 {
            // A ranged GET carries no hash: ask for the source's first (answers come in
            // request order).
            self.link.send(&Msg::Sum {
                path: job.path.clone(),
            })?;
            sums.push_back(file_id);
        }
        self.link.send(&Msg::Get {
            file_id,
            offset,
            length: u64::MAX,
            path: job.path.clone(),
        })?;
        live.insert(
            file_id,
            Dl {
                path: job.path,
                null: job.dest.is_none(),
                dest: job.dest.unwrap_or_default(),
                ident: job.ident,
                part,
                journal,
                writer: None,
                size: 0,
                mode: 0o644,
                hash: None,
                outstanding: 1,
                rounds: 0,
                chunk: None,
            },
        );
        Ok(())
    }

    fn download_loop(
        &mut self,
        jobs: &mut dyn Iterator<Item = DlJob>,
        live: &mut HashMap<u32, Dl>,
        commits: &mut CommitPool,
        progress: &dyn Progress,
    ) -> Result<()> {
        let mut sums = VecDeque::new();
        loop {
            while live.len() < GET_WINDOW
                && live.values().filter(|d| d.chunk.is_some()).count()
                    < crate::parallel::CHUNKS_AHEAD
            {
                let Some(job) = jobs.next() else {
                    break;
                };
                self.start_download(job, live, &mut sums, progress)?;
            }
            if live.is_empty() {
                return Ok(());
            }
            // BLOCKs are checked (and written) in place in the receive buffer.
            let wire = &mut self.stats.wire_bytes;
            let msg = self.link.recv_with(|bytes| -> Result<Msg> {
                let (msg, _) = proto::decode(bytes)
                    .map_err(|e| XferError::conn(format!("the server sent a bad frame: {e}")))?;
                if let Msg::Block(h) = &msg {
                    let writer = live
                        .get_mut(&h.file_id)
                        .and_then(|dl| dl.writer.as_mut())
                        .ok_or_else(|| XferError::conn("BLOCK of no transfer in progress"))?;
                    writer.push_slice(bytes)?;
                    progress.add(u64::from(h.len));
                    *wire += u64::from(h.len);
                }
                Ok(msg)
            })??;
            let id = match &msg {
                Msg::Ready { file_id, .. }
                | Msg::FileDone { file_id, .. }
                | Msg::Error { file_id, .. } => *file_id,
                Msg::Block(h) => h.file_id,
                Msg::SumReply { blake3, .. } => {
                    let id = sums
                        .pop_front()
                        .ok_or_else(|| XferError::conn("the server sent a SUM_REPLY unasked"))?;
                    if let Some(dl) = live.get_mut(&id) {
                        dl.hash = Some(*blake3);
                        if let Some(ch) = &dl.chunk {
                            if let Some(size) = ch.file.source_hash(*blake3)? {
                                self.stats.files += 1;
                                self.stats.bytes += size;
                            }
                        }
                    }
                    continue;
                }
                m => return Err(unexpected(m)),
            };
            let Some(dl) = live.get_mut(&id) else {
                if let Msg::Error { code, message, .. } = &msg {
                    return Err(remote_err(*code, message));
                }
                return Err(XferError::conn(format!(
                    "the server answered unknown transfer {id}"
                )));
            };
            match msg {
                Msg::Ready { size, mode, .. } if dl.chunk.is_some() => {
                    if let (None, Some(ch)) = (&dl.writer, &dl.chunk) {
                        dl.writer = Some(ch.writer(id, size, mode, self.ring)?);
                        dl.size = size;
                    }
                }
                Msg::Ready { size, .. } if dl.null => {
                    if dl.writer.is_none() {
                        dl.writer = Some(BlockWriter::null(id, size));
                        dl.size = size;
                    }
                }
                Msg::Ready { size, mode, .. } => {
                    if dl.writer.is_none() {
                        if size != dl.ident.size {
                            return Err(XferError::new(
                                Kind::Integrity,
                                format!(
                                    "{}: the file changed on the server while being copied ({} bytes, now {size}); try again",
                                    dl.path, dl.ident.size
                                ),
                            ));
                        }
                        let (Some(part), Some(journal)) = (dl.part.as_ref(), dl.journal.take())
                        else {
                            return Err(XferError::conn("READY twice"));
                        };
                        let mut sink = BlockSink::journaled(id, size, journal);
                        if self.direct {
                            sink.set_direct(&part.file);
                        }
                        dl.writer = Some(BlockWriter::with_sink(sink, &part.file, self.ring)?);
                        dl.size = size;
                        dl.mode = mode;
                    }
                }
                Msg::Block(_) => {}
                Msg::Error { code, message, .. } => {
                    return Err(remote_err(code, &message));
                }
                Msg::FileDone { blake3, .. } => {
                    if blake3.is_some() {
                        dl.hash = blake3;
                    }
                    dl.outstanding = dl.outstanding.saturating_sub(1);
                    if dl.outstanding > 0 {
                        continue;
                    }
                    let bad = match dl.writer.as_mut() {
                        Some(w) => w.sync()?,
                        None => return Err(XferError::conn("FILE_DONE before READY")),
                    };
                    if !bad.is_empty() {
                        dl.rounds += 1;
                        if dl.rounds > crate::BLOCK_RETRIES {
                            return Err(XferError::new(
                                Kind::Integrity,
                                format!(
                                    "{}: blocks kept failing their CRC after {} retries; nothing was written. Check the network path (NIC, cable, memory) and try again",
                                    dl.path,
                                    crate::BLOCK_RETRIES
                                ),
                            ));
                        }
                        self.stats.blocks_resent += bad.len() as u64;
                        for (offset, len) in bad {
                            self.link.send(&Msg::Get {
                                file_id: id,
                                offset,
                                length: u64::from(len),
                                path: dl.path.clone(),
                            })?;
                            dl.outstanding += 1;
                        }
                        continue;
                    }
                    let Some(mut dl) = live.remove(&id) else {
                        continue;
                    };
                    if let Some(ch) = dl.chunk.take() {
                        let w = dl
                            .writer
                            .take()
                            .ok_or_else(|| XferError::conn("FILE_DONE before READY"))?;
                        if let Some(size) = ch.done(w.finish()?)? {
                            self.stats.files += 1;
                            self.stats.bytes += size;
                        }
                        continue;
                    }
                    if dl.null {
                        self.stats.files += 1;
                        self.stats.bytes += dl.size;
                        continue;
                    }
                    if dl.hash.is_none() && crate::mem::classify(&dl.path).is_some() {
                        // A server's zero source sends no hash: what was written must be zeros.
                        dl.hash = Some(crate::mem::zero_hash(dl.size));
                    }
                    let (Some(part), Some(writer)) = (dl.part.take(), dl.writer.take()) else {
                        return Err(XferError::conn("FILE_DONE before READY"));
                    };
                    let mut sink = writer.finish()?;
                    let fail = |part: LocalPart, e: XferError| {
                        part.discard();
                        Err(e)
                    };
                    if let Some(e) = sink.io_error.take() {
                        return fail(part, XferError::io(dl.dest.display(), &e));
                    }
                    let got = match sink.hash(&part.file) {
                        Ok(h) => h,
                        Err(e) => return fail(part, XferError::io(dl.dest.display(), &e)),
                    };
                    if dl.hash != Some(got) {
                        return fail(
                            part,
                            XferError::new(
                                Kind::Integrity,
                                format!(
                                    "{}: the whole-file BLAKE3 does not match the server's; nothing was written. Was the file changing on the server? Try again",
                                    dl.path
                                ),
                            ),
                        );
                    }
                    let (mode, mtime) = (dl.mode, system_time(dl.ident.mtime));
                    commits.submit(move || part.commit(mode, mtime).map(Some))?;
                    self.stats.files += 1;
                    self.stats.bytes += dl.size;
                }
                m => return Err(unexpected(&m)),
            }
        }
    }

    /// Uploads one local file to a remote path.
    pub fn upload_file(&mut self, src: &Path, path: &str, progress: &dyn Progress) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let file = File::open(src).map_err(|e| XferError::io(src.display(), &e))?;
        let md = file
            .metadata()
            .map_err(|e| XferError::io(src.display(), &e))?;
        if !md.is_file() {
            return Err(XferError::new(
                Kind::Usage,
                format!(
                    "{}: not a regular file (use -r for directories)",
                    src.display()
                ),
            ));
        }
        use std::os::unix::fs::MetadataExt;
        let mtime = md
            .mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(md.mtime_nsec());
        let mode = md.permissions().mode() & 0o7777;
        self.put(
            Source::File(&file),
            md.len(),
            mode,
            Some(mtime),
            path,
            progress,
        )
    }

    /// Uploads an open regular file of `size` bytes to a remote path, creating it with
    /// permission bits `mode` and, if given, the source's `mtime` (ns since the epoch).
    pub fn upload_open(
        &mut self,
        file: &File,
        size: u64,
        mode: u32,
        mtime: Option<i64>,
        path: &str,
        progress: &dyn Progress,
    ) -> Result<()> {
        self.put(Source::File(file), size, mode, mtime, path, progress)
    }

    /// Uploads `size` zero bytes (the `zero:SIZE` source of memory mode) to a remote path;
    /// no file is read. To the server's null sink (`mem/null`) nothing is hashed.
    pub fn upload_zero(&mut self, size: u64, path: &str, progress: &dyn Progress) -> Result<()> {
        self.put(Source::Zero, size, 0o644, None, path, progress)
    }

    fn put(
        &mut self,
        src: Source<'_>,
        size: u64,
        mode: u32,
        mtime: Option<i64>,
        path: &str,
        progress: &dyn Progress,
    ) -> Result<()> {
        let file_id = self.id();
        // 1.1 servers take the source's mtime (kept on the file, checked on resume) and
        // resume; a 1.0 server gets a plain PUT.
        let v11 = self.minor >= 1;
        let resume = self.resume && v11 && matches!(src, Source::File(_));
        if self.resume && !v11 {
            tracing::warn!(
                "the server speaks protocol 1.0 and cannot resume; sending the whole file"
            );
        }
        self.link.send(&Msg::Put {
            file_id,
            flags: if resume { proto::PUT_RESUME } else { 0 },
            mode,
            size,
            mtime: mtime.filter(|_| v11),
            path: path.into(),
        })?;
        let offset = match self.link.recv_msg()? {
            Msg::Ready { offset, .. } if offset <= size => offset,
            Msg::Ready { offset, .. } => {
                return Err(XferError::conn(format!(
                    "the server would resume at {offset}, past the end ({size} bytes)"
                )))
            }
            Msg::Error { code, message, .. } => return Err(remote_err(code, &message)),
            m => return Err(unexpected(&m)),
        };
        let to_null = crate::mem::classify(path) == Some(Ok(crate::mem::Virtual::Null));
        let mut hasher = (!to_null).then(blake3::Hasher::new);
        if offset > 0 {
            tracing::info!("{path}: resuming at byte {offset}");
            if let (Source::File(file), Some(h)) = (src, hasher.as_mut()) {
                hash_prefix(file, offset, h).map_err(|e| XferError::io(path, &e))?;
            }
            self.stats.resumed_bytes += offset;
            progress.add(offset);
        }
        self.stats.wire_bytes += size - offset;
        {
            let tx = &mut self.tx;
            let add = |n| progress.add(n);
            let sent = tx.send_range(
                &self.link,
                src,
                Span {
                    file_id,
                    offset,
                    len: size - offset,
                },
                hasher.as_mut(),
                &add,
            );
            if let Err(e) = sent {
                let _ = tx.flush();
                let _ = self.link.send(&Msg::Error {
                    code: e.code(),
                    file_id,
                    message: e.msg.clone(),
                });
                return Err(e);
            }
            // The server answers FILE_DONE only after taking every block: no flush needed.
        }
        let hash = hasher.map(|h| *h.finalize().as_bytes());
        loop {
            self.link.send(&Msg::FileDone {
                file_id,
                length: size,
                blake3: hash,
            })?;
            match self.link.recv_msg()? {
                Msg::Ok { .. } => break,
                Msg::Resend { ranges, .. } => {
                    self.stats.blocks_resent += ranges.len() as u64;
                    self.stats.wire_bytes += ranges.iter().map(|r| u64::from(r.1)).sum::<u64>();
                    let tx = &mut self.tx;
                    for (off, len) in ranges {
                        if off.saturating_add(u64::from(len)) > size {
                            return Err(XferError::conn(
                                "the server asked for a range past the end",
                            ));
                        }
                        tx.send_range(
                            &self.link,
                            src,
                            Span {
                                file_id,
                                offset: off,
                                len: u64::from(len),
                            },
                            None,
                            &|_| {},
                        )?;
                    }
                }
                Msg::Error { code, message, .. } => return Err(remote_err(code, &message)),
                m => return Err(unexpected(&m)),
            }
        }
        self.stats.files += 1;
        self.stats.bytes += size;
        Ok(())
    }

    /// Lists a remote tree: its directories (relative, parents first) and files.
    fn walk_remote(&mut self, path: &str) -> Result<Tree> {
        walk_entries(path, |p| self.list(p))
    }

    /// Where a copy of a source named `name` lands when its destination is `path`: inside
    /// `path` if that is an existing directory (as `scp` does), else at `path` itself.
    pub fn target(&mut self, path: &str, name: &str) -> Result<String> {
        Ok(match self.stat(path) {
            Ok(e) if e.kind == EntryKind::Dir && !name.is_empty() => join(path, name),
            Ok(_) => path.to_string(),
            Err(e) if e.kind == Kind::NotFound => path.to_string(),
            Err(e) => return Err(e),
        })
    }

    /// Ends the session politely.
    pub fn bye(self) {
        let _ = self.link.send(&Msg::Bye);
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Feeds `file[..len]` to `h`.
fn hash_prefix(file: &File, len: u64, h: &mut blake3::Hasher) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    while pos < len {
        let n = (len - pos).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], pos)?;
        h.update(&buf[..n]);
        pos += n as u64;
    }
    Ok(())
}

pub(crate) fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{}/{b}", a.trim_end_matches('/')),
    }
}

pub(crate) fn basename(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

/// Copies `src` to `dst` (one of them local, one remote), like `scp`: into an existing
/// directory the source keeps its name. `recursive` copies trees. After a connection
/// failure it reconnects and resumes up to `opts.retries` times.
pub fn copy(
    src: &Location,
    dst: &Location,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Stats> {
    let mut total = Stats::default();
    let mut opts = opts.clone();
    let mut delay = RETRY_DELAY;
    loop {
        let res = match (src, dst) {
            (Location::Remote(r), Location::Local(l)) if opts.streams > 1 => {
                crate::parallel::download(r, Some(l), recursive, &opts, progress, &mut total)
            }
            (Location::Remote(r), Location::Null) if opts.streams > 1 => {
                crate::parallel::download(r, None, recursive, &opts, progress, &mut total)
            }
            (Location::Local(l), Location::Remote(r)) if opts.streams > 1 => {
                crate::parallel::upload(Some(l), 0, r, recursive, &opts, progress, &mut total)
            }
            (Location::Zero(n), Location::Remote(r)) if opts.streams > 1 => {
                crate::parallel::upload(None, *n, r, recursive, &opts, progress, &mut total)
            }
            (Location::Remote(r), Location::Local(l)) => {
                download(r, Some(l), recursive, &opts, progress, &mut total)
            }
            (Location::Remote(r), Location::Null) => {
                download(r, None, recursive, &opts, progress, &mut total)
            }
            (Location::Local(l), Location::Remote(r)) => {
                upload(l, r, recursive, &opts, progress, &mut total)
            }
            (Location::Remote(s), Location::Remote(d)) => {
                third_party(s, d, recursive, &opts, progress, &mut total)
            }
            (Location::Zero(n), Location::Remote(r)) => {
                with_client(r, &opts, &mut total, |c| {
                    let target = c.target(&r.path, "zero")?;
                    progress.total(*n);
                    c.upload_zero(*n, &target, progress)
                })
            }
            (_, Location::Zero(_)) => Err(XferError::new(
                Kind::Usage,
                "zero:SIZE is a source only; to discard data write to null: (or the server's mem/null)",
            )),
            (Location::Null, _) => Err(XferError::new(
                Kind::Usage,
                "null: is a sink only; to send zeros read zero:SIZE (or the server's mem/zero/SIZE)",
            )),
            (Location::Zero(_) | Location::Local(_), Location::Null | Location::Local(_)) => {
                Err(XferError::new(
                    Kind::Usage,
                    "both ends are local: one of SRC and DST must be remote (host:root/path or ferry://host/root/path)",
                ))
            }
        };
        match res {
            Ok(()) => return Ok(total),
            Err(e) if e.kind == Kind::Connection && total.retries < u64::from(opts.retries) => {
                total.retries += 1;
                tracing::warn!(
                    "{e}; retrying in {:.1} s ({} of {}), resuming",
                    delay.as_secs_f64(),
                    total.retries,
                    opts.retries
                );
                std::thread::sleep(delay);
                delay = (delay * 2).min(RETRY_MAX_DELAY);
                progress.restart();
                // A retry continues what the failed attempt left.
                opts.resume = true;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Runs `f` on a new connection and adds its counters to `total`, whatever the outcome.
pub(crate) fn with_client(
    r: &Remote,
    opts: &Options,
    total: &mut Stats,
    f: impl FnOnce(&mut Client) -> Result<()>,
) -> Result<()> {
    let mut c = Client::connect(&r.addr, opts)?;
    let res = f(&mut c);
    total.add(&c.stats);
    if res.is_ok() {
        c.bye();
    }
    res
}

/// Where a tree goes when its destination is an existing directory: normally inside it
/// under the source's name (as scp does). A resume would then nest a second copy inside the
/// directory the interrupted run created, so with `--resume` a tree goes into the
/// directory itself unless that already holds an entry of the source's name.
fn resume_into_itself(opts: &Options, is_tree: bool, named_exists: bool) -> bool {
    opts.resume && is_tree && !named_exists
}

/// Downloads to `local` (`None`: the null sink, nothing is written).
fn download(
    r: &Remote,
    local: Option<&Path>,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
    total: &mut Stats,
) -> Result<()> {
    with_client(r, opts, total, |c| {
        let jobs = plan_download(c, r, local, recursive, opts, progress)?;
        c.download_files(jobs, progress)
    })
}

/// What a download of `r` to `local` fetches: STATs (and walks) the source, creates the
/// local directories, and skips (counting them) files a resume finds complete.
pub(crate) fn plan_download(
    c: &mut Client,
    r: &Remote,
    local: Option<&Path>,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Vec<DlJob>> {
    {
        let entry = c.stat(&r.path)?;
        let is_tree = entry.kind == EntryKind::Dir;
        let dest = local.map(|local| {
            let named = local.join(basename(&r.path));
            if local.is_dir() && !resume_into_itself(opts, is_tree, named.exists()) {
                named
            } else {
                local.to_path_buf()
            }
        });
        let files = match entry.kind {
            EntryKind::File => {
                vec![(r.path.clone(), dest, entry.size, entry.mtime)]
            }
            EntryKind::Dir if recursive => {
                let (dirs, files) = c.walk_remote(&r.path)?;
                let mk = |p: &Path| {
                    std::fs::create_dir_all(p).map_err(|e| XferError::io(p.display(), &e))
                };
                if let Some(dest) = &dest {
                    mk(dest)?;
                    for d in &dirs {
                        mk(&dest.join(d))?;
                    }
                }
                files
                    .into_iter()
                    .map(|(rel, size, mtime)| {
                        let to = dest.as_ref().map(|d| d.join(&rel));
                        (join(&r.path, &rel), to, size, mtime)
                    })
                    .collect()
            }
            EntryKind::Dir => {
                return Err(XferError::new(
                    Kind::Usage,
                    format!("{}: is a directory; use -r to copy trees", r.path),
                ))
            }
            _ => {
                return Err(XferError::new(
                    Kind::Usage,
                    format!("{}: not a regular file or directory", r.path),
                ))
            }
        };
        progress.total(files.iter().map(|f| f.2).sum());
        let mut jobs = Vec::new();
        for (path, dest, size, mtime) in files {
            let ident = Ident { size, mtime };
            if opts.resume && dest.as_ref().is_some_and(|d| complete_at(d, ident)) {
                c.stats.files += 1;
                c.stats.files_skipped += 1;
                c.stats.bytes += size;
                progress.add(size);
                continue;
            }
            jobs.push(DlJob {
                path,
                dest,
                ident,
                chunk: None,
            });
        }
        Ok(jobs)
    }
}

fn upload(
    local: &Path,
    r: &Remote,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
    total: &mut Stats,
) -> Result<()> {
    let md = std::fs::metadata(local).map_err(|e| XferError::io(local.display(), &e))?;
    if md.is_dir() && !recursive {
        return Err(XferError::new(
            Kind::Usage,
            format!("{}: is a directory; use -r to copy trees", local.display()),
        ));
    }
    with_client(r, opts, total, |c| {
        for (src, path, _) in plan_upload(c, local, &md, r, opts, progress)? {
            c.upload_file(&src, &path, progress)?;
        }
        Ok(())
    })
}

/// What an upload of `local` (metadata `md`) to `r` sends: (source, remote path, size) of
/// each file. STATs the target, creates the remote directories and skips (counting them)
/// files a resume finds complete there.
pub(crate) fn plan_upload(
    c: &mut Client,
    local: &Path,
    md: &std::fs::Metadata,
    r: &Remote,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Vec<(PathBuf, String, u64)>> {
    {
        let name = local
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (target, existing) = match c.stat(&r.path) {
            Ok(e) if e.kind == EntryKind::Dir && !name.is_empty() => {
                let named = join(&r.path, &name);
                let there = opts.resume && md.is_dir() && c.stat(&named).is_ok();
                if resume_into_itself(opts, md.is_dir(), there) {
                    (r.path.clone(), None)
                } else {
                    (named, None)
                }
            }
            Ok(e) => (r.path.clone(), Some(e)),
            Err(e) if e.kind == Kind::NotFound => (r.path.clone(), None),
            Err(e) => return Err(e),
        };
        // What the destination already holds, for a resume's quick check (size, mtime s).
        let mut there: HashMap<String, (u64, i64)> = HashMap::new();
        let files = if md.is_file() {
            if opts.resume {
                let e = match existing {
                    Some(e) => Some(e),
                    None => c.stat(&target).ok(),
                };
                if let Some(e) = e.filter(|e| e.kind == EntryKind::File) {
                    there.insert(String::new(), (e.size, e.mtime));
                }
            }
            vec![(String::new(), md.len(), mtime_secs(md))]
        } else {
            let (dirs, files) = walk_local(local)?;
            if opts.resume {
                if let Ok((_, remote)) = c.walk_remote(&target) {
                    there = remote.into_iter().map(|(p, s, m)| (p, (s, m))).collect();
                }
            }
            c.mkdir(&target, 0o755)?;
            for d in &dirs {
                c.mkdir(&join(&target, d), 0o755)?;
            }
            files
        };
        progress.total(files.iter().map(|f| f.1).sum());
        let mut out = Vec::new();
        for (rel, size, mtime) in files {
            if there.get(&rel) == Some(&(size, mtime)) {
                c.stats.files += 1;
                c.stats.files_skipped += 1;
                c.stats.bytes += size;
                progress.add(size);
                continue;
            }
            let src = if rel.is_empty() {
                local.to_path_buf()
            } else {
                local.join(&rel)
            };
            out.push((src, join(&target, &rel), size));
        }
        Ok(out)
    }
}

/// A third-party copy: the source server sends straight to the destination server, and
/// this client only watches.
fn third_party(
    src: &Remote,
    dst: &Remote,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
    total: &mut Stats,
) -> Result<()> {
    with_client(src, opts, total, |c| {
        if c.minor < 1 {
            return Err(XferError::new(
                Kind::Usage,
                format!(
                    "{} speaks transfer protocol 1.{} and cannot make third-party copies: upgrade it, or copy through this host in two steps",
                    src.addr, c.minor
                ),
            ));
        }
        let file_id = c.id();
        c.link.send(&Msg::SendTo {
            flags: if recursive { proto::SEND_RECURSIVE } else { 0 },
            file_id,
            path: src.path.clone(),
            dest: dst.addr.clone(),
            dest_path: dst.path.clone(),
            token: opts
                .dest_token
                .clone()
                .unwrap_or_else(|| opts.token.clone()),
        })?;
        let mut shown = 0;
        loop {
            match c.link.recv_msg()? {
                Msg::Progress { done, total, .. } => {
                    if shown == 0 {
                        progress.total(total);
                    }
                    progress.add(done.saturating_sub(shown));
                    shown = shown.max(done);
                }
                Msg::Copied {
                    files,
                    bytes,
                    blocks_resent,
                    ..
                } => {
                    progress.add(bytes.saturating_sub(shown));
                    c.stats.files += files;
                    c.stats.bytes += bytes;
                    c.stats.wire_bytes += bytes;
                    c.stats.blocks_resent += blocks_resent;
                    return Ok(());
                }
                Msg::Error { code, message, .. } => return Err(remote_err(code, &message)),
                m => return Err(unexpected(&m)),
            }
        }
    })
}

/// A local tree's directories (relative, parents first) and files; symlinks are skipped
/// with a warning, names that are not UTF-8 are refused.
fn walk_local(root: &Path) -> Result<Tree> {
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    let mut todo = vec![String::new()];
    while let Some(rel) = todo.pop() {
        let here = root.join(&rel);
        let rd = std::fs::read_dir(&here).map_err(|e| XferError::io(here.display(), &e))?;
        for ent in rd {
            let ent = ent.map_err(|e| XferError::io(here.display(), &e))?;
            let name = ent.file_name().into_string().map_err(|n| {
                XferError::new(
                    Kind::Usage,
                    format!("{}: name is not UTF-8; rename it", here.join(n).display()),
                )
            })?;
            let r = join(&rel, &name);
            let ft = ent
                .file_type()
                .map_err(|e| XferError::io(ent.path().display(), &e))?;
            if ft.is_dir() {
                dirs.push(r.clone());
                todo.push(r);
            } else if ft.is_file() {
                let md = ent
                    .metadata()
                    .map_err(|e| XferError::io(ent.path().display(), &e))?;
                files.push((r, md.len(), mtime_secs(&md)));
            } else {
                tracing::warn!(
                    "{}: skipping (not a file or directory)",
                    ent.path().display()
                );
            }
        }
    }
    dirs.sort();
    Ok((dirs, files))
}

/// BLAKE3 of a local file, as `ferry sum` prints it.
pub fn sum_local(path: &Path) -> Result<(u64, [u8; 32])> {
    let f = File::open(path).map_err(|e| XferError::io(path.display(), &e))?;
    let md = f
        .metadata()
        .map_err(|e| XferError::io(path.display(), &e))?;
    if !md.is_file() {
        return Err(XferError::new(
            Kind::Usage,
            format!("{}: not a regular file", path.display()),
        ));
    }
    let h =
        crate::server::hash_file(&f, md.len()).map_err(|e| XferError::io(path.display(), &e))?;
    Ok((md.len(), h))
}

/// Hex of a hash.
pub fn hex(h: &[u8; 32]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}
