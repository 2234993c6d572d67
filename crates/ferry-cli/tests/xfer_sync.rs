//! Server-to-server `ferry sync` and third-party tree copies that take `--include`,
//! `--exclude` and `-L`: real `ferry serve` processes over loopback (tcp), the source
//! allowed to send to the destination.

use std::path::Path;

mod common;

use common::*;

/// A destination server `b` and a source `a` that may copy to it.
fn pair() -> (Server, Server) {
    let b = serve_as(ferry(), "tcp", &[], &[]);
    let a = serve_as(ferry(), "tcp", &[], &["--allow-third-party", &b.addr]);
    (a, b)
}

/// `ferry sync --json --token TOKEN ARGS`, which must succeed.
fn sync(args: &[&str]) -> serde_json::Value {
    let mut c = ferry();
    c.args(["sync", "--json", "--token", TOKEN]).args(args);
    ok(&run(c))
}

/// A JSON array of strings.
fn list(v: &serde_json::Value, k: &str) -> Vec<String> {
    v[k].as_array()
        .unwrap_or_else(|| panic!("no {k} in {v}"))
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

/// Rewrites `f` with other bytes of the same length and gives it back its mtime: a change
/// only a checksum sees.
fn change_in_place(f: &Path, seed: u8) {
    let before = std::fs::metadata(f).unwrap();
    std::fs::write(f, pattern(before.len() as usize, seed)).unwrap();
    std::fs::File::options()
        .write(true)
        .open(f)
        .unwrap()
        .set_modified(before.modified().unwrap())
        .unwrap();
}

/// Between two servers `ferry sync` copies only what differs (the copies keep their mtime,
/// so a second run copies nothing), removes with --delete what the source lacks (not what
/// the filter leaves out), changes nothing in a dry run, and with --checksum (each server
/// hashes its own file) catches a change that kept size and mtime.
#[test]
fn server_to_server_sync_moves_only_what_differs() {
    let (a, b) = pair();
    let t = a.root.join("t");
    std::fs::create_dir_all(t.join("d")).unwrap();
    std::fs::write(t.join("a"), pattern(1000, 1)).unwrap();
    std::fs::write(t.join("b"), pattern(2000, 2)).unwrap();
    std::fs::write(t.join("d/c"), pattern(3000, 3)).unwrap();
    let (src, dst) = (a.url("t"), b.url("m"));
    let v = sync(&[&src, &dst]);
    assert_eq!(list(&v, "copied"), ["a", "b", "d/c"], "{v}");
    let m = b.root.join("m/t");
    same_tree(&t, &m);
    let v = sync(&[&src, &dst]);
    assert_eq!(
        (list(&v, "copied").len(), v["files_unchanged"].as_u64()),
        (0, Some(3)),
        "mtimes kept, nothing to copy again: {v}"
    );
    // Changes on both sides.
    std::fs::write(t.join("a"), pattern(1100, 4)).unwrap();
    std::fs::write(t.join("e"), pattern(500, 5)).unwrap();
    std::fs::remove_file(t.join("b")).unwrap();
    std::fs::write(m.join("x"), b"extra").unwrap();
    std::fs::create_dir_all(m.join("old")).unwrap();
    std::fs::write(m.join("old/y"), b"extra").unwrap();
    std::fs::write(m.join("keep.me"), b"mine").unwrap();
    let delete = ["--delete", "--exclude", "keep*"];
    let dry = sync(&[&["--dry-run"], &delete[..], &[&src, &dst]].concat());
    assert_eq!(list(&dry, "copied"), ["a", "e"], "{dry}");
    assert_eq!(list(&dry, "removed"), ["b", "old/y", "x", "old"], "{dry}");
    assert!(
        m.join("x").exists() && m.join("b").exists() && !m.join("e").exists(),
        "a dry run changed nothing"
    );
    assert_eq!(std::fs::read(m.join("a")).unwrap(), pattern(1000, 1));
    let v = sync(&[&delete[..], &[&src, &dst]].concat());
    assert_eq!(list(&v, "copied"), ["a", "e"], "{v}");
    assert_eq!(v["files_unchanged"].as_u64(), Some(1), "{v}");
    assert_eq!(std::fs::read(m.join("keep.me")).unwrap(), b"mine");
    std::fs::remove_file(m.join("keep.me")).unwrap();
    same_tree(&t, &m);
    // Same size, same mtime, other bytes: only --checksum sees it.
    change_in_place(&t.join("d/c"), 9);
    let v = sync(&[&src, &dst]);
    assert!(list(&v, "copied").is_empty(), "{v}");
    let v = sync(&["--checksum", &src, &dst]);
    assert_eq!(list(&v, "copied"), ["d/c"], "{v}");
    same_tree(&t, &m);
    // -L: a link inside the source's root syncs as what it leads to; one out of the root is
    // skipped and counted.
    std::os::unix::fs::symlink("a", t.join("to_a")).unwrap();
    std::os::unix::fs::symlink(std::env::temp_dir(), t.join("out")).unwrap();
    let v = sync(&["-L", &src, &dst]);
    assert_eq!(list(&v, "copied"), ["to_a"], "{v}");
    assert_eq!(v["entries_skipped"].as_u64(), Some(1), "{v}");
    same_file(&t.join("a"), &m.join("to_a"));
    assert!(!m.join("out").exists());
}

/// A sync whose changed files fill more than one SEND_TO (their list is split over several
/// requests): every file arrives, once, and nothing nests.
#[test]
fn a_long_list_of_changed_files_goes_in_several_requests() {
    let (a, b) = pair();
    let t = a.root.join("t");
    // 600 names of 200 bytes: some 120 KiB of list, two frames or more.
    let dir = t.join("long");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..600 {
        std::fs::write(dir.join(format!("{i:0>200}")), pattern(10 + i, i as u8)).unwrap();
    }
    let v = sync(&[&a.url("t/"), &b.url("m")]);
    assert_eq!(list(&v, "copied").len(), 600);
    assert_eq!(v["files"].as_u64(), Some(600), "{v}");
    same_tree(&t, &b.root.join("m"));
    let v = sync(&[&a.url("t/"), &b.url("m")]);
    assert_eq!(v["files_unchanged"].as_u64(), Some(600), "{v}");
}

/// A third-party tree copy applies --include/--exclude on the source server, and with -L
/// copies what a link inside the root leads to while a link out of it is skipped (never
/// followed) and counted.
#[test]
fn third_party_trees_take_filters_and_follow_links_inside_the_root() {
    let (a, b) = pair();
    let t = a.root.join("t");
    std::fs::create_dir_all(t.join("run/scratch")).unwrap();
    std::fs::write(t.join("a.h5"), pattern(700, 1)).unwrap();
    std::fs::write(t.join("a.tmp"), pattern(800, 2)).unwrap();
    std::fs::write(t.join("run/b.h5"), pattern(900, 3)).unwrap();
    std::fs::write(t.join("run/b.tmp"), pattern(100, 4)).unwrap();
    std::fs::write(t.join("run/scratch/c.h5"), pattern(300, 5)).unwrap();
    let v = ok(&cp(
        &["-r", "--exclude", "*.tmp", &a.url("t"), &b.url("ex")],
        &[],
    ));
    assert_eq!(v["files"].as_u64(), Some(3), "{v}");
    let got = b.root.join("ex/t");
    assert!(got.join("a.h5").exists() && got.join("run/scratch/c.h5").exists());
    assert!(!got.join("a.tmp").exists() && !got.join("run/b.tmp").exists());
    same_file(&t.join("run/b.h5"), &got.join("run/b.h5"));
    let v = ok(&cp(
        &[
            "-r",
            "--include",
            "*.h5",
            "--exclude",
            "scratch",
            &a.url("t/"),
            &b.url("in"),
        ],
        &[],
    ));
    assert_eq!(v["files"].as_u64(), Some(2), "{v}");
    assert!(b.root.join("in/run/b.h5").exists() && !b.root.join("in/run/scratch").exists());

    // Links: one to a file and one to a directory inside the root, one out of it.
    let outside = scratch("outside");
    std::fs::write(outside.join("secret"), b"not yours").unwrap();
    std::os::unix::fs::symlink("../a.h5", t.join("run/to_file")).unwrap();
    std::os::unix::fs::symlink("run/scratch", t.join("to_dir")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), t.join("escape")).unwrap();
    let v = ok(&cp(&["-r", &a.url("t/"), &b.url("plain")], &[]));
    assert_eq!(v["entries_skipped"].as_u64(), Some(3), "without -L: {v}");
    assert!(!b.root.join("plain/run/to_file").exists());
    let v = ok(&cp(
        &[
            "-r",
            "-L",
            "--exclude",
            "*.tmp",
            &a.url("t/"),
            &b.url("deref"),
        ],
        &[],
    ));
    assert_eq!(v["files"].as_u64(), Some(5), "{v}");
    assert_eq!(
        v["entries_skipped"].as_u64(),
        Some(1),
        "the escaping link: {v}"
    );
    let d = b.root.join("deref");
    same_file(&t.join("a.h5"), &d.join("run/to_file"));
    same_file(&t.join("run/scratch/c.h5"), &d.join("to_dir/c.h5"));
    assert!(
        !d.join("escape").exists(),
        "a link out of the root was followed"
    );
    for p in ["run/to_file", "to_dir"] {
        let md = std::fs::symlink_metadata(d.join(p)).unwrap();
        assert!(
            !md.file_type().is_symlink(),
            "{p}: copied as what it leads to"
        );
    }
    // An excluded link is neither followed nor counted.
    let v = ok(&cp(
        &[
            "-r",
            "-L",
            "--exclude",
            "escape",
            &a.url("t/"),
            &b.url("deref2"),
        ],
        &[],
    ));
    assert_eq!(v["entries_skipped"].as_u64(), Some(0), "{v}");
    std::fs::remove_dir_all(&outside).unwrap();
}

/// `cp -n` between two servers plans as sync does: what the destination has is left alone
/// (counted as skipped, as `-n` counts it in other copies), the rest lands; a single file
/// too; a directory still needs -r. A plain copy then replaces the file `-n` kept.
#[test]
fn no_clobber_between_servers_keeps_what_the_destination_has() {
    let (a, b) = pair();
    let t = a.root.join("t");
    std::fs::create_dir_all(t.join("d")).unwrap();
    std::fs::write(t.join("a"), pattern(1000, 1)).unwrap();
    std::fs::write(t.join("b"), pattern(2000, 2)).unwrap();
    std::fs::write(t.join("d/c"), pattern(3000, 3)).unwrap();
    let m = b.root.join("m/t");
    std::fs::create_dir_all(&m).unwrap();
    std::fs::write(m.join("a"), b"mine").unwrap();
    let v = ok(&cp(&["-r", "-n", &a.url("t"), &b.url("m")], &[]));
    let counts = |v: &serde_json::Value| (v["files"].as_u64(), v["files_skipped"].as_u64());
    assert_eq!(counts(&v), (Some(3), Some(1)), "{v}");
    assert_eq!(std::fs::read(m.join("a")).unwrap(), b"mine");
    same_file(&t.join("b"), &m.join("b"));
    same_file(&t.join("d/c"), &m.join("d/c"));
    let v = ok(&cp(&["-n", &a.url("t/b"), &b.url("m/t/a")], &[]));
    assert_eq!(counts(&v), (Some(1), Some(1)), "{v}");
    assert_eq!(std::fs::read(m.join("a")).unwrap(), b"mine");
    let v = ok(&cp(&["-n", &a.url("t/b"), &b.url("one")], &[]));
    assert_eq!(counts(&v), (Some(1), Some(0)), "{v}");
    same_file(&t.join("b"), &b.root.join("one"));
    fails(&cp(&["-n", &a.url("t"), &b.url("m2")], &[]), 1, "use -r");
    ok(&cp(&["-r", &a.url("t"), &b.url("m")], &[]));
    same_file(&t.join("a"), &m.join("a"));
}
