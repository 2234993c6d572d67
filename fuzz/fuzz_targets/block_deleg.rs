//! Feeds arbitrary bytes to the block fabric protocol's decoder and the chunk check.
#![no_main]

#[path = "../../crates/ferry-block/fuzz_targets_src/block_deleg.rs"]
mod block_deleg;

libfuzzer_sys::fuzz_target!(|data: &[u8]| block_deleg::block_deleg(data));
