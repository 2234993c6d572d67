//! Driver `tcp`: ferry's native TCP driver.
//!
//! One TCP connection per endpoint, served by a reader thread and a writer thread; the
//! posting thread only queues work. Payloads move between the socket and registered memory
//! with vectored I/O and no staging copy, except sends up to the inline size, which are copied
//! at post time and complete at once. RMA is emulated with request/response frames
//! ([`frame`]): the target's reader checks every access (that the key was granted to this
//! connection and remote access is enabled, then bounds and rights: [`crate::grants`]) before
//! it touches memory. Remote addresses are offsets into the region.
//!
//! Completions are in posting order per kind. When the connection ends (peer gone, reset,
//! protocol violation, endpoint dropped), every pending operation fails, and later posts are
//! accepted and fail at once with the same error, so callers handle loss in one place.
//! Dropping an endpoint aborts what is still in flight.
//!
//! Wire protocol: `docs/protocol.md`, section "Native TCP driver wire protocol".

/// Whether the writer sends a file mapping's pages ([`crate::Buffer::map_file_after`])
/// with `sendfile` (`FERRY_TCP_SENDFILE=on`) or, by default, with `sendmsg` from the
/// mapping (the kernel copies them from the page cache). On loopback the copy won: with
/// `sendfile` the server spent 10 % less CPU but the receiver 20 % more and the copy ran
/// 18 % slower (4 GiB from /dev/shm at `integrity`, 5 rounds, docs/xfer.md); across a real
/// network, where nothing on this host copies the pages afterwards, measure both.
pub fn sendfile_sends() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        matches!(
            std::env::var("FERRY_TCP_SENDFILE").as_deref(),
            Ok("on") | Ok("1")
        )
    })
}

mod conn;
pub mod frame;
#[allow(unsafe_code)] // memory: views of registered memory for readv/writev.
mod io;
mod keys;
mod rx;
mod tx;

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use std::os::fd::AsFd;

use rustix::event::{poll, PollFd, PollFlags};

use self::conn::{Conn, TcpEndpoint};
use self::frame::Frame;
use self::keys::{KeyTable, Reg};
use crate::caps::{Capabilities, Ordering, Progress};
use crate::error::{FabricError, Result};
use crate::mem::{next_domain_id, Access, Buffer, DomainId, MemoryRegion};
use crate::{Address, Domain, Endpoint, Listener, Scheme};

/// Most segments per operation. writev accepts 1024 iovecs (`UIO_MAXIOV`); at 64, one frame
/// (header and segments) uses a small share of that, so a burst of frames still leaves in one
/// writev. Longer lists are split by the layers above.
const MAX_GATHER: usize = 64;
/// Sends up to this size are copied at post time and complete immediately.
const INLINE_SIZE: usize = 4096;

fn capabilities() -> Capabilities {
    Capabilities {
        driver: "tcp".into(),
        provider: "tcp".into(),
        rma: true,
        max_gather: MAX_GATHER,
        rma_gather: MAX_GATHER,
        rma_iov_limit: 1,
        inline_size: INLINE_SIZE,
        max_msg_size: frame::MAX_LEN,
        // The reader and writer overlap pieces instead of one 16 MiB readv (measured with
        // `ferry bench exs`: docs/fabric.md, "Driver tuning").
        rma_piece: 1 << 20,
        // One TCP stream, one reader applying frames in order, answers in request order.
        ordering: Ordering {
            send_after_send: true,
            send_after_write: true,
            write_after_write: true,
            completion_in_order: true,
        },
        progress: Progress::Auto,
        virt_addr: false,
    }
}

/// Opens a client domain.
pub fn open(addr: &Address) -> Result<Arc<dyn Domain>> {
    check_scheme(addr)?;
    Ok(TcpDomain::new())
}

/// Listens on `addr` with a domain of its own.
pub fn listen(addr: &Address) -> Result<Box<dyn Listener>> {
    check_scheme(addr)?;
    let listener = std::net::TcpListener::bind(addr.host_port())
        .map_err(|e| FabricError::io(format!("bind {addr}"), e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| FabricError::io("listener O_NONBLOCK", e))?;
    let local = listener
        .local_addr()
        .map_err(|e| FabricError::io("listener address", e))?;
    Ok(Box::new(TcpListener {
        domain: TcpDomain::new(),
        listener,
        local: Address {
            scheme: Scheme::Tcp,
            host: local.ip().to_string(),
            port: Some(local.port()),
        },
        waiting: std::sync::Mutex::new(Vec::new()),
    }))
}

/// `timeout` from now, saturating instead of overflowing for huge timeouts.
fn deadline(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or(now + Duration::from_secs(100 * 365 * 86_400))
}

fn check_scheme(addr: &Address) -> Result<()> {
    match addr.scheme {
        Scheme::Tcp => Ok(()),
        _ => Err(FabricError::InvalidArgument(format!(
            "{addr} is not a tcp:// address"
        ))),
    }
}

/// A domain of the native TCP driver: its capabilities and key table.
struct TcpDomain {
    id: DomainId,
    caps: Capabilities,
    keys: Arc<KeyTable>,
    me: Weak<TcpDomain>,
}

impl TcpDomain {
    fn new() -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            id: next_domain_id(),
            caps: capabilities(),
            keys: Arc::new(KeyTable::new()),
            me: me.clone(),
        })
    }

    /// Handshakes on a connected socket and starts its reader and writer. An accepted
    /// connection serves no RMA until [`Endpoint::enable_remote_access`].
    fn endpoint(
        &self,
        stream: TcpStream,
        timeout: Duration,
        accepted: bool,
    ) -> Result<Box<dyn Endpoint>> {
        let domain = self.me.upgrade().ok_or(FabricError::Cancelled)?;
        stream
            .set_nodelay(true)
            .map_err(|e| FabricError::io("TCP_NODELAY", e))?;
        if accepted {
            // The connector's HELLO is here already ([`TcpListener::accept`] waits for it).
            handshake(&stream, deadline(timeout), timeout)?;
        } else {
            // The listener's HELLO comes a round trip later (it answers the connector's
            // once that has arrived); the reader checks it as the first frame, so what the
            // caller sends meanwhile leaves at once, right behind our HELLO.
            send_hello(&stream, timeout)?;
        }
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "unknown peer".into(), |a| format!("tcp://{a}"));
        let local = stream
            .local_addr()
            .map_or_else(|_| "unknown".into(), |a| format!("tcp://{a}"));
        let conn = Arc::new(Conn::new(stream, !accepted, peer.clone())?);
        let hello_first = !accepted;
        let mut ep = TcpEndpoint {
            domain,
            conn,
            peer,
            local,
            threads: Vec::with_capacity(2),
        };
        let run_rx: Box<dyn FnOnce(Arc<Conn>) + Send> = Box::new(move |c| rx::run(c, hello_first));
        let run_tx: Box<dyn FnOnce(Arc<Conn>) + Send> = Box::new(tx::run);
        for (name, run) in [("ferry-tcp-rx", run_rx), ("ferry-tcp-tx", run_tx)] {
            let conn = ep.conn.clone();
            // On failure `ep` drops, which stops the thread already started.
            let t = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || run(conn))
                .map_err(|e| FabricError::io("spawn connection thread", e))?;
            ep.threads.push(t);
        }
        Ok(Box::new(ep))
    }
}

impl Domain for TcpDomain {
    fn id(&self) -> DomainId {
        self.id
    }

    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn register(&self, buf: &Buffer, access: Access) -> Result<MemoryRegion> {
        let key = self.keys.insert();
        let reg = Reg {
            keys: self.keys.clone(),
            key,
        };
        Ok(MemoryRegion::new(
            buf.clone(),
            access,
            key,
            self.id,
            false,
            Box::new(reg),
        ))
    }

    fn connect(&self, addr: &Address, timeout: Duration) -> Result<Box<dyn Endpoint>> {
        check_scheme(addr)?;
        let deadline = deadline(timeout);
        let targets = addr
            .host_port()
            .to_socket_addrs()
            .map_err(|e| FabricError::io(format!("resolve {addr}"), e))?;
        let mut last = None;
        for target in targets {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(FabricError::Timeout(timeout));
            }
            match TcpStream::connect_timeout(&target, left) {
                Ok(s) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    return self.endpoint(s, left, false);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(match last {
            Some(e) if e.kind() == ErrorKind::TimedOut => FabricError::Timeout(timeout),
            Some(e) => FabricError::io(format!("connect {addr}"), e),
            None => FabricError::BadAddress {
                addr: addr.to_string(),
                why: "resolves to no address".into(),
            },
        })
    }
}

/// This side's HELLO frame (the connector's and the listener's are alike).
fn our_hello() -> frame::Header {
    Frame::Hello {
        major: frame::VERSION_MAJOR,
        minor: frame::VERSION_MINOR,
        flags: 0,
    }
    .encode()
}

/// Sends this side's HELLO (a connector: the reader checks the listener's).
fn send_hello(stream: &TcpStream, timeout: Duration) -> Result<()> {
    let mut s = stream;
    stream
        .set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
        .and_then(|()| s.write_all(our_hello().as_bytes()))
        .and_then(|()| stream.set_write_timeout(None))
        .map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => FabricError::Timeout(timeout),
            _ => FabricError::io("HELLO", e),
        })
}

/// The peer's first frame as decoded, which must be a HELLO of our major.
fn check_hello(
    first: std::result::Result<Option<(Frame, usize)>, frame::DecodeError>,
) -> Result<()> {
    match first {
        Ok(Some((f, _))) => rx::peers_hello(f).map_err(|c| c.error()),
        Ok(None) => Err(FabricError::Protocol(
            "peer did not start with HELLO".into(),
        )),
        Err(e) => Err(FabricError::Protocol(format!("bad HELLO: {e}"))),
    }
}

/// Exchanges HELLO frames on an accepted connection (whose peer's HELLO has arrived):
/// sends ours, then checks the peer's magic and major.
fn handshake(stream: &TcpStream, deadline: Instant, timeout: Duration) -> Result<()> {
    let io_err = |e: std::io::Error| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => FabricError::Timeout(timeout),
        ErrorKind::UnexpectedEof => {
            FabricError::ConnectionLost("peer closed the connection during HELLO".into())
        }
        _ => FabricError::io("HELLO", e),
    };
    let set = |t: Option<Duration>| -> Result<()> {
        stream
            .set_read_timeout(t)
            .and_then(|()| stream.set_write_timeout(t))
            .map_err(|e| FabricError::io("socket timeout", e))
    };
    let left = deadline.saturating_duration_since(Instant::now());
    set(Some(left.max(Duration::from_millis(1))))?;
    let hello = our_hello();
    let mut s = stream;
    s.write_all(hello.as_bytes()).map_err(io_err)?;
    // Read no further than a HELLO: the peer's first frames may follow it at once.
    let mut buf = [0u8; frame::MAX_HEADER_LEN];
    let hello_len = hello.as_bytes().len();
    s.read_exact(&mut buf[..frame::PREFIX_LEN])
        .map_err(io_err)?;
    let peer = match frame::decode(&buf[..frame::PREFIX_LEN]) {
        Ok(None) => {
            s.read_exact(&mut buf[frame::PREFIX_LEN..hello_len])
                .map_err(io_err)?;
            frame::decode(&buf[..hello_len])
        }
        other => other,
    };
    check_hello(peer)?;
    set(None)
}

/// How long an accepted connection may take to send its HELLO before it is dropped.
const HELLO_GRACE: Duration = Duration::from_secs(10);

/// A listening socket; accepted endpoints share its domain.
struct TcpListener {
    domain: Arc<TcpDomain>,
    listener: std::net::TcpListener,
    local: Address,
    /// Accepted connections whose HELLO has not all arrived yet, with when they came. A
    /// connection waits here across `accept` calls, so neither a caller that accepts in
    /// short slices nor a busy peer slow to send its HELLO cuts a handshake short, and a
    /// silent peer holds up no one else.
    waiting: std::sync::Mutex<Vec<(TcpStream, Instant)>>,
}

/// Where an accepted connection's HELLO stands.
enum HelloState {
    /// All of it is readable (or something else is, which the handshake will refuse).
    Arrived,
    /// Not all of it yet.
    Pending,
    /// The peer closed or the socket failed: drop it.
    Gone,
}

/// Looks (without reading) at what an accepted, non-blocking socket has received.
fn hello_state(stream: &TcpStream) -> HelloState {
    let hello_len = our_hello().as_bytes().len();
    let mut buf = [0u8; frame::MAX_HEADER_LEN];
    match stream.peek(&mut buf[..hello_len]) {
        Ok(0) => HelloState::Gone,
        Ok(n) if n >= hello_len => HelloState::Arrived,
        Ok(n) if n < frame::PREFIX_LEN => HelloState::Pending,
        Ok(n) => match frame::decode(&buf[..n]) {
            Ok(None) => HelloState::Pending,
            _ => HelloState::Arrived,
        },
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
            HelloState::Pending
        }
        Err(_) => HelloState::Gone,
    }
}

impl Listener for TcpListener {
    fn domain(&self) -> Arc<dyn Domain> {
        self.domain.clone()
    }

    fn local_addr(&self) -> Address {
        self.local.clone()
    }

    /// Waits for a connection whose HELLO has arrived and handshakes on it. An error from a
    /// failed handshake concerns that connection only; the listener keeps accepting.
    fn accept(&self, timeout: Duration) -> Result<Box<dyn Endpoint>> {
        let deadline = deadline(timeout);
        loop {
            let ready = {
                let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    match self.listener.accept() {
                        Ok((stream, _)) => {
                            if stream.set_nonblocking(true).is_ok() {
                                waiting.push((stream, Instant::now()));
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(e) => return Err(FabricError::io("accept", e)),
                    }
                }
                // The closed go, and those silent for too long.
                waiting.retain(|(stream, since)| {
                    !matches!(hello_state(stream), HelloState::Gone)
                        && since.elapsed() < HELLO_GRACE
                });
                match waiting
                    .iter()
                    .position(|(s, _)| matches!(hello_state(s), HelloState::Arrived))
                {
                    Some(i) => Ok(waiting.swap_remove(i).0),
                    None => Err(waiting
                        .iter()
                        .map(|(_, since)| {
                            (*since + HELLO_GRACE).saturating_duration_since(Instant::now())
                        })
                        .min()),
                }
            };
            let soonest_expiry = match ready {
                Ok(stream) => {
                    stream
                        .set_nonblocking(false)
                        .map_err(|e| FabricError::io("accepted socket blocking mode", e))?;
                    // The HELLO is here: the handshake does not wait on the peer.
                    return self.domain.endpoint(stream, HELLO_GRACE, true);
                }
                Err(soonest) => soonest,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(FabricError::Timeout(timeout));
            }
            // Bounded so the conversion cannot fail; the loop polls again.
            let wait = soonest_expiry
                .map_or(left, |e| left.min(e))
                .min(Duration::from_secs(3600));
            let ts = rustix::time::Timespec::try_from(wait).unwrap_or(rustix::time::Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            });
            let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            let mut fds: Vec<PollFd<'_>> = std::iter::once(self.listener.as_fd())
                .chain(waiting.iter().map(|(s, _)| s.as_fd()))
                .map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN))
                .collect();
            let polled = poll(&mut fds, Some(&ts));
            drop(fds);
            drop(waiting);
            match polled {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(FabricError::io("poll listener", e.into())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Vec<u8> {
        our_hello().as_bytes().to_vec()
    }

    fn listener() -> (Box<dyn Listener>, Address) {
        let l = listen(&"tcp://127.0.0.1:0".parse().unwrap()).unwrap();
        let a = l.local_addr();
        (l, a)
    }

    #[test]
    fn a_hello_slower_than_the_accept_slices_is_still_accepted() {
        // A server accepting in 20 ms slices, a peer whose HELLO comes 300 ms after its
        // connect (a loaded host): the handshake must not be cut to what is left of a slice.
        let (l, addr) = listener();
        let port = addr.port.unwrap();
        let peer = std::thread::spawn(move || {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            s.write_all(&hello()).unwrap();
            let mut back = vec![0u8; hello().len()];
            s.read_exact(&mut back).map(|()| back)
        });
        let start = Instant::now();
        let ep = loop {
            match l.accept(Duration::from_millis(20)) {
                Ok(ep) => break ep,
                Err(FabricError::Timeout(_)) if start.elapsed() < Duration::from_secs(5) => {}
                Err(e) => panic!("the slow peer was not accepted: {e}"),
            }
        };
        assert_eq!(peer.join().unwrap().unwrap(), hello());
        drop(ep);
    }

    #[test]
    fn a_silent_connection_holds_up_no_one() {
        let (l, addr) = listener();
        let port = addr.port.unwrap();
        let _silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let to = addr.clone();
        let client = std::thread::spawn(move || {
            open(&to)
                .and_then(|d| d.connect(&to, Duration::from_secs(5)))
                .map(|_ep| ())
        });
        let start = Instant::now();
        l.accept(Duration::from_secs(5))
            .expect("the client that spoke is accepted");
        assert!(start.elapsed() < Duration::from_secs(2));
        client.join().unwrap().unwrap();
    }
}
