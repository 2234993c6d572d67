//! The segment cursor: a lazy, seekable walk over the merged `(offset, len)` runs of a layout.

use std::iter::FusedIterator;
use std::ops::Range;

use crate::error::{DtypeError, Result};
use crate::types::{Datatype, Kind};

/// A run of bytes: `len` bytes from `offset`, relative to the layout's origin (the buffer
/// position of displacement 0). In a buffer whose origin is at index `origin`, the run is
/// `origin + offset .. origin + offset + len` (see [`Segment::buffer_range`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Offset from the origin; negative when the layout reaches below it.
    pub offset: i64,
    /// Length in bytes.
    pub len: u64,
}

impl Segment {
    /// A segment of `len` bytes at `offset`.
    pub const fn new(offset: i64, len: u64) -> Self {
        Self { offset, len }
    }

    /// The segment's indices in a buffer whose origin (displacement 0) is at index `origin`,
    /// or `None` if they would fall below index 0 or overflow `usize`. The caller still checks
    /// the end against the buffer's length; [`crate::Packer`] checks the whole layout at once.
    pub fn buffer_range(&self, origin: usize) -> Option<Range<usize>> {
        let start = i128::try_from(origin).ok()? + i128::from(self.offset);
        let start = usize::try_from(start).ok()?;
        let end = start.checked_add(usize::try_from(self.len).ok()?)?;
        Some(start..end)
    }
}

impl From<(i64, u64)> for Segment {
    fn from((offset, len): (i64, u64)) -> Self {
        Self { offset, len }
    }
}

/// One level of the walk: a node instance at `base` and the next of its children to visit.
#[derive(Clone)]
struct Frame {
    node: Datatype,
    base: i64,
    /// Next block.
    block: u64,
    /// Next copy within that block.
    elem: u64,
}

/// Walks the data stream of `count` instances of a datatype as maximal runs of bytes.
///
/// - **Lazy**: the state is one frame per nesting level (at most [`Datatype::depth`]` + 1`,
///   allocated once); a vector of 2^20 blocks is walked without a list of them.
/// - **Merged**: runs that continue each other in stream order (one ends where the next
///   begins) come out as one [`Segment`], so every segment is maximal.
/// - **Seekable**: [`Cursor::seek`] jumps to any byte of the stream in O(depth) steps,
///   each O(1) for vectors or a binary search for indexed and struct types.
/// - **Bounded**: [`Cursor::next_segment`] and [`Cursor::next_batch`] stop at a byte budget,
///   splitting a run; the next call continues inside it.
///
/// The data stream is what packing produces: the bytes of the type map in order. Position
/// `p` of the stream is byte `p` of the packed message, so a transfer resumes by seeking to
/// the count of bytes already moved.
///
/// ```
/// use ferry_dtype::{Cursor, Datatype, Segment};
/// // 3 blocks of 2 doubles, 4 doubles apart.
/// let t = Datatype::vector(3, 2, 4, &Datatype::primitive(8)?)?;
/// let mut c = Cursor::new(&t, 1)?;
/// c.seek(20)?; // 4 bytes into the second block
/// let mut batch = Vec::new();
/// let bytes = c.next_batch(8, 1 << 20, &mut batch);
/// assert_eq!(batch, [Segment::new(36, 12), Segment::new(64, 16)]);
/// assert_eq!((bytes, c.position()), (28, 48));
/// # Ok::<(), ferry_dtype::DtypeError>(())
/// ```
#[derive(Clone)]
pub struct Cursor {
    /// `count` instances of the type (a contiguous type over it).
    root: Datatype,
    /// Bytes of the stream already yielded.
    pos: u64,
    stack: Vec<Frame>,
    /// The rest of a run taken from the walk but not yet yielded.
    pending: Option<(i64, u64)>,
}

impl Cursor {
    /// A cursor at the start of the data stream of `count` instances of `dtype`, laid out
    /// `dtype.extent()` bytes apart. Errors if the whole layout overflows 64-bit arithmetic.
    pub fn new(dtype: &Datatype, count: u64) -> Result<Cursor> {
        let root = Datatype::contiguous(count, dtype)?;
        let mut cursor = Cursor {
            stack: Vec::with_capacity(root.0.depth + 1),
            root,
            pos: 0,
            pending: None,
        };
        cursor.seek(0)?;
        Ok(cursor)
    }

    /// A cursor at byte `pos` of the data stream: [`Cursor::new`] then [`Cursor::seek`].
    pub fn at(dtype: &Datatype, count: u64, pos: u64) -> Result<Cursor> {
        let mut cursor = Self::new(dtype, count)?;
        cursor.seek(pos)?;
        Ok(cursor)
    }

    /// Bytes in the whole data stream (`count * size`).
    pub fn total(&self) -> u64 {
        self.root.0.size
    }

    /// Bytes of the stream already yielded (the position of the next byte).
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Bytes still to come.
    pub fn remaining(&self) -> u64 {
        self.total() - self.pos
    }

    /// True at the end of the stream.
    pub fn is_done(&self) -> bool {
        self.pos == self.total()
    }

    /// Heap and inline bytes this cursor holds: O(depth), whatever the number of segments.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.stack.capacity() * std::mem::size_of::<Frame>()
    }

    /// Moves to byte `pos` of the data stream (`pos == total()` is the end). The next segment
    /// then starts at the offset of that byte, and is the rest of the maximal run holding it,
    /// exactly as a walk from the start would have yielded it.
    pub fn seek(&mut self, pos: u64) -> Result<()> {
        let total = self.total();
        if pos > total {
            return Err(DtypeError::PositionOutOfRange { pos, total });
        }
        self.stack.clear();
        self.pending = None;
        self.pos = pos;
        if pos == total {
            return Ok(());
        }
        let broken = DtypeError::Invalid {
            op: "seek",
            reason: "inconsistent datatype (a bug in ferry-dtype)",
        };
        self.push(self.root.clone(), 0);
        let mut rem = pos;
        loop {
            let Some(top) = self.stack.last_mut() else {
                return Err(broken);
            };
            let kind = &top.node.0.kind;
            let Some((b, r)) = kind.locate(rem) else {
                return Err(broken);
            };
            let Some((copies, disp, child)) = kind.block(b) else {
                return Err(broken);
            };
            let c = &child.0;
            let block_base = top.base.wrapping_add(disp);
            if c.dense && (copies == 1 || c.tiles) {
                top.block = b + 1;
                top.elem = 0;
                let start = block_base.wrapping_add(c.true_lb).wrapping_add(r as i64);
                self.pending = Some((start, copies * c.size - r));
                return Ok(());
            }
            let (Some(e), Some(r)) = (r.checked_div(c.size), r.checked_rem(c.size)) else {
                return Err(broken);
            };
            let inst = block_base.wrapping_add((e as i64).wrapping_mul(c.extent));
            (top.block, top.elem) = if e + 1 == copies {
                (b + 1, 0)
            } else {
                (b, e + 1)
            };
            if c.dense {
                let start = inst.wrapping_add(c.true_lb).wrapping_add(r as i64);
                self.pending = Some((start, c.size - r));
                return Ok(());
            }
            let child = child.clone();
            self.push(child, inst);
            rem = r;
        }
    }

    /// Enters a node instance at `base`. A resized node only changes bounds: its child is
    /// entered directly.
    fn push(&mut self, mut node: Datatype, base: i64) {
        while let Kind::Resized { child } = &node.0.kind {
            let child = child.clone();
            node = child;
        }
        self.stack.push(Frame {
            node,
            base,
            block: 0,
            elem: 0,
        });
    }

    /// The next leaf run of the walk, unmerged.
    ///
    /// Offsets are summed wrapping: the constructors proved each data offset fits `i64`, and
    /// wrapping addition is exact modulo 2^64, so the final sums are exact.
    fn next_raw(&mut self) -> Option<(i64, u64)> {
        loop {
            let top = self.stack.last_mut()?;
            let kind = &top.node.0.kind;
            if top.block >= kind.nblocks() {
                self.stack.pop();
                continue;
            }
            let Some((copies, disp, child)) = kind.block(top.block) else {
                self.stack.pop();
                continue;
            };
            let c = &child.0;
            if copies == 0 || c.size == 0 {
                top.block += 1;
                top.elem = 0;
                continue;
            }
            let block_base = top.base.wrapping_add(disp);
            if c.dense && (copies == 1 || c.tiles) {
                top.block += 1;
                top.elem = 0;
                // No overflow: a block's bytes are part of the checked size.
                return Some((block_base.wrapping_add(c.true_lb), copies * c.size));
            }
            let inst = block_base.wrapping_add((top.elem as i64).wrapping_mul(c.extent));
            top.elem += 1;
            if top.elem == copies {
                top.block += 1;
                top.elem = 0;
            }
            if c.dense {
                return Some((inst.wrapping_add(c.true_lb), c.size));
            }
            let child = child.clone();
            self.push(child, inst);
        }
    }

    /// The next maximal run, cut to at most `max_len` bytes; `None` at the end of the stream
    /// (or if `max_len` is 0). A cut run continues in the next call.
    pub fn next_segment(&mut self, max_len: u64) -> Option<Segment> {
        if max_len == 0 {
            return None;
        }
        let (offset, mut len) = match self.pending.take() {
            Some(run) => run,
            None => self.next_raw()?,
        };
        loop {
            if len >= max_len {
                if len > max_len {
                    self.pending = Some((offset.wrapping_add(max_len as i64), len - max_len));
                }
                len = max_len;
                break;
            }
            match self.next_raw() {
                Some((o, l)) if o == offset.wrapping_add(len as i64) => len += l,
                next => {
                    self.pending = next;
                    break;
                }
            }
        }
        self.pos += len;
        Some(Segment { offset, len })
    }

    /// Appends to `out` the next segments, at most `max_segments` of them and `max_bytes`
    /// bytes in all (the last one cut if needed), and returns the bytes appended. The shape a
    /// gather list wants: `max_segments` from the driver's gather limit, `max_bytes` from the
    /// message or staging-buffer size. Reusing `out` keeps the walk allocation-free.
    pub fn next_batch(
        &mut self,
        max_segments: usize,
        max_bytes: u64,
        out: &mut Vec<Segment>,
    ) -> u64 {
        let mut bytes = 0;
        for _ in 0..max_segments {
            match self.next_segment(max_bytes - bytes) {
                Some(seg) => {
                    bytes += seg.len;
                    out.push(seg);
                }
                None => break,
            }
        }
        bytes
    }
}

impl Iterator for Cursor {
    type Item = Segment;

    /// The next maximal run, uncut.
    fn next(&mut self) -> Option<Segment> {
        self.next_segment(u64::MAX)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::from(!self.is_done()), None)
    }
}

impl FusedIterator for Cursor {}

impl std::fmt::Debug for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cursor")
            .field("position", &self.pos)
            .field("total", &self.total())
            .field("depth", &self.stack.len())
            .finish()
    }
}
