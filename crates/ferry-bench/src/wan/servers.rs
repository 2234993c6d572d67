//! The servers of one emulated path, all in namespace A (198.18.0.1): `ferry serve` per
//! driver, a GridFTP server and `iperf3 -s`. Clients run in namespace B, so every byte
//! crosses the delay line and its bottleneck.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ferry_wan::Wan;

/// A server process inside namespace A; killed and reaped on drop.
pub struct Remote {
    child: Child,
    /// Where clients reach it: a ferry address, or the TCP port of a peer.
    pub addr: String,
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free TCP port on namespace A's address (bound there and released).
fn free_port(wan: &Wan) -> Result<u16> {
    let a = wan.a().addr;
    let l = wan
        .in_a(move || TcpListener::bind((a, 0)).and_then(|l| l.local_addr()))
        .context("entering namespace A")?
        .context("finding a free port in namespace A")?;
    Ok(l.port())
}

/// Waits until something in namespace A accepts TCP connections on `port`.
fn wait_listening(wan: &Wan, port: u16, child: &mut Child, what: &str) -> Result<()> {
    let to = SocketAddr::from((wan.a().addr, port));
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let up = wan
            .in_a(move || TcpStream::connect_timeout(&to, Duration::from_millis(200)).is_ok())
            .unwrap_or(false);
        if up {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            bail!("{what} exited at start ({st})");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{what} did not listen on {to} within 20 s")
}

/// Starts `cmd` in namespace A with no stdio.
fn spawn_quiet(wan: &Wan, cmd: Command, what: &str) -> Result<Child> {
    wan.exec_in_a(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {what}"))
}

/// `ferry serve --mem --anonymous` on `driver` (`tcp`, `ofi+tcp`) in namespace A,
/// exporting `roots`, with the configuration file `config` if given; its address is the
/// one it reports.
pub fn ferry(
    wan: &Wan,
    driver: &str,
    roots: &[(&str, &Path)],
    config: Option<&Path>,
) -> Result<Remote> {
    let exe = std::env::current_exe().context("locating the ferry binary")?;
    let mut cmd = Command::new(exe);
    let listen = format!("{driver}://{}:0", wan.a().addr);
    cmd.args(["serve", "--mem", "--anonymous", "--listen", &listen]);
    for (name, path) in roots {
        cmd.arg("--root").arg(format!("{name}={}", path.display()));
    }
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    cmd.env("RUST_LOG", "warn");
    let child = wan
        .exec_in_a(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting ferry serve in namespace A")?;
    // Owned first, so that a server that never reports is killed with it.
    let mut server = Remote {
        child,
        addr: String::new(),
    };
    server.addr = crate::child::serve_address(&mut server.child)?;
    Ok(server)
}

/// An anonymous `globus-gridftp-server` on namespace A's address (forking per session).
pub fn gridftp(wan: &Wan) -> Result<Remote> {
    let port = free_port(wan)?;
    let a = wan.a().addr.to_string();
    let mut cmd = Command::new("globus-gridftp-server");
    cmd.args(["-aa", "-anonymous-user", "nobody", "-p", &port.to_string()])
        .args(["-control-interface", &a, "-data-interface", &a]);
    let mut child = spawn_quiet(wan, cmd, "globus-gridftp-server")?;
    wait_listening(wan, port, &mut child, "globus-gridftp-server")?;
    Ok(Remote {
        child,
        addr: port.to_string(),
    })
}

/// `iperf3 -s` on namespace A's address.
pub fn iperf3(wan: &Wan) -> Result<Remote> {
    let port = free_port(wan)?;
    let mut cmd = Command::new("iperf3");
    cmd.args([
        "-s",
        "-B",
        &wan.a().addr.to_string(),
        "-p",
        &port.to_string(),
    ]);
    let mut child = spawn_quiet(wan, cmd, "iperf3 -s")?;
    wait_listening(wan, port, &mut child, "iperf3 -s")?;
    Ok(Remote {
        child,
        addr: port.to_string(),
    })
}
