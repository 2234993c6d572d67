//! `ferry serve` hosting the block service as a real process: exports from the command line
//! and from the config's `[block]` table, reached by standard NBD clients (libnbd-bin) over
//! TCP and a Unix socket, beside file transfer in the same daemon, and stopped by SIGTERM.

use std::process::{Child, Command, Stdio};

mod common;

use common::*;

/// Starts `ferry serve ARGS`; its child and the `listening on` addresses (`count` lines).
fn serve(args: &[&str], count: usize) -> (Child, Vec<String>) {
    let mut child = ferry()
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addrs: Vec<String> = listening(&mut child, count);
    (child, addrs)
}

fn need(tool: &str, package: &str) {
    let found = Command::new(tool).arg("--version").output().is_ok();
    assert!(
        found,
        "{tool} is not installed: install the Debian package {package}"
    );
}

fn sigterm(child: &mut Child) -> std::process::ExitStatus {
    rustix::process::kill_process(
        rustix::process::Pid::from_child(child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    child.wait().unwrap()
}

#[test]
fn nbd_export_from_the_command_line_over_tcp_and_unix() {
    need("nbdcopy", "libnbd-bin");
    let dir = scratch("nbd-cli");
    let img = dir.join("disk.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let src = dir.join("src.img");
    std::fs::write(&src, pattern(8 << 20, 3)).unwrap();
    let sock = dir.join("nbd.sock");
    let (mut child, addrs) = serve(
        &[
            "--nbd-export",
            &format!("disk={}", img.display()),
            "--nbd-listen",
            "127.0.0.1:0",
            "--nbd-listen",
            &format!("unix:{}", sock.display()),
        ],
        2,
    );
    assert!(addrs[0].starts_with("nbd://127.0.0.1:"), "{addrs:?}");
    let tcp = format!("{}/disk", addrs[0]);
    let unix = format!("nbd+unix:///disk?socket={}", sock.display());
    let mut up = Command::new("nbdcopy");
    up.args(["--connections=4", src.to_str().unwrap(), &tcp]);
    ok_status(run(up));
    same_file(&src, &img);
    let back = dir.join("back.img");
    let mut down = Command::new("nbdcopy");
    down.args([&unix, back.to_str().unwrap()]);
    ok_status(run(down));
    same_file(&src, &back);
    assert!(sigterm(&mut child).success());
    assert!(!sock.exists(), "the socket file outlived the server");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Both faces from one config file: file transfer on its listener, a memory export on NBD.
#[test]
fn block_table_beside_file_transfer() {
    need("nbdinfo", "libnbd-bin");
    let dir = scratch("nbd-cfg");
    let cfg = dir.join("serve.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"tcp://127.0.0.1:0\"\n[auth]\ntokens = [\"{TOKEN}\"]\n[[root]]\nname = \"d\"\npath = \"{}\"\n\n[block]\nlisten = \"127.0.0.1:0\"\n[[block.export]]\nname = \"ram\"\nmemory = \"1GiB\"\ndescription = \"scratch\"\n",
            dir.display()
        ),
    )
    .unwrap();
    let (mut child, addrs) = serve(&["--config", cfg.to_str().unwrap()], 2);
    assert!(addrs[0].starts_with("tcp://"), "{addrs:?}");
    assert!(addrs[1].starts_with("nbd://"), "{addrs:?}");
    let mut info = Command::new("nbdinfo");
    info.args(["--json", &format!("{}/ram", addrs[1])]);
    let j = json(&ok_status(run(info)));
    assert_eq!(j["exports"][0]["export-size"], 1u64 << 30, "{j}");
    assert_eq!(j["exports"][0]["description"], "scratch", "{j}");
    assert!(sigterm(&mut child).success());
    // An unknown key in [block] is refused at start, naming it.
    std::fs::write(&cfg, "[block]\nlisten = \"127.0.0.1:0\"\nexprt = 1\n").unwrap();
    let mut bad = ferry();
    bad.args(["serve", "--config", cfg.to_str().unwrap()]);
    let out = run(bad);
    fails(&out, 1, "exprt");
    let _ = std::fs::remove_dir_all(&dir);
}

fn ok_status(o: std::process::Output) -> std::process::Output {
    assert!(
        o.status.success(),
        "failed: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    o
}
