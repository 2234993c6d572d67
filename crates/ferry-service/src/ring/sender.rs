//! The sending half of the staging ring over EXS: the runtime of a [`SendRing`].
//!
//! The calling thread is the disk reader. It takes a free registered block (at most `ring`
//! exist), `pread`s into it, computes the block's CRC-32C, has the face write its frame
//! header in front and posts the EXS send; the transfer itself proceeds in the EXS progress
//! thread and the peer's RMA read while the reader fills the next block. A block comes back
//! for reuse when its send completes, so a slow network or a slow receiver (which stops
//! re-posting receive buffers while its writer lags) stalls the reader: bounded memory,
//! back-pressure end to end.
//!
//! A face that builds other frames in a block (whole files, packs of them) [`Sender::claim`]s
//! one, fills it and [`Sender::send`]s it; the same credits bound it.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferry_exs::proto::{EventKind, Flags};
use ferry_exs::runtime::{EventQueue, ExsBuf, ExsSocket};

use super::{Action, Piece, SendRing, SlotId};
use crate::channel::{alloc_aligned, exs_err, pinned, rights, Use, FRAME_HEAD, HEAD_ROOM};
use crate::direct::{direct_aligned, direct_read_helps, open_direct, open_direct_or_warn};
use crate::error::{Error, Result};
use crate::secure::protect::{BlockCheck, BlockDigest};
use crate::tree::BlockSpans;

/// Writes a block frame's header: given the block, its check value, and whether that value
/// was computed from the block's [`BlockSpans`] (the face flags the frame so).
pub type Head<'a> = dyn Fn(&Piece, u32, bool) -> Result<[u8; FRAME_HEAD]> + 'a;

/// What a range's reader hands on of each block: its offset, its bytes, and the spans its
/// tag read, if it did.
type AfterRead<'a> = dyn FnMut(u64, &[u8], Option<&BlockSpans>) -> Result<()> + 'a;

/// What hashes the bytes of a sent range as they are read.
pub enum Digest<'a> {
    /// Nothing.
    None,
    /// One hasher fed every byte in order (a range that is the whole file).
    Stream(&'a mut blake3::Hasher),
    /// The file's hash tree, given each block at its offset ([`crate::tree`]): from the
    /// spans its integrity tag read where it can, so the bytes are hashed once.
    Tree(&'a crate::tree::SharedTree),
}

/// Where the bytes of a sent range come from.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// A file, read at the range's offsets.
    File(&'a std::fs::File),
    /// A file whose blocks' checks the checksum cache holds ([`crate::sumcache::Blocks`],
    /// for the version of the file as opened): each whole block whose check is there and
    /// of the sender's kind goes with that check, none computed ([`Sender::send_range`]):
    /// read into staging, or sent unread from a mapping ([`vouched_copies`]); the others are
    /// read as [`Source::File`]'s. A file truncated under a mapping makes that send fail (a
    /// provider's copy in user space is guarded, `Buffer::file_torn`).
    Vouched(&'a std::fs::File, &'a crate::sumcache::Blocks),
    /// Zeros (memory-to-memory mode: no file is read).
    Zero,
}

impl<'a> Source<'a> {
    /// The file read, if any.
    fn file(&self) -> Option<&'a std::fs::File> {
        match *self {
            Source::File(f) | Source::Vouched(f, _) => Some(f),
            Source::Zero => None,
        }
    }
}

/// Blocks shorter than this are read even when vouched for: mapping costs more than the
/// copy, and the drivers copy small sends in user space (the tcp driver's inline sends and
/// the rest of a frame the posting thread wrote part of, up to 16 KiB).
pub const MIN_UNREAD: u64 = 256 << 10;

/// Payload bytes this process sent without reading them ([`Source::Vouched`]).
static UNREAD: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The same, sent by this thread (a server's connection thread: its audit reads it).
    static UNREAD_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Payload bytes this process has sent straight from the page cache, never read into user
/// space ([`Source::Vouched`]).
pub fn unread_bytes() -> u64 {
    UNREAD.load(Ordering::Relaxed)
}

/// [`unread_bytes`] sent by the calling thread.
pub fn unread_bytes_here() -> u64 {
    UNREAD_HERE.with(|c| c.get())
}

/// Whether blocks the checksum cache vouches for go with its checks, no checksum computed
/// (read into staging or mapped, [`vouched_copies`]): `FERRY_ZERO_COPY_SENDS=off` turns it
/// off (for A/B measurements; the cache still saves the whole-file hash).
pub fn zero_copy_sends() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("FERRY_ZERO_COPY_SENDS").as_deref(),
            Ok("off") | Ok("0")
        ) && std::env::var_os("FERRY_TEST_CORRUPT_BLOCKS").is_none()
    })
}

/// Whether vouched blocks are read into a staging block (a copy, no check computed) rather
/// than sent from a mapping of the file's pages (`FERRY_VOUCHED_SENDS=map`). Mapping a
/// block costs its page table: populating and unmapping a 4 KiB page took longer here
/// than copying it. 4 GiB from /dev/shm to `null:` at `integrity`, five alternated rounds
/// on 2 cores: tcp 2.08–2.43 GB/s and 1.31–1.59 server CPU-s copied against 1.56–2.05 and
/// 1.91–2.56 mapped; ofi+shm 2.16–2.92 and 0.63–0.99 against 1.99–2.23 and 1.23–1.42
/// (docs/xfer.md, "Blocks sent unread"). A NIC that reads registered pages itself may see
/// the mapping win: measure there.
pub fn vouched_copies() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !matches!(std::env::var("FERRY_VOUCHED_SENDS").as_deref(), Ok("map")))
}

/// The checks of a whole file's blocks as a range of it is sent from offset 0 in whole
/// blocks ([`Sender::collect_checks`]), for the checksum cache.
#[derive(Debug)]
struct Collect {
    size: u64,
    block: u64,
    /// Each block's digest and whether it is its spans'.
    got: Vec<Option<(BlockDigest, bool)>>,
}

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

/// Heap bytes the hashing thread of a [`Sender`] of `depth` slots of `block` bytes holds at
/// most (staging threads on, a range of more than two blocks, [`Sender::send_range`]): the
/// blocks it is fed are copies, `depth` queued, one being hashed and one being filled;
/// every piece of such a range but its last is a whole block, so each copy's capacity is
/// one block.
pub fn hasher_bytes(depth: usize, block: u32) -> u64 {
    (depth as u64 + 2) * u64::from(block)
}

/// A slot claimed for the face to fill: its registered block, with byte 0 where a frame
/// header starts ([`FRAME_HEAD`] bytes before the aligned payload).
pub struct Staged {
    slot: SlotId,
    /// The block.
    pub buf: ExsBuf,
}

/// The sending runtime: registered blocks by slot, the [`SendRing`] deciding what each does,
/// and the queue their send completions come back on.
pub struct Sender {
    dq: EventQueue,
    ring: SendRing,
    /// Each slot's whole registered block, while the slot is free (`None` before its first
    /// use and while it is claimed or in flight).
    blocks: Vec<Option<ExsBuf>>,
    /// What each filled slot sends (a slice of its block).
    msgs: Vec<Option<ExsBuf>>,
    /// Slots whose payload area holds only zeros.
    zeroed: HashSet<SlotId>,
    /// The digest of the last length of zeros sent (its CRC-32C, or BLAKE3 under an
    /// integrity tag): a zero source's blocks all share it, and computing the CRC per block
    /// was 40 % of a memory-mode server's CPU.
    zero_digest: Option<(usize, BlockDigest)>,
    /// How each block's check value is computed: CRC-32C, or the connection's integrity
    /// tag; or how it is encrypted, at `private` ([`crate::secure::protect`]).
    pub check: BlockCheck,
    timeout: Duration,
    /// Read files with direct I/O (`O_DIRECT`, bypassing the page cache) where the
    /// filesystem allows it; the unaligned tail of a file is read through the cache.
    pub direct: bool,
    /// Bytes of the staging blocks allocated so far (each slot's, on its first use).
    staged_bytes: u64,
    /// Slots whose send is a file mapping ([`Source::Vouched`]), not their block: the file
    /// and the end of the range mapped, checked again just before the send is posted.
    mapped: Vec<Option<(std::fs::File, u64)>>,
    /// The blocks' checks being gathered, if asked ([`Sender::collect_checks`]).
    collect: Option<Collect>,
}

impl Sender {
    /// A sender of blocks of at most `block` bytes, with at most `ring` in flight; it keeps
    /// its registered blocks for the next ranges it sends.
    pub fn new(block: u32, ring: usize, timeout: Duration) -> Result<Self> {
        let ring = SendRing::new(ring, u64::from(block));
        Ok(Sender {
            dq: EventQueue::new().map_err(|e| Error::io("create event queue", &e))?,
            blocks: (0..ring.slots()).map(|_| None).collect(),
            msgs: (0..ring.slots()).map(|_| None).collect(),
            mapped: (0..ring.slots()).map(|_| None).collect(),
            ring,
            zeroed: HashSet::new(),
            zero_digest: None,
            check: BlockCheck::Crc,
            timeout,
            direct: false,
            staged_bytes: 0,
            collect: None,
        })
    }

    /// Bytes of staging blocks this sender has allocated: what its ring really pins
    /// (compare [`crate::channel::ring_bytes`]).
    pub fn staged_bytes(&self) -> u64 {
        self.staged_bytes
    }

    /// The payload bytes a block holds.
    pub fn block(&self) -> usize {
        self.ring.block() as usize
    }

    /// A free block for the face to fill (waiting for a send to complete while every block
    /// is busy), its payload area's contents unspecified.
    pub fn claim(&mut self, sock: &ExsSocket) -> Result<Staged> {
        let slot = loop {
            match self.ring.claim() {
                Some(slot) => break slot,
                None => self.reap_one()?,
            }
        };
        self.zeroed.remove(&slot);
        match self.block_of(sock, slot) {
            Ok(buf) => Ok(Staged { slot, buf }),
            Err(e) => {
                self.ring.release(slot);
                Err(e)
            }
        }
    }

    /// A claimed block not sent after all: free again.
    pub fn release(&mut self, staged: Staged) {
        self.blocks[staged.slot] = Some(ExsBuf::new(staged.buf.region().clone()));
        self.ring.release(staged.slot);
    }

    /// Sends `bytes` of a claimed block (a frame or frames the face wrote there), counting
    /// it in flight until its completion hands the block back.
    pub fn send(&mut self, sock: &ExsSocket, staged: Staged, bytes: Range<usize>) -> Result<()> {
        let (slot, len) = (staged.slot, bytes.len());
        let region = staged.buf.region().clone();
        let msg = match staged.buf.slice(bytes) {
            Ok(m) => m,
            Err(e) => {
                self.release(Staged {
                    slot,
                    buf: ExsBuf::new(region),
                });
                return Err(Error::conn(format!("slice staging block: {e}")));
            }
        };
        self.msgs[slot] = Some(msg);
        self.ring.filled(slot, len);
        self.drive(sock, &mut |_, _, _| {
            Err(Error::conn("internal: a read outside a range"))
        })
    }

    /// Waits until every block sent has completed.
    pub fn flush(&mut self) -> Result<()> {
        while self.ring.in_flight() > 0 {
            self.reap_one()?;
        }
        Ok(())
    }

    /// Gathers the check of every block of a file of `size` bytes sent from now on (from a
    /// file, at block offsets, whole blocks), until [`Sender::take_checks`].
    pub fn collect_checks(&mut self, size: u64) {
        let block = self.block() as u64;
        let n = usize::try_from(size.div_ceil(block)).unwrap_or(0);
        self.collect = (n > 0).then(|| Collect {
            size,
            block,
            got: vec![None; n],
        });
    }

    /// The checks gathered since [`Sender::collect_checks`], if they are of every block and
    /// of one kind (a connection's blocks all are); gathering stops.
    pub fn take_checks(&mut self) -> Option<crate::sumcache::Blocks> {
        use crate::sumcache::{Blocks, Checks};
        let c = self.collect.take()?;
        let got: Vec<(BlockDigest, bool)> = c.got.into_iter().collect::<Option<_>>()?;
        if got.is_empty() {
            return None;
        }
        // One kind for the whole file: every block's CRC, or every block's span digest.
        let crc = |d: &(BlockDigest, bool)| match d {
            (BlockDigest::Crc(x), false) => Some(*x),
            _ => None,
        };
        let spans = |d: &(BlockDigest, bool)| match d {
            (BlockDigest::Hash(h), true) => Some(*h),
            _ => None,
        };
        let checks = match got.iter().map(crc).collect::<Option<_>>() {
            Some(v) => Checks::Crc(v),
            None => Checks::Spans(got.iter().map(spans).collect::<Option<_>>()?),
        };
        Some(Blocks {
            block: c.block,
            checks,
        })
    }

    /// Sends `piece` of `src` as block frames whose header `head(piece, check, spans)` writes,
    /// feeding every byte read to `digest`, and `progress` with each block's length. Each
    /// block is read straight into its registered staging block (no copy; a zero source's
    /// blocks are zeroed once), and its check is computed there; blocks the checksum cache
    /// vouches for go from a mapping of the file, unread. For ranges of more than two blocks
    /// with staging threads on, the hash runs on its own thread, fed copies of the blocks,
    /// so reading, checks and hashing overlap.
    pub fn send_range(
        &mut self,
        sock: &ExsSocket,
        src: Source<'_>,
        piece: Piece,
        digest: Digest<'_>,
        progress: &dyn Fn(u64),
        head: &Head<'_>,
    ) -> Result<()> {
        let block = self.block() as u64;
        // A vouched block is never read: a range that must be hashed is read.
        let src = match (src, &digest) {
            (Source::Vouched(f, _), Digest::Stream(_) | Digest::Tree(_)) => Source::File(f),
            _ => src,
        };
        let mut range = RangeRead {
            src,
            piece,
            direct: None,
            size: None,
            block,
            progress,
            head,
        };
        match digest {
            Digest::Stream(h) if piece.len > 2 * block && staging_threads() => {
                let depth = self.ring.slots();
                std::thread::scope(|s| {
                    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(depth);
                    let (back_tx, back_rx) = std::sync::mpsc::channel::<Vec<u8>>();
                    let worker = s.spawn(move || {
                        for v in rx {
                            h.update(&v);
                            let _ = back_tx.send(v);
                        }
                    });
                    let res = self.read_and_send(sock, &mut range, &mut |_, b: &[u8], _| {
                        let mut v = back_rx.try_recv().unwrap_or_default();
                        v.clear();
                        v.extend_from_slice(b);
                        tx.send(v)
                            .map_err(|_| Error::conn("the hashing thread stopped"))
                    });
                    drop(tx);
                    let joined = worker.join();
                    res?;
                    joined.map_err(|_| Error::conn("the hashing thread failed"))
                })
            }
            Digest::Stream(h) => self.read_and_send(sock, &mut range, &mut |_, b: &[u8], _| {
                h.update(b);
                Ok(())
            }),
            Digest::Tree(t) => self.read_and_send(sock, &mut range, &mut |at, b: &[u8], spans| {
                t.record_spans(at, b, spans);
                Ok(())
            }),
            Digest::None => self.read_and_send(sock, &mut range, &mut |_, _: &[u8], _| Ok(())),
        }
    }

    /// Queues the range in the ring and carries out its actions until it is all sent.
    fn read_and_send(
        &mut self,
        sock: &ExsSocket,
        range: &mut RangeRead<'_, '_>,
        after_read: &mut AfterRead<'_>,
    ) -> Result<()> {
        range.prepare(self.direct);
        self.ring.queue(range.piece);
        let res = self.drive(sock, &mut |me: &mut Sender, slot, piece| {
            me.fill_block(sock, range, slot, piece, after_read)
        });
        if res.is_err() {
            self.ring.cancel_pending();
            // Nor are the blocks filled and not yet sent: none lingers behind the failure.
            for slot in self.ring.cancel_ready() {
                let msg = self.msgs[slot].take();
                if self.mapped[slot].take().is_none() {
                    self.blocks[slot] = msg.map(|m| ExsBuf::new(m.region().clone()));
                }
            }
        }
        res
    }

    /// Carries out the ring's actions until nothing is left to read or send (what is in
    /// flight completes later): reads through `read`, sends, and waits for completions.
    fn drive(
        &mut self,
        sock: &ExsSocket,
        read: &mut dyn FnMut(&mut Sender, SlotId, Piece) -> Result<()>,
    ) -> Result<()> {
        loop {
            match self.ring.step() {
                Some(Action::ReadInto { slot, piece }) => {
                    if let Err(e) = read(self, slot, piece) {
                        // Not filled: the slot is free again (its block, if kept, with it).
                        self.ring.release(slot);
                        return Err(e);
                    }
                }
                Some(Action::Send { slot, .. }) => {
                    let msg = self.msgs[slot]
                        .take()
                        .ok_or_else(|| Error::conn("internal: a send of an empty slot"))?;
                    if let Err(e) = self.still_mapped(slot) {
                        // Not posted: its credit comes back, its mapping goes.
                        self.mapped[slot] = None;
                        self.ring.sent(slot);
                        return Err(e);
                    }
                    sock.send_to(Some(&self.dq), msg, 0, Flags::NONE, slot as u64);
                }
                Some(Action::Wait) if self.ring.has_pending() => self.reap_one()?,
                // Only sends in flight: they complete while the caller goes on.
                Some(Action::Wait) | None => return Ok(()),
                Some(other) => {
                    return Err(Error::conn(format!("internal: a sender asked {other:?}")))
                }
            }
        }
    }

    /// Fails if `slot` sends a file mapping whose range the file no longer holds (truncated
    /// since it was mapped): a send posted now would end the connection (`EFAULT`), an
    /// error here fails only the transfer, as a changed source. (A truncation after this
    /// check still ends the connection, and nothing else.)
    fn still_mapped(&self, slot: SlotId) -> Result<()> {
        let Some((file, end)) = &self.mapped[slot] else {
            return Ok(());
        };
        let size = file
            .metadata()
            .map_err(|e| Error::io("stat the file being sent", &e))?
            .len();
        if size < *end {
            return Err(Error::io(
                format!("send up to offset {end}"),
                &std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
            ));
        }
        Ok(())
    }

    /// Reads `piece` into `slot`'s block, checksums it, writes its frame header and marks
    /// it filled.
    fn fill_block(
        &mut self,
        sock: &ExsSocket,
        range: &mut RangeRead<'_, '_>,
        slot: SlotId,
        piece: Piece,
        after_read: &mut AfterRead<'_>,
    ) -> Result<()> {
        if let Source::Vouched(file, blocks) = range.src {
            if let Some(check) = self.vouched(range, blocks, piece) {
                if vouched_copies() {
                    return self.fill_vouched(sock, range, slot, piece, check);
                }
                return self.fill_unread(sock, (range, file), slot, piece, check);
            }
        }
        let buf = self.block_of(sock, slot)?;
        // Until it is filled the slot's block is held here: put it back if anything fails.
        let res = self.fill(range, slot, &buf, piece, after_read);
        match res {
            Ok(len) => {
                let wire = len + self.check.trailer();
                let msg = buf
                    .slice(..FRAME_HEAD + wire)
                    .map_err(|e| Error::conn(format!("slice staging block: {e}")))?;
                self.msgs[slot] = Some(msg);
                self.ring.filled(slot, FRAME_HEAD + wire);
                (range.progress)(len as u64);
                Ok(())
            }
            Err(e) => {
                self.blocks[slot] = Some(ExsBuf::new(buf.region().clone()));
                Err(e)
            }
        }
    }

    /// The cached digest of `piece` if it may be sent unread: a whole block of the entry's
    /// size at a block offset, large enough, of the check this sender computes.
    fn vouched(
        &self,
        range: &RangeRead<'_, '_>,
        blocks: &crate::sumcache::Blocks,
        piece: Piece,
    ) -> Option<(BlockDigest, bool)> {
        use crate::sumcache::Checks;
        let size = range.size?;
        let (block, at) = (blocks.block, piece.offset);
        let whole = at.is_multiple_of(block) && piece.len == block.min(size.saturating_sub(at));
        if !whole || piece.len < MIN_UNREAD || !blocks.covers(size) || !zero_copy_sends() {
            return None;
        }
        let i = usize::try_from(at / block).ok()?;
        match (&blocks.checks, self.check) {
            (Checks::Crc(v), BlockCheck::Crc) => Some((BlockDigest::Crc(*v.get(i)?), false)),
            (Checks::Spans(v), BlockCheck::Tag(_)) => Some((BlockDigest::Hash(*v.get(i)?), true)),
            _ => None,
        }
    }

    /// Sends `piece` of `file` from a mapping of its pages, with no read into user space,
    /// under a header whose check comes from the checksum cache (`digest`, of its spans or
    /// not). The file is checked to still hold the piece before the send is posted
    /// ([`Sender::still_mapped`]); a truncation after that fails the send in the kernel
    /// (the connection ends), never in this process.
    fn fill_unread(
        &mut self,
        sock: &ExsSocket,
        (range, file): (&RangeRead<'_, '_>, &std::fs::File),
        slot: SlotId,
        piece: Piece,
        (digest, spans): (BlockDigest, bool),
    ) -> Result<()> {
        let n = usize::try_from(piece.len).map_err(|_| Error::conn("internal: block too large"))?;
        // Checked again before the send is posted ([`Sender::still_mapped`]).
        let kept = file
            .try_clone()
            .map_err(|e| Error::io("hold the file being sent", &e))?;
        // The kernel's copy walks the pages (mapped up front); `sendfile` never touches them.
        let populate = !ferry_fabric::drivers::tcp::sendfile_sends();
        let map = ferry_fabric::Buffer::map_file_after(file, piece.offset, n, FRAME_HEAD, populate)
            .map_err(|e| Error::conn(format!("map the file being sent: {e}")))?;
        let buf = sock
            .register_with(map, rights(sock, Use::Send))
            .map_err(|e| Error::conn(format!("register the file being sent: {e}")))?;
        let value = self
            .check
            .value(&digest, piece.transfer, piece.offset, n as u32);
        let head = (range.head)(&piece, value, spans)?;
        buf.write_at(0, &head)
            .map_err(|e| Error::conn(format!("fill block header: {e}")))?;
        self.msgs[slot] = Some(buf);
        self.mapped[slot] = Some((kept, piece.end()));
        self.ring.filled(slot, FRAME_HEAD + n);
        UNREAD.fetch_add(piece.len, Ordering::Relaxed);
        UNREAD_HERE.with(|c| c.set(c.get() + piece.len));
        (range.progress)(piece.len);
        if piece.offset == range.piece.offset {
            crate::stamp::test_pause_after_unread();
        }
        Ok(())
    }

    /// Reads `piece` into `slot`'s staging block under a header whose check comes from the
    /// checksum cache (`digest`, of its spans or not): a copy, and no checksum computed.
    fn fill_vouched(
        &mut self,
        sock: &ExsSocket,
        range: &RangeRead<'_, '_>,
        slot: SlotId,
        piece: Piece,
        (digest, spans): (BlockDigest, bool),
    ) -> Result<()> {
        let n = usize::try_from(piece.len).map_err(|_| Error::conn("internal: block too large"))?;
        let buf = self.block_of(sock, slot)?;
        let value = self
            .check
            .value(&digest, piece.transfer, piece.offset, n as u32);
        let filled = range.read(&buf, piece).and_then(|()| {
            let head = (range.head)(&piece, value, spans)?;
            buf.write_at(0, &head)
                .map_err(|e| Error::conn(format!("fill block header: {e}")))
        });
        if let Err(e) = filled {
            self.blocks[slot] = Some(ExsBuf::new(buf.region().clone()));
            return Err(e);
        }
        let msg = buf
            .slice(..FRAME_HEAD + n)
            .map_err(|e| Error::conn(format!("slice staging block: {e}")))?;
        self.zeroed.remove(&slot);
        self.msgs[slot] = Some(msg);
        self.ring.filled(slot, FRAME_HEAD + n);
        (range.progress)(piece.len);
        Ok(())
    }

    /// Notes `piece`'s check for the checksum cache, if gathering and it is a whole block.
    fn note_check(&mut self, piece: Piece, digest: Option<(BlockDigest, bool)>) {
        let Some(c) = self.collect.as_mut() else {
            return;
        };
        let whole = piece.offset.is_multiple_of(c.block)
            && piece.len == c.block.min(c.size.saturating_sub(piece.offset));
        let slot = usize::try_from(piece.offset / c.block)
            .ok()
            .and_then(|i| c.got.get_mut(i));
        if let (true, Some(slot), Some(d)) = (whole, slot, digest) {
            *slot = Some(d);
        }
    }

    /// Fills `buf` (slot `slot`) with `piece` and its header; the payload's length (a sealed
    /// block's [`BlockCheck::trailer`] follows it).
    fn fill(
        &mut self,
        range: &mut RangeRead<'_, '_>,
        slot: SlotId,
        buf: &ExsBuf,
        piece: Piece,
        after_read: &mut AfterRead<'_>,
    ) -> Result<usize> {
        let n = usize::try_from(piece.len).map_err(|_| Error::conn("internal: block too large"))?;
        if buf.len() < FRAME_HEAD + n + self.check.trailer() {
            return Err(Error::conn("internal: staging block too small"));
        }
        let (mem, at) = (buf.buffer(), buf.offset() + FRAME_HEAD);
        match range.src {
            Source::File(_) | Source::Vouched(..) => {
                self.zeroed.remove(&slot);
                range.read(buf, piece)?;
            }
            Source::Zero => {
                if self.zeroed.insert(slot) {
                    mem.copy_from(at, &zero_block(self.block()), 0, self.block());
                }
            }
        }
        if self.check.seals() {
            return self.seal(range, slot, buf, piece, after_read);
        }
        // A zero source's staging blocks hold zeros (`zeroed`), so one digest serves them
        // all (its block's place goes into the check value after). A file's blocks at
        // `integrity` are digested by their spans, which the file's hash tree takes too.
        let check = self.check;
        let zero = match (range.src, self.zero_digest) {
            (Source::Zero, Some((len, d))) if len == n && check.reads_as(&d) => Some(d),
            _ => None,
        };
        let checked = !crate::hash::checksums_off();
        let by_spans = checked && check.reads_spans() && range.src.file().is_some();
        let size = range.size;
        // The digest, and whether it is the spans' (the block's header says so).
        let digest = mem.with_bytes(at, n, |b| -> Result<Option<(BlockDigest, bool)>> {
            let spans = size
                .filter(|_| by_spans)
                .and_then(|size| BlockSpans::of(piece.offset, b, size));
            after_read(piece.offset, b, spans.as_ref())?;
            Ok(match spans {
                Some(s) => Some((BlockDigest::Hash(s.digest()), true)),
                None if checked => Some((zero.unwrap_or_else(|| check.digest(b)), false)),
                None => None,
            })
        })?;
        if range.src.file().is_some() {
            self.note_check(piece, digest);
        }
        let (value, spans) = match digest {
            Some((d, spans)) => {
                if matches!(range.src, Source::Zero) {
                    self.zero_digest = Some((n, d));
                }
                (
                    check.value(&d, piece.transfer, piece.offset, n as u32),
                    spans,
                )
            }
            None => (0, false),
        };
        let head = (range.head)(&piece, value, spans)?;
        buf.write_at(0, &head)
            .map_err(|e| Error::conn(format!("fill staging block: {e}")))?;
        if test_corrupt(buf, FRAME_HEAD, n) {
            self.zeroed.remove(&slot);
        }
        Ok(n)
    }

    /// Encrypts the block read into `buf`'s payload area in place (once the digest was fed
    /// its bytes) and writes its header: the frame's header, ciphertext and seal trailer.
    /// The payload's length.
    fn seal(
        &mut self,
        range: &mut RangeRead<'_, '_>,
        slot: SlotId,
        buf: &ExsBuf,
        piece: Piece,
        after_read: &mut AfterRead<'_>,
    ) -> Result<usize> {
        let n = piece.len as usize;
        let (mem, at, check) = (buf.buffer(), buf.offset() + FRAME_HEAD, self.check);
        // The ciphertext replaces a zero source's zeros: cleared again before next use.
        self.zeroed.remove(&slot);
        mem.with_bytes_mut(at, n + check.trailer(), |b| -> Result<()> {
            after_read(piece.offset, &b[..n], None)?;
            check.seal(piece.transfer, piece.offset, b)
        })?;
        let head = (range.head)(&piece, 0, false)?;
        buf.write_at(0, &head)
            .map_err(|e| Error::conn(format!("fill staging block: {e}")))?;
        test_corrupt(buf, FRAME_HEAD, n);
        Ok(n)
    }

    /// `slot`'s block (allocated on its first use, or again if the one kept is too small
    /// for a sealed block's trailer), with byte 0 where a frame header starts.
    fn block_of(&mut self, sock: &ExsSocket, slot: SlotId) -> Result<ExsBuf> {
        let room = FRAME_HEAD + self.block() + self.check.trailer();
        let kept = self.blocks[slot].take().map(|b| {
            b.slice(HEAD_ROOM - FRAME_HEAD..)
                .map_err(|e| Error::conn(format!("slice staging block: {e}")))
        });
        match kept {
            Some(Ok(b)) if b.len() >= room => Ok(b),
            Some(Err(e)) => Err(e),
            small => {
                if let Some(Ok(b)) = small {
                    self.staged_bytes = self.staged_bytes.saturating_sub(pinned(&b));
                }
                let buf = alloc_aligned(sock, room, "staging block", Use::Send)?;
                self.staged_bytes += pinned(&buf);
                Ok(buf)
            }
        }
    }

    /// Waits for one send completion and takes its block back.
    fn reap_one(&mut self) -> Result<()> {
        let ev = self
            .dq
            .dequeue(self.timeout)
            .ok_or_else(|| Error::conn("the peer stopped taking data; giving up"))?;
        if ev.kind == EventKind::Send {
            let slot = usize::try_from(ev.ctx)
                .ok()
                .filter(|&s| s < self.blocks.len())
                .ok_or_else(|| Error::conn("internal: a send completion of no slot"))?;
            if let Some((_, end)) = self.mapped[slot].take() {
                // A file mapping: unmapped as it drops; the slot's block stays as it was.
                // Torn: read in user space (a provider's copy) after the file shrank, so
                // zeros went instead of the file's bytes: the file changed under the send.
                let torn = ev.buf.as_ref().is_some_and(|b| b.buffer().file_torn());
                drop(ev.buf);
                if torn {
                    self.ring.sent(slot);
                    return Err(Error::io(
                        format!("send up to offset {end}"),
                        &std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
                    ));
                }
            } else if let Some(buf) = ev.buf {
                // The send used part of the block; keep the whole block.
                self.blocks[slot] = Some(ExsBuf::new(buf.region().clone()));
            }
            self.ring.sent(slot);
        }
        ev.result.map_err(|e| exs_err("send block", e))
    }
}

/// One range being read: its source, and the file's direct-I/O handle.
struct RangeRead<'s, 'f> {
    src: Source<'s>,
    piece: Piece,
    direct: Option<std::fs::File>,
    /// The file's size when the range started (what its blocks' spans are cut by).
    size: Option<u64>,
    /// The block size, the most read ahead at a time.
    block: u64,
    progress: &'f dyn Fn(u64),
    head: &'f Head<'f>,
}

impl RangeRead<'_, '_> {
    /// Opens the direct handle (asked for, or where it helps: [`direct_read_helps`]), or
    /// advises the kernel of a sequential read of the range; notes the file's size.
    fn prepare(&mut self, direct: bool) {
        let Some(file) = self.src.file() else {
            return;
        };
        // The size the transfer announced, unless the file changed since: then its blocks'
        // tags fail, and the change is caught before the copy could commit.
        self.size = file.metadata().ok().map(|m| m.len());
        if direct {
            self.direct = open_direct_or_warn(file, false);
        } else if direct_read_helps(file, self.size.unwrap_or(0), self.piece.offset) {
            // Unasked: where the filesystem refuses it after all, quietly buffered.
            self.direct = open_direct(file, false).ok();
        }
        if self.direct.is_none() {
            // A larger kernel readahead window for the whole range (advice only).
            let _ = rustix::fs::fadvise(
                file,
                self.piece.offset,
                std::num::NonZeroU64::new(self.piece.len),
                rustix::fs::Advice::Sequential,
            );
        }
    }

    /// Reads `piece` of the file into `buf`'s payload area.
    fn read(&self, buf: &ExsBuf, piece: Piece) -> Result<()> {
        let Some(file) = self.src.file() else {
            return Ok(());
        };
        let (pos, n) = (piece.offset, piece.len as usize);
        let (mem, at) = (buf.buffer(), buf.offset() + FRAME_HEAD);
        let aligned = direct_aligned(buf.addr() + FRAME_HEAD, pos, n);
        let read = match &self.direct {
            Some(d) if aligned => mem.read_file_at(at, n, d, pos),
            _ => {
                // The disk reads the next block while this one is read, checked and sent.
                let (next, end) = (pos + n as u64, self.piece.end());
                if next < end && self.direct.is_none() {
                    let _ = rustix::fs::fadvise(
                        file,
                        next,
                        std::num::NonZeroU64::new((end - next).min(self.block)),
                        rustix::fs::Advice::WillNeed,
                    );
                }
                mem.read_file_at(at, n, file, pos)
            }
        };
        read.map_err(|e| Error::io(format!("read at offset {pos}"), &e))?;
        if pos == self.piece.offset {
            crate::stamp::test_pause_after_read();
        }
        Ok(())
    }
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

/// The test hook (`FERRY_TEST_CORRUPT_BLOCKS`): flips the first byte of the `n`-byte
/// payload at `at` of `buf`, after its checksums were computed, while the hook allows. True
/// if it did. A face calls it for the frames it fills itself.
pub fn test_corrupt(buf: &ExsBuf, at: usize, n: usize) -> bool {
    if n == 0 || !corrupt_this_block() {
        return false;
    }
    let first = buf.buffer().with_bytes(buf.offset() + at, 1, |b| b[0]);
    let _ = buf.write_at(at, &[first ^ 0xff]);
    true
}
