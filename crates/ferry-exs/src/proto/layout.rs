//! The compact layout an ADVERT with [`F_LAYOUT`](super::wire::F_LAYOUT) carries (EXS 1.1):
//! where the message's bytes lie inside the advertised slice, so the receiver can gather
//! them with RMA reads straight from the sender's noncontiguous buffer.
//!
//! A layout is a list of segments repeated `reps` times, `stride` bytes apart: the message
//! stream is, for `r` in `0..reps` and each segment `(off, len)` in order, the bytes
//! `off + r * stride .. + len` of the slice. One segment repeated covers MPI vectors (EXIO's
//! benchmark pattern); `reps = 1` covers any short segment list. Pure data: no I/O.

/// Bytes before the segments: `reps u64`, `stride u64`, `nseg u32`, 4 zero bytes.
pub const LAYOUT_HEADER: usize = 24;
/// Bytes per segment: `offset u64`, `len u64`.
pub const LAYOUT_SEGMENT: usize = 16;

/// A checked layout: every byte lies inside the slice it was checked against and its size
/// fits in `u64`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireLayout {
    reps: u64,
    stride: u64,
    segs: Vec<(u64, u64)>,
    size: u64,
}

impl WireLayout {
    /// A layout of `segs` (`(offset, len)` within the slice, each `len >= 1`) repeated `reps`
    /// times `stride` bytes apart, checked to lie within `span` bytes. `None` if it does not,
    /// if it is not canonical (no segments, `reps == 0`, a zero-length segment, a stride with
    /// `reps == 1`), or if any figure overflows.
    pub fn new(reps: u64, stride: u64, segs: Vec<(u64, u64)>, span: u64) -> Option<WireLayout> {
        if segs.is_empty() || reps == 0 || (reps == 1 && stride != 0) {
            return None;
        }
        let mut per = 0u64;
        let mut end = 0u64;
        for &(off, len) in &segs {
            if len == 0 {
                return None;
            }
            per = per.checked_add(len)?;
            end = end.max(off.checked_add(len)?);
        }
        let last = (reps - 1).checked_mul(stride)?.checked_add(end)?;
        if last > span {
            return None;
        }
        let size = per.checked_mul(reps)?;
        Some(WireLayout {
            reps,
            stride,
            segs,
            size,
        })
    }

    /// Bytes in the message stream.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Repetitions.
    pub fn reps(&self) -> u64 {
        self.reps
    }

    /// Distance between repetitions.
    pub fn stride(&self) -> u64 {
        self.stride
    }

    /// The segments of one repetition, `(offset, len)` within the slice.
    pub fn segments(&self) -> &[(u64, u64)] {
        &self.segs
    }

    /// Encoded length in bytes.
    pub fn encoded_len(&self) -> usize {
        LAYOUT_HEADER + LAYOUT_SEGMENT * self.segs.len()
    }

    /// The encoded length of a layout of `nseg` segments.
    pub fn encoded_len_of(nseg: usize) -> usize {
        LAYOUT_HEADER.saturating_add(LAYOUT_SEGMENT.saturating_mul(nseg))
    }

    /// Appends the encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.reps.to_le_bytes());
        out.extend_from_slice(&self.stride.to_le_bytes());
        out.extend_from_slice(&(self.segs.len() as u32).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        for &(off, len) in &self.segs {
            out.extend_from_slice(&off.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
        }
    }

    /// Decodes exactly `b` as a layout within `span` bytes; `None` unless canonical.
    pub fn decode(b: &[u8], span: u64) -> Option<WireLayout> {
        let u64_at = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
        };
        let reps = u64_at(0)?;
        let stride = u64_at(8)?;
        let nseg = u32::from_le_bytes(b.get(16..20)?.try_into().ok()?) as usize;
        if b.get(20..24)? != [0; 4] || b.len() != Self::encoded_len_of(nseg) {
            return None;
        }
        let segs = (0..nseg)
            .map(|i| {
                let at = LAYOUT_HEADER + i * LAYOUT_SEGMENT;
                Some((u64_at(at)?, u64_at(at + 8)?))
            })
            .collect::<Option<Vec<_>>>()?;
        Self::new(reps, stride, segs, span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bounds() {
        let l = WireLayout::new(16, 1 << 20, vec![(0, 256 << 10)], 16 << 20).expect("fits");
        assert_eq!(l.size(), 4 << 20);
        let mut b = Vec::new();
        l.encode(&mut b);
        assert_eq!(b.len(), l.encoded_len());
        assert_eq!(WireLayout::decode(&b, 16 << 20), Some(l.clone()));
        // One byte short of the span, a trailing byte, a reserved byte set: refused.
        assert_eq!(WireLayout::decode(&b, (15 << 20) + (256 << 10) - 1), None);
        let mut long = b.clone();
        long.push(0);
        assert_eq!(WireLayout::decode(&long, 16 << 20), None);
        let mut res = b.clone();
        res[21] = 1;
        assert_eq!(WireLayout::decode(&res, 16 << 20), None);
    }

    #[test]
    fn refuses_non_canonical_and_overflow() {
        assert!(WireLayout::new(1, 0, vec![], 10).is_none());
        assert!(WireLayout::new(0, 0, vec![(0, 1)], 10).is_none());
        assert!(WireLayout::new(1, 4, vec![(0, 1)], 10).is_none());
        assert!(WireLayout::new(1, 0, vec![(0, 0)], 10).is_none());
        assert!(WireLayout::new(u64::MAX, u64::MAX, vec![(0, 1)], u64::MAX).is_none());
        assert!(WireLayout::new(1, 0, vec![(u64::MAX, 1)], u64::MAX).is_none());
        assert!(WireLayout::new(3, 0, vec![(0, u64::MAX / 2)], u64::MAX).is_none());
        // Overlapping source segments are fine: a sender may send a byte twice.
        assert_eq!(
            WireLayout::new(2, 0, vec![(0, 4), (2, 4)], 6).map(|l| l.size()),
            Some(16)
        );
    }
}
