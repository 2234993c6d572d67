//! Memory-to-memory mode of `ferry cp` as real processes over loopback, on every driver:
//! a server's zero source into the client's null sink and the client's zero source into
//! the server's null sink move exactly SIZE bytes; damaged blocks are caught by the null
//! sink's CRC check and fetched again; zeros landing in real files are zeros; refusals.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

const TOKEN: &str = "test-token-1";
const BLOCK: u64 = 4 << 20;

fn ferry() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferry"));
    c.env("RUST_LOG", "warn").env_remove("FERRY_TOKEN");
    c
}

fn scratch(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "ferry-mem-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A running `ferry serve`, killed on drop.
struct Server {
    child: Child,
    addr: String,
    root: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.root);
        // A killed ofi+shm server cannot remove its region in /dev/shm.
        if let Some(name) = self.addr.strip_prefix("ofi+shm://") {
            let _ = std::fs::remove_file(PathBuf::from("/dev/shm").join(name));
        }
    }
}

fn listen_url(driver: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    match driver {
        "ofi+shm" => format!("ofi+shm://ferry-mem-{}-{n}", std::process::id()),
        d => format!("{d}://127.0.0.1:0"),
    }
}

fn serve(driver: &str, mem: bool, env: &[(&str, &str)]) -> Server {
    let root = scratch("root");
    let mut cmd = ferry();
    if mem {
        cmd.arg("serve").arg("--mem");
    } else {
        cmd.arg("serve");
    }
    cmd.arg("--root")
        .arg(format!("d={}", root.display()))
        .args(["--listen", &listen_url(driver), "--token", TOKEN])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn ferry serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("serve printed {line:?}"))
        .to_string();
    Server { child, addr, root }
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.addr)
    }
}

fn run(mut c: Command) -> Output {
    c.output().expect("ferry runs")
}

fn cp(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = ferry();
    c.args(["cp", "--token", TOKEN, "--json"]).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    run(c)
}

fn json(o: &Output) -> Value {
    let text = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "stdout {text:?} is not one JSON ({e}); stderr: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

fn ok(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "ferry failed ({:?}): {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    json(o)
}

fn fails(o: &Output, code: i32, says: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert!(err.contains(says), "{says:?} not in: {err}");
}

/// Two blocks and a partial one.
const SIZE: u64 = 2 * BLOCK + 12345;

/// Zero source → null sink both ways, exact byte counts; with blocks damaged on the way,
/// the null sink's CRC check catches each and it is sent again.
fn zero_to_null(driver: &str) {
    let s = serve(driver, true, &[]);
    let zero = s.url(&format!("mem/zero/{SIZE}"));
    let v = ok(&cp(&[&zero, "null:"], &[]));
    assert_eq!(
        (v["files"].as_u64(), v["bytes"].as_u64()),
        (Some(1), Some(SIZE)),
        "{v}"
    );
    assert_eq!(v["blocks_resent"].as_u64(), Some(0), "{v}");
    let v = ok(&cp(&[&format!("zero:{SIZE}"), &s.url("mem/null")], &[]));
    assert_eq!(
        (v["files"].as_u64(), v["bytes"].as_u64()),
        (Some(1), Some(SIZE)),
        "{v}"
    );
    // The client's own sender damages blocks: the server's null sink asks for them again.
    let v = ok(&cp(
        &[&format!("zero:{SIZE}"), &s.url("mem/null")],
        &[("FERRY_TEST_CORRUPT_BLOCKS", "2")],
    ));
    assert_eq!(v["blocks_resent"].as_u64(), Some(2), "{v}");
    assert_eq!(v["bytes"].as_u64(), Some(SIZE), "{v}");
    drop(s);
    // The server damages blocks: the client's null sink fetches them again.
    let s = serve(driver, true, &[("FERRY_TEST_CORRUPT_BLOCKS", "2")]);
    let v = ok(&cp(
        &[&s.url(&format!("mem/zero/{SIZE}")), "/dev/null"],
        &[],
    ));
    assert_eq!(v["blocks_resent"].as_u64(), Some(2), "{v}");
    assert_eq!(v["bytes"].as_u64(), Some(SIZE), "{v}");
}

macro_rules! per_driver {
    ($($name:ident),*) => {
        mod tcp { $( #[test] fn $name() { super::$name("tcp") } )* }
        mod ofi_tcp { $( #[test] fn $name() { super::$name("ofi+tcp") } )* }
        mod ofi_shm { $( #[test] fn $name() { super::$name("ofi+shm") } )* }
    };
}

per_driver!(zero_to_null);

/// Zeros into real files (both ways) are zeros and pass the whole-file check; the memory
/// root refuses what it cannot do; a server without --mem has no such root.
#[test]
fn zeros_into_files_and_refusals() {
    let s = serve("tcp", true, &[]);
    let local = scratch("local");
    let dest = local.join("z");
    let v = ok(&cp(&[&s.url("mem/zero/5M"), dest.to_str().unwrap()], &[]));
    assert_eq!(v["bytes"].as_u64(), Some(5 << 20));
    let got = std::fs::read(&dest).unwrap();
    assert!(got.len() == 5 << 20 && got.iter().all(|b| *b == 0));
    let v = ok(&cp(&["zero:3M", &s.url("d/z3")], &[]));
    assert_eq!(v["bytes"].as_u64(), Some(3 << 20));
    let got = std::fs::read(s.root.join("z3")).unwrap();
    assert!(got.len() == 3 << 20 && got.iter().all(|b| *b == 0));
    fails(
        &cp(&[&s.url("mem/null"), "null:"], &[]),
        1,
        "not a regular file",
    );
    fails(
        &cp(&["zero:1M", &s.url("mem/zero/1M")], &[]),
        7,
        "read-only",
    );
    fails(
        &cp(&[&s.url("mem/zero/lots"), "null:"], &[]),
        3,
        "name a size",
    );
    fails(&cp(&["zero:1M", "null:"], &[]), 1, "both ends are local");
    let mut sum = ferry();
    sum.args(["sum", "--token", TOKEN, &s.url("mem/zero/1M")]);
    let o = run(sum);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no checksums"));
    fails(&cp(&["null:", &s.url("mem/null")], &[]), 1, "sink only");
    drop(s);
    let s = serve("tcp", false, &[]);
    fails(
        &cp(&[&s.url("mem/zero/1M"), "null:"], &[]),
        3,
        "no root named",
    );
    std::fs::remove_dir_all(&local).unwrap();
}
