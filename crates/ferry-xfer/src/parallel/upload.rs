//! Parallel uploads: OPEN, PUT_RANGE on whichever stream is free, CLOSE.

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::{
    chunk_size, chunks, finish_clients, grower, join_streams, lock, run_streams, Early, Joiner,
};
use crate::client::tune::{self, Growth};
use crate::client::{
    open_source, plan_upload, remote_err, unexpected, Client, Options, Progress, Stats,
};
use crate::conv::upload::{held_ranges, PutFiles, Uploader};
use crate::error::{Kind, Result, XferError};
use crate::link::{FileMeta, Source};
use crate::proto::{self, Msg};
use crate::url::Remote;
use ferry_service::journal::RangeSet;
use ferry_service::stamp::Stamp;
use ferry_service::tree::{BlockTree, SharedTree};

/// A large file being uploaded by several streams (OPEN, PUT_RANGE…, CLOSE).
struct SharedUp {
    id: u32,
    path: String,
    size: u64,
    /// The source (`None`: zeros) and its stamp when it was opened.
    file: Option<(File, Stamp)>,
    left: Mutex<RangeSet>,
    /// The source's BLAKE3, once CLOSE takes it.
    hash: Mutex<Option<HashJob>>,
    /// The source's hash tree, fed with every block the streams send (`None`: nothing to
    /// hash, or a block size no tree aligns to: the source is then read at CLOSE).
    tree: Option<SharedTree>,
}

/// Where CLOSE's hash comes from.
enum HashJob {
    /// Known (`None`: none is sent).
    Ready(Option<[u8; 32]>),
    /// A zero source's, worked out on a thread of its own while the streams send (hashing a
    /// large size of zeros first would hold back the first byte).
    Zeros(ZeroHash),
    /// The source's: its tree, completed from the file where the ranges sent did not
    /// cover it (what a resumed server held), or the whole file read.
    Source,
}

/// The hash of a zero source on its own thread, given up when the upload is dropped.
struct ZeroHash {
    job: Option<std::thread::JoinHandle<Option<[u8; 32]>>>,
    stop: Arc<AtomicBool>,
}

impl ZeroHash {
    fn start(size: u64) -> ZeroHash {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let job = std::thread::spawn(move || crate::mem::zero_hash_unless(size, &flag));
        ZeroHash {
            job: Some(job),
            stop,
        }
    }

    fn wait(mut self) -> Result<[u8; 32]> {
        self.job
            .take()
            .and_then(|job| job.join().ok().flatten())
            .ok_or_else(|| XferError::conn("internal: the hash of the zeros was not made"))
    }
}

impl Drop for ZeroHash {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl SharedUp {
    fn source(&self) -> Source<'_> {
        match &self.file {
            Some((f, _)) => Source::File(f),
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
            Some(HashJob::Zeros(job)) => job.wait().map(Some),
            Some(HashJob::Source) => {
                let Some((f, _)) = &self.file else {
                    return Err(XferError::conn("internal: no source to hash"));
                };
                let hashed = match &self.tree {
                    Some(t) => t.root_filling_from(f),
                    None => ferry_service::hash::hash_file(f, self.size),
                };
                hashed
                    .map(Some)
                    .map_err(|e| XferError::io(self.path.as_str(), &e))
            }
            None => Err(XferError::conn("internal: the file was closed twice")),
        }
    }
}

/// Upload work.
enum UpJob {
    /// A whole file, one PUT or PUT_FILE (small files, or every file of a 1.1 server), of
    /// about this size.
    Whole(PathBuf, String, u64),
    /// A large file to OPEN and split (`None`: zeros).
    Big(Option<PathBuf>, String, u64),
    /// One range of an OPENed file.
    Range(Arc<SharedUp>, u64, u64),
}

/// Opens an upload's source by its name (a local path; a file under a server's root for a
/// third-party copy): the file and what a PUT says of it.
pub(crate) type Opener<'a> = dyn Fn(&Path) -> Result<(File, FileMeta)> + Sync + 'a;

struct UpQueue<'a> {
    queue: Mutex<VecDeque<UpJob>>,
    abort: AtomicBool,
    next_id: AtomicU32,
    chunk: u64,
    resume: bool,
    open: &'a Opener<'a>,
}

impl UpQueue<'_> {
    fn next(&self) -> Option<UpJob> {
        if self.abort.load(Ordering::SeqCst) {
            return None;
        }
        lock(&self.queue).pop_front()
    }
}

/// An upload of `local` (`None`: `zero_size` zero bytes) over `opts.streams` streams.
#[allow(clippy::too_many_arguments)]
pub(crate) fn upload(
    first: &mut Option<Client>,
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
    let mut c0 = match first.take() {
        Some(c) => c,
        None => Client::connect(&r.addr, opts)?,
    };
    // On a long path the next streams connect while this one plans. (No share is held
    // back for them: a stream takes whole files 16 at a time and ranges one by one.)
    let single = match &md {
        Some(md) if md.is_dir() => None,
        Some(md) => Some(md.len()),
        None => Some(zero_size),
    };
    let want = tune::Upfront {
        long: tune::upload_upfront(single),
        short: 1,
    };
    let early = Early::start(&c0, r, opts, want);
    let planned = match (local, &md) {
        (Some(l), Some(md)) => plan_upload(&mut c0, l, md, r, opts, progress)
            .map(|v| v.into_iter().map(|(s, p, n)| (Some(s), p, n)).collect()),
        _ => c0.target("zero", false, &r.path).map(|t| {
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
    let open = |p: &Path| open_source(p);
    let grow = grower(&c0, r, opts);
    let streams = (others, grow, &early);
    upload_planned(c0, streams, files, &open, opts, progress, total)
}

/// An upload's streams besides the first: those joined already, the search that adds
/// more, and those connecting.
pub(crate) type Streams<'a, 'e> = (Vec<Client>, Option<(Growth, Joiner<'a>)>, &'e Early);

/// Uploads `files` ((source, remote path, size); source `None`: zeros) over `c0` and the
/// streams `others` joined to its session: whole files (PUT_FILE or PUT) and ranges of
/// large ones (OPEN, PUT_RANGE…, CLOSE) on whichever stream is free. Sources open with
/// `open`. Every client's counters end up in `total`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn upload_planned(
    c0: Client,
    (others, grow, early): Streams<'_, '_>,
    files: Vec<(Option<PathBuf>, String, u64)>,
    open: &Opener,
    opts: &Options,
    progress: &dyn Progress,
    total: &mut Stats,
) -> Result<()> {
    let chunk = chunk_size(opts, c0.block_size());
    // A copy that may grow its streams splits large files from the start.
    let parallel = !others.is_empty() || grow.is_some() || early.waiting() > 0;
    let mut clients = vec![c0];
    clients.extend(others);
    let jobs = files
        .into_iter()
        .map(|(src, path, size)| match src {
            Some(src) if !parallel || size <= chunk => UpJob::Whole(src, path, size),
            src => UpJob::Big(src, path, size),
        })
        .collect::<VecDeque<_>>();
    let q = UpQueue {
        queue: Mutex::new(jobs),
        abort: AtomicBool::new(false),
        next_id: AtomicU32::new(1 << 31),
        chunk,
        resume: opts.resume,
        open,
    };
    let left = || !lock(&q.queue).is_empty();
    let (clients, res) = run_streams(clients, grow, early, (progress, &left), &|c, counter| {
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

/// Most whole files a stream takes from the queue at once (and no more bytes than a
/// block: a PACK's worth, 1.11).
const WHOLE_BATCH: usize = 256;

/// One stream's share of an upload. Whole files' answers are taken as they come, across
/// batches, and all of them before a large file's conversation and at the end.
fn upload_stream(c: &mut Client, q: &UpQueue, progress: &dyn Progress) -> Result<()> {
    let mut window = PutFiles::default();
    let open = |p: &PathBuf| (q.open)(p);
    while let Some(job) = q.next() {
        if !matches!(job, UpJob::Whole(..)) {
            c.settle_puts(&mut window, &open, progress)?;
        }
        match job {
            UpJob::Whole(src, path, size) => {
                // Whole files stream (PUT_FILE): take the next few along with this one.
                let batch = whole_batch(q, (src, path, size), u64::from(c.block_size()));
                c.put_each(batch, &mut window, &open, progress)?
            }
            UpJob::Big(None, path, size) if c.minor < proto::MINOR_STREAMS => {
                c.upload_zero(size, &path, progress)?
            }
            UpJob::Big(src, path, size) => {
                let Some(up) = open_upload(c, q, src.as_deref(), &path, size, progress)? else {
                    continue;
                };
                let ranges = chunks(&lock(&up.left).missing(size), q.chunk);
                if ranges.is_empty() {
                    close_upload(c, &up, progress)?;
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
                    close_upload(c, &up, progress)?;
                }
            }
        }
    }
    c.settle_puts(&mut window, &open, progress)
}

/// `first` and the whole files queued right after it: at most [`WHOLE_BATCH`] files and
/// `bytes` bytes (`first` whatever its size).
fn whole_batch(
    q: &UpQueue,
    (src, path, size): (PathBuf, String, u64),
    bytes: u64,
) -> Vec<(PathBuf, String)> {
    let mut batch = vec![(src, path)];
    let mut taken = size;
    let mut queue = lock(&q.queue);
    while batch.len() < WHOLE_BATCH {
        match queue.pop_front() {
            Some(UpJob::Whole(src, path, size)) if taken + size <= bytes => {
                taken += size;
                batch.push((src, path));
            }
            Some(other) => {
                queue.push_front(other);
                break;
            }
            None => break,
        }
    }
    batch
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
    let (file, mode, mtime) = match src {
        Some(p) => {
            let (f, meta) = (q.open)(p)?;
            if meta.size != size {
                return Err(XferError::new(
                    Kind::Integrity,
                    format!("{}: changed while being copied; try again", p.display()),
                ));
            }
            (Some((f, meta.stamp)), meta.mode, meta.mtime)
        }
        None => (None, 0o644, 0),
    };
    let id = q.next_id.fetch_add(1, Ordering::Relaxed);
    let resume = q.resume && file.is_some();
    c.link.send(&Msg::Open {
        flags: if resume { proto::OPEN_RESUME } else { 0 } | c.force_flag(proto::OPEN_FORCE),
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
    let left = held_ranges(&have, size)?;
    if !left.is_empty() {
        tracing::info!("{path}: resuming, {} bytes in place", left.total());
        c.stats.resumed_bytes += left.total();
        progress.already_there(left.total());
    }
    let to_null = crate::mem::classify(path) == Some(Ok(crate::mem::Virtual::Null));
    let (hash, tree) = match (&file, to_null) {
        (_, true) => (HashJob::Ready(None), None),
        (None, false) => (HashJob::Zeros(ZeroHash::start(size)), None),
        // Hashed as the streams read it to send it: each byte once.
        (Some(_), false) => (
            HashJob::Source,
            BlockTree::new(size, u64::from(c.block_size())).map(SharedTree::new),
        ),
    };
    Ok(Some(Arc::new(SharedUp {
        id,
        path: path.to_string(),
        size,
        file,
        left: Mutex::new(left),
        hash: Mutex::new(Some(hash)),
        tree,
    })))
}

/// Sends `[lo, hi)` of `up` on this stream (PUT_RANGE, BLOCKs, FILE_DONE; RESEND rounds),
/// executing the [`Uploader`]'s actions.
fn put_range(
    c: &mut Client,
    up: &SharedUp,
    lo: u64,
    hi: u64,
    progress: &dyn Progress,
) -> Result<()> {
    c.converse(
        Uploader::range(up.id, lo, hi),
        (up.source(), up.tree.as_ref()),
        None,
        &up.path,
        progress,
    )
}

/// A hash no content has, as good as: the complement of the one computed. A CLOSE that
/// carries it is refused and its part dropped, by servers of every version.
fn unmatchable(h: Option<[u8; 32]>) -> [u8; 32] {
    h.unwrap_or_default().map(|b| !b)
}

/// Every range of `up` arrived: CLOSE it with the source's hash. If the source changed
/// since it was opened (every range and the hash were read since), the CLOSE carries a hash
/// that cannot match, so the server drops the part, and the upload fails (integrity).
fn close_upload(c: &mut Client, up: &SharedUp, progress: &dyn Progress) -> Result<()> {
    let mut blake3 = up.hash()?;
    let changed = match &up.file {
        Some((f, stamp)) => stamp.check(f, &up.path).err(),
        None => None,
    };
    if changed.is_some() {
        blake3 = Some(unmatchable(blake3));
    }
    c.link.send(&Msg::Close {
        file_id: up.id,
        length: up.size,
        blake3,
    })?;
    let answer = c.link.recv_msg()?;
    if let Some(e) = changed {
        return Err(e);
    }
    match answer {
        Msg::Ok { .. } => {
            c.stats.files += 1;
            c.stats.bytes += up.size;
            progress.file_done();
            Ok(())
        }
        Msg::Error { code, message, .. } => Err(remote_err(code, &message)),
        m => Err(unexpected(&m)),
    }
}
