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

/// Files at least this large are written with direct I/O without being asked, where it
/// helps ([`direct_helps`]). Smaller ones gain nothing from skipping the page cache (their
/// writes return at memory speed and their one fsync flushes them).
pub const AUTO_DIRECT_MIN: u64 = 64 << 20;

/// Filesystems on a block device where direct I/O is known to work and to help: ext2/3/4,
/// XFS, Btrfs, F2FS (`statfs` magic numbers).
const DIRECT_FILESYSTEMS: [u64; 4] = [0xef53, 0x5846_5342, 0x9123_683e, 0xf2f5_2010];

/// Whether a file of `size` bytes landing in `file` is better written with direct I/O when
/// no one asked for it: a large file on a disk filesystem. Through the page cache such a
/// file's every byte is copied into it, the kernel's flusher and the checkpoints' fsyncs
/// write it out behind the copy, and the cache fills with pages no one reads again (on this
/// machine's ext4: half the rate of direct I/O at three times the CPU). A memory filesystem
/// (tmpfs) is its page cache, and on an unknown one (a network or FUSE filesystem) direct
/// I/O may be refused or slow: both stay buffered.
pub fn direct_helps(file: &std::fs::File, size: u64) -> bool {
    size >= AUTO_DIRECT_MIN
        && rustix::fs::fstatfs(file).is_ok_and(|s| DIRECT_FILESYSTEMS.contains(&(s.f_type as u64)))
}

/// Whether a file of `size` bytes is better read with direct I/O from `offset` on when no
/// one asked for it: a large file on a disk filesystem ([`direct_helps`]) whose page there
/// is not in the page cache. A file read or written lately is served from the cache at
/// memory speed, and direct I/O would go to the disk for it; one that is not cached comes
/// from the disk either way, and through the page cache every byte is copied once more and
/// evicts pages someone may want (on this machine's ext4: 10–15 % of the rate, and a third
/// of the server's CPU per byte).
pub fn direct_read_helps(file: &std::fs::File, size: u64, offset: u64) -> bool {
    direct_helps(file, size) && !cached(file, offset)
}

/// Whether the page of `file` at `offset` is in the page cache: a read that may not wait
/// for the disk (`RWF_NOWAIT`) succeeds only from there. A filesystem that cannot tell
/// (the read refused for another reason) counts as cached, so nothing changes there.
pub fn cached(file: &std::fs::File, offset: u64) -> bool {
    use rustix::io::{preadv2, Errno, ReadWriteFlags};
    let mut page = [0u8; DIRECT_ALIGN];
    let at = offset - offset % DIRECT_ALIGN as u64;
    let probe = preadv2(
        file,
        &mut [std::io::IoSliceMut::new(&mut page)],
        at,
        ReadWriteFlags::NOWAIT,
    );
    !matches!(probe, Err(Errno::AGAIN))
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
