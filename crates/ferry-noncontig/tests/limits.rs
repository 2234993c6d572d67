//! Limits and errors of the engine on every driver: empty layouts, 1-byte segments, 2^20
//! segments walked lazily, lists longer than the gather limit (software splitting), the
//! automatic path choice, and the errors that must come before anything moves.

mod common;

use common::*;
use ferry_dtype::{Datatype, Segment};
use ferry_noncontig::{read, write, NoncontigError, Options, Path};

fn each(f: impl Fn(&Pair, &str)) {
    for d in DRIVERS {
        let p = pair(d);
        f(&p, d);
    }
}

fn forced(path: Path) -> Options {
    Options {
        path,
        ..Options::default()
    }
}

#[test]
fn empty_layouts_move_nothing() {
    each(|p, d| {
        let lr = p.local(&[1; 16]);
        let rr = p.target(&[2; 16]);
        let empty = Datatype::from_segments(&[]).unwrap();
        for path in [Path::ZeroCopy, Path::Packed, Path::Auto] {
            let s = write(
                p.client.as_ref(),
                &local_layout(&lr, 0, &empty, 1),
                &remote_layout(&rr, 0, &empty, 5),
                &forced(path),
            )
            .unwrap_or_else(|e| panic!("{d}: {e}"));
            assert_eq!((s.bytes, s.ops), (0, 0), "{d}");
        }
        assert_eq!(rr.buffer().to_vec(), [2; 16]);
    });
}

#[test]
fn one_byte_segments_both_sides() {
    each(|p, d| {
        // Every third byte on the left into every other byte on the right, 200 bytes.
        let b = Datatype::byte();
        let l = Datatype::vector(200, 1, 3, &b).unwrap();
        let r = Datatype::vector(200, 1, 2, &b).unwrap();
        let src = pattern(600, 9);
        for path in [Path::ZeroCopy, Path::Packed] {
            let lr = p.local(&src);
            let rr = p.target(&[0; 400]);
            let s = write(
                p.client.as_ref(),
                &local_layout(&lr, 0, &l, 1),
                &remote_layout(&rr, 0, &r, 1),
                &forced(path),
            )
            .unwrap();
            assert_eq!(s.remote_segments, 200, "{d} {path:?}");
            let want = reference((&src, 0, &l, 1), (&[0; 400], 0, &r, 1));
            assert_eq!(rr.buffer().to_vec(), want, "{d} {path:?}");
        }
    });
}

#[test]
fn a_million_segments_walked_lazily() {
    // 2^20 one-byte blocks, every other byte, gathered into a contiguous remote range.
    let n = 1u64 << 20;
    let t = Datatype::vector(n, 1, 2, &Datatype::byte()).unwrap();
    let src = pattern(2 * n as usize, 5);
    let want: Vec<u8> = src.iter().step_by(2).copied().collect();
    // shm's gather limit is small: 2^20 one-byte operations there take seconds, so the
    // zero-copy walk runs on tcp (64 per gather) and shm takes the packed path.
    for (d, paths) in [
        ("tcp", &[Path::ZeroCopy, Path::Auto][..]),
        ("ofi+shm", &[Path::Auto][..]),
    ] {
        let p = pair(d);
        let lr = p.local(&src);
        for &path in paths {
            let rr = p.target(&vec![0; n as usize]);
            let s = write(
                p.client.as_ref(),
                &local_layout(&lr, 0, &t, 1),
                &remote_layout(&rr, 0, &Datatype::byte(), n),
                &forced(path),
            )
            .unwrap();
            assert_eq!(rr.buffer().to_vec(), want, "{d} {path:?}");
            let gather = p.client.capabilities().max_gather as u64;
            match s.path {
                Path::ZeroCopy => {
                    assert_eq!(s.local_segments, n);
                    assert_eq!(s.ops, n.div_ceil(gather));
                    assert_eq!(s.splits, 1, "one remote segment split in software");
                }
                _ => {
                    assert_eq!(s.packed_bytes, n);
                    assert_eq!(s.zero_copy_ops, 0);
                }
            }
            if path == Path::Auto {
                assert_eq!(s.path, Path::Packed, "tiny local, contiguous remote packs");
            }
        }
        if d != "tcp" {
            continue;
        }
        // And back: a contiguous remote range scattered over the million segments.
        let back = p.local(&vec![0; 2 * n as usize]);
        let rr = p.target(&want);
        read(
            p.client.as_ref(),
            &local_layout(&back, 0, &t, 1),
            &remote_layout(&rr, 0, &Datatype::byte(), n),
            &forced(Path::ZeroCopy),
        )
        .unwrap();
        let got = back.buffer().to_vec();
        assert!(
            got.iter().step_by(2).copied().eq(want.iter().copied()),
            "{d}"
        );
        assert!(got.iter().skip(1).step_by(2).all(|&b| b == 0), "{d}");
    }
}

#[test]
fn lists_longer_than_the_gather_limit_are_split() {
    each(|p, d| {
        let caps_gather = p.client.capabilities().rma_gather;
        // 3 remote segments of 400 bytes, each filled from 50 local 8-byte segments.
        let l = Datatype::vector(150, 8, 16, &Datatype::byte()).unwrap();
        let r = Datatype::vector(3, 400, 1000, &Datatype::byte()).unwrap();
        let src = pattern(2400, 7);
        for gather in [1, 3, 64, 1000] {
            let lr = p.local(&src);
            let rr = p.target(&[0; 2400]);
            let s = write(
                p.client.as_ref(),
                &local_layout(&lr, 0, &l, 1),
                &remote_layout(&rr, 0, &r, 1),
                &Options {
                    path: Path::ZeroCopy,
                    max_gather: Some(gather),
                    max_remote_segments: Some(1),
                    ..Options::default()
                },
            )
            .unwrap();
            let g = gather.min(caps_gather) as u64;
            assert_eq!(s.ops, 3 * 50u64.div_ceil(g), "{d} gather {gather}");
            assert_eq!(s.splits, if g < 50 { 3 } else { 0 }, "{d} gather {gather}");
            assert_eq!(s.local_segments, 150);
            let want = reference((&src, 0, &l, 1), (&[0; 2400], 0, &r, 1));
            assert_eq!(rr.buffer().to_vec(), want, "{d} gather {gather}");
        }
    });
}

#[test]
fn consecutive_remote_segments_share_operations() {
    each(|p, d| {
        let caps = p.client.capabilities().clone();
        // 16 remote segments of 1000 bytes, each filled from one local segment.
        let l = Datatype::vector(16, 1000, 2000, &Datatype::byte()).unwrap();
        let r = Datatype::vector(16, 1000, 3000, &Datatype::byte()).unwrap();
        let src = pattern(32_000, 11);
        for riov in [1, 2, 4, 100] {
            let opts = Options {
                path: Path::ZeroCopy,
                max_remote_segments: Some(riov),
                ..Options::default()
            };
            let per_op = riov.min(caps.rma_iov_limit).min(caps.rma_gather) as u64;
            let lr = p.local(&src);
            let rr = p.target(&[0; 48_000]);
            let s = write(
                p.client.as_ref(),
                &local_layout(&lr, 0, &l, 1),
                &remote_layout(&rr, 0, &r, 1),
                &opts,
            )
            .unwrap();
            assert_eq!(s.ops, 16u64.div_ceil(per_op), "{d} riov {riov}");
            assert_eq!((s.remote_segments, s.local_segments, s.splits), (16, 16, 0));
            if riov > 1 && caps.rma_iov_limit > 1 {
                assert!(s.ops < 16, "{d}: grouped writes take fewer operations");
            }
            let want = reference((&src, 0, &l, 1), (&[0; 48_000], 0, &r, 1));
            assert_eq!(rr.buffer().to_vec(), want, "{d} riov {riov}");
            // And back: a gathered read of the same ranges into a fresh local layout.
            let back = p.local(&[0; 32_000]);
            let s = read(
                p.client.as_ref(),
                &local_layout(&back, 0, &l, 1),
                &remote_layout(&rr, 0, &r, 1),
                &opts,
            )
            .unwrap();
            assert_eq!(s.ops, 16u64.div_ceil(per_op), "{d} riov {riov} read");
            let want = reference((&want, 0, &r, 1), (&[0; 32_000], 0, &l, 1));
            assert_eq!(back.buffer().to_vec(), want, "{d} riov {riov} read");
        }
    });
}

#[test]
fn auto_packs_only_when_the_remote_side_is_large() {
    let p = pair("tcp");
    let lr = p.local(&[0; 4096]);
    let tiny = Datatype::vector(512, 4, 8, &Datatype::byte()).unwrap();
    let big = Datatype::contiguous(2048, &Datatype::byte()).unwrap();
    let o = Options::default();
    let rr = p.target(&[0; 4096]);
    let choose = |lt: &Datatype, rt: &Datatype| {
        o.choose(
            p.client.capabilities(),
            &local_layout(&lr, 0, lt, 1),
            &remote_layout(&rr, 0, rt, 1),
        )
    };
    assert_eq!(choose(&tiny, &big), Path::Packed);
    assert_eq!(choose(&tiny, &tiny), Path::ZeroCopy);
    assert_eq!(choose(&big, &tiny), Path::ZeroCopy);
    assert_eq!(choose(&big, &big), Path::ZeroCopy);
    let never = Options {
        pack_threshold: Some(0),
        ..Options::default()
    };
    assert_eq!(
        never.choose(
            p.client.capabilities(),
            &local_layout(&lr, 0, &tiny, 1),
            &remote_layout(&rr, 0, &big, 1)
        ),
        Path::ZeroCopy
    );
}

#[test]
fn errors_come_before_anything_moves() {
    each(|p, d| {
        let lr = p.local(&[1; 64]);
        let rr = p.target(&[2; 64]);
        let b = Datatype::byte();
        let run = |l: &Datatype, ln: u64, r: &Datatype, rn: u64, origin: u64| {
            write(
                p.client.as_ref(),
                &local_layout(&lr, 0, l, ln),
                &remote_layout(&rr, origin, r, rn),
                &Options::default(),
            )
        };
        // Overlapping receive segments.
        let overlap = Datatype::from_segments(&[Segment::new(0, 8), Segment::new(4, 8)]).unwrap();
        let e = run(&b, 16, &overlap, 1, 0).unwrap_err();
        assert!(matches!(e, NoncontigError::Dtype(_)), "{d}: {e}");
        // Different sizes.
        let e = run(&b, 16, &b, 15, 0).unwrap_err();
        assert!(
            matches!(
                e,
                NoncontigError::SizeMismatch {
                    local: 16,
                    remote: 15
                }
            ),
            "{d}: {e}"
        );
        // Remote layout outside the advertised slice (by origin, and by extent).
        let e = run(&b, 16, &b, 16, 60).unwrap_err();
        assert!(
            matches!(e, NoncontigError::RemoteOutOfSlice { .. }),
            "{d}: {e}"
        );
        let far = Datatype::vector(2, 8, 60, &b).unwrap();
        let e = run(&b, 16, &far, 1, 0).unwrap_err();
        assert!(
            matches!(e, NoncontigError::RemoteOutOfSlice { .. }),
            "{d}: {e}"
        );
        // Layouts whose arithmetic overflows 64 bits are refused, not wrapped.
        let big = Datatype::contiguous(1 << 40, &b).unwrap();
        assert!(run(&big, 1 << 30, &b, 16, 0).is_err(), "{d}");
        assert!(run(&b, 16, &big, u64::MAX, 0).is_err(), "{d}");
        // Local layout outside its region.
        let e = run(&far, 1, &b, 16, 0).unwrap_err();
        assert!(
            matches!(e, NoncontigError::LocalOutOfRegion { .. }),
            "{d}: {e}"
        );
        // A read whose local (receive) side overlaps.
        let e = read(
            p.client.as_ref(),
            &local_layout(&lr, 0, &overlap, 1),
            &remote_layout(&rr, 0, &b, 16),
            &Options::default(),
        )
        .unwrap_err();
        assert!(matches!(e, NoncontigError::Dtype(_)), "{d}: {e}");
        // Nothing moved, and the endpoint still works.
        assert_eq!(rr.buffer().to_vec(), [2; 64], "{d}");
        assert!(p.client.cq().is_empty());
        run(&b, 16, &b, 16, 0).expect("a good transfer after the refusals");
        assert_eq!(
            &rr.buffer().to_vec()[..17],
            &[[1; 16].as_slice(), &[2]].concat()[..]
        );
    });
}

#[test]
fn a_refused_key_fails_the_transfer_after_draining() {
    each(|p, d| {
        let t = Datatype::vector(8, 16, 32, &Datatype::byte()).unwrap();
        let lr = p.local(&pattern(256, 1));
        let rr = p.target(&[0; 256]);
        let mut bad = remote_layout(&rr, 0, &t, 1);
        bad.slice.key ^= 0x5a5a;
        for path in [Path::ZeroCopy, Path::Packed] {
            let e = write(
                p.client.as_ref(),
                &local_layout(&lr, 0, &t, 1),
                &bad,
                &forced(path),
            )
            .unwrap_err();
            assert!(
                matches!(e, NoncontigError::Completion(_)),
                "{d} {path:?}: {e}"
            );
            assert!(p.client.cq().is_empty(), "{d}: everything drained");
        }
        assert_eq!(rr.buffer().to_vec(), [0; 256], "{d}");
        // The endpoint still works.
        write(
            p.client.as_ref(),
            &local_layout(&lr, 0, &t, 1),
            &remote_layout(&rr, 0, &t, 1),
            &Options::default(),
        )
        .unwrap();
    });
}

#[test]
fn a_caller_staging_region_is_used_in_chunks() {
    each(|p, d| {
        let l = Datatype::vector(300, 2, 5, &Datatype::byte()).unwrap();
        let src = pattern(1500, 4);
        let lr = p.local(&src);
        // Two halves of 32 bytes (19 chunks), and a 1-byte staging buffer (no halves).
        for (len, ops) in [(64, 19), (1, 600)] {
            let rr = p.target(&[0; 600]);
            let staging = p
                .client
                .domain()
                .register(&ferry_fabric::Buffer::new(len), ferry_fabric::Access::LOCAL)
                .unwrap();
            let s = write(
                p.client.as_ref(),
                &local_layout(&lr, 0, &l, 1),
                &remote_layout(&rr, 0, &Datatype::byte(), 600),
                &Options {
                    path: Path::Packed,
                    staging: Some(staging.clone()),
                    ..Options::default()
                },
            )
            .unwrap();
            assert_eq!(
                (s.path, s.packed_bytes, s.ops),
                (Path::Packed, 600, ops),
                "{d}"
            );
            let want = reference((&src, 0, &l, 1), (&[0; 600], 0, &Datatype::byte(), 600));
            assert_eq!(rr.buffer().to_vec(), want, "{d} staging {len}");
            // And back, through the same staging.
            let back = p.local(&[0; 1500]);
            let s = read(
                p.client.as_ref(),
                &local_layout(&back, 0, &l, 1),
                &remote_layout(&rr, 0, &Datatype::byte(), 600),
                &Options {
                    path: Path::Packed,
                    staging: Some(staging),
                    ..Options::default()
                },
            )
            .unwrap();
            assert_eq!(s.packed_bytes, 600, "{d}");
            let target = rr.buffer().to_vec();
            let want = reference((&target, 0, &Datatype::byte(), 600), (&[0; 1500], 0, &l, 1));
            assert_eq!(back.buffer().to_vec(), want, "{d} staging {len} read");
        }
    });
}

#[test]
fn a_foreign_completion_is_an_error_after_draining() {
    let p = pair("tcp");
    let t = Datatype::vector(4, 8, 16, &Datatype::byte()).unwrap();
    let lr = p.local(&pattern(64, 1));
    let rr = p.target(&[0; 64]);
    // Someone else's operation completes on the same queue during the transfer.
    p.client
        .post_write(&[lr.slice(0..8).unwrap()], rr.remote(56..64).unwrap(), 7)
        .unwrap();
    let e = write(
        p.client.as_ref(),
        &local_layout(&lr, 0, &t, 1),
        &remote_layout(&rr, 0, &t, 1),
        &Options::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("foreign"), "{e}");
    assert!(p.client.cq().is_empty(), "everything drained");
}
