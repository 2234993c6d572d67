//! C sockets: the ES-API life cycle (socket, bind, listen / connect, accept, close) over the
//! runtime's `ExsListener` and `ExsSocket`.
//!
//! A socket is fresh (settings may change), then either connecting → connected (or failed,
//! from where a new connect may be tried), or bound → listening. `exs_connect` and
//! `exs_accept` are asynchronous: a thread per pending connect or accepted handshake does
//! the waiting and announces the outcome on the caller's queue. A listening socket has one
//! thread that accepts connections into a backlog as they arrive (at the fabric level; the
//! EXS handshake runs when an `exs_accept` takes one), which is also what makes it readable
//! for `exs_poll`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use ferry_exs::proto::Config;
use ferry_exs::runtime::{default_config, ExsIncoming, ExsListener, ExsSocket};
use ferry_fabric::{Address, DomainId, FabricError};
use tracing::debug;

use crate::error::{Errno, Res};
use crate::handle::{self, Obj};
use crate::queue::{Ev, Queue, EVT_ACCEPT, EVT_CONNECT};

/// How long a connect (fabric connect and EXS handshake) may take unless set with
/// `EXS_F_SET_CONNECT_TIMEOUT`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an accepted connection's handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the listener thread looks up from waiting for connections.
const ACCEPT_SLICE: Duration = Duration::from_millis(100);
/// Default and largest backlog of `exs_listen`.
const BACKLOG_DEFAULT: usize = 16;
const BACKLOG_MAX: usize = 4096;

/// `exs_fcntl` commands (see exs.h).
pub mod cmd {
    pub const GET_SEND_CREDITS: i32 = 1;
    pub const SET_SEND_CREDITS: i32 = 2;
    pub const GET_RECV_CREDITS: i32 = 3;
    pub const SET_RECV_CREDITS: i32 = 4;
    pub const GET_SMALL_PACKET_MAX: i32 = 5;
    pub const SET_SMALL_PACKET_MAX: i32 = 6;
    pub const GET_PUSH: i32 = 7;
    pub const SET_PUSH: i32 = 8;
    pub const GET_CONNECT_TIMEOUT: i32 = 9;
    pub const SET_CONNECT_TIMEOUT: i32 = 10;
}

/// `EXS_POLL*` values (the same as poll(2)'s).
pub mod pollbits {
    pub const IN: i16 = libc::POLLIN;
    pub const OUT: i16 = libc::POLLOUT;
    pub const ERR: i16 = libc::POLLERR;
    pub const HUP: i16 = libc::POLLHUP;
    pub const NVAL: i16 = libc::POLLNVAL;
}

/// What `exs_fcntl` sets.
#[derive(Debug, Clone)]
pub struct Settings {
    cfg: Config,
    /// Whether the program chose the rendezvous; if not, the driver's recommendation is used.
    push_set: bool,
    connect_timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            cfg: Config::default(),
            push_set: false,
            connect_timeout: CONNECT_TIMEOUT,
        }
    }
}

impl Settings {
    /// The settings a connection to or from `addr` uses.
    fn resolved(&self, addr: &Address) -> Settings {
        let mut s = self.clone();
        if !s.push_set {
            s.cfg.push = default_config(addr).push;
            s.push_set = true;
        }
        s
    }
}

enum State {
    Fresh {
        bound: Option<String>,
    },
    /// A connect is under way; closing the socket reports its ECANCELED on `q` at once.
    Connecting {
        q: Arc<Queue>,
        ctx: usize,
    },
    Connected(Arc<ExsSocket>),
    Listening(Arc<Listen>),
    /// The last connect failed (its event said why); another may be tried.
    Failed,
    Closed,
}

struct Inner {
    settings: Settings,
    state: State,
}

/// One C socket.
pub struct Socket {
    inner: Mutex<Inner>,
    /// The fabric domain its registrations belong to, learnt at its first registration.
    pub domain: OnceLock<DomainId>,
}

impl Socket {
    fn new(settings: Settings, state: State) -> Socket {
        Socket {
            inner: Mutex::new(Inner { settings, state }),
            domain: OnceLock::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The runtime socket, if connected (ENOTCONN otherwise; EBADF once closed).
    pub fn connected(&self) -> Res<Arc<ExsSocket>> {
        match &self.lock().state {
            State::Connected(s) => Ok(s.clone()),
            State::Closed => Err(Errno::BADF),
            _ => Err(Errno(libc::ENOTCONN)),
        }
    }

    /// `exs_poll`'s view (before masking with the requested events).
    pub fn revents(&self) -> i16 {
        use pollbits::*;
        match &self.lock().state {
            State::Connected(s) => {
                let r = s.readiness();
                (if r.readable { IN } else { 0 })
                    | (if r.writable { OUT } else { 0 })
                    | (if r.closed { HUP } else { 0 })
            }
            State::Listening(l) => {
                if l.lock().backlog.is_empty() {
                    0
                } else {
                    IN
                }
            }
            State::Failed => ERR,
            State::Closed => NVAL,
            State::Fresh { .. } | State::Connecting { .. } => 0,
        }
    }
}

/// Runs `f` with SIGPIPE blocked in the calling thread, restoring the mask after. Threads
/// started inside (ours, and the drivers' writer and progress threads, which inherit the
/// mask) then never take SIGPIPE: a write to a connection the peer reset fails with EPIPE
/// and ends the connection, instead of killing a C program that, unlike a Rust one, did not
/// ignore SIGPIPE at start-up.
fn sigpipe_blocked<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(libc::sigset_t);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: restores a mask pthread_sigmask filled in below; no pointers kept.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
        }
    }
    // SAFETY: sigset_t is plain data that sigemptyset initialises; the calls only read and
    // write the two local sets and this thread's signal mask.
    let _restore = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        Restore(old)
    };
    f()
}

/// Starts a thread of this library (SIGPIPE blocked, see [`sigpipe_blocked`]).
fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    sigpipe_blocked(|| std::thread::Builder::new().name(name).spawn(f).map(drop))
}

/// `exs_socket`: a fresh socket.
pub fn create() -> Res<i32> {
    handle::insert(Obj::Sock(Arc::new(Socket::new(
        Settings::default(),
        State::Fresh { bound: None },
    ))))
}

/// The longest host (or shm endpoint name) a URL may carry: a DNS name has at most 253
/// characters, a file name (shm regions live in /dev/shm) 255.
const HOST_MAX: usize = 255;

/// Parses a URL; EINVAL if malformed or its host is longer than [`HOST_MAX`]. Nothing is
/// resolved here: `exs_listen` and `exs_connect` resolve the host.
fn parse(url: &str) -> Res<Address> {
    let addr = url.parse::<Address>().map_err(Errno::from)?;
    if addr.host.len() > HOST_MAX {
        return Err(Errno::INVAL);
    }
    Ok(addr)
}

/// `exs_bind`: records the address; the fabric binds it at `exs_listen`, so settings made
/// in between apply to the listener.
pub fn bind(h: i32, url: &str) -> Res<()> {
    let s = handle::sock(h)?;
    parse(url)?;
    let mut i = s.lock();
    match &mut i.state {
        State::Fresh { bound: b @ None } => {
            *b = Some(url.to_owned());
            Ok(())
        }
        State::Connecting { .. } | State::Connected(_) => Err(Errno(libc::EISCONN)),
        State::Closed => Err(Errno::BADF),
        _ => Err(Errno::INVAL),
    }
}

/// EADDRNOTAVAIL if `addr` names a host with a port that does not resolve (the drivers
/// would report a bare I/O error).
fn resolvable(addr: &Address) -> Res<()> {
    use std::net::ToSocketAddrs;
    let Some(port) = addr.port else {
        return Ok(());
    };
    let found = (addr.host.as_str(), port)
        .to_socket_addrs()
        .map_or(0, Iterator::count);
    if found == 0 {
        return Err(Errno(libc::EADDRNOTAVAIL));
    }
    Ok(())
}

/// `exs_listen`.
pub fn listen(h: i32, backlog: i32) -> Res<()> {
    let s = handle::sock(h)?;
    let max = usize::try_from(backlog)
        .ok()
        .filter(|&b| b > 0)
        .unwrap_or(BACKLOG_DEFAULT)
        .min(BACKLOG_MAX);
    let mut i = s.lock();
    let url = match &i.state {
        State::Fresh { bound: Some(url) } => url.clone(),
        State::Fresh { bound: None } => return Err(Errno(libc::EDESTADDRREQ)),
        State::Listening(l) => {
            l.lock().max = max;
            return Ok(());
        }
        State::Connecting { .. } | State::Connected(_) => return Err(Errno(libc::EISCONN)),
        State::Closed => return Err(Errno::BADF),
        State::Failed => return Err(Errno::INVAL),
    };
    let addr = parse(&url)?;
    resolvable(&addr)?;
    let settings = i.settings.resolved(&addr);
    let exs = sigpipe_blocked(|| ExsListener::bind(&url, settings.cfg.clone()))?;
    let l = Arc::new(Listen {
        exs,
        handle: h,
        settings: settings.clone(),
        st: Mutex::new(ListenState {
            backlog: VecDeque::new(),
            requests: VecDeque::new(),
            max,
            closed: false,
        }),
        stop: AtomicBool::new(false),
        thread: Mutex::new(None),
    });
    let t = l.clone();
    let thread = sigpipe_blocked(|| {
        std::thread::Builder::new()
            .name(format!("exs-listen-{h}"))
            .spawn(move || t.run())
    })
    .map_err(Errno::from)?;
    *l.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread);
    i.settings = settings;
    i.state = State::Listening(l);
    Ok(())
}

/// `exs_accept`: the next connection is announced by an EXS_EVT_ACCEPT on `q`.
pub fn accept(h: i32, q: Arc<Queue>, ctx: usize) -> Res<()> {
    let s = handle::sock(h)?;
    let l = match &s.lock().state {
        State::Listening(l) => l.clone(),
        State::Closed => return Err(Errno::BADF),
        _ => return Err(Errno::INVAL),
    };
    let mut st = l.lock();
    if st.closed {
        return Err(Errno::BADF);
    }
    let req = Req { q, ctx };
    match st.backlog.pop_front() {
        Some(inc) => {
            drop(st);
            l.handshake(inc, req);
        }
        None => st.requests.push_back(req),
    }
    Ok(())
}

/// `exs_connect`: the outcome is announced by an EXS_EVT_CONNECT on `q`.
pub fn connect(h: i32, url: &str, q: Arc<Queue>, ctx: usize) -> Res<()> {
    let s = handle::sock(h)?;
    let addr = parse(url)?;
    let mut i = s.lock();
    match &i.state {
        State::Fresh { bound: None } | State::Failed => {}
        State::Fresh { bound: Some(_) } | State::Listening(_) => return Err(Errno::INVAL),
        State::Connecting { .. } => return Err(Errno(libc::EALREADY)),
        State::Connected(_) => return Err(Errno(libc::EISCONN)),
        State::Closed => return Err(Errno::BADF),
    }
    let settings = i.settings.resolved(&addr);
    settings.cfg.validate()?;
    i.settings = settings.clone();
    i.state = State::Connecting { q: q.clone(), ctx };
    drop(i);
    let url = url.to_owned();
    let sock = s.clone();
    let q2 = q.clone();
    let spawned = spawn(format!("exs-connect-{h}"), move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ExsSocket::connect(&url, settings.cfg, &q2.rt, settings.connect_timeout)
        }));
        let r = match r {
            Ok(r) => r.map_err(Errno::from),
            Err(_) => Err(Errno(libc::EIO)),
        };
        connected(h, &sock, r, &q2, ctx);
    });
    if let Err(e) = spawned {
        s.lock().state = State::Failed;
        return Err(Errno::from(e));
    }
    Ok(())
}

/// Ends a connect: the socket becomes connected (or failed), unless it was closed meanwhile
/// (the close already reported ECANCELED; a new connection is dropped, silently).
fn connected(h: i32, s: &Socket, r: Res<ExsSocket>, q: &Queue, ctx: usize) {
    let mut discard = None;
    {
        let mut i = s.lock();
        let open = matches!(i.state, State::Connecting { .. });
        match r {
            Ok(exs) if open => {
                let id = exs.id();
                i.state = State::Connected(Arc::new(exs));
                q.announce(Ev::conn(EVT_CONNECT, h, -1, 0, ctx), Some((id, h)));
            }
            Ok(exs) => {
                q.disown(exs.id());
                discard = Some(exs);
            }
            Err(e) if open => {
                i.state = State::Failed;
                q.push(Ev::conn(EVT_CONNECT, h, -1, e.0, ctx));
            }
            Err(_) => {}
        }
    }
    // Dropping sends CLOSE and waits for it to leave: not under the socket's lock.
    drop(discard);
}

/// `exs_close`. The handle is gone at once; a connected socket's pending operations
/// complete with ECANCELED and a close event follows on its queue.
pub fn close(h: i32) -> Res<()> {
    let Obj::Sock(s) = handle::remove_if(h, |o| matches!(o, Obj::Sock(_)))? else {
        return Err(Errno::BADF);
    };
    let old = std::mem::replace(&mut s.lock().state, State::Closed);
    match old {
        State::Listening(l) => l.shutdown(),
        // The connect completes now; its thread finds the socket closed and stays silent.
        State::Connecting { q, ctx } => q.push(Ev::conn(EVT_CONNECT, h, -1, libc::ECANCELED, ctx)),
        State::Connected(exs) => {
            let _ = exs.close();
            // Dropping waits (up to a second) for the CLOSE frame to leave, so a program
            // that exits right after exs_close still tells its peer.
            drop(exs);
        }
        _ => {}
    }
    Ok(())
}

fn check_credits(arg: i64) -> Res<u16> {
    u16::try_from(arg)
        .ok()
        .filter(|&c| c > 0)
        .ok_or(Errno::INVAL)
}

/// `exs_fcntl`. Settings change only on a fresh (or failed) socket: later, a connected or
/// connecting socket fails with EISCONN and a listening one with EINVAL.
pub fn fcntl(h: i32, cmd: i32, arg: i64) -> Res<i32> {
    let s = handle::sock(h)?;
    let mut i = s.lock();
    let c = &i.settings.cfg;
    let get = match cmd {
        cmd::GET_SEND_CREDITS => Some(i32::from(c.send_credits)),
        cmd::GET_RECV_CREDITS => Some(i32::from(c.recv_credits)),
        cmd::GET_SMALL_PACKET_MAX => Some(c.small_packet_max_size as i32),
        cmd::GET_PUSH => Some(i32::from(c.push)),
        cmd::GET_CONNECT_TIMEOUT => {
            Some(i32::try_from(i.settings.connect_timeout.as_millis()).unwrap_or(i32::MAX))
        }
        cmd::SET_SEND_CREDITS
        | cmd::SET_RECV_CREDITS
        | cmd::SET_SMALL_PACKET_MAX
        | cmd::SET_PUSH
        | cmd::SET_CONNECT_TIMEOUT => None,
        _ => return Err(Errno::INVAL),
    };
    if let Some(v) = get {
        return Ok(v);
    }
    match i.state {
        State::Fresh { .. } | State::Failed => {}
        State::Connecting { .. } | State::Connected(_) => return Err(Errno(libc::EISCONN)),
        State::Listening(_) => return Err(Errno::INVAL),
        State::Closed => return Err(Errno::BADF),
    }
    let st = &mut i.settings;
    match cmd {
        cmd::SET_SEND_CREDITS => st.cfg.send_credits = check_credits(arg)?,
        cmd::SET_RECV_CREDITS => st.cfg.recv_credits = check_credits(arg)?,
        cmd::SET_SMALL_PACKET_MAX => {
            st.cfg.small_packet_max_size = u32::try_from(arg)
                .ok()
                .filter(|&v| v <= ferry_exs::proto::MAX_IMMEDIATE)
                .ok_or(Errno::INVAL)?
        }
        cmd::SET_PUSH => {
            st.cfg.push = match arg {
                0 => false,
                1 => true,
                _ => return Err(Errno::INVAL),
            };
            st.push_set = true;
        }
        _ => {
            let ms = u64::try_from(arg)
                .ok()
                .filter(|&ms| ms > 0 && ms <= i32::MAX as u64)
                .ok_or(Errno::INVAL)?;
            st.connect_timeout = Duration::from_millis(ms);
        }
    }
    Ok(0)
}

/// `exs_getsockname`: a connected socket's local address, a listener's bound address (the
/// port resolved), or the address given to `exs_bind`.
pub fn sockname(h: i32) -> Res<String> {
    let s = handle::sock(h)?;
    let i = s.lock();
    match &i.state {
        State::Connected(x) => Ok(x.local_addr()),
        State::Listening(l) => Ok(l.exs.local_addr()),
        State::Fresh { bound: Some(u) } => Ok(u.clone()),
        State::Closed => Err(Errno::BADF),
        _ => Err(Errno(libc::ENOTCONN)),
    }
}

/// `exs_getpeername`.
pub fn peername(h: i32) -> Res<String> {
    let s = handle::sock(h)?;
    let i = s.lock();
    match &i.state {
        State::Connected(x) => Ok(x.peer_addr()),
        State::Closed => Err(Errno::BADF),
        _ => Err(Errno(libc::ENOTCONN)),
    }
}

struct Req {
    q: Arc<Queue>,
    ctx: usize,
}

struct ListenState {
    /// Connections accepted at the fabric level, waiting for an `exs_accept`.
    backlog: VecDeque<ExsIncoming>,
    /// `exs_accept` calls waiting for a connection.
    requests: VecDeque<Req>,
    max: usize,
    closed: bool,
}

/// A listening socket's shared state and thread.
struct Listen {
    exs: ExsListener,
    handle: i32,
    /// What accepted sockets report through `exs_fcntl`.
    settings: Settings,
    st: Mutex<ListenState>,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Listen {
    fn lock(&self) -> MutexGuard<'_, ListenState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The listener thread: keeps the backlog filled and hands connections to waiting
    /// accepts.
    fn run(self: Arc<Self>) {
        while !self.stop.load(Ordering::Acquire) {
            let room = {
                let st = self.lock();
                st.backlog.len() < st.max || !st.requests.is_empty()
            };
            if !room {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            match self.exs.accept_incoming(ACCEPT_SLICE) {
                Ok(inc) => {
                    let mut st = self.lock();
                    if st.closed {
                        continue;
                    }
                    match st.requests.pop_front() {
                        Some(req) => {
                            drop(st);
                            self.handshake(inc, req);
                        }
                        None => st.backlog.push_back(inc),
                    }
                }
                Err(ferry_exs::runtime::Error::Fabric(FabricError::Timeout(_))) => {}
                Err(e) => {
                    debug!(%e, "EXS listener: accept failed");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// Runs the EXS handshake of `inc` on a thread of its own, then announces the new socket
    /// (or the failure) on the request's queue.
    fn handshake(&self, inc: ExsIncoming, req: Req) {
        let (lh, settings) = (self.handle, self.settings.clone());
        let (q, ctx) = (req.q.clone(), req.ctx);
        let spawned = spawn(format!("exs-accept-{lh}"), move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                inc.start(&req.q.rt, HANDSHAKE_TIMEOUT)
            }));
            let exs = match r {
                Ok(Ok(exs)) => exs,
                Ok(Err(e)) => {
                    let err = Errno::from(e).0;
                    return req.q.push(Ev::conn(EVT_ACCEPT, lh, -1, err, req.ctx));
                }
                Err(_) => return req.q.push(Ev::conn(EVT_ACCEPT, lh, -1, libc::EIO, req.ctx)),
            };
            let id = exs.id();
            let sock = Socket::new(settings, State::Connected(Arc::new(exs)));
            match handle::insert(Obj::Sock(Arc::new(sock))) {
                Ok(h) => req
                    .q
                    .announce(Ev::conn(EVT_ACCEPT, lh, h, 0, req.ctx), Some((id, h))),
                Err(e) => {
                    let ev = Ev::conn(EVT_ACCEPT, lh, -1, e.0, req.ctx);
                    req.q.announce(ev, Some((id, -1)))
                }
            }
        });
        if spawned.is_err() {
            q.push(Ev::conn(EVT_ACCEPT, lh, -1, libc::EAGAIN, ctx));
        }
    }

    /// Stops the thread, fails waiting accepts with ECANCELED and drops the backlog.
    fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        let t = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
        let (requests, backlog) = {
            let mut st = self.lock();
            st.closed = true;
            (
                std::mem::take(&mut st.requests),
                std::mem::take(&mut st.backlog),
            )
        };
        drop(backlog);
        for r in requests {
            r.q.push(Ev::conn(
                EVT_ACCEPT,
                self.handle,
                -1,
                libc::ECANCELED,
                r.ctx,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sigpipe_is_blocked() -> bool {
        // SAFETY: reads this thread's mask into a local set (a null `set` changes nothing).
        unsafe {
            let mut cur: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
            libc::sigismember(&cur, libc::SIGPIPE) == 1
        }
    }

    #[test]
    fn library_threads_block_sigpipe_and_callers_keep_their_mask() {
        assert!(!sigpipe_is_blocked());
        let (tx, rx) = std::sync::mpsc::channel();
        spawn("sigpipe-test".into(), move || {
            let _ = tx.send(sigpipe_is_blocked());
        })
        .unwrap();
        assert!(rx.recv().unwrap());
        assert!(!sigpipe_is_blocked());
        assert!(sigpipe_blocked(sigpipe_is_blocked));
        assert!(!sigpipe_is_blocked());
    }
}
