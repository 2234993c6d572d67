//! Feeds arbitrary bytes to the datatype description decoder.
#![no_main]

#[path = "../../crates/ferry-dtype/fuzz_targets_src/dtype_desc.rs"]
mod dtype_desc;

libfuzzer_sys::fuzz_target!(|data: &[u8]| dtype_desc::dtype_desc(data));
