//! `ferry block attach` as a real process: a `ferry serve` exporting a file as a block
//! device, reached over the fabric's RMA path (native tcp, ofi+tcp, ofi+shm) by an attach
//! that serves it on a Unix socket to nbdcopy (both ways, bytes compared with the server's
//! file); then (native tcp) an attach killed in the middle of a write: the server goes on serving
//! another attach, and what was flushed before is intact.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;

use common::*;

const SIZE: u64 = 32 << 20;

/// A `ferry serve` exporting `nbd_export` over NBD and on the fabric listener of
/// `driver`, killed on drop. Both `listening on` lines are read before its stdout is let
/// go (a server printing into a closed pipe would die).
struct Serve {
    child: Child,
    addr: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(name) = self.addr.strip_prefix("ofi+shm://") {
            let _ = std::fs::remove_file(Path::new("/dev/shm").join(name));
        }
    }
}

fn serve(driver: &str, dir: &Path, nbd_export: &str) -> Serve {
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let mut child = ferry()
        .args(["serve", "--root"])
        .arg(format!("d={}", root.display()))
        .args(["--listen", &listen_url(driver), "--token", TOKEN])
        .args(["--nbd-export", nbd_export, "--nbd-listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ferry serve");
    let addrs = listening(&mut child, 2);
    let addr = addrs
        .into_iter()
        .find(|a| !a.starts_with("nbd"))
        .expect("a fabric address");
    Serve { child, addr }
}

/// Starts `ferry block attach ADDR/disk --nbd unix:SOCK`; its child and NBD URI.
fn attach(addr: &str, sock: &Path) -> (Child, String) {
    let mut c = ferry();
    c.args(["block", "attach", &format!("{addr}/disk"), "--token", TOKEN])
        .arg("--nbd")
        .arg(format!("unix:{}", sock.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = c.spawn().expect("spawn ferry block attach");
    listening(&mut child, 1);
    (child, format!("nbd+unix:///disk?socket={}", sock.display()))
}

fn nbdcopy(from: &str, to: &str) {
    let mut c = Command::new("nbdcopy");
    c.args(["--connections=2", from, to]);
    let o = run(c);
    assert!(
        o.status.success(),
        "nbdcopy {from} {to}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn attach_carries_nbd_clients_over_every_driver_and_survives_a_killed_client() {
    let found = Command::new("nbdcopy").arg("--version").output().is_ok()
        && Command::new("fio").arg("--version").output().is_ok();
    assert!(found, "install the Debian packages libnbd-bin and fio");
    for driver in ["tcp", "ofi+tcp", "ofi+shm"] {
        let dir = scratch("attach");
        let img = dir.join("disk.img");
        std::fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
        let src = dir.join("src.img");
        std::fs::write(&src, pattern(8 << 20, 5)).unwrap();
        let nbd_export = format!("disk={}", img.display());
        let s = serve(driver, &dir, &nbd_export);
        let (a, uri) = attach(&s.addr, &dir.join("a.sock"));
        nbdcopy(src.to_str().unwrap(), &uri);
        let on_server = std::fs::read(&img).unwrap();
        assert!(
            on_server[..8 << 20] == std::fs::read(&src).unwrap()[..],
            "{driver}: upload"
        );
        let back = dir.join("back.img");
        nbdcopy(&uri, back.to_str().unwrap());
        assert!(
            std::fs::read(&back).unwrap()[..8 << 20] == std::fs::read(&src).unwrap()[..],
            "{driver}: download"
        );

        if driver != "tcp" {
            stop(a);
            let _ = std::fs::remove_dir_all(&dir);
            continue;
        }
        // Killed mid-write (on one driver, to keep the test short): a long write through
        // `a`, which is killed with SIGKILL.
        let mut fio = Command::new("fio")
            .args([
                "--name=w",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                "--rw=write",
                "--bs=1m",
                "--iodepth=8",
                "--offset=16m",
                "--size=16m",
                "--time_based",
                "--runtime=20",
                // One process: killing it leaves no job process behind.
                "--thread",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(700));
        stop(a);
        let _ = fio.kill();
        let _ = fio.wait();
        // Another client is served, and the flushed upload is intact.
        let (b, uri_b) = attach(&s.addr, &dir.join("b.sock"));
        let again = dir.join("again.img");
        nbdcopy(&uri_b, again.to_str().unwrap());
        assert!(
            std::fs::read(&again).unwrap()[..8 << 20] == std::fs::read(&src).unwrap()[..],
            "{driver}: after the kill"
        );
        stop(b);
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
