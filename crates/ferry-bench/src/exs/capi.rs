//! The C-API row of `bench exs`: the normal-mode ping-pong through libferry's C API, run by
//! the C conformance suite's `tests/c/latency.c` (a server and a client process, both C).
//!
//! It is built at run time from this checkout, as a user would: libferry.so by cargo in
//! the profile and target directory of the running `ferry` (a no-op when it is up to date,
//! and never a stale library), then the program by `cc` against it and `exs.h`. Without a
//! checkout, cargo or a C compiler the row is reported missing with the reason; the rest of
//! the bench runs.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ferry_fabric::Address;

use super::client::Measured;
use crate::cpu;

/// Longest the C server may take to publish its address.
const LISTEN: Duration = Duration::from_secs(20);
/// Longest one C ping-pong run (blocking then polling rounds) may take.
const RUN: Duration = Duration::from_secs(120);

/// The built C ping-pong, in a temporary directory removed on drop.
pub struct CPingPong {
    dir: PathBuf,
    exe: PathBuf,
    runs: usize,
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
            runs: 0,
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

    /// One run on the driver listening at `listen`: `warm` unrecorded then `rounds`
    /// recorded round trips of `size` bytes in normal mode (small packets off), blocking
    /// dequeues on both sides; the median one-way latency (half the round trip) the client
    /// reports. The client is the receiving side for CPU, the server the sending side.
    pub fn run(
        &mut self,
        listen: &Address,
        size: usize,
        warm: usize,
        rounds: usize,
    ) -> Result<Measured> {
        ensure!(
            size == 10,
            "tests/c/latency.c sends 10-byte messages, not {size}"
        );
        self.runs += 1;
        let addr_file = self.dir.join(format!("addr-{}", self.runs));
        let tail = [rounds.to_string(), warm.to_string(), "0".into()];
        let c0 = cpu::children_usage();
        let mut server = Proc::spawn(
            Command::new(&self.exe)
                .arg("server")
                .arg(listen.to_string())
                .arg(&addr_file)
                .args(&tail),
        )?;
        let addr = server.published(&addr_file)?;
        let mut client = Proc::spawn(Command::new(&self.exe).arg("client").arg(&addr).args(&tail))?;
        let (status, out, err) = client.finish(RUN)?;
        let c1 = cpu::children_usage();
        ensure!(status.success(), "C client {status}: {}", err.trim());
        let (status, _, err) = server.finish(LISTEN)?;
        let c2 = cpu::children_usage();
        ensure!(status.success(), "C server {status}: {}", err.trim());
        Ok(Measured {
            value: blocking_us(&out)?,
            bytes: 0,
            send_cpu: c2.secs_since(c1),
            recv_cpu: c1.secs_since(c0),
        })
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

/// The blocking median from the client's line `... blocking 41.23 us, polling 39.87 us`.
fn blocking_us(out: &str) -> Result<f64> {
    let line = out.lines().find(|l| l.contains("one-way latency"));
    let v = line
        .and_then(|l| l.split_once("blocking "))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0);
    v.with_context(|| format!("no blocking latency in the C client's output {out:?}"))
}

/// A C process, killed and reaped if dropped while it runs.
struct Proc(Child);

impl Proc {
    fn spawn(cmd: &mut Command) -> Result<Proc> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting the C ping-pong")?;
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
                bail!("C server {st} before listening: {}", err.trim());
            }
            ensure!(
                Instant::now() < deadline,
                "C server not listening after {LISTEN:?}"
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
                "C ping-pong still running after {limit:?}"
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
    fn the_client_line_gives_the_blocking_median() {
        let line = "latency client: one-way latency, 10 B, median of 1000: blocking 41.23 us, \
                    polling 39.87 us\n";
        assert_eq!(blocking_us(line).unwrap(), 41.23);
        assert!(blocking_us("").is_err());
        assert!(blocking_us("one-way latency: blocking nan us").is_err());
    }

    #[test]
    fn tool_errors_keep_their_last_lines() {
        assert_eq!(last_lines(b"a\n\nb\n  c\nd\n"), "b / c / d");
        assert_eq!(last_lines(b""), "");
    }
}
