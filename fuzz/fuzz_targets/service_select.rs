//! Feeds arbitrary bytes to the floor's service-selection decoder.
#![no_main]

#[path = "../../crates/ferry-service/fuzz_targets_src/service_select.rs"]
mod service_select;

libfuzzer_sys::fuzz_target!(|data: &[u8]| service_select::service_select(data));
