//! The collective I/O server: the floor's service `cio`.
//!
//! Each rank's connection runs on its own thread (the floor's). A connection authenticates
//! with its OPEN's token ([`Admission::authenticate`], as file transfer's HELLO does), joins
//! the session of its job and path, and then serves the rank's requests in order: a
//! collective one is handed to the session ([`crate::session::Session`]) and waits until
//! every rank made it; the thread of the rank that completes it runs the file action (one
//! placement of every rank's pieces, one read of the regions they cover) and each waiting
//! thread answers its own rank. Independent requests are served on the spot. A connection
//! that breaks the protocol ends only itself; its session learns the rank is gone.

mod behind;
mod files;
mod pool;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_dtype::Datatype;
use ferry_exs::runtime::ExsListener;
use ferry_service::admit::{Admission, Handshake};
use ferry_service::audit::{Audit, Record};
use ferry_service::auth::AuthConfig;
use ferry_service::channel::Channel;
use ferry_service::drain::{Drain, DrainReport};
use ferry_service::registry::{Conn, Registry, Service};

use behind::Behind;
pub use files::Exports;
use pool::Pool;

use crate::config::CioConfig;
use crate::error::{CioError, ErrorClass, Result};
use crate::proto::{self, amode, Desc, Msg, HEADER_LEN, MAX_CACHED_TYPES};
use crate::session::{self, Action, CallKind, Output, Rank, Session, Work};
use crate::view::{Extents, View};

/// The name the face is hosted under in a server's registry.
pub const SERVICE: &str = "cio";

/// Receive buffers each connection keeps posted (each a chunk and a header).
const RING: usize = 3;

/// How often a rank waiting in a collective call looks at the session's clock.
const TICK: Duration = Duration::from_millis(200);

/// How long a rank may send nothing between requests (it computes between I/O phases);
/// a rank whose process died is noticed at once, by its connection closing.
const IDLE: Duration = Duration::from_secs(3600);

/// How often a connection waiting for its rank's next request looks at the drain.
const RECV_SLICE: Duration = Duration::from_millis(250);

/// How long a connection whose last answer went out waits for the client to close first.
/// Closing an EXS socket cancels the sends still queued on it (waiting for the peer's
/// credits), so a server closing right after answering CLOSE could lose that answer and
/// the client would see its close fail with "the peer closed the connection"; the client
/// closes once it has the answer.
const CLOSE_LINGER: Duration = Duration::from_secs(2);

/// A running collective I/O face.
pub struct Server {
    cfg: CioConfig,
    exports: Exports,
    auth: AuthConfig,
    admission: Arc<Admission>,
    /// Live sessions by (job, path).
    sessions: Mutex<HashMap<(u64, String), Arc<Shared>>>,
    /// Requests in flight, and the drain.
    drain: Drain,
    /// Where a record of each open and close goes (the daemon's audit log).
    audit: Arc<Audit>,
}

/// One session shared by its ranks' connections.
struct Shared {
    path: String,
    st: Mutex<State>,
    /// The buffers of finished calls, for the next ones.
    pool: Pool,
    /// The collective write answered and not yet written, if any.
    behind: Behind,
}

struct State {
    machine: Session,
    /// Per rank: where its answer goes while it waits in a collective call.
    waiters: Vec<Option<mpsc::Sender<Outcome>>>,
    /// Per rank: a live connection holds it.
    attached: Vec<bool>,
    /// The file, once the collective open ran.
    file: Option<Arc<std::fs::File>>,
    /// Opened with DELETE_ON_CLOSE: the collective close removes it.
    delete_on_close: bool,
}

/// One rank's answer to a collective call.
type Outcome = Result<Reply>;

/// What a rank is answered.
#[derive(Debug)]
enum Reply {
    /// DONE with a byte count (OPEN: the file's size).
    Done(u64),
    /// The bytes of a read, then DONE.
    Stream(Vec<u8>),
}

/// A file action to run outside the session's lock, and whom to answer.
struct Job {
    action: Action,
    answer: Vec<Option<mpsc::Sender<Outcome>>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Sends the session's outputs on their way: failures to the ranks they name, actions
/// out as jobs to run.
fn route(st: &mut State, outs: Vec<Output>) -> Vec<Job> {
    let mut jobs = Vec::new();
    for out in outs {
        match out {
            Output::Fail { ranks, error } => {
                for r in ranks {
                    if let Some(tx) = st.waiters.get_mut(r as usize).and_then(Option::take) {
                        let _ = tx.send(Err(error.clone()));
                    }
                }
            }
            Output::Run { action, .. } => jobs.push(Job {
                action,
                answer: st.waiters.iter_mut().map(Option::take).collect(),
            }),
        }
    }
    jobs
}

/// The bytes a read or write of `len` moved: all of them once it succeeded.
fn moved(outcome: &Outcome, len: u64) -> u64 {
    if outcome.is_ok() {
        len
    } else {
        0
    }
}

/// One rank's connection once open.
struct RankConn {
    shared: Arc<Shared>,
    rank: Rank,
    amode: u32,
    view: View,
    /// Datatype descriptions received, by BLAKE3 (the decoding's outcome).
    types: HashMap<[u8; 32], Result<Datatype>>,
    /// Views set before, flattened (HDF5 sets the same view again in every call).
    views: Views,
    chunk: usize,
    /// Bytes this rank read and wrote since its open, for the audit's close record.
    moved: u64,
    /// The client takes a read's answer inline (DATA_DONE; its OPEN said 1.2 or later).
    inline_answers: bool,
}

impl Server {
    /// The face over the server's exported roots (`(name, directory)`), behind its
    /// authentication and admission, recording its opens and closes in `audit`.
    pub fn new(
        cfg: CioConfig,
        roots: &[(String, PathBuf)],
        (auth, admission): (AuthConfig, Arc<Admission>),
        audit: Arc<Audit>,
    ) -> Result<Arc<Server>> {
        cfg.validate()?;
        let exports = Exports::open(roots.iter().map(|(n, p)| (n.as_str(), p.as_path())))?;
        Ok(Arc::new(Server {
            cfg,
            exports,
            auth,
            admission,
            sessions: Mutex::new(HashMap::new()),
            drain: Drain::new(),
            audit,
        }))
    }

    /// Serves `cio` alone on `listeners` until `quit` is set (a server of its own, for
    /// tests and embedding, secured with the identity of the default state directory;
    /// `ferry serve` hosts it beside file transfer).
    pub fn serve_until(
        self: &Arc<Self>,
        listeners: &[ExsListener],
        quit: &AtomicBool,
    ) -> Result<()> {
        // TLS with the identity in the default state directory ($FERRY_STATE_DIR).
        let security = ferry_service::secure::SecurityConfig::default().load()?;
        let mut registry = Registry::new(self.auth.clone(), security);
        registry.add(SERVICE, self.clone())?;
        ferry_service::serve::serve_until(&Arc::new(registry), &self.admission, listeners, quit);
        Ok(())
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<(u64, String), Arc<Shared>>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves one connection: OPEN, then requests until CLOSE or an error.
    fn connection(
        &self,
        ch: &mut Channel,
        hs: Handshake,
        first: Option<Vec<u8>>,
        peer: &str,
    ) -> Result<()> {
        let bytes = first_frame(ch, &hs, first)?;
        let (major, minor, job, rank, size, mode, path, token) = match decode(&bytes)?.0 {
            Msg::Open {
                major,
                minor,
                job,
                rank,
                size,
                amode,
                path,
                token,
                ..
            } => (major, minor, job, rank, size, amode, path, token),
            m => return Err(CioError::conn(format!("expected OPEN, got {m:?}"))),
        };
        if major != proto::VERSION_MAJOR {
            return refuse_open(
                ch,
                CioError::new(
                    ErrorClass::Version,
                    format!(
                        "this server speaks ferry collective I/O protocol {}.{}, the client {major}.x: upgrade the older side",
                        proto::VERSION_MAJOR,
                        proto::VERSION_MINOR
                    ),
                ),
            );
        }
        let principal = match self.admission.authenticate(&hs.addr, &self.auth, &token) {
            Ok(p) => p,
            Err(r) => return refuse_open(ch, CioError::new(ErrorClass::Access, r.message)),
        };
        if let Err(e) = self.exports.permit(&principal.rights, &path, mode) {
            return refuse_open(ch, e);
        }
        if self.drain.draining() {
            return refuse_open(
                ch,
                CioError::new(
                    ErrorClass::Busy,
                    "the server is shutting down; try again later",
                ),
            );
        }
        let _slot = match hs.admit(RING, self.cfg.chunk) {
            Ok(s) => s,
            Err(r) => return refuse_open(ch, CioError::new(ErrorClass::Busy, r.message)),
        };
        // Authenticated: the client may now reach this connection's buffers by RMA.
        ch.socket().enable_remote_access();
        ch.post_ring(
            RING,
            (HEADER_LEN + self.cfg.chunk as usize).max(proto::MAX_SET_VIEW),
        )?;
        if size == 0 || rank >= size || size > proto::MAX_RANKS {
            return refuse_open(
                ch,
                CioError::new(
                    ErrorClass::Arg,
                    format!(
                        "rank {rank} of {size}: a rank must be below the rank count, which is at most {}",
                        proto::MAX_RANKS
                    ),
                ),
            );
        }
        let shared = match self.join(job, &path, rank, size) {
            Ok(s) => s,
            Err(e) => return refuse_open(ch, e),
        };
        let _attached = Attached {
            server: self,
            shared: shared.clone(),
            rank,
            job,
        };
        let mut me = RankConn {
            shared,
            rank,
            amode: mode,
            view: View::default(),
            types: HashMap::new(),
            views: Views::default(),
            chunk: self.cfg.chunk as usize,
            moved: 0,
            inline_answers: minor >= proto::MINOR_INLINE,
        };
        let audit = |op, bytes, (time, began): (std::time::SystemTime, Instant), error| {
            self.audit.write(
                &Record {
                    time,
                    peer: peer.to_string(),
                    credential: principal.id.clone(),
                    face: SERVICE,
                    op,
                    path: path.clone(),
                    bytes,
                    duration: began.elapsed(),
                    error,
                    read_written: None,
                    unread: 0,
                },
                false,
            )
        };
        let opening = (std::time::SystemTime::now(), Instant::now());
        // An open file is in flight for the drain until it is closed: a drain lets the
        // job finish its I/O through the grace period, then ends the connection between
        // requests (the job's other ranks fail with RankLost). Counted before the OPEN is
        // answered, so a drain that follows the answer finds it.
        let _open = self.drain.count();
        let work = Exports::check_amode(mode).map(|()| Work::Value(u64::from(mode)));
        match self.collective(&me, CallKind::Open, work) {
            Ok(Reply::Done(size)) => send(
                ch,
                &Msg::Opened {
                    major: proto::VERSION_MAJOR,
                    minor: proto::VERSION_MINOR,
                    chunk: self.cfg.chunk,
                    size,
                },
            )?,
            Ok(Reply::Stream(_)) => {
                return Err(CioError::conn("internal: OPEN answered with data"))
            }
            Err(e) => {
                audit("open", 0, opening, Some(e.to_string()));
                send_error(ch, &e)?;
                return Ok(());
            }
        }
        audit("open", 0, opening, None);
        tracing::debug!("job {job:#x} rank {rank}/{size}: opened {path}");
        let res = self.requests(ch, &mut me);
        // The close: what this rank moved while the file was open, and how it ended (a
        // connection that ends without CLOSE says why).
        let error = res
            .as_ref()
            .err()
            .map(|e| format!("ended without CLOSE: {e}"));
        audit("close", me.moved, opening, error);
        res
    }

    /// Joins (or starts) the session of `job` and `path` as `rank` of `size`.
    fn join(&self, job: u64, path: &str, rank: Rank, size: Rank) -> Result<Arc<Shared>> {
        let mut map = self.sessions();
        let key = (job, path.to_string());
        let live = map
            .get(&key)
            .filter(|s| !s.lock().machine.is_over())
            .cloned();
        let shared = match live {
            Some(s) => s,
            None => {
                let s = Arc::new(Shared {
                    path: path.to_string(),
                    pool: Pool::new(size as usize),
                    behind: Behind::new(self.cfg.write_behind),
                    st: Mutex::new(State {
                        machine: Session::new(size, self.cfg.timeout()),
                        waiters: (0..size).map(|_| None).collect(),
                        attached: vec![false; size as usize],
                        file: None,
                        delete_on_close: false,
                    }),
                });
                map.insert(key, s.clone());
                s
            }
        };
        let mut st = shared.lock();
        if st.machine.size() != size {
            return Err(CioError::new(
                ErrorClass::NotSame,
                format!(
                    "rank {rank} opens {path} in job {job:#x} with {size} ranks, the others with {}",
                    st.machine.size()
                ),
            ));
        }
        if std::mem::replace(&mut st.attached[rank as usize], true) {
            return Err(CioError::new(
                ErrorClass::Arg,
                format!("rank {rank} of job {job:#x} already has {path} open"),
            ));
        }
        drop(st);
        Ok(shared)
    }

    /// The request loop, until CLOSE (answered) or an error; the caller counts the open
    /// file in flight for the drain.
    fn requests(&self, ch: &mut Channel, me: &mut RankConn) -> Result<()> {
        let mut bytes = Vec::new();
        let mut idle = Duration::ZERO;
        loop {
            if !ch.recv_within(&mut bytes, RECV_SLICE)? {
                idle += RECV_SLICE;
                if self.drain.stopping() {
                    self.drain.interrupted();
                    return Err(CioError::new(
                        ErrorClass::Busy,
                        "the server is shutting down (its drain's grace is over)",
                    ));
                }
                if idle >= IDLE {
                    return Err(CioError::conn(format!(
                        "the rank sent nothing for {} s",
                        IDLE.as_secs()
                    )));
                }
                continue;
            }
            idle = Duration::ZERO;
            let (msg, payload) = decode(&bytes)?;
            let closing = matches!(msg, Msg::Close);
            // An inline write's data, out of the receive buffer (as DATA's is).
            let inline = match msg {
                Msg::WriteAtAllInline { .. } | Msg::WriteAtInline { .. } => {
                    Some(self.inline_data(payload, &me.shared.pool))
                }
                _ => None,
            };
            self.request(ch, me, msg, inline)?;
            if closing {
                return Ok(());
            }
        }
    }

    /// Serves one request and answers it; `inline` is an inline write's data.
    fn request(
        &self,
        ch: &mut Channel,
        me: &mut RankConn,
        msg: Msg,
        inline: Option<Result<Vec<u8>>>,
    ) -> Result<()> {
        match msg {
            Msg::SetView {
                disp,
                etype,
                filetype,
            } => {
                let key = (disp, desc_hash(&etype), desc_hash(&filetype));
                let view = resolve(&mut me.types, etype).and_then(|e| {
                    let f = resolve(&mut me.types, filetype)?;
                    me.views.get_or_make(key, || View::new(disp, e, f))
                });
                let work = view.as_ref().map(|_| Work::Nothing).map_err(Clone::clone);
                let outcome = self.collective(me, CallKind::SetView, work);
                if let (Ok(_), Ok(v)) = (&outcome, view) {
                    me.view = v;
                }
                answer(ch, outcome, me)
            }
            Msg::WriteAtAll { offset, len } => {
                let data = self.recv_data(ch, len, &me.shared.pool)?;
                self.write_at_all(ch, me, offset, len, data)
            }
            Msg::WriteAtAllInline { offset, len } => {
                let data = inline.unwrap_or_else(|| Err(CioError::conn("internal: no data")));
                self.write_at_all(ch, me, offset, u64::from(len), data)
            }
            Msg::WriteAtInline { offset, len } => {
                let data = inline.unwrap_or_else(|| Err(CioError::conn("internal: no data")));
                self.write_at(ch, me, offset, u64::from(len), data)
            }
            Msg::ReadAtAll { offset, len } => {
                let work = self
                    .read_extents(me, offset, len)
                    .map(|extents| Work::Read { extents });
                let outcome = self.collective(me, CallKind::ReadAtAll, work);
                me.moved += moved(&outcome, len);
                answer(ch, outcome, me)
            }
            Msg::WriteAt { offset, len } => {
                let data = self.recv_data(ch, len, &me.shared.pool)?;
                self.write_at(ch, me, offset, len, data)
            }
            Msg::ReadAt { offset, len } => {
                let outcome = self.read_extents(me, offset, len).and_then(|extents| {
                    let file = file_of(me)?;
                    let mut wants = [extents];
                    let streams = files::read_regions(&file, &mut wants, &me.shared.pool);
                    let [extents] = wants;
                    me.shared.pool.give_extents(extents);
                    Ok(Reply::Stream(streams?.pop().unwrap_or_default()))
                });
                me.moved += moved(&outcome, len);
                answer(ch, outcome, me)
            }
            Msg::GetSize => {
                let size = file_of(me).and_then(|f| {
                    f.metadata()
                        .map(|m| m.len())
                        .map_err(|e| files::io_error("get size", &e))
                });
                match size {
                    Ok(n) => send(ch, &Msg::Size(n)),
                    Err(e) => send_error(ch, &e),
                }
            }
            Msg::SetSize(n) | Msg::Preallocate(n) => {
                let kind = if matches!(msg, Msg::SetSize(_)) {
                    CallKind::SetSize
                } else {
                    CallKind::Preallocate
                };
                let work = writable(me.amode).map(|()| Work::Value(n));
                let outcome = self.collective(me, kind, work);
                answer(ch, outcome, me)
            }
            Msg::Sync => {
                let outcome = self.collective(me, CallKind::Sync, Ok(Work::Nothing));
                answer(ch, outcome, me)
            }
            Msg::Close => {
                let outcome = self.collective(me, CallKind::Close, Ok(Work::Nothing));
                answer(ch, outcome, me)
            }
            m => Err(CioError::conn(format!("unexpected frame {m:?}"))),
        }
    }

    /// A collective write of `len` bytes at `offset`, its data received (`Err`: received
    /// and refused), whichever form it came in.
    fn write_at_all(
        &self,
        ch: &Channel,
        me: &mut RankConn,
        offset: u64,
        len: u64,
        data: Result<Vec<u8>>,
    ) -> Result<()> {
        let work = write_work(me, offset, len, data);
        let outcome = self.collective(me, CallKind::WriteAtAll, work);
        me.moved += moved(&outcome, len);
        let answered = answer(ch, outcome, me);
        // The write behind, if this rank's arrival completed the call: after its
        // answer left, so no rank waits for the file.
        me.shared.behind.flush(&me.shared.pool);
        answered
    }

    /// An independent write of `len` bytes at `offset`, its data received (`Err`: received
    /// and refused), whichever form it came in.
    fn write_at(
        &self,
        ch: &Channel,
        me: &mut RankConn,
        offset: u64,
        len: u64,
        data: Result<Vec<u8>>,
    ) -> Result<()> {
        let outcome = write_work(me, offset, len, data).and_then(|work| {
            let file = file_of(me)?;
            let action = session::placement(vec![work])?;
            let written = files::write(&file, &action, &me.shared.pool);
            recycle(&me.shared.pool, action);
            written.map(|()| Reply::Done(len))
        });
        me.moved += moved(&outcome, len);
        answer(ch, outcome, me)
    }

    /// An inline write's data, copied out of the receive buffer into one of the pool's
    /// (`Err`: over `max_call_bytes`, refused as a two-frame write of that size is).
    fn inline_data(&self, payload: &[u8], pool: &Pool) -> Result<Vec<u8>> {
        self.check_len(payload.len() as u64)?;
        let mut data = pool.bytes(payload.len());
        data.extend_from_slice(payload);
        Ok(data)
    }

    /// The extents of a read of `len` bytes at `offset` (a file opened for reading).
    fn read_extents(&self, me: &RankConn, offset: u64, len: u64) -> Result<Extents> {
        if me.amode & amode::WRONLY != 0 {
            return Err(CioError::new(
                ErrorClass::Access,
                "a read of a file opened write-only (WRONLY)",
            ));
        }
        self.check_len(len)?;
        me.view.pieces(offset, len, me.shared.pool.extents())
    }

    fn check_len(&self, len: u64) -> Result<()> {
        if len > self.cfg.max_call_bytes {
            return Err(CioError::new(
                ErrorClass::Arg,
                format!(
                    "a call of {len} bytes; this server moves at most {} per rank and call ([cio] max_call_bytes)",
                    self.cfg.max_call_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Receives the `len` bytes of data stream that follow a write request. A write over
    /// the limit is received and dropped (`Ok(Err(..))`): the connection stays in step.
    /// A DATA frame out of place, or more bytes than announced, ends the connection.
    fn recv_data(&self, ch: &mut Channel, len: u64, pool: &Pool) -> Result<Result<Vec<u8>>> {
        let verdict = self.check_len(len);
        let keep = verdict.is_ok();
        let mut data = pool.bytes(if keep { len.min(64 << 20) as usize } else { 0 });
        let mut got = 0u64;
        while got < len {
            let n = ch.recv_with(|bytes| -> Result<u64> {
                let (msg, payload) = decode(bytes)?;
                if !matches!(msg, Msg::Data { .. }) {
                    return Err(CioError::conn(format!(
                        "expected DATA ({} of {len} bytes left), got {msg:?}",
                        len - got
                    )));
                }
                let n = payload.len() as u64;
                if n == 0 || n > len - got {
                    return Err(CioError::conn(format!(
                        "a DATA frame of {n} bytes with {} of {len} bytes left",
                        len - got
                    )));
                }
                if keep {
                    data.extend_from_slice(payload);
                }
                Ok(n)
            })??;
            got += n;
        }
        Ok(verdict.map(|()| data))
    }

    /// Hands `rank`'s collective call to its session and waits for its answer; runs the
    /// file action if this rank's call completed it (or the clock ran out on others).
    fn collective(&self, me: &RankConn, kind: CallKind, work: Result<Work>) -> Outcome {
        let (tx, rx) = mpsc::channel();
        let jobs = {
            let mut st = me.shared.lock();
            if let Some(w) = st.waiters.get_mut(me.rank as usize) {
                *w = Some(tx);
            }
            let outs = st.machine.arrive(me.rank, kind, work, Instant::now());
            route(&mut st, outs)
        };
        self.run(&me.shared, jobs);
        loop {
            match rx.recv_timeout(TICK) {
                Ok(outcome) => return outcome,
                Err(RecvTimeoutError::Timeout) => {
                    let jobs = {
                        let mut st = me.shared.lock();
                        let outs = st.machine.tick(Instant::now());
                        route(&mut st, outs)
                    };
                    self.run(&me.shared, jobs);
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(CioError::new(
                        ErrorClass::RankLost,
                        "internal: the session dropped this call",
                    ))
                }
            }
        }
    }

    /// Runs file actions and answers every rank of each.
    fn run(&self, shared: &Shared, jobs: Vec<Job>) {
        for job in jobs {
            let outcomes = self.act(shared, job.action, job.answer.len());
            for (tx, o) in job.answer.into_iter().zip(outcomes) {
                if let Some(tx) = tx {
                    let _ = tx.send(o);
                }
            }
        }
    }

    /// One file action, after the write behind (if any) reached the file; the answer of
    /// each of `n` ranks. The error of a write behind is every rank's answer to the next
    /// call, which then does nothing on the file (but CLOSE, which still closes it).
    fn act(&self, shared: &Shared, action: Action, n: usize) -> Vec<Outcome> {
        shared.behind.settle(&shared.pool);
        let Some(earlier) = shared.behind.take_error() else {
            return self.act_now(shared, action, n);
        };
        match action {
            Action::Close => drop(self.act_now(shared, action, n)),
            other => recycle(&shared.pool, other),
        }
        (0..n).map(|_| Err(earlier.clone())).collect()
    }

    /// [`Server::act`] on a settled file: writes that fit the write-behind cap are queued
    /// and answered at once.
    fn act_now(&self, shared: &Shared, action: Action, n: usize) -> Vec<Outcome> {
        let all = |r: Result<u64>| -> Vec<Outcome> {
            (0..n).map(|_| r.clone().map(Reply::Done)).collect()
        };
        let file = shared.lock().file.clone();
        let need = || {
            file.clone().ok_or_else(|| {
                CioError::new(
                    ErrorClass::BadFile,
                    "the file is not open (its open failed)",
                )
            })
        };
        match action {
            Action::Open { amode } => {
                let opened = self.exports.open_file(&shared.path, amode).and_then(|f| {
                    let size = f.metadata().map_err(|e| files::io_error("open", &e))?.len();
                    Ok((f, size))
                });
                match opened {
                    Ok((f, size)) => {
                        let mut st = shared.lock();
                        st.file = Some(Arc::new(f));
                        st.delete_on_close = amode & amode::DELETE_ON_CLOSE != 0;
                        all(Ok(size))
                    }
                    Err(e) => all(Err(e)),
                }
            }
            Action::Nothing => all(Ok(0)),
            Action::PlaceWrite { .. } | Action::PlaceDomain { .. } => {
                let lens: Vec<u64> = match &action {
                    Action::PlaceWrite { data, .. } => {
                        data.iter().map(|d| d.len() as u64).collect()
                    }
                    Action::PlaceDomain { ranks, .. } => {
                        ranks.iter().map(|(_, d)| d.len() as u64).collect()
                    }
                    _ => Vec::new(),
                };
                let written = match need() {
                    Ok(f) if shared.behind.takes(lens.iter().sum()) => {
                        shared.behind.queue(f, action, &shared.pool);
                        Ok(())
                    }
                    f => {
                        let w = f.and_then(|f| files::write(&f, &action, &shared.pool));
                        recycle(&shared.pool, action);
                        w
                    }
                };
                match written {
                    Ok(()) => lens.into_iter().map(|l| Ok(Reply::Done(l))).collect(),
                    Err(e) => all(Err(e)),
                }
            }
            Action::ReadRegions { mut wants } => {
                let read = need().and_then(|f| files::read_regions(&f, &mut wants, &shared.pool));
                recycle(&shared.pool, Action::ReadRegions { wants });
                match read {
                    Ok(streams) => streams.into_iter().map(|s| Ok(Reply::Stream(s))).collect(),
                    Err(e) => all(Err(e)),
                }
            }
            Action::SetSize(size) => all(need().and_then(|f| {
                f.set_len(size)
                    .map_err(|e| files::io_error("set size", &e))?;
                Ok(0)
            })),
            Action::Preallocate(size) => {
                all(need().and_then(|f| files::preallocate(&f, size).map(|()| 0)))
            }
            Action::Sync => all(need().and_then(|f| {
                f.sync_all().map_err(|e| files::io_error("sync", &e))?;
                Ok(0)
            })),
            Action::Close => {
                // Close makes every rank's data durable, as sync does.
                let synced = need().and_then(|f| {
                    f.sync_all().map_err(|e| files::io_error("close", &e))?;
                    Ok(0)
                });
                let delete = {
                    let mut st = shared.lock();
                    st.file = None;
                    st.delete_on_close
                };
                // MPI_MODE_DELETE_ON_CLOSE (and so MPI_File_delete): gone once every rank
                // closed it.
                let removed = synced.and_then(|n| match delete {
                    true => self.exports.remove_file(&shared.path).map(|()| n),
                    false => Ok(n),
                });
                all(removed)
            }
        }
    }
}

impl Service for Server {
    /// A connection the floor handed to collective I/O.
    fn serve_connection(&self, conn: Conn) {
        let Conn {
            sock,
            queue,
            hs,
            peer,
            first,
            // OPEN carries the token, checked with it (sealed, over TLS).
            principal: _,
            secure,
        } = conn;
        let mut ch = Channel::new(sock, queue);
        // Every frame of collective I/O goes through the channel's control path: all sealed.
        ch.seal(secure);
        match self.connection(&mut ch, hs, first, &peer) {
            Ok(()) => {
                tracing::debug!("{peer}: done");
                // Until the client closes (an error: its close), anything else, or the
                // linger's end.
                let _ = ch.recv_within(&mut Vec::new(), CLOSE_LINGER);
            }
            Err(e) => tracing::info!("{peer}: connection ended: {e}"),
        }
        ch.close();
    }

    /// Starts refusing new opens (Busy); callable from any thread. Idempotent.
    fn begin_drain(&self) {
        self.drain.begin();
    }

    /// Refuses new opens and lets the requests in flight run for up to `grace` (a
    /// collective call waits at most `collective_timeout` for its ranks), and reports.
    fn drain(&self, grace: Duration) -> DrainReport {
        self.drain.run(grace)
    }
}

/// A rank's hold on its session: dropped when the connection ends, it tells the session
/// the rank is gone and forgets the session once no rank holds it.
struct Attached<'a> {
    server: &'a Server,
    shared: Arc<Shared>,
    rank: Rank,
    job: u64,
}

impl Drop for Attached<'_> {
    fn drop(&mut self) {
        let (jobs, empty) = {
            let mut st = self.shared.lock();
            if let Some(a) = st.attached.get_mut(self.rank as usize) {
                *a = false;
            }
            let outs = st.machine.gone(self.rank);
            let jobs = route(&mut st, outs);
            (jobs, !st.attached.iter().any(|&a| a))
        };
        self.server.run(&self.shared, jobs);
        // A write answered before this rank left still reaches the file.
        self.shared.behind.flush(&self.shared.pool);
        if empty {
            let mut map = self.server.sessions();
            let key = (self.job, self.shared.path.clone());
            if map.get(&key).is_some_and(|s| Arc::ptr_eq(s, &self.shared)) {
                map.remove(&key);
            }
        }
    }
}

/// Gives the buffers of a finished action back to its session's pool.
fn recycle(pool: &Pool, action: Action) {
    match action {
        Action::PlaceWrite { data, .. } => data.into_iter().for_each(|d| pool.give_bytes(d)),
        Action::PlaceDomain { ranks, .. } => {
            for (extents, data) in ranks {
                pool.give_extents(extents);
                pool.give_bytes(data);
            }
        }
        Action::ReadRegions { wants } => wants.into_iter().for_each(|w| pool.give_extents(w)),
        _ => {}
    }
}

/// The file of a rank's session, once no write is behind (a rank reads its own writes).
fn file_of(me: &RankConn) -> Result<Arc<std::fs::File>> {
    me.shared.behind.settle(&me.shared.pool);
    me.shared
        .lock()
        .file
        .clone()
        .ok_or_else(|| CioError::new(ErrorClass::BadFile, "the file is closed"))
}

/// Refuses writes to a file opened read-only.
/// The placement of a write of `len` bytes at `offset` through `me`'s view, its data
/// received (`Err`: received and refused), if the file is open for writing.
fn write_work(me: &RankConn, offset: u64, len: u64, data: Result<Vec<u8>>) -> Result<Work> {
    let data = data?;
    writable(me.amode)?;
    let extents = me.view.pieces(offset, len, me.shared.pool.extents())?;
    Ok(Work::Write { extents, data })
}

fn writable(mode: u32) -> Result<()> {
    if mode & amode::RDONLY != 0 {
        return Err(CioError::new(
            ErrorClass::Access,
            "a write to a file opened read-only (RDONLY)",
        ));
    }
    Ok(())
}

/// A SET_VIEW datatype: decoded (and kept by hash), or one kept earlier. Both sides forget
/// every kept description when a new one would be one too many
/// ([`MAX_CACHED_TYPES`]), so the client knows what is kept.
fn resolve(types: &mut HashMap<[u8; 32], Result<Datatype>>, d: Desc) -> Result<Datatype> {
    match d {
        Desc::Hash(h) => types.get(&h).cloned().unwrap_or_else(|| {
            Err(CioError::new(
                ErrorClass::Type,
                "a datatype hash this connection never described: send the description",
            ))
        }),
        Desc::Inline(bytes) => {
            let h = *blake3::hash(&bytes).as_bytes();
            let t = Datatype::decode(&bytes).map_err(|e| {
                CioError::new(ErrorClass::Type, format!("a datatype description: {e}"))
            });
            if !types.contains_key(&h) && types.len() >= MAX_CACHED_TYPES {
                types.clear();
            }
            types.insert(h, t.clone());
            t
        }
    }
}

/// A SET_VIEW's key: its displacement and the BLAKE3 of its etype's and file type's
/// descriptions.
type ViewKey = (i64, [u8; 32], [u8; 32]);

/// The views a connection set, flattened, by their key: setting one again costs a lookup
/// (at most [`MAX_CACHED_TYPES`] kept; all forgotten when one more would be too many).
#[derive(Default)]
struct Views(HashMap<ViewKey, View>);

impl Views {
    /// The view of `key`, kept or made by `make` (and kept if it is valid).
    fn get_or_make(&mut self, key: ViewKey, make: impl FnOnce() -> Result<View>) -> Result<View> {
        if let Some(v) = self.0.get(&key) {
            return Ok(v.clone());
        }
        let v = make()?;
        if self.0.len() >= MAX_CACHED_TYPES {
            self.0.clear();
        }
        self.0.insert(key, v.clone());
        Ok(v)
    }
}

/// The BLAKE3 of a datatype description, sent or named.
fn desc_hash(d: &Desc) -> [u8; 32] {
    match d {
        Desc::Hash(h) => *h,
        Desc::Inline(bytes) => *blake3::hash(bytes).as_bytes(),
    }
}

/// The connection's first frame (OPEN): `first` if the floor already received it, else
/// the next message, within the handshake's deadline.
fn first_frame(ch: &mut Channel, hs: &Handshake, first: Option<Vec<u8>>) -> Result<Vec<u8>> {
    if let Some(b) = first {
        return Ok(b);
    }
    ch.post_ring(1, proto::MAX_CONTROL)?;
    Ok(ch.recv_first_in(hs, "OPEN")?)
}

/// Answers a refused OPEN and ends the connection (after a moment for the answer to
/// leave).
fn refuse_open(ch: &Channel, e: CioError) -> Result<()> {
    send_error(ch, &e)?;
    std::thread::sleep(Duration::from_millis(50));
    Err(e)
}

fn decode(bytes: &[u8]) -> Result<(Msg, &[u8])> {
    proto::decode(bytes).map_err(|e| CioError::conn(format!("the peer sent a bad frame: {e}")))
}

fn send(ch: &Channel, msg: &Msg) -> Result<()> {
    let bytes = proto::to_vec(msg).map_err(|e| CioError::conn(format!("encode {e}")))?;
    Ok(ch.send_frame(&bytes)?)
}

fn send_error(ch: &Channel, e: &CioError) -> Result<()> {
    let mut message = e.message.clone();
    if message.len() > proto::MAX_MESSAGE {
        let mut cut = proto::MAX_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    send(
        ch,
        &Msg::Error {
            class: e.class,
            message,
        },
    )
}

/// Answers a request: a read's bytes (whose buffer then goes back to the session's pool)
/// in one DATA_DONE if they fit and the client takes it, else DATA frames, then DONE; or
/// ERROR.
fn answer(ch: &Channel, outcome: Outcome, me: &RankConn) -> Result<()> {
    match outcome {
        Ok(Reply::Done(n)) => send(ch, &Msg::Done(n)),
        Ok(Reply::Stream(s)) if me.inline_answers && s.len() <= proto::MAX_INLINE => {
            let sent = send_data_done(ch, &s, &me.shared.pool);
            me.shared.pool.give_bytes(s);
            sent
        }
        Ok(Reply::Stream(s)) => {
            let sent = send_stream(ch, &s, me.chunk, &me.shared.pool);
            let n = s.len() as u64;
            me.shared.pool.give_bytes(s);
            sent?;
            send(ch, &Msg::Done(n))
        }
        Err(e) => send_error(ch, &e),
    }
}

/// Sends `data` (at most [`proto::MAX_INLINE`] bytes) as one DATA_DONE frame (built in a
/// buffer of `pool`'s).
fn send_data_done(ch: &Channel, data: &[u8], pool: &Pool) -> Result<()> {
    let mut frame = pool.bytes(HEADER_LEN + data.len());
    let head = Msg::DataDone {
        len: data.len() as u32,
    };
    let sent = proto::encode(&head, &mut frame)
        .map_err(|e| CioError::conn(format!("encode DATA_DONE: {e}")))
        .and_then(|()| {
            frame.extend_from_slice(data);
            Ok(ch.send_frame(&frame)?)
        });
    pool.give_bytes(frame);
    sent
}

/// Sends `data` as DATA frames of at most `chunk` bytes (built in a buffer of `pool`'s).
fn send_stream(ch: &Channel, data: &[u8], chunk: usize, pool: &Pool) -> Result<()> {
    let mut frame = pool.bytes(HEADER_LEN + chunk.min(data.len()));
    let sent = data.chunks(chunk.max(1)).try_for_each(|piece| {
        frame.clear();
        let header = proto::data_header(piece.len() as u32)
            .map_err(|e| CioError::conn(format!("encode DATA: {e}")))?;
        frame.extend_from_slice(&header);
        frame.extend_from_slice(piece);
        Ok(ch.send_frame(&frame)?)
    });
    pool.give_bytes(frame);
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A view set again (same displacement, same descriptions) is the kept one, not
    /// flattened again; a refused view is not kept; a full cache starts over.
    #[test]
    fn views_are_kept_by_their_key() {
        let mut views = Views::default();
        let mut made = 0;
        let key = |d: i64| (d, [1; 32], [2; 32]);
        for _ in 0..3 {
            let v = views.get_or_make(key(4), || {
                made += 1;
                View::new(4, Datatype::byte(), Datatype::byte())
            });
            assert_eq!(v.unwrap().disp(), 4);
        }
        assert_eq!(made, 1);
        for _ in 0..2 {
            let bad = views.get_or_make(key(-1), || {
                made += 1;
                View::new(-1, Datatype::byte(), Datatype::byte())
            });
            assert_eq!(bad.unwrap_err().class, ErrorClass::Arg);
        }
        assert_eq!(made, 3);
        for d in 0..MAX_CACHED_TYPES as i64 + 1 {
            views
                .get_or_make(key(100 + d), || {
                    View::new(0, Datatype::byte(), Datatype::byte())
                })
                .unwrap();
        }
        assert!(views.0.len() <= MAX_CACHED_TYPES);
    }
}
