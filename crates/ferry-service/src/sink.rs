//! Receiving one transfer's blocks into a file: CRC check, write (direct I/O when asked), in-order hash.
//!
//! Runs of zeros of at least [`MIN_HOLE`] bytes (or a block that is all zeros) are not
//! written: they are punched out of the file (`fallocate(PUNCH_HOLE)`), so a sparse source
//! stays sparse at the destination (like `cp --sparse=always`), and a reused part file can
//! hold no stale bytes there. The hash covers the data as sent, zeros included.

use std::fs::File;
use std::os::unix::fs::FileExt;

use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::journal::RangeSet;
use crate::landing::{Progress, SharedProgress};
use crate::secure::protect::BlockCheck;
use crate::tree::{BlockSpans, BlockTree, SharedTree};

/// One block as its sender described it: the transfer it belongs to, where it lies in the
/// file, its length and its check value, and how the receiver checks it (a face decodes it
/// from its own frames and its connection's [`crate::secure::Protection`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// The transfer (the face's file id) the block belongs to.
    pub transfer: u32,
    /// Where the block lies in the file.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u32,
    /// Its check value: the CRC-32C of its bytes, or its integrity tag, as `check` says.
    pub crc32c: u32,
    /// How the check value is verified.
    pub check: BlockCheck,
    /// The sender digested the block by its [`BlockSpans`] (a file's block at `integrity`,
    /// the BLOCK header's `TREE` flag, [`crate::secure::protect`]).
    pub spans: bool,
}

/// Receives the blocks of one transfer into `file`: verifies each block's
/// CRC-32C, writes the good ones and hashes the file in order. Shared by the server (PUT)
/// and the client (GET).
pub struct BlockSink {
    file_id: u32,
    size: u64,
    hasher: blake3::Hasher,
    hashed: u64,
    rehash: bool,
    /// Ranges whose CRC failed in the current round.
    pub bad: Vec<(u64, u32)>,
    /// Blocks that failed their CRC, over all rounds.
    pub bad_total: u64,
    /// The first write error (the transfer keeps draining blocks, then reports it).
    pub io_error: Option<std::io::Error>,
    /// The resume journal's view of the part file, when the receiver keeps one.
    pub journal: Option<Progress>,
    /// For one range of a parallel transfer: the range blocks must lie in.
    window: Option<(u64, u64)>,
    /// For one range of a parallel transfer: what was written from good blocks.
    pub got: RangeSet,
    /// For one range of a parallel transfer: the shared file's journal, told of each block
    /// as it is written.
    shared: Option<std::sync::Arc<SharedProgress>>,
    /// For one range of a parallel transfer: the shared file's [`SharedTree`], given the
    /// BLAKE3 chaining values of each good block's bytes while they are in memory.
    tree: Option<SharedTree>,
    /// A direct-I/O (`O_DIRECT`) handle on the file, when asked for and allowed.
    direct: Option<File>,
    /// An aligned copy of a payload that arrived unaligned, for direct writes.
    bounce: Vec<u8>,
    /// How runs of zeros are stored (see [`Holes`]).
    holes: Holes,
    /// Bytes of good blocks written so far (what a writer's ring counts toward its next
    /// checkpoint).
    stored: u64,
}

/// The most units (32 bytes of chaining value each) a fresh file's hash tree keeps
/// ([`BlockSink::journaled`]): 32 MiB of values, a 4 TiB file in 4 MiB blocks.
pub const MAX_FRESH_UNITS: usize = 1 << 20;

/// How a sink stores runs of zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holes {
    /// Punched, once the file has its full size (set before the first hole).
    Unsized,
    /// Punched; the file already has its full size.
    Sized,
    /// Written like data: the filesystem cannot punch holes.
    Written,
}

impl BlockSink {
    /// A sink for transfer `file_id` of a file of `size` bytes.
    pub fn new(file_id: u32, size: u64) -> Self {
        BlockSink {
            file_id,
            size,
            hasher: blake3::Hasher::new(),
            hashed: 0,
            rehash: false,
            bad: Vec::new(),
            bad_total: 0,
            io_error: None,
            journal: None,
            window: None,
            got: RangeSet::new(),
            shared: None,
            tree: None,
            direct: None,
            bounce: Vec::new(),
            holes: Holes::Unsized,
            stored: 0,
        }
    }

    /// Writes aligned blocks of `file` with direct I/O (`O_DIRECT`, bypassing the page
    /// cache) where its filesystem allows it; unaligned ones (a file's tail) go through the
    /// cache. Without direct I/O there (a warning says so) every write goes through the cache.
    pub fn set_direct(&mut self, file: &File) {
        self.direct = crate::direct::open_direct_or_warn(file, true);
    }

    /// Writes with direct I/O as [`BlockSink::set_direct`] does if `asked`, and otherwise
    /// where it helps ([`crate::direct::direct_helps`]: a large file on a disk), silently
    /// going through the page cache where the filesystem refuses it. True if direct I/O is
    /// on.
    pub fn choose_direct(&mut self, file: &File, asked: bool) -> bool {
        if asked {
            self.set_direct(file);
        } else if crate::direct::direct_helps(file, self.size) {
            self.direct = crate::direct::open_direct(file, true).ok();
        }
        self.direct.is_some()
    }

    /// A sink for the range `[lo, hi)` of a file of `size` bytes, one piece of a parallel
    /// transfer: blocks outside it are refused, nothing is hashed in order (each block goes
    /// into the file's hash tree instead, [`BlockSink::hash_into`]), and [`BlockSink::got`]
    /// records what was written.
    pub fn range(file_id: u32, size: u64, lo: u64, hi: u64) -> Self {
        let mut s = Self::new(file_id, size);
        s.rehash = true;
        s.window = Some((lo, hi));
        s
    }

    /// Reports each block written to `journal`, the journal of the file this range is a
    /// piece of (so a kill loses no more than with one stream).
    pub fn report_to(&mut self, journal: Option<std::sync::Arc<SharedProgress>>) {
        self.shared = journal;
    }

    /// Hashes each good block into `tree`, the hash tree of the file this range is a piece
    /// of, so the whole file's BLAKE3 needs no second read ([`crate::tree`]).
    pub fn hash_into(&mut self, tree: Option<SharedTree>) {
        self.tree = tree;
    }

    /// A sink that journals its verified prefix as it goes ([`crate::landing`]) and starts
    /// where the journal's prefix ends (those bytes are not expected again). A resumed
    /// file's final hash reads back only the part verified before (not the whole file,
    /// which made a resume slower than a fresh copy).
    ///
    /// Its blocks go into the file's hash tree, fresh or resumed: a block whose tag read
    /// its spans ([`BlockSpans`]) gives the tree their values, so its bytes are hashed once
    /// for both. A fresh file of more than [`MAX_FRESH_UNITS`] units (tiny blocks, huge
    /// file) is hashed in order instead, its tree's memory not worth the pass it saves.
    pub fn journaled(file_id: u32, size: u64, journal: Progress) -> Self {
        let mut s = Self::new(file_id, size);
        let resumed = journal.prefix() > 0;
        let block = u64::from(journal.block());
        s.tree = BlockTree::new(size, block)
            .filter(|t| resumed || t.units() <= MAX_FRESH_UNITS)
            .map(SharedTree::new);
        s.rehash = s.tree.is_some() || resumed;
        s.journal = Some(journal);
        s
    }

    /// A resumed file: starts hashing the prefix verified before from `file` on a thread
    /// ([`SharedTree::fill_behind`]) while the rest arrives, instead of reading it back
    /// after the last block.
    pub fn hash_held_behind(&self, file: &File) {
        if let (Some(tree), Some(j)) = (&self.tree, &self.journal) {
            tree.fill_behind(file, vec![(0, j.prefix())]);
        }
    }

    /// The transfer this sink receives.
    pub fn transfer(&self) -> u32 {
        self.file_id
    }

    /// The transfer's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes of good blocks written so far.
    pub fn stored(&self) -> u64 {
        self.stored
    }

    /// Whether the sink journals what it verifies (only then has it anything to checkpoint
    /// while data flows).
    pub fn journals(&self) -> bool {
        self.journal.is_some()
    }

    /// A checkpoint while data flows, when the writer's ring asks for one: hands the
    /// verified ranges to the journal's checkpoint thread, which fsyncs `file` and then
    /// records them (waiting only for the previous checkpoint). A failure becomes the
    /// transfer's write error.
    pub fn checkpoint_in_background(&mut self, file: &File) {
        if self.io_error.is_some() {
            return;
        }
        if let Some(j) = &mut self.journal {
            if let Err(e) = j.checkpoint_in_background(file) {
                self.io_error = Some(e);
            }
        }
    }

    /// Records what is verified so far in the journal (fsync first), e.g. before giving up
    /// on a broken connection.
    pub fn checkpoint(&mut self, file: &File) -> std::io::Result<()> {
        match &mut self.journal {
            Some(j) => j.checkpoint(file),
            None => Ok(()),
        }
    }

    /// Waits for the background checkpoints and stops their thread; an error they met
    /// becomes the transfer's write error.
    pub fn settle(&mut self) {
        if let Some(j) = &mut self.journal {
            if let Err(e) = j.settle() {
                self.io_error.get_or_insert(e);
            }
        }
    }

    /// Checks one BLOCK against its check value (CRC-32C or integrity tag) and the
    /// transfer's bounds; writes it if good (to `file`; `None` is the null sink of memory
    /// mode: nothing is written or hashed), remembers its range for a re-fetch if not.
    ///
    /// A block flagged as digested by its spans ([`Block::spans`]) is checked by them, and
    /// they go on to the file's hash tree: its bytes are read once.
    pub fn block(&mut self, file: Option<&File>, h: &Block, payload: &[u8]) -> Result<()> {
        self.check_bounds(h)?;
        if crate::hash::checksums_off() {
            self.accept(file, h, payload, None);
            return Ok(());
        }
        let spans = h
            .spans
            .then(|| BlockSpans::of(h.offset, payload, self.size))
            .flatten();
        let good = match (&spans, h.spans) {
            (Some(s), _) => h.check.verify_spans(h.transfer, h.offset, s, h.crc32c),
            // Flagged, but no spans in it: no sender digests such a block so.
            (None, true) => false,
            (None, false) => h.check.verify(h.transfer, h.offset, payload, h.crc32c),
        };
        if !good {
            self.refetch(h, h.check.failure());
            return Ok(());
        }
        self.accept(file, h, payload, spans.as_ref());
        Ok(())
    }

    /// Opens a `private` block in place (`wire`: its ciphertext and seal trailer,
    /// [`crate::secure::protect::BlockCheck::open`]) and lands its bytes as
    /// [`BlockSink::block`] does a good block's; one that does not open is remembered for a
    /// re-fetch, never written.
    pub fn sealed_block(&mut self, file: Option<&File>, h: &Block, wire: &mut [u8]) -> Result<()> {
        self.check_bounds(h)?;
        match h.check.open(h.transfer, h.offset, h.len, wire) {
            Some(plain) => self.accept(file, h, plain, None),
            None => self.refetch(h, h.check.failure()),
        }
        Ok(())
    }

    /// Lands a checked block: writes and hashes it (from `spans`, its tag's, where the
    /// file's tree takes them; a memory-mode sink only records it).
    fn accept(
        &mut self,
        file: Option<&File>,
        h: &Block,
        payload: &[u8],
        spans: Option<&BlockSpans>,
    ) {
        let Some(file) = file else {
            if self.window.is_some() {
                self.got.insert(h.offset, h.offset + u64::from(h.len));
            }
            return;
        };
        self.store(file, h, payload);
        if let Some(t) = &self.tree {
            t.record_spans(h.offset, payload, spans);
        }
        if h.offset == self.hashed && !self.rehash {
            self.hasher.update(payload);
            self.hashed += u64::from(h.len);
        } else {
            self.rehash = true;
        }
    }

    /// A whole file in one block (a FILE frame), with the file's BLAKE3 from the sender:
    /// that hash covers the same bytes as the block's CRC-32C and is needed anyway, so it
    /// is the block's check instead of both (a server sends a 1.12 client no CRC at all).
    /// A mismatch is re-fetched like a bad CRC.
    pub fn whole_file(
        &mut self,
        file: Option<&File>,
        h: &Block,
        payload: &[u8],
        blake3: &[u8; 32],
    ) -> Result<()> {
        self.check_bounds(h)?;
        let mut hasher = blake3::Hasher::new();
        hasher.update(payload);
        if hasher.finalize().as_bytes() != blake3 {
            self.refetch(h, "file BLAKE3 mismatch; it will be sent again");
            return Ok(());
        }
        // A fresh file (no part of it verified before, no range of a parallel transfer):
        // its FILE frame's hash is the whole file's, in order, and becomes the file's.
        let resumed = self.journal.as_ref().is_some_and(|j| j.prefix() > 0);
        let fresh = h.offset == 0 && self.hashed == 0 && !resumed && self.window.is_none();
        let (Some(file), true) = (file, fresh && u64::from(h.len) == self.size) else {
            self.accept(file, h, payload, None);
            return Ok(());
        };
        self.store(file, h, payload);
        self.hasher = hasher;
        self.hashed = self.size;
        self.rehash = false;
        Ok(())
    }

    fn check_bounds(&self, h: &Block) -> Result<()> {
        let end = h.offset.saturating_add(u64::from(h.len));
        let outside = self
            .window
            .is_some_and(|(lo, hi)| h.offset < lo || end > hi);
        if h.transfer != self.file_id || end > self.size || outside {
            return Err(Error::conn(format!(
                "the peer sent a block outside the transfer (file {} offset {} len {})",
                h.transfer, h.offset, h.len
            )));
        }
        Ok(())
    }

    fn refetch(&mut self, h: &Block, why: &str) {
        tracing::warn!(offset = h.offset, len = h.len, "{why}");
        self.bad.push((h.offset, h.len));
        self.bad_total += 1;
    }

    /// Writes a good block (bounds checked) and records it: in the range set of a parallel
    /// piece, in the journal (checkpointed when the writer's ring asks, or, for a piece, in
    /// its file's shared journal). A write error is kept for the end.
    fn store(&mut self, file: &File, h: &Block, payload: &[u8]) {
        if self.io_error.is_some() {
            return;
        }
        if let Err(e) = self.write_sparse(file, payload, h.offset) {
            self.io_error = Some(e);
            return;
        }
        self.stored += u64::from(h.len);
        if self.window.is_some() {
            self.got.insert(h.offset, h.offset + u64::from(h.len));
        }
        if let Some(j) = &self.shared {
            if let Err(e) = j.good(h.offset, u64::from(h.len)) {
                self.io_error = Some(e);
            }
        }
        if let Some(j) = &mut self.journal {
            j.good(h.offset, u64::from(h.len));
        }
    }

    /// Writes `payload` at `offset`, leaving holes for its runs of zeros (see the module
    /// notes): the data between them is written as usual (direct where aligned).
    fn write_sparse(&mut self, file: &File, payload: &[u8], offset: u64) -> std::io::Result<()> {
        if self.holes == Holes::Written {
            return write_at(file, &mut self.direct, &mut self.bounce, payload, offset);
        }
        let mut data_from = 0;
        for (lo, hi) in zero_runs(payload, offset) {
            if self.holes == Holes::Written {
                break;
            }
            self.write_piece(file, &payload[data_from..lo], offset + data_from as u64)?;
            // Not punched: the zeros go with the rest of the payload.
            data_from = if self.punch(file, offset + lo as u64, (hi - lo) as u64)? {
                hi
            } else {
                lo
            };
        }
        self.write_piece(file, &payload[data_from..], offset + data_from as u64)
    }

    /// Writes `data` (possibly empty) at `offset`, direct where aligned.
    fn write_piece(&mut self, file: &File, data: &[u8], offset: u64) -> std::io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        write_at(file, &mut self.direct, &mut self.bounce, data, offset)
    }

    /// Makes `[offset, offset + len)` of `file` a hole (reading as zeros); false if the
    /// filesystem cannot (the zeros are then written, now and from then on).
    fn punch(&mut self, file: &File, offset: u64, len: u64) -> std::io::Result<bool> {
        use rustix::fs::FallocateFlags;
        if self.holes == Holes::Unsized {
            // A hole at the end must not leave the file short: give it its size first
            // (never shrinking it: a parallel transfer's other pieces share the file).
            if file.metadata()?.len() < self.size {
                file.set_len(self.size)?;
            }
            self.holes = Holes::Sized;
        }
        let how = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        match rustix::fs::fallocate(file, how, offset, len) {
            Ok(()) => Ok(true),
            Err(Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL) => {
                tracing::debug!("this filesystem cannot punch holes: zeros are written");
                self.holes = Holes::Written;
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The BLAKE3 of what was written: hashed as it came in order; from the hash tree of a
    /// resumed file (reading back the units no block of this transfer covered); else
    /// (blocks out of order) by re-reading the file.
    pub fn hash(&mut self, file: &File) -> std::io::Result<[u8; 32]> {
        if !self.rehash && self.hashed == self.size {
            return Ok(*self.hasher.finalize().as_bytes());
        }
        match (&self.tree, self.window) {
            (Some(tree), None) => tree.root_filling_from(file),
            _ => crate::hash::hash_file(file, self.size),
        }
    }
}

/// Writes `payload` at `offset` of `file`: through `direct` when the block is aligned (from
/// an aligned copy in `bounce` if the payload itself is not), else through the page cache. A
/// filesystem that refuses a direct write (`EINVAL`) gets this and later blocks cached.
fn write_at(
    file: &File,
    direct: &mut Option<File>,
    bounce: &mut Vec<u8>,
    payload: &[u8],
    offset: u64,
) -> std::io::Result<()> {
    use crate::direct::{direct_aligned, DIRECT_ALIGN};
    let Some(d) = direct.as_ref() else {
        return file.write_all_at(payload, offset);
    };
    if !direct_aligned(0, offset, payload.len()) {
        return file.write_all_at(payload, offset);
    }
    let res = if direct_aligned(payload.as_ptr() as usize, offset, payload.len()) {
        d.write_all_at(payload, offset)
    } else {
        if bounce.len() < payload.len() + DIRECT_ALIGN {
            bounce.resize(payload.len() + DIRECT_ALIGN, 0);
        }
        let start = bounce.as_ptr().align_offset(DIRECT_ALIGN);
        let copy = &mut bounce[start..start + payload.len()];
        copy.copy_from_slice(payload);
        d.write_all_at(copy, offset)
    };
    match res {
        Err(e) if e.raw_os_error() == Some(Errno::INVAL.raw_os_error()) => {
            tracing::warn!("direct I/O write refused ({e}): going through the page cache");
            *direct = None;
            file.write_all_at(payload, offset)
        }
        r => r,
    }
}

/// The shortest run of zeros left as a hole (shorter ones are written with their data, so
/// a block costs a few syscalls at most); a block that is all zeros is a hole whatever its
/// size.
pub const MIN_HOLE: usize = 64 << 10;

/// Holes are found in grains of this many bytes, aligned to file offsets (a filesystem
/// block, and the direct-I/O alignment, so the data between holes stays aligned).
const HOLE_GRAIN: usize = 4096;

/// The runs of zeros in `payload` (which lies at `offset` of its file) to leave as holes,
/// as `[lo, hi)` indices into `payload`, in order: whole aligned grains of zeros, at least
/// [`MIN_HOLE`] bytes together, or the whole payload if it is all zeros.
fn zero_runs(payload: &[u8], offset: u64) -> Vec<(usize, usize)> {
    let len = payload.len();
    let mut runs = Vec::new();
    // The first grain boundary at or after `offset`.
    let skew = ((HOLE_GRAIN - (offset % HOLE_GRAIN as u64) as usize) % HOLE_GRAIN).min(len);
    let mut at = skew;
    let mut run_from = None;
    let mut every_grain_zero = true;
    while at + HOLE_GRAIN <= len {
        let zero = all_zero(&payload[at..at + HOLE_GRAIN]);
        every_grain_zero &= zero;
        match (zero, run_from) {
            (true, None) => run_from = Some(at),
            (false, Some(lo)) => {
                if at - lo >= MIN_HOLE {
                    runs.push((lo, at));
                }
                run_from = None;
            }
            _ => {}
        }
        at += HOLE_GRAIN;
    }
    // A block of zeros is one hole whatever its size and alignment (its unaligned ends,
    // under a grain each, are checked only then).
    if len > 0 && every_grain_zero && all_zero(&payload[..skew]) && all_zero(&payload[at..]) {
        return vec![(0, len)];
    }
    if let Some(lo) = run_from {
        if at - lo >= MIN_HOLE {
            runs.push((lo, at));
        }
    }
    runs
}

/// Whether every byte of `b` is zero. Each 4 KiB is OR-folded without early exit (the
/// compiler vectorizes it) after a look at its first 64 bytes (data almost always shows
/// there, so a block of data costs a few ns per 4 KiB); the scan stops at the first 4 KiB
/// holding data.
pub fn all_zero(b: &[u8]) -> bool {
    let zero = |c: &[u8]| c.iter().fold(0u8, |acc, &x| acc | x) == 0;
    b.chunks(HOLE_GRAIN).all(|c| {
        let (head, rest) = c.split_at(c.len().min(64));
        zero(head) && zero(rest)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(len: usize, crc32c: u32) -> Block {
        Block {
            transfer: 7,
            offset: 0,
            len: len as u32,
            crc32c,
            check: BlockCheck::Crc,
            spans: false,
        }
    }

    /// A whole file checked by its BLAKE3: written and hashed once when it matches; kept out
    /// of the file and listed for a re-fetch when it does not, whatever its CRC says.
    #[test]
    fn a_whole_file_is_checked_by_its_hash() {
        let dir = std::env::temp_dir().join(format!("ferry-sink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 31 + 7) as u8).collect();
        let good = *blake3::hash(&data).as_bytes();
        let path = dir.join("good");
        let file = File::create_new(&path).unwrap();
        let mut sink = BlockSink::new(7, data.len() as u64);
        // A CRC of 0 would fail `block`: the hash alone decides here.
        sink.whole_file(Some(&file), &header(data.len(), 0), &data, &good)
            .unwrap();
        assert!(sink.bad.is_empty());
        assert_eq!(std::fs::read(&path).unwrap(), data);
        assert_eq!(sink.hash(&file).unwrap(), good);

        let path = dir.join("bad");
        let file = File::create_new(&path).unwrap();
        let mut sink = BlockSink::new(7, data.len() as u64);
        let mut other = good;
        other[0] ^= 1;
        let crc = crc32c::crc32c(&data);
        sink.whole_file(Some(&file), &header(data.len(), crc), &data, &other)
            .unwrap();
        assert_eq!(sink.bad, vec![(0, data.len() as u32)]);
        assert_eq!(sink.bad_total, 1);
        assert!(std::fs::read(&path).unwrap().is_empty());
        // Outside the transfer is refused as before.
        let mut sink = BlockSink::new(7, 10);
        assert!(sink
            .whole_file(Some(&file), &header(data.len(), crc), &data, &good)
            .is_err());
        // The null sink (and any sink not taking the file whole) checks the hash too, and
        // no CRC: a 1.12 server sends none.
        let mut sink = BlockSink::new(7, data.len() as u64);
        sink.whole_file(None, &header(data.len(), 0), &data, &good)
            .unwrap();
        assert!(sink.bad.is_empty());
        sink.whole_file(None, &header(data.len(), crc), &data, &other)
            .unwrap();
        assert_eq!(sink.bad, vec![(0, data.len() as u32)]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// At `integrity`, a fresh file's blocks tagged by their spans are checked by them and
    /// give the file's tree its values: the whole-file hash needs no byte read again (the
    /// file changed on disk after the blocks were written still hashes as sent). A changed
    /// byte, a tag of the plain digest under the spans' flag, or spans of another place are
    /// caught and listed for a re-fetch.
    #[test]
    fn a_fresh_file_is_hashed_from_its_blocks_tags() {
        use crate::journal::{Ident, Journal};
        use crate::secure::protect::{Level, Protection};
        use std::os::unix::fs::FileExt;
        const BLOCK: usize = 64 * 1024;
        let export = |label: &[u8], ctx: &[u8]| -> Result<[u8; 32]> {
            Ok(*blake3::Hasher::new()
                .update(label)
                .update(ctx)
                .finalize()
                .as_bytes())
        };
        let client = Protection::new(Level::Integrity, false, export).unwrap();
        let server = Protection::new(Level::Integrity, true, export).unwrap();
        let dir = std::env::temp_dir().join(format!("ferry-sink-spans-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let data: Vec<u8> = (0..5 * BLOCK as u32 + 999)
            .map(|i| (i * 13 + i / 97) as u8)
            .collect();
        let size = data.len() as u64;
        let part = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("part"))
            .unwrap();
        let jfile = File::create(dir.join("journal")).unwrap();
        let journal = Journal::create(jfile, Ident { size, mtime: 1 }, BLOCK as u32).unwrap();
        let mut sink = BlockSink::journaled(7, size, Progress::new(journal));
        let tagged = |offset: usize, bytes: &[u8]| {
            let spans = BlockSpans::of(offset as u64, bytes, size).unwrap();
            let tag = client
                .send
                .spans_value(&spans, 7, offset as u64, bytes.len() as u32);
            Block {
                transfer: 7,
                offset: offset as u64,
                len: bytes.len() as u32,
                crc32c: tag,
                check: server.recv,
                spans: true,
            }
        };
        for (i, chunk) in data.chunks(BLOCK).enumerate() {
            let at = i * BLOCK;
            let h = tagged(at, chunk);
            if i == 1 {
                let mut changed = chunk.to_vec();
                changed[77] ^= 1;
                sink.block(Some(&part), &h, &changed).unwrap();
                let plain = Block {
                    crc32c: client.send.compute(7, at as u64, chunk),
                    ..h
                };
                sink.block(Some(&part), &plain, chunk).unwrap();
                let moved = Block {
                    offset: (at + BLOCK) as u64,
                    ..h
                };
                sink.block(Some(&part), &moved, &data[at + BLOCK..at + 2 * BLOCK])
                    .unwrap();
                assert_eq!(sink.bad.len(), 3, "every change is caught");
                sink.bad.clear();
            }
            sink.block(Some(&part), &h, chunk).unwrap();
        }
        assert!(sink.bad.is_empty());
        assert!(
            sink.tree.as_ref().unwrap().root().is_some(),
            "every unit has its value"
        );
        part.write_all_at(b"changed after it was written", 10)
            .unwrap();
        assert_eq!(&sink.hash(&part).unwrap(), blake3::hash(&data).as_bytes());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A resumed file is hashed from its tree: the part verified before is read back, the
    /// blocks of this transfer are hashed as they arrive and never read again (changed on
    /// disk after they were written, they still count as sent; the prefix, changed, shows).
    #[test]
    fn a_resumed_file_reads_back_only_its_old_part() {
        use crate::journal::{Ident, Journal};
        use std::os::unix::fs::FileExt;
        const BLOCK: usize = 64 * 1024;
        let dir = std::env::temp_dir().join(format!("ferry-sink-resume-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let data: Vec<u8> = (0..5 * BLOCK as u32 + 999)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let size = data.len() as u64;
        let prefix = 2 * BLOCK;
        let resumed = |tag: &str| {
            let part = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.join(format!("{tag}-part")))
                .unwrap();
            part.write_all_at(&data[..prefix], 0).unwrap();
            let jfile = File::create(dir.join(format!("{tag}-journal"))).unwrap();
            let mut journal =
                Journal::create(jfile, Ident { size, mtime: 1 }, BLOCK as u32).unwrap();
            let mut done = RangeSet::new();
            done.insert(0, prefix as u64);
            journal.record(&done).unwrap();
            let mut sink = BlockSink::journaled(7, size, Progress::new(journal));
            for (i, chunk) in data[prefix..].chunks(BLOCK).enumerate() {
                let mut h = header(chunk.len(), crc32c::crc32c(chunk));
                h.offset = (prefix + i * BLOCK) as u64;
                sink.block(Some(&part), &h, chunk).unwrap();
            }
            (sink, part)
        };
        let (mut sink, part) = resumed("tail");
        part.write_all_at(b"changed after it was written", prefix as u64 + 10)
            .unwrap();
        assert_eq!(&sink.hash(&part).unwrap(), blake3::hash(&data).as_bytes());

        let (mut sink, part) = resumed("head");
        part.write_all_at(b"changed", 10).unwrap();
        assert_ne!(&sink.hash(&part).unwrap(), blake3::hash(&data).as_bytes());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Runs of zeros become holes: whole aligned grains, at least MIN_HOLE together, or
    /// the whole payload; a short run stays with its data.
    #[test]
    fn zero_runs_are_aligned_and_long_enough() {
        let mut b = vec![0u8; 1 << 20];
        assert_eq!(zero_runs(&b, 0), vec![(0, 1 << 20)]);
        assert_eq!(zero_runs(&b[..100], 7), vec![(0, 100)]);
        assert!(zero_runs(&[], 0).is_empty());
        b[10] = 1;
        b[500_000] = 1;
        // Data at 10 and 500,000 (in the grain from 499,712): the zeros around them.
        assert_eq!(zero_runs(&b, 0), vec![(4096, 499_712), (503_808, 1 << 20)]);
        // Grains follow file offsets: the block starting 100 bytes into a grain.
        let runs = zero_runs(&b, 100);
        assert_eq!(runs[0], (3996, 499_612));
        // 32 KiB of zeros between data is written, not punched.
        let mut c = vec![1u8; 3 * 32 * 1024];
        c[32 * 1024..64 * 1024].fill(0);
        assert!(zero_runs(&c, 0).is_empty());
    }

    /// A sparse stream of blocks lands with its holes (the file's allocated blocks far
    /// below its size), reads back identical, hashes as the data, and overwrites stale
    /// bytes of a reused part with zeros.
    #[test]
    fn zeros_become_holes() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("ferry-sink-sparse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sparse");
        let size = 16u64 << 20;
        let mut data = vec![0u8; size as usize];
        data[..5000].fill(7);
        data[9 << 20..(9 << 20) + 70_000].fill(9);
        // A reused part full of stale bytes.
        std::fs::write(&path, vec![0xEEu8; size as usize]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut sink = BlockSink::new(7, size);
        let block = 1 << 20;
        for (i, chunk) in data.chunks(block).enumerate() {
            let h = Block {
                transfer: 7,
                offset: (i * block) as u64,
                len: chunk.len() as u32,
                crc32c: crc32c::crc32c(chunk),
                check: BlockCheck::Crc,
                spans: false,
            };
            sink.block(Some(&file), &h, chunk).unwrap();
        }
        assert!(sink.io_error.is_none());
        assert_eq!(sink.hash(&file).unwrap(), *blake3::hash(&data).as_bytes());
        assert!(std::fs::read(&path).unwrap() == data);
        let md = std::fs::metadata(&path).unwrap();
        assert_eq!(md.len(), size);
        if sink.holes != Holes::Written {
            assert!(
                md.blocks() * 512 < 1 << 20,
                "{} bytes allocated",
                md.blocks() * 512
            );
        }
        // A hole at the end still gives the file its size.
        let tail = dir.join("tail");
        let file = File::create_new(&tail).unwrap();
        let mut sink = BlockSink::new(7, 2 * block as u64);
        let ones = vec![1u8; block];
        let zeros = vec![0u8; block];
        for (i, c) in [&ones, &zeros].iter().enumerate() {
            let h = Block {
                transfer: 7,
                offset: (i * block) as u64,
                len: block as u32,
                crc32c: crc32c::crc32c(c),
                check: BlockCheck::Crc,
                spans: false,
            };
            sink.block(Some(&file), &h, c).unwrap();
        }
        assert_eq!(std::fs::metadata(&tail).unwrap().len(), 2 * block as u64);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
