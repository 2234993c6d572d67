//! The datatype description decoder on hostile input: the fuzz target's body run over
//! descriptions of real types, every truncation and single-byte corruption of them, and
//! random bytes, so it stays buildable and meaningful between fuzzing campaigns.

#[path = "../fuzz_targets_src/dtype_desc.rs"]
mod dtype_desc;

use ferry_dtype::{Datatype, Order};
use proptest::prelude::*;

/// Descriptions of types of every constructor, nested and shared.
fn corpus() -> Vec<Vec<u8>> {
    let int = Datatype::primitive(4).unwrap();
    let dbl = Datatype::primitive(8).unwrap();
    let v = Datatype::vector(5, 1, 2, &int).unwrap();
    let r = Datatype::resized(&v, -8, 48).unwrap();
    let s = Datatype::structure(
        &[1, 2, 1],
        &[0, 8, 40],
        &[dbl.clone(), r.clone(), r.clone()],
    )
    .unwrap();
    let types = [
        Datatype::byte(),
        Datatype::contiguous(3, &dbl).unwrap(),
        Datatype::hvector(2, 3, -40, &int).unwrap(),
        Datatype::indexed(&[1, 0, 2], &[4, 1, -2], &r).unwrap(),
        Datatype::hindexed(&[2, 1], &[100, -7], &s).unwrap(),
        Datatype::indexed_block(2, &[0, 5, 9], &v).unwrap(),
        Datatype::hindexed_block(1, &[16, 0], &s).unwrap(),
        Datatype::subarray(&[4, 6], &[2, 3], &[1, 2], Order::Fortran, &s).unwrap(),
        Datatype::from_segments(&[(0, 4).into(), (-16, 2).into()]).unwrap(),
        s,
    ];
    types.iter().map(Datatype::encode).collect()
}

#[test]
fn corpus_truncated_and_corrupted() {
    for good in corpus() {
        dtype_desc::dtype_desc(&good);
        assert!(Datatype::decode(&good).is_ok());
        for cut in 0..good.len() {
            dtype_desc::dtype_desc(&good[..cut]);
        }
        for i in 0..good.len() {
            for b in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut bad = good.clone();
                bad[i] = b;
                dtype_desc::dtype_desc(&bad);
            }
        }
    }
}

proptest! {
    #[test]
    fn random_bytes(data in prop::collection::vec(any::<u8>(), 0..256)) {
        dtype_desc::dtype_desc(&data);
    }

    #[test]
    fn random_tails_after_a_valid_head(i in 0usize..10, tail in prop::collection::vec(any::<u8>(), 0..64)) {
        let mut d = corpus()[i].clone();
        let keep = d.len() / 2;
        d.truncate(keep);
        d.extend(tail);
        dtype_desc::dtype_desc(&d);
    }
}
