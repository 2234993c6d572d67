//! Feeds arbitrary bytes to the NBD option decoder and the server handshake.
#![no_main]

#[path = "../../crates/ferry-block/fuzz_targets_src/nbd_option.rs"]
mod nbd_option;

libfuzzer_sys::fuzz_target!(|data: &[u8]| nbd_option::nbd_option(data));
