//! The processes `bench cp` runs: servers (ferry serve per driver, globus-gridftp-server,
//! xrootd, iperf3 -s) kept up for the whole run, and one client process per transfer, timed
//! from spawn to exit, with the CPU of both sides.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::cpu::{children_usage, proc_cpu_secs};

/// What one transfer cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// Wall seconds from spawning the client to its exit (plus the sync of the output, for
    /// disk workloads).
    pub secs: f64,
    /// User+system CPU seconds of the client process.
    pub client_cpu: f64,
    /// User+system CPU seconds the server spent meanwhile.
    pub server_cpu: f64,
}

/// Whether `prog` is on the PATH.
pub fn installed(prog: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p)
            .any(|d| std::fs::metadata(d.join(prog)).is_ok_and(|m| m.is_file()))
    })
}

/// A free TCP port on loopback (bound and released; the server binds it next).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free port")?
        .port())
}

/// Waits until something accepts TCP connections on 127.0.0.1:`port`.
fn wait_listening(port: u16, child: &mut Child, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            bail!("{what} exited at start ({st})");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{what} did not listen on 127.0.0.1:{port} within 20 s")
}

/// A server process kept for the run; killed and reaped on drop.
pub struct Server {
    child: Child,
    /// Where clients reach it: a ferry address, or the TCP port of a peer.
    pub addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A killed ofi+shm server cannot remove its 16 MiB region in /dev/shm.
        if let Some(name) = self.addr.strip_prefix("ofi+shm://") {
            if !name.is_empty() && !name.contains('/') {
                let _ = std::fs::remove_file(Path::new("/dev/shm").join(name));
            }
        }
    }
}

impl Server {
    /// CPU seconds so far (None once it has gone).
    pub fn cpu(&self) -> Option<f64> {
        proc_cpu_secs(self.child.id())
    }

    /// `ferry serve --mem --anonymous --anonymous-write` exporting `roots` on `listen`, with `extra`
    /// arguments and environment `env`; its address is the one it reports.
    pub fn ferry(
        listen: &str,
        roots: &[(&str, &Path)],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Server> {
        let exe = std::env::current_exe().context("locating the ferry binary")?;
        let mut cmd = Command::new(exe);
        cmd.args([
            "serve",
            "--mem",
            "--anonymous",
            "--anonymous-write",
            "--listen",
            listen,
        ])
        .args(extra)
        .envs(env.iter().copied());
        for (name, path) in roots {
            cmd.arg("--root").arg(format!("{name}={}", path.display()));
        }
        let child = cmd
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting ferry serve")?;
        // Owned first, so that a server that never reports is killed with it.
        let mut server = Server {
            child,
            addr: String::new(),
        };
        server.addr = crate::child::serve_address(&mut server.child)?;
        Ok(server)
    }

    /// An anonymous, loopback-only `globus-gridftp-server` (forking per session).
    pub fn gridftp() -> Result<Server> {
        let port = free_port()?;
        let mut child = Command::new("globus-gridftp-server")
            .args(["-aa", "-anonymous-user", "nobody", "-p", &port.to_string()])
            .args([
                "-control-interface",
                "127.0.0.1",
                "-data-interface",
                "127.0.0.1",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting globus-gridftp-server")?;
        wait_listening(port, &mut child, "globus-gridftp-server")?;
        Ok(Server {
            child,
            addr: port.to_string(),
        })
    }

    /// `xrootd` as user nobody (it refuses to run as root) exporting `exports`.
    pub fn xrootd(exports: &[&Path], cfg: &Path) -> Result<Server> {
        let port = free_port()?;
        let body: String = exports
            .iter()
            .map(|p| format!("all.export {}\n", p.display()))
            .collect();
        std::fs::write(cfg, body).context("writing the xrootd configuration")?;
        let mut cmd = Command::new("xrootd");
        if rustix::process::getuid().is_root() {
            cmd.args(["-R", "nobody"]);
        }
        let mut child = cmd
            .args(["-p", &port.to_string(), "-c"])
            .arg(cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting xrootd")?;
        wait_listening(port, &mut child, "xrootd")?;
        Ok(Server {
            child,
            addr: port.to_string(),
        })
    }

    /// `iperf3 -s` on loopback.
    pub fn iperf3() -> Result<Server> {
        let port = free_port()?;
        let mut child = Command::new("iperf3")
            .args(["-s", "-B", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting iperf3 -s")?;
        wait_listening(port, &mut child, "iperf3 -s")?;
        Ok(Server {
            child,
            addr: port.to_string(),
        })
    }
}

/// A throwaway OpenSSH server on a free loopback port (`scp`, `rsync -e ssh` rows): its own
/// host key, configuration and a client key allowed in, made in a temporary directory
/// removed with it. The peer users reach for when they want their data encrypted.
pub struct Sshd {
    /// The `sshd -D` process.
    pub server: Server,
    /// The client's private key.
    key: std::path::PathBuf,
    /// Whom the client logs in as (this user).
    user: String,
    dir: std::path::PathBuf,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where `sshd` lives, as an absolute path (sshd re-executes itself and refuses to start
/// otherwise): on the PATH, or in /usr/sbin (not on every user's PATH).
fn sshd_program() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(std::iter::once("/usr/sbin".into()))
        .map(|d| d.join("sshd"))
        .find(|p| p.is_absolute() && p.is_file())
}

impl Sshd {
    /// Starts one, or says why not (OpenSSH's server or client not installed).
    pub fn start() -> Result<Sshd> {
        let prog = sshd_program()
            .context("sshd not installed (openssh-server; run scripts/install-deps.sh): skipped")?;
        for p in ["ssh", "scp", "ssh-keygen"] {
            if !installed(p) {
                bail!("{p} not installed (openssh-client): skipped");
            }
        }
        let dir = std::env::temp_dir().join(format!("ferry-bench-sshd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let user = whoami()?;
        let port = free_port()?;
        for key in ["host_key", "client_key"] {
            let st = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(dir.join(key))
                .stdin(Stdio::null())
                .status()
                .context("running ssh-keygen")?;
            if !st.success() {
                bail!("ssh-keygen failed ({st})");
            }
        }
        std::fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys"))
            .context("writing authorized_keys")?;
        let cfg = dir.join("sshd_config");
        std::fs::write(&cfg, sshd_config(&dir, port)).context("writing sshd_config")?;
        if rustix::process::getuid().is_root() {
            // sshd's privilege separation directory, which its package makes at boot.
            let _ = std::fs::create_dir_all("/run/sshd");
        }
        let mut child = Command::new(&prog)
            .args(["-D", "-e", "-f"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting sshd")?;
        wait_listening(port, &mut child, "sshd")?;
        Ok(Sshd {
            server: Server {
                child,
                addr: port.to_string(),
            },
            key: dir.join("client_key"),
            user,
            dir,
        })
    }

    /// The ssh options every client here takes: this server's port, the client key, and
    /// no host-key bookkeeping (the host key is a throwaway).
    fn ssh_opts(&self, port_flag: &str) -> Vec<String> {
        let mut v = vec![port_flag.to_string(), self.server.addr.clone(), "-i".into()];
        v.push(self.key.display().to_string());
        for o in [
            "StrictHostKeyChecking=no",
            "UserKnownHostsFile=/dev/null",
            "BatchMode=yes",
            "LogLevel=ERROR",
        ] {
            v.extend(["-o".to_string(), o.to_string()]);
        }
        v
    }

    /// `user@127.0.0.1:path`.
    fn remote(&self, path: &Path) -> String {
        format!("{}@127.0.0.1:{}", self.user, path.display())
    }

    /// `scp` of `src` on this server to `dst`, with `cipher` if not empty.
    pub fn scp(&self, cipher: &str, src: &Path, dst: &Path) -> Command {
        let mut c = Command::new("scp");
        c.arg("-q").args(self.ssh_opts("-P"));
        if !cipher.is_empty() {
            c.args(["-c", cipher]);
        }
        c.arg(self.remote(src)).arg(dst);
        c
    }

    /// `rsync -e ssh` of `src` on this server to `dst` (whole file: nothing to compare).
    pub fn rsync(&self, src: &Path, dst: &Path) -> Command {
        let mut c = Command::new("rsync");
        let ssh = std::iter::once("ssh".to_string())
            .chain(self.ssh_opts("-p"))
            .collect::<Vec<_>>()
            .join(" ");
        c.args(["-q", "--whole-file", "-e", &ssh])
            .arg(self.remote(src))
            .arg(dst);
        c
    }
}

/// An `sshd_config` for a server of its own on 127.0.0.1:`port` whose files are in `dir`:
/// key logins only, this user's key only, root allowed (the bench may run as root), SFTP
/// for scp (OpenSSH 9's scp speaks SFTP).
fn sshd_config(dir: &Path, port: u16) -> String {
    let d = dir.display();
    format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\n\
         AuthorizedKeysFile {d}/authorized_keys\nPidFile none\nPermitRootLogin yes\n\
         StrictModes no\nUsePAM no\nPasswordAuthentication no\n\
         KbdInteractiveAuthentication no\nSubsystem sftp internal-sftp\n"
    )
}

/// This process's user name (`id -un`).
fn whoami() -> Result<String> {
    let out = Command::new("id")
        .arg("-un")
        .output()
        .context("running id -un")?;
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if name.is_empty() {
        bail!("no user name for this process");
    }
    Ok(name)
}

/// How long a server may keep working after its client exited (a forking server reaps
/// the session's process) before its CPU is read.
const SETTLE: Duration = Duration::from_millis(200);

/// Runs `cmd` (a client) to completion within `timeout`, timing it, then `after` (e.g. a
/// sync of the output) inside the timed span; the CPU of the client and of `server` (a
/// reference tool such as fio has none). Returns the client's stdout too.
pub fn run_client(
    mut cmd: Command,
    server: Option<&Server>,
    timeout: Duration,
    after: impl FnOnce() -> Result<()>,
) -> Result<(Measured, Vec<u8>)> {
    let what = format!("{:?}", cmd.get_program());
    let s0 = match server {
        Some(s) => Some(s.cpu().context("the server is gone")?),
        None => None,
    };
    let c0 = children_usage();
    let t = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let mut out = child.stdout.take().context("client stdout")?;
    let mut err = child.stderr.take().context("client stderr")?;
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err, &mut v);
        v
    });
    let status = loop {
        if let Some(st) = child.try_wait().context("waiting for the client")? {
            break st;
        }
        if t.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    after()?;
    let secs = t.elapsed().as_secs_f64();
    let client_cpu = children_usage().secs_since(c0);
    let stdout = reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    if !status.success() {
        let msg = String::from_utf8_lossy(&stderr);
        let msg = msg
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        bail!("{what} failed ({status}): {}", msg.trim());
    }
    let server_cpu = match (server, s0) {
        (Some(server), Some(s0)) => {
            std::thread::sleep(SETTLE);
            server.cpu().map_or(0.0, |s| (s - s0).max(0.0))
        }
        _ => 0.0,
    };
    Ok((
        Measured {
            secs,
            client_cpu,
            server_cpu,
        },
        stdout,
    ))
}
