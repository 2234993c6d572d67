//! The NBD runtime: listeners on TCP and Unix sockets; the floor's admission
//! ([`ferry_service::admit`]: a bounded handshake pool with a deadline, connection limits);
//! a thread per connection that runs the handshake ([`crate::nbd::handshake`]) and then
//! becomes one of the connection's workers, which take turns reading a request and each
//! serve the request they read against the export's [`Backend`], answering out of order
//! (replies written whole under one lock; a short request of an otherwise idle connection
//! is served by its reader, which keeps its turn); and the drain a SIGTERM starts. A client that
//! breaks the protocol loses its own connection; nothing it sends can stop the others.

use std::collections::HashMap;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_service::admit::{more, Admission, Handshake as Pass, Slot, Turned};
use ferry_service::audit::{Audit, Record};
use ferry_service::drain::DrainReport;
use ferry_service::error::{Error, Kind, Result};

use crate::backend::file::FileBackend;
use crate::backend::memory::MemoryBackend;
use crate::backend::{nbd_errno, Backend, Zeroing};
use crate::buf::{Buf, Pool};
use crate::config::{BlockConfig, ExportConfig, ListenAddr, Storage, TlsPolicy};
use crate::nbd::consts::{ESHUTDOWN, REQUEST_LEN};
use crate::nbd::handshake::{ExportInfo, Handshake, Negotiated, Next, BASE_ALLOCATION_ID};
use crate::nbd::reply::{self, Piece};
use crate::nbd::request::{decode_request, Command, Refusal, RequestHeader, Session};
use crate::tls::{self, TlsStream};

/// Workers serving one connection's requests (as many requests are served at once).
const WORKERS: usize = 16;
/// How often a read of the handshake looks at its deadline and whether it was called off.
const HANDSHAKE_POLL: Duration = Duration::from_millis(100);
/// Reads shorter than this go as one data chunk without looking for holes: a hole chunk
/// saves little on a short read, and finding it costs a file two `lseek`s per read.
const SPARSE_READ_MIN: u32 = 64 * 1024;
/// Reads at least this long are sent from a file export by `sendfile` (the page cache's
/// pages go to the socket with no copy through a user buffer); shorter ones are read into
/// a buffer and sent with the header in one write, which costs the same system calls and
/// keeps a small reply one segment.
const SENDFILE_MIN: u32 = 64 * 1024;
/// The environment variable that chooses when long reads of a file export go out by
/// `sendfile` ([`ZeroCopyReads`]): `off`, `on`, or `auto` (the default).
pub const ZERO_COPY_ENV: &str = "FERRY_NBD_ZERO_COPY_READS";

/// When long reads of a file export go out by `sendfile` instead of a read into a buffer.
///
/// `sendfile` halves the server's CPU per byte, but the socket then carries the page
/// cache's own pages: a client on this machine copies from those (cold in the CPU's
/// cache) instead of from socket buffers the server just wrote, which measured here
/// (loopback, fio's nbd engine, 1 MiB reads at QD 16) doubled the client's CPU per byte
/// and lowered throughput. Hence `Remote` by default: only peers beyond this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroCopyReads {
    /// Never: every read goes through a buffer.
    Off,
    /// To TCP peers not on loopback (`auto`, the default).
    Remote,
    /// On every clear connection, loopback and Unix sockets too (`on`).
    On,
}

impl ZeroCopyReads {
    /// The mode [`ZERO_COPY_ENV`] names (unset or unknown: `Remote`).
    pub fn from_env() -> ZeroCopyReads {
        Self::parse(&std::env::var(ZERO_COPY_ENV).unwrap_or_default())
    }

    /// The mode a value of [`ZERO_COPY_ENV`] names (unknown: `Remote`).
    pub fn parse(v: &str) -> ZeroCopyReads {
        match v.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "false" | "no" => ZeroCopyReads::Off,
            "on" | "1" | "true" | "yes" | "always" => ZeroCopyReads::On,
            _ => ZeroCopyReads::Remote,
        }
    }

    /// Whether a connection on `stream` sends by `sendfile` (never under TLS).
    fn applies(self, stream: &Stream) -> bool {
        match (self, stream) {
            (_, Stream::Tls(_)) | (ZeroCopyReads::Off, _) => false,
            (ZeroCopyReads::On, _) => true,
            (ZeroCopyReads::Remote, Stream::Tcp(s)) => {
                s.peer_addr().is_ok_and(|a| !a.ip().is_loopback())
            }
            (ZeroCopyReads::Remote, Stream::Unix(_)) => false,
        }
    }
}
/// Longest request an idle connection's reading worker serves itself.
const INLINE_MAX: u32 = 64 * 1024;
/// Shortest read of an in-memory export that the reading worker always serves itself.
/// Such a read only writes its reply, and replies go out one at a time: handed to other
/// workers, long replies queued on the reply lock, which a worker that had just written
/// could take again ahead of the others (1 MiB reads at QD 16: p99 about 50 ms served by
/// the workers, 5 ms by the reader, and a higher rate; docs/block.md). Shorter reads
/// still go to the workers (at QD 1 handing them over was faster).
const INLINE_MEMORY_READ_MIN: u32 = 64 * 1024;
/// The environment variable that turns on serving an idle connection's short requests on
/// the reading worker (`on`). Off by default: on a quiet host it served 4 KiB requests at
/// QD 1 slower than handing them to the next worker (docs/block.md).
pub const INLINE_IDLE_ENV: &str = "FERRY_NBD_INLINE_IDLE";
/// How often the accept loop looks at its quit flag.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// An export: what clients are told about it and the storage behind it.
pub struct Export {
    /// Name, size, flags, block sizes.
    pub info: ExportInfo,
    /// The storage.
    pub backend: Arc<dyn Backend>,
    /// Refused to a client that has not started TLS (`tls = "require"`).
    pub tls_required: bool,
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export").field("info", &self.info).finish()
    }
}

impl Export {
    /// Opens the storage an export's configuration names.
    pub fn open(c: &ExportConfig) -> Result<Export> {
        let backend: Arc<dyn Backend> = match c.storage() {
            Storage::Path(p) => {
                let f = FileBackend::open(&p, c.readonly, c.direct).map_err(|e| {
                    Error::io(
                        format_args!("block export {:?} ({})", c.name, p.display()),
                        &e,
                    )
                })?;
                Arc::new(f)
            }
            Storage::Memory(n) => Arc::new(MemoryBackend::new(n)),
        };
        Ok(Export::new(c, backend))
    }

    /// An export of `backend` with the name, description and read-only flag of `c`.
    pub fn new(c: &ExportConfig, backend: Arc<dyn Backend>) -> Export {
        let info = ExportInfo {
            name: c.name.clone(),
            description: c.description.clone(),
            size: backend.size(),
            readonly: c.readonly,
            min_block: backend.min_block(),
            preferred_block: backend.preferred_block(),
            multi_conn: backend.multi_conn(),
        };
        Export {
            info,
            backend,
            tls_required: c.tls == TlsPolicy::Require,
        }
    }
}

/// A connected client's socket, clear or under TLS.
#[derive(Debug)]
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// After `NBD_OPT_STARTTLS`: a TLS session on a TCP or Unix socket.
    Tls(Arc<TlsStream<Stream>>),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tls(t) => Stream::Tls(t.clone()),
        })
    }

    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Tls(t) => {
                t.socket().shutdown();
                Ok(())
            }
        };
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tls(s) => s.socket().set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
            Stream::Tls(s) => s.socket().set_write_timeout(t),
        }
    }

    /// The socket itself, for `sendfile`; `None` under TLS (rustls must see the bytes).
    fn socket_fd(&self) -> Option<BorrowedFd<'_>> {
        match self {
            Stream::Tcp(s) => Some(s.as_fd()),
            Stream::Unix(s) => Some(s.as_fd()),
            Stream::Tls(_) => None,
        }
    }

    fn prepare(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_nonblocking(false)?;
                // Replies are written whole; small ones must leave at once.
                s.set_nodelay(true)
            }
            Stream::Unix(s) => s.set_nonblocking(false),
            Stream::Tls(t) => t.socket().prepare(),
        }
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&*s).read(buf),
            Stream::Unix(s) => (&*s).read(buf),
            Stream::Tls(t) => t.read_plain(buf),
        }
    }
}

/// How long an idle connection's reader polls for the next request before it sleeps:
/// `FERRY_NBD_POLL_US` microseconds in `ferry serve`'s environment (default
/// [`DEFAULT_POLL_US`]; 0: never poll).
fn poll_time() -> Duration {
    static T: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        let us = std::env::var("FERRY_NBD_POLL_US").ok();
        Duration::from_micros(us.and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_POLL_US))
    })
}

/// A client with one request at a time sends its next one a few tens of microseconds
/// after our reply: polling that long saves the sleep and the wake-up (docs/block.md,
/// "Polling for the next request").
const DEFAULT_POLL_US: u64 = 50;

/// Waits up to `limit` for the socket to hold something to read, without sleeping (a
/// peek that does not wait, tried again); true once it does, false at the limit (the
/// caller then sleeps in a blocking read as before).
fn poll_readable(fd: BorrowedFd<'_>, limit: Duration) -> bool {
    let start = Instant::now();
    let mut probe = [0u8; 1];
    loop {
        let flags = rustix::net::RecvFlags::DONTWAIT | rustix::net::RecvFlags::PEEK;
        match rustix::net::recv(fd, &mut probe[..], flags) {
            // Data, or the end of the stream: the read that follows will not sleep.
            Ok(_) => return true,
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
            Err(_) => return true,
        }
        if start.elapsed() >= limit {
            return false;
        }
        std::hint::spin_loop();
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&*s).write(buf),
            Stream::Unix(s) => (&*s).write(buf),
            Stream::Tls(t) => t.send_sealed(&[IoSlice::new(buf)]),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&*s).write_vectored(bufs),
            Stream::Unix(s) => (&*s).write_vectored(bufs),
            Stream::Tls(t) => t.send_sealed(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A bound listening socket.
#[derive(Debug)]
enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    fn bind(addr: &ListenAddr) -> Result<Listener> {
        match addr {
            ListenAddr::Tcp(hp) => TcpListener::bind(hp.as_str())
                .map(Listener::Tcp)
                .map_err(|e| {
                    Error::conn(format!(
                        "cannot listen on {hp} for NBD: {e} (is another NBD server using it? set [block] listen)"
                    ))
                }),
            ListenAddr::Unix(p) => bind_unix(p),
        }
    }

    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(l, _) => l.as_fd(),
        }
    }

    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.set_nonblocking(true),
            Listener::Unix(l, _) => l.set_nonblocking(true),
        }
    }

    /// A waiting connection: its socket, the peer for the log, and the address its
    /// limits are counted under (the IP; every Unix-socket client is one, `unix`).
    fn accept(&self) -> io::Result<(Stream, String, String)> {
        match self {
            Listener::Tcp(l) => l
                .accept()
                .map(|(s, a)| (Stream::Tcp(s), a.to_string(), a.ip().to_string())),
            Listener::Unix(l, p) => l.accept().map(|(s, _)| {
                let peer = format!("unix:{}", p.display());
                (Stream::Unix(s), peer, "unix".to_string())
            }),
        }
    }

    /// Whether clients beyond this machine can reach it (a TCP address not on loopback).
    fn beyond_loopback(&self) -> bool {
        match self {
            Listener::Tcp(l) => l.local_addr().is_ok_and(|a| !a.ip().is_loopback()),
            Listener::Unix(..) => false,
        }
    }

    /// The address as an NBD URI clients can use.
    fn uri(&self) -> String {
        match self {
            Listener::Tcp(l) => match l.local_addr() {
                Ok(a) => format!("nbd://{a}"),
                Err(_) => "nbd://?".into(),
            },
            Listener::Unix(_, p) => format!("nbd+unix:///?socket={}", p.display()),
        }
    }
}

/// Binds a Unix socket at `p`, replacing a stale socket file nobody listens on (a server
/// that died) but refusing one that answers.
fn bind_unix(p: &std::path::Path) -> Result<Listener> {
    use std::os::unix::fs::FileTypeExt;
    let fail = |e: io::Error| Error::conn(format!("cannot listen on unix:{}: {e}", p.display()));
    if let Ok(m) = std::fs::symlink_metadata(p) {
        if !m.file_type().is_socket() {
            return Err(fail(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way",
            )));
        }
        if UnixStream::connect(p).is_ok() {
            return Err(fail(io::Error::new(
                io::ErrorKind::AddrInUse,
                "another server answers on it",
            )));
        }
        std::fs::remove_file(p).map_err(fail)?;
    }
    UnixListener::bind(p)
        .map(|l| Listener::Unix(l, p.to_path_buf()))
        .map_err(fail)
}

/// State every connection of a server shares: the drain and the sockets a drain closes.
#[derive(Debug, Default)]
struct Shared {
    draining: AtomicBool,
    /// Requests read and not yet answered, over all connections.
    in_flight: AtomicUsize,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Stream>>,
}

impl Shared {
    fn register(&self, s: &Stream) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(c) = s.try_clone() {
            lock(&self.conns).insert(id, c);
        }
        id
    }

    /// Forgets a connection, giving back the clone of its socket.
    fn unregister(&self, id: u64) -> Option<Stream> {
        lock(&self.conns).remove(&id)
    }
}

/// Writes every byte of `parts` (`Write::write_all_vectored` is not stable yet).
fn write_all_vectored(mut w: impl Write, mut parts: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut parts, 0);
    while !parts.is_empty() {
        match w.write_vectored(parts) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut parts, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether the worker that read `cmd` serves it itself before reading on: a long read of
/// an in-memory export ([`INLINE_MEMORY_READ_MIN`]) always; otherwise only when
/// `idle_inline` (inline serving is on, no other request of the connection is being served
/// and none is waiting in the read buffer) and the job is short (a request arriving
/// meanwhile waits for it).
fn reader_serves(
    cmd: &std::result::Result<Command, Refusal>,
    in_memory: bool,
    idle_inline: bool,
) -> bool {
    match *cmd {
        Ok(Command::Read { len, .. }) if in_memory && len >= INLINE_MEMORY_READ_MIN => true,
        _ if !idle_inline => false,
        Err(_) => true,
        Ok(Command::Read { len, .. }) => len <= INLINE_MAX,
        Ok(Command::Write { len, fua, .. }) => len <= INLINE_MAX && !fua,
        Ok(_) => false,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether [`INLINE_IDLE_ENV`] turns inline serving on (`on`, `1`, `yes`, `true`).
fn inline_idle_from_env() -> bool {
    let v = std::env::var(INLINE_IDLE_ENV).unwrap_or_default();
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "on" | "1" | "yes" | "true"
    )
}

/// The NBD service of `ferry serve`: its exports, listeners and admission.
pub struct BlockServer {
    exports: Arc<Vec<Export>>,
    listeners: Vec<Listener>,
    shared: Arc<Shared>,
    /// The floor's admission: the handshake pool and deadline, the connection limits.
    admission: Arc<Admission>,
    /// TLS, offered with `NBD_OPT_STARTTLS` when the configuration names a certificate.
    tls: Option<Arc<rustls::ServerConfig>>,
    /// Where a record of each session goes (the daemon's audit log; none: not recorded).
    audit: Option<Arc<Audit>>,
    /// When long reads of file exports go out by `sendfile`.
    zero_copy_reads: ZeroCopyReads,
    /// Whether an idle connection's short requests are served by the worker that read them.
    inline_idle: bool,
}

impl std::fmt::Debug for BlockServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockServer")
            .field("exports", &self.exports)
            .field("listeners", &self.listeners)
            .finish_non_exhaustive()
    }
}

impl BlockServer {
    /// Opens every export of `cfg` and binds its listen addresses.
    pub fn new(cfg: &BlockConfig) -> Result<BlockServer> {
        cfg.validate()?;
        let exports = cfg
            .exports
            .iter()
            .map(Export::open)
            .collect::<Result<Vec<_>>>()?;
        let mut s = Self::with_exports(&cfg.listen, exports)?;
        s.admission = Admission::new(&cfg.limits(), no_staging);
        if let (Some(cert), Some(key)) = (&cfg.tls_certificate, &cfg.tls_key) {
            s.tls = Some(tls::server_config(cert, key)?);
        }
        let clear = s.exports.iter().any(|e| !e.tls_required);
        for l in &s.listeners {
            if clear && l.beyond_loopback() {
                tracing::warn!(
                    "NBD exports without tls = \"require\" are reachable in clear on {} \
                     (beyond loopback): anyone on the network can read and write them",
                    l.uri()
                );
            }
        }
        Ok(s)
    }

    /// A server of already opened `exports` on `listen`, under the default limits.
    pub fn with_exports(listen: &[String], exports: Vec<Export>) -> Result<BlockServer> {
        if exports.is_empty() {
            return Err(Error::new(Kind::Usage, "an NBD server needs an export"));
        }
        let listeners = listen
            .iter()
            .map(|a| ListenAddr::parse(a).and_then(|a| Listener::bind(&a)))
            .collect::<Result<Vec<_>>>()?;
        Ok(BlockServer {
            exports: Arc::new(exports),
            listeners,
            shared: Arc::default(),
            admission: Admission::new(&BlockConfig::default().limits(), no_staging),
            tls: None,
            audit: None,
            zero_copy_reads: ZeroCopyReads::from_env(),
            inline_idle: inline_idle_from_env(),
        })
    }

    /// Whether the worker that reads a short request of an otherwise idle connection
    /// serves it itself, keeping the socket (off unless [`INLINE_IDLE_ENV`] said `on`).
    pub fn set_inline_idle(&mut self, on: bool) {
        self.inline_idle = on;
    }

    /// When long reads of file exports are sent by `sendfile` (by default what
    /// [`ZERO_COPY_ENV`] said when the server was made).
    pub fn set_zero_copy_reads(&mut self, mode: ZeroCopyReads) {
        self.zero_copy_reads = mode;
    }

    /// Records each session (export, bytes read and written, duration, how it ended) in
    /// `audit`, the audit log the daemon's other faces write to.
    pub fn set_audit(&mut self, audit: Arc<Audit>) {
        self.audit = Some(audit);
    }

    /// The exports served.
    pub fn exports(&self) -> &[Export] {
        &self.exports
    }

    /// Where clients connect, as NBD URIs (`nbd://127.0.0.1:10809`,
    /// `nbd+unix:///?socket=/run/nbd.sock`); append `/NAME` (TCP) or `NAME` before `?`
    /// (Unix) to choose an export.
    pub fn local_addrs(&self) -> Vec<String> {
        self.listeners.iter().map(Listener::uri).collect()
    }

    /// Accepts connections on every listener until `quit` is set (looked at a few times a
    /// second), each served on a thread of its own; returns leaving them running (see
    /// [`BlockServer::drain`]).
    pub fn serve_until(&self, quit: &AtomicBool) {
        for l in &self.listeners {
            if let Err(e) = l.set_nonblocking() {
                tracing::warn!("NBD listener {}: {e}", l.uri());
            }
        }
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: POLL_INTERVAL.as_nanos() as _,
        };
        while !quit.load(Ordering::SeqCst) {
            let mut fds: Vec<rustix::event::PollFd<'_>> = self
                .listeners
                .iter()
                .map(|l| {
                    rustix::event::PollFd::from_borrowed_fd(l.as_fd(), rustix::event::PollFlags::IN)
                })
                .collect();
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("NBD accept loop: poll: {e}");
                    std::thread::sleep(POLL_INTERVAL);
                    continue;
                }
            }
            for l in &self.listeners {
                self.accept_ready(l);
            }
        }
    }

    /// Accepts every connection waiting on `l`.
    fn accept_ready(&self, l: &Listener) {
        loop {
            match l.accept() {
                Ok((stream, peer, key)) => self.admit(stream, peer, &key),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors or memory: give it a moment rather than spin.
                    tracing::warn!("NBD accept on {}: {e}", l.uri());
                    std::thread::sleep(Duration::from_millis(50));
                    return;
                }
            }
        }
    }

    /// Lets a new connection into the handshake pool (calling off an older handshake if
    /// the pool is full) and starts its thread, or closes it.
    fn admit(&self, stream: Stream, peer: String, key: &str) {
        let pass = match self.admission.arrive(key) {
            Ok(pass) => pass,
            Err(Turned(why)) => {
                if let Some(held) = self.admission.log_refused.pass() {
                    tracing::warn!("NBD: closed a connection from {peer}: {why}{}", more(held));
                }
                stream.shutdown();
                return;
            }
        };
        let on = Serving {
            exports: self.exports.clone(),
            shared: self.shared.clone(),
            tls: self.tls.clone(),
            audit: self.audit.clone(),
            zero_copy_reads: self.zero_copy_reads,
            inline_idle: self.inline_idle,
        };
        let spawned = std::thread::Builder::new()
            .name("ferry-nbd-conn".into())
            .spawn(move || connection(stream, pass, &on, &peer));
        if let Err(e) = spawned {
            tracing::warn!("cannot start an NBD connection thread: {e}");
        }
    }

    /// First step of a drain: requests read from now on are answered `ESHUTDOWN` (a
    /// client then disconnects).
    pub fn begin_drain(&self) {
        self.shared.draining.store(true, Ordering::SeqCst);
    }

    /// Waits up to `grace` for the requests in flight to be answered, then closes every
    /// connection.
    pub fn drain(&self, grace: Duration) -> DrainReport {
        self.begin_drain();
        let at_start = self.shared.in_flight.load(Ordering::SeqCst);
        let deadline = Instant::now() + grace;
        while self.shared.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let left = self.shared.in_flight.load(Ordering::SeqCst);
        for s in lock(&self.shared.conns).values() {
            s.shutdown();
        }
        // The daemon may never drop its faces (its signal thread holds them): the socket
        // files go now.
        self.remove_socket_files();
        DrainReport {
            in_flight: at_start,
            interrupted: left,
            abandoned: 0,
        }
    }
}

impl BlockServer {
    /// Removes the files of the Unix sockets listened on.
    fn remove_socket_files(&self) {
        for l in &self.listeners {
            if let Listener::Unix(_, p) = l {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

impl Drop for BlockServer {
    fn drop(&mut self) {
        self.remove_socket_files();
    }
}

/// What a connection thread serves: the server's exports, shared state and TLS.
struct Serving {
    exports: Arc<Vec<Export>>,
    shared: Arc<Shared>,
    tls: Option<Arc<rustls::ServerConfig>>,
    audit: Option<Arc<Audit>>,
    zero_copy_reads: ZeroCopyReads,
    inline_idle: bool,
}

/// What the audit says of one session: its export, when it began, the bytes it read and
/// wrote.
struct Audited<'a> {
    export: &'a str,
    time: std::time::SystemTime,
    began: Instant,
    read: u64,
    written: u64,
}

impl Serving {
    /// Records a session that ended with `end` (NBD has no credential: `anonymous`, or
    /// `tls client` over TLS).
    fn audit(&self, peer: &str, tls: bool, s: &Audited, end: &End) {
        let Some(audit) = &self.audit else {
            return;
        };
        audit.write(
            &Record {
                time: s.time,
                peer: peer.to_string(),
                credential: if tls { "tls client" } else { "anonymous" }.into(),
                face: "block",
                op: "session",
                path: s.export.to_string(),
                bytes: s.read + s.written,
                duration: s.began.elapsed(),
                error: end.as_ref().err().cloned(),
                read_written: Some((s.read, s.written)),
                unread: 0,
            },
            false,
        );
    }
}

/// One connection, on its own thread: handshake, then transmission.
fn connection(stream: Stream, pass: Pass, on: &Serving, peer: &str) {
    let id = on.shared.register(&stream);
    let end = serve_connection(stream, pass, on, peer);
    // The server's clone of the socket: shut down, so the client sees the end whatever
    // the connection thread still holds.
    if let Some(s) = on.shared.unregister(id) {
        s.shutdown();
    }
    match end {
        Ok(why) => tracing::debug!("NBD client {peer}: {why}"),
        Err(e) => tracing::info!("NBD client {peer} disconnected: {e}"),
    }
}

/// The connection's life; `Ok` says how it ended well, `Err` what went wrong.
fn serve_connection(stream: Stream, pass: Pass, on: &Serving, peer: &str) -> End {
    stream.prepare().map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(pass.left()))
        .map_err(|e| e.to_string())?;
    let Some((stream, n, _slot)) = handshake(stream, pass, on)? else {
        return Ok("left during the handshake");
    };
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    stream.set_write_timeout(None).map_err(|e| e.to_string())?;
    let export = (on.exports)
        .get(n.export)
        .ok_or("handshake chose an export that does not exist")?;
    // `_slot` holds the connection's place among max_connections until it ends.
    let (time, began) = (std::time::SystemTime::now(), Instant::now());
    let (end, read, written) = transmission(&stream, export, &n, on);
    stream.shutdown();
    let session = Audited {
        export: &export.info.name,
        time,
        began,
        read,
        written,
    };
    on.audit(peer, matches!(stream, Stream::Tls(_)), &session, &end);
    end
}

/// Runs the handshake machine over the socket within the pass's deadline (TLS started on
/// it when the client asks and the server has a certificate), then takes a connection
/// slot; the stream to go on with, or `None` when it ended without an export.
fn handshake(
    mut stream: Stream,
    pass: Pass,
    on: &Serving,
) -> std::result::Result<Option<(Stream, Negotiated, Slot)>, String> {
    let io = |e: io::Error| format!("during the handshake: {e}");
    let mut hs = Handshake::new(on.exports.iter().map(|e| e.info.clone()).collect());
    if on.tls.is_some() {
        hs = hs.offer_tls(on.exports.iter().map(|e| e.tls_required).collect());
    }
    (&stream).write_all(&hs.greeting()).map_err(io)?;
    loop {
        let mut input = vec![0u8; hs.wants()];
        read_before_deadline(&stream, &mut input, &pass).map_err(io)?;
        let step = hs.feed(&input);
        let n = match step.next {
            Next::Continue => {
                (&stream).write_all(&step.send).map_err(io)?;
                continue;
            }
            Next::StartTls => {
                (&stream).write_all(&step.send).map_err(io)?;
                stream = start_tls(stream, on.tls.clone(), &pass).map_err(io)?;
                continue;
            }
            Next::Close(why) => {
                (&stream).write_all(&step.send).map_err(io)?;
                tracing::debug!("NBD handshake closed: {why}");
                return Ok(None);
            }
            Next::Transmit(n) => n,
        };
        // The last answer goes only to a client that gets a place.
        return match pass.admit(1, 0) {
            Ok(slot) => {
                (&stream).write_all(&step.send).map_err(io)?;
                Ok(Some((stream, n, slot)))
            }
            Err(refused) => {
                let _ = (&stream).write_all(&n.refusal(&refused.message));
                Err(format!("refused: {}", refused.message))
            }
        };
    }
}

/// The TLS handshake on a clear socket, within what is left of the handshake's time.
fn start_tls(
    stream: Stream,
    cfg: Option<Arc<rustls::ServerConfig>>,
    pass: &Pass,
) -> io::Result<Stream> {
    let cfg = cfg.ok_or_else(|| io::Error::other("STARTTLS accepted with no certificate"))?;
    let left = pass.left().max(Duration::from_millis(1));
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))?;
    let t = TlsStream::accept(stream, cfg)
        .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake: {e}")))?;
    Ok(Stream::Tls(Arc::new(t)))
}

/// Fills `buf` from the socket before the handshake's deadline, giving up when a newer
/// connection took this one's place in the handshake pool.
fn read_before_deadline(stream: &Stream, buf: &mut [u8], pass: &Pass) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        if pass.cancelled() {
            let why = "called off: the handshake pool is full (max_handshakes)";
            return Err(io::Error::other(why));
        }
        let left = pass.left();
        if left.is_zero() {
            let why = "the client took longer than handshake_timeout";
            return Err(io::Error::new(io::ErrorKind::TimedOut, why));
        }
        stream.set_read_timeout(Some(left.min(HANDSHAKE_POLL)))?;
        let mut r = stream;
        match r.read(&mut buf[filled..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A connection's staging memory, for the floor's memory budget: none worth counting (an
/// NBD connection holds the buffers of its requests in flight, no rings).
fn no_staging(_ring: usize, _block: u32) -> u64 {
    0
}

/// A request read and checked, for the worker that read it.
struct Job {
    header: RequestHeader,
    cmd: std::result::Result<Command, Refusal>,
    payload: Option<Buf>,
}

/// How a connection ended: `Ok` says how it ended well, `Err` what went wrong.
type End = std::result::Result<&'static str, String>;

/// The socket's receiving side, read by one worker at a time.
struct Reader<'a> {
    /// Buffered, so requests that arrive together are taken with one system call (a
    /// write's data longer than the buffer is read straight into its own buffer).
    r: BufReader<&'a Stream>,
    /// Set by the worker that saw the connection end; the others then stop.
    end: Option<End>,
    /// How long the connection has lately stayed idle before its next request (a moving
    /// average): polling pays only while that is shorter than the poll.
    gap: Duration,
}

impl Reader<'_> {
    /// Takes one idle wait's length into [`Reader::gap`] (weight 1/8; a long pause counts
    /// as a few polls' length, so the average comes back soon after it).
    fn note_gap(&mut self, waited: Duration, limit: Duration) {
        let sample = waited.min(4 * limit);
        self.gap = (self.gap * 7 + sample) / 8;
    }
}

/// The transmission phase of one connection.
struct Conn<'a> {
    stream: &'a Stream,
    /// Held by the worker whose turn it is to read the next request.
    reader: Mutex<Reader<'a>>,
    /// Held while one reply is written, so replies never interleave.
    write_lock: Mutex<()>,
    backend: &'a dyn Backend,
    session: Session,
    pool: Pool,
    shared: &'a Shared,
    /// Long reads of a file go out by `sendfile` ([`Conn::send_from_file`]).
    zero_copy_reads: bool,
    /// Short requests of an otherwise idle connection are served by the reading worker.
    inline_idle: bool,
    /// Requests being served by workers that let the reader go.
    busy: AtomicUsize,
    /// Bytes read by the client's reads, for the audit.
    read: AtomicU64,
    /// Bytes written by its writes, for the audit.
    written: AtomicU64,
}

/// Bytes of requests read ahead (a few hundred request headers).
const READ_AHEAD: usize = 16 * 1024;

fn transmission(stream: &Stream, export: &Export, n: &Negotiated, on: &Serving) -> (End, u64, u64) {
    let conn = Conn {
        stream,
        reader: Mutex::new(Reader {
            r: BufReader::with_capacity(READ_AHEAD, stream),
            end: None,
            gap: Duration::ZERO,
        }),
        write_lock: Mutex::new(()),
        backend: export.backend.as_ref(),
        session: Session {
            size: export.info.size,
            readonly: export.info.readonly,
            min_block: export.info.min_block,
            structured: n.structured,
            base_allocation: n.base_allocation,
        },
        pool: Pool::default(),
        shared: &on.shared,
        zero_copy_reads: on.zero_copy_reads.applies(stream),
        inline_idle: on.inline_idle,
        busy: AtomicUsize::new(0),
        read: AtomicU64::new(0),
        written: AtomicU64::new(0),
    };
    std::thread::scope(|s| {
        // The first worker is this thread; the others are started beside it.
        for _ in 1..WORKERS {
            let spawned = std::thread::Builder::new()
                .name("ferry-nbd-work".into())
                .spawn_scoped(s, || conn.work());
            if let Err(e) = spawned {
                // Fewer workers serve the connection all the same.
                tracing::warn!("cannot start an NBD worker: {e}");
                break;
            }
        }
        conn.work();
    });
    let end = lock(&conn.reader).end.take();
    (
        end.unwrap_or(Ok("closed the connection")),
        conn.read.into_inner(),
        conn.written.into_inner(),
    )
}

impl Conn<'_> {
    /// A worker, in turn with the others: takes the reader, reads one request, lets the
    /// reader go, serves the request and writes its reply; until the connection ends. A
    /// request is thus served by the thread that read it, with no hand-over between
    /// threads, and while it is served the next worker reads the next request.
    fn work(&self) {
        loop {
            let mut rd = lock(&self.reader);
            let job = loop {
                if rd.end.is_some() {
                    return;
                }
                let job = match self.next_request(&mut rd) {
                    Ok(job) => job,
                    Err(end) => {
                        rd.end = Some(end);
                        return;
                    }
                };
                if !self.serve_inline(&job, &rd) {
                    break job;
                }
                // A long read from memory only writes its reply; for anything else, nothing
                // else is in flight and nothing more read: letting the reader go would only
                // wake another worker to wait on the socket in this one's place.
                self.serve(job);
                self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            };
            // Counted busy before the reader goes, so the next reader never serves
            // inline beside it.
            self.busy.fetch_add(1, Ordering::SeqCst);
            drop(rd);
            self.serve(job);
            self.busy.fetch_sub(1, Ordering::SeqCst);
            self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Whether the worker holding the reader serves `job` itself before reading on
    /// ([`reader_serves`]).
    fn serve_inline(&self, job: &Job, rd: &Reader<'_>) -> bool {
        let idle = rd.r.buffer().is_empty() && self.busy.load(Ordering::SeqCst) == 0;
        reader_serves(&job.cmd, self.backend.in_memory(), self.inline_idle && idle)
    }

    /// Reads and checks the next request (counted in flight); `Err` when the client
    /// disconnects or breaks the protocol.
    fn next_request(&self, rd: &mut Reader<'_>) -> std::result::Result<Job, End> {
        let idle_since = self.wait_idle(rd);
        let r = &mut rd.r;
        let mut hb = [0u8; REQUEST_LEN];
        match r.read_exact(&mut hb) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(Ok("closed the connection"))
            }
            Err(e) => return Err(Err(e.to_string())),
        }
        if let Some(since) = idle_since {
            rd.note_gap(since.elapsed(), poll_time());
        }
        let r = &mut rd.r;
        let header = decode_request(&hb).map_err(|e| Err(e.to_string()))?;
        let plen = self
            .session
            .payload_len(&header)
            .map_err(|e| Err(e.to_string()))? as usize;
        let payload = if plen > 0 {
            let mut b = self.pool.get(plen);
            if let Err(e) = r.read_exact(b.data_mut(plen)) {
                self.pool.put(b);
                return Err(Err(format!("reading a write's data: {e}")));
            }
            Some(b)
        } else {
            None
        };
        let cmd = if self.shared.draining.load(Ordering::SeqCst) {
            Err(Refusal {
                errno: ESHUTDOWN,
                why: "the server is shutting down",
            })
        } else {
            self.session.check(&header)
        };
        if cmd == Ok(Command::Disconnect) {
            return Err(Ok("disconnected"));
        }
        self.shared.in_flight.fetch_add(1, Ordering::SeqCst);
        Ok(Job {
            header,
            cmd,
            payload,
        })
    }

    /// When nothing of the connection is being served and no request is buffered, the
    /// connection is idle: returns when that wait began, after polling the socket briefly
    /// for the next request ([`poll_time`]) if its recent idle gaps were short enough for
    /// a poll to catch it. A client that pauses longer (a file system above FUSE thinking
    /// between requests) would only lose the poll's CPU. Not while another worker serves,
    /// whose core the poll would take.
    fn wait_idle(&self, rd: &Reader<'_>) -> Option<Instant> {
        if !rd.r.buffer().is_empty() || self.busy.load(Ordering::SeqCst) != 0 {
            return None;
        }
        let since = Instant::now();
        let limit = poll_time();
        if !limit.is_zero() && rd.gap < limit {
            if let Some(fd) = self.stream.socket_fd() {
                poll_readable(fd, limit);
            }
        }
        Some(since)
    }

    fn serve(&self, job: Job) {
        let cookie = job.header.cookie;
        let sent = match job.cmd {
            Err(r) => self.send(&reply::error(
                self.session.structured,
                cookie,
                r.errno,
                r.why,
            )),
            Ok(cmd) => self.run(cmd, cookie, job.payload.as_ref()),
        };
        if let Some(b) = job.payload {
            self.pool.put(b);
        }
        if let Err(e) = sent {
            // The socket is broken: end the connection (the reader sees it close).
            tracing::debug!("NBD reply not sent: {e}");
            self.stream.shutdown();
        }
    }

    /// Writes one whole reply.
    fn send(&self, bytes: &[u8]) -> io::Result<()> {
        let _one = lock(&self.write_lock);
        let mut w = self.stream;
        w.write_all(bytes)
    }

    /// The reply to a command without data: success, or its error.
    fn send_result(&self, cookie: u64, r: io::Result<()>) -> io::Result<()> {
        match r {
            Ok(()) => self.send(&reply::simple(cookie, 0)),
            Err(e) => self.send(&reply::error(
                self.session.structured,
                cookie,
                nbd_errno(&e),
                &e.to_string(),
            )),
        }
    }

    fn run(&self, cmd: Command, cookie: u64, payload: Option<&Buf>) -> io::Result<()> {
        let b = self.backend;
        match cmd {
            Command::Read { offset, len, df } if self.session.structured => {
                self.read.fetch_add(u64::from(len), Ordering::Relaxed);
                self.read_structured(cookie, offset, len, df)
            }
            Command::Read { offset, len, .. } => {
                self.read.fetch_add(u64::from(len), Ordering::Relaxed);
                self.read_simple(cookie, offset, len)
            }
            Command::Write { offset, len, fua } => {
                let data = payload.map_or(&[][..], |p| p.data(len as usize));
                let r = b.write_at(data, offset, fua);
                if r.is_ok() {
                    self.written.fetch_add(u64::from(len), Ordering::Relaxed);
                }
                self.send_result(cookie, r)
            }
            Command::Flush => self.send_result(cookie, b.flush()),
            Command::Trim { offset, len, fua } => {
                self.send_result(cookie, b.trim(offset, u64::from(len), fua))
            }
            Command::Cache { offset, len } => {
                self.send_result(cookie, b.cache(offset, u64::from(len)))
            }
            Command::WriteZeroes {
                offset,
                len,
                fua,
                may_trim,
                fast,
            } => {
                let how = Zeroing {
                    may_trim,
                    fast,
                    fua,
                };
                self.send_result(cookie, b.write_zeroes(offset, u64::from(len), how))
            }
            Command::BlockStatus {
                offset,
                len,
                req_one,
            } => self.block_status(cookie, offset, len, req_one),
            Command::Disconnect => Ok(()),
        }
    }

    /// Writes one whole reply gathered from `parts` (headers and data in place: one
    /// vectored write, no copy into a reply buffer).
    fn send_vectored(&self, parts: &mut [IoSlice<'_>]) -> io::Result<()> {
        let _one = lock(&self.write_lock);
        write_all_vectored(self.stream, parts)
    }

    fn read_simple(&self, cookie: u64, offset: u64, len: u32) -> io::Result<()> {
        let len = len as usize;
        let ok = reply::simple(cookie, 0);
        if let Some(shared) = self.backend.read_shared(offset, len) {
            let mut parts = vec![IoSlice::new(&ok)];
            parts.extend(shared.slices(0, len));
            return self.send_vectored(&mut parts);
        }
        if let Some(sent) = self.send_from_file(cookie, offset, len as u32, None) {
            return sent;
        }
        let mut buf = self.pool.get(len);
        let sent = match self.backend.read_at(buf.data_mut(len), offset) {
            Ok(()) => self.send(buf.framed(&ok, len)),
            Err(e) => self.send(&reply::simple(cookie, nbd_errno(&e))),
        };
        self.pool.put(buf);
        sent
    }

    /// A structured read: zero runs as holes (in reads of at least [`SPARSE_READ_MIN`]),
    /// the rest as data, every byte read before anything is sent (so an error is one error
    /// chunk, never a broken data chunk). Memory the backend shares is sent from where it
    /// lies, and tells the holes itself.
    fn read_structured(&self, cookie: u64, offset: u64, len: u32, df: bool) -> io::Result<()> {
        if len == 0 {
            return self.send(&reply::done(cookie));
        }
        let sparse = !df && len >= SPARSE_READ_MIN;
        if let Some(shared) = self.backend.read_shared(offset, len as usize) {
            let extents = if sparse { shared.extents() } else { Vec::new() };
            let pieces = reply::plan_read(offset, len, &extents, df);
            return self.send_pieces(cookie, offset, &pieces, |at, n| shared.slices(at, n));
        }
        let extents = if sparse {
            // Unknown allocation is read as data.
            self.backend
                .extents(offset, u64::from(len))
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let pieces = reply::plan_read(offset, len, &extents, df);
        if let Some(sent) = self.send_from_file(cookie, offset, len, Some(&pieces)) {
            return sent;
        }
        let mut buf = self.pool.get(len as usize);
        for p in pieces.iter().filter(|p| !p.hole) {
            let at = (p.offset - offset) as usize;
            let into = &mut buf.data_mut(len as usize)[at..at + p.len as usize];
            if let Err(e) = self.backend.read_at(into, p.offset) {
                self.pool.put(buf);
                let msg = format!("read failed: {e}");
                return self.send(&reply::error_chunk(cookie, nbd_errno(&e), &msg));
            }
        }
        let data = buf.data(len as usize);
        let sent = self.send_pieces(cookie, offset, &pieces, |at, n| {
            vec![IoSlice::new(&data[at..at + n])]
        });
        self.pool.put(buf);
        sent
    }

    /// The chunks of a structured read in one vectored write: a hole chunk for each hole
    /// piece, a data chunk with `data(at, len)` (bytes from `at` in the request) for the
    /// others, the last flagged done.
    fn send_pieces<'d>(
        &self,
        cookie: u64,
        offset: u64,
        pieces: &[Piece],
        data: impl Fn(usize, usize) -> Vec<IoSlice<'d>>,
    ) -> io::Result<()> {
        let last = pieces.len().saturating_sub(1);
        let heads: Vec<Vec<u8>> = (pieces.iter().enumerate())
            .map(|(i, p)| match p.hole {
                true => reply::offset_hole(cookie, p.offset, p.len, i == last).to_vec(),
                false => reply::offset_data(cookie, p.offset, p.len, i == last).to_vec(),
            })
            .collect();
        let mut parts = Vec::with_capacity(pieces.len() * 2);
        for (p, h) in pieces.iter().zip(&heads) {
            parts.push(IoSlice::new(h));
            if !p.hole {
                parts.extend(data((p.offset - offset) as usize, p.len as usize));
            }
        }
        self.send_vectored(&mut parts)
    }

    /// A read's reply with its data sent from the backend's file by `sendfile`: one simple
    /// reply (`pieces` `None`) or the chunks of `pieces`, each header sent with `MSG_MORE`
    /// so it leaves in a segment with its data. `None` when the knob, the length, the
    /// socket (TLS: rustls needs the bytes) or the backend (no file, `O_DIRECT`) rule it
    /// out: the caller reads into a buffer.
    ///
    /// The length is decided, and checked against the file's end, before the header goes
    /// out; a file truncated between that check and `sendfile` leaves a reply shorter
    /// than its header says, which cannot be mended on the wire: the error closes the
    /// connection (the client sees its requests fail, never wrong bytes).
    fn send_from_file(
        &self,
        cookie: u64,
        offset: u64,
        len: u32,
        pieces: Option<&[Piece]>,
    ) -> Option<io::Result<()>> {
        if !self.zero_copy_reads || len < SENDFILE_MIN {
            return None;
        }
        let sock = self.stream.socket_fd()?;
        let file = match self.backend.send_source(offset, u64::from(len))? {
            Ok(f) => f,
            Err(e) => {
                let msg = format!("read failed: {e}");
                let structured = self.session.structured;
                return Some(self.send(&reply::error(structured, cookie, nbd_errno(&e), &msg)));
            }
        };
        let _one = lock(&self.write_lock);
        Some(match pieces {
            None => send_all(sock, &reply::simple(cookie, 0), true)
                .and_then(|()| sendfile_all(sock, file, offset, len as usize)),
            Some(pieces) => send_pieces_from_file(sock, file, cookie, pieces),
        })
    }

    fn block_status(&self, cookie: u64, offset: u64, len: u32, req_one: bool) -> io::Result<()> {
        let id = self.session.base_allocation.unwrap_or(BASE_ALLOCATION_ID);
        match self.backend.extents(offset, u64::from(len)) {
            Ok(ext) => {
                let d = reply::status_descriptors(len, &ext, req_one);
                self.send(&reply::block_status(cookie, id, &d))
            }
            Err(e) => {
                let msg = format!("block status failed: {e}");
                self.send(&reply::error_chunk(cookie, nbd_errno(&e), &msg))
            }
        }
    }
}

/// The chunks of a structured read (see [`Conn::send_from_file`]): a hole chunk for each
/// hole piece, a data chunk whose data `sendfile` takes from `file` for the others.
fn send_pieces_from_file(
    sock: BorrowedFd<'_>,
    file: BorrowedFd<'_>,
    cookie: u64,
    pieces: &[Piece],
) -> io::Result<()> {
    let last = pieces.len().saturating_sub(1);
    for (i, p) in pieces.iter().enumerate() {
        if p.hole {
            let h = reply::offset_hole(cookie, p.offset, p.len, i == last);
            send_all(sock, &h, i != last)?;
        } else {
            let h = reply::offset_data(cookie, p.offset, p.len, i == last);
            send_all(sock, &h, true)?;
            sendfile_all(sock, file, p.offset, p.len as usize)?;
        }
    }
    Ok(())
}

/// Sends all of `bytes`; with `more`, flagged `MSG_MORE` (data follows: the kernel holds
/// a partial segment for it).
fn send_all(sock: BorrowedFd<'_>, mut bytes: &[u8], more: bool) -> io::Result<()> {
    use rustix::net::SendFlags;
    let flags = match more {
        true => SendFlags::MORE | SendFlags::NOSIGNAL,
        false => SendFlags::NOSIGNAL,
    };
    while !bytes.is_empty() {
        match rustix::net::send(sock, bytes, flags) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Sends `len` bytes of `file` from `offset` by `sendfile`. A file that ends first
/// (truncated since its end was checked) is an error: the header already promised the
/// bytes, so the caller closes the connection.
fn sendfile_all(
    sock: BorrowedFd<'_>,
    file: BorrowedFd<'_>,
    mut offset: u64,
    mut len: usize,
) -> io::Result<()> {
    while len > 0 {
        match rustix::fs::sendfile(sock, file, Some(&mut offset), len) {
            Ok(0) => {
                let why = "the file ended under a reply already begun (truncated under the \
                           export): the connection is closed";
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, why));
            }
            Ok(n) => len -= n.min(len),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The block service as a face of `ferry serve`'s daemon: it accepts on sockets of its own.
impl ferry_service::daemon::Endpoint for BlockServer {
    fn local_addrs(&self) -> Vec<String> {
        BlockServer::local_addrs(self)
    }

    fn serve_until(&self, quit: &AtomicBool) {
        BlockServer::serve_until(self, quit)
    }

    fn begin_drain(&self) {
        BlockServer::begin_drain(self)
    }

    fn drain(&self, grace: Duration) -> DrainReport {
        BlockServer::drain(self, grace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The poll for the next request ends as soon as bytes (or the end of the stream) are
    /// there, and at its limit on a quiet socket, consuming nothing.
    #[test]
    fn polling_sees_data_and_the_end_and_gives_up_on_silence() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let long = Duration::from_secs(5);
        let t = Instant::now();
        assert!(!poll_readable(b.as_fd(), Duration::from_millis(20)));
        assert!(t.elapsed() >= Duration::from_millis(20));
        a.write_all(b"x").unwrap();
        let t = Instant::now();
        assert!(poll_readable(b.as_fd(), long));
        assert!(t.elapsed() < long);
        let mut got = [0u8; 1];
        (&b).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"x", "the poll left the byte to read");
        drop(a);
        assert!(poll_readable(b.as_fd(), long), "the end of the stream");
    }

    /// Long reads of an in-memory export are served by the reader whatever else the
    /// connection does; anything else only by an idle connection's reader, when short.
    #[test]
    fn the_reader_serves_long_memory_reads_and_idle_short_requests() {
        let read = |len| {
            Ok(Command::Read {
                offset: 0,
                len,
                df: false,
            })
        };
        let write = |len, fua| {
            Ok(Command::Write {
                offset: 0,
                len,
                fua,
            })
        };
        let long = INLINE_MEMORY_READ_MIN;
        assert!(reader_serves(&read(long), true, false));
        assert!(reader_serves(&read(1 << 20), true, false));
        assert!(!reader_serves(&read(long - 1), true, false));
        assert!(!reader_serves(&read(long), false, false));
        assert!(!reader_serves(&write(1 << 20, false), true, false));
        // An idle connection's short requests, when inline serving is on.
        assert!(reader_serves(&read(INLINE_MAX), false, true));
        assert!(!reader_serves(&read(INLINE_MAX + 1), false, true));
        assert!(reader_serves(&write(4096, false), false, true));
        assert!(!reader_serves(&write(4096, true), false, true));
        assert!(!reader_serves(&Ok(Command::Flush), false, true));
        let refused = Refusal {
            errno: ESHUTDOWN,
            why: "the server is shutting down",
        };
        assert!(reader_serves(&Err(refused), false, true));
        assert!(!reader_serves(&Err(refused), false, false));
    }

    /// A file shorter than the reply promised: `sendfile_all` fails (the caller then
    /// closes the connection) after sending exactly what the file held, never more.
    #[test]
    fn sendfile_of_a_file_cut_short_is_an_error() {
        let p = std::env::temp_dir().join(format!("ferry-block-sendfile-{}", std::process::id()));
        std::fs::write(&p, vec![5u8; 1000]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        let (a, mut b) = UnixStream::pair().unwrap();
        let e = sendfile_all(a.as_fd(), f.as_fd(), 0, 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        drop(a);
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        assert_eq!(got, vec![5u8; 1000]);
        // A whole range goes out whole, from its offset.
        let (a, mut b) = UnixStream::pair().unwrap();
        sendfile_all(a.as_fd(), f.as_fd(), 10, 990).unwrap();
        send_all(a.as_fd(), b"end", false).unwrap();
        drop(a);
        got.clear();
        b.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 993);
        assert_eq!(&got[990..], b"end");
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn the_knob_reads_off_on_and_auto() {
        let parse = ZeroCopyReads::parse;
        assert_eq!(parse(" OFF"), ZeroCopyReads::Off);
        assert_eq!(parse("0"), ZeroCopyReads::Off);
        assert_eq!(parse("on"), ZeroCopyReads::On);
        assert_eq!(parse("auto"), ZeroCopyReads::Remote);
        assert_eq!(parse(""), ZeroCopyReads::Remote);
    }
}
