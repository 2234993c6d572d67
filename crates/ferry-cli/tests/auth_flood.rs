//! Failed authentications under a flood (issue 16, hardening), with a real `ferry serve`:
//! a thousand wrong token proofs from one address are locked out and logged a bounded
//! number of times (once per address per interval, naming the token's identifier, never
//! the token), while a good client on another address copies at the same time.

mod common;

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_service::channel::Channel;
use ferry_service::secure::ClientSecurity;

use common::*;

/// The wrong token the flood proves (it must never appear in the log).
const WRONG: &str = "wrong-token-for-the-flood-0123456789";

/// Connects over TLS to `addr` and proves [`WRONG`]; whether the server refused it.
fn wrong_proof(addr: &str, sec: &ClientSecurity) -> bool {
    let Ok(mut ch) = Channel::connect_with(addr, Duration::from_secs(5), sec) else {
        return false;
    };
    ch.timeout = Duration::from_secs(5);
    let refused = ch
        .select(addr, "xfer", WRONG)
        .is_err_and(|e| e.msg.contains("not accepted"));
    ch.close();
    refused
}

#[test]
fn a_thousand_wrong_proofs_are_throttled_and_logged_while_a_good_client_copies() {
    let dir = scratch("flood");
    let log_path = dir.join("serve.log");
    let root = scratch("flood-root");
    let data = pattern(2 << 20, 7);
    std::fs::write(root.join("f.bin"), &data).unwrap();
    let mut cmd = ferry();
    cmd.env("RUST_LOG", "info")
        .args(["serve", "--token", TOKEN, "--root"])
        .arg(format!("d={}", root.display()))
        .args([
            "--listen",
            &listen_url("tcp"),
            "--listen",
            &listen_url("ofi+shm"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(&log_path).unwrap()));
    let mut child = cmd.spawn().unwrap();
    let addrs = listening(&mut child, 2);
    let (tcp, shm) = (addrs[0].clone(), addrs[1].clone());
    let sec = ClientSecurity {
        fingerprint: Some(fingerprint()),
        ..ClientSecurity::default()
    };

    // The flood: 1,000 wrong proofs over tcp from 127.0.0.1, four connections at a time.
    let done = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicUsize::new(0));
    let flood: Vec<_> = (0..4)
        .map(|_| {
            let (tcp, sec, refused) = (tcp.clone(), sec.clone(), refused.clone());
            std::thread::spawn(move || {
                for _ in 0..250 {
                    if wrong_proof(&tcp, &sec) {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    // Meanwhile a good client on another address (ofi+shm) copies, again and again.
    let good = {
        let (shm, done) = (shm.clone(), done.clone());
        let dir = dir.clone();
        std::thread::spawn(move || {
            let mut copies = 0;
            while !done.load(Ordering::SeqCst) || copies == 0 {
                let out = dir.join(format!("got{copies}.bin"));
                let o = cp(&[&format!("{shm}/d/f.bin"), out.to_str().unwrap()], &[]);
                ok(&o);
                copies += 1;
            }
            copies
        })
    };
    let started = Instant::now();
    for t in flood {
        t.join().unwrap();
    }
    let took = started.elapsed();
    done.store(true, Ordering::SeqCst);
    let copies = good.join().unwrap();
    assert_eq!(std::fs::read(dir.join("got0.bin")).unwrap(), data);
    assert_eq!(
        refused.load(Ordering::Relaxed),
        1000,
        "every wrong proof is refused"
    );
    std::thread::sleep(Duration::from_millis(200));
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(&log_path).unwrap();
    let failures: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("authentication failed"))
        .collect();
    // Once per address per 10 s, whatever the flood's rate.
    let bound = took.as_secs() / 10 + 1;
    assert!(
        !failures.is_empty() && failures.len() as u64 <= bound,
        "{} failure lines for {took:?} of flood (at most {bound}):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        failures[0].contains("127.0.0.1") && failures[0].contains("token "),
        "{}",
        failures[0]
    );
    // The good client's copies are logged, one line each (the server's transfer log);
    // everything else must not grow with the flood.
    assert!(
        log.lines().filter(|l| !l.contains(": xfer get ")).count() < 20,
        "the log grew with the flood:\n{log}"
    );
    assert!(!log.contains(WRONG), "a secret in the log");
    eprintln!(
        "1000 wrong proofs in {took:?}, {copies} good copies meanwhile, {} log lines:\n{log}",
        log.lines().count()
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&root);
    if let Some(name) = shm.strip_prefix("ofi+shm://") {
        let _ = std::fs::remove_file(std::path::Path::new("/dev/shm").join(name));
    }
}
