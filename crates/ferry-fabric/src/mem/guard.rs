//! The fault guard of file mappings: a file truncated under a mapping makes a read of the
//! lost pages raise SIGBUS, which would kill the process. Every file mapping this module
//! makes is guarded: a SIGBUS at an address inside one is answered by mapping anonymous
//! zero pages over the rest of the range and marking it torn, and the read that faulted
//! goes on, with zeros. So any reader of the mapping is safe (a provider's bounce copy, a
//! hash over the mapping, shm's user-space copy when CMA is unavailable), and its owner
//! learns from [`Guard::torn`] that what was read is not the file: a sender fails the
//! transfer as a changed source, and a receiver's check fails on the zeros in any case.
//!
//! The signal handler only reads atomics and calls `mmap` (a raw system call), both
//! async-signal-safe. A SIGBUS anywhere else goes to the handler that was there before
//! (Rust's own, which tells a stack overflow from other faults and resets the default
//! action), or to the default action: the process dies as it would without the guard.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

use crate::error::{FabricError, Result};

use super::PAGE;

/// Guarded ranges that may be alive at once: a sender's ring slots times its connections
/// fit many times over. A mapping that finds no free slot is refused (the caller reads the
/// file instead).
const SLOTS: usize = 8192;

/// A slot's `start` while it is being filled.
const FILLING: usize = 1;

/// One guarded range, `start..end`; `start` 0 when free.
struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    torn: AtomicBool,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        start: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
        torn: AtomicBool::new(false),
    }
}; SLOTS];

/// Where the search for a free slot starts (the last one taken): slots are taken and given
/// back in ring order, so the next free one is usually right after it.
static HINT: AtomicUsize = AtomicUsize::new(0);

/// The SIGBUS action before ours, written once before ours is installed.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

static INSTALL: Once = Once::new();

/// A guarded file mapping's range: reads of it never kill the process. Dropped (the range
/// unguarded) before the range is unmapped.
#[derive(Debug)]
pub(super) struct Guard {
    slot: usize,
}

impl Guard {
    /// Guards `start..start + len` (page aligned; a file mapping made by the caller).
    pub(super) fn new(start: usize, len: usize) -> Result<Guard> {
        install()?;
        let end = start
            .checked_add(len)
            .ok_or_else(|| FabricError::InvalidArgument("guard: range overflows".into()))?;
        let first = HINT.load(Ordering::Relaxed);
        for i in (0..SLOTS).map(|k| (first + k) % SLOTS) {
            let s = &TABLE[i];
            if s.start
                .compare_exchange(0, FILLING, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                s.end.store(end, Ordering::Relaxed);
                s.torn.store(false, Ordering::Relaxed);
                // Published last: the handler matches a slot only once `start` is real.
                s.start.store(start, Ordering::Release);
                HINT.store(i + 1, Ordering::Relaxed);
                return Ok(Guard { slot: i });
            }
        }
        Err(FabricError::Unavailable(
            "every file mapping guard is in use".into(),
        ))
    }

    /// Whether a read of the range faulted (the file had shrunk) and got zeros instead of
    /// the file's bytes.
    pub(super) fn torn(&self) -> bool {
        TABLE[self.slot].torn.load(Ordering::Acquire)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        TABLE[self.slot].start.store(0, Ordering::Release);
    }
}

/// Installs the handler once per process.
fn install() -> Result<()> {
    let mut failed = None;
    INSTALL.call_once(|| {
        // SAFETY: sigaction with a zeroed struct reads the current action into `old` only;
        // the new action's handler is an `extern "C"` function that stays for the life of
        // the process, and its mask is initialised by sigemptyset.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                failed = Some(std::io::Error::last_os_error());
                return;
            }
            let _ = PREVIOUS.set(old);
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigbus as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            if libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut()) != 0 {
                failed = Some(std::io::Error::last_os_error());
            }
        }
    });
    match failed {
        Some(e) => Err(FabricError::io("install the SIGBUS guard", e)),
        None => Ok(()),
    }
}

/// The guarded range holding `addr`, if any.
fn slot_of(addr: usize) -> Option<&'static Slot> {
    TABLE.iter().find(|s| {
        let start = s.start.load(Ordering::Acquire);
        start > FILLING && addr >= start && addr < s.end.load(Ordering::Relaxed)
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    if let Some(slot) = slot_of(addr) {
        let page = addr & !(PAGE - 1);
        let end = slot.end.load(Ordering::Relaxed);
        // SAFETY: page..end lies inside a guarded file mapping, which its owner keeps
        // mapped while it is guarded; MAP_FIXED replaces those pages with zero pages the
        // owner then unmaps with the rest. Nothing holds a Rust reference into them that
        // their new contents could break: they are read as plain bytes.
        let zeroed = unsafe {
            rustix::mm::mmap_anonymous(
                page as *mut _,
                end - page,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::FIXED,
            )
        };
        if zeroed.is_ok() {
            slot.torn.store(true, Ordering::Release);
            return;
        }
    }
    pass_on(sig, info, ctx);
}

/// Hands a SIGBUS that is not ours to the previous action: its handler, or the default
/// action (restored, so the faulting instruction, run again, kills the process as usual).
fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let previous = PREVIOUS.get().map(|old| (old.sa_sigaction, old.sa_flags));
    match previous {
        Some((h, flags)) if h != libc::SIG_DFL && h != libc::SIG_IGN => {
            if flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous action was installed as an SA_SIGINFO handler.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(h) };
                f(sig, info, ctx);
            } else {
                // SAFETY: the previous action was installed as a plain handler.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
                f(sig);
            }
        }
        _ => {
            // SAFETY: restoring the default action with an empty mask.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigemptyset(&mut dfl.sa_mask);
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            }
        }
    }
}
