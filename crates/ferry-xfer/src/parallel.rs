//! Parallel streams (`ferry cp -p N`, protocol 1.2): one copy over N connections.
//!
//! Stream 0 opens a session; streams 1..N-1 join it (HELLO `session`/`stream`). Each
//! stream runs on its own thread and pulls work from one shared queue: whole files (small
//! ones, pipelined on the stream as a single-stream copy does) and chunks of large files.
//! A large file (more than one chunk) is opened once: its part file is shared by every
//! stream, each chunk lands in place by `pwrite`, its journal records the verified ranges,
//! and a hashing thread follows the verified prefix ([`crate::ordered_hash`]), so the
//! whole-file BLAKE3 is ready when the last chunk lands. Chunks are handed out one at a
//! time (at most [`CHUNKS_AHEAD`] outstanding per stream), so a slow stream does not hold
//! the others back.
//!
//! Downloads fetch a chunk with a ranged GET; the source's BLAKE3 comes from a SUM sent on
//! the stream that opened the file. Uploads OPEN the file (HAVE lists what a resumed part
//! holds), send each chunk with PUT_RANGE on whichever stream is free, and CLOSE it with
//! the source's BLAKE3, which a thread computes from the source file meanwhile.

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::client::{
    plan_download, plan_upload, remote_err, system_time, unexpected, Client, DlJob, LocalPart,
    Options, Progress, Stats,
};
use crate::error::{Kind, Result, XferError};
use crate::journal::{Found, Progress as Journaled, RangeSet};
use crate::link::{BlockWriter, Source, Span};
use crate::ordered_hash::OrderedHash;
use crate::proto::{self, Msg};
use crate::server::BlockSink;
use crate::url::Remote;

/// Default chunk of a large file handed to one stream (rounded up to the block size).
pub const DEFAULT_CHUNK: u64 = 64 << 20;
/// Chunks a download stream keeps requested ahead (one in flight, one queued).
pub(crate) const CHUNKS_AHEAD: usize = 2;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Splits the missing ranges of a file into chunks of `chunk` bytes, aligned to `chunk`
/// boundaries (so, with `chunk` a multiple of the block size, to blocks).
pub(crate) fn chunks(missing: &[(u64, u64)], chunk: u64) -> Vec<(u64, u64)> {
    let chunk = chunk.max(1);
    let mut out = Vec::new();
    for &(a, b) in missing {
        let mut pos = a;
        while pos < b {
            let end = b.min((pos / chunk + 1).saturating_mul(chunk));
            out.push((pos, end));
            pos = end;
        }
    }
    out
}

/// Progress from the stream threads, handed to the caller's reporter by the main thread.
#[derive(Default)]
struct Counter(AtomicU64);

impl Progress for Counter {
    fn add(&self, bytes: u64) {
        self.0.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// One chunk of a download the streams share.
#[derive(Clone)]
pub(crate) struct Chunk {
    /// The file.
    pub file: Arc<SharedDl>,
    /// First byte.
    pub lo: u64,
    /// End.
    pub hi: u64,
    /// Ask for the source's BLAKE3 (SUM) before this chunk's GET.
    pub sum: bool,
}

impl std::fmt::Debug for Chunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}..{})", self.file.path, self.lo, self.hi)
    }
}

impl Chunk {
    /// The writer for this chunk once READY said the file's `size` and `mode`.
    pub(crate) fn writer(&self, id: u32, size: u64, mode: u32, ring: usize) -> Result<BlockWriter> {
        self.file.writer(id, size, mode, self.lo, self.hi, ring)
    }

    /// Every block of the chunk was good: record it; `Some(size)` if that finished the file.
    pub(crate) fn done(&self, sink: BlockSink) -> Result<Option<u64>> {
        self.file.range_done(sink, self.lo, self.hi)
    }
}

/// A large file being downloaded by several streams into one part file.
pub(crate) struct SharedDl {
    path: String,
    dest: PathBuf,
    size: u64,
    mtime: i64,
    /// A handle on the part (`None`: the null sink).
    file: Option<File>,
    state: Mutex<DlState>,
}

struct DlState {
    part: Option<LocalPart>,
    journal: Option<Journaled>,
    done: RangeSet,
    hasher: Option<OrderedHash>,
    src_hash: Option<[u8; 32]>,
    mode: u32,
    finished: bool,
}

impl SharedDl {
    /// Opens (or, with `resume`, continues) the part of `job` and splits what is missing
    /// into chunks. Adds what a resume found in place to `resumed`.
    fn open(
        job: &DlJob,
        block: u32,
        resume: bool,
        chunk: u64,
        resumed: &AtomicU64,
    ) -> Result<(Arc<SharedDl>, Vec<Chunk>)> {
        let size = job.ident.size;
        let (part, journal, done) = match &job.dest {
            None => (None, None, RangeSet::new()),
            Some(dest) => {
                let (part, journal, found) = LocalPart::open(dest, job.ident, block, resume)?;
                let done = journal.ranges().clone();
                match found {
                    Found::Resumed => {
                        tracing::info!("{}: resuming, {} bytes in place", job.path, done.total());
                        resumed.fetch_add(done.total(), Ordering::Relaxed);
                    }
                    Found::Restarted => tracing::warn!(
                        "{}: the source changed since the interrupted copy (size or mtime differ); starting over",
                        job.path
                    ),
                    Found::Fresh => {}
                }
                (Some(part), Some(journal), done)
            }
        };
        let io = |e: std::io::Error| XferError::io(job.path.as_str(), &e);
        let (file, hasher) = match &part {
            Some(p) => (
                Some(p.file.try_clone().map_err(io)?),
                Some(OrderedHash::start(&p.file, size, done.prefix()).map_err(io)?),
            ),
            None => (None, None),
        };
        let zero_src = crate::mem::classify(&job.path).is_some();
        let shared = Arc::new(SharedDl {
            path: job.path.clone(),
            dest: job.dest.clone().unwrap_or_default(),
            size,
            mtime: job.ident.mtime,
            file,
            state: Mutex::new(DlState {
                part,
                journal,
                done: done.clone(),
                hasher,
                src_hash: zero_src.then(|| crate::mem::zero_hash(size)),
                mode: 0o644,
                finished: false,
            }),
        });
        let mut ranges = chunks(&done.missing(size), chunk);
        if ranges.is_empty() {
            // All there already: one empty GET still brings the mode and the hash.
            ranges.push((size, size));
        }
        let wants_sum = shared.file.is_some() && !zero_src;
        let list = ranges
            .into_iter()
            .enumerate()
            .map(|(i, (lo, hi))| Chunk {
                file: shared.clone(),
                lo,
                hi,
                sum: i == 0 && wants_sum,
            })
            .collect();
        Ok((shared, list))
    }

    fn writer(
        &self,
        id: u32,
        size: u64,
        mode: u32,
        lo: u64,
        hi: u64,
        ring: usize,
    ) -> Result<BlockWriter> {
        if size != self.size {
            return Err(XferError::new(
                Kind::Integrity,
                format!(
                    "{}: the file changed on the server while being copied ({} bytes, now {size}); try again",
                    self.path, self.size
                ),
            ));
        }
        lock(&self.state).mode = mode;
        let sink = BlockSink::range(id, size, lo, hi);
        match &self.file {
            Some(f) => BlockWriter::with_sink(sink, f, ring),
            None => Ok(BlockWriter::null_sink(sink)),
        }
    }

    fn range_done(&self, mut sink: BlockSink, lo: u64, hi: u64) -> Result<Option<u64>> {
        if let Some(e) = sink.io_error.take() {
            return Err(XferError::io(self.dest.display(), &e));
        }
        if !sink.got.contains(lo, hi) {
            return Err(XferError::conn(format!(
                "{}: the server ended range {lo}..{hi} before sending all of it",
                self.path
            )));
        }
        let mut st = lock(&self.state);
        st.done.insert(lo, hi);
        let prefix = st.done.prefix();
        if let (Some(j), Some(f)) = (st.journal.as_mut(), self.file.as_ref()) {
            j.good(lo, hi - lo);
            if j.due() {
                j.checkpoint(f)
                    .map_err(|e| XferError::io(self.dest.display(), &e))?;
            }
        }
        if let Some(h) = &st.hasher {
            h.advance(prefix);
        }
        self.try_finish(&mut st)
    }

    /// The source's BLAKE3 arrived (SUM); `Some(size)` if that finished the file.
    pub(crate) fn source_hash(&self, h: [u8; 32]) -> Result<Option<u64>> {
        let mut st = lock(&self.state);
        st.src_hash = Some(h);
        self.try_finish(&mut st)
    }

    /// Commits the file once every range is in and the source's hash is known.
    fn try_finish(&self, st: &mut DlState) -> Result<Option<u64>> {
        if st.finished || !st.done.contains(0, self.size) {
            return Ok(None);
        }
        let Some(part) = st.part.take() else {
            st.finished = true;
            return Ok(Some(self.size));
        };
        let Some(want) = st.src_hash else {
            st.part = Some(part);
            return Ok(None);
        };
        st.finished = true;
        st.journal = None;
        let got = match st.hasher.take().map(OrderedHash::finish) {
            Some(Ok(h)) => h,
            Some(Err(e)) => {
                part.discard();
                return Err(XferError::io(self.dest.display(), &e));
            }
            None => {
                part.discard();
                return Err(XferError::conn("internal: no hasher"));
            }
        };
        if got != want {
            part.discard();
            return Err(XferError::new(
                Kind::Integrity,
                format!(
                    "{}: the whole-file BLAKE3 does not match the server's; nothing was written. Was the file changing on the server? Try again",
                    self.path
                ),
            ));
        }
        part.commit(st.mode, system_time(self.mtime))?;
        Ok(Some(self.size))
    }

    /// The copy failed: keep the part and journal what is verified (`keep`, after a
    /// connection failure), or remove both.
    fn abandon(&self, keep: bool) {
        let mut st = lock(&self.state);
        st.hasher = None;
        let Some(part) = st.part.take() else { return };
        if !keep {
            part.discard();
            return;
        }
        if let Some(j) = st.journal.as_mut() {
            if j.checkpoint(&part.file).is_err() {
                tracing::warn!("{}: could not journal the partial file", self.path);
            }
        }
    }
}

/// The download work queue the streams share.
struct DlQueue {
    queue: Mutex<VecDeque<DlJob>>,
    opened: Mutex<Vec<Arc<SharedDl>>>,
    failed: Mutex<Option<XferError>>,
    abort: AtomicBool,
    resumed: AtomicU64,
    block: u32,
    chunk: u64,
    resume: bool,
}

impl DlQueue {
    /// The next job: a whole file, or a chunk (opening a large file queues its chunks
    /// first, so the streams work on it together).
    fn next(&self) -> Option<DlJob> {
        if self.abort.load(Ordering::SeqCst) {
            return None;
        }
        let mut q = lock(&self.queue);
        let job = q.pop_front()?;
        if job.chunk.is_some() || job.ident.size <= self.chunk {
            return Some(job);
        }
        match SharedDl::open(&job, self.block, self.resume, self.chunk, &self.resumed) {
            Ok((shared, chunks)) => {
                lock(&self.opened).push(shared);
                for ch in chunks.into_iter().rev() {
                    q.push_front(DlJob {
                        chunk: Some(ch),
                        ..job.clone()
                    });
                }
                q.pop_front()
            }
            Err(e) => {
                self.fail(e);
                None
            }
        }
    }

    fn fail(&self, e: XferError) {
        self.abort.store(true, Ordering::SeqCst);
        lock(&self.failed).get_or_insert(e);
    }
}

/// The chunk size for `opts` and block size `block`: a multiple of the block.
fn chunk_size(opts: &Options, block: u32) -> u64 {
    let b = u64::from(block.max(1));
    opts.chunk.max(b).div_ceil(b) * b
}

/// Opens streams 1..N-1 of `c0`'s session, or says why it keeps one stream.
fn join_streams(c0: &Client, r: &Remote, opts: &Options) -> Result<Vec<Client>> {
    if c0.minor < proto::MINOR_STREAMS {
        tracing::warn!(
            "{} speaks transfer protocol 1.{}, which has no parallel streams; copying over one stream",
            r.addr,
            c0.minor
        );
        return Ok(Vec::new());
    }
    let n = opts.streams.clamp(1, proto::MAX_STREAMS);
    let mut out = Vec::new();
    for i in 1..n {
        match join_stream(c0, r, opts, i) {
            Ok(c) => out.push(c),
            // A refusal is the server's answer: it would answer every stream the same.
            Err(e) if e.kind != Kind::Connection => return Err(e),
            Err(e) => {
                tracing::warn!("stream {i} could not connect ({e}); copying over {i} stream(s)");
                break;
            }
        }
    }
    Ok(out)
}

/// Connects stream `i` of `c0`'s session; a connection that fails (e.g. reset by a busy
/// listener) is tried twice more.
fn join_stream(c0: &Client, r: &Remote, opts: &Options, i: u16) -> Result<Client> {
    let mut tries = 0;
    loop {
        match Client::connect_as(&r.addr, opts, c0.session, i) {
            Err(e) if e.kind == Kind::Connection && tries < 2 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            res => return res,
        }
    }
}

/// Runs `work` on every client, each on its own thread, relaying their progress to
/// `progress`; returns the first error (connection failures last: they are usually the
/// consequence of another) after every thread ended.
fn run_streams(
    clients: &mut [Client],
    progress: &dyn Progress,
    work: &(dyn Fn(&mut Client, &dyn Progress) -> Result<()> + Sync),
) -> Result<()> {
    let counter = Counter::default();
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter_mut()
            .map(|c| {
                let counter = &counter;
                s.spawn(move || work(c, counter))
            })
            .collect();
        let mut shown = 0;
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(10));
            let now = counter.0.load(Ordering::Relaxed);
            progress.add(now - shown);
            shown = now;
        }
        progress.add(counter.0.load(Ordering::Relaxed) - shown);
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(XferError::conn("a stream thread failed")))
            })
            .collect()
    });
    let mut errs: Vec<XferError> = results.into_iter().filter_map(|r| r.err()).collect();
    errs.sort_by_key(|e| e.kind == Kind::Connection);
    match errs.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn finish_clients(clients: Vec<Client>, total: &mut Stats, ok: bool) {
    for c in clients {
        total.add(&c.stats);
        if ok {
            c.bye();
        }
    }
}

/// A download over `opts.streams` streams (see the module documentation).
pub(crate) fn download(
    r: &Remote,
    local: Option<&Path>,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
    total: &mut Stats,
) -> Result<()> {
    let mut c0 = Client::connect(&r.addr, opts)?;
    let planned = plan_download(&mut c0, r, local, recursive, opts, progress);
    let jobs = match planned {
        Ok(j) => j,
        Err(e) => {
            total.add(&c0.stats);
            return Err(e);
        }
    };
    let others = match join_streams(&c0, r, opts) {
        Ok(o) => o,
        Err(e) => {
            total.add(&c0.stats);
            return Err(e);
        }
    };
    let block = c0.block_size();
    let mut clients = vec![c0];
    clients.extend(others);
    let q = DlQueue {
        queue: Mutex::new(jobs.into()),
        opened: Mutex::new(Vec::new()),
        failed: Mutex::new(None),
        abort: AtomicBool::new(false),
        resumed: AtomicU64::new(0),
        block,
        chunk: chunk_size(opts, block),
        resume: opts.resume,
    };
    let res = run_streams(&mut clients, progress, &|c, counter| {
        c.set_resume(q.resume);
        let mut jobs = std::iter::from_fn(|| q.next());
        let r = c.download_from(&mut jobs, counter);
        if r.is_err() {
            q.abort.store(true, Ordering::SeqCst);
        }
        r
    });
    let res = match lock(&q.failed).take() {
        Some(e) => Err(e),
        None => res,
    };
    let resumed = q.resumed.load(Ordering::Relaxed);
    total.resumed_bytes += resumed;
    progress.add(resumed);
    if let Err(e) = &res {
        for f in lock(&q.opened).iter() {
            f.abandon(e.kind == Kind::Connection);
        }
    }
    finish_clients(clients, total, res.is_ok());
    res
}

/// A large file being uploaded by several streams (OPEN, PUT_RANGE…, CLOSE).
struct SharedUp {
    id: u32,
    path: String,
    size: u64,
    /// The source (`None`: zeros).
    file: Option<File>,
    left: Mutex<RangeSet>,
    /// The source's BLAKE3, computed meanwhile (`None`: none is sent).
    hash: Mutex<Option<HashJob>>,
}

enum HashJob {
    Ready(Option<[u8; 32]>),
    Thread(std::thread::JoinHandle<std::io::Result<[u8; 32]>>),
}

impl SharedUp {
    fn source(&self) -> Source<'_> {
        match &self.file {
            Some(f) => Source::File(f),
            None => Source::Zero,
        }
    }

    /// `[lo, hi)` was acknowledged; true if that was the last range.
    fn range_done(&self, lo: u64, hi: u64) -> bool {
        let mut left = lock(&self.left);
        left.insert(lo, hi);
        left.contains(0, self.size)
    }

    fn hash(&self) -> Result<Option<[u8; 32]>> {
        let job = lock(&self.hash).take();
        match job {
            Some(HashJob::Ready(h)) => Ok(h),
            Some(HashJob::Thread(t)) => match t.join() {
                Ok(Ok(h)) => Ok(Some(h)),
                Ok(Err(e)) => Err(XferError::io(self.path.as_str(), &e)),
                Err(_) => Err(XferError::conn("the hashing thread failed")),
            },
            None => Err(XferError::conn("internal: the file was closed twice")),
        }
    }
}

/// Upload work.
enum UpJob {
    /// A whole file, one PUT (small files, or every file of a 1.1 server).
    Whole(PathBuf, String),
    /// A large file to OPEN and split (`None`: zeros).
    Big(Option<PathBuf>, String, u64),
    /// One range of an OPENed file.
    Range(Arc<SharedUp>, u64, u64),
}

struct UpQueue {
    queue: Mutex<VecDeque<UpJob>>,
    abort: AtomicBool,
    next_id: AtomicU32,
    chunk: u64,
    resume: bool,
}

impl UpQueue {
    fn next(&self) -> Option<UpJob> {
        if self.abort.load(Ordering::SeqCst) {
            return None;
        }
        lock(&self.queue).pop_front()
    }
}

/// An upload of `local` (`None`: `zero_size` zero bytes) over `opts.streams` streams.
pub(crate) fn upload(
    local: Option<&Path>,
    zero_size: u64,
    r: &Remote,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
    total: &mut Stats,
) -> Result<()> {
    let md = match local {
        Some(l) => {
            let md = std::fs::metadata(l).map_err(|e| XferError::io(l.display(), &e))?;
            if md.is_dir() && !recursive {
                return Err(XferError::new(
                    Kind::Usage,
                    format!("{}: is a directory; use -r to copy trees", l.display()),
                ));
            }
            Some(md)
        }
        None => None,
    };
    let mut c0 = Client::connect(&r.addr, opts)?;
    let planned = match (local, &md) {
        (Some(l), Some(md)) => plan_upload(&mut c0, l, md, r, opts, progress)
            .map(|v| v.into_iter().map(|(s, p, n)| (Some(s), p, n)).collect()),
        _ => c0.target(&r.path, "zero").map(|t| {
            progress.total(zero_size);
            vec![(None, t, zero_size)]
        }),
    };
    let files: Vec<(Option<PathBuf>, String, u64)> = match planned {
        Ok(f) => f,
        Err(e) => {
            total.add(&c0.stats);
            return Err(e);
        }
    };
    let others = match join_streams(&c0, r, opts) {
        Ok(o) => o,
        Err(e) => {
            total.add(&c0.stats);
            return Err(e);
        }
    };
    let chunk = chunk_size(opts, c0.block_size());
    let parallel = !others.is_empty();
    let mut clients = vec![c0];
    clients.extend(others);
    let jobs = files
        .into_iter()
        .map(|(src, path, size)| match src {
            Some(src) if !parallel || size <= chunk => UpJob::Whole(src, path),
            src => UpJob::Big(src, path, size),
        })
        .collect::<VecDeque<_>>();
    let q = UpQueue {
        queue: Mutex::new(jobs),
        abort: AtomicBool::new(false),
        next_id: AtomicU32::new(1 << 31),
        chunk,
        resume: opts.resume,
    };
    let res = run_streams(&mut clients, progress, &|c, counter| {
        c.set_resume(q.resume);
        let r = upload_stream(c, &q, counter);
        if r.is_err() {
            q.abort.store(true, Ordering::SeqCst);
        }
        r
    });
    finish_clients(clients, total, res.is_ok());
    res
}

/// One stream's share of an upload.
fn upload_stream(c: &mut Client, q: &UpQueue, progress: &dyn Progress) -> Result<()> {
    while let Some(job) = q.next() {
        match job {
            UpJob::Whole(src, path) => c.upload_file(&src, &path, progress)?,
            UpJob::Big(None, path, size) if c.minor < proto::MINOR_STREAMS => {
                c.upload_zero(size, &path, progress)?
            }
            UpJob::Big(src, path, size) => {
                let Some(up) = open_upload(c, q, src.as_deref(), &path, size, progress)? else {
                    continue;
                };
                let ranges = chunks(&lock(&up.left).missing(size), q.chunk);
                if ranges.is_empty() {
                    close_upload(c, &up)?;
                    continue;
                }
                let mut queue = lock(&q.queue);
                for (lo, hi) in ranges.into_iter().rev() {
                    queue.push_front(UpJob::Range(up.clone(), lo, hi));
                }
            }
            UpJob::Range(up, lo, hi) => {
                put_range(c, &up, lo, hi, progress)?;
                if up.range_done(lo, hi) {
                    close_upload(c, &up)?;
                }
            }
        }
    }
    Ok(())
}

/// OPENs a parallel upload of `src` (`None`: zeros) to `path`: the shared state with what
/// the server holds already and the hash being computed, or `None` if the whole file went
/// with one PUT instead (a 1.1 server).
fn open_upload(
    c: &mut Client,
    q: &UpQueue,
    src: Option<&Path>,
    path: &str,
    size: u64,
    progress: &dyn Progress,
) -> Result<Option<Arc<SharedUp>>> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (file, mode, mtime) = match src {
        Some(p) => {
            let f = File::open(p).map_err(|e| XferError::io(p.display(), &e))?;
            let md = f.metadata().map_err(|e| XferError::io(p.display(), &e))?;
            if md.len() != size {
                return Err(XferError::new(
                    Kind::Integrity,
                    format!("{}: changed while being copied; try again", p.display()),
                ));
            }
            let ns = md
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(md.mtime_nsec());
            (Some(f), md.permissions().mode() & 0o7777, ns)
        }
        None => (None, 0o644, 0),
    };
    let id = q.next_id.fetch_add(1, Ordering::Relaxed);
    let resume = q.resume && file.is_some();
    c.link.send(&Msg::Open {
        flags: if resume { proto::OPEN_RESUME } else { 0 },
        file_id: id,
        mode,
        size,
        mtime,
        path: path.into(),
    })?;
    let have = match c.link.recv_msg()? {
        Msg::Have { file_id, ranges } if file_id == id => ranges,
        Msg::Error { code, message, .. } => return Err(remote_err(code, &message)),
        m => return Err(unexpected(&m)),
    };
    let mut left = RangeSet::new();
    for (a, b) in have {
        if a >= b || b > size {
            return Err(XferError::conn(format!(
                "the server holds a range {a}..{b} outside the file ({size} bytes)"
            )));
        }
        left.insert(a, b);
    }
    if !left.is_empty() {
        tracing::info!("{path}: resuming, {} bytes in place", left.total());
        c.stats.resumed_bytes += left.total();
        progress.add(left.total());
    }
    let to_null = crate::mem::classify(path) == Some(Ok(crate::mem::Virtual::Null));
    let hash = match (&file, to_null) {
        (_, true) => HashJob::Ready(None),
        (None, false) => HashJob::Ready(Some(crate::mem::zero_hash(size))),
        (Some(f), false) => {
            let f = f.try_clone().map_err(|e| XferError::io(path, &e))?;
            HashJob::Thread(
                std::thread::Builder::new()
                    .name("ferry-hash".into())
                    .spawn(move || crate::server::hash_file(&f, size))
                    .map_err(|e| XferError::io("start hashing thread", &e))?,
            )
        }
    };
    Ok(Some(Arc::new(SharedUp {
        id,
        path: path.to_string(),
        size,
        file,
        left: Mutex::new(left),
        hash: Mutex::new(Some(hash)),
    })))
}

/// Sends `[lo, hi)` of `up` on this stream (PUT_RANGE, BLOCKs, FILE_DONE; RESEND rounds).
fn put_range(
    c: &mut Client,
    up: &SharedUp,
    lo: u64,
    hi: u64,
    progress: &dyn Progress,
) -> Result<()> {
    let file_id = up.id;
    c.link.send(&Msg::PutRange {
        file_id,
        offset: lo,
        length: hi - lo,
    })?;
    match c.link.recv_msg()? {
        Msg::Ready { offset, .. } if offset == lo => {}
        Msg::Error { code, message, .. } => return Err(remote_err(code, &message)),
        m => return Err(unexpected(&m)),
    }
    c.stats.wire_bytes += hi - lo;
    let span = Span {
        file_id,
        offset: lo,
        len: hi - lo,
    };
    let add = |n| progress.add(n);
    if let Err(e) = c.tx.send_range(&c.link, up.source(), span, None, &add) {
        let _ = c.tx.flush();
        let _ = c.link.send(&Msg::Error {
            code: e.code(),
            file_id,
            message: e.msg.clone(),
        });
        return Err(e);
    }
    loop {
        c.link.send(&Msg::FileDone {
            file_id,
            length: hi - lo,
            blake3: None,
        })?;
        match c.link.recv_msg()? {
            Msg::Ok { .. } => return Ok(()),
            Msg::Resend { ranges, .. } => {
                c.stats.blocks_resent += ranges.len() as u64;
                for (off, len) in ranges {
                    let end = off.saturating_add(u64::from(len));
                    if off < lo || end > hi {
                        return Err(XferError::conn(
                            "the server asked for a range outside the one sent",
                        ));
                    }
                    c.stats.wire_bytes += u64::from(len);
                    let span = Span {
                        file_id,
                        offset: off,
                        len: u64::from(len),
                    };
                    c.tx.send_range(&c.link, up.source(), span, None, &|_| {})?;
                }
            }
            Msg::Error { code, message, .. } => return Err(remote_err(code, &message)),
            m => return Err(unexpected(&m)),
        }
    }
}

/// Every range of `up` arrived: CLOSE it with the source's hash.
fn close_upload(c: &mut Client, up: &SharedUp) -> Result<()> {
    let blake3 = up.hash()?;
    c.link.send(&Msg::Close {
        file_id: up.id,
        length: up.size,
        blake3,
    })?;
    match c.link.recv_msg()? {
        Msg::Ok { .. } => {
            c.stats.files += 1;
            c.stats.bytes += up.size;
            Ok(())
        }
        Msg::Error { code, message, .. } => Err(remote_err(code, &message)),
        m => Err(unexpected(&m)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_align_and_cover() {
        assert_eq!(chunks(&[(0, 25)], 10), vec![(0, 10), (10, 20), (20, 25)]);
        // A hole that starts mid-chunk realigns at the next boundary.
        assert_eq!(
            chunks(&[(5, 12), (30, 31)], 10),
            vec![(5, 10), (10, 12), (30, 31)]
        );
        assert!(chunks(&[], 10).is_empty());
    }
}
