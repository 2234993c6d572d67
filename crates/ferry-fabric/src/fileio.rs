//! File I/O calls the staging ring needs that safe wrappers do not offer.

use std::os::fd::AsRawFd;

/// Starts writeback of the dirty pages of `file` in `[offset, offset + len)` without
/// waiting for it (`sync_file_range(SYNC_FILE_RANGE_WRITE)`): write-behind, so a later
/// `fdatasync` finds little left to write. Makes nothing durable by itself (no metadata, no
/// device cache flush); a receiver still fsyncs before it journals or renames.
pub fn start_writeback(file: &std::fs::File, offset: u64, len: u64) -> std::io::Result<()> {
    let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(std::io::ErrorKind::InvalidInput.into());
    };
    // SAFETY: a plain system call on a borrowed open descriptor; no memory is passed.
    let r = unsafe { libc::sync_file_range(file.as_raw_fd(), off, n, libc::SYNC_FILE_RANGE_WRITE) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn writeback_of_a_written_range_succeeds_and_bad_ranges_fail() {
        let p = std::env::temp_dir().join(format!("ferry-fileio-{}", std::process::id()));
        let f = std::fs::File::create(&p).unwrap();
        f.write_all_at(&[7u8; 8192], 0).unwrap();
        start_writeback(&f, 0, 8192).unwrap();
        assert!(start_writeback(&f, u64::MAX, 1).is_err(), "offset past i64");
        let _ = std::fs::remove_file(&p);
    }
}
