//! Property tests: random nested datatypes against a naive reference implementation.
//!
//! The reference materializes the type map byte by byte, straight from the MPI definitions
//! (each constructor places copies of its old type's map at the displacements the standard
//! gives; bounds follow the sticky-marker rule), so it is slow and obviously right. The crate's
//! figures, cursor, pack and unpack must agree with it.

use ferry_dtype::{Cursor, Datatype, DtypeError, Order, Packer, Segment, Unpacker};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// A datatype description both sides build from.

#[derive(Clone, Debug)]
enum Spec {
    Prim(u64),
    Segments(Vec<(i64, u64)>),
    Contig(u64, Box<Spec>),
    Vector(u64, u64, i64, Box<Spec>),
    Hvector(u64, u64, i64, Box<Spec>),
    Indexed(Vec<u64>, Vec<i64>, Box<Spec>),
    Hindexed(Vec<u64>, Vec<i64>, Box<Spec>),
    IndexedBlock(u64, Vec<i64>, Box<Spec>),
    Struct(Vec<(u64, i64, Spec)>),
    Subarray(Vec<(u64, u64, u64)>, bool, Box<Spec>),
    Resized(i64, i64, Box<Spec>),
}

fn build(spec: &Spec) -> Result<Datatype, DtypeError> {
    Ok(match spec {
        Spec::Prim(n) => Datatype::primitive(*n)?,
        Spec::Segments(list) => {
            let segs: Vec<Segment> = list.iter().map(|&s| s.into()).collect();
            Datatype::from_segments(&segs)?
        }
        Spec::Contig(c, t) => Datatype::contiguous(*c, &build(t)?)?,
        Spec::Vector(c, b, s, t) => Datatype::vector(*c, *b, *s, &build(t)?)?,
        Spec::Hvector(c, b, s, t) => Datatype::hvector(*c, *b, *s, &build(t)?)?,
        Spec::Indexed(b, d, t) => Datatype::indexed(b, d, &build(t)?)?,
        Spec::Hindexed(b, d, t) => Datatype::hindexed(b, d, &build(t)?)?,
        Spec::IndexedBlock(b, d, t) => Datatype::indexed_block(*b, d, &build(t)?)?,
        Spec::Struct(fields) => {
            let lens: Vec<u64> = fields.iter().map(|f| f.0).collect();
            let displs: Vec<i64> = fields.iter().map(|f| f.1).collect();
            let types = fields
                .iter()
                .map(|f| build(&f.2))
                .collect::<Result<Vec<_>, _>>()?;
            Datatype::structure(&lens, &displs, &types)?
        }
        Spec::Subarray(dims, c_order, t) => {
            let sizes: Vec<u64> = dims.iter().map(|d| d.0).collect();
            let subsizes: Vec<u64> = dims.iter().map(|d| d.1).collect();
            let starts: Vec<u64> = dims.iter().map(|d| d.2).collect();
            let order = if *c_order { Order::C } else { Order::Fortran };
            Datatype::subarray(&sizes, &subsizes, &starts, order, &build(t)?)?
        }
        Spec::Resized(lb, ext, t) => Datatype::resized(&build(t)?, *lb, *ext)?,
    })
}

// ---------------------------------------------------------------------------------------------
// The reference: type maps as lists of single bytes and bound markers.

#[derive(Clone, Copy, Debug)]
enum E {
    Byte(i64),
    Lb(i64),
    Ub(i64),
}

fn shift(map: &[E], by: i64, out: &mut Vec<E>) {
    out.extend(map.iter().map(|e| match *e {
        E::Byte(o) => E::Byte(o + by),
        E::Lb(o) => E::Lb(o + by),
        E::Ub(o) => E::Ub(o + by),
    }));
}

fn data_only(map: &[E]) -> Vec<E> {
    map.iter()
        .filter(|e| matches!(e, E::Byte(_)))
        .copied()
        .collect()
}

fn bytes(map: &[E]) -> Vec<i64> {
    map.iter()
        .filter_map(|e| match e {
            E::Byte(o) => Some(*o),
            _ => None,
        })
        .collect()
}

/// (lb, ub) by the MPI rule: markers win if present, data otherwise, 0 for an empty map.
fn bounds(map: &[E]) -> (i64, i64) {
    let data = bytes(map);
    let lbm = map.iter().filter_map(|e| match e {
        E::Lb(o) => Some(*o),
        _ => None,
    });
    let ubm = map.iter().filter_map(|e| match e {
        E::Ub(o) => Some(*o),
        _ => None,
    });
    let lb = lbm.min().or(data.iter().copied().min()).unwrap_or(0);
    let ub = ubm.max().or(data.iter().map(|o| o + 1).max()).unwrap_or(0);
    (lb, ub)
}

fn extent(map: &[E]) -> i64 {
    let (lb, ub) = bounds(map);
    ub - lb
}

fn reference(spec: &Spec) -> Vec<E> {
    let mut out = Vec::new();
    match spec {
        Spec::Prim(n) => out.extend((0..*n as i64).map(E::Byte)),
        Spec::Segments(list) => {
            for &(o, l) in list {
                out.extend((o..o + l as i64).map(E::Byte));
            }
        }
        Spec::Contig(c, t) => {
            let m = reference(t);
            let ex = extent(&m);
            for i in 0..*c as i64 {
                shift(&m, i * ex, &mut out);
            }
        }
        Spec::Vector(c, b, s, t) | Spec::Hvector(c, b, s, t) => {
            let m = reference(t);
            let ex = extent(&m);
            let stride = if matches!(spec, Spec::Vector(..)) {
                s * ex
            } else {
                *s
            };
            for i in 0..*c as i64 {
                for j in 0..*b as i64 {
                    shift(&m, i * stride + j * ex, &mut out);
                }
            }
        }
        Spec::Indexed(bl, d, t) | Spec::Hindexed(bl, d, t) => {
            let m = reference(t);
            let ex = extent(&m);
            let scale = if matches!(spec, Spec::Indexed(..)) {
                ex
            } else {
                1
            };
            for (&b, &d) in bl.iter().zip(d) {
                for j in 0..b as i64 {
                    shift(&m, d * scale + j * ex, &mut out);
                }
            }
        }
        Spec::IndexedBlock(b, d, t) => {
            let m = reference(t);
            let ex = extent(&m);
            for &d in d {
                for j in 0..*b as i64 {
                    shift(&m, d * ex + j * ex, &mut out);
                }
            }
        }
        Spec::Struct(fields) => {
            for (b, d, t) in fields {
                let m = reference(t);
                let ex = extent(&m);
                for j in 0..*b as i64 {
                    shift(&m, d + j * ex, &mut out);
                }
            }
        }
        Spec::Subarray(dims, c_order, t) => {
            let m = reference(t);
            let ex = extent(&m);
            let data = data_only(&m);
            let n = dims.len();
            // Element strides (in elements) per dimension.
            let mut strides = vec![0i64; n];
            let mut acc = 1i64;
            let fastest_first: Vec<usize> = if *c_order {
                (0..n).rev().collect()
            } else {
                (0..n).collect()
            };
            for &d in &fastest_first {
                strides[d] = acc;
                acc *= dims[d].0 as i64;
            }
            // Enumerate the window, fastest dimension varying fastest.
            let mut idx = vec![0u64; n];
            'outer: loop {
                let disp: i64 = (0..n)
                    .map(|d| (dims[d].2 + idx[d]) as i64 * strides[d] * ex)
                    .sum();
                shift(&data, disp, &mut out);
                for &d in &fastest_first {
                    idx[d] += 1;
                    if idx[d] < dims[d].1 {
                        continue 'outer;
                    }
                    idx[d] = 0;
                }
                break;
            }
            out.push(E::Lb(0));
            out.push(E::Ub(acc * ex));
        }
        Spec::Resized(lb, ext, t) => {
            out = data_only(&reference(t));
            out.push(E::Lb(*lb));
            out.push(E::Ub(lb + ext));
        }
    }
    out
}

/// `count` instances of a map, by its extent.
fn repeat(map: &[E], count: u64) -> Vec<E> {
    let ex = extent(map);
    let mut out = Vec::new();
    for i in 0..count as i64 {
        shift(map, i * ex, &mut out);
    }
    out
}

/// Merges the byte stream into maximal runs.
fn runs(bytes: &[i64]) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    for &b in bytes {
        match out.last_mut() {
            Some(s) if s.offset + s.len as i64 == b => s.len += 1,
            _ => out.push(Segment::new(b, 1)),
        }
    }
    out
}

/// Expands segments back to their bytes.
fn expand(segs: &[Segment]) -> Vec<i64> {
    segs.iter()
        .flat_map(|s| s.offset..s.offset + s.len as i64)
        .collect()
}

fn noise(i: usize) -> u8 {
    ((i as u64 ^ 0x5bd1).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

// ---------------------------------------------------------------------------------------------
// Strategies.

fn leaf() -> impl Strategy<Value = Spec> {
    prop_oneof![
        3 => (1u64..=4).prop_map(Spec::Prim),
        1 => prop::collection::vec((-8i64..24, n()), 0..5).prop_map(Spec::Segments),
    ]
}

fn subarray_dims() -> impl Strategy<Value = Vec<(u64, u64, u64)>> {
    let dim = (1u64..=3).prop_flat_map(|size| {
        (1..=size).prop_flat_map(move |sub| (0..=size - sub).prop_map(move |st| (size, sub, st)))
    });
    prop::collection::vec(dim, 1..=2)
}

/// A count or block length: mostly 1..=3, sometimes 0 (zeros propagate up the tree).
fn n() -> impl Strategy<Value = u64> + Clone {
    prop_oneof![1 => Just(0u64), 12 => 1u64..4]
}

fn spec() -> impl Strategy<Value = Spec> {
    leaf().prop_recursive(4, 48, 3, |inner| {
        let boxed = inner.clone();
        let b = move || boxed.clone().prop_map(Box::new);
        prop_oneof![
            (n(), b()).prop_map(|(c, t)| Spec::Contig(c, t)),
            (n(), n(), -3i64..4, b()).prop_map(|(c, l, s, t)| Spec::Vector(c, l, s, t)),
            (n(), n(), -16i64..16, b()).prop_map(|(c, l, s, t)| Spec::Hvector(c, l, s, t)),
            (prop::collection::vec((n(), -4i64..6), 1..4), b()).prop_map(|(v, t)| {
                let (bl, d) = v.into_iter().unzip();
                Spec::Indexed(bl, d, t)
            }),
            (prop::collection::vec((n(), -16i64..24), 1..4), b()).prop_map(|(v, t)| {
                let (bl, d) = v.into_iter().unzip();
                Spec::Hindexed(bl, d, t)
            }),
            (n(), prop::collection::vec(-4i64..6, 1..4), b())
                .prop_map(|(l, d, t)| Spec::IndexedBlock(l, d, t)),
            prop::collection::vec((n(), -16i64..24, inner.clone()), 1..3).prop_map(Spec::Struct),
            (subarray_dims(), any::<bool>(), b()).prop_map(|(d, c, t)| Spec::Subarray(d, c, t)),
            (-8i64..8, -4i64..24, b()).prop_map(|(lb, ex, t)| Spec::Resized(lb, ex, t)),
        ]
    })
}

/// A spec, its instance count, and the reference map of that many instances (bounded size).
fn case() -> impl Strategy<Value = (Spec, u64, Vec<E>, Vec<E>)> {
    (spec(), n())
        .prop_map(|(s, count)| {
            let one = reference(&s);
            let all = repeat(&one, count);
            (s, count, one, all)
        })
        .prop_filter("reference too large", |c| c.3.len() <= 20_000)
}

/// 160 cases by default (the suite stays fast in debug); `PROPTEST_CASES=5000` for a deep run.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(160);
    ProptestConfig {
        cases,
        max_global_rejects: 10_000,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Properties.

proptest! {
    #![proptest_config(config())]

    /// The wire description round-trips: the decoded type has the same type map (the
    /// flattening of several instances), figures and depth, and describes itself with the
    /// same bytes.
    #[test]
    fn description_round_trips((s, count, _one, _all) in case()) {
        let t = build(&s).expect("small specs build");
        let bytes = t.encode();
        let back = Datatype::decode(&bytes).expect("a description decodes");
        prop_assert_eq!(back.flatten(count + 1).unwrap(), t.flatten(count + 1).unwrap());
        prop_assert_eq!(
            (back.size(), back.lb(), back.ub(), back.true_lb(), back.true_ub()),
            (t.size(), t.lb(), t.ub(), t.true_lb(), t.true_ub())
        );
        prop_assert_eq!(back.depth(), t.depth());
        prop_assert_eq!(back.encode(), bytes);
    }

    /// Figures, flattening, merging, segment-count hint, receive check.
    #[test]
    fn layout_matches_reference((s, count, one, all) in case()) {
        let t = build(&s).expect("small specs build");
        let (lb, ub) = bounds(&one);
        let data = bytes(&one);
        prop_assert_eq!(t.size(), data.len() as u64);
        prop_assert_eq!((t.lb(), t.ub(), t.extent()), (lb, ub, ub - lb));
        let true_lb = data.iter().copied().min().unwrap_or(0);
        let true_ub = data.iter().map(|o| o + 1).max().unwrap_or(0);
        prop_assert_eq!((t.true_lb(), t.true_ub()), (true_lb, true_ub));

        let stream = bytes(&all);
        let expect = runs(&stream);
        let got = t.flatten(count).unwrap();
        prop_assert_eq!(&got, &expect);
        // Maximal, nonempty, covering size * count bytes.
        prop_assert!(got.iter().all(|s| s.len > 0));
        prop_assert!(got.windows(2).all(|w| w[0].offset + w[0].len as i64 != w[1].offset));
        prop_assert_eq!(got.iter().map(|s| s.len).sum::<u64>(), t.size() * count);
        prop_assert!(t.segment_count_hint(count) >= got.len() as u64);
        prop_assert_eq!(t.is_contiguous(), runs(&data).len() <= 1);

        let range = t.true_range(count).unwrap();
        let expect_range = (!stream.is_empty()).then(|| {
            *stream.iter().min().unwrap()..stream.iter().max().unwrap() + 1
        });
        prop_assert_eq!(range, expect_range);

        let mut sorted = stream.clone();
        sorted.sort_unstable();
        let unique = sorted.windows(2).all(|w| w[0] != w[1]);
        prop_assert_eq!(t.check_receive(count).is_ok(), unique);
    }

    /// Seeking then walking yields the suffix of the full walk; bounded batches reassemble it.
    #[test]
    fn seek_and_batches((s, count, _one, all) in case(), at in 0.0f64..=1.0,
                        budgets in prop::collection::vec((1usize..5, 1u64..40), 1..40)) {
        let t = build(&s).unwrap();
        let stream = bytes(&all);
        let pos = ((stream.len() as f64) * at) as usize;
        let mut c = Cursor::at(&t, count, pos as u64).unwrap();
        prop_assert_eq!(c.remaining(), (stream.len() - pos) as u64);
        let suffix: Vec<Segment> = c.by_ref().collect();
        prop_assert_eq!(&suffix, &runs(&stream[pos..]));
        prop_assert!(c.is_done());

        // Batches with random budgets, from the start, cover the stream in order.
        let mut c = Cursor::new(&t, count).unwrap();
        let mut got = Vec::new();
        for (k, b) in budgets.iter().cycle().take(10_000) {
            if c.is_done() {
                break;
            }
            let before = got.len();
            let n = c.next_batch(*k, *b, &mut got);
            prop_assert!(got.len() - before <= *k);
            prop_assert!(n <= *b && n > 0);
            prop_assert_eq!(n, got[before..].iter().map(|s| s.len).sum::<u64>());
        }
        prop_assert!(c.is_done());
        prop_assert_eq!(expand(&got), stream);
    }

    /// Pack and unpack, at once and resumed in random chunks, match the reference.
    #[test]
    fn pack_unpack((s, count, _one, all) in case(), slack in 0usize..3,
                   chunks in prop::collection::vec(1usize..48, 1..16)) {
        let t = build(&s).unwrap();
        let stream = bytes(&all);
        let lo = stream.iter().copied().min().unwrap_or(0);
        let hi = stream.iter().map(|o| o + 1).max().unwrap_or(0);
        let origin = (-lo).max(0) as usize + slack;
        let len = (origin as i64 + hi).max(0) as usize + slack;
        let src: Vec<u8> = (0..len).map(noise).collect();
        let at = |o: i64| (origin as i64 + o) as usize;

        let expect: Vec<u8> = stream.iter().map(|&o| src[at(o)]).collect();
        prop_assert_eq!(&ferry_dtype::pack(&t, count, &src, origin).unwrap(), &expect);

        // Resumed packing in random chunk sizes, reusing one packer.
        let mut packer = Packer::new(&t, count).unwrap();
        prop_assert_eq!(packer.packed_size(), expect.len() as u64);
        let mut got = Vec::new();
        for &n in chunks.iter().cycle() {
            let mut buf = vec![0u8; n];
            let w = packer.pack(&src, origin, got.len() as u64, &mut buf).unwrap();
            got.extend_from_slice(&buf[..w]);
            if w < n {
                break;
            }
        }
        prop_assert_eq!(&got, &expect);

        // Unpack: writes in stream order (the last write wins where entries overlap).
        let input: Vec<u8> = (0..stream.len()).map(|i| noise(i + 977)).collect();
        let mut want = vec![0xEEu8; len];
        for (i, &o) in stream.iter().enumerate() {
            want[at(o)] = input[i];
        }
        let mut dst = vec![0xEEu8; len];
        ferry_dtype::unpack(&t, count, &input, &mut dst, origin).unwrap();
        prop_assert_eq!(&dst, &want);

        let mut dst = vec![0xEEu8; len];
        let mut unpacker = Unpacker::new(&t, count).unwrap();
        let mut pos = 0;
        for &n in chunks.iter().cycle() {
            let end = (pos + n).min(input.len());
            let r = unpacker.unpack(&mut dst, origin, pos as u64, &input[pos..end]).unwrap();
            prop_assert_eq!(r, end - pos);
            pos = end;
            if pos == input.len() {
                break;
            }
        }
        prop_assert_eq!(&dst, &want);

        // A buffer one byte short at either end is refused before anything is written.
        if !stream.is_empty() {
            let mut out = vec![0x55u8; expect.len()];
            let short = &src[..at(hi) - 1];
            let err = packer.pack(short, origin, 0, &mut out).unwrap_err();
            prop_assert!(matches!(err, DtypeError::OutOfBuffer { .. }), "{err}");
            prop_assert!(out.iter().all(|&b| b == 0x55));
            if at(lo) == 0 && origin > 0 {
                let err = packer.pack(&src[..], origin - 1, 0, &mut out).unwrap_err();
                prop_assert!(matches!(err, DtypeError::OutOfBuffer { .. }), "{err}");
            }
            let mut d = dst.clone();
            let err = unpacker.unpack(&mut d[..at(hi) - 1], origin, 0, &input).unwrap_err();
            prop_assert!(matches!(err, DtypeError::OutOfBuffer { .. }), "{err}");
            prop_assert_eq!(&d, &dst);
        }
    }
}

/// The properties above are only as good as the types generated: most must hold data, and
/// some must be deep and scattered.
#[test]
fn generator_is_not_degenerate() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strat = case();
    let (mut empty, mut deep, mut scattered) = (0, 0, 0);
    for _ in 0..300 {
        let (s, count, _one, all) = strat.new_tree(&mut runner).unwrap().current();
        let t = build(&s).unwrap();
        empty += usize::from(bytes(&all).is_empty());
        deep += usize::from(t.depth() >= 4);
        scattered += usize::from(t.flatten(count).unwrap().len() >= 10);
    }
    assert!(empty < 100, "{empty} of 300 generated layouts are empty");
    assert!(
        deep > 30,
        "only {deep} of 300 generated types have depth >= 4"
    );
    assert!(
        scattered > 30,
        "only {scattered} of 300 layouts have 10 segments or more"
    );
}
