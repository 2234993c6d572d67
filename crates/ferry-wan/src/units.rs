//! Parsers for the command line's quantities, in `tc`'s spelling where `tc` has one.

use std::time::Duration;

/// A duration: `30ms`, `1.5s`, `250us`, `0`. A bare number is milliseconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = split_unit(s);
    let scale = match unit {
        "" | "ms" => 1e-3,
        "s" => 1.0,
        "us" => 1e-6,
        "ns" => 1e-9,
        _ => return Err(format!("{s:?}: unknown time unit (use s, ms, us)")),
    };
    let secs = number(s, num)? * scale;
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))
}

/// A rate in bits per second. As in `tc`: `kbit`, `mbit`, `gbit` are bits (decimal
/// prefixes) and `kbps`, `mbps`, `gbps` are bytes per second; `k`, `m`, `g` alone are bits
/// (as in iperf3). A bare number is bits per second.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let (num, unit) = split_unit(s);
    let lower = unit.to_ascii_lowercase();
    let (prefix, bytes) = match lower.strip_suffix("bit") {
        Some(p) => (p, false),
        None => match lower.strip_suffix("bps") {
            Some(p) => (p, true),
            None => (lower.as_str(), false),
        },
    };
    let scale = match prefix {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        _ => return Err(format!("{s:?}: unknown rate unit (use kbit, mbit, gbit)")),
    };
    let bits = number(s, num)? * scale * if bytes { 8.0 } else { 1.0 };
    if bits < 8_000.0 {
        return Err(format!("{s:?}: a rate below 8 kbit/s is not useful"));
    }
    Ok(bits as u64)
}

/// A byte count: `256k`, `4m`, `1g` (binary prefixes; `kb`, `kib` mean the same), or bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let (num, unit) = split_unit(s);
    let lower = unit.to_ascii_lowercase();
    let prefix = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let scale = match prefix {
        "" => 1u64,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        _ => return Err(format!("{s:?}: unknown size unit (use k, m, g)")),
    };
    Ok((number(s, num)? * scale as f64) as u64)
}

/// A probability: `0.1%` or a fraction (`0.001`).
pub fn parse_probability(s: &str) -> Result<f64, String> {
    let p = match s.strip_suffix('%') {
        Some(pct) => number(s, pct)? / 100.0,
        None => number(s, s)?,
    };
    if !(0.0..=1.0).contains(&p) {
        return Err(format!("{s:?}: a probability is between 0 and 100%"));
    }
    Ok(p)
}

fn split_unit(s: &str) -> (&str, &str) {
    let s = s.trim();
    let at = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    s.split_at(at)
}

fn number(whole: &str, num: &str) -> Result<f64, String> {
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{whole:?}: expected a non-negative number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_parse_like_tc() {
        assert_eq!(parse_duration("30ms").unwrap(), Duration::from_millis(30));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_rate("1gbit").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("200mbit").unwrap(), 200_000_000);
        assert_eq!(parse_rate("10mbps").unwrap(), 80_000_000);
        assert_eq!(parse_rate("2.5g").unwrap(), 2_500_000_000);
        assert_eq!(parse_bytes("256k").unwrap(), 256 << 10);
        assert_eq!(parse_bytes("4MiB").unwrap(), 4 << 20);
        assert!((parse_probability("0.1%").unwrap() - 0.001).abs() < 1e-12);
        assert!((parse_probability("0.02").unwrap() - 0.02).abs() < 1e-12);
        for bad in ["fast", "-1ms", "10 parsecs", "1e"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_rate("1furlong").is_err());
        assert!(parse_probability("150%").is_err());
    }
}
