//! The secure channel: TLS 1.3 (rustls) on every connection's control messages, on every
//! driver, with the server's identity pinned by the client and tokens proven, never sent
//! (protocol 1.7, `docs/protocol.md`, "Secure channel"; `docs/security.md`).
//!
//! rustls does no I/O of its own, so one design serves every driver: its records travel
//! inside EXS messages as floor frames of type [`TLS_TYPE`]. The client's first message is
//! one (its ClientHello), which is how a server tells a TLS client from a clear one. During
//! the handshake the TLS byte stream is cut into messages no larger than the immediate size
//! (the server lets a client reach its buffers by RMA only once it is authenticated); after
//! it, each control frame of the connection is sealed into one message ([`Secure::seal`]),
//! and the receiver opens it ([`Secure::open`]). Data frames (a face's blocks, moved by RMA
//! or as bulk messages) stay as they are in this slice: the face names their types, and
//! any other clear message on a sealed connection is refused, so a control frame cannot be
//! forged or changed on the path (the floor's channel checks it).
//!
//! The server's identity ([`identity`]) is a key pair and self-signed certificate made at
//! first start in its state directory; the client pins the certificate's SHA-256
//! fingerprint: given (`--server-fingerprint`), or from its known-hosts file
//! ([`known_hosts`], trust on first use, ssh-like, strict on request).
//!
//! Tokens are proven: the client sends HMAC-SHA256(token, the TLS exporter value) and a
//! short identifier of the token ([`prove`], [`token_id`]), so a captured proof is useless
//! on any other connection (the exporter value is unique to each TLS session).
//!
//! The crypto provider is *ring*: it builds with only a C compiler (aws-lc-rs needs cmake
//! and a longer build on this project's 2-core CI), and only the control channel is
//! encrypted in this slice, where the provider's speed does not show (a few small records
//! per request). Data blocks are authenticated under keys from this session's exporter
//! ([`protect`], protocol 1.9); its module notes measure *ring*'s AEADs on this CPU for
//! the encrypting level still to come.

pub mod identity;
pub mod known_hosts;
pub mod protect;

use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::error::{Error, Kind, Result};
use crate::select::HEADER_LEN;

pub use identity::{default_state_dir, fingerprint, parse_fingerprint, Identity};
pub use protect::{Level, Protection};

/// The floor frame type carrying TLS bytes (header as every floor frame, then the bytes).
pub const TLS_TYPE: u8 = 0xF4;

/// The label of the TLS exporter value a token proof is computed over (RFC 8446 7.5).
pub const PROOF_LABEL: &[u8] = b"EXPORTER-ferry-token-proof";

pub use crate::select::TOKEN_ID_LEN;

/// The largest TLS record payload, and what sealing adds to each record at most (record
/// header, content type, AEAD tag).
const RECORD: usize = 16 * 1024;
const RECORD_OVERHEAD: usize = 5 + 1 + 16;

/// The most bytes sealing adds to a frame of `len` bytes: what a receive buffer for frames
/// of `len` bytes needs on top when the connection is sealed.
pub fn seal_room(len: usize) -> usize {
    HEADER_LEN + (len / RECORD + 1) * RECORD_OVERHEAD
}

/// A floor frame carrying `tls` bytes.
pub fn tls_frame(tls: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + tls.len());
    // A message is at most a control frame and its seal, far under 4 GiB.
    v.extend_from_slice(&((HEADER_LEN + tls.len()) as u32).to_le_bytes());
    v.extend_from_slice(&[TLS_TYPE, 0, 0, 0]);
    v.extend_from_slice(tls);
    v
}

/// The TLS bytes of a message, if it is a well-formed TLS floor frame.
pub fn tls_payload(msg: &[u8]) -> Option<&[u8]> {
    let head = msg.get(..HEADER_LEN)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    (len == msg.len() && head[4] == TLS_TYPE && head[5..8] == [0, 0, 0]).then(|| &msg[HEADER_LEN..])
}

/// Whether a message is a TLS floor frame (a client's first one announces TLS).
pub fn is_tls(msg: &[u8]) -> bool {
    msg.len() >= HEADER_LEN && msg[4] == TLS_TYPE
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// An identifier of `token` that does not reveal it: the first bytes of a SHA-256 of it.
pub fn token_id(token: &str) -> [u8; TOKEN_ID_LEN] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(b"ferry token id\0");
    ctx.update(token.as_bytes());
    let d = ctx.finish();
    let mut id = [0u8; TOKEN_ID_LEN];
    id.copy_from_slice(&d.as_ref()[..TOKEN_ID_LEN]);
    id
}

/// The proof of `token` on a connection whose exporter value is `binding`:
/// HMAC-SHA256 keyed by the token.
pub fn prove(token: &str, binding: &[u8; 32]) -> [u8; 32] {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, token.as_bytes());
    let tag = ring::hmac::sign(&key, binding);
    let mut mac = [0u8; 32];
    mac.copy_from_slice(tag.as_ref());
    mac
}

/// The `[security]` table of a server's configuration.
#[derive(Debug, Clone, Default, serde::Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SecurityConfig {
    /// Where the server keeps its identity ([`default_state_dir`] when not set).
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// Let in clients that ask for a clear connection (`--insecure-clear`): no TLS, the
    /// token in clear. Trusted networks only.
    #[serde(default)]
    pub allow_clear: bool,
    /// The data protection levels a TLS client may ask for ([`protect`]; the default
    /// [`protect::DEFAULT_ALLOWED`]): `clear` only when listed.
    #[serde(default)]
    pub protection: Option<Vec<Level>>,
}

impl SecurityConfig {
    /// The state directory in use.
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir.clone().unwrap_or_else(default_state_dir)
    }

    /// The server's security: its identity loaded (made at first start), TLS with it.
    pub fn load(&self) -> Result<ServerSecurity> {
        let mut sec = ServerSecurity::from_state_dir(&self.state_dir(), self.allow_clear)?;
        if let Some(levels) = &self.protection {
            sec.set_protection(levels)?;
        }
        Ok(sec)
    }
}

/// What a server does about security: its TLS identity, and whether clear clients are let
/// in.
#[derive(Clone)]
pub struct ServerSecurity {
    tls: Option<Arc<rustls::ServerConfig>>,
    fingerprint: Option<String>,
    /// Let in clients that ask for a clear connection (`[security] allow_clear`).
    pub allow_clear: bool,
    /// The data protection levels a TLS client may ask for (`[security] protection`).
    protection: Vec<Level>,
    /// Whether `protection` was configured (then a client that agrees on no level, one
    /// older than protocol 1.9, is served only if it lists `clear`).
    protection_set: bool,
}

impl std::fmt::Debug for ServerSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerSecurity")
            .field("fingerprint", &self.fingerprint)
            .field("allow_clear", &self.allow_clear)
            .field("protection", &self.protection)
            .finish()
    }
}

impl ServerSecurity {
    /// TLS with `identity`; clear clients too when `allow_clear`.
    pub fn new(identity: &Identity, allow_clear: bool) -> Result<ServerSecurity> {
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| Error::new(Kind::Usage, format!("TLS setup: {e}")))?
            .with_no_client_auth()
            .with_single_cert(
                std::iter::once(&identity.cert)
                    .chain(&identity.chain)
                    .cloned()
                    .collect(),
                identity.key.clone_key(),
            )
            .map_err(|e| {
                Error::new(
                    Kind::Usage,
                    format!("the server key in {}: {e}", identity.path.display()),
                )
            })?;
        // No resumption: every connection makes a full handshake, and no post-handshake
        // message follows it.
        cfg.send_tls13_tickets = 0;
        Ok(ServerSecurity {
            tls: Some(Arc::new(cfg)),
            fingerprint: Some(identity.fingerprint()),
            allow_clear,
            protection: protect::DEFAULT_ALLOWED.to_vec(),
            protection_set: false,
        })
    }

    /// No TLS, clear connections refused: a server with no EXS listener (block exports
    /// only), which never meets a client of the floor.
    pub fn none() -> ServerSecurity {
        ServerSecurity {
            tls: None,
            fingerprint: None,
            allow_clear: false,
            protection: protect::DEFAULT_ALLOWED.to_vec(),
            protection_set: false,
        }
    }

    /// The identity in `state_dir` (made at first start), TLS with it.
    pub fn from_state_dir(state_dir: &std::path::Path, allow_clear: bool) -> Result<Self> {
        Self::new(&Identity::load_or_create(state_dir)?, allow_clear)
    }

    /// The server's fingerprint, when it speaks TLS.
    pub fn fingerprint(&self) -> Option<&str> {
        self.fingerprint.as_deref()
    }

    /// A fresh server side of a TLS session.
    pub(crate) fn session(&self) -> Result<rustls::Connection> {
        let cfg = self
            .tls
            .clone()
            .ok_or_else(|| Error::conn("this server has no TLS identity"))?;
        rustls::ServerConnection::new(cfg)
            .map(Into::into)
            .map_err(|e| Error::conn(format!("TLS: {e}")))
    }

    /// Whether a clear connection is let in.
    pub fn clear_allowed(&self) -> bool {
        self.allow_clear
    }

    /// The data protection levels a TLS client may ask for.
    pub fn protection(&self) -> &[Level] {
        &self.protection
    }

    /// Allows exactly `levels` ([`protect::check_allowed`]).
    pub fn set_protection(&mut self, levels: &[Level]) -> Result<()> {
        protect::check_allowed(levels)?;
        let mut levels = levels.to_vec();
        levels.sort();
        levels.dedup();
        self.protection = levels;
        self.protection_set = true;
        Ok(())
    }

    /// Whether a TLS client that agrees on no level (one older than protocol 1.9) is
    /// served, its blocks checked by CRC-32C and its files by their sealed BLAKE3, as 1.8
    /// did: by default yes (compatibility); with `[security] protection` set, only if it
    /// lists `clear`.
    pub fn serves_unprotected(&self) -> bool {
        !self.protection_set || self.protection.contains(&Level::Clear)
    }
}

/// What a client does about security.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSecurity {
    /// Ask for a clear connection (`--insecure-clear`); the server must allow it too.
    pub clear: bool,
    /// Accept only a server with this fingerprint (`--server-fingerprint`); the known-hosts
    /// file is then neither read nor written.
    pub fingerprint: Option<String>,
    /// The known-hosts file ([`known_hosts::default_path`] unless given).
    pub known_hosts: PathBuf,
    /// Refuse a server not in the known-hosts file (`--strict-host-keys`).
    pub strict: bool,
    /// Verify the server's certificate chain against the CAs in this PEM file, for the
    /// server's host name or IP address (`--ca-file`), instead of pinning: the known-hosts
    /// file is then neither read nor written.
    pub ca_file: Option<PathBuf>,
    /// The data protection required (`--protect`): exactly this level or the connection
    /// fails. `None`: [`Level::Integrity`] over TLS, [`Level::Clear`] on a clear connection.
    pub protection: Option<Level>,
}

impl ClientSecurity {
    /// The data protection this client requires.
    pub fn level(&self) -> Level {
        match (self.protection, self.clear) {
            (Some(l), _) => l,
            (None, true) => Level::Clear,
            (None, false) => Level::Integrity,
        }
    }
}

impl Default for ClientSecurity {
    fn default() -> Self {
        ClientSecurity {
            clear: false,
            fingerprint: None,
            known_hosts: known_hosts::default_path(),
            strict: false,
            ca_file: None,
            protection: None,
        }
    }
}

/// The messages of one connection during a handshake.
pub(crate) trait Wire {
    /// Sends one message.
    fn send_msg(&mut self, msg: &[u8]) -> Result<()>;
    /// The next message.
    fn recv_msg(&mut self) -> Result<Vec<u8>>;
    /// The largest message that crosses without RMA (the immediate size).
    fn immediate(&self) -> usize;
}

/// One connection's TLS session after its handshake: seals and opens its control frames.
pub struct Secure {
    tls: Mutex<rustls::Connection>,
    binding: [u8; 32],
    /// Room for the next sealed message, kept from an earlier one (used under the `tls`
    /// lock): a large frame sealed into fresh memory would fault its pages in every time.
    sealed: Mutex<Vec<u8>>,
    /// The shortest wait, during the handshake, from this side's flight to the peer's
    /// answer to it: a round trip of the path (and the peer's handshake work).
    rtt: Option<std::time::Duration>,
}

impl std::fmt::Debug for Secure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secure")
    }
}

impl Secure {
    fn lock(&self) -> MutexGuard<'_, rustls::Connection> {
        self.tls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The handshake's round trip: from a flight this side sent to the peer's answer
    /// (for the server, its ServerHello to the client's Finished). A server learns the
    /// path's round trip from it when a client sends its requests without waiting for
    /// WELCOME, which leaves no later wait to time.
    pub fn handshake_rtt(&self) -> Option<std::time::Duration> {
        self.rtt
    }

    /// The TLS exporter value a token proof is computed over (unique to this session).
    pub fn binding(&self) -> &[u8; 32] {
        &self.binding
    }

    /// 32 bytes of the TLS exporter under `label` and `context` (RFC 8446 7.5): keys both
    /// ends of this session derive alike and no one else can ([`protect`]).
    pub fn export(&self, label: &[u8], context: &[u8]) -> Result<[u8; 32]> {
        let mut out = [0u8; 32];
        self.lock()
            .export_keying_material(&mut out, label, Some(context))
            .map_err(|e| Error::conn(format!("TLS exporter: {e}")))?;
        Ok(out)
    }

    /// Seals `frame` into one TLS floor frame and hands it to `send` while holding the
    /// session, so that records leave in the order they were sealed.
    pub fn seal<T>(&self, frame: &[u8], send: impl FnOnce(&[u8]) -> Result<T>) -> Result<T> {
        let mut tls = self.lock();
        let mut w = tls.writer();
        std::io::Write::write_all(&mut w, frame)
            .map_err(|e| Error::conn(format!("seal a frame: {e}")))?;
        let mut out = std::mem::take(&mut *self.sealed.lock().unwrap_or_else(|p| p.into_inner()));
        out.clear();
        out.reserve(HEADER_LEN + frame.len() + seal_room(frame.len()));
        out.extend_from_slice(&[0; HEADER_LEN]);
        while tls.wants_write() {
            tls.write_tls(&mut out)
                .map_err(|e| Error::conn(format!("seal a frame: {e}")))?;
        }
        let len = out.len() as u32;
        out[..4].copy_from_slice(&len.to_le_bytes());
        out[4] = TLS_TYPE;
        let sent = send(&out);
        *self.sealed.lock().unwrap_or_else(|p| p.into_inner()) = out;
        sent
    }

    /// Opens a sealed message into `out` (the one frame it carries). A message that is not
    /// sealed, or fails its authentication (changed on the path, replayed, out of order),
    /// breaks the connection.
    pub fn open(&self, msg: &[u8], out: &mut Vec<u8>) -> Result<()> {
        let records = tls_payload(msg).ok_or_else(|| {
            Error::conn(
                "a clear control message on a secure connection (forged or changed on the path?)",
            )
        })?;
        out.clear();
        let mut tls = self.lock();
        feed(&mut tls, records, Some(out))?;
        if out.is_empty() {
            return Err(Error::conn("a secure message with no frame in it"));
        }
        Ok(())
    }
}

/// Feeds `records` to the session and collects the plaintext they carry into `out` (none
/// is expected during a handshake).
fn feed(
    tls: &mut rustls::Connection,
    mut records: &[u8],
    mut out: Option<&mut Vec<u8>>,
) -> Result<()> {
    let broke = |e: &dyn std::fmt::Display| {
        Error::conn(format!(
            "the secure channel broke: {e} (a message changed, replayed or forged on the path?)"
        ))
    };
    while !records.is_empty() {
        tls.read_tls(&mut records).map_err(|e| broke(&e))?;
        let state = tls.process_new_packets().map_err(|e| broke(&e))?;
        if state.peer_has_closed() {
            return Err(Error::conn("the peer closed the secure channel"));
        }
        let n = state.plaintext_bytes_to_read();
        if n > 0 {
            let Some(out) = out.as_deref_mut() else {
                return Err(broke(&"data before the handshake's end"));
            };
            let at = out.len();
            out.resize(at + n, 0);
            tls.reader()
                .read_exact(&mut out[at..])
                .map_err(|e| broke(&e))?;
        }
    }
    Ok(())
}

/// Runs a handshake over `wire` to its end (`first`: the peer's first message, already
/// received), then returns the session.
fn handshake(
    mut tls: rustls::Connection,
    wire: &mut dyn Wire,
    first: Option<Vec<u8>>,
) -> Result<Secure> {
    let chunk = wire.immediate().min(512).saturating_sub(HEADER_LEN).max(64);
    let mut next = first;
    let mut rtt: Option<std::time::Duration> = None;
    loop {
        // What this side has to say first: its flight, or the alert of a failure.
        let mut flight = Vec::new();
        while tls.wants_write() {
            tls.write_tls(&mut flight)
                .map_err(|e| Error::conn(format!("TLS handshake: {e}")))?;
        }
        for part in flight.chunks(chunk) {
            wire.send_msg(&tls_frame(part))?;
        }
        if !tls.is_handshaking() {
            break;
        }
        let msg = match next.take() {
            Some(m) => m,
            None => {
                let sent = std::time::Instant::now();
                let m = wire.recv_msg()?;
                if !flight.is_empty() {
                    let waited = sent.elapsed();
                    rtt = Some(rtt.map_or(waited, |r| r.min(waited)));
                }
                m
            }
        };
        let records = tls_payload(&msg)
            .ok_or_else(|| Error::conn("the peer sent a clear message during the TLS handshake"))?;
        if let Err(e) = feed(&mut tls, records, None) {
            // The alert rustls queued tells the peer why; best effort.
            let mut alert = Vec::new();
            let _ = tls.write_tls(&mut alert);
            if !alert.is_empty() {
                let _ = wire.send_msg(&tls_frame(&alert));
            }
            return Err(e);
        }
    }
    // A sealed frame is written whole and its records drained at once ([`Secure::seal`]):
    // no buffer limit needs to hold it back.
    tls.set_buffer_limit(None);
    let mut binding = [0u8; 32];
    tls.export_keying_material(&mut binding, PROOF_LABEL, None)
        .map_err(|e| Error::conn(format!("TLS exporter: {e}")))?;
    Ok(Secure {
        tls: Mutex::new(tls),
        binding,
        sealed: Mutex::new(Vec::new()),
        rtt,
    })
}

/// The server's side of a handshake whose ClientHello is `first`.
pub(crate) fn accept(sec: &ServerSecurity, wire: &mut dyn Wire, first: Vec<u8>) -> Result<Secure> {
    handshake(sec.session()?, wire, Some(first))
}

/// The client's side of a handshake with the server at `addr`, pinning its identity as
/// `sec` says.
pub(crate) fn connect(sec: &ClientSecurity, addr: &str, wire: &mut dyn Wire) -> Result<Secure> {
    if let Some(ca) = &sec.ca_file {
        return connect_ca(ca, addr, wire);
    }
    let pins = Arc::new(Pinning {
        host: known_hosts::host_key(addr),
        sec: sec.clone(),
        provider: provider(),
        refusal: Mutex::new(None),
        new_host: Mutex::new(None),
    });
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::new(Kind::Usage, format!("TLS setup: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(pins.clone())
        .with_no_client_auth();
    cfg.resumption = rustls::client::Resumption::disabled();
    cfg.enable_sni = false;
    let name = ServerName::try_from("ferry").map_err(|e| Error::conn(format!("TLS: {e}")))?;
    let tls = rustls::ClientConnection::new(Arc::new(cfg), name)
        .map_err(|e| Error::conn(format!("TLS: {e}")))?;
    let secure = handshake(tls.into(), wire, None).map_err(|e| {
        let refused = pins
            .refusal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        refused.unwrap_or_else(|| old_server(addr, e))
    })?;
    let new_host = pins
        .new_host
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    if let Some(fp) = new_host {
        known_hosts::remember(&sec.known_hosts, &pins.host, &fp)?;
        eprintln!(
            "ferry: pinned the server {} ({fp}) in {}",
            pins.host,
            sec.known_hosts.display()
        );
    }
    Ok(secure)
}

/// The client's side of a handshake whose server certificate must chain to a CA of the PEM
/// file `ca` and name the host of `addr` (its DNS name or IP address).
fn connect_ca(ca: &std::path::Path, addr: &str, wire: &mut dyn Wire) -> Result<Secure> {
    let pem =
        std::fs::read(ca).map_err(|e| Error::io(format!("--ca-file {}", ca.display()), &e))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert =
            cert.map_err(|e| Error::new(Kind::Usage, format!("--ca-file {}: {e}", ca.display())))?;
        roots
            .add(cert)
            .map_err(|e| Error::new(Kind::Usage, format!("--ca-file {}: {e}", ca.display())))?;
    }
    if roots.is_empty() {
        return Err(Error::new(
            Kind::Usage,
            format!("--ca-file {}: no certificate in it", ca.display()),
        ));
    }
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| Error::new(Kind::Usage, format!("--ca-file {}: {e}", ca.display())))?;
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::new(Kind::Usage, format!("TLS setup: {e}")))?
        .with_webpki_verifier(verifier)
        .with_no_client_auth();
    cfg.resumption = rustls::client::Resumption::disabled();
    cfg.enable_sni = false;
    let host = host_of(addr);
    let name = ServerName::try_from(host.to_string()).map_err(|e| {
        Error::new(
            Kind::Usage,
            format!("{addr}: {host:?} is no host name: {e}"),
        )
    })?;
    let tls = rustls::ClientConnection::new(Arc::new(cfg), name)
        .map_err(|e| Error::conn(format!("TLS: {e}")))?;
    handshake(tls.into(), wire, None).map_err(|e| {
        if e.msg.contains("certificate") {
            Error::new(
                Kind::Auth,
                format!(
                    "the server at {addr} presented a certificate the CAs of {} do not vouch for as {host}: refusing it ({e})",
                    ca.display()
                ),
            )
        } else {
            old_server(addr, e)
        }
    })
}

/// The host of a fabric address (`tcp://HOST:PORT`, `[V6]:PORT`): what its certificate
/// must name.
fn host_of(addr: &str) -> &str {
    let hp = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    let host = match hp.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => hp,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

/// A handshake that failed because the server closed the connection is most likely a
/// server that predates TLS.
fn old_server(addr: &str, e: Error) -> Error {
    if e.msg.contains("closed") {
        Error::conn(format!(
            "{addr} closed the connection during the TLS handshake: a ferry serve older than protocol 1.7 (no TLS)? Upgrade it, or use --insecure-clear here and allow_clear there ({e})"
        ))
    } else {
        e
    }
}

/// The client's judge of the server's certificate: its fingerprint against the pin or the
/// known-hosts file.
#[derive(Debug)]
struct Pinning {
    host: String,
    sec: ClientSecurity,
    provider: Arc<CryptoProvider>,
    /// Why the server was refused (rustls only carries an error code).
    refusal: Mutex<Option<Error>>,
    /// A host seen for the first time, pinned once the handshake proved the key.
    new_host: Mutex<Option<String>>,
}

impl Pinning {
    fn judge(&self, offered: &str) -> Result<()> {
        let sec = &self.sec;
        let host = &self.host;
        if let Some(want) = &sec.fingerprint {
            return match parse_fingerprint(want) {
                Some(w) if w == offered => Ok(()),
                _ => Err(Error::new(
                    Kind::Auth,
                    format!("the server at {host} presented {offered}, not {want} (--server-fingerprint): refusing it"),
                )),
            };
        }
        match known_hosts::lookup(&sec.known_hosts, host)? {
            known_hosts::Known::Pinned(fp, _) if fp == offered => Ok(()),
            known_hosts::Known::Pinned(fp, line) => Err(known_hosts::changed(
                host,
                &fp,
                offered,
                &sec.known_hosts,
                line,
            )),
            known_hosts::Known::Unknown if sec.strict => Err(Error::new(
                Kind::Auth,
                format!(
                    "unknown server {host} ({offered}): --strict-host-keys refuses servers not in {}. Check the fingerprint with the server's admin (`ferry fingerprint` there) and add the line \"{host} {offered}\"",
                    sec.known_hosts.display()
                ),
            )),
            known_hosts::Known::Unknown => {
                *self.new_host.lock().unwrap_or_else(|p| p.into_inner()) = Some(offered.to_string());
                Ok(())
            }
        }
    }
}

impl ServerCertVerifier for Pinning {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self.judge(&fingerprint(end_entity)) {
            Ok(()) => Ok(ServerCertVerified::assertion()),
            Err(e) => {
                *self.refusal.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::ApplicationVerificationFailure,
                ))
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not offered".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
