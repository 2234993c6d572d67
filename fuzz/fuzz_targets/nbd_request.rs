//! Feeds arbitrary bytes to the NBD request decoder, its session checks and the reply
//! planners.
#![no_main]

#[path = "../../crates/ferry-block/fuzz_targets_src/nbd_request.rs"]
mod nbd_request;

libfuzzer_sys::fuzz_target!(|data: &[u8]| nbd_request::nbd_request(data));
