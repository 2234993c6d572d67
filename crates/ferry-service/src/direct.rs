//! Direct I/O (`O_DIRECT`): a second handle on a file that bypasses the page cache, and the
//! alignment rules its transfers follow. Where a filesystem refuses it, callers fall back
//! to the page cache.

use std::sync::atomic::Ordering;

/// Alignment of direct (O_DIRECT) file I/O: memory address, file offset and length. 4096
/// covers the logical block size of every common disk.
pub const DIRECT_ALIGN: usize = 4096;

/// Opens a second handle on the same file that bypasses the page cache (`O_DIRECT`),
/// through `/proc/self/fd`, for reading or for writing. Filesystems without direct I/O
/// refuse it (`EINVAL`).
pub fn open_direct(file: &std::fs::File, write: bool) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// [`open_direct`], or `None` with a warning (once per process) that says why the copy goes
/// through the page cache instead.
pub fn open_direct_or_warn(file: &std::fs::File, write: bool) -> Option<std::fs::File> {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    match open_direct(file, write) {
        Ok(f) => Some(f),
        Err(e) => {
            if !WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "direct I/O (O_DIRECT) refused here ({e}; the filesystem may not support it): going through the page cache"
                );
            }
            None
        }
    }
}

/// Whether a direct transfer of `len` bytes at file offset `pos` from or to address
/// `addr` meets the alignment rules.
pub fn direct_aligned(addr: usize, pos: u64, len: usize) -> bool {
    addr.is_multiple_of(DIRECT_ALIGN)
        && pos.is_multiple_of(DIRECT_ALIGN as u64)
        && len.is_multiple_of(DIRECT_ALIGN)
}
