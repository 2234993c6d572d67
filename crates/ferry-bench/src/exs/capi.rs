//! The paired ping-pong rows of `bench exs`: the normal-mode ping-pong through libferry's C
//! API, run by the C conformance suite's `tests/c/latency.c`, and its Rust twin
//! (`ferry bench exs-pingpong`, see [`super::pingpong`]), each a server and a client process
//! started afresh, with the same arguments, launched and read the same way.
//!
//! The C program is built at run time from this checkout, as a user would: libferry.so by
//! cargo in the profile and target directory of the running `ferry` (a no-op when it is up to
//! date, and never a stale library), then the program by `cc` against it and `exs.h`.
//! Without a checkout, cargo or a C compiler the C rows are reported missing with the reason;
//! the Rust twin and the rest of the bench run.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ferry_fabric::Address;

use super::pingpong::Opts;
use crate::cpu;

/// Longest a server may take to publish its address.
const LISTEN: Duration = Duration::from_secs(20);
/// Longest one ping-pong run (blocking and polling phases) may take.
const RUN: Duration = Duration::from_secs(120);

/// Which program a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// `ferry bench exs-pingpong`, through the Rust runtime.
    Rust,
    /// `tests/c/latency.c`, through libferry.
    C,
}

/// What one run measured: the client's median one-way latencies and the CPU of both sides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PingPong {
    /// Median one-way latency with blocking dequeues, µs.
    pub block_us: f64,
    /// Median one-way latency with zero-timeout dequeues in a loop, µs.
    pub poll_us: f64,
    /// CPU seconds of the server (the answering side).
    pub send_cpu: f64,
    /// CPU seconds of the client (the timing side).
    pub recv_cpu: f64,
}

/// The built C ping-pong, in a temporary directory removed on drop.
pub struct CPingPong {
    dir: PathBuf,
    exe: PathBuf,
}

/// The two ping-pong programs; the C one may be missing (with the reason).
pub struct Programs {
    c: Result<CPingPong, String>,
    dir: PathBuf,
    runs: usize,
}

impl Programs {
    /// Builds the C program (or keeps why not) beside the Rust one, which is this binary.
    pub fn build() -> Programs {
        let c = CPingPong::build().map_err(|e| format!("C-API row not built: {e:#}"));
        if let Err(why) = &c {
            tracing::warn!("{why}");
        }
        let dir = std::env::temp_dir().join(format!("ferry-bench-pp-{}", std::process::id()));
        Programs { c, dir, runs: 0 }
    }

    /// Why the C program is missing, if it is.
    pub fn c_missing(&self) -> Option<&str> {
        self.c.as_ref().err().map(String::as_str)
    }

    /// One run of `lang`'s program on the driver listening at `listen`: a server and a client
    /// process, `o` on both sides; the client's medians.
    pub fn run(&mut self, lang: Lang, listen: &Address, o: Opts) -> Result<PingPong> {
        let program = |role: &str| -> Result<Command> {
            match lang {
                Lang::C => {
                    let c = self.c.as_ref().map_err(|why| anyhow::anyhow!("{why}"))?;
                    let mut cmd = Command::new(&c.exe);
                    cmd.arg(role);
                    Ok(cmd)
                }
                Lang::Rust => {
                    let exe = std::env::current_exe().context("locating the ferry binary")?;
                    let mut cmd = Command::new(exe);
                    cmd.args(["bench", "exs-pingpong", role]);
                    Ok(cmd)
                }
            }
        };
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        self.runs += 1;
        let addr_file = self.dir.join(format!("addr-{}", self.runs));
        let tail = o.args();
        let c0 = cpu::children_usage();
        let mut server = Proc::spawn(
            program("server")?
                .arg(listen.to_string())
                .arg(&addr_file)
                .args(&tail),
        )?;
        let addr = server.published(&addr_file)?;
        let mut client = Proc::spawn(program("client")?.arg(&addr).args(&tail))?;
        let (status, out, err) = client.finish(RUN)?;
        let c1 = cpu::children_usage();
        ensure!(status.success(), "{lang:?} client {status}: {}", err.trim());
        let (status, _, err) = server.finish(LISTEN)?;
        let c2 = cpu::children_usage();
        ensure!(status.success(), "{lang:?} server {status}: {}", err.trim());
        let (block_us, poll_us) = medians(&out)?;
        Ok(PingPong {
            block_us,
            poll_us,
            send_cpu: c2.secs_since(c1),
            recv_cpu: c1.secs_since(c0),
        })
    }
}

impl Drop for Programs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl CPingPong {
    /// Builds libferry.so and `tests/c/latency.c` against it.
    pub fn build() -> Result<CPingPong> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let src = root.join("tests/c/latency.c");
        let include = root.join("crates/ferry-capi/include");
        ensure!(
            src.is_file() && include.join("ferry/exs.h").is_file(),
            "no ferry checkout at {} (the C row builds tests/c/latency.c there)",
            root.display()
        );
        let lib = build_libferry(&root)?;
        let dir = std::env::temp_dir().join(format!("ferry-bench-capi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let pp = CPingPong {
            exe: dir.join("latency"),
            dir,
        };
        // The library under its SONAME (libferry.so.0, what the program loads) and the
        // link name, as `make install` lays them out; a copy, so a rebuild during the run
        // does not change it.
        let so = pp.dir.join("libferry.so.0");
        std::fs::copy(&lib, &so).with_context(|| format!("copying {}", lib.display()))?;
        let link = pp.dir.join("libferry.so");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("libferry.so.0", &link).context("linking libferry.so")?;
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&cc)
            .args(["-std=c99", "-O2", "-I"])
            .arg(&include)
            .arg("-o")
            .arg(&pp.exe)
            .arg(&src)
            .arg("-L")
            .arg(&pp.dir)
            .arg("-lferry")
            .arg(format!("-Wl,-rpath,{}", pp.dir.display()))
            .output()
            .with_context(|| format!("running the C compiler {cc:?}"))?;
        ensure!(
            out.status.success(),
            "{cc} tests/c/latency.c failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(pp)
    }
}

impl Drop for CPingPong {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// libferry.so built by cargo in the running binary's profile and target directory (the
/// C row then runs the same optimisation as the Rust rows it is compared with).
fn build_libferry(root: &Path) -> Result<PathBuf> {
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let exe = std::env::current_exe().context("locating the ferry binary")?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(root)
        .args(["build", "--quiet", "-p", "ferry-capi", "--lib"]);
    if profile == "release" {
        cmd.arg("--release");
    }
    let exe_dir = exe.parent().context("the ferry binary has no directory")?;
    let target = match exe_dir.file_name() {
        Some(p) if p == profile => exe_dir.parent().map(Path::to_path_buf),
        _ => None,
    };
    let target = target.unwrap_or_else(|| match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t),
        None => root.join("target"),
    });
    cmd.arg("--target-dir").arg(&target);
    let out = cmd
        .output()
        .with_context(|| format!("running {cargo} to build libferry.so"))?;
    ensure!(
        out.status.success(),
        "{cargo} build -p ferry-capi failed: {}",
        last_lines(&out.stderr)
    );
    let lib = target.join(profile).join("libferry.so");
    ensure!(lib.is_file(), "{} missing after the build", lib.display());
    Ok(lib)
}

/// The last lines of a tool's error output (where cargo and cc put the error itself),
/// joined on one line for the row's `error`.
fn last_lines(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines[lines.len().saturating_sub(3)..].join(" / ")
}

/// The blocking and polling medians from the client's line
/// `... blocking 41.23 us, polling 39.87 us` (both programs print it).
fn medians(out: &str) -> Result<(f64, f64)> {
    let line = out.lines().find(|l| l.contains("one-way latency"));
    let after = |word: &str| {
        line.and_then(|l| l.split_once(word))
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v > 0.0)
    };
    match (after("blocking "), after("polling ")) {
        (Some(b), Some(p)) => Ok((b, p)),
        _ => bail!("no blocking and polling latency in the client's output {out:?}"),
    }
}

/// A ping-pong process, killed and reaped if dropped while it runs.
struct Proc(Child);

impl Proc {
    fn spawn(cmd: &mut Command) -> Result<Proc> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting a ping-pong program")?;
        Ok(Proc(child))
    }

    /// The address the server writes to `file` (it renames it into place whole).
    fn published(&mut self, file: &Path) -> Result<String> {
        let deadline = Instant::now() + LISTEN;
        loop {
            if let Ok(s) = std::fs::read_to_string(file) {
                if !s.trim().is_empty() {
                    return Ok(s.trim().to_string());
                }
            }
            if let Some(st) = self.0.try_wait()? {
                let (_, err) = self.output();
                bail!("server {st} before listening: {}", err.trim());
            }
            ensure!(
                Instant::now() < deadline,
                "server not listening after {LISTEN:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits at most `limit` for the exit; its status, stdout and stderr (a few lines, so
    /// the pipes cannot fill while it runs).
    fn finish(&mut self, limit: Duration) -> Result<(ExitStatus, String, String)> {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(st) = self.0.try_wait()? {
                break st;
            }
            ensure!(
                Instant::now() < deadline,
                "ping-pong still running after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(2));
        };
        let (out, err) = self.output();
        Ok((status, out, err))
    }

    fn output(&mut self) -> (String, String) {
        let read = |r: Option<&mut dyn Read>| {
            let mut s = String::new();
            if let Some(r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        };
        let out = read(self.0.stdout.as_mut().map(|r| r as &mut dyn Read));
        let err = read(self.0.stderr.as_mut().map(|r| r as &mut dyn Read));
        (out, err)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_line_gives_both_medians() {
        let line = "latency client: one-way latency, 10 B, median of 1000: blocking 41.23 us, \
                    polling 39.87 us\n";
        assert_eq!(medians(line).unwrap(), (41.23, 39.87));
        assert!(medians("").is_err());
        assert!(medians("one-way latency: blocking nan us, polling 3 us").is_err());
        assert!(medians("one-way latency: blocking 3 us").is_err());
    }

    #[test]
    fn tool_errors_keep_their_last_lines() {
        assert_eq!(last_lines(b"a\n\nb\n  c\nd\n"), "b / c / d");
        assert_eq!(last_lines(b""), "");
    }
}
