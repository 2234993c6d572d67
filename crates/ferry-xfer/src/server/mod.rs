//! `ferry serve`: exported roots behind a sandbox, token auth, a thread per connection,
//! admission limits ([`ferry_service::admit`]).
//!
//! Every path a client names is `root/relative/path`. The relative part is opened with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` relative to the root's directory
//! descriptor, so `..`, absolute paths and symlinks that lead outside the root are refused
//! by the kernel, whatever races happen meanwhile. New files are created inside a directory
//! opened that way, under a temporary name, and renamed into place only after their BLAKE3
//! matched and they were fsynced.

mod get;
mod put;
mod ranges;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_exs::runtime::ExsListener;

use crate::config::ServerConfig;
pub(crate) use crate::conv::serve::PutReq;
use crate::conv::serve::{Route, Router, SendToReq, DRAINING};
use crate::error::{Kind, Result, XferError};
use crate::link::{BlockSender, Link, PackCheck};
use crate::proto::{self, Entry, ErrorCode, Msg, BLOCK_HEADER_LEN};
use crate::session::Session;
use ferry_service::admit::{Admission, AuthRefused, Handshake};
use ferry_service::audit::{Audit, Record};
use ferry_service::auth::{AuthConfig, Principal};
use ferry_service::channel::Held;
use ferry_service::drain::Drain;
pub use ferry_service::drain::DrainReport;
use ferry_service::registry::Registry;
use ferry_service::registry::{Conn, Service};
use ferry_service::secure::{Level, ServerSecurity};

pub use crate::export::Refusal;
use crate::export::{refuse, PResult};
use ferry_service::claims::{Claim, Claims};
pub use ferry_service::roots::{PartFile, RootSpec, Roots, Target};

/// A running server's shared state.
pub struct Server {
    cfg: ServerConfig,
    roots: Roots,
    sessions: AtomicU64,
    /// Files a PUT is writing (their `root/path`), so a resumed PUT never shares a part file
    /// with the connection of a client that vanished but is not noticed gone yet.
    /// A newer PUT of the same file raises the holder's flag: the holder journals and lets go
    /// (the usual holder is a vanished client's connection the fabric has not noticed).
    busy: Claims,
    /// Third-party copies in progress (`ferry copies`).
    copies: crate::third_party::Copies,
    /// Live sessions (parallel streams join them by id).
    live: Mutex<HashMap<u64, Arc<Session>>>,
    /// Connections in flight, and the drain (requests refused with Unavailable once its
    /// grace is over).
    drain: Drain,
    /// Connection, memory and authentication limits.
    admission: Arc<Admission>,
    /// Its TLS identity, and whether clear clients are let in.
    security: ServerSecurity,
    /// Where a record of each request goes (shared with the daemon's other faces).
    audit: Arc<Audit>,
}

impl Service for Server {
    /// A connection the floor handed to file transfer: `Server::connection`, within the
    /// handshake's deadline until authenticated, and ended early if the handshake is called
    /// off to make room for a newer connection.
    fn serve_connection(&self, conn: Conn) {
        let Conn {
            sock,
            queue,
            hs,
            peer,
            first,
            principal,
            secure,
        } = conn;
        let mut link = Link::new(sock, queue);
        link.seal(secure);
        match self.connection(&mut link, hs, first, principal) {
            Ok(()) => tracing::debug!("{peer}: done"),
            Err(e) => tracing::info!("{peer}: connection ended: {e}"),
        }
        link.close();
    }

    /// A clear client older than protocol 1.6 on a server that requires TLS: told so in an
    /// ERROR it understands.
    fn refuse_connection(&self, conn: Conn, message: &str) {
        let link = Link::new(conn.sock, conn.queue);
        let _ = link.send(&Msg::Error {
            code: ErrorCode::VersionMismatch,
            file_id: 0,
            message: message.to_string(),
        });
        std::thread::sleep(Duration::from_millis(50));
        link.close();
    }

    /// Starts refusing new requests (with Unavailable) and notes how many transfers are in
    /// flight.
    fn begin_drain(&self) {
        self.drain.begin();
    }

    /// Refuses new requests, lets the transfers in flight run for up to `grace`, then
    /// tells the rest to stop (an upload fsyncs its part file and journals its verified
    /// prefix; a download just ends, its client journals) and waits a little for them.
    fn drain(&self, grace: Duration) -> DrainReport {
        self.drain.run(grace)
    }
}

/// The name file transfer is hosted under in a server's registry (the service a client
/// older than protocol 1.6 gets: [`ferry_service::registry::LEGACY_SERVICE`]).
pub const SERVICE: &str = ferry_service::registry::LEGACY_SERVICE;

/// How long a PUT waits for another connection to let go of the same file.
const BUSY_WAIT: Duration = Duration::from_secs(20);

/// A PUT's receive loop looks at the drain and takeover flags this often while idle.
const RECV_SLICE: Duration = Duration::from_millis(250);

/// A GET is sent in pieces of this many bytes, so a drain can stop it between them.
const GET_PIECE: u64 = 32 << 20;

impl Server {
    /// Validates `cfg` and opens its roots.
    pub fn new(cfg: ServerConfig) -> Result<Arc<Server>> {
        cfg.validate()?;
        let roots = Roots::open(
            cfg.roots.iter().map(|r| RootSpec {
                name: &r.name,
                path: &r.path,
                read_only: r.read_only,
            }),
            cfg.keep_special_bits,
        )?;
        let admission = Admission::new(&cfg.limits, staging_cost);
        let security = cfg.security.load()?;
        let audit = Arc::new(Audit::open(cfg.audit_log.as_deref())?);
        Ok(Arc::new(Server {
            admission,
            security,
            audit,
            cfg,
            roots,
            sessions: AtomicU64::new(1),
            busy: Claims::new(),
            copies: crate::third_party::Copies::default(),
            live: Mutex::new(HashMap::new()),
            drain: Drain::new(),
        }))
    }

    /// The admission every connection passes (limits, handshake pool, staging memory),
    /// shared with the other faces of a daemon.
    pub fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    /// The addresses it is configured to listen on.
    pub fn listen(&self) -> &[String] {
        &self.cfg.listen
    }

    /// Where its audit records go (`audit_log`): the daemon's other faces write theirs
    /// there too.
    pub fn audit(&self) -> &Arc<Audit> {
        &self.audit
    }

    /// Who may use it.
    pub fn auth(&self) -> &AuthConfig {
        &self.cfg.auth
    }

    /// Its TLS identity (its fingerprint is what clients pin), and whether clear clients
    /// are let in.
    pub fn security(&self) -> &ServerSecurity {
        &self.security
    }

    /// Binds every configured listen address.
    pub fn bind(&self) -> Result<Vec<ExsListener>> {
        ferry_service::serve::bind_all(&self.cfg.listen)
    }

    /// Accepts connections on every listener forever, serving each on its own thread. A
    /// failing connection ends only itself.
    pub fn serve(self: &Arc<Self>, listeners: &[ExsListener]) -> Result<()> {
        self.serve_until(listeners, &AtomicBool::new(false))
    }

    /// Like [`Server::serve`], until `quit` is set (checked a few times a second); then it
    /// stops accepting and returns, leaving the connections running (see [`Service::drain`]).
    ///
    /// The server is the registry's file-transfer service ([`SERVICE`]); each listener
    /// accepts on its own thread, and every connection passes the one admission
    /// ([`ferry_service::serve::serve_until`]).
    pub fn serve_until(
        self: &Arc<Self>,
        listeners: &[ExsListener],
        quit: &AtomicBool,
    ) -> Result<()> {
        let mut registry = Registry::new(self.cfg.auth.clone(), self.security.clone());
        registry.add(SERVICE, self.clone())?;
        ferry_service::serve::serve_until(&Arc::new(registry), &self.admission, listeners, quit);
        Ok(())
    }

    fn stopping(&self) -> bool {
        self.drain.stopping()
    }

    fn stopped(&self, what: &str) -> XferError {
        self.drain.interrupted();
        XferError::conn(format!("{what}: the server is shutting down"))
    }

    /// Claims `path` for writing. If another connection holds it, asks that one to journal
    /// and let go (a PUT of a file supersedes an older one still writing it), waiting up
    /// to [`BUSY_WAIT`].
    fn claim(&self, path: &str) -> Option<Claim> {
        self.busy.claim(path, BUSY_WAIT, || self.stopping())
    }

    /// The client's HELLO, waited for until the handshake's deadline or until it is called
    /// off.
    fn first_msg(link: &mut Link, hs: &Handshake) -> Result<Msg> {
        link.recv_first_in(hs, "HELLO")
    }

    /// Answers a HELLO whose token the floor refused ([`Admission::authenticate`]).
    fn refuse_token(link: &Link, r: AuthRefused) -> Result<()> {
        link.send(&Msg::Error {
            code: ErrorCode::AuthRefused,
            file_id: 0,
            message: r.message.into(),
        })?;
        // Let the refusal reach the client before the connection goes.
        std::thread::sleep(Duration::from_millis(50));
        Err(XferError::new(Kind::Auth, "client refused: bad token"))
    }

    /// The client's HELLO: `first` if the floor already received it (a client that sent no
    /// service selection), else the next message.
    fn hello(link: &mut Link, hs: &Handshake, first: Option<Vec<u8>>) -> Result<Msg> {
        match first {
            Some(bytes) => proto::decode(&bytes)
                .map(|(m, _)| m)
                .map_err(|e| XferError::conn(format!("the peer sent a bad frame: {e}"))),
            None => {
                link.post_ring(1, proto::MAX_CONTROL)?;
                Self::first_msg(link, hs)
            }
        }
    }

    /// A client older than protocol 1.9 over TLS sends blocks with a CRC-32C only, its
    /// files checked by the sealed BLAKE3 (as 1.8 did): served unless this server's
    /// protection is configured without `clear`, then refused with what to do.
    fn older_client(&self, link: &Link, minor: u16) -> Result<()> {
        if self.security.serves_unprotected() {
            return Ok(());
        }
        let message = format!(
            "this server requires data protection ({}; protocol 1.{}), which a protocol 1.{minor} client cannot give: upgrade the client, or allow \"clear\" in the server's [security] protection",
            levels(self.security.protection()),
            proto::MINOR_PROTECT,
        );
        refuse_connection(link, refuse(ErrorCode::AuthRefused, message))
    }

    /// The client's PROTECT (its first request): the level it requires, agreed if this
    /// server allows it (the connection's blocks are then checked so), refused otherwise
    /// (the connection ends: never another level than asked). Once only, before data moves.
    fn agree_protection(&self, link: &mut Link, code: u8, st: &mut Requests) -> Result<()> {
        if st.agreed || link.secure().is_none() {
            let message = "PROTECT only once, first, and only on a secure connection";
            return refuse_connection(link, refuse(ErrorCode::BadRequest, message));
        }
        let asked = Level::from_code(code);
        let allowed = self.security.protection();
        match asked.filter(|l| allowed.contains(l)) {
            Some(level) => {
                link.protect(level, true)?;
                st.agreed = true;
                st.packs = PackCheck::for_uploads(link, st.minor);
                link.send(&Msg::Ok { file_id: 0 })
            }
            None => {
                let asked = asked.map_or("an unknown level".to_string(), |l| l.to_string());
                let message = format!(
                    "the client requires data protection {asked}; this server allows only {}",
                    levels(allowed)
                );
                refuse_connection(link, refuse(ErrorCode::AuthRefused, message))
            }
        }
    }

    /// Serves one connection: handshake, then requests in order until BYE or close.
    /// `floor`: who the floor already authenticated (a token or key proven over TLS,
    /// protocol 1.7 and 1.9), in which case the HELLO carries no token.
    fn connection(
        &self,
        link: &mut Link,
        hs: Handshake,
        first: Option<Vec<u8>>,
        floor: Option<Principal>,
    ) -> Result<()> {
        let (major, minor, block_size, token, join, stream) = match Self::hello(link, &hs, first)? {
            Msg::Hello {
                major,
                minor,
                block_size,
                token,
                session,
                stream,
            } => (major, minor, block_size, token, session, stream),
            m => return Err(XferError::conn(format!("expected HELLO, got {m:?}"))),
        };
        if major != proto::VERSION_MAJOR {
            let message = format!(
                "this server speaks ferry transfer protocol {}.{}, the client {major}.x: upgrade the older side",
                proto::VERSION_MAJOR,
                proto::VERSION_MINOR
            );
            link.send(&Msg::Error {
                code: ErrorCode::VersionMismatch,
                file_id: 0,
                message: message.clone(),
            })?;
            return Err(XferError::conn(message));
        }
        if link.secure().is_some() && minor < proto::MINOR_PROTECT {
            self.older_client(link, minor)?;
        }
        let principal = match floor {
            Some(p) => p,
            None => match self
                .admission
                .authenticate(&hs.addr, &self.cfg.auth, &token)
            {
                Ok(p) => p,
                Err(r) => return Self::refuse_token(link, r),
            },
        };
        let owner = crate::third_party::Owner::of(&principal, &hs.addr);
        let block = block_size.clamp(proto::MIN_BLOCK, self.cfg.block_size);
        let remote = is_remote_peer(&hs.addr);
        let peer = hs.addr.clone();
        let slot = match hs.admit(self.cfg.ring, block) {
            Ok(s) => s,
            Err(r) => return refuse_connection(link, r),
        };
        // Authenticated: the client may now reach this connection's buffers by RMA.
        link.socket().enable_remote_access();
        let session = match self.join(join, stream, principal) {
            Ok(s) => s,
            Err(r) => return refuse_connection(link, r),
        };
        let _stream = StreamGuard {
            server: self,
            session: session.clone(),
        };
        let (block, ring) = (slot.block, slot.ring);
        // Posted before WELCOME: the client's first request may be a whole file (PUT_FILE).
        link.post_ring(ring, BLOCK_HEADER_LEN + block as usize)?;
        link.send(&Msg::Welcome {
            major: proto::VERSION_MAJOR,
            minor: proto::VERSION_MINOR,
            block_size: block,
            session: session.id,
        })?;
        let welcomed = Instant::now();
        // Also how long a transfer may make no progress.
        link.timeout = self.cfg.limits.idle();
        let mut tx = BlockSender::new(block, ring, link.timeout)?;
        // Small whole files travel as one FILE frame to clients that know it (1.3), and
        // those of one GETS batch several to a PACK (1.4).
        tx.inline = minor >= proto::MINOR_FILE;
        tx.packing = minor >= proto::MINOR_PACK;
        // And travel clear, tagged or sealed in place by the session's keys (1.10).
        tx.clear_packs = minor >= proto::MINOR_TAGGED_PACK;
        // And FILE frames with no CRC to a client that checks them by their hash (1.12).
        tx.file_crc = minor < proto::MINOR_FILE_HASH_ONLY;
        tx.direct = self.cfg.direct;
        let mut st = Requests {
            peer,
            block,
            ring,
            batch: std::collections::VecDeque::new(),
            held: None,
            put_at: None,
            packs: PackCheck::default(),
            commits: put::Commits::new(minor >= proto::MINOR_PUT_PACK),
            minor,
            owner,
            welcomed: remote.then_some(welcomed),
            grown: None,
            agreed: false,
        };
        let res = self.requests(link, &session, &mut tx, &mut st);
        // What was whole and verified is committed even if the connection ended.
        let flushed = st.commits.flush(link);
        res.and(flushed)
    }

    /// The request loop of [`Server::connection`], until BYE or an error: each request is
    /// routed ([`Router`]) and its route executed.
    fn requests(
        &self,
        link: &mut Link,
        session: &Arc<Session>,
        tx: &mut BlockSender,
        st: &mut Requests,
    ) -> Result<()> {
        let router = Router {
            block: st.block,
            ring: st.ring,
            mem: self.cfg.mem,
        };
        // A connection is in flight for the drain until it ends: its client's next requests
        // (the rest of a download in pieces, re-GETs after a CRC failure, the chunks of a
        // parallel copy, its final verdicts) are served through the grace period, which is
        // what finishing the work in progress means; the listeners take no new connections.
        let _in_flight = self.drain.count();
        loop {
            // The frames of PUT_FILEs answered (or refused unwritten, while draining, say)
            // go back once none is left to answer.
            if st.batch.is_empty() {
                if let Some(frame) = st.held.take() {
                    link.give_back(frame)?;
                }
            }
            let msg = match st.batch.pop_front() {
                Some((m, at)) => {
                    st.put_at = at;
                    m
                }
                None => self.wait_request(link, session, tx, st)?,
            };
            if let Msg::Protect { level } = msg {
                self.agree_protection(link, level, st)?;
                continue;
            }
            // The first request after PROTECT (which a client may send with its HELLO) came
            // one round trip after WELCOME went out, or later if the client was busy; TCP's
            // own smallest round trip is not lengthened so. A client that sent its first
            // requests with its HELLO leaves no wait to time: the TLS handshake's round
            // trip stands in for TCP's on drivers that do not know it.
            if let Some(welcomed) = st.welcomed.take() {
                let waited = welcomed.elapsed();
                let rtt = link
                    .socket()
                    .path_rtt()
                    .or_else(|| link.secure().and_then(|s| s.handshake_rtt()))
                    .unwrap_or(waited);
                self.grow_to_path(link, tx, st, rtt);
            }
            if !st.agreed && link.secure().is_some() && !self.security.serves_unprotected() {
                let message = "this server requires a data protection level (PROTECT, protocol 1.9) before any request";
                return refuse_connection(link, refuse(ErrorCode::AuthRefused, message));
            }
            // The session is not idle while this request runs.
            let _working = session.working();
            if !Router::joins_commits(&msg) {
                st.commits.flush(link)?;
            }
            let stopping = self.stopping();
            if !router.packs(&msg) || stopping {
                tx.flush_pack(link)?;
            }
            match self.permitted(session, &st.peer, router.route(msg, stopping)) {
                Route::Bye => return Ok(()),
                // The drain's grace is over: the client hears why, and the connection ends.
                Route::Refuse { file_id, refusal } if stopping => {
                    reply_refusal(link, file_id, refusal)?;
                    return Err(self.stopped("a request"));
                }
                Route::Batch(gets) => st.batch.extend(gets.into_iter().map(|m| (m, None))),
                Route::Virtual(msg) => {
                    // The memory root's requests are audited as the real roots' are.
                    let audit = Route::virtual_audited(&msg);
                    let peer = st.peer.clone();
                    self.with_audit(session, &peer, audit, || {
                        if self.virtual_request(link, tx, &msg, session)? {
                            return Ok(());
                        }
                        self.execute_route(link, session, tx, st, router.dispatch(msg))
                    })?
                }
                route => self.execute(link, session, tx, st, route)?,
            }
        }
    }

    /// Grows the ring of blocks the connection sends ahead (downloads) from the configured
    /// `ring` to the path's bandwidth-delay product for round trip `rtt`, as a client sizes
    /// its own (`tune::ring_for`): a block is busy for about two round trips, so a fixed
    /// 8 × 4 MiB holds one stream near 1.3 Gbit/s at 50 ms. Its blocks are allocated on
    /// first use, so a connection that sends little costs nothing more; the receive ring
    /// (uploads) stays as configured: posting it whole up front cost more than it gave
    /// (docs/wan.md). The extra memory is reserved from the budget like a connection's own
    /// (less, or none, when the budget is short: the ring stays). Called before the first
    /// request is served: nothing is in flight.
    fn grow_to_path(&self, link: &Link, tx: &mut BlockSender, st: &mut Requests, rtt: Duration) {
        use crate::client::tune;
        let want = tune::ring_for(tune::Buffer::Path, st.ring, rtt, st.block);
        if want <= st.ring {
            return;
        }
        let grant = match self.admission.reserve(1, want - st.ring, st.block) {
            Ok(g) if g.block == st.block && g.ring > 0 => g,
            _ => return,
        };
        let ring = st.ring + grant.ring;
        let Ok(grown) = tx.with_ring(ring, link.timeout) else {
            return;
        };
        *tx = grown;
        tracing::debug!(
            "round trip {:.1} ms: send ring grown from {} to {ring} blocks of {} bytes",
            rtt.as_secs_f64() * 1e3,
            st.ring,
            st.block
        );
        st.grown = Some(grant);
    }

    /// `route`, or its refusal when the session's credential may not do it (a root not
    /// granted, a write by a read-only credential), which the audit records.
    fn permitted(&self, session: &Session, peer: &str, route: Route) -> Route {
        let Some((path, write, file_id)) = route.access() else {
            return route;
        };
        let Err(r) = self.roots.permit(&session.principal.rights, path, write) else {
            return route;
        };
        if let Some((op, path, _, quiet)) = route.audited() {
            self.audit.write(
                &Record {
                    time: std::time::SystemTime::now(),
                    peer: peer.to_string(),
                    credential: session.principal.id.clone(),
                    face: SERVICE,
                    op,
                    path,
                    bytes: 0,
                    duration: Duration::ZERO,
                    error: Some(r.message.clone()),
                    read_written: None,
                    unread: 0,
                },
                quiet,
            );
        }
        Route::Refuse {
            file_id,
            refusal: r.into(),
        }
    }

    /// The next request. What waits to leave goes when no request is there to join it: the
    /// open PACK (the next GETS, already here, fills it further: a client at distance asks
    /// in small frames, and full PACKs are fewer adverts and acknowledgements) and the
    /// PUT_FILE commits. A request that does not join them sends them first (the loop).
    fn wait_request(
        &self,
        link: &mut Link,
        session: &Session,
        tx: &mut BlockSender,
        st: &mut Requests,
    ) -> Result<Msg> {
        let arrived = if st.commits.is_empty() && !tx.pack_open() {
            None
        } else {
            link.recv_held_within(Duration::ZERO)?
        };
        if arrived.is_none() {
            tx.flush_pack(link)?;
            st.commits.flush(link)?;
        }
        ferry_fabric::timeline::mark("srv.wait", 0);
        let held = match arrived {
            Some(held) => held,
            None => {
                match next_request(link, session, self.cfg.limits.idle(), || self.stopping())? {
                    Some(held) => held,
                    None => return self.stop_idle(link),
                }
            }
        };
        let m = st.take_request(link, held)?;
        ferry_fabric::timeline::mark("srv.req", 0);
        Ok(m)
    }

    /// A connection waiting for its client's next request when the drain's grace ran out:
    /// the client hears that the server is shutting down (it resumes with --retries), and
    /// the connection ends, counted as stopped by the drain.
    fn stop_idle(&self, link: &mut Link) -> Result<Msg> {
        reply_refusal(link, 0, refuse(ErrorCode::Unavailable, DRAINING))?;
        Err(self.stopped("a connection between requests"))
    }

    /// Executes one route, and records it in the audit: what was asked, by whom, how long
    /// it took, and how it ended (the refusal the client was told, or the error that ended
    /// the connection).
    fn execute(
        &self,
        link: &mut Link,
        session: &Arc<Session>,
        tx: &mut BlockSender,
        st: &mut Requests,
        route: Route,
    ) -> Result<()> {
        let audit = route.audited();
        let peer = st.peer.clone();
        self.with_audit(session, &peer, audit, || {
            self.execute_route(link, session, tx, st, route)
        })
    }

    /// Runs one request (`run`) and records it in the audit as `audit` names it (op, path,
    /// bytes asked, quiet): by whom, how long it took, and how it ended (the refusal the
    /// client was told, or the error that ended the connection). `None`: not audited.
    fn with_audit(
        &self,
        session: &Session,
        peer: &str,
        audit: Option<(&'static str, String, u64, bool)>,
        run: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let Some((op, path, asked, quiet)) = audit else {
            return run();
        };
        let (time, began) = (std::time::SystemTime::now(), std::time::Instant::now());
        let _ = (take_refusal(), take_served_size());
        // Bytes sent unread are counted per thread: this request's run on this one.
        let unread = ferry_service::ring::sender::unread_bytes_here();
        let res = run();
        let unread = ferry_service::ring::sender::unread_bytes_here() - unread;
        let error = match &res {
            Ok(()) => take_refusal(),
            Err(e) => Some(e.msg.clone()),
        };
        // A GET to the end names no length: the file's size says what it moved (as the
        // GET saw it when it opened the file, else as it is now).
        let served = take_served_size();
        let bytes = match (op, asked, &error) {
            ("get", u64::MAX, None) => served.unwrap_or_else(|| self.size_of(&path)),
            ("get", u64::MAX, Some(_)) => 0,
            _ => asked,
        };
        self.audit.write(
            &Record {
                time,
                peer: peer.to_string(),
                credential: session.principal.id.clone(),
                face: SERVICE,
                op,
                path,
                bytes,
                duration: began.elapsed(),
                error,
                read_written: None,
                unread,
            },
            quiet,
        );
        res
    }

    /// The size of the file `path` names: a real root's, or a memory root's zero file.
    fn size_of(&self, path: &str) -> u64 {
        match crate::mem::classify(path) {
            Some(Ok(crate::mem::Virtual::Zero(n))) if self.cfg.mem => n,
            _ => self.roots.stat(path).map_or(0, |m| m.size),
        }
    }

    /// Executes one route.
    fn execute_route(
        &self,
        link: &mut Link,
        session: &Arc<Session>,
        tx: &mut BlockSender,
        st: &mut Requests,
        route: Route,
    ) -> Result<()> {
        match route {
            Route::Bye | Route::Batch(_) | Route::Virtual(_) => Err(XferError::conn(
                "internal: a route the request loop takes is executed",
            )),
            Route::Refuse { file_id, refusal } => {
                // Answers keep request order: PUT_FILEs waiting to be committed go first.
                st.commits.flush(link)?;
                reply_refusal(link, file_id, refusal)
            }
            Route::Stat(path) => match crate::export::stat(&self.roots, &path) {
                Ok(e) => link.send(&Msg::Entry(e)),
                Err(r) => reply_refusal(link, 0, r),
            },
            Route::List(path) => match crate::export::list(&self.roots, &path) {
                Ok(mut entries) => {
                    // The list of roots shows those the credential is granted.
                    if path.trim_matches('/').is_empty() {
                        entries.retain(|e| session.principal.rights.grants(&e.name));
                    }
                    send_entries(link, entries)
                }
                Err(r) => reply_refusal(link, 0, r),
            },
            Route::Mkdir { mode, path } => match self.roots.mkdir(&path, mode) {
                Ok(()) => link.send(&Msg::Ok { file_id: 0 }),
                Err(r) => reply_refusal(link, 0, r),
            },
            Route::Remove(path) => match self.roots.remove(&path) {
                Ok(()) => link.send(&Msg::Ok { file_id: 0 }),
                Err(r) => reply_refusal(link, 0, r),
            },
            Route::Sum(path) => self.sum(link, tx, &path),
            Route::Get {
                file_id,
                offset,
                length,
                path,
            } => self.get(link, tx, file_id, offset, length, &path),
            Route::Put(req, path) => self.put(link, &req, &path),
            Route::PutFile {
                req,
                path,
                blake3,
                len,
            } => {
                let (Some(frame), Some(at)) = (&st.held, st.put_at.take()) else {
                    return Err(XferError::conn("internal: a PUT_FILE without its frame"));
                };
                // Landed from its receive buffer, which goes back to the peer after (the
                // loop's next turn, once no other file of its PACK waits).
                frame.with_bytes(|b| {
                    let payload = b
                        .get(at..)
                        .and_then(|p| p.get(..len as usize))
                        .ok_or_else(|| XferError::conn("PUT_FILE shorter than its payload"))?;
                    self.put_file(link, &mut st.commits, &req, &path, payload, &blake3)
                })
            }
            Route::Open(req, path) => self.open(link, session, &req, &path),
            Route::PutRange {
                file_id,
                offset,
                length,
            } => self.put_range(link, session, st.ring, file_id, offset, length),
            Route::Close {
                file_id,
                length,
                blake3,
            } => self.close(link, session, file_id, length, blake3),
            Route::SendTo(req) => self.send_to(link, req, st),
            Route::Grant {
                tree,
                ttl_secs,
                path,
            } => self.grant(link, session, tree, ttl_secs, &path),
            Route::Copies => {
                for m in self.copies.list(&st.owner) {
                    link.send(&m)?;
                }
                link.send(&Msg::Ok { file_id: 0 })
            }
            Route::AbortCopy(id) => {
                if self.copies.abort(&st.owner, id) {
                    link.send(&Msg::Ok { file_id: 0 })
                } else {
                    link.send(&Msg::Error {
                        code: ErrorCode::NotFound,
                        file_id: 0,
                        message: format!("no third-party copy {id} of yours is running here"),
                    })
                }
            }
            Route::Unexpected(m) => Err(XferError::conn(format!("unexpected request {m:?}"))),
        }
    }

    /// GRANT: mints a grant for another server to write `path` here on this session's
    /// credential's behalf ([`ferry_service::grants`]); the route was permitted as a write
    /// by that credential. Only over TLS: the secret must never cross the wire in clear.
    fn grant(
        &self,
        link: &Link,
        session: &Session,
        tree: bool,
        ttl_secs: u32,
        path: &str,
    ) -> Result<()> {
        if link.secure().is_none() {
            let message = "grants are given only over a secure (TLS) connection";
            return reply_refusal(link, 0, refuse(ErrorCode::AuthRefused, message));
        }
        let ttl = Duration::from_secs(u64::from(ttl_secs));
        match self
            .cfg
            .auth
            .grants
            .mint(&session.principal, path, tree, ttl)
        {
            Ok(m) => {
                tracing::info!(
                    "{}: {} for {path}{} for {} s",
                    session.principal.id,
                    ferry_service::grants::label(m.id, &session.principal.id),
                    if tree { " and beneath" } else { "" },
                    m.ttl.as_secs()
                );
                link.send(&Msg::Granted {
                    id: m.id,
                    secret: m.seed,
                    ttl_secs: u32::try_from(m.ttl.as_secs()).unwrap_or(u32::MAX),
                })
            }
            Err(e) => reply_refusal(link, 0, refuse(crate::error::code_of(&e), e.msg)),
        }
    }

    /// SEND_TO: copies to another server, whose connections hold staging memory too.
    fn send_to(&self, link: &mut Link, req: SendToReq, st: &Requests) -> Result<()> {
        let streams = req.streams;
        let grant = match self.admission.reserve(
            usize::from(streams.max(1)),
            self.cfg.ring,
            self.cfg.block_size,
        ) {
            Ok(g) => g,
            Err(r) => return reply_refusal(link, req.file_id, r),
        };
        crate::third_party::serve(
            &self.cfg,
            (&self.roots, &self.copies),
            link,
            crate::third_party::SendTo {
                file_id: req.file_id,
                recursive: req.recursive,
                path: &req.path,
                dest: &req.dest,
                dest_path: &req.dest_path,
                token: &req.token,
                grant: req.grant,
                streams,
                follow: req.follow,
                patterns: req.patterns.as_ref(),
                only: req.only.as_deref(),
                ring: grant.ring,
                block: grant.block,
                client_minor: st.minor,
                owner: st.owner.clone(),
            },
        )
    }

    /// Admits a stream: stream 0 of a new session (`join` 0), or stream `stream` of the live
    /// session `join`, which must have been opened with the same credential.
    fn join(&self, join: u64, stream: u16, principal: Principal) -> PResult<Arc<Session>> {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if join == 0 {
            // A grant opens one session, once; that session's streams join it below.
            if let Some(scope) = &principal.rights.scope {
                if !self.cfg.auth.grants.claim(scope.grant) {
                    return Err(refuse(
                        ErrorCode::AuthRefused,
                        "this grant was already used: a grant opens one session",
                    ));
                }
            }
            if stream != 0 {
                return Err(refuse(
                    ErrorCode::BadRequest,
                    format!("stream {stream} of no session: stream 0 opens the session"),
                ));
            }
            let id = loop {
                let id = random_id(self.sessions.fetch_add(1, Ordering::Relaxed));
                if id != 0 && !live.contains_key(&id) {
                    break id;
                }
            };
            let s = Arc::new(Session::new(id, principal));
            live.insert(id, s.clone());
            return Ok(s);
        }
        if stream == 0 || stream >= proto::MAX_STREAMS {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!(
                    "stream {stream}: a joining stream is numbered 1 to {}",
                    proto::MAX_STREAMS - 1
                ),
            ));
        }
        let s = live.get(&join).ok_or_else(|| {
            refuse(
                ErrorCode::BadRequest,
                format!("unknown session {join:#x}: it ended or never existed (a stream joins while stream 0 is connected)"),
            )
        })?;
        if s.principal.id != principal.id {
            return Err(refuse(
                ErrorCode::AuthRefused,
                "the token differs from the one session was opened with",
            ));
        }
        s.streams.fetch_add(1, Ordering::SeqCst);
        Ok(s.clone())
    }
}

/// A connection's state between requests.
struct Requests {
    /// The client's address, for the audit.
    peer: String,
    /// The agreed block size.
    block: u32,
    /// The connection's ring.
    ring: usize,
    /// The GETs of a GETS frame or the PUT_FILEs of a PACK (1.11, each with where its
    /// payload starts in `held`), answered one by one as if each had come alone.
    batch: std::collections::VecDeque<(Msg, Option<usize>)>,
    /// The receive buffer of the PUT_FILE or the PACK of them being answered, kept until
    /// their files are written from it (no copy).
    held: Option<Held>,
    /// Where the payload of the PUT_FILE being answered starts in `held`.
    put_at: Option<usize>,
    /// How the client's PACKs of PUT_FILEs are checked (1.11; once the level is agreed).
    packs: PackCheck,
    /// PUT_FILEs written and waiting to be committed together.
    commits: put::Commits,
    /// The client's protocol minor version.
    minor: u16,
    /// Whose third-party copies this connection may list and abort.
    owner: crate::third_party::Owner,
    /// When WELCOME went to a peer on another host: the first request's arrival is one
    /// round trip later (and sizes the send ring to the path, [`Server::grow_to_path`]).
    welcomed: Option<Instant>,
    /// The budget's memory for the send ring's growth to the path, held while it lasts.
    grown: Option<ferry_service::admit::Grant>,
    /// Whether the client agreed on a data protection level (PROTECT).
    agreed: bool,
}

impl Requests {
    /// Decodes the request `held` in place. Its receive buffer goes back to the peer at once,
    /// but a PUT_FILE's or a PACK's of them (1.11), which is kept until the files are
    /// written: a PACK's PUT_FILEs are then answered one by one from [`Requests::batch`].
    fn take_request(&mut self, link: &mut Link, mut held: Held) -> Result<Msg> {
        let msg = held.with_bytes(decode_request);
        let files = match msg {
            Ok(m @ Msg::PutFile { len, .. }) => vec![(m, held.len().checked_sub(len as usize))],
            Ok(Msg::Pack {
                count, tag, sealed, ..
            }) if self.minor >= proto::MINOR_PUT_PACK => {
                let packs = &mut self.packs;
                held.with_bytes_mut(|b| unpack(packs, (count, tag, sealed), b))?
            }
            Ok(Msg::Pack { .. }) => return Err(XferError::conn("unexpected data frame")),
            other => {
                link.give_back(held)?;
                return other;
            }
        };
        if let Some(old) = self.held.replace(held) {
            link.give_back(old)?;
        }
        self.batch.extend(files);
        let (m, at) = self
            .batch
            .pop_front()
            .ok_or_else(|| XferError::conn("the client sent a PACK of no file"))?;
        self.put_at = at;
        Ok(m)
    }
}

/// Checks and takes apart a client's PACK of PUT_FILE frames (1.11) in `b`, its whole
/// message (opened in place when sealed): each PUT_FILE with where its payload starts in `b`.
fn unpack(
    packs: &mut PackCheck,
    head: (u16, Option<[u8; 32]>, bool),
    b: &mut [u8],
) -> Result<Vec<(Msg, Option<usize>)>> {
    let bad = |e| XferError::conn(format!("the client sent a bad pack: {e}"));
    let (_, frames) = proto::decode(b).map_err(bad)?;
    let at = b.len() - frames.len();
    let base = b.as_ptr() as usize;
    let frames = packs.open(head, &mut b[at..])?;
    Ok(proto::decode_put_pack(head.0, frames)
        .map_err(bad)?
        .into_iter()
        .map(|(m, payload)| (m, Some(payload.as_ptr() as usize - base)))
        .collect())
}

/// The next request on a connection, in its receive buffer. While it waits, the session
/// lets go of uploads a newer OPEN or PUT of the same file asked for and no stream is
/// receiving (their client is usually gone without the fabric noticing yet). The
/// connection ends once the whole session has been idle (no stream working on a request)
/// for `idle`.
/// The next request; `None` once `stopping` says the drain's grace is over; an error when
/// the connection has been idle for `idle`.
fn next_request(
    link: &mut Link,
    session: &Session,
    idle: Duration,
    stopping: impl Fn() -> bool,
) -> Result<Option<Held>> {
    loop {
        if let Some(held) = link.recv_held_within(RECV_SLICE.min(idle))? {
            return Ok(Some(held));
        }
        if stopping() {
            return Ok(None);
        }
        session.release_superseded();
        if session.idle_for() >= idle {
            return Err(XferError::conn(format!(
                "idle for {:.1} s (idle_timeout): closing the connection",
                idle.as_secs_f64()
            )));
        }
    }
}

/// Decodes a request (a data frame is an error here, but a PACK: [`Requests::take_request`]).
fn decode_request(buf: &[u8]) -> Result<Msg> {
    let (msg, _) = proto::decode(buf)
        .map_err(|e| XferError::conn(format!("the peer sent a bad frame: {e}")))?;
    if matches!(msg, Msg::Block(_) | Msg::File { .. }) {
        return Err(XferError::conn("unexpected data frame"));
    }
    Ok(msg)
}

/// The refusal for a file another connection is writing.
fn busy(path: &str) -> Refusal {
    refuse(
        ErrorCode::Unavailable,
        format!("{path}: another connection is still writing this file; try again"),
    )
}

fn id_in_use(file_id: u32) -> Refusal {
    refuse(
        ErrorCode::BadRequest,
        format!("transfer id {file_id} is already open in this session"),
    )
}

/// A session id: unpredictable (a joining stream must also present the session's token).
fn random_id(n: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(n);
    h.finish()
}

/// A stream of a session; the last one to end ends the session.
struct StreamGuard<'a> {
    server: &'a Server,
    session: Arc<Session>,
}

impl Drop for StreamGuard<'_> {
    fn drop(&mut self) {
        let mut live = self.server.live.lock().unwrap_or_else(|p| p.into_inner());
        if self.session.streams.fetch_sub(1, Ordering::SeqCst) == 1 {
            live.remove(&self.session.id);
            drop(live);
            self.session.end();
        }
    }
}

/// How a PUT's blocks ended: FILE_DONE's `length`, and its hash once every block was good
/// (or the refusal after too many CRC rounds).
type Received = (u64, PResult<Option<[u8; 32]>>);

/// Whether a peer (its address key, [`ferry_service::serve::peer_key`]) is on another
/// host: an IP address that is not loopback. Shared memory and this host's addresses are
/// paths of no distance, however long a busy host took to answer.
fn is_remote_peer(key: &str) -> bool {
    key.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| !ip.is_loopback())
}

/// Bytes of staging memory a connection with `ring` blocks of `block` bytes holds at most,
/// from what it really allocates: its receive ring (the posted receive buffers, in which a
/// writer's queued blocks and a PUT_FILE being written also wait: no copies), its send ring
/// (staging blocks, each on first use), its pool of control send buffers, and with staging
/// threads the copies a GET's hashing thread is fed. (It used to count two more blocks, a
/// copy of a request and of a received block, and with staging threads a writer queue of
/// copies: none is made any more.) The floor's test `ring_costs_what_it_allocates` holds
/// the rings' part to the real allocations.
fn staging_cost(ring: usize, block: u32) -> u64 {
    use ferry_service::channel::{control_pool_bytes, ring_bytes};
    let hashing = if crate::link::staging_threads() {
        ferry_service::ring::sender::hasher_bytes(ring, block)
    } else {
        0
    };
    2 * ring_bytes(ring, block) + control_pool_bytes(proto::MAX_CONTROL) + hashing
}

/// Refuses a connection at its handshake: the refusal, a moment for it to reach the client
/// before the connection goes, and the error that ends the connection.
/// A server's allowed protection levels, as a refusal names them.
fn levels(allowed: &[Level]) -> String {
    let names: Vec<&str> = allowed.iter().map(|l| l.name()).collect();
    names.join(", ")
}

fn refuse_connection<T>(link: &Link, r: impl Into<Refusal>) -> Result<T> {
    let r = r.into();
    let message = r.message.clone();
    reply_refusal(link, 0, r)?;
    std::thread::sleep(Duration::from_millis(50));
    Err(XferError::conn(message))
}

thread_local! {
    /// The last refusal this thread sent: a connection is served on its own thread, so this
    /// is what the request being executed was refused with, for its audit record (the
    /// request handlers answer refusals themselves and return Ok).
    static REFUSED: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// The refusal sent since the last call, if any.
fn take_refusal() -> Option<String> {
    REFUSED.with(|r| r.borrow_mut().take())
}

thread_local! {
    /// The size of the file the last GET on this thread opened, for its audit record (a
    /// second lookup of the path would cost as much as the open did, per small file).
    static SERVED_SIZE: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Notes the size of the file a GET opened, for its audit record.
fn note_served_size(size: u64) {
    SERVED_SIZE.with(|s| s.set(Some(size)));
}

/// The size noted since the last call, if any.
fn take_served_size() -> Option<u64> {
    SERVED_SIZE.with(|s| s.take())
}

fn reply_refusal(link: &Link, file_id: u32, r: impl Into<Refusal>) -> Result<()> {
    let r = r.into();
    tracing::debug!("refused: {}", r.message);
    REFUSED.with(|cell| *cell.borrow_mut() = Some(r.message.clone()));
    link.send(&Msg::Error {
        code: r.code,
        file_id,
        message: r.message,
    })
}

/// Answers a LIST with ENTRIES frames, each short enough to travel inside its
/// advertisement (`Channel::frame_room`: half a round trip, where a longer one is pulled
/// in one and a half; at 50 ms a tree's listing took a round trip more per level), or as
/// long as a control frame may be where the link takes less than a few entries that way.
fn send_entries(link: &Link, entries: Vec<Entry>) -> Result<()> {
    // A frame's header and count; each entry's fixed fields and its name (EntryCodec).
    const FRAME: usize = proto::HEADER_LEN + 2;
    const ENTRY: usize = 1 + 4 + 8 + 8 + 2;
    let room = match link.frame_room() {
        r if r >= FRAME + 8 * (ENTRY + 64) => r,
        _ => proto::MAX_CONTROL,
    };
    let mut batch: Vec<Entry> = Vec::new();
    let mut bytes = FRAME;
    for e in entries {
        let sz = ENTRY + e.name.len();
        if !batch.is_empty() && bytes + sz > room.min(proto::MAX_CONTROL - 64) {
            link.send(&Msg::Entries {
                more: true,
                entries: std::mem::take(&mut batch),
            })?;
            bytes = FRAME;
        }
        bytes += sz;
        batch.push(e);
    }
    link.send(&Msg::Entries {
        more: false,
        entries: batch,
    })
}
