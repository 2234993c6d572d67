//! An idle ofi server costs the host little: a listening domain with no connection lets
//! its progress thread nap long (at most a millisecond, it woke about a thousand times a
//! second, which slowed other work on the host), and the first client after the quiet
//! still connects and is answered.
//!
//! One test in this binary, so that no other test's domain is busy beside it.

use std::time::{Duration, Instant};

use ferry_fabric::{listen, Access, Buffer, Endpoint};

const T: Duration = Duration::from_secs(20);
/// Longer than the progress thread's quiet before its long naps (`DEEP_IDLE_AFTER`).
const SETTLE: Duration = Duration::from_millis(1500);
/// Wake-ups a second the two idle progress threads may take together: napping 10 ms they
/// take about 200; napping at most a millisecond, they took about 1,850.
const MAX_WAKEUPS_PER_SEC: u64 = 400;

/// Voluntary context switches of this process's progress threads (`ferry-ofi-<domain>`).
fn progress_thread_switches() -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let is_progress = comm
            .trim()
            .strip_prefix("ferry-ofi-")
            .is_some_and(|id| id.parse::<u64>().is_ok());
        if !is_progress {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        total += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

/// One byte each way on `ep`, this side first if `sends_first`.
fn exchange(ep: &dyn Endpoint, sends_first: bool) {
    let mr = ep
        .domain()
        .register(&Buffer::new(1), Access::LOCAL)
        .unwrap();
    for (n, send) in [sends_first, !sends_first].into_iter().enumerate() {
        match send {
            true => ep.post_send(&[mr.full()], n as u64).unwrap(),
            false => ep.post_recv(&[mr.full()], n as u64).unwrap(),
        }
        ep.cq().wait(T).unwrap().result.unwrap();
    }
}

/// A one-byte message from a new client to a server whose domain was idle, and back.
fn ping(l: &dyn ferry_fabric::Listener) {
    let addr = l.local_addr();
    let client = std::thread::spawn(move || {
        let ep = ferry_fabric::connect(&addr, T).expect("connect after the quiet");
        exchange(ep.as_ref(), true);
    });
    let ep = l.accept(T).expect("accept after the quiet");
    exchange(ep.as_ref(), false);
    client.join().unwrap();
}

#[test]
fn an_idle_listening_domain_naps_long_and_still_answers() {
    let shm = format!("ofi+shm://ferry-idle-{}", std::process::id());
    let listeners: Vec<_> = [shm.as_str(), "ofi+tcp://127.0.0.1:0"]
        .into_iter()
        .map(|a| listen(&a.parse().unwrap()).unwrap_or_else(|e| panic!("listen {a}: {e}")))
        .collect();
    std::thread::sleep(SETTLE);
    let (before, t0) = (progress_thread_switches(), Instant::now());
    std::thread::sleep(Duration::from_secs(1));
    let per_sec = (progress_thread_switches() - before) as f64 / t0.elapsed().as_secs_f64();
    eprintln!("{per_sec:.0} wake-ups a second for the idle listeners");
    assert!(
        (per_sec as u64) < MAX_WAKEUPS_PER_SEC,
        "{per_sec:.0} wake-ups a second for {} idle listeners",
        listeners.len()
    );
    for l in &listeners {
        let t = Instant::now();
        ping(l.as_ref());
        eprintln!(
            "{}: first exchange after the quiet in {:?}",
            l.local_addr(),
            t.elapsed()
        );
    }
}
