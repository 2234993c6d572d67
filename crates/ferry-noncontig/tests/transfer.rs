//! Property tests of the engine over every driver: random segment lists and random vector
//! datatypes on both sides, written and read, zero-copy and packed; after each transfer the
//! target holds exactly what a pack/unpack reference says. `PROPTEST_CASES` scales the run
//! (the default keeps the whole file to a few seconds per driver).

mod common;

use common::*;
use ferry_dtype::{Datatype, Order, Segment};
use ferry_noncontig::{read, write, Options, Path, Stats};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// A side's layout: a datatype, a count, and the bytes its buffer needs.
#[derive(Clone, Debug)]
struct Side {
    dtype: Datatype,
    count: u64,
    origin: usize,
    buf_len: usize,
}

impl Side {
    fn new(dtype: Datatype, count: u64) -> Side {
        let range = dtype.true_range(count).expect("range").unwrap_or(0..0);
        let origin = (-range.start).max(0) as usize + 3;
        let buf_len = (origin as i64 + range.end.max(0)) as usize + 5;
        Side {
            dtype,
            count,
            origin,
            buf_len,
        }
    }

    fn size(&self) -> u64 {
        self.dtype.size() * self.count
    }
}

/// `total` bytes cut at `cuts` (taken modulo `total`), laid out with `gaps` between the
/// pieces, in an order rotated by `rot`: a non-overlapping segment list.
fn partition(total: u64, cuts: &[u64], gaps: &[u64], rot: usize) -> Vec<Segment> {
    let mut points: Vec<u64> = cuts.iter().map(|c| c % total.max(1)).collect();
    points.push(0);
    points.push(total);
    points.sort_unstable();
    points.dedup();
    let mut segs = Vec::new();
    let mut at = 0i64;
    for (i, w) in points.windows(2).enumerate() {
        let len = w[1] - w[0];
        at += gaps.get(i).copied().unwrap_or(0) as i64;
        segs.push(Segment::new(at, len));
        at += len as i64;
    }
    if !segs.is_empty() {
        let r = rot % segs.len();
        segs.rotate_left(r);
    }
    segs
}

/// A random layout — a vector, a 2-D subarray, a nested indexed type or a segment list —
/// plus the other side as a random partition of the same bytes (swapped at random).
fn sides() -> impl Strategy<Value = (Side, Side)> {
    let vector = (1u64..8, 1u64..40, 1u64..6, 0i64..5, 1u64..3).prop_map(
        |(elem, count, block, extra, n)| {
            let e = Datatype::primitive(elem).expect("primitive");
            let t = Datatype::vector(count, block, block as i64 + extra, &e).expect("vector");
            Side::new(t, n)
        },
    );
    let list = (
        proptest::collection::vec(0u64..300, 0..12),
        proptest::collection::vec(0u64..64, 0..12),
        0usize..12,
        1u64..2000,
    )
        .prop_map(|(cuts, gaps, rot, total)| {
            let t = Datatype::from_segments(&partition(total, &cuts, &gaps, rot)).expect("list");
            Side::new(t, 1)
        });
    let subarray = (
        2u64..8,
        2u64..8,
        0u64..8,
        0u64..8,
        0u64..8,
        0u64..8,
        1u64..5,
        1u64..3,
    )
        .prop_map(|(a, b, sa, sb, oa, ob, elem, n)| {
            let (sa, sb) = (1 + sa % a, 1 + sb % b);
            let (oa, ob) = (oa % (a - sa + 1), ob % (b - sb + 1));
            let e = Datatype::primitive(elem).expect("primitive");
            let t =
                Datatype::subarray(&[a, b], &[sa, sb], &[oa, ob], Order::C, &e).expect("subarray");
            Side::new(t, n)
        });
    let indexed = proptest::collection::vec((0u64..5, 0i64..4), 1..10).prop_map(|blocks| {
        // Ascending, non-overlapping blocks of 3-byte elements (a valid receive layout),
        // nested in a contiguous type of 2.
        let e = Datatype::primitive(3).expect("primitive");
        let mut at = 0i64;
        let (mut lens, mut displs) = (Vec::new(), Vec::new());
        for (len, gap) in blocks {
            at += gap;
            lens.push(len);
            displs.push(at);
            at += len as i64;
        }
        let t = Datatype::indexed(&lens, &displs, &e).expect("indexed");
        Side::new(Datatype::contiguous(2, &t).expect("contiguous"), 1)
    });
    (
        prop_oneof![vector, list, subarray, indexed],
        proptest::collection::vec(0u64..4096, 0..24),
        proptest::collection::vec(0u64..32, 0..24),
        0usize..24,
        any::<bool>(),
    )
        .prop_map(|(a, cuts, gaps, rot, swap)| {
            let t = Datatype::from_segments(&partition(a.size(), &cuts, &gaps, rot)).expect("b");
            let b = Side::new(t, 1);
            if swap {
                (b, a)
            } else {
                (a, b)
            }
        })
}

fn opts(path: Path, gather: Option<usize>, riov: Option<usize>) -> Options {
    Options {
        path,
        max_gather: gather,
        max_remote_segments: riov,
        staging_bytes: 97, // small, so the packed path runs in several chunks
        window: 4,
        ..Options::default()
    }
}

/// Writes `l` into `r` on `p` along `path` (`gather` local and `riov` remote segments per
/// operation at most); returns the target's bytes and the stats.
fn do_write(
    p: &Pair,
    l: &Side,
    r: &Side,
    path: Path,
    gather: Option<usize>,
    riov: Option<usize>,
) -> (Vec<u8>, Stats) {
    let src = pattern(l.buf_len, 1);
    let dst = pattern(r.buf_len, 2);
    let lr = p.local(&src);
    let rr = p.target(&dst);
    let stats = write(
        p.client.as_ref(),
        &local_layout(&lr, l.origin, &l.dtype, l.count),
        &remote_layout(&rr, r.origin as u64, &r.dtype, r.count),
        &opts(path, gather, riov),
    )
    .expect("write");
    let want = reference(
        (&src, l.origin, &l.dtype, l.count),
        (&dst, r.origin, &r.dtype, r.count),
    );
    let got = rr.buffer().to_vec();
    assert!(got == want, "write {path:?}: target differs from reference");
    (got, stats)
}

/// Reads `r` into `l` on `p` along `path`; returns the local bytes.
fn do_read(p: &Pair, l: &Side, r: &Side, path: Path) -> Vec<u8> {
    let dst = pattern(l.buf_len, 3);
    let src = pattern(r.buf_len, 4);
    let lr = p.local(&dst);
    let rr = p.target(&src);
    read(
        p.client.as_ref(),
        &local_layout(&lr, l.origin, &l.dtype, l.count),
        &remote_layout(&rr, r.origin as u64, &r.dtype, r.count),
        &opts(path, None, None),
    )
    .expect("read");
    let want = reference(
        (&src, r.origin, &r.dtype, r.count),
        (&dst, l.origin, &l.dtype, l.count),
    );
    let got = lr.buffer().to_vec();
    assert!(got == want, "read {path:?}: local differs from reference");
    got
}

fn random_layouts(driver: &str) {
    let p = pair(driver);
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(
            &(sides(), 1usize..5, 1usize..6),
            |((l, r), gather, riov)| {
                let (zc, zs) = do_write(&p, &l, &r, Path::ZeroCopy, Some(gather), Some(riov));
                let (pk, ps) = do_write(&p, &l, &r, Path::Packed, None, None);
                prop_assert_eq!(zc, pk);
                prop_assert_eq!(zs.bytes, l.size());
                prop_assert_eq!(ps.packed_bytes, l.size());
                prop_assert_eq!(zs.packed_bytes, 0);
                let a = do_read(&p, &l, &r, Path::ZeroCopy);
                let b = do_read(&p, &l, &r, Path::Packed);
                prop_assert_eq!(a, b);
                Ok(())
            },
        )
        .expect("property holds");
}

#[test]
fn random_layouts_tcp() {
    random_layouts("tcp");
}

#[test]
fn random_layouts_ofi_tcp() {
    random_layouts("ofi+tcp");
}

#[test]
fn random_layouts_ofi_shm() {
    random_layouts("ofi+shm");
}
