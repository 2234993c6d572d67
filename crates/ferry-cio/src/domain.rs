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

use crate::view::{Extents, Strided};

/// Calls of fewer pieces than this are placed piece by piece (a few large pieces are
/// written straight from each rank's data, with no copy at all).
pub const MIN_PIECES: usize = 256;

/// A span at most this many times the bytes the pieces hold is dense enough for a
/// domain buffer (its holes cost a bitmap bit and a buffer byte each).
const MAX_SPREAD: u64 = 2;

/// The largest domain buffer, bytes.
const MAX_SPAN: u64 = 1 << 31;

/// The most strided ranks whose tiling is checked by arithmetic; more go through the
/// bitmap.
const MAX_STRIDED_RANKS: usize = 64;

/// The file span `[lo, hi)` that `lists`' pieces cover, if they are many, close together
/// and the span is small enough for one buffer.
pub fn dense_span<'a>(lists: impl Iterator<Item = &'a Extents>) -> Option<(u64, u64)> {
    let (mut lo, mut hi, mut bytes, mut pieces) = (u64::MAX, 0u64, 0u64, 0u64);
    let mut cover = |first: u64, end: u64, held: u64, n: u64| {
        lo = lo.min(first);
        hi = hi.max(end);
        bytes = bytes.saturating_add(held);
        pieces = pieces.saturating_add(n);
    };
    for l in lists {
        match l {
            Extents::Strided(s) => cover(s.first, s.end(), s.count * s.len, s.count),
            Extents::List(v) => {
                for e in v.iter().filter(|e| e.len > 0) {
                    cover(e.file, e.file.checked_add(e.len)?, e.len, 1);
                }
            }
        }
    }
    let span = hi.checked_sub(lo)?;
    let dense =
        pieces >= MIN_PIECES as u64 && span <= MAX_SPAN && span <= bytes.saturating_mul(MAX_SPREAD);
    dense.then_some((lo, hi))
}

/// The regions a write of `lists`' pieces over span `[lo, hi)` writes: the runs of bytes
/// some piece claims, `(file offset, length)`, ascending and apart. None if a byte is
/// claimed twice (an overlap) or a piece lies outside the span.
pub fn claim<'a>(
    lists: impl Iterator<Item = &'a Extents> + Clone,
    (lo, hi): (u64, u64),
) -> Option<Vec<(u64, u64)>> {
    if tiled(lists.clone(), (lo, hi)) {
        return Some(vec![(lo, hi - lo)]);
    }
    let mut claimed = Bitmap::new(usize::try_from(hi.checked_sub(lo)?).ok()?);
    for l in lists {
        for e in l.iter() {
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

/// Whether the ranks are all [`Strided`] at one period, as many runs each, and their
/// runs tile the span `[lo, hi)` (the seed's interleaved ints): one period's runs, sorted,
/// follow each other from `lo` and fill the period. Then no byte is claimed twice and the
/// span is one region, found by arithmetic; otherwise the bitmap decides.
fn tiled<'a>(lists: impl Iterator<Item = &'a Extents>, (lo, hi): (u64, u64)) -> bool {
    let mut ranks: Vec<Strided> = Vec::new();
    for l in lists {
        match l {
            Extents::Strided(s) if ranks.len() < MAX_STRIDED_RANKS => ranks.push(*s),
            Extents::List(v) if v.is_empty() => {}
            _ => return false,
        }
    }
    let Some(&Strided { period, count, .. }) = ranks.first() else {
        return false;
    };
    let alike = |s: &Strided| s.period == period && s.count == count && s.first >= lo;
    if !ranks.iter().all(alike) {
        return false;
    }
    ranks.sort_unstable_by_key(|s| s.first);
    let mut end = lo;
    for s in &ranks {
        if s.first != end {
            return false;
        }
        end += s.len;
    }
    end - lo == period && lo.checked_add(count.saturating_mul(period)) == Some(hi)
}

/// Copies every rank's pieces (`(extents, data stream)` per rank) into `buf`, which holds
/// the file's bytes from offset `lo`; None if a piece lies outside `buf` or its rank's
/// data.
pub fn place(buf: &mut [u8], lo: u64, ranks: &[(Extents, Vec<u8>)]) -> Option<()> {
    for (extents, data) in ranks {
        match extents {
            Extents::Strided(s) if s.len <= s.period => {
                let (from, to) = span_of(s, lo)?;
                let src = data.get(..usize::try_from(s.count * s.len).ok()?)?;
                scatter_runs(buf.get_mut(from..to)?, src, s);
            }
            _ => {
                let mut at = 0usize;
                for e in extents.iter() {
                    let len = usize::try_from(e.len).ok()?;
                    let from = usize::try_from(e.file.checked_sub(lo)?).ok()?;
                    let src = data.get(at..at.checked_add(len)?)?;
                    copy(buf.get_mut(from..from.checked_add(len)?)?, src);
                    at += len;
                }
            }
        }
    }
    Some(())
}

/// Fills `out` with the stream of `extents` taken from `span`, which holds the file's
/// bytes from offset `lo` (the read twin of [`place`]); None if an extent lies outside
/// the span. Every byte of `out` is written: its old bytes need not be cleared.
pub fn gather(extents: &Extents, lo: u64, span: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let n = usize::try_from(extents.bytes()).ok()?;
    out.truncate(n);
    out.resize(n, 0);
    match extents {
        Extents::Strided(s) if s.len <= s.period => {
            let (from, to) = span_of(s, lo)?;
            gather_runs(span.get(from..to)?, out, s);
        }
        _ => {
            let mut at = 0usize;
            for e in extents.iter() {
                let len = usize::try_from(e.len).ok()?;
                let from = usize::try_from(e.file.checked_sub(lo)?).ok()?;
                copy(
                    &mut out[at..at + len],
                    span.get(from..from.checked_add(len)?)?,
                );
                at += len;
            }
        }
    }
    Some(())
}

/// Where strided `s` lies in a buffer of the file's bytes from `lo`: its first run's start
/// and its last run's end.
fn span_of(s: &Strided, lo: u64) -> Option<(usize, usize)> {
    let from = usize::try_from(s.first.checked_sub(lo)?).ok()?;
    let to = usize::try_from(s.end().checked_sub(lo)?).ok()?;
    Some((from, to))
}

/// Copies the runs of `s` (apart: no longer than its period) from `stream` (back to back)
/// into `file` (the file's bytes from `s`'s first run to the end of its last): a loop with
/// no arithmetic but slicing.
fn scatter_runs(file: &mut [u8], stream: &[u8], s: &Strided) {
    let Some((len, period)) = run_shape(s) else {
        return;
    };
    for (f, st) in file.chunks_mut(period).zip(stream.chunks_exact(len)) {
        if let Some(f) = f.get_mut(..len) {
            copy(f, st);
        }
    }
}

/// The read twin of [`scatter_runs`]: the runs of `s` from `file` into `stream`.
fn gather_runs(file: &[u8], stream: &mut [u8], s: &Strided) {
    let Some((len, period)) = run_shape(s) else {
        return;
    };
    for (f, st) in file.chunks(period).zip(stream.chunks_exact_mut(len)) {
        if let Some(f) = f.get(..len) {
            copy(st, f);
        }
    }
}

/// A strided's run length and period as buffer sizes, both at least 1.
fn run_shape(s: &Strided) -> Option<(usize, usize)> {
    let len = usize::try_from(s.len).ok().filter(|&l| l > 0)?;
    let period = usize::try_from(s.period).ok().filter(|&p| p > 0)?;
    Some((len, period))
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
    use crate::view::Extent;

    fn ext(v: &[(u64, u64)]) -> Extents {
        Extents::List(v.iter().map(|&(file, len)| Extent { file, len }).collect())
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
        let lists = [r0.clone(), r1.clone()];
        let span = dense_span(lists.iter()).expect("dense");
        assert_eq!(span, (100, 100 + 8 * n - 4));
        let regions = claim(lists.iter(), span).expect("disjoint");
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
        let lists = [r0.clone(), r1.clone()];
        let span = dense_span(lists.iter()).unwrap();
        assert_eq!(claim(lists.iter(), span), None);
        let far = ext(&(0..300).map(|i| (4096 * i, 4)).collect::<Vec<_>>());
        assert_eq!(dense_span([far].iter()), None);
        let few = ext(&[(0, 4), (4, 4)]);
        assert_eq!(dense_span([few].iter()), None);
    }

    use proptest::prelude::*;
    use proptest::test_runner::RngSeed;

    /// Ranks at one period, each a run per period: laid side by side from offset 10 (the
    /// seed's interleaving) at the period their runs fill, or a shorter one (overlaps) or
    /// a longer one (holes); then one of them moved by `delta` (an overlap or a hole), one
    /// given `fewer` runs, or, unless `same`, a period of its own.
    fn strided_ranks() -> impl Strategy<Value = Vec<Strided>> {
        (
            prop::collection::vec(1u64..6, 1..5),
            (1u64..30, -2i64..3),
            (0usize..8, -3i64..4),
            (0usize..8, 0u64..3),
            (any::<bool>(), 0u64..3),
        )
            .prop_map(
                |(lens, (count, stretch), (moved, delta), (short, fewer), (same, wider))| {
                    let period = lens
                        .iter()
                        .sum::<u64>()
                        .saturating_add_signed(stretch)
                        .max(1);
                    let mut at = 10;
                    let mut ranks: Vec<Strided> = lens
                        .iter()
                        .map(|&len| {
                            let s = Strided {
                                first: at,
                                len,
                                period,
                                count,
                            };
                            at += len;
                            s
                        })
                        .collect();
                    if let Some(r) = ranks.get_mut(moved) {
                        r.first = r.first.saturating_add_signed(delta);
                    }
                    if let Some(r) = ranks.get_mut(short) {
                        r.count = r.count.saturating_sub(fewer).max(1);
                    }
                    if !same {
                        ranks[0].period += wider;
                    }
                    ranks
                },
            )
    }

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 1024,
            rng_seed: RngSeed::Fixed(17),
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    proptest! {
        #![proptest_config(config())]

        /// Strided ranks claim, place and gather as their runs listed do: the same regions
        /// (or the same overlap), the same file bytes, the same read streams.
        #[test]
        fn strided_ranks_match_their_lists(ranks in strided_ranks()) {
            let fast: Vec<Extents> = ranks.iter().map(|s| Extents::Strided(*s)).collect();
            let slow: Vec<Extents> =
                fast.iter().map(|e| Extents::List(e.iter().collect())).collect();
            prop_assert_eq!(dense_span(fast.iter()), dense_span(slow.iter()));
            let lo = ranks.iter().map(|s| s.first).min().unwrap();
            let hi = ranks.iter().map(Strided::end).max().unwrap();
            let regions = claim(fast.iter(), (lo, hi));
            prop_assert_eq!(&regions, &claim(slow.iter(), (lo, hi)));
            let data: Vec<Vec<u8>> = fast
                .iter()
                .enumerate()
                .map(|(r, e)| (0..e.bytes()).map(|i| (r as u64 * 61 + i) as u8).collect())
                .collect();
            let placed = |lists: &[Extents]| {
                let ranks: Vec<(Extents, Vec<u8>)> =
                    lists.iter().cloned().zip(data.iter().cloned()).collect();
                let mut buf = vec![0u8; (hi - lo) as usize];
                place(&mut buf, lo, &ranks).map(|()| buf)
            };
            let buf = placed(&fast);
            prop_assert_eq!(&buf, &placed(&slow));
            let buf = buf.unwrap();
            for (f, s) in fast.iter().zip(&slow) {
                let (mut a, mut b) = (vec![9u8; 3], Vec::new());
                prop_assert_eq!(gather(f, lo, &buf, &mut a), gather(s, lo, &buf, &mut b));
                prop_assert_eq!(a, b);
            }
        }
    }
}
