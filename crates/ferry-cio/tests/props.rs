//! Property tests through a real server on loopback: random nested file types and memory
//! types (vector, indexed, subarray, struct, resized; gaps, negative lower bounds) on a
//! random number of ranks, each writing collectively at a random offset of its own view and
//! reading it back. The file must equal the reference placement (MPI-IO's view semantics,
//! byte by byte from a flattened tile) and each rank must read back exactly the buffer
//! unpacking its own stream gives. `PROPTEST_CASES=N` for a deeper run.

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::{job, reference_offsets, reference_place, start, Running, TOKEN};
use ferry_cio::view::View;
use ferry_cio::{amode, Comm};
use ferry_dtype::{Datatype, Order, Segment};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Spec {
    Prim(u64),
    Segments(Vec<(i64, u64)>),
    Contig(u64, Box<Spec>),
    Vector(u64, u64, i64, Box<Spec>),
    Hvector(u64, u64, i64, Box<Spec>),
    Indexed(Vec<u64>, Vec<i64>, Box<Spec>),
    Struct(Vec<(u64, i64, Spec)>),
    Subarray(Vec<(u64, u64, u64)>, bool, Box<Spec>),
    Resized(i64, i64, Box<Spec>),
}

fn build(spec: &Spec) -> Option<Datatype> {
    Some(match spec {
        Spec::Prim(n) => Datatype::primitive(*n).ok()?,
        Spec::Segments(list) => {
            let segs: Vec<Segment> = list.iter().map(|&s| s.into()).collect();
            Datatype::from_segments(&segs).ok()?
        }
        Spec::Contig(c, t) => Datatype::contiguous(*c, &build(t)?).ok()?,
        Spec::Vector(c, b, s, t) => Datatype::vector(*c, *b, *s, &build(t)?).ok()?,
        Spec::Hvector(c, b, s, t) => Datatype::hvector(*c, *b, *s, &build(t)?).ok()?,
        Spec::Indexed(b, d, t) => Datatype::indexed(b, d, &build(t)?).ok()?,
        Spec::Struct(fields) => {
            let lens: Vec<u64> = fields.iter().map(|f| f.0).collect();
            let displs: Vec<i64> = fields.iter().map(|f| f.1).collect();
            let types = fields
                .iter()
                .map(|f| build(&f.2))
                .collect::<Option<Vec<_>>>()?;
            Datatype::structure(&lens, &displs, &types).ok()?
        }
        Spec::Subarray(dims, c, t) => {
            let sizes: Vec<u64> = dims.iter().map(|d| d.0).collect();
            let subs: Vec<u64> = dims.iter().map(|d| d.1).collect();
            let starts: Vec<u64> = dims.iter().map(|d| d.2).collect();
            let order = if *c { Order::C } else { Order::Fortran };
            Datatype::subarray(&sizes, &subs, &starts, order, &build(t)?).ok()?
        }
        Spec::Resized(lb, ex, t) => Datatype::resized(&build(t)?, *lb, *ex).ok()?,
    })
}

fn spec() -> impl Strategy<Value = Spec> {
    let leaf = prop_oneof![
        3 => (1u64..=4).prop_map(Spec::Prim),
        1 => prop::collection::vec((-8i64..24, 1u64..4), 1..4).prop_map(Spec::Segments),
    ];
    leaf.prop_recursive(3, 24, 3, |inner| {
        let b = move || inner.clone().prop_map(Box::new);
        prop_oneof![
            (1u64..4, b()).prop_map(|(c, t)| Spec::Contig(c, t)),
            (1u64..4, 1u64..3, -3i64..4, b()).prop_map(|(c, l, s, t)| Spec::Vector(c, l, s, t)),
            (1u64..4, 1u64..3, -16i64..32, b()).prop_map(|(c, l, s, t)| Spec::Hvector(c, l, s, t)),
            (prop::collection::vec((0u64..3, -4i64..8), 1..4), b()).prop_map(|(v, t)| {
                let (bl, d) = v.into_iter().unzip();
                Spec::Indexed(bl, d, t)
            }),
            prop::collection::vec((1u64..3, -16i64..32, b().prop_map(|t| *t)), 1..3)
                .prop_map(Spec::Struct),
            (
                prop::collection::vec(
                    (1u64..4).prop_flat_map(|size| (1..=size).prop_flat_map(move |sub| (0..=size
                        - sub)
                        .prop_map(move |st| (size, sub, st)))),
                    1..=2
                ),
                any::<bool>(),
                b()
            )
                .prop_map(|(d, c, t)| Spec::Subarray(d, c, t)),
            (-8i64..8, 1i64..32, b()).prop_map(|(lb, ex, t)| Spec::Resized(lb, ex, t)),
        ]
    })
}

/// One rank's part: its file type, memory type, instance count and offset.
#[derive(Clone, Debug)]
struct Part {
    file: Spec,
    mem: Spec,
    count: u64,
    offset: u64,
}

fn part() -> impl Strategy<Value = Part> {
    (spec(), spec(), 0u64..4, 0u64..4).prop_map(|(file, mem, count, offset)| Part {
        file,
        mem,
        count,
        offset,
    })
}

/// A part made concrete: its types, its buffer (origin), its stream, and where the
/// reference puts the stream (displacement 0 for now).
struct Ready {
    ft: Datatype,
    mem: Datatype,
    count: u64,
    offset: u64,
    origin: usize,
    buf: Vec<u8>,
    stream: Vec<u8>,
    offsets: Vec<u64>,
    disp: u64,
}

fn ready(p: &Part, rank: usize) -> Option<Ready> {
    let ft = build(&p.file)?;
    let mem = build(&p.mem)?;
    View::new(1 << 20, Datatype::byte(), ft.clone()).ok()?;
    let (origin, buf) = match mem.true_range(p.count).ok()? {
        Some(r) => {
            let origin = usize::try_from(-r.start.min(0)).ok()?;
            let len = usize::try_from(origin as i64 + r.end).ok()?;
            if len > 1 << 16 {
                return None;
            }
            (
                origin,
                (0..len).map(|i| (i * 7 + rank * 31 + 1) as u8).collect(),
            )
        }
        None => (0, Vec::new()),
    };
    let stream = ferry_dtype::pack(&mem, p.count, &buf, origin).ok()?;
    if stream.len() > 1 << 14 {
        return None;
    }
    // Where the window goes with displacement 1 MiB (a view's tiles may reach below
    // their origin); shifted to the rank's own region below.
    let offsets = reference_offsets(1 << 20, &ft, p.offset, stream.len() as u64);
    let mut sorted = offsets.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != offsets.len() {
        return None; // a file type writing a byte twice: erroneous in MPI-IO
    }
    Some(Ready {
        ft,
        mem,
        count: p.count,
        offset: p.offset,
        origin,
        buf,
        stream,
        offsets,
        disp: 1 << 20,
    })
}

fn server() -> &'static Running {
    static S: OnceLock<Running> = OnceLock::new();
    S.get_or_init(|| start("tcp", Duration::from_secs(30)))
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    ProptestConfig {
        cases,
        max_global_rejects: 100_000,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn collective_write_and_read_match_the_reference(parts in prop::collection::vec(part(), 1..=4)) {
        let mut ranks: Vec<Ready> = Vec::new();
        for (r, p) in parts.iter().enumerate() {
            match ready(p, r) {
                Some(x) => ranks.push(x),
                None => return Err(TestCaseError::reject("not a valid view or too large")),
            }
        }
        // Give each rank a region of its own: shift its displacement so that its lowest
        // byte lands after the previous rank's highest, with a gap.
        let mut next = 16u64;
        for x in ranks.iter_mut() {
            let lo = x.offsets.iter().min().copied().unwrap_or(x.disp);
            let lowest = lo.min(x.disp).min((x.disp as i64 + x.ft.true_lb()) as u64);
            for o in x.offsets.iter_mut() {
                *o = *o - lowest + next;
            }
            x.disp = x.disp - lowest + next;
            let hi = x.offsets.iter().max().copied().unwrap_or(x.disp);
            next = hi.max(x.disp) + 1 + 13;
        }
        let srv = server();
        let key = job();
        let path = format!("d/prop-{key:x}.bin");
        let size = ranks.len() as u32;
        let reads: Vec<(Vec<u8>, u64)> = std::thread::scope(|s| {
            let handles: Vec<_> = ranks
                .iter()
                .enumerate()
                .map(|(r, x)| {
                    let (addr, path) = (srv.addr.as_str(), path.as_str());
                    s.spawn(move || {
                        let comm = Comm { job: key, rank: r as u32, size };
                        let mut f = common::open(addr, path, comm, amode::CREATE | amode::RDWR, TOKEN).unwrap();
                        f.set_view(x.disp as i64, &Datatype::byte(), &x.ft).unwrap();
                        let wrote = f
                            .write_at_all_origin(x.offset, &x.buf, x.origin, x.count, &x.mem)
                            .unwrap();
                        assert_eq!(wrote, x.stream.len() as u64);
                        let mut back = vec![0u8; x.buf.len()];
                        let n = f
                            .read_at_all_origin(x.offset, &mut back, x.origin, x.count, &x.mem)
                            .unwrap();
                        f.close().unwrap();
                        (back, n)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut expected = Vec::new();
        for x in &ranks {
            reference_place(&mut expected, &x.offsets, &x.stream);
        }
        let got = std::fs::read(srv.root.join(path.trim_start_matches("d/"))).unwrap();
        prop_assert_eq!(got.len(), expected.len());
        prop_assert!(got == expected, "the file differs from the reference placement");
        for (x, (back, n)) in ranks.iter().zip(reads) {
            prop_assert_eq!(n, x.stream.len() as u64);
            let mut want = vec![0u8; x.buf.len()];
            if !x.stream.is_empty() {
                ferry_dtype::unpack(&x.mem, x.count, &x.stream, &mut want, x.origin).unwrap();
            }
            prop_assert!(back == want, "a rank read back other bytes");
        }
    }
}
