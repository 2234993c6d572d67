//! CPU time of this process from getrusage (the only FFI in the CLI).

/// User and system CPU time of a process, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// User time.
    pub user_us: u64,
    /// System time.
    pub sys_us: u64,
}

impl Usage {
    /// User plus system seconds elapsed from `earlier` to `self`.
    pub fn secs_since(self, earlier: Usage) -> f64 {
        let total = |u: Usage| u.user_us + u.sys_us;
        total(self).saturating_sub(total(earlier)) as f64 / 1e6
    }
}

/// CPU used so far by this whole process (all threads, including driver threads).
pub fn self_usage() -> Usage {
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage; RUSAGE_SELF cannot fail with a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let us = |tv: libc::timeval| tv.tv_sec.max(0) as u64 * 1_000_000 + tv.tv_usec.max(0) as u64;
    Usage {
        user_us: us(ru.ru_utime),
        sys_us: us(ru.ru_stime),
    }
}
