//! Downloads: pipelined GETs into part files, CRC checks and re-fetches, resume, commits.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{remote_err, unexpected, Client, Progress, GET_WINDOW};
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::error::{Kind, Result, XferError};
use crate::link::BlockWriter;
use crate::proto::{self, Msg};
use ferry_service::commit::{CommitPool, SyncDir};
use ferry_service::journal::{journal_name, Ident, Journal};
use ferry_service::landing::{open_part, Found, OpenHow, Progress as Journaled};
use ferry_service::sink::BlockSink;

/// Where a downloaded file (or directory) lands: a relative path beneath a directory held
/// open, the destination the user named (for a tree) or the directory of a single file.
/// Everything beneath it is opened with [`ferry_service::beneath`]'s discipline, so no name a
/// server lists and no symlink inside the destination can lead a write outside it.
#[derive(Clone)]
pub struct Dest {
    base: Arc<DestBase>,
    base_path: PathBuf,
    rel: String,
}

/// The directory a download writes beneath, held open, and the directory beneath it that was
/// opened last: the files of a tree arrive directory by directory, so one `openat2` serves
/// them all instead of one per file (a tenth of the client's syscalls for small files). The
/// cached directory stays the one that was beneath the base when it was opened.
pub(crate) struct DestBase {
    fd: OwnedFd,
    last: std::sync::Mutex<Option<(String, Arc<OwnedFd>)>>,
}

impl DestBase {
    /// `dir` (relative, "" for the base itself), opened beneath the base.
    fn open_dir(&self, dir: &str) -> std::result::Result<Arc<OwnedFd>, Errno> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((name, fd)) = &*last {
            if name == dir {
                return Ok(fd.clone());
            }
        }
        let fd = Arc::new(ferry_service::beneath::open_dir_beneath(&self.fd, dir)?);
        *last = Some((dir.to_string(), fd.clone()));
        Ok(fd)
    }
}

impl std::fmt::Debug for Dest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.path().fmt(f)
    }
}

/// The error of a path operation beneath a destination: escapes are refusals (exit 7).
fn beneath_err(path: &Path, e: Errno) -> XferError {
    match e {
        Errno::XDEV | Errno::LOOP => XferError::new(
            Kind::Permission,
            format!(
                "{}: refused, the path leads outside the destination (a symlink?)",
                path.display()
            ),
        ),
        e => XferError::io(path.display(), &e.into()),
    }
}

impl Dest {
    /// Opens the directory `base` (it must exist) for paths beneath it.
    pub(crate) fn open_base(base: &Path) -> Result<Arc<DestBase>> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let at = if base.as_os_str().is_empty() {
            Path::new(".")
        } else {
            base
        };
        let fd = rustix::fs::open(at, flags, Mode::empty())
            .map_err(|e| XferError::io(base.display(), &e.into()))?;
        Ok(Arc::new(DestBase {
            fd,
            last: std::sync::Mutex::new(None),
        }))
    }

    /// `rel` beneath the open directory `base` (shown as `base_path`).
    pub(crate) fn under(base: &Arc<DestBase>, base_path: &Path, rel: &str) -> Dest {
        Dest {
            base: base.clone(),
            base_path: base_path.to_path_buf(),
            rel: rel.to_string(),
        }
    }

    /// A single file at `path` (the user's choice): beneath its directory.
    pub(crate) fn file(path: &Path) -> Result<Dest> {
        let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
            XferError::new(
                Kind::Usage,
                format!("{}: not a UTF-8 file name", path.display()),
            )
        })?;
        let dir = path.parent().unwrap_or(Path::new(""));
        Ok(Dest::under(&Dest::open_base(dir)?, dir, name))
    }

    /// The destination as a path, for messages.
    pub fn path(&self) -> PathBuf {
        if self.rel.is_empty() {
            self.base_path.clone()
        } else {
            self.base_path.join(&self.rel)
        }
    }

    /// The directory holding the last component, opened beneath the base, and that
    /// component.
    fn parent(&self) -> Result<(Arc<OwnedFd>, &str)> {
        let (dir, name) = ferry_service::beneath::split_last(&self.rel);
        let fd = self
            .base
            .open_dir(dir)
            .map_err(|e| beneath_err(&self.path(), e))?;
        Ok((fd, name))
    }

    /// Creates this directory (an existing one is fine; a symlink or file in its place
    /// is refused, not followed).
    pub(crate) fn mkdir(&self) -> Result<()> {
        let (parent, name) = self.parent()?;
        ferry_service::beneath::mkdir_in(&*parent, name, 0o755).map_err(|e| match e {
            Errno::NOTDIR => XferError::new(
                Kind::Usage,
                format!(
                    "{}: exists and is not a directory (a symlink is not followed)",
                    self.path().display()
                ),
            ),
            e => beneath_err(&self.path(), e),
        })
    }

    /// Whether a complete copy is already here by the quick check (a regular file of the
    /// same size and mtime; a symlink does not count).
    pub(crate) fn complete(&self, ident: Ident) -> bool {
        let Ok((dir, name)) = self.parent() else {
            return false;
        };
        rustix::fs::statat(&*dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
                && st.st_size as u64 == ident.size
                && st.st_mtime == ident.mtime
        })
    }
}

/// A local file being written under its temporary name, with its resume journal, in a
/// directory held open (see [`Dest`]).
pub(crate) struct LocalPart {
    /// The final path, for messages.
    dest: PathBuf,
    dir: Arc<OwnedFd>,
    name: String,
    tmp: String,
    pub(crate) file: File,
    /// Whether a journal file may exist next to the part (false: a deferred journal that
    /// was never created, so there is none to remove).
    journal: Arc<AtomicBool>,
}

/// Opens `name` in `dir` for a part or its journal, never following a symlink.
fn open_in(dir: &OwnedFd, name: &str, how: OpenHow) -> std::io::Result<File> {
    let mut flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match how {
        OpenHow::Truncate => flags |= OFlags::CREATE | OFlags::TRUNC,
        OpenHow::New => flags |= OFlags::CREATE | OFlags::EXCL,
        OpenHow::Existing => {}
    }
    let fd = rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600))?;
    Ok(File::from(fd))
}

/// Refuses, before any data moves (as `cp` does), to replace a read-only regular file `name`
/// in `dir` (shown as `shown`) unless `force`. (The commit renames the part over it, so
/// nothing is ever written into what is there; a directory there makes that rename fail,
/// which removes the part and fails the copy with exit 5.)
fn check_local_target(dir: &OwnedFd, name: &str, shown: &Path, force: bool) -> Result<()> {
    let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(XferError::io(shown.display(), &e.into())),
    };
    let regular = rustix::fs::FileType::from_raw_mode(st.st_mode).is_file();
    let read_only = regular
        && (st.st_mode & 0o222 == 0
            || rustix::fs::accessat(dir, name, rustix::fs::Access::WRITE_OK, AtFlags::EACCESS)
                .is_err());
    if read_only && !force {
        return Err(XferError::new(
            Kind::Permission,
            format!(
                "{}: the file there is read-only; not replaced (ferry cp --force replaces it)",
                shown.display()
            ),
        ));
    }
    Ok(())
}

impl LocalPart {
    /// Opens `.<name>.ferry-part` next to `dest` for a download of `ident` (see
    /// [`ferry_service::landing::open_part`]), with `resume`, after checking what `dest` is now
    /// (see [`check_local_target`]; `force` replaces a read-only file).
    pub(crate) fn open(
        dest: &Dest,
        ident: Ident,
        block: u32,
        (resume, force): (bool, bool),
    ) -> Result<(LocalPart, Journaled, Found)> {
        let (dir, name) = dest.parent()?;
        let shown = dest.path();
        check_local_target(&dir, name, &shown, force)?;
        let tmp = ferry_service::roots::part_name(name);
        let part = |file, journal| LocalPart {
            dest: shown.clone(),
            dir: dir.clone(),
            name: name.to_string(),
            tmp: tmp.clone(),
            file,
            journal,
        };
        let io =
            |what: &str, e: std::io::Error| XferError::io(shown.with_file_name(what).display(), &e);
        if !resume && ident.size <= u64::from(block) {
            // One block: nothing to checkpoint before the file is whole, so no journal file
            // unless one turns out to be needed. A journal only means something with its part:
            // if a part of an earlier copy is there, its journal goes before the part is reused.
            let jname = journal_name(&tmp);
            let file = match open_in(&dir, &tmp, OpenHow::New) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    match rustix::fs::unlinkat(&*dir, jname.as_str(), AtFlags::empty()) {
                        Ok(()) | Err(Errno::NOENT) => {}
                        Err(e) => return Err(io(&jname, e.into())),
                    }
                    open_in(&dir, &tmp, OpenHow::Truncate).map_err(|e| io(&tmp, e))?
                }
                r => r.map_err(|e| io(&tmp, e))?,
            };
            let created = Arc::new(AtomicBool::new(false));
            let (flag, jdir) = (created.clone(), dir.clone());
            let later: ferry_service::journal::Opener = Box::new(move || {
                flag.store(true, Ordering::SeqCst);
                open_in(&jdir, &jname, OpenHow::Truncate)
            });
            let journal = Journaled::new(Journal::deferred(later, ident, block));
            return Ok((part(file, created), journal, Found::Fresh));
        }
        let open = |n: &str, how: OpenHow| open_in(&dir, n, how);
        let (file, progress, found) =
            open_part(&open, &tmp, ident, block, resume).map_err(|e| io(&tmp, e))?;
        Ok((part(file, Arc::new(AtomicBool::new(true))), progress, found))
    }

    /// Sets mode and mtime, fsyncs, drops the journal and renames into place; returns the
    /// directory, which the caller fsyncs (once for all the files committed into it) before
    /// it reports success. If any step fails the temporary file goes too (nothing to
    /// resume: the data was whole and verified, the failure is the destination's).
    pub(crate) fn commit(self, mode: u32, mtime: Option<SystemTime>) -> Result<SyncDir> {
        let res = self.try_commit(mode, mtime);
        if res.is_err() {
            self.discard();
        }
        res
    }

    fn try_commit(&self, mode: u32, mtime: Option<SystemTime>) -> Result<SyncDir> {
        use std::os::unix::fs::PermissionsExt;
        let io = |e: std::io::Error| XferError::io(self.dest.display(), &e);
        self.file
            .set_permissions(std::fs::Permissions::from_mode(
                ferry_service::commit::file_mode(mode, false),
            ))
            .map_err(io)?;
        if let Some(t) = mtime {
            self.file.set_modified(t).map_err(io)?;
        }
        self.file.sync_all().map_err(io)?;
        // The journal first: a part without one is never trusted.
        if self.journal.load(Ordering::SeqCst) {
            let jname = journal_name(&self.tmp);
            match rustix::fs::unlinkat(&*self.dir, jname.as_str(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(io(e.into())),
            }
        }
        rustix::fs::renameat(
            &*self.dir,
            self.tmp.as_str(),
            &*self.dir,
            self.name.as_str(),
        )
        .map_err(|e| io(e.into()))?;
        let shown = match self.dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Ok(SyncDir {
            dir: self.dir.clone(),
            shown,
        })
    }

    pub(crate) fn discard(self) {
        let jname = journal_name(&self.tmp);
        let _ = rustix::fs::unlinkat(&*self.dir, jname.as_str(), AtFlags::empty());
        let _ = rustix::fs::unlinkat(&*self.dir, self.tmp.as_str(), AtFlags::empty());
    }
}

/// One file to download: the remote path, where it goes, and the source's identity as
/// STAT or LIST reported it.
#[derive(Debug, Clone)]
pub struct DlJob {
    /// `root/relative/path` on the server.
    pub path: String,
    /// Local destination (`None`: the null sink of memory mode, nothing is written).
    pub dest: Option<Dest>,
    /// Size and mtime (seconds) of the source.
    pub ident: Ident,
    /// One range of a file that parallel streams share (`None`: the whole file).
    pub(crate) chunk: Option<crate::parallel::Chunk>,
}

pub(crate) fn system_time(secs: i64) -> Option<SystemTime> {
    let s = u64::try_from(secs).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(s))
}

pub(super) fn mtime_secs(md: &std::fs::Metadata) -> i64 {
    use std::os::unix::fs::MetadataExt;
    md.mtime()
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

impl Dl {
    /// A file whose GET was just sent: nothing received yet.
    fn new(
        job: DlJob,
        part: Option<LocalPart>,
        journal: Option<Journaled>,
        chunk: Option<crate::parallel::Chunk>,
    ) -> Dl {
        Dl {
            path: job.path,
            null: job.dest.is_none(),
            dest: job.dest.map(|d| d.path()).unwrap_or_default(),
            ident: job.ident,
            part,
            journal,
            writer: None,
            size: 0,
            mode: 0o644,
            hash: None,
            outstanding: 1,
            rounds: 0,
            chunk,
        }
    }
}

impl Client {
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
                let Some(part) = dl.part else {
                    // A chunk of a shared file: its writer reports the blocks it still
                    // writes to the file's journal, which the parallel copy checkpoints.
                    if let Some(w) = dl.writer.filter(|_| keep) {
                        let _ = w.finish();
                    }
                    continue;
                };
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

    fn start_download(
        &mut self,
        mut job: DlJob,
        live: &mut HashMap<u32, Dl>,
        sums: &mut VecDeque<u32>,
        gets: &mut Vec<(u32, String)>,
        progress: &dyn Progress,
    ) -> Result<()> {
        let file_id = self.id();
        if let Some(ch) = job.chunk.take() {
            self.flush_gets(gets)?;
            // A range of a file the streams share: its part is open already.
            self.send_get(file_id, &job.path, ch.lo, ch.hi - ch.lo, ch.sum, sums)?;
            live.insert(file_id, Dl::new(job, None, None, Some(ch)));
            return Ok(());
        }
        // No destination: the null sink, nothing to open or resume.
        let (part, journal, offset) = match &job.dest {
            None => (None, None, 0),
            Some(dest) => {
                let how = (self.resume, self.force);
                let (part, journal, found) = LocalPart::open(dest, job.ident, self.block, how)?;
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
        if offset == 0 && self.minor >= proto::MINOR_FILE {
            // Whole files go out in GETS frames, several per message.
            let bytes = |g: &[(u32, String)]| g.iter().map(|(_, p)| p.len() + 6).sum::<usize>();
            if gets.len() >= proto::MAX_GETS
                || bytes(gets) + job.path.len() + 6 > proto::MAX_CONTROL - 64
            {
                self.flush_gets(gets)?;
            }
            gets.push((file_id, job.path.clone()));
            live.insert(file_id, Dl::new(job, part, journal, None));
            return Ok(());
        }
        self.flush_gets(gets)?;
        // A ranged GET carries no hash: ask for the source's first.
        self.send_get(file_id, &job.path, offset, u64::MAX, offset > 0, sums)?;
        live.insert(file_id, Dl::new(job, part, journal, None));
        Ok(())
    }

    /// Sends a GET of `length` bytes at `offset` of `path` as transfer `file_id`, preceded by
    /// a SUM of the whole source if `sum` (answers come in request order, so `sums` records
    /// whose hash comes next).
    fn send_get(
        &self,
        file_id: u32,
        path: &str,
        offset: u64,
        length: u64,
        sum: bool,
        sums: &mut VecDeque<u32>,
    ) -> Result<()> {
        if sum {
            self.link.send(&Msg::Sum { path: path.into() })?;
            sums.push_back(file_id);
        }
        self.link.send(&Msg::Get {
            file_id,
            offset,
            length,
            path: path.into(),
        })
    }

    /// Sends the whole-file GETs collected in `gets` as one GETS frame.
    fn flush_gets(&self, gets: &mut Vec<(u32, String)>) -> Result<()> {
        if !gets.is_empty() {
            ferry_fabric::timeline::mark("cp.gets", gets.len() as u64);
        }
        if gets.is_empty() {
            return Ok(());
        }
        self.link.send(&Msg::Gets {
            files: std::mem::take(gets),
        })
    }

    fn download_loop(
        &mut self,
        jobs: &mut dyn Iterator<Item = DlJob>,
        live: &mut HashMap<u32, Dl>,
        commits: &mut CommitPool,
        progress: &dyn Progress,
    ) -> Result<()> {
        let mut sums = VecDeque::new();
        let mut gets = Vec::new();
        loop {
            self.refill(jobs, live, &mut sums, &mut gets, progress)?;
            if live.is_empty() {
                return Ok(());
            }
            ferry_fabric::timeline::mark("cp.wait", live.len() as u64);
            // BLOCKs and FILEs are checked (and written) in place in the receive buffer; a
            // BLOCK goes to its writer in that buffer (held until written, no copy).
            let wire = &mut self.stats.wire_bytes;
            let (direct, ring) = (self.direct, self.ring);
            let held = self.link.recv_held()?;
            let mut block = None;
            let msgs = held.with_bytes(|bytes| -> Result<Vec<Msg>> {
                ferry_fabric::timeline::mark("cp.got", bytes.len() as u64);
                let (msg, payload) = proto::decode(bytes)
                    .map_err(|e| XferError::conn(format!("the server sent a bad frame: {e}")))?;
                let mut take_file = |msg, payload: &[u8]| -> Result<Msg> {
                    let (id, len) = take_file(live, msg, payload, direct, ring)?;
                    progress.add(len);
                    *wire += len;
                    Ok(id)
                };
                match msg {
                    Msg::Pack { count, .. } => proto::decode_pack(count, payload)
                        .map_err(|e| XferError::conn(format!("the server sent a bad pack: {e}")))?
                        .into_iter()
                        .map(|(m, p)| take_file(m, p))
                        .collect(),
                    Msg::File { .. } => Ok(vec![take_file(msg, payload)?]),
                    Msg::Block(h) => {
                        block = Some((h, bytes.len() - payload.len()));
                        Ok(vec![msg])
                    }
                    _ => Ok(vec![msg]),
                }
            })?;
            match block {
                Some((h, at)) => {
                    let writer = live
                        .get_mut(&h.file_id)
                        .and_then(|dl| dl.writer.as_mut())
                        .ok_or_else(|| XferError::conn("BLOCK of no transfer in progress"))?;
                    writer.push_held(&h, held, at)?;
                    progress.add(u64::from(h.len));
                    self.stats.wire_bytes += u64::from(h.len);
                }
                // The peer gets the buffer back before the answers are worked through.
                None => self.link.give_back(held)?,
            }
            let last = msgs.len();
            ferry_fabric::timeline::mark("cp.msg", last as u64);
            for (i, msg) in msgs.into_iter().enumerate() {
                self.on_msg(msg, live, &mut sums, commits)?;
                // A PACK answers many GETs: ask for the next ones as soon as half the
                // window is back, not after the whole pack is written.
                if i + 1 < last {
                    self.refill(jobs, live, &mut sums, &mut gets, progress)?;
                }
            }
        }
    }

    /// Starts downloads of the next jobs while the window has room. A 1.3 server takes
    /// whole-file GETs in batches (GETS): refill once half the window is back, so that each
    /// batch carries several.
    fn refill(
        &mut self,
        jobs: &mut dyn Iterator<Item = DlJob>,
        live: &mut HashMap<u32, Dl>,
        sums: &mut VecDeque<u32>,
        gets: &mut Vec<(u32, String)>,
        progress: &dyn Progress,
    ) -> Result<()> {
        let refill = self.minor < proto::MINOR_FILE || live.len() <= GET_WINDOW / 2;
        while refill
            && live.len() < GET_WINDOW
            && live.values().filter(|d| d.chunk.is_some()).count() < crate::parallel::CHUNKS_AHEAD
        {
            let Some(job) = jobs.next() else {
                break;
            };
            self.start_download(job, live, sums, gets, progress)?;
        }
        self.flush_gets(gets)
    }

    /// Takes one frame of the server's answers (FILE and PACK frames already written as
    /// their READY, BLOCK and FILE_DONE, which is what arrives here for them).
    fn on_msg(
        &mut self,
        msg: Msg,
        live: &mut HashMap<u32, Dl>,
        sums: &mut VecDeque<u32>,
        commits: &mut CommitPool,
    ) -> Result<()> {
        let (direct, ring) = (self.direct, self.ring);
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
                return Ok(());
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
            Msg::Ready { size, mode, .. } => on_ready(dl, id, size, mode, direct, ring)?,
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
                    return Ok(());
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
                            crate::crc_exhausted(&dl.path),
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
                    return Ok(());
                }
                let Some(mut dl) = live.remove(&id) else {
                    return Ok(());
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
                    return Ok(());
                }
                if dl.null {
                    self.stats.files += 1;
                    self.stats.bytes += dl.size;
                    return Ok(());
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
                if ferry_service::commit::fsync_is_free(&part.file) {
                    // Nothing to wait for: a thread hand-off would cost more (tmpfs).
                    commits.run_here(move || part.commit(mode, mtime).map(Some))?;
                } else {
                    commits.submit(move || part.commit(mode, mtime).map(Some))?;
                }
                self.stats.files += 1;
                self.stats.bytes += dl.size;
            }
            m => return Err(unexpected(&m)),
        }
        Ok(())
    }
}

/// A whole small file (a FILE frame, alone or in a PACK): its READY, its one block (checked
/// and written in place) and its FILE_DONE, which it returns for the caller to take as
/// such, with the payload's length.
fn take_file(
    live: &mut HashMap<u32, Dl>,
    msg: Msg,
    payload: &[u8],
    direct: bool,
    ring: usize,
) -> Result<(Msg, u64)> {
    let Msg::File {
        file_id,
        mode,
        crc32c,
        blake3,
        len,
    } = msg
    else {
        return Err(unexpected(&msg));
    };
    let dl = live
        .get_mut(&file_id)
        .ok_or_else(|| XferError::conn("FILE of no transfer in progress"))?;
    on_ready(dl, file_id, u64::from(len), mode, direct, ring)?;
    let h = proto::BlockHeader {
        file_id,
        stream: 0,
        offset: 0,
        len,
        crc32c,
    };
    dl.writer
        .as_mut()
        .ok_or_else(|| XferError::conn("FILE of no transfer in progress"))?
        .push_file(&h, payload, &blake3)?;
    let done = Msg::FileDone {
        file_id,
        length: u64::from(len),
        blake3: Some(blake3),
    };
    Ok((done, u64::from(len)))
}

/// READY of `dl` (transfer `id`, `size` bytes, permission bits `mode`): its writer, once.
fn on_ready(dl: &mut Dl, id: u32, size: u64, mode: u32, direct: bool, ring: usize) -> Result<()> {
    if dl.writer.is_some() {
        return Ok(());
    }
    if let Some(ch) = &dl.chunk {
        dl.writer = Some(ch.writer(id, size, mode, ring)?);
    } else if dl.null {
        dl.writer = Some(BlockWriter::null(id, size));
    } else {
        if size != dl.ident.size {
            return Err(XferError::new(
                Kind::Integrity,
                format!(
                    "{}: the file changed on the server while being copied ({} bytes, now {size}); try again",
                    dl.path, dl.ident.size
                ),
            ));
        }
        let (Some(part), Some(journal)) = (dl.part.as_ref(), dl.journal.take()) else {
            return Err(XferError::conn("READY twice"));
        };
        let mut sink = BlockSink::journaled(id, size, journal);
        if direct {
            sink.set_direct(&part.file);
        }
        dl.writer = Some(BlockWriter::with_sink(sink, &part.file, ring)?);
        dl.mode = mode;
    }
    dl.size = size;
    Ok(())
}
