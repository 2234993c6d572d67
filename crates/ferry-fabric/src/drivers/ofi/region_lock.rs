//! A look at this endpoint's own shm region lock, so the progress thread does not spin on it.
//!
//! libfabric 1.17's shm guards each endpoint's region with a process-shared spinlock
//! (`smr_region.lock`, a `pthread_spinlock_t`) that a *peer* takes for the whole CMA copy of
//! an RMA into or out of this process's memory (`wedge.rs`, `gate.rs`), about a
//! millisecond per 4 MiB piece. The owner's progress (`fi_cq_read`) takes the same lock, so
//! while a client pulls a file from a server, the server's progress thread spent a third
//! of the server's CPU spinning in `pthread_spin_lock` (perf, a 2 GiB file from /dev/shm
//! over ofi+shm). Reading the lock word first lets it wait off the CPU instead.
//!
//! The word is found, not assumed: the region is the mapping of `/dev/shm/NAME` in this
//! process, and the layout is accepted only if its header holds this process's pid at byte
//! 4 and the mapping's own address at byte 16 (`smr_region.base_addr`), as 1.17's does; the
//! lock follows at byte 24. Its free value is whatever `pthread_spin_init` writes (1 with
//! glibc on x86-64, where a held lock is 0 or below). Any other layout: no look, the
//! progress thread polls as before.

use std::sync::atomic::{AtomicI32, Ordering::Relaxed};

/// Byte offsets in 1.17's `struct smr_region`.
const PID_AT: usize = 4;
const BASE_ADDR_AT: usize = 16;
const LOCK_AT: usize = 24;

/// This endpoint's region lock, readable while the endpoint lives.
pub(super) struct RegionLock {
    word: *const AtomicI32,
    free: i32,
}

impl RegionLock {
    /// The lock of region `name` (`/dev/shm/NAME`), mapped by this process, if its layout
    /// is 1.17's.
    ///
    /// The caller must stop using the result before the endpoint owning the region closes
    /// (the provider unmaps it then): the progress thread, joined before the domain
    /// closes, is its only user.
    pub(super) fn find(name: &str) -> Option<RegionLock> {
        let start = mapping_start(name)?;
        // SAFETY: `start` is the start of a shared mapping of the region file, at least a
        // page long (checked in `mapping_start`), so the first 32 bytes are readable; the
        // provider writes them concurrently, so the lock word is read atomically below,
        // and the header fields, set once when the region was created, plainly.
        let (pid, base, word) = unsafe {
            let p = start as *const u8;
            (
                std::ptr::read_unaligned(p.add(PID_AT) as *const i32),
                std::ptr::read_unaligned(p.add(BASE_ADDR_AT) as *const usize),
                p.add(LOCK_AT) as *const AtomicI32,
            )
        };
        let ours = u32::try_from(pid).is_ok_and(|p| p == std::process::id());
        (ours && base == start).then(|| RegionLock {
            word,
            free: spin_lock_free_value(),
        })
    }

    /// Whether a thread (of any process) holds the lock right now.
    pub(super) fn held(&self) -> bool {
        // SAFETY: `word` is 4-aligned (offset 24 in a page-aligned mapping) and mapped for
        // as long as this value is used (`find`'s contract).
        unsafe { (*self.word).load(Relaxed) != self.free }
    }
}

/// The value `pthread_spin_init` gives a free lock here.
fn spin_lock_free_value() -> i32 {
    let mut lock: libc::pthread_spinlock_t = 0;
    // SAFETY: initialising a local spinlock (process-shared, like the provider's).
    unsafe { libc::pthread_spin_init(&mut lock, libc::PTHREAD_PROCESS_SHARED) };
    lock
}

/// Where `/dev/shm/NAME` is mapped, shared and from its start, in this process (a page or
/// more), from `/proc/self/maps`.
fn mapping_start(name: &str) -> Option<usize> {
    let path = format!("/dev/shm/{name}");
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (range, perms, offset) = (f.next()?, f.next()?, f.next()?);
        let file = f.nth(2)?;
        if file != path || !perms.starts_with("rw") || &perms[3..4] != "s" {
            return None;
        }
        if usize::from_str_radix(offset, 16).ok()? != 0 {
            return None;
        }
        let (lo, hi) = range.split_once('-')?;
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).ok()?,
            usize::from_str_radix(hi, 16).ok()?,
        );
        (hi >= lo + 4096).then_some(lo)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Maps `/dev/shm/NAME` (created, 8 KiB of zeros) shared and writable, as the provider
    /// maps a region, and runs `f` while it is mapped.
    fn with_shared_mapping(name: &str, f: impl FnOnce()) {
        use std::os::fd::AsRawFd;
        let path = format!("/dev/shm/{name}");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        file.set_len(8192).unwrap();
        // SAFETY: a fresh shared mapping of a file this test owns, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        f();
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(p, 8192) };
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn an_endpoints_own_region_lock_is_found_and_free_when_idle() {
        let name = format!("ferry-region-lock-{}", std::process::id());
        let addr: crate::Address = format!("ofi+shm://{name}").parse().unwrap();
        let _listener = crate::listen(&addr).unwrap();
        let lock = RegionLock::find(&name).expect("libfabric 1.17's shm region layout");
        assert!(!lock.held());
    }

    #[test]
    fn a_mapping_with_another_layout_is_refused() {
        // A region-like mapping whose header is zeros: neither our pid nor its own address.
        let name = format!("ferry-region-lock-zeros-{}", std::process::id());
        with_shared_mapping(&name, || assert!(RegionLock::find(&name).is_none()));
        assert!(RegionLock::find("ferry-no-such-region").is_none());
    }
}
