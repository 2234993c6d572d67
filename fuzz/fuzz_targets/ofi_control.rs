//! Feeds arbitrary bytes to the ofi driver's control-message decoder (CONNECT, ACCEPT,
//! checked-RMA requests, ...), which parses what any process on the fabric may send.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry_fabric::drivers::ofi::fuzz_control(data));
