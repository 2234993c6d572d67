//! What the end-to-end transfer tests share: `ferry` processes, scratch directories, running
//! servers, and checks of a command's outcome.

// Each test binary uses its own subset.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The token every test server accepts.
pub const TOKEN: &str = "test-token-1";

/// The `ferry` under test, quiet, with no token from the environment, and this test
/// process's own server identity and known hosts ([`isolate`]).
pub fn ferry() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferry"));
    c.env("RUST_LOG", "warn").env_remove("FERRY_TOKEN");
    isolate(&mut c);
    c
}

/// Where this test process keeps its servers' identity and its clients' known hosts.
pub fn security_dir() -> PathBuf {
    std::env::temp_dir().join(format!("ferry-test-security-{}", std::process::id()))
}

/// Gives `c` this test process's state directory (one server identity, made by the first
/// server) and known-hosts file (its clients pin that identity on first use), so that no
/// test reads or writes the machine's own (/var/lib/ferry, ~/.config/ferry).
pub fn isolate(c: &mut Command) {
    let dir = security_dir();
    c.env("FERRY_STATE_DIR", dir.join("state"))
        .env("FERRY_KNOWN_HOSTS", dir.join("known_hosts"))
        // No client key of the machine's user (~/.config/ferry/id_ed25519) is used.
        .env("XDG_CONFIG_HOME", dir.join("config"));
}

/// How an in-process client (a library call, not a `ferry` child) checks this test
/// process's servers: by the same known-hosts file as the [`isolate`]d children, not the
/// run's or the user's.
pub fn client_security() -> ferry_service::secure::ClientSecurity {
    ferry_service::secure::ClientSecurity {
        known_hosts: security_dir().join("known_hosts"),
        ..Default::default()
    }
}

/// The fingerprint of this test process's server identity (`ferry serve --fingerprint`).
pub fn fingerprint() -> String {
    let mut c = ferry();
    c.args(["serve", "--fingerprint"]);
    let o = run(c);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

/// A fresh empty directory under the temp dir.
pub fn scratch(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "ferry-test-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A running `ferry serve` exporting a scratch directory as root `d`, killed on drop.
pub struct Server {
    pub child: Child,
    pub addr: String,
    pub root: PathBuf,
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

impl Server {
    /// `path` under root `d`, as a URL.
    pub fn url(&self, path: &str) -> String {
        format!("{}/d/{path}", self.addr)
    }

    /// A path of any root (e.g. `mem/null`), as a URL.
    pub fn at(&self, path: &str) -> String {
        format!("{}/{path}", self.addr)
    }
}

/// A loopback address (or shm name) for `driver`, port chosen by the system.
pub fn listen_url(driver: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    match driver {
        "ofi+shm" => format!("ofi+shm://ferry-test-{}-{n}", std::process::id()),
        d => format!("{d}://127.0.0.1:0"),
    }
}

/// Starts `cmd` (`ferry`, or `ferry` behind a wrapper) as `serve` on `driver` with `env`
/// and extra `args`, and waits until it listens.
pub fn serve_as(cmd: Command, driver: &str, env: &[(&str, &str)], args: &[&str]) -> Server {
    serve_logging(cmd, driver, env, args, Stdio::inherit())
}

/// [`serve_as`] with the server's log (stderr) going to `log`.
pub fn serve_logging(
    mut cmd: Command,
    driver: &str,
    env: &[(&str, &str)],
    args: &[&str],
    log: Stdio,
) -> Server {
    let root = scratch("root");
    isolate(&mut cmd);
    cmd.args(["serve", "--root"])
        .arg(format!("d={}", root.display()))
        .args(["--listen", &listen_url(driver), "--token", TOKEN])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(log);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn ferry serve");
    let addr = listening(&mut child, 1).remove(0);
    Server { child, addr, root }
}

/// The addresses the first `count` `listening on` lines of a `ferry serve` child (stdout
/// piped) name.
pub fn listening(child: &mut Child, count: usize) -> Vec<String> {
    let mut out = BufReader::new(child.stdout.take().expect("serve's stdout is piped"));
    (0..count)
        .map(|_| {
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            line.trim()
                .strip_prefix("listening on ")
                .unwrap_or_else(|| panic!("serve printed {line:?}"))
                .to_string()
        })
        .collect()
}

/// The longest a test's command may run before it is killed and the test fails (a hung
/// copy must fail its test, not stall the suite until CI's limit).
const COMMAND_LIMIT: Duration = Duration::from_secs(300);

/// Runs a command to its end, or kills it and panics after [`COMMAND_LIMIT`].
pub fn run(mut c: Command) -> Output {
    let what = format!(
        "{:?} {:?}",
        c.get_program(),
        c.get_args().collect::<Vec<_>>()
    );
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > COMMAND_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            let err = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
            panic!("{what} still ran after {COMMAND_LIMIT:?}: killed; stderr: {err}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// `ferry cp --token TOKEN --json ARGS` with `env`.
pub fn cp(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = ferry();
    c.args(["cp", "--token", TOKEN, "--json"]).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    run(c)
}

/// The one JSON line a `--json` command printed.
pub fn json(o: &Output) -> Value {
    let text = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "stdout {text:?} is not one JSON ({e}); stderr: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// Asserts success and returns the JSON line.
pub fn ok(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "ferry failed ({:?}): {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    json(o)
}

/// Asserts exit `code` and that stderr says `says`.
pub fn fails(o: &Output, code: i32, says: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert!(err.contains(says), "{says:?} not in: {err}");
}

/// `len` bytes of a seeded xorshift pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    let mut x = u64::from(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Asserts two files hold the same bytes.
pub fn same_file(a: &Path, b: &Path) {
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    assert!(
        x.len() == y.len() && x == y,
        "{} and {} differ",
        a.display(),
        b.display()
    );
}

/// Asserts two trees hold the same directories and files, byte for byte.
pub fn same_tree(a: &Path, b: &Path) {
    let list = |r: &Path| {
        let mut out = Vec::new();
        let mut todo = vec![r.to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let rel = p.strip_prefix(r).unwrap().to_path_buf();
                if p.is_dir() {
                    todo.push(p);
                    out.push((rel, None));
                } else {
                    out.push((rel, Some(std::fs::read(&p).unwrap())));
                }
            }
        }
        out.sort();
        out
    };
    assert!(
        list(a) == list(b),
        "trees {} and {} differ",
        a.display(),
        b.display()
    );
}

/// `ferry keygen -f DIR/NAME`; the private key's path and its public-key line.
pub fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    let key = dir.join(name);
    let mut c = ferry();
    c.args(["keygen", "-C", name, "-f"]).arg(&key);
    let o = run(c);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("SHA256:"));
    let line = std::fs::read_to_string(dir.join(format!("{name}.pub"))).unwrap();
    (key, line.trim().to_string())
}

/// A private file (mode 600) at `path` holding `text`.
pub fn private(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}
