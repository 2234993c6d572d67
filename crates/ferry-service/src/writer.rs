//! The receiving half of the staging ring: the runtime of [`LandRing`], which lands received
//! blocks in a [`BlockSink`] on the network thread or on a disk writer thread of its own.
//!
//! The ring core decides; this module only carries out what it asks. Each block handed
//! over takes a slot of the writer's ring ([`LandRing::arrived`]); the core answers
//! [`Action::Write`] in arrival order (the sink checks the block's CRC-32C, `pwrite`s a good
//! one and hashes the file in order), then [`Action::Repost`] once the write returned: only
//! then does a block's receive buffer ([`Held`]) go back to the channel for the peer to
//! fill again. When the bytes written since the last one reach the ring's [`Cadence`]
//! (a journaled sink's [`checkpoint_bytes`] or [`CHECKPOINT_EVERY`]), the core asks
//! [`Action::Fsync`]: the journal's checkpoint (fsync the part file, then record the
//! verified ranges; on the journal's own thread, [`crate::writeback`]).
//!
//! A writer thread gets its blocks through a channel bounded by the ring depth and takes
//! those waiting into its free slots before writing any; the blocks it holds are receive
//! buffers the peer cannot fill, so a slow disk stalls the sender. Files up to two blocks
//! are written inline, by a ring of one slot, before the call returns.

use std::fs::File;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::Instant;

use crate::channel::Held;
use crate::error::{Error, Result};
use crate::landing::{checkpoint_bytes, CHECKPOINT_EVERY};
use crate::ring::{staging_threads, Action, Cadence, LandRing, Piece, SlotId};
use crate::sink::{Block, BlockSink};

/// Files from this size on get a writer thread (with staging threads on); smaller ones are
/// written inline. Two default (4 MiB) blocks.
const THREADED_MIN: u64 = 8 << 20;

/// The writer's answer to a sync: CRC failures since the last one, or what stopped it.
type SyncReply = (Vec<(u64, u32)>, Option<Error>);

enum ToWriter {
    /// A block for the writer thread's ring.
    Block(Landed<Received>),
    Sync(SyncSender<SyncReply>),
}

/// A block in a slot of the ring: its decoded header, the file's BLAKE3 when the block is a
/// whole file in one frame (checked instead of the CRC, [`BlockSink::whole_file`]), and its
/// bytes, which stay where they are until the ring reposts the slot.
struct Landed<P> {
    block: Block,
    whole: Option<[u8; 32]>,
    payload: P,
}

/// A block's bytes as a slot holds them.
trait Payload {
    /// Runs `f` over the bytes, in place.
    fn with_payload<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R;

    /// Runs `f` over the bytes mutably (a `private` block is opened in place): a copy
    /// unless the bytes are this slot's own.
    fn with_payload_mut<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        self.with_payload(|b| f(&mut b.to_vec()))
    }
}

impl Payload for &[u8] {
    fn with_payload<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(self)
    }
}

/// The bytes of a block handed to the writer thread.
enum Received {
    /// Still in its receive buffer, the payload from byte `at`: dropping it (the ring's
    /// repost) gives the buffer back to the channel.
    Held { held: Held, at: usize },
    /// Copied for the thread (a whole file in one frame, [`BlockWriter::push_block`]).
    Copied(Vec<u8>),
}

impl Payload for Received {
    fn with_payload<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            Received::Held { held, at } => held.with_bytes(|b| f(b.get(*at..).unwrap_or(&[]))),
            Received::Copied(v) => f(v),
        }
    }

    fn with_payload_mut<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        match self {
            Received::Held { held, at } => {
                let at = *at;
                held.with_bytes_mut(|b| f(b.get_mut(at..).unwrap_or(&mut [])))
            }
            Received::Copied(v) => f(v),
        }
    }
}

/// The runtime of a [`LandRing`]: writes with the sink, reposts by letting a slot's payload
/// go, checkpoints the sink's journal, and reports each back to the core.
struct Lander {
    ring: LandRing,
    sink: BlockSink,
    /// `None` for the null sink of memory mode.
    file: Option<File>,
    /// The first error a block met (one outside the transfer); later blocks are only
    /// reposted until a sync takes it.
    fatal: Option<Error>,
}

impl Lander {
    /// A ring of `slots` slots landing in `sink`, with the fsync cadence a sink wants: its
    /// journal's ([`checkpoint_bytes`] of its size, [`CHECKPOINT_EVERY`]), or none without a journal.
    fn new(sink: BlockSink, file: Option<File>, slots: usize) -> Lander {
        let now = Instant::now();
        let cadence = if sink.journals() && file.is_some() {
            Cadence::new(checkpoint_bytes(sink.size()), CHECKPOINT_EVERY, now)
        } else {
            Cadence::never(now)
        };
        Self::with_cadence(sink, file, slots, cadence)
    }

    fn with_cadence(sink: BlockSink, file: Option<File>, slots: usize, cadence: Cadence) -> Lander {
        Lander {
            // One write at a time: a second writer would only reorder the in-order hash.
            ring: LandRing::new(slots, 1, cadence),
            sink,
            file,
            fatal: None,
        }
    }

    /// Whether a slot is free for another block.
    fn has_room(&self) -> bool {
        self.ring.free_slot().is_some()
    }

    /// `landed` arrived: it takes the ring's lowest free slot in `slots` (the table of what
    /// each slot holds, as long as the ring has slots).
    fn arrive<P>(&mut self, slots: &mut [Option<Landed<P>>], landed: Landed<P>) {
        let free = self
            .ring
            .free_slot()
            .and_then(|s| Some((s, slots.get_mut(s)?)));
        let Some((slot, at)) = free else {
            // Dropped: the buffer goes back unwritten, and the transfer fails.
            self.fatal
                .get_or_insert_with(|| Error::conn("internal: a block with no free slot"));
            return;
        };
        let b = landed.block;
        *at = Some(landed);
        let piece = Piece {
            transfer: b.transfer,
            offset: b.offset,
            len: u64::from(b.len),
        };
        self.ring.arrived(slot, piece);
    }

    /// Carries out the ring's actions until it waits for the next arrival: every block
    /// landed is written and reposted, and the journal checkpointed when due.
    fn run<P: Payload>(&mut self, slots: &mut [Option<Landed<P>>]) {
        loop {
            match self.ring.due(Instant::now()) {
                Some(Action::Write { slot, .. }) => self.write(slots, slot),
                Some(Action::Fsync) => self.checkpoint(),
                // Writes finish before the core is asked again: nothing else to wait for.
                _ => return,
            }
        }
    }

    /// The ring's `Write` of `slot`, then its `Repost`.
    fn write<P: Payload>(&mut self, slots: &mut [Option<Landed<P>>], slot: SlotId) {
        let mut landed = slots.get_mut(slot).and_then(Option::take);
        let before = self.sink.stored();
        if let (Some(l), true) = (&mut landed, self.fatal.is_none()) {
            let (sink, file, block) = (&mut self.sink, self.file.as_ref(), l.block);
            let res = match &l.whole {
                Some(hash) => l
                    .payload
                    .with_payload(|b| sink.whole_file(file, &block, b, hash)),
                None if block.check.seals() => l
                    .payload
                    .with_payload_mut(|b| sink.sealed_block(file, &block, b)),
                None => l.payload.with_payload(|b| sink.block(file, &block, b)),
            };
            if let Err(e) = res {
                self.fatal = Some(e);
            }
        }
        let repost = self.ring.written(slot, self.sink.stored() - before);
        debug_assert_eq!(repost, Action::Repost { slot });
        // The repost: only now, written, does the buffer go back to the network.
        drop(landed);
    }

    /// The ring's `Fsync`: the journal's checkpoint, handed to its thread (a failure is the
    /// transfer's write error), then reported done as far as this ring is concerned.
    fn checkpoint(&mut self) {
        if let Some(file) = &self.file {
            self.sink.checkpoint_in_background(file);
        }
        self.ring.synced(Instant::now());
    }

    /// Lands one block on this thread (an inline writer's ring has one slot): `Err` if it
    /// lies outside the transfer.
    fn land_now<P: Payload>(&mut self, landed: Landed<P>) -> Result<()> {
        let mut slots = [None];
        self.arrive(&mut slots, landed);
        self.run(&mut slots);
        self.fatal.take().map_or(Ok(()), Err)
    }

    /// The answer to a sync: the CRC failures since the last, or the error that stopped
    /// the writer.
    fn take_sync(&mut self) -> SyncReply {
        (std::mem::take(&mut self.sink.bad), self.fatal.take())
    }
}

/// Lands one transfer's blocks in a [`BlockSink`] (see the module documentation). A face
/// hands it blocks described by anything that converts into a [`Block`] (its decoded
/// header).
pub struct BlockWriter {
    inner: WriterKind,
}

enum WriterKind {
    Inline(Box<Lander>),
    Thread {
        tx: SyncSender<ToWriter>,
        handle: std::thread::JoinHandle<BlockSink>,
    },
}

impl BlockWriter {
    /// A writer of transfer `file_id` (`size` bytes) into `file` (a duplicate handle is
    /// kept; the caller's stays usable), with a ring of `ring` blocks.
    pub fn new(file_id: u32, size: u64, file: &File, ring: usize) -> Result<Self> {
        Self::with_sink(BlockSink::new(file_id, size), file, ring)
    }

    /// A writer feeding `sink` (e.g. one that journals, [`BlockSink::journaled`]).
    pub fn with_sink(sink: BlockSink, file: &File, ring: usize) -> Result<Self> {
        let size = sink.size();
        let file = file
            .try_clone()
            .map_err(|e| Error::io("duplicate file handle", &e))?;
        if size < THREADED_MIN || !staging_threads() {
            return Ok(Self::inline(sink, Some(file)));
        }
        let ring = ring.max(1);
        let (tx, rx) = sync_channel::<ToWriter>(ring);
        let lander = Lander::new(sink, Some(file), ring);
        let handle = std::thread::Builder::new()
            .name("ferry-writer".into())
            .spawn(move || write_loop(lander, rx))
            .map_err(|e| Error::io("start writer thread", &e))?;
        Ok(BlockWriter {
            inner: WriterKind::Thread { tx, handle },
        })
    }

    fn inline(sink: BlockSink, file: Option<File>) -> Self {
        BlockWriter {
            inner: WriterKind::Inline(Box::new(Lander::new(sink, file, 1))),
        }
    }

    /// The null sink of memory mode for transfer `file_id` (`size` bytes): every block's
    /// CRC-32C and bounds are checked, nothing is written or hashed.
    pub fn null(file_id: u32, size: u64) -> Self {
        Self::null_sink(BlockSink::new(file_id, size))
    }

    /// The null sink feeding `sink` (e.g. one range of a parallel transfer).
    pub fn null_sink(sink: BlockSink) -> Self {
        Self::inline(sink, None)
    }

    /// Takes a whole file that came in one frame, checked against the file's BLAKE3
    /// instead of its CRC (see [`BlockSink::whole_file`]).
    pub fn push_file(
        &mut self,
        block: impl Into<Block>,
        payload: &[u8],
        blake3: &[u8; 32],
    ) -> Result<()> {
        self.push(block.into(), Some(*blake3), payload)
    }

    /// Checks and writes one block given as its decoded header and a borrowed payload (in
    /// place in a receive buffer, or the block of a whole-file frame): on the calling
    /// thread, or for a threaded writer copied to it. Received blocks go in their buffers
    /// instead ([`BlockWriter::push_held`]); only a whole file in one frame larger than a
    /// threaded writer's threshold takes the copy. The frame is decoded once, by the caller.
    pub fn push_block(&mut self, block: impl Into<Block>, payload: &[u8]) -> Result<()> {
        self.push(block.into(), None, payload)
    }

    fn push(&mut self, block: Block, whole: Option<[u8; 32]>, payload: &[u8]) -> Result<()> {
        match &mut self.inner {
            WriterKind::Inline(lander) => lander.land_now(Landed {
                block,
                whole,
                payload,
            }),
            WriterKind::Thread { tx, .. } => tx
                .send(ToWriter::Block(Landed {
                    block,
                    whole,
                    payload: Received::Copied(payload.to_vec()),
                }))
                .map_err(|_| writer_stopped()),
        }
    }

    /// Hands over one block still in its received buffer (`held`, the payload from byte
    /// `at`), whose header the caller decoded: no copy; the buffer is posted again once the
    /// block is written. Blocks while the ring is full.
    pub fn push_held(&mut self, block: impl Into<Block>, held: Held, at: usize) -> Result<()> {
        if at > held.len() {
            return Err(Error::conn("internal: a payload beyond its message"));
        }
        let landed = Landed {
            block: block.into(),
            whole: None,
            payload: Received::Held { held, at },
        };
        match &mut self.inner {
            WriterKind::Inline(lander) => lander.land_now(landed),
            WriterKind::Thread { tx, .. } => tx
                .send(ToWriter::Block(landed))
                .map_err(|_| writer_stopped()),
        }
    }

    /// Waits until every block handed over is written, and takes the ranges whose CRC
    /// failed since the last call.
    pub fn sync(&mut self) -> Result<Vec<(u64, u32)>> {
        let (bad, fatal) = match &mut self.inner {
            WriterKind::Inline(lander) => lander.take_sync(),
            WriterKind::Thread { tx, .. } => {
                let (rtx, rrx) = sync_channel(1);
                tx.send(ToWriter::Sync(rtx)).map_err(|_| writer_stopped())?;
                rrx.recv().map_err(|_| writer_stopped())?
            }
        };
        match fatal {
            Some(e) => Err(e),
            None => Ok(bad),
        }
    }

    /// Stops the writer and returns its sink (write errors, including those of its
    /// background checkpoints, and hash state).
    pub fn finish(self) -> Result<BlockSink> {
        let mut sink = match self.inner {
            WriterKind::Inline(lander) => lander.sink,
            WriterKind::Thread { tx, handle } => {
                drop(tx);
                handle
                    .join()
                    .map_err(|_| Error::conn("the disk writer thread failed"))?
            }
        };
        sink.settle();
        Ok(sink)
    }
}

/// The writer thread: each block handed over arrives in a slot of its ring, with those
/// already waiting taking the other free slots before any is written (the ring then writes
/// them in arrival order); a sync is answered once everything before it is written.
fn write_loop(mut lander: Lander, rx: Receiver<ToWriter>) -> BlockSink {
    let mut slots: Vec<Option<Landed<Received>>> = (0..lander.ring.slots()).map(|_| None).collect();
    let mut next: Option<ToWriter> = None;
    loop {
        let m = match next.take() {
            Some(m) => m,
            None => match rx.recv() {
                Ok(m) => m,
                Err(_) => break,
            },
        };
        match m {
            ToWriter::Block(landed) => {
                lander.arrive(&mut slots, landed);
                while lander.has_room() {
                    match rx.try_recv() {
                        Ok(ToWriter::Block(more)) => lander.arrive(&mut slots, more),
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                lander.run(&mut slots);
            }
            ToWriter::Sync(reply) => {
                let _ = reply.send(lander.take_sync());
            }
        }
    }
    lander.sink
}

fn writer_stopped() -> Error {
    Error::conn("the disk writer thread stopped")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::tests::{open, tmp};
    use crate::journal::{Ident, Journal};
    use crate::landing::Progress;
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    const BLOCK: usize = 1000;

    /// A block's bytes that, when the ring reposts them (drops them), look whether the file
    /// already holds them at their offset: a repost before the write finished would find
    /// the file without them.
    struct Probe {
        bytes: Vec<u8>,
        offset: u64,
        file: File,
        early: Arc<AtomicUsize>,
        reposted: Arc<AtomicUsize>,
    }

    impl Payload for Probe {
        fn with_payload<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
            f(&self.bytes)
        }
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            let mut on_disk = vec![0u8; self.bytes.len()];
            let got = self.file.read_exact_at(&mut on_disk, self.offset);
            if got.is_err() || on_disk != self.bytes {
                self.early.fetch_add(1, Ordering::SeqCst);
            }
            self.reposted.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn block_at(i: usize) -> (Block, Vec<u8>) {
        let bytes: Vec<u8> = (0..BLOCK).map(|j| (i * 7 + j % 251 + 1) as u8).collect();
        let block = Block {
            transfer: 1,
            offset: (i * BLOCK) as u64,
            len: BLOCK as u32,
            crc32c: crc32c::crc32c(&bytes),
            check: Default::default(),
            spans: false,
        };
        (block, bytes)
    }

    /// A journaled sink for a file of `blocks` blocks, its part (already unlinked) and its
    /// journal's path.
    fn journaled(tag: &str, blocks: usize) -> (BlockSink, File, std::path::PathBuf) {
        let size = (blocks * BLOCK) as u64;
        let jpath = tmp(&format!("{tag}-journal"));
        let journal =
            Journal::create(open(&jpath), Ident { size, mtime: 3 }, BLOCK as u32).expect("journal");
        let ppath = tmp(&format!("{tag}-part"));
        let part = open(&ppath);
        let _ = std::fs::remove_file(&ppath);
        let sink = BlockSink::journaled(1, size, Progress::new(journal));
        (sink, part, jpath)
    }

    /// Blocks waiting together take the ring's slots, are written in arrival order, and each
    /// goes back to the network only once its bytes are in the file.
    #[test]
    fn a_slot_is_reposted_only_once_its_block_is_written() {
        let (sink, part, jpath) = journaled("repost", 7);
        let _ = std::fs::remove_file(&jpath);
        let mut lander = Lander::new(sink, Some(part.try_clone().expect("dup")), 3);
        let mut slots: Vec<Option<Landed<Probe>>> = (0..3).map(|_| None).collect();
        let (early, reposted) = (Arc::default(), Arc::<AtomicUsize>::default());
        for batch in [0..3, 3..5, 5..7] {
            for i in batch {
                assert!(lander.has_room(), "a free slot for block {i}");
                let (block, bytes) = block_at(i);
                let payload = Probe {
                    bytes,
                    offset: block.offset,
                    file: part.try_clone().expect("dup"),
                    early: Arc::clone(&early),
                    reposted: Arc::clone(&reposted),
                };
                let landed = Landed {
                    block,
                    whole: None,
                    payload,
                };
                lander.arrive(&mut slots, landed);
            }
            lander.run(&mut slots);
            assert_eq!(lander.ring.credits(), 3, "every slot reposted");
        }
        assert_eq!(reposted.load(Ordering::SeqCst), 7);
        assert_eq!(early.load(Ordering::SeqCst), 0, "a repost before its write");
        assert!(lander.fatal.is_none() && lander.sink.io_error.is_none());
        let want: Vec<u8> = (0..7).flat_map(|i| block_at(i).1).collect();
        let mut got = vec![0u8; want.len()];
        part.read_exact_at(&mut got, 0).expect("read back");
        assert!(got == want);
    }

    /// A journaled transfer checkpoints when its ring's cadence says: with a water mark of
    /// three blocks, the journal holds 3, 6, 9 blocks as they land, never more than was
    /// written, and nothing between marks.
    #[test]
    fn checkpoints_follow_the_rings_cadence() {
        let (sink, part, jpath) = journaled("cadence", 10);
        let mark = Cadence::new(3 * BLOCK as u64, Duration::from_secs(3600), Instant::now());
        let mut lander = Lander::with_cadence(sink, Some(part), 2, mark);
        for i in 0..10 {
            let (block, bytes) = block_at(i);
            lander
                .land_now(Landed {
                    block,
                    whole: None,
                    payload: &bytes[..],
                })
                .expect("land");
            // Wait for the checkpoint handed over, if any, and read the journal.
            lander.sink.settle();
            // (A journal never recorded is empty: nothing journaled.)
            let done = Journal::load(open(&jpath)).map_or(0, |j| j.done());
            let want = ((i + 1) / 3 * 3 * BLOCK) as u64;
            assert_eq!(done, want, "journaled after block {i}");
        }
        assert!(lander.sink.io_error.is_none());
        let _ = std::fs::remove_file(&jpath);
    }
}
