//! One transfer connection in file-transfer frames: the service floor's EXS message channel
//! ([`ferry_service::channel`]) and staging ring ([`ferry_service::ring`]) speaking this
//! protocol's frames.
//!
//! - [`Link`]: the channel, sending and receiving control frames ([`Msg`]).
//! - [`BlockSender`]: the floor's sending runtime writing BLOCK headers in front of the
//!   blocks it reads, and FILE, PACK and PUT_FILE frames into the blocks it claims.
//! - [`BlockWriter`] (the floor's): lands the BLOCKs a receiver decoded; a [`BlockHeader`]
//!   converts into the floor's [`Block`].

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use ferry_exs::runtime::{EventQueue, ExsBuf, ExsSocket};
use ferry_service::channel::{Channel, FRAME_HEAD};
use ferry_service::ring::{self, Piece, Sender, Staged};
use ferry_service::secure::protect::{BlockCheck, Level};
use ferry_service::secure::ClientSecurity;
use ferry_service::sink::Block;

pub use ferry_service::ring::{staging_threads, Digest, Source};
pub use ferry_service::writer::BlockWriter;

use crate::error::{Kind, Result, XferError};
use crate::proto::{self, BlockHeader, Msg, BLOCK_HEADER_LEN};

/// The frames that may arrive in clear on a secure connection (protocol 1.7): BLOCK (type
/// 11, `docs/protocol.md`), whose payload goes from a staging block by RMA or as a bulk
/// message; its range is checked by its integrity tag (1.9, keyed by the session; a CRC-32C
/// at the `clear` level) and the whole file by the BLAKE3 that FILE_DONE (sealed) carries.
/// Every other frame is sealed, the whole-file frames FILE, PACK and PUT_FILE included
/// ([`BlockSender::send_whole`]), except PACKs a 1.10 server tags or seals in place with the
/// session's keys ([`CLEAR_PACK_TYPES`]).
pub const DATA_TYPES: &[u8] = &[11];
/// The same and PACK (type 25), on a connection whose PACKs travel clear, tagged
/// (`integrity`: [`proto::pack_tag`]) or sealed in place (`private`) with the session's
/// keys (1.10).
pub const CLEAR_PACK_TYPES: &[u8] = &[11, 25];

/// How long a handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

// The floor keeps room for a block frame's header right before each payload: a BLOCK
// header must fill it exactly, so the payload stays aligned for direct I/O.
const _: () = assert!(BLOCK_HEADER_LEN == FRAME_HEAD);

// A sealed BLOCK's trailer is the floor's seal trailer.
const _: () = assert!(proto::BLOCK_SEAL_TRAILER == ferry_service::secure::protect::SEAL_TRAILER);

/// A connected transfer link: the floor's EXS channel carrying this protocol's frames.
pub struct Link(Channel);

impl Deref for Link {
    type Target = Channel;
    fn deref(&self) -> &Channel {
        &self.0
    }
}

impl DerefMut for Link {
    fn deref_mut(&mut self) -> &mut Channel {
        &mut self.0
    }
}

impl Link {
    /// Connects to a `ferry serve` at a fabric address (`tcp://h:p`, `ofi+tcp://h:p`,
    /// `ofi+shm://name`).
    ///
    /// Secured as [`ClientSecurity::default`] says (TLS, the server pinned in the default
    /// known-hosts file); the HELLO may follow at once (the server takes it for file
    /// transfer, as from a client older than protocol 1.6).
    pub fn connect(addr: &str, timeout: Duration) -> Result<Link> {
        Self::connect_with(addr, timeout, &ClientSecurity::default())
    }

    /// Connects, secured as `sec` says.
    pub fn connect_with(addr: &str, timeout: Duration, sec: &ClientSecurity) -> Result<Link> {
        let mut ch = Channel::connect_with(addr, timeout, sec)?;
        ch.set_data_types(DATA_TYPES);
        Ok(Link(ch))
    }

    /// Wraps a connected socket whose events go to `q` (seal it with the floor's session:
    /// [`Channel::seal`]).
    pub fn new(sock: ExsSocket, q: EventQueue) -> Link {
        let mut ch = Channel::new(sock, q);
        ch.set_data_types(DATA_TYPES);
        Link(ch)
    }

    /// Closes the connection once its last frames have left, ending its threads at once
    /// ([`Channel::hang_up`]): after a goodbye the peer answers nothing.
    pub fn hang_up(self) {
        self.0.hang_up();
    }

    /// How the blocks this side receives are checked (as agreed, [`Channel::protect`]).
    pub fn recv_check(&self) -> BlockCheck {
        self.protection().recv
    }

    /// Sends one control frame.
    pub fn send(&self, msg: &Msg) -> Result<()> {
        let bytes =
            proto::to_vec(msg).map_err(|e| XferError::conn(format!("encode frame: {e}")))?;
        self.send_frame(&bytes)
    }

    /// Receives and decodes the next control frame (a BLOCK is an error here).
    pub fn recv_msg(&mut self) -> Result<Msg> {
        let mut v = Vec::new();
        self.recv_into(&mut v)?;
        decode_control(&v)
    }

    /// The next control frame if one has arrived (no wait).
    pub fn try_recv_msg(&mut self) -> Result<Option<Msg>> {
        let mut v = Vec::new();
        if !self.recv_within(&mut v, Duration::ZERO)? {
            return Ok(None);
        }
        decode_control(&v).map(Some)
    }

    /// Like [`Link::recv_msg`], but the buffer is not posted again: for the handshake's
    /// frame (see [`Channel::recv_first_within`]).
    pub fn recv_first_msg(&mut self) -> Result<Msg> {
        decode_control(&self.0.recv_first()?)
    }

    /// Decoded [`Channel::recv_first_in`]: the first frame within the handshake's deadline.
    pub fn recv_first_in(
        &mut self,
        hs: &ferry_service::admit::Handshake,
        what: &str,
    ) -> Result<Msg> {
        decode_control(&self.0.recv_first_in(hs, what)?)
    }

    /// Like [`Link::recv_first_msg`], but `Ok(None)` when nothing arrived for about
    /// `wait`, so a caller can look at a deadline or a cancel flag between waits.
    pub fn recv_first_within(&mut self, wait: Duration) -> Result<Option<Msg>> {
        match self.0.recv_first_within(wait)? {
            Some(v) => decode_control(&v).map(Some),
            None => Ok(None),
        }
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

/// A received BLOCK's header as the floor's [`Block`], its check value verified by `check`
/// (the connection's, [`Link::recv_check`]).
pub fn received(h: &BlockHeader, check: BlockCheck) -> Block {
    Block {
        check,
        spans: h.spans,
        ..Block::from(h)
    }
}

/// What the floor's sink needs of a frame's header, checked by CRC-32C (a FILE frame's,
/// which travels sealed and is checked by its BLAKE3; BLOCKs take [`received`]).
impl From<&BlockHeader> for Block {
    fn from(h: &BlockHeader) -> Block {
        Block {
            transfer: h.file_id,
            offset: h.offset,
            len: h.len,
            crc32c: h.crc32c,
            check: Default::default(),
            spans: false,
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

impl From<Span> for Piece {
    fn from(s: Span) -> Piece {
        Piece {
            transfer: s.file_id,
            offset: s.offset,
            len: s.len,
        }
    }
}

/// The sending half of the staging ring in this protocol's frames: the floor's
/// [`Sender`] reading ranges into registered blocks sent as BLOCK frames, and whole small
/// files read into blocks as FILE (packed into PACK) or PUT_FILE frames.
pub struct BlockSender {
    ring: Sender,
    /// Read files with direct I/O (`O_DIRECT`, bypassing the page cache) where the
    /// filesystem allows it; the unaligned tail of a file is read through the cache.
    pub direct: bool,
    /// Send a whole file that fits in a block as one FILE frame (a 1.3 peer).
    pub inline: bool,
    /// Gather FILE frames into PACK frames (a 1.4 peer).
    pub packing: bool,
    /// Send PACKs clear, tagged at `integrity` or sealed in place at `private` (a 1.10 peer).
    pub clear_packs: bool,
    /// FILE frames carry their CRC-32C (a peer before 1.12); a 1.12 peer checks them by
    /// their BLAKE3 alone and gets 0.
    pub file_crc: bool,
    /// PACKs sent tagged or sealed in place on this link (the next one's `seq`).
    packs_numbered: u64,
    /// The PACK being filled.
    pack: Option<Pack>,
}

impl BlockSender {
    /// A sender of blocks of at most `block` bytes, with at most `ring` in flight; it keeps
    /// its registered blocks for the next ranges it sends.
    pub fn new(block: u32, ring: usize, timeout: Duration) -> Result<Self> {
        Ok(BlockSender {
            ring: Sender::new(block, ring, timeout)?,
            direct: false,
            inline: false,
            packing: false,
            clear_packs: false,
            file_crc: true,
            packs_numbered: 0,
            pack: None,
        })
    }

    /// A sender like this one (the same block size, the same ways of sending, the same
    /// count of numbered PACKs) with `ring` blocks in flight; this one must have nothing in
    /// flight and no PACK open.
    pub fn with_ring(&self, ring: usize, timeout: Duration) -> Result<Self> {
        if self.pack.is_some() {
            return Err(XferError::conn(
                "internal: a sender regrown with a PACK open",
            ));
        }
        let block = u32::try_from(self.ring.block())
            .map_err(|_| XferError::conn("internal: a block size past u32"))?;
        Ok(BlockSender {
            ring: Sender::new(block, ring, timeout)?,
            direct: self.direct,
            inline: self.inline,
            packing: self.packing,
            clear_packs: self.clear_packs,
            file_crc: self.file_crc,
            packs_numbered: self.packs_numbered,
            pack: None,
        })
    }

    /// Sends `span` of `src` as BLOCK frames of `span.file_id`, feeding every byte read to
    /// `digest`, and `progress` with each block's length (see
    /// [`Sender::send_range`]: read in place, checked there, no copy), each block carrying
    /// the check value the link's protection asks for (CRC-32C or integrity tag), or sealed
    /// (encrypted in place, its header flagged [`proto::BLOCK_SEALED`]) at `private`.
    pub fn send_range(
        &mut self,
        link: &Link,
        src: Source<'_>,
        span: Span,
        digest: Digest<'_>,
        progress: &dyn Fn(u64),
    ) -> Result<()> {
        self.ring.direct = self.direct;
        self.ring.check = link.protection().send;
        let sealed = self.ring.check.seals();
        let head = |p: &Piece, crc32c: u32, spans: bool| {
            let h = BlockHeader {
                file_id: p.transfer,
                stream: 0,
                offset: p.offset,
                len: p.len as u32,
                crc32c,
                spans,
            };
            let head = if sealed {
                proto::encode_sealed_block_header(&h)
            } else {
                proto::encode_block_header(&h)
            };
            head.map_err(|e| XferError::conn(format!("encode block: {e}")))
        };
        self.ring
            .send_range(link.socket(), src, span.into(), digest, progress, &head)
    }

    /// Gathers the checks of the blocks of a whole file of `size` bytes sent from now on, for
    /// the checksum cache ([`Sender::collect_checks`]).
    pub fn collect_checks(&mut self, size: u64) {
        self.ring.collect_checks(size);
    }

    /// The checks gathered, if of every block ([`Sender::take_checks`]); gathering stops.
    pub fn take_checks(&mut self) -> Option<ferry_service::sumcache::Blocks> {
        self.ring.take_checks()
    }

    /// The most payload bytes a block carries.
    pub fn block(&self) -> u64 {
        self.ring.block() as u64
    }

    /// Whether a file of `size` bytes fits in one FILE frame (header and payload in one
    /// staging block, and in one of the peer's receive buffers of the same size).
    pub fn file_fits(&self, size: u64) -> bool {
        size.saturating_add(proto::FILE_HEADER_LEN as u64)
            <= (BLOCK_HEADER_LEN + self.ring.block()) as u64
    }

    /// Sends the whole of `file` (`size` bytes, [`BlockSender::file_fits`]) as one FILE
    /// frame of `file_id`: read with one `pread` into a registered staging block, its
    /// CRC-32C and BLAKE3 computed there (the BLAKE3 only if not `known`, from the checksum
    /// cache), sent without a copy. With [`BlockSender::packing`] the frame joins the open
    /// PACK (a new one when it does not fit), which leaves at [`BlockSender::flush_pack`] or
    /// when it is full. `unchanged` runs once the file was read: if it fails (the source
    /// changed, [`ferry_service::stamp`]), the frame is not sent. Returns the frame's BLAKE3.
    pub fn send_file(
        &mut self,
        link: &Link,
        file: &std::fs::File,
        (file_id, mode): (u32, u32),
        size: u64,
        known: Option<[u8; 32]>,
        unchanged: &dyn Fn() -> Result<()>,
    ) -> Result<[u8; 32]> {
        let n = usize::try_from(size)
            .ok()
            .filter(|_| self.file_fits(size))
            .ok_or_else(|| XferError::conn("internal: file too large for one FILE frame"))?;
        let frame = proto::FILE_HEADER_LEN + n;
        let (mut sent, crc) = ([0; 32], self.file_crc);
        self.join_pack(link, (frame, Whole::File), |buf, at| {
            sent = fill_file_frame(buf, at, file, (file_id, mode), (n, crc), known)?;
            unchanged()
        })?;
        Ok(sent)
    }

    /// Whether a file of `size` bytes uploaded to `path` fits in one PUT_FILE frame.
    pub fn put_file_fits(&self, path: &str, size: u64) -> bool {
        size.saturating_add(proto::put_file_header_len(path) as u64)
            <= (BLOCK_HEADER_LEN + self.ring.block()) as u64
    }

    /// Sends the whole of `file` ([`BlockSender::put_file_fits`]) to `path` as one PUT_FILE
    /// frame of `file_id` with `flags` (PUT_FILE's): read with one `pread` into a registered
    /// staging block, its BLAKE3 computed there, sent without a copy. With
    /// [`BlockSender::packing`] (a 1.11 server) the frame joins the open PACK as
    /// [`BlockSender::send_file`]'s do. A source that changed since `meta` was taken
    /// ([`ferry_service::stamp`]) is not sent: an integrity error.
    pub fn send_put_file(
        &mut self,
        link: &Link,
        file: &std::fs::File,
        (file_id, flags): (u32, u8),
        path: &str,
        meta: &FileMeta,
    ) -> Result<()> {
        let size = meta.size;
        let n = usize::try_from(size)
            .ok()
            .filter(|_| self.put_file_fits(path, size))
            .ok_or_else(|| XferError::conn("internal: file too large for one PUT_FILE frame"))?;
        let frame = proto::put_file_header_len(path) + n;
        self.join_pack(link, (frame, Whole::PutFile), |buf, at| {
            fill_put_file(buf, at, file, (file_id, flags), path, meta, n)
        })
    }

    /// Writes a whole-file frame of `len` bytes and `kind` with `fill` (at its offset in a
    /// staging block) into the open PACK, or a new one when it does not fit or holds frames
    /// of another kind. A frame that leaves no room for a PACK header goes alone, bare. If
    /// `fill` fails, nothing of this frame is sent (what the PACK held before still goes).
    fn join_pack(
        &mut self,
        link: &Link,
        (frame, kind): (usize, Whole),
        fill: impl FnOnce(&ExsBuf, usize) -> Result<()>,
    ) -> Result<()> {
        let room = |p: &Pack| {
            p.count < u16::MAX
                && p.packed()
                && p.kind == kind
                && p.fill + frame + p.way.trailer() <= p.block.buf.len()
        };
        if self.pack.as_ref().is_some_and(|p| !room(p)) {
            self.flush_pack(link)?;
        }
        let mut pack = match self.pack.take() {
            Some(p) => p,
            None => {
                let block = self.ring.claim(link.socket())?;
                // Packed, frames follow the PACK header; a frame that leaves no room for
                // it goes alone, bare, from the block's start.
                let way = self.pack_way(link, kind);
                let head = way.header();
                let packed = self.packing && head + frame + way.trailer() <= block.buf.len();
                let start = if packed { head } else { 0 };
                Pack {
                    block,
                    start,
                    fill: start,
                    count: 0,
                    kind,
                    way: if packed { way } else { PackWay::Tls },
                }
            }
        };
        let at = pack.fill;
        let filled = if at + frame + pack.way.trailer() > pack.block.buf.len() {
            Err(XferError::conn("internal: staging block too small"))
        } else {
            fill(&pack.block.buf, at)
        };
        if let Err(e) = filled {
            // Nothing of this file is in the block: what it held before still goes.
            if pack.count > 0 {
                self.pack = Some(pack);
            } else {
                self.ring.release(pack.block);
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

    /// Whole-file frames waiting in the open PACK (sent at [`BlockSender::flush_pack`]).
    pub fn packed(&self) -> usize {
        self.pack.as_ref().map_or(0, |p| usize::from(p.count))
    }

    /// Tags or seals `p`'s frames as its way says (the next `seq` of this link) and writes
    /// its PACK header at its block's start; `p.fill` then covers a seal's trailer.
    fn pack_head(&mut self, link: &Link, p: &mut Pack) -> Result<()> {
        let frames = p.fill - p.start;
        let at = p.block.buf.offset() + p.start;
        let buf = p.block.buf.buffer();
        let (seq, count, check) = (self.packs_numbered, p.count, link.protection().send);
        let tag = match p.way {
            PackWay::Tls => None,
            PackWay::Tagged => {
                let key = check
                    .tag_key()
                    .ok_or_else(|| XferError::conn("internal: a tagged pack without a key"))?;
                let tag = buf.with_bytes(at, frames, |f| proto::pack_tag(key, seq, count, f));
                Some(tag.map_err(|e| XferError::conn(format!("internal: tag a pack: {e}")))?)
            }
            PackWay::Sealed => {
                let context = proto::pack_seal_context(seq, count);
                let n = frames + proto::BLOCK_SEAL_TRAILER;
                buf.with_bytes_mut(at, n, |f| check.seal_frames(&context, f))?;
                p.fill += proto::BLOCK_SEAL_TRAILER;
                None
            }
        };
        let sealed = p.way == PackWay::Sealed;
        let len = (p.fill - p.start) as u32;
        let head = proto::encode_pack_header(count, tag, sealed, len)
            .map_err(|e| XferError::conn(format!("encode pack: {e}")))?;
        p.block
            .buf
            .write_at(0, &head)
            .map_err(|e| XferError::conn(format!("fill staging block: {e}")))?;
        self.packs_numbered += u64::from(p.way != PackWay::Tls);
        Ok(())
    }

    /// How PACKs of `kind` leave on `link`: clear, tagged at `integrity` or sealed in place
    /// at `private`, to a peer that takes them so ([`BlockSender::clear_packs`]); else sealed
    /// by TLS as before. PUT_FILE frames name their paths: never clear, so sealed by TLS at
    /// `integrity`.
    fn pack_way(&self, link: &Link, kind: Whole) -> PackWay {
        let p = link.protection();
        match p.level {
            _ if !self.clear_packs || link.secure().is_none() => PackWay::Tls,
            Level::Integrity if kind == Whole::File && p.send.tag_key().is_some() => {
                PackWay::Tagged
            }
            Level::Private if p.send.seals() => PackWay::Sealed,
            _ => PackWay::Tls,
        }
    }

    /// Whether a PACK is open (frames wait in it for [`BlockSender::flush_pack`]).
    pub fn pack_open(&self) -> bool {
        self.pack.is_some()
    }

    /// Sends the open PACK, if any: as a PACK frame, or as the bare frame when it holds only
    /// one and goes sealed by TLS. The server calls it before any other frame and before it
    /// waits for requests, so answers leave in request order; a client before any other
    /// request and before it waits for answers to the files in it.
    pub fn flush_pack(&mut self, link: &Link) -> Result<()> {
        let Some(mut p) = self.pack.take() else {
            return Ok(());
        };
        ferry_fabric::timeline::mark("srv.pack", u64::from(p.count));
        if p.count == 1 && p.way == PackWay::Tls {
            return self.send_whole(link, p.block, p.start..p.fill);
        }
        match self.pack_head(link, &mut p) {
            // Tagged or sealed in place, it needs no TLS seal.
            Ok(()) if p.way != PackWay::Tls => self.ring.send(link.socket(), p.block, 0..p.fill),
            Ok(()) => self.send_whole(link, p.block, 0..p.fill),
            Err(e) => {
                self.ring.release(p.block);
                Err(e)
            }
        }
    }

    /// Sends the frame in `range` of a staging block that holds whole files (FILE, PACK,
    /// PUT_FILE). On a secure connection it goes sealed, as a control frame (encrypted
    /// from the block where it lies, with no copy of it first): such a frame carries its
    /// own BLAKE3 (and PUT_FILE its path), which must not cross where it can be read or
    /// replaced (protocol 1.7).
    fn send_whole(
        &mut self,
        link: &Link,
        block: Staged,
        range: std::ops::Range<usize>,
    ) -> Result<()> {
        if link.secure().is_none() {
            return self.ring.send(link.socket(), block, range);
        }
        // The staging block is this side's own, written before and idle until released.
        let at = block.buf.offset() + range.start;
        let sent = block
            .buf
            .buffer()
            .with_bytes(at, range.len(), |frame| link.send_frame(frame));
        self.ring.release(block);
        sent
    }

    /// Waits until every block sent has completed.
    pub fn flush(&mut self) -> Result<()> {
        self.ring.flush()
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

/// How the PACKs a connection receives are checked: sealed by TLS (or on a clear
/// connection), or clear with a tag keyed by the session (`integrity`, [`proto::pack_tag`],
/// a 1.10 server's FILE frames) or sealed in place with its `private` key (those and, from a
/// 1.11 client, PUT_FILE frames).
#[derive(Debug, Default)]
pub struct PackCheck {
    /// What the connection's PACKs carry: `Crc` (nothing of their own), `Tag` or `Seal`.
    check: BlockCheck,
    /// PACKs tagged or sealed in place received so far: the next one's `seq`.
    seq: u64,
}

impl PackCheck {
    /// The check of the PACKs of FILE frames a server of protocol `minor` sends on `link`
    /// (a client's); lets PACKs arrive clear on it when they carry a check of their own.
    pub(crate) fn for_downloads(link: &mut Link, minor: u16) -> PackCheck {
        let p = link.protection();
        let clear = link.secure().is_some() && minor >= proto::MINOR_TAGGED_PACK;
        let check = match p.level {
            Level::Integrity | Level::Private if clear => p.recv,
            _ => BlockCheck::Crc,
        };
        Self::taking(link, check)
    }

    /// The check of the PACKs of PUT_FILE frames a client of protocol `minor` sends on
    /// `link` (a server's, once the level is agreed): sealed in place at `private` from a
    /// client of 1.11, else sealed by TLS (they name paths: never merely tagged).
    pub(crate) fn for_uploads(link: &mut Link, minor: u16) -> PackCheck {
        let p = link.protection();
        let clear = link.secure().is_some() && minor >= proto::MINOR_PUT_PACK;
        let check = match p.level {
            Level::Private if clear => p.recv,
            _ => BlockCheck::Crc,
        };
        Self::taking(link, check)
    }

    /// Checks PACKs by `check`, taken in clear on `link` when it is the session's own.
    fn taking(link: &mut Link, check: BlockCheck) -> PackCheck {
        if check != BlockCheck::Crc {
            link.set_data_types(CLEAR_PACK_TYPES);
        }
        PackCheck { check, seq: 0 }
    }

    /// Checks a PACK of `count` frames with `tag`, `sealed` as its header says, whose
    /// `payload` follows: its frames' bytes (opened in place when sealed), to take apart
    /// with [`proto::decode_pack`] or [`proto::decode_put_pack`]. The tag or seal must be
    /// there exactly when the connection agreed on one, and right: else the connection
    /// ends.
    pub(crate) fn open<'a>(
        &mut self,
        (count, tag, sealed): (u16, Option<[u8; 32]>, bool),
        payload: &'a mut [u8],
    ) -> Result<&'a [u8]> {
        let seq = self.seq;
        let frames = match (&self.check, tag, sealed) {
            (BlockCheck::Crc, None, false) => return Ok(payload),
            (BlockCheck::Tag(key), Some(tag), false) => {
                let want = proto::pack_tag(key, seq, count, payload)
                    .map_err(|e| XferError::conn(format!("the peer sent a bad pack: {e}")))?;
                // blake3::Hash compares in constant time.
                (blake3::Hash::from(want) == blake3::Hash::from(tag)).then_some(&*payload)
            }
            (check @ BlockCheck::Seal(_), None, true) => {
                check.open_frames(&proto::pack_seal_context(seq, count), payload)
            }
            _ => {
                return Err(XferError::conn(format!(
                    "the peer sent a PACK {} on a connection whose PACKs are {}",
                    match (tag.is_some(), sealed) {
                        (true, _) => "tagged",
                        (_, true) => "sealed in place",
                        _ => "with no tag nor seal",
                    },
                    match self.check {
                        BlockCheck::Crc => "sealed by TLS",
                        BlockCheck::Tag(_) => "tagged",
                        BlockCheck::Seal(_) => "sealed in place",
                    }
                )))
            }
        };
        self.seq += 1;
        frames.ok_or_else(|| {
            XferError::new(
                Kind::Integrity,
                "a PACK failed its integrity check (changed, reordered or replayed on the way): closing the connection",
            )
        })
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

/// A staging block filling with whole-file frames (see [`BlockSender::send_file`],
/// [`BlockSender::send_put_file`]).
struct Pack {
    block: Staged,
    /// Where the first frame starts: after the PACK header's room, or 0 for a bare frame.
    start: usize,
    /// Bytes used, from the block's start.
    fill: usize,
    /// Frames in it.
    count: u16,
    /// What they are.
    kind: Whole,
    /// How it leaves (tagged or sealed in place: a PACK even of one frame).
    way: PackWay,
}

/// The whole-file frames a PACK carries: one kind to a PACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Whole {
    /// FILE (a download's, 1.4).
    File,
    /// PUT_FILE (an upload's, 1.11).
    PutFile,
}

/// How a PACK leaves (protocol 1.10, [`BlockSender::clear_packs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PackWay {
    /// Sealed by TLS (or on a clear connection, as it is).
    Tls,
    /// Clear with a tag keyed by the session ([`proto::pack_tag`]), at `integrity`.
    Tagged,
    /// Clear, its frames sealed in place with the session's key, at `private`.
    Sealed,
}

impl PackWay {
    /// The PACK header's length.
    fn header(self) -> usize {
        match self {
            PackWay::Tagged => proto::TAGGED_PACK_HEADER_LEN,
            _ => proto::PACK_HEADER_LEN,
        }
    }

    /// The bytes after the frames.
    fn trailer(self) -> usize {
        match self {
            PackWay::Sealed => proto::BLOCK_SEAL_TRAILER,
            _ => 0,
        }
    }
}

impl Pack {
    /// Whether more frames may join (else it holds one bare frame).
    fn packed(&self) -> bool {
        self.start > 0
    }
}

/// Reads `n` bytes of `file` into `buf` at `at + FILE_HEADER_LEN` and writes the FILE
/// frame's header (the CRC-32C of those bytes if `crc`, else 0; their BLAKE3 unless
/// `known`) at `at`; returns the BLAKE3 written.
fn fill_file_frame(
    buf: &ExsBuf,
    at: usize,
    file: &std::fs::File,
    (file_id, mode): (u32, u32),
    (n, crc): (usize, bool),
    known: Option<[u8; 32]>,
) -> Result<[u8; 32]> {
    let data = at + proto::FILE_HEADER_LEN;
    read_payload(buf, data, file, n)?;
    let (crc, hash) = buf.buffer().with_bytes(buf.offset() + data, n, |b| {
        let hash = known.unwrap_or_else(|| *blake3::hash(b).as_bytes());
        (if crc { crc32c::crc32c(b) } else { 0 }, hash)
    });
    let head = proto::encode_file_header(file_id, mode, crc, hash, n as u32)
        .map_err(|e| XferError::conn(format!("encode file: {e}")))?;
    buf.write_at(at, &head)
        .map_err(|e| XferError::conn(format!("fill staging block: {e}")))?;
    ring::sender::test_corrupt(buf, data, n);
    Ok(hash)
}

/// Reads the whole of `file` (`n` bytes, as `meta` describes it) into `buf` at `at` after a
/// PUT_FILE header for `path`, checks the source did not change, and writes the header
/// (with the BLAKE3 of the bytes read) in front.
fn fill_put_file(
    buf: &ExsBuf,
    at: usize,
    file: &std::fs::File,
    (file_id, flags): (u32, u8),
    path: &str,
    meta: &FileMeta,
    n: usize,
) -> Result<()> {
    let data = at + proto::put_file_header_len(path);
    read_payload(buf, data, file, n)?;
    meta.stamp.check(file, path)?;
    let blake3 = buf
        .buffer()
        .with_bytes(buf.offset() + data, n, |b| *blake3::hash(b).as_bytes());
    let msg = Msg::PutFile {
        flags,
        file_id,
        mode: meta.mode,
        mtime: meta.mtime,
        blake3,
        path: path.to_string(),
        len: n as u32,
    };
    let head = proto::to_vec(&msg).map_err(|e| XferError::conn(format!("encode: {e}")))?;
    buf.write_at(at, &head)
        .map_err(|e| XferError::conn(format!("fill staging block: {e}")))?;
    ring::sender::test_corrupt(buf, data, n);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The one frame type a secure connection takes in clear is BLOCK's, and no control
    /// frame has it.
    #[test]
    fn only_blocks_travel_clear() {
        let h = BlockHeader {
            file_id: 1,
            stream: 0,
            offset: 0,
            len: 1,
            crc32c: 0,
            spans: false,
        };
        let block = proto::encode_block_header(&h).unwrap();
        assert_eq!(DATA_TYPES, &[block[4]]);
        let whole = proto::to_vec(&Msg::PutFile {
            flags: 0,
            file_id: 1,
            mode: 0o644,
            mtime: 0,
            blake3: [0; 32],
            path: "d/f".into(),
            len: 0,
        })
        .unwrap();
        assert!(!DATA_TYPES.contains(&whole[4]), "PUT_FILE names a path");
    }

    /// A pack of two FILE frames.
    fn frames() -> Vec<u8> {
        let mut v = Vec::new();
        for (id, data) in [(1u32, &b"abc"[..]), (2, &b"hello"[..])] {
            let hash = *blake3::hash(data).as_bytes();
            let len = data.len() as u32;
            v.extend_from_slice(&proto::encode_file_header(id, 0o644, 0, hash, len).unwrap());
            v.extend_from_slice(data);
        }
        v
    }

    fn tagged(key: [u8; 32]) -> PackCheck {
        PackCheck {
            check: BlockCheck::Tag(key),
            seq: 0,
        }
    }

    #[test]
    fn a_tagged_connection_takes_each_pack_only_with_its_own_tag_in_order() {
        let key = [3; 32];
        let f = frames();
        let tag = |seq| Some(proto::pack_tag(&key, seq, 2, &f).unwrap());
        let mut c = tagged(key);
        assert_eq!(c.open((2, tag(0), false), &mut f.clone()).unwrap(), &f[..]);
        c.open((2, tag(1), false), &mut f.clone()).unwrap();
        // Replayed (an earlier place), forged, missing, sealed instead: each refused.
        let e = c.open((2, tag(1), false), &mut f.clone()).unwrap_err();
        assert_eq!(e.kind, Kind::Integrity, "{e}");
        let mut forged = tag(0).unwrap();
        forged[31] ^= 1;
        let mut copy = f.clone();
        let e = tagged(key).open((2, Some(forged), false), &mut copy);
        assert_eq!(e.unwrap_err().kind, Kind::Integrity);
        assert!(tagged(key).open((2, None, false), &mut f.clone()).is_err());
        assert!(tagged(key).open((2, None, true), &mut f.clone()).is_err());
        // A file's header changed under a good tag.
        let mut changed = f.clone();
        changed[8] ^= 1;
        assert!(tagged(key).open((2, tag(0), false), &mut changed).is_err());
    }

    #[test]
    fn a_private_connection_takes_packs_sealed_in_place_in_order() {
        let key = BlockCheck::Seal([5; 32]);
        let f = frames();
        let sealed = |seq| {
            let mut b = f.clone();
            b.resize(f.len() + proto::BLOCK_SEAL_TRAILER, 0);
            key.seal_frames(&proto::pack_seal_context(seq, 2), &mut b)
                .unwrap();
            b
        };
        let mut c = PackCheck { check: key, seq: 0 };
        assert_eq!(c.open((2, None, true), &mut sealed(0)).unwrap(), &f[..]);
        // Replayed, changed, or clear: refused.
        let e = c.open((2, None, true), &mut sealed(0)).unwrap_err();
        assert_eq!(e.kind, Kind::Integrity);
        let mut changed = sealed(2);
        changed[3] ^= 1;
        assert!(c.open((2, None, true), &mut changed).is_err());
        let mut c = PackCheck { check: key, seq: 0 };
        assert!(c.open((2, None, false), &mut f.clone()).is_err());
    }

    #[test]
    fn an_untagged_connection_refuses_a_tagged_or_sealed_pack() {
        let f = frames();
        let mut c = PackCheck::default();
        c.open((2, None, false), &mut f.clone()).unwrap();
        assert!(c.open((2, Some([0; 32]), false), &mut f.clone()).is_err());
        assert!(c.open((2, None, true), &mut f.clone()).is_err());
    }
}
