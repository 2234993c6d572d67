//! Memory-to-memory mode of `ferry cp` as real processes over loopback, on every driver:
//! a server's zero source into the client's null sink and the client's zero source into
//! the server's null sink move exactly SIZE bytes; damaged blocks are caught by the null
//! sink's CRC check and fetched again; zeros landing in real files are zeros; refusals.

mod common;

use common::*;

const BLOCK: u64 = 4 << 20;

fn serve(driver: &str, mem: bool, env: &[(&str, &str)]) -> Server {
    serve_as(ferry(), driver, env, if mem { &["--mem"] } else { &[] })
}

/// Two blocks and a partial one.
const SIZE: u64 = 2 * BLOCK + 12345;

/// Zero source → null sink both ways, exact byte counts; with blocks damaged on the way,
/// the null sink's CRC check catches each and it is sent again.
fn zero_to_null(driver: &str) {
    let s = serve(driver, true, &[]);
    let zero = s.at(&format!("mem/zero/{SIZE}"));
    // On loopback a copy without -p keeps one stream and opens nothing more, whatever
    // FERRY_UPFRONT_STREAMS asks for a long path.
    let v = ok(&cp(&[&zero, "null:"], &[("FERRY_UPFRONT_STREAMS", "4")]));
    assert_eq!(
        (v["files"].as_u64(), v["bytes"].as_u64()),
        (Some(1), Some(SIZE)),
        "{v}"
    );
    assert_eq!(v["blocks_resent"].as_u64(), Some(0), "{v}");
    assert_eq!(
        (
            v["path"]["streams"].as_u64(),
            v["path"]["streams_auto"].as_bool()
        ),
        (Some(1), Some(true)),
        "{v}"
    );
    let v = ok(&cp(&[&format!("zero:{SIZE}"), &s.at("mem/null")], &[]));
    assert_eq!(
        (v["files"].as_u64(), v["bytes"].as_u64()),
        (Some(1), Some(SIZE)),
        "{v}"
    );
    // The client's own sender damages blocks: the server's null sink asks for them again.
    let v = ok(&cp(
        &[&format!("zero:{SIZE}"), &s.at("mem/null")],
        &[("FERRY_TEST_CORRUPT_BLOCKS", "2")],
    ));
    assert_eq!(v["blocks_resent"].as_u64(), Some(2), "{v}");
    assert_eq!(v["bytes"].as_u64(), Some(SIZE), "{v}");
    drop(s);
    // The server damages blocks: the client's null sink fetches them again.
    let s = serve(driver, true, &[("FERRY_TEST_CORRUPT_BLOCKS", "2")]);
    let v = ok(&cp(&[&s.at(&format!("mem/zero/{SIZE}")), "/dev/null"], &[]));
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
    let v = ok(&cp(&[&s.at("mem/zero/5M"), dest.to_str().unwrap()], &[]));
    assert_eq!(v["bytes"].as_u64(), Some(5 << 20));
    let got = std::fs::read(&dest).unwrap();
    assert!(got.len() == 5 << 20 && got.iter().all(|b| *b == 0));
    let v = ok(&cp(&["zero:3M", &s.at("d/z3")], &[]));
    assert_eq!(v["bytes"].as_u64(), Some(3 << 20));
    let got = std::fs::read(s.root.join("z3")).unwrap();
    assert!(got.len() == 3 << 20 && got.iter().all(|b| *b == 0));
    // In parallel, the zeros' hash made beside the streams is the one the server checks.
    let v = ok(&cp(&["-p", "2", "zero:40M", &s.at("d/z40")], &[]));
    assert_eq!(v["bytes"].as_u64(), Some(40 << 20));
    assert_eq!(
        std::fs::metadata(s.root.join("z40")).unwrap().len(),
        40 << 20
    );
    fails(
        &cp(&[&s.at("mem/null"), "null:"], &[]),
        1,
        "not a regular file",
    );
    fails(&cp(&["zero:1M", &s.at("mem/zero/1M")], &[]), 7, "read-only");
    fails(
        &cp(&[&s.at("mem/zero/lots"), "null:"], &[]),
        3,
        "name a size",
    );
    fails(&cp(&["zero:1M", "null:"], &[]), 1, "both ends are local");
    let mut sum = ferry();
    sum.args(["sum", "--token", TOKEN, &s.at("mem/zero/1M")]);
    let o = run(sum);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no checksums"));
    fails(&cp(&["null:", &s.at("mem/null")], &[]), 1, "sink only");
    drop(s);
    let s = serve("tcp", false, &[]);
    fails(
        &cp(&[&s.at("mem/zero/1M"), "null:"], &[]),
        3,
        "no root named",
    );
    std::fs::remove_dir_all(&local).unwrap();
}

/// A parallel upload of a zero source to a file sends data at once: the client used to hash
/// the whole size of zeros before the first block, so a terabyte sent nothing for minutes.
/// The hash is made beside the streams now. Seen in the server's root: the part file is
/// given its full size when the first block of zeros lands (as a hole), and not before.
#[test]
fn a_parallel_zero_upload_starts_at_once() {
    let s = serve_as(ferry(), "tcp", &[], &[]);
    let mut c = ferry();
    c.args(["cp", "--token", TOKEN, "-p", "2", "zero:1T", &s.url("big")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = c.spawn().expect("spawn ferry cp");
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let landed = loop {
        let largest = std::fs::read_dir(&s.root)
            .unwrap()
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .max()
            .unwrap_or(0);
        if largest > 0 || std::time::Instant::now() > end {
            break largest;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(landed, 1 << 40, "no block of the upload landed in 5 s");
}

/// A download of a server's zero source into `null:` on several streams starts moving
/// data at once: the client used to hash the source's whole size of zeros before its
/// first GET (for a check a null sink never makes: 0.7 s of a 2 GiB copy's set-up at
/// 50 ms), so a terabyte sent nothing for minutes. Seen through the server's audit log:
/// the GETs the client made before it was stopped carried data.
#[test]
fn a_parallel_zero_download_to_null_starts_at_once() {
    let dir = scratch("zero-start");
    let audit = dir.join("audit.jsonl");
    let s = serve_as(
        ferry(),
        "tcp",
        &[],
        &["--mem", "--audit-log", audit.to_str().unwrap()],
    );
    let mut c = ferry();
    c.args(["cp", "--token", TOKEN, "--json", "-p", "2"])
        .args([&s.at("mem/zero/1T"), "null:"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = c.spawn().expect("spawn ferry cp");
    std::thread::sleep(std::time::Duration::from_secs(3));
    let _ = child.kill();
    let _ = child.wait();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let moved = loop {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        let moved: u64 = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|r| r["op"] == "get" && r["path"] == "mem/zero/1T")
            .filter_map(|r| r["bytes"].as_u64())
            .sum();
        if moved > 0 || std::time::Instant::now() > end {
            break (moved, text);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(moved.0 > 0, "no data moved in 3 s; audit log:\n{}", moved.1);
}
