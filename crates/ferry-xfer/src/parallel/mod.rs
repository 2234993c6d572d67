//! Parallel streams (`ferry cp -p N`, protocol 1.2): one copy over N connections.
//!
//! Stream 0 opens a session; streams 1..N-1 join it (HELLO `session`/`stream`). Each
//! stream runs on its own thread and pulls work from one shared queue: whole files (small
//! ones, pipelined on the stream as a single-stream copy does) and chunks of large files.
//! A large file (more than one chunk) is opened once: its part file is shared by every
//! stream, each chunk lands in place by `pwrite`, its journal records the verified ranges,
//! and each block is hashed into the file's hash tree as it lands
//! ([`ferry_service::tree`]), so the whole-file BLAKE3 follows from 32 bytes per block when
//! the last chunk lands, without reading the part again. Chunks are handed out one at a
//! time (at most [`CHUNKS_AHEAD`] outstanding per stream), so a slow stream does not hold
//! the others back.
//!
//! Downloads fetch a chunk with a ranged GET; the source's BLAKE3 comes from a SUM sent on
//! the stream that opened the file. Uploads OPEN the file (HAVE lists what a resumed part
//! holds), send each chunk with PUT_RANGE on whichever stream is free, and CLOSE it with
//! the source's BLAKE3, merged from the blocks the streams hashed as they read them.
//!
//! A copy without `-p` on a long path opens its first extra streams at once ([`Early`]):
//! they connect on their own threads while stream 0 plans, join the copy as they come,
//! and until they have, a download stream takes no more than its share of the jobs
//! ([`tune::fair_share`]).

mod download;
mod upload;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::client::tune::{self, Growth};
use crate::client::{Client, Options, Progress, Stats};
use crate::error::{Kind, Result, XferError};
use crate::proto;
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

/// Progress from the stream threads, handed to the caller's reporter by the main thread:
/// bytes moved, bytes found already there (kept apart: they are no part of a rate), files
/// completed.
#[derive(Default)]
struct Counter {
    moved: AtomicU64,
    held: AtomicU64,
    files: AtomicU64,
}

/// What a [`Counter`] reported last: (moved, held, files).
type Shown = (u64, u64, u64);

impl Progress for Counter {
    fn add(&self, bytes: u64) {
        self.moved.fetch_add(bytes, Ordering::Relaxed);
    }
    fn already_there(&self, bytes: u64) {
        self.held.fetch_add(bytes, Ordering::Relaxed);
    }
    fn file_done(&self) {
        self.files.fetch_add(1, Ordering::Relaxed);
    }
}

impl Counter {
    /// Reports to `progress` what changed since `shown`, which it updates.
    fn relay(&self, progress: &dyn Progress, shown: &mut Shown) {
        let now = (
            self.moved.load(Ordering::Relaxed),
            self.held.load(Ordering::Relaxed),
            self.files.load(Ordering::Relaxed),
        );
        if now.1 > shown.1 {
            progress.already_there(now.1 - shown.1);
        }
        progress.add(now.0 - shown.0);
        for _ in shown.2..now.2 {
            progress.file_done();
        }
        *shown = now;
    }
}

/// The chunk size for `opts` and block size `block`: a multiple of the block.
fn chunk_size(opts: &Options, block: u32) -> u64 {
    let b = u64::from(block.max(1));
    opts.chunk.max(b).div_ceil(b) * b
}

/// Opens streams 1..N-1 of `c0`'s session, or says why it keeps one stream. A copy that
/// chooses its stream count starts with one ([`grower`] adds the others).
pub(crate) fn join_streams(c0: &Client, r: &Remote, opts: &Options) -> Result<Vec<Client>> {
    if opts.auto_streams {
        return Ok(Vec::new());
    }
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
        match join_stream(c0.session, r, opts, i) {
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

/// Connects stream `i` of `session`; a connection that fails (e.g. reset by a busy
/// listener) is tried twice more.
fn join_stream(session: u64, r: &Remote, opts: &Options, i: u16) -> Result<Client> {
    let mut tries = 0;
    loop {
        match Client::connect_as(&r.addr, opts, session, i) {
            Err(e) if e.kind == Kind::Connection && tries < 2 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            res => return res,
        }
    }
}

/// Opens stream `i` of the copy's session (for a copy that grows its stream count).
pub(crate) type Joiner<'a> = Box<dyn Fn(u16) -> Result<Client> + Sync + 'a>;

/// The streams a copy without `-p` opens before data moves ([`tune::upfront_streams`]):
/// each connects on its own thread while stream 0 lists and plans, and joins the copy
/// when it is ready ([`run_streams`]). One that cannot connect is left out (the copy goes
/// on with the streams it has), and one still connecting when the copy ends is left to
/// finish on its own.
pub(crate) struct Early {
    /// The connecting threads, by stream number.
    pending: Mutex<Vec<(u16, JoinHandle<Result<Client>>)>>,
    /// Streams still connecting.
    waiting: AtomicUsize,
    /// Streams working (set by [`run_streams`]).
    working: AtomicUsize,
}

impl Early {
    /// None: the copy's streams are the ones it starts with.
    pub(crate) fn none() -> Early {
        Early {
            pending: Mutex::new(Vec::new()),
            waiting: AtomicUsize::new(0),
            working: AtomicUsize::new(1),
        }
    }

    /// Starts connecting the streams after `c0` that a copy without `-p` opens at once
    /// over `c0`'s path: `want` in all ([`tune::upfront_streams`]; on a long path
    /// `FERRY_UPFRONT_STREAMS` says otherwise); none with `-p`, or to a server without
    /// sessions. On a driver where streams cannot join a busy copy
    /// ([`tune::joins_while_busy`]) they have connected (or failed to) when this returns.
    pub(crate) fn start(c0: &Client, r: &Remote, opts: &Options, want: tune::Upfront) -> Early {
        let early = Early::none();
        if !opts.auto_streams || c0.minor < proto::MINOR_STREAMS {
            return early;
        }
        let max = opts.streams.clamp(1, proto::MAX_STREAMS);
        let want = tune::Upfront {
            long: tune::upfront_knob().unwrap_or(want.long),
            ..want
        };
        let n = tune::upfront_streams(c0.rtt(), max, want);
        if n <= 1 {
            return early;
        }
        match tune::long_path(c0.rtt()) {
            true => tracing::debug!("a long path: opening {n} streams at once"),
            false => tracing::debug!("a tree over a short path: opening {n} streams at once"),
        }
        let mut pending = lock(&early.pending);
        for i in 1..n {
            let (session, r, opts) = (c0.session, r.clone(), opts.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("ferry-stream-{i}"))
                .spawn(move || join_stream(session, &r, &opts, i));
            match spawned {
                Ok(h) => pending.push((i, h)),
                Err(e) => tracing::debug!("stream {i} not started ({e})"),
            }
        }
        early.waiting.store(pending.len(), Ordering::SeqCst);
        if !tune::joins_while_busy(&r.addr) {
            // They connect now, while this stream is idle ([`tune::joins_while_busy`]).
            while !pending.iter().all(|(_, h)| h.is_finished()) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        drop(pending);
        early
    }

    /// Streams still connecting.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Streams working.
    pub(crate) fn working(&self) -> usize {
        self.working.load(Ordering::SeqCst)
    }

    /// The streams that finished connecting (or failed to) since the last call.
    fn ready(&self) -> Vec<(u16, Result<Client>)> {
        let mut pending = lock(&self.pending);
        if pending.iter().all(|(_, h)| !h.is_finished()) {
            return Vec::new();
        }
        let (done, still): (Vec<_>, Vec<_>) = pending.drain(..).partition(|(_, h)| h.is_finished());
        *pending = still;
        done.into_iter()
            .map(|(i, h)| {
                let res = h
                    .join()
                    .unwrap_or_else(|_| Err(XferError::conn("a connecting thread failed")));
                (i, res)
            })
            .collect()
    }

    /// A stream left connecting or out: one fewer waited for.
    fn resolved(&self) {
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }

    /// The copy ended: streams still connecting are left to finish on their own (waiting
    /// for them would add a handshake to the copy's end); nothing waits for them now.
    fn abandon(&self) {
        let left = std::mem::take(&mut *lock(&self.pending));
        if !left.is_empty() {
            tracing::debug!(
                "{} stream(s) still connecting when the copy ended",
                left.len()
            );
        }
        self.waiting.store(0, Ordering::SeqCst);
    }
}

/// Runs `work` on every client, each on its own thread, relaying their progress to
/// `progress`; starts it on each of the `early` streams as it connects; with `grow`, once
/// none of those is waited for, adds streams while the delivery rate grows ([`Growth`])
/// and `left` says jobs wait that no stream has taken yet. Returns the clients (for their
/// counters) and the first error (connection failures last: they are usually the
/// consequence of another) after every thread ended.
fn run_streams(
    clients: Vec<Client>,
    mut grow: Option<(Growth, Joiner<'_>)>,
    early: &Early,
    (progress, left): (&dyn Progress, &dyn Fn() -> bool),
    work: &(dyn Fn(&mut Client, &dyn Progress) -> Result<()> + Sync),
) -> (Vec<Client>, Result<()>) {
    let counter = Counter::default();
    // Each stream's transport round trip, read while the streams work: the path, not a
    // handshake a busy host slowed down, decides whether more streams can help.
    let mut probes: Vec<Box<dyn Fn() -> Option<Duration> + Send + Sync>> = Vec::new();
    let (clients, results): (Vec<Client>, Vec<Result<()>>) = std::thread::scope(|s| {
        let spawn = |mut c: Client| {
            let counter = &counter;
            s.spawn(move || {
                let r = work(&mut c, counter);
                (c, r)
            })
        };
        let mut handles = Vec::new();
        early.working.store(clients.len(), Ordering::SeqCst);
        for c in clients {
            probes.push(Box::new(c.link.socket().rtt_probe()));
            handles.push(spawn(c));
        }
        let mut shown: Shown = (0, 0, 0);
        // The growth search's measuring period: from when (after a stream's slow start),
        // and the bytes at that moment.
        let mut mark: Option<(Instant, u64)> = None;
        // The first stream's slow start is not measured either.
        let mut settle_until =
            Instant::now() + grow.as_ref().map_or(Duration::ZERO, |g| g.0.period() / 2);
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(10));
            counter.relay(progress, &mut shown);
            let now = shown.0;
            for (i, res) in early.ready() {
                match res {
                    Ok(c) => {
                        tracing::debug!("stream {} joined the copy", i + 1);
                        probes.push(Box::new(c.link.socket().rtt_probe()));
                        handles.push(spawn(c));
                        early.working.fetch_add(1, Ordering::SeqCst);
                        // Its slow start is not measured.
                        if let Some((growth, _)) = &grow {
                            settle_until = Instant::now() + growth.period() / 2;
                        }
                    }
                    Err(e) => {
                        // The copy goes on with the streams it has; one that could not
                        // connect says the next would not either.
                        tracing::warn!(
                            "stream {} could not connect ({e}); copying without it",
                            i + 1
                        );
                        if let Some((growth, _)) = grow.as_mut() {
                            growth.stop();
                        }
                    }
                }
                early.resolved();
            }
            let Some((growth, join)) = grow.as_mut() else {
                continue;
            };
            if growth.done() || early.waiting() > 0 || Instant::now() < settle_until {
                mark = None;
                continue;
            }
            let (since, bytes) = *mark.get_or_insert((Instant::now(), now));
            if since.elapsed() < growth.period() {
                continue;
            }
            let rate = (now - bytes) as f64 / since.elapsed().as_secs_f64();
            let streams = handles.len() as u16;
            mark = None;
            let path = probes.iter().filter_map(|p| p()).min();
            if let Some(rtt) = path.filter(|&r| !tune::long_path(r)) {
                tracing::debug!(
                    "TCP measured a round trip of {:.2} ms: a short path; keeping {streams} stream(s)",
                    rtt.as_secs_f64() * 1e3
                );
                growth.stop();
                continue;
            }
            if !left() {
                // Every job is on a stream already (a window of GETs can hold a whole
                // tree): a new one would only add its handshake to the copy's end.
                tracing::debug!("nothing left for another stream; keeping {streams}");
                growth.stop();
                continue;
            }
            if !growth.add_after(streams, rate) {
                tracing::debug!(
                    "{streams} stream(s) deliver {:.0} Mbit/s; keeping {streams}",
                    rate * 8e-6
                );
                continue;
            }
            match join(streams) {
                Ok(c) => {
                    tracing::debug!(
                        "{streams} stream(s) deliver {:.0} Mbit/s; adding stream {}",
                        rate * 8e-6,
                        streams + 1
                    );
                    probes.push(Box::new(c.link.socket().rtt_probe()));
                    handles.push(spawn(c));
                    // Its slow start is not measured.
                    settle_until = Instant::now() + growth.period() / 2;
                }
                Err(e) => {
                    tracing::warn!(
                        "stream {} could not connect ({e}); copying over {streams}",
                        streams + 1
                    );
                    growth.stop();
                }
            }
        }
        early.abandon();
        counter.relay(progress, &mut shown);
        let mut out = (Vec::new(), Vec::new());
        for h in handles {
            match h.join() {
                Ok((c, r)) => {
                    out.0.push(c);
                    out.1.push(r);
                }
                Err(_) => out.1.push(Err(XferError::conn("a stream thread failed"))),
            }
        }
        out
    });
    let mut errs: Vec<XferError> = results.into_iter().filter_map(|r| r.err()).collect();
    errs.sort_by_key(|e| e.kind == Kind::Connection);
    let res = match errs.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    };
    (clients, res)
}

/// A copy that chooses its stream count: the search and how to open one more stream of
/// `c0`'s session, if the path is long, the server has sessions and streams may join
/// while others work ([`tune::joins_while_busy`]); `None` otherwise.
pub(crate) fn grower<'a>(
    c0: &Client,
    r: &'a Remote,
    opts: &'a Options,
) -> Option<(Growth, Joiner<'a>)> {
    if !opts.auto_streams
        || !tune::long_path(c0.rtt())
        || c0.minor < proto::MINOR_STREAMS
        || !tune::joins_while_busy(&r.addr)
    {
        return None;
    }
    let session = c0.session;
    let max = opts.streams.clamp(1, proto::MAX_STREAMS);
    let join = move |i| join_stream(session, r, opts, i);
    Some((Growth::new(c0.rtt(), max), Box::new(join)))
}

fn finish_clients(clients: Vec<Client>, total: &mut Stats, ok: bool) {
    let streams = clients.len() as u16;
    for mut c in clients {
        c.sample_path();
        total.add(&c.stats);
        if ok {
            c.bye();
        }
    }
    total.tuning.streams = total.tuning.streams.max(streams);
}

pub(crate) use download::{download, Chunk};
pub(crate) use upload::{upload, upload_planned};

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
