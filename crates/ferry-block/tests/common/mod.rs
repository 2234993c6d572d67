//! What the integration tests share: a real server on loopback (in this process, on its
//! own threads), the client tools it is tested with, and scratch files.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use ferry_block::config::{BlockConfig, ExportConfig};
use ferry_block::BlockServer;

/// A server serving until dropped.
pub struct Running {
    pub server: Arc<BlockServer>,
    quit: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// `nbd://127.0.0.1:PORT`
    pub base: String,
}

impl Running {
    /// The URI of export `name`.
    pub fn uri(&self, name: &str) -> String {
        format!("{}/{name}", self.base)
    }

    /// `host`, `port` of the TCP listener.
    pub fn addr(&self) -> String {
        self.base.trim_start_matches("nbd://").to_string()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.quit.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.server.drain(std::time::Duration::from_millis(100));
    }
}

/// Starts a server on `127.0.0.1:0` (and any `extra` listen addresses) with `exports`.
pub fn start(exports: Vec<ExportConfig>, extra: &[String]) -> Running {
    let mut listen = vec!["127.0.0.1:0".to_string()];
    listen.extend_from_slice(extra);
    start_config(BlockConfig {
        listen,
        exports,
        ..BlockConfig::default()
    })
}

/// Starts a server of `cfg` (its first listen address is the one [`Running::base`] names).
pub fn start_config(cfg: BlockConfig) -> Running {
    start_server(BlockServer::new(&cfg).expect("server starts"))
}

/// Serves `server` (made and adjusted by the caller) on a thread until dropped.
pub fn start_server(server: BlockServer) -> Running {
    let server = Arc::new(server);
    let base = server.local_addrs()[0].clone();
    let quit = Arc::new(AtomicBool::new(false));
    let (s, q) = (server.clone(), quit.clone());
    let thread = std::thread::spawn(move || s.serve_until(&q));
    Running {
        server,
        quit,
        thread: Some(thread),
        base,
    }
}

/// A scratch directory, removed when dropped.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh scratch directory on the real filesystem (direct I/O and holes work there).
pub fn scratch(tag: &str) -> Scratch {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("ferry-block-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

/// A sparse file of `size` bytes with a pattern in each `(offset, len)` of `data` and
/// holes elsewhere.
pub fn sparse_file(path: &Path, size: u64, data: &[(u64, usize)]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    for &(off, len) in data {
        f.write_all_at(&pattern(off, len), off).unwrap();
    }
    f.sync_all().unwrap();
}

/// Bytes that differ at every offset (so a misplaced block shows).
pub fn pattern(offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = (offset + i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            (x >> 56) as u8 | 1
        })
        .collect()
}

/// Fails the test, naming the Debian package, when `tool` is not installed.
pub fn need(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{tool} is not installed: install the Debian package {package} (scripts/install-deps.sh does)"
    );
}

/// Runs a command and requires it to succeed; its output.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Whether two files hold the same bytes.
pub fn same_bytes(a: &Path, b: &Path) -> bool {
    std::fs::read(a).unwrap() == std::fs::read(b).unwrap()
}

/// `nbdsh`, run with a `python3` that has the libnbd module: nbdsh runs the first
/// `python3` on PATH, which on hosts with a second Python (pyenv, a venv) lacks Debian's
/// module, so the system interpreter's directory goes first there.
pub fn nbdsh() -> Command {
    need("nbdsh", "python3-libnbd");
    let imports = |py: &str| {
        Command::new(py)
            .args(["-c", "import nbd"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let mut c = Command::new("nbdsh");
    if !imports("python3") {
        assert!(
            imports("/usr/bin/python3"),
            "no python3 here imports nbd: install the Debian package python3-libnbd"
        );
        let path = std::env::var("PATH").unwrap_or_default();
        c.env("PATH", format!("/usr/bin:{path}"));
    }
    c
}
