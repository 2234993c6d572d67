//! A process that exits while another of its threads is closing shm endpoints exits
//! cleanly: libfabric's exit-time teardown and the close are kept apart (a segfault in
//! shm's `smr_free` was seen without that). The test runs itself as the exiting child.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ferry_fabric::{listen, open, Address};

const T: Duration = Duration::from_secs(20);
const CHILD: &str = "FERRY_TEST_EXIT_CHILD";
/// Pairs the child closes while it exits: enough closes to span its exit.
const PAIRS: usize = 24;

fn shm_addr() -> Address {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("ofi+shm://ferry-exit-{}-{n}", std::process::id())
        .parse()
        .unwrap()
}

/// The child: connected shm pairs in this process, closed one by one on a thread while
/// the main thread exits (after `delay_us`).
fn child(delay_us: u64) -> ! {
    let mut held = Vec::new();
    for _ in 0..PAIRS {
        let l = listen(&shm_addr()).expect("listen");
        let addr = l.local_addr();
        let d = open(&addr).expect("open");
        let c = std::thread::spawn({
            let d = d.clone();
            move || d.connect(&addr, T).expect("connect")
        });
        let s = l.accept(T).expect("accept");
        held.push((c.join().unwrap(), s, d, l));
    }
    std::thread::spawn(move || {
        for h in held {
            drop(h);
        }
    });
    std::thread::sleep(Duration::from_micros(delay_us));
    std::process::exit(0)
}

/// Removes the shm regions a child that exited mid-close left behind (16 MiB each in
/// /dev/shm: the provider unlinks a region when its endpoint closes, which the exit cut
/// short).
fn remove_regions_of(pid: u32) {
    let prefix = format!("ferry-exit-{pid}-");
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for e in dir.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[test]
fn exiting_while_another_thread_closes_endpoints_is_clean() {
    if let Ok(d) = std::env::var(CHILD) {
        child(d.parse().unwrap_or(0));
    }
    let me = std::env::current_exe().unwrap();
    for i in 0..24u64 {
        let child = Command::new(&me)
            .args([
                "--exact",
                "exiting_while_another_thread_closes_endpoints_is_clean",
                "--nocapture",
            ])
            .env(CHILD, (i * 397 % 6000).to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        remove_regions_of(pid);
        assert!(
            out.status.success(),
            "run {i} ended {:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
