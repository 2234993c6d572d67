//! CPU time of this process (the process CPU clock), of its waited-for children and of other
//! running processes (/proc), without FFI: rustix's safe clock and clock-tick calls.

use rustix::time::{clock_gettime, ClockId};

/// CPU time (user plus system, all threads) a process has used, in microseconds.
///
/// Only the sum is kept: every report adds user and system time, and the process CPU clock
/// gives the sum at nanosecond resolution where /proc splits it in 10 ms ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// User plus system microseconds.
    pub cpu_us: u64,
}

impl Usage {
    /// CPU seconds elapsed from `earlier` to `self`.
    pub fn secs_since(self, earlier: Usage) -> f64 {
        self.cpu_us.saturating_sub(earlier.cpu_us) as f64 / 1e6
    }
}

/// CPU used so far by this whole process (all threads, including driver threads): the
/// CLOCK_PROCESS_CPUTIME_ID clock, the same user+system sum getrusage(RUSAGE_SELF) splits.
pub fn self_usage() -> Usage {
    let t = clock_gettime(ClockId::ProcessCPUTime);
    Usage {
        cpu_us: t.tv_sec.max(0) as u64 * 1_000_000 + t.tv_nsec.max(0) as u64 / 1_000,
    }
}

/// CPU used so far by this process's terminated and waited-for children (and theirs):
/// cutime + cstime of /proc/self/stat, in clock ticks (10 ms at the usual 100 Hz), which is
/// fine for the external tools `bench cp` times over seconds. Zero if /proc is unreadable.
pub fn children_usage() -> Usage {
    let secs = stat_ticks("self", 13..15).map_or(0.0, ticks_to_secs);
    Usage {
        cpu_us: (secs * 1e6) as u64,
    }
}

/// User+system CPU seconds a running process has used so far, all its threads and its
/// waited-for children included (`/proc/PID/stat` utime, stime, cutime, cstime); None if
/// the process is gone or the file unreadable.
pub fn proc_cpu_secs(pid: u32) -> Option<f64> {
    stat_ticks(&pid.to_string(), 11..15).map(ticks_to_secs)
}

/// The sum of the given fields of `/proc/PROC/stat`, counted from field 3 (state) as 0.
fn stat_ticks(proc: &str, fields: std::ops::Range<usize>) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{proc}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis
    // start at field 3 (state), so utime..cstime (14..17) are the 12th..15th of them.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f.get(fields)?.iter().map(|x| x.parse::<u64>().ok()).sum()
}

fn ticks_to_secs(ticks: u64) -> f64 {
    ticks as f64 / rustix::param::clock_ticks_per_second().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_cpu_is_visible_in_proc() {
        // Spin 30 ms of this process's CPU (not of wall time: the machine may be busy).
        let (u0, t) = (self_usage(), std::time::Instant::now());
        let mut x = 0u64;
        while self_usage().secs_since(u0) < 0.03 && t.elapsed().as_secs() < 10 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        assert!(self_usage().secs_since(u0) >= 0.03, "{u0:?}");
        let cpu = proc_cpu_secs(std::process::id()).expect("own /proc stat");
        assert!(cpu > 0.0, "{cpu}");
        assert!(proc_cpu_secs(u32::MAX).is_none());
    }

    #[test]
    fn waited_for_children_are_counted() {
        let c0 = children_usage();
        // A child that spins some CPU, then is waited for.
        let st = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 50000 ]; do i=$((i+1)); done"])
            .status()
            .expect("sh runs");
        assert!(st.success());
        assert!(children_usage().secs_since(c0) > 0.0);
    }
}
