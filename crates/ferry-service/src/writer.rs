//! The receiving half of the staging ring: received blocks into a [`BlockSink`], on the
//! network thread or on a disk writer thread of their own.
//!
//! A writer thread gets its blocks in their receive buffers ([`Held`]) through a channel
//! bounded by the ring depth, and each buffer goes back to the channel once written, so a
//! slow disk leaves the peer fewer receive buffers to fill, which stalls the sender. The
//! sink checks each block's CRC-32C, `pwrite`s the good ones and hashes the file in order.
//! Files up to two blocks are written inline.

use std::fs::File;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use crate::channel::Held;
use crate::error::{Error, Result};
use crate::ring::staging_threads;
use crate::sink::{Block, BlockSink};

/// Files from this size on get a writer thread (with staging threads on); smaller ones are
/// written inline. Two default (4 MiB) blocks.
const THREADED_MIN: u64 = 8 << 20;

/// The writer's answer to a sync: CRC failures since the last one, or what stopped it.
type SyncReply = (Vec<(u64, u32)>, Option<Error>);

enum ToWriter {
    /// A block given as a borrowed payload, copied for the thread (see
    /// [`BlockWriter::push_block`]).
    Copied {
        block: Block,
        bytes: Vec<u8>,
    },
    /// A block still in its received buffer, its payload at byte `at`; the buffer goes
    /// back to the channel once written.
    Held {
        block: Block,
        held: Held,
        at: usize,
    },
    Sync(SyncSender<SyncReply>),
}

/// Lands one transfer's blocks in a [`BlockSink`] (see the module documentation). A face
/// hands it blocks described by anything that converts into a [`Block`] (its decoded
/// header).
pub struct BlockWriter {
    inner: WriterKind,
}

enum WriterKind {
    /// The file is `None` for the null sink.
    Inline(Box<BlockSink>, Option<File>),
    Thread {
        tx: SyncSender<ToWriter>,
        handle: std::thread::JoinHandle<BlockSink>,
    },
}

impl BlockWriter {
    /// A writer of transfer `file_id` (`size` bytes) into `file` (a duplicate handle is
    /// kept; the caller's stays usable), with at most `ring` blocks queued.
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
            return Ok(BlockWriter {
                inner: WriterKind::Inline(Box::new(sink), Some(file)),
            });
        }
        let (tx, rx) = sync_channel::<ToWriter>(ring.max(1));
        let handle = std::thread::Builder::new()
            .name("ferry-writer".into())
            .spawn(move || write_loop(sink, &file, rx))
            .map_err(|e| Error::io("start writer thread", &e))?;
        Ok(BlockWriter {
            inner: WriterKind::Thread { tx, handle },
        })
    }

    /// The null sink of memory mode for transfer `file_id` (`size` bytes): every block's
    /// CRC-32C and bounds are checked, nothing is written or hashed.
    pub fn null(file_id: u32, size: u64) -> Self {
        Self::null_sink(BlockSink::new(file_id, size))
    }

    /// The null sink feeding `sink` (e.g. one range of a parallel transfer).
    pub fn null_sink(sink: BlockSink) -> Self {
        BlockWriter {
            inner: WriterKind::Inline(Box::new(sink), None),
        }
    }

    /// Takes a whole file that came in one frame, checked against the file's BLAKE3
    /// instead of its CRC (see [`BlockSink::whole_file`]).
    pub fn push_file(
        &mut self,
        block: impl Into<Block>,
        payload: &[u8],
        blake3: &[u8; 32],
    ) -> Result<()> {
        match &mut self.inner {
            WriterKind::Inline(sink, file) => {
                sink.whole_file(file.as_ref(), &block.into(), payload, blake3)
            }
            WriterKind::Thread { .. } => self.push_block(block, payload),
        }
    }

    /// Checks and writes one block given as its decoded header and a borrowed payload (in
    /// place in a receive buffer, or the block of a whole-file frame): on the calling
    /// thread, or for a threaded writer copied to it. Received blocks go in their buffers
    /// instead ([`BlockWriter::push_held`]); only a whole file in one frame larger than a
    /// threaded writer's threshold takes the copy. The frame is decoded once, by the caller.
    pub fn push_block(&mut self, block: impl Into<Block>, payload: &[u8]) -> Result<()> {
        let block = block.into();
        match &mut self.inner {
            WriterKind::Inline(sink, file) => sink.block(file.as_ref(), &block, payload),
            WriterKind::Thread { tx, .. } => tx
                .send(ToWriter::Copied {
                    block,
                    bytes: payload.to_vec(),
                })
                .map_err(|_| writer_stopped()),
        }
    }

    /// Hands over one block still in its received buffer (`held`, the payload from byte
    /// `at`), whose header the caller decoded: no copy; the buffer is posted again once the
    /// block is written. Blocks while the ring is full.
    pub fn push_held(&mut self, block: impl Into<Block>, held: Held, at: usize) -> Result<()> {
        let block = block.into();
        if at > held.len() {
            return Err(Error::conn("internal: a payload beyond its message"));
        }
        match &mut self.inner {
            WriterKind::Inline(sink, file) => {
                held.with_bytes(|b| sink.block(file.as_ref(), &block, &b[at..]))
            }
            WriterKind::Thread { tx, .. } => tx
                .send(ToWriter::Held { block, held, at })
                .map_err(|_| writer_stopped()),
        }
    }

    /// Waits until every block handed over is written, and takes the ranges whose CRC
    /// failed since the last call.
    pub fn sync(&mut self) -> Result<Vec<(u64, u32)>> {
        match &mut self.inner {
            WriterKind::Inline(sink, _) => Ok(std::mem::take(&mut sink.bad)),
            WriterKind::Thread { tx, .. } => {
                let (rtx, rrx) = sync_channel(1);
                tx.send(ToWriter::Sync(rtx)).map_err(|_| writer_stopped())?;
                let (bad, fatal) = rrx.recv().map_err(|_| writer_stopped())?;
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
            WriterKind::Inline(sink, _) => *sink,
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

/// The writer thread: lands each block handed over (until the first fatal error, after
/// which blocks are only drained) and lets its buffer go back.
fn write_loop(mut sink: BlockSink, file: &File, rx: Receiver<ToWriter>) -> BlockSink {
    let mut fatal: Option<Error> = None;
    for m in rx {
        match m {
            ToWriter::Copied { block, bytes } => {
                if fatal.is_none() {
                    if let Err(e) = sink.block(Some(file), &block, &bytes) {
                        fatal = Some(e);
                    }
                }
            }
            ToWriter::Held { block, held, at } => {
                if fatal.is_none() {
                    if let Err(e) = held.with_bytes(|b| sink.block(Some(file), &block, &b[at..])) {
                        fatal = Some(e);
                    }
                }
            }
            ToWriter::Sync(reply) => {
                let _ = reply.send((std::mem::take(&mut sink.bad), fatal.take()));
            }
        }
    }
    sink
}

fn writer_stopped() -> Error {
    Error::conn("the disk writer thread stopped")
}
