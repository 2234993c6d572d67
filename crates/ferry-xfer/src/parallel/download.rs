//! Parallel downloads: ranged GETs of shared chunks written in place into one part file.

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{chunk_size, chunks, finish_clients, grower, join_streams, lock, run_streams, Early};
use crate::client::{
    plan_download, system_time, tune, Client, DlJob, LocalPart, Options, Progress, Stats,
};
use crate::error::{Kind, Result, XferError};
use crate::link::BlockWriter;
use crate::url::Remote;
use ferry_service::journal::RangeSet;
use ferry_service::landing::{Found, SharedProgress};
use ferry_service::sink::BlockSink;
use ferry_service::tree::{BlockTree, SharedTree};

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
    /// The writer for this chunk once READY said the file's `size` and `mode`; `(direct,
    /// ring)` as for a whole file (direct I/O asked for, else where it helps).
    pub(crate) fn writer(
        &self,
        id: u32,
        size: u64,
        mode: u32,
        how: (bool, usize),
    ) -> Result<BlockWriter> {
        self.file.writer(id, size, mode, (self.lo, self.hi), how)
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
    /// The part's journal, fed by every stream's sink block by block (`None`: the null sink).
    journal: Option<Arc<SharedProgress>>,
    /// The part's hash tree, fed by every stream's sink block by block (`None`: the null
    /// sink, or a block size no tree aligns to: the part is then hashed after the last
    /// chunk).
    tree: Option<SharedTree>,
    state: Mutex<DlState>,
}

struct DlState {
    part: Option<LocalPart>,
    /// The chunks whose every block arrived.
    done: RangeSet,
    src_hash: Option<[u8; 32]>,
    /// The source is the server's `mem/zero/SIZE`: its hash is that of `size` zeros.
    zero_src: bool,
    mode: u32,
    finished: bool,
}

impl SharedDl {
    /// Opens (or, with `resume`, continues) the part of `job` and splits what is missing
    /// into chunks. Adds what a resume found in place to `resumed`.
    fn open(
        job: &DlJob,
        block: u32,
        (resume, force): (bool, bool),
        chunk: u64,
        resumed: &AtomicU64,
    ) -> Result<(Arc<SharedDl>, Vec<Chunk>)> {
        let size = job.ident.size;
        let (part, journal, done) = match &job.dest {
            None => (None, None, RangeSet::new()),
            Some(dest) => {
                let (part, journal, found) =
                    LocalPart::open(dest, job.ident, block, (resume, force))?;
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
        let (file, journal) = match (&part, journal) {
            (Some(p), Some(j)) => (
                Some(p.file.try_clone().map_err(io)?),
                Some(Arc::new(SharedProgress::new(&p.file, j).map_err(io)?)),
            ),
            _ => (None, None),
        };
        // Blocks are hashed as they land; what a resume found in place is hashed on a
        // thread meanwhile.
        let tree = file
            .as_ref()
            .and_then(|_| BlockTree::new(size, u64::from(block)))
            .map(SharedTree::new);
        if let (Some(t), Some(f)) = (&tree, &file) {
            t.fill_behind(f, done.iter().collect());
        }
        let zero_src = crate::mem::classify(&job.path).is_some();
        let shared = Arc::new(SharedDl {
            path: job.path.clone(),
            dest: job.dest.as_ref().map(|d| d.path()).unwrap_or_default(),
            size,
            mtime: job.ident.mtime,
            file,
            journal,
            tree,
            state: Mutex::new(DlState {
                part,
                done: done.clone(),
                // A server's zero source sends no hash: it is worked out when a part
                // needs checking ([`SharedDl::try_finish`]), not here, before the first
                // GET (2 GiB of zeros took 0.7 s on a loaded host: the copy's whole
                // set-up at 50 ms), and never for `null:`, which keeps nothing to check.
                src_hash: None,
                zero_src,
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
        (lo, hi): (u64, u64),
        (direct, ring): (bool, usize),
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
        let mut sink = BlockSink::range(id, size, lo, hi);
        sink.report_to(self.journal.clone());
        sink.hash_into(self.tree.clone());
        match &self.file {
            Some(f) => {
                sink.choose_direct(f, direct);
                BlockWriter::with_sink(sink, f, ring)
            }
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
        // Its blocks are in the journal already (the sink reported each as it wrote it).
        let mut st = lock(&self.state);
        st.done.insert(lo, hi);
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
        if st.src_hash.is_none() && st.zero_src {
            st.src_hash = Some(crate::mem::zero_hash(self.size));
        }
        let Some(want) = st.src_hash else {
            st.part = Some(part);
            return Ok(None);
        };
        st.finished = true;
        if let Some(j) = &self.journal {
            j.close();
        }
        let hashed = match &self.tree {
            Some(t) => t.root_filling_from(&part.file),
            None => ferry_service::hash::hash_file(&part.file, self.size),
        };
        let got = match hashed {
            Ok(h) => h,
            Err(e) => {
                part.discard();
                return Err(XferError::io(self.dest.display(), &e));
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
        let dir = part.commit(st.mode, system_time(self.mtime))?;
        ferry_service::commit::sync_dir(&dir)?;
        Ok(Some(self.size))
    }

    /// The copy failed: keep the part and journal what is verified (`keep`, after a
    /// connection failure), or remove both.
    fn abandon(&self, keep: bool) {
        let mut st = lock(&self.state);
        let Some(part) = st.part.take() else { return };
        let journal = self.journal.as_deref();
        if !keep {
            if let Some(j) = journal {
                j.close();
            }
            part.discard();
            return;
        }
        if journal.is_some_and(|j| j.finish().is_err()) {
            tracing::warn!("{}: could not journal the partial file", self.path);
        }
    }
}

/// The download work queue the streams share.
struct DlQueue {
    queue: Mutex<VecDeque<DlJob>>,
    /// Jobs handed to streams so far.
    taken: AtomicUsize,
    opened: Mutex<Vec<Arc<SharedDl>>>,
    failed: Mutex<Option<XferError>>,
    abort: AtomicBool,
    resumed: AtomicU64,
    block: u32,
    chunk: u64,
    resume: bool,
    /// Replace read-only local files ([`Options::force`]).
    force: bool,
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
            self.taken.fetch_add(1, Ordering::Relaxed);
            return Some(job);
        }
        let how = (self.resume, self.force);
        match SharedDl::open(&job, self.block, how, self.chunk, &self.resumed) {
            Ok((shared, chunks)) => {
                lock(&self.opened).push(shared);
                for ch in chunks.into_iter().rev() {
                    q.push_front(DlJob {
                        chunk: Some(ch),
                        ..job.clone()
                    });
                }
                self.taken.fetch_add(1, Ordering::Relaxed);
                q.pop_front()
            }
            Err(e) => {
                self.fail(e);
                None
            }
        }
    }

    /// [`DlQueue::next`] for a stream that took `mine` jobs so far, while streams of
    /// `early` are still connecting: none past its share ([`tune::fair_share`]).
    fn next_share(&self, early: &Early, mine: &mut usize) -> Option<DlJob> {
        let waiting = early.waiting();
        if waiting > 0 {
            let jobs = self.taken.load(Ordering::Relaxed) + lock(&self.queue).len();
            if *mine >= tune::fair_share(jobs, early.working(), waiting) {
                return None;
            }
        }
        let job = self.next()?;
        *mine += 1;
        Some(job)
    }

    fn is_empty(&self) -> bool {
        lock(&self.queue).is_empty()
    }

    fn fail(&self, e: XferError) {
        self.abort.store(true, Ordering::SeqCst);
        lock(&self.failed).get_or_insert(e);
    }
}

/// A download over `opts.streams` streams (see the module documentation), the first
/// `first` if connected already.
pub(crate) fn download(
    first: &mut Option<Client>,
    r: &Remote,
    local: Option<&Path>,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
    total: &mut Stats,
) -> Result<()> {
    let mut c0 = match first.take() {
        Some(c) => c,
        None => Client::connect(&r.addr, opts)?,
    };
    // Streams opened at once connect while this one lists and plans: on a long path none
    // by default (`tune::UPFRONT_DOWNLOAD`; `FERRY_UPFRONT_STREAMS` asks for them), on a
    // short one a stream per core for a tree (`tune::short_tree_streams`).
    let want = tune::Upfront {
        long: tune::UPFRONT_DOWNLOAD,
        short: if recursive {
            tune::short_tree_streams_here()
        } else {
            1
        },
    };
    let early = Early::start(&c0, r, opts, want);
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
    let mean = crate::client::tune::mean_size(jobs.iter().map(|j| j.ident.size).sum(), jobs.len());
    let grow = grower(&c0, r, opts);
    let mut clients = vec![c0];
    clients.extend(others);
    let q = DlQueue {
        queue: Mutex::new(jobs.into()),
        taken: AtomicUsize::new(0),
        opened: Mutex::new(Vec::new()),
        failed: Mutex::new(None),
        abort: AtomicBool::new(false),
        resumed: AtomicU64::new(0),
        block,
        chunk: chunk_size(opts, block),
        resume: opts.resume,
        force: opts.force,
    };
    let left = || !q.is_empty();
    let (clients, res) = run_streams(clients, grow, &early, (progress, &left), &|c, counter| {
        c.set_resume(q.resume);
        c.fit_window(mean);
        // While streams are still connecting, a stream's window of GETs takes no more than
        // its share of the jobs; one that finished its share before they are ready takes
        // the rest rather than wait for them.
        let mut mine = 0;
        let mut r = c.download_from(
            &mut std::iter::from_fn(|| q.next_share(&early, &mut mine)),
            counter,
        );
        if r.is_ok() && !q.is_empty() {
            r = c.download_from(&mut std::iter::from_fn(|| q.next()), counter);
        }
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
    progress.already_there(resumed);
    if let Err(e) = &res {
        for f in lock(&q.opened).iter() {
            f.abandon(e.kind == Kind::Connection);
        }
    }
    finish_clients(clients, total, res.is_ok());
    res
}
