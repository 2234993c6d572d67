//! Secrets off the command line: `ferry token new`, `ferry serve --token-file` and
//! `FERRY_TOKEN` for the server, the warnings about secrets others can guess, and the
//! refusal of token files others can read.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

/// `ferry token new --file PATH`: a private file with a fresh 48-hex-digit token.
fn new_token_file(path: &std::path::Path) -> String {
    let mut c = ferry();
    c.args(["token", "new", "--file"]).arg(path);
    let o = run(c);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a token file others can read");
    let token = std::fs::read_to_string(path).unwrap().trim().to_string();
    assert_eq!(token.len(), 48);
    token
}

/// Starts a server with `args` and the environment `env`, its log (info and up) in a file;
/// returns it and the log's path.
fn serve_with(args: &[&str], env: &[(&str, &str)]) -> (Server, std::path::PathBuf) {
    let log = scratch("secrets-log").join("serve.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut cmd = ferry();
    cmd.env("RUST_LOG", "info");
    (serve_logging(cmd, "tcp", env, args, Stdio::from(file)), log)
}

/// Waits up to a few seconds for `log` to contain `what`.
fn logged(log: &std::path::Path, what: &str) -> String {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(what) || Instant::now() > end {
            return text;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Copies `src` to `dst` with `token`; the exit status.
fn cp_with(token: &str, src: &str, dst: &str) -> Option<i32> {
    let mut c = ferry();
    c.args(["cp", "--token", token, src, dst]);
    run(c).status.code()
}

#[test]
fn tokens_come_from_files_and_the_environment() {
    let dir = scratch("secrets");
    let file = dir.join("tokens");
    let from_file = new_token_file(&file);
    let mut again = ferry();
    again.args(["token", "new", "--file"]).arg(&file);
    assert_eq!(
        run(again).status.code(),
        Some(5),
        "an existing token file is not replaced"
    );
    let from_env = "an-environment-token-0123456789";
    let (s, log) = serve_with(
        &["--token-file", file.to_str().unwrap()],
        &[("FERRY_TOKEN", from_env)],
    );
    let src = dir.join("a");
    std::fs::write(&src, b"secret-free payload").unwrap();
    let src = src.to_str().unwrap();
    assert_eq!(cp_with(&from_file, src, &s.url("a")), Some(0));
    assert_eq!(cp_with(from_env, src, &s.url("b")), Some(0));
    assert_eq!(
        cp_with("a-wrong-token-0123456789", src, &s.url("c")),
        Some(2)
    );
    // TOKEN (common's --token) is short and on the command line: both warned about; the
    // private token file is not.
    let text = logged(&log, "easy to guess");
    assert!(text.contains("visible to every user"), "{text}");
    assert!(text.contains("easy to guess"), "{text}");
    assert!(!text.contains("others may read"), "{text}");
    // The start-up lines say what is exported and how a client reaches it.
    assert!(
        text.contains(&format!("exporting d = {}", s.root.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("from a client: ferry cp FILE {}/d/", s.addr)),
        "{text}"
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn secret_files_others_can_read_are_refused() {
    let dir = scratch("secrets-open");
    let file = dir.join("tokens");
    std::fs::write(&file, "an-open-token-0123456789\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let mut c = ferry();
    c.args(["serve", "--root", &format!("d={}", dir.display())])
        .args(["--listen", "tcp://127.0.0.1:0", "--token-file"])
        .arg(&file);
    let o = run(c);
    fails(&o, 7, "others may read or write it (mode 640)");
    fails(&o, 7, &format!("chmod 600 {}", file.display()));

    let empty = dir.join("empty");
    std::fs::write(&empty, "# no token yet\n").unwrap();
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut c = ferry();
    c.args(["serve", "--root", &format!("d={}", dir.display())])
        .args(["--listen", "tcp://127.0.0.1:0", "--token-file"])
        .arg(&empty);
    fails(&run(c), 1, "no token in it");
    let _ = std::fs::remove_dir_all(&dir);
}
