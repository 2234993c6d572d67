//! Downloads: pipelined GETs into part files, CRC checks and re-fetches, resume, commits.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{unexpected, Client, Progress};
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::conv::download::{Action, Downloader, Job, Landing, Settings};
use crate::error::{Kind, Result, XferError};
use crate::link::{received, BlockWriter};
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
    last: std::sync::Mutex<Option<(String, Arc<OwnedFd>, DirFacts)>>,
    /// The facts of every directory this copy opened, as they were at its first opening:
    /// streams placing files in different directories take turns with `last`, and a
    /// directory opened again after some of the copy's files landed is not empty any more,
    /// though it holds none of the names still to come.
    seen: std::sync::Mutex<HashMap<String, DirFacts>>,
}

/// What is decided once per directory when it is opened, instead of once per file in it.
#[derive(Debug, Clone, Copy, Default)]
struct DirFacts {
    /// The directory was empty when opened (one `getdents`): no file of this copy's names
    /// was there then, so there is nothing to stat before a file is placed in it (a file
    /// another process puts there meanwhile is the same race as between a stat and the
    /// rename). The files a copy places go under names it places once, and a directory
    /// opened again after they landed is not empty any more.
    fresh: bool,
    /// It is on a memory filesystem (tmpfs, ramfs): an fsync there makes nothing more
    /// durable (nothing there survives a reboot) and is skipped.
    memory: bool,
}

impl DirFacts {
    fn of(fd: &OwnedFd) -> DirFacts {
        DirFacts {
            fresh: is_empty_dir(fd),
            memory: ferry_service::commit::fsync_is_free(fd),
        }
    }
}

/// Whether directory `fd` holds no entry but `.` and `..` (an error answers false).
fn is_empty_dir(fd: &OwnedFd) -> bool {
    let Ok(dir) = rustix::fs::Dir::read_from(fd) else {
        return false;
    };
    let mut entries = dir;
    entries.all(|e| e.is_ok_and(|e| matches!(e.file_name().to_bytes(), b"." | b"..")))
}

impl DestBase {
    /// `dir` (relative, "" for the base itself), opened beneath the base, and its facts.
    fn open_dir(&self, dir: &str) -> std::result::Result<(Arc<OwnedFd>, DirFacts), Errno> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((name, fd, facts)) = &*last {
            if name == dir {
                return Ok((fd.clone(), *facts));
            }
        }
        let fd = Arc::new(ferry_service::beneath::open_dir_beneath(&self.fd, dir)?);
        let facts = *self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(dir.to_string())
            .or_insert_with(|| DirFacts::of(&fd));
        *last = Some((dir.to_string(), fd.clone(), facts));
        Ok((fd, facts))
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
            seen: std::sync::Mutex::new(HashMap::new()),
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

    /// The directory holding the last component, opened beneath the base, that component
    /// and the directory's facts.
    fn parent(&self) -> Result<(Arc<OwnedFd>, &str, DirFacts)> {
        let (dir, name) = ferry_service::beneath::split_last(&self.rel);
        let (fd, facts) = self
            .base
            .open_dir(dir)
            .map_err(|e| beneath_err(&self.path(), e))?;
        Ok((fd, name, facts))
    }

    /// Creates this directory (an existing one is fine; a symlink or file in its place
    /// is refused, not followed).
    pub(crate) fn mkdir(&self) -> Result<()> {
        let (parent, name, _) = self.parent()?;
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

    /// The size and mtime (seconds) of the regular file here, if one is (a symlink does
    /// not count), for [`Skip`](super::Skip)'s checks.
    pub(crate) fn existing(&self) -> Option<(u64, i64)> {
        let (dir, name, facts) = self.parent().ok()?;
        if facts.fresh {
            return None;
        }
        let st = rustix::fs::statat(&*dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).ok()?;
        (rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile)
            .then_some((st.st_size as u64, st.st_mtime))
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
    /// On a memory filesystem: the commit needs no fsync (see [`DirFacts::memory`]).
    memory: bool,
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
        let (dir, name, facts) = dest.parent()?;
        let shown = dest.path();
        if !facts.fresh {
            check_local_target(&dir, name, &shown, force)?;
        }
        let tmp = ferry_service::roots::part_name(name);
        let part = |file, journal| LocalPart {
            dest: shown.clone(),
            dir: dir.clone(),
            name: name.to_string(),
            tmp: tmp.clone(),
            file,
            journal,
            memory: facts.memory,
        };
        let io =
            |what: &str, e: std::io::Error| XferError::io(shown.with_file_name(what).display(), &e);
        if ident.size <= u64::from(block) {
            // One block: nothing to checkpoint before the file is whole (so nothing worth
            // resuming either), and no journal file unless one turns out to be needed. A journal only means something with its part:
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

    /// Sets mode and mtime, fsyncs (not on a memory filesystem), drops the journal and
    /// renames into place; returns the
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
        if !self.memory {
            self.file.sync_all().map_err(io)?;
        }
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

/// What the runtime holds of one file of a download: where it lands and its writer (the
/// conversation itself is the [`Downloader`]'s).
struct Local {
    path: String,
    /// The destination, for messages.
    dest: PathBuf,
    /// The source's mtime (seconds), set on the committed file.
    mtime: i64,
    part: Option<LocalPart>,
    /// The journal's view until READY hands it to the writer.
    journal: Option<Journaled>,
    writer: Option<BlockWriter>,
    chunk: Option<crate::parallel::Chunk>,
}

impl Local {
    /// The writer `file`'s data goes through (opened at its READY).
    fn writer(&mut self) -> Result<&mut BlockWriter> {
        self.writer
            .as_mut()
            .ok_or_else(|| XferError::conn("FILE_DONE before READY"))
    }
}

/// The files in flight, by transfer id.
type Locals = HashMap<u32, Local>;

fn local(locals: &mut Locals, file: u32) -> Result<&mut Local> {
    locals
        .get_mut(&file)
        .ok_or_else(|| XferError::conn(format!("no transfer {file} in progress")))
}

impl Client {
    /// Downloads remote files to local paths, pipelined. Without
    /// [`Options::resume`](super::Options::resume) (as given to [`Client::set_resume`]) each
    /// file starts from zero; with it, a journaled part of the same source continues where
    /// its verified prefix ends. When the connection fails the parts stay, journaled, for a
    /// later resume; any other failure removes them.
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
        let mut conv = Downloader::new(Settings {
            minor: self.minor,
            window: self.get_window,
            refill: super::tune::refill_for(self.get_window, self.rtt),
            frame: super::tune::gets_frame(self.rtt, self.link.frame_room()),
            chunks_ahead: crate::parallel::CHUNKS_AHEAD,
            retries: crate::BLOCK_RETRIES,
        });
        let mut locals = Locals::new();
        let mut commits = CommitPool::new();
        let res = self.download_loop(&mut conv, jobs, &mut locals, &mut commits, progress);
        self.stats.blocks_resent += conv.resent();
        // Every file handed to the pool is complete and verified: let its commit finish.
        let committed = commits.finish();
        if let Err(e) = &res {
            leave(locals, e.kind == Kind::Connection);
        }
        res.and(committed)
    }

    fn download_loop(
        &mut self,
        conv: &mut Downloader,
        jobs: &mut dyn Iterator<Item = DlJob>,
        locals: &mut Locals,
        commits: &mut CommitPool,
        progress: &dyn Progress,
    ) -> Result<()> {
        loop {
            self.refill(conv, jobs, locals, progress)?;
            self.execute(conv, locals, commits, progress)?;
            if conv.is_idle() {
                return Ok(());
            }
            ferry_fabric::timeline::mark("cp.wait", conv.in_flight() as u64);
            let msgs = self.receive(conv, locals, progress)?;
            let last = msgs.len();
            ferry_fabric::timeline::mark("cp.msg", last as u64);
            for (i, msg) in msgs.into_iter().enumerate() {
                conv.on_msg(msg)?;
                self.execute(conv, locals, commits, progress)?;
                // A PACK answers many GETs: ask for the next ones as soon as half the
                // window is back, not after the whole pack is written.
                if i + 1 < last {
                    self.refill(conv, jobs, locals, progress)?;
                    self.execute(conv, locals, commits, progress)?;
                }
            }
        }
    }

    /// Receives one message and writes the data it carries in place in the receive buffer
    /// (BLOCKs, FILE frames, PACKs of them): the frames for the conversation, a FILE frame
    /// as its FILE_DONE (its READY is taken at once, the writer being needed for the payload).
    /// A BLOCK goes to its writer in that buffer, held until written (no copy, also for a
    /// writer thread).
    fn receive(
        &mut self,
        conv: &mut Downloader,
        locals: &mut Locals,
        progress: &dyn Progress,
    ) -> Result<Vec<Msg>> {
        let wire = &mut self.stats.wire_bytes;
        let (direct, ring) = (self.direct, self.ring);
        let check = self.link.recv_check();
        let packs = &mut self.packs;
        let mut held = self.link.recv_held()?;
        let mut block = None;
        let msgs = held.with_bytes_mut(|bytes| -> Result<Vec<Msg>> {
            ferry_fabric::timeline::mark("cp.got", bytes.len() as u64);
            let (msg, payload) = proto::decode(bytes)
                .map_err(|e| XferError::conn(format!("the server sent a bad frame: {e}")))?;
            let at = bytes.len() - payload.len();
            let mut take_file = |msg, payload: &[u8]| -> Result<Msg> {
                let (done, len) = take_file(conv, locals, msg, payload, (direct, ring))?;
                progress.add(len);
                *wire += len;
                Ok(done)
            };
            match msg {
                Msg::Pack {
                    count, tag, sealed, ..
                } => {
                    let frames = packs.open((count, tag, sealed), &mut bytes[at..])?;
                    proto::decode_pack(count, frames)
                        .map_err(|e| XferError::conn(format!("the server sent a bad pack: {e}")))?
                        .into_iter()
                        .map(|(m, p)| take_file(m, p))
                        .collect()
                }
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
                let writer = locals
                    .get_mut(&h.file_id)
                    .and_then(|l| l.writer.as_mut())
                    .ok_or_else(|| XferError::conn("BLOCK of no transfer in progress"))?;
                writer.push_held(received(&h, check), held, at)?;
                progress.add(u64::from(h.len));
                self.stats.wire_bytes += u64::from(h.len);
            }
            // The peer gets the buffer back before the answers are worked through.
            None => self.link.give_back(held)?,
        }
        Ok(msgs)
    }

    /// Starts downloads of the next jobs while the conversation has room for them. Each
    /// GETS frame leaves as soon as it is full, before the part files of the next ones
    /// are opened: a window of 1,000 files on a loaded disk took 200 ms to open, with
    /// nothing asked for yet.
    fn refill(
        &mut self,
        conv: &mut Downloader,
        jobs: &mut dyn Iterator<Item = DlJob>,
        locals: &mut Locals,
        progress: &dyn Progress,
    ) -> Result<()> {
        if conv.refill_open() {
            while conv.has_room() {
                let Some(job) = jobs.next() else {
                    break;
                };
                let (local, job) = self.prepare(job, progress)?;
                locals.insert(job.file, local);
                conv.start(job);
                if conv.has_output() {
                    self.send_requests(conv)?;
                }
            }
        }
        conv.flush();
        Ok(())
    }

    /// Sends the requests (GETS, GET, SUM) the conversation has queued, while only
    /// requests are queued (any other action waits for [`Client::execute`]).
    fn send_requests(&mut self, conv: &mut Downloader) -> Result<()> {
        while let Some(msg) = conv.next_request() {
            if let Msg::Gets { files } = &msg {
                ferry_fabric::timeline::mark("cp.gets", files.len() as u64);
            }
            self.link.send(&msg)?;
        }
        Ok(())
    }

    /// Opens (or resumes) the part file of `job`, or takes the chunk it is: what the runtime
    /// keeps of it, and the job for the conversation.
    fn prepare(&mut self, mut job: DlJob, progress: &dyn Progress) -> Result<(Local, Job)> {
        let file = self.id();
        let mut local = Local {
            path: job.path.clone(),
            dest: job.dest.as_ref().map(|d| d.path()).unwrap_or_default(),
            mtime: job.ident.mtime,
            part: None,
            journal: None,
            writer: None,
            chunk: None,
        };
        let landing = if let Some(ch) = job.chunk.take() {
            // A range of a file the streams share: its part is open already.
            let landing = Landing::Chunk {
                lo: ch.lo,
                hi: ch.hi,
                sum: ch.sum,
            };
            local.chunk = Some(ch);
            landing
        } else if let Some(dest) = &job.dest {
            let how = (self.resume, self.force);
            let (part, journal, found) = LocalPart::open(dest, job.ident, self.block, how)?;
            let held = journal.prefix();
            match found {
                Found::Resumed => {
                    tracing::info!("{}: resuming at byte {held}", job.path);
                    self.stats.resumed_bytes += held;
                    progress.already_there(held);
                }
                Found::Restarted => tracing::warn!(
                    "{}: the source changed since the interrupted copy (size or mtime differ); starting over",
                    job.path
                ),
                Found::Fresh => {}
            }
            local.part = Some(part);
            local.journal = Some(journal);
            Landing::Part {
                size: job.ident.size,
                held,
            }
        } else {
            // No destination: the null sink, nothing to open or resume.
            Landing::Null
        };
        let job = Job {
            file,
            path: job.path,
            landing,
        };
        Ok((local, job))
    }

    /// Carries out the conversation's actions until it has none.
    fn execute(
        &mut self,
        conv: &mut Downloader,
        locals: &mut Locals,
        commits: &mut CommitPool,
        progress: &dyn Progress,
    ) -> Result<()> {
        while let Some(action) = conv.poll() {
            match action {
                Action::Send(msg) => {
                    if let Msg::Gets { files } = &msg {
                        ferry_fabric::timeline::mark("cp.gets", files.len() as u64);
                    }
                    self.link.send(&msg)?;
                }
                Action::Open { file, size, mode } => {
                    let l = local(locals, file)?;
                    l.writer = Some(open_writer(l, file, size, mode, (self.direct, self.ring))?);
                }
                Action::Check { file } => {
                    let bad = local(locals, file)?.writer()?.sync()?;
                    conv.checked(file, bad)?;
                }
                Action::Hash { file } => {
                    let got = hash_part(local(locals, file)?)?;
                    conv.hashed(file, got)?;
                }
                Action::Commit { file, size, mode } => {
                    self.commit(locals.remove(&file), mode, commits)?;
                    self.count(Some(size), progress);
                }
                Action::Finish { file, size } => {
                    if let Some(l) = locals.remove(&file) {
                        let done = finish(l, size)?;
                        self.count(done, progress);
                    }
                }
                Action::SourceHash { file, hash } => {
                    let chunk = locals.get(&file).and_then(|l| l.chunk.as_ref());
                    let done = chunk.map(|ch| ch.file.source_hash(hash)).transpose()?;
                    self.count(done.flatten(), progress);
                }
            }
        }
        Ok(())
    }

    /// Commits the verified part of `l` (mode, mtime, fsync, rename) on this thread or the
    /// pool's.
    fn commit(&self, l: Option<Local>, mode: u32, commits: &mut CommitPool) -> Result<()> {
        let Some((part, mtime)) = l.and_then(|l| Some((l.part?, l.mtime))) else {
            return Err(XferError::conn("FILE_DONE before READY"));
        };
        let mtime = system_time(mtime);
        if part.memory {
            // Nothing to wait for: a thread hand-off would cost more (tmpfs).
            commits.run_here(move || part.commit(mode, mtime).map(Some))
        } else {
            commits.submit(move || part.commit(mode, mtime).map(Some))
        }
    }

    /// Counts a file of `size` bytes copied (`None`: none completed).
    fn count(&mut self, size: Option<u64>, progress: &dyn Progress) {
        if let Some(size) = size {
            self.stats.files += 1;
            self.stats.bytes += size;
            progress.file_done();
        }
    }
}

/// A complete null-sink file (`size` bytes) or chunk: the size of a file it completed.
fn finish(mut l: Local, size: u64) -> Result<Option<u64>> {
    let Some(ch) = l.chunk.take() else {
        // The null sink: nothing to commit.
        return Ok(Some(size));
    };
    // A chunk: the parallel copy counts its file once all chunks are in.
    let w = l
        .writer
        .take()
        .ok_or_else(|| XferError::conn("FILE_DONE before READY"))?;
    ch.done(w.finish()?)
}

/// After a failed download: with `keep` (a connection failure) each part is journaled for a
/// resume, else removed.
fn leave(locals: Locals, keep: bool) {
    for (_, l) in locals {
        let Some(part) = l.part else {
            // A chunk of a shared file: its writer reports the blocks it still writes to
            // the file's journal, which the parallel copy checkpoints.
            if let Some(w) = l.writer.filter(|_| keep) {
                let _ = w.finish();
            }
            continue;
        };
        if !keep {
            part.discard();
            continue;
        }
        if let Some(w) = l.writer {
            let saved = w.finish().map(|mut s| s.checkpoint(&part.file));
            if !matches!(saved, Ok(Ok(()))) {
                tracing::warn!("{}: could not journal the partial file", l.path);
            }
        }
    }
}

/// Stops the writer of a complete part and hashes the whole part (a write error it kept
/// fails the file here).
fn hash_part(l: &mut Local) -> Result<[u8; 32]> {
    let (Some(part), Some(writer)) = (l.part.as_ref(), l.writer.take()) else {
        return Err(XferError::conn("FILE_DONE before READY"));
    };
    let mut sink = writer.finish()?;
    if let Some(e) = sink.io_error.take() {
        return Err(XferError::io(l.dest.display(), &e));
    }
    sink.hash(&part.file)
        .map_err(|e| XferError::io(l.dest.display(), &e))
}

/// A whole small file (a FILE frame, alone or in a PACK): its READY, its one block (checked
/// and written in place) and its FILE_DONE, which it returns for the conversation to take
/// as such, with the payload's length.
fn take_file(
    conv: &mut Downloader,
    locals: &mut Locals,
    msg: Msg,
    payload: &[u8],
    how: (bool, usize),
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
    let l = locals
        .get_mut(&file_id)
        .ok_or_else(|| XferError::conn("FILE of no transfer in progress"))?;
    if let Some((size, mode)) = conv.ready(file_id, u64::from(len), mode)? {
        l.writer = Some(open_writer(l, file_id, size, mode, how)?);
    }
    let h = proto::BlockHeader {
        file_id,
        stream: 0,
        offset: 0,
        len,
        crc32c,
        spans: false,
    };
    l.writer()?.push_file(&h, payload, &blake3)?;
    let done = Msg::FileDone {
        file_id,
        length: u64::from(len),
        blake3: Some(blake3),
    };
    Ok((done, u64::from(len)))
}

/// The writer of `l` (transfer `id`, `size` bytes, permission bits `mode`), opened at its
/// READY; `(direct, ring)`: O_DIRECT writes (asked for; else where they help, see
/// [`BlockSink::choose_direct`]), blocks queued to a writer thread at most.
fn open_writer(
    l: &mut Local,
    id: u32,
    size: u64,
    mode: u32,
    (direct, ring): (bool, usize),
) -> Result<BlockWriter> {
    if let Some(ch) = &l.chunk {
        return ch.writer(id, size, mode, (direct, ring));
    }
    let (Some(part), journal) = (l.part.as_ref(), l.journal.take()) else {
        // No part: the null sink.
        return Ok(BlockWriter::null(id, size));
    };
    let journal = journal.ok_or_else(|| XferError::conn("READY twice"))?;
    let mut sink = BlockSink::journaled(id, size, journal);
    if sink.choose_direct(&part.file, direct) {
        tracing::debug!("{}: writing with direct I/O", l.dest.display());
    }
    sink.hash_held_behind(&part.file);
    BlockWriter::with_sink(sink, &part.file, ring)
}
