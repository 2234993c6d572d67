//! Resumable packing and unpacking between a layout over a buffer and contiguous bytes.

use std::ops::Range;

use crate::cursor::Cursor;
use crate::error::{DtypeError, Result};
use crate::types::Datatype;

/// The machinery shared by [`Packer`] and [`Unpacker`]: a cursor kept where the last call
/// stopped, so consecutive calls cost no seek.
#[derive(Clone, Debug)]
struct Engine {
    cursor: Cursor,
    /// Offsets `[lo, hi)` the layout touches, if it has data.
    range: Option<(i64, i64)>,
}

impl Engine {
    fn new(dtype: &Datatype, count: u64) -> Result<Self> {
        let cursor = Cursor::new(dtype, count)?;
        let range = dtype.true_range(count)?.map(|r| (r.start, r.end));
        Ok(Self { cursor, range })
    }

    /// Checks the whole layout against a buffer of `len` bytes with displacement 0 at index
    /// `origin`, before anything is copied.
    fn check(&self, origin: usize, len: usize) -> Result<()> {
        let Some((lo, hi)) = self.range else {
            return Ok(());
        };
        let o = origin as i128;
        if o + i128::from(lo) >= 0 && o + i128::from(hi) <= len as i128 {
            Ok(())
        } else {
            Err(DtypeError::OutOfBuffer {
                lo,
                hi,
                origin,
                len,
            })
        }
    }

    /// Positions the cursor at `pos` and returns how many bytes a call with room for
    /// `room` bytes moves.
    fn start(&mut self, pos: u64, room: usize) -> Result<usize> {
        if pos != self.cursor.position() {
            self.cursor.seek(pos)?;
        }
        // `remaining()` fits usize whenever it is smaller than `room`.
        Ok(usize::try_from(self.cursor.remaining()).map_or(room, |rest| rest.min(room)))
    }

    /// Calls `copy(buffer range, packed range)` for each segment of the next `want` bytes.
    /// `copy` returns false if a range is outside its slice, which `check` rules out; it is
    /// reported as the same error rather than trusted.
    fn run(
        &mut self,
        origin: usize,
        len: usize,
        want: usize,
        mut copy: impl FnMut(Range<usize>, Range<usize>) -> bool,
    ) -> Result<usize> {
        let mut done = 0;
        while done < want {
            let Some(seg) = self.cursor.next_segment((want - done) as u64) else {
                break;
            };
            let range = seg.buffer_range(origin);
            let n = seg.len as usize;
            if !range.is_some_and(|range| copy(range, done..done + n)) {
                let (lo, hi) = self.range.unwrap_or_default();
                return Err(DtypeError::OutOfBuffer {
                    lo,
                    hi,
                    origin,
                    len,
                });
            }
            done += n;
        }
        Ok(done)
    }
}

/// Copies `from` to `to` if both ranges lie inside their slices.
fn copy_checked(
    to: &mut [u8],
    to_range: Range<usize>,
    from: &[u8],
    from_range: Range<usize>,
) -> bool {
    match (to.get_mut(to_range), from.get(from_range)) {
        (Some(to), Some(from)) if to.len() == from.len() => {
            to.copy_from_slice(from);
            true
        }
        _ => false,
    }
}

/// Packs `count` instances of a datatype from a buffer into contiguous bytes, in pieces:
/// each [`Packer::pack`] call continues at any byte position of the packed stream, so a
/// pipeline packs 64 KiB at a time into a staging buffer.
///
/// ```
/// use ferry_dtype::{Datatype, Packer};
/// // Every other byte of an 8-byte buffer.
/// let t = Datatype::vector(4, 1, 2, &Datatype::byte())?;
/// let src = *b"aAbBcCdD";
/// let mut packer = Packer::new(&t, 1)?;
/// let mut out = [0u8; 3];
/// assert_eq!(packer.pack(&src, 0, 0, &mut out)?, 3);
/// assert_eq!(&out, b"abc");
/// assert_eq!(packer.pack(&src, 0, 3, &mut out)?, 1);
/// assert_eq!(&out[..1], b"d");
/// # Ok::<(), ferry_dtype::DtypeError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Packer(Engine);

impl Packer {
    /// A packer for `count` instances of `dtype`, laid out `dtype.extent()` bytes apart.
    pub fn new(dtype: &Datatype, count: u64) -> Result<Self> {
        Ok(Self(Engine::new(dtype, count)?))
    }

    /// Bytes of the whole packed stream.
    pub fn packed_size(&self) -> u64 {
        self.0.cursor.total()
    }

    /// Copies packed bytes `pos..` into `out` from the layout over `src`, whose displacement
    /// 0 is at index `origin`; returns the bytes written: `out.len()`, or fewer at the end of
    /// the stream. Errors, before writing anything, if `pos` is past the end or the layout
    /// reaches outside `src`.
    pub fn pack(&mut self, src: &[u8], origin: usize, pos: u64, out: &mut [u8]) -> Result<usize> {
        self.0.check(origin, src.len())?;
        let want = self.0.start(pos, out.len())?;
        self.0.run(origin, src.len(), want, |from, to| {
            copy_checked(out, to, src, from)
        })
    }
}

/// Unpacks contiguous bytes into `count` instances of a datatype over a buffer, in pieces:
/// the receiving twin of [`Packer`]. Bytes that several entries of the type map share (only
/// possible with overlapping layouts) end up with the last write in stream order.
#[derive(Clone, Debug)]
pub struct Unpacker(Engine);

impl Unpacker {
    /// An unpacker for `count` instances of `dtype`, laid out `dtype.extent()` bytes apart.
    pub fn new(dtype: &Datatype, count: u64) -> Result<Self> {
        Ok(Self(Engine::new(dtype, count)?))
    }

    /// Bytes of the whole packed stream.
    pub fn packed_size(&self) -> u64 {
        self.0.cursor.total()
    }

    /// Copies `input`, which holds packed bytes `pos..`, into the layout over `dst`, whose
    /// displacement 0 is at index `origin`; returns the bytes consumed: `input.len()`, or
    /// fewer at the end of the stream. Errors, before writing anything, if `pos` is past the
    /// end or the layout reaches outside `dst`.
    pub fn unpack(
        &mut self,
        dst: &mut [u8],
        origin: usize,
        pos: u64,
        input: &[u8],
    ) -> Result<usize> {
        self.0.check(origin, dst.len())?;
        let want = self.0.start(pos, input.len())?;
        self.0.run(origin, dst.len(), want, |to, from| {
            copy_checked(dst, to, input, from)
        })
    }
}

/// Packs all `count` instances of `dtype` from `src` (origin at index `origin`) into a new
/// vector: [`Packer`] in one call.
pub fn pack(dtype: &Datatype, count: u64, src: &[u8], origin: usize) -> Result<Vec<u8>> {
    let mut packer = Packer::new(dtype, count)?;
    let size = usize::try_from(packer.packed_size()).map_err(|_| DtypeError::Overflow {
        op: "pack",
        what: "packed size",
    })?;
    let mut out = vec![0; size];
    packer.pack(src, origin, 0, &mut out)?;
    Ok(out)
}

/// Unpacks `packed`, which must hold exactly the packed size of `count` instances of
/// `dtype`, into `dst` (origin at index `origin`): [`Unpacker`] in one call.
pub fn unpack(
    dtype: &Datatype,
    count: u64,
    packed: &[u8],
    dst: &mut [u8],
    origin: usize,
) -> Result<()> {
    let mut unpacker = Unpacker::new(dtype, count)?;
    if packed.len() as u64 != unpacker.packed_size() {
        return Err(DtypeError::PackedLength {
            got: packed.len(),
            expected: unpacker.packed_size(),
        });
    }
    unpacker.unpack(dst, origin, 0, packed)?;
    Ok(())
}
