//! Fuzz target body for the datatype description decoder ([`Datatype::decode`]).
//!
//! Wired into the cargo-fuzz project as
//! `fuzz_target!(|data: &[u8]| dtype_desc::dtype_desc(data));`
//! (`tests/desc.rs` compiles and runs it in the normal test suite).

use ferry_dtype::{Cursor, Datatype};

/// Checks one input: the decoder never panics; whatever it accepts re-encodes to exactly
/// the same bytes (it accepts only canonical descriptions), nests at most
/// `desc::MAX_DEPTH` levels, and can be walked (the first segments of two instances).
pub fn dtype_desc(data: &[u8]) {
    let Ok(t) = Datatype::decode(data) else {
        return;
    };
    assert!(t.depth() <= ferry_dtype::desc::MAX_DEPTH);
    assert_eq!(
        t.encode(),
        data,
        "decoder accepted a non-canonical description"
    );
    if let Ok(c) = Cursor::new(&t, 2) {
        let mut stream = 0u64;
        for s in c.take(1000) {
            stream = stream.checked_add(s.len).expect("a walk's length fits u64");
        }
        assert!(stream <= t.size().saturating_mul(2));
    }
}
