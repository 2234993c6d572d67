//! Feeds arbitrary bytes to the EXS frame decoder and to a connected EXS state machine.
#![no_main]

#[path = "../../crates/ferry-exs/fuzz_targets_src/exs_frame.rs"]
mod exs_frame;

libfuzzer_sys::fuzz_target!(|data: &[u8]| exs_frame::exs_frame(data));
