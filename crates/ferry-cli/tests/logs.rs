//! `ferry serve`'s log as a file sees it: plain text (no colour codes when stderr is not a
//! terminal), no Rust module paths unless `-vv` asks, nothing but errors with `-q`.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

/// What a server started with `flags` logged (stderr to a file) while a client with a bad
/// token was refused, waiting up to `wait` for the refusal to appear.
fn server_log(flags: &[&str], wait: Duration) -> String {
    let dir = scratch("logs");
    let path = dir.join("serve.log");
    let file = std::fs::File::create(&path).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ferry"));
    cmd.env_remove("RUST_LOG")
        .env_remove("FERRY_LOG")
        .env_remove("NO_COLOR");
    let s = serve_logging(cmd, "tcp", &[], flags, Stdio::from(file));
    let mut c = ferry();
    c.args(["cp", "--token", "not-the-token", &s.url("x"), "/dev/null"]);
    let o = run(c);
    assert_eq!(o.status.code(), Some(2), "a bad token is refused");
    let end = Instant::now() + wait;
    let mut log = String::new();
    while Instant::now() < end {
        log = std::fs::read_to_string(&path).unwrap();
        if log.contains("authentication failed") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
    log
}

#[test]
fn a_log_file_gets_plain_lines_without_module_paths() {
    let log = server_log(&[], Duration::from_secs(10));
    assert!(
        log.contains("authentication failed"),
        "the refusal is logged: {log:?}"
    );
    assert!(!log.contains('\x1b'), "colour codes in a file: {log:?}");
    assert!(!log.contains("ferry_"), "module paths by default: {log:?}");
}

#[test]
fn very_verbose_names_the_modules() {
    let log = server_log(&["-vv"], Duration::from_secs(10));
    assert!(
        log.contains("authentication failed"),
        "the refusal is logged: {log:?}"
    );
    assert!(
        log.contains("ferry_service::"),
        "no module paths with -vv: {log:?}"
    );
    assert!(!log.contains('\x1b'), "colour codes in a file: {log:?}");
}

#[test]
fn quiet_keeps_errors_only() {
    let log = server_log(&["-q"], Duration::from_secs(1));
    assert!(
        !log.contains("authentication failed"),
        "-q logged info: {log:?}"
    );
    assert!(!log.contains("INFO") && !log.contains("WARN"), "{log:?}");
}
