//! Compiles the fuzz target body and runs it on a seed corpus and random inputs, so it stays
//! buildable and meaningful between fuzzing campaigns.

#[path = "../fuzz_targets_src/exs_frame.rs"]
mod exs_frame;

use ferry_exs::proto::wire::{self, Frame};
use ferry_exs::proto::RemoteSlice;
use proptest::prelude::*;

fn frame(f: Frame, credits: u16, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    wire::encode(&f, credits, payload.len(), &mut b);
    b.extend_from_slice(payload);
    b
}

#[test]
fn seed_corpus() {
    let remote = RemoteSlice {
        addr: 4096,
        len: 10,
        key: 3,
    };
    let imm = RemoteSlice {
        addr: 0,
        len: 3,
        key: 0,
    };
    let mut layout = Vec::new();
    ferry_exs::proto::WireLayout::new(2, 5, vec![(1, 3)], 10)
        .expect("fits")
        .encode(&mut layout);
    let corpus = [
        vec![],
        vec![0xff],
        frame(Frame::Credit, 1, &[]),
        [
            vec![1],
            frame(
                Frame::Advert {
                    id: 1,
                    flags: 0,
                    offset: 0,
                    remote,
                },
                0,
                &[],
            ),
        ]
        .concat(),
        [
            vec![2],
            frame(
                Frame::Advert {
                    id: 1,
                    flags: 1,
                    offset: 0,
                    remote: imm,
                },
                0,
                b"abc",
            ),
        ]
        .concat(),
        // A peer's noncontiguous message (EXS 1.1): two runs of 3 bytes, 5 apart.
        [
            vec![0],
            frame(
                Frame::Advert {
                    id: 1,
                    flags: wire::F_LAYOUT,
                    offset: 0,
                    remote,
                },
                0,
                &layout,
            ),
        ]
        .concat(),
        [
            vec![3],
            frame(
                Frame::PushReq {
                    id: 1,
                    offset: 0,
                    len: 10,
                },
                0,
                &[],
            ),
        ]
        .concat(),
        [
            vec![0],
            frame(
                Frame::Ack {
                    id: 1,
                    len: 0,
                    status: Ok(()),
                },
                1,
                &[],
            ),
        ]
        .concat(),
        [
            vec![0],
            frame(
                Frame::Close {
                    reason: 0,
                    major: 1,
                    minor: 0,
                },
                0,
                &[],
            ),
        ]
        .concat(),
    ];
    for input in corpus {
        exs_frame::exs_frame(&input);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn random_inputs(data in prop::collection::vec(any::<u8>(), 0..256)) {
        exs_frame::exs_frame(&data);
    }
}
