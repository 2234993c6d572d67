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
