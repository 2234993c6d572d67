//! The MPI side of `bench cio`: the seed program (c/mpiio/tests/seed.c, compiled with
//! mpicc for the run), the interposer libferry-mpiio.so, the `mpirun` line of each
//! configuration, and the seed's `times` lines parsed.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::cp::tools::installed;

/// The seed program's source, compiled by [`build_seed`].
const SEED_C: &str = include_str!("../../../../c/mpiio/tests/seed.c");

/// The longest one `mpirun` may take before it is killed (a hung configuration must not
/// stall the run).
const MPIRUN_LIMIT: Duration = Duration::from_secs(600);

/// How the ranks reach the file.
#[derive(Debug, Clone, PartialEq)]
pub enum Io {
    /// Open MPI's own MPI-IO on a local path: MCA settings and MPI_Info hints.
    Local {
        /// `--mca NAME VALUE` pairs.
        mca: &'static [(&'static str, &'static str)],
        /// KEY=VALUE hints given to MPI_File_open.
        hints: &'static [&'static str],
    },
    /// The interposer against a ferry server; extra hints (ferry_mode=independent).
    Ferry {
        /// KEY=VALUE hints given to MPI_File_open.
        hints: &'static [&'static str],
    },
}

/// Compiles the seed program into `dir`; returns its path.
pub fn build_seed(dir: &Path) -> Result<PathBuf> {
    if !installed("mpicc") || !installed("mpirun") {
        bail!("mpicc/mpirun not installed (apt-get install openmpi-bin libopenmpi-dev)");
    }
    let src = dir.join("seed.c");
    std::fs::write(&src, SEED_C).context("writing seed.c")?;
    let exe = dir.join("seed");
    let out = Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .context("running mpicc")?;
    if !out.status.success() {
        bail!(
            "mpicc seed.c failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(exe)
}

/// The interposer: `given`, else libferry-mpiio.so next to the running ferry binary
/// (where `make build-mpiio` puts it beside target/release/ferry).
pub fn interposer(given: Option<&Path>) -> Result<PathBuf> {
    let lib = match given {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .context("locating the ferry binary")?
            .with_file_name("libferry-mpiio.so"),
    };
    match lib.is_file() {
        true => Ok(lib),
        false => bail!(
            "{} not found (run `make build-mpiio`, or give --mpiio-lib)",
            lib.display()
        ),
    }
}

/// One seed run: `np` ranks, `count` ints, the timed `phase` (`w` or `r`) repeated
/// `iters` times within `budget_s` seconds.
pub struct SeedRun<'a> {
    pub seed: &'a Path,
    pub np: u32,
    pub count: u64,
    pub phase: &'a str,
    pub iters: usize,
    pub budget_s: f64,
    pub io: &'a Io,
    /// The file: a local path or a ferry URL.
    pub file: &'a str,
    /// The interposer and the environment its ranks get (token, state directories).
    pub ferry_env: &'a [(String, String)],
    pub lib: Option<&'a Path>,
}

/// What the timed phase measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Times {
    /// Each call's time (slowest rank), ms.
    pub ms: Vec<f64>,
    /// CPU of all ranks over the timed calls, s.
    pub cpu_s: f64,
}

impl SeedRun<'_> {
    /// The `mpirun` command line.
    fn command(&self) -> Result<Command> {
        let mut c = Command::new("mpirun");
        // /proc/self belongs to the effective user.
        if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
            c.arg("--allow-run-as-root");
        }
        c.args(["--oversubscribe", "-np", &self.np.to_string()])
            // Open MPI's shared-memory transport cannot use CMA/XPMEM in most containers.
            .args(["--mca", "btl_vader_single_copy_mechanism", "none"]);
        let hints = match self.io {
            Io::Local { mca, hints } => {
                for (k, v) in *mca {
                    c.args(["--mca", k, v]);
                }
                hints
            }
            Io::Ferry { hints } => {
                let lib = self.lib.context("no interposer")?;
                c.arg("-x").arg(format!("LD_PRELOAD={}", lib.display()));
                for (k, v) in self.ferry_env {
                    c.env(k, v).args(["-x", k]);
                }
                hints
            }
        };
        c.arg(self.seed).arg(self.file).arg(self.count.to_string());
        c.args([self.iters.to_string(), self.phase.to_string()])
            .arg(format!("seed_budget_s={}", self.budget_s))
            .args(hints.iter());
        Ok(c)
    }

    /// Runs it; the times of the timed phase.
    pub fn run(&self) -> Result<Times> {
        let out = run_limited(self.command()?)?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !stdout.contains("seed: ok") {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().rev().find(|l| !l.trim().is_empty());
            bail!(
                "mpirun failed ({}): {}",
                out.status,
                last.unwrap_or("no output").trim()
            );
        }
        let want = if self.phase == "w" { "write" } else { "read" };
        stdout
            .lines()
            .find_map(|l| parse_times(l, want))
            .with_context(|| format!("no {want} times in the seed's output: {stdout}"))
    }
}

/// Runs `c` to its end, or kills it after [`MPIRUN_LIMIT`] (mpirun takes its ranks down
/// with it).
fn run_limited(mut c: Command) -> Result<Output> {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting mpirun")?;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(child.stdout.take().map(|o| Box::new(o) as _));
    let err = drain(child.stderr.take().map(|e| Box::new(e) as _));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().context("waiting for mpirun")? {
            break st;
        }
        if start.elapsed() > MPIRUN_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            bail!("mpirun took over {MPIRUN_LIMIT:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok(Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// The times of `phase` from one line of the seed's output:
/// `seed: times phase=write iters=N ms=T1,T2,... cpu_s=C`.
pub fn parse_times(line: &str, phase: &str) -> Option<Times> {
    let rest = line.strip_prefix("seed: times ")?;
    let mut ms = None;
    let mut cpu_s = None;
    let mut found = false;
    for field in rest.split_whitespace() {
        let (k, v) = field.split_once('=')?;
        match k {
            "phase" => found = v == phase,
            "ms" => ms = v.split(',').map(|t| t.parse().ok()).collect(),
            "cpu_s" => cpu_s = v.parse().ok(),
            _ => {}
        }
    }
    let ms: Vec<f64> = ms?;
    (found && !ms.is_empty()).then_some(Times { ms, cpu_s: cpu_s? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_lines_parse() {
        let l = "seed: times phase=write iters=3 ms=2.5,1.0,1.5 cpu_s=0.0120";
        assert_eq!(
            parse_times(l, "write"),
            Some(Times {
                ms: vec![2.5, 1.0, 1.5],
                cpu_s: 0.012
            })
        );
        assert_eq!(parse_times(l, "read"), None);
        assert_eq!(parse_times("seed: ok, 2 ranks", "write"), None);
        assert_eq!(
            parse_times("seed: times phase=read ms=x cpu_s=1", "read"),
            None
        );
    }
}
