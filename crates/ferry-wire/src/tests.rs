use proptest::prelude::*;

use crate::{Cx, Field, Flag, IfFlag, Le, List, Payload, Raw, ReadError, Reader, Str, Writer};

crate::frames! {
    /// A protocol exercising every codec.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Test: u8 {
        /// Integers and arrays.
        Ints = 1 { a: u8 as Le, b: u16 as Le, c: u32 as Le, d: u64 as Le, e: i64 as Le, h: [u8; 4] as Raw },
        /// Strings and lists.
        Lists = 2 { s: String as Str<8>, l: Vec<(u32, String)> as List<(Le, Str<4>), 3> },
        /// Flags.
        Flagged = 3 { more: bool as Flag<1>, t: Option<u64> as IfFlag<2, Le> },
        /// A payload.
        Data = 4 { id: u32 as Le, len: u32 as Payload<100> },
        /// A tuple.
        One = 5 (x: u16 as Le),
        /// Nothing.
        Empty = 6,
    }
}

fn any_test() -> impl Strategy<Value = Test> {
    prop_oneof![
        (
            any::<u8>(),
            any::<u16>(),
            any::<u32>(),
            any::<u64>(),
            any::<i64>(),
            any::<[u8; 4]>()
        )
            .prop_map(|(a, b, c, d, e, h)| Test::Ints { a, b, c, d, e, h }),
        (
            "[a-z]{0,8}",
            prop::collection::vec((any::<u32>(), "[a-z]{0,4}"), 0..=3)
        )
            .prop_map(|(s, l)| Test::Lists { s, l }),
        (any::<bool>(), any::<Option<u64>>()).prop_map(|(more, t)| Test::Flagged { more, t }),
        (any::<u32>(), 0u32..=100).prop_map(|(id, len)| Test::Data { id, len }),
        any::<u16>().prop_map(Test::One),
        Just(Test::Empty),
    ]
}

/// Encodes with a 2-byte header (code, flags) and the payload (`len` bytes of 7) appended.
fn frame(t: &Test) -> Vec<u8> {
    let mut out = vec![t.code(), 0];
    let mut cx = Cx::default();
    t.encode_body(&mut Writer::new(&mut out), &mut cx).unwrap();
    out[1] = cx.flags;
    out.resize(out.len() + cx.payload_len, 7);
    out
}

fn unframe(b: &[u8]) -> Result<(Test, &[u8]), ReadError> {
    let mut r = Reader::new(b);
    let (code, flags) = (r.u8()?, r.u8()?);
    if flags & !Test::flags_allowed(code) != 0 {
        return Err(ReadError::Invalid("flags"));
    }
    let mut cx = Cx {
        flags,
        ..Cx::default()
    };
    let t = Test::decode_body(code, &mut r, &mut cx)?;
    r.finish()?;
    Ok((t, cx.payload))
}

proptest! {
    #[test]
    fn round_trips_within_bounds(t in any_test()) {
        let b = frame(&t);
        let (min, max) = Test::body_bounds(t.code()).unwrap();
        prop_assert!((min..=max).contains(&(b.len() - 2)), "{} not in {min}..={max}", b.len() - 2);
        let (back, payload) = unframe(&b).unwrap();
        prop_assert_eq!(&back, &t);
        if let Test::Data { len, .. } = t {
            prop_assert_eq!(payload.len(), len as usize);
        }
    }

    #[test]
    fn never_panics_and_reads_within_the_input(b in prop::collection::vec(any::<u8>(), 0..64)) {
        if let Ok((t, payload)) = unframe(&b) {
            // Whatever decodes re-encodes to the same bytes: the decoder is canonical.
            let again = frame(&t);
            let body = b.len() - payload.len();
            prop_assert_eq!(again.len(), b.len());
            prop_assert_eq!(&again[..body], &b[..body]);
        }
    }

    #[test]
    fn reader_takes_what_it_returns(b in prop::collection::vec(any::<u8>(), 0..40), n in 0usize..48) {
        let mut r = Reader::new(&b);
        match r.take(n) {
            Ok(head) => {
                prop_assert_eq!(head, &b[..n]);
                prop_assert_eq!(r.remaining(), b.len() - n);
            }
            Err(e) => {
                prop_assert_eq!(e, ReadError::Short);
                prop_assert_eq!(r.remaining(), b.len(), "a failed read consumes nothing");
            }
        }
    }

    #[test]
    fn integers_round_trip(a: u8, b: u16, c: u32, d: u64, e: i64) {
        let mut out = Vec::new();
        let mut w = Writer::new(&mut out);
        w.u8(a); w.u16(b); w.u32(c); w.u64(d); w.i64(e);
        prop_assert_eq!(w.len(), 23);
        let mut r = Reader::new(&out);
        prop_assert_eq!((r.u8()?, r.u16()?, r.u32()?, r.u64()?, r.i64()?), (a, b, c, d, e));
        prop_assert!(r.finish().is_ok());
    }
}

#[test]
fn strings_are_bounded_and_utf8() {
    let mut out = Vec::new();
    let mut w = Writer::new(&mut out);
    assert_eq!(w.str_u16("toolong", 3, "name"), Err(crate::TooLong("name")));
    assert!(w.is_empty(), "a refused string writes nothing");
    w.str_u16("abc", 3, "name").unwrap();
    assert_eq!(out, [3, 0, b'a', b'b', b'c']);
    let mut r = Reader::new(&out);
    assert_eq!(
        r.clone().str_u16(2),
        Err(ReadError::TooLong { len: 3, max: 2 })
    );
    assert_eq!(r.str_u16(3), Ok("abc"));
    let bad = [2, 0, 0xff, 0xfe];
    let mut r = Reader::new(&bad);
    assert_eq!(r.str_u16(8), Err(ReadError::NotUtf8));
    assert_eq!(r.remaining(), 4, "a failed read consumes nothing");
    assert_eq!(Reader::new(&[5, 0, 1]).bytes_u16(8), Err(ReadError::Short));
}

#[test]
fn finish_rejects_trailing_bytes() {
    let mut r = Reader::new(&[1, 2, 3]);
    r.u8().unwrap();
    assert_eq!(r.finish(), Err(ReadError::Trailing(2)));
    assert!(Reader::new(&[]).finish().is_ok());
}

#[test]
fn writer_patches_and_undoes() {
    let mut out = vec![9];
    let mut w = Writer::new(&mut out);
    w.u32(0);
    w.zeros(2);
    w.patch_u32(0, 0x0403_0201);
    w.patch_u32(4, 1); // beyond what was written: ignored, never a panic
    assert_eq!(w.len(), 6);
    w.undo();
    assert!(w.is_empty());
    assert_eq!(out, [9]);
}

#[test]
fn bounds_and_flags_come_from_the_table() {
    assert_eq!(Test::CODES, &[1, 2, 3, 4, 5, 6]);
    assert_eq!(Test::body_bounds(1), Some((27, 27)));
    assert_eq!(Test::body_bounds(2), Some((4, 2 + 8 + 2 + 3 * (4 + 2 + 4))));
    assert_eq!(Test::body_bounds(4), Some((4, 104)));
    assert_eq!(Test::body_bounds(6), Some((0, 0)));
    assert_eq!(Test::body_bounds(7), None);
    assert_eq!(Test::flags_allowed(3), 3);
    assert_eq!(Test::flags_allowed(1), 0);
    assert!(Test::carries_payload(4) && !Test::carries_payload(1));
    assert_eq!(<List<Le, 2> as Field<Vec<u64>>>::MAX, 18);
    assert_eq!(Test::One(5).code(), 5);
    assert_eq!(
        Test::decode_body(9, &mut Reader::new(&[]), &mut Cx::default()),
        Err(ReadError::UnknownType)
    );
}

#[test]
fn list_counts_are_bounded() {
    let b = [0, 0, 2, 0, 1, 0, 0, 0, 0, 0];
    let t = Test::decode_body(2, &mut Reader::new(&b), &mut Cx::default());
    assert_eq!(t, Err(ReadError::Short));
    // count 4 > 3
    let b = [0, 0, 4, 0];
    let t = Test::decode_body(2, &mut Reader::new(&b), &mut Cx::default());
    assert_eq!(t, Err(ReadError::TooLong { len: 4, max: 3 }));
}
