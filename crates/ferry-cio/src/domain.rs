//! File-domain buffers: a collective call whose many small pieces lie close together (the
//! seed's pattern: every rank's 4-byte ints interleaved) is placed into, or read from, one
//! buffer over the file span the pieces cover, instead of merging a million pieces by
//! offset and copying each into a staging run. Pure: no I/O.
//!
//! A write claims each piece's bytes in a bitmap of the span: a byte claimed twice is an
//! overlap (the caller then reports it the precise way), and the claimed runs, never the
//! holes between them, are the regions written. The ranks' pieces are then copied straight
//! from their streams into the buffer. A read takes the span in one read and copies each
//! rank's pieces out of it.

use crate::view::Extent;

/// Calls of fewer pieces than this are placed piece by piece (a few large pieces are
/// written straight from each rank's data, with no copy at all).
pub const MIN_PIECES: usize = 256;

/// A span at most this many times the bytes the pieces hold is dense enough for a
/// domain buffer (its holes cost a bitmap bit and a buffer byte each).
const MAX_SPREAD: u64 = 2;

/// The largest domain buffer, bytes.
const MAX_SPAN: u64 = 1 << 31;

/// The file span `[lo, hi)` that `lists`' pieces cover, if they are many, close together
/// and the span is small enough for one buffer.
pub fn dense_span<'a>(lists: impl Iterator<Item = &'a [Extent]>) -> Option<(u64, u64)> {
    let (mut lo, mut hi, mut bytes, mut pieces) = (u64::MAX, 0u64, 0u64, 0usize);
    for l in lists {
        for e in l.iter().filter(|e| e.len > 0) {
            lo = lo.min(e.file);
            hi = hi.max(e.file.checked_add(e.len)?);
            bytes = bytes.checked_add(e.len)?;
            pieces += 1;
        }
    }
    let span = hi.checked_sub(lo)?;
    let dense =
        pieces >= MIN_PIECES && span <= MAX_SPAN && span <= bytes.saturating_mul(MAX_SPREAD);
    dense.then_some((lo, hi))
}

/// The regions a write of `lists`' pieces over span `[lo, hi)` writes: the runs of bytes
/// some piece claims, `(file offset, length)`, ascending and apart. None if a byte is
/// claimed twice (an overlap) or a piece lies outside the span.
pub fn claim<'a>(
    lists: impl Iterator<Item = &'a [Extent]>,
    (lo, hi): (u64, u64),
) -> Option<Vec<(u64, u64)>> {
    let mut claimed = Bitmap::new(usize::try_from(hi.checked_sub(lo)?).ok()?);
    for l in lists {
        for e in l {
            let from = usize::try_from(e.file.checked_sub(lo)?).ok()?;
            if !claimed.claim(from, usize::try_from(e.len).ok()?) {
                return None;
            }
        }
    }
    Some(
        claimed
            .runs()
            .map(|(s, l)| (lo + s as u64, l as u64))
            .collect(),
    )
}

/// Copies every rank's pieces (`(extents, data stream)` per rank) into `buf`, which holds
/// the file's bytes from offset `lo`; None if a piece lies outside `buf` or its rank's
/// data.
pub fn place(buf: &mut [u8], lo: u64, ranks: &[(Vec<Extent>, Vec<u8>)]) -> Option<()> {
    for (extents, data) in ranks {
        let mut at = 0usize;
        for e in extents {
            let len = usize::try_from(e.len).ok()?;
            let from = usize::try_from(e.file.checked_sub(lo)?).ok()?;
            let src = data.get(at..at.checked_add(len)?)?;
            copy(buf.get_mut(from..from.checked_add(len)?)?, src);
            at += len;
        }
    }
    Some(())
}

/// Fills `out` with the stream of `extents` taken from `span`, which holds the file's
/// bytes from offset `lo` (the read twin of [`place`]); None if an extent lies outside
/// the span.
pub fn gather(extents: &[Extent], lo: u64, span: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let n: u64 = extents.iter().map(|e| e.len).sum();
    out.clear();
    out.resize(usize::try_from(n).ok()?, 0);
    let mut at = 0usize;
    for e in extents {
        let len = usize::try_from(e.len).ok()?;
        let from = usize::try_from(e.file.checked_sub(lo)?).ok()?;
        copy(
            &mut out[at..at + len],
            span.get(from..from.checked_add(len)?)?,
        );
        at += len;
    }
    Some(())
}

/// `dst.copy_from_slice(src)`, with the lengths of the usual etypes spelled out: a
/// 4-byte piece is one move rather than a call to `memcpy`.
#[inline]
fn copy(dst: &mut [u8], src: &[u8]) {
    match (dst.len(), src.len()) {
        (4, 4) => dst[..4].copy_from_slice(&src[..4]),
        (8, 8) => dst[..8].copy_from_slice(&src[..8]),
        _ => dst.copy_from_slice(src),
    }
}

/// One bit per byte of a span.
struct Bitmap(Vec<u64>);

impl Bitmap {
    fn new(bits: usize) -> Bitmap {
        Bitmap(vec![0; bits.div_ceil(64)])
    }

    /// Sets bits `[from, from + len)`; false (and nothing set past the first clash) if
    /// one was set already or the run leaves the map.
    #[inline]
    fn claim(&mut self, from: usize, len: usize) -> bool {
        let Some(end) = from.checked_add(len) else {
            return false;
        };
        let mut at = from;
        while at < end {
            let (w, b) = (at / 64, at % 64);
            let n = (64 - b).min(end - at);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << b
            };
            let Some(word) = self.0.get_mut(w) else {
                return false;
            };
            if *word & mask != 0 {
                return false;
            }
            *word |= mask;
            at += n;
        }
        true
    }

    /// The runs of set bits, `(start, length)`, ascending.
    fn runs(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let mut at = 0usize;
        let bits = self.0.len() * 64;
        std::iter::from_fn(move || {
            let start = self.next(at, true)?;
            let end = self.next(start, false).unwrap_or(bits);
            at = end;
            Some((start, end - start))
        })
    }

    /// The first bit at or after `at` that is `set` (or clear).
    fn next(&self, at: usize, set: bool) -> Option<usize> {
        let mut w = at / 64;
        let flip = |x: u64| if set { x } else { !x };
        let mut word = flip(*self.0.get(w)?) & (u64::MAX << (at % 64));
        loop {
            if word != 0 {
                return Some(w * 64 + word.trailing_zeros() as usize);
            }
            w += 1;
            word = flip(*self.0.get(w)?);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(v: &[(u64, u64)]) -> Vec<Extent> {
        v.iter().map(|&(file, len)| Extent { file, len }).collect()
    }

    #[test]
    fn claims_and_runs() {
        let mut b = Bitmap::new(200);
        assert!(b.claim(3, 4));
        assert!(b.claim(60, 70));
        assert!(!b.claim(129, 2));
        assert!(b.claim(7, 1));
        assert!(!b.claim(250, 20), "past the end of the words");
        assert_eq!(b.runs().collect::<Vec<_>>(), [(3, 5), (60, 70), (250, 6)]);
    }

    #[test]
    fn interleaved_ranks_make_one_region_and_holes_stay_unwritten() {
        let n = 300u64;
        let r0 = ext(&(0..n).map(|i| (100 + 8 * i, 4)).collect::<Vec<_>>());
        // Rank 1 leaves its last two ints out: a hole before rank 0's last int.
        let r1 = ext(&(0..n - 2).map(|i| (104 + 8 * i, 4)).collect::<Vec<_>>());
        let d0: Vec<u8> = (0..4 * n).map(|i| i as u8).collect();
        let d1 = vec![0xee; 4 * (n as usize - 2)];
        let lists = [r0.as_slice(), r1.as_slice()];
        let span = dense_span(lists.iter().copied()).expect("dense");
        assert_eq!(span, (100, 100 + 8 * n - 4));
        let regions = claim(lists.iter().copied(), span).expect("disjoint");
        // Rank 0's last int, after the 4-byte hole rank 1's missing int leaves.
        let last = 100 + 8 * (n - 1);
        assert_eq!(regions, [(100, last - 4 - 100), (last, 4)]);
        let mut buf = vec![0u8; (span.1 - span.0) as usize];
        let ranks = [(r0.clone(), d0.clone()), (r1.clone(), d1.clone())];
        place(&mut buf, 100, &ranks).expect("placed");
        assert_eq!(buf[..8], [0, 1, 2, 3, 0xee, 0xee, 0xee, 0xee]);
        // The ranks' streams read back from the span, into buffers holding old bytes.
        let mut got = vec![7u8; 5];
        gather(&r0, 100, &buf, &mut got).unwrap();
        assert_eq!(got, d0);
        gather(&r1, 100, &buf, &mut got).unwrap();
        assert_eq!(got, d1);
    }

    #[test]
    fn overlaps_and_sparse_calls_are_left_to_the_piece_by_piece_path() {
        let r0 = ext(&(0..300).map(|i| (8 * i, 4)).collect::<Vec<_>>());
        let r1 = ext(&(0..300).map(|i| (8 * i + 2, 4)).collect::<Vec<_>>());
        let lists = [r0.as_slice(), r1.as_slice()];
        let span = dense_span(lists.iter().copied()).unwrap();
        assert_eq!(claim(lists.iter().copied(), span), None);
        let far = ext(&(0..300).map(|i| (4096 * i, 4)).collect::<Vec<_>>());
        assert_eq!(dense_span([far.as_slice()].into_iter()), None);
        let few = ext(&[(0, 4), (4, 4)]);
        assert_eq!(dense_span([few.as_slice()].into_iter()), None);
    }
}
