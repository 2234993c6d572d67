//! The Rust API of the block fabric path: a session with one export of a `ferry serve`,
//! reads and writes at offsets, flush, trim, zeroes.
//!
//! A call's bytes are cut into requests of at most the delegated chunk size and kept
//! in flight up to the server's credits (queue depth), so one large call is a pipelined
//! sequential stream. Under delegation a write copies into the chunk's local staging
//! buffer, RMA-writes it into the server's chunk, then names the chunk; a read has the
//! server fill the chunk and RMA-reads it back ([`ReadMode::ServerFill`]), or names the
//! staging buffer, which the server RMA-writes ([`ReadMode::ServerWrite`]).
//!
//! ```no_run
//! use ferry_block::deleg::client::{Client, Options};
//! # fn run() -> ferry_service::Result<()> {
//! let mut c = Client::connect("ofi+shm://ferry", &Options::new("disk"))?;
//! c.write_at(0, &[7u8; 1 << 20], false)?;
//! let mut back = vec![0u8; 1 << 20];
//! c.read_at(0, &mut back)?;
//! c.flush()?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::time::Duration;

use ferry_exs::proto::EventKind;
use ferry_exs::runtime::{EventQueue, ExsBuf};
use ferry_fabric::{Access, RemoteSlice};
use ferry_service::channel::Channel;
use ferry_service::secure::ClientSecurity;
use ferry_service::{Error, Kind, Result};

use super::pool::FirstFit;
use super::proto::{self, rflag, Cmd, Data, Msg, ReadMode, Scheme};

/// How a client connects.
#[derive(Debug, Clone)]
pub struct Options {
    /// The export's name.
    pub export: String,
    /// The token (empty: none).
    pub token: String,
    /// How data moves.
    pub scheme: Scheme,
    /// How reads move under delegation.
    pub read: ReadMode,
    /// Ask the server to rotate a chunk's key after each I/O on it.
    pub always_invalidate: bool,
    /// TLS (or clear) and the server's identity.
    pub security: ClientSecurity,
    /// How long the connection, and each wait for the server, may take.
    pub timeout: Duration,
}

impl Options {
    /// Zero-copy delegation with the default read scheme, TLS as
    /// [`ClientSecurity::default`] says, for `export`.
    pub fn new(export: &str) -> Options {
        Options {
            export: export.to_string(),
            token: String::new(),
            scheme: Scheme::Delegated,
            read: DEFAULT_READ,
            always_invalidate: false,
            security: ClientSecurity::default(),
            timeout: Duration::from_secs(30),
        }
    }
}

/// The read scheme a client asks for unless told otherwise: the faster of the two as
/// measured (`docs/block.md`, "The RDMA path").
pub const DEFAULT_READ: ReadMode = ReadMode::ServerWrite;

/// What a request in flight waits for.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// A write (its slot is freed by the reply).
    Write { slot: u16 },
    /// A read into `dst[at..at + len]` through slot `slot`.
    Read { slot: u16, at: usize, len: usize },
    /// FLUSH, TRIM, WRITE_ZEROES.
    Plain { slot: u16 },
}

/// What an RMA of the client's waits to do once complete.
#[derive(Debug, Clone, Copy)]
enum Rma {
    /// The write's data is in the chunk: send the WRITE.
    Written { offset: u64, len: u32, fua: bool },
    /// The chunk's data is in the staging buffer: copy it to `dst[at..]`.
    Read { at: usize, len: usize },
}

/// A session with one export.
pub struct Client {
    ch: Channel,
    /// Where this client's own RMAs complete.
    rq: EventQueue,
    size: u64,
    readonly: bool,
    chunk_size: u32,
    scheme: Scheme,
    read: ReadMode,
    /// The delegated chunks (their current keys).
    chunks: Vec<RemoteSlice>,
    /// One registered staging buffer per slot (absent while an RMA holds it).
    staging: Vec<Option<ExsBuf>>,
    /// The staging buffers' remote ranges (RTRS reads name them).
    staging_remote: Vec<RemoteSlice>,
    slots: FirstFit,
    inflight: HashMap<u64, Op>,
    rmas: HashMap<u16, Rma>,
    next_handle: u64,
    /// The first error a request of the current call got.
    failed: Option<Error>,
}

impl Client {
    /// Connects to the `ferry serve` at `addr` (`tcp://h:p`, `ofi+tcp://h:p`,
    /// `ofi+shm://name`), selects its `block` face and opens `opts.export`.
    pub fn connect(addr: &str, opts: &Options) -> Result<Client> {
        let mut ch = Channel::connect_with(addr, opts.timeout, &opts.security)?;
        ch.timeout = opts.timeout;
        let sealed = ch.secure().is_some();
        ch.select(addr, super::SERVICE, if sealed { &opts.token } else { "" })?;
        ch.post_ring(1, 2 * proto::MAX_TEXT + 64)?;
        ch.send_frame(&proto::encode(&Msg::Hello {
            major: proto::VERSION_MAJOR,
            minor: proto::VERSION_MINOR,
            scheme: opts.scheme,
            read: opts.read,
            always_invalidate: opts.always_invalidate,
            export: opts.export.clone(),
            // Over TLS the SELECT proved the token; it never crosses.
            token: if sealed {
                String::new()
            } else {
                opts.token.clone()
            },
        }))?;
        // Not posted again: the ring for the replies, posted next, is sized for the
        // largest (a whole chunk's READ under the copy scheme).
        let frame = ch.recv_first()?;
        let (size, readonly, credits, chunk_size, chunks) = match proto::decode(&frame) {
            Ok(Msg::Delegate {
                major,
                size,
                readonly,
                credits,
                chunk_size,
                chunks,
                ..
            }) if major == proto::VERSION_MAJOR => (size, readonly, credits, chunk_size, chunks),
            Ok(Msg::Error { message }) => {
                return Err(Error::new(Kind::Auth, format!("{addr}: {message}")))
            }
            Ok(m) => return Err(Error::conn(format!("{addr}: expected DELEGATE, got {m:?}"))),
            Err(e) => return Err(Error::conn(format!("{addr}: {e}"))),
        };
        let slots = match opts.scheme {
            Scheme::Delegated if chunks.is_empty() => {
                return Err(Error::conn(format!("{addr} delegated no chunks")))
            }
            Scheme::Delegated => chunks.len().min(usize::from(credits)),
            Scheme::Copy => usize::from(credits),
        };
        let reply_max = proto::HEADER_LEN
            + proto::REPLY_LEN
            + RemoteSlice::WIRE_LEN
            + match opts.scheme {
                Scheme::Copy => chunk_size as usize,
                Scheme::Delegated => 0,
            };
        ch.post_ring(slots, reply_max.max(2 * proto::MAX_TEXT + 64))?;
        let mut c = Client {
            rq: EventQueue::new().map_err(|e| Error::io("create event queue", &e))?,
            ch,
            size,
            readonly,
            chunk_size,
            scheme: opts.scheme,
            read: opts.read,
            chunks,
            staging: Vec::new(),
            staging_remote: Vec::new(),
            slots: FirstFit::new(slots),
            inflight: HashMap::new(),
            rmas: HashMap::new(),
            next_handle: 1,
            failed: None,
        };
        if c.scheme == Scheme::Delegated {
            c.register_staging(slots)?;
        }
        Ok(c)
    }

    /// One registered staging buffer per slot; under RTRS the server may write into them
    /// (granted on this connection only).
    fn register_staging(&mut self, slots: usize) -> Result<()> {
        let rtrs = self.read == ReadMode::ServerWrite;
        let access = if rtrs {
            Access::REMOTE_WRITE
        } else {
            Access::LOCAL
        };
        let sock = self.ch.socket();
        for _ in 0..slots {
            let buf = sock
                .alloc_with(self.chunk_size as usize, access)
                .map_err(|e| Error::conn(format!("register a staging buffer: {e}")))?;
            if rtrs {
                sock.grant(&buf)
                    .map_err(|e| Error::conn(format!("grant a staging buffer: {e}")))?;
            }
            let remote = buf
                .region()
                .remote(..)
                .map_err(|e| Error::conn(format!("a staging buffer's range: {e}")))?;
            self.staging.push(Some(buf));
            self.staging_remote.push(remote);
        }
        Ok(())
    }

    /// The export's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether the export refuses writes.
    pub fn readonly(&self) -> bool {
        self.readonly
    }

    /// The largest single request (bytes): the delegated chunk size.
    pub fn chunk_size(&self) -> u32 {
        self.chunk_size
    }

    /// Writes `data` at `offset`; with `fua`, durable when this returns.
    pub fn write_at(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.check_range(offset, data.len() as u64)?;
        let step = self.chunk_size as usize;
        for (i, piece) in data.chunks(step).enumerate() {
            let off = offset + (i * step) as u64;
            let slot = self.take_slot(&mut [])?;
            self.start_write(slot, off, piece, fua)?;
        }
        self.finish(&mut [])
    }

    /// Fills `buf` from `offset`.
    pub fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let step = self.chunk_size as usize;
        let mut at = 0;
        while at < buf.len() {
            let len = step.min(buf.len() - at);
            let slot = self.take_slot(buf)?;
            self.start_read(slot, offset + at as u64, at, len)?;
            at += len;
        }
        self.finish(buf)
    }

    /// Makes every acknowledged write durable.
    pub fn flush(&mut self) -> Result<()> {
        self.plain(Cmd::Flush, 0, 0, 0)
    }

    /// Discards `len` bytes at `offset` (a hint).
    pub fn trim(&mut self, offset: u64, len: u32) -> Result<()> {
        self.plain(Cmd::Trim, offset, len, 0)
    }

    /// Makes `len` bytes at `offset` read as zeroes (a hole allowed unless `no_hole`).
    pub fn write_zeroes(&mut self, offset: u64, len: u32, no_hole: bool) -> Result<()> {
        let flags = if no_hole { rflag::NO_HOLE } else { 0 };
        self.plain(Cmd::WriteZeroes, offset, len, flags)
    }

    /// Closes the session.
    pub fn close(self) {
        self.ch.close();
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        if offset.checked_add(len).is_some_and(|e| e <= self.size) {
            Ok(())
        } else {
            Err(Error::new(
                Kind::Usage,
                format!(
                    "{len} bytes at {offset} lie past the end of the {}-byte export",
                    self.size
                ),
            ))
        }
    }

    fn plain(&mut self, cmd: Cmd, offset: u64, len: u32, flags: u8) -> Result<()> {
        let slot = self.take_slot(&mut [])?;
        self.send_request(cmd, flags, offset, len, Data::None, Op::Plain { slot })?;
        self.finish(&mut [])
    }

    /// A free slot, waiting for requests in flight to finish while none is.
    fn take_slot(&mut self, dst: &mut [u8]) -> Result<u16> {
        loop {
            if let Some(s) = self.slots.alloc() {
                return Ok(s);
            }
            self.step(dst)?;
        }
    }

    /// Waits for everything in flight, then reports the first error a request got.
    fn finish(&mut self, dst: &mut [u8]) -> Result<()> {
        while !self.inflight.is_empty() || !self.rmas.is_empty() {
            self.step(dst)?;
        }
        match self.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn start_write(&mut self, slot: u16, offset: u64, piece: &[u8], fua: bool) -> Result<()> {
        let len = piece.len() as u32;
        if self.scheme == Scheme::Copy {
            let flags = if fua { rflag::FUA } else { 0 };
            let data = Data::Inline(piece.to_vec());
            return self.send_request(Cmd::Write, flags, offset, len, data, Op::Write { slot });
        }
        let buf = self.staging_buf(slot)?;
        buf.write_at(0, piece)
            .map_err(|e| Error::conn(format!("stage a write: {e}")))?;
        self.post_rma(slot, true, buf, len, Rma::Written { offset, len, fua })
    }

    fn start_read(&mut self, slot: u16, offset: u64, at: usize, len: usize) -> Result<()> {
        let op = Op::Read { slot, at, len };
        let n = len as u32;
        let (flags, data) = match (self.scheme, self.read) {
            (Scheme::Copy, _) => (0, Data::None),
            (Scheme::Delegated, ReadMode::ServerFill) => (0, Data::Chunk { chunk: slot, at: 0 }),
            (Scheme::Delegated, ReadMode::ServerWrite) => {
                let r = self.staging_remote[usize::from(slot)];
                (rflag::REMOTE, Data::Remote(sub(r, n)?))
            }
        };
        self.send_request(Cmd::Read, flags, offset, n, data, op)
    }

    fn staging_buf(&mut self, slot: u16) -> Result<ExsBuf> {
        self.staging
            .get_mut(usize::from(slot))
            .and_then(Option::take)
            .ok_or_else(|| Error::conn("internal: a staging buffer in use twice"))
    }

    /// RMA between slot `slot`'s staging buffer (its first `len` bytes) and its chunk.
    fn post_rma(&mut self, slot: u16, write: bool, buf: ExsBuf, len: u32, then: Rma) -> Result<()> {
        let remote = sub(self.chunks[usize::from(slot)], len)?;
        let part = buf
            .slice(..len as usize)
            .map_err(|e| Error::conn(format!("a staging slice: {e}")))?;
        self.rmas.insert(slot, then);
        self.ch
            .socket()
            .rma(&self.rq, write, part, remote, u64::from(slot));
        Ok(())
    }

    fn send_request(
        &mut self,
        cmd: Cmd,
        flags: u8,
        offset: u64,
        len: u32,
        data: Data,
        op: Op,
    ) -> Result<()> {
        let handle = self.next_handle;
        self.next_handle += 1;
        self.inflight.insert(handle, op);
        self.ch.send_frame(&proto::encode(&Msg::Request {
            handle,
            cmd,
            flags,
            offset,
            len,
            data,
        }))
    }

    /// Waits for one thing: an RMA of ours when one is out (they finish first and unblock
    /// requests), else a reply.
    fn step(&mut self, dst: &mut [u8]) -> Result<()> {
        if !self.rmas.is_empty() {
            return self.rma_done(dst);
        }
        let mut frame = Vec::new();
        self.ch.recv_into(&mut frame)?;
        match proto::decode(&frame) {
            Ok(Msg::Reply {
                handle,
                error,
                rekey,
                payload,
            }) => self.reply(handle, error, rekey, payload, dst),
            Ok(Msg::Error { message }) => Err(Error::conn(format!(
                "the server ended the session: {message}"
            ))),
            Ok(m) => Err(Error::conn(format!("expected REPLY, got {m:?}"))),
            Err(e) => Err(Error::conn(e.to_string())),
        }
    }

    fn rma_done(&mut self, dst: &mut [u8]) -> Result<()> {
        let ev = loop {
            match self.rq.dequeue(self.ch.timeout) {
                Some(ev) if ev.kind == EventKind::Rma => break ev,
                Some(_) => continue,
                None => return Err(Error::conn("an RMA to the server hung")),
            }
        };
        let slot = u16::try_from(ev.ctx).unwrap_or(u16::MAX);
        let then = self
            .rmas
            .remove(&slot)
            .ok_or_else(|| Error::conn("internal: an RMA nobody posted"))?;
        let buf = ev
            .buf
            .map(|b| ExsBuf::new(b.region().clone()))
            .ok_or_else(|| Error::conn("an RMA completed without its buffer"))?;
        ev.result
            .map_err(|e| Error::conn(format!("RMA to the server's chunk: {e}")))?;
        match then {
            Rma::Written { offset, len, fua } => {
                self.staging[usize::from(slot)] = Some(buf);
                let flags = if fua { rflag::FUA } else { 0 };
                let data = Data::Chunk { chunk: slot, at: 0 };
                self.send_request(Cmd::Write, flags, offset, len, data, Op::Write { slot })
            }
            Rma::Read { at, len } => {
                copy_to(&buf, dst, at, len)?;
                self.staging[usize::from(slot)] = Some(buf);
                self.slots.release(slot);
                Ok(())
            }
        }
    }

    fn reply(
        &mut self,
        handle: u64,
        error: u32,
        rekey: Option<RemoteSlice>,
        payload: Vec<u8>,
        dst: &mut [u8],
    ) -> Result<()> {
        let op = self
            .inflight
            .remove(&handle)
            .ok_or_else(|| Error::conn(format!("a REPLY to handle {handle}, not in flight")))?;
        let slot = match op {
            Op::Write { slot } | Op::Read { slot, .. } | Op::Plain { slot } => slot,
        };
        if let Some(k) = rekey {
            match self.chunks.get_mut(usize::from(slot)) {
                Some(c) if k.len == u64::from(self.chunk_size) => *c = k,
                _ => return Err(Error::conn("a rekeyed chunk that is not ours")),
            }
        }
        if error != 0 {
            self.failed.get_or_insert_with(|| nbd_error(error));
            self.slots.release(slot);
            return Ok(());
        }
        match op {
            Op::Read { slot, at, len } => match (self.scheme, self.read) {
                (Scheme::Copy, _) => {
                    if payload.len() != len {
                        return Err(Error::conn("a READ's reply is not its length"));
                    }
                    dst[at..at + len].copy_from_slice(&payload);
                    self.slots.release(slot);
                    Ok(())
                }
                (Scheme::Delegated, ReadMode::ServerFill) => {
                    // The chunk stays ours until this read of it completes: the fence
                    // that keeps a later request from overwriting it first.
                    let buf = self.staging_buf(slot)?;
                    self.post_rma(slot, false, buf, len as u32, Rma::Read { at, len })
                }
                (Scheme::Delegated, ReadMode::ServerWrite) => {
                    let buf = self.staging_buf(slot)?;
                    let r = copy_to(&buf, dst, at, len);
                    self.staging[usize::from(slot)] = Some(buf);
                    self.slots.release(slot);
                    r
                }
            },
            _ => {
                self.slots.release(slot);
                Ok(())
            }
        }
    }
}

/// The first `len` bytes of `r`.
fn sub(r: RemoteSlice, len: u32) -> Result<RemoteSlice> {
    r.sub(0, u64::from(len))
        .map_err(|e| Error::conn(format!("a chunk range: {e}")))
}

/// Copies the first `len` bytes of `buf` to `dst[at..]`.
fn copy_to(buf: &ExsBuf, dst: &mut [u8], at: usize, len: usize) -> Result<()> {
    let out = dst
        .get_mut(at..at + len)
        .ok_or_else(|| Error::conn("internal: a read past its buffer"))?;
    buf.buffer().read_at(buf.offset(), out);
    Ok(())
}

/// A request's NBD error as the caller sees it.
fn nbd_error(errno: u32) -> Error {
    let kind = match errno {
        crate::nbd::consts::EPERM => Kind::Permission,
        crate::nbd::consts::EINVAL => Kind::Usage,
        _ => Kind::Io,
    };
    Error::new(kind, format!("the server answered error {errno}"))
}
