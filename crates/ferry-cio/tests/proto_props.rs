//! Property tests of the collective I/O codec: the frames round-trip, and the decoder (the
//! fuzz target body) never panics on arbitrary or damaged bytes.

#[path = "../fuzz_targets_src/cio_frame.rs"]
mod cio_frame;

use ferry_cio::proto::{self, Desc, Msg, MAX_INLINE};
use ferry_cio::ErrorClass;
use proptest::prelude::*;

/// A frame and its payload bytes.
fn frame() -> impl Strategy<Value = (Msg, Vec<u8>)> {
    let payload = proptest::collection::vec(any::<u8>(), 0..=1024);
    prop_oneof![
        (any::<u64>(), payload.clone()).prop_map(|(offset, p)| (
            Msg::WriteAtAllInline {
                offset,
                len: p.len() as u32
            },
            p
        )),
        (any::<u64>(), payload.clone()).prop_map(|(offset, p)| (
            Msg::WriteAtInline {
                offset,
                len: p.len() as u32
            },
            p
        )),
        payload.clone().prop_map(|p| (
            Msg::Data {
                len: p.len() as u32
            },
            p
        )),
        payload.prop_map(|p| (
            Msg::DataDone {
                len: p.len() as u32
            },
            p
        )),
        (any::<u64>(), any::<u64>())
            .prop_map(|(offset, len)| (Msg::WriteAtAll { offset, len }, Vec::new())),
        (
            any::<i64>(),
            proptest::collection::vec(any::<u8>(), 0..64),
            any::<[u8; 32]>()
        )
            .prop_map(|(disp, e, h)| (
                Msg::SetView {
                    disp,
                    etype: Desc::Inline(e),
                    filetype: Desc::Hash(h),
                },
                Vec::new()
            )),
        ".{0,40}".prop_map(|message| (
            Msg::Error {
                class: ErrorClass::Arg,
                message
            },
            Vec::new()
        )),
    ]
}

fn bytes(msg: &Msg, payload: &[u8]) -> Vec<u8> {
    let mut v = proto::to_vec(msg).unwrap();
    v.extend_from_slice(payload);
    v
}

proptest! {
    #[test]
    fn frames_round_trip((msg, payload) in frame()) {
        let v = bytes(&msg, &payload);
        let (got, p) = proto::decode(&v).unwrap();
        prop_assert_eq!(&got, &msg);
        prop_assert_eq!(p, &payload[..]);
        cio_frame::cio_frame(&v);
    }

    #[test]
    fn damaged_frames_never_panic(
        (msg, payload) in frame(),
        at in any::<usize>(),
        to in any::<u8>(),
        cut in any::<usize>(),
    ) {
        let mut v = bytes(&msg, &payload);
        let i = at % v.len();
        v[i] = to;
        cio_frame::cio_frame(&v);
        v.truncate(cut % (v.len() + 1));
        cio_frame::cio_frame(&v);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        cio_frame::cio_frame(&data);
    }
}

/// The largest inline write decodes; one byte more does not.
#[test]
fn the_inline_limit_is_exact() {
    let at = vec![5u8; MAX_INLINE];
    let msg = Msg::WriteAtAllInline {
        offset: 0,
        len: MAX_INLINE as u32,
    };
    cio_frame::cio_frame(&bytes(&msg, &at));
    assert!(proto::decode(&bytes(&msg, &at)).is_ok());
    let mut over = bytes(&msg, &at);
    over.push(5);
    let n = over.len() as u32;
    over[..4].copy_from_slice(&n.to_le_bytes());
    assert!(proto::decode(&over).is_err());
    cio_frame::cio_frame(&over);
}
