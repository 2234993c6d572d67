//! The `ferry-wan` command end to end: `run` carries its commands' status and tears down,
//! `up` tears down on SIGTERM, `down --all` cleans up after a killed `up`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};

fn ferry_wan() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferry-wan"))
}

fn supported() -> bool {
    match ferry_wan::supported() {
        Ok(()) => true,
        Err(e) => {
            eprintln!("skipping: {e}");
            false
        }
    }
}

/// Whether the namespace, or the /etc/hosts file its commands get, is still there.
fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists() || Path::new("/etc/netns").join(name).exists()
}

/// Starts `ferry-wan up` and reads the two namespace names it prints.
fn up() -> (Child, Vec<String>) {
    let mut child = ferry_wan()
        .args(["up", "--rtt", "1ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let names: Vec<String> = stdout
        .lines()
        .take(2)
        .map(|l| l.unwrap().split(' ').nth(1).unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 2);
    assert!(names.iter().all(|n| netns_exists(n)), "{names:?}");
    (child, names)
}

fn signal(child: &Child, sig: Signal) {
    kill_process(Pid::from_raw(child.id() as i32).unwrap(), sig).unwrap();
}

#[test]
fn run_exits_with_b_status_and_tears_down() {
    if !supported() {
        return;
    }
    let out = ferry_wan()
        .args(["run", "--rtt", "2ms", "--grace", "0s"])
        .args(["--a", "sleep 30"])
        .args([
            "--b",
            "[ \"$FERRY_WAN_A\" = 198.18.0.1 ] || exit 9; \
             getent hosts ferry-wan-a | grep -q '^198.18.0.1 ' || exit 8; exit 3",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    // B resolved A's name (its /etc/hosts has both ends). It names its namespaces on
    // stderr; A's `sleep 30` was ended, not waited for, and the namespaces are gone.
    let names: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("ferry-wan: namespace "))
        .filter_map(|l| l.split(' ').nth(1))
        .collect();
    assert_eq!(names.len(), 2, "{stderr}");
    assert!(
        names.iter().all(|n| !netns_exists(n)),
        "{names:?} left behind"
    );
}

#[test]
fn up_tears_down_on_sigterm() {
    if !supported() {
        return;
    }
    let (mut child, names) = up();
    signal(&child, Signal::TERM);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        names.iter().all(|n| !netns_exists(n)),
        "{names:?} left behind"
    );
}

#[test]
fn down_all_removes_what_a_killed_up_left() {
    if !supported() {
        return;
    }
    let (mut child, names) = up();
    signal(&child, Signal::KILL);
    child.wait().unwrap();
    assert!(names.iter().all(|n| netns_exists(n)), "SIGKILL leaves them");
    let out = ferry_wan().args(["down", "--all"]).output().unwrap();
    assert!(out.status.success());
    let deadline = Instant::now() + Duration::from_secs(2);
    while names.iter().any(|n| netns_exists(n)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        names.iter().all(|n| !netns_exists(n)),
        "{names:?} left behind"
    );
}
