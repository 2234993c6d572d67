//! Helpers for the codecs' golden-frame tests and decode-speed loops.

/// The bytes of a hex string (two digits a byte), as golden frames are written.
///
/// # Panics
/// On a digit that is not hex: golden frames are test data.
pub fn from_hex(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).expect("hex digits"))
        .collect()
}

/// Two hex digits a byte: how golden frames are written.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decodes every frame `rounds` times with `decode`, and returns nanoseconds per frame.
/// A quick A/B for codec changes (run in release); `black_box` keeps the work from being
/// optimised away.
pub fn ns_per_decode<T>(frames: &[Vec<u8>], rounds: usize, decode: impl Fn(&[u8]) -> T) -> f64 {
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        for f in frames {
            std::hint::black_box(decode(std::hint::black_box(f)));
        }
    }
    start.elapsed().as_nanos() as f64 / (rounds * frames.len()).max(1) as f64
}
