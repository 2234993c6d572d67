//! The disk data path on a real disk filesystem (the temp dir): many small files committed
//! by the commit pool (fsyncs overlapping), both directions, and a commit that fails in the
//! pool reported per file with exit 5 while every other file lands whole.

use std::path::{Path, PathBuf};

mod common;

use common::*;

/// `files` small files (0..8 KiB) in nested directories.
fn make_tree(root: &Path, files: usize) {
    for i in 0..files {
        let d = root.join(format!("d{}", i % 16));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}")), pattern(i * 53 % 8192, i as u8)).unwrap();
    }
}

/// Every regular file under `root`, relative, with its bytes.
fn files_of(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push((
                    p.strip_prefix(root).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

fn no_part_files(root: &Path) {
    for (p, _) in files_of(root) {
        let n = p.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!n.contains(".ferry-part"), "left behind: {}", p.display());
    }
}

/// 2,000 small files down and up on a disk filesystem, byte-identical, nothing left behind.
#[test]
fn two_thousand_small_files_both_ways() {
    let s = serve_as(ferry(), "tcp", &[], &[]);
    let src = s.root.join("many");
    make_tree(&src, 2000);
    let local = scratch("disk-local");
    let v = ok(&cp(&["-r", &s.url("many"), local.to_str().unwrap()], &[]));
    assert_eq!(v["files"].as_u64(), Some(2000));
    assert!(
        files_of(&src) == files_of(&local.join("many")),
        "download differs"
    );
    no_part_files(&local);
    let v = ok(&cp(
        &["-r", local.join("many").to_str().unwrap(), &s.url("back")],
        &[],
    ));
    assert_eq!(v["files"].as_u64(), Some(2000));
    assert!(
        files_of(&src) == files_of(&s.root.join("back/many")),
        "upload differs"
    );
    no_part_files(&s.root);
    std::fs::remove_dir_all(&local).unwrap();
}

/// A commit that fails in the pool (the final name is taken by a non-empty directory, so
/// the rename fails) is exit 5 naming that file; every file under its final name is whole.
#[test]
fn a_failed_commit_is_reported_and_nothing_partial_is_visible() {
    let s = serve_as(ferry(), "tcp", &[], &[]);
    let src = s.root.join("many");
    make_tree(&src, 300);
    let local = scratch("disk-fail");
    let blocker = local.join("many/d5/f101");
    std::fs::create_dir_all(blocker.join("keep")).unwrap();
    let o = cp(&["-r", &s.url("many"), local.to_str().unwrap()], &[]);
    fails(&o, 5, "f101");
    let want: std::collections::HashMap<_, _> = files_of(&src).into_iter().collect();
    let got = files_of(&local.join("many"));
    for (p, bytes) in &got {
        if p.starts_with("d5/f101") {
            continue;
        }
        assert!(
            want.get(p) == Some(bytes),
            "{} is not the whole source file",
            p.display()
        );
    }
    assert!(got.len() > 1, "the other files were copied");
    no_part_files(&local);
    std::fs::remove_dir_all(&local).unwrap();
}

/// With direct I/O on both sides (`ferry serve --direct`, `ferry cp --direct`), files around
/// the 4 KiB alignment and the block size land byte-identical, down and up, on a disk
/// filesystem; with the staging threads on too (their copies of the blocks are unaligned and
/// go through an aligned bounce buffer).
#[test]
fn direct_io_sizes_both_ways() {
    const BLOCK: usize = 64 << 10;
    for threads in ["off", "on"] {
        let env = [("FERRY_STAGING_THREADS", threads)];
        let s = serve_as(ferry(), "tcp", &env, &["--direct"]);
        let local = scratch("direct");
        let sizes = [
            0,
            1,
            4095,
            4096,
            4097,
            BLOCK - 1,
            BLOCK,
            BLOCK + 1,
            3 * BLOCK + 4096,
            5 * BLOCK + 5,
        ];
        for (i, len) in sizes.into_iter().enumerate() {
            let name = format!("f{len}");
            std::fs::write(s.root.join(&name), pattern(len, i as u8 + 1)).unwrap();
            let opts = ["--direct", "--block-size", "65536"];
            let (remote, here) = (s.url(&name), local.join(&name));
            let dl = [&opts[..], &[&remote, local.to_str().unwrap()]].concat();
            let o = cp(&dl, &env);
            let err = String::from_utf8_lossy(&o.stderr).into_owned();
            assert!(!err.contains("direct I/O"), "direct I/O fell back: {err}");
            assert_eq!(ok(&o)["bytes"].as_u64(), Some(len as u64));
            same_file(&s.root.join(&name), &local.join(&name));
            let up = format!("up{len}");
            let remote_up = s.url(&up);
            let ul = [&opts[..], &[here.to_str().unwrap(), &remote_up]].concat();
            ok(&cp(&ul, &env));
            same_file(&local.join(&name), &s.root.join(&up));
        }
        no_part_files(&local);
        no_part_files(&s.root);
        std::fs::remove_dir_all(&local).unwrap();
    }
}

/// Bytes of `path` in the page cache (`fincore`), or `None` where the tool is missing.
fn cached_bytes(path: &Path) -> Option<u64> {
    let o = std::process::Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(path)
        .output()
        .ok()?;
    String::from_utf8_lossy(&o.stdout).trim().parse().ok()
}

/// With no flags, a large file is written with direct I/O on a disk filesystem, down and
/// up: it lands byte-identical and almost none of it stays in the page cache (through the
/// cache, all of it did). On tmpfs, which has nothing to gain, it goes through the cache
/// with no complaint. The size ends in a partial 4 KiB page (written through the cache).
#[test]
fn large_files_are_written_direct_unasked_where_it_helps() {
    const LEN: usize = (64 << 20) + 5;
    let s = serve_as(ferry(), "tcp", &[], &[]);
    std::fs::write(s.root.join("big"), pattern(LEN, 7)).unwrap();
    let local = scratch("auto-direct");
    let here = local.join("big");
    let o = cp(&[&s.url("big"), here.to_str().unwrap()], &[]);
    assert_eq!(ok(&o)["bytes"].as_u64(), Some(LEN as u64));
    let Some(down) = cached_bytes(&here) else {
        eprintln!("skipping the page-cache checks: no fincore");
        return;
    };
    let o = cp(&[here.to_str().unwrap(), &s.url("up")], &[]);
    ok(&o);
    let up = cached_bytes(&s.root.join("up")).unwrap();
    assert!(down < 1 << 20, "download: {down} bytes in the page cache");
    assert!(up < 1 << 20, "upload: {up} bytes in the page cache");
    same_file(&s.root.join("big"), &here);
    same_file(&s.root.join("big"), &s.root.join("up"));
    // Several streams, each writing its own ranges: the same choice, down and up.
    let there = local.join("big-p4");
    ok(&cp(
        &["-p", "4", &s.url("big"), there.to_str().unwrap()],
        &[],
    ));
    let down = cached_bytes(&there).unwrap();
    ok(&cp(
        &["-p", "4", there.to_str().unwrap(), &s.url("up-p4")],
        &[],
    ));
    let up = cached_bytes(&s.root.join("up-p4")).unwrap();
    assert!(
        down < 1 << 20,
        "download, 4 streams: {down} bytes in the page cache"
    );
    assert!(
        up < 1 << 20,
        "upload, 4 streams: {up} bytes in the page cache"
    );
    same_file(&s.root.join("big"), &there);
    same_file(&s.root.join("big"), &s.root.join("up-p4"));
    // tmpfs: through the page cache, silently.
    let shm = Path::new("/dev/shm").join(format!("ferry-test-auto-direct-{}", std::process::id()));
    std::fs::create_dir_all(&shm).unwrap();
    let o = cp(&[&s.url("big"), shm.to_str().unwrap()], &[]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    ok(&o);
    assert!(!err.contains("direct I/O"), "a warning on tmpfs: {err}");
    same_file(&s.root.join("big"), &shm.join("big"));
    let _ = std::fs::remove_dir_all(&shm);
    no_part_files(&local);
    std::fs::remove_dir_all(&local).unwrap();
}

/// How many calls of each of `syscalls` (comma-separated) `ferry cp --json ARGS` made, from
/// `strace -f -c`; `None` where strace is missing.
fn cp_syscalls(args: &[&str], syscalls: &str) -> Option<std::collections::BTreeMap<String, u64>> {
    if std::process::Command::new("strace")
        .arg("-V")
        .output()
        .is_err()
    {
        return None;
    }
    let log = scratch("strace").join("log");
    let mut c = std::process::Command::new("strace");
    c.args(["-f", "-c", "-o"])
        .arg(&log)
        .arg(format!("--trace={syscalls}"))
        .arg(env!("CARGO_BIN_EXE_ferry"))
        .env("RUST_LOG", "warn")
        .env_remove("FERRY_TOKEN");
    isolate(&mut c);
    c.args(["cp", "--token", TOKEN, "--json"]).args(args);
    ok(&run(c));
    let text = std::fs::read_to_string(&log).unwrap();
    // "% time  seconds  usecs/call  calls  [errors]  syscall" rows.
    let counts = text
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let calls = w.get(3)?.parse().ok()?;
            Some((w.last()?.to_string(), calls))
        })
        .collect();
    Some(counts)
}

/// A tree's files landing in directories this copy made (empty when opened) cost no stat
/// each, and on tmpfs no fsync each (nothing there is made more durable by one); on a disk
/// every file is still fsynced before its rename. (Before, each file cost two stats, an
/// fstatfs and an fsync wherever it landed.)
#[test]
fn files_in_fresh_directories_cost_no_per_file_checks() {
    const FILES: usize = 300;
    let s = serve_as(ferry(), "tcp", &[], &[]);
    make_tree(&s.root.join("many"), FILES);
    let watched = "newfstatat,fstatfs,fsync";
    let disk = scratch("fresh");
    let Some(n) = cp_syscalls(&["-r", &s.url("many"), disk.to_str().unwrap()], watched) else {
        eprintln!("skipping: no strace");
        return;
    };
    let count =
        |n: &std::collections::BTreeMap<String, u64>, k: &str| n.get(k).copied().unwrap_or(0);
    // A few dozen stats are the dynamic loader's, searching the test's library path.
    let few = FILES as u64 / 3;
    assert!(count(&n, "newfstatat") < few, "stats on disk: {n:?}");
    assert!(count(&n, "fstatfs") < few, "fstatfs on disk: {n:?}");
    assert!(
        count(&n, "fsync") >= FILES as u64,
        "every file fsynced on disk: {n:?}"
    );
    assert!(files_of(&s.root.join("many")) == files_of(&disk.join("many")));
    let shm = Path::new("/dev/shm").join(format!("ferry-test-fresh-{}", std::process::id()));
    std::fs::create_dir_all(&shm).unwrap();
    let n = cp_syscalls(&["-r", &s.url("many"), shm.to_str().unwrap()], watched).unwrap();
    assert!(count(&n, "fsync") < few, "fsyncs on tmpfs: {n:?}");
    assert!(count(&n, "newfstatat") < few, "stats on tmpfs: {n:?}");
    assert!(files_of(&s.root.join("many")) == files_of(&shm.join("many")));
    let _ = std::fs::remove_dir_all(&shm);
    std::fs::remove_dir_all(&disk).unwrap();
}
