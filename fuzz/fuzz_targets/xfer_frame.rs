//! Feeds arbitrary bytes to the file-transfer frame decoder.
#![no_main]

#[path = "../../crates/ferry-xfer/fuzz_targets_src/xfer_frame.rs"]
mod xfer_frame;

libfuzzer_sys::fuzz_target!(|data: &[u8]| xfer_frame::xfer_frame(data));
