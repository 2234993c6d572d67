//! A file's BLAKE3 from the chaining values of its aligned pieces, so each byte is hashed
//! once, where it is touched anyway (a received block, in memory), in any order, by any
//! thread, and the whole-file hash follows from the pieces' 32-byte values alone.
//!
//! BLAKE3 is a binary tree over 1 KiB chunks, left-balanced: the left subtree of any node
//! holds the largest power of two of chunks smaller than the node's. Cut a file into
//! **units** of `u` bytes, `u` a power of two of at least 1 KiB, at offsets that are multiples
//! of `u`: then every unit (the last one possibly short) is a whole subtree of the file's
//! tree, and the tree over the units is again left-balanced (a power of two of chunks at
//! least `u` long is a multiple of `u`). So each unit's chaining value
//! ([`blake3::hazmat::HasherExt::finalize_non_root`], the unit's offset set) can be
//! computed alone, and the root is merged from them by the same left-balanced split
//! ([`blake3::hazmat::merge_subtrees_non_root`], [`blake3::hazmat::merge_subtrees_root`] at
//! the top). A file of one unit or less has no parent node: its root is the plain hash of
//! its bytes.
//!
//! A transfer's blocks are `block` bytes at multiples of `block` (ranges and chunks start on
//! block boundaries): the unit is the largest power of two dividing the block size, so every
//! block is a whole number of units (a 4 MiB block is one unit, a 3 MiB block three of 1 MiB).

use std::fs::File;
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use blake3::hazmat::Mode;
use blake3::hazmat::{merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt};

/// How a file is cut into units: what hashing a unit needs, without the values.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    size: u64,
    /// The unit: a power of two, at least [`blake3::CHUNK_LEN`].
    unit: u64,
}

/// The pieces of one file whose chaining values are known (see the module notes).
#[derive(Debug, Clone)]
pub struct BlockTree {
    geo: Geometry,
    /// Each unit's value: a chaining value, or (a file of one unit) the root itself.
    cvs: Vec<Option<ChainingValue>>,
}

impl BlockTree {
    /// The tree of a file of `size` bytes received in blocks of `block` bytes at multiples
    /// of `block`; `None` if `block` is not a multiple of 1 KiB (no unit can then align to
    /// every block).
    pub fn new(size: u64, block: u64) -> Option<BlockTree> {
        let unit = block.checked_sub(1).map(|m| block & !m)?;
        if unit < blake3::CHUNK_LEN as u64 {
            return None;
        }
        let units = usize::try_from(size.div_ceil(unit)).ok()?;
        Some(BlockTree {
            geo: Geometry { size, unit },
            cvs: vec![None; units],
        })
    }

    /// How many units cut the file.
    pub fn units(&self) -> usize {
        self.cvs.len()
    }

    /// The file's size.
    pub fn size(&self) -> u64 {
        self.geo.size
    }

    /// Records the bytes `data` found at `offset` of the file: the value of every unit they
    /// cover whole (the last unit ends at the file's end). Units they cover only in part
    /// lose what they had (those bytes were just written over by others); [`BlockTree::fill`]
    /// or a later block covering them whole supplies them.
    pub fn record(&mut self, offset: u64, data: &[u8]) {
        for (i, value) in self.geo.values(offset, data) {
            if let Some(slot) = self.cvs.get_mut(i) {
                *slot = value;
            }
        }
    }

    /// Records a block's [`BlockSpans`] if they are this tree's units (same place, same
    /// length): true then. False, recording nothing, if they are cut otherwise (another
    /// block size, or a file's last block longer than a unit); the caller then records the
    /// bytes ([`BlockTree::record`]).
    pub fn record_spans(&mut self, spans: &BlockSpans) -> bool {
        let slots = self.geo.slots(spans);
        let Some(slots) = slots else {
            return false;
        };
        for (i, v) in slots {
            if let Some(slot) = self.cvs.get_mut(i) {
                *slot = Some(v);
            }
        }
        true
    }

    /// The ranges of the file whose units have no value yet, merged where they touch.
    pub fn missing(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (i, _) in self.cvs.iter().enumerate().filter(|(_, v)| v.is_none()) {
            let lo = i as u64 * self.geo.unit;
            let hi = (lo + self.geo.unit).min(self.geo.size);
            match out.last_mut() {
                Some(last) if last.1 == lo => last.1 = hi,
                _ => out.push((lo, hi)),
            }
        }
        out
    }

    /// Reads the units that have no value from `file` (a resumed part's bytes, or blocks that
    /// did not align), so [`BlockTree::root`] has them all.
    pub fn fill(&mut self, file: &File) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut buf = Vec::new();
        for (lo, hi) in self.missing() {
            let mut pos = lo;
            while pos < hi {
                let n = (hi - pos).min(self.geo.unit.max(1 << 20)) as usize;
                buf.resize(n, 0);
                file.read_exact_at(&mut buf, pos)?;
                self.record(pos, &buf);
                pos += n as u64;
            }
        }
        Ok(())
    }

    /// The whole file's BLAKE3, once every unit has its value.
    pub fn root(&self) -> Option<[u8; 32]> {
        match self.cvs.len() {
            0 => Some(*blake3::hash(&[]).as_bytes()),
            1 => self.cvs[0],
            n => {
                let split = left_units(n);
                let (l, r) = (self.merge(0, split)?, self.merge(split, n)?);
                Some(*merge_subtrees_root(&l, &r, Mode::Hash).as_bytes())
            }
        }
    }

    /// The chaining value of the subtree over units `lo..hi` (not the root).
    fn merge(&self, lo: usize, hi: usize) -> Option<ChainingValue> {
        if hi - lo == 1 {
            return self.cvs[lo];
        }
        let split = lo + left_units(hi - lo);
        let (l, r) = (self.merge(lo, split)?, self.merge(split, hi)?);
        Some(merge_subtrees_non_root(&l, &r, Mode::Hash))
    }
}

impl Geometry {
    /// The values of the units `data` at `offset` touches: `Some` for those it covers whole,
    /// `None` for the others. Computed without the tree's lock by [`SharedTree::record`].
    fn values(&self, offset: u64, data: &[u8]) -> Vec<(usize, Option<ChainingValue>)> {
        let end = offset.saturating_add(data.len() as u64).min(self.size);
        if offset >= end {
            return Vec::new();
        }
        let (first, last) = (offset / self.unit, (end - 1) / self.unit);
        (first..=last)
            .map(|u| {
                let lo = u * self.unit;
                let hi = (lo + self.unit).min(self.size);
                let whole = lo >= offset && hi <= end;
                let value = whole.then(|| {
                    let at = (lo - offset) as usize;
                    self.value(lo, &data[at..at + (hi - lo) as usize])
                });
                (u as usize, value)
            })
            .collect()
    }

    /// The unit index of each of `spans` with its value, if every span is exactly a unit
    /// of this geometry (a unit's value is a root hash exactly when the file is one unit,
    /// and a span's exactly when its block is the whole file: the same test).
    fn slots(&self, spans: &BlockSpans) -> Option<Vec<(usize, ChainingValue)>> {
        spans
            .ranges()
            .map(|((lo, hi), v)| {
                let unit_end = lo.saturating_add(self.unit).min(self.size);
                (lo % self.unit == 0 && hi == unit_end)
                    .then(|| usize::try_from(lo / self.unit).ok().map(|i| (i, *v)))
                    .flatten()
            })
            .collect()
    }

    /// `ranges` cut to the units they cover whole, in pieces of about [`FILL_PIECE`]
    /// bytes, each a whole number of units (the file's last unit may be short).
    fn whole_units(&self, ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
        let unit = self.unit;
        let piece = FILL_PIECE.max(unit) / unit * unit;
        let mut out = Vec::new();
        for &(lo, hi) in ranges {
            let lo = lo.div_ceil(unit).saturating_mul(unit);
            let hi = if hi >= self.size {
                self.size
            } else {
                hi / unit * unit
            };
            let mut pos = lo;
            while pos < hi {
                let end = hi.min(pos.saturating_add(piece));
                out.push((pos, end));
                pos = end;
            }
        }
        out
    }

    /// The value of the unit starting at `lo` holding `bytes` (all of it).
    fn value(&self, lo: u64, bytes: &[u8]) -> ChainingValue {
        if self.size <= self.unit {
            return *blake3::hash(bytes).as_bytes();
        }
        blake3::Hasher::new()
            .set_input_offset(lo)
            .update(bytes)
            .finalize_non_root()
    }
}

/// The smallest span a block's tree digest reads ([`BlockSpans`]): smaller ones would be
/// hashed one chunk at a time, without BLAKE3's parallelism across chunks.
pub const MIN_SPAN: u64 = 4096;

/// A block's bytes as whole subtrees of its file's BLAKE3 tree (see the module notes):
/// what its integrity tag reads, and what the file's [`BlockTree`] takes without hashing
/// the bytes again ([`BlockTree::record_spans`]). So a file transfer at `integrity` hashes
/// each byte once per side.
///
/// The spans depend only on the block's place and the file's size, so both ends cut a
/// block alike without agreeing on anything else: a block that is the whole file is one
/// span whose value is the file's root hash; else the span is the largest power of two
/// dividing the block's offset and, unless the block ends the file, its length (every
/// span, the last one possibly short, is then an aligned subtree). Spans shorter than
/// [`MIN_SPAN`] are not taken: such a block keeps the plain digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSpans {
    offset: u64,
    end: u64,
    /// Bytes per span (a power of two; the last span may be shorter).
    span: u64,
    /// Each span's chaining value, or the root hash of a block that is the whole file.
    values: Vec<ChainingValue>,
}

impl BlockSpans {
    /// The spans of the block `bytes` at `offset` of a file of `size` bytes, with their
    /// values (the bytes hashed once), or `None` if the block is empty, outside the file, or
    /// not cut in spans of at least [`MIN_SPAN`] bytes.
    pub fn of(offset: u64, bytes: &[u8], size: u64) -> Option<BlockSpans> {
        let n = bytes.len() as u64;
        let end = offset.checked_add(n).filter(|&e| n > 0 && e <= size)?;
        if offset == 0 && end == size {
            return Some(BlockSpans {
                offset,
                end,
                span: n,
                values: vec![*blake3::hash(bytes).as_bytes()],
            });
        }
        let low = |x: u64| {
            if x == 0 {
                u64::MAX
            } else {
                x & x.wrapping_neg()
            }
        };
        let span = if end < size {
            low(offset).min(low(n))
        } else {
            low(offset)
        };
        if span < MIN_SPAN {
            return None;
        }
        let values = bytes
            .chunks(usize::try_from(span).unwrap_or(usize::MAX))
            .enumerate()
            .map(|(k, piece)| {
                blake3::Hasher::new()
                    .set_input_offset(offset + k as u64 * span)
                    .update(piece)
                    .finalize_non_root()
            })
            .collect();
        Some(BlockSpans {
            offset,
            end,
            span,
            values,
        })
    }

    /// The block's length.
    pub fn block_len(&self) -> u32 {
        u32::try_from(self.end - self.offset).unwrap_or(u32::MAX)
    }

    /// The 32 bytes the block's tag reads: BLAKE3 in derive-key mode (its own context, so
    /// it never equals the plain BLAKE3 of some bytes) over the spans' values in order.
    pub fn digest(&self) -> [u8; 32] {
        let mut h = blake3::Hasher::new_derive_key("ferry 1.9 block spans");
        for v in &self.values {
            h.update(v);
        }
        *h.finalize().as_bytes()
    }

    /// Each span's range and value.
    fn ranges(&self) -> impl Iterator<Item = ((u64, u64), &ChainingValue)> + '_ {
        self.values.iter().enumerate().map(|(k, v)| {
            let lo = self.offset + k as u64 * self.span;
            ((lo, lo.saturating_add(self.span).min(self.end)), v)
        })
    }
}

/// Units (by index) and their values, as [`Geometry::values`] gives them.
type UnitValues = Vec<(usize, Option<ChainingValue>)>;

/// Units of this size cut a file for [`hash_file_parallel`].
const PAR_UNIT: u64 = 1 << 20;

/// BLAKE3 of the first `size` bytes of `file`, read and hashed by up to `threads` threads
/// at once, each over its own span of the file (the whole-file hash follows from the
/// spans' chaining values, see the module notes): a server answering SUM for a resumed
/// download hashes the whole source before the first block goes out, so this is time
/// the copy waits.
pub fn hash_file_parallel(file: &File, size: u64, threads: usize) -> std::io::Result<[u8; 32]> {
    let Some(mut tree) = BlockTree::new(size, PAR_UNIT) else {
        return crate::hash::hash_file(file, size);
    };
    let units = tree.cvs.len() as u64;
    let threads = (threads.max(1) as u64)
        .min(units.div_ceil(FILL_PIECE / PAR_UNIT))
        .max(1);
    if threads <= 1 {
        return crate::hash::hash_file(file, size);
    }
    let geo = tree.geo;
    let per = units.div_ceil(threads) * PAR_UNIT;
    let spans: Vec<(u64, u64)> = (0..threads)
        .map(|i| ((i * per).min(size), ((i + 1) * per).min(size)))
        .filter(|(lo, hi)| lo < hi)
        .collect();
    let results: Vec<std::io::Result<UnitValues>> = std::thread::scope(|s| {
        let handles: Vec<_> = spans
            .iter()
            .map(|&span| s.spawn(move || hash_span(geo, file, span)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("a hashing thread panicked")))
            })
            .collect()
    });
    for values in results {
        for (i, v) in values? {
            if let Some(slot) = tree.cvs.get_mut(i) {
                *slot = v;
            }
        }
    }
    tree.root()
        .ok_or_else(|| std::io::Error::other("internal: a unit of the file was not hashed"))
}

/// The units' values of `[lo, hi)` of `file` (whole units), read in pieces.
fn hash_span(geo: Geometry, file: &File, (lo, hi): (u64, u64)) -> std::io::Result<UnitValues> {
    use std::os::unix::fs::FileExt;
    let mut out = Vec::new();
    let mut buf = Vec::new();
    for (a, b) in geo.whole_units(&[(lo, hi)]) {
        buf.resize((b - a) as usize, 0);
        file.read_exact_at(&mut buf, a)?;
        out.extend(geo.values(a, &buf));
    }
    Ok(out)
}

/// Units in the left subtree of a node over `n ≥ 2` units: the largest power of two below `n`.
fn left_units(n: usize) -> usize {
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

/// A [`BlockTree`] the receivers of one file's ranges share (parallel streams): each hashes
/// its blocks outside the lock and only stores the values under it. A resumed part's
/// verified ranges can be hashed on a thread of their own while the rest arrives
/// ([`SharedTree::fill_behind`]).
#[derive(Debug, Clone)]
pub struct SharedTree(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    tree: Mutex<BlockTree>,
    /// The thread hashing ranges already in the file, if one was started.
    behind: Mutex<Option<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Bytes the background fill reads and hashes at a time (a whole number of units).
const FILL_PIECE: u64 = 8 << 20;

impl SharedTree {
    /// Shares `tree`.
    pub fn new(tree: BlockTree) -> SharedTree {
        SharedTree(Arc::new(Shared {
            tree: Mutex::new(tree),
            behind: Mutex::new(None),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BlockTree> {
        lock(&self.0.tree)
    }

    /// [`BlockTree::record`], hashing without holding the lock.
    pub fn record(&self, offset: u64, data: &[u8]) {
        let geo = self.lock().geo;
        let values = geo.values(offset, data);
        let mut t = self.lock();
        for (i, v) in values {
            if let Some(slot) = t.cvs.get_mut(i) {
                *slot = v;
            }
        }
    }

    /// Records the block `data` at `offset` from its [`BlockSpans`] when they are this
    /// tree's units (no hashing), else by hashing its bytes ([`SharedTree::record`]).
    pub fn record_spans(&self, offset: u64, data: &[u8], spans: Option<&BlockSpans>) {
        let taken = spans.is_some_and(|s| self.lock().record_spans(s));
        if !taken {
            self.record(offset, data);
        }
    }

    /// Starts hashing `ranges` of `file` (a resumed part's verified bytes, which no block of
    /// this transfer brings again) on a thread, so the final [`SharedTree::root_filling_from`]
    /// does not read them back serially after the last block: a resume then costs what
    /// the bytes it moves cost, not that plus a read of what it did not move. Only units
    /// the ranges cover whole are recorded (ranges start and end on block boundaries, so
    /// that is all of them); whatever the thread does not supply (it stops at a read error,
    /// or when the tree is dropped) the final fill reads.
    pub fn fill_behind(&self, file: &File, ranges: Vec<(u64, u64)>) {
        let geo = self.lock().geo;
        let pieces = geo.whole_units(&ranges);
        if pieces.is_empty() {
            return;
        }
        let Ok(file) = file.try_clone() else {
            return;
        };
        let tree = Arc::downgrade(&self.0);
        let spawned = std::thread::Builder::new()
            .name("ferry-hash-held".into())
            .spawn(move || fill_pieces(&tree, geo, &file, &pieces));
        match spawned {
            Ok(h) => *lock(&self.0.behind) = Some(h),
            Err(e) => tracing::debug!("no background hashing ({e}); hashed at the end"),
        }
    }

    /// The whole file's BLAKE3, once every unit has its value ([`BlockTree::root`]).
    pub fn root(&self) -> Option<[u8; 32]> {
        self.lock().root()
    }

    /// [`BlockTree::fill`] from `file` (after the background fill, if one runs, ended),
    /// then [`BlockTree::root`].
    pub fn root_filling_from(&self, file: &File) -> std::io::Result<[u8; 32]> {
        let behind = lock(&self.0.behind).take();
        if let Some(h) = behind {
            // A thread that failed left its units missing: the fill below reads them.
            let _ = h.join();
        }
        let mut t = self.lock();
        t.fill(file)?;
        t.root()
            .ok_or_else(|| std::io::Error::other("internal: a unit of the file was not hashed"))
    }
}

/// The background fill: reads `pieces` of `file` and records their units' values into the
/// tree while it lives (hashing outside its lock).
fn fill_pieces(tree: &Weak<Shared>, geo: Geometry, file: &File, pieces: &[(u64, u64)]) {
    use std::os::unix::fs::FileExt;
    let mut buf = Vec::new();
    for &(lo, hi) in pieces {
        buf.resize((hi - lo) as usize, 0);
        if file.read_exact_at(&mut buf, lo).is_err() {
            return;
        }
        let values = geo.values(lo, &buf);
        let Some(shared) = tree.upgrade() else {
            return;
        };
        let mut t = lock(&shared.tree);
        for (i, v) in values {
            if let (Some(slot), Some(v)) = (t.cvs.get_mut(i), v) {
                *slot = Some(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn data(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
            .collect()
    }

    /// The root from blocks recorded in any order equals the plain hash, for sizes around
    /// the unit and chunk boundaries.
    fn check(size: usize, block: u64, order_seed: u64) {
        let bytes = data(size, order_seed as u8);
        let mut tree = BlockTree::new(size as u64, block).unwrap();
        let mut blocks: Vec<u64> = (0..(size as u64).div_ceil(block)).collect();
        // A fixed shuffle: parallel streams land blocks out of order.
        let k = blocks.len().max(1);
        blocks.rotate_left((order_seed as usize) % k);
        if order_seed % 2 == 1 {
            blocks.reverse();
        }
        for b in blocks {
            let lo = (b * block) as usize;
            let hi = (lo + block as usize).min(size);
            tree.record(lo as u64, &bytes[lo..hi]);
        }
        assert!(tree.missing().is_empty());
        assert_eq!(
            tree.root(),
            Some(*blake3::hash(&bytes).as_bytes()),
            "size {size} block {block}"
        );
    }

    #[test]
    fn sizes_around_boundaries() {
        for block in [1024u64, 4096, 3 << 12, 1 << 16] {
            for mult in [0u64, 1, 2, 3, 4, 5, 8, 9] {
                for delta in [-1i64, 0, 1] {
                    let size = (mult * block) as i64 + delta;
                    if size >= 0 {
                        check(size as usize, block, mult);
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn root_equals_the_plain_hash(
            shift in 10u32..15,
            odd in prop::sample::select(vec![1u64, 3, 5]),
            blocks in 0u64..12,
            delta in -1100i64..1100,
            seed in any::<u64>(),
        ) {
            let block = odd << shift;
            let size = ((blocks * block) as i64 + delta).max(0) as usize;
            check(size, block, seed);
        }
    }

    /// Unaligned or partial writes leave their units to be filled from the file.
    #[test]
    fn partial_units_are_filled_from_the_file() {
        let bytes = data(10_000, 7);
        let p = std::env::temp_dir().join(format!("ferry-tree-{}", std::process::id()));
        std::fs::write(&p, &bytes).unwrap();
        let f = File::open(&p).unwrap();
        let tree = SharedTree::new(BlockTree::new(10_000, 2048).unwrap());
        tree.record(0, &bytes[..2048]);
        tree.record(3000, &bytes[3000..9000]); // covers units 2 and 3 whole only
        assert_eq!(tree.lock().missing(), vec![(2048, 4096), (8192, 10_000)]);
        assert_eq!(
            tree.root_filling_from(&f).unwrap(),
            *blake3::hash(&bytes).as_bytes()
        );
        let _ = std::fs::remove_file(&p);
    }

    /// A resumed part: its verified ranges hashed on a thread while the other blocks are
    /// recorded give the plain hash, and leave nothing for the final fill to read.
    #[test]
    fn ranges_held_are_hashed_behind() {
        let (size, block) = (40 << 20 | 1234, 1u64 << 20);
        let bytes = data(size, 3);
        let p = std::env::temp_dir().join(format!("ferry-tree-behind-{}", std::process::id()));
        std::fs::write(&p, &bytes).unwrap();
        let f = File::open(&p).unwrap();
        let tree = SharedTree::new(BlockTree::new(size as u64, block).unwrap());
        // Held: the first 17 blocks and blocks 30..32; the rest arrives meanwhile.
        let held = vec![(0, 17 * block), (30 * block, 32 * block)];
        tree.fill_behind(&f, held.clone());
        for b in (0..(size as u64).div_ceil(block)).filter(|&b| !(b < 17 || (30..32).contains(&b)))
        {
            let lo = (b * block) as usize;
            let hi = (lo + block as usize).min(size);
            tree.record(lo as u64, &bytes[lo..hi]);
        }
        let behind = tree.0.behind.lock().unwrap().take().unwrap();
        behind.join().unwrap();
        assert!(tree.lock().missing().is_empty());
        assert_eq!(
            tree.root_filling_from(&f).unwrap(),
            *blake3::hash(&bytes).as_bytes()
        );
        // Ranges that end at the file's end, or on no unit boundary, cover whole units only.
        let geo = tree.lock().geo;
        assert_eq!(
            geo.whole_units(&[(39 << 20, size as u64)]),
            vec![(39 << 20, size as u64)]
        );
        assert_eq!(geo.whole_units(&[(1, (1 << 20) + 5)]), vec![]);
        let _ = std::fs::remove_file(&p);
    }

    /// A file hashed by several threads, each over its own span, gives the plain hash;
    /// sizes around the unit and the spans' edges, and a file shorter than asked fails.
    #[test]
    fn files_hashed_in_parallel_give_the_plain_hash() {
        let p = std::env::temp_dir().join(format!("ferry-tree-par-{}", std::process::id()));
        for size in [0usize, 1000, PAR_UNIT as usize, 17 << 20, (40 << 20) + 3] {
            let bytes = data(size, 9);
            std::fs::write(&p, &bytes).unwrap();
            let f = File::open(&p).unwrap();
            for threads in [1, 2, 3, 8] {
                assert_eq!(
                    hash_file_parallel(&f, size as u64, threads).unwrap(),
                    *blake3::hash(&bytes).as_bytes(),
                    "size {size}, {threads} threads"
                );
            }
            assert!(hash_file_parallel(&f, size as u64 + (9 << 20), 2).is_err());
        }
        let _ = std::fs::remove_file(&p);
    }

    /// The root built from the spans every block's tag reads equals the plain hash, with
    /// no block hashed twice when the block size is a power of two; and for sizes around
    /// the unit and block boundaries, whatever the block size.
    #[test]
    fn roots_from_the_tags_spans_equal_the_plain_hash() {
        for block in [4096u64, 1 << 16, 3 << 12, 5 << 14] {
            for mult in [0u64, 1, 2, 3, 4, 7, 8, 9] {
                for delta in [-4097i64, -1, 0, 1, 1024, 4096] {
                    let Ok(size) = usize::try_from((mult * block) as i64 + delta) else {
                        continue;
                    };
                    let bytes = data(size, mult as u8);
                    let mut tree = BlockTree::new(size as u64, block).unwrap();
                    let mut rehashed = 0;
                    for lo in (0..size).step_by(block as usize) {
                        let piece = &bytes[lo..(lo + block as usize).min(size)];
                        let spans = BlockSpans::of(lo as u64, piece, size as u64)
                            .expect("a block cut at a multiple of the block size has spans");
                        if !tree.record_spans(&spans) {
                            rehashed += 1;
                            tree.record(lo as u64, piece);
                        }
                    }
                    let want = Some(*blake3::hash(&bytes).as_bytes());
                    assert_eq!(tree.root(), want, "size {size} block {block}");
                    if block.is_power_of_two() {
                        assert_eq!(rehashed, 0, "size {size} block {block}");
                    }
                }
            }
        }
    }

    /// A block's spans, and so its tag's digest, change with any byte, its offset, or where
    /// the file ends; blocks too finely aligned keep the plain digest.
    #[test]
    fn spans_bind_bytes_place_and_size() {
        let bytes = data(3 << 14, 1);
        let at = |o: u64, b: &[u8], size: u64| BlockSpans::of(o, b, size).unwrap().digest();
        let d = at(1 << 16, &bytes, 1 << 20);
        let mut changed = bytes.clone();
        changed[40_000] ^= 1;
        assert_ne!(at(1 << 16, &changed, 1 << 20), d, "a changed byte");
        assert_ne!(at(1 << 17, &bytes, 1 << 20), d, "another offset");
        assert_ne!(
            at(1 << 16, &bytes, (1 << 16) + (3 << 14)),
            d,
            "the file's end"
        );
        assert_ne!(at(0, &bytes, 3 << 14), *blake3::hash(&bytes).as_bytes());
        assert!(
            BlockSpans::of(1024, &bytes, 1 << 20).is_none(),
            "1 KiB aligned"
        );
        assert!(BlockSpans::of(0, &[], 0).is_none(), "empty");
        assert!(
            BlockSpans::of(1 << 20, &bytes, 1 << 20).is_none(),
            "past the end"
        );
    }

    #[test]
    fn blocks_not_a_multiple_of_a_chunk_have_no_tree() {
        assert!(BlockTree::new(100, 1000).is_none());
        assert!(BlockTree::new(100, 0).is_none());
        assert_eq!(BlockTree::new(100, 4096 * 3).unwrap().geo.unit, 4096);
    }
}
