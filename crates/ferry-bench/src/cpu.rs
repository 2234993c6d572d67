//! CPU time of this process and its children from getrusage, and of other processes from
//! /proc (the only FFI in the CLI).

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

/// CPU used so far by this process's terminated and waited-for children (and theirs).
pub fn children_usage() -> Usage {
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage; RUSAGE_CHILDREN cannot fail with a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let us = |tv: libc::timeval| tv.tv_sec.max(0) as u64 * 1_000_000 + tv.tv_usec.max(0) as u64;
    Usage {
        user_us: us(ru.ru_utime),
        sys_us: us(ru.ru_stime),
    }
}

/// User+system CPU seconds a running process has used so far, all its threads and its
/// waited-for children included (`/proc/PID/stat` utime, stime, cutime, cstime); None if
/// the process is gone or the file unreadable.
pub fn proc_cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis
    // start at field 3 (state), so utime..cstime (14..17) are the 12th..15th of them.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f
        .get(11..15)?
        .iter()
        .map(|x| x.parse::<u64>().ok())
        .sum::<Option<u64>>()?;
    // SAFETY: sysconf has no memory effects; _SC_CLK_TCK is always a valid name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks as f64 / hz as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_cpu_is_visible_in_proc() {
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed().as_millis() < 60 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let cpu = proc_cpu_secs(std::process::id()).expect("own /proc stat");
        assert!(cpu > 0.0, "{cpu}");
        assert!(proc_cpu_secs(u32::MAX).is_none());
    }
}
