//! The one BLAKE3 of a file (or of a range of it) that every part of ferry uses: the sender
//! before FILE_DONE, the receiver after blocks arrived out of order, the client comparing a
//! local file with the server's SUM.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Test and measurement switch: with `FERRY_TEST_NO_CHECKSUMS=1` in its environment a
/// process computes no CRC-32C for the blocks it sends (it sends 0) and checks none it
/// receives, and a server's GET and SUM compute no BLAKE3 (FILE_DONE without HASH): the
/// cost of integrity is the difference against the same transfer without it
/// (`ferry bench cp`'s `checksum_cost`). Only for a receiver that keeps nothing (`null:`,
/// `mem/null`): one writing a file still checks its whole-file hash and fails. Never set in
/// normal use.
pub fn checksums_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| {
        let off = std::env::var("FERRY_TEST_NO_CHECKSUMS").is_ok_and(|v| v == "1");
        if off {
            tracing::warn!("FERRY_TEST_NO_CHECKSUMS=1: blocks and files are not checked");
        }
        off
    })
}

/// Bytes read per `pread` while hashing.
const READ: usize = 1 << 20;

/// Feeds `len` bytes of `file` from `offset` into `h`, reading through `buf` (grown on first
/// use to the range, at most 1 MiB, so a caller hashing range after range allocates it once).
/// A small file gets a small buffer: a fresh zeroed 1 MiB per 64 KiB file cost the client of
/// a small-files copy ten times its CPU (a mapping, 256 page faults and an unmap per file).
pub fn hash_range(
    file: &File,
    offset: u64,
    len: u64,
    h: &mut blake3::Hasher,
    buf: &mut Vec<u8>,
) -> std::io::Result<()> {
    let want = usize::try_from(len).unwrap_or(usize::MAX).clamp(1, READ);
    if buf.len() < want {
        buf.resize(want, 0);
    }
    let mut pos = 0u64;
    while pos < len {
        let n = (len - pos).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], offset + pos)?;
        h.update(&buf[..n]);
        pos += n as u64;
    }
    Ok(())
}

/// BLAKE3 of the first `size` bytes of `file`.
pub fn hash_file(file: &File, size: u64) -> std::io::Result<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    hash_range(file, 0, size, &mut h, &mut Vec::new())?;
    Ok(*h.finalize().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranges hashed one after the other give the hash of the whole; a file shorter than
    /// asked is an error, not a short hash.
    #[test]
    fn ranges_compose_and_short_files_fail() {
        let p = std::env::temp_dir().join(format!("ferry-hash-{}", std::process::id()));
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let f = File::open(&p).unwrap();
        assert_eq!(
            hash_file(&f, data.len() as u64).unwrap(),
            *blake3::hash(&data).as_bytes()
        );
        let mut h = blake3::Hasher::new();
        let mut buf = Vec::new();
        hash_range(&f, 0, 1_500_001, &mut h, &mut buf).unwrap();
        hash_range(&f, 1_500_001, 1_499_999, &mut h, &mut buf).unwrap();
        assert_eq!(h.finalize(), blake3::hash(&data));
        assert!(hash_file(&f, data.len() as u64 + 1).is_err());
        let _ = std::fs::remove_file(&p);
    }
}
