//! Checksums in one pass and the checksum cache, with real `ferry serve` and `ferry cp`
//! processes over loopback:
//! - parallel copies (`-p N`) hash each block where it lands, into the file's BLAKE3 tree:
//!   files of sizes around block and chunk boundaries, block sizes a power of two or not,
//!   land (their root equals the source's BLAKE3) both ways;
//! - the server keeps a file's BLAKE3 in `user.ferry.blake3` after SUM or a whole GET, uses
//!   it while size, mtime, inode and device are unchanged, and ignores it when any changed;
//!   the documented blind spot (content rewritten with size and mtime restored) is shown,
//!   and the receiver refuses such a file rather than commit it, except one small enough
//!   for a FILE frame, which is fetched again, hashed, and its entry mended;
//!   `--no-checksum-cache` keeps none;
//! - a `-p 4` download during which SUM writes the attribute (moving the file's ctime while
//!   other streams read it) succeeds.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

mod common;

use common::*;

const XATTR: &str = "user.ferry.blake3";
/// Larger than a block (4 MiB), so a whole GET answers with BLOCKs and FILE_DONE (not one
/// FILE frame, whose checks the receiver handles otherwise).
const BIG: usize = 5 << 20;

fn serve(args: &[&str]) -> Server {
    serve_as(ferry(), "tcp", &[], args)
}

/// A server that sends the blocks its entries vouch for from a mapping of the file,
/// unread, so that the audit's `unread` counts them.
fn serve_mapping(args: &[&str]) -> Server {
    serve_as(ferry(), "tcp", &[("FERRY_VOUCHED_SENDS", "map")], args)
}

/// `ferry sum TARGET`'s hash.
fn sum(target: &str) -> String {
    let mut c = ferry();
    c.args(["sum", "--token", TOKEN, target]);
    let o = run(c);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    out.split_whitespace().next().unwrap_or("").to_string()
}

/// The cache entry of `path`, if any.
fn entry(path: &Path) -> Option<Vec<u8>> {
    let f = std::fs::File::open(path).unwrap();
    let mut buf = [0u8; 256];
    let n = rustix::fs::fgetxattr(&f, XATTR, &mut buf[..]).ok()?;
    Some(buf[..n].to_vec())
}

/// Rewrites a byte of `path` in place and puts its mtime back: same size, same mtime.
fn rewrite_keeping_mtime(path: &Path) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mtime = f.metadata().unwrap().modified().unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, 1000).unwrap();
    f.write_all_at(&[b[0] ^ 0xff], 1000).unwrap();
    f.set_modified(mtime).unwrap();
}

fn set_mtime(path: &Path, t: SystemTime) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_modified(t).unwrap();
}

/// Files of sizes around the block (64 KiB) and chunk (128 KiB) boundaries, copied down and
/// up over 3 streams with a power-of-two block and with a block of 3 × 16 KiB.
#[test]
fn parallel_copies_hash_each_block_once() {
    let s = serve(&[]);
    let tree = s.root.join("t");
    std::fs::create_dir(&tree).unwrap();
    let (block, chunk) = (64 << 10, 128 << 10);
    let sizes = [
        2 * chunk + 1,
        3 * chunk - 1,
        3 * chunk,
        3 * chunk + 1,
        3 * chunk + block - 1,
        3 * chunk + block + 1024,
        5 * chunk + 1025,
        7 * chunk + 17,
    ];
    for (i, n) in sizes.iter().enumerate() {
        std::fs::write(tree.join(format!("f{i}")), pattern(*n, i as u8 + 1)).unwrap();
    }
    for block in [block, 48 << 10] {
        let (b, c) = (block.to_string(), chunk.to_string());
        let opts = ["-p", "3", "--block-size", &b, "--chunk-size", &c];
        let local = scratch("down");
        let (src, here) = (s.url("t"), local.display().to_string());
        let mut args = vec!["-r"];
        args.extend(opts);
        args.extend([src.as_str(), here.as_str()]);
        let o = cp(&args, &[]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let (there, back) = (
            local.join("t").display().to_string(),
            s.url(&format!("back{block}")),
        );
        let mut args = vec!["-r"];
        args.extend(opts);
        args.extend([there.as_str(), back.as_str()]);
        let o = cp(&args, &[]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        for i in 0..sizes.len() {
            let name = format!("f{i}");
            same_file(&tree.join(&name), &local.join("t").join(&name));
            same_file(
                &tree.join(&name),
                &s.root.join(format!("back{block}/t/{name}")),
            );
        }
        std::fs::remove_dir_all(&local).unwrap();
    }
}

/// SUM keeps the hash; every change the key can see makes the server hash again; the
/// blind spot keeps the stale hash, and a download then fails rather than commit.
#[test]
fn the_cache_follows_size_mtime_and_inode() {
    let s = serve(&[]);
    let path = s.root.join("big");
    std::fs::write(&path, pattern(BIG, 9)).unwrap();
    let url = s.url("big");
    let local_sum = || sum(path.to_str().unwrap());
    let first = sum(&url);
    assert_eq!(first, local_sum());
    assert_eq!(
        entry(&path).map(|e| e.len()),
        Some(80),
        "no cache entry written"
    );
    // Blind spot: same size, same mtime. The stale hash is served...
    rewrite_keeping_mtime(&path);
    assert_ne!(local_sum(), first);
    assert_eq!(sum(&url), first, "the cache was not used");
    // ...and a download of the file is refused, not committed.
    let local = scratch("local");
    let o = cp(&[&url, local.to_str().unwrap()], &[]);
    fails(&o, 4, "does not match");
    assert!(!local.join("big").exists());
    // mtime moved: hashed again.
    set_mtime(&path, SystemTime::now() + Duration::from_secs(5));
    assert_eq!(sum(&url), local_sum());
    // Size changed (mtime then put back): hashed again.
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all_at(b"more", BIG as u64).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    assert_eq!(sum(&url), local_sum());
    // Another inode (the file replaced by a copy carrying the attribute, same size and
    // mtime, different content): hashed again.
    let cached = entry(&path).unwrap();
    let tmp = s.root.join("big.new");
    let mut data = std::fs::read(&path).unwrap();
    data[7] ^= 0xff;
    std::fs::write(&tmp, &data).unwrap();
    let t = std::fs::File::open(&tmp).unwrap();
    rustix::fs::fsetxattr(&t, XATTR, &cached, rustix::fs::XattrFlags::empty()).unwrap();
    drop(t);
    set_mtime(&tmp, std::fs::metadata(&path).unwrap().modified().unwrap());
    std::fs::rename(&tmp, &path).unwrap();
    assert_eq!(sum(&url), local_sum());
    // A whole download after all that lands.
    let o = cp(&[&url, local.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    same_file(&path, &local.join("big"));
}

/// A whole-file GET writes the entry and a later GET sends it instead of hashing (shown by
/// the blind spot); with `--no-checksum-cache` nothing is written or read.
#[test]
fn gets_use_the_cache_unless_turned_off() {
    for off in [false, true] {
        let s = serve(if off { &["--no-checksum-cache"] } else { &[] });
        let path = s.root.join("big");
        std::fs::write(&path, pattern(BIG, 4)).unwrap();
        let local = scratch("local");
        let o = cp(&[&s.url("big"), local.to_str().unwrap()], &[]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(entry(&path).is_some(), !off);
        std::fs::remove_file(local.join("big")).unwrap();
        rewrite_keeping_mtime(&path);
        let o = cp(&[&s.url("big"), local.to_str().unwrap()], &[]);
        if off {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            same_file(&path, &local.join("big"));
        } else {
            fails(&o, 4, "does not match");
        }
        // Files below 32 KiB are neither cached nor looked up.
        let small = s.root.join("small");
        std::fs::write(&small, pattern((32 << 10) - 1, 5)).unwrap();
        assert_eq!(sum(&s.url("small")), sum(small.to_str().unwrap()));
        assert!(entry(&small).is_none());
    }
}

/// A file sent whole in one FILE frame (64 KiB) gets an entry at its first download and
/// takes its hash from it at the next. In the blind spot its frame carries the stale hash:
/// the client's check of the frame fails, it asks for the file again by length, and that
/// answer is hashed as read: the copy lands the new content and the entry is mended.
#[test]
fn a_small_file_takes_its_hash_from_the_cache_and_mends_a_stale_one() {
    let s = serve(&[]);
    let path = s.root.join("small");
    std::fs::write(&path, pattern(64 << 10, 6)).unwrap();
    let local = scratch("local");
    let down = || {
        let _ = std::fs::remove_file(local.join("small"));
        ok(&cp(&[&s.url("small"), local.to_str().unwrap()], &[]))
    };
    let first = down();
    assert_eq!(first["blocks_resent"], 0, "{first}");
    let stale = entry(&path).expect("no cache entry written for a FILE frame's file");
    assert_eq!(stale.len(), 80);
    same_file(&path, &local.join("small"));
    // Unchanged: the entry is used and left as it was.
    assert_eq!(down()["blocks_resent"], 0);
    assert_eq!(entry(&path).as_deref(), Some(&stale[..]));
    // Blind spot: the stale hash goes out, fails, and the file is fetched again, hashed.
    rewrite_keeping_mtime(&path);
    let mended = down();
    assert_eq!(
        mended["blocks_resent"], 1,
        "the stale hash was not sent: {mended}"
    );
    same_file(&path, &local.join("small"));
    let fresh = entry(&path).expect("the entry went");
    assert_ne!(fresh, stale, "the stale entry was kept");
    assert_eq!(down()["blocks_resent"], 0, "the mended entry is not used");
}

/// `-p 4`: SUM hashes the file and writes its entry while another stream's GET holds it
/// (paused by the test hook after its first block); the ctime that moves is the cache's
/// own, so that GET's check passes and the copy lands. (Checked: with the moves not
/// followed, this copy fails as a changed source.) The hook pauses the server's first read:
/// if that was the GET after the SUM on the same stream, the entry was already there and
/// nothing overlapped; the test then tries again on a new server.
#[test]
fn a_parallel_download_survives_the_entry_its_sum_writes() {
    for attempt in 0.. {
        assert!(attempt < 5, "the SUM never overlapped another stream's GET");
        let marker = scratch("marker").join("paused");
        let hook = marker.display().to_string();
        let s = serve_as(ferry(), "tcp", &[("FERRY_TEST_PAUSE_READ", &hook)], &[]);
        let path = s.root.join("big");
        std::fs::write(&path, pattern(16 << 20, 6)).unwrap();
        let watch = {
            let path = path.clone();
            std::thread::spawn(move || {
                let end = std::time::Instant::now() + Duration::from_secs(60);
                while !marker.exists() {
                    assert!(std::time::Instant::now() < end, "no read paused");
                    std::thread::sleep(Duration::from_millis(2));
                }
                let before = entry(&path).is_some();
                while entry(&path).is_none() && std::time::Instant::now() < end {
                    std::thread::sleep(Duration::from_millis(2));
                }
                std::fs::remove_file(&marker).unwrap();
                !before
            })
        };
        let local = scratch("local");
        let args = [
            "-p",
            "4",
            "--chunk-size",
            "1048576",
            "--block-size",
            "262144",
        ];
        let (url, here) = (s.url("big"), local.display().to_string());
        let mut a = args.to_vec();
        a.extend([url.as_str(), here.as_str()]);
        let o = cp(&a, &[]);
        let overlapped = watch.join().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        same_file(&path, &local.join("big"));
        if overlapped {
            break;
        }
    }
}

/// Four blocks (4 MiB, the default) and a last one large enough to be sent unread.
const HUGE: usize = (16 << 20) + (300 << 10);

/// The whole cache entry of `path`, if any.
fn entry_bytes(path: &Path) -> Option<Vec<u8>> {
    let f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    let n = rustix::fs::fgetxattr(&f, XATTR, &mut buf[..]).ok()?;
    Some(buf[..n].to_vec())
}

/// The `get` records of the audit file `path` as (bytes, bytes sent unread), waiting up to
/// 5 s for at least `n`.
fn gets(path: &Path, n: usize) -> Vec<(u64, u64)> {
    let end = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let got: Vec<(u64, u64)> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["op"] == "get")
            .map(|v| {
                let n = |k: &str| v[k].as_u64().unwrap_or(0);
                (n("bytes"), n("unread"))
            })
            .collect();
        if got.len() >= n || std::time::Instant::now() > end {
            return got;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How a test server sends the blocks its entries vouch for.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Vouched {
    /// Read into staging, the checks from the entry (the default).
    Copy,
    /// From a mapping of the file, unread (`FERRY_VOUCHED_SENDS=map`).
    Map,
    /// Read and checked as any block (`FERRY_ZERO_COPY_SENDS=off`).
    Off,
}

/// A file sent whole keeps its blocks' checks in its entry (format 2: CRC-32C at `clear`,
/// the span digests the `integrity` tag reads otherwise); sent again, its blocks carry
/// those checks: read into staging, or with `FERRY_VOUCHED_SENDS=map` unread (the audit's
/// `unread`), and land byte for byte; with `FERRY_ZERO_COPY_SENDS=off` they are read and
/// checked. So on every driver (each takes the mapping as it takes a staging block).
/// Rewritten with size and mtime kept (the blind spot), the copy is refused (exit 4) and
/// nothing is committed; the block whose cached check went stale is fetched again first,
/// which shows the cached checks were sent.
#[test]
fn a_cached_file_is_sent_unread_the_second_time() {
    for (driver, clear, how) in [
        ("tcp", false, Vouched::Copy),
        ("tcp", false, Vouched::Map),
        ("tcp", true, Vouched::Map),
        ("tcp", false, Vouched::Off),
        ("ofi+tcp", false, Vouched::Map),
        ("ofi+shm", true, Vouched::Map),
        ("ofi+shm", false, Vouched::Copy),
    ] {
        let dir = scratch("unread");
        let audit = dir.join("audit.jsonl");
        let mut args = vec!["--audit-log", audit.to_str().unwrap()];
        if clear {
            args.extend(["--protection", "clear,integrity"]);
        }
        let env: &[(&str, &str)] = match how {
            Vouched::Copy => &[],
            Vouched::Map => &[("FERRY_VOUCHED_SENDS", "map")],
            Vouched::Off => &[("FERRY_ZERO_COPY_SENDS", "off")],
        };
        let s = serve_as(ferry(), driver, env, &args);
        let path = s.root.join("huge");
        std::fs::write(&path, pattern(HUGE, 11)).unwrap();
        let local = dir.join("local");
        std::fs::create_dir(&local).unwrap();
        let (url, here) = (s.url("huge"), local.display().to_string());
        let mut a = if clear {
            vec!["--protect", "clear"]
        } else {
            vec![]
        };
        a.extend([url.as_str(), here.as_str()]);
        for round in 0..2 {
            let o = cp(&a, &[]);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            same_file(&path, &local.join("huge"));
            std::fs::remove_file(local.join("huge")).unwrap();
            let e = entry_bytes(&path).expect("an entry");
            assert_eq!(&e[..8], b"FERRYB32", "round {round}: not format 2");
            assert_eq!(
                e[80..82],
                [1, if clear { 1 } else { 2 }],
                "one list, its kind"
            );
        }
        let size = HUGE as u64;
        let unread = if how == Vouched::Map { size } else { 0 };
        assert_eq!(
            gets(&audit, 2),
            [(size, 0), (size, unread)],
            "{driver} clear {clear} {how:?}"
        );
        // The blind spot: the entry's checks are stale; the blocks that fail them are
        // fetched again and read, and the whole file's hash refuses the copy.
        rewrite_keeping_mtime(&path);
        let o = cp(&a, &[]);
        fails(&o, 4, "does not match");
        let refetched = String::from_utf8_lossy(&o.stderr).contains("it will be sent again");
        assert_eq!(
            refetched,
            how != Vouched::Off,
            "{driver} clear {clear} {how:?}"
        );
        assert!(!local.join("huge").exists());
    }
}

/// A format 1 entry (written by SUM: the root alone) gives a GET its hash, and that GET
/// writes format 2 with the same root; the next GET is sent unread.
#[test]
fn a_format_1_entry_is_used_then_upgraded() {
    let dir = scratch("upgrade");
    let audit = dir.join("audit.jsonl");
    let s = serve_mapping(&["--audit-log", audit.to_str().unwrap()]);
    let path = s.root.join("huge");
    std::fs::write(&path, pattern(HUGE, 12)).unwrap();
    assert_eq!(sum(&s.url("huge")), sum(path.to_str().unwrap()));
    let v1 = entry_bytes(&path).expect("SUM wrote an entry");
    assert_eq!((&v1[..8], v1.len()), (&b"FERRYB31"[..], 80));
    let local = dir.join("local");
    std::fs::create_dir(&local).unwrap();
    for _ in 0..2 {
        let o = cp(&[&s.url("huge"), local.to_str().unwrap()], &[]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        same_file(&path, &local.join("huge"));
        std::fs::remove_file(local.join("huge")).unwrap();
        let v2 = entry_bytes(&path).unwrap();
        assert_eq!(&v2[..8], b"FERRYB32");
        assert_eq!(v2[8..80], v1[8..80], "the same key and root");
    }
    let size = HUGE as u64;
    assert_eq!(gets(&audit, 2), [(size, 0), (size, size)]);
}

/// The file is truncated while its blocks are being sent unread (paused by the test hook
/// after the first block's send was prepared): the copy fails as a changed source (exit 4),
/// commits nothing, and the server keeps serving.
#[test]
fn a_file_truncated_while_sent_unread_fails_the_copy_not_the_server() {
    let marker = scratch("marker").join("paused");
    let hook = marker.display().to_string();
    let env = [
        ("FERRY_TEST_PAUSE_UNREAD", hook.as_str()),
        ("FERRY_VOUCHED_SENDS", "map"),
    ];
    let mut s = serve_as(ferry(), "tcp", &env, &[]);
    let path = s.root.join("huge");
    std::fs::write(&path, pattern(HUGE, 13)).unwrap();
    let local = scratch("local");
    let (url, here) = (s.url("huge"), local.display().to_string());
    let o = cp(&[&url, &here], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::remove_file(local.join("huge")).unwrap();
    let watch = {
        let path = path.clone();
        std::thread::spawn(move || {
            let end = std::time::Instant::now() + Duration::from_secs(60);
            while !marker.exists() {
                assert!(std::time::Instant::now() < end, "no unread send paused");
                std::thread::sleep(Duration::from_millis(2));
            }
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.set_len(1 << 20).unwrap();
            std::fs::remove_file(&marker).unwrap();
        })
    };
    let o = cp(&[&url, &here], &[]);
    watch.join().unwrap();
    // Caught before the block's send was posted: the transfer fails, the connection stays.
    // (A truncation after that check fails the send in the kernel and ends the connection:
    // ferry-fabric's mem tests.)
    fails(&o, 4, "the source changed while it was being copied");
    assert!(!local.join("huge").exists());
    assert!(s.child.try_wait().unwrap().is_none(), "the server died");
    let o = cp(&[&url, &here], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    same_file(&path, &local.join("huge"));
}

/// A file copied at `integrity` and at `clear` in turn keeps both kinds of checks in its
/// entry: after one copy at each level, the next ones at both are sent unread.
#[test]
fn both_levels_keep_their_checks() {
    let dir = scratch("levels");
    let audit = dir.join("audit.jsonl");
    let s = serve_mapping(&[
        "--audit-log",
        audit.to_str().unwrap(),
        "--protection",
        "clear,integrity",
    ]);
    let path = s.root.join("huge");
    std::fs::write(&path, pattern(HUGE, 14)).unwrap();
    let local = dir.join("local");
    std::fs::create_dir(&local).unwrap();
    let (url, here) = (s.url("huge"), local.display().to_string());
    for clear in [false, true, false, true] {
        let mut a = if clear {
            vec!["--protect", "clear"]
        } else {
            vec![]
        };
        a.extend([url.as_str(), here.as_str()]);
        let o = cp(&a, &[]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        same_file(&path, &local.join("huge"));
        std::fs::remove_file(local.join("huge")).unwrap();
    }
    assert_eq!(entry_bytes(&path).unwrap()[80], 2, "two lists of checks");
    let size = HUGE as u64;
    let want = [(size, 0), (size, 0), (size, size), (size, size)];
    assert_eq!(gets(&audit, 4), want);
}
