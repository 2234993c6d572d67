//! The audit log (docs/security.md, "Audit log") with real `ferry` processes: one JSON line
//! per request in `--audit-log FILE` (who, from where, what, bytes, how long, how it ended),
//! refusals included, never a secret; without it, one line per transfer in the server's log.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::*;

/// The records of an audit file, waiting up to 5 s for at least `n`.
fn records(path: &std::path::Path, n: usize) -> (String, Vec<Value>) {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let recs: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("every audit line is one JSON object"))
            .collect();
        if recs.len() >= n || Instant::now() > end {
            return (text, recs);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_request_is_one_json_line_without_secrets() {
    let dir = scratch("audit");
    let audit = dir.join("audit.jsonl");
    let tokens = dir.join("tokens");
    let reader = "read-only-audit-token-0123456789";
    std::fs::write(&tokens, format!("ro {reader}\n")).unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let s = serve_as(
        ferry(),
        "tcp",
        &[],
        &[
            "--audit-log",
            audit.to_str().unwrap(),
            "--token-file",
            tokens.to_str().unwrap(),
        ],
    );
    let data = pattern(300_000, 3);
    let local = dir.join("up.bin");
    std::fs::write(&local, &data).unwrap();
    ok(&cp(&[local.to_str().unwrap(), &s.url("up.bin")], &[]));
    let back = dir.join("back.bin");
    ok(&cp(&[&s.url("up.bin"), back.to_str().unwrap()], &[]));
    let mut c = ferry();
    c.args([
        "cp",
        "--token",
        reader,
        local.to_str().unwrap(),
        &s.url("no.bin"),
    ]);
    fails(&run(c), 7, "read-only");

    let (text, recs) = records(&audit, 3);
    assert!(
        !text.contains(TOKEN) && !text.contains(reader),
        "a secret in the audit: {text}"
    );
    let find = |op: &str, path: &str| {
        recs.iter()
            .find(|r| r["op"] == op && r["path"] == path)
            .unwrap_or_else(|| panic!("no {op} of {path} in:\n{text}"))
    };
    let put = find("put", "d/up.bin");
    assert_eq!(put["result"], "ok", "{put}");
    assert_eq!(put["bytes"], 300_000);
    assert_eq!(put["face"], "xfer");
    assert_eq!(put["peer"], "127.0.0.1");
    assert!(
        put["credential"].as_str().unwrap().starts_with("token "),
        "{put}"
    );
    assert!(put["time"].as_str().unwrap().ends_with('Z'));
    assert!(put["duration_s"].as_f64().unwrap() >= 0.0);
    let get = find("get", "d/up.bin");
    assert_eq!(
        (get["result"].clone(), get["bytes"].clone()),
        ("ok".into(), 300_000.into())
    );
    let refused = find("put", "d/no.bin");
    assert_eq!(refused["result"], "error");
    assert!(
        refused["error"].as_str().unwrap().contains("read-only"),
        "{refused}"
    );
    assert_ne!(
        refused["credential"], put["credential"],
        "two tokens, two ids"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_an_audit_file_the_log_has_a_line_per_transfer() {
    let dir = scratch("audit-log");
    let log = dir.join("serve.log");
    let mut cmd = ferry();
    cmd.env("RUST_LOG", "info");
    let s = serve_logging(
        cmd,
        "tcp",
        &[],
        &[],
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    let local = dir.join("f.bin");
    std::fs::write(&local, pattern(4096, 1)).unwrap();
    ok(&cp(&[local.to_str().unwrap(), &s.url("f.bin")], &[]));
    let end = Instant::now() + Duration::from_secs(5);
    let mut text = String::new();
    while Instant::now() < end && !text.contains("xfer put d/f.bin") {
        text = std::fs::read_to_string(&log).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let line = text
        .lines()
        .find(|l| l.contains("xfer put d/f.bin"))
        .unwrap_or_else(|| panic!("no transfer line in:\n{text}"));
    assert!(
        line.contains("127.0.0.1 (token ") && line.contains("4096 bytes") && line.ends_with(": ok"),
        "{line}"
    );
    assert!(!text.contains(TOKEN), "a secret in the log: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The record of `op` on `path` among `recs`.
fn record<'a>(recs: &'a [Value], text: &str, op: &str, path: &str) -> &'a Value {
    recs.iter()
        .find(|r| r["op"] == op && r["path"] == path)
        .unwrap_or_else(|| panic!("no {op} of {path} in:\n{text}"))
}

/// The memory root's requests (`--mem`) are audited as the real roots' are.
#[test]
fn the_memory_root_is_audited() {
    let dir = scratch("audit-mem");
    let audit = dir.join("audit.jsonl");
    let s = serve_as(
        ferry(),
        "tcp",
        &[],
        &["--mem", "--audit-log", audit.to_str().unwrap()],
    );
    ok(&cp(&["zero:1M", &s.at("mem/null")], &[]));
    ok(&cp(&[&s.at("mem/zero/2M"), "null:"], &[]));
    fails(&cp(&["zero:1M", &s.at("mem/zero/1M")], &[]), 7, "read-only");
    let (text, recs) = records(&audit, 3);
    let put = record(&recs, &text, "put", "mem/null");
    assert_eq!(
        (put["result"].as_str(), put["bytes"].as_u64()),
        (Some("ok"), Some(1 << 20))
    );
    assert!(
        put["credential"].as_str().unwrap().starts_with("token "),
        "{put}"
    );
    let get = record(&recs, &text, "get", "mem/zero/2M");
    assert_eq!(
        (get["result"].as_str(), get["bytes"].as_u64()),
        (Some("ok"), Some(2 << 20))
    );
    let refused = record(&recs, &text, "put", "mem/zero/1M");
    assert_eq!(refused["result"], "error", "{refused}");
    assert!(!text.contains(TOKEN), "a secret in the audit: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The collective I/O face's opens and closes go to the same audit log: who opened which
/// file, and what the rank moved until its close.
#[test]
fn collective_io_opens_and_closes_are_audited() {
    use ferry_cio::{amode, Comm, File};
    let dir = scratch("audit-cio");
    let audit = dir.join("audit.jsonl");
    let s = serve_as(
        ferry(),
        "tcp",
        &[],
        &["--audit-log", audit.to_str().unwrap()],
    );
    let comm = Comm {
        job: u64::from(std::process::id()) << 8 | 1,
        rank: 0,
        size: 1,
    };
    let byte = ferry_dtype::Datatype::primitive(1).unwrap();
    let mut f = File::open_with(
        &s.addr,
        "d/c.bin",
        comm,
        amode::CREATE | amode::RDWR,
        TOKEN,
        &client_security(),
    )
    .unwrap();
    let data = pattern(10_000, 7);
    assert_eq!(f.write_at(0, &data, 10_000, &byte).unwrap(), 10_000);
    let mut back = vec![0u8; 4_000];
    assert_eq!(f.read_at(0, &mut back, 4_000, &byte).unwrap(), 4_000);
    f.close().unwrap();
    // The pin went to this test process's known hosts, beside its children's: one left in
    // the run's shared file would refuse the next server there on the same port.
    let pins = std::fs::read_to_string(security_dir().join("known_hosts")).unwrap_or_default();
    let host = s.addr.trim_start_matches("tcp://");
    assert!(pins.contains(host), "{host} not pinned in {pins}");
    assert!(File::open_with(
        &s.addr,
        "e/none",
        comm,
        amode::RDONLY,
        TOKEN,
        &client_security()
    )
    .is_err());
    let (text, recs) = records(&audit, 2);
    let open = record(&recs, &text, "open", "d/c.bin");
    assert_eq!(
        (open["face"].as_str(), open["result"].as_str()),
        (Some("cio"), Some("ok"))
    );
    assert!(
        open["credential"].as_str().unwrap().starts_with("token "),
        "{open}"
    );
    let close = record(&recs, &text, "close", "d/c.bin");
    assert_eq!(close["bytes"].as_u64(), Some(14_000), "{close}");
    assert_eq!(close["result"], "ok", "{close}");
    assert!(!text.contains(TOKEN), "a secret in the audit: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The block face writes one line per NBD session: its export, the bytes read and written,
/// how long it lasted.
#[test]
fn block_sessions_are_audited() {
    let found = std::process::Command::new("nbdcopy")
        .arg("--version")
        .output()
        .is_ok();
    assert!(
        found,
        "nbdcopy is not installed: install the Debian package libnbd-bin"
    );
    let dir = scratch("audit-nbd");
    let audit = dir.join("audit.jsonl");
    let img = dir.join("disk.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let src = dir.join("src.img");
    std::fs::write(&src, pattern(1 << 20, 5)).unwrap();
    let mut child = ferry()
        .args(["serve", "--audit-log", audit.to_str().unwrap()])
        .args(["--nbd-export", &format!("disk={}", img.display())])
        .args(["--nbd-listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = listening(&mut child, 1).remove(0);
    let nbdcopy = |from: &str, to: &str| {
        let mut c = std::process::Command::new("nbdcopy");
        c.args(["--connections=1", from, to]);
        let o = run(c);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let url = format!("{addr}/disk");
    nbdcopy(src.to_str().unwrap(), &url);
    nbdcopy(&url, dir.join("back.img").to_str().unwrap());
    let (text, recs) = records(&audit, 2);
    let _ = child.kill();
    let _ = child.wait();
    let sessions: Vec<&Value> = recs.iter().filter(|r| r["face"] == "block").collect();
    assert_eq!(sessions.len(), 2, "{text}");
    for s in &sessions {
        assert_eq!(
            (s["op"].as_str(), s["path"].as_str()),
            (Some("session"), Some("disk"))
        );
        assert_eq!(s["credential"], "anonymous", "{s}");
    }
    assert_eq!(sessions[0]["written"].as_u64(), Some(1 << 20), "{text}");
    assert_eq!(sessions[1]["read"].as_u64(), Some(1 << 20), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
