//! How sizes read to people, the same in every command: binary units, as the progress bar
//! shows them.

/// Bytes in binary units, one decimal above a KiB: `512 B`, `1.5 KiB`, `4.0 GiB` (the
/// units `ferry cp`'s progress uses).
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::human_size;

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(4 << 30), "4.0 GiB");
        assert_eq!(human_size(u64::MAX), "16.0 EiB");
    }
}
