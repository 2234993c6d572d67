//! Memory-to-memory mode: a zero source and a null sink, so a copy exercises the network
//! path and the per-block CRC-32C without reading or writing any file (the GridFTP habit of
//! `/dev/zero` → `/dev/null` tests).
//!
//! - Client side: the source `zero:SIZE` (e.g. `zero:4G`) sends SIZE zero bytes; the sink
//!   `null:` (or `/dev/null`) receives and discards.
//! - Server side (`ferry serve --mem`, config `mem = true`): a virtual root [`MEM_ROOT`]
//!   holding `mem/zero/SIZE` (read-only, SIZE zero bytes) and `mem/null` (write-only,
//!   discards what is PUT to it).
//!
//! What is checked: every block's CRC-32C, computed by the sender over the bytes it sends
//! and verified by the receiver over the bytes it received (bad blocks are fetched again as
//! for files). No BLAKE3 runs when the sink is null (nothing is kept to hash); when a zero
//! source lands in a real file, the whole-file BLAKE3 of what was written is compared with
//! the BLAKE3 of SIZE zero bytes.

use ferry_service::config::parse_size;

/// The name of the server's virtual root when memory mode is on.
pub const MEM_ROOT: &str = "mem";

/// A virtual path under [`MEM_ROOT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Virtual {
    /// `mem` itself (a directory holding `zero` and `null`).
    Root,
    /// `mem/zero` (a directory: name a size under it).
    ZeroDir,
    /// `mem/zero/SIZE`: SIZE zero bytes, read-only.
    Zero(u64),
    /// `mem/null`: a write-only sink.
    Null,
}

/// Classifies `path` if it lies under [`MEM_ROOT`]: `None` if it names another root,
/// `Some(Err(message))` if it is under `mem` but names nothing there.
pub fn classify(path: &str) -> Option<std::result::Result<Virtual, String>> {
    let path = path.trim_end_matches('/');
    let (root, rel) = path.split_once('/').unwrap_or((path, ""));
    if root != MEM_ROOT {
        return None;
    }
    Some(match rel.split_once('/').unwrap_or((rel, "")) {
        ("", "") => Ok(Virtual::Root),
        ("zero", "") => Ok(Virtual::ZeroDir),
        ("zero", size) => parse_size(size)
            .ok()
            .map(Virtual::Zero)
            .ok_or_else(|| format!("{path}: name a size, e.g. mem/zero/4G")),
        ("null", _) => Ok(Virtual::Null),
        _ => Err(format!(
            "{path}: the memory root holds only zero/SIZE and null"
        )),
    })
}

/// BLAKE3 of `size` zero bytes (what a zero source's data hashes to).
pub fn zero_hash(size: u64) -> [u8; 32] {
    let never = std::sync::atomic::AtomicBool::new(false);
    zero_hash_unless(size, &never).unwrap_or_default()
}

/// [`zero_hash`], given up (`None`) soon after `stop` is set: a terabyte of zeros takes
/// minutes, and nobody needs the hash of an upload that was abandoned.
pub fn zero_hash_unless(size: u64, stop: &std::sync::atomic::AtomicBool) -> Option<[u8; 32]> {
    // BLAKE3 numbers its chunks, so equal runs of zeros hash differently by position: there
    // is no shortcut, only the work.
    let zeros = vec![0u8; 1 << 20];
    let mut h = blake3::Hasher::new();
    let mut left = size;
    while left > 0 {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let n = left.min(zeros.len() as u64) as usize;
        h.update(&zeros[..n]);
        left -= n as u64;
    }
    Some(*h.finalize().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(classify("data/x"), None);
        assert_eq!(classify("memory/x"), None);
        assert_eq!(classify("mem"), Some(Ok(Virtual::Root)));
        assert_eq!(classify("mem/zero/"), Some(Ok(Virtual::ZeroDir)));
        assert_eq!(classify("mem/zero/1M"), Some(Ok(Virtual::Zero(1 << 20))));
        assert_eq!(classify("mem/null"), Some(Ok(Virtual::Null)));
        assert_eq!(classify("mem/null/anything"), Some(Ok(Virtual::Null)));
        assert!(matches!(classify("mem/zero/lots"), Some(Err(_))));
        assert!(matches!(classify("mem/other"), Some(Err(_))));
    }

    #[test]
    fn zero_hash_matches_a_buffer_of_zeros() {
        let n = (3 << 20) + 17;
        assert_eq!(zero_hash(n), *blake3::hash(&vec![0; n as usize]).as_bytes());
    }
}
