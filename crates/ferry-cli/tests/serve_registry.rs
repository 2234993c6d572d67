//! One `ferry serve` on several addresses, and the services it hosts, as real processes
//! over loopback: `ferry cp` through each listener (given by repeated `--listen`, or as a
//! `listen` list in the config), and `ferry services` listing the services and refusing one
//! the server does not run, naming those it does.

use std::process::{Command, Stdio};

mod common;

use common::*;

/// Starts `ferry serve ARGS` exporting a scratch root `d`; waits for its `listening on`
/// lines, one per address, and returns the server (at the first address) and every
/// address.
fn serve_on(args: &[&str], listeners: usize) -> (Server, Vec<String>) {
    let root = scratch("root");
    let mut child = ferry()
        .args(["serve", "--root"])
        .arg(format!("d={}", root.display()))
        .args(["--token", TOKEN])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn ferry serve");
    let addrs: Vec<String> = listening(&mut child, listeners);
    let server = Server {
        child,
        addr: addrs[0].clone(),
        root,
    };
    (server, addrs)
}

/// `ferry services ARGS`.
fn services(args: &[&str]) -> std::process::Output {
    let mut c: Command = ferry();
    c.arg("services").args(args);
    run(c)
}

/// A file down and up through each listener of a server on tcp and ofi+tcp (two
/// `--listen`), byte-identical.
#[test]
fn cp_through_each_of_two_listeners() {
    let (s, addrs) = serve_on(
        &[
            "--listen",
            "tcp://127.0.0.1:0",
            "--listen",
            "ofi+tcp://127.0.0.1:0",
        ],
        2,
    );
    assert!(addrs[0].starts_with("tcp://") && addrs[1].starts_with("ofi+tcp://"));
    let local = scratch("local");
    std::fs::write(s.root.join("f"), pattern(300_000, 7)).unwrap();
    for (i, addr) in addrs.iter().enumerate() {
        let down = local.join(format!("down{i}"));
        let v = ok(&cp(&[&format!("{addr}/d/f"), down.to_str().unwrap()], &[]));
        assert_eq!(v["bytes"].as_u64(), Some(300_000), "{addr}");
        same_file(&s.root.join("f"), &down);
        let up = format!("up{i}");
        ok(&cp(
            &[down.to_str().unwrap(), &format!("{addr}/d/{up}")],
            &[],
        ));
        same_file(&down, &s.root.join(&up));
    }
    std::fs::remove_dir_all(&local).unwrap();
}

/// A config's `listen` list: both addresses serve; `ferry services` lists xfer and cio
/// through either, says xfer is hosted, and refuses nbd naming those it runs (exit 3).
#[test]
fn config_listen_list_and_services() {
    let dir = scratch("conf");
    let conf = dir.join("ferry.toml");
    std::fs::write(
        &conf,
        "listen = [\"tcp://127.0.0.1:0\", \"tcp://127.0.0.1:0\"]\n",
    )
    .unwrap();
    let (s, addrs) = serve_on(&["--config", conf.to_str().unwrap()], 2);
    assert_ne!(addrs[0], addrs[1], "two ports");
    std::fs::write(s.root.join("g"), b"through both").unwrap();
    for addr in &addrs {
        let o = services(&[addr]);
        assert!(o.status.success(), "{o:?}");
        assert_eq!(String::from_utf8_lossy(&o.stdout), "xfer\ncio\n");
        let o = services(&[addr, "xfer"]);
        assert!(o.status.success(), "{o:?}");
        ok(&cp(
            &[&format!("{addr}/d/g"), dir.join("g").to_str().unwrap()],
            &[],
        ));
    }
    let o = services(&[&addrs[1], "nbd"]);
    fails(&o, 3, "does not run service \"nbd\"; it runs: xfer, cio");
    assert!(o.stdout.is_empty());
    let o = services(&[&addrs[0], "NBD"]);
    fails(&o, 1, "service name");
    drop(s);
    std::fs::remove_dir_all(&dir).unwrap();
}
