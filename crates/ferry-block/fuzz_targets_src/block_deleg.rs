//! Fuzz target body for the block fabric protocol's decoder (`ferry_block::deleg::proto`)
//! and the server's chunk check: any bytes decode or are refused without a panic, what
//! decodes encodes back to the same bytes, and a request's chunk range is checked against a
//! pool without overflow.
//!
//! Wired into the cargo-fuzz project as
//! `fuzz_target!(|data: &[u8]| block_deleg::block_deleg(data));`
//! (`tests/deleg_props.rs` compiles and runs it in the normal test suite).

use ferry_block::deleg::pool;
use ferry_block::deleg::proto::{decode, encode, Data, Msg};

/// One input.
pub fn block_deleg(data: &[u8]) {
    let Ok(m) = decode(data) else {
        return;
    };
    assert_eq!(
        encode(&m),
        data,
        "a decoded frame encodes back to its bytes"
    );
    if let Msg::Request {
        len,
        data: Data::Chunk { chunk, at },
        ..
    } = m
    {
        for (count, size) in [(0, 4096), (16, 1 << 20), (usize::from(u16::MAX), u32::MAX)] {
            let ok = pool::check(count, size, chunk, at, len).is_ok();
            let inside =
                usize::from(chunk) < count && u64::from(at) + u64::from(len) <= u64::from(size);
            assert_eq!(ok, inside);
        }
    }
}
