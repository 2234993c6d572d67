//! The client side of `ferry cp`, `ferry ls` and `ferry sum`.
//!
//! Downloads are pipelined: up to [`GET_WINDOW`] GETs are outstanding, the server answers
//! them in order, and every message names its transfer, so a tree of small files costs
//! little more than its bytes. Each received block is checked against its CRC-32C; bad
//! blocks are fetched again by ranged GETs (up to [`crate::BLOCK_RETRIES`] rounds) and the
//! whole file's BLAKE3 is compared before `.<name>.ferry-part` is fsynced and renamed.
//! Uploads stream a file's blocks, then FILE_DONE with its BLAKE3; the server answers OK,
//! RESEND (blocks that failed their CRC) or ERROR.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Kind, Result, XferError};
use crate::link::{BlockSender, BlockWriter, Link, Source, Span, HANDSHAKE_TIMEOUT};
use crate::proto::{self, Entry, EntryKind, Msg, BLOCK_HEADER_LEN};
use crate::server::part_name;
use crate::url::{Location, Remote};

/// A tree: its directories (relative, parents first) and its files with their sizes.
pub(crate) type Tree = (Vec<String>, Vec<(String, u64)>);

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
                EntryKind::File => files.push((r, e.size)),
                _ => tracing::warn!("{}: skipping (not a file or directory)", join(path, &r)),
            }
        }
    }
    dirs.sort();
    Ok((dirs, files))
}

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
    /// Token for the destination server of a third-party copy (`None`: the same token).
    pub dest_token: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: String::new(),
            block_size: crate::DEFAULT_BLOCK,
            ring: crate::DEFAULT_RING,
            timeout: Duration::from_secs(10),
            dest_token: None,
        }
    }
}

/// What a copy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Files copied.
    pub files: u64,
    /// File bytes copied.
    pub bytes: u64,
    /// Blocks sent again after a CRC mismatch.
    pub blocks_resent: u64,
}

/// Receives progress reports.
pub trait Progress {
    /// The total number of bytes, once known.
    fn total(&self, _bytes: u64) {}
    /// `bytes` more moved.
    fn add(&self, _bytes: u64) {}
}

impl Progress for () {}

/// A connection to a `ferry serve`.
pub struct Client {
    link: Link,
    block: u32,
    tx: BlockSender,
    ring: usize,
    next_id: u32,
    /// Counters so far.
    pub stats: Stats,
    /// The server's protocol minor version (what it can do).
    server_minor: u16,
}

fn remote_err(code: proto::ErrorCode, message: &str) -> XferError {
    XferError::remote(code, message)
}

fn unexpected(m: &Msg) -> XferError {
    XferError::conn(format!("the server sent an unexpected frame: {m:?}"))
}

/// A local file being written under its temporary name.
struct LocalPart {
    dest: PathBuf,
    tmp: PathBuf,
    file: File,
}

impl LocalPart {
    fn create(dest: &Path) -> Result<LocalPart> {
        let name = dest
            .file_name()
            .ok_or_else(|| {
                XferError::new(Kind::Usage, format!("{}: not a file name", dest.display()))
            })?
            .to_string_lossy()
            .into_owned();
        let tmp = dest.with_file_name(part_name(&name));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| XferError::io(tmp.display(), &e))?;
        Ok(LocalPart {
            dest: dest.to_path_buf(),
            tmp,
            file,
        })
    }

    fn commit(self, mode: u32) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let io = |e: std::io::Error| XferError::io(self.dest.display(), &e);
        self.file
            .set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))
            .map_err(io)?;
        self.file.sync_all().map_err(io)?;
        std::fs::rename(&self.tmp, &self.dest).map_err(io)?;
        let parent = match self.dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(parent).and_then(|d| d.sync_all()).map_err(io)
    }

    fn discard(self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// One file of a download.
struct Dl {
    path: String,
    /// Discard the data (the null sink): CRCs are checked, nothing is written.
    null: bool,
    dest: PathBuf,
    part: Option<LocalPart>,
    writer: Option<BlockWriter>,
    size: u64,
    mode: u32,
    hash: Option<[u8; 32]>,
    outstanding: u32,
    rounds: u32,
}

impl Client {
    /// Connects and authenticates.
    pub fn connect(addr: &str, opts: &Options) -> Result<Client> {
        let mut link = Link::connect(addr, opts.timeout)?;
        link.timeout = HANDSHAKE_TIMEOUT;
        link.post_ring(1, proto::MAX_CONTROL)?;
        link.send(&Msg::Hello {
            major: proto::VERSION_MAJOR,
            minor: proto::VERSION_MINOR,
            block_size: opts.block_size.clamp(proto::MIN_BLOCK, proto::MAX_BLOCK),
            session: 0,
            stream: 0,
            token: opts.token.clone(),
        })?;
        let (block, server_minor) = match link.recv_msg() {
            Ok(Msg::Welcome {
                block_size, minor, ..
            }) => (block_size, minor),
            Ok(Msg::Error { code, message, .. }) => return Err(remote_err(code, &message)),
            Ok(m) => return Err(unexpected(&m)),
            Err(e) => return Err(e),
        };
        if !(proto::MIN_BLOCK..=proto::MAX_BLOCK).contains(&block) {
            return Err(XferError::conn(format!(
                "the server chose a bad block size {block}"
            )));
        }
        link.timeout = Duration::from_secs(120);
        link.post_ring(opts.ring.max(2), BLOCK_HEADER_LEN + block as usize)?;
        Ok(Client {
            link,
            block,
            tx: BlockSender::new(block, opts.ring.max(1), Duration::from_secs(120))?,
            ring: opts.ring.max(1),
            next_id: 1,
            stats: Stats::default(),
            server_minor,
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

    /// Downloads remote files to local paths (`None`: the null sink), pipelined.
    pub fn download_files(
        &mut self,
        jobs: Vec<(String, Option<PathBuf>)>,
        progress: &dyn Progress,
    ) -> Result<()> {
        let mut jobs = jobs.into_iter();
        let mut live: HashMap<u32, Dl> = HashMap::new();
        let res = self.download_loop(&mut jobs, &mut live, progress);
        if res.is_err() {
            for (_, dl) in live.drain() {
                if let Some(p) = dl.part {
                    p.discard();
                }
            }
        }
        res
    }

    fn download_loop(
        &mut self,
        jobs: &mut impl Iterator<Item = (String, Option<PathBuf>)>,
        live: &mut HashMap<u32, Dl>,
        progress: &dyn Progress,
    ) -> Result<()> {
        loop {
            while live.len() < GET_WINDOW {
                let Some((path, dest)) = jobs.next() else {
                    break;
                };
                let file_id = self.id();
                self.link.send(&Msg::Get {
                    file_id,
                    offset: 0,
                    length: u64::MAX,
                    path: path.clone(),
                })?;
                live.insert(
                    file_id,
                    Dl {
                        path,
                        null: dest.is_none(),
                        dest: dest.unwrap_or_default(),
                        part: None,
                        writer: None,
                        size: 0,
                        mode: 0o644,
                        hash: None,
                        outstanding: 1,
                        rounds: 0,
                    },
                );
            }
            if live.is_empty() {
                return Ok(());
            }
            // BLOCKs are checked (and written) in place in the receive buffer.
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
                }
                Ok(msg)
            })??;
            let id = match &msg {
                Msg::Ready { file_id, .. }
                | Msg::FileDone { file_id, .. }
                | Msg::Error { file_id, .. } => *file_id,
                Msg::Block(h) => h.file_id,
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
                Msg::Ready { size, .. } if dl.null => {
                    if dl.writer.is_none() {
                        dl.writer = Some(BlockWriter::null(id, size));
                        dl.size = size;
                    }
                }
                Msg::Ready { size, mode, .. } => {
                    if dl.part.is_none() {
                        let part = LocalPart::create(&dl.dest)?;
                        dl.writer = Some(BlockWriter::new(id, size, &part.file, self.ring)?);
                        dl.part = Some(part);
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
                    part.commit(dl.mode)?;
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
        let mode = md.permissions().mode() & 0o7777;
        self.put(Source::File(&file), md.len(), mode, path, progress)
    }

    /// Uploads an open regular file of `size` bytes to a remote path, creating it with
    /// permission bits `mode`.
    pub fn upload_open(
        &mut self,
        file: &File,
        size: u64,
        mode: u32,
        path: &str,
        progress: &dyn Progress,
    ) -> Result<()> {
        self.put(Source::File(file), size, mode, path, progress)
    }

    /// Uploads `size` zero bytes (the `zero:SIZE` source of memory mode) to a remote path;
    /// no file is read. To the server's null sink (`mem/null`) nothing is hashed.
    pub fn upload_zero(&mut self, size: u64, path: &str, progress: &dyn Progress) -> Result<()> {
        self.put(Source::Zero, size, 0o644, path, progress)
    }

    fn put(
        &mut self,
        src: Source<'_>,
        size: u64,
        mode: u32,
        path: &str,
        progress: &dyn Progress,
    ) -> Result<()> {
        let file_id = self.id();
        self.link.send(&Msg::Put {
            file_id,
            flags: 0,
            mode,
            size,
            path: path.into(),
        })?;
        match self.link.recv_msg()? {
            Msg::Ready { .. } => {}
            Msg::Error { code, message, .. } => return Err(remote_err(code, &message)),
            m => return Err(unexpected(&m)),
        }
        let to_null = crate::mem::classify(path) == Some(Ok(crate::mem::Virtual::Null));
        let mut hasher = (!to_null).then(blake3::Hasher::new);
        {
            let tx = &mut self.tx;
            let add = |n| progress.add(n);
            let sent = tx.send_range(
                &self.link,
                src,
                Span {
                    file_id,
                    offset: 0,
                    len: size,
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

    /// Lists a remote tree: its directories (relative, parents first) and files.
    fn walk_remote(&mut self, path: &str) -> Result<Tree> {
        walk_entries(path, |p| self.list(p))
    }

    /// Ends the session politely.
    pub fn bye(self) {
        let _ = self.link.send(&Msg::Bye);
        std::thread::sleep(Duration::from_millis(5));
    }
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
/// directory the source keeps its name. `recursive` copies trees.
pub fn copy(
    src: &Location,
    dst: &Location,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Stats> {
    match (src, dst) {
        (Location::Remote(r), Location::Local(l)) => {
            download(r, Some(l), recursive, opts, progress)
        }
        (Location::Remote(r), Location::Null) => download(r, None, recursive, opts, progress),
        (Location::Local(l), Location::Remote(r)) => upload(l, r, recursive, opts, progress),
        (Location::Remote(s), Location::Remote(d)) => third_party(s, d, recursive, opts, progress),
        (Location::Zero(n), Location::Remote(r)) => upload_zero(*n, r, opts, progress),
        (_, Location::Zero(_)) => Err(XferError::new(
            Kind::Usage,
            "zero:SIZE is a source only; to discard data write to null: (or the server's mem/null)",
        )),
        (Location::Null, _) => Err(XferError::new(
            Kind::Usage,
            "null: is a sink only; to send zeros read zero:SIZE (or the server's mem/zero/SIZE)",
        )),
        (Location::Zero(_) | Location::Local(_), Location::Null | Location::Local(_)) => Err(XferError::new(
            Kind::Usage,
            "both ends are local: one of SRC and DST must be remote (host:root/path or ferry://host/root/path)",
        )),
    }
}

/// Downloads to `local` (`None`: the null sink, nothing is written).
fn download(
    r: &Remote,
    local: Option<&Path>,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Stats> {
    let mut c = Client::connect(&r.addr, opts)?;
    let entry = c.stat(&r.path)?;
    let dest = local.map(|l| match l.is_dir() {
        true => l.join(basename(&r.path)),
        false => l.to_path_buf(),
    });
    match entry.kind {
        EntryKind::File => {
            progress.total(entry.size);
            c.download_files(vec![(r.path.clone(), dest)], progress)?;
        }
        EntryKind::Dir if recursive => {
            let (dirs, files) = c.walk_remote(&r.path)?;
            progress.total(files.iter().map(|f| f.1).sum());
            let mk =
                |p: &Path| std::fs::create_dir_all(p).map_err(|e| XferError::io(p.display(), &e));
            if let Some(dest) = &dest {
                mk(dest)?;
                for d in &dirs {
                    mk(&dest.join(d))?;
                }
            }
            let jobs = files
                .into_iter()
                .map(|(rel, _)| (join(&r.path, &rel), dest.as_ref().map(|d| d.join(&rel))))
                .collect();
            c.download_files(jobs, progress)?;
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
    }
    let stats = c.stats;
    c.bye();
    Ok(stats)
}

fn upload(
    local: &Path,
    r: &Remote,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Stats> {
    let md = std::fs::metadata(local).map_err(|e| XferError::io(local.display(), &e))?;
    if md.is_dir() && !recursive {
        return Err(XferError::new(
            Kind::Usage,
            format!("{}: is a directory; use -r to copy trees", local.display()),
        ));
    }
    let mut c = Client::connect(&r.addr, opts)?;
    let name = local
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let target = c.target(&r.path, &name)?;
    if md.is_file() {
        progress.total(md.len());
        c.upload_file(local, &target, progress)?;
    } else {
        let (dirs, files) = walk_local(local)?;
        progress.total(files.iter().map(|f| f.1).sum());
        c.mkdir(&target, 0o755)?;
        for d in &dirs {
            c.mkdir(&join(&target, d), 0o755)?;
        }
        for (rel, _) in files {
            c.upload_file(&local.join(&rel), &join(&target, &rel), progress)?;
        }
    }
    let stats = c.stats;
    c.bye();
    Ok(stats)
}

/// A third-party copy: the source server sends straight to the destination server, and
/// this client only watches.
fn third_party(
    src: &Remote,
    dst: &Remote,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Stats> {
    let mut c = Client::connect(&src.addr, opts)?;
    if c.server_minor < 1 {
        return Err(XferError::new(
            Kind::Usage,
            format!(
                "{} speaks transfer protocol 1.{} and cannot make third-party copies: upgrade it, or copy through this host in two steps",
                src.addr, c.server_minor
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
                c.bye();
                return Ok(Stats {
                    files,
                    bytes,
                    blocks_resent,
                });
            }
            Msg::Error { code, message, .. } => return Err(remote_err(code, &message)),
            m => return Err(unexpected(&m)),
        }
    }
}

/// Uploads `size` zero bytes to `r` (into a directory: as `zero`).
fn upload_zero(size: u64, r: &Remote, opts: &Options, progress: &dyn Progress) -> Result<Stats> {
    let mut c = Client::connect(&r.addr, opts)?;
    let target = c.target(&r.path, "zero")?;
    progress.total(size);
    c.upload_zero(size, &target, progress)?;
    let stats = c.stats;
    c.bye();
    Ok(stats)
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
                let len = ent
                    .metadata()
                    .map_err(|e| XferError::io(ent.path().display(), &e))?
                    .len();
                files.push((r, len));
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
