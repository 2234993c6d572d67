//! Limits and errors: empty layouts, tiny and huge segment counts, overlap, overflow, bounds.

use ferry_dtype::{
    pack, unpack, validate_receive_segments, Cursor, Datatype, DtypeError, Order, Packer, Segment,
    Unpacker,
};

fn seg(offset: i64, len: u64) -> Segment {
    Segment::new(offset, len)
}

#[test]
fn zero_segments_and_zero_count() {
    let byte = Datatype::byte();
    // Count 0 of a real type, a type of count 0, an empty segment list.
    let v = Datatype::vector(4, 2, 3, &byte).unwrap();
    let empty = [
        Datatype::contiguous(0, &byte).unwrap(),
        Datatype::vector(0, 5, 7, &byte).unwrap(),
        Datatype::vector(5, 0, 7, &byte).unwrap(),
        Datatype::from_segments(&[]).unwrap(),
        Datatype::from_segments(&[seg(100, 0), seg(-5, 0)]).unwrap(),
        Datatype::structure(&[], &[], &[]).unwrap(),
    ];
    for t in &empty {
        assert_eq!(
            (t.size(), t.lb(), t.ub(), t.extent()),
            (0, 0, 0, 0),
            "{t:?}"
        );
        assert_eq!((t.true_lb(), t.true_extent()), (0, 0));
        assert!(t.is_contiguous());
        assert_eq!(t.flatten(3).unwrap(), []);
        assert_eq!(t.segment_count_hint(3), 0);
        assert_eq!(t.true_range(3).unwrap(), None);
        t.check_receive(3).unwrap();
    }
    for (t, count) in [(&v, 0), (&empty[0], 5)] {
        let mut c = Cursor::new(t, count).unwrap();
        assert!(c.is_done());
        assert_eq!(c.next(), None);
        assert_eq!(c.total(), 0);
        c.seek(0).unwrap();
        assert!(matches!(
            c.seek(1),
            Err(DtypeError::PositionOutOfRange { pos: 1, total: 0 })
        ));
        // Packing nothing touches no buffer, even an empty one.
        let mut p = Packer::new(t, count).unwrap();
        assert_eq!(p.pack(&[], 0, 0, &mut [0u8; 8]).unwrap(), 0);
        assert_eq!(pack(t, count, &[], 0).unwrap(), Vec::<u8>::new());
        unpack(t, count, &[], &mut [], 0).unwrap();
    }
    validate_receive_segments(&[]).unwrap();
}

#[test]
fn one_byte_segments() {
    // Scattered single bytes, in descending order, some adjacent.
    let list = [seg(9, 1), seg(7, 1), seg(6, 1), seg(2, 1), seg(0, 1)];
    let t = Datatype::from_segments(&list).unwrap();
    assert_eq!((t.size(), t.lb(), t.ub(), t.true_extent()), (5, 0, 10, 10));
    // 7 then 6 are neighbours in memory but not in stream order: no merge.
    assert_eq!(t.flatten(1).unwrap(), list);
    validate_receive_segments(&list).unwrap();
    t.check_receive(1).unwrap();
    let src: Vec<u8> = (0..10).collect();
    assert_eq!(pack(&t, 1, &src, 0).unwrap(), [9, 7, 6, 2, 0]);
    // Ascending 1-byte segments that touch merge into one, and so do instances (extent 3).
    let t = Datatype::from_segments(&[seg(3, 1), seg(4, 1), seg(5, 1)]).unwrap();
    assert!(t.is_contiguous());
    assert_eq!(t.flatten(2).unwrap(), [seg(3, 6)]);
    let spaced = Datatype::resized(&t, 0, 8).unwrap();
    assert_eq!(spaced.flatten(2).unwrap(), [seg(3, 3), seg(11, 3)]);
    // A 1-byte vector: every byte a segment.
    let t = Datatype::vector(5, 1, 2, &Datatype::byte()).unwrap();
    assert_eq!(t.flatten(1).unwrap().len(), 5);
}

#[test]
fn million_segments_walk_in_constant_memory() {
    const N: u64 = 1 << 20;
    let t = Datatype::vector(N, 1, 2, &Datatype::byte()).unwrap();
    assert_eq!((t.size(), t.extent(), t.depth()), (N, 2 * N as i64 - 1, 2));
    assert_eq!(t.segment_count_hint(1), N);
    let mut c = Cursor::new(&t, 1).unwrap();
    let start = c.memory_bytes();
    assert!(start < 512, "cursor holds {start} bytes");
    let (mut n, mut bytes, mut last) = (0u64, 0u64, -2i64);
    while let Some(s) = c.next_segment(u64::MAX) {
        assert_eq!((s.offset, s.len), (last + 2, 1));
        last = s.offset;
        n += 1;
        bytes += s.len;
    }
    assert_eq!((n, bytes), (N, N));
    assert_eq!(c.memory_bytes(), start, "the walk allocated");
    // Seek to the middle and resume there.
    c.seek(N / 2 + 1).unwrap();
    assert_eq!(c.next(), Some(seg(N as i64 + 2, 1)));
    assert_eq!(c.remaining(), N / 2 - 2);
    assert_eq!(c.memory_bytes(), start);
    // A batch as a gather list: 64 segments at most.
    let mut out = Vec::with_capacity(64);
    assert_eq!(c.next_batch(64, u64::MAX, &mut out), 64);
    assert_eq!(out.len(), 64);
}

#[test]
fn overlapping_receive_segments_are_refused() {
    let err = validate_receive_segments(&[seg(0, 8), seg(16, 4), seg(7, 2)]).unwrap_err();
    assert_eq!(
        err,
        DtypeError::Overlap {
            first: seg(0, 8),
            second: seg(7, 2)
        }
    );
    assert!(err.to_string().contains("overlap"), "{err}");
    // Same start, identical, nested, at the extremes of i64.
    for list in [
        vec![seg(5, 1), seg(5, 1)],
        vec![seg(0, 10), seg(2, 3)],
        vec![seg(i64::MAX - 1, 1), seg(i64::MIN, 3), seg(i64::MAX - 2, 2)],
        vec![seg(i64::MAX, u64::MAX), seg(i64::MAX, 1)],
    ] {
        assert!(
            matches!(
                validate_receive_segments(&list),
                Err(DtypeError::Overlap { .. })
            ),
            "{list:?}"
        );
    }
    // Touching, zero-length inside others, unsorted but disjoint: fine.
    validate_receive_segments(&[seg(0, 4), seg(4, 4), seg(2, 0), seg(-10, 10)]).unwrap();
    validate_receive_segments(&[seg(100, 1), seg(0, 1), seg(50, 50)]).unwrap();
    // Datatypes: an extent smaller than the data makes instances overlap.
    let int = Datatype::primitive(4).unwrap();
    let squeezed = Datatype::resized(&int, 0, 2).unwrap();
    squeezed.check_receive(1).unwrap();
    assert!(matches!(
        squeezed.check_receive(2),
        Err(DtypeError::Overlap { .. })
    ));
    let twice = Datatype::hindexed(&[1, 1], &[0, 3], &int).unwrap();
    assert!(twice.check_receive(1).is_err());
    Datatype::hindexed(&[1, 1], &[4, 0], &int)
        .unwrap()
        .check_receive(1)
        .unwrap();
}

fn overflow(r: Result<Datatype, DtypeError>) -> bool {
    matches!(r, Err(DtypeError::Overflow { .. }))
}

#[test]
fn overflowing_types_are_errors() {
    let byte = Datatype::byte();
    let big = Datatype::primitive(1 << 40).unwrap();
    // Extent: strides and displacements far apart.
    assert!(overflow(Datatype::hvector(3, 1, i64::MAX / 2 + 1, &byte)));
    assert!(overflow(Datatype::vector(
        2,
        1,
        i64::MAX,
        &Datatype::primitive(2).unwrap()
    )));
    assert!(overflow(Datatype::hindexed(
        &[1, 1],
        &[i64::MIN, i64::MAX],
        &byte
    )));
    assert!(overflow(Datatype::indexed(&[1], &[i64::MAX / 2], &big)));
    assert!(overflow(Datatype::resized(&byte, i64::MAX, 1)));
    assert!(overflow(Datatype::resized(&byte, i64::MIN, -1)));
    assert!(overflow(Datatype::from_segments(&[seg(i64::MAX, 1)])));
    assert!(overflow(Datatype::from_segments(&[seg(0, u64::MAX)])));
    assert!(overflow(Datatype::primitive(u64::MAX)));
    // Size: u64 copies of 2^40 bytes, overlapping in place so the extent would fit.
    let flat = Datatype::resized(&big, 0, 0).unwrap();
    assert!(overflow(Datatype::contiguous(1 << 30, &flat)));
    assert_eq!(
        Datatype::contiguous(1 << 20, &flat).unwrap().size(),
        1 << 60
    );
    // Subarray whose whole array is too large.
    assert!(overflow(Datatype::subarray(
        &[1 << 32, 1 << 32],
        &[1, 1],
        &[0, 0],
        Order::C,
        &Datatype::primitive(8).unwrap()
    )));
    // A count of a valid type that does not fit, at the cursor and the packer.
    let wide = Datatype::hvector(2, 1, 1 << 61, &byte).unwrap();
    assert!(matches!(
        Cursor::new(&wide, 8),
        Err(DtypeError::Overflow { .. })
    ));
    assert!(Packer::new(&wide, 8).is_err());
    assert!(Unpacker::new(&wide, 8).is_err());
    let e = Datatype::hvector(3, 1, i64::MAX / 2 + 1, &byte).unwrap_err();
    assert!(e.to_string().contains("hvector"), "{e}");
}

#[test]
fn inconsistent_descriptions_are_errors() {
    let int = Datatype::primitive(4).unwrap();
    let sub = |sizes: &[u64], subsizes: &[u64], starts: &[u64]| {
        Datatype::subarray(sizes, subsizes, starts, Order::Fortran, &int)
    };
    let out_of_range = DtypeError::SubarrayOutOfRange {
        dim: 1,
        size: 5,
        subsize: 3,
        start: 3,
    };
    assert_eq!(sub(&[4, 5], &[2, 3], &[0, 3]).unwrap_err(), out_of_range);
    assert!(out_of_range.to_string().contains("dimension 1"));
    for (sizes, subsizes, starts) in [
        (&[4u64][..], &[5u64][..], &[0u64][..]),
        (&[4], &[0], &[0]),
        (&[0], &[0], &[0]),
        (&[4], &[1], &[u64::MAX]),
    ] {
        assert!(matches!(
            sub(sizes, subsizes, starts),
            Err(DtypeError::SubarrayOutOfRange { dim: 0, .. })
        ));
    }
    assert!(matches!(
        sub(&[], &[], &[]),
        Err(DtypeError::Invalid { .. })
    ));
    assert!(matches!(
        sub(&[4, 4], &[2], &[0, 0]),
        Err(DtypeError::LengthMismatch {
            what: "subsizes",
            got: 1,
            expected: 2,
            ..
        })
    ));
    assert!(matches!(
        Datatype::indexed(&[1, 2], &[0], &int),
        Err(DtypeError::LengthMismatch { .. })
    ));
    assert!(matches!(
        Datatype::hindexed(&[1], &[0, 4], &int),
        Err(DtypeError::LengthMismatch { .. })
    ));
    assert!(matches!(
        Datatype::structure(&[1, 1], &[0, 4], std::slice::from_ref(&int)),
        Err(DtypeError::LengthMismatch { what: "types", .. })
    ));
}

#[test]
fn out_of_buffer_is_refused_before_writing() {
    // Negative lower bound: bytes at -4..0 and 8..12.
    let t = Datatype::hindexed(&[4, 4], &[-4, 8], &Datatype::byte()).unwrap();
    assert_eq!((t.lb(), t.true_lb(), t.true_ub()), (-4, -4, 12));
    assert_eq!(t.true_range(1).unwrap(), Some(-4..12));
    let src: Vec<u8> = (0..16).collect();
    assert_eq!(pack(&t, 1, &src, 4).unwrap(), [0, 1, 2, 3, 12, 13, 14, 15]);
    let mut out = [0xAAu8; 8];
    let mut p = Packer::new(&t, 1).unwrap();
    for (buf, origin) in [(&src[..], 3), (&src[..15], 4), (&src[..], usize::MAX)] {
        let err = p.pack(buf, origin, 0, &mut out).unwrap_err();
        assert!(
            matches!(err, DtypeError::OutOfBuffer { lo: -4, hi: 12, .. }),
            "{err}"
        );
        assert_eq!(out, [0xAA; 8]);
    }
    let mut dst = [0u8; 15];
    let mut u = Unpacker::new(&t, 1).unwrap();
    assert!(u.unpack(&mut dst, 4, 0, &[7; 8]).is_err());
    assert_eq!(dst, [0; 15]);
    assert!(matches!(
        p.pack(&src, 4, 9, &mut out),
        Err(DtypeError::PositionOutOfRange { pos: 9, total: 8 })
    ));
    assert!(matches!(
        unpack(&t, 1, &[0; 7], &mut [0; 16], 4),
        Err(DtypeError::PackedLength {
            got: 7,
            expected: 8
        })
    ));
    // The error tells what origin and length would do.
    let msg = p.pack(&src, 3, 0, &mut out).unwrap_err().to_string();
    assert!(msg.contains("at least 4"), "{msg}");
}

#[test]
fn mpi_examples() {
    // MPI 4.1 section 5.1.7: resized(int, -3, 9) replicated twice.
    let int = Datatype::primitive(4).unwrap();
    let t1 = Datatype::resized(&int, -3, 9).unwrap();
    assert_eq!((t1.lb(), t1.ub(), t1.extent(), t1.size()), (-3, 6, 9, 4));
    let t2 = Datatype::contiguous(2, &t1).unwrap();
    assert_eq!((t2.lb(), t2.ub(), t2.extent()), (-3, 15, 18));
    assert_eq!(t2.flatten(1).unwrap(), [seg(0, 4), seg(9, 4)]);
    // Markers are sticky: a struct holding t1 and data beyond it keeps t1's bounds.
    let s = Datatype::structure(&[1, 1], &[0, 20], &[t1.clone(), int.clone()]).unwrap();
    assert_eq!((s.lb(), s.ub(), s.true_lb(), s.true_ub()), (-3, 6, 0, 24));
    // Vector with a negative stride walks backwards from the origin.
    let v = Datatype::vector(3, 1, -2, &int).unwrap();
    assert_eq!((v.lb(), v.ub(), v.extent()), (-16, 4, 20));
    assert_eq!(v.flatten(1).unwrap(), [seg(0, 4), seg(-8, 4), seg(-16, 4)]);
    // ECIO's test type: blocklens 1, indices 2 apart, MPI_INT.
    let e = Datatype::indexed_block(1, &[0, 2, 4, 6], &int).unwrap();
    assert_eq!(
        e.flatten(1).unwrap(),
        [seg(0, 4), seg(8, 4), seg(16, 4), seg(24, 4)]
    );
    // Subarray: Fortran order, 3-d, with the padded-struct element.
    let elem = Datatype::resized(&int, 0, 8).unwrap();
    let sa = Datatype::subarray(&[4, 3, 2], &[2, 1, 2], &[1, 2, 0], Order::Fortran, &elem).unwrap();
    assert_eq!((sa.size(), sa.lb(), sa.extent()), (16, 0, 4 * 3 * 2 * 8));
    // Elements (1,2,k) and (2,2,k): offsets 8*(i + 4*j + 12*k).
    assert_eq!(
        sa.flatten(1).unwrap(),
        [seg(72, 4), seg(80, 4), seg(168, 4), seg(176, 4)]
    );
    // Contiguous layouts collapse to one segment across counts.
    let c = Datatype::contiguous(1000, &int).unwrap();
    assert!(c.is_contiguous());
    assert_eq!(c.segment_count_hint(7), 1);
    assert_eq!(c.flatten(7).unwrap(), [seg(0, 28_000)]);
}

#[test]
fn deep_nesting() {
    // 200 levels of contiguous(1, ..) around a vector: deep but cheap.
    let mut t = Datatype::vector(3, 1, 2, &Datatype::byte()).unwrap();
    for i in 0..200 {
        t = if i % 2 == 0 {
            Datatype::contiguous(1, &t).unwrap()
        } else {
            Datatype::resized(&t, 0, 6).unwrap()
        };
    }
    assert_eq!(t.depth(), 202);
    let mut c = Cursor::at(&t, 2, 4).unwrap();
    assert!(c.memory_bytes() < 64 * 210);
    assert_eq!(c.by_ref().collect::<Vec<_>>(), [seg(8, 1), seg(10, 1)]);
}

#[test]
fn handles_are_shareable_and_budgets_are_exact() {
    fn send_sync<T: Send + Sync + Clone>() {}
    send_sync::<Datatype>();
    send_sync::<Cursor>();
    send_sync::<Packer>();
    send_sync::<Unpacker>();

    let t = Datatype::hvector(4, 10, 100, &Datatype::byte()).unwrap();
    let mut c = Cursor::new(&t, 1).unwrap();
    assert_eq!(c.next_segment(0), None);
    assert_eq!(c.position(), 0);
    // A budget cuts a segment; the next call continues inside it.
    assert_eq!(c.next_segment(3), Some(seg(0, 3)));
    let mut out = Vec::new();
    assert_eq!(c.next_batch(2, 20, &mut out), 17);
    assert_eq!(out, [seg(3, 7), seg(100, 10)]);
    assert_eq!(c.next_batch(0, 20, &mut out), 0);
    assert_eq!(c.next_batch(5, 0, &mut out), 0);
    assert_eq!(c.position(), 20);
    assert!(matches!(
        Cursor::at(&t, 1, 41),
        Err(DtypeError::PositionOutOfRange { pos: 41, total: 40 })
    ));
    let mut end = Cursor::at(&t, 1, 40).unwrap();
    assert!(end.is_done());
    assert_eq!(end.next(), None);
}
