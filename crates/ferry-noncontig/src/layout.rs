//! Local and remote layouts, their bounds checks, and packing between a layout over a
//! registered region and a contiguous buffer.

use ferry_dtype::{Cursor, Datatype};
use ferry_fabric::{Buffer, MemoryRegion, RemoteSlice};

use crate::error::{NoncontigError, Result};

/// `count` instances of `dtype` over a registered local region, displacement 0 at region
/// offset `origin`.
#[derive(Clone, Debug)]
pub struct LocalLayout {
    /// The registered memory.
    pub region: MemoryRegion,
    /// Region offset of displacement 0.
    pub origin: usize,
    /// Where the bytes lie, relative to the origin.
    pub dtype: Datatype,
    /// Instances, `dtype.extent()` apart.
    pub count: u64,
}

/// `count` instances of `dtype` over a peer's advertised slice, displacement 0 at slice
/// offset `origin`.
#[derive(Clone, Debug)]
pub struct RemoteLayout {
    /// What the peer advertised; nothing outside it is ever addressed.
    pub slice: RemoteSlice,
    /// Slice offset of displacement 0.
    pub origin: u64,
    /// Where the bytes lie, relative to the origin.
    pub dtype: Datatype,
    /// Instances, `dtype.extent()` apart.
    pub count: u64,
}

/// Checks `lo..hi` (relative to `origin`) against `0..len`.
fn inside(range: Option<std::ops::Range<i64>>, origin: i128, len: i128) -> Option<(i64, i64)> {
    let r = range?;
    let ok = origin + i128::from(r.start) >= 0 && origin + i128::from(r.end) <= len;
    (!ok).then_some((r.start, r.end))
}

impl LocalLayout {
    /// A layout of `count` instances of `dtype` at `origin` in `region`.
    pub fn new(region: MemoryRegion, origin: usize, dtype: Datatype, count: u64) -> Self {
        Self {
            region,
            origin,
            dtype,
            count,
        }
    }

    /// The whole region as one contiguous run of bytes.
    pub fn contiguous(region: MemoryRegion) -> Self {
        let len = region.len() as u64;
        Self::new(region, 0, Datatype::byte(), len)
    }

    /// Bytes of the data stream.
    pub fn size(&self) -> u64 {
        self.dtype.size().saturating_mul(self.count)
    }

    /// Errors unless every byte of the layout lies inside the region.
    pub fn check(&self) -> Result<()> {
        let range = self.dtype.true_range(self.count)?;
        match inside(range, self.origin as i128, self.region.len() as i128) {
            None => Ok(()),
            Some((lo, hi)) => Err(NoncontigError::LocalOutOfRegion {
                lo,
                hi,
                origin: self.origin,
                len: self.region.len(),
            }),
        }
    }

    /// A cursor over the data stream.
    pub(crate) fn cursor(&self) -> Result<Cursor> {
        Ok(Cursor::new(&self.dtype, self.count)?)
    }

    /// Region offset of a segment offset (the layout was checked, so it is in range).
    pub(crate) fn at(&self, offset: i64) -> usize {
        (self.origin as i128 + i128::from(offset)) as usize
    }
}

impl RemoteLayout {
    /// A layout of `count` instances of `dtype` at `origin` in `slice`.
    pub fn new(slice: RemoteSlice, origin: u64, dtype: Datatype, count: u64) -> Self {
        Self {
            slice,
            origin,
            dtype,
            count,
        }
    }

    /// The whole slice as one contiguous run of bytes.
    pub fn contiguous(slice: RemoteSlice) -> Self {
        Self::new(slice, 0, Datatype::byte(), slice.len)
    }

    /// Bytes of the data stream.
    pub fn size(&self) -> u64 {
        self.dtype.size().saturating_mul(self.count)
    }

    /// Errors unless every byte of the layout lies inside the advertised slice.
    pub fn check(&self) -> Result<()> {
        let range = self.dtype.true_range(self.count)?;
        match inside(range, i128::from(self.origin), i128::from(self.slice.len)) {
            None => Ok(()),
            Some((lo, hi)) => Err(NoncontigError::RemoteOutOfSlice {
                lo,
                hi,
                origin: self.origin,
                len: self.slice.len,
            }),
        }
    }

    pub(crate) fn cursor(&self) -> Result<Cursor> {
        Ok(Cursor::new(&self.dtype, self.count)?)
    }

    /// Slice offset of a segment offset (the layout was checked, so it is in range).
    pub(crate) fn at(&self, offset: i64) -> u64 {
        (i128::from(self.origin) + i128::from(offset)) as u64
    }
}

/// Packs `len` bytes of `layout`'s data stream from position `pos` into `out` at `out_offset`
/// (one copy per segment, straight between the two buffers). Returns the bytes packed
/// (fewer than `len` at the end of the stream). The receiving peer of a packed transfer
/// uses [`unpack_from_buffer`].
pub fn pack_to_buffer(
    layout: &LocalLayout,
    pos: u64,
    out: &Buffer,
    out_offset: usize,
    len: usize,
) -> Result<usize> {
    copy_stream(layout, pos, out, out_offset, len, true)
}

/// Unpacks `len` contiguous bytes of `input` at `in_offset` into `layout`'s data stream from
/// position `pos`. Returns the bytes unpacked (fewer than `len` at the end of the stream).
pub fn unpack_from_buffer(
    layout: &LocalLayout,
    pos: u64,
    input: &Buffer,
    in_offset: usize,
    len: usize,
) -> Result<usize> {
    copy_stream(layout, pos, input, in_offset, len, false)
}

fn copy_stream(
    layout: &LocalLayout,
    pos: u64,
    contig: &Buffer,
    offset: usize,
    len: usize,
    pack: bool,
) -> Result<usize> {
    layout.check()?;
    if offset.checked_add(len).is_none_or(|end| end > contig.len()) {
        return Err(NoncontigError::Invalid(format!(
            "{len} bytes at {offset} outside the {}-byte buffer",
            contig.len()
        )));
    }
    let mut cursor = Cursor::at(&layout.dtype, layout.count, pos)?;
    let mut done = 0usize;
    let buf = layout.region.buffer();
    while done < len {
        let Some(seg) = cursor.next_segment((len - done) as u64) else {
            break;
        };
        let n = seg.len as usize;
        if pack {
            contig.copy_from(offset + done, buf, layout.at(seg.offset), n);
        } else {
            buf.copy_from(layout.at(seg.offset), contig, offset + done, n);
        }
        done += n;
    }
    Ok(done)
}
