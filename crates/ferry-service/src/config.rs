//! What every face's configuration reads alike: sizes with binary suffixes, and keys that
//! take one value or a list.

use serde::Deserialize;

/// Parses a size: a number of bytes with an optional binary suffix, any case: `K`, `M`,
/// `G`, `T`, also spelled `KiB`… or `KB`… (all powers of 1024), and `B` for bytes; blanks
/// around and between are allowed (`4G`, `512 MiB`, `1000000`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("size {s:?} does not start with a number"))?;
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        u => {
            return Err(format!(
                "size {s:?}: unknown unit {u:?} (use K, M, G or T: powers of 1024)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// A key that takes one string or a list of them (`listen = "tcp://…"` or `listen =
/// ["tcp://…", "ofi+shm://…"]`), for `#[serde(deserialize_with = "one_or_more")]`.
pub fn one_or_more<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMore {
        One(String),
        More(Vec<String>),
    }
    Ok(match OneOrMore::deserialize(d)? {
        OneOrMore::One(a) => vec![a],
        OneOrMore::More(v) => v,
    })
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_binary_suffixes_in_any_spelling() {
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("3kb"), Ok(3072));
        assert!(parse_size("").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("4X").is_err());
        assert!(parse_size("99999999999999T").is_err());
    }
}
