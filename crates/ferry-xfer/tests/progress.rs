//! What `ferry cp`'s progress hears from a copy: a real server (in-process, on loopback)
//! and tree copies both ways, over one stream and over three. The listing's file count and
//! each completed file are reported (a tree's bar shows `done/total files`), every byte is
//! reported once, and what a resumed copy finds already there is reported as such, never
//! as bytes moved (a display keeps those out of its rate).

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use ferry_xfer::client::{copy, Options, Progress, Skip};
use ferry_xfer::config::{AuthConfig, RootConfig, ServerConfig};
use ferry_xfer::server::Server;
use ferry_xfer::url::{Location, Remote};

const T: Duration = Duration::from_secs(10);
const BLOCK: u32 = 64 * 1024;

/// Everything a copy reported.
#[derive(Default)]
struct Recorded {
    total: AtomicU64,
    files: AtomicU64,
    moved: AtomicU64,
    held: AtomicU64,
    done: AtomicU64,
    /// `file_done` before the listing's count arrived, or beyond it.
    out_of_order: Mutex<Vec<String>>,
}

impl Progress for Recorded {
    fn total(&self, bytes: u64) {
        self.total.fetch_add(bytes, Ordering::SeqCst);
    }
    fn add(&self, bytes: u64) {
        self.moved.fetch_add(bytes, Ordering::SeqCst);
    }
    fn already_there(&self, bytes: u64) {
        self.held.fetch_add(bytes, Ordering::SeqCst);
    }
    fn files(&self, files: u64) {
        self.files.fetch_add(files, Ordering::SeqCst);
    }
    fn file_done(&self) {
        let done = self.done.fetch_add(1, Ordering::SeqCst) + 1;
        if done > self.files.load(Ordering::SeqCst) {
            self.out_of_order
                .lock()
                .unwrap()
                .push(format!("file {done}"));
        }
    }
}

impl Recorded {
    /// (total, files, moved, held, done)
    fn get(&self) -> (u64, u64, u64, u64, u64) {
        let l = |a: &AtomicU64| a.load(Ordering::SeqCst);
        (
            l(&self.total),
            l(&self.files),
            l(&self.moved),
            l(&self.held),
            l(&self.done),
        )
    }
}

fn scratch(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "ferry-progress-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Starts a server exporting `dir` as `d`; returns its address.
fn start(dir: &Path) -> String {
    let cfg = ServerConfig {
        listen: vec!["tcp://127.0.0.1:0".into()],
        block_size: BLOCK,
        ring: 4,
        auth: AuthConfig {
            tokens: vec!["tok".into()],
            anonymous: false,
            ..AuthConfig::default()
        },
        roots: vec![RootConfig {
            name: "d".into(),
            path: dir.to_path_buf(),
            read_only: false,
        }],
        ..ServerConfig::default()
    };
    let server = Server::new(cfg).unwrap();
    let listeners = server.bind().unwrap();
    let addr = listeners[0].local_addr();
    std::thread::spawn(move || server.serve(&listeners));
    addr
}

/// A tree of five files: small ones (one frame each), one of many blocks (split into
/// chunks over several streams), one in a subdirectory. Returns its byte count.
fn make_tree(at: &Path) -> u64 {
    let sizes = [
        ("a", 10),
        ("b", 40_000),
        ("big", 1_500_000),
        ("sub/c", 300_000),
        ("sub/d", 0),
    ];
    std::fs::create_dir_all(at.join("sub")).unwrap();
    for (i, (name, size)) in sizes.iter().enumerate() {
        let bytes: Vec<u8> = (0..*size).map(|j: usize| (j * 31 + i) as u8).collect();
        std::fs::write(at.join(name), bytes).unwrap();
    }
    sizes.iter().map(|s| s.1 as u64).sum()
}

fn opts(streams: u16, skip: Skip) -> Options {
    Options {
        token: "tok".into(),
        block_size: BLOCK,
        timeout: T,
        idle_timeout: T,
        streams,
        auto_streams: false,
        chunk: 4 * u64::from(BLOCK),
        skip,
        security: common::security(),
        ..Options::default()
    }
}

fn remote(addr: &str, path: &str) -> Location {
    Location::Remote(Remote {
        addr: addr.to_string(),
        path: path.into(),
    })
}

/// Copies `src` to `dst` and checks what was reported against a tree of `bytes` bytes in
/// five files: moved (a first copy) or all found there (the same copy again, resuming).
fn check_copy(src: &Location, dst: &Location, streams: u16, bytes: u64, what: &str) {
    for (skip, again) in [(Skip::Nothing, false), (Skip::Unchanged, true)] {
        let rec = Recorded::default();
        let stats = copy(src, dst, true, &opts(streams, skip), &rec).unwrap();
        let (total, files, moved, held, done) = rec.get();
        let case = format!("{what} -p {streams}, again: {again}");
        assert_eq!((total, files, done), (bytes, 5, 5), "{case}");
        assert_eq!(stats.files, 5, "{case}");
        let out = rec.out_of_order.lock().unwrap();
        assert!(out.is_empty(), "{case}: done beyond the listing: {out:?}");
        if again {
            assert_eq!((moved, held, stats.files_skipped), (0, bytes, 5), "{case}");
        } else {
            assert_eq!((moved, held), (bytes, 0), "{case}");
        }
    }
}

#[test]
fn tree_copies_report_files_and_bytes_once() {
    let served = scratch("served");
    let addr = start(&served);
    let bytes = make_tree(&served.join("src"));
    for streams in [1, 3] {
        let local = scratch("local");
        check_copy(
            &remote(&addr, "d/src"),
            &Location::Local(local.join("down")),
            streams,
            bytes,
            "download",
        );
        check_copy(
            &Location::Local(served.join("src")),
            &remote(&addr, &format!("d/up{streams}")),
            streams,
            bytes,
            "upload",
        );
        let _ = std::fs::remove_dir_all(&local);
    }
    let _ = std::fs::remove_dir_all(&served);
}
