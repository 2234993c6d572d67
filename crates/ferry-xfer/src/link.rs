//! One transfer connection over EXS, and the staging ring that moves file blocks over it.
//!
//! Every EXS message is one protocol frame. The receiving side keeps `ring` receive
//! buffers of `BLOCK_HEADER_LEN + block_size` bytes posted (registered memory); a control
//! frame fits the immediate size and is copied out of the advert, a BLOCK frame is pulled
//! by RMA straight into a posted buffer. Received messages are delivered in posting order.
//!
//! Sending a file range ([`BlockSender`]): the calling thread is the disk reader. It takes a
//! free registered block (at most `ring` exist), `pread`s into it, computes the block's
//! CRC-32C, writes the BLOCK header in front and posts the EXS send; the transfer itself
//! proceeds in the EXS progress thread and the peer's RMA read while the reader fills the
//! next block. A block comes back for reuse when its send completes, so a slow network or a
//! slow receiver (which stops re-posting receive buffers while its writer lags) stalls the
//! reader: bounded memory, back-pressure end to end.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferry_exs::proto::{EventKind, Flags};
use ferry_exs::runtime::{default_config, EventQueue, ExsBuf, ExsSocket};
use ferry_exs::ExsError;
use ferry_fabric::Access;

use ferry_service::direct::{direct_aligned, open_direct_or_warn, DIRECT_ALIGN};
use ferry_service::sink::{Block, BlockSink};

use crate::error::{Result, XferError};
use crate::proto::{self, BlockHeader, Msg, BLOCK_HEADER_LEN};

/// Context of control sends (their completions are only checked for errors).
const CTX_CONTROL: u64 = u64::MAX;

/// Size of a pooled control send buffer (larger frames get their own).
const CONTROL_BUF: usize = 4096;

/// How long a handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Room in front of every staging block and receive buffer: the 32-byte BLOCK header sits
/// right before the payload, which starts [`DIRECT_ALIGN`] into the (page-aligned)
/// registered allocation, so direct I/O can read into it and write from it in place.
const HEAD_ROOM: usize = DIRECT_ALIGN;

/// What a buffer is for, which decides the remote rights it is registered with.
#[derive(Clone, Copy)]
enum Use {
    /// Sent from (staging blocks, control frames).
    Send,
    /// Received into (the receive ring).
    Recv,
}

/// The least remote rights a buffer needs under the socket's rendezvous: with pull (the
/// default) the peer reads what we send and never touches what we receive into; with push,
/// the reverse. Nothing else of ours is reachable by the peer, and only on its own
/// connection.
fn rights(sock: &ExsSocket, what: Use) -> Access {
    match (sock.config().push, what) {
        (false, Use::Send) => Access::REMOTE_READ,
        (true, Use::Recv) => Access::REMOTE_WRITE,
        _ => Access::LOCAL,
    }
}

/// Allocates a registered buffer of `len` bytes whose byte [`BLOCK_HEADER_LEN`] (a BLOCK's
/// payload) is [`DIRECT_ALIGN`]-aligned, with the rights its use needs.
fn alloc_aligned(sock: &ExsSocket, len: usize, what: &str, to: Use) -> Result<ExsBuf> {
    let start = HEAD_ROOM - BLOCK_HEADER_LEN;
    sock.alloc_with(start + len, rights(sock, to))
        .map_err(|e| XferError::conn(format!("register {what}: {e}")))?
        .slice(start..)
        .map_err(|e| XferError::conn(format!("slice {what}: {e}")))
}

/// Bytes one staging block or receive buffer for blocks of `block` bytes takes (its head
/// room, header and payload, in whole pages).
pub fn buffer_bytes(block: u32) -> u64 {
    (HEAD_ROOM as u64 + u64::from(block)).next_multiple_of(DIRECT_ALIGN as u64)
}

/// A connected transfer link: an EXS socket, its queue, and the posted receive ring.
pub struct Link {
    sock: ExsSocket,
    q: EventQueue,
    next_post: u64,
    next_deliver: u64,
    done: BTreeMap<u64, (ExsBuf, usize)>,
    recv_size: usize,
    /// Registered control send buffers whose sends completed, for reuse.
    ctrl_pool: std::sync::Mutex<Vec<ExsBuf>>,
    /// How long [`Link::recv`] waits for the peer before giving up.
    pub timeout: Duration,
}

fn exs_err(what: &str, e: ExsError) -> XferError {
    match e {
        ExsError::PeerClosed | ExsError::ConnectionReset | ExsError::NotConnected => {
            XferError::conn(format!("{what}: the peer closed the connection"))
        }
        ExsError::MessageSize => XferError::conn(format!(
            "{what}: the peer sent a message larger than agreed"
        )),
        e => XferError::conn(format!("{what}: {e}")),
    }
}

impl Link {
    /// Connects to a `ferry serve` at a fabric address (`tcp://h:p`, `ofi+tcp://h:p`,
    /// `ofi+shm://name`).
    pub fn connect(addr: &str, timeout: Duration) -> Result<Link> {
        let fabric: ferry_fabric::Address = addr
            .parse()
            .map_err(|e| XferError::new(crate::Kind::Usage, format!("bad address {addr}: {e}")))?;
        let q = EventQueue::new().map_err(|e| XferError::io("create event queue", &e))?;
        let sock = ExsSocket::connect(addr, default_config(&fabric), &q, timeout).map_err(|e| {
            // A driver missing here (libfabric not installed) is not the server's doing.
            let hint = match e {
                ferry_exs::runtime::Error::Fabric(ferry_fabric::FabricError::Unavailable(_)) => "",
                _ => " (is `ferry serve` running there, and is the driver right?)",
            };
            XferError::conn(format!("cannot connect to {addr}: {e}{hint}"))
        })?;
        Ok(Self::new(sock, q))
    }

    /// Wraps a connected socket whose events go to `q`.
    pub fn new(sock: ExsSocket, q: EventQueue) -> Link {
        Link {
            sock,
            q,
            next_post: 0,
            next_deliver: 0,
            done: BTreeMap::new(),
            recv_size: 0,
            ctrl_pool: std::sync::Mutex::new(Vec::new()),
            timeout: Duration::from_secs(120),
        }
    }

    /// The socket underneath.
    pub fn socket(&self) -> &ExsSocket {
        &self.sock
    }

    /// Posts receive buffers until `count` are outstanding, each `size` bytes (the first
    /// call fixes the size; later messages must fit it).
    pub fn post_ring(&mut self, count: usize, size: usize) -> Result<()> {
        self.recv_size = size;
        let outstanding = (self.next_post - self.next_deliver) as usize;
        for _ in outstanding..count {
            let buf = alloc_aligned(&self.sock, size, "receive buffer", Use::Recv)?;
            self.sock.recv(buf, Flags::NONE, self.next_post);
            self.next_post += 1;
        }
        Ok(())
    }

    /// Sends one control frame.
    pub fn send(&self, msg: &Msg) -> Result<()> {
        let bytes =
            proto::to_vec(msg).map_err(|e| XferError::conn(format!("encode frame: {e}")))?;
        self.send_frame(&bytes)
    }

    /// Sends `bytes`, a whole encoded frame (with its payload, if any), as one message,
    /// copied into a registered buffer.
    pub fn send_frame(&self, bytes: &[u8]) -> Result<()> {
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
                .map_err(|e| XferError::conn(format!("register send buffer: {e}")))?,
        };
        buf.write_at(0, bytes)
            .map_err(|e| XferError::conn(format!("fill send buffer: {e}")))?;
        let buf = buf
            .slice(..bytes.len())
            .map_err(|e| XferError::conn(format!("slice send buffer: {e}")))?;
        self.sock.send(buf, Flags::NONE, CTX_CONTROL);
        Ok(())
    }

    /// Receives the next message into `out` (resized to the message) and re-posts its
    /// buffer. Send completions met on the way are checked.
    pub fn recv_into(&mut self, out: &mut Vec<u8>) -> Result<()> {
        let (buf, len) = self.next_done()?;
        out.resize(len, 0);
        buf.buffer().read_at(buf.offset(), out);
        self.repost(buf)
    }

    /// Like [`Link::recv_into`], but `Ok(false)` when nothing arrived for about `wait`, so
    /// a caller can look at other things between waits.
    pub fn recv_within(&mut self, out: &mut Vec<u8>, wait: Duration) -> Result<bool> {
        let Some((buf, len)) = self.next_done_within(wait)? else {
            return Ok(false);
        };
        out.resize(len, 0);
        buf.buffer().read_at(buf.offset(), out);
        self.repost(buf)?;
        Ok(true)
    }

    /// Re-posts a delivered receive buffer (a fresh one if the ring grew since).
    fn repost(&mut self, buf: ExsBuf) -> Result<()> {
        let buf = if buf.len() < self.recv_size {
            alloc_aligned(&self.sock, self.recv_size, "receive buffer", Use::Recv)?
        } else {
            buf
        };
        self.sock.recv(buf, Flags::NONE, self.next_post);
        self.next_post += 1;
        Ok(())
    }

    /// The next received message in posting order (its buffer and length), waiting at most
    /// the link's timeout.
    fn next_done(&mut self) -> Result<(ExsBuf, usize)> {
        self.next_done_within(self.timeout)?.ok_or_else(|| {
            XferError::conn(format!(
                "the peer sent nothing for {} s; giving up",
                self.timeout.as_secs()
            ))
        })
    }

    /// The next received message in posting order, or `None` when nothing arrived for
    /// about `wait`. Send completions met on the way are checked.
    fn next_done_within(&mut self, wait: Duration) -> Result<Option<(ExsBuf, usize)>> {
        loop {
            if let Some(done) = self.done.remove(&self.next_deliver) {
                self.next_deliver += 1;
                return Ok(Some(done));
            }
            if self.next_post == self.next_deliver {
                return Err(XferError::conn("internal: receive with no buffer posted"));
            }
            let Some(ev) = self.q.dequeue(wait) else {
                return Ok(None);
            };
            match ev.kind {
                EventKind::Recv => {
                    ev.result.map_err(|e| exs_err("receive", e))?;
                    let buf = ev
                        .buf
                        .ok_or_else(|| XferError::conn("receive completed without its buffer"))?;
                    let len = usize::try_from(ev.len).unwrap_or(usize::MAX).min(buf.len());
                    self.done.insert(ev.ctx, (buf, len));
                }
                EventKind::Send => {
                    ev.result.map_err(|e| exs_err("send", e))?;
                    if let Some(b) = ev.buf {
                        let mut pool = self.ctrl_pool.lock().unwrap_or_else(|p| p.into_inner());
                        if pool.len() < 16 {
                            pool.push(ExsBuf::new(b.region().clone()));
                        }
                    }
                }
                EventKind::Close => {
                    return Err(match ev.result {
                        Err(e) => exs_err("connection", e),
                        Ok(()) => XferError::conn("the connection was closed"),
                    })
                }
                EventKind::Connect | EventKind::ReadNotify => {}
            }
        }
    }

    /// Receives the next message and runs `f` over its bytes in place, in the registered
    /// receive buffer (no copy), then re-posts the buffer.
    pub fn recv_with<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let (buf, len) = self.next_done()?;
        let out = buf.buffer().with_bytes(buf.offset(), len, f);
        self.repost(buf)?;
        Ok(out)
    }

    /// Receives and decodes the next control frame (a BLOCK is an error here).
    pub fn recv_msg(&mut self) -> Result<Msg> {
        let mut v = Vec::new();
        self.recv_into(&mut v)?;
        decode_control(&v)
    }

    /// Like [`Link::recv_msg`], but the buffer is not posted again: for the handshake's
    /// frame, after which the caller posts its ring sized for the agreed block (re-posted,
    /// the handshake's small buffer would be the next to fill, and the first message after
    /// the handshake may be a whole file).
    pub fn recv_first_msg(&mut self) -> Result<Msg> {
        let (buf, len) = self.next_done()?;
        let mut v = vec![0; len];
        buf.buffer().read_at(buf.offset(), &mut v);
        decode_control(&v)
    }

    /// Like [`Link::recv_first_msg`], but `Ok(None)` when nothing arrived for about
    /// `wait`, so a caller can look at a deadline or a cancel flag between waits.
    pub fn recv_first_within(&mut self, wait: Duration) -> Result<Option<Msg>> {
        let Some((buf, len)) = self.next_done_within(wait)? else {
            return Ok(None);
        };
        let mut v = vec![0; len];
        buf.buffer().read_at(buf.offset(), &mut v);
        decode_control(&v).map(Some)
    }

    /// The largest message the posted buffers take.
    pub fn recv_size(&self) -> usize {
        self.recv_size
    }

    /// Closes the connection (the peer sees it closed).
    pub fn close(&self) {
        let _ = self.sock.close();
    }
}

/// Decodes a control frame (a BLOCK is an error here).
fn decode_control(v: &[u8]) -> Result<Msg> {
    let (msg, _) =
        proto::decode(v).map_err(|e| XferError::conn(format!("the peer sent a bad frame: {e}")))?;
    if matches!(msg, Msg::Block(_)) {
        return Err(XferError::conn("unexpected BLOCK frame"));
    }
    Ok(msg)
}

/// Test hook: `FERRY_TEST_CORRUPT_BLOCKS=N` flips a byte in the first N blocks this process
/// sends (after their CRC was computed), so tests can watch the receiver catch and re-fetch
/// them. Unset in normal use.
fn corrupt_this_block() -> bool {
    static SENT: AtomicU64 = AtomicU64::new(0);
    static LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let limit = *LIMIT.get_or_init(|| {
        std::env::var("FERRY_TEST_CORRUPT_BLOCKS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
    limit > 0 && SENT.fetch_add(1, Ordering::Relaxed) < limit
}

/// Where the bytes of a sent range come from.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// A file, read at the range's offsets.
    File(&'a std::fs::File),
    /// Zeros (memory-to-memory mode: no file is read).
    Zero,
}

/// A registered-size buffer of zeros, shared by every sender of a process, to clear a
/// staging block from.
fn zero_block(len: usize) -> ferry_fabric::Buffer {
    static ZEROS: std::sync::Mutex<Option<ferry_fabric::Buffer>> = std::sync::Mutex::new(None);
    let mut z = ZEROS.lock().unwrap_or_else(|p| p.into_inner());
    match &*z {
        Some(b) if b.len() >= len => b.clone(),
        _ => {
            let b = ferry_fabric::Buffer::new(len);
            b.fill(0);
            *z = Some(b.clone());
            b
        }
    }
}

/// A byte range of one transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// The transfer.
    pub file_id: u32,
    /// First byte.
    pub offset: u64,
    /// Length.
    pub len: u64,
}

/// The sending half of the staging ring: reads file ranges into registered blocks and
/// sends them as BLOCK frames (see the module documentation).
pub struct BlockSender {
    dq: EventQueue,
    free: Vec<ExsBuf>,
    allocated: usize,
    in_flight: usize,
    ring: usize,
    block: usize,
    /// Staging blocks (by address) whose payload area holds only zeros.
    zeroed: std::collections::HashSet<usize>,
    /// CRC-32C of the last length of zeros sent: a zero source's blocks all carry the same
    /// one, and computing it per block was 40 % of a memory-mode server's CPU.
    zero_crc: Option<(usize, u32)>,
    timeout: Duration,
    /// Blocks sent.
    pub blocks: u64,
    /// Read files with direct I/O (`O_DIRECT`, bypassing the page cache) where the
    /// filesystem allows it; the unaligned tail of a file is read through the cache.
    pub direct: bool,
    /// Send a whole file that fits in a block as one FILE frame (a 1.3 peer).
    pub inline: bool,
    /// Gather FILE frames into PACK frames (a 1.4 peer).
    pub packing: bool,
    /// The PACK being filled.
    pack: Option<Pack>,
}

impl BlockSender {
    /// A sender of blocks of at most `block` bytes, with at most `ring` in flight; it keeps
    /// its registered blocks for the next ranges it sends.
    pub fn new(block: u32, ring: usize, timeout: Duration) -> Result<Self> {
        Ok(BlockSender {
            dq: EventQueue::new().map_err(|e| XferError::io("create event queue", &e))?,
            free: Vec::new(),
            allocated: 0,
            in_flight: 0,
            ring: ring.max(1),
            block: block as usize,
            zeroed: std::collections::HashSet::new(),
            zero_crc: None,
            timeout,
            blocks: 0,
            direct: false,
            inline: false,
            packing: false,
            pack: None,
        })
    }

    fn reap_one(&mut self) -> Result<()> {
        let ev = self
            .dq
            .dequeue(self.timeout)
            .ok_or_else(|| XferError::conn("the peer stopped taking data; giving up"))?;
        if ev.kind == EventKind::Send {
            self.in_flight -= 1;
        }
        ev.result.map_err(|e| exs_err("send block", e))?;
        if let Some(buf) = ev.buf {
            // The send used part of the block; keep the whole block.
            self.free.push(ExsBuf::new(buf.region().clone()));
        }
        Ok(())
    }

    fn take_block(&mut self, sock: &ExsSocket) -> Result<ExsBuf> {
        loop {
            if let Some(b) = self.free.pop() {
                return b
                    .slice(HEAD_ROOM - BLOCK_HEADER_LEN..)
                    .map_err(|e| XferError::conn(format!("slice staging block: {e}")));
            }
            if self.allocated < self.ring {
                self.allocated += 1;
                return alloc_aligned(
                    sock,
                    BLOCK_HEADER_LEN + self.block,
                    "staging block",
                    Use::Send,
                );
            }
            self.reap_one()?;
        }
    }

    /// Sends `span` of `src` as BLOCK frames of `span.file_id`, feeding every byte read to
    /// `hasher` in order, and `progress` with each block's length. Each block is read straight
    /// into its registered staging block (no copy; a zero source's blocks are zeroed once),
    /// and its CRC-32C is computed there. For ranges of more than two blocks with staging
    /// threads on, the hash runs on its own thread, fed copies of the blocks, so reading, CRC
    /// and hashing overlap.
    pub fn send_range(
        &mut self,
        link: &Link,
        src: Source<'_>,
        span: Span,
        hasher: Option<&mut blake3::Hasher>,
        progress: &dyn Fn(u64),
    ) -> Result<()> {
        match hasher {
            Some(h) if span.len > 2 * self.block as u64 && staging_threads() => {
                std::thread::scope(|s| {
                    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(self.ring);
                    let (back_tx, back_rx) = std::sync::mpsc::channel::<Vec<u8>>();
                    let worker = s.spawn(move || {
                        for v in rx {
                            h.update(&v);
                            let _ = back_tx.send(v);
                        }
                    });
                    let res = self.send_blocks(
                        link,
                        src,
                        span,
                        &mut |b: &[u8]| {
                            let mut v = back_rx.try_recv().unwrap_or_default();
                            v.clear();
                            v.extend_from_slice(b);
                            tx.send(v)
                                .map_err(|_| XferError::conn("the hashing thread stopped"))
                        },
                        progress,
                    );
                    drop(tx);
                    let joined = worker.join();
                    res?;
                    joined.map_err(|_| XferError::conn("the hashing thread failed"))
                })
            }
            Some(h) => self.send_blocks(
                link,
                src,
                span,
                &mut |b: &[u8]| {
                    h.update(b);
                    Ok(())
                },
                progress,
            ),
            None => self.send_blocks(link, src, span, &mut |_: &[u8]| Ok(()), progress),
        }
    }

    fn send_blocks(
        &mut self,
        link: &Link,
        src: Source<'_>,
        span: Span,
        after_read: &mut dyn FnMut(&[u8]) -> Result<()>,
        progress: &dyn Fn(u64),
    ) -> Result<()> {
        let mut pos = span.offset;
        let end = span.offset.saturating_add(span.len);
        let mut direct = None;
        if let Source::File(file) = src {
            if self.direct {
                direct = open_direct_or_warn(file, false);
            } else {
                // A larger kernel readahead window for the whole range (advice only).
                let _ = rustix::fs::fadvise(
                    file,
                    span.offset,
                    std::num::NonZeroU64::new(span.len),
                    rustix::fs::Advice::Sequential,
                );
            }
        }
        while pos < end {
            let n = (end - pos).min(self.block as u64) as usize;
            let buf = self.take_block(&link.sock)?;
            let mem = buf.buffer();
            let at = buf.offset() + BLOCK_HEADER_LEN;
            if buf.len() < BLOCK_HEADER_LEN + n {
                return Err(XferError::conn("internal: staging block too small"));
            }
            match src {
                Source::File(file) => {
                    self.zeroed.remove(&buf.addr());
                    let aligned = direct_aligned(buf.addr() + BLOCK_HEADER_LEN, pos, n);
                    let read = match &direct {
                        Some(d) if aligned => mem.read_file_at(at, n, d, pos),
                        _ => {
                            // The disk reads the next block while this one is read, checked
                            // and sent.
                            let next = pos + n as u64;
                            if next < end && direct.is_none() {
                                let _ = rustix::fs::fadvise(
                                    file,
                                    next,
                                    std::num::NonZeroU64::new((end - next).min(self.block as u64)),
                                    rustix::fs::Advice::WillNeed,
                                );
                            }
                            mem.read_file_at(at, n, file, pos)
                        }
                    };
                    read.map_err(|e| XferError::io(format!("read at offset {pos}"), &e))?;
                    if pos == span.offset {
                        ferry_service::stamp::test_pause_after_read();
                    }
                }
                Source::Zero => {
                    if self.zeroed.insert(buf.addr()) {
                        mem.copy_from(at, &zero_block(self.block), 0, self.block);
                    }
                }
            }
            // A zero source's staging blocks hold zeros (`zeroed`), so one CRC serves them all.
            let zero_crc = match (src, self.zero_crc) {
                (Source::Zero, Some((len, crc))) if len == n => Some(crc),
                _ => None,
            };
            let crc = mem.with_bytes(at, n, |b| -> Result<u32> {
                after_read(b)?;
                Ok(zero_crc.unwrap_or_else(|| crc32c::crc32c(b)))
            })?;
            if matches!(src, Source::Zero) {
                self.zero_crc = Some((n, crc));
            }
            let h = BlockHeader {
                file_id: span.file_id,
                stream: 0,
                offset: pos,
                len: n as u32,
                crc32c: crc,
            };
            let head = proto::encode_block_header(&h)
                .map_err(|e| XferError::conn(format!("encode block: {e}")))?;
            buf.write_at(0, &head)
                .map_err(|e| XferError::conn(format!("fill staging block: {e}")))?;
            if corrupt_payload(&buf, BLOCK_HEADER_LEN, n) {
                self.zeroed.remove(&buf.addr());
            }
            let msg = buf
                .slice(..BLOCK_HEADER_LEN + n)
                .map_err(|e| XferError::conn(format!("slice staging block: {e}")))?;
            self.send_staged(link, msg);
            progress(n as u64);
            pos += n as u64;
        }
        Ok(())
    }

    /// Whether a file of `size` bytes fits in one FILE frame (header and payload in one
    /// staging block, and in one of the peer's receive buffers of the same size).
    pub fn file_fits(&self, size: u64) -> bool {
        size.saturating_add(proto::FILE_HEADER_LEN as u64) <= (BLOCK_HEADER_LEN + self.block) as u64
    }

    /// Sends the whole of `file` (`size` bytes, [`BlockSender::file_fits`]) as one FILE
    /// frame of `file_id`: read with one `pread` into a registered staging block, its
    /// CRC-32C and BLAKE3 computed there, sent without a copy. With [`BlockSender::packing`]
    /// the frame joins the open PACK (a new one when it does not fit), which leaves at
    /// [`BlockSender::flush_pack`] or when it is full. `unchanged` runs once the file was
    /// read: if it fails (the source changed, [`ferry_service::stamp`]), the frame is not sent.
    pub fn send_file(
        &mut self,
        link: &Link,
        file: &std::fs::File,
        file_id: u32,
        mode: u32,
        size: u64,
        unchanged: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let n = usize::try_from(size)
            .ok()
            .filter(|_| self.file_fits(size))
            .ok_or_else(|| XferError::conn("internal: file too large for one FILE frame"))?;
        let frame = proto::FILE_HEADER_LEN + n;
        let room = |p: &Pack| p.count < u16::MAX && p.packed() && p.fill + frame <= p.buf.len();
        if self.pack.as_ref().is_some_and(|p| !room(p)) {
            self.flush_pack(link)?;
        }
        let mut pack = match self.pack.take() {
            Some(p) => p,
            None => {
                let buf = self.take_block(&link.sock)?;
                self.zeroed.remove(&buf.addr());
                // Packed, frames follow the PACK header; a frame that leaves no room for
                // it goes alone, bare, from the block's start.
                let packed = self.packing && proto::PACK_HEADER_LEN + frame <= buf.len();
                let start = if packed { proto::PACK_HEADER_LEN } else { 0 };
                Pack {
                    buf,
                    start,
                    fill: start,
                    count: 0,
                }
            }
        };
        if pack.fill + frame > pack.buf.len() {
            return Err(XferError::conn("internal: staging block too small"));
        }
        let at = pack.fill;
        let filled =
            fill_file_frame(&pack.buf, at, file, file_id, mode, n).and_then(|()| unchanged());
        if let Err(e) = filled {
            // Nothing of this file is in the block: what it held before still goes.
            if pack.count > 0 {
                self.pack = Some(pack);
            } else {
                self.free.push(ExsBuf::new(pack.buf.region().clone()));
            }
            return Err(e);
        }
        pack.fill += frame;
        pack.count += 1;
        let full = !pack.packed();
        self.pack = Some(pack);
        if full {
            return self.flush_pack(link);
        }
        Ok(())
    }

    /// Whether a file of `size` bytes uploaded to `path` fits in one PUT_FILE frame.
    pub fn put_file_fits(&self, path: &str, size: u64) -> bool {
        size.saturating_add(proto::put_file_header_len(path) as u64)
            <= (BLOCK_HEADER_LEN + self.block) as u64
    }

    /// Sends the whole of `file` ([`BlockSender::put_file_fits`]) to `path` as one PUT_FILE
    /// frame of `file_id` with `flags` (PUT_FILE's): read with one `pread` into a registered
    /// staging block, its BLAKE3 computed there, sent without a copy. A source that changed
    /// since `meta` was taken ([`ferry_service::stamp`]) is not sent: an integrity error.
    pub fn send_put_file(
        &mut self,
        link: &Link,
        file: &std::fs::File,
        (file_id, flags): (u32, u8),
        path: &str,
        meta: &FileMeta,
    ) -> Result<()> {
        let (size, mode, mtime) = (meta.size, meta.mode, meta.mtime);
        let n = usize::try_from(size)
            .ok()
            .filter(|_| self.put_file_fits(path, size))
            .ok_or_else(|| XferError::conn("internal: file too large for one PUT_FILE frame"))?;
        let head_len = proto::put_file_header_len(path);
        let buf = self.take_block(&link.sock)?;
        self.zeroed.remove(&buf.addr());
        let read =
            read_payload(&buf, head_len, file, n).and_then(|()| meta.stamp.check(file, path));
        if let Err(e) = read {
            self.free.push(ExsBuf::new(buf.region().clone()));
            return Err(e);
        }
        let blake3 = buf
            .buffer()
            .with_bytes(buf.offset() + head_len, n, |b| *blake3::hash(b).as_bytes());
        let msg = Msg::PutFile {
            flags,
            file_id,
            mode,
            mtime,
            blake3,
            path: path.to_string(),
            len: n as u32,
        };
        let head = proto::to_vec(&msg).map_err(|e| XferError::conn(format!("encode: {e}")))?;
        buf.write_at(0, &head)
            .map_err(|e| XferError::conn(format!("fill staging block: {e}")))?;
        corrupt_payload(&buf, head_len, n);
        let msg = buf
            .slice(..head_len + n)
            .map_err(|e| XferError::conn(format!("slice staging block: {e}")))?;
        self.send_staged(link, msg);
        Ok(())
    }

    /// Sends the open PACK, if any: as a PACK frame, or as the bare FILE frame when it holds
    /// only one. The server calls it before any other frame and before it waits for requests,
    /// so answers leave in request order.
    pub fn flush_pack(&mut self, link: &Link) -> Result<()> {
        let Some(p) = self.pack.take() else {
            return Ok(());
        };
        ferry_fabric::timeline::mark("srv.pack", u64::from(p.count));
        let msg = if p.count == 1 {
            p.buf.slice(p.start..p.fill)
        } else {
            let frames = (p.fill - p.start) as u32;
            let head = proto::encode_pack_header(p.count, frames)
                .map_err(|e| XferError::conn(format!("encode pack: {e}")))?;
            p.buf
                .write_at(0, &head)
                .map_err(|e| XferError::conn(format!("fill staging block: {e}")))?;
            p.buf.slice(..p.fill)
        }
        .map_err(|e| XferError::conn(format!("slice staging block: {e}")))?;
        self.send_staged(link, msg);
        Ok(())
    }

    /// Sends `msg`, a slice of a staging block, counting it in flight until its completion
    /// hands the block back.
    fn send_staged(&mut self, link: &Link, msg: ExsBuf) {
        link.sock
            .send_to(Some(&self.dq), msg, 0, Flags::NONE, self.blocks);
        self.in_flight += 1;
        self.blocks += 1;
    }

    /// Waits until every block sent has completed.
    pub fn flush(&mut self) -> Result<()> {
        while self.in_flight > 0 {
            self.reap_one()?;
        }
        Ok(())
    }

    /// Gives up sending file `file_id` because of `e`: lets the blocks sent go, tells the
    /// peer (which drops what it received of the file) and returns `e`. Best effort: the
    /// link may be what failed.
    pub fn abandon<T>(&mut self, link: &Link, file_id: u32, e: XferError) -> Result<T> {
        let _ = self.flush();
        let _ = link.send(&Msg::Error {
            code: crate::error::code_of(&e),
            file_id,
            message: e.msg.clone(),
        });
        Err(e)
    }
}

/// What a PUT_FILE says of its file besides the bytes.
#[derive(Debug, Clone, Copy)]
pub struct FileMeta {
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, nanoseconds since the epoch.
    pub mtime: i64,
    /// The file's identity when it was opened: checked again once it has been read, before
    /// the receiver may commit it (see [`ferry_service::stamp`]).
    pub stamp: ferry_service::stamp::Stamp,
}

/// A staging block filling with FILE frames (see [`BlockSender::send_file`]).
struct Pack {
    buf: ExsBuf,
    /// Where the first frame starts: after the PACK header's room, or 0 for a bare frame.
    start: usize,
    /// Bytes used, from the block's start.
    fill: usize,
    /// FILE frames in it.
    count: u16,
}

impl Pack {
    /// Whether more frames may join (else it holds one bare frame).
    fn packed(&self) -> bool {
        self.start > 0
    }
}

/// Reads `n` bytes of `file` into `buf` at `at + FILE_HEADER_LEN` and writes the FILE
/// frame's header (CRC-32C and BLAKE3 of those bytes) at `at`.
fn fill_file_frame(
    buf: &ExsBuf,
    at: usize,
    file: &std::fs::File,
    file_id: u32,
    mode: u32,
    n: usize,
) -> Result<()> {
    let data = at + proto::FILE_HEADER_LEN;
    read_payload(buf, data, file, n)?;
    let (crc, hash) = buf.buffer().with_bytes(buf.offset() + data, n, |b| {
        (crc32c::crc32c(b), *blake3::hash(b).as_bytes())
    });
    let head = proto::encode_file_header(file_id, mode, crc, hash, n as u32)
        .map_err(|e| XferError::conn(format!("encode file: {e}")))?;
    buf.write_at(at, &head)
        .map_err(|e| XferError::conn(format!("fill staging block: {e}")))?;
    corrupt_payload(buf, data, n);
    Ok(())
}

/// Reads the first `n` bytes of `file` into `buf` at `at` (one `pread`).
fn read_payload(buf: &ExsBuf, at: usize, file: &std::fs::File, n: usize) -> Result<()> {
    if n > 0 {
        buf.buffer()
            .read_file_at(buf.offset() + at, n, file, 0)
            .map_err(|e| XferError::io("read", &e))?;
    }
    Ok(())
}

/// The test hook: flips the first byte of the `n`-byte payload at `at` of `buf`, after its
/// checksums were computed, while `FERRY_TEST_CORRUPT_BLOCKS` allows. True if it did.
fn corrupt_payload(buf: &ExsBuf, at: usize, n: usize) -> bool {
    if n == 0 || !corrupt_this_block() {
        return false;
    }
    let first = buf.buffer().with_bytes(buf.offset() + at, 1, |b| b[0]);
    let _ = buf.write_at(at, &[first ^ 0xff]);
    true
}

/// Blocks larger files get a writer thread for; smaller ones are written inline.
const THREADED_MIN: u64 = 2 * crate::DEFAULT_BLOCK as u64;

/// Whether the staging ring runs its helper threads (the receiver's disk writer, the
/// sender's hasher) or does that work on the network thread. `FERRY_STAGING_THREADS=on|off`
/// decides; by default they run on hosts with at least 4 CPUs, because on fewer cores the
/// extra threads share them with the EXS progress threads and the hand-offs cost more than
/// the overlap gains (the measurement is in `docs/xfer.md`, "Tuning").
pub fn staging_threads() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("FERRY_STAGING_THREADS").as_deref() {
        Ok("on") | Ok("1") => true,
        Ok("off") | Ok("0") => false,
        _ => std::thread::available_parallelism().is_ok_and(|n| n.get() >= 4),
    })
}

/// The writer's answer to a sync: CRC failures since the last one, or what stopped it.
type SyncReply = (Vec<(u64, u32)>, Option<XferError>);

enum ToWriter {
    /// A block, its payload at `bytes[at..]` (a whole received frame, or the payload alone).
    Block {
        block: Block,
        bytes: Vec<u8>,
        at: usize,
    },
    Sync(std::sync::mpsc::SyncSender<SyncReply>),
}

/// The receiving half of the staging ring: BLOCK messages go to a disk writer thread through
/// a channel bounded by the ring depth (so a slow disk stops the network thread re-posting
/// receive buffers, which stalls the sender), and the message buffers come back for reuse.
/// The writer checks each block's CRC-32C, `pwrite`s the good ones and hashes the file in
/// order ([`BlockSink`]). Files up to two blocks are written inline.
pub struct BlockWriter {
    inner: WriterKind,
    /// Spare message buffers.
    pool: std::sync::mpsc::Receiver<Vec<u8>>,
}

enum WriterKind {
    /// `None` for the null sink.
    Inline(
        Box<BlockSink>,
        Option<std::fs::File>,
        std::sync::mpsc::Sender<Vec<u8>>,
    ),
    Thread {
        tx: std::sync::mpsc::SyncSender<ToWriter>,
        handle: std::thread::JoinHandle<BlockSink>,
    },
}

impl BlockWriter {
    /// A writer of transfer `file_id` (`size` bytes) into `file` (a duplicate handle is
    /// kept; the caller's stays usable), with at most `ring` blocks queued.
    pub fn new(file_id: u32, size: u64, file: &std::fs::File, ring: usize) -> Result<Self> {
        Self::with_sink(BlockSink::new(file_id, size), file, ring)
    }

    /// A writer feeding `sink` (e.g. one that journals, [`BlockSink::journaled`]).
    pub fn with_sink(sink: BlockSink, file: &std::fs::File, ring: usize) -> Result<Self> {
        let size = sink.size();
        let file = file
            .try_clone()
            .map_err(|e| XferError::io("duplicate file handle", &e))?;
        let (back_tx, pool) = std::sync::mpsc::channel();
        if size < THREADED_MIN || !staging_threads() {
            return Ok(BlockWriter {
                inner: WriterKind::Inline(Box::new(sink), Some(file), back_tx),
                pool,
            });
        }
        let (tx, rx) = std::sync::mpsc::sync_channel::<ToWriter>(ring.max(1));
        let handle = std::thread::Builder::new()
            .name("ferry-writer".into())
            .spawn(move || {
                let mut sink = sink;
                let mut fatal: Option<XferError> = None;
                for m in rx {
                    match m {
                        ToWriter::Block { block, bytes, at } => {
                            if fatal.is_none() {
                                if let Err(e) = sink.block(Some(&file), &block, &bytes[at..]) {
                                    fatal = Some(e);
                                }
                            }
                            let _ = back_tx.send(bytes);
                        }
                        ToWriter::Sync(reply) => {
                            let _ = reply.send((std::mem::take(&mut sink.bad), fatal.take()));
                        }
                    }
                }
                sink
            })
            .map_err(|e| XferError::io("start writer thread", &e))?;
        Ok(BlockWriter {
            inner: WriterKind::Thread { tx, handle },
            pool,
        })
    }

    /// The null sink of memory mode for transfer `file_id` (`size` bytes): every block's
    /// CRC-32C and bounds are checked, nothing is written or hashed.
    pub fn null(file_id: u32, size: u64) -> Self {
        Self::null_sink(BlockSink::new(file_id, size))
    }

    /// The null sink feeding `sink` (e.g. one range of a parallel transfer).
    pub fn null_sink(sink: BlockSink) -> Self {
        let (back_tx, pool) = std::sync::mpsc::channel();
        BlockWriter {
            inner: WriterKind::Inline(Box::new(sink), None, back_tx),
            pool,
        }
    }

    /// Takes a whole file that came in one FILE frame, checked against the file's BLAKE3
    /// instead of its CRC (see [`BlockSink::whole_file`]).
    pub fn push_file(&mut self, h: &BlockHeader, payload: &[u8], blake3: &[u8; 32]) -> Result<()> {
        match &mut self.inner {
            WriterKind::Inline(sink, file, _) => {
                sink.whole_file(file.as_ref(), &block_of(h), payload, blake3)
            }
            WriterKind::Thread { .. } => self.push_block(h, payload),
        }
    }

    /// Checks and writes one block given as its decoded header and its payload (in place in
    /// the receive buffer, or the block of a FILE frame): on the calling thread, or for a
    /// threaded writer with the payload copied to it. The frame is decoded once, by the caller.
    pub fn push_block(&mut self, h: &BlockHeader, payload: &[u8]) -> Result<()> {
        match &mut self.inner {
            WriterKind::Inline(sink, file, _) => sink.block(file.as_ref(), &block_of(h), payload),
            WriterKind::Thread { .. } => {
                let mut v = self.spare();
                v.clear();
                v.extend_from_slice(payload);
                self.push(h, v, 0)
            }
        }
    }

    /// A buffer to receive the next message into.
    pub fn spare(&self) -> Vec<u8> {
        self.pool.try_recv().unwrap_or_default()
    }

    /// Hands over one block whose header the caller decoded, its payload at `bytes[at..]`
    /// (the received frame itself, no copy); blocks while the ring is full.
    pub fn push(&mut self, h: &BlockHeader, bytes: Vec<u8>, at: usize) -> Result<()> {
        let block = block_of(h);
        match &mut self.inner {
            WriterKind::Inline(sink, file, back) => {
                let res = sink.block(file.as_ref(), &block, &bytes[at..]);
                let _ = back.send(bytes);
                res
            }
            WriterKind::Thread { tx, .. } => tx
                .send(ToWriter::Block { block, bytes, at })
                .map_err(|_| XferError::conn("the disk writer thread stopped")),
        }
    }

    /// Waits until every block handed over is written, and takes the ranges whose CRC
    /// failed since the last call.
    pub fn sync(&mut self) -> Result<Vec<(u64, u32)>> {
        match &mut self.inner {
            WriterKind::Inline(sink, _, _) => Ok(std::mem::take(&mut sink.bad)),
            WriterKind::Thread { tx, .. } => {
                let (rtx, rrx) = std::sync::mpsc::sync_channel(1);
                tx.send(ToWriter::Sync(rtx))
                    .map_err(|_| XferError::conn("the disk writer thread stopped"))?;
                let (bad, fatal) = rrx
                    .recv()
                    .map_err(|_| XferError::conn("the disk writer thread stopped"))?;
                match fatal {
                    Some(e) => Err(e),
                    None => Ok(bad),
                }
            }
        }
    }

    /// Stops the writer and returns its sink (write errors, including those of its
    /// background checkpoints, and hash state).
    pub fn finish(self) -> Result<BlockSink> {
        let mut sink = match self.inner {
            WriterKind::Inline(sink, _, _) => *sink,
            WriterKind::Thread { tx, handle } => {
                drop(tx);
                handle
                    .join()
                    .map_err(|_| XferError::conn("the disk writer thread failed"))?
            }
        };
        sink.settle();
        Ok(sink)
    }
}

/// What the floor's sink needs of a BLOCK header (the stream number only routes it here).
fn block_of(h: &BlockHeader) -> Block {
    Block {
        transfer: h.file_id,
        offset: h.offset,
        len: h.len,
        crc32c: h.crc32c,
    }
}
