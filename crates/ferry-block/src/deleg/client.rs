//! The Rust API of the block fabric path: a session with one export of a `ferry serve`,
//! reads and writes at offsets, flush, trim, zeroes.
//!
//! A [`Client`] is shared by many threads (`&self`): each call is cut into requests of at
//! most the delegated chunk size, and every request of every caller is kept in flight up to
//! the server's credits (queue depth), one chunk each. The caller's thread stages its own
//! data (a write copies into the chunk's local staging buffer; a read copies out of it); a
//! driver thread, the session's only user of the connection, posts the RMAs, sends the
//! requests and matches the replies, in any order, by handle. Under delegation a write
//! RMA-writes the staging buffer into the server's chunk, then names the chunk; a read has
//! the server fill the chunk and RMA-reads it back ([`ReadMode::ServerFill`]), or names
//! the staging buffer, which the server RMA-writes ([`ReadMode::ServerWrite`]).
//!
//! Writes the driver finds waiting together whose ranges follow one another on the export
//! go as one request ([`super::merge`]): one RMA gathers their staging buffers into the
//! first one's chunk, where the driver allows it ([`Client::write_many`] hands a call's
//! ranges over together; concurrent callers' writes meet in the queue).
//!
//! ```no_run
//! use ferry_block::deleg::client::{Client, Options};
//! # fn run() -> ferry_service::Result<()> {
//! let c = Client::connect("ofi+shm://ferry", &Options::new("disk"))?;
//! c.write_at(0, &[7u8; 1 << 20], false)?;
//! let mut back = vec![0u8; 1 << 20];
//! c.read_at(0, &mut back)?;
//! c.flush()?;
//! # Ok(()) }
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferry_exs::proto::EventKind;
use ferry_exs::runtime::{EventQueue, ExsBuf};
use ferry_fabric::{Access, RemoteSlice};
use ferry_service::channel::Channel;
use ferry_service::secure::ClientSecurity;
use ferry_service::{Error, Kind, Result};

use super::merge::{self, Limits, Piece};
use super::pool::FirstFit;
use super::proto::{self, rflag, Cmd, Data, Msg, ReadMode, Scheme};

/// How a client connects.
#[derive(Debug, Clone)]
pub struct Options {
    /// The export's name.
    pub export: String,
    /// The token (empty: none).
    pub token: String,
    /// How data moves.
    pub scheme: Scheme,
    /// How reads move under delegation.
    pub read: ReadMode,
    /// Ask the server to rotate a chunk's key after each I/O on it.
    pub always_invalidate: bool,
    /// Send writes that follow one another on the export as one request (block
    /// aggregation; delegated scheme only). On by default.
    pub merge: bool,
    /// TLS (or clear) and the server's identity.
    pub security: ClientSecurity,
    /// How long the connection, and each wait for the server, may take.
    pub timeout: Duration,
}

impl Options {
    /// Zero-copy delegation with the default read scheme, TLS as
    /// [`ClientSecurity::default`] says, for `export`.
    pub fn new(export: &str) -> Options {
        Options {
            export: export.to_string(),
            token: String::new(),
            scheme: Scheme::Delegated,
            read: DEFAULT_READ,
            always_invalidate: false,
            merge: true,
            security: ClientSecurity::default(),
            timeout: Duration::from_secs(30),
        }
    }
}

/// The read scheme a client asks for unless told otherwise: the faster of the two as
/// measured (`docs/block.md`, "The RDMA path").
pub const DEFAULT_READ: ReadMode = ReadMode::ServerWrite;

/// One request a caller hands to the driver (its slot taken, its write data staged).
#[derive(Debug)]
struct Submit {
    /// Given when handed over.
    ticket: u64,
    slot: u16,
    cmd: Cmd,
    flags: u8,
    offset: u64,
    len: u32,
    /// A WRITE's bytes under the copy scheme.
    inline: Option<Vec<u8>>,
}

/// What a request ended with: a copy-scheme READ's bytes, or nothing.
type Outcome = Result<Option<Vec<u8>>>;

/// What callers and the driver share.
struct State {
    slots: FirstFit,
    /// Requests not yet picked up by the driver.
    submitted: VecDeque<Submit>,
    /// Requests finished, by ticket, until their caller takes the outcome.
    done: HashMap<u64, Outcome>,
    /// Callers asleep until a ticket finishes, by ticket: each is woken alone, so a reply
    /// wakes its own caller, not every thread sharing the session.
    waiting: HashMap<u64, std::thread::Thread>,
    next_ticket: u64,
    /// Why the session broke (every call fails from then on).
    broken: Option<Error>,
    /// The client is closing: the driver ends once nothing is in flight.
    closing: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled once per slot freed, and for all when the session breaks.
    slot_freed: Condvar,
    /// Signalled when a request is submitted (or the client closes).
    work: Condvar,
    /// The connection's queue and the driver's RMA queue: woken on a submission, so the
    /// driver, waiting on either, picks it up at once.
    wake: [EventQueue; 2],
    /// Requests sent to the server.
    sent: AtomicU64,
    /// Writes that went inside another's request (block aggregation).
    merged: AtomicU64,
}

/// What a session has sent so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Requests sent to the server.
    pub requests: u64,
    /// Writes of callers that travelled inside another write's request (merged), so
    /// sent no request of their own.
    pub merged_writes: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues requests for the driver, all at once (so that it sees them together).
    fn submit(&self, st: &mut State, subs: impl IntoIterator<Item = Submit>) {
        st.submitted.extend(subs);
        self.work.notify_one();
        for q in &self.wake {
            q.wake();
        }
    }
}

/// A session with one export, shareable by threads.
pub struct Client {
    shared: Arc<Shared>,
    driver: Option<JoinHandle<()>>,
    size: u64,
    readonly: bool,
    chunk_size: u32,
    scheme: Scheme,
    /// One registered staging buffer per slot (delegated scheme).
    staging: Arc<Vec<ExsBuf>>,
    timeout: Duration,
}

impl Client {
    /// Connects to the `ferry serve` at `addr` (`tcp://h:p`, `ofi+tcp://h:p`,
    /// `ofi+shm://name`), selects its `block` face and opens `opts.export`.
    pub fn connect(addr: &str, opts: &Options) -> Result<Client> {
        let mut ch = Channel::connect_with(addr, opts.timeout, &opts.security)?;
        ch.timeout = opts.timeout;
        let sealed = ch.secure().is_some();
        ch.select(addr, super::SERVICE, if sealed { &opts.token } else { "" })?;
        ch.post_ring(1, 2 * proto::MAX_TEXT + 64)?;
        ch.send_frame(&proto::encode(&Msg::Hello {
            major: proto::VERSION_MAJOR,
            minor: proto::VERSION_MINOR,
            scheme: opts.scheme,
            read: opts.read,
            always_invalidate: opts.always_invalidate,
            export: opts.export.clone(),
            // Over TLS the SELECT proved the token; it never crosses.
            token: if sealed {
                String::new()
            } else {
                opts.token.clone()
            },
        }))?;
        // Not posted again: the ring for the replies, posted next, is sized for the
        // largest (a whole chunk's READ under the copy scheme).
        let frame = ch.recv_first()?;
        let (size, readonly, credits, chunk_size, chunks) = match proto::decode(&frame) {
            Ok(Msg::Delegate {
                major,
                size,
                readonly,
                credits,
                chunk_size,
                chunks,
                ..
            }) if major == proto::VERSION_MAJOR => (size, readonly, credits, chunk_size, chunks),
            Ok(Msg::Error { message }) => {
                return Err(Error::new(Kind::Auth, format!("{addr}: {message}")))
            }
            Ok(m) => return Err(Error::conn(format!("{addr}: expected DELEGATE, got {m:?}"))),
            Err(e) => return Err(Error::conn(format!("{addr}: {e}"))),
        };
        let slots = match opts.scheme {
            Scheme::Delegated if chunks.is_empty() => {
                return Err(Error::conn(format!("{addr} delegated no chunks")))
            }
            Scheme::Delegated => chunks.len().min(usize::from(credits)),
            Scheme::Copy => usize::from(credits),
        };
        let reply_max = proto::HEADER_LEN
            + proto::REPLY_LEN
            + RemoteSlice::WIRE_LEN
            + match opts.scheme {
                Scheme::Copy => chunk_size as usize,
                Scheme::Delegated => 0,
            };
        ch.post_ring(slots, reply_max.max(2 * proto::MAX_TEXT + 64))?;
        let (staging, staging_remote) = match opts.scheme {
            Scheme::Delegated => register_staging(&ch, slots, chunk_size, opts.read)?,
            Scheme::Copy => (Vec::new(), Vec::new()),
        };
        let rq = EventQueue::new().map_err(|e| Error::io("create event queue", &e))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                slots: FirstFit::new(slots),
                submitted: VecDeque::new(),
                done: HashMap::new(),
                waiting: HashMap::new(),
                next_ticket: 1,
                broken: None,
                closing: false,
            }),
            slot_freed: Condvar::new(),
            work: Condvar::new(),
            wake: [ch.queue().clone(), rq.clone()],
            sent: AtomicU64::new(0),
            merged: AtomicU64::new(0),
        });
        let merge_limits = (opts.merge && opts.scheme == Scheme::Delegated).then(|| Limits {
            max_len: chunk_size,
            max_parts: ch.socket().rma_gather(),
        });
        let ordered = ch.socket().orders_send_after_write();
        let staging = Arc::new(staging);
        let driver = Driver {
            ch,
            rq,
            shared: shared.clone(),
            scheme: opts.scheme,
            read: opts.read,
            merge: merge_limits,
            ordered,
            chunk_size,
            chunks,
            staging: staging.clone(),
            staging_remote,
            inflight: HashMap::new(),
            rmas: HashMap::new(),
            next_handle: 1,
        };
        let driver = std::thread::Builder::new()
            .name("ferry-block-client".into())
            .spawn(move || driver.run())
            .map_err(|e| Error::io("start the block client's driver", &e))?;
        Ok(Client {
            shared,
            driver: Some(driver),
            size,
            readonly,
            chunk_size,
            scheme: opts.scheme,
            staging,
            timeout: opts.timeout,
        })
    }

    /// The export's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether the export refuses writes.
    pub fn readonly(&self) -> bool {
        self.readonly
    }

    /// The largest single request (bytes): the delegated chunk size.
    pub fn chunk_size(&self) -> u32 {
        self.chunk_size
    }

    /// Whether the session broke (its connection failed or the server ended it).
    pub fn is_broken(&self) -> bool {
        self.shared.lock().broken.is_some()
    }

    /// Writes `data` at `offset`; with `fua`, durable when this returns.
    pub fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.write_many(&[(offset, data)], fua)
    }

    /// Writes each `(offset, data)` of `ranges`; with `fua`, all durable when this returns.
    /// The ranges' requests reach the driver together (a chunk's worth at a time), so
    /// ranges that follow one another on the export, in any order in `ranges`, travel as
    /// one request (up to a chunk); the call returns when all are answered, with the first
    /// error. Ranges must not overlap: their order on the export is not kept.
    pub fn write_many(&self, ranges: &[(u64, &[u8])], fua: bool) -> Result<()> {
        for (offset, data) in ranges {
            self.check_range(*offset, data.len() as u64)?;
        }
        let flags = if fua { rflag::FUA } else { 0 };
        let step = self.chunk_size as usize;
        let pieces = ranges.iter().flat_map(|&(offset, data)| {
            data.chunks(step)
                .enumerate()
                .map(move |(i, p)| (offset + (i * step) as u64, p))
        });
        let (mut tickets, mut batch) = (Vec::new(), Vec::new());
        // The batch goes to the driver once it holds a chunk's worth, so that pieces which
        // could merge go together while a large write's staging overlaps its transfers.
        let mut batch_bytes = 0;
        let mut first_err = None;
        for (off, piece) in pieces {
            if batch_bytes + piece.len() > step {
                self.submit_all(&mut batch, &mut tickets);
                batch_bytes = 0;
            }
            let slot = match self.slot(false).transpose() {
                Some(s) => s,
                None => {
                    self.submit_all(&mut batch, &mut tickets);
                    batch_bytes = 0;
                    self.take_slot()
                }
            };
            let slot = match slot {
                Ok(s) => s,
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            };
            match self.stage(slot, piece) {
                Ok(inline) => batch.push(Submit {
                    ticket: 0,
                    slot,
                    cmd: Cmd::Write,
                    flags,
                    offset: off,
                    len: piece.len() as u32,
                    inline,
                }),
                Err(e) => {
                    self.release(slot);
                    first_err = Some(e);
                    break;
                }
            }
            batch_bytes += piece.len();
        }
        self.submit_all(&mut batch, &mut tickets);
        let r = self.wait_all(&tickets);
        first_err.map_or(r, Err)
    }

    /// Stages a write's bytes for slot `slot`: into its registered buffer (delegated), or
    /// into the message itself (copy scheme, returned).
    fn stage(&self, slot: u16, piece: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.scheme {
            Scheme::Copy => Ok(Some(piece.to_vec())),
            Scheme::Delegated => self.staging[usize::from(slot)]
                .write_at(0, piece)
                .map(|()| None)
                .map_err(|e| Error::conn(format!("stage a write: {e}"))),
        }
    }

    /// What this session has sent so far.
    pub fn stats(&self) -> Stats {
        Stats {
            requests: self.shared.sent.load(Ordering::Relaxed),
            merged_writes: self.shared.merged.load(Ordering::Relaxed),
        }
    }

    /// Fills `buf` from `offset`. Its requests stay in flight up to the free slots; each
    /// finished one is copied out (its slot freed) before this call waits for another slot,
    /// so a call longer than the pool never waits on itself.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let step = self.chunk_size as usize;
        let mut pending = VecDeque::new();
        let mut first_err = None;
        let mut at = 0;
        while (at < buf.len() && first_err.is_none()) || !pending.is_empty() {
            if at < buf.len() && first_err.is_none() {
                match self.slot(pending.is_empty()) {
                    Ok(Some(slot)) => {
                        let len = step.min(buf.len() - at);
                        let off = offset + at as u64;
                        let t = self.submit(slot, Cmd::Read, 0, off, len as u32);
                        pending.push_back((t, slot, at, len));
                        at += len;
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        first_err = Some(e);
                        continue;
                    }
                }
            }
            let Some((t, slot, a, len)) = pending.pop_front() else {
                break;
            };
            let r = self
                .outcome(t)?
                .and_then(|payload| self.copy_out(slot, payload, &mut buf[a..a + len]));
            self.release(slot);
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Makes every acknowledged write durable.
    pub fn flush(&self) -> Result<()> {
        self.plain(Cmd::Flush, 0, 0, 0)
    }

    /// Discards `len` bytes at `offset` (a hint).
    pub fn trim(&self, offset: u64, len: u32) -> Result<()> {
        self.plain(Cmd::Trim, offset, len, 0)
    }

    /// Makes `len` bytes at `offset` read as zeroes (a hole allowed unless `no_hole`).
    pub fn write_zeroes(&self, offset: u64, len: u32, no_hole: bool) -> Result<()> {
        let flags = if no_hole { rflag::NO_HOLE } else { 0 };
        self.plain(Cmd::WriteZeroes, offset, len, flags)
    }

    /// Closes the session (after the requests in flight).
    pub fn close(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.closing = true;
            self.shared.work.notify_all();
            for q in &self.shared.wake {
                q.wake();
            }
        }
        if let Some(d) = self.driver.take() {
            let _ = d.join();
        }
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        if offset.checked_add(len).is_some_and(|e| e <= self.size) {
            Ok(())
        } else {
            Err(Error::new(
                Kind::Usage,
                format!(
                    "{len} bytes at {offset} lie past the end of the {}-byte export",
                    self.size
                ),
            ))
        }
    }

    fn plain(&self, cmd: Cmd, offset: u64, len: u32, flags: u8) -> Result<()> {
        let slot = self.take_slot()?;
        let t = self.submit(slot, cmd, flags, offset, len);
        self.wait_all(&[t])
    }

    /// A free slot (a request's credit and chunk), waiting while every one is in use.
    fn take_slot(&self) -> Result<u16> {
        loop {
            if let Some(s) = self.slot(true)? {
                return Ok(s);
            }
        }
    }

    /// A free slot; `None` at once if every one is in use, unless `wait`.
    fn slot(&self, wait: bool) -> Result<Option<u16>> {
        let mut st = self.shared.lock();
        loop {
            if let Some(e) = &st.broken {
                return Err(e.clone());
            }
            if let Some(s) = st.slots.alloc() {
                return Ok(Some(s));
            }
            if !wait {
                return Ok(None);
            }
            let (next, to) = self
                .shared
                .slot_freed
                .wait_timeout(st, self.patience())
                .unwrap_or_else(|p| p.into_inner());
            st = next;
            if to.timed_out() && st.broken.is_none() {
                return Err(stopped_answering());
            }
        }
    }

    fn release(&self, slot: u16) {
        self.shared.lock().slots.release(slot);
        self.shared.slot_freed.notify_one();
    }

    /// How long a caller waits without news before it gives up: longer than the session's
    /// timeout, after which the driver itself gives up on a silent server.
    fn patience(&self) -> Duration {
        self.timeout + Duration::from_secs(1)
    }

    /// Hands one request without data of its own to the driver; its ticket.
    fn submit(&self, slot: u16, cmd: Cmd, flags: u8, offset: u64, len: u32) -> u64 {
        let s = Submit {
            ticket: 0,
            slot,
            cmd,
            flags,
            offset,
            len,
            inline: None,
        };
        let mut tickets = Vec::with_capacity(1);
        self.submit_all(&mut vec![s], &mut tickets);
        tickets[0]
    }

    /// Hands every request of `batch` (emptied) to the driver at once, each given its
    /// ticket, appended to `tickets`.
    fn submit_all(&self, batch: &mut Vec<Submit>, tickets: &mut Vec<u64>) {
        if batch.is_empty() {
            return;
        }
        let mut st = self.shared.lock();
        for s in batch.iter_mut() {
            s.ticket = st.next_ticket;
            st.next_ticket += 1;
            tickets.push(s.ticket);
        }
        // A session that broke since these were staged has no driver to answer them.
        if let Some(e) = st.broken.clone() {
            for s in batch.drain(..) {
                st.slots.release(s.slot);
                st.done.insert(s.ticket, Err(e.clone()));
            }
            return;
        }
        self.shared.submit(&mut st, batch.drain(..));
    }

    /// Waits for every ticket of a call; the first error once all are done.
    fn wait_all(&self, tickets: &[u64]) -> Result<()> {
        let mut first_err = None;
        for t in tickets {
            if let Err(e) = self.outcome(*t)? {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Waits for a ticket's outcome (`Err` outside: the session stopped answering). The
    /// caller sleeps until the driver wakes it for this ticket.
    fn outcome(&self, ticket: u64) -> Result<Outcome> {
        loop {
            {
                let mut st = self.shared.lock();
                if let Some(o) = st.done.remove(&ticket) {
                    st.waiting.remove(&ticket);
                    return Ok(o);
                }
                st.waiting.insert(ticket, std::thread::current());
            }
            let slept = Instant::now();
            std::thread::park_timeout(self.patience());
            if slept.elapsed() >= self.patience() {
                let mut st = self.shared.lock();
                if !st.done.contains_key(&ticket) {
                    st.waiting.remove(&ticket);
                    return Err(stopped_answering());
                }
            }
        }
    }

    /// A finished READ's bytes into `out`: from the reply (copy scheme) or the staging buffer.
    fn copy_out(&self, slot: u16, payload: Option<Vec<u8>>, out: &mut [u8]) -> Result<()> {
        match (self.scheme, payload) {
            (Scheme::Copy, Some(p)) if p.len() == out.len() => {
                out.copy_from_slice(&p);
                Ok(())
            }
            (Scheme::Copy, _) => Err(Error::conn("a READ's reply is not its length")),
            (Scheme::Delegated, _) => {
                let b = &self.staging[usize::from(slot)];
                b.buffer().read_at(b.offset(), out);
                Ok(())
            }
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One registered staging buffer per slot and their remote ranges; under RTRS the server
/// may write into them (granted on this connection only).
fn register_staging(
    ch: &Channel,
    slots: usize,
    chunk_size: u32,
    read: ReadMode,
) -> Result<(Vec<ExsBuf>, Vec<RemoteSlice>)> {
    let rtrs = read == ReadMode::ServerWrite;
    let access = if rtrs {
        Access::REMOTE_WRITE
    } else {
        Access::LOCAL
    };
    let sock = ch.socket();
    let (mut bufs, mut remotes) = (Vec::new(), Vec::new());
    for _ in 0..slots {
        let buf = sock
            .alloc_with(chunk_size as usize, access)
            .map_err(|e| Error::conn(format!("register a staging buffer: {e}")))?;
        if rtrs {
            sock.grant(&buf)
                .map_err(|e| Error::conn(format!("grant a staging buffer: {e}")))?;
        }
        let remote = buf
            .region()
            .remote(..)
            .map_err(|e| Error::conn(format!("a staging buffer's range: {e}")))?;
        bufs.push(buf);
        remotes.push(remote);
    }
    Ok((bufs, remotes))
}

/// What a request in flight waits for.
#[derive(Debug, Clone)]
struct Op {
    /// The slot whose chunk (or staging buffer) the request names.
    slot: u16,
    cmd: Cmd,
    len: u32,
    /// The callers' requests it carries, by ticket and slot: one, or the writes merged
    /// into it (their slots free with it).
    parts: Vec<(u64, u16)>,
}

impl Op {
    fn of(s: &Submit) -> Op {
        Op {
            slot: s.slot,
            cmd: s.cmd,
            len: s.len,
            parts: vec![(s.ticket, s.slot)],
        }
    }
}

/// What an RMA of the driver's waits to do once complete.
#[derive(Debug)]
enum Rma {
    /// The writes' data is in the first one's chunk: send them as one WRITE.
    Written(Vec<Submit>),
    /// The WRITE went right behind the RMA (the driver orders a send after a write): only
    /// the RMA's completion is awaited, before the request's slots are freed.
    Sent,
    /// The chunk's data is in the staging buffer: the READ is done.
    Read { ticket: u64 },
}

/// The session's connection and everything in flight on it, on a thread of its own.
struct Driver {
    ch: Channel,
    /// Where the driver's own RMAs complete.
    rq: EventQueue,
    shared: Arc<Shared>,
    scheme: Scheme,
    read: ReadMode,
    /// How far writes merge (`None`: they do not).
    merge: Option<Limits>,
    /// A WRITE may follow its RMA at once: the driver delivers a send after an earlier
    /// RMA write is in place (native tcp; not ofi, whose checked RMA asks the target
    /// first), as the seed relies on InfiniBand RC doing.
    ordered: bool,
    chunk_size: u32,
    /// The delegated chunks (their current keys).
    chunks: Vec<RemoteSlice>,
    staging: Arc<Vec<ExsBuf>>,
    staging_remote: Vec<RemoteSlice>,
    inflight: HashMap<u64, Op>,
    rmas: HashMap<u16, Rma>,
    next_handle: u64,
}

impl Driver {
    fn run(mut self) {
        let r = self.serve();
        let mut st = self.shared.lock();
        let e = match r {
            Ok(()) => Error::conn("the block session is closed"),
            Err(e) => e,
        };
        // Whatever was in flight fails with the session.
        let tickets = self
            .inflight
            .values()
            .flat_map(|o| o.parts.iter().map(|p| p.0))
            .chain(self.rmas.values().flat_map(|r| match r {
                Rma::Written(subs) => subs.iter().map(|s| s.ticket).collect(),
                Rma::Read { ticket } => vec![*ticket],
                Rma::Sent => vec![],
            }))
            .chain(st.submitted.iter().map(|s| s.ticket))
            .collect::<Vec<_>>();
        st.submitted.clear();
        for t in tickets {
            st.done.insert(t, Err(e.clone()));
        }
        st.broken = Some(e);
        self.shared.slot_freed.notify_all();
        for (_, caller) in st.waiting.drain() {
            caller.unpark();
        }
        drop(st);
        self.ch.close();
    }

    /// Starts what callers submitted and finishes what the server answered, until the
    /// client closes with nothing in flight, or the session breaks.
    fn serve(&mut self) -> Result<()> {
        let mut heard = Instant::now();
        loop {
            let subs = {
                let mut st = self.shared.lock();
                if st.submitted.is_empty() && self.idle() {
                    if st.closing {
                        return Ok(());
                    }
                    st = self.shared.work.wait(st).unwrap_or_else(|p| p.into_inner());
                    heard = Instant::now();
                }
                std::mem::take(&mut st.submitted)
            };
            for group in self.group(subs) {
                self.start(group)?;
            }
            if self.idle() {
                continue;
            }
            let progressed = if self.rmas.values().any(|r| !matches!(r, Rma::Sent)) {
                self.rma_step()?
            } else {
                self.take_done_rmas()?;
                self.reply_step()?
            };
            if progressed {
                heard = Instant::now();
            } else if heard.elapsed() >= self.ch.timeout {
                return Err(Error::conn(if self.rmas.is_empty() {
                    "the server did not answer"
                } else {
                    "an RMA to the server hung"
                }));
            }
        }
    }

    fn idle(&self) -> bool {
        self.inflight.is_empty() && self.rmas.is_empty()
    }

    /// The requests to send for `subs`: each alone, or adjacent writes together.
    fn group(&self, subs: VecDeque<Submit>) -> Vec<Vec<Submit>> {
        let Some(limits) = self.merge.filter(|_| subs.len() > 1) else {
            return subs.into_iter().map(|s| vec![s]).collect();
        };
        let pieces: Vec<Piece> = subs
            .iter()
            .map(|s| Piece {
                write: s.cmd == Cmd::Write,
                flags: s.flags,
                offset: s.offset,
                len: s.len,
            })
            .collect();
        let mut subs: Vec<Option<Submit>> = subs.into_iter().map(Some).collect();
        merge::plan(&pieces, limits)
            .into_iter()
            .map(|run| run.into_iter().filter_map(|k| subs[k].take()).collect())
            .collect()
    }

    /// Starts a request: a delegated WRITE's RMA first (one gathering every write of a
    /// merged group), anything else its REQUEST.
    fn start(&mut self, group: Vec<Submit>) -> Result<()> {
        let delegated = |s: &Submit| (s.cmd, self.scheme) == (Cmd::Write, Scheme::Delegated);
        if group.len() > 1 || group.first().is_some_and(delegated) {
            let parts: Vec<(u16, u32)> = group.iter().map(|s| (s.slot, s.len)).collect();
            if !self.ordered {
                return self.post_rma(&parts, true, Rma::Written(group));
            }
            self.post_rma(&parts, true, Rma::Sent)?;
            return self.send_write(group);
        }
        let Some(s) = group.into_iter().next() else {
            return Ok(());
        };
        match s.cmd {
            Cmd::Write => {
                let op = Op::of(&s);
                let data = Data::Inline(s.inline.unwrap_or_default());
                self.send_request(op, s.flags, s.offset, data)
            }
            Cmd::Read => self.start_read(s),
            _ => self.send_request(Op::of(&s), s.flags, s.offset, Data::None),
        }
    }

    fn start_read(&mut self, s: Submit) -> Result<()> {
        let op = Op::of(&s);
        let (flags, data) = match (self.scheme, self.read) {
            (Scheme::Copy, _) => (0, Data::None),
            (Scheme::Delegated, ReadMode::ServerFill) => (
                0,
                Data::Chunk {
                    chunk: s.slot,
                    at: 0,
                },
            ),
            (Scheme::Delegated, ReadMode::ServerWrite) => {
                let r = self.staging_remote[usize::from(s.slot)];
                (rflag::REMOTE, Data::Remote(sub(r, s.len)?))
            }
        };
        self.send_request(op, flags, s.offset, data)
    }

    /// RMA between the staging buffers of `parts` (each slot's first bytes, in order) and
    /// the start of the first slot's chunk: one buffer, or several gathered.
    fn post_rma(&mut self, parts: &[(u16, u32)], write: bool, then: Rma) -> Result<()> {
        let Some(&(slot, _)) = parts.first() else {
            return Ok(());
        };
        let total = parts.iter().map(|p| p.1).sum();
        let remote = sub(self.chunks[usize::from(slot)], total)?;
        let bufs = parts
            .iter()
            .map(|&(s, len)| {
                ExsBuf::new(self.staging[usize::from(s)].region().clone())
                    .slice(..len as usize)
                    .map_err(|e| Error::conn(format!("a staging slice: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        self.rmas.insert(slot, then);
        self.ch
            .socket()
            .rma_v(&self.rq, write, bufs, remote, u64::from(slot));
        Ok(())
    }

    fn send_request(&mut self, op: Op, flags: u8, offset: u64, data: Data) -> Result<()> {
        let handle = self.next_handle;
        self.next_handle += 1;
        let frame = proto::encode(&Msg::Request {
            handle,
            cmd: op.cmd,
            flags,
            offset,
            len: op.len,
            data,
        });
        let merged = (op.parts.len() as u64).saturating_sub(1);
        self.inflight.insert(handle, op);
        self.shared.sent.fetch_add(1, Ordering::Relaxed);
        self.shared.merged.fetch_add(merged, Ordering::Relaxed);
        self.ch.send_frame(&frame)
    }

    /// Waits for one of our RMAs; false if woken (a submission) first.
    fn rma_step(&mut self) -> Result<bool> {
        loop {
            match self.rq.dequeue(self.ch.timeout) {
                Some(ev) if ev.kind == EventKind::Rma => return self.rma_done(ev),
                Some(_) => continue,
                None => return Ok(false),
            }
        }
    }

    /// Acts on an RMA's completion.
    fn rma_done(&mut self, ev: ferry_exs::runtime::ExsEvent) -> Result<bool> {
        let slot = u16::try_from(ev.ctx).unwrap_or(u16::MAX);
        let then = self
            .rmas
            .remove(&slot)
            .ok_or_else(|| Error::conn("internal: an RMA nobody posted"))?;
        ev.result
            .map_err(|e| Error::conn(format!("RMA to the server's chunk: {e}")))?;
        match then {
            Rma::Written(subs) => self.send_write(subs)?,
            Rma::Sent => {}
            // The slot stays taken until its caller copied the bytes out.
            Rma::Read { ticket } => self.finish(&[(ticket, slot)], false, Ok(None)),
        }
        Ok(true)
    }

    /// Handles the RMA completions already in, without waiting.
    fn take_done_rmas(&mut self) -> Result<()> {
        while let Some(ev) = self.rq.try_dequeue() {
            if ev.kind == EventKind::Rma {
                self.rma_done(ev)?;
            }
        }
        Ok(())
    }

    /// Sends writes (one, or adjacent ones merged, in offset order) whose data is in the
    /// first one's chunk, as one WRITE.
    fn send_write(&mut self, subs: Vec<Submit>) -> Result<()> {
        let Some(first) = subs.first() else {
            return Ok(());
        };
        let (slot, flags, offset) = (first.slot, first.flags, first.offset);
        let op = Op {
            slot,
            cmd: Cmd::Write,
            len: subs.iter().map(|s| s.len).sum(),
            parts: subs.iter().map(|s| (s.ticket, s.slot)).collect(),
        };
        self.send_request(op, flags, offset, Data::Chunk { chunk: slot, at: 0 })
    }

    /// Waits for a reply; false if woken (a submission) first.
    fn reply_step(&mut self) -> Result<bool> {
        let mut frame = Vec::new();
        if !self.ch.recv_within(&mut frame, self.ch.timeout)? {
            return Ok(false);
        }
        match proto::decode(&frame) {
            Ok(Msg::Reply {
                handle,
                error,
                rekey,
                payload,
            }) => self.reply(handle, error, rekey, payload)?,
            Ok(Msg::Error { message }) => {
                return Err(Error::conn(format!(
                    "the server ended the session: {message}"
                )))
            }
            Ok(m) => return Err(Error::conn(format!("expected REPLY, got {m:?}"))),
            Err(e) => return Err(Error::conn(e.to_string())),
        }
        Ok(true)
    }

    fn reply(
        &mut self,
        handle: u64,
        error: u32,
        rekey: Option<RemoteSlice>,
        payload: Vec<u8>,
    ) -> Result<()> {
        let op = self
            .inflight
            .remove(&handle)
            .ok_or_else(|| Error::conn(format!("a REPLY to handle {handle}, not in flight")))?;
        if let Some(k) = rekey {
            match self.chunks.get_mut(usize::from(op.slot)) {
                Some(c) if k.len == u64::from(self.chunk_size) => *c = k,
                _ => return Err(Error::conn("a rekeyed chunk that is not ours")),
            }
        }
        if op.cmd != Cmd::Read {
            // A write sent right behind its RMA frees its slots once that RMA is complete.
            let since = Instant::now();
            while matches!(self.rmas.get(&op.slot), Some(Rma::Sent)) {
                if !self.rma_step()? && since.elapsed() >= self.ch.timeout {
                    return Err(Error::conn("an RMA to the server hung"));
                }
            }
            let outcome = if error == 0 {
                Ok(None)
            } else {
                Err(nbd_error(error))
            };
            self.finish(&op.parts, true, outcome);
            return Ok(());
        }
        // A read's slot is freed by its caller, once it copied the bytes out (or failed
        // with the others of the call).
        match (error, self.scheme, self.read) {
            (0, Scheme::Copy, _) => self.finish(&op.parts, false, Ok(Some(payload))),
            // The chunk stays ours until this read of it completes: the fence that keeps
            // a later request from overwriting it first.
            (0, Scheme::Delegated, ReadMode::ServerFill) => {
                let ticket = op.parts[0].0;
                self.post_rma(&[(op.slot, op.len)], false, Rma::Read { ticket })?
            }
            (0, Scheme::Delegated, ReadMode::ServerWrite) => {
                self.finish(&op.parts, false, Ok(None))
            }
            _ => self.finish(&op.parts, false, Err(nbd_error(error))),
        }
        Ok(())
    }

    /// Hands a request's outcome to the callers of every part (by ticket), freeing their
    /// slots if `free`.
    fn finish(&self, parts: &[(u64, u16)], free: bool, outcome: Outcome) {
        let mut callers = Vec::with_capacity(parts.len());
        let mut st = self.shared.lock();
        for &(ticket, slot) in parts {
            if free {
                st.slots.release(slot);
                self.shared.slot_freed.notify_one();
            }
            st.done.insert(ticket, outcome.clone());
            callers.extend(st.waiting.remove(&ticket));
        }
        drop(st);
        for c in callers {
            c.unpark();
        }
    }
}

fn stopped_answering() -> Error {
    Error::conn("the block client's driver stopped answering")
}

/// The first `len` bytes of `r`.
fn sub(r: RemoteSlice, len: u32) -> Result<RemoteSlice> {
    r.sub(0, u64::from(len))
        .map_err(|e| Error::conn(format!("a chunk range: {e}")))
}

/// A request's NBD error as the caller sees it.
fn nbd_error(errno: u32) -> Error {
    let kind = match errno {
        crate::nbd::consts::EPERM => Kind::Permission,
        crate::nbd::consts::EINVAL => Kind::Usage,
        _ => Kind::Io,
    };
    Error::new(kind, format!("the server answered error {errno}"))
}
