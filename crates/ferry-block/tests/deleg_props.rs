//! Property tests of the block fabric protocol: its fuzz target body never panics on
//! arbitrary bytes or on mutations of valid frames.

#[path = "../fuzz_targets_src/block_deleg.rs"]
mod block_deleg;

use ferry_block::deleg::proto::{encode, Cmd, Data, Msg};
use proptest::prelude::*;

fn request() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        any::<u16>(),
        any::<u32>(),
    )
        .prop_map(|(handle, offset, len, chunk, at)| {
            encode(&Msg::Request {
                handle,
                cmd: Cmd::Write,
                flags: 0,
                offset,
                len,
                data: Data::Chunk { chunk, at },
            })
        })
}

proptest! {
    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        block_deleg::block_deleg(&bytes);
    }

    #[test]
    fn mutated_requests(frame in request(), at in any::<usize>(), v in any::<u8>()) {
        block_deleg::block_deleg(&frame);
        let mut m = frame.clone();
        let i = at % m.len();
        m[i] = v;
        block_deleg::block_deleg(&m);
    }
}
