//! EXS send/recv with layouts over real connections on every driver: random segment lists
//! and vectors on both sides land exactly where a local pack/unpack puts them, whichever
//! path ran (zero-copy gather/scatter, packed, immediate, push); plus the limits (empty,
//! 1-byte, 2^20 segments), truncation, overlap and overflow refusals.

mod runtime_util;

use ferry_dtype::{Datatype, DtypeError, Segment};
use ferry_exs::proto::{Config, EventKind, Flags};
use ferry_exs::runtime::{Layout, LayoutError, LayoutPath, LayoutStats};
use ferry_exs::ExsError;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use runtime_util::{next, ok, pair, pair_with, pattern, Pair, DRIVERS};

/// Random segments holding `total` bytes inside a buffer, in random stream order, never
/// overlapping; returns them and the buffer length they need.
fn segments(rng: &mut StdRng, total: u64, max_seg: u64) -> (Vec<Segment>, usize) {
    let mut segs = Vec::new();
    let (mut at, mut left) = (rng.random_range(0..64u64), total);
    while left > 0 {
        let len = rng.random_range(1..=max_seg.min(left));
        segs.push(Segment::new(at as i64, len));
        at += len + rng.random_range(0..=max_seg);
        left -= len;
    }
    segs.shuffle(rng);
    (segs, at as usize + 7)
}

fn path(rng: &mut StdRng) -> LayoutPath {
    [LayoutPath::Auto, LayoutPath::ZeroCopy, LayoutPath::Packed][rng.random_range(0..3)]
}

/// What the receiver must hold: its initial bytes with the sender's stream unpacked into its
/// layout (the first `n` bytes of it).
fn reference(send: &Layout, src: &[u8], recv: &Layout, init: &[u8]) -> (Vec<u8>, u64) {
    let stream = ferry_dtype::pack(send.dtype(), send.count(), src, send.origin()).expect("pack");
    let n = stream.len().min(recv.size() as usize);
    let mut out = init.to_vec();
    let mut u = ferry_dtype::Unpacker::new(recv.dtype(), recv.count()).expect("unpacker");
    u.unpack(&mut out, recv.origin(), 0, &stream[..n])
        .expect("unpack");
    (out, n as u64)
}

/// Sends `src` through `send` and receives it into `recv` over `p` (a → b); checks the
/// bytes against the local reference and returns both sides' events' lengths and results.
fn transfer(p: &Pair, src: &[u8], send: &Layout, rlen: usize, recv: &Layout, ctx: u64) {
    let init = pattern(rlen, 0xa5);
    let rbuf = p.b.alloc(rlen).expect("alloc");
    rbuf.write_at(0, &init).expect("init");
    p.b.recv_layout(rbuf, recv, ctx).expect("recv_layout");
    let sbuf = p.a.alloc(src.len()).expect("alloc");
    sbuf.write_at(0, src).expect("fill");
    p.a.send_layout(sbuf, send, ctx).expect("send_layout");
    let (want, n) = reference(send, src, recv, &init);
    let r = next(&p.qb, "Recv");
    assert_eq!((r.kind, r.ctx, r.len), (EventKind::Recv, ctx, n), "{r:?}");
    let truncated = send.size() > recv.size();
    let expect = if truncated {
        Err(ExsError::MessageSize)
    } else {
        Ok(())
    };
    assert_eq!(r.result, expect);
    let s = next(&p.qa, "Send");
    assert_eq!(
        (s.kind, s.ctx, s.result, s.len),
        (EventKind::Send, ctx, Ok(()), n),
        "{s:?}"
    );
    assert_eq!(s.buf.expect("send buffer back").len(), src.len());
    let got = r.buf.expect("recv buffer back").to_vec();
    assert!(
        got == want,
        "ctx {ctx}: received bytes differ from the local copy"
    );
}

/// Property: random segment lists (and sometimes vectors) on both sides, random forced
/// paths and pack thresholds, on pull and push sockets: the receiver equals a local copy.
#[test]
fn random_layouts_equal_a_local_copy() {
    let cases: u64 = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    for (d, driver) in DRIVERS.into_iter().enumerate() {
        for push in [false, true] {
            let cfg = Config {
                push,
                ..Config::default()
            };
            let p = pair_with(driver, cfg.clone(), cfg);
            let seed = 0x1a70_u64 + 2 * d as u64 + u64::from(push);
            let mut rng = StdRng::seed_from_u64(seed);
            for case in 0..cases {
                for sock in [&p.a, &p.b] {
                    let t = [None, Some(1), Some(256), Some(64 << 10)][rng.random_range(0..4)];
                    sock.set_pack_threshold(t);
                }
                let total = match rng.random_range(0..4) {
                    0 => rng.random_range(1..=600u64),
                    1 => rng.random_range(600..=40_000),
                    _ => rng.random_range(40_000..=400_000),
                };
                let max_seg = [8u64, 512, 8 << 10, 128 << 10][rng.random_range(0..4)];
                let (ssegs, slen) = segments(&mut rng, total, max_seg);
                let send = if rng.random_bool(0.25) {
                    // A vector: `blocks` runs `stride` apart.
                    let block = rng.random_range(1..=4096u64);
                    let blocks = (total / block).max(1);
                    let stride = block + rng.random_range(0..4096);
                    Layout::new(
                        Datatype::hvector(blocks, block, stride as i64, &Datatype::byte())
                            .expect("vector"),
                        1,
                        rng.random_range(0..16),
                    )
                    .expect("layout")
                } else {
                    Layout::segments(&ssegs).expect("segments")
                };
                let slen = slen.max(
                    send.origin()
                        + send
                            .dtype()
                            .true_range(1)
                            .expect("range")
                            .map_or(0, |r| r.end as usize),
                );
                // The receive side holds the whole message, or sometimes less (truncation).
                let rtotal = if rng.random_bool(0.15) {
                    rng.random_range(0..=send.size())
                } else {
                    send.size()
                };
                let (rsegs, rlen) = segments(&mut rng, rtotal, max_seg.max(64));
                let send = send.with_path(path(&mut rng));
                let recv = Layout::segments(&rsegs)
                    .expect("segments")
                    .with_path(path(&mut rng));
                let src = pattern(slen, case as u8);
                transfer(&p, &src, &send, rlen.max(1), &recv, case + 1);
            }
            let (sa, sb) = (p.a.layout_stats(), p.b.layout_stats());
            eprintln!("{driver} push={push}: sender {sa:?}\nreceiver {sb:?}");
            assert_eq!(sa.sends_zero_copy + sa.sends_packed, cases, "{driver}");
            assert!(
                sa.sends_packed > 0 && sb.packed_bytes > 0,
                "{driver}: never packed"
            );
            if !push {
                assert!(sa.sends_zero_copy > 0, "{driver}: no layout was advertised");
                assert!(sb.recvs_zero_copy > 0, "{driver}: never scattered in place");
            } else {
                assert!(
                    sa.sends_zero_copy > 0 && sa.zero_copy_ops > 0,
                    "{driver}: no gather"
                );
            }
        }
    }
}

fn stats_diff(after: LayoutStats, before: LayoutStats) -> LayoutStats {
    LayoutStats {
        sends_zero_copy: after.sends_zero_copy - before.sends_zero_copy,
        sends_packed: after.sends_packed - before.sends_packed,
        recvs_zero_copy: after.recvs_zero_copy - before.recvs_zero_copy,
        recvs_packed: after.recvs_packed - before.recvs_packed,
        recvs_immediate: after.recvs_immediate - before.recvs_immediate,
        rma_ops: after.rma_ops - before.rma_ops,
        zero_copy_ops: after.zero_copy_ops - before.zero_copy_ops,
        local_segments: after.local_segments - before.local_segments,
        remote_segments: after.remote_segments - before.remote_segments,
        splits: after.splits - before.splits,
        packed_bytes: after.packed_bytes - before.packed_bytes,
    }
}

/// Reads a receiver posts for `ranges` remote ranges whose local segments fit the gather
/// limit: one range per read on native tcp (`rma_iov_limit` 1), four on libfabric's tcp and
/// shm (`rma_iov_limit` and `rma_gather` 4).
fn reads_for(driver: &str, ranges: u64) -> u64 {
    if driver == "tcp" {
        ranges
    } else {
        ranges.div_ceil(4)
    }
}

/// EXIO's pattern (16 blocks of 64 KiB, 128 KiB apart) on both sides: the ADVERT carries
/// the sender's layout and the receiver posts one RMA read per block (tcp) or per four
/// blocks (ofi), each scattering into its own blocks; forced packing moves the same bytes.
#[test]
fn both_sided_zero_copy_reads_whole_segments() {
    for driver in DRIVERS {
        let p = pair(driver);
        let v = Datatype::hvector(16, 64 << 10, 128 << 10, &Datatype::byte()).expect("vector");
        let zc = Layout::new(v.clone(), 1, 0)
            .expect("layout")
            .with_path(LayoutPath::ZeroCopy);
        let src = pattern(2 << 20, 7);
        let (a0, b0) = (p.a.layout_stats(), p.b.layout_stats());
        transfer(&p, &src, &zc, 2 << 20, &zc, 1);
        let (a, b) = (
            stats_diff(p.a.layout_stats(), a0),
            stats_diff(p.b.layout_stats(), b0),
        );
        assert_eq!(
            (a.sends_zero_copy, a.sends_packed, a.packed_bytes),
            (1, 0, 0),
            "{driver}"
        );
        // One read per block where an RMA addresses one remote range (native tcp); four
        // blocks per read where the driver's rma_iov_limit and rma_gather are 4 (ofi).
        let reads = reads_for(driver, 16);
        assert_eq!(
            (b.recvs_zero_copy, b.rma_ops, b.zero_copy_ops),
            (1, reads, reads),
            "{driver}"
        );
        assert_eq!(
            (b.local_segments, b.remote_segments, b.packed_bytes),
            (16, 16, 0)
        );
        // The same message packed on both sides: same bytes, no zero-copy operation.
        let packed = Layout::new(v, 1, 0)
            .expect("layout")
            .with_path(LayoutPath::Packed);
        let (a0, b0) = (p.a.layout_stats(), p.b.layout_stats());
        transfer(&p, &src, &packed, 2 << 20, &packed, 2);
        let (a, b) = (
            stats_diff(p.a.layout_stats(), a0),
            stats_diff(p.b.layout_stats(), b0),
        );
        assert_eq!((a.sends_packed, a.packed_bytes), (1, 1 << 20), "{driver}");
        assert_eq!(
            (b.recvs_packed, b.zero_copy_ops, b.packed_bytes),
            (1, 0, 1 << 20)
        );
    }
}

/// Small remote blocks into large local ones: 16 sender blocks of 16 KiB (32 KiB apart)
/// land in 4 receiver blocks of 64 KiB; consecutive remote ranges share a read up to the
/// driver's limit (4 reads on ofi, each filling one local block; 16 on native tcp), the
/// bytes are the local reference's, and nothing is split.
#[test]
fn consecutive_remote_ranges_share_a_read() {
    for driver in DRIVERS {
        let p = pair(driver);
        let small = Datatype::hvector(16, 16 << 10, 32 << 10, &Datatype::byte()).expect("vector");
        let large = Datatype::hvector(4, 64 << 10, 96 << 10, &Datatype::byte()).expect("vector");
        let send = Layout::new(small, 1, 0)
            .expect("layout")
            .with_path(LayoutPath::ZeroCopy);
        let recv = Layout::new(large, 1, 0)
            .expect("layout")
            .with_path(LayoutPath::ZeroCopy);
        let src = pattern(512 << 10, 3);
        let b0 = p.b.layout_stats();
        transfer(&p, &src, &send, 384 << 10, &recv, 5);
        let b = stats_diff(p.b.layout_stats(), b0);
        let reads = reads_for(driver, 16);
        assert_eq!(
            (b.recvs_zero_copy, b.rma_ops, b.zero_copy_ops, b.splits),
            (1, reads, reads, 0),
            "{driver}"
        );
        assert_eq!((b.remote_segments, b.local_segments), (16, 16), "{driver}");
    }
}

/// A plain contiguous send into a layout receive, and a layout send into a plain receive.
#[test]
fn layouts_meet_plain_sends_and_recvs() {
    for driver in DRIVERS {
        let p = pair(driver);
        let segs = [Segment::new(100_000, 50_000), Segment::new(0, 50_000)];
        let l = Layout::segments(&segs).expect("segments");
        // Plain send → layout recv.
        let rbuf = p.b.alloc(150_000).expect("alloc");
        p.b.recv_layout(rbuf, &l, 1).expect("recv");
        let src = pattern(100_000, 3);
        let sbuf = p.a.alloc(100_000).expect("alloc");
        sbuf.write_at(0, &src).expect("fill");
        p.a.send(sbuf, Flags::NONE, 1);
        let got = ok(&p.qb, EventKind::Recv).buf.expect("buf").to_vec();
        ok(&p.qa, EventKind::Send);
        assert_eq!(&got[100_000..], &src[..50_000]);
        assert_eq!(&got[..50_000], &src[50_000..]);
        assert!(
            got[50_000..100_000].iter().all(|&b| b == 0),
            "{driver}: gap written"
        );
        // Layout send → plain recv.
        let rbuf = p.b.alloc(100_000).expect("alloc");
        p.b.recv(rbuf, Flags::NONE, 2);
        let sbuf = p.a.alloc(150_000).expect("alloc");
        sbuf.write_at(0, &got).expect("fill");
        p.a.send_layout(sbuf, &l, 2).expect("send");
        let back = ok(&p.qb, EventKind::Recv).buf.expect("buf").to_vec();
        ok(&p.qa, EventKind::Send);
        assert_eq!(back, src, "{driver}");
    }
}

/// Empty layouts, 1-byte segments on both sides, and 2^20 one-byte segments both ways.
#[test]
fn limits_empty_one_byte_and_a_million_segments() {
    for driver in DRIVERS {
        let p = pair(driver);
        let empty = Layout::segments(&[]).expect("empty");
        transfer(&p, &pattern(16, 1), &empty, 16, &empty, 1);
        // 1-byte segments, every other byte, both sides (packed by the threshold).
        let ones: Vec<Segment> = (0..3000).map(|i| Segment::new(2 * i, 1)).collect();
        let l = Layout::segments(&ones).expect("segments");
        let before = p.a.layout_stats();
        transfer(&p, &pattern(6000, 2), &l, 6000, &l, 2);
        assert_eq!(
            stats_diff(p.a.layout_stats(), before).sends_packed,
            1,
            "{driver}"
        );
        // And forced zero-copy: one RMA read per gather batch of 1-byte segments.
        let zc = l.clone().with_path(LayoutPath::ZeroCopy);
        transfer(&p, &pattern(6000, 3), &l, 6000, &zc, 3);
    }
    // 2^20 one-byte segments on native tcp: packed send, then scattered in place on receive.
    let p = pair("tcp");
    let n = 1u64 << 20;
    let v = Datatype::hvector(n, 1, 2, &Datatype::byte()).expect("vector");
    let send = Layout::new(v.clone(), 1, 0).expect("layout");
    let recv = Layout::new(v, 1, 1)
        .expect("layout")
        .with_path(LayoutPath::ZeroCopy);
    let before = p.b.layout_stats();
    transfer(&p, &pattern(2 << 20, 9), &send, (2 << 20) + 1, &recv, 4);
    let d = stats_diff(p.b.layout_stats(), before);
    assert_eq!((d.recvs_zero_copy, d.local_segments), (1, n));
    assert!(d.rma_ops >= n / 64, "{d:?}");
}

/// A receive layout smaller than the message gets its prefix and MessageSize; nothing
/// outside its segments changes; the sender completes with the length taken.
#[test]
fn truncation_writes_only_the_prefix_into_the_segments() {
    for driver in DRIVERS {
        let p = pair(driver);
        let send = Layout::new(
            Datatype::hvector(8, 16 << 10, 32 << 10, &Datatype::byte()).expect("vector"),
            1,
            0,
        )
        .expect("layout")
        .with_path(LayoutPath::ZeroCopy);
        let recv = Layout::segments(&[Segment::new(70_000, 30_000), Segment::new(10, 20_000)])
            .expect("segments")
            .with_path(LayoutPath::ZeroCopy);
        // `transfer` checks MessageSize, the sender's length and every byte of the buffer.
        transfer(&p, &pattern(256 << 10, 4), &send, 100_000, &recv, 1);
    }
}

/// Refusals before anything moves: overlapping receive segments, a layout outside its
/// buffer, a datatype whose extent overflows.
#[test]
fn refusals_hand_the_buffer_back() {
    let p = pair("tcp");
    let overlap = Layout::segments(&[Segment::new(0, 10), Segment::new(5, 10)]).expect("list");
    let r =
        p.b.recv_layout(p.b.alloc(64).expect("alloc"), &overlap, 1)
            .expect_err("overlap refused");
    assert!(
        matches!(r.error, LayoutError::Dtype(DtypeError::Overlap { .. })),
        "{r}"
    );
    assert_eq!(r.buf.len(), 64);
    // A sender may read a byte twice.
    let s = p.a.alloc(64).expect("alloc");
    let rb = p.b.alloc(20).expect("alloc");
    p.b.recv(rb, Flags::NONE, 2);
    p.a.send_layout(s, &overlap, 2)
        .expect("overlapping send segments are fine");
    assert_eq!(ok(&p.qb, EventKind::Recv).len, 20);
    ok(&p.qa, EventKind::Send);
    // Outside the buffer.
    let far = Layout::segments(&[Segment::new(60, 10)]).expect("list");
    let r =
        p.a.send_layout(p.a.alloc(64).expect("alloc"), &far, 3)
            .expect_err("outside refused");
    assert!(
        matches!(r.error, LayoutError::OutOfBuffer { len: 64, .. }),
        "{r}"
    );
    // Extent overflow: in the constructor, or for `count` instances.
    assert!(Datatype::hvector(4, 1, i64::MAX / 2, &Datatype::byte()).is_err());
    let wide = Datatype::hvector(2, 1, 1 << 40, &Datatype::byte()).expect("vector");
    let err = Layout::new(wide, 1 << 30, 0).expect_err("overflow refused");
    assert!(matches!(err, LayoutError::Dtype(_)), "{err}");
    // Nothing was sent by the refusals: the connection still carries a message.
    let rb = p.b.alloc(8).expect("alloc");
    p.b.recv(rb, Flags::NONE, 4);
    p.a.send(p.a.alloc(8).expect("alloc"), Flags::NONE, 4);
    assert_eq!(ok(&p.qb, EventKind::Recv).ctx, 4);
}
