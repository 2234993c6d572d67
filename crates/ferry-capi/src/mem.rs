//! Memory registrations (`exs_mregister`): caller-owned memory, registered lazily in each
//! fabric domain that uses it.
//!
//! In C, `exs_mregister` comes before (and independently of) any socket, but a fabric
//! registration belongs to one domain (an accepting listener's sockets share one; each
//! connecting socket has its own). So a [`Mem`] records the range and wraps it once as a
//! [`Buffer`] over the caller's memory; the first operation on a socket of a domain registers
//! that buffer there and caches the [`MemoryRegion`] by domain, and later operations in the
//! same domain reuse it.
//!
//! `exs_mderegister` drops the cache and then asks the buffer how many handles it has: every
//! live registration holds one, and a registration lives while anything holds it: an
//! operation in flight, or its completion event not yet dequeued. Only when the buffer is
//! the last handle is nothing able to reach the memory, and only then may the caller free
//! it. The count is the truth, so it also settles by itself when events are lost with a
//! deleted queue (they die with the queue or their socket); the price is that an EBUSY
//! answer has emptied the cache, and the next operation registers the memory again.

use std::collections::HashMap;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

use ferry_exs::runtime::ExsSocket;
use ferry_fabric::{Buffer, DomainId, MemoryRegion};

use crate::error::{Errno, Res};
use crate::socket::Socket;

/// The longest `exs_mderegister` waits for a driver's transient hold on the buffer (see
/// [`Mem::deregister`]) before answering EBUSY.
const SETTLE_HOLDS: std::time::Duration = std::time::Duration::from_millis(50);

/// One `exs_mhandle_t`.
pub struct Mem {
    addr: usize,
    len: usize,
    st: Mutex<MemState>,
}

struct MemState {
    /// None once deregistered.
    buffer: Option<Buffer>,
    regions: HashMap<DomainId, MemoryRegion>,
}

impl Mem {
    /// Records `addr..addr + len` (EINVAL if null, empty or wrapping).
    ///
    /// # Safety
    /// The memory must be valid for reads and writes and stay allocated until
    /// [`Mem::deregister`] has succeeded (the `exs_mregister` contract).
    pub unsafe fn new(addr: *mut u8, len: usize) -> Res<Mem> {
        let ptr = NonNull::new(addr).ok_or(Errno::INVAL)?;
        if len == 0 || len > isize::MAX as usize || (addr as usize).checked_add(len).is_none() {
            return Err(Errno::INVAL);
        }
        // SAFETY: the caller guarantees the range stays valid until deregister succeeds, and
        // deregister succeeds only when this buffer is the last handle to it (no region, no
        // operation), so nothing reaches the memory after that.
        let buffer = unsafe { Buffer::from_raw_parts(ptr, len) };
        Ok(Mem {
            addr: addr as usize,
            len,
            st: Mutex::new(MemState {
                buffer: Some(buffer),
                regions: HashMap::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, MemState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where `buf..buf + len` lies within the registration (EFAULT if not entirely inside).
    pub fn range(&self, buf: usize, len: usize) -> Res<Range<usize>> {
        let start = buf.checked_sub(self.addr).ok_or(Errno::FAULT)?;
        let end = start.checked_add(len).ok_or(Errno::FAULT)?;
        if end > self.len {
            return Err(Errno::FAULT);
        }
        Ok(start..end)
    }

    /// The registration of this memory in `sock`'s domain (made on first use). EBADF once
    /// deregistered.
    pub fn region(&self, sock: &Socket, exs: &ExsSocket) -> Res<MemoryRegion> {
        let mut st = self.lock();
        let buffer = st.buffer.clone().ok_or(Errno::BADF)?;
        let cached = sock.domain.get().and_then(|d| st.regions.get(d)).cloned();
        let region = match cached {
            Some(r) => r,
            None => {
                let region = exs.register(buffer)?.region().clone();
                let d = region.domain();
                let _ = sock.domain.set(d);
                st.regions.entry(d).or_insert(region).clone()
            }
        };
        Ok(region)
    }

    /// Drops every registration; EBUSY while an operation (or its undequeued event) still
    /// holds one. After success the caller may free the memory.
    ///
    /// A driver may still hold the buffer for a moment after the event of the operation
    /// that used it was delivered (native tcp's writer completes a send as its bytes leave,
    /// then drops the batch that held them): such a hold is waited out, up to
    /// [`SETTLE_HOLDS`], before the answer is EBUSY.
    pub fn deregister(&self) -> Res<()> {
        let mut st = self.lock();
        if st.buffer.is_none() {
            return Err(Errno::BADF);
        }
        // Dropping the cache deregisters every region nothing else holds; a region still
        // held keeps a buffer handle, so the count tells.
        st.regions.clear();
        let held = |st: &MemState| st.buffer.as_ref().is_some_and(|b| b.handle_count() > 1);
        let start = std::time::Instant::now();
        while held(&st) {
            if start.elapsed() >= SETTLE_HOLDS {
                return Err(Errno(libc::EBUSY));
            }
            std::thread::yield_now();
        }
        st.buffer = None;
        Ok(())
    }
}
