//! What an export is stored on: the [`Backend`] trait and its three implementations, a
//! regular file or a block device ([`file::FileBackend`]) and memory
//! ([`memory::MemoryBackend`], sparse, for benchmarks). Backends are shared by every
//! connection to the export and called from many threads at once.

use std::io;

use crate::nbd::consts;
pub use crate::nbd::reply::Extent;

pub mod file;
pub mod memory;

/// How a WRITE_ZEROES may be carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zeroing {
    /// `NBD_CMD_FLAG_NO_HOLE` was clear: punching a hole is allowed.
    pub may_trim: bool,
    /// `NBD_CMD_FLAG_FAST_ZERO`: fail with `ENOTSUP` (and change nothing) rather than
    /// write zeroes at the speed of a WRITE.
    pub fast: bool,
    /// `NBD_CMD_FLAG_FUA`: durable before returning.
    pub fua: bool,
}

/// Storage behind one export. Ranges passed in are already checked against [`size`]
/// (and the export's alignment) by the protocol core.
///
/// [`size`]: Backend::size
pub trait Backend: Send + Sync + 'static {
    /// Size in bytes.
    fn size(&self) -> u64;

    /// Smallest addressable unit that requests must align to (1: any byte).
    fn min_block(&self) -> u32 {
        1
    }

    /// Size at which requests are efficient (advertised in `NBD_INFO_BLOCK_SIZE`).
    fn preferred_block(&self) -> u32 {
        4096
    }

    /// Whether a FLUSH through one connection covers writes made through every other
    /// (true when all connections share one file handle or one memory).
    fn multi_conn(&self) -> bool {
        true
    }

    /// Fills `buf` from `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// Writes `buf` at `offset`; with `fua`, durable before returning.
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()>;

    /// Makes every write that has returned durable.
    fn flush(&self) -> io::Result<()>;

    /// Discards a range where the storage can (a hint: unsupported is not an error).
    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()>;

    /// Makes a range read as zeroes ([`Zeroing`] says how).
    fn write_zeroes(&self, offset: u64, len: u64, how: Zeroing) -> io::Result<()>;

    /// The allocation of the range from `offset`, in order; may stop short of `len` (the
    /// caller treats the rest as allocated data).
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>>;

    /// Reads a range ahead into a cache where there is one.
    fn cache(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
}

/// The error a fast-zero request gets when zeroing would be as slow as writing.
pub fn not_fast() -> io::Error {
    io::Error::from_raw_os_error(rustix::io::Errno::OPNOTSUPP.raw_os_error())
}

/// The NBD error value for a backend error (the specification's short list: EDQUOT and
/// EFBIG are reported as ENOSPC, anything unlisted as EIO).
pub fn nbd_errno(e: &io::Error) -> u32 {
    use rustix::io::Errno;
    let Some(raw) = e.raw_os_error() else {
        return consts::EIO;
    };
    match Errno::from_raw_os_error(raw) {
        Errno::PERM | Errno::ACCESS | Errno::ROFS => consts::EPERM,
        Errno::NOSPC | Errno::DQUOT | Errno::FBIG => consts::ENOSPC,
        Errno::INVAL => consts::EINVAL,
        Errno::NOMEM => consts::ENOMEM,
        Errno::OPNOTSUPP => consts::ENOTSUP,
        Errno::OVERFLOW => consts::EOVERFLOW,
        _ => consts::EIO,
    }
}

/// Whether a failed `fallocate` means "this storage cannot do that" (as opposed to an
/// I/O error): the caller falls back to another way.
pub(crate) fn unsupported(e: &io::Error) -> bool {
    use rustix::io::Errno;
    e.raw_os_error().is_some_and(|raw| {
        matches!(
            Errno::from_raw_os_error(raw),
            Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL
        )
    })
}
