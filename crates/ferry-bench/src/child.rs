//! A bench peer process: this binary re-run with a hidden subcommand, its stdout read line by
//! line with timeouts, its stdin a command channel whose closing tells it to exit.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A running peer; dropping it closes its stdin (it exits) and reaps it, killing if needed.
pub struct PeerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<std::io::Result<String>>,
}

impl PeerProcess {
    /// Starts `ferry bench <args>` with piped stdin and stdout (stderr inherited).
    pub fn spawn(args: &[&str]) -> Result<PeerProcess> {
        let exe = std::env::current_exe().context("locating the ferry binary")?;
        let mut child = Command::new(exe)
            .arg("bench")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning the bench peer")?;
        let stdin = child.stdin.take();
        let out = child.stdout.take().context("peer stdout not captured")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(PeerProcess {
            child,
            stdin,
            lines,
        })
    }

    /// The next stdout line (without its newline), waiting at most `timeout`.
    pub fn line(&mut self, timeout: Duration) -> Result<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(Ok(line)) => Ok(line),
            Ok(Err(e)) => Err(e).context("reading the peer's output"),
            Err(RecvTimeoutError::Disconnected) => bail!("the peer exited"),
            Err(RecvTimeoutError::Timeout) => bail!("the peer said nothing for {timeout:?}"),
        }
    }

    /// Writes one command line to the peer's stdin.
    pub fn send(&mut self, cmd: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("peer stdin closed")?;
        writeln!(stdin, "{cmd}")
            .and_then(|()| stdin.flush())
            .context("writing to the peer")
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address a `ferry serve` child reports on the first line of its (piped) stdout,
/// `listening on ADDR`, within 20 s; an error names what it said instead.
pub fn serve_address(child: &mut Child) -> Result<String> {
    let out = child.stdout.take().context("ferry serve stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .context("ferry serve did not report its address")?;
    Ok(line
        .trim()
        .strip_prefix("listening on ")
        .with_context(|| format!("ferry serve said {line:?}"))?
        .to_string())
}
