//! The EXS message channel: one connection over EXS carrying a face's frames as messages.
//!
//! Every EXS message is one frame (the face encodes and decodes them; the channel moves
//! bytes). The receiving side keeps a ring of receive buffers of one size posted
//! (registered memory); a small message fits the immediate size and is copied out of the
//! advert, a large one (a block) is pulled by RMA straight into a posted buffer. Received
//! messages are delivered in posting order.
//!
//! A channel may be sealed ([`Channel::seal`], protocol 1.7): its control frames then travel
//! as TLS records ([`crate::secure`]), and only the data frames its face names may arrive in
//! clear; any other clear message breaks the connection.
//!
//! Every buffer keeps [`FRAME_HEAD`] bytes for a block frame's header right before a payload
//! that starts [`DIRECT_ALIGN`] into its page-aligned allocation, so direct I/O reads into
//! and writes from it in place.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_exs::proto::Config;
use ferry_exs::proto::{EventKind, Flags};
use ferry_exs::runtime::{default_config, EventQueue, ExsBuf, ExsSocket};
use ferry_exs::ExsError;
use ferry_fabric::{timeline, Access};

use crate::admit::{Handshake, Stage};
use crate::direct::DIRECT_ALIGN;
use crate::error::{Error, Kind, Result};
use crate::secure::{self, ClientSecurity, Level, Protection, Secure};
use crate::select::{self as floor, Floor};

/// How often a wait for a face's first frame looks whether its handshake was called off.
const HANDSHAKE_POLL: Duration = Duration::from_millis(10);

/// The bytes of a face's block-frame header, which sit right before the block's payload in
/// every staging block and receive buffer (file transfer's BLOCK header is this long).
pub const FRAME_HEAD: usize = 32;

/// Room in front of every staging block and receive buffer: the header ends exactly where
/// the payload starts, [`DIRECT_ALIGN`] into the allocation.
pub(crate) const HEAD_ROOM: usize = DIRECT_ALIGN;

/// Context of control sends (their completions are only checked for errors).
const CTX_CONTROL: u64 = u64::MAX;

/// Size of a pooled control send buffer (larger frames get their own).
const CONTROL_BUF: usize = 4096;

/// Completed control send buffers kept for reuse.
const CONTROL_POOL: usize = 16;

/// What a buffer is for, which decides the remote rights it is registered with.
#[derive(Clone, Copy)]
pub(crate) enum Use {
    /// Sent from (staging blocks, control frames).
    Send,
    /// Received into (the receive ring).
    Recv,
}

/// The least remote rights a buffer needs under the socket's rendezvous: with pull (the
/// default) the peer reads what we send and never touches what we receive into; with push,
/// the reverse. Nothing else of ours is reachable by the peer, and only on its own
/// connection.
pub(crate) fn rights(sock: &ExsSocket, what: Use) -> Access {
    match (sock.config().push, what) {
        (false, Use::Send) => Access::REMOTE_READ,
        (true, Use::Recv) => Access::REMOTE_WRITE,
        _ => Access::LOCAL,
    }
}

/// Allocates a registered buffer of `len` bytes whose byte [`FRAME_HEAD`] (a block's
/// payload) is [`DIRECT_ALIGN`]-aligned, with the rights its use needs.
pub(crate) fn alloc_aligned(sock: &ExsSocket, len: usize, what: &str, to: Use) -> Result<ExsBuf> {
    let start = HEAD_ROOM - FRAME_HEAD;
    sock.alloc_with(start + len, rights(sock, to))
        .map_err(|e| Error::conn(format!("register {what}: {e}")))?
        .slice(start..)
        .map_err(|e| Error::conn(format!("slice {what}: {e}")))
}

/// Bytes one staging block or receive buffer for blocks of `block` bytes takes (its head
/// room, header and payload, in whole pages).
pub fn buffer_bytes(block: u32) -> u64 {
    (HEAD_ROOM as u64 + u64::from(block)).next_multiple_of(DIRECT_ALIGN as u64)
}

/// Messages up to this size travel inside their advertisement (EXS's immediate size),
/// copied out on arrival: half a round trip. A larger message is pulled (advertisement,
/// read, data: a round trip and a half), which at 50 ms made every LIST answer and every
/// GETS of a tree cost 75 ms instead of 25. 4 KiB holds a GETS of 64 files or a LIST
/// answer of about a hundred entries; each socket keeps its control buffers this large
/// (EXS posts one per credit each way: about 140 KiB per connection). Each side offers
/// it and EXS uses the smaller offer, so an older peer's 512 bytes still hold.
pub const IMMEDIATE: u32 = 4096;

/// The EXS settings of a channel to or from `addr`: the driver's recommended ones
/// ([`default_config`]) with messages up to [`IMMEDIATE`] sent eagerly.
pub fn exs_config(addr: &ferry_fabric::Address) -> Config {
    Config {
        small_packet_max_size: IMMEDIATE,
        ..default_config(addr)
    }
}

/// Bytes a ring of `slots` buffers for blocks of `block` bytes pins: the receive buffers
/// [`Channel::post_ring`] posts for such blocks, or the staging blocks a
/// [`crate::ring::Sender`] of that depth allocates. (Held buffers, the blocks a writer has
/// queued, are the receive ring's own: they add nothing.)
pub fn ring_bytes(slots: usize, block: u32) -> u64 {
    slots as u64 * buffer_bytes(block)
}

/// The most a channel's pool of control send buffers holds when its control frames are at
/// most `largest` bytes (a face's largest control frame).
pub fn control_pool_bytes(largest: usize) -> u64 {
    (CONTROL_POOL * CONTROL_BUF.max(largest).next_multiple_of(DIRECT_ALIGN)) as u64
}

/// The memory an allocated buffer really takes: its whole registered allocation (the
/// slice a caller sees may start past its head room), in the fabric's whole 4 KiB pages.
pub(crate) fn pinned(buf: &ExsBuf) -> u64 {
    buf.buffer().len().next_multiple_of(DIRECT_ALIGN) as u64
}

/// An EXS error as the channel reports it.
pub(crate) fn exs_err(what: &str, e: ExsError) -> Error {
    match e {
        ExsError::PeerClosed | ExsError::ConnectionReset | ExsError::NotConnected => {
            Error::conn(format!("{what}: the peer closed the connection"))
        }
        ExsError::MessageSize => Error::conn(format!(
            "{what}: the peer sent a message larger than agreed"
        )),
        e => Error::conn(format!("{what}: {e}")),
    }
}

/// A connected channel: an EXS socket, its queue, and the posted receive ring.
pub struct Channel {
    sock: ExsSocket,
    q: EventQueue,
    next_post: u64,
    next_deliver: u64,
    done: BTreeMap<u64, (ExsBuf, usize)>,
    recv_size: usize,
    /// Registered control send buffers whose sends completed, for reuse.
    ctrl_pool: Mutex<Vec<ExsBuf>>,
    /// Receive buffers handed out as [`Held`] come back here when dropped (the receiver in
    /// a mutex, only ever taken by `&mut self`, keeps the channel shareable).
    returns: (mpsc::Sender<ExsBuf>, Mutex<mpsc::Receiver<ExsBuf>>),
    /// Receive buffers handed out and not back yet.
    held: usize,
    /// Bytes of the receive buffers allocated and not dropped (posted, received, held).
    recv_bytes: u64,
    /// How long a receive waits for the peer before giving up.
    pub timeout: Duration,
    /// The TLS session its control frames are sealed with, if any.
    secure: Option<Arc<Secure>>,
    /// The frame types that may arrive in clear on a sealed channel (the face's data).
    data_types: &'static [u8],
    /// How the data blocks of the channel are checked ([`Channel::protect`]).
    protection: Protection,
    /// Room for the next sealed message's frame, kept from an earlier one: a large frame
    /// opened into fresh memory would fault its pages in every time.
    opened: Vec<u8>,
}

/// A message as delivered: in its receive buffer (clear), or opened from its seal.
enum Delivered {
    Raw(ExsBuf, usize),
    Opened(Vec<u8>),
}

/// A received message whose registered buffer its receiver keeps (to write from it on
/// another thread, say) instead of copying the bytes out: the channel posts the buffer
/// again once this is dropped. While held, the buffer is one fewer the peer may send into,
/// so holding them is back-pressure, as a copy's bounded queue was.
pub struct Held {
    buf: Option<ExsBuf>,
    /// A sealed message's frame, opened (it no longer lives in a receive buffer).
    opened: Option<Vec<u8>>,
    len: usize,
    back: mpsc::Sender<ExsBuf>,
}

impl Held {
    /// The message's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Runs `f` over the message's bytes, in place in the registered buffer.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match (&self.buf, &self.opened) {
            (Some(b), _) => b.buffer().with_bytes(b.offset(), self.len, f),
            (None, Some(v)) => f(v),
            (None, None) => f(&[]),
        }
    }

    /// Runs `f` over the message's bytes mutably, in place (a `private` block is decrypted
    /// where it landed). The buffer is this receiver's alone until it is dropped.
    pub fn with_bytes_mut<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        match (&self.buf, &mut self.opened) {
            (Some(b), _) => b.buffer().with_bytes_mut(b.offset(), self.len, f),
            (None, Some(v)) => f(v),
            (None, None) => f(&mut []),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            // A closed channel no longer wants it: the buffer is freed with it.
            let _ = self.back.send(b);
        }
    }
}

impl Channel {
    /// Connects to a `ferry serve` at a fabric address (`tcp://h:p`, `ofi+tcp://h:p`,
    /// `ofi+shm://name`).
    ///
    /// The connection is secured as [`ClientSecurity::default`] says (TLS, the server
    /// pinned in the default known-hosts file): see [`Channel::connect_with`].
    pub fn connect(addr: &str, timeout: Duration) -> Result<Channel> {
        Self::connect_with(addr, timeout, &ClientSecurity::default())
    }

    /// Connects to a `ferry serve` and, unless `sec` asks for a clear connection, runs the
    /// TLS handshake (the server's identity checked as `sec` says) and seals the channel;
    /// the caller names its face's data frames with [`Channel::set_data_types`]. The TLS
    /// ClientHello rides right behind EXS's HELLO ([`Channel::connect_first`]).
    pub fn connect_with(addr: &str, timeout: Duration, sec: &ClientSecurity) -> Result<Channel> {
        if sec.clear {
            return Self::connect_clear(addr, timeout);
        }
        let mut wire = ChannelWire {
            ch: None,
            addr,
            timeout,
            deadline: std::time::Instant::now() + timeout,
        };
        let secure = secure::connect(sec, addr, &mut wire)?;
        let mut ch = wire
            .ch
            .ok_or_else(|| Error::conn("internal: a TLS handshake that sent nothing"))?;
        ch.secure = Some(Arc::new(secure));
        Ok(ch)
    }

    /// Connects with `first` as the connection's first message, sent right behind EXS's
    /// HELLO instead of a round trip later, after the server's
    /// ([`ExsSocket::connect_early`]; `docs/protocol.md`, EXS "Handshake and versions"). A
    /// message longer than [`EARLY_MAX`], or a server whose immediate size turns out too
    /// small for it, gets a connection first and the message after.
    fn connect_first(addr: &str, timeout: Duration, first: &[u8]) -> Result<Channel> {
        if first.len() <= EARLY_MAX {
            match Self::open(addr, timeout, Some(first))? {
                Ok(ch) => return Ok(ch),
                // The server's immediates cannot hold it: again, the message after.
                Err(ExsConnectError::Exs(ExsError::MessageSize)) => {}
                Err(e) => return Err(connect_error(addr, &e)),
            }
        }
        let ch = Self::connect_clear(addr, timeout)?;
        ch.send_raw(first)?;
        Ok(ch)
    }

    /// Connects without securing the connection.
    fn connect_clear(addr: &str, timeout: Duration) -> Result<Channel> {
        Self::open(addr, timeout, None)?.map_err(|e| connect_error(addr, &e))
    }

    /// A clear channel to `addr`, with `first` as an early first message; the inner error
    /// is the EXS connection's, for the caller to tell a refused early message apart.
    fn open(
        addr: &str,
        timeout: Duration,
        first: Option<&[u8]>,
    ) -> Result<std::result::Result<Channel, ExsConnectError>> {
        let fabric: ferry_fabric::Address = addr
            .parse()
            .map_err(|e| Error::new(Kind::Usage, format!("bad address {addr}: {e}")))?;
        let q = EventQueue::new().map_err(|e| Error::io("create event queue", &e))?;
        let cfg = exs_config(&fabric);
        let sock = match first {
            Some(first) => ExsSocket::connect_early(addr, cfg, &q, timeout, (first, CTX_CONTROL)),
            None => ExsSocket::connect(addr, cfg, &q, timeout),
        };
        Ok(sock.map(|sock| Self::new(sock, q)))
    }

    /// Wraps a connected socket whose events go to `q`.
    pub fn new(sock: ExsSocket, q: EventQueue) -> Channel {
        Channel {
            sock,
            q,
            next_post: 0,
            next_deliver: 0,
            done: BTreeMap::new(),
            recv_size: 0,
            ctrl_pool: Mutex::new(Vec::new()),
            returns: {
                let (tx, rx) = mpsc::channel();
                (tx, Mutex::new(rx))
            },
            held: 0,
            recv_bytes: 0,
            timeout: Duration::from_secs(120),
            secure: None,
            data_types: &[],
            protection: Protection::default(),
            opened: Vec::new(),
        }
    }

    /// Seals the channel with a session the floor's handshake made (the server's side:
    /// [`crate::registry::Conn::secure`]); `None` leaves it clear.
    pub fn seal(&mut self, secure: Option<Arc<Secure>>) {
        self.secure = secure;
    }

    /// The TLS session sealing the channel, if any.
    pub fn secure(&self) -> Option<&Arc<Secure>> {
        self.secure.as_ref()
    }

    /// Protects the channel's data blocks at `level`, as agreed with the peer on the sealed
    /// channel (`server`: which side this is); the keys come from the TLS session. A clear
    /// channel has only [`Level::Clear`].
    pub fn protect(&mut self, level: Level, server: bool) -> Result<()> {
        self.protection = match (&self.secure, level) {
            (_, Level::Clear) => Protection::default(),
            (Some(s), _) => Protection::new(level, server, |l, c| s.export(l, c))?,
            (None, _) => {
                return Err(Error::new(
                    Kind::Usage,
                    format!(
                        "data protection {level} needs TLS: a clear connection has only clear data"
                    ),
                ))
            }
        };
        Ok(())
    }

    /// What protects the channel's data blocks (CRC-32C only until [`Channel::protect`]).
    pub fn protection(&self) -> &Protection {
        &self.protection
    }

    /// The frame types (a face's header type byte) that may arrive in clear on a sealed
    /// channel: the face's data frames, which this slice leaves unsealed.
    pub fn set_data_types(&mut self, types: &'static [u8]) {
        self.data_types = types;
    }

    /// Selects `service` on a sealed channel and waits for the answer, proving `token`
    /// (if not empty) over the TLS exporter value instead of sending it (protocol 1.7).
    /// A refused proof is an authentication error; a service not hosted, not found.
    pub fn select(&mut self, addr: &str, service: &str, token: &str) -> Result<()> {
        self.select_as(addr, service, token, None)
    }

    /// [`Channel::select`] proving `key` too (protocol 1.9): its signature of the TLS
    /// exporter value ([`crate::keys::ClientKey::prove`]); the server authenticates the
    /// key when one is given.
    pub fn select_as(
        &mut self,
        addr: &str,
        service: &str,
        token: &str,
        key: Option<&crate::keys::ClientKey>,
    ) -> Result<()> {
        let keyed = self.send_select(service, token, key)?;
        self.selected(addr, service, keyed)
    }

    /// Sends the SELECT of [`Channel::select_as`] without waiting for its answer, so the
    /// face's first frames can follow it at once (protocol 1.6: the server answers the
    /// SELECT before any of them); [`Channel::selected`] takes the answer. One receive
    /// buffer is posted for it first. Whether it carries a key proof (for the error of an
    /// older server) is returned.
    pub fn send_select(
        &mut self,
        service: &str,
        token: &str,
        key: Option<&crate::keys::ClientKey>,
    ) -> Result<bool> {
        let proof = match (&self.secure, token.is_empty()) {
            (Some(s), false) => Some((secure::token_id(token), secure::prove(token, s.binding()))),
            _ => None,
        };
        let key = match (&self.secure, key) {
            (Some(s), Some(k)) => Some(k.prove(s.binding())),
            _ => None,
        };
        let keyed = key.is_some();
        self.post_ring(1, floor::MAX_ANSWER)?;
        let bytes = floor::encode(&Floor::Select {
            service: service.to_string(),
            token: None,
            proof,
            key,
        })
        .map_err(|e| Error::conn(format!("encode SELECT: {e}")))?;
        self.send_frame(&bytes)?;
        Ok(keyed)
    }

    /// The answer to a SELECT [`Channel::send_select`] sent (`keyed`: with a key proof):
    /// `Ok` once selected. Its buffer is not posted again: the face posts its own next.
    pub fn selected(&mut self, addr: &str, service: &str, keyed: bool) -> Result<()> {
        let answer = self.recv_first().map_err(|e| {
            if keyed {
                Error::conn(format!(
                    "{addr} closed the connection at a key proof: a ferry serve older than protocol 1.9 (no client keys)? Use a token with it (--token; --identity none) ({e})"
                ))
            } else {
                e
            }
        })?;
        match floor::decode(&answer) {
            Ok(Floor::Selected) => Ok(()),
            Ok(Floor::Refused { message }) => {
                Err(Error::new(Kind::Auth, format!("{addr}: {message}")))
            }
            Ok(Floor::Services { hosted, .. }) => Err(not_hosted(addr, service, &hosted)),
            Ok(f) => Err(Error::conn(format!("{addr} answered {f:?} to SELECT"))),
            Err(e) => Err(Error::conn(format!("{addr} sent {e}"))),
        }
    }

    /// The socket underneath.
    pub fn socket(&self) -> &ExsSocket {
        &self.sock
    }

    /// The largest message this side sends inside its advertisement ([`IMMEDIATE`], or
    /// less as configured; a peer that offered less takes larger ones by pull).
    pub fn immediate(&self) -> usize {
        self.sock.config().small_packet_max_size as usize
    }

    /// The longest control frame that crosses inside its advertisement, in half a round
    /// trip instead of one and a half: the immediate size both sides settled, less the
    /// seal of a secure channel. A face that can split an answer (LIST's ENTRIES, a
    /// client's GETS) keeps its frames this short on a long path.
    pub fn frame_room(&self) -> usize {
        let imm = self.sock.immediate_max();
        match self.secure {
            Some(_) => imm.saturating_sub(secure::seal_room(imm)),
            None => imm,
        }
    }

    /// The queue the socket's events go to (a thread waiting in a receive is woken early
    /// by its [`EventQueue::wake`]).
    pub fn queue(&self) -> &EventQueue {
        &self.q
    }

    /// Posts receive buffers until `count` are outstanding, each `size` bytes (the first
    /// call fixes the size; later messages must fit it).
    pub fn post_ring(&mut self, count: usize, size: usize) -> Result<()> {
        // A sealed control frame is a little longer than the frame.
        let size = match self.secure {
            Some(_) => size + secure::seal_room(size),
            None => size,
        };
        self.recv_size = size;
        let outstanding = (self.next_post - self.next_deliver) as usize;
        for _ in outstanding..count {
            let buf = alloc_aligned(&self.sock, size, "receive buffer", Use::Recv)?;
            self.recv_bytes += pinned(&buf);
            self.sock.recv(buf, Flags::NONE, self.next_post);
            self.next_post += 1;
        }
        Ok(())
    }

    /// Closes the channel once its last frames have left, without the grace a plain drop
    /// leaves the peer ([`ExsSocket::hang_up`]): for a client whose peer sends nothing
    /// more, after its goodbye.
    pub fn hang_up(self) {
        self.sock.hang_up();
    }

    /// Sends `bytes`, a whole encoded frame (with its payload, if any), as one message,
    /// copied into a registered buffer.
    pub fn send_frame(&self, bytes: &[u8]) -> Result<()> {
        mark_frame("chan.tx", bytes);
        match &self.secure {
            Some(s) => s.seal(bytes, |sealed| self.send_raw(sealed)),
            None => self.send_raw(bytes),
        }
    }

    /// Sends `bytes` as one message as they are.
    fn send_raw(&self, bytes: &[u8]) -> Result<()> {
        let pooled = {
            let mut pool = self.ctrl_pool.lock().unwrap_or_else(|p| p.into_inner());
            pool.iter()
                .position(|b| b.len() >= bytes.len())
                .map(|i| pool.swap_remove(i))
        };
        let buf = match pooled {
            Some(b) => b,
            None => self
                .sock
                .alloc_with(bytes.len().max(CONTROL_BUF), rights(&self.sock, Use::Send))
                .map_err(|e| Error::conn(format!("register send buffer: {e}")))?,
        };
        buf.write_at(0, bytes)
            .map_err(|e| Error::conn(format!("fill send buffer: {e}")))?;
        let buf = buf
            .slice(..bytes.len())
            .map_err(|e| Error::conn(format!("slice send buffer: {e}")))?;
        self.sock.send(buf, Flags::NONE, CTX_CONTROL);
        Ok(())
    }

    /// Receives the next message into `out` (resized to the message) and re-posts its
    /// buffer. Send completions met on the way are checked.
    pub fn recv_into(&mut self, out: &mut Vec<u8>) -> Result<()> {
        let wait = self.timeout;
        if !self.recv_within(out, wait)? {
            return Err(silent_peer(wait));
        }
        Ok(())
    }

    /// Like [`Channel::recv_into`], but `Ok(false)` when nothing arrived for about `wait`,
    /// so a caller can look at other things between waits.
    pub fn recv_within(&mut self, out: &mut Vec<u8>, wait: Duration) -> Result<bool> {
        match self.next_within(wait, true)? {
            None => Ok(false),
            Some(Delivered::Raw(buf, len)) => {
                copy_out(&buf, len, out);
                self.repost(buf)?;
                Ok(true)
            }
            Some(Delivered::Opened(mut v)) => {
                std::mem::swap(out, &mut v);
                self.opened = v;
                Ok(true)
            }
        }
    }

    /// Receives the next message and runs `f` over its bytes in place, in the registered
    /// receive buffer (no copy), then re-posts the buffer.
    pub fn recv_with<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let wait = self.timeout;
        match self
            .next_within(wait, true)?
            .ok_or_else(|| silent_peer(wait))?
        {
            Delivered::Raw(buf, len) => {
                let out = buf.buffer().with_bytes(buf.offset(), len, f);
                self.repost(buf)?;
                Ok(out)
            }
            Delivered::Opened(v) => {
                let out = f(&v);
                self.opened = v;
                Ok(out)
            }
        }
    }

    /// Receives the next message and hands over its registered buffer itself, posted again
    /// once the [`Held`] is dropped (no copy, and the bytes may be used on another thread).
    pub fn recv_held(&mut self) -> Result<Held> {
        let wait = self.timeout;
        self.recv_held_within(wait)?
            .ok_or_else(|| silent_peer(wait))
    }

    /// Like [`Channel::recv_held`], but `Ok(None)` when nothing arrived for about `wait`, so
    /// a caller can look at other things between waits.
    pub fn recv_held_within(&mut self, wait: Duration) -> Result<Option<Held>> {
        Ok(match self.next_within(wait, true)? {
            None => None,
            Some(Delivered::Raw(buf, len)) => {
                self.held += 1;
                Some(Held {
                    buf: Some(buf),
                    opened: None,
                    len,
                    back: self.returns.0.clone(),
                })
            }
            Some(Delivered::Opened(v)) => Some(Held {
                buf: None,
                len: v.len(),
                opened: Some(v),
                back: self.returns.0.clone(),
            }),
        })
    }

    /// Posts a held buffer again at once, rather than at the next receive after the
    /// [`Held`] is dropped (for a message done with before other work).
    pub fn give_back(&mut self, mut held: Held) -> Result<()> {
        match held.buf.take() {
            Some(buf) => {
                self.held = self.held.saturating_sub(1);
                self.repost(buf)
            }
            None => Ok(()),
        }
    }

    /// The next message, copied out, without posting its buffer again: for a handshake's
    /// frame, after which the caller posts its ring sized for the agreed block (re-posted,
    /// the handshake's small buffer would be the next to fill, and the first message after
    /// the handshake may be a whole file). `Ok(None)` when nothing arrived for about `wait`.
    pub fn recv_first_within(&mut self, wait: Duration) -> Result<Option<Vec<u8>>> {
        Ok(match self.next_within(wait, false)? {
            None => None,
            Some(Delivered::Raw(buf, len)) => {
                let mut v = Vec::new();
                copy_out(&buf, len, &mut v);
                self.recv_bytes = self.recv_bytes.saturating_sub(pinned(&buf));
                Some(v)
            }
            Some(Delivered::Opened(v)) => Some(v),
        })
    }

    /// A face's first frame on a connection still in its handshake (`hs`): waited for until
    /// the handshake's deadline, or until the handshake is called off to make room for
    /// newer connections. `what` names the frame (HELLO, OPEN) in the errors.
    pub fn recv_first_in(&mut self, hs: &Handshake, what: &str) -> Result<Vec<u8>> {
        loop {
            if hs.cancelled() {
                return Err(Error::conn(format!(
                    "closed before its {what} to make room for newer connections (max_handshakes)"
                )));
            }
            let left = hs.left();
            if left.is_zero() {
                return Err(Error::conn(format!(
                    "no {what} within the handshake timeout (handshake_timeout)"
                )));
            }
            if let Some(v) = self.recv_first_within(left.min(HANDSHAKE_POLL))? {
                if hs.reached(Stage::Checking) {
                    return Ok(v);
                }
            }
        }
    }

    /// Like [`Channel::recv_first_within`], waiting at most the channel's timeout.
    pub fn recv_first(&mut self) -> Result<Vec<u8>> {
        let wait = self.timeout;
        self.recv_first_within(wait)?
            .ok_or_else(|| silent_peer(wait))
    }

    /// Bytes of receive buffers this channel has allocated and not let go: what its receive
    /// ring really pins (compare [`ring_bytes`]).
    pub fn recv_ring_bytes(&self) -> u64 {
        self.recv_bytes
    }

    /// The largest message the posted buffers take.
    pub fn recv_size(&self) -> usize {
        self.recv_size
    }

    /// Closes the connection (the peer sees it closed).
    pub fn close(&self) {
        let _ = self.sock.close();
    }

    /// Where held buffers come back.
    fn returned(&mut self) -> &mpsc::Receiver<ExsBuf> {
        self.returns.1.get_mut().unwrap_or_else(|p| p.into_inner())
    }

    /// Posts again the held buffers that came back.
    fn repost_returned(&mut self) -> Result<()> {
        while let Ok(buf) = self.returned().try_recv() {
            self.held = self.held.saturating_sub(1);
            self.repost(buf)?;
        }
        Ok(())
    }

    /// Re-posts a delivered receive buffer (a fresh one if the ring grew since).
    fn repost(&mut self, buf: ExsBuf) -> Result<()> {
        let buf = if buf.len() < self.recv_size {
            let grown = alloc_aligned(&self.sock, self.recv_size, "receive buffer", Use::Recv)?;
            self.recv_bytes = self.recv_bytes.saturating_sub(pinned(&buf)) + pinned(&grown);
            grown
        } else {
            buf
        };
        self.sock.recv(buf, Flags::NONE, self.next_post);
        self.next_post += 1;
        Ok(())
    }

    /// The next received message within about `wait`: a clear one in its buffer, a sealed
    /// one opened (its buffer posted again if `repost`, else let go). On a sealed channel a
    /// clear message must be one of the face's data frames.
    fn next_within(&mut self, wait: Duration, repost: bool) -> Result<Option<Delivered>> {
        let Some((buf, len)) = self.next_done_within(wait)? else {
            return Ok(None);
        };
        let kind = buf
            .buffer()
            .with_bytes(buf.offset(), len.min(floor::HEADER_LEN), |h| {
                h.get(4).copied()
            });
        let Some(sec) = self.secure.clone() else {
            timeline::mark("chan.rx", kind.map_or(0, u64::from));
            return Ok(Some(Delivered::Raw(buf, len)));
        };
        if kind.is_some_and(|t| self.data_types.contains(&t)) {
            timeline::mark("chan.rx", kind.map_or(0, u64::from));
            return Ok(Some(Delivered::Raw(buf, len)));
        }
        // Opened from its receive buffer (no copy), into the room an earlier one left.
        let mut frame = std::mem::take(&mut self.opened);
        let opened = buf
            .buffer()
            .with_bytes(buf.offset(), len, |sealed| sec.open(sealed, &mut frame));
        if repost {
            self.repost(buf)?;
        } else {
            self.recv_bytes = self.recv_bytes.saturating_sub(pinned(&buf));
        }
        opened?;
        mark_frame("chan.rx", &frame);
        Ok(Some(Delivered::Opened(frame)))
    }

    /// The next received message in posting order, or `None` when nothing arrived for
    /// about `wait`. Send completions met on the way are checked.
    fn next_done_within(&mut self, wait: Duration) -> Result<Option<(ExsBuf, usize)>> {
        loop {
            // Held buffers go back to the peer first, so its window stays full.
            self.repost_returned()?;
            if let Some(done) = self.done.remove(&self.next_deliver) {
                self.next_deliver += 1;
                return Ok(Some(done));
            }
            if self.next_post == self.next_deliver {
                if self.held == 0 {
                    return Err(Error::conn("internal: receive with no buffer posted"));
                }
                // Every buffer is held: wait for one to come back.
                match self.returned().recv_timeout(wait) {
                    Ok(buf) => {
                        self.held -= 1;
                        self.repost(buf)?;
                        continue;
                    }
                    Err(_) => return Ok(None),
                }
            }
            let Some(ev) = self.q.dequeue(wait) else {
                return Ok(None);
            };
            match ev.kind {
                EventKind::Recv => {
                    ev.result.map_err(|e| exs_err("receive", e))?;
                    let buf = ev
                        .buf
                        .ok_or_else(|| Error::conn("receive completed without its buffer"))?;
                    let len = usize::try_from(ev.len).unwrap_or(usize::MAX).min(buf.len());
                    self.done.insert(ev.ctx, (buf, len));
                }
                EventKind::Send => {
                    ev.result.map_err(|e| exs_err("send", e))?;
                    // (An early first message's buffer is smaller and local only: dropped.)
                    if let Some(b) = ev.buf.filter(|b| b.len() >= CONTROL_BUF) {
                        let mut pool = self.ctrl_pool.lock().unwrap_or_else(|p| p.into_inner());
                        if pool.len() < CONTROL_POOL {
                            pool.push(ExsBuf::new(b.region().clone()));
                        }
                    }
                }
                EventKind::Close => {
                    return Err(match ev.result {
                        Err(e) => exs_err("connection", e),
                        Ok(()) => Error::conn("the connection was closed"),
                    })
                }
                EventKind::Connect | EventKind::ReadNotify | EventKind::Rma => {}
            }
        }
    }
}

/// A client's messages during its TLS handshake: the first one connects (and rides with
/// the connection's handshake, [`Channel::connect_first`]); one receive posted at a time
/// (and not posted again, so none is left for the face), until `deadline`.
struct ChannelWire<'a> {
    ch: Option<Channel>,
    addr: &'a str,
    timeout: Duration,
    deadline: std::time::Instant,
}

impl ChannelWire<'_> {
    fn channel(&mut self) -> Result<&mut Channel> {
        self.ch
            .as_mut()
            .ok_or_else(|| Error::conn("internal: a TLS handshake that waits before it sends"))
    }
}

impl secure::Wire for ChannelWire<'_> {
    fn send_msg(&mut self, msg: &[u8]) -> Result<()> {
        match &self.ch {
            Some(ch) => ch.send_raw(msg),
            None => {
                self.ch = Some(Channel::connect_first(self.addr, self.timeout, msg)?);
                Ok(())
            }
        }
    }

    fn recv_msg(&mut self) -> Result<Vec<u8>> {
        let deadline = self.deadline;
        let ch = self.channel()?;
        ch.post_ring(1, HANDSHAKE_BUF)?;
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        ch.recv_first_within(left)?
            .ok_or_else(|| Error::conn("no answer to the TLS handshake within the connect timeout"))
    }

    fn immediate(&self) -> usize {
        IMMEDIATE as usize
    }
}

/// The longest early first message ([`Channel::connect_first`]): the immediate size every
/// `ferry serve` since TLS (1.7) offers, so a server of any version takes it.
const EARLY_MAX: usize = 512;

/// The error of a failed EXS connection.
type ExsConnectError = ferry_exs::runtime::Error;

/// What a failed connection to `addr` reports, with a hint at the likely cause.
fn connect_error(addr: &str, e: &ExsConnectError) -> Error {
    // A driver missing here (libfabric not installed) is not the server's doing, and a name
    // that does not resolve is the user's to fix, not a server to start.
    use ferry_fabric::FabricError;
    let hint = match e {
        ExsConnectError::Fabric(FabricError::Unavailable(_)) => "",
        ExsConnectError::Fabric(FabricError::Io { context, .. })
            if context.starts_with("resolv") =>
        {
            " (no such host: check its name)"
        }
        _ => " (is `ferry serve` running there, and is the driver right?)",
    };
    Error::conn(format!("cannot connect to {addr}: {e}{hint}"))
}

/// The receive buffer of a handshake message (a TLS flight cut to the immediate size).
const HANDSHAKE_BUF: usize = 4096;

/// Marks a control frame sent or received on the process's timeline
/// ([`ferry_fabric::timeline`], off unless `FERRY_TIMELINE` is set), with its type byte:
/// what shows a handshake's frames leaving before the answers to the ones before them.
fn mark_frame(what: &'static str, frame: &[u8]) {
    timeline::mark(what, frame.get(4).copied().map_or(0, u64::from));
}

/// Copies the first `len` bytes of a received buffer into `out` (resized to them).
pub(crate) fn copy_out(buf: &ExsBuf, len: usize, out: &mut Vec<u8>) {
    out.resize(len, 0);
    buf.buffer().read_at(buf.offset(), out);
}

/// The error of a peer that sent nothing for `wait`.
fn silent_peer(wait: Duration) -> Error {
    Error::conn(format!(
        "the peer sent nothing for {} s; giving up",
        wait.as_secs()
    ))
}

/// The refusal `ferry` prints for a service a server does not run.
pub fn not_hosted(addr: &str, service: &str, hosted: &[String]) -> Error {
    let list = if hosted.is_empty() {
        "none".to_string()
    } else {
        hosted.join(", ")
    };
    Error::new(
        Kind::NotFound,
        format!("the server at {addr} does not run service {service:?}; it runs: {list}"),
    )
}
