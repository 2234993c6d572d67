//! Feeds arbitrary bytes to the native tcp driver's frame decoder, as a byte stream: decode a
//! header, skip its payload, repeat. The decoder must never panic, and what it accepts must
//! re-encode to the same frame.
#![no_main]

use ferry_fabric::drivers::tcp::frame;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Ok(Some((f, n))) = frame::decode(rest) {
        assert!(n <= rest.len());
        let again = f.encode();
        assert_eq!(
            frame::decode(again.as_bytes()),
            Ok(Some((f, again.as_bytes().len())))
        );
        let skip = usize::try_from(f.payload_len()).unwrap_or(usize::MAX);
        rest = rest.get(n.saturating_add(skip)..).unwrap_or(&[]);
    }
});
