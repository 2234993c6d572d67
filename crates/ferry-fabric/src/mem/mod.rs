//! Memory that the fabric may touch: buffers, registered regions, local and remote slices.
//!
//! This module and the driver FFI modules are the only places with `unsafe`. The rules it
//! enforces:
//! - a [`Buffer`] is a page-aligned allocation shared by reference count, so an operation in
//!   flight or a registration keeps it alive: memory cannot be freed while registered;
//! - direct `&[u8]`/`&mut [u8]` access is given only to the sole owner of a buffer; anyone else
//!   copies with [`Buffer::read_at`]/[`Buffer::write_at`], because a peer may write concurrently;
//! - a [`MemoryRegion`] drops its driver registration before its memory.

use std::alloc::{self, Layout};
use std::any::Any;
use std::fmt;
use std::ops::{BitOr, Bound, RangeBounds};
use std::ptr::NonNull;
use std::sync::{Arc, Weak};

use crate::error::{FabricError, Result};

mod guard;
use guard::Guard;

const PAGE: usize = 4096;

/// The raw allocation behind a [`Buffer`].
struct RawMem {
    ptr: NonNull<u8>,
    len: usize,
    source: Source,
}

/// Where the memory came from, so it goes back to the same place.
enum Source {
    /// The global allocator (small buffers).
    Heap(Layout),
    /// An anonymous mapping of this many bytes, 2 MiB aligned and eligible for huge pages.
    Map(usize),
    /// A private mapping of a file: `size` bytes from `base` (page aligned, at or before the
    /// buffer's start), its file pages under `guard` (taken off before the unmap).
    File {
        base: usize,
        size: usize,
        guard: Option<Guard>,
    },
    /// [`Buffer::map_file_after`]'s: a head then a file's pages, `size` bytes from `base`;
    /// the file (its own descriptor) and where its bytes start, so a driver can send them
    /// with `sendfile` instead of through the mapping.
    FileAfter {
        base: usize,
        size: usize,
        part: FilePart,
        guard: Option<Guard>,
    },
    /// Memory the caller owns (the C API's `exs_mregister`): never freed here.
    Borrowed,
}

/// The file behind the bytes of a [`Buffer::map_file_after`] buffer from `head` on.
pub struct FilePart {
    /// The file (a descriptor of its own).
    pub file: std::fs::File,
    /// The file offset of the buffer's byte `head`.
    pub offset: u64,
    /// Bytes of the buffer before the file's.
    pub head: usize,
}

/// Buffers at least this large are mapped with transparent huge pages: the kernel then pins
/// (CMA, RDMA registration) and copies (sockets) them with 512× fewer page walks (measured
/// gain: docs/fabric.md, "Driver tuning").
const HUGE: usize = 2 << 20;

// SAFETY: RawMem is a plain allocation; all access goes through the rules in the module
// documentation (exclusive slices only for the sole owner, copies otherwise).
unsafe impl Send for RawMem {}
// SAFETY: as above; shared access never hands out overlapping &mut.
unsafe impl Sync for RawMem {}

impl RawMem {
    fn new(len: usize) -> Self {
        if len >= HUGE {
            if let Some(raw) = Self::map(len) {
                return raw;
            }
        }
        let size = len.max(1).next_multiple_of(PAGE);
        // A layout error here means `len` is near usize::MAX, which no allocation can satisfy.
        let layout = Layout::from_size_align(size, PAGE).expect("buffer size overflows");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        Self {
            ptr,
            len,
            source: Source::Heap(layout),
        }
    }

    /// Maps `len` bytes (rounded up to a page) at a 2 MiB boundary and asks for huge pages.
    /// Only whole 2 MiB extents get huge pages: rounding the size up to 2 MiB instead made a
    /// staging block of 4 MiB plus its 4 KiB head room take three huge pages (6 MiB
    /// resident) once filled. `None` if the kernel refuses; the caller falls back to the heap.
    fn map(len: usize) -> Option<Self> {
        use rustix::mm::{madvise, mmap_anonymous, munmap, Advice, MapFlags, ProtFlags};
        let size = len.checked_next_multiple_of(PAGE)?;
        let span = size.checked_add(HUGE)?;
        // SAFETY: a fresh private anonymous mapping aliases nothing.
        let base = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                span,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .ok()? as usize;
        let start = base.next_multiple_of(HUGE);
        let (head, tail) = (start - base, base + span - (start + size));
        // SAFETY: head and tail are the unused slack of the mapping made above.
        unsafe {
            if head > 0 {
                let _ = munmap(base as *mut _, head);
            }
            if tail > 0 {
                let _ = munmap((start + size) as *mut _, tail);
            }
            // Advisory only: without huge pages the mapping still works.
            let _ = madvise(start as *mut _, size, Advice::LinuxHugepage);
        }
        Some(Self {
            ptr: NonNull::new(start as *mut u8)?,
            len,
            source: Source::Map(size),
        })
    }
}

impl Drop for RawMem {
    fn drop(&mut self) {
        match &mut self.source {
            // SAFETY: ptr came from alloc_zeroed with exactly this layout and is freed once.
            Source::Heap(layout) => unsafe { alloc::dealloc(self.ptr.as_ptr(), *layout) },
            // SAFETY: ptr..ptr+size is the mapping made in `map`, unmapped once.
            Source::Map(size) => unsafe {
                let _ = rustix::mm::munmap(self.ptr.as_ptr().cast(), *size);
            },
            Source::File { base, size, guard }
            | Source::FileAfter {
                base, size, guard, ..
            } => {
                // Unguarded first: once unmapped, the addresses may be mapped again by
                // anyone, and a fault there is not the guard's to answer.
                drop(guard.take());
                // SAFETY: base..base+size is the mapping made in `map_file` or
                // `map_file_after`, unmapped once.
                unsafe {
                    let _ = rustix::mm::munmap(*base as *mut _, *size);
                }
            }
            Source::Borrowed => {}
        }
    }
}

/// Guards the file pages of the mapping `base..base + size`, from `from` to its end
/// ([`guard`]); unmaps the whole mapping if it cannot be guarded.
fn guard_or_unmap((base, size): (usize, usize), from: usize) -> Result<Guard> {
    Guard::new(from, base + size - from).inspect_err(|_| {
        // SAFETY: the caller's fresh mapping, not yet handed to anyone.
        unsafe {
            let _ = rustix::mm::munmap(base as *mut _, size);
        }
    })
}

/// A page-aligned, zero-initialised byte buffer that the fabric can register.
///
/// Cloning shares the same memory. While a buffer is shared (registered, or used by an
/// operation in flight) its bytes are reached by copying; the sole owner may borrow them.
#[derive(Clone)]
pub struct Buffer {
    raw: Arc<RawMem>,
}

impl Buffer {
    /// Allocates `len` zeroed bytes aligned to a page (2 MiB and huge-page backed when large).
    pub fn new(len: usize) -> Self {
        Self {
            raw: Arc::new(RawMem::new(len)),
        }
    }

    /// Maps `len` bytes of `file` from `offset` without reading them: a private, copy-on-write
    /// mapping of the page cache, so the fabric sends straight from it (`exs_sendfile`) and a
    /// write through the buffer never reaches the file.
    ///
    /// If the file is truncated below `offset + len` while the buffer lives, the pages past
    /// its new end read as zeros from the first touch on ([`Buffer::file_torn`] then says
    /// so): a read there raises SIGBUS, which the mapping's guard answers ([`guard`]).
    pub fn map_file(file: &std::fs::File, offset: u64, len: usize) -> Result<Self> {
        use rustix::mm::{mmap, MapFlags, ProtFlags};
        if len == 0 {
            return Ok(Self::new(0));
        }
        let bad = |what: &str| FabricError::InvalidArgument(format!("map_file: {what}"));
        let skew = (offset % PAGE as u64) as usize;
        let size = len
            .checked_add(skew)
            .ok_or_else(|| bad("length overflows"))?;
        // SAFETY: a fresh private mapping aliases no Rust object; it is unmapped in Drop.
        let base = unsafe {
            mmap(
                std::ptr::null_mut(),
                size,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
                file,
                offset - skew as u64,
            )
        }
        .map_err(|e| FabricError::io("mmap file", e.into()))? as usize;
        Ok(Self {
            raw: Arc::new(RawMem {
                ptr: NonNull::new((base + skew) as *mut u8).ok_or_else(|| bad("null mapping"))?,
                len,
                source: Source::File {
                    base,
                    size,
                    guard: Some(guard_or_unmap((base, size), base)?),
                },
            }),
        })
    }

    /// Maps `len` bytes of `file` from `offset` (a multiple of the page size) read-only,
    /// right after `head` writable bytes (at most a page) of anonymous memory: one contiguous
    /// buffer of `head + len` bytes, so a frame's header can go in front of a file's bytes
    /// that are never read into user space: the kernel copies them from the page cache when
    /// it writes the buffer to a socket, or a driver that knows (the native tcp driver with
    /// `FERRY_TCP_SENDFILE=on`, [`Buffer::file_part`]) sends them with `sendfile`. With
    /// `populate` the file's pages are mapped up front (`MAP_POPULATE`): one walk instead of
    /// a fault per few pages, for a buffer whose bytes will be read (a hash, the kernel's
    /// copy); without it, for one whose pages go by `sendfile` and are never touched.
    ///
    /// Only `head` may be written. A file page past the file's end (it was truncated after
    /// the map) fails the kernel's own copy (`sendmsg`: `EFAULT`); read in user space (a
    /// provider's bounce copy, a hash) it reads as zeros from the first such page on, and
    /// [`Buffer::file_torn`] says so ([`guard`]): whoever sends or hashes such a buffer
    /// checks that before trusting what it read.
    pub fn map_file_after(
        file: &std::fs::File,
        offset: u64,
        len: usize,
        head: usize,
        populate: bool,
    ) -> Result<Self> {
        use rustix::mm::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};
        let bad = |what: &str| FabricError::InvalidArgument(format!("map_file_after: {what}"));
        if len == 0 || head > PAGE || !offset.is_multiple_of(PAGE as u64) {
            return Err(bad("empty, unaligned, or head larger than a page"));
        }
        let own = file
            .try_clone()
            .map_err(|e| FabricError::io("duplicate the file's descriptor", e))?;
        let flags = match populate {
            true => MapFlags::PRIVATE | MapFlags::FIXED | MapFlags::POPULATE,
            false => MapFlags::PRIVATE | MapFlags::FIXED,
        };
        let size = len
            .checked_next_multiple_of(PAGE)
            .and_then(|n| n.checked_add(PAGE))
            .ok_or_else(|| bad("length overflows"))?;
        // SAFETY: a fresh private anonymous mapping aliases no Rust object.
        let base = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                size,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .map_err(|e| FabricError::io("mmap head", e.into()))? as usize;
        // SAFETY: MAP_FIXED replaces only pages of the mapping just made (base + PAGE up to
        // base + size), which nothing else refers to.
        let mapped = unsafe {
            mmap(
                (base + PAGE) as *mut _,
                size - PAGE,
                ProtFlags::READ,
                flags,
                file,
                offset,
            )
        };
        if let Err(e) = mapped {
            // SAFETY: the mapping made above, not yet shared.
            unsafe {
                let _ = munmap(base as *mut _, size);
            }
            return Err(FabricError::io("mmap file", e.into()));
        }
        Ok(Self {
            raw: Arc::new(RawMem {
                ptr: NonNull::new((base + PAGE - head) as *mut u8)
                    .ok_or_else(|| bad("null mapping"))?,
                len: head + len,
                source: Source::FileAfter {
                    base,
                    size,
                    part: FilePart {
                        file: own,
                        offset,
                        head,
                    },
                    guard: Some(guard_or_unmap((base, size), base + PAGE)?),
                },
            }),
        })
    }

    /// The file behind the buffer's bytes from [`FilePart::head`] on, if it was made by
    /// [`Buffer::map_file_after`].
    pub fn file_part(&self) -> Option<&FilePart> {
        match &self.raw.source {
            Source::FileAfter { part, .. } => Some(part),
            _ => None,
        }
    }

    /// Whether this buffer maps a file that shrank under it: a read of a page past its new
    /// end faulted, and the pages from there on read as zeros, not as the file. Reads the
    /// mapping had before the fault were the file's.
    pub fn file_torn(&self) -> bool {
        match &self.raw.source {
            Source::File { guard, .. } | Source::FileAfter { guard, .. } => {
                guard.as_ref().is_some_and(Guard::torn)
            }
            _ => false,
        }
    }

    /// A buffer over memory the caller owns and keeps: the C API registers user memory
    /// this way. Nothing is freed when the last handle drops.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be valid for reads and writes and stay allocated until every
    /// handle to the returned buffer (registrations and operations in flight included,
    /// see [`Self::handle_count`]) has been dropped.
    pub unsafe fn from_raw_parts(ptr: NonNull<u8>, len: usize) -> Self {
        Self {
            raw: Arc::new(RawMem {
                ptr,
                len,
                source: Source::Borrowed,
            }),
        }
    }

    /// A new buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        let buf = Self::new(data.len());
        buf.write_at(0, data);
        buf
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.raw.len
    }

    /// True if the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.raw.len == 0
    }

    /// Start address (for registration and virtual-address RMA).
    pub fn addr(&self) -> usize {
        self.raw.ptr.as_ptr() as usize
    }

    /// True if both handles share one allocation.
    pub fn same_memory(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.raw, &other.raw)
    }

    /// How many handles (buffers, regions, operations in flight) share this memory.
    pub fn handle_count(&self) -> usize {
        Arc::strong_count(&self.raw)
    }

    /// The bytes, if this handle is the only one.
    pub fn as_slice(&self) -> Option<&[u8]> {
        (Arc::strong_count(&self.raw) == 1).then(|| {
            // SAFETY: sole handle, so no region or operation can write concurrently.
            unsafe { std::slice::from_raw_parts(self.raw.ptr.as_ptr(), self.raw.len) }
        })
    }

    /// The bytes, mutably, if this handle is the only one.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        (Arc::strong_count(&self.raw) == 1).then(|| {
            // SAFETY: sole handle and &mut self: nobody else can observe the memory.
            unsafe { std::slice::from_raw_parts_mut(self.raw.ptr.as_ptr(), self.raw.len) }
        })
    }

    /// Copies `out.len()` bytes starting at `offset` into `out`. Panics if out of range
    /// (a caller bug, never data from the network).
    pub fn read_at(&self, offset: usize, out: &mut [u8]) {
        self.check(offset, out.len());
        // SAFETY: range checked; the copy may race with a remote write the owner granted,
        // which is the documented RDMA contract and yields at worst mixed old/new bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.raw.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        }
    }

    /// Copies `data` into the buffer at `offset`. Panics if out of range (a caller bug).
    pub fn write_at(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len());
        // SAFETY: range checked; see read_at for the concurrency contract.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.raw.ptr.as_ptr().add(offset),
                data.len(),
            )
        }
    }

    /// Copies `len` bytes from `src` at `src_offset` to this buffer at `offset`, with no
    /// intermediate copy (the ranges may overlap when both handles share one allocation).
    /// This is how layers above pack and unpack between registered regions, which only
    /// their sole owner could borrow. Panics if either range is out of bounds (a caller bug).
    pub fn copy_from(&self, offset: usize, src: &Buffer, src_offset: usize, len: usize) {
        self.check(offset, len);
        src.check(src_offset, len);
        // SAFETY: both ranges checked; `copy` tolerates overlap; the concurrency contract is
        // read_at's and write_at's (a granted remote write may race, mixing old/new bytes).
        unsafe {
            std::ptr::copy(
                src.raw.ptr.as_ptr().add(src_offset),
                self.raw.ptr.as_ptr().add(offset),
                len,
            )
        }
    }

    /// Reads `len` bytes of `file` at `pos` straight into the buffer at `offset` (`pread`
    /// into the memory, no intermediate copy): how a file sender fills a registered staging
    /// block. An early end of file is an `UnexpectedEof` error. Panics if the range is out
    /// of bounds (a caller bug).
    pub fn read_file_at(
        &self,
        offset: usize,
        len: usize,
        file: &std::fs::File,
        pos: u64,
    ) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        self.check(offset, len);
        let mut done = 0usize;
        while done < len {
            let at = i64::try_from(pos + done as u64)
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
            // SAFETY: the range was checked against the allocation; the kernel writes into it
            // like a device would (no Rust reference is formed), with write_at's concurrency
            // contract; `file` is an open descriptor borrowed for the call.
            let n = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    self.raw.ptr.as_ptr().add(offset + done).cast(),
                    len - done,
                    at,
                )
            };
            match n {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                n if n < 0 => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
                n => done += n as usize,
            }
        }
        Ok(())
    }

    /// Runs `f` over `len` bytes at `offset` in place (no copy), e.g. to checksum a received
    /// block. Panics if the range is out of bounds (a caller bug). The view has read_at's
    /// concurrency contract: a remote write the owner granted into the same range while `f`
    /// runs may change the bytes it sees (hold the memory in an operation-free state, as
    /// a completed receive is, to see stable bytes).
    pub fn with_bytes<R>(&self, offset: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        self.check(offset, len);
        // SAFETY: range checked just above; concurrency per the documented contract, the
        // same one drivers rely on when they send from registered memory.
        f(unsafe { self.bytes(offset, len) })
    }

    /// Runs `f` over `len` bytes at `offset`, mutably and in place (no copy): how a block
    /// is encrypted in its staging block before it is sent, or decrypted in its receive
    /// buffer. Panics if the range is out of bounds (a caller bug). The caller holds the
    /// range idle while `f` runs: no operation in flight on it (a staging block not yet
    /// sent, a completed receive not yet posted again) and no other view of it, the
    /// contract `write_at` relies on.
    pub fn with_bytes_mut<R>(
        &self,
        offset: usize,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> R {
        self.check(offset, len);
        // SAFETY: range checked just above; the caller keeps the range idle and unviewed
        // while `f` runs (documented above), so this is its only reference.
        f(unsafe { self.bytes_mut(offset, len) })
    }

    /// Fills the whole buffer with `byte`.
    pub fn fill(&self, byte: u8) {
        // SAFETY: whole allocation; same contract as write_at.
        unsafe { std::ptr::write_bytes(self.raw.ptr.as_ptr(), byte, self.raw.len) }
    }

    /// A copy of the whole contents.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len()];
        self.read_at(0, &mut v);
        v
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset
                .checked_add(len)
                .is_some_and(|end| end <= self.raw.len),
            "range {offset}+{len} outside buffer of {}",
            self.raw.len
        );
    }

    /// Immutable view of a range for a driver sending it.
    ///
    /// # Safety
    /// The range must be in bounds, and the caller must accept that a concurrent remote write
    /// into the same range (granted by the owner) may change the bytes being read.
    pub(crate) unsafe fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        debug_assert!(offset + len <= self.raw.len);
        // SAFETY: per the function contract.
        unsafe { std::slice::from_raw_parts(self.raw.ptr.as_ptr().add(offset), len) }
    }

    /// Mutable view of a range for a driver receiving into it.
    ///
    /// # Safety
    /// The range must be in bounds and no other driver path may write the same range at the
    /// same time (receives and RMA targets are serialised per connection by the drivers).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        debug_assert!(offset + len <= self.raw.len);
        // SAFETY: per the function contract.
        unsafe { std::slice::from_raw_parts_mut(self.raw.ptr.as_ptr().add(offset), len) }
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Buffer({:#x}, {} B)", self.addr(), self.len())
    }
}

/// Rights a registration grants. Local send/receive/RMA-source use is always granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Access(u8);

impl Access {
    /// Local use only: the region can be sent from, received into, and be the local side of RMA.
    pub const LOCAL: Access = Access(0);
    /// Peers may RMA-read the region.
    pub const REMOTE_READ: Access = Access(1);
    /// Peers may RMA-write the region.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Everything.
    pub const ALL: Access = Access(3);

    /// True if every right in `other` is granted here.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// Identifies the domain that made a registration, so regions cannot be mixed across domains.
pub type DomainId = u64;

/// Hands out process-unique domain ids.
pub(crate) fn next_domain_id() -> DomainId {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The driver's side of a registration; dropping it deregisters.
pub(crate) trait Registration: Any + Send + Sync {
    fn as_any(&self) -> &dyn Any;
}

struct RegionInner {
    // Field order matters: the registration is dropped (deregistered) before the memory.
    registration: Box<dyn Registration>,
    buffer: Buffer,
    key: u64,
    access: Access,
    domain: DomainId,
    virt_addr: bool,
}

/// A registered buffer: memory plus the key peers use to reach it.
///
/// Cheap to clone (a shared handle). The registration ends when the last handle is dropped,
/// including the handles held by operations in flight, and only then is the memory released.
#[derive(Clone)]
pub struct MemoryRegion {
    inner: Arc<RegionInner>,
}

impl MemoryRegion {
    pub(crate) fn new(
        buffer: Buffer,
        access: Access,
        key: u64,
        domain: DomainId,
        virt_addr: bool,
        registration: Box<dyn Registration>,
    ) -> Self {
        Self {
            inner: Arc::new(RegionInner {
                registration,
                buffer,
                key,
                access,
                domain,
                virt_addr,
            }),
        }
    }

    /// The registered memory.
    pub fn buffer(&self) -> &Buffer {
        &self.inner.buffer
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.buffer.len()
    }

    /// True if the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The remote key.
    pub fn key(&self) -> u64 {
        self.inner.key
    }

    /// Granted rights.
    pub fn access(&self) -> Access {
        self.inner.access
    }

    /// The domain that registered it.
    pub fn domain(&self) -> DomainId {
        self.inner.domain
    }

    pub(crate) fn registration(&self) -> &dyn Any {
        self.inner.registration.as_any()
    }

    /// A handle that does not keep the registration alive (drivers' key tables).
    pub(crate) fn downgrade(&self) -> WeakRegion {
        WeakRegion {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// A local slice of the region for send, receive or the local side of RMA.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<LocalSlice> {
        let (offset, len) = resolve(range, self.len())?;
        Ok(LocalSlice {
            region: self.clone(),
            offset,
            len,
        })
    }

    /// The whole region as a local slice.
    pub fn full(&self) -> LocalSlice {
        LocalSlice {
            region: self.clone(),
            offset: 0,
            len: self.len(),
        }
    }

    /// Describes a range of the region for a peer (to be sent in a message).
    pub fn remote(&self, range: impl RangeBounds<usize>) -> Result<RemoteSlice> {
        let (offset, len) = resolve(range, self.len())?;
        let base = if self.inner.virt_addr {
            self.buffer().addr() as u64
        } else {
            0
        };
        Ok(RemoteSlice {
            addr: base + offset as u64,
            len: len as u64,
            key: self.key(),
        })
    }
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("buffer", &self.inner.buffer)
            .field("key", &format_args!("{:#x}", self.inner.key))
            .field("access", &self.inner.access)
            .finish()
    }
}

/// A non-owning handle to a [`MemoryRegion`], for drivers that look regions up by key.
#[derive(Clone)]
pub(crate) struct WeakRegion {
    inner: Weak<RegionInner>,
}

impl WeakRegion {
    /// The region, if it is still registered.
    pub(crate) fn upgrade(&self) -> Option<MemoryRegion> {
        self.inner.upgrade().map(|inner| MemoryRegion { inner })
    }

    /// True while the region is registered (without taking a handle to it).
    pub(crate) fn is_live(&self) -> bool {
        self.inner.strong_count() > 0
    }
}

fn resolve(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(FabricError::InvalidArgument(format!(
            "range {start}..{end} outside region of {len} bytes"
        )));
    }
    Ok((start, end - start))
}

/// A range of a local registered region, held by an operation until it completes.
#[derive(Clone, Debug)]
pub struct LocalSlice {
    /// The region.
    pub region: MemoryRegion,
    /// Start within the region.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

impl LocalSlice {
    /// Total length of a gather/scatter list.
    pub fn total(list: &[LocalSlice]) -> u64 {
        list.iter().map(|s| s.len as u64).sum()
    }

    /// Start address of the slice in memory.
    pub fn addr(&self) -> usize {
        self.region.buffer().addr() + self.offset
    }
}

/// A range of a peer's registered region: what one side advertises so the other can RMA it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RemoteSlice {
    /// Virtual address or offset, as the driver's `virt_addr` capability says.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The region's remote key.
    pub key: u64,
}

impl RemoteSlice {
    /// Encoded size on the wire.
    pub const WIRE_LEN: usize = 24;

    /// A sub-range, checked against this slice.
    pub fn sub(&self, offset: u64, len: u64) -> Result<RemoteSlice> {
        let addr = self.addr.checked_add(offset);
        match (offset.checked_add(len), addr) {
            (Some(end), Some(addr)) if end <= self.len => Ok(RemoteSlice {
                addr,
                len,
                key: self.key,
            }),
            _ => Err(FabricError::InvalidArgument(format!(
                "remote range {offset}+{len} outside slice of {} bytes",
                self.len
            ))),
        }
    }

    /// Little-endian wire form: addr, len, key.
    pub fn encode(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.key.to_le_bytes());
        b
    }

    /// Decodes the wire form; `None` if `b` is too short.
    pub fn decode(b: &[u8]) -> Option<RemoteSlice> {
        let word = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        Some(RemoteSlice {
            addr: word(0)?,
            len: word(8)?,
            key: word(16)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_file_in_place_and_views_bytes() {
        let path = std::env::temp_dir().join(format!("ferry-mem-read-{}", std::process::id()));
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let b = Buffer::new(4096 + 100);
        b.read_file_at(100, 4096, &f, 5000).unwrap();
        assert_eq!(b.with_bytes(100, 4096, <[u8]>::to_vec), &data[5000..9096]);
        assert!(b.with_bytes(0, 100, |s| s.iter().all(|x| *x == 0)));
        // Past the end of the file: an error, not a short buffer.
        let e = b.read_file_at(0, 4096, &f, 8000).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        drop(f);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn copy_from_between_and_within_buffers() {
        let a = Buffer::from_slice(b"abcdefgh");
        let b = Buffer::new(8);
        b.copy_from(2, &a, 4, 3);
        assert_eq!(&b.to_vec()[..6], b"\0\0efg\0");
        a.copy_from(1, &a.clone(), 0, 4);
        assert_eq!(a.to_vec(), b"aabcdfgh");
    }

    /// A file's pages after a header: the bytes are the header's then the file's; a file
    /// truncated under the mapping fails the kernel's copy of it (EFAULT), not the process.
    #[test]
    fn a_file_after_a_header_and_a_truncation_under_it() {
        use std::io::Read;
        let path = std::env::temp_dir().join(format!("ferry-map-after-{}", std::process::id()));
        let data: Vec<u8> = (0..3 * PAGE as u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        assert!(
            Buffer::map_file_after(&file, 100, 10, 8, true).is_err(),
            "unaligned"
        );
        assert!(
            Buffer::map_file_after(&file, 0, 10, PAGE + 1, true).is_err(),
            "head too large"
        );
        let b = Buffer::map_file_after(&file, PAGE as u64, 2 * PAGE, 8, true).unwrap();
        b.write_at(0, b"HEADER!!");
        let mut want = b"HEADER!!".to_vec();
        want.extend_from_slice(&data[PAGE..]);
        assert_eq!(b.to_vec(), want);
        // Truncated: writing the buffer to a socket fails once it reaches the lost pages.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(PAGE as u64)
            .unwrap();
        let (a, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
        // SAFETY: the buffer lives; only the kernel reads these bytes (the point of the test).
        let bytes = unsafe { b.bytes(0, b.len()) };
        let mut sent = 0;
        let err = loop {
            match rustix::io::write(&a, &bytes[sent..]) {
                Ok(0) => break None,
                Ok(n) => sent += n,
                Err(e) => break Some(e),
            }
        };
        assert_eq!(err, Some(rustix::io::Errno::FAULT));
        assert!(sent <= 8, "only the header was readable: {sent} bytes went");
        drop(a);
        let mut got = Vec::new();
        peer.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"HEADER!!"[..sent]);
        drop(b);
        std::fs::remove_file(&path).unwrap();
    }

    /// A file truncated under its mappings: reading them in user space (what a provider's
    /// bounce copy or a hash does) gets zeros past the new end instead of SIGBUS killing the
    /// process, and the buffers say they are torn; an untouched or unharmed one does not.
    #[test]
    fn a_read_past_a_truncation_gets_zeros_and_a_torn_buffer_not_sigbus() {
        let path = std::env::temp_dir().join(format!("ferry-map-torn-{}", std::process::id()));
        let data: Vec<u8> = (0..4 * PAGE as u32).map(|i| (i % 251) as u8 | 1).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let after = Buffer::map_file_after(&file, 0, 4 * PAGE, 8, true).unwrap();
        let plain = Buffer::map_file(&file, PAGE as u64, 3 * PAGE).unwrap();
        let kept = Buffer::map_file(&file, 0, PAGE).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(2 * PAGE as u64 + 100)
            .unwrap();
        assert!(!after.file_torn() && !plain.file_torn(), "nothing read yet");
        let got = after.to_vec();
        assert_eq!(&got[8..8 + 2 * PAGE], &data[..2 * PAGE], "the pages kept");
        // The page holding the new end keeps the file's bytes up to it (zeros after).
        assert_eq!(
            &got[8 + 2 * PAGE..8 + 2 * PAGE + 100],
            &data[2 * PAGE..2 * PAGE + 100]
        );
        assert!(
            got[8 + 3 * PAGE..].iter().all(|&b| b == 0),
            "lost pages read as zeros"
        );
        assert!(after.file_torn());
        let got = plain.to_vec();
        assert_eq!(&got[..PAGE], &data[PAGE..2 * PAGE]);
        assert!(got[2 * PAGE..].iter().all(|&b| b == 0));
        assert!(plain.file_torn());
        assert_eq!(kept.to_vec(), &data[..PAGE]);
        assert!(!kept.file_torn(), "a mapping inside the new size is whole");
        drop((after, plain, kept));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn file_mapping_reads_the_file_at_any_offset_and_never_writes_it() {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!("ferry-map-{}", std::process::id()));
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(&data))
            .unwrap();
        let file = std::fs::File::open(&path).unwrap();
        for (off, len) in [
            (0usize, 20_000usize),
            (5_000, 100),
            (4_096, 4_096),
            (19_999, 1),
        ] {
            let b = Buffer::map_file(&file, off as u64, len).unwrap();
            assert_eq!(b.to_vec(), &data[off..off + len]);
            b.write_at(0, &[0xff]);
        }
        assert!(Buffer::map_file(&file, 0, 0).unwrap().is_empty());
        assert_eq!(
            std::fs::read(&path).unwrap(),
            data,
            "private mapping leaked a write"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn borrowed_memory_is_used_in_place_and_not_freed() {
        let mut backing = vec![3u8; 64];
        let ptr = NonNull::new(backing.as_mut_ptr()).unwrap();
        // SAFETY: `backing` outlives `b`, which is dropped at the end of this block.
        let b = unsafe { Buffer::from_raw_parts(ptr, 64) };
        b.write_at(10, &[9]);
        assert_eq!(b.to_vec()[..11], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 9]);
        drop(b);
        assert_eq!(backing[10], 9);
    }

    #[test]
    fn buffer_is_aligned_zeroed_and_exclusive_only_when_unique() {
        let mut b = Buffer::new(10_000);
        assert_eq!(b.addr() % PAGE, 0);
        assert!(b.as_slice().unwrap().iter().all(|&x| x == 0));
        b.as_mut_slice().unwrap()[9_999] = 7;
        let shared = b.clone();
        assert!(b.as_mut_slice().is_none());
        let mut one = [0u8];
        shared.read_at(9_999, &mut one);
        assert_eq!(one, [7]);
        drop(shared);
        assert!(b.as_slice().is_some());
        assert!(Buffer::new(0).is_empty());
    }

    #[test]
    fn large_buffers_are_mapped_aligned_and_zeroed() {
        let mut b = Buffer::new(3 * HUGE + 5);
        assert_eq!(b.addr() % HUGE, 0);
        assert_eq!(b.len(), 3 * HUGE + 5);
        let s = b.as_mut_slice().unwrap();
        assert!(s.iter().all(|&x| x == 0));
        s[3 * HUGE + 4] = 9;
        let mut last = [0u8];
        b.read_at(3 * HUGE + 4, &mut last);
        assert_eq!(last, [9]);
    }

    #[test]
    fn remote_slice_round_trips_and_bounds() {
        let r = RemoteSlice {
            addr: 4096,
            len: 100,
            key: 0xdead_beef,
        };
        assert_eq!(RemoteSlice::decode(&r.encode()), Some(r));
        assert_eq!(RemoteSlice::decode(&[0; 23]), None);
        assert_eq!(r.sub(90, 10).unwrap().addr, 4186);
        assert!(r.sub(91, 10).is_err());
        assert!(r.sub(u64::MAX, 2).is_err());
        let high = RemoteSlice {
            addr: u64::MAX,
            len: 10,
            key: 1,
        };
        assert!(
            high.sub(1, 1).is_err(),
            "a peer-chosen address that overflows is refused"
        );
    }
}
