//! `ExsSocket` and `ExsListener`: the user-facing API and the per-socket progress thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;
use std::thread::Thread;
use std::time::{Duration, Instant};

use ferry_fabric::{Access, Address, Buffer, Endpoint, Listener, Scheme};

use super::buf::{ExsBuf, Held};
use super::engine::{Engine, Phase};
use super::queue::{Drive, EventQueue, SocketId};
use super::Error;

mod layout;
use crate::error::ExsError;
use crate::proto::{Config, Connection, CreditState, Flags, Stats};

/// How long the progress thread sleeps in the completion queue before checking for shutdown.
const TICK: Duration = Duration::from_millis(20);

/// How long the progress thread stands by after a dequeuer last drove its socket (unless
/// the dequeuer wakes it earlier by going to sleep): covers a user handling one event
/// before it dequeues again.
const STAND_BY: Duration = Duration::from_micros(500);

/// How long the progress thread spins for more completions before it sleeps (measured: not
/// spinning here made small-message round trips slower, even with dequeuers spinning).
const SPIN: Duration = Duration::from_micros(50);

/// How often a cancellable handshake ([`ExsIncoming::start_cancellable`]) looks at its flag.
const CANCEL_POLL: Duration = Duration::from_millis(10);

/// How long dropping a socket waits for its last frames to leave.
const LINGER: Duration = Duration::from_secs(1);

/// The recommended [`Config`] for the driver `addr` names: the defaults, with the rendezvous
/// (push or pull) that measured faster on that driver.
pub fn default_config(addr: &Address) -> Config {
    // Measured with tests/runtime_bench.rs (release, loopback, best of 3, shared 2-core VM
    // with load ~4, so +-20% noise; MB/s, pull/push, two runs):
    //   tcp      4 KiB x1: 32/28, 37/19   64 KiB x8: 1446/1351, 1435/1240   1 MiB x8: 2156/2026, 2187/2376
    //   ofi+tcp  4 KiB x1: 25/25, 25/22   64 KiB x8:  612/599,   861/618    1 MiB x8: 2566/2255, 2949/3023
    //   ofi+shm  4 KiB x1: 53/48, 62/71   64 KiB x8: 2589/1719, 2680/4126   1 MiB x8: 5663/4436, 7640/8403
    // Pull has one round trip fewer (ADVERT, read, ACK against REQ, GRANT, write, DONE) and
    // wins or ties on every driver, the native tcp driver included, so pull is the default
    // everywhere; ofi+shm is a tie within the noise and is worth re-measuring on a quiet host.
    let push = match &addr.scheme {
        Scheme::Tcp => false,
        Scheme::Ofi(_) => false,
    };
    Config {
        push,
        ..Config::default()
    }
}

struct Inner {
    id: SocketId,
    ep: Arc<dyn Endpoint>,
    /// The socket's own queue: while a dequeuer drives it, the progress thread stands by.
    queue: EventQueue,
    /// The progress thread, for `Drive::wake`.
    thread: OnceLock<Thread>,
    engine: Mutex<Engine>,
    phase_changed: Condvar,
    stop: AtomicBool,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Engine> {
        // A panic under the lock is a bug in this crate; the state is still the best we have.
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the engine, executes what it caused, and wakes `connect` if the phase moved.
    fn with<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> R {
        self.run(self.lock(), f)
    }

    fn run<R>(&self, mut e: MutexGuard<'_, Engine>, f: impl FnOnce(&mut Engine) -> R) -> R {
        let before = e.phase;
        let r = f(&mut e);
        e.drain();
        if e.phase != before {
            self.phase_changed.notify_all();
        }
        r
    }

    /// The progress thread: the backstop that handles completions when no dequeuer does.
    fn progress(&self) {
        while !self.stop.load(Ordering::Acquire) {
            // A dequeuer is handling completions: competing for them would only cost both
            // threads CPU (on 2 cores, the CPU the transfers need). It wakes us when it sleeps.
            if self.queue.driven(STAND_BY) {
                ferry_fabric::timeline::mark("exs.standby", 0);
                std::thread::park_timeout(STAND_BY);
                continue;
            }
            // Completions are taken only under the engine lock (here and in `drive`), so
            // whichever thread handles them handles them in order.
            if self.ep.cq().wait_ready(TICK, SPIN) && !self.queue.driven(STAND_BY) {
                self.handle_completions(self.lock());
            }
        }
    }

    /// Feeds every waiting completion to the engine; true if there were any.
    fn handle_completions(&self, e: MutexGuard<'_, Engine>) -> bool {
        let mut batch = Vec::with_capacity(16);
        self.ep.cq().poll_into(&mut batch, 64);
        if batch.is_empty() {
            return false;
        }
        ferry_fabric::timeline::mark("exs.batch", batch.len() as u64);
        self.run(e, |e| {
            for c in batch.drain(..) {
                e.complete(c);
            }
        });
        true
    }
}

impl Drive for Inner {
    fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    fn drive(&self) -> bool {
        if self.ep.cq().is_empty() {
            return false;
        }
        // A busy engine's holder (the progress thread or a user call) handles them.
        match self.engine.try_lock() {
            Ok(e) => self.handle_completions(e),
            Err(_) => false,
        }
    }
}

/// One EXS socket over one fabric endpoint.
///
/// A dead peer is noticed when the fabric reports it: at once on the native tcp driver (its
/// reader sees the connection drop and fails the posted control receives); on libfabric
/// drivers when the driver's keepalive has heard nothing from the peer for its timeout
/// (10 s, `FERRY_OFI_PEER_TIMEOUT`), or earlier if an operation reaches the dead peer.
/// [`ExsSocket::close`] never waits for the peer.
pub struct ExsSocket {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

/// Closes a socket from another thread while its owner is busy with it (cancelling a
/// transfer when the party that asked for it went away): [`ExsSocket::close`] without the
/// socket. Closing one already closed, or dropped, does nothing.
#[derive(Clone)]
pub struct Closer(Arc<Inner>);

impl Closer {
    /// Closes the socket: every pending operation completes with [`ExsError::Canceled`].
    pub fn close(&self) {
        self.0.with(|e| {
            if !e.user_closed {
                e.user_closed = true;
                e.conn.close();
            }
        })
    }

    /// True from the handshake until the connection closes (either side).
    pub fn is_connected(&self) -> bool {
        self.0.lock().phase == Phase::Open
    }
}

impl std::fmt::Debug for ExsSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExsSocket")
            .field("id", &self.inner.id)
            .field("peer", &self.inner.ep.peer())
            .finish()
    }
}

impl ExsSocket {
    /// Connects to an [`ExsListener`] at `addr` (e.g. `tcp://127.0.0.1:7000`) and waits up to
    /// `timeout` for the connection and the EXS handshake. Events go to `queue`.
    pub fn connect(
        addr: &str,
        cfg: Config,
        queue: &EventQueue,
        timeout: Duration,
    ) -> Result<ExsSocket, Error> {
        let ep = Self::dial(addr, &cfg, timeout)?;
        Self::start(ep, cfg, queue, timeout, None, |_| {})
    }

    /// The fabric connection to `addr` for a socket configured with `cfg`.
    fn dial(addr: &str, cfg: &Config, timeout: Duration) -> Result<Arc<dyn Endpoint>, Error> {
        cfg.validate()?;
        let addr: Address = addr.parse()?;
        Ok(Arc::from(ferry_fabric::connect(&addr, timeout)?))
    }

    /// Connects as [`ExsSocket::connect`] does, with `first` as the connection's first
    /// message, sent right behind this side's HELLO instead of after the peer's
    /// ([`Connection::send_early`]): a first word that crosses with the handshake, a round
    /// trip sooner. Its completion is a Send event with `ctx` and a buffer of this socket
    /// (registered for local use). A peer whose immediate size cannot hold `first` fails
    /// the connection with [`ExsError::MessageSize`]; connect again without it then.
    pub fn connect_early(
        addr: &str,
        cfg: Config,
        queue: &EventQueue,
        timeout: Duration,
        (first, ctx): (&[u8], u64),
    ) -> Result<ExsSocket, Error> {
        let ep = Self::dial(addr, &cfg, timeout)?;
        let buf = ExsBuf::new(
            ep.domain()
                .register(&Buffer::from_slice(first), Access::LOCAL)?,
        );
        let early = move |sock: &ExsSocket| {
            ferry_fabric::timeline::mark("exs.send", ctx);
            sock.post(None, ctx, Held::new(buf), |conn, token, held| {
                conn.send_early(token, held)
            });
        };
        Self::start(ep, cfg, queue, timeout, None, early)
    }

    /// Starts the socket's engine on `ep`, does `first` with the socket (before the
    /// handshake is over), and waits for the handshake.
    fn start(
        ep: Arc<dyn Endpoint>,
        cfg: Config,
        queue: &EventQueue,
        timeout: Duration,
        cancel: Option<&AtomicBool>,
        first: impl FnOnce(&ExsSocket),
    ) -> Result<ExsSocket, Error> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let id = SocketId(NEXT_ID.fetch_add(1, Ordering::Relaxed));
        let engine = Engine::start(ep.clone(), cfg, queue.clone(), id)?;
        let inner = Arc::new(Inner {
            id,
            ep,
            queue: queue.clone(),
            thread: OnceLock::new(),
            engine: Mutex::new(engine),
            phase_changed: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        queue.attach(Arc::downgrade(&inner) as Weak<dyn Drive>);
        let t = inner.clone();
        let thread = std::thread::Builder::new()
            .name(format!("exs-progress-{}", id.0))
            .spawn(move || t.progress())
            .map_err(|e| ferry_fabric::FabricError::io("spawn EXS progress thread", e))?;
        let _ = inner.thread.set(thread.thread().clone());
        let sock = ExsSocket {
            inner,
            thread: Some(thread),
        };
        first(&sock);
        if let Err(e) = sock.wait_open(timeout, cancel) {
            if cancel.is_some() {
                sock.let_go();
            }
            return Err(e);
        }
        Ok(sock)
    }

    /// Waits up to `timeout` for the handshake to finish; gives up early (with
    /// [`ExsError::Canceled`]) once `cancel` is set, which is looked at every [`CANCEL_POLL`].
    fn wait_open(&self, timeout: Duration, cancel: Option<&AtomicBool>) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        let mut e = self.inner.lock();
        loop {
            match e.phase {
                Phase::Open => return Ok(()),
                Phase::Closed => {
                    return Err(e.close_err.unwrap_or(ExsError::ConnectionReset).into())
                }
                Phase::Handshake => {}
            }
            if cancel.is_some_and(|c| c.load(Ordering::Acquire)) {
                return Err(ExsError::Canceled.into());
            }
            let mut left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout);
            }
            if cancel.is_some() {
                left = left.min(CANCEL_POLL);
            }
            e = self
                .inner
                .phase_changed
                .wait_timeout(e, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The settings this socket was made with.
    pub fn config(&self) -> Config {
        self.inner.lock().conn.config().clone()
    }

    /// This socket's id, as events report it.
    pub fn id(&self) -> SocketId {
        self.inner.id
    }

    /// Registers `buf` for use with this socket (`exs_mregister`), with remote read and write
    /// rights so it can serve every transfer mode. The peer can reach it only while an
    /// operation of this socket that needs it is posted (and only on this socket's
    /// connection); [`Self::register_with`] narrows the rights further.
    pub fn register(&self, buf: Buffer) -> Result<ExsBuf, Error> {
        self.register_with(buf, Access::ALL)
    }

    /// Registers `buf` with only the remote rights `access` (least privilege, for callers
    /// that know how their buffers are used): with pull, the default, the peer reads a send's
    /// buffer (`REMOTE_READ`) and receives need no remote right (`LOCAL`); with push
    /// ([`Config::push`]) the peer writes a receive's buffer (`REMOTE_WRITE`) and sends need
    /// none. Persistent blocks follow the same rule. A buffer without the right an operation
    /// needs fails it with [`ExsError::NotRemoteAccessible`]; messages up to the immediate
    /// size never need one.
    pub fn register_with(&self, buf: Buffer, access: Access) -> Result<ExsBuf, Error> {
        Ok(ExsBuf::new(self.inner.ep.domain().register(&buf, access)?))
    }

    /// Allocates and registers a zeroed buffer of `len` bytes.
    pub fn alloc(&self, len: usize) -> Result<ExsBuf, Error> {
        self.register(Buffer::new(len))
    }

    /// Allocates a zeroed buffer of `len` bytes registered with `access` (see
    /// [`Self::register_with`]).
    pub fn alloc_with(&self, len: usize, access: Access) -> Result<ExsBuf, Error> {
        self.register_with(Buffer::new(len), access)
    }

    /// Lets the peer of a socket accepted by a listener made with
    /// [`ExsListener::defer_remote_access`] reach the buffers posted for it by RMA: call it
    /// once the layer above has authenticated the peer. Until then the fabric refuses every
    /// RMA the peer asks for (and closes the connection after a few), so only messages up to
    /// the immediate size (and what this side pulls from the peer) can cross. Idempotent;
    /// sockets accepted otherwise, and connected ones, have it on from the start.
    pub fn enable_remote_access(&self) {
        self.inner.ep.enable_remote_access();
    }

    /// Lets the peer reach `buf`'s whole registration by RMA on this connection (and only
    /// this one), with the rights it was registered with, for as long as it stays
    /// registered: for a face that delegates memory to its peer and tells it the key itself
    /// (the block face's chunks). Grant before telling the key; drop the registration to
    /// take it back.
    pub fn grant(&self, buf: &ExsBuf) -> Result<(), Error> {
        Ok(self.inner.ep.grant(buf.region())?)
    }

    /// One-sided RMA for a face that manages remote memory itself: writes all of `buf` into
    /// `remote` (`write`) or reads `remote` into all of `buf` (their lengths must match).
    /// `remote` is a range the peer granted on this connection; its fabric checks the key,
    /// bounds and rights. An [`crate::proto::EventKind::Rma`] event hands the buffer back on
    /// `queue` (the socket's own queue or another), with its result.
    pub fn rma(
        &self,
        queue: &EventQueue,
        write: bool,
        buf: ExsBuf,
        remote: ferry_fabric::RemoteSlice,
        ctx: u64,
    ) {
        self.rma_v(queue, write, vec![buf], remote, ctx);
    }

    /// [`ExsSocket::rma`] over several local buffers as one operation: a write gathers
    /// `bufs` in order into `remote`, a read scatters `remote` over them (their lengths must
    /// add up to its length; at most [`ExsSocket::rma_gather`] of them). The event hands
    /// back the first buffer and the bytes of all.
    pub fn rma_v(
        &self,
        queue: &EventQueue,
        write: bool,
        bufs: Vec<ExsBuf>,
        remote: ferry_fabric::RemoteSlice,
        ctx: u64,
    ) {
        ferry_fabric::timeline::mark("exs.rma", ctx);
        let u = super::engine::UserRma {
            ctx,
            queue: queue.clone(),
            bufs,
        };
        self.inner.with(|e| e.user_rma(u, write, remote));
    }

    /// Most local buffers one [`ExsSocket::rma_v`] may gather or scatter on this
    /// connection's driver (1: no gathering).
    pub fn rma_gather(&self) -> usize {
        self.inner.ep.capabilities().rma_gather.max(1)
    }

    /// Whether an RMA write posted by [`ExsSocket::rma`] is in place at the peer before
    /// a message sent after it is delivered there (the driver orders send after write, as
    /// an InfiniBand RC queue pair does): a face may then name the written memory in a
    /// message without waiting for the write's completion.
    pub fn orders_send_after_write(&self) -> bool {
        self.inner.ep.capabilities().ordering.send_after_write
    }

    /// `exs_send`: sends all of `buf` as one message. The buffer comes back in the Send event.
    pub fn send(&self, buf: ExsBuf, flags: Flags, ctx: u64) {
        self.send_to(None, buf, 0, flags, ctx);
    }

    /// `exs_send` with an offset into the peer's persistent recv block.
    pub fn send_offset(&self, buf: ExsBuf, offset: u64, flags: Flags, ctx: u64) {
        self.send_to(None, buf, offset, flags, ctx);
    }

    /// `exs_send` in full: the completion goes to `queue` (None: the socket's queue).
    pub fn send_to(
        &self,
        queue: Option<&EventQueue>,
        buf: ExsBuf,
        offset: u64,
        flags: Flags,
        ctx: u64,
    ) {
        ferry_fabric::timeline::mark("exs.send", ctx);
        self.post(queue, ctx, Held::new(buf), |conn, token, held| {
            conn.send(token, held, flags, offset)
        });
    }

    /// `exs_recv`: receives the next message into `buf`. The buffer comes back in the Recv event.
    pub fn recv(&self, buf: ExsBuf, flags: Flags, ctx: u64) {
        self.recv_to(None, buf, 0, flags, ctx);
    }

    /// `exs_recv` of the range at `offset` of the peer's persistent send block.
    pub fn recv_offset(&self, buf: ExsBuf, offset: u64, flags: Flags, ctx: u64) {
        self.recv_to(None, buf, offset, flags, ctx);
    }

    /// `exs_recv` in full: the completion goes to `queue` (None: the socket's queue).
    pub fn recv_to(
        &self,
        queue: Option<&EventQueue>,
        buf: ExsBuf,
        offset: u64,
        flags: Flags,
        ctx: u64,
    ) {
        ferry_fabric::timeline::mark("exs.recv", ctx);
        self.post(queue, ctx, Held::new(buf), |conn, token, held| {
            conn.recv(token, held, flags, offset)
        });
    }

    /// Runs one user operation on the core, under the token that routes its completion,
    /// with its buffer granted to the peer first.
    fn post(
        &self,
        queue: Option<&EventQueue>,
        ctx: u64,
        held: Held,
        op: impl FnOnce(&mut Connection<Held>, u64, Held),
    ) {
        self.inner.with(|e| {
            e.grant(&held);
            let token = e.route(ctx, queue);
            op(&mut e.conn, token, held)
        });
    }

    /// `exs_sendfile`: sends `len` bytes of `file` from `offset` as one message (the
    /// completion goes to `queue`, None: the socket's). The bytes
    /// go straight from the page cache: the range is mapped (copy-on-write, so nothing can
    /// write the file), registered for remote read and advertised, and the peer pulls it, so
    /// no user-space copy happens on the drivers that read registered memory in place
    /// (native tcp writes it to the socket, shm reads it by CMA, verbs by the NIC). Ranges up
    /// to the immediate size are read into a small buffer instead, as mapping costs more.
    ///
    /// The Send event hands back a buffer over the mapping; dropping it unmaps. The file must
    /// not be truncated below `offset + len` while the send is in flight (mapped pages past
    /// the end of a file raise SIGBUS), as with every zero-copy file path.
    pub fn sendfile(
        &self,
        queue: Option<&EventQueue>,
        file: &std::fs::File,
        offset: u64,
        len: u64,
        flags: Flags,
        ctx: u64,
    ) -> Result<(), Error> {
        let size = file
            .metadata()
            .map_err(|e| ferry_fabric::FabricError::io("stat file to send", e))?
            .len();
        let fits = offset.checked_add(len).is_some_and(|end| end <= size);
        let len = usize::try_from(len).ok().filter(|_| fits).ok_or_else(|| {
            ferry_fabric::FabricError::InvalidArgument(format!(
                "sendfile range {offset}+{len} outside file of {size} bytes"
            ))
        })?;
        let buf = if len <= self.inner.lock().conn.immediate_max() as usize {
            let mut v = vec![0; len];
            std::os::unix::fs::FileExt::read_exact_at(file, &mut v, offset)
                .map_err(|e| ferry_fabric::FabricError::io("read file to send", e))?;
            Buffer::from_slice(&v)
        } else {
            Buffer::map_file(file, offset, len)?
        };
        let region = self.inner.ep.domain().register(&buf, Access::REMOTE_READ)?;
        self.send_to(queue, ExsBuf::new(region), 0, flags, ctx);
        Ok(())
    }

    /// `exs_poll`'s view of the socket, at this instant.
    pub fn readiness(&self) -> super::Readiness {
        let e = self.inner.lock();
        let open = e.phase == Phase::Open;
        super::Readiness {
            readable: e.conn.waiting_messages() > 0,
            writable: open && e.conn.credits().available > 0,
            closed: e.phase == Phase::Closed,
        }
    }

    /// This side's address (`exs_getsockname`), e.g. `tcp://127.0.0.1:40112`.
    pub fn local_addr(&self) -> String {
        self.inner.ep.local()
    }

    /// The peer's address (`exs_getpeername`).
    pub fn peer_addr(&self) -> String {
        self.inner.ep.peer()
    }

    /// The smallest round trip the transport measured on this connection so far (the tcp
    /// driver's `TCP_INFO`), if its driver measures one.
    pub fn path_rtt(&self) -> Option<Duration> {
        self.inner.ep.path_rtt()
    }

    /// Reads [`ExsSocket::path_rtt`] from another thread while the socket's owner uses it
    /// (a copy's controller watching its streams). Keep it no longer than the socket.
    pub fn rtt_probe(&self) -> impl Fn() -> Option<Duration> + Send + Sync + 'static {
        let ep = self.inner.ep.clone();
        move || ep.path_rtt()
    }

    /// `exs_close`: tells the peer and completes every pending operation (with
    /// [`ExsError::Canceled`]); a Close event follows on the queue. A second call fails with
    /// [`ExsError::NotConnected`].
    pub fn close(&self) -> Result<(), ExsError> {
        self.inner.with(|e| {
            if e.user_closed {
                return Err(ExsError::NotConnected);
            }
            e.user_closed = true;
            e.conn.close();
            Ok(())
        })
    }

    /// A handle that can close this socket from another thread ([`Closer`]).
    pub fn closer(&self) -> Closer {
        Closer(self.inner.clone())
    }

    /// Splits this side's RMA transfers into pieces of at most `bytes` (default: the
    /// driver's measured `Capabilities::rma_piece`; `u64::MAX` turns splitting off). They are
    /// always split at the driver's `max_msg_size`.
    pub fn set_rma_chunk(&self, bytes: u64) {
        self.inner.lock().rma_chunk = bytes.max(1);
    }

    /// True from the handshake until the connection closes (either side).
    pub fn is_connected(&self) -> bool {
        self.inner.lock().phase == Phase::Open
    }

    /// The connection's counters.
    pub fn stats(&self) -> Stats {
        *self.inner.lock().conn.stats()
    }

    /// The runtime's own counters.
    pub fn runtime_stats(&self) -> super::RuntimeStats {
        self.inner.lock().stats
    }

    /// The credit counters.
    pub fn credits(&self) -> CreditState {
        self.inner.lock().conn.credits()
    }

    /// The largest message that travels inside its advertisement: the smaller of both
    /// sides' `small_packet_max_size`, as the handshake settled it.
    pub fn immediate_max(&self) -> usize {
        usize::try_from(self.inner.lock().conn.immediate_max()).unwrap_or(usize::MAX)
    }

    /// The driver's name and provider (for logs and benchmarks).
    pub fn driver(&self) -> String {
        self.inner.ep.capabilities().provider.clone()
    }

    /// Drops the socket without telling the peer, as a crashed process would (tests only).
    #[doc(hidden)]
    pub fn abort(mut self) {
        self.stop_thread(false);
        self.inner.lock().user_closed = true;
    }

    /// Closes the socket and leaves its progress thread to end on its own (within a
    /// [`TICK`]; it holds what it needs): for a server calling off handshakes under a flood
    /// of them, so the caller is not held up joining threads at every one.
    fn let_go(mut self) {
        let _ = self.close();
        self.inner.stop.store(true, Ordering::Release);
        drop(self.thread.take());
    }

    /// Closes the socket as dropping it does, but ends its progress thread at once instead
    /// of letting it finish its current wait (up to a [`TICK`], 20 ms): for a caller whose
    /// peer has nothing more in flight to it, such as a client after its goodbye. A
    /// plain drop keeps that wait, which leaves a peer that is still sending time to have
    /// its frames taken before the endpoint goes: closed at once, a peer's sends in
    /// flight fail, and it may see the connection reset before it reads what this side
    /// sent last (a listener refusing a handshake was seen so).
    pub fn hang_up(mut self) {
        self.finish(true);
    }

    /// Closes (unless the user did), lets the last frames leave, stops the progress thread.
    fn finish(&mut self, at_once: bool) {
        if !self.inner.lock().user_closed {
            let _ = self.close();
        }
        // Let the CLOSE frame (and any other frame) leave before the endpoint goes away.
        let deadline = Instant::now() + LINGER;
        while self.thread.is_some()
            && self.inner.lock().frames_out() > 0
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.stop_thread(at_once);
    }

    /// Stops the progress thread and waits for it; `at_once` wakes it out of its wait
    /// instead of letting the wait run out.
    fn stop_thread(&mut self, at_once: bool) {
        self.inner.stop.store(true, Ordering::Release);
        let Some(t) = self.thread.take() else {
            return;
        };
        if at_once {
            self.inner.ep.cq().signal();
            t.thread().unpark();
        }
        let _ = t.join();
    }
}

impl Drop for ExsSocket {
    fn drop(&mut self) {
        self.finish(false);
    }
}

/// A listening EXS address (`exs_listen`).
pub struct ExsListener {
    listener: Box<dyn Listener>,
    cfg: Config,
    /// Accepted sockets serve RMA only after [`ExsSocket::enable_remote_access`].
    deferred: bool,
}

impl ExsListener {
    /// Binds `addr` (port 0 picks a free port; see [`Self::local_addr`]). Accepted sockets use
    /// `cfg`.
    pub fn bind(addr: &str, cfg: Config) -> Result<ExsListener, Error> {
        cfg.validate()?;
        let addr: Address = addr.parse()?;
        Ok(ExsListener {
            listener: ferry_fabric::listen(&addr)?,
            cfg,
            deferred: false,
        })
    }

    /// Makes the sockets this listener accepts serve no RMA to their peer until
    /// [`ExsSocket::enable_remote_access`]: for servers that authenticate their clients over
    /// EXS itself. EXS has no authentication of its own, so by default an accepted socket
    /// serves its peer as soon as it is accepted (its buffers, granted to its connection only).
    pub fn defer_remote_access(mut self) -> Self {
        self.deferred = true;
        self
    }

    /// The fabric endpoint of an accepted connection, remote access on unless deferred.
    fn accepted(&self, timeout: Duration) -> Result<Box<dyn Endpoint>, Error> {
        let ep = self.listener.accept(timeout)?;
        if !self.deferred {
            ep.enable_remote_access();
        }
        Ok(ep)
    }

    /// The address clients connect to, as text.
    pub fn local_addr(&self) -> String {
        self.listener.local_addr().to_string()
    }

    /// Waits up to `timeout` for a connection and its handshake (`exs_accept`).
    pub fn accept(&self, queue: &EventQueue, timeout: Duration) -> Result<ExsSocket, Error> {
        let start = Instant::now();
        let ep = self.accepted(timeout)?;
        let left = timeout.saturating_sub(start.elapsed()).max(TICK);
        ExsSocket::start(Arc::from(ep), self.cfg.clone(), queue, left, None, |_| {})
    }

    /// Waits up to `timeout` for the next connection and hands it over without starting EXS
    /// on it: the caller picks its event queue later with [`ExsIncoming::start`]. Lets a
    /// caller accept ahead of time (a backlog, readiness for `exs_poll`) and wait for
    /// connections in short slices without cutting a handshake short.
    pub fn accept_incoming(&self, timeout: Duration) -> Result<ExsIncoming, Error> {
        Ok(ExsIncoming {
            ep: self.accepted(timeout)?,
            cfg: self.cfg.clone(),
        })
    }
}

/// A connection taken from an [`ExsListener`] whose EXS handshake has not started
/// ([`ExsListener::accept_incoming`]). The peer's HELLO waits at the fabric meanwhile;
/// dropping it closes the connection.
pub struct ExsIncoming {
    ep: Box<dyn Endpoint>,
    cfg: Config,
}

impl std::fmt::Debug for ExsIncoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExsIncoming")
            .field("peer", &self.ep.peer())
            .finish()
    }
}

impl ExsIncoming {
    /// Starts EXS on the connection with events going to `queue`, and waits up to `timeout`
    /// for the handshake.
    pub fn start(self, queue: &EventQueue, timeout: Duration) -> Result<ExsSocket, Error> {
        ExsSocket::start(Arc::from(self.ep), self.cfg, queue, timeout, None, |_| {})
    }

    /// Like [`ExsIncoming::start`], but a server can call the handshake off from another
    /// thread by setting `cancel` (to make room for a newer connection, say): the wait ends
    /// within about ten milliseconds with [`ExsError::Canceled`] and the connection
    /// closes.
    pub fn start_cancellable(
        self,
        queue: &EventQueue,
        timeout: Duration,
        cancel: &AtomicBool,
    ) -> Result<ExsSocket, Error> {
        ExsSocket::start(
            Arc::from(self.ep),
            self.cfg,
            queue,
            timeout,
            Some(cancel),
            |_| {},
        )
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> String {
        self.ep.peer()
    }
}
