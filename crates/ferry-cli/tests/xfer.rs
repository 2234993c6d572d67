//! `ferry serve` and `ferry cp`/`ls`/`sum` as real processes over loopback, on every driver:
//! byte-identical files around the block size, trees, auth refusals, sandbox escapes,
//! corrupted blocks caught and re-fetched, and exit codes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::*;

const BLOCK: usize = 4 << 20;

fn serve(driver: &str, env: &[(&str, &str)]) -> Server {
    serve_as(ferry(), driver, env, &[])
}

/// A server with more command-line arguments.
fn serve_with(driver: &str, env: &[(&str, &str)], args: &[&str]) -> Server {
    serve_as(ferry(), driver, env, args)
}

fn no_part_files(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!n.ends_with(".ferry-part"), "left behind: {n}");
    }
}

/// The staging ring's helper threads (writer, hasher) on for tcp and ofi+shm, off (work on
/// the network thread, the default on small hosts) for ofi+tcp, so both paths are tested.
fn threads(driver: &str) -> [(&'static str, &'static str); 1] {
    [(
        "FERRY_STAGING_THREADS",
        if driver == "ofi+tcp" { "off" } else { "on" },
    )]
}

/// Files of 0, 1, block-1, block, block+1 bytes and 64 MiB, down and up, byte-identical.
fn sizes(driver: &str) {
    let env = threads(driver);
    let s = serve(driver, &env);
    let local = scratch("local");
    for (i, len) in [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 64 << 20]
        .into_iter()
        .enumerate()
    {
        let name = format!("f{len}");
        std::fs::write(s.root.join(&name), pattern(len, i as u8)).unwrap();
        // Download.
        let v = ok(&cp(&[&s.url(&name), local.to_str().unwrap()], &[]));
        assert_eq!(
            (v["files"].as_u64(), v["bytes"].as_u64()),
            (Some(1), Some(len as u64))
        );
        same_file(&s.root.join(&name), &local.join(&name));
        // Upload under another name.
        let up = format!("up{len}");
        let v = ok(&cp(
            &[local.join(&name).to_str().unwrap(), &s.url(&up)],
            &[],
        ));
        assert_eq!(v["bytes"].as_u64(), Some(len as u64));
        same_file(&local.join(&name), &s.root.join(&up));
    }
    no_part_files(&s.root);
    no_part_files(&local);
    std::fs::remove_dir_all(&local).unwrap();
}

/// A tree down and up, with nested directories; `ls` and `sum` agree with it.
fn tree(driver: &str) {
    let s = serve(driver, &[]);
    let src = s.root.join("tree");
    make_tree(&src, 100);
    let local = scratch("local");
    let v = ok(&cp(&["-r", &s.url("tree"), local.to_str().unwrap()], &[]));
    assert_eq!(v["files"].as_u64(), Some(100));
    same_tree(&src, &local.join("tree"));
    let v = ok(&cp(
        &["-r", local.join("tree").to_str().unwrap(), &s.url("back")],
        &[],
    ));
    assert_eq!(v["files"].as_u64(), Some(100));
    same_tree(&src, &s.root.join("back/tree"));
    // ls and sum.
    let o = run({
        let mut c = ferry();
        c.args(["ls", "--token", TOKEN, &s.url("tree")]);
        c
    });
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && text.contains("d0/") && text.contains("empty/"),
        "{text}"
    );
    let o = run({
        let mut c = ferry();
        c.args(["ls", "-l", "--token", TOKEN, &s.url("tree/d0")]);
        c
    });
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && text.contains(" f0\n") && text.contains("e0/"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("-rw") && l.ends_with(" f0")),
        "-l shows the mode: {text}"
    );
    // A file lists itself; a path that is not there fails and says so (the STAT and LIST
    // went with the handshake, the LIST refused for both).
    let ls = |path: &str| {
        run({
            let mut c = ferry();
            c.args(["ls", "--token", TOKEN, &s.url(path)]);
            c
        })
    };
    let o = ls("tree/d0/f0");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && text == "f0\n", "{text}");
    let o = ls("tree/nothing-here");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("nothing-here"), "{err}");
    // -R --json: every file of the tree, with its exact size, once.
    let o = run({
        let mut c = ferry();
        c.args(["ls", "-R", "--json", "--token", TOKEN, &s.url("tree")]);
        c
    });
    let text = String::from_utf8_lossy(&o.stdout);
    let files: Vec<serde_json::Value> = (text.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["kind"] == "file")
        .collect();
    assert_eq!(files.len(), 100, "{text}");
    for f in &files {
        let path = f["path"].as_str().unwrap();
        let len = std::fs::metadata(src.join(path)).unwrap().len();
        assert_eq!(f["size"].as_u64(), Some(len), "{f}");
    }
    let sum = |target: &str| {
        let mut c = ferry();
        c.args(["sum", "--token", TOKEN, target]);
        let o = run(c);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string()
    };
    let remote = sum(&s.url("tree/d0/f0"));
    let here = sum(src.join("d0/f0").to_str().unwrap());
    assert_eq!(remote.len(), 64);
    assert_eq!(remote, here);
    // A directory has no sum, and ferry sum has no -r to suggest.
    let mut c = ferry();
    c.args(["sum", "--token", TOKEN, &s.url("tree/d0")]);
    let o = run(c);
    fails(&o, 1, "is a directory");
    assert!(!String::from_utf8_lossy(&o.stderr).contains("-r"), "{o:?}");
    std::fs::remove_dir_all(&local).unwrap();
}

fn make_tree(root: &Path, files: usize) {
    for i in 0..files {
        let d = root
            .join(format!("d{}", i % 10))
            .join(format!("e{}", i % 3));
        let d = if i % 7 == 0 {
            root.join(format!("d{}", i % 10))
        } else {
            d
        };
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}")), pattern(i * 37 % 5000, i as u8)).unwrap();
    }
    std::fs::create_dir_all(root.join("empty")).unwrap();
}

/// Corrupted blocks are caught by their CRC and fetched again, both directions; corruption
/// that never stops fails loudly with exit 4 and leaves nothing behind.
fn corruption(driver: &str) {
    // With the writer and hasher threads, so re-fetches cross the writer's sync.
    const ON: (&str, &str) = ("FERRY_STAGING_THREADS", "on");
    let s = serve(driver, &[("FERRY_TEST_CORRUPT_BLOCKS", "2"), ON]);
    let local = scratch("local");
    let data = pattern(3 * BLOCK + 5, 9);
    std::fs::write(s.root.join("c"), &data).unwrap();
    let v = ok(&cp(&[&s.url("c"), local.to_str().unwrap()], &[ON]));
    assert_eq!(v["blocks_resent"].as_u64(), Some(2), "{v}");
    same_file(&s.root.join("c"), &local.join("c"));
    // Small files come as one FILE frame each (protocol 1.3): a damaged one is fetched again
    // by a ranged GET, and every file lands whole.
    let t = serve(driver, &[("FERRY_TEST_CORRUPT_BLOCKS", "2")]);
    std::fs::create_dir(t.root.join("t")).unwrap();
    for i in 0..6 {
        let f = t.root.join("t").join(format!("f{i}"));
        std::fs::write(f, pattern(1000 + 7 * i, i as u8)).unwrap();
    }
    let v = ok(&cp(&["-r", &t.url("t"), local.to_str().unwrap()], &[]));
    assert_eq!(v["blocks_resent"].as_u64(), Some(2), "{v}");
    assert_eq!(v["files"].as_u64(), Some(6), "{v}");
    for i in 0..6 {
        let f = format!("f{i}");
        same_file(&t.root.join("t").join(&f), &local.join("t").join(&f));
    }
    no_part_files(&local);
    drop(t);
    let v = ok(&cp(
        &[local.join("c").to_str().unwrap(), &s.url("c2")],
        &[("FERRY_TEST_CORRUPT_BLOCKS", "1"), ON],
    ));
    assert_eq!(v["blocks_resent"].as_u64(), Some(1), "{v}");
    same_file(&local.join("c"), &s.root.join("c2"));
    // Small files go up as one PUT_FILE frame each (protocol 1.4): the server refuses a
    // damaged one (BLAKE3), it goes again by PUT, and every file lands whole.
    let v = ok(&cp(
        &["-r", local.join("t").to_str().unwrap(), &s.url("up")],
        &[("FERRY_TEST_CORRUPT_BLOCKS", "2")],
    ));
    assert_eq!(v["blocks_resent"].as_u64(), Some(2), "{v}");
    assert_eq!(v["files"].as_u64(), Some(6), "{v}");
    for i in 0..6 {
        let f = format!("f{i}");
        same_file(&local.join("t").join(&f), &s.root.join("up/t").join(&f));
    }
    no_part_files(&s.root);
    // Upload that never gets through.
    let o = cp(
        &[local.join("c").to_str().unwrap(), &s.url("c3")],
        &[("FERRY_TEST_CORRUPT_BLOCKS", "1000"), ON],
    );
    fails(&o, 4, "CRC");
    assert_eq!(json(&o)["exit_code"].as_u64(), Some(4));
    assert!(!s.root.join("c3").exists());
    no_part_files(&s.root);
    drop(s);
    // Download that never gets through.
    let s = serve(driver, &[("FERRY_TEST_CORRUPT_BLOCKS", "1000"), ON]);
    std::fs::write(s.root.join("c"), &data).unwrap();
    let dest = local.join("never");
    fails(&cp(&[&s.url("c"), dest.to_str().unwrap()], &[ON]), 4, "CRC");
    assert!(!dest.exists());
    no_part_files(&local);
    std::fs::remove_dir_all(&local).unwrap();
}

/// Wrong or missing token: exit 2 with what to do; the server keeps serving others.
fn auth(driver: &str) {
    let s = serve(driver, &[]);
    std::fs::write(s.root.join("a"), b"abc").unwrap();
    let local = scratch("local");
    let mut c = ferry();
    c.args([
        "cp",
        "--token",
        "wrong",
        &s.url("a"),
        local.to_str().unwrap(),
    ]);
    fails(&run(c), 2, "token was not accepted");
    let mut c = ferry();
    c.args(["cp", &s.url("a"), local.to_str().unwrap()]);
    fails(&run(c), 2, "FERRY_TOKEN");
    // FERRY_TOKEN works like --token, and the server still serves.
    let mut c = ferry();
    c.env("FERRY_TOKEN", TOKEN)
        .args(["cp", "-q", &s.url("a"), local.to_str().unwrap()]);
    let o = run(c);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stderr.is_empty(), "-q printed something");
    assert_eq!(std::fs::read(local.join("a")).unwrap(), b"abc");
    // Without -q, one summary line in the progress bar's units.
    let mut c = ferry();
    c.env("FERRY_TOKEN", TOKEN)
        .args(["cp", &s.url("a"), local.join("b").to_str().unwrap()]);
    let o = run(c);
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(said.starts_with("1 file(s), 3 B in "), "{said}");
    assert!(said.trim_end().ends_with("/s)"), "{said}");
    std::fs::remove_dir_all(&local).unwrap();
}

/// `..`, absolute paths and symlink escapes are refused (exit 7), down and up; missing files
/// are exit 3; a directory without -r is exit 1.
fn sandbox(driver: &str) {
    let s = serve(driver, &[]);
    let outside = scratch("outside");
    std::fs::write(outside.join("secret"), b"secret").unwrap();
    std::os::unix::fs::symlink(&outside, s.root.join("link")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), s.root.join("flink")).unwrap();
    std::fs::create_dir(s.root.join("sub")).unwrap();
    std::fs::write(s.root.join("sub/in"), b"in").unwrap();
    std::os::unix::fs::symlink("../sub/in", s.root.join("sub/inner-ok")).unwrap();
    let local = scratch("local");
    let dst = local.join("x");
    let dst = dst.to_str().unwrap();
    for bad in [
        "../".to_string() + outside.file_name().unwrap().to_str().unwrap() + "/secret",
        "sub/../../x".into(),
        "/etc/passwd".into(),
        "link/secret".into(),
        "flink".into(),
    ] {
        let o = cp(&[&s.url(&bad), dst], &[]);
        fails(&o, 7, "refused");
        assert!(!local.join("x").exists());
        // Uploads through the same paths are refused too.
        std::fs::write(local.join("up"), b"up").unwrap();
        let o = cp(&[local.join("up").to_str().unwrap(), &s.url(&bad)], &[]);
        assert!(
            matches!(o.status.code(), Some(7)),
            "upload to {bad}: {:?} {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"secret");
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        1,
        "nothing written outside"
    );
    // A symlink that stays inside is fine.
    ok(&cp(&[&s.url("sub/inner-ok"), dst], &[]));
    assert_eq!(std::fs::read(dst).unwrap(), b"in");
    // Missing files, remote and local.
    fails(&cp(&[&s.url("nope"), dst], &[]), 3, "nope");
    fails(
        &cp(&[local.join("nope").to_str().unwrap(), &s.url("n")], &[]),
        3,
        "nope",
    );
    // No such root.
    fails(
        &cp(&[&format!("{}/zz/a", s.addr), dst], &[]),
        3,
        "no root named",
    );
    // Directories need -r.
    fails(&cp(&[&s.url("sub"), dst], &[]), 1, "use -r");
    std::fs::remove_dir_all(&local).unwrap();
    std::fs::remove_dir_all(&outside).unwrap();
}

macro_rules! on_all_drivers {
    ($($name:ident),*) => {
        mod tcp { $( #[test] fn $name() { super::$name("tcp") } )* }
        mod ofi_tcp { $( #[test] fn $name() { super::$name("ofi+tcp") } )* }
        mod ofi_shm { $( #[test] fn $name() { super::$name("ofi+shm") } )* }
    };
}

on_all_drivers!(
    sizes,
    tree,
    corruption,
    auth,
    sandbox,
    third_party,
    unreadable,
    disk_full
);

/// Server-to-server copies: a file and a tree go from A straight to B; A copies only to
/// the destinations its operator allowed, and B's own token check still applies.
fn third_party(driver: &str) {
    let b = serve(driver, &[]);
    let a = serve_with(driver, &[], &["--allow-third-party", &b.addr]);
    std::fs::write(a.root.join("big"), pattern(BLOCK * 2 + 5, 9)).unwrap();
    make_tree(&a.root.join("tree"), 30);

    let v = ok(&cp(&[&a.url("big"), &b.url("")], &[]));
    assert_eq!(
        (v["files"].as_u64(), v["bytes"].as_u64()),
        (Some(1), Some(BLOCK as u64 * 2 + 5))
    );
    same_file(&a.root.join("big"), &b.root.join("big"));
    // A symbolic link in the tree stays behind, and the client is told (protocol 1.9).
    std::os::unix::fs::symlink("f0", a.root.join("tree/link")).unwrap();
    let v = ok(&cp(&["-r", &a.url("tree/"), &b.url("copy")], &[]));
    assert_eq!(v["files"].as_u64(), Some(30));
    assert_eq!(v["entries_skipped"].as_u64(), Some(1), "{v}");
    std::fs::remove_file(a.root.join("tree/link")).unwrap();
    same_tree(&a.root.join("tree"), &b.root.join("copy"));
    no_part_files(&b.root);
    // Over 4 streams (protocol 1.4): the tree's files spread over them, and a file larger
    // than a chunk (64 MiB) goes up in ranges (OPEN, PUT_RANGE…, CLOSE).
    if driver == "tcp" {
        let huge = 64 * 1024 * 1024 + 5;
        std::fs::write(a.root.join("huge"), pattern(huge, 3)).unwrap();
        let v = ok(&cp(
            &["-p", "4", "-r", &a.url("tree/"), &b.url("copy4")],
            &[],
        ));
        assert_eq!(v["files"].as_u64(), Some(30), "{v}");
        same_tree(&a.root.join("tree"), &b.root.join("copy4"));
        let v = ok(&cp(&["-p", "4", &a.url("huge"), &b.url("huge4")], &[]));
        assert_eq!(v["bytes"].as_u64(), Some(huge as u64), "{v}");
        same_file(&a.root.join("huge"), &b.root.join("huge4"));
        no_part_files(&b.root);
        let _ = std::fs::remove_file(a.root.join("huge"));
        let _ = std::fs::remove_file(b.root.join("huge4"));
    }

    fails(&cp(&[&a.url("tree"), &b.url("t2")], &[]), 1, "use -r");
    let refused = cp(&["--dest-token", "wrong", &a.url("big"), &b.url("x")], &[]);
    fails(&refused, 2, "--dest-token");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !said.contains("check --token"),
        "advice for the wrong token: {said}"
    );
    // A destination A was not told about, and a server allowed none.
    let c = serve(driver, &[]);
    fails(
        &cp(&[&a.url("big"), &c.url("x")], &[]),
        7,
        "may not copy to",
    );
    fails(
        &cp(&[&b.url("big"), &a.url("back")], &[]),
        7,
        "makes no third-party copies",
    );
    assert!(!c.root.join("x").exists() && !a.root.join("back").exists());
}

/// `ferry` as a process that file permissions bind even when the tests run as root: the
/// capabilities that override them are dropped from its bounding set.
fn ferry_bound_by_permissions() -> Command {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0)
        != 0
    {
        return ferry();
    }
    let mut c = Command::new("setpriv");
    c.args(["--bounding-set=-dac_override,-dac_read_search", "--"])
        .arg(env!("CARGO_BIN_EXE_ferry"))
        .env("RUST_LOG", "warn")
        .env_remove("FERRY_TOKEN");
    isolate(&mut c);
    c
}

/// An unreadable source, remote or local, is a clear permission error (exit 7); nothing
/// lands, and the server goes on serving.
fn unreadable(driver: &str) {
    use std::os::unix::fs::PermissionsExt;
    let s = serve_as(ferry_bound_by_permissions(), driver, &[], &[]);
    let local = scratch("local");
    let locked = |p: &Path| {
        std::fs::write(p, b"secret").unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o000)).unwrap();
    };
    locked(&s.root.join("locked"));
    std::fs::write(s.root.join("open"), pattern(1000, 3)).unwrap();
    fails(
        &cp(&[&s.url("locked"), local.to_str().unwrap()], &[]),
        7,
        "ermission denied",
    );
    assert!(!local.join("locked").exists());
    no_part_files(&local);
    let o = run({
        let mut c = ferry_bound_by_permissions();
        c.args(["cp", "--token", TOKEN])
            .arg(local.join("mine"))
            .arg(s.url("mine"));
        locked(&local.join("mine"));
        c
    });
    fails(&o, 7, "ermission denied");
    assert!(!s.root.join("mine").exists());
    ok(&cp(&[&s.url("open"), local.to_str().unwrap()], &[]));
    same_file(&s.root.join("open"), &local.join("open"));
    std::fs::remove_dir_all(&local).unwrap();
}

/// A small tmpfs, unmounted on drop.
struct SmallDisk(PathBuf);

impl SmallDisk {
    /// Mounts `size` of tmpfs on a new directory (the tests run as root on the CI machine).
    fn mount(size: &str) -> SmallDisk {
        let d = scratch("small");
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&d)
            .output()
            .expect("run mount");
        assert!(
            o.status.success(),
            "mount tmpfs (needs root): {}",
            String::from_utf8_lossy(&o.stderr)
        );
        SmallDisk(d)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A full disk on either side is exit 5 with a message that says so; nothing half-written
/// is left, and the server goes on serving.
fn disk_full(driver: &str) {
    let s = serve(driver, &[]);
    let small = SmallDisk::mount("8m");
    std::fs::write(s.root.join("big"), pattern(12 << 20, 5)).unwrap();
    // Download onto the small disk.
    fails(
        &cp(&[&s.url("big"), small.0.to_str().unwrap()], &[]),
        5,
        "disk is full",
    );
    assert_eq!(std::fs::read_dir(&small.0).unwrap().count(), 0);
    // Upload to a server whose root is the small disk.
    let full = serve_with(
        driver,
        &[],
        &["--root", &format!("s={}", small.0.display())],
    );
    let o = cp(
        &[
            s.root.join("big").to_str().unwrap(),
            &format!("{}/s/big", full.addr),
        ],
        &[],
    );
    fails(&o, 5, "no space");
    assert_eq!(std::fs::read_dir(&small.0).unwrap().count(), 0);
    // Over four streams (the file in 2 MiB chunks): the part and its journal go too, once
    // the session ends.
    let o = cp(
        &[
            "-p",
            "4",
            "--chunk-size",
            "2097152",
            s.root.join("big").to_str().unwrap(),
            &format!("{}/s/big", full.addr),
        ],
        &[],
    );
    assert_eq!(
        o.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let t = std::time::Instant::now();
    while std::fs::read_dir(&small.0).unwrap().count() > 0 && t.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let left: Vec<_> = std::fs::read_dir(&small.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    // The space came back, and the server still serves.
    std::fs::write(s.root.join("small"), pattern(1 << 20, 6)).unwrap();
    ok(&cp(
        &[
            s.root.join("small").to_str().unwrap(),
            &format!("{}/s/small", full.addr),
        ],
        &[],
    ));
    same_file(&s.root.join("small"), &small.0.join("small"));
    drop(full);
}

fn big_tree(files: usize) {
    let s = serve("tcp", &[]);
    let src = s.root.join("many");
    make_tree(&src, files);
    let local = scratch("local");
    let t = std::time::Instant::now();
    let v = ok(&cp(&["-r", &s.url("many"), local.to_str().unwrap()], &[]));
    let down = t.elapsed();
    assert_eq!(v["files"].as_u64(), Some(files as u64));
    same_tree(&src, &local.join("many"));
    // Over loopback a tree download without -p opens a stream per core (at most four).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let want = cores.clamp(1, 4) as u64;
    assert_eq!(v["path"]["streams"].as_u64(), Some(want), "{v}");
    let t = std::time::Instant::now();
    let v = ok(&cp(
        &["-r", local.join("many").to_str().unwrap(), &s.url("back")],
        &[],
    ));
    let up = t.elapsed();
    assert_eq!(v["files"].as_u64(), Some(files as u64));
    assert_eq!(
        v["path"]["streams"].as_u64(),
        Some(1),
        "an upload keeps one: {v}"
    );
    same_tree(&src, &s.root.join("back/many"));
    eprintln!("{files} files: down {down:?}, up {up:?}");
    std::fs::remove_dir_all(&local).unwrap();
}

/// The first `(what, type)` mark's line in a client's timeline (`FERRY_TIMELINE`): its
/// position in the order the process recorded them.
fn first_mark(lines: &[(String, u64)], what: &str, kind: u64) -> usize {
    lines
        .iter()
        .position(|(w, k)| w == what && *k == kind)
        .unwrap_or_else(|| panic!("no {what} {kind} in the timeline: {lines:?}"))
}

/// A tree copy's handshake does not wait for its answers: over TLS the client sends the
/// SELECT, HELLO, PROTECT and the tree's STAT and LIST before SELECTED and WELCOME come
/// back (frame types from the client's own timeline, in the order it recorded them), and
/// waits for each answer in turn with `FERRY_PIPELINE_HANDSHAKE=0` (so the assertion can
/// fail). The copies are byte-identical either way.
#[test]
fn a_tree_copy_sends_its_first_requests_with_the_handshake() {
    let s = serve("tcp", &[]);
    let src = s.root.join("tree");
    make_tree(&src, 30);
    for pipelined in [true, false] {
        let marks = scratch("timeline");
        let local = scratch("local");
        let prefix = marks.join("t");
        let mut env = vec![("FERRY_TIMELINE", prefix.to_str().unwrap())];
        if !pipelined {
            env.push(("FERRY_PIPELINE_HANDSHAKE", "0"));
        }
        let v = ok(&cp(&["-r", &s.url("tree"), local.to_str().unwrap()], &env));
        assert_eq!(v["files"].as_u64(), Some(30));
        same_tree(&src, &local.join("tree"));
        let file = std::fs::read_dir(&marks).unwrap().next().unwrap().unwrap();
        let text = std::fs::read_to_string(file.path()).unwrap();
        // `ns thread what type`; a process records its marks in order.
        let lines: Vec<(String, u64)> = text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (f.len() == 4 && f[2].starts_with("chan."))
                    .then(|| (f[2].to_string(), f[3].parse().unwrap()))
            })
            .collect();
        let (hello, stat, list) = (
            first_mark(&lines, "chan.tx", 1),
            first_mark(&lines, "chan.tx", 4),
            first_mark(&lines, "chan.tx", 6),
        );
        let (selected, welcome, entry) = (
            first_mark(&lines, "chan.rx", 0xF1),
            first_mark(&lines, "chan.rx", 2),
            first_mark(&lines, "chan.rx", 5),
        );
        assert!(hello < stat && stat < list && selected < welcome && welcome < entry);
        if pipelined {
            assert!(
                list < selected,
                "the HELLO, STAT and LIST left before SELECTED arrived: {lines:?}"
            );
        } else {
            assert!(
                selected < hello && welcome < stat,
                "each waited for the answer before it: {lines:?}"
            );
        }
        std::fs::remove_dir_all(&marks).unwrap();
        std::fs::remove_dir_all(&local).unwrap();
    }
}

/// 1,000 small files down and up (tcp).
#[test]
fn thousand_small_files() {
    big_tree(1000);
}

/// The issue's 10,000 small files, down and up (about 25 s in a debug build on 2 cores).
#[test]
fn ten_thousand_small_files() {
    big_tree(10_000);
}

/// 1 GiB down and up (about 25 s in a debug build on 2 cores).
#[test]
fn one_gib() {
    let s = serve("tcp", &[]);
    let local = scratch("local");
    let mut f = std::fs::File::create(s.root.join("g")).unwrap();
    for i in 0..256 {
        f.write_all(&pattern(4 << 20, i as u8)).unwrap();
    }
    drop(f);
    ok(&cp(&[&s.url("g"), local.to_str().unwrap()], &[]));
    same_file(&s.root.join("g"), &local.join("g"));
    std::fs::remove_dir_all(&local).unwrap();
}

/// A client that sends garbage loses only its own connection.
#[test]
fn garbage_client_does_not_hurt_others() {
    let s = serve("tcp", &[]);
    std::fs::write(s.root.join("a"), b"abc").unwrap();
    let hostport = s.addr.trim_start_matches("tcp://").to_string();
    let mut junk = std::net::TcpStream::connect(&hostport).unwrap();
    let _ = junk.write_all(&[0xff; 4096]);
    let mut half = std::net::TcpStream::connect(&hostport).unwrap();
    let _ = half.write_all(&[1, 0]);
    let local = scratch("local");
    ok(&cp(&[&s.url("a"), local.to_str().unwrap()], &[]));
    assert_eq!(std::fs::read(local.join("a")).unwrap(), b"abc");
    drop((junk, half));
    std::fs::remove_dir_all(&local).unwrap();
}

/// Usage errors exit 1; --help documents the exit codes; serve refuses to start without auth.
#[test]
fn usage_and_help() {
    let mut c = ferry();
    c.args(["cp", "--help"]);
    let text = String::from_utf8_lossy(&run(c).stdout).into_owned();
    for s in ["Exit codes", "integrity", "--token", "-r"] {
        assert!(text.contains(s), "{s} missing from {text}");
    }
    let mut c = ferry();
    c.args(["cp", "--bogus"]);
    assert_eq!(run(c).status.code(), Some(1));
    let mut c = ferry();
    c.args(["cp", "a", "b"]);
    fails(&run(c), 1, "one of SRC and DST must be remote");
    let mut c = ferry();
    c.args(["serve", "--root", "d=/tmp", "--listen", "tcp://127.0.0.1:0"]);
    fails(&run(c), 1, "anonymous");
}

/// Several clients at once, downloading and uploading against one server.
#[test]
fn many_clients_at_once() {
    let s = serve("tcp", &[]);
    let data = pattern(9 << 20, 4);
    std::fs::write(s.root.join("shared"), &data).unwrap();
    let local = scratch("local");
    std::fs::write(local.join("up"), &data).unwrap();
    let mut kids = Vec::new();
    for i in 0..4 {
        let mut c = ferry();
        c.args(["cp", "-q", "--token", TOKEN, &s.url("shared")])
            .arg(local.join(format!("down{i}")));
        kids.push(c.spawn().unwrap());
        let mut c = ferry();
        c.args(["cp", "-q", "--token", TOKEN])
            .arg(local.join("up"))
            .arg(s.url(&format!("up{i}")));
        kids.push(c.spawn().unwrap());
    }
    for mut k in kids {
        assert!(k.wait().unwrap().success());
    }
    for i in 0..4 {
        same_file(&s.root.join("shared"), &local.join(format!("down{i}")));
        same_file(&local.join("up"), &s.root.join(format!("up{i}")));
    }
    std::fs::remove_dir_all(&local).unwrap();
}

/// Bytes a file has allocated on its disk.
fn allocated(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().blocks() * 512
}

/// A sparse file (64 MiB, 3 MiB of data) keeps its holes both ways, over one stream, over
/// four, and with direct I/O: identical content, a few MiB allocated.
#[test]
fn sparse_files_stay_sparse() {
    use std::os::unix::fs::FileExt;
    let s = serve("tcp", &[]);
    let local = scratch("sparse");
    let src = local.join("src");
    let f = std::fs::File::create(&src).unwrap();
    f.set_len(64 << 20).unwrap();
    for (at, seed) in [(0u64, 1u8), (20 << 20, 2), (41 << 20, 3)] {
        f.write_all_at(&pattern(1 << 20, seed), at).unwrap();
    }
    drop(f);
    assert!(allocated(&src) <= 4 << 20, "{}", allocated(&src));
    let runs: [&[&str]; 3] = [&[], &["-p", "4", "--chunk-size", "8388608"], &["--direct"]];
    for (i, extra) in runs.iter().enumerate() {
        let up = s.root.join(format!("up{i}"));
        let mut args = extra.to_vec();
        let url = s.url(&format!("up{i}"));
        args.extend([src.to_str().unwrap(), &url]);
        ok(&cp(&args, &[]));
        same_file(&src, &up);
        assert!(
            allocated(&up) < 8 << 20,
            "{extra:?} upload: {} allocated",
            allocated(&up)
        );
        let down = local.join(format!("down{i}"));
        let mut args = extra.to_vec();
        args.extend([url.as_str(), down.to_str().unwrap()]);
        ok(&cp(&args, &[]));
        same_file(&src, &down);
        assert!(
            allocated(&down) < 8 << 20,
            "{extra:?} download: {} allocated",
            allocated(&down)
        );
    }
}

/// A read-only file is not replaced, uploading or downloading, without --force (exit 7,
/// nothing moved); with it, it is. Setuid and setgid bits do not travel either way.
#[test]
fn read_only_destinations_need_force_and_setuid_does_not_travel() {
    use std::os::unix::fs::PermissionsExt;
    let s = serve("tcp", &[]);
    let local = scratch("readonly");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let read_only = |p: &Path, data: &[u8]| {
        std::fs::write(p, data).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o444)).unwrap();
    };
    std::fs::write(local.join("f"), b"new").unwrap();
    read_only(&s.root.join("f"), b"old");
    let src = local.join("f");
    fails(
        &cp(&[src.to_str().unwrap(), &s.url("f")], &[]),
        7,
        "read-only",
    );
    assert_eq!(std::fs::read(s.root.join("f")).unwrap(), b"old");
    no_part_files(&s.root);
    ok(&cp(&["--force", src.to_str().unwrap(), &s.url("f")], &[]));
    assert_eq!(std::fs::read(s.root.join("f")).unwrap(), b"new");
    // Downloading onto a read-only local file.
    std::fs::write(s.root.join("g"), b"new").unwrap();
    let g = local.join("g");
    read_only(&g, b"old");
    fails(
        &cp(&[&s.url("g"), g.to_str().unwrap()], &[]),
        7,
        "read-only",
    );
    assert_eq!(std::fs::read(&g).unwrap(), b"old");
    no_part_files(&local);
    ok(&cp(&["-f", &s.url("g"), g.to_str().unwrap()], &[]));
    assert_eq!(std::fs::read(&g).unwrap(), b"new");
    // Setuid and setgid bits are dropped both ways.
    std::fs::write(s.root.join("suid"), b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(s.root.join("suid"), std::fs::Permissions::from_mode(0o6755)).unwrap();
    ok(&cp(
        &[&s.url("suid"), local.join("suid").to_str().unwrap()],
        &[],
    ));
    assert_eq!(mode(&local.join("suid")) & 0o7000, 0);
    let up = local.join("lsuid");
    std::fs::write(&up, b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&up, std::fs::Permissions::from_mode(0o4755)).unwrap();
    ok(&cp(&[up.to_str().unwrap(), &s.url("lsuid")], &[]));
    assert_eq!(mode(&s.root.join("lsuid")) & 0o7000, 0);
    assert_eq!(mode(&s.root.join("lsuid")) & 0o111, 0o111);
    std::fs::remove_dir_all(&local).unwrap();
}

/// A FIFO is refused at once as a local source and as a remote one (the server's thread
/// is not stuck on it); `cp -r` skips one in a tree with a warning.
#[test]
fn fifos_are_refused_not_waited_on() {
    use rustix::fs::{FileType, Mode, CWD};
    let s = serve("tcp", &[]);
    let local = scratch("fifo");
    let fifo = |p: &Path| {
        rustix::fs::mknodat(CWD, p, FileType::Fifo, Mode::from_raw_mode(0o666), 0).unwrap()
    };
    fifo(&local.join("p"));
    fifo(&s.root.join("p"));
    let t = std::time::Instant::now();
    fails(
        &cp(&[local.join("p").to_str().unwrap(), &s.url("x")], &[]),
        1,
        "regular file",
    );
    fails(
        &cp(&[&s.url("p"), local.join("y").to_str().unwrap()], &[]),
        1,
        "not a regular file",
    );
    assert!(t.elapsed().as_secs() < 10, "{:?}", t.elapsed());
    std::fs::create_dir(local.join("tree")).unwrap();
    std::fs::write(local.join("tree/a"), b"a").unwrap();
    fifo(&local.join("tree/p"));
    ok(&cp(
        &["-r", local.join("tree").to_str().unwrap(), &s.url("")],
        &[],
    ));
    assert_eq!(std::fs::read(s.root.join("tree/a")).unwrap(), b"a");
    assert!(!s.root.join("tree/p").exists());
    std::fs::remove_dir_all(&local).unwrap();
}

/// A host name that does not resolve is said to be one, not blamed on a server that is not
/// running; `HOST:PORT:PATH` names a port.
#[test]
fn an_unknown_host_is_named_and_ports_fit_the_short_form() {
    let mut c = ferry();
    c.args(["ls", "no-such-host.invalid:d/"]);
    let o = run(c);
    fails(&o, 6, "no such host");
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(!said.contains("ferry serve"), "{said}");

    let s = serve("tcp", &[]);
    std::fs::write(s.root.join("only-here"), b"x").unwrap();
    let port = s.addr.rsplit(':').next().unwrap();
    let mut c = ferry();
    c.args(["ls", "--token", TOKEN, &format!("127.0.0.1:{port}:d/")]);
    let o = run(c);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("only-here"));
}

/// A read-only root serves reads and refuses every write (exit 7, saying why), leaving
/// nothing behind; the writable root next to it still takes uploads.
#[test]
fn read_only_roots_serve_reads_and_refuse_writes() {
    let ro = scratch("ro");
    std::fs::write(ro.join("kept"), b"original").unwrap();
    let arg = format!("ro={}", ro.display());
    let s = serve_with("tcp", &[], &["--read-only-root", &arg]);
    let local = scratch("local");
    let v = ok(&cp(&[&s.at("ro/kept"), local.to_str().unwrap()], &[]));
    assert_eq!(v["bytes"].as_u64(), Some(8));
    std::fs::write(local.join("new"), b"payload").unwrap();
    let up = local.join("new");
    let up = up.to_str().unwrap();
    fails(&cp(&[up, &s.at("ro/new")], &[]), 7, "read-only");
    fails(&cp(&[up, &s.at("ro/kept")], &[]), 7, "read-only");
    std::fs::create_dir(local.join("tree")).unwrap();
    std::fs::write(local.join("tree/f"), b"x").unwrap();
    let tree = local.join("tree");
    fails(
        &cp(&["-r", tree.to_str().unwrap(), &s.at("ro/")], &[]),
        7,
        "read-only",
    );
    assert_eq!(std::fs::read(ro.join("kept")).unwrap(), b"original");
    let names: Vec<_> = std::fs::read_dir(&ro)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("kept")],
        "nothing was left in ro"
    );
    ok(&cp(&[up, &s.url("new")], &[]));
    std::fs::remove_dir_all(&local).unwrap();
    std::fs::remove_dir_all(&ro).unwrap();
}

/// One rule for where a copy lands, both directions (docs/xfer.md, "Where a copy lands"): a
/// destination ending in / is a directory (created, one level), a missing parent is refused
/// before any data moves, and a tree copied again lands where it did the first time.
#[test]
fn one_rule_for_where_a_copy_lands() {
    let s = serve("tcp", &[]);
    let local = scratch("local");
    std::fs::create_dir_all(&local).unwrap();
    std::fs::write(local.join("f1.dat"), pattern(5000, 1)).unwrap();
    std::fs::write(s.root.join("g"), pattern(7000, 2)).unwrap();
    make_tree(&s.root.join("t"), 12);
    let f1 = local.join("f1.dat");
    let f1 = f1.to_str().unwrap();
    // Up to "newdir2/": a directory, created, the file inside it under its own name.
    ok(&cp(&[f1, &s.url("newdir2/")], &[]));
    same_file(&local.join("f1.dat"), &s.root.join("newdir2/f1.dat"));
    // Down to "newdir/": the same.
    let newdir = format!("{}/newdir/", local.display());
    ok(&cp(&[&s.url("g"), &newdir], &[]));
    same_file(&s.root.join("g"), &local.join("newdir/g"));
    // A missing parent is refused before any data moves, naming the missing directory.
    let deep = format!("{}/no/such/x/", local.display());
    let o = cp(&[&s.url("g"), &deep], &[]);
    fails(
        &o,
        3,
        &format!("{}/no/such: no such directory", local.display()),
    );
    assert!(!local.join("no").exists());
    let o = cp(&[f1, &s.url("no/such/x/")], &[]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert!(!s.root.join("no").exists());
    // A file where the rule needs a directory is refused.
    let o = cp(&[f1, &s.url("g/")], &[]);
    fails(&o, 1, "is not a directory");
    // A tree lands in DST/NAME whether DST existed or not, so a second run resumes in place
    // instead of nesting a copy inside the first; "t/" lands the contents.
    let into = local.join("copies");
    for _ in 0..2 {
        ok(&cp(&["-r", &s.url("t"), into.to_str().unwrap()], &[]));
        same_tree(&s.root.join("t"), &into.join("t"));
        assert!(!into.join("t/t").exists());
    }
    ok(&cp(
        &["-r", &s.url("t/"), local.join("flat").to_str().unwrap()],
        &[],
    ));
    same_tree(&s.root.join("t"), &local.join("flat"));
    let up = local.join("copies/t");
    for _ in 0..2 {
        ok(&cp(&["-r", up.to_str().unwrap(), &s.url("up")], &[]));
        same_tree(&s.root.join("t"), &s.root.join("up/t"));
        assert!(!s.root.join("up/t/t").exists());
    }
    std::fs::remove_dir_all(&local).unwrap();
}

/// Symlinks in a tree are skipped and counted (in the JSON and the summary), or followed
/// with -L: to files and directories, never a dangling link, and a local loop once.
#[test]
fn symlinks_are_counted_or_followed() {
    use std::os::unix::fs::symlink;
    let s = serve("tcp", &[]);
    let mk = |t: &Path| {
        std::fs::create_dir_all(t.join("d")).unwrap();
        std::fs::write(t.join("f"), pattern(3000, 5)).unwrap();
        std::fs::write(t.join("d/g"), pattern(4000, 6)).unwrap();
        symlink("f", t.join("lf")).unwrap();
        symlink("d", t.join("ld")).unwrap();
        symlink("nowhere", t.join("ln")).unwrap();
    };
    mk(&s.root.join("t"));
    let local = scratch("local");
    let counts = |v: &serde_json::Value| (v["files"].as_u64(), v["entries_skipped"].as_u64());
    // Down: skipped and counted, then followed.
    let v = ok(&cp(
        &["-r", &s.url("t"), local.join("a").to_str().unwrap()],
        &[],
    ));
    assert_eq!(counts(&v), (Some(2), Some(3)), "{v}");
    assert!(std::fs::symlink_metadata(local.join("a/t/lf")).is_err());
    let human = run({
        let mut c = ferry();
        c.args([
            "cp",
            "-r",
            "--token",
            TOKEN,
            &s.url("t"),
            local.join("h").to_str().unwrap(),
        ]);
        c
    });
    assert!(human.status.success(), "{human:?}");
    let said = String::from_utf8_lossy(&human.stderr);
    assert!(
        said.contains("3 entr(y/ies) not copied (symlinks: -L follows them"),
        "{said}"
    );
    let v = ok(&cp(
        &["-r", "-L", &s.url("t"), local.join("b").to_str().unwrap()],
        &[],
    ));
    assert_eq!(counts(&v), (Some(4), Some(1)), "{v}");
    let human = run({
        let mut c = ferry();
        c.args(["cp", "-r", "-L", "--token", TOKEN, &s.url("t")])
            .arg(local.join("hl"));
        c
    });
    assert!(human.status.success(), "{human:?}");
    let said = String::from_utf8_lossy(&human.stderr);
    assert!(
        said.contains("1 entr(y/ies) not copied (with -L: symlinks to nothing")
            && !said.contains("-L follows them"),
        "the dangling link, not advice to pass -L again: {said}"
    );
    same_file(&s.root.join("t/f"), &local.join("b/t/lf"));
    same_file(&s.root.join("t/d/g"), &local.join("b/t/ld/g"));
    assert!(std::fs::symlink_metadata(local.join("b/t/lf"))
        .unwrap()
        .is_file());
    // Up, with a loop back to the tree's top: found once.
    let lt = local.join("lt");
    mk(&lt);
    symlink(".", lt.join("lp")).unwrap();
    let v = ok(&cp(&["-r", lt.to_str().unwrap(), &s.url("up1")], &[]));
    assert_eq!(counts(&v), (Some(2), Some(4)), "{v}");
    let v = ok(&cp(&["-r", "-L", lt.to_str().unwrap(), &s.url("up2")], &[]));
    assert_eq!(counts(&v), (Some(4), Some(2)), "{v}");
    same_file(&lt.join("f"), &s.root.join("up2/lt/lf"));
    same_file(&lt.join("d/g"), &s.root.join("up2/lt/ld/g"));
    std::fs::remove_dir_all(&local).unwrap();
}

/// Several sources land in one directory; --include/--exclude pick a tree's files both ways;
/// --no-clobber leaves files already there alone.
#[test]
fn several_sources_filters_and_no_clobber() {
    let s = serve("tcp", &[]);
    let t = s.root.join("t");
    for (p, n) in [
        ("a.h5", 1),
        ("b.log", 2),
        ("run/c.h5", 3),
        ("run/tmp/d.h5", 4),
        ("e.tmp", 5),
    ] {
        std::fs::create_dir_all(t.join(p).parent().unwrap()).unwrap();
        std::fs::write(t.join(p), pattern(1000 * n, n as u8)).unwrap();
    }
    std::fs::write(s.root.join("x"), pattern(500, 7)).unwrap();
    std::fs::write(s.root.join("y"), pattern(600, 8)).unwrap();
    let local = scratch("local");
    let names = |d: &Path| {
        let mut v = Vec::new();
        let mut todo = vec![d.to_path_buf()];
        while let Some(p) = todo.pop() {
            for e in std::fs::read_dir(&p).unwrap() {
                let e = e.unwrap().path();
                if e.is_dir() {
                    todo.push(e);
                } else {
                    v.push(e.strip_prefix(d).unwrap().to_string_lossy().into_owned());
                }
            }
        }
        v.sort();
        v
    };
    // Two sources, one destination directory (created).
    let many = local.join("many");
    let v = ok(&cp(
        &[&s.url("x"), &s.url("y"), many.to_str().unwrap()],
        &[],
    ));
    assert_eq!(v["files"].as_u64(), Some(2), "{v}");
    same_file(&s.root.join("x"), &many.join("x"));
    same_file(&s.root.join("y"), &many.join("y"));
    // Down: only the .h5 files, not under tmp/.
    let f = local.join("f");
    let v = ok(&cp(
        &[
            "-r",
            "--include",
            "*.h5",
            "--exclude",
            "tmp",
            &s.url("t"),
            f.to_str().unwrap(),
        ],
        &[],
    ));
    assert_eq!(v["files"].as_u64(), Some(2), "{v}");
    assert_eq!(names(&f.join("t")), ["a.h5", "run/c.h5"]);
    // Up: everything but *.tmp and run/**.
    let v = ok(&cp(
        &[
            "-r",
            "--exclude",
            "*.tmp",
            "--exclude",
            "run/**",
            f.join("t").to_str().unwrap(),
            &s.url("up"),
        ],
        &[],
    ));
    assert_eq!(v["files"].as_u64(), Some(1), "{v}");
    // --no-clobber: a changed local copy is not replaced; a plain copy replaces it.
    std::fs::write(many.join("x"), b"mine").unwrap();
    let v = ok(&cp(&["-n", &s.url("x"), many.to_str().unwrap()], &[]));
    assert_eq!(v["files_skipped"].as_u64(), Some(1), "{v}");
    assert_eq!(std::fs::read(many.join("x")).unwrap(), b"mine");
    ok(&cp(&[&s.url("x"), many.to_str().unwrap()], &[]));
    same_file(&s.root.join("x"), &many.join("x"));
    // (Filters and --no-clobber server to server: tests/xfer_sync.rs.)
    let o = cp(
        &["-r", "--include", "[", &s.url("t"), f.to_str().unwrap()],
        &[],
    );
    fails(&o, 1, "pattern \"[\"");
    std::fs::remove_dir_all(&local).unwrap();
}

/// A large file on `a` (a repeated MiB: quick to make, long enough to send that a test
/// acts mid-copy), a `ferry cp` of it to `b` started with its stderr piped, and the
/// destination's part file, once 8 MiB of it arrived.
const HUGE: u64 = 1 << 30;

fn third_party_copy_under_way(a: &Server, b: &Server) -> (std::process::Child, PathBuf) {
    let mib = pattern(1 << 20, 3);
    let mut f = std::fs::File::create(a.root.join("huge")).unwrap();
    for _ in 0..HUGE >> 20 {
        f.write_all(&mib).unwrap();
    }
    drop(f);
    let part = b.root.join(".huge.ferry-part");
    let mut client = ferry();
    client.args(["cp", "--token", TOKEN, &a.url("huge"), &b.url("")]);
    let client = client
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while size(&part) < 8 << 20 && t.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(size(&part) >= 8 << 20, "the copy did not start");
    (client, part)
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// Ctrl-C on the client cancels a server-to-server copy: the source stops sending, and the
/// file never appears at the destination (what arrived stays journaled there for a resume).
#[test]
fn interrupting_a_third_party_copy_cancels_it() {
    let b = serve("tcp", &[]);
    let a = serve_with("tcp", &[], &["--allow-third-party", &b.addr]);
    let (mut client, part) = third_party_copy_under_way(&a, &b);
    let pid = rustix::process::Pid::from_child(&client);
    rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
    assert_eq!(client.wait().unwrap().code(), Some(130));
    // Within a second the part stops growing, and the file never lands.
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let stopped = size(&part);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(size(&part), stopped, "the source kept sending");
    assert!(stopped < HUGE);
    assert!(!b.root.join("huge").exists());
}

/// `ferry copies` lists a server-to-server copy to its owner, and `--abort` stops it: its
/// own `ferry cp` ends with exit 1 saying so, and the file never lands.
#[test]
fn a_third_party_copy_is_listed_and_aborted_by_its_owner() {
    let b = serve("tcp", &[]);
    let a = serve_with("tcp", &[], &["--allow-third-party", &b.addr]);
    let (client, part) = third_party_copy_under_way(&a, &b);
    let copies = |args: &[&str]| {
        let mut c = ferry();
        c.args(["copies", "--token", TOKEN]).args(args).arg(&a.addr);
        run(c)
    };
    let v = ok(&copies(&["--json"]));
    assert_eq!(v["path"].as_str(), Some("d/huge"), "{v}");
    assert!(
        b.addr.contains(v["dest"].as_str().unwrap()),
        "{v} vs {}",
        b.addr
    );
    assert_eq!(v["total"].as_u64(), Some(HUGE), "{v}");
    assert!(v["done"].as_u64().unwrap() >= 8 << 20, "{v}");
    let id = v["id"].as_u64().unwrap();
    fails(
        &copies(&["--abort", &(id + 1).to_string()]),
        3,
        "no third-party copy",
    );
    assert!(copies(&["--abort", &id.to_string()]).status.success());
    let out = client.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("aborted by its owner"), "{said}");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let stopped = size(&part);
    std::thread::sleep(std::time::Duration::from_millis(1000));
    assert_eq!(size(&part), stopped, "the source kept sending");
    assert!(!b.root.join("huge").exists());
    // Nothing left to list.
    assert!(copies(&[]).stdout.is_empty());
}

/// `ferry sync` copies what differs, removes what the source lacks with --delete (not what
/// the filter leaves out), changes nothing in a dry run, and with --checksum catches a
/// change that kept size and mtime; both directions.
#[test]
fn sync_moves_only_what_differs() {
    let s = serve("tcp", &[]);
    let t = s.root.join("t");
    std::fs::create_dir_all(t.join("d")).unwrap();
    std::fs::write(t.join("a"), pattern(1000, 1)).unwrap();
    std::fs::write(t.join("b"), pattern(2000, 2)).unwrap();
    std::fs::write(t.join("d/c"), pattern(3000, 3)).unwrap();
    let local = scratch("local");
    std::fs::create_dir_all(&local).unwrap();
    let m = local.join("m");
    let sync = |args: &[&str]| {
        let mut c = ferry();
        c.args(["sync", "--json", "--token", TOKEN]).args(args);
        ok(&run(c))
    };
    let list = |v: &serde_json::Value, k: &str| -> Vec<String> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect()
    };
    let v = sync(&[&s.url("t"), m.to_str().unwrap()]);
    assert_eq!(list(&v, "copied"), ["a", "b", "d/c"], "{v}");
    same_tree(&t, &m.join("t"));
    let v = sync(&[&s.url("t"), m.to_str().unwrap()]);
    assert_eq!(
        (list(&v, "copied").len(), v["files_unchanged"].as_u64()),
        (0, Some(3)),
        "{v}"
    );
    // Changes on both sides.
    std::fs::write(t.join("a"), pattern(1100, 4)).unwrap();
    std::fs::write(t.join("e"), pattern(500, 5)).unwrap();
    std::fs::remove_file(t.join("b")).unwrap();
    std::fs::write(m.join("t/x"), b"extra").unwrap();
    std::fs::create_dir_all(m.join("t/old")).unwrap();
    std::fs::write(m.join("t/old/y"), b"extra").unwrap();
    std::fs::write(m.join("t/keep.me"), b"mine").unwrap();
    let dry = sync(&[
        "--dry-run",
        "--delete",
        "--exclude",
        "keep*",
        &s.url("t"),
        m.to_str().unwrap(),
    ]);
    assert_eq!(list(&dry, "copied"), ["a", "e"], "{dry}");
    assert_eq!(list(&dry, "removed"), ["b", "old/y", "x", "old"], "{dry}");
    assert!(
        m.join("t/x").exists() && m.join("t/b").exists(),
        "a dry run changed nothing"
    );
    sync(&[
        "--delete",
        "--exclude",
        "keep*",
        &s.url("t"),
        m.to_str().unwrap(),
    ]);
    std::fs::remove_file(m.join("t/keep.me")).unwrap();
    same_tree(&t, &m.join("t"));
    // Up, with --delete: the server's extra file goes (REMOVE).
    let up = m.join("t");
    sync(&[up.to_str().unwrap(), &s.url("back")]);
    std::fs::write(s.root.join("back/t/stale"), b"old").unwrap();
    let v = sync(&["--delete", up.to_str().unwrap(), &s.url("back")]);
    assert_eq!(list(&v, "removed"), ["stale"], "{v}");
    same_tree(&up, &s.root.join("back/t"));
    // Same size, same mtime, other bytes: only --checksum sees it.
    let f = t.join("d/c");
    let mtime = std::fs::metadata(&f).unwrap().modified().unwrap();
    std::fs::write(&f, pattern(3000, 9)).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let v = sync(&[&s.url("t"), m.to_str().unwrap()]);
    assert!(list(&v, "copied").is_empty(), "{v}");
    let v = sync(&["--checksum", &s.url("t"), m.to_str().unwrap()]);
    assert_eq!(list(&v, "copied"), ["d/c"], "{v}");
    same_file(&f, &m.join("t/d/c"));
    std::fs::remove_dir_all(&local).unwrap();
}

/// A remote glob expands on the server (names in its directory, hidden ones only when the
/// pattern starts with a dot) and its matches land in the destination directory; no match
/// is exit 3.
#[test]
fn remote_globs_expand_on_the_server() {
    let s = serve("tcp", &[]);
    std::fs::create_dir_all(s.root.join("g")).unwrap();
    for (n, i) in [("a.h5", 1), ("b.h5", 2), ("c.log", 3), (".hidden.h5", 4)] {
        std::fs::write(s.root.join("g").join(n), pattern(700 * i, i as u8)).unwrap();
    }
    let local = scratch("local");
    let out = local.join("out");
    let v = ok(&cp(&[&s.url("g/*.h5"), out.to_str().unwrap()], &[]));
    assert_eq!(v["files"].as_u64(), Some(2), "{v}");
    let mut got: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    got.sort();
    assert_eq!(got, ["a.h5", "b.h5"]);
    same_file(&s.root.join("g/b.h5"), &out.join("b.h5"));
    let o = cp(&[&s.url("g/*.none"), out.to_str().unwrap()], &[]);
    fails(&o, 3, "no match");
    std::fs::remove_dir_all(&local).unwrap();
}

/// A tree download asks about its source once: one STAT, with the top level's LIST in the
/// same round trip, before the subdirectories are listed (the server's audit file records
/// every request; the copy used to STAT the source twice and LIST it a round trip later:
/// at 50 ms, 100 ms before the first byte). With `-p 1`, the same.
#[test]
fn a_tree_download_asks_about_its_source_once() {
    let dir = scratch("plan-once");
    let audit = dir.join("audit.jsonl");
    let s = serve_as(
        ferry(),
        "tcp",
        &[],
        &["--audit-log", audit.to_str().unwrap()],
    );
    std::fs::create_dir_all(s.root.join("tree/sub")).unwrap();
    std::fs::write(s.root.join("tree/a"), pattern(1000, 1)).unwrap();
    std::fs::write(s.root.join("tree/sub/b"), pattern(2000, 2)).unwrap();
    let src = s.url("tree");
    for (i, extra) in [&[][..], &["-p", "1"][..]].into_iter().enumerate() {
        let out = dir.join(format!("out{i}"));
        let mut args = extra.to_vec();
        args.extend(["-r", &src, out.to_str().unwrap()]);
        ok(&cp(&args, &[]));
        same_file(&s.root.join("tree/sub/b"), &out.join("tree/sub/b"));
    }
    let text = std::fs::read_to_string(&audit).unwrap();
    let asked = |op: &str, path: &str| {
        text.lines()
            .filter(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["op"] == op && v["path"] == path
            })
            .count()
    };
    assert_eq!(asked("stat", "d/tree"), 2, "one STAT per copy:\n{text}");
    assert_eq!(asked("list", "d/tree"), 2, "one top LIST per copy:\n{text}");
    assert_eq!(asked("list", "d/tree/sub"), 2, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
