//! The block fabric face: one thread per session, which registers and delegates the
//! session's chunk pool, then reads its requests and answers them, with a few workers
//! that carry out the reads and writes meanwhile (replies out of order, matched by handle).

use std::io;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_exs::proto::EventKind;
use ferry_exs::runtime::{EventQueue, ExsBuf, ExsSocket};
use ferry_fabric::{Access, Buffer, RemoteSlice};
use ferry_service::admit::{Admission, Handshake};
use ferry_service::auth::{AuthConfig, Principal};
use ferry_service::channel::Channel;
use ferry_service::drain::{Drain, DrainReport};
use ferry_service::registry::{Conn, Service};
use ferry_service::{Error, Kind, Result};

use super::pool;
use super::proto::{self, rflag, Cmd, Data, Msg, ReadMode, Scheme};
use crate::backend::{nbd_errno, Backend, Zeroing};
use crate::nbd::consts;
use crate::server::Export;

/// How long the server waits for its own RMA into a client's memory (RTRS reads).
const RMA_TIMEOUT: Duration = Duration::from_secs(30);

/// The pool delegated to each session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Chunks (and credits).
    pub chunks: u16,
    /// Bytes per chunk: the largest request.
    pub chunk_size: u32,
}

impl PoolConfig {
    /// The pool `[block]` configures (`pool_chunks`, `chunk_size`).
    pub fn of(cfg: &crate::config::BlockConfig) -> PoolConfig {
        PoolConfig {
            chunks: cfg.pool_chunks,
            chunk_size: cfg.chunk_size,
        }
    }
}

impl Default for PoolConfig {
    /// 16 chunks of 1 MiB: 1 MiB requests at queue depth 16.
    fn default() -> Self {
        PoolConfig {
            chunks: 16,
            chunk_size: 1 << 20,
        }
    }
}

/// The `block` face on the fabric port.
pub struct FabricService {
    exports: Vec<Export>,
    auth: AuthConfig,
    admission: Arc<Admission>,
    pool: PoolConfig,
    /// The sessions being served, for the drain: a process that exits while a session's
    /// thread still closes its endpoint races libfabric's own exit-time teardown.
    sessions: Drain,
}

impl FabricService {
    /// Serves `exports` to clients authenticated against `auth`, each session delegated a
    /// pool as `pool` says (clamped to the protocol's bounds).
    pub fn new(
        exports: Vec<Export>,
        auth: AuthConfig,
        admission: Arc<Admission>,
        pool: PoolConfig,
    ) -> FabricService {
        let pool = PoolConfig {
            chunks: pool.chunks.clamp(1, proto::MAX_CHUNKS),
            chunk_size: pool.chunk_size.clamp(proto::MIN_CHUNK, proto::MAX_CHUNK),
        };
        FabricService {
            exports,
            auth,
            admission,
            pool,
            sessions: Drain::new(),
        }
    }

    /// One session: HELLO, the checks, the delegation, then its requests. `floor_authed`:
    /// the floor already accepted the client's token (proved in its SELECT over TLS).
    fn session(
        &self,
        ch: &mut Channel,
        wake: EventQueue,
        hs: Handshake,
        first: Option<Vec<u8>>,
        floor: Option<Principal>,
        sealed: bool,
    ) -> Result<()> {
        let bytes = match first {
            Some(b) => b,
            None => {
                ch.post_ring(1, 2 * proto::MAX_TEXT + 64)?;
                ch.recv_first_in(&hs, "HELLO")?
            }
        };
        let Ok(Msg::Hello {
            major,
            scheme,
            read,
            always_invalidate,
            export,
            token,
            ..
        }) = proto::decode(&bytes)
        else {
            return refuse(ch, "expected HELLO".into());
        };
        if major != proto::VERSION_MAJOR {
            return refuse(
                ch,
                format!(
                    "this server speaks ferry block protocol {}.{}, the client {major}.x",
                    proto::VERSION_MAJOR,
                    proto::VERSION_MINOR
                ),
            );
        }
        if self.sessions.draining() {
            return refuse(ch, "the server is shutting down".into());
        }
        let principal = match floor {
            Some(p) => p,
            None => match self.admission.authenticate(&hs.addr, &self.auth, &token) {
                Ok(p) => p,
                Err(r) => return refuse(ch, r.message.to_string()),
            },
        };
        // A read-only credential sees every export read-only.
        let readonly_for = |exp: &Export| exp.info.readonly || principal.rights.read_only;
        let Some(exp) = self.exports.iter().find(|e| e.info.name == export) else {
            return refuse(ch, format!("no export named {export:?}"));
        };
        if exp.tls_required && !sealed {
            return refuse(
                ch,
                format!("export {export:?} requires TLS: connect without --insecure-clear"),
            );
        }
        let _slot = match hs.admit(usize::from(self.pool.chunks), self.pool.chunk_size) {
            Ok(s) => s,
            Err(r) => return refuse(ch, r.message.to_string()),
        };
        // Authenticated: the client may now reach this session's chunks by RMA.
        ch.socket().enable_remote_access();
        let chunks = match scheme {
            Scheme::Delegated => Chunks::register(ch.socket(), self.pool)?,
            Scheme::Copy => Chunks::default(),
        };
        let frame_max = proto::HEADER_LEN
            + proto::REQUEST_LEN
            + RemoteSlice::WIRE_LEN
            + match scheme {
                Scheme::Copy => self.pool.chunk_size as usize,
                Scheme::Delegated => 0,
            };
        ch.post_ring(usize::from(self.pool.chunks), frame_max)?;
        ch.send_frame(&proto::encode(&Msg::Delegate {
            major: proto::VERSION_MAJOR,
            minor: proto::VERSION_MINOR,
            size: exp.info.size,
            readonly: readonly_for(exp),
            credits: self.pool.chunks,
            chunk_size: self.pool.chunk_size,
            chunks: chunks.remote.clone(),
        }))?;
        let mut s = Session {
            ch,
            wake,
            backend: exp.backend.as_ref(),
            size: exp.info.size,
            readonly: readonly_for(exp),
            chunk_size: self.pool.chunk_size,
            scheme,
            read,
            always_invalidate,
            chunks,
            rtrs: Vec::new(),
            rq: EventQueue::new().map_err(|e| Error::io("create event queue", &e))?,
        };
        s.serve(usize::from(self.pool.chunks).min(MAX_WORKERS))
    }
}

impl Service for FabricService {
    fn serve_connection(&self, conn: Conn) {
        let _live = self.sessions.count();
        let Conn {
            sock,
            queue,
            hs,
            peer,
            first,
            principal,
            secure,
        } = conn;
        let wake = queue.clone();
        let mut ch = Channel::new(sock, queue);
        let sealed = secure.is_some();
        ch.seal(secure);
        match self.session(&mut ch, wake, hs, first, principal, sealed) {
            Ok(()) => tracing::debug!("{peer}: block session done"),
            Err(e) => tracing::info!("{peer}: block session ended: {e}"),
        }
        // Closing drops the session's registrations with it: its keys die here.
        ch.close();
    }

    fn begin_drain(&self) {
        self.sessions.begin();
    }

    /// Waits up to `grace` for the sessions to end (their clients detach); sessions still
    /// attached then are reported abandoned: a session stops only when its client goes.
    fn drain(&self, grace: Duration) -> DrainReport {
        self.sessions.wait(grace)
    }
}

/// Answers a refused HELLO and ends the session (after a moment for the answer to leave).
fn refuse(ch: &Channel, message: String) -> Result<()> {
    let _ = ch.send_frame(&proto::encode(&Msg::Error {
        message: message.clone(),
    }));
    std::thread::sleep(Duration::from_millis(50));
    Err(Error::new(Kind::Usage, message))
}

/// A session's delegated chunks: its own registrations, granted on its connection only.
#[derive(Default)]
struct Chunks {
    bufs: Vec<ExsBuf>,
    remote: Vec<RemoteSlice>,
}

/// The rights a chunk gives the client: it writes into it and reads from it.
const CHUNK_ACCESS: Access = Access::ALL;

impl Chunks {
    fn register(sock: &ExsSocket, cfg: PoolConfig) -> Result<Chunks> {
        let mut c = Chunks::default();
        for _ in 0..cfg.chunks {
            let buf = sock
                .alloc_with(cfg.chunk_size as usize, CHUNK_ACCESS)
                .map_err(|e| Error::conn(format!("register a chunk: {e}")))?;
            let remote = grant(sock, &buf)?;
            c.bufs.push(buf);
            c.remote.push(remote);
        }
        Ok(c)
    }

    /// Re-registers chunk `i` (the same memory, a new key) and drops the old registration,
    /// whose key the client can no longer use: RTRS's `always_invalidate`.
    fn rotate(&mut self, sock: &ExsSocket, i: usize) -> Result<RemoteSlice> {
        let memory = self.bufs[i].buffer().clone();
        let buf = sock
            .register_with(memory, CHUNK_ACCESS)
            .map_err(|e| Error::conn(format!("re-register a chunk: {e}")))?;
        let remote = grant(sock, &buf)?;
        self.bufs[i] = buf;
        self.remote[i] = remote;
        Ok(remote)
    }
}

/// Grants `buf` to the connection's peer and returns its remote range.
fn grant(sock: &ExsSocket, buf: &ExsBuf) -> Result<RemoteSlice> {
    sock.grant(buf)
        .map_err(|e| Error::conn(format!("grant a chunk: {e}")))?;
    buf.region()
        .remote(..)
        .map_err(|e| Error::conn(format!("a chunk's remote range: {e}")))
}

/// One session being served.
struct Session<'a> {
    ch: &'a mut Channel,
    /// The channel's event queue: workers wake the session's reader through it.
    wake: EventQueue,
    backend: &'a dyn Backend,
    size: u64,
    readonly: bool,
    chunk_size: u32,
    scheme: Scheme,
    read: ReadMode,
    always_invalidate: bool,
    chunks: Chunks,
    /// Registered buffers RTRS reads are read into and RMA-written from, free for the
    /// next (as many as such reads were ever in flight at once).
    rtrs: Vec<ExsBuf>,
    /// Where the server's own RMAs complete.
    rq: EventQueue,
}

/// What a request got: the NBD errno (0: done), and the copy scheme's READ data.
type Outcome = (u32, Option<RemoteSlice>, Vec<u8>);

/// Workers per session at most: enough to keep a few backend reads and writes (and a
/// FLUSH) going while the reader takes the next requests, few enough for a small machine.
const MAX_WORKERS: usize = 4;

/// A request checked and handed to a worker.
struct Job {
    handle: u64,
    cmd: Cmd,
    flags: u8,
    offset: u64,
    len: u32,
    data: JobData,
}

/// Where a job's data is (WRITE), or goes (READ).
enum JobData {
    /// Nowhere (FLUSH, TRIM, WRITE_ZEROES), or in the reply (a copy scheme READ).
    None,
    /// In a delegated chunk: a WRITE goes to the backend from the registered memory itself;
    /// a READ fills it (the client RMA-reads it after the reply).
    Chunk { chunk: u16, memory: Buffer, at: u32 },
    /// Inside the request (copy scheme WRITE).
    Inline(Vec<u8>),
    /// The client's registered range a READ's bytes are RMA-written into (RTRS), by the
    /// reader once the worker has read them into `buf`, a registered buffer of the
    /// session's own (never granted: nothing but this job touches it).
    Remote { remote: RemoteSlice, buf: ExsBuf },
}

/// A job done, for the reader to answer.
struct Done {
    handle: u64,
    cmd: Cmd,
    data: JobData,
    /// What the backend said, and a READ's bytes when the reply (copy scheme) or the
    /// reader's RMA (RTRS) carries them.
    result: io::Result<Vec<u8>>,
}

impl Job {
    /// Carries the job out on `backend`; a READ's bytes come back unless they went into
    /// its chunk. `scratch`: the worker's own buffer for a READ into a chunk.
    fn run(&self, backend: &dyn Backend, scratch: &mut Vec<u8>) -> io::Result<Vec<u8>> {
        let fua = self.flags & rflag::FUA != 0;
        let none = |r: io::Result<()>| r.map(|()| Vec::new());
        match (self.cmd, &self.data) {
            (Cmd::Read, JobData::Chunk { memory, at, .. }) => {
                scratch.resize(self.len as usize, 0);
                backend.read_at(scratch, self.offset)?;
                memory.write_at(*at as usize, scratch);
                Ok(Vec::new())
            }
            (Cmd::Read, JobData::Remote { buf, .. }) => {
                let b = buf.buffer();
                b.with_bytes_mut(buf.offset(), self.len as usize, |out| {
                    backend.read_at(out, self.offset)
                })?;
                Ok(Vec::new())
            }
            (Cmd::Read, _) => {
                let mut out = vec![0; self.len as usize];
                backend.read_at(&mut out, self.offset).map(|()| out)
            }
            (Cmd::Write, JobData::Chunk { memory, at, .. }) => {
                none(memory.with_bytes(*at as usize, self.len as usize, |b| {
                    backend.write_at(b, self.offset, fua)
                }))
            }
            (Cmd::Write, JobData::Inline(b)) => none(backend.write_at(b, self.offset, fua)),
            (Cmd::Flush, _) => none(backend.flush()),
            (Cmd::Trim, _) => none(backend.trim(self.offset, u64::from(self.len), fua)),
            (Cmd::WriteZeroes, _) => {
                let how = Zeroing {
                    may_trim: self.flags & rflag::NO_HOLE == 0,
                    fast: false,
                    fua,
                };
                none(backend.write_zeroes(self.offset, u64::from(self.len), how))
            }
            // Refused by the scheme check before a job is made.
            (Cmd::Write, JobData::None | JobData::Remote { .. }) => none(unreachable_scheme()),
        }
    }

    fn done(self, result: io::Result<Vec<u8>>) -> Done {
        Done {
            handle: self.handle,
            cmd: self.cmd,
            data: self.data,
            result,
        }
    }
}

/// A worker: takes jobs until the reader is gone, hands each result back and wakes the
/// reader (which may be waiting for the client's next request).
fn work(
    backend: &dyn Backend,
    jobs: &Mutex<mpsc::Receiver<Job>>,
    done: mpsc::Sender<Done>,
    wake: &EventQueue,
) {
    let mut scratch = Vec::new();
    loop {
        let job = match jobs.lock().unwrap_or_else(|p| p.into_inner()).recv() {
            Ok(j) => j,
            Err(_) => return,
        };
        let result = job.run(backend, &mut scratch);
        if done.send(job.done(result)).is_err() {
            return;
        }
        wake.wake();
    }
}

/// What the reader does with a request it has checked.
enum Next {
    /// Answer now (an error found by the checks).
    Reply(Outcome),
    /// Hand to a worker.
    Job(Job),
}

impl Session<'_> {
    /// Serves requests until the client goes, or breaks the protocol (which ends this
    /// session alone: its error says why). This thread reads and checks every request and
    /// sends every reply (and makes an RTRS READ's RMA); the backend work of every request
    /// goes to a few workers, so the next requests are read while the backend works, and
    /// their replies go out as they finish (out of order: the client matches them by
    /// handle). A FLUSH covers every write replied to before it arrived: those are in the
    /// backend already.
    fn serve(&mut self, workers: usize) -> Result<()> {
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let (done_tx, done_rx) = mpsc::channel::<Done>();
        let job_rx = Mutex::new(job_rx);
        let (backend, wake) = (self.backend, self.wake.clone());
        std::thread::scope(|s| {
            let mut started = 0;
            for _ in 0..workers {
                let (done, jobs, wake) = (done_tx.clone(), &job_rx, &wake);
                let spawned = std::thread::Builder::new()
                    .name("ferry-block-io".into())
                    .spawn_scoped(s, move || work(backend, jobs, done, wake));
                match spawned {
                    Ok(_) => started += 1,
                    Err(e) => {
                        // Fewer workers (or none: the reader runs the jobs) all the same.
                        tracing::warn!("cannot start a block session worker: {e}");
                        break;
                    }
                }
            }
            drop(done_tx);
            let jobs = (started > 0).then_some(&job_tx);
            let r = self.read_loop(jobs, &done_rx);
            // The workers finish the jobs they hold, then see the queue closed.
            drop(job_tx);
            r
        })
    }

    /// The reader: requests in, replies out, until the client goes or breaks the protocol.
    fn read_loop(
        &mut self,
        jobs: Option<&mpsc::Sender<Job>>,
        done: &mpsc::Receiver<Done>,
    ) -> Result<()> {
        let mut pending = 0usize;
        let mut heard = Instant::now();
        let mut frame = Vec::new();
        loop {
            while let Ok(d) = done.try_recv() {
                pending = pending.saturating_sub(1);
                self.answer_done(d)?;
            }
            let wait = self.ch.timeout;
            match self.ch.recv_within(&mut frame, wait) {
                Ok(true) => heard = Instant::now(),
                // Woken by a worker, or the client is quiet.
                Ok(false) if pending > 0 || heard.elapsed() < wait => continue,
                Ok(false) => {
                    tracing::debug!("block session: the client was silent for {wait:?}");
                    return Ok(());
                }
                Err(e) => {
                    // The client went (closed, or its connection broke): the session's end.
                    tracing::debug!("block session: {e}");
                    return Ok(());
                }
            }
            let msg = match proto::decode(&frame) {
                Ok(m) => m,
                Err(e) => return self.violation(e.to_string()),
            };
            let Msg::Request {
                handle,
                cmd,
                flags,
                offset,
                len,
                data,
            } = msg
            else {
                return self.violation("expected REQUEST".into());
            };
            let job = match self.request(handle, cmd, flags, offset, len, data) {
                Ok(Next::Reply(o)) => {
                    self.send_reply(handle, o)?;
                    continue;
                }
                Ok(Next::Job(j)) => j,
                Err(Violation(m)) => return self.violation(m),
            };
            match jobs {
                Some(tx) => match tx.send(job) {
                    Ok(()) => pending += 1,
                    Err(mpsc::SendError(job)) => self.run_here(job)?,
                },
                None => self.run_here(job)?,
            }
        }
    }

    /// Runs a job on the reader itself (no worker could be started).
    fn run_here(&mut self, job: Job) -> Result<()> {
        let result = job.run(self.backend, &mut Vec::new());
        self.answer_done(job.done(result))
    }

    /// Answers a job done: an RTRS READ's bytes RMA-written to the client first (a range
    /// the fabric refuses ends the session), a chunk's key rotated first if the session
    /// asked.
    fn answer_done(&mut self, d: Done) -> Result<()> {
        let outcome = match (d.data, d.result) {
            (JobData::Chunk { chunk, .. }, r) => self.after_chunk_io(r.map(drop), chunk),
            (JobData::Remote { buf, .. }, Err(e)) => {
                self.rtrs.push(buf);
                (nbd_errno(&e), None, Vec::new())
            }
            (_, Err(e)) => (nbd_errno(&e), None, Vec::new()),
            (JobData::Remote { remote, buf }, Ok(_)) => match self.write_remote(remote, buf) {
                Ok(()) => (0, None, Vec::new()),
                Err(Violation(m)) => return self.violation(m),
            },
            // A copy scheme READ's bytes go in the reply.
            (JobData::None, Ok(bytes)) if d.cmd == Cmd::Read => (0, None, bytes),
            (JobData::None | JobData::Inline(_), Ok(_)) => (0, None, Vec::new()),
        };
        self.send_reply(d.handle, outcome)
    }

    fn send_reply(&self, handle: u64, (error, rekey, payload): Outcome) -> Result<()> {
        self.ch.send_frame(&proto::encode(&Msg::Reply {
            handle,
            error,
            rekey,
            payload,
        }))
    }

    /// Tells the client why its session ends, and ends it.
    fn violation(&self, message: String) -> Result<()> {
        let _ = self.ch.send_frame(&proto::encode(&Msg::Error {
            message: message.clone(),
        }));
        Err(Error::conn(message))
    }

    /// Checks a request: a violation ends the session; an error is answered here; anything
    /// else becomes a job.
    fn request(
        &mut self,
        handle: u64,
        cmd: Cmd,
        flags: u8,
        offset: u64,
        len: u32,
        data: Data,
    ) -> std::result::Result<Next, Violation> {
        if matches!(cmd, Cmd::Read | Cmd::Write) && len > self.chunk_size {
            return Err(Violation(format!(
                "a {len}-byte request is larger than the {}-byte chunk",
                self.chunk_size
            )));
        }
        if let Data::Chunk { chunk, at } = data {
            if self.scheme != Scheme::Delegated {
                return Err(Violation("a chunk named in a copy-based session".into()));
            }
            pool::check(self.chunks.bufs.len(), self.chunk_size, chunk, at, len)
                .map_err(|e| Violation(e.to_string()))?;
        }
        let scheme_fits = match (&data, cmd) {
            (Data::Inline(_), _) | (Data::None, Cmd::Read) => self.scheme == Scheme::Copy,
            (Data::Remote(_), _) => {
                self.scheme == Scheme::Delegated && self.read == ReadMode::ServerWrite
            }
            (Data::None, Cmd::Write) => false,
            _ => true,
        };
        if !scheme_fits {
            return Err(Violation(format!(
                "a {cmd:?} whose data does not fit the session's scheme"
            )));
        }
        let writes = !matches!(cmd, Cmd::Read | Cmd::Flush);
        if writes && self.readonly {
            return Ok(Next::Reply((consts::EPERM, None, Vec::new())));
        }
        let inside = offset
            .checked_add(u64::from(len))
            .is_some_and(|end| end <= self.size);
        if !inside && cmd != Cmd::Flush {
            return Ok(Next::Reply((consts::EINVAL, None, Vec::new())));
        }
        let data = match data {
            Data::Chunk { chunk, at } => JobData::Chunk {
                chunk,
                memory: self.chunks.bufs[usize::from(chunk)].buffer().clone(),
                at,
            },
            Data::Inline(b) => JobData::Inline(b),
            Data::Remote(remote) => JobData::Remote {
                remote,
                buf: self.rtrs_buf()?,
            },
            Data::None => JobData::None,
        };
        Ok(Next::Job(Job {
            handle,
            cmd,
            flags,
            offset,
            len,
            data,
        }))
    }

    /// A registered buffer for an RTRS read: a free one, or a new one.
    fn rtrs_buf(&mut self) -> std::result::Result<ExsBuf, Violation> {
        match self.rtrs.pop() {
            Some(b) => Ok(b),
            None => self
                .ch
                .socket()
                .alloc_with(self.chunk_size as usize, Access::LOCAL)
                .map_err(|e| Violation(format!("register an RTRS buffer: {e}"))),
        }
    }

    /// RMA-writes the first `remote.len` bytes of `buf` into the client's `remote` range
    /// and waits for it (then `buf` is free again): a range the fabric refuses (not the
    /// client's, or not granted) ends the session.
    fn write_remote(
        &mut self,
        remote: RemoteSlice,
        buf: ExsBuf,
    ) -> std::result::Result<(), Violation> {
        let whole = buf.region().clone();
        let n = usize::try_from(remote.len).unwrap_or(usize::MAX);
        let part = buf.slice(..n).map_err(|e| Violation(e.to_string()))?;
        self.ch.socket().rma(&self.rq, true, part, remote, 0);
        let ev = loop {
            match self.rq.dequeue(RMA_TIMEOUT) {
                Some(ev) if ev.kind == EventKind::Rma => break ev,
                Some(_) => continue,
                None => return Err(Violation("the RMA into the client's memory hung".into())),
            }
        };
        self.rtrs.push(ExsBuf::new(whole));
        ev.result
            .map_err(|e| Violation(format!("the client's range was refused: {e}")))
    }

    /// The reply of an I/O on a chunk, after rotating its key if the session asked.
    fn after_chunk_io(&mut self, r: io::Result<()>, chunk: u16) -> Outcome {
        let rekey = if self.always_invalidate {
            match self.chunks.rotate(self.ch.socket(), usize::from(chunk)) {
                Ok(k) => Some(k),
                Err(e) => {
                    tracing::warn!("rotate a chunk's key: {e}");
                    return (consts::EIO, None, Vec::new());
                }
            }
        } else {
            None
        };
        (errno(r), rekey, Vec::new())
    }
}

/// A request the session cannot trust: it ends the session.
struct Violation(String);

fn errno(r: io::Result<()>) -> u32 {
    match r {
        Ok(()) => 0,
        Err(e) => nbd_errno(&e),
    }
}

/// A WRITE without data: refused by the scheme check before it gets here.
fn unreachable_scheme() -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::InvalidInput))
}
