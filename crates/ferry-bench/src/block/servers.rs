//! The NBD servers `bench block` measures, each a process kept up for the whole run:
//! `ferry serve` (one process: a memory and a file export, on TCP and on a Unix socket),
//! nbdkit (memory plugin, file plugin) and qemu-nbd (file), and where fio reaches each
//! export (its NBD URI).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::cp::tools::{free_port, installed};
use crate::cpu::proc_cpu_secs;

/// How long the readiness probe waits for a greeting.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A server process, killed and reaped on drop.
pub struct Proc {
    child: Child,
    what: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    /// Starts `cmd` (stdio detached, its log quiet) and waits until `ready` connects.
    fn start(mut cmd: Command, what: &str, ready: &Listen) -> Result<Proc> {
        let child = cmd
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        let mut p = Proc {
            child,
            what: what.into(),
        };
        p.wait_ready(ready)?;
        Ok(p)
    }

    fn wait_ready(&mut self, at: &Listen) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let up = match at {
                Listen::Tcp(port) => TcpStream::connect(("127.0.0.1", *port)).map(|s| {
                    let _ = s.set_read_timeout(Some(PROBE_TIMEOUT));
                    nbd_abort(s)
                }),
                Listen::Unix(p) => UnixStream::connect(p).map(|s| {
                    let _ = s.set_read_timeout(Some(PROBE_TIMEOUT));
                    nbd_abort(s)
                }),
            };
            if up.is_ok() {
                return Ok(());
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                bail!("{} exited at start ({st})", self.what);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("{} did not listen on {at:?} within 20 s", self.what)
    }

    /// CPU seconds (user + system) the server has used so far.
    pub fn cpu(&self) -> Option<f64> {
        proc_cpu_secs(self.child.id())
    }
}

/// Takes an NBD server's greeting and leaves the way the protocol says,
/// `NBD_OPT_ABORT`, so the server has no broken handshake to log.
fn nbd_abort(mut s: impl Read + Write) {
    const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
    const OPT_ABORT: u32 = 2;
    let mut greeting = [0u8; 18];
    if s.read_exact(&mut greeting).is_err() {
        return;
    }
    let mut msg = Vec::with_capacity(20);
    msg.extend_from_slice(&3u32.to_be_bytes()); // fixed newstyle, no zeroes
    msg.extend_from_slice(&IHAVEOPT.to_be_bytes());
    msg.extend_from_slice(&OPT_ABORT.to_be_bytes());
    msg.extend_from_slice(&0u32.to_be_bytes());
    if s.write_all(&msg).is_ok() {
        let mut reply = [0u8; 20];
        let _ = s.read_exact(&mut reply);
    }
}

/// Where a server listens.
#[derive(Debug, Clone)]
pub enum Listen {
    /// TCP on 127.0.0.1.
    Tcp(u16),
    /// A Unix socket.
    Unix(PathBuf),
}

impl Listen {
    /// The NBD URI of `export` here.
    pub fn uri(&self, export: &str) -> String {
        match self {
            Listen::Tcp(port) => format!("nbd://127.0.0.1:{port}/{export}"),
            Listen::Unix(p) => format!("nbd+unix:///{export}?socket={}", p.display()),
        }
    }

    /// `tcp` or `unix`.
    pub fn transport(&self) -> &'static str {
        match self {
            Listen::Tcp(_) => "tcp",
            Listen::Unix(_) => "unix",
        }
    }
}

/// `ferry serve` with the block service alone: exports `mem` (memory of `size` bytes) and
/// `file` (the backing file) on TCP and on a Unix socket.
pub fn ferry(dir: &Path, file: &Path, size: u64) -> Result<(Proc, Listen, Listen)> {
    let port = free_port()?;
    let sock = dir.join("ferry.sock");
    let cfg = dir.join("ferry-block.toml");
    let toml = format!(
        "[block]\nlisten = [\"127.0.0.1:{port}\", \"unix:{}\"]\n\n\
         [[block.export]]\nname = \"mem\"\nmemory = {size}\n\n\
         [[block.export]]\nname = \"file\"\npath = \"{}\"\n",
        sock.display(),
        file.display()
    );
    std::fs::write(&cfg, toml).context("writing ferry serve's configuration")?;
    let exe = std::env::current_exe().context("locating the ferry binary")?;
    let mut cmd = Command::new(exe);
    cmd.args(["serve", "--config"]).arg(&cfg);
    let tcp = Listen::Tcp(port);
    let p = Proc::start(cmd, "ferry serve", &tcp)?;
    Ok((p, tcp, Listen::Unix(sock)))
}

/// nbdkit in the foreground with `plugin args`, on TCP or (with `sock`) a Unix socket. Its
/// default thread model and thread count (16) serve requests in parallel.
pub fn nbdkit(plugin: &[String], sock: Option<&Path>) -> Result<(Proc, Listen)> {
    need("nbdkit")?;
    let at = match sock {
        Some(p) => Listen::Unix(p.to_path_buf()),
        None => Listen::Tcp(free_port()?),
    };
    let mut cmd = Command::new("nbdkit");
    cmd.args(["-f", "--exit-with-parent"]);
    match &at {
        Listen::Tcp(port) => cmd.args(["-i", "127.0.0.1", "-p", &port.to_string()]),
        Listen::Unix(p) => cmd.arg("-U").arg(p),
    };
    cmd.args(plugin);
    let p = Proc::start(cmd, "nbdkit", &at)?;
    Ok((p, at))
}

/// qemu-nbd serving `file` (raw, page cache, thread pool I/O) as export `file` to up to
/// 16 clients, persistent.
pub fn qemu_nbd(file: &Path) -> Result<(Proc, Listen)> {
    need("qemu-nbd")?;
    let port = free_port()?;
    let mut cmd = Command::new("qemu-nbd");
    cmd.args(["-f", "raw", "-x", "file", "-b", "127.0.0.1"])
        .args(["-p", &port.to_string(), "-t", "-e", "16"])
        .args(["--cache=writeback", "--aio=threads"])
        .arg(file);
    let at = Listen::Tcp(port);
    let p = Proc::start(cmd, "qemu-nbd", &at)?;
    Ok((p, at))
}

/// An error naming the package when `prog` is missing.
pub fn need(prog: &str) -> Result<()> {
    if installed(prog) {
        Ok(())
    } else {
        bail!("{prog} not installed (run scripts/install-deps.sh)")
    }
}
