//! File-domain buffers: a collective call whose many small pieces lie close together (the
//! seed's pattern: every rank's 4-byte ints interleaved) is placed into, or read from, one
//! buffer over the file span the pieces cover, instead of sorting a million pieces and
//! copying each into a staging run. Pure: no I/O.
//!
//! A write claims each piece's bytes in a bitmap of the span as it copies them in: a byte
//! claimed twice is an overlap (the caller then reports it the precise way), and the
//! claimed bytes, never the holes between them, are the regions written. A read takes the
//! span in one read and copies each rank's pieces out of it.

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

/// One collective write placed over its file span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    /// The file offset of `buf[0]`.
    pub base: u64,
    /// The span's bytes (holes hold zeros and are never written).
    pub buf: Vec<u8>,
    /// The claimed runs, `(file offset, length)`, ascending and apart: what is written.
    pub regions: Vec<(u64, u64)>,
}

impl Domain {
    /// Places every rank's pieces (`(extents, data stream)` per rank) into a buffer over
    /// `[lo, hi)`; None if a byte is claimed twice (an overlap) or a piece lies outside
    /// the span or its rank's data.
    pub fn place(ranks: &[(&[Extent], &[u8])], (lo, hi): (u64, u64)) -> Option<Domain> {
        let span = usize::try_from(hi - lo).ok()?;
        let mut buf = vec![0u8; span];
        let mut claimed = Bitmap::new(span);
        for (extents, data) in ranks {
            let mut at = 0usize;
            for e in extents.iter().filter(|e| e.len > 0) {
                let len = usize::try_from(e.len).ok()?;
                let from = usize::try_from(e.file.checked_sub(lo)?).ok()?;
                if !claimed.claim(from, len) {
                    return None;
                }
                let src = data.get(at..at.checked_add(len)?)?;
                buf.get_mut(from..from + len)?.copy_from_slice(src);
                at += len;
            }
        }
        let regions = claimed
            .runs()
            .map(|(s, l)| (lo + s as u64, l as u64))
            .collect();
        Some(Domain {
            base: lo,
            buf,
            regions,
        })
    }

    /// The bytes of a region (one of [`Domain::regions`]).
    pub fn bytes(&self, (file, len): (u64, u64)) -> &[u8] {
        let from = (file - self.base) as usize;
        &self.buf[from..from + len as usize]
    }
}

/// Each rank's stream, gathered from `span`, which holds the file's bytes from `lo` (and
/// is cut short where the file ends): the read twin of [`Domain::place`]. The extents
/// must lie within the span (clipped to the file's end beforehand).
pub fn gather(wants: &[Vec<Extent>], lo: u64, span: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::with_capacity(wants.len());
    for extents in wants {
        let n: u64 = extents.iter().map(|e| e.len).sum();
        let mut stream = Vec::with_capacity(usize::try_from(n).ok()?);
        for e in extents {
            let from = usize::try_from(e.file.checked_sub(lo)?).ok()?;
            let len = usize::try_from(e.len).ok()?;
            stream.extend_from_slice(span.get(from..from.checked_add(len)?)?);
        }
        out.push(stream);
    }
    Some(out)
}

/// One bit per byte of a span.
struct Bitmap(Vec<u64>);

impl Bitmap {
    fn new(bits: usize) -> Bitmap {
        Bitmap(vec![0; bits.div_ceil(64)])
    }

    /// Sets bits `[from, from + len)`; false (and nothing set past the first clash) if
    /// one was set already.
    fn claim(&mut self, from: usize, len: usize) -> bool {
        let (mut at, end) = (from, from + len);
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
        assert_eq!(b.runs().collect::<Vec<_>>(), [(3, 5), (60, 70)]);
    }

    #[test]
    fn interleaved_ranks_make_one_region_and_holes_stay_unwritten() {
        let n = 300u64;
        let r0 = ext(&(0..n).map(|i| (100 + 8 * i, 4)).collect::<Vec<_>>());
        // Rank 1 leaves its last int out: a hole before rank 0's last int.
        let r1 = ext(&(0..n - 2).map(|i| (104 + 8 * i, 4)).collect::<Vec<_>>());
        let d0: Vec<u8> = (0..4 * n).map(|i| i as u8).collect();
        let d1 = vec![0xee; 4 * (n as usize - 2)];
        let lists = [r0.as_slice(), r1.as_slice()];
        let span = dense_span(lists.iter().copied()).expect("dense");
        assert_eq!(span, (100, 100 + 8 * n - 4));
        let d = Domain::place(&[(&r0[..], &d0[..]), (&r1[..], &d1[..])], span).expect("placed");
        // Rank 0's last int, after the 4-byte hole rank 1's missing int leaves.
        let last = 100 + 8 * (n - 1);
        assert_eq!(d.regions, [(100, last - 4 - 100), (last, 4)]);
        assert_eq!(d.bytes((100, 8)), [0, 1, 2, 3, 0xee, 0xee, 0xee, 0xee]);
        // The ranks' streams read back from the span.
        let streams = gather(&[r0.clone(), r1.clone()], 100, &d.buf).unwrap();
        assert_eq!(streams, [d0, d1]);
    }

    #[test]
    fn overlaps_and_sparse_calls_are_left_to_the_piece_by_piece_path() {
        let r0 = ext(&(0..300).map(|i| (8 * i, 4)).collect::<Vec<_>>());
        let r1 = ext(&(0..300).map(|i| (8 * i + 2, 4)).collect::<Vec<_>>());
        let d = vec![0u8; 1200];
        let lists = [r0.as_slice(), r1.as_slice()];
        let span = dense_span(lists.iter().copied()).unwrap();
        assert_eq!(
            Domain::place(&[(&r0[..], &d[..]), (&r1[..], &d[..])], span),
            None
        );
        let far = ext(&(0..300).map(|i| (4096 * i, 4)).collect::<Vec<_>>());
        assert_eq!(dense_span([far.as_slice()].into_iter()), None);
        let few = ext(&[(0, 4), (4, 4)]);
        assert_eq!(dense_span([few.as_slice()].into_iter()), None);
    }
}
