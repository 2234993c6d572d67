//! Feeds arbitrary bytes to the collective I/O frame decoder.
#![no_main]

#[path = "../../crates/ferry-cio/fuzz_targets_src/cio_frame.rs"]
mod cio_frame;

libfuzzer_sys::fuzz_target!(|data: &[u8]| cio_frame::cio_frame(data));
