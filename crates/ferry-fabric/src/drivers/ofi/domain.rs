//! The ofi domain: one RDM endpoint (with its CQ and AV) shared by every connection of the
//! domain, the connection handshake, and the listener.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use ferry_ofi_sys as sys;

use super::endpoint::{peer_gone, Conn, Liveness, OfiEndpoint};
use super::ffi::{self, errno, Event, Fabric, FiAddr, Info, Meta, ADDR_UNSPEC};
use super::gate::{Gate, Job};
use super::progress::{self, Op, Purpose};
use super::rma::Checked;
use super::wedge::{self, wedged_error};
use super::wire::{self, Control};
use super::{info, lock, CONTROL_TAG};
use crate::caps::Capabilities;
use crate::error::{FabricError, Result};
use crate::mem::{next_domain_id, Access, Buffer, DomainId, LocalSlice, MemoryRegion};
use crate::{Address, Domain, Endpoint, Listener};

/// Standing receives for control messages; more than one so a burst of handshakes is not
/// left to the provider's unexpected-message buffering.
const CONTROL_SLOTS: usize = 4;

/// CONNECTs queued for `accept` at most; more are ignored (their clients time out).
const BACKLOG: usize = 1024;

/// How long a post keeps retrying while the provider reports -FI_EAGAIN (its queues full,
/// e.g. because the peer stopped progressing) before it fails with `Timeout`.
const POST_STALL: Duration = Duration::from_secs(5);

/// How long closing a domain waits for operations in flight to finish before cancelling them.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

/// How long `connect` pauses before sending CONNECT again after the provider reported the
/// transport to the listener as going down (tcp: until ofi_rxm notices and reconnects).
const CONNECT_RETRY: Duration = Duration::from_millis(10);

/// How long a peer that answers PINGs may stay silent before its connection is declared
/// lost, unless `FERRY_OFI_PEER_TIMEOUT` (seconds, fractions allowed) says otherwise. RDM
/// providers report a dead peer only to operations that reach it, and shm not even then;
/// without this, a recv waiting on a killed peer would wait forever.
const PEER_TIMEOUT: Duration = Duration::from_secs(10);

/// The first minor version of the control protocol that answers PINGs (1.1).
const PING_MINOR: u16 = 1;

/// The minor version in a control message's header (`magic "FOFI" | major u16 | minor u16`,
/// frozen across versions, see `wire.rs`); 0 if the message is too short to say.
fn peer_minor(msg: &[u8]) -> u16 {
    msg.get(6..8)
        .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]))
}

/// The shm regions of the domains this process closed. libfabric 1.17's shm keeps a closed
/// endpoint's name in its process-wide list (`ep_name_list`; `smr_free` unmaps the region
/// but never removes the entry), and `fi_av_insert` of that name later maps to the unmapped
/// region: SIGSEGV in `smr_cma_check`. So this process never inserts such a name again.
static CLOSED_SHM_REGIONS: Mutex<std::collections::BTreeSet<String>> =
    Mutex::new(std::collections::BTreeSet::new());

/// Whether an shm peer can be reached: its region exists (a listener removes it when it
/// closes: nobody listens there, ECONNREFUSED at once rather than a CONNECT timing out) and
/// is not one this process closed (see [`CLOSED_SHM_REGIONS`]).
fn shm_reachable(region: &str) -> Result<()> {
    let refused = |why: String| {
        FabricError::io(
            why,
            std::io::Error::from_raw_os_error(rustix::io::Errno::CONNREFUSED.raw_os_error()),
        )
    };
    if lock(&CLOSED_SHM_REGIONS).contains(region) {
        return Err(refused(format!(
            "ofi+shm://{region} was closed by this process, which libfabric 1.17's shm cannot reach again"
        )));
    }
    let exists = !region.contains('/') && std::path::Path::new("/dev/shm").join(region).exists();
    if !exists {
        return Err(refused(format!("nothing listens at ofi+shm://{region}")));
    }
    Ok(())
}

/// Tells a tcp listener that is not there. ofi_rxm 1.17 answers a send to a peer whose
/// connection is refused with -FI_EAGAIN forever (`rxm_get_conn` restarts the connect each
/// time; the refusal only reaches its log), so a CONNECT would wait out the whole connect
/// timeout. While the CONNECT is not taken, this tries a plain TCP connection to the
/// listener's port (after 50 ms, then every 250 ms): refused means nobody listens.
struct RefusalProbe {
    listener: Option<std::net::SocketAddr>,
    next: Instant,
}

impl RefusalProbe {
    /// The first probe comes after this long (a listener there takes the CONNECT at once).
    const FIRST: Duration = Duration::from_millis(50);
    /// Then one probe per this long.
    const EVERY: Duration = Duration::from_millis(250);

    /// The socket address to probe for a connect to `addr`: only for tcp providers, whose
    /// listener is a TCP socket on the address's port (verbs' rdma_cm port is not).
    fn target(addr: &Address) -> Option<std::net::SocketAddr> {
        use std::net::ToSocketAddrs;
        match &addr.scheme {
            crate::Scheme::Ofi(p) if p.starts_with("tcp") && addr.port.is_some() => {
                addr.host_port().to_socket_addrs().ok()?.next()
            }
            _ => None,
        }
    }

    fn new(listener: Option<std::net::SocketAddr>) -> Self {
        RefusalProbe {
            listener,
            next: Instant::now() + Self::FIRST,
        }
    }

    /// Fails with ECONNREFUSED when a probe is due and refused.
    fn check(&mut self) -> Result<()> {
        let Some(at) = self.listener.filter(|_| Instant::now() >= self.next) else {
            return Ok(());
        };
        self.next = Instant::now() + Self::EVERY;
        match std::net::TcpStream::connect_timeout(&at, Self::EVERY) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Err(FabricError::io(
                format!("connect to {at}: nothing listens there"),
                e,
            )),
            _ => Ok(()),
        }
    }
}

/// Keepalive timing: PING a connection quiet for `every`; give up after `limit`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Keepalive {
    pub every: Duration,
    pub limit: Duration,
}

impl Keepalive {
    fn from_env() -> Self {
        let limit = std::env::var("FERRY_OFI_PEER_TIMEOUT")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .filter(|d| !d.is_zero())
            .unwrap_or(PEER_TIMEOUT);
        Keepalive {
            every: (limit / 4).min(Duration::from_secs(1)),
            limit,
        }
    }
}

/// A connection attempt waiting for the listener's answer.
struct Connecting {
    peer: FiAddr,
    /// The listener's name, for the connection's description.
    name: Vec<u8>,
    /// `None` once `connect` gave up; a late ACCEPT is then answered with DISCONNECT.
    reply: Option<mpsc::SyncSender<Reply>>,
}

/// What became of a CONNECT.
pub(super) enum Reply {
    /// Accepted: the connection, registered before any later message from the peer is read.
    Accepted(Arc<Conn>),
    /// Refused or undeliverable.
    Failed(FabricError),
    /// Undeliverable for now (the transport is being torn down); worth sending again.
    Retry(FabricError),
}

/// A CONNECT waiting for `accept`.
struct ConnectRequest {
    major: u16,
    /// The client's minor version (from 1 on it answers PINGs).
    minor: u16,
    conn: u64,
    name: Vec<u8>,
}

/// Pending CONNECTs of a listening domain.
struct AcceptQueue {
    queue: Mutex<VecDeque<ConnectRequest>>,
    ready: Condvar,
    /// False once the listener is dropped: further CONNECTs are ignored.
    open: AtomicBool,
}

/// State shared by the domain's handles, its endpoints and its progress thread.
pub(super) struct Shared {
    /// The libfabric objects.
    pub fab: Fabric,
    /// Process-unique id (regions carry it).
    pub id: DomainId,
    /// What the provider can do.
    pub caps: Capabilities,
    /// The provider can filter receives by source.
    pub directed: bool,
    /// The address the domain was opened for (its scheme names the provider).
    addr: Address,
    /// Address format of the provider's names.
    pub format: u32,
    /// This endpoint's own name.
    name: Vec<u8>,
    /// The same, as a ferry address (`getsockname`).
    pub local_text: String,
    /// The bits of a requested MR key the provider keeps (`mr_key_size`).
    key_mask: u64,
    next_conn: AtomicU64,
    av: Mutex<HashMap<Vec<u8>, FiAddr>>,
    /// Live connections by id, for DISCONNECT.
    conns: Mutex<HashMap<u64, Weak<Conn>>>,
    connecting: Mutex<HashMap<u64, Connecting>>,
    accept: Option<AcceptQueue>,
    /// Checked-RMA state, on providers that need it.
    pub rma: Option<Checked>,
    /// Buffers of the standing control receives (released before the endpoint closes).
    control: Mutex<Option<MemoryRegion>>,
    stop: AtomicBool,
    /// Closing: control receives are no longer reposted.
    closing: AtomicBool,
    /// The progress thread is (about to be) asleep and must be woken for new work.
    pub sleeping: AtomicBool,
    thread: OnceLock<Thread>,
    /// Dead-peer detection timing.
    pub keepalive: Keepalive,
    /// Who may call into the provider (`gate.rs`).
    pub gate: Gate,
    /// How long a provider call may run before the domain is declared wedged (`wedge.rs`).
    pub wedge_after: Duration,
}

impl Shared {
    /// The address scheme (names the provider).
    pub fn scheme(&self) -> String {
        self.addr.driver_name()
    }

    /// Declares the domain wedged if a provider call has been running for `after`: fails
    /// its connections, connection attempts and pending accepts, and every operation in
    /// flight, without calling into the provider. True if it was declared wedged now.
    pub fn check_wedge(&self, after: Duration) -> bool {
        if self.fab.watch.stuck_for().is_none_or(|d| d < after) || !self.gate.set_wedged() {
            return false;
        }
        let conns: Vec<Arc<Conn>> = lock(&self.conns)
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for c in &conns {
            c.abort();
        }
        self.fab.report_stranded(|op| {
            if let Purpose::User {
                conn,
                context,
                kind,
                ..
            } = &op.purpose
            {
                conn.cq
                    .push(crate::Completion::err(*context, *kind, wedged_error()));
            }
        });
        let attempts: Vec<u64> = lock(&self.connecting).keys().copied().collect();
        for id in attempts {
            self.connect_failed(id, Reply::Failed(wedged_error()));
        }
        if let Some(q) = &self.accept {
            let _queue = lock(&q.queue);
            q.ready.notify_all();
        }
        true
    }

    /// True once the domain is closing.
    pub fn stopping(&self) -> bool {
        self.stop.load(SeqCst)
    }

    /// True if sends or RMAs are in flight (they finish only as this side progresses), or
    /// checked RMAs wait for their grant; unlike [`Self::user_ops_in_flight`], posted
    /// receives do not count.
    pub fn active_ops(&self) -> bool {
        self.fab.active() > 0
            || self.gate.has_bulk()
            || self.rma.as_ref().is_some_and(Checked::waiting)
    }

    /// True if user operations (beyond the standing control receives) are in flight, or
    /// checked RMAs wait for their grant or, granted, for their turn.
    pub fn user_ops_in_flight(&self) -> bool {
        self.fab.in_flight() > CONTROL_SLOTS
            || self.gate.has_bulk()
            || self.rma.as_ref().is_some_and(Checked::waiting)
    }

    /// Makes sure the progress thread will look at the CQ soon.
    pub fn wake(&self) {
        if self.sleeping.load(SeqCst) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    /// A retry hook for posts that hit -FI_EAGAIN: progress the CQ from this thread, give up
    /// after [`POST_STALL`].
    pub fn again(&self) -> impl FnMut() -> Result<()> + '_ {
        self.again_until(Instant::now() + POST_STALL)
    }

    /// [`Shared::again`], giving up at `deadline`.
    fn again_until(&self, deadline: Instant) -> impl FnMut() -> Result<()> + '_ {
        let stall = deadline.saturating_duration_since(Instant::now());
        move || {
            if progress::progress(self) == 0 {
                std::thread::yield_now();
            }
            if Instant::now() >= deadline {
                return Err(FabricError::Timeout(stall));
            }
            Ok(())
        }
    }

    fn register(&self, buf: &Buffer, access: Access) -> Result<MemoryRegion> {
        self.gate.check()?;
        let mut flags = (sys::FI_SEND | sys::FI_RECV | sys::FI_READ | sys::FI_WRITE) as u64;
        if access.contains(Access::REMOTE_READ) {
            flags |= sys::FI_REMOTE_READ as u64;
        }
        if access.contains(Access::REMOTE_WRITE) {
            flags |= sys::FI_REMOTE_WRITE as u64;
        }
        // Requested keys are drawn at random per registration (as wide as the provider
        // keeps them), so one key tells nothing about the next; a provider that picks its own
        // (FI_MR_PROV_KEY) ignores the request. A requested key must be unique in the domain:
        // a clash (likely only with narrow keys) is retried with a fresh one.
        let mut tries = 0;
        let mr = loop {
            // Never 0, which EXS reads as "no remote buffer" (with offset 0).
            let key = (rand::random::<u64>() & self.key_mask).max(1) & self.key_mask;
            match self.fab.register(buf, flags, key) {
                Err(_) if tries < 3 => tries += 1,
                done => break done?,
            }
        };
        let region = MemoryRegion::new(
            buf.clone(),
            access,
            mr.key(),
            self.id,
            self.caps.virt_addr,
            Box::new(mr),
        );
        Ok(region)
    }

    /// The live connection with id `id`.
    pub fn conn(&self, id: u64) -> Option<Arc<Conn>> {
        lock(&self.conns).get(&id).and_then(Weak::upgrade)
    }

    /// The AV handle of a peer name, inserting it once.
    pub fn peer(&self, name: &[u8]) -> Result<FiAddr> {
        let mut av = lock(&self.av);
        if let Some(&a) = av.get(name) {
            return Ok(a);
        }
        if let Some(region) = self.shm_region(name) {
            shm_reachable(&region)?;
        }
        let a = self.fab.av_insert(name)?;
        av.insert(name.to_vec(), a);
        Ok(a)
    }

    /// The shm region name (`/dev/shm/NAME`) of a peer name, on the shm provider.
    fn shm_region(&self, name: &[u8]) -> Option<String> {
        let text = info::to_address(&self.addr, self.format, name).to_string();
        text.strip_prefix("ofi+shm://").map(str::to_owned)
    }

    /// This endpoint's own shm region name, on the shm provider.
    pub fn own_shm_region(&self) -> Option<String> {
        self.shm_region(&self.name)
    }

    /// Sends a control message to `peer`: injected where it fits (all but CONNECT on the
    /// providers tested), else from a freshly registered buffer.
    pub fn send_control(&self, peer: FiAddr, msg: &Control) -> Result<()> {
        self.send_control_or(peer, msg, |_, e| {
            tracing::debug!("control message not sent: {e}")
        })
    }

    /// [`Self::send_control`]; if the send had to be queued (`gate.rs`) and then fails,
    /// `fail` is told instead of the caller.
    pub fn send_control_or(
        &self,
        peer: FiAddr,
        msg: &Control,
        fail: impl FnOnce(&Shared, FabricError) + Send + 'static,
    ) -> Result<()> {
        let bytes = msg.encode();
        if bytes.len() <= self.caps.inline_size {
            let run = move |sh: &Shared| {
                sh.fab.inject(&bytes, peer, CONTROL_TAG, &mut sh.again())?;
                sh.wake();
                Ok(())
            };
            return self.gate.call(self, Job::new(run, fail));
        }
        let region = self.register(&Buffer::from_slice(&bytes), Access::LOCAL)?;
        let run = move |sh: &Shared| {
            sh.send_control_region(peer, region, None, Instant::now() + POST_STALL, None)
        };
        self.gate.call(self, Job::new(run, fail))
    }

    /// Sends a registered control message, giving up at `deadline` if the provider keeps
    /// saying -FI_EAGAIN.
    /// Sends a control message from `region`, retrying until `deadline`; for a CONNECT to
    /// a tcp listener at `listener`, also fails once [`RefusalProbe`] finds nobody there.
    fn send_control_region(
        &self,
        peer: FiAddr,
        region: MemoryRegion,
        connect: Option<u64>,
        deadline: Instant,
        listener: Option<std::net::SocketAddr>,
    ) -> Result<()> {
        let op = Op {
            slices: vec![region.full()],
            purpose: Purpose::ControlSend { connect },
        };
        let _inside = self.gate.enter_wait(self)?;
        let mut again = self.again_until(deadline);
        let mut probe = RefusalProbe::new(listener);
        self.fab.send(op, peer, CONTROL_TAG, 0, &mut || {
            again()?;
            probe.check()
        })?;
        self.wake();
        Ok(())
    }

    fn post_control_recv(&self, slice: LocalSlice) -> Result<()> {
        let op = Op {
            slices: vec![slice],
            purpose: Purpose::ControlRecv,
        };
        let meta = Meta {
            conn: 0,
            recv_seq: Some(0),
            lost: false,
        };
        // Reposts happen while routing completions, possibly on a thread already inside a
        // retry loop: wait by yielding instead of progressing again.
        let run = move |sh: &Shared| {
            let deadline = Instant::now() + POST_STALL;
            let mut again = || {
                std::thread::yield_now();
                if Instant::now() >= deadline {
                    Err(FabricError::Timeout(POST_STALL))
                } else {
                    Ok(())
                }
            };
            sh.fab.recv(op, ADDR_UNSPEC, CONTROL_TAG, meta, &mut again)
        };
        self.gate
            .call(self, Job::logged("cannot repost a control receive", run))
    }

    /// Handles a completed control receive and posts it again.
    pub fn on_control(&self, ev: Event, slices: Vec<LocalSlice>) {
        let msg = match (ev.err, slices.first()) {
            (Some(e), _) if e.code == errno::ECANCELED => return,
            (Some(e), _) => {
                tracing::debug!("control receive failed: {}", ffi::strerror(e.code));
                None
            }
            (None, Some(s)) if ev.len > s.len => {
                // Not ours (none is that long); the excess went to the sink.
                self.fab.release_sink();
                tracing::debug!("ignoring a {}-byte control message", ev.len);
                None
            }
            (None, Some(s)) => {
                let mut msg = vec![0u8; ev.len];
                s.region.buffer().read_at(s.offset, &mut msg);
                Some(msg)
            }
            (None, None) => None,
        };
        if !self.closing.load(SeqCst) {
            for s in slices {
                if let Err(e) = self.post_control_recv(s) {
                    tracing::warn!("cannot repost a control receive: {e}");
                }
            }
        }
        match msg.map(|m| (peer_minor(&m), Control::decode(&m))) {
            Some((minor, Ok(c))) => self.handle(c, minor),
            Some((_, Err(why))) => tracing::debug!("ignoring control message: {why}"),
            None => {}
        }
    }

    /// Handles a control message from a peer speaking minor version `minor`.
    fn handle(&self, msg: Control, minor: u16) {
        match msg {
            Control::Connect { major, conn, name } => match &self.accept {
                Some(q) if q.open.load(SeqCst) => {
                    let mut queue = lock(&q.queue);
                    if queue.len() < BACKLOG {
                        queue.push_back(ConnectRequest {
                            major,
                            minor,
                            conn,
                            name,
                        });
                        q.ready.notify_one();
                    }
                }
                _ => tracing::debug!("CONNECT to a domain that is not listening"),
            },
            Control::Accept { target, conn } => {
                let entry = lock(&self.connecting).remove(&target);
                match entry {
                    Some(Connecting {
                        peer,
                        name,
                        reply: Some(tx),
                    }) => match self.new_conn(target, conn, peer, &name, minor) {
                        Ok(c) => {
                            if tx.try_send(Reply::Accepted(c)).is_err() {
                                self.remove_conn(target);
                            }
                        }
                        Err(e) => {
                            let _ = tx.try_send(Reply::Failed(e));
                        }
                    },
                    Some(Connecting {
                        peer, reply: None, ..
                    }) => {
                        // connect() gave up: close the connection the listener just made.
                        let bye = Control::Disconnect {
                            target: conn,
                            sender: target,
                            sent: 0,
                        };
                        if let Err(e) = self.send_control(peer, &bye) {
                            tracing::debug!("cannot close an abandoned connection: {e}");
                        }
                    }
                    None => tracing::debug!("ACCEPT for unknown connection {target}"),
                }
            }
            Control::Refuse { target, major } => {
                self.connect_failed(
                    target,
                    Reply::Failed(FabricError::VersionMismatch {
                        peer_major: major,
                        our_major: wire::MAJOR,
                    }),
                );
            }
            Control::Disconnect {
                target,
                sender,
                sent,
            } => match self.conn(target) {
                Some(c) if c.peer_id == sender => {
                    c.peer_left(sent);
                    self.reap(&c);
                    self.fail_pending_rma(c.id, peer_gone);
                }
                _ => tracing::debug!("DISCONNECT for unknown connection {target}"),
            },
            Control::RmaRequest {
                target,
                sender,
                token,
                remote,
                write,
            } => self.on_rma_request(target, sender, token, remote, write),
            Control::RmaAnswer {
                target,
                token,
                status,
            } => self.on_rma_answer(target, token, status),
            Control::RmaDone { target, token, .. } => self.on_rma_done(target, token),
            Control::Ping { target, sender } => match self.conn(target) {
                Some(c) if c.peer_id == sender => {
                    c.heard(false);
                    let pong = Control::Pong {
                        target: sender,
                        sender: target,
                    };
                    if let Err(e) = self.try_send_control(c.peer, &pong) {
                        tracing::debug!("cannot answer a PING from {}: {e}", c.peer_text);
                    }
                }
                _ => tracing::debug!("PING for unknown connection {target}"),
            },
            Control::Pong { target, sender } => match self.conn(target) {
                Some(c) if c.peer_id == sender => c.heard(true),
                _ => tracing::debug!("PONG for unknown connection {target}"),
            },
        }
    }

    /// Sends a small control message if the provider takes it within a millisecond: for
    /// keepalives, which the progress thread sends and which must never stall it (a dead
    /// peer's queue may stay full forever). The next round tries again.
    pub fn try_send_control(&self, peer: FiAddr, msg: &Control) -> Result<()> {
        let bytes = msg.encode();
        if bytes.len() > self.caps.inline_size {
            return self.send_control(peer, msg);
        }
        let run = move |sh: &Shared| {
            let deadline = Instant::now() + Duration::from_millis(1);
            sh.fab
                .inject(&bytes, peer, CONTROL_TAG, &mut sh.again_until(deadline))?;
            sh.wake();
            Ok(())
        };
        self.gate
            .call(self, Job::logged("control message not sent", run))
    }

    /// One keepalive round (the progress thread runs it every `keepalive.every / 2`):
    /// PINGs quiet peers, and aborts the connections of peers that answered PINGs before
    /// but have now been silent longer than `keepalive.limit`.
    pub fn keepalive(&self) {
        let conns: Vec<Arc<Conn>> = lock(&self.conns)
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        let Keepalive { every, limit } = self.keepalive;
        for c in conns.iter().filter(|c| c.peer_closed().is_none()) {
            match c.liveness(every, limit) {
                Liveness::Fine => {}
                Liveness::Ping => {
                    let ping = Control::Ping {
                        target: c.peer_id,
                        sender: c.id,
                    };
                    if let Err(e) = self.try_send_control(c.peer, &ping) {
                        tracing::debug!("cannot PING {}: {e}", c.peer_text);
                    }
                }
                Liveness::Dead => {
                    tracing::warn!("{} silent for {limit:?}: connection lost", c.peer_text);
                    self.abort(c);
                }
            }
        }
    }

    /// Fails connection attempt `id` (`reply` is `Failed` or `Retry`).
    pub fn connect_failed(&self, id: u64, reply: Reply) {
        let entry = lock(&self.connecting).remove(&id);
        if let Some(Connecting {
            reply: Some(tx), ..
        }) = entry
        {
            let _ = tx.try_send(reply);
        }
    }

    /// After the peer of `conn` closed: cancels the receives its remaining messages cannot
    /// satisfy (the newest ones; receives match in posting order), reporting them as
    /// `ConnectionLost`. Called whenever the counts change, so races between threads only
    /// ever delay a cancellation until the next call.
    pub fn reap(&self, conn: &Conn) {
        let Some(sent) = conn.peer_closed() else {
            return;
        };
        let expecting = sent.saturating_sub(conn.received.load(SeqCst));
        let pending = self.fab.pending_recvs(conn.id);
        let Some(&first_surplus) = usize::try_from(expecting).ok().and_then(|i| pending.get(i))
        else {
            return;
        };
        let id = conn.id;
        self.cancel_recvs(move |m| {
            let surplus = m.conn == id && m.recv_seq >= Some(first_surplus);
            m.lost |= surplus;
            surplus
        });
        self.wake();
    }

    /// Cancels the receives `select` picks (see `Fabric::cancel_recvs`), through the gate.
    pub fn cancel_recvs(&self, select: impl FnMut(&mut Meta) -> bool + Send + 'static) {
        let run = move |sh: &Shared| {
            sh.fab.cancel_recvs(select);
            Ok(())
        };
        let _ = self.gate.call(self, Job::logged("cancel", run));
    }

    /// Gives up on `conn` after the provider lost its transport (messages may be lost): its
    /// receives fail, later posts fail, and the peer is told to do the same.
    pub fn abort(&self, conn: &Conn) {
        let _ = self.abort_because(conn, "the provider lost the transport");
    }

    /// Gives up on `conn` as [`Shared::abort`] does, failing what is pending with `why`.
    /// False if it was closed already.
    pub fn abort_because(&self, conn: &Conn, why: &'static str) -> bool {
        let first = conn.abort();
        if first {
            let bye = Control::Disconnect {
                target: conn.peer_id,
                sender: conn.id,
                sent: 0,
            };
            if let Err(e) = self.try_send_control(conn.peer, &bye) {
                tracing::debug!("cannot tell {} about the abort: {e}", conn.peer_text);
            }
            self.reap(conn);
            self.fail_pending_rma(conn.id, || FabricError::ConnectionLost(why.into()));
        }
        first
    }

    /// Gives up on `conn` when a send to its peer stalled for [`POST_STALL`] (`err` is the
    /// timeout): the peer is dead or stopped (ofi_rxm retries a connection to a dead peer
    /// forever; shm's queue to it stays full), and the stream has lost a message anyway. Later
    /// posts then fail at once instead of stalling again.
    pub fn give_up_if_stalled(&self, conn: &Conn, err: &FabricError) {
        if matches!(err, FabricError::Timeout(_)) {
            self.abort_because(conn, "the peer took no message for 5 s");
        }
    }

    /// Registers a new connection to a peer speaking minor version `peer_minor`.
    fn new_conn(
        &self,
        id: u64,
        peer_id: u64,
        peer: FiAddr,
        peer_name: &[u8],
        peer_minor: u16,
    ) -> Result<Arc<Conn>> {
        let conn = Arc::new(Conn::new(
            id,
            peer_id,
            peer,
            info::to_address(&self.addr, self.format, peer_name).to_string(),
        )?);
        if peer_minor >= PING_MINOR {
            // Known to answer PINGs from the start: a peer that dies before its first PONG
            // is still noticed (otherwise it would be taken for a 1.0 peer, never timed out).
            conn.heard(true);
        }
        lock(&self.conns).insert(id, Arc::downgrade(&conn));
        Ok(conn)
    }

    fn drain_until(&self, deadline: Instant, busy: impl Fn() -> bool) {
        while busy() && Instant::now() < deadline {
            if progress::progress(self) == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Forgets a connection whose endpoint is gone.
    pub fn remove_conn(&self, id: u64) {
        lock(&self.conns).remove(&id);
    }

    /// Lets what is in flight finish (for a while), cancels the rest, closes the endpoint, and
    /// fails whatever never completed.
    fn close(&self) {
        if let Some(region) = self.shm_region(&self.name) {
            lock(&CLOSED_SHM_REGIONS).insert(region);
        }
        let deadline = Instant::now() + CLOSE_GRACE;
        // Operations in flight, and peers' RMAs into our regions (whose DONE arrives as a
        // control message), get a chance to finish.
        let busy = || self.user_ops_in_flight() || self.rma.as_ref().is_some_and(Checked::granted);
        self.drain_until(deadline, busy);
        self.closing.store(true, SeqCst);
        // Nobody else is left to post; this runs what is still queued, and keeps the
        // provider to this thread until the end. A wedged provider is left alone (leaked).
        let Ok(_inside) = self.gate.enter_wait(self) else {
            return;
        };
        lock(&self.control).take();
        self.close_rma();
        self.gate.fail_bulk(self, || FabricError::Cancelled);
        self.fab.cancel_recvs(|_| true);
        self.drain_until(deadline, || self.fab.in_flight() > 0);
        self.fab.shutdown(|op| {
            if let Purpose::User {
                conn,
                context,
                kind,
                ..
            } = &op.purpose
            {
                conn.cq.push(crate::Completion::err(
                    *context,
                    *kind,
                    FabricError::Cancelled,
                ));
            }
        });
    }
}

/// Owns the progress thread; when the last handle of the domain goes, stops it and closes.
pub(super) struct DomainCore {
    /// Shared state.
    pub shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl DomainCore {
    fn open(addr: &Address, info: Info, listening: bool) -> Result<Arc<DomainCore>> {
        let name = if listening {
            info::listener_name(addr, &info)
        } else {
            let name = info::client_name(&info);
            if name.is_some() {
                info::sweep_dead_client_regions();
            }
            name
        };
        let quirks = info::quirks(&info);
        let fab = Fabric::open(&info, name.as_deref(), quirks)?;
        let name = fab.getname()?;
        let key_mask = info::key_mask(&info);
        let shared = Arc::new(Shared {
            id: next_domain_id(),
            caps: info::capabilities(addr, &info),
            directed: info.caps() & sys::FI_DIRECTED_RECV != 0,
            addr: addr.clone(),
            format: info.addr_format(),
            local_text: info::to_address(addr, info.addr_format(), &name).to_string(),
            name,
            key_mask,
            next_conn: AtomicU64::new(1),
            av: Mutex::new(HashMap::new()),
            conns: Mutex::new(HashMap::new()),
            connecting: Mutex::new(HashMap::new()),
            accept: listening.then(|| AcceptQueue {
                queue: Mutex::new(VecDeque::new()),
                ready: Condvar::new(),
                open: AtomicBool::new(true),
            }),
            rma: quirks.checked_rma.then(Checked::default),
            control: Mutex::new(None),
            stop: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            thread: OnceLock::new(),
            keepalive: Keepalive::from_env(),
            gate: Gate::new(quirks.funnel),
            wedge_after: wedge::timeout_from_env(),
            fab,
        });
        wedge::watch(&shared);
        let core = Arc::new(DomainCore {
            shared: shared.clone(),
            thread: Mutex::new(None),
        });
        // From here on, dropping `core` closes everything properly.
        let region = shared.register(&Buffer::new(CONTROL_SLOTS * wire::MAX_LEN), Access::LOCAL)?;
        for i in 0..CONTROL_SLOTS {
            shared.post_control_recv(region.slice(i * wire::MAX_LEN..(i + 1) * wire::MAX_LEN)?)?;
        }
        *lock(&shared.control) = Some(region);
        let runner = shared.clone();
        let handle = std::thread::Builder::new()
            .name(format!("ferry-ofi-{}", shared.id))
            .spawn(move || progress::run(runner))
            .map_err(|e| FabricError::io("spawning the ofi progress thread", e))?;
        let _ = shared.thread.set(handle.thread().clone());
        *lock(&core.thread) = Some(handle);
        Ok(core)
    }

    /// A new handle to this domain.
    pub(super) fn handle(self: &Arc<Self>) -> Arc<dyn Domain> {
        Arc::new(OfiDomain { core: self.clone() })
    }
}

/// How long closing a domain waits for its progress thread to leave the provider.
const PROGRESS_EXIT: Duration = Duration::from_secs(5);

impl Drop for DomainCore {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        self.shared.sleeping.store(true, SeqCst);
        self.shared.wake();
        if self.shared.gate.is_wedged() {
            // A thread is stuck in the provider for good: closing its objects under it would
            // be unsafe, and joining it would hang. Leave both to the process exit.
            return;
        }
        if let Some(t) = lock(&self.thread).take() {
            let deadline = Instant::now() + PROGRESS_EXIT;
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if !t.is_finished() {
                // libfabric 1.17's shm keeps spinlocks in memory shared with its peers; a
                // peer killed while holding one leaves fi_cq_read spinning forever. Closing
                // the provider's objects under that thread would be unsafe, and waiting
                // would hang the caller: leave both to the process exit (the thread keeps
                // `Shared` alive).
                tracing::warn!(
                    domain = self.shared.id,
                    "ofi progress thread stuck in the provider (a peer died holding a lock?); \
                     leaking the domain"
                );
                return;
            }
            let _ = t.join();
        }
        self.shared.close();
    }
}

/// A handle to an ofi domain. Cheap to create: every handle (and every endpoint and listener)
/// shares one [`DomainCore`].
pub(super) struct OfiDomain {
    core: Arc<DomainCore>,
}

/// Opens a client domain for `addr`.
pub(super) fn open(addr: &Address) -> Result<Arc<dyn Domain>> {
    wedge::check_scheme(&addr.driver_name())?;
    let info = info::for_client(addr)?;
    Ok(DomainCore::open(addr, info, false)?.handle())
}

/// Opens a listening domain bound to exactly `addr`.
pub(super) fn listen(addr: &Address) -> Result<Box<dyn Listener>> {
    wedge::check_scheme(&addr.driver_name())?;
    let info = info::for_listener(addr)?;
    let core = DomainCore::open(addr, info, true)?;
    let local = info::to_address(addr, core.shared.format, &core.shared.name);
    Ok(Box::new(OfiListener { core, local }))
}

impl DomainCore {
    /// The handshake of `Domain::connect`, speaking protocol `major`.
    pub(super) fn connect(
        self: &Arc<Self>,
        addr: &Address,
        timeout: Duration,
        major: u16,
    ) -> Result<Box<dyn Endpoint>> {
        let shared = &self.shared;
        if addr.scheme != shared.addr.scheme {
            return Err(FabricError::InvalidArgument(format!(
                "a {} domain cannot connect to {addr}",
                shared.addr.driver_name()
            )));
        }
        shared.gate.check()?;
        let deadline = Instant::now() + timeout;
        let name = info::peer_name(addr, shared.format)?;
        let peer = shared.peer(&name)?;
        let listener = RefusalProbe::target(addr);
        loop {
            let id = shared.next_conn.fetch_add(1, SeqCst);
            let (tx, rx) = mpsc::sync_channel(1);
            lock(&shared.connecting).insert(
                id,
                Connecting {
                    peer,
                    name: name.clone(),
                    reply: Some(tx),
                },
            );
            let hello = Control::Connect {
                major,
                conn: id,
                name: shared.name.clone(),
            };
            let sent = shared
                .register(&Buffer::from_slice(&hello.encode_as(major)), Access::LOCAL)
                .and_then(|r| shared.send_control_region(peer, r, Some(id), deadline, listener));
            if let Err(e) = sent {
                lock(&shared.connecting).remove(&id);
                // The provider never took the CONNECT: nobody there (shm), or still trying to
                // reach it (tcp).
                return Err(match e {
                    FabricError::Timeout(_) => FabricError::Timeout(timeout),
                    e => e,
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let reply = match rx.recv_timeout(left) {
                Ok(r) => r,
                Err(_) => {
                    // Keep the entry, without a reply channel, so a late ACCEPT is closed;
                    // unless the answer is already on its way.
                    let answered = match lock(&shared.connecting).get_mut(&id) {
                        Some(c) => {
                            c.reply = None;
                            false
                        }
                        None => true,
                    };
                    match answered.then(|| rx.recv().ok()).flatten() {
                        Some(r) => r,
                        None => return Err(FabricError::Timeout(timeout)),
                    }
                }
            };
            match reply {
                Reply::Accepted(conn) => {
                    // The peer is the server this side chose to connect to.
                    conn.grants.enable();
                    return Ok(Box::new(OfiEndpoint::new(self.clone(), conn)));
                }
                Reply::Retry(_) if Instant::now() + CONNECT_RETRY < deadline => {
                    std::thread::sleep(CONNECT_RETRY);
                }
                Reply::Retry(e) | Reply::Failed(e) => return Err(e),
            }
        }
    }
}

impl Domain for OfiDomain {
    fn id(&self) -> DomainId {
        self.core.shared.id
    }

    fn capabilities(&self) -> &Capabilities {
        &self.core.shared.caps
    }

    fn register(&self, buf: &Buffer, access: Access) -> Result<MemoryRegion> {
        self.core.shared.register(buf, access)
    }

    fn connect(&self, addr: &Address, timeout: Duration) -> Result<Box<dyn Endpoint>> {
        self.core.connect(addr, timeout, wire::MAJOR)
    }
}

/// A listening ofi domain.
pub(super) struct OfiListener {
    core: Arc<DomainCore>,
    local: Address,
}

impl Listener for OfiListener {
    fn domain(&self) -> Arc<dyn Domain> {
        self.core.handle()
    }

    fn local_addr(&self) -> Address {
        self.local.clone()
    }

    fn accept(&self, timeout: Duration) -> Result<Box<dyn Endpoint>> {
        let shared = &self.core.shared;
        let Some(q) = &shared.accept else {
            return Err(FabricError::InvalidArgument(
                "domain is not listening".into(),
            ));
        };
        let deadline = Instant::now() + timeout;
        loop {
            let req = {
                let mut queue = lock(&q.queue);
                loop {
                    shared.gate.check()?;
                    if let Some(r) = queue.pop_front() {
                        break r;
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(FabricError::Timeout(timeout));
                    }
                    queue = q
                        .ready
                        .wait_timeout(queue, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            };
            let peer = match shared.peer(&req.name) {
                Ok(p) => p,
                Err(e) => {
                    tracing::debug!("ignoring CONNECT with an unusable address: {e}");
                    continue;
                }
            };
            if req.major != wire::MAJOR {
                let no = Control::Refuse {
                    target: req.conn,
                    major: wire::MAJOR,
                };
                if let Err(e) = shared.send_control(peer, &no) {
                    tracing::debug!("cannot refuse a protocol {} client: {e}", req.major);
                }
                continue;
            }
            let id = shared.next_conn.fetch_add(1, SeqCst);
            let conn = shared.new_conn(id, req.conn, peer, &req.name, req.minor)?;
            let yes = Control::Accept {
                target: req.conn,
                conn: id,
            };
            // Synchronously (not queued behind a copy): a failure must drop the connection.
            let answered = shared
                .gate
                .enter_wait(shared)
                .and_then(|_inside| shared.send_control(peer, &yes));
            match answered {
                Ok(()) => return Ok(Box::new(OfiEndpoint::new(self.core.clone(), conn))),
                Err(e) => {
                    shared.remove_conn(id);
                    tracing::debug!("cannot answer a CONNECT: {e}");
                }
            }
        }
    }
}

impl Drop for OfiListener {
    fn drop(&mut self) {
        if let Some(q) = &self.core.shared.accept {
            q.open.store(false, SeqCst);
            lock(&q.queue).clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_of_another_major_version_is_refused() {
        let shm = format!("ofi+shm://ferry-unit-{}", std::process::id());
        for addr in ["ofi+tcp://127.0.0.1:0", shm.as_str()] {
            let listener = listen(&addr.parse().unwrap()).unwrap();
            let la = listener.local_addr();
            let server = std::thread::spawn(move || {
                listener.accept(Duration::from_millis(1500)).map(|_| ())
            });
            let core = DomainCore::open(&la, info::for_client(&la).unwrap(), false).unwrap();
            let r = core.connect(&la, Duration::from_secs(10), wire::MAJOR + 1);
            assert!(
                matches!(
                    r,
                    Err(FabricError::VersionMismatch {
                        peer_major: wire::MAJOR,
                        ..
                    })
                ),
                "{addr}: {:?}",
                r.err()
            );
            // The listener refused it and kept waiting for a real client.
            assert!(matches!(
                server.join().unwrap(),
                Err(FabricError::Timeout(_))
            ));
        }
    }

    /// The shm gate's bulk lane (`gate.rs`): a call another thread makes while a deferred
    /// RMA copies is queued and runs before the next deferred RMA, not after all of them.
    #[test]
    fn a_call_queued_during_a_deferred_rma_goes_before_the_next() {
        let addr: Address = format!("ofi+shm://ferry-unit-gate-{}", std::process::id())
            .parse()
            .unwrap();
        let core = DomainCore::open(&addr, info::for_client(&addr).unwrap(), false).unwrap();
        let sh = core.shared.clone();
        let order = Arc::new(Mutex::new(Vec::new()));
        let note = |o: &Arc<Mutex<Vec<&'static str>>>, what| lock(o).push(what);
        let o = order.clone();
        let first = Job::logged("first", move |sh: &Shared| {
            let inside = sh.gate.enter_wait(sh)?;
            inside.long(|| {
                note(&o, "rma 1");
                // Another thread's call finds the gate in a long call: it is queued.
                std::thread::scope(|s| {
                    s.spawn(|| {
                        let o = o.clone();
                        let call = Job::logged("call", move |_: &Shared| {
                            note(&o, "call");
                            Ok(())
                        });
                        sh.gate.call(sh, call)
                    })
                    .join()
                    .unwrap()
                })
            })
        });
        let o = order.clone();
        let second = Job::logged("second", move |_: &Shared| {
            note(&o, "rma 2");
            Ok(())
        });
        sh.gate.defer(&sh, first).unwrap();
        sh.gate.defer(&sh, second).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&order).len() < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*lock(&order), ["rma 1", "call", "rma 2"]);
        assert!(!sh.gate.has_bulk());
    }

    /// The watchdog's verdict (`wedge.rs`): a provider call that does not return (simulated
    /// by holding the domain's in-call mark) wedges the domain; its receives in flight fail
    /// with the wedge error, and every later post, connect and registration fails at once.
    #[test]
    fn a_stuck_provider_call_wedges_the_domain_and_everything_fails_fast() {
        let addr: Address = format!("ofi+shm://ferry-unit-wedge-{}", std::process::id())
            .parse()
            .unwrap();
        let listener = listen(&addr).unwrap();
        let la = listener.local_addr();
        let server = std::thread::spawn(move || {
            let ep = listener.accept(Duration::from_secs(10)).unwrap();
            (listener, ep)
        });
        let client = DomainCore::open(&la, info::for_client(&la).unwrap(), false).unwrap();
        let ep = client
            .connect(&la, Duration::from_secs(10), wire::MAJOR)
            .unwrap();
        let (_listener, _server_ep) = server.join().unwrap();
        let sh = client.shared.clone();
        let buf = sh.register(&Buffer::new(64), Access::LOCAL).unwrap();
        ep.post_recv(&[buf.full()], 7).unwrap();

        // Not stuck, or not long enough: nothing happens.
        assert!(!sh.check_wedge(Duration::from_millis(50)));
        // A stuck call is inside the gate (shm funnels calls): hold it, and the mark.
        let held = sh.gate.enter_wait(&sh).unwrap();
        let stuck = sh.fab.watch.enter();
        assert!(!sh.check_wedge(Duration::from_millis(100)));
        std::thread::sleep(Duration::from_millis(120));
        assert!(!sh.check_wedge(Duration::from_secs(60)));
        assert!(sh.check_wedge(Duration::from_millis(100)));
        // Declared once.
        assert!(!sh.check_wedge(Duration::from_millis(100)));

        let c = ep.cq().wait(Duration::from_secs(5)).unwrap();
        assert_eq!(c.context, 7);
        let msg = |r: Result<()>| match r {
            Err(FabricError::Wedged(m)) => m,
            other => panic!("expected the wedge error, got {other:?}"),
        };
        assert!(msg(c.result).contains("wedged"));
        let started = Instant::now();
        assert!(msg(ep.post_send(&[buf.full()], 8)).contains("wedged"));
        assert!(msg(ep.post_recv(&[buf.full()], 9)).contains("wedged"));
        assert!(msg(client
            .connect(&la, Duration::from_secs(30), wire::MAJOR)
            .map(drop))
        .contains("wedged"));
        assert!(msg(sh.register(&Buffer::new(8), Access::LOCAL).map(drop)).contains("wedged"));
        assert!(started.elapsed() < Duration::from_secs(1));
        drop(stuck);
        drop(held);
        // Dropping a wedged domain returns at once (it is leaked, never joined).
        let started = Instant::now();
        drop(ep);
        drop(client);
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
