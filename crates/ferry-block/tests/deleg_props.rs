//! Property tests of the block fabric protocol: its fuzz target body never panics on
//! arbitrary bytes or on mutations of valid frames; the client's merge plans keep every
//! request and merge only adjacent writes.

#[path = "../fuzz_targets_src/block_deleg.rs"]
mod block_deleg;

use ferry_block::deleg::merge::{self, Limits, Piece};
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

fn piece() -> impl Strategy<Value = Piece> {
    // Small offsets and lengths in 1 KiB units, so that adjacency happens often.
    (prop::bool::weighted(0.85), 0u8..2, 0u64..24, 1u32..6).prop_map(|(write, flags, at, n)| {
        Piece {
            write,
            flags,
            offset: at << 10,
            len: n << 10,
        }
    })
}

proptest! {
    /// Every request is sent once; a merged request is writes of equal flags, each
    /// starting where the one before ends, within the limits; nothing crosses a request
    /// that is not a write.
    #[test]
    fn merge_plans_keep_every_request_and_merge_only_adjacent_writes(
        pieces in proptest::collection::vec(piece(), 0..40),
        max_kib in 1u32..12,
        max_parts in 1usize..6,
    ) {
        let limits = Limits { max_len: max_kib << 10, max_parts };
        let plan = merge::plan(&pieces, limits);
        let mut seen: Vec<usize> = plan.iter().flatten().copied().collect();
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..pieces.len()).collect::<Vec<_>>());
        for run in plan.iter().filter(|r| r.len() > 1) {
            prop_assert!(run.len() <= max_parts);
            let bytes: u64 = run.iter().map(|&k| u64::from(pieces[k].len)).sum();
            prop_assert!(bytes <= u64::from(limits.max_len));
            for pair in run.windows(2) {
                let (a, b) = (pieces[pair[0]], pieces[pair[1]]);
                prop_assert!(a.write && b.write && a.flags == b.flags);
                prop_assert_eq!(a.offset + u64::from(a.len), b.offset);
            }
            // No request that is not a write lies between the run's first and last.
            let (lo, hi) = (run.iter().min().unwrap(), run.iter().max().unwrap());
            prop_assert!((*lo..=*hi).all(|k| pieces[k].write));
        }
        // Requests that are not writes keep their order among the requests.
        let others: Vec<usize> = plan.iter().flatten().copied().filter(|&k| !pieces[k].write).collect();
        prop_assert!(others.windows(2).all(|p| p[0] < p[1]));
    }
}
