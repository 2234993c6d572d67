//! What an export is stored on: the [`Backend`] trait and its three implementations, a
//! regular file or a block device ([`file::FileBackend`]) and memory
//! ([`memory::MemoryBackend`], sparse, for benchmarks). Backends are shared by every
//! connection to the export and called from many threads at once.

use std::io::{self, IoSlice};
use std::os::fd::BorrowedFd;
use std::sync::Arc;

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

    /// Whether every read is served from memory, never waiting for a disk (a server may
    /// then serve reads on the thread that reads requests).
    fn in_memory(&self) -> bool {
        false
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

    /// The range `[offset, offset + len)` as the storage's own memory, pinned without a
    /// lock, so a reply is written straight from it (no copy into a reply buffer, no lock
    /// held across the socket write); `None` where the storage has no such memory (the
    /// caller then reads into a buffer with [`Backend::read_at`]).
    fn read_shared(&self, _offset: u64, _len: usize) -> Option<SharedRead> {
        None
    }

    /// The file a read of `[offset, offset + len)` may be sent from with `sendfile(2)`
    /// (the page cache's pages go to the socket, no copy through a user buffer): `None`
    /// where the storage is no such file or bypasses the page cache (`O_DIRECT`);
    /// `Some(Err)` when the range is no longer all there (a file truncated under the
    /// export), which the caller answers with an error before it sends any header.
    fn send_source(&self, _offset: u64, _len: u64) -> Option<io::Result<BorrowedFd<'_>>> {
        None
    }
}

/// A page of memory a backend shares with readers: a writer to a page a reader still
/// holds writes a copy (`Arc::make_mut`), so a reader's bytes never change under it.
pub type SharedPage = Arc<Vec<u8>>;

/// Zeroes to send for the parts of a [`SharedRead`] that are holes.
static ZEROES: [u8; 64 * 1024] = [0; 64 * 1024];

/// One run of a [`SharedRead`]: bytes of a page, or zeroes.
#[derive(Debug, Clone)]
enum Segment {
    Page {
        page: SharedPage,
        start: usize,
        len: usize,
    },
    Zero(usize),
}

impl Segment {
    fn len(&self) -> usize {
        match self {
            Segment::Page { len, .. } | Segment::Zero(len) => *len,
        }
    }
}

/// A range of an export read as shared pages (see [`Backend::read_shared`]): what the
/// range held when it was read, kept alive by reference counts while a reply is sent.
#[derive(Debug, Clone, Default)]
pub struct SharedRead {
    segments: Vec<Segment>,
    len: usize,
}

impl SharedRead {
    /// Appends `len` bytes of `page` from `start` (clamped to the page).
    pub fn push_page(&mut self, page: SharedPage, start: usize, len: usize) {
        let start = start.min(page.len());
        let len = len.min(page.len() - start);
        self.len += len;
        self.segments.push(Segment::Page { page, start, len });
    }

    /// Appends `len` bytes of zeroes (a hole), merged with zeroes before them.
    pub fn push_zeroes(&mut self, len: usize) {
        self.len += len;
        if let Some(Segment::Zero(n)) = self.segments.last_mut() {
            *n += len;
        } else {
            self.segments.push(Segment::Zero(len));
        }
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes are held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The allocation of the range: zeroes as holes, pages as data (what a structured
    /// read's plan and a block status need, with no second look at the storage).
    pub fn extents(&self) -> Vec<Extent> {
        let mut out: Vec<Extent> = Vec::new();
        for s in &self.segments {
            let hole = matches!(s, Segment::Zero(_));
            let len = s.len() as u64;
            match out.last_mut() {
                Some(last) if last.hole == hole => last.len += len,
                _ => out.push(Extent {
                    len,
                    hole,
                    zero: hole,
                }),
            }
        }
        out
    }

    /// The bytes `[from, from + len)` of the range (clamped to it) as slices for one
    /// vectored write.
    pub fn slices(&self, from: usize, len: usize) -> Vec<IoSlice<'_>> {
        let mut out = Vec::new();
        let end = from.saturating_add(len).min(self.len);
        let mut at = 0usize;
        for s in &self.segments {
            let (lo, hi) = (at.max(from), (at + s.len()).min(end));
            if lo < hi {
                let (skip, n) = (lo - at, hi - lo);
                match s {
                    Segment::Page { page, start, .. } => {
                        out.push(IoSlice::new(&page[start + skip..start + skip + n]));
                    }
                    Segment::Zero(_) => push_zero_slices(&mut out, n),
                }
            }
            at += s.len();
            if at >= end {
                break;
            }
        }
        out
    }
}

/// Slices of [`ZEROES`] adding up to `n` bytes.
fn push_zero_slices<'a>(out: &mut Vec<IoSlice<'a>>, mut n: usize) {
    while n > 0 {
        let k = n.min(ZEROES.len());
        out.push(IoSlice::new(&ZEROES[..k]));
        n -= k;
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
