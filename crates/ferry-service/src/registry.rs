//! The services one `ferry serve` hosts, and how a connection chooses one (protocol 1.6,
//! `docs/protocol.md`, "Service selection"), over the secure channel (protocol 1.7,
//! [`crate::secure`]).
//!
//! A client's first message announces TLS (a [`crate::secure::TLS_TYPE`] frame): the
//! handshake runs at once, and every floor and face control frame after it is sealed; the
//! service gets the session ([`Conn::secure`]). A clear first message is refused (REFUSED,
//! or the face's own refusal for a client older than 1.6) unless the server allows clear
//! connections.
//!
//! A connection's first message is either a floor SELECT ([`crate::select`]) naming a
//! service (and, optionally, the client's token, checked here before the service sees the
//! connection), answered SELECTED (the service's face takes over; its first frame may
//! already be on its way), SERVICES (not hosted here: the list of those that are) or
//! REFUSED (the token), the last two closing the connection; or a face's own first frame, which goes to [`LEGACY_SERVICE`], since
//! every client that sends none predates the selection and speaks file transfer. The
//! selection is a floor frame rather than a field of a face's HELLO so that every face keeps
//! its protocol to itself: a face never parses another's frames, and the floor none.

use std::sync::Arc;
use std::time::Duration;

use ferry_exs::proto::{EventKind, Flags};
use ferry_exs::runtime::{EventQueue, ExsBuf, ExsIncoming, ExsSocket};
use ferry_fabric::Access;

use crate::admit::{more, Handshake, Stage};
use crate::auth::{AuthConfig, Principal};
use crate::channel::Channel;
use crate::drain::DrainReport;
use crate::error::{Error, Kind, Result};
use crate::secure::{self, ClientSecurity, Secure, ServerSecurity};
use crate::select::{self, Floor};

/// What a server does with a connection once admission let it in and the client chose it.
pub trait Service: Send + Sync + 'static {
    /// Serves one connection from its face's first frame on (within the handshake's
    /// deadline until authenticated), on the connection's own thread. A failing connection
    /// ends only itself.
    fn serve_connection(&self, conn: Conn);

    /// Refuses a connection whose first frame is this face's own (a client older than
    /// protocol 1.6) with `message`, in the face's words if it can; the default closes it.
    fn refuse_connection(&self, conn: Conn, message: &str) {
        let _ = message;
        let _ = conn.sock.close();
    }

    /// Starts refusing new work (the daemon's first SIGTERM); cheap, idempotent, callable
    /// from the signal thread.
    fn begin_drain(&self) {}

    /// Lets the work in flight run for up to `grace`, then stops the rest, and says what
    /// it did (see [`crate::daemon`]).
    fn drain(&self, grace: Duration) -> DrainReport {
        let _ = grace;
        DrainReport::default()
    }
}

/// An accepted connection handed to a [`Service`]: EXS is open on it, no receive is
/// posted, and the service was chosen.
pub struct Conn {
    /// The connection (remote access deferred until the service authenticates the peer:
    /// [`ExsSocket::enable_remote_access`]).
    pub sock: ExsSocket,
    /// The queue its events go to.
    pub queue: EventQueue,
    /// Its place in the handshake pool, until the service admits it.
    pub hs: Handshake,
    /// The peer's address.
    pub peer: String,
    /// The face's first frame, already received, when the client sent no SELECT (a client
    /// older than protocol 1.6: see [`LEGACY_SERVICE`]); `None` when the
    /// client selected the service, its first frame being the next message.
    pub first: Option<Vec<u8>>,
    /// Who the client's SELECT authenticated as, accepted by the floor
    /// ([`crate::admit::Admission::authenticate`]: a token, over TLS a token's proof or a
    /// key's signature), and what it may do; `None` when it sent no credential, and the
    /// service checks the token its own first frame carries with the same call.
    pub principal: Option<Principal>,
    /// The connection's TLS session (protocol 1.7): the service seals its channel with it
    /// ([`crate::channel::Channel::seal`]); `None` for a clear connection.
    pub secure: Option<Arc<Secure>>,
}

/// The service a connection whose first frame is not a SELECT goes to: file transfer,
/// the only face of clients older than protocol 1.6.
pub const LEGACY_SERVICE: &str = "xfer";

/// The most bytes a connection's first message may have (a SELECT, or a face's first frame
/// sent without one).
pub const FIRST_MAX: usize = 64 * 1024;

/// How often a connection waiting for its first message looks whether it was called off.
const CANCEL_POLL: Duration = Duration::from_millis(10);

/// How long a refusal is given to reach the client before the connection closes.
const LINGER: Duration = Duration::from_millis(50);

/// The services a server hosts, by name, behind its one authentication.
pub struct Registry {
    services: Vec<(String, Arc<dyn Service>)>,
    /// Who may use them (the token a SELECT carries is checked against it).
    auth: AuthConfig,
    /// The server's TLS identity and whether clear connections are let in.
    security: ServerSecurity,
}

impl Registry {
    /// No services yet; clients authenticate against `auth` over connections secured as
    /// `security` says.
    pub fn new(auth: AuthConfig, security: ServerSecurity) -> Registry {
        Registry {
            services: Vec::new(),
            auth,
            security,
        }
    }

    /// Hosts `service` as `name`: a [`select::valid_name`], not empty, not taken, and at
    /// most [`select::MAX_SERVICES`] in all.
    pub fn add(&mut self, name: &str, service: Arc<dyn Service>) -> Result<()> {
        let usage = |m: String| Err(Error::new(Kind::Usage, m));
        if name.is_empty() || !select::valid_name(name) {
            return usage(format!(
                "service name {name:?}: 1 to {} bytes of a-z 0-9 - _ .",
                select::MAX_NAME
            ));
        }
        if self.get(name).is_some() {
            return usage(format!("service {name:?} is hosted twice"));
        }
        if self.services.len() >= select::MAX_SERVICES {
            return usage(format!(
                "at most {} services in one server",
                select::MAX_SERVICES
            ));
        }
        self.services.push((name.to_string(), service));
        Ok(())
    }

    /// The service hosted as `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Service>> {
        self.services
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s)
    }

    /// The names of the services hosted, in the order they were added.
    pub fn names(&self) -> Vec<String> {
        self.services.iter().map(|(n, _)| n.clone()).collect()
    }

    /// A connection's thread: the EXS handshake, the first message, and the service it
    /// chooses, within the handshake's deadline and ended early if the handshake is called
    /// off to make room for a newer connection.
    pub(crate) fn connection(&self, inc: ExsIncoming, hs: Handshake, peer: String) {
        let queue = match EventQueue::new() {
            Ok(q) => q,
            Err(e) => return tracing::warn!("{peer}: event queue: {e}"),
        };
        let sock = match inc.start_cancellable(&queue, hs.left(), &hs.cancel) {
            Ok(s) => s,
            Err(e) => {
                if let Some(held) = hs.admission().log_handshake.pass() {
                    tracing::info!("{peer}: handshake failed: {e}{}", more(held));
                }
                return;
            }
        };
        if !hs.reached(Stage::Hello) {
            let _ = sock.close();
            return;
        }
        let first = match first_message(&sock, &queue, &hs) {
            Ok(m) => m,
            Err(e) => {
                tracing::info!("{peer}: connection ended: {e}");
                let _ = sock.close();
                return;
            }
        };
        let (first, secure) = if secure::is_tls(&first) {
            match self.secure(&sock, &queue, &hs, first) {
                Ok((f, s)) => (f, Some(Arc::new(s))),
                Err(e) => {
                    tracing::info!("{peer}: TLS handshake failed: {e}");
                    let _ = sock.close();
                    return;
                }
            }
        } else if self.security.clear_allowed() {
            (first, None)
        } else {
            return self.refuse_clear(sock, queue, hs, peer, first);
        };
        match self.choose(&sock, secure.as_deref(), &hs, &first) {
            Ok(Some((service, selected, principal))) => {
                // A face's first frame is being checked now: never called off.
                if !selected && !hs.reached(Stage::Checking) {
                    let _ = sock.close();
                    return;
                }
                service.serve_connection(Conn {
                    sock,
                    queue,
                    hs,
                    peer,
                    first: (!selected).then_some(first),
                    principal,
                    secure,
                });
            }
            Ok(None) => {
                std::thread::sleep(LINGER);
                let _ = sock.close();
            }
            Err(e) => {
                tracing::info!("{peer}: connection ended: {e}");
                let _ = sock.close();
            }
        }
    }

    /// The service a first message chooses, whether it chose by SELECT (answered
    /// SELECTED), and who the credential the SELECT carried (token, token proof or key
    /// proof) authenticated; `None` when it named a service not hosted here (answered
    /// SERVICES) or carried a credential refused (answered REFUSED; the admission logs it,
    /// rate-limited per address).
    fn choose(
        &self,
        sock: &ExsSocket,
        secure: Option<&Secure>,
        hs: &Handshake,
        first: &[u8],
    ) -> Result<Option<Chosen>> {
        if !select::is_floor(first) {
            return match self.get(LEGACY_SERVICE) {
                Some(s) => Ok(Some((s.clone(), false, None))),
                None => Err(Error::conn(format!(
                    "a client without service selection (older than protocol 1.6) asked for {LEGACY_SERVICE}, which this server does not run"
                ))),
            };
        }
        let (service, token, proof, key) = match select::decode(first) {
            Ok(Floor::Select {
                service,
                token,
                proof,
                key,
            }) => (service, token, proof, key),
            Ok(f) => return Err(Error::conn(format!("expected SELECT, got {f:?}"))),
            Err(e) => return Err(Error::conn(format!("the peer sent {e}"))),
        };
        match self.get(&service) {
            Some(s) => {
                let adm = hs.admission();
                let checked = match (&token, &proof, &key, secure) {
                    (_, Some(_), _, None) | (_, _, Some(_), None) => {
                        return Err(Error::conn("a token or key proof outside TLS"));
                    }
                    (_, _, Some(k), Some(sec)) => adm
                        .authenticate_key(&hs.addr, &self.auth, k, sec.binding())
                        .map(Some),
                    (_, Some(p), None, Some(sec)) => adm
                        .authenticate_proof(&hs.addr, &self.auth, p, sec.binding())
                        .map(Some),
                    (Some(t), None, None, _) => adm.authenticate(&hs.addr, &self.auth, t).map(Some),
                    (None, None, None, _) => Ok(None),
                };
                // A grant lets its holder write one path by file transfer, and nothing else.
                let checked = match checked {
                    Ok(Some(p)) if p.rights.scope.is_some() && service != LEGACY_SERVICE => {
                        Err(crate::admit::AuthRefused {
                            message: "a grant is for file transfer only",
                        })
                    }
                    other => other,
                };
                match checked {
                    Ok(principal) => {
                        send(sock, secure, &Floor::Selected)?;
                        Ok(Some((s.clone(), true, principal)))
                    }
                    Err(r) => {
                        send(
                            sock,
                            secure,
                            &Floor::Refused {
                                message: r.message.into(),
                            },
                        )?;
                        Ok(None)
                    }
                }
            }
            None => {
                tracing::debug!("refused a SELECT of service {service:?}: not hosted");
                send(
                    sock,
                    secure,
                    &Floor::Services {
                        requested: service,
                        hosted: self.names(),
                    },
                )?;
                Ok(None)
            }
        }
    }
}

impl Registry {
    /// The TLS handshake of a connection whose first message (`hello`) announced it, then
    /// its first frame, opened.
    fn secure(
        &self,
        sock: &ExsSocket,
        queue: &EventQueue,
        hs: &Handshake,
        hello: Vec<u8>,
    ) -> Result<(Vec<u8>, Secure)> {
        let mut wire = RawWire { sock, queue, hs };
        let session = secure::accept(&self.security, &mut wire, hello)?;
        let sealed = secure::Wire::recv_msg(&mut wire)?;
        let mut first = Vec::new();
        session.open(&sealed, &mut first)?;
        Ok((first, session))
    }

    /// Refuses a clear connection (this server requires TLS): REFUSED to a SELECT, the
    /// face's refusal to a client older than protocol 1.6.
    fn refuse_clear(
        &self,
        sock: ExsSocket,
        queue: EventQueue,
        hs: Handshake,
        peer: String,
        first: Vec<u8>,
    ) {
        tracing::info!("{peer}: refused a clear connection (this server requires TLS)");
        if select::is_floor(&first) {
            let _ = send(
                &sock,
                None,
                &Floor::Refused {
                    message: CLEAR_REFUSED.into(),
                },
            );
            std::thread::sleep(LINGER);
            let _ = sock.close();
            return;
        }
        match self.get(LEGACY_SERVICE) {
            Some(s) => s.refuse_connection(
                Conn {
                    sock,
                    queue,
                    hs,
                    peer,
                    first: Some(first),
                    principal: None,
                    secure: None,
                },
                CLEAR_REFUSED,
            ),
            None => {
                let _ = sock.close();
            }
        }
    }
}

/// What a clear client is told by a server that requires TLS.
pub const CLEAR_REFUSED: &str = "this server requires TLS (protocol 1.7): upgrade this ferry client; or, on a trusted network only, allow clear connections on the server ([security] allow_clear) and pass --insecure-clear";

/// A connection's raw messages during its TLS handshake, within the handshake's deadline.
struct RawWire<'a> {
    sock: &'a ExsSocket,
    queue: &'a EventQueue,
    hs: &'a Handshake,
}

impl secure::Wire for RawWire<'_> {
    fn send_msg(&mut self, msg: &[u8]) -> Result<()> {
        send_raw(self.sock, msg)
    }

    fn recv_msg(&mut self) -> Result<Vec<u8>> {
        first_message(self.sock, self.queue, self.hs)
    }

    fn immediate(&self) -> usize {
        self.sock.config().small_packet_max_size as usize
    }
}

/// A chosen service, whether by SELECT, and who the floor authenticated.
type Chosen = (Arc<dyn Service>, bool, Option<Principal>);

/// The connection's first message, waited for until the handshake's deadline or until it
/// is called off.
fn first_message(sock: &ExsSocket, queue: &EventQueue, hs: &Handshake) -> Result<Vec<u8>> {
    let buf = sock
        .alloc_with(FIRST_MAX, recv_rights(sock))
        .map_err(|e| Error::conn(format!("register the first receive buffer: {e}")))?;
    sock.recv(buf, Flags::NONE, 0);
    loop {
        if hs.cancelled() {
            return Err(Error::conn(
                "closed before its first frame to make room for newer connections (max_handshakes)",
            ));
        }
        let left = hs.left();
        if left.is_zero() {
            return Err(Error::conn(
                "no first frame within the handshake timeout (handshake_timeout)",
            ));
        }
        let Some(ev) = queue.dequeue(left.min(CANCEL_POLL)) else {
            continue;
        };
        match ev.kind {
            EventKind::Recv => {
                ev.result
                    .map_err(|e| Error::conn(format!("receive the first frame: {e}")))?;
                return received(ev.buf, ev.len);
            }
            EventKind::Close => return Err(Error::conn("the peer closed the connection")),
            _ => {}
        }
    }
}

/// The bytes a completed receive delivered (`len` of its buffer).
fn received(buf: Option<ExsBuf>, len: u64) -> Result<Vec<u8>> {
    let buf = buf.ok_or_else(|| Error::conn("receive completed without its buffer"))?;
    let len = usize::try_from(len).unwrap_or(usize::MAX).min(buf.len());
    let mut v = Vec::new();
    crate::channel::copy_out(&buf, len, &mut v);
    Ok(v)
}

/// Sends a floor frame (small enough to need no remote access, sealed too), sealed when
/// the connection is secure.
fn send(sock: &ExsSocket, secure: Option<&Secure>, f: &Floor) -> Result<()> {
    let bytes = select::encode(f).map_err(|e| Error::conn(format!("encode {f:?}: {e}")))?;
    match secure {
        Some(s) => s.seal(&bytes, |sealed| send_raw(sock, sealed)),
        None => send_raw(sock, &bytes),
    }
}

/// Sends one message as it is (small enough to need no remote access).
fn send_raw(sock: &ExsSocket, bytes: &[u8]) -> Result<()> {
    let rights = if sock.config().push {
        Access::LOCAL
    } else {
        Access::REMOTE_READ
    };
    let buf = sock
        .alloc_with(bytes.len(), rights)
        .map_err(|e| Error::conn(format!("register a send buffer: {e}")))?;
    buf.write_at(0, bytes)
        .map_err(|e| Error::conn(format!("fill a send buffer: {e}")))?;
    sock.send(buf, Flags::NONE, 0);
    Ok(())
}

/// The remote rights a receive buffer needs: none with pull (the default), write with push.
fn recv_rights(sock: &ExsSocket) -> Access {
    if sock.config().push {
        Access::REMOTE_WRITE
    } else {
        Access::LOCAL
    }
}

/// What a server answered a SELECT ([`probe`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The service is hosted (SELECTED).
    Selected,
    /// It is not; these are (SERVICES).
    Hosted(Vec<String>),
}

/// Asks the server at `addr` for `service` ("" only asks for the list) and returns its
/// answer, then closes the connection: what `ferry services` does, over a connection
/// secured as [`ClientSecurity::default`] says (see [`probe_with`]).
pub fn probe(addr: &str, service: &str, timeout: Duration) -> Result<Answer> {
    probe_with(addr, service, timeout, &ClientSecurity::default())
}

/// [`probe`] over a connection secured as `sec` says. A server older than protocol 1.6
/// closes the connection without an answer (it takes a SELECT for a bad frame).
pub fn probe_with(
    addr: &str,
    service: &str,
    timeout: Duration,
    sec: &ClientSecurity,
) -> Result<Answer> {
    if !select::valid_name(service) {
        return Err(Error::new(
            Kind::Usage,
            format!(
                "service name {service:?}: 1 to {} bytes of a-z 0-9 - _ .",
                select::MAX_NAME
            ),
        ));
    }
    let mut ch = Channel::connect_with(addr, timeout, sec)?;
    ch.timeout = timeout;
    ch.post_ring(1, select::MAX_ANSWER)?;
    let select = Floor::Select {
        service: service.to_string(),
        token: None,
        proof: None,
        key: None,
    };
    let bytes = select::encode(&select).map_err(|e| Error::conn(format!("encode SELECT: {e}")))?;
    ch.send_frame(&bytes)?;
    let old = |e: Error| {
        Error::conn(format!(
            "{addr} closed the connection without answering: a ferry serve older than protocol 1.6 (no service selection; it runs file transfer only)? ({e})"
        ))
    };
    let answer = ch.recv_first().map_err(old);
    ch.close();
    match select::decode(&answer?) {
        Ok(Floor::Selected) => Ok(Answer::Selected),
        Ok(Floor::Services { hosted, .. }) => Ok(Answer::Hosted(hosted)),
        Ok(Floor::Refused { message }) => Err(Error::new(Kind::Auth, format!("{addr}: {message}"))),
        Ok(f) => Err(Error::conn(format!("{addr} answered {f:?} to SELECT"))),
        Err(e) => Err(Error::conn(format!("{addr} sent {e}"))),
    }
}
