//! Resume, retries and SIGTERM journaling of `ferry cp` / `ferry serve`, with real processes
//! on loopback on every driver: `kill -9` of either side at random points (seeded; the seed
//! is printed, `FERRY_TEST_SEED=N` replays it), a server restarted under a client with
//! `--retries`, SIGTERM during a transfer, a source that changed between runs, a dropped
//! connection, and a tree resumed. Every resumed file must be byte-identical and must not
//! have moved its completed ranges again.
//!
//! No process here may run unbounded: libfabric 1.17's shm can spin forever in a process
//! whose peer was killed holding its lock. ferry's watchdog (docs/fabric.md) turns that into
//! an exit (serve: status 75, cp: status 6 saying "wedged"); the tests restart a wedged
//! server, run a wedged client again with `--resume`, count the wedges, and kill and fail
//! any process that outlives [`CHILD_LIMIT`].

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::ok;

const TOKEN: &str = "resume-token";
/// Small blocks so a kill lands between many of them.
const BLOCK: &str = "262144";
/// The file the kill runs move: long enough to be interrupted mid-way in a debug build.
const SIZE: usize = 48 << 20;
/// `ferry serve`'s status when its provider wedged.
const WEDGED_EXIT: i32 = 75;
/// `ferry cp`'s status on a connection failure (also when its provider wedged).
const CONNECTION_EXIT: i32 = 6;
/// The longest any one `ferry` process of these tests may run.
const CHILD_LIMIT: Duration = Duration::from_secs(240);
/// Wedges seen: servers that exited with [`WEDGED_EXIT`], clients that failed on one.
static SERVER_WEDGES: AtomicU32 = AtomicU32::new(0);
static CLIENT_WEDGES: AtomicU32 = AtomicU32::new(0);

fn ferry() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferry"));
    // A peer killed on an ofi driver is noticed after 1 s instead of 10.
    c.env("RUST_LOG", "warn")
        .env("FERRY_OFI_PEER_TIMEOUT", "1")
        // A provider call stuck this long wedges the process (exit) instead of hanging it.
        .env("FERRY_OFI_WEDGE_TIMEOUT", "5")
        .env_remove("FERRY_TOKEN");
    common::isolate(&mut c);
    c
}

fn scratch(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "ferry-resume-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A tiny seeded generator (xorshift64*), so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn from_env(test: &str) -> Rng {
        let seed = std::env::var("FERRY_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!("{test}: seed {seed} (replay with FERRY_TEST_SEED={seed})");
        Rng(seed | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A `ferry serve` that can be killed and started again at the same address.
struct Server {
    child: Option<Child>,
    driver: String,
    listen: String,
    addr: String,
    root: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    /// Environment for the next start only (a test hook).
    once_env: Vec<(String, String)>,
    /// Restarts after a wedge.
    wedge_restarts: u32,
}

fn listen_url(driver: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    match driver {
        "ofi+shm" => format!("ofi+shm://ferry-resume-{}-{n}", std::process::id()),
        d => format!("{d}://127.0.0.1:0"),
    }
}

impl Server {
    fn start(driver: &str, args: &[&str]) -> Server {
        let root = scratch("root");
        let log = root.with_extension("log");
        let mut s = Server {
            child: None,
            driver: driver.into(),
            listen: listen_url(driver),
            addr: String::new(),
            root,
            log,
            args: args.iter().map(|a| a.to_string()).collect(),
            once_env: Vec::new(),
            wedge_restarts: 0,
        };
        s.spawn();
        s
    }

    /// [`Server::start`], with `env` set for the first start only.
    fn start_once_with(driver: &str, env: &[(&str, &str)]) -> Server {
        let mut s = Server {
            child: None,
            driver: driver.into(),
            listen: listen_url(driver),
            addr: String::new(),
            root: scratch("root"),
            log: PathBuf::new(),
            args: Vec::new(),
            once_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            wedge_restarts: 0,
        };
        s.log = s.root.with_extension("log");
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let t = Instant::now();
        loop {
            let mut cmd = ferry();
            cmd.args(["serve", "--root"])
                .arg(format!("d={}", self.root.display()))
                .args(["--listen", &self.listen, "--token", TOKEN])
                .args(&self.args)
                .envs(std::mem::take(&mut self.once_env))
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&self.log).unwrap());
            let mut child = cmd.spawn().expect("spawn ferry serve");
            let out = child.stdout.take().unwrap();
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = BufReader::new(out).read_line(&mut line);
                let _ = tx.send(line);
            });
            let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) else {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "serve did not start within 60 s (stuck in the provider?): {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            };
            if let Some(a) = line.trim().strip_prefix("listening on ") {
                self.addr = a.to_string();
                // Restarts bind the same address.
                if self.driver != "ofi+shm" {
                    self.listen = self.addr.clone();
                }
                self.child = Some(child);
                return;
            }
            // The old listener's address may take a moment to free up.
            let _ = child.wait();
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "serve did not start: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Restarts the server if it exited with the wedge status (true if so); fails if it
    /// exited otherwise.
    fn revive(&mut self) -> bool {
        let Some(c) = self.child.as_mut() else {
            return false;
        };
        let Some(st) = c.try_wait().unwrap() else {
            return false;
        };
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        assert_eq!(st.code(), Some(WEDGED_EXIT), "ferry serve exited: {log}");
        assert!(
            log.contains("wedged"),
            "exit {WEDGED_EXIT} without saying why: {log}"
        );
        let n = SERVER_WEDGES.fetch_add(1, Ordering::Relaxed) + 1;
        self.wedge_restarts += 1;
        eprintln!("server wedged ({n} so far), restarting it: {}", log.trim());
        self.child = None;
        self.spawn();
        true
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}/d/{path}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.root);
        let _ = std::fs::remove_file(&self.log);
        if let Some(name) = self.listen.strip_prefix("ofi+shm://") {
            // A killed server cannot unlink its shared-memory region itself.
            if let Ok(rd) = std::fs::read_dir("/dev/shm") {
                for e in rd.flatten() {
                    if e.file_name().to_string_lossy().starts_with(name) {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
    }
}

fn cp_cmd(args: &[&str]) -> Command {
    let mut c = ferry();
    c.args(["cp", "--token", TOKEN, "--json", "--block-size", BLOCK])
        .args(args);
    c
}

fn num(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

fn same(a: &Path, b: &Path) {
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    assert!(
        x.len() == y.len() && x == y,
        "{} and {} differ ({} and {} bytes)",
        a.display(),
        b.display(),
        x.len(),
        y.len()
    );
}

fn part_of(p: &Path) -> PathBuf {
    let name = p.file_name().unwrap().to_string_lossy();
    p.with_file_name(format!(".{name}.ferry-part"))
}

fn journal_of(p: &Path) -> PathBuf {
    let name = p.file_name().unwrap().to_string_lossy();
    p.with_file_name(format!(".{name}.ferry-part.journal"))
}

fn no_leftovers(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!n.contains(".ferry-part"), "left behind: {n}");
    }
}

/// Waits until the receiver's part file holds at least `bytes`; false if the copy ended
/// first.
fn wait_for_part(part: &Path, bytes: u64, copier: &mut Child, s: &mut Server) -> bool {
    let t = Instant::now();
    loop {
        s.revive();
        if std::fs::metadata(part).is_ok_and(|m| m.len() >= bytes) {
            return true;
        }
        if copier.try_wait().unwrap().is_some() {
            return false;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the copy never got going"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Starts the download `cp` into `dest` and waits until its part file is past the first
/// checkpoint (8 MiB), so there is something to resume from.
fn past_first_checkpoint(mut cp: Command, dest: &Path, s: &mut Server) -> Child {
    let mut client = cp
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for_part(&part_of(dest), 24 << 20, &mut client, s));
    client
}

fn finish(c: Child) -> Output {
    finish_serving(c, None)
}

/// Waits for `c` (reading its output meanwhile) for at most [`CHILD_LIMIT`], restarting
/// `server` whenever it exits wedged; a process still running then is killed and the test
/// fails.
fn finish_serving(mut c: Child, mut server: Option<&mut Server>) -> Output {
    fn drain(r: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    }
    let (out, err) = (drain(c.stdout.take()), drain(c.stderr.take()));
    let t = Instant::now();
    let status = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        if let Some(s) = server.as_deref_mut() {
            s.revive();
        }
        if t.elapsed() > CHILD_LIMIT {
            let _ = c.kill();
            let _ = c.wait();
            let err = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
            panic!(
                "a ferry process ran over {CHILD_LIMIT:?} and was killed (a thread spinning \
                 in a wedged libfabric provider that the watchdog missed?); stderr: {err}"
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// `Command::output`, bounded like [`finish`].
trait Bounded {
    fn bounded(&mut self) -> std::io::Result<Output>;
}

impl Bounded for Command {
    fn bounded(&mut self) -> std::io::Result<Output> {
        let c = self.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        Ok(finish(c))
    }
}

/// Waits for `c`'s exit for at most [`CHILD_LIMIT`] (killing it and failing after).
fn wait_bounded(mut c: Child) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            return st;
        }
        if t.elapsed() > CHILD_LIMIT {
            let _ = c.kill();
            let _ = c.wait();
            panic!("a ferry process ran over {CHILD_LIMIT:?} and was killed");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// True if a `ferry cp` failed because its provider wedged.
fn client_wedged(o: &Output) -> bool {
    o.status.code() == Some(CONNECTION_EXIT)
        && String::from_utf8_lossy(&o.stderr).contains("wedged")
}

/// Runs `cp` (a `--resume` command) to completion against `s`: restarts the server when it
/// wedges and runs the client again when it wedged or when the server wedged under it.
fn cp_resumed(s: &mut Server, cp: impl Fn() -> Command, what: &str) -> Value {
    for attempt in 0.. {
        let before = SERVER_WEDGES.load(Ordering::Relaxed);
        let c = cp()
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let o = finish_serving(c, Some(s));
        if o.status.success() || attempt == 4 {
            return ok(&o);
        }
        let server_wedged = SERVER_WEDGES.load(Ordering::Relaxed) > before;
        if client_wedged(&o) {
            let n = CLIENT_WEDGES.fetch_add(1, Ordering::Relaxed) + 1;
            eprintln!("{what}: client wedged ({n} so far); running it again");
            if attempt >= 1 {
                // Fresh clients keep wedging: the dead peer's lock is in the server's
                // region, which the server itself may never touch (so it never wedges).
                // An operator restarts the server; so does this test.
                eprintln!("{what}: clients keep wedging; restarting the server");
                s.kill9();
                s.spawn();
            }
        } else if !(server_wedged && o.status.code() == Some(CONNECTION_EXIT)) {
            return ok(&o);
        }
    }
    unreachable!()
}

#[derive(Debug, Clone, Copy)]
enum Victim {
    Client,
    Server,
}

/// One kill run: a copy (download or upload) is interrupted by `kill -9` of `victim` once
/// `frac` of the file has reached the receiver; a killed client is run again with
/// `--resume`, a killed server is restarted under a client running with `--retries`. The
/// result must be identical, and the finishing run must have moved less than the file.
/// False if a wedge ended the copy before the kill: the run must be done again.
fn kill_run(
    s: &mut Server,
    local: &Path,
    src_name: &str,
    i: usize,
    down: bool,
    victim: Victim,
    frac: f64,
) -> bool {
    kill_run_with(s, local, src_name, i, down, victim, frac, &[])
}

/// [`kill_run`] with more `ferry cp` arguments (e.g. `-p 4`). With parallel streams the
/// part file grows out of order (its length says little), so the kill also waits for the
/// receiver's first checkpoint.
#[allow(clippy::too_many_arguments)]
fn kill_run_with(
    s: &mut Server,
    local: &Path,
    src_name: &str,
    i: usize,
    down: bool,
    victim: Victim,
    frac: f64,
    extra: &[&str],
) -> bool {
    let local_src = local.join(src_name);
    let (from, to, dest) = if down {
        let d = local.join(format!("down{i}"));
        (s.url(src_name), d.to_str().unwrap().to_string(), d)
    } else {
        (
            local_src.to_str().unwrap().to_string(),
            s.url(&format!("up{i}")),
            s.root.join(format!("up{i}")),
        )
    };
    // On the ofi drivers a client whose server died does not always notice (the fabric's
    // keepalive declares dead only peers that once answered a PING): the idle timeout
    // bounds the wait.
    // Connecting right after a restart on ofi+shm is sometimes reset: every command
    // retries its connection.
    let retries: &[&str] = match victim {
        Victim::Client => &["--retries", "5"],
        Victim::Server => &["--retries", "30", "--idle-timeout", "3"],
    };
    let mut first = cp_cmd(retries)
        .args(extra)
        .args([&from, &to])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let at = (SIZE as f64 * frac) as u64;
    let before = SERVER_WEDGES.load(Ordering::Relaxed);
    let waited = if extra.is_empty() {
        wait_for_part(&part_of(&dest), at, &mut first, s)
    } else {
        // Two 1 KiB journal slots: at least one checkpoint was written.
        wait_for_part(&journal_of(&dest), 2048, &mut first, s)
            && wait_for_part(&part_of(&dest), at, &mut first, s)
    };
    if !waited {
        let o = finish_serving(first, Some(s));
        let server_wedged = SERVER_WEDGES.load(Ordering::Relaxed) > before;
        if client_wedged(&o) || (server_wedged && !o.status.success()) {
            if client_wedged(&o) {
                CLIENT_WEDGES.fetch_add(1, Ordering::Relaxed);
            }
            eprintln!("run {i}: a wedge ended the copy before the kill; doing the run again");
            let _ = std::fs::remove_file(part_of(&dest));
            let _ = std::fs::remove_file(journal_of(&dest));
            return false;
        }
        panic!(
            "run {i}: the copy ended before byte {at}: {:?} {} {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let resumed = |args: &'static [&'static str]| {
        let (from, to) = (from.clone(), to.clone());
        move || {
            let mut c = cp_cmd(args);
            c.args(extra).args([&from, &to]);
            c
        }
    };
    let what = format!("run {i}");
    let v = match victim {
        Victim::Client => {
            let _ = first.kill();
            let _ = first.wait();
            assert!(
                !dest.exists(),
                "run {i}: a partial file appeared under its name"
            );
            cp_resumed(s, resumed(&["--resume", "--retries", "5"]), &what)
        }
        Victim::Server => {
            s.kill9();
            assert!(
                !dest.exists(),
                "run {i}: a partial file appeared under its name"
            );
            s.spawn();
            let before = SERVER_WEDGES.load(Ordering::Relaxed);
            let o = finish_serving(first, Some(s));
            let server_wedged = SERVER_WEDGES.load(Ordering::Relaxed) > before;
            if o.status.success() {
                let v = ok(&o);
                assert!(num(&v, "retries") >= 1, "run {i}: {v}");
                v
            } else if client_wedged(&o)
                || (server_wedged && o.status.code() == Some(CONNECTION_EXIT))
            {
                if client_wedged(&o) {
                    let n = CLIENT_WEDGES.fetch_add(1, Ordering::Relaxed) + 1;
                    eprintln!("{what}: client wedged ({n} so far); resuming it");
                }
                let args = &["--resume", "--retries", "30", "--idle-timeout", "3"];
                cp_resumed(s, resumed(args), &what)
            } else {
                ok(&o)
            }
        }
    };
    let size = SIZE as u64;
    assert_eq!(num(&v, "bytes"), size, "run {i}: {v}");
    assert!(
        num(&v, "resumed_bytes") > 0,
        "run {i}: nothing was resumed: {v}"
    );
    // (A resumed run that itself had to reconnect counts both attempts.)
    if matches!(victim, Victim::Client) && num(&v, "retries") == 0 {
        assert!(
            num(&v, "wire_bytes") + num(&v, "resumed_bytes") == size,
            "run {i}: resumed and moved bytes must add up to the file: {v}"
        );
    }
    let src = if down {
        s.root.join(src_name)
    } else {
        local_src
    };
    same(&src, &dest);
    assert!(!part_of(&dest).exists() && !journal_of(&dest).exists());
    eprintln!(
        "run {i}{extra:?}: {} {victim:?} killed at {:.0}%: resumed {} MiB, moved {} MiB by the finishing process",
        if down { "download" } else { "upload" },
        frac * 100.0,
        num(&v, "resumed_bytes") >> 20,
        num(&v, "wire_bytes") >> 20
    );
    true
}

/// Does kill run `i` until a wedge no longer ends its copy early (three tries).
fn kill_run_retrying(mut run: impl FnMut() -> bool, i: usize) {
    for _ in 0..3 {
        if run() {
            return;
        }
    }
    panic!("run {i}: wedges ended the copy early three times");
}

/// Prints the wedges seen so far (the kill runs on ofi+shm meet some).
fn report_wedges(test: &str) {
    eprintln!(
        "{test}: wedges seen: {} server(s) restarted, {} client(s) run again",
        SERVER_WEDGES.load(Ordering::Relaxed),
        CLIENT_WEDGES.load(Ordering::Relaxed)
    );
}

/// `runs` kill runs on one driver: direction, victim and kill point drawn from the seed.
fn kill_runs(driver: &str, runs: usize) {
    let mut rng = Rng::from_env(&format!("kill_runs {driver}"));
    let mut s = Server::start(driver, &[]);
    let local = scratch("local");
    let data = pattern(SIZE, rng.next());
    std::fs::write(s.root.join("src"), &data).unwrap();
    std::fs::write(local.join("src"), &data).unwrap();
    for i in 0..runs {
        let down = rng.below(2) == 0;
        let victim = if rng.below(2) == 0 {
            Victim::Client
        } else {
            Victim::Server
        };
        // From 40 %: past the receiver's first checkpoint (16 MiB), so there is always
        // something journaled to resume.
        let frac = 0.4 + rng.below(46) as f64 / 100.0;
        kill_run_retrying(|| kill_run(&mut s, &local, "src", i, down, victim, frac), i);
    }
    report_wedges(&format!("kill_runs {driver}"));
    no_leftovers(&local);
    no_leftovers(&s.root);
    std::fs::remove_dir_all(&local).unwrap();
}

/// `runs` kill runs with four parallel streams (small chunks, so many are in flight): the
/// journal's range set lets the resumed copy move only what is missing.
fn kill_runs_streams(driver: &str, runs: usize) {
    let mut rng = Rng::from_env(&format!("kill_runs_streams {driver}"));
    let mut s = Server::start(driver, &[]);
    let local = scratch("local");
    let data = pattern(SIZE, rng.next());
    std::fs::write(s.root.join("src"), &data).unwrap();
    std::fs::write(local.join("src"), &data).unwrap();
    let extra = ["-p", "4", "--chunk-size", "2097152"];
    for i in 0..runs {
        // Every direction and victim at least once.
        let down = i % 2 == 0;
        let victim = if (i / 2) % 2 == 0 {
            Victim::Client
        } else {
            Victim::Server
        };
        let frac = 0.3 + rng.below(50) as f64 / 100.0;
        kill_run_retrying(
            || kill_run_with(&mut s, &local, "src", i, down, victim, frac, &extra),
            i,
        );
    }
    report_wedges(&format!("kill_runs_streams {driver}"));
    no_leftovers(&local);
    no_leftovers(&s.root);
    std::fs::remove_dir_all(&local).unwrap();
}

#[test]
fn kill_runs_streams_tcp() {
    kill_runs_streams("tcp", 4);
}

#[test]
fn kill_runs_streams_ofi_tcp() {
    kill_runs_streams("ofi+tcp", 4);
}

#[test]
fn kill_runs_streams_ofi_shm() {
    kill_runs_streams("ofi+shm", 4);
}

/// Bytes of `p` on disk: a part that parallel streams fill out of order is sparse, and its
/// length says little.
fn allocated(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).map_or(0, |m| m.blocks() * 512)
}

/// The bytes the journal next to `dest`'s part vouches for (0 if none is valid).
fn vouched(dest: &Path) -> u64 {
    std::fs::File::open(journal_of(dest))
        .ok()
        .and_then(ferry_xfer::journal::Journal::load)
        .map_or(0, |j| j.ranges().total())
}

/// `kill -9` of the receiver of a `-p 4` copy loses at most what docs/xfer.md promises
/// (two checkpoint intervals plus the block each other stream is writing), however large
/// the chunks: killed before any chunk is whole, the journal still vouches for all but that
/// much of what is on disk; and `--resume` then moves exactly the rest. Down (the client
/// killed) and up (the server killed).
#[test]
fn parallel_kill_loses_at_most_the_bound() {
    const CHUNK: u64 = 24 << 20;
    const BIG: usize = 4 * CHUNK as usize;
    let streams = 4;
    let block: u64 = BLOCK.parse().unwrap();
    let bound = 2 * ferry_xfer::landing::CHECKPOINT_BYTES + (streams - 1) * block;
    // Killed before any chunk can be whole (no stream has written a chunk's worth).
    let kill_at = CHUNK - (3 << 20);
    assert!(
        kill_at > bound + (2 << 20),
        "the kill point must tell the bound apart"
    );
    let mut s = Server::start("tcp", &[]);
    let local = scratch("local");
    let data = pattern(BIG, 1313);
    std::fs::write(s.root.join("src"), &data).unwrap();
    std::fs::write(local.join("src"), &data).unwrap();
    drop(data);
    let extra = ["-p", "4", "--chunk-size", &CHUNK.to_string()];
    for down in [true, false] {
        let (from, to, dest, src) = if down {
            let d = local.join("down");
            let to = d.to_str().unwrap().to_string();
            (s.url("src"), to, d, s.root.join("src"))
        } else {
            let from = local.join("src").to_str().unwrap().to_string();
            (from, s.url("up"), s.root.join("up"), local.join("src"))
        };
        let mut c = cp_cmd(&extra)
            .args([&from, &to])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let part = part_of(&dest);
        let t = Instant::now();
        while allocated(&part) < kill_at {
            assert!(c.try_wait().unwrap().is_none(), "the copy ended first");
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the copy never got going"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        if !down {
            s.kill9();
        }
        let _ = c.kill();
        let _ = c.wait();
        let (on_disk, good) = (allocated(&part), vouched(&dest));
        eprintln!(
            "-p 4 {} killed with {on_disk} bytes on disk, {good} journaled: {} lost (bound {bound})",
            if down { "download" } else { "upload" },
            on_disk.saturating_sub(good)
        );
        assert!(
            on_disk.saturating_sub(good) <= bound,
            "{on_disk} bytes on disk, the journal vouches for {good}: more than {bound} lost"
        );
        if !down {
            s.spawn();
        }
        let v = ok(&cp_cmd(&extra)
            .args(["--resume", &from, &to])
            .bounded()
            .unwrap());
        assert_eq!(num(&v, "resumed_bytes"), good, "{v}");
        assert_eq!(
            num(&v, "wire_bytes") + good,
            BIG as u64,
            "only the missing ranges move: {v}"
        );
        same(&src, &dest);
        assert!(!part.exists() && !journal_of(&dest).exists());
    }
    std::fs::remove_dir_all(&local).unwrap();
}

// 20 kill runs in all, spread over the drivers.
#[test]
fn kill_runs_tcp() {
    kill_runs("tcp", 7);
}

#[test]
fn kill_runs_ofi_tcp() {
    kill_runs("ofi+tcp", 7);
}

#[test]
fn kill_runs_ofi_shm() {
    kill_runs("ofi+shm", 6);
}

/// The wedge watchdog end to end, with a simulated stuck provider call (the test hook
/// `FERRY_OFI_TEST_WEDGE_AFTER` of ferry-fabric's `test-hooks` feature): a server whose
/// progress thread never returns from the provider exits 75 saying so, within the wedge
/// timeout, and a client with `--retries` completes against the restarted server; a client
/// that wedges exits 6 saying so, at once, and `--resume` then finishes its copy.
#[test]
fn wedged_processes_exit_and_copies_complete() {
    let hook = [
        ("FERRY_OFI_TEST_WEDGE_AFTER", "0"),
        ("FERRY_OFI_WEDGE_TIMEOUT", "1"),
    ];
    let mut s = Server::start_once_with("ofi+shm", &hook);
    let local = scratch("local");
    let data = pattern(SIZE / 4, 41);
    std::fs::write(s.root.join("w"), &data).unwrap();
    let dest = local.join("w");
    let client = cp_cmd(&["--retries", "30", "--idle-timeout", "3"])
        .args([&s.url("w"), dest.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let v = ok(&finish_serving(client, Some(&mut s)));
    assert_eq!(s.wedge_restarts, 1, "the server did not exit wedged: {v}");
    assert!(num(&v, "retries") >= 1, "{v}");
    same(&s.root.join("w"), &dest);

    let dest = local.join("w2");
    let t = Instant::now();
    let o = cp_cmd(&[&s.url("w"), dest.to_str().unwrap()])
        .envs(hook)
        .bounded()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(client_wedged(&o), "{:?} {err}", o.status.code());
    assert!(err.contains("must restart"), "{err}");
    let out = String::from_utf8_lossy(&o.stdout);
    let line: Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("{e}: stdout {out:?}, stderr {err}"));
    assert_eq!(line["exit_code"], CONNECTION_EXIT, "{line}");
    assert!(line["error"].as_str().unwrap().contains("wedged"), "{line}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert!(!dest.exists());
    ok(&cp_cmd(&["--resume", &s.url("w"), dest.to_str().unwrap()])
        .bounded()
        .unwrap());
    same(&s.root.join("w"), &dest);
    std::fs::remove_dir_all(&local).unwrap();
}

/// Sends the server SIGTERM, checks it exits 0 within the bound, and returns its log.
fn stop_gracefully(s: &mut Server) -> String {
    let server = s.child.take().unwrap();
    let pid = rustix::process::Pid::from_child(&server);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert_eq!(wait_bounded(server).code(), Some(0), "serve after SIGTERM");
    std::fs::read_to_string(&s.log).unwrap()
}

/// SIGTERM during an upload, with no grace: the server exits 0 saying it journaled one
/// transfer, the journal is there, and the client (with --retries) finishes against the
/// restarted server without resending what was journaled. With a grace period, a transfer
/// in flight finishes and the server then exits 0.
fn sigterm(driver: &str) {
    // Twice the kill runs' size: the signal must find the transfer still running.
    const BIG: usize = 2 * SIZE;
    let mut s = Server::start(driver, &["--drain-timeout", "0"]);
    let local = scratch("local");
    let data = pattern(BIG, 77);
    std::fs::write(local.join("src"), &data).unwrap();
    let dest = s.root.join("up");
    let mut client = cp_cmd(&["--retries", "30", "--idle-timeout", "3"])
        .arg(local.join("src"))
        .arg(s.url("up"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for_part(
        &part_of(&dest),
        BIG as u64 / 8,
        &mut client,
        &mut s
    ));
    let log = stop_gracefully(&mut s);
    assert!(log.contains("1 stopped (uploads journaled)"), "{log}");
    assert!(journal_of(&dest).exists() && part_of(&dest).exists());
    assert!(!dest.exists());
    s.spawn();
    let v = ok(&finish(client));
    assert!(
        num(&v, "retries") >= 1 && num(&v, "resumed_bytes") > 0,
        "{v}"
    );
    same(&local.join("src"), &dest);
    // A grace period long enough: the transfer in flight finishes, then the server exits.
    s.kill9();
    s.args = vec!["--drain-timeout".into(), "60".into()];
    s.spawn();
    let dest = s.root.join("graced");
    let mut client = cp_cmd(&[])
        .arg(local.join("src"))
        .arg(s.url("graced"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for_part(
        &part_of(&dest),
        BIG as u64 / 4,
        &mut client,
        &mut s
    ));
    let log = stop_gracefully(&mut s);
    assert!(
        log.contains("1 connection(s) open at the signal, 1 finished"),
        "{log}"
    );
    let v = ok(&finish(client));
    assert_eq!(num(&v, "resumed_bytes"), 0);
    same(&local.join("src"), &dest);
    std::fs::remove_dir_all(&local).unwrap();
}

#[test]
fn sigterm_tcp() {
    sigterm("tcp");
}

/// SIGTERM during a download: with a grace period a parallel download (four streams, each
/// fetching chunk after chunk) finishes, because the server keeps serving the connections
/// that were transferring instead of refusing their next chunk, and the server reports it
/// finished; without a grace period the client hears that the server is shutting down,
/// keeps its journaled part, and (with --retries) finishes against the restarted server
/// without fetching again what it had.
fn sigterm_download(driver: &str) {
    const BIG: usize = 4 * SIZE;
    let mut s = Server::start(driver, &["--drain-timeout", "60"]);
    std::fs::write(s.root.join("src"), pattern(BIG, 78)).unwrap();
    let local = scratch("local-down");
    let download = |s: &Server, name: &str, retries: &str| {
        cp_cmd(&["--retries", retries, "--idle-timeout", "3"])
            .args(["-p", "4", "--chunk-size", "4194304"])
            .arg(s.url("src"))
            .arg(local.join(name))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut client = download(&s, "graced", "0");
    let part = part_of(&local.join("graced"));
    assert!(wait_for_part(&part, BIG as u64 / 8, &mut client, &mut s));
    let log = stop_gracefully(&mut s);
    assert!(log.contains(" finished, 0 stopped"), "{log}");
    let v = ok(&finish(client));
    assert_eq!(num(&v, "bytes"), BIG as u64, "{v}");
    same(&s.root.join("src"), &local.join("graced"));

    s.args = vec!["--drain-timeout".into(), "0".into()];
    s.spawn();
    let mut client = download(&s, "stopped", "30");
    let part = part_of(&local.join("stopped"));
    assert!(wait_for_part(&part, BIG as u64 / 8, &mut client, &mut s));
    let log = stop_gracefully(&mut s);
    assert!(!log.contains(" 0 stopped"), "{log}");
    s.spawn();
    let v = ok(&finish(client));
    assert!(
        num(&v, "retries") >= 1 && num(&v, "resumed_bytes") > 0,
        "{v}"
    );
    same(&s.root.join("src"), &local.join("stopped"));
    std::fs::remove_dir_all(&local).unwrap();
}

/// Ctrl-C on a download: the client exits 130 printing the command that continues it, and
/// that command, run as printed, resumes from the journaled part.
#[test]
fn interrupted_copy_says_how_to_continue() {
    const BIG: usize = 4 * SIZE;
    let mut s = Server::start("tcp", &[]);
    std::fs::write(s.root.join("src"), pattern(BIG, 79)).unwrap();
    let local = scratch("local-int");
    let dest = local.join("copy");
    let mut copy = cp_cmd(&[]);
    copy.arg(s.url("src")).arg(&dest);
    let client = past_first_checkpoint(copy, &dest, &mut s);
    let pid = rustix::process::Pid::from_child(&client);
    rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
    let o = finish(client);
    let said = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{said}");
    let again = said
        .lines()
        .skip_while(|l| !l.contains("To continue:"))
        .nth(1)
        .unwrap_or_else(|| panic!("no command to continue with: {said}"));
    let words: Vec<&str> = again.split_whitespace().collect();
    assert!(words.contains(&"--resume"), "{again}");
    let line = common::json(&o);
    assert_eq!(line["exit_code"], 130, "{line}");
    assert_eq!(line["continue_with"].as_str(), Some(again.trim()), "{line}");
    let mut c = Command::new(words[0]);
    c.args(&words[1..]).env_remove("FERRY_TOKEN");
    // The printed command, run as the user would, but against this test's known hosts.
    common::isolate(&mut c);
    let v = ok(&finish(
        c.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    assert!(num(&v, "resumed_bytes") > 0, "{v}");
    same(&s.root.join("src"), &dest);
    std::fs::remove_dir_all(&local).unwrap();
}

/// The same command run again resumes by itself: the journal proves the verified part (no
/// `--resume` needed), and `--no-resume` starts over.
#[test]
fn the_same_command_again_resumes() {
    const BIG: usize = 4 * SIZE;
    let mut s = Server::start("tcp", &[]);
    std::fs::write(s.root.join("src"), pattern(BIG, 81)).unwrap();
    let local = scratch("local-again");
    let dest = local.join("copy");
    let url = s.url("src");
    let run = || {
        let mut c = cp_cmd(&[]);
        c.arg(&url).arg(&dest);
        c
    };
    for (extra, resumed) in [(None, true), (Some("--no-resume"), false)] {
        let mut client = past_first_checkpoint(run(), &dest, &mut s);
        let _ = client.kill();
        let _ = client.wait();
        let mut again = run();
        again.args(extra);
        let v = ok(&again.bounded().unwrap());
        assert_eq!(num(&v, "resumed_bytes") > 0, resumed, "{extra:?}: {v}");
        same(&s.root.join("src"), &dest);
        std::fs::remove_file(&dest).unwrap();
    }
    std::fs::remove_dir_all(&local).unwrap();
}

#[test]
fn sigterm_download_tcp() {
    sigterm_download("tcp");
}

#[test]
fn sigterm_ofi_shm() {
    sigterm("ofi+shm");
}

/// A server stopped (SIGSTOP) for longer than both the peer timeout and the wedge timeout,
/// then continued: on ofi+shm its clients must wait for it, not declare it dead (its process
/// is there, stopped) or their provider wedged; a download and an upload in flight both
/// finish without reconnecting. (The server itself, stopped, must not blame its clients for
/// the silence either.)
#[test]
fn stopped_server_is_not_dead_ofi_shm() {
    // Short limits, so a short stop outlasts them.
    let limits = [
        ("FERRY_OFI_PEER_TIMEOUT", "1"),
        ("FERRY_OFI_WEDGE_TIMEOUT", "1.5"),
    ];
    let mut s = Server::start_once_with("ofi+shm", &limits);
    let local = scratch("local");
    // Four times the other tests' file: at ofi+shm's rate a 48 MiB upload could finish
    // between two looks at its part file when the test threads ran late on a busy host,
    // and then nothing was in flight at the stop.
    let size = 4 * SIZE;
    let data = pattern(size, 23);
    std::fs::write(s.root.join("f"), &data).unwrap();
    std::fs::write(local.join("f"), &data).unwrap();
    let down = local.join("down");
    let spawn = |from: &str, to: &str| {
        cp_cmd(&[from, to])
            .envs(limits)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut get = spawn(&s.url("f"), down.to_str().unwrap());
    let mut put = spawn(local.join("f").to_str().unwrap(), &s.url("up"));
    for (part, copier, what) in [
        (part_of(&down), &mut get, "download"),
        (part_of(&s.root.join("up")), &mut put, "upload"),
    ] {
        assert!(
            wait_for_part(&part, size as u64 / 8, copier, &mut s),
            "the {what} ended before the server was stopped: {:?}",
            copier.try_wait()
        );
    }
    let pid = rustix::process::Pid::from_child(s.child.as_ref().unwrap());
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
    let resumed = Instant::now();
    for (c, what) in [(get, "download"), (put, "upload")] {
        let o = finish(c);
        assert!(
            o.status.success(),
            "{what} failed across a 3 s SIGSTOP of the server: {:?} {}\nserver log:\n{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr),
            std::fs::read_to_string(&s.log).unwrap_or_default()
        );
        let v = ok(&o);
        eprintln!("{what} done {:?} after SIGCONT", resumed.elapsed());
        assert_eq!(num(&v, "retries"), 0, "{what}: {v}");
    }
    same(&s.root.join("f"), &down);
    same(&local.join("f"), &s.root.join("up"));
    assert!(
        s.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "the server exited: {}",
        std::fs::read_to_string(&s.log).unwrap_or_default()
    );
    std::fs::remove_dir_all(&local).unwrap();
}

/// A copy interrupted, then the source replaced (other bytes, other mtime): --resume
/// starts over and lands exactly the new source, never a mix; down and up.
#[test]
fn changed_source_restarts() {
    let mut s = Server::start("tcp", &[]);
    let local = scratch("local");
    let set_mtime = |p: &Path, secs: u64| {
        let f = std::fs::File::options().write(true).open(p).unwrap();
        f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(secs))
            .unwrap();
    };
    for down in [true, false] {
        let (src, dest) = if down {
            (s.root.join("c"), local.join("c"))
        } else {
            (local.join("cu"), s.root.join("cu"))
        };
        std::fs::write(&src, pattern(SIZE, 1)).unwrap();
        set_mtime(&src, 1_600_000_000);
        let (from, to) = if down {
            (s.url("c"), dest.to_str().unwrap().to_string())
        } else {
            (src.to_str().unwrap().to_string(), s.url("cu"))
        };
        let mut c = cp_cmd(&[&from, &to])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        assert!(wait_for_part(
            &part_of(&dest),
            SIZE as u64 / 2,
            &mut c,
            &mut s
        ));
        let _ = c.kill();
        let _ = c.wait();
        assert!(journal_of(&dest).exists());
        // Same size, other bytes, other mtime.
        std::fs::write(&src, pattern(SIZE, if down { 2 } else { 3 })).unwrap();
        set_mtime(&src, 1_600_000_100);
        std::thread::sleep(Duration::from_millis(50));
        let mut cmd = cp_cmd(&["--resume", &from, &to]);
        cmd.env("RUST_LOG", "info");
        let o = cmd.bounded().unwrap();
        let v = ok(&o);
        assert_eq!(num(&v, "resumed_bytes"), 0, "{v}");
        assert_eq!(num(&v, "wire_bytes"), SIZE as u64, "{v}");
        if down {
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains("starting over"), "{err}");
        }
        same(&src, &dest);
    }
    no_leftovers(&local);
    std::fs::remove_dir_all(&local).unwrap();
}

/// Forwards TCP connections to `to`; the first one is cut after `cut` bytes from the
/// server, later ones pass whole. Returns the proxy's address.
fn cutting_proxy(to: String, cut: usize) -> String {
    proxy(to, Cut::FromServer(cut)).0
}

/// Which connection a [`proxy`] cuts: the first one, after `n` bytes from the server; or
/// the one carrying the client's bytes when `n` of them (over all connections) have crossed.
#[derive(Clone, Copy)]
enum Cut {
    FromServer(usize),
    FromClient(u64),
}

/// Forwards TCP connections to `to`, cutting one as `cut` says (the others pass whole).
/// Returns the proxy's address and a count of the bytes it forwarded from clients to the
/// server (what crossed, over every connection).
fn proxy(to: String, cut: Cut) -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::sync::Arc;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let upstream = Arc::new(AtomicU64::new(0));
    let counted = upstream.clone();
    let cut_once = Arc::new(AtomicBool::new(false));
    std::thread::spawn(move || {
        for (n, inc) in l.incoming().enumerate() {
            let Ok(a) = inc else { return };
            let Ok(b) = std::net::TcpStream::connect(&to) else {
                return;
            };
            let down_limit = match cut {
                Cut::FromServer(c) if n == 0 => c,
                _ => usize::MAX,
            };
            let up_cut = match cut {
                Cut::FromClient(c) => c,
                Cut::FromServer(_) => u64::MAX,
            };
            let (counted, cut_once) = (counted.clone(), cut_once.clone());
            let (mut r, mut w) = (a.try_clone().unwrap(), b.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(k) = r.read(&mut buf) {
                    if k == 0 || w.write_all(&buf[..k]).is_err() {
                        break;
                    }
                    let total = counted.fetch_add(k as u64, Ordering::Relaxed) + k as u64;
                    if total >= up_cut && !cut_once.swap(true, Ordering::SeqCst) {
                        break;
                    }
                }
                let _ = r.shutdown(std::net::Shutdown::Both);
                let _ = w.shutdown(std::net::Shutdown::Both);
            });
            let (mut r, mut w) = (b, a);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                let mut moved = 0usize;
                while let Ok(k) = r.read(&mut buf) {
                    if k == 0 || w.write_all(&buf[..k]).is_err() {
                        break;
                    }
                    moved += k;
                    if moved >= down_limit {
                        break;
                    }
                }
                let _ = r.shutdown(std::net::Shutdown::Both);
                let _ = w.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    (addr, upstream)
}

/// An upload whose connection breaks part way (tcp, through a proxy that cuts what the
/// client sends), finished by `--retries`: `wire_bytes` counts what was sent, so it is at
/// most what crossed the proxy to the server (plus what the cut left in the sockets and the
/// staging ring), not the file counted again for every attempt; one stream and four.
#[test]
fn retried_upload_counts_what_was_sent() {
    let s = Server::start("tcp", &[]);
    let local = scratch("local");
    std::fs::write(local.join("f"), pattern(SIZE, 8)).unwrap();
    let hostport = s.addr.trim_start_matches("tcp://").to_string();
    // The bytes a cut connection may have taken from the client without passing them on:
    // the staging ring (8 blocks) and loopback socket buffers.
    let slack = 12u64 << 20;
    for (i, streams) in ["1", "4"].into_iter().enumerate() {
        let (proxy, crossed) = proxy(hostport.clone(), Cut::FromClient(SIZE as u64 / 8));
        let to = format!("tcp://{proxy}/d/up{i}");
        let v = ok(
            &cp_cmd(&["--retries", "5", "-p", streams, "--chunk-size", "8388608"])
                .arg(local.join("f"))
                .arg(&to)
                .bounded()
                .unwrap(),
        );
        let (wire, crossed) = (num(&v, "wire_bytes"), crossed.load(Ordering::Relaxed));
        eprintln!("-p {streams}: wire_bytes {wire}, {crossed} bytes crossed to the server: {v}");
        assert!(num(&v, "retries") >= 1, "{v}");
        assert!(
            wire <= crossed + slack,
            "-p {streams}: wire_bytes {wire} but only {crossed} bytes crossed: {v}"
        );
        assert!(
            wire + num(&v, "resumed_bytes") >= SIZE as u64,
            "-p {streams}: {v}"
        );
        same(&local.join("f"), &s.root.join(format!("up{i}")));
    }
    std::fs::remove_dir_all(&local).unwrap();
}

/// A connection dropped mid-download (tcp, through a proxy that cuts it): --retries
/// reconnects and resumes on its own.
#[test]
fn dropped_connection_retries() {
    let s = Server::start("tcp", &[]);
    let local = scratch("local");
    std::fs::write(s.root.join("f"), pattern(SIZE, 5)).unwrap();
    let hostport = s.addr.trim_start_matches("tcp://").to_string();
    let proxy = cutting_proxy(hostport, SIZE / 2);
    let from = format!("tcp://{proxy}/d/f");
    let o = cp_cmd(&["--retries", "5", &from, local.to_str().unwrap()])
        .bounded()
        .unwrap();
    let v = ok(&o);
    assert!(num(&v, "retries") >= 1, "{v}");
    assert!(num(&v, "resumed_bytes") > 0, "{v}");
    same(&s.root.join("f"), &local.join("f"));
    // Without --retries the same cut is a connection failure (exit 6), leaving a
    // journaled part that --resume then continues.
    let proxy = cutting_proxy(s.addr.trim_start_matches("tcp://").to_string(), SIZE / 2);
    let from = format!("tcp://{proxy}/d/f");
    let dest = local.join("g");
    let o = cp_cmd(&[&from, dest.to_str().unwrap()]).bounded().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(6), "{err}");
    assert!(journal_of(&dest).exists() && !dest.exists(), "{err}");
    let v = ok(&cp_cmd(&["--resume", &s.url("f"), dest.to_str().unwrap()])
        .bounded()
        .unwrap());
    assert!(
        num(&v, "resumed_bytes") > 0 && num(&v, "wire_bytes") < SIZE as u64,
        "{v}"
    );
    same(&s.root.join("f"), &dest);
    std::fs::remove_dir_all(&local).unwrap();
}

/// A tree download killed part way: --resume skips the files already there (same size and
/// mtime), continues the partial one, and the tree ends identical; the same up.
#[test]
fn tree_resume() {
    let mut s = Server::start("tcp", &[]);
    let local = scratch("local");
    let src = s.root.join("t");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    for i in 0..20 {
        std::fs::write(
            src.join(format!("small{i:02}")),
            pattern(1000 + i, i as u64),
        )
        .unwrap();
    }
    std::fs::write(src.join("sub/zbig"), pattern(SIZE, 9)).unwrap();
    let dest = local.join("t");
    let mut c = cp_cmd(&["-r", &s.url("t"), local.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for_part(
        &part_of(&dest.join("sub/zbig")),
        SIZE as u64 / 2,
        &mut c,
        &mut s
    ));
    let _ = c.kill();
    let _ = c.wait();
    let v = ok(
        &cp_cmd(&["-r", "--resume", &s.url("t"), local.to_str().unwrap()])
            .bounded()
            .unwrap(),
    );
    assert_eq!(num(&v, "files"), 21, "{v}");
    assert!(num(&v, "files_skipped") >= 1, "{v}");
    assert!(num(&v, "resumed_bytes") > 0, "{v}");
    for i in 0..20 {
        let n = format!("small{i:02}");
        same(&src.join(&n), &dest.join(&n));
    }
    same(&src.join("sub/zbig"), &dest.join("sub/zbig"));
    no_leftovers(&dest.join("sub"));
    // Up: everything is already there after a first full upload; a resume skips it all.
    ok(&cp_cmd(&["-r", dest.to_str().unwrap(), &s.url("back")])
        .bounded()
        .unwrap());
    let v = ok(
        &cp_cmd(&["-r", "--resume", dest.to_str().unwrap(), &s.url("back")])
            .bounded()
            .unwrap(),
    );
    assert_eq!(
        (num(&v, "files_skipped"), num(&v, "wire_bytes")),
        (21, 0),
        "{v}"
    );
    std::fs::remove_dir_all(&local).unwrap();
}

/// A tree of small files going up as PUT_FILEs (protocol 1.4, several unanswered at once),
/// the client killed part way: every file under its final name at the server is whole, and
/// `--resume` finishes the tree identical with nothing left over.
#[test]
fn small_files_upload_killed_then_resumed() {
    let s = Server::start("tcp", &[]);
    let local = scratch("local");
    let src = local.join("t");
    std::fs::create_dir_all(&src).unwrap();
    let n = 1000;
    for i in 0..n {
        std::fs::write(src.join(format!("f{i:04}")), pattern(20_000, i as u64)).unwrap();
    }
    // The tree lands in up/t, the first time (up created) and the second alike.
    let dest = s.root.join("up/t");
    let mut c = cp_cmd(&["-r", src.to_str().unwrap(), &s.url("up")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let landed = |d: &Path| {
        std::fs::read_dir(d).map_or(0, |r| {
            r.filter_map(|e| e.ok())
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .count()
        })
    };
    let t = Instant::now();
    while landed(&dest) < n / 10
        && c.try_wait().unwrap().is_none()
        && t.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = c.kill();
    let _ = c.wait();
    let before = landed(&dest);
    assert!(before >= n / 10, "only {before} files landed");
    for e in std::fs::read_dir(&dest).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') {
            same(&src.join(&name), &dest.join(&name));
        }
    }
    let v = ok(
        &cp_cmd(&["-r", "--resume", src.to_str().unwrap(), &s.url("up")])
            .bounded()
            .unwrap(),
    );
    assert_eq!(num(&v, "files"), n as u64, "{v}");
    assert!(num(&v, "files_skipped") >= before as u64 - 1, "{v}");
    for i in 0..n {
        let f = format!("f{i:04}");
        same(&src.join(&f), &dest.join(&f));
    }
    no_leftovers(&dest);
    std::fs::remove_dir_all(&local).unwrap();
}
