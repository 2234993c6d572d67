//! `ferry cp` at distance, on the WAN emulator (`ferry-wan`): a server in namespace A, the
//! client in namespace B, 50 ms between them through a bottleneck. No tuning flags: what a
//! user gets.
//!
//! - a memory copy reaches 90 % of a 1 Gbit/s bottleneck within 20 s;
//! - a copy without `-p` has two streams from the start;
//! - 1,000 files of 64 KiB take their bytes at the bottleneck rate plus a few round trips
//!   (ignored: not met yet), and a tree of 1,000 small files is asked for in one window;
//! - 1,000 files of 64 KiB go up in their bytes at the bottleneck rate plus 60 round trips;
//! - a 5 s cut of the link in the middle of a copy is finished by `--retries`, byte for
//!   byte, without fetching again what had landed;
//! - 1 % random loss: the copy completes and reports its rate.
//!
//! Each test skips with the emulator's message when the machine cannot run it (not root,
//! no /dev/net/tun). They run one at a time: they measure rates on shared cores.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{ferry, ok, pattern, run, same_file, scratch, Server, TOKEN};
use ferry_wan::{Config, Wan};
use serde_json::Value;

const RTT: Duration = Duration::from_millis(50);
const GBIT: u64 = 1_000_000_000;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The emulator with `config`, or `None` (and why, on stderr) when it cannot run here.
fn wan_or_skip(config: Config) -> Option<Wan> {
    if let Err(e) = ferry_wan::supported() {
        eprintln!("skipping: {e}");
        return None;
    }
    Some(Wan::up(config).expect("bring the emulator up"))
}

fn path(rate_bps: u64) -> Config {
    Config {
        rtt: RTT,
        rate_bps: Some(rate_bps),
        ..Config::default()
    }
}

/// `ferry serve --mem` in namespace A, exporting a scratch directory as root `d`.
fn serve_in_a(wan: &Wan) -> Server {
    serve_in_a_with(wan, |_| {})
}

/// `ferry serve --mem` in namespace A as [`serve_in_a`] does, its debug log going to the
/// file `log`.
fn serve_in_a_logging(wan: &Wan, log: &std::path::Path) -> Server {
    let log = std::fs::File::create(log).expect("create the server's log");
    serve_in_a_with(wan, |cmd| {
        cmd.env("RUST_LOG", "ferry_xfer=debug").stderr(log);
    })
}

/// [`serve_in_a`] with `more` done to its command first (arguments, environment, stderr).
fn serve_in_a_with(wan: &Wan, more: impl FnOnce(&mut Command)) -> Server {
    let root = scratch("wan-root");
    let mut cmd = wan.exec_in_a(ferry());
    cmd.args(["serve", "--mem", "--token", TOKEN, "--root"])
        .arg(format!("d={}", root.display()))
        .arg("--listen")
        .arg(format!("tcp://{}:0", wan.a().addr))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    more(&mut cmd);
    let mut child = cmd.spawn().expect("spawn ferry serve in namespace A");
    let addr = common::listening(&mut child, 1).remove(0);
    Server { child, addr, root }
}

/// `ferry cp --token TOKEN --json ARGS` in namespace B.
fn cp_in_b(wan: &Wan, args: &[&str]) -> Command {
    let mut c = wan.exec_in_b(ferry());
    c.args(["cp", "--token", TOKEN, "--json"]).args(args);
    c
}

/// 1,000 files of `size` bytes under `tree`, 100 to a directory (`d0/f0` … `d9/f999`).
fn thousand_files(tree: &std::path::Path, size: usize) {
    for i in 0..1000 {
        let dir = tree.join(format!("d{}", i / 100));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i}")), pattern(size, i as u8)).unwrap();
    }
}

/// The rate a copy reported (bits/s of file data that crossed the network).
fn rate(v: &Value) -> f64 {
    v["wire_bytes"].as_f64().unwrap() * 8.0 / v["seconds"].as_f64().unwrap()
}

/// A memory copy with no flags reaches 90 % of a 1 Gbit/s bottleneck at 50 ms within 20 s:
/// measured on the line (IP bytes the bottleneck passed, which it bills as a 1500-byte-MTU
/// link does) over 2-second windows, and ferry's own report once the copy ends.
#[test]
fn a_memory_copy_fills_a_long_path() {
    let _g = serial();
    let Some(wan) = wan_or_skip(path(GBIT)) else {
        return;
    };
    let srv = serve_in_a(&wan);
    // 2.5 GB: 20 s at the bottleneck; the test stops the copy once the rate was reached.
    let mut cp = cp_in_b(&wan, &[&srv.at("mem/zero/2500M"), "null:"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ferry cp");
    let line = wan.stats_a_to_b();
    let start = Instant::now();
    let window = Duration::from_secs(2);
    let mut samples = vec![(start, line.bytes.load(Ordering::Relaxed))];
    let mut best = 0.0f64;
    let mut reached = None;
    while start.elapsed() < Duration::from_secs(20) && reached.is_none() {
        std::thread::sleep(Duration::from_millis(100));
        let now = (Instant::now(), line.bytes.load(Ordering::Relaxed));
        samples.push(now);
        if let Some(then) = samples.iter().find(|s| now.0 - s.0 <= window) {
            if now.0 - then.0 >= window - Duration::from_millis(150) {
                let bps = (now.1 - then.1) as f64 * 8.0 / (now.0 - then.0).as_secs_f64();
                best = best.max(bps);
                if bps >= 0.9 * GBIT as f64 {
                    reached = Some(start.elapsed());
                }
            }
        }
        if cp.try_wait().unwrap().is_some() {
            break;
        }
    }
    let finished = cp.try_wait().unwrap().is_some();
    stop(&mut cp);
    match reached {
        Some(t) => eprintln!(
            "90 % of 1 Gbit/s reached after {:.1} s ({:.0} Mbit/s over 2 s)",
            t.as_secs_f64(),
            best / 1e6
        ),
        None => panic!(
            "the copy never reached 90 % of the bottleneck in 20 s: best {:.0} Mbit/s over 2 s (finished: {finished})",
            best / 1e6
        ),
    }
}

fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// 1,000 files of 64 KiB through 1 Gbit/s at 50 ms take no longer than their bytes at the
/// bottleneck rate (as TCP payload: 1448 of every 1500 bytes) plus a few round trips: the
/// connection's handshake, the listing, and TCP's slow start (about log2 of the path's
/// bandwidth-delay product in segments over the initial window: 9 round trips) — 15 in all.
///
/// Not met reliably yet (docs/wan.md, "Session 21"): with the handshake a round trip
/// shorter, five release runs on a quiet host took 1.27–1.56 s; the bytes alone take
/// 0.94–0.96 s through a cold connection (`iperf3 -R -n 64000K` on the same path), whose
/// slow start overshoots into the drop-tail queue. Run it with `--ignored` to measure.
#[test]
#[ignore = "the bound is not met yet: docs/wan.md, Figures"]
fn a_tree_of_small_files_streams_at_distance() {
    let _g = serial();
    let Some(wan) = wan_or_skip(path(GBIT)) else {
        return;
    };
    let srv = serve_in_a(&wan);
    let tree = srv.root.join("tree");
    thousand_files(&tree, 64 << 10);
    let out = scratch("wan-tree");
    let v = ok(&run(cp_in_b(
        &wan,
        &["-r", &srv.url("tree"), out.to_str().unwrap()],
    )));
    assert_eq!(v["files"], 1000);
    let bytes = 1000.0 * 65536.0;
    let at_rate = bytes * 8.0 / (GBIT as f64 * 1448.0 / 1500.0);
    let budget = at_rate + 15.0 * RTT.as_secs_f64();
    let secs = v["seconds"].as_f64().unwrap();
    eprintln!(
        "1,000 × 64 KiB: {secs:.2} s (at the bottleneck rate {at_rate:.2} s, budget {budget:.2} s), {:.0} Mbit/s, {} packets dropped at the bottleneck; path {}",
        rate(&v) / 1e6,
        wan.stats_a_to_b().queue_drops.load(Ordering::Relaxed),
        v["path"]
    );
    same_file(&tree.join("d3/f345"), &out.join("tree/d3/f345"));
    assert!(secs <= budget, "took {secs:.2} s, more than {budget:.2} s");
    let _ = std::fs::remove_dir_all(&out);
}

/// 1,000 files of 64 KiB go up through 1 Gbit/s at 50 ms in their bytes at the bottleneck
/// rate plus 60 round trips: small files leave several to a message (a PACK of PUT_FILEs,
/// protocol 1.11), so a stream keeps a round trip's worth in flight. One PUT_FILE to a
/// message kept about 8 in flight per round trip and a stream: 5.2 s in a release build
/// (7.1 s on one stream); 1.4–1.5 s since in release, 2.3 s in a debug build (which hashes
/// slowly). The bound leaves room for a debug build on a loaded host, and is still well
/// below what one file to a message took in release.
#[test]
fn a_tree_of_small_files_goes_up_at_distance() {
    let _g = serial();
    let Some(wan) = wan_or_skip(path(GBIT)) else {
        return;
    };
    let srv = serve_in_a(&wan);
    let tree = scratch("wan-up-tree").join("tree");
    thousand_files(&tree, 64 << 10);
    let v = ok(&run(cp_in_b(
        &wan,
        &["-r", tree.to_str().unwrap(), &srv.url("")],
    )));
    assert_eq!(v["files"], 1000);
    let at_rate = 1000.0 * 65536.0 * 8.0 / (GBIT as f64 * 1448.0 / 1500.0);
    let budget = at_rate + 60.0 * RTT.as_secs_f64();
    let secs = v["seconds"].as_f64().unwrap();
    eprintln!(
        "1,000 × 64 KiB up: {secs:.2} s (at the bottleneck rate {at_rate:.2} s, budget {budget:.2} s), {:.0} Mbit/s; path {}",
        rate(&v) / 1e6,
        v["path"]
    );
    same_file(&tree.join("d3/f345"), &srv.root.join("tree/d3/f345"));
    assert!(secs <= budget, "took {secs:.2} s, more than {budget:.2} s");
    let _ = std::fs::remove_dir_all(tree.parent().unwrap());
}

/// An upload without `-p` at 50 ms has its second stream from the start: it connects
/// while the first plans (256 MiB of zeros; one file under 256 MiB opens none). A download
/// opens none at once by default (slower on this path: docs/wan.md, session 19) unless
/// `FERRY_UPFRONT_STREAMS` asks, and then the first stream takes only its share of the
/// jobs, so the second has work when it is ready: 128 MiB (two chunks, both of which the
/// first stream alone would ask for at once, leaving nothing for a stream the search adds
/// 1.5 s in) move over two streams. A server that admits one connection leaves the copy
/// on one stream, finished.
#[test]
fn a_copy_at_distance_has_two_streams_from_the_start() {
    let _g = serial();
    let Some(wan) = wan_or_skip(path(GBIT)) else {
        return;
    };
    let srv = serve_in_a(&wan);
    let streams = |v: &Value| {
        eprintln!(
            "{} bytes at 50 ms: {:.2} s, {:.0} Mbit/s; path {}",
            v["bytes"],
            v["seconds"].as_f64().unwrap(),
            rate(v) / 1e6,
            v["path"]
        );
        assert_eq!(v["path"]["streams_auto"], true, "{v}");
        v["path"]["streams"].as_u64().unwrap()
    };
    let up = ok(&run(cp_in_b(&wan, &["zero:256M", &srv.at("mem/null")])));
    assert!(streams(&up) >= 2, "an upload on one stream: {}", up["path"]);
    let up = ok(&run(cp_in_b(&wan, &["zero:16M", &srv.at("mem/null")])));
    assert_eq!(streams(&up), 1, "{}", up["path"]);
    let src = srv.at("mem/zero/128M");
    let mut asked = cp_in_b(&wan, &[&src, "null:"]);
    asked.env("FERRY_UPFRONT_STREAMS", "2");
    let down = ok(&run(asked));
    assert!(
        streams(&down) >= 2,
        "a download on one stream: {}",
        down["path"]
    );
    let down = ok(&run(cp_in_b(&wan, &[&src, "null:"])));
    assert_eq!(streams(&down), 1, "{}", down["path"]);
    drop(srv);
    // One connection admitted: the second stream is refused, the copy goes on without it.
    let config = scratch("wan-one-conn").join("serve.toml");
    std::fs::write(&config, "[limits]\nmax_connections = 1\n").unwrap();
    std::fs::set_permissions(&config, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let one = serve_in_a_with(&wan, |cmd| {
        cmd.arg("--config").arg(&config);
    });
    let up = run(cp_in_b(&wan, &["zero:256M", &one.at("mem/null")]));
    assert_eq!(streams(&ok(&up)), 1);
}

/// A tree of 1,000 small files at 50 ms is asked for in one window: the copy's window of
/// GETs (sized to the path, within the open-file limit, which `ferry cp` raises to its hard
/// limit) holds every file, so no GET waits for an answer to leave. The cheap companion of
/// [`a_tree_of_small_files_streams_at_distance`]: 1 KiB files. (Whether a second stream
/// is added is not asserted: on a loaded host a debug build's first stream can still be
/// opening part files, jobs not yet taken, when the stream search decides, 1.5 s in.)
#[test]
fn a_tree_of_small_files_is_asked_for_in_one_window() {
    let _g = serial();
    let Some(wan) = wan_or_skip(path(GBIT)) else {
        return;
    };
    let srv = serve_in_a(&wan);
    let tree = srv.root.join("small");
    thousand_files(&tree, 1024);
    let out = scratch("wan-small");
    let v = ok(&run(cp_in_b(
        &wan,
        &["-r", &srv.url("small"), out.to_str().unwrap()],
    )));
    eprintln!(
        "1,000 × 1 KiB: {:.2} s; path {}",
        v["seconds"].as_f64().unwrap(),
        v["path"]
    );
    assert_eq!(v["files"], 1000);
    // What the open-file limit allows (ferry keeps 128 files for other uses and shares the
    // rest among up to 8 streams): on a host whose hard limit is low, that much.
    let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .unwrap_or(u64::MAX);
    let room = (hard.saturating_sub(128) / 8).clamp(32, 1000);
    let window = v["path"]["get_window"].as_u64().unwrap();
    assert!(window >= room, "a window of {window} GETs for 1,000 files");
    same_file(&tree.join("d7/f789"), &out.join("small/d7/f789"));
    let _ = std::fs::remove_dir_all(&out);
}

/// A tree of 25 directories (4 under the top, 5 under each of those), a small file in each,
/// at 50 ms: the walk lists the directories of one depth together, up to 12 at once (4
/// round trips of LISTs here; 6 when 6 went at once: 3.4–6.2 round trips more than the
/// flat copy were measured in debug builds at load 8–12 with 12), so it takes less than 12
/// round trips longer than a copy of the same files in
/// one directory; listing one directory at a time took 24 more (1.3–1.7 s more in a debug
/// build on the loaded 2-core host). Each copy's best of two runs counts.
#[test]
fn a_tree_is_listed_a_level_at_a_time() {
    let _g = serial();
    let Some(wan) = wan_or_skip(path(GBIT)) else {
        return;
    };
    let srv = serve_in_a(&wan);
    let (deep, flat) = (srv.root.join("deep"), srv.root.join("flat"));
    std::fs::create_dir_all(&flat).unwrap();
    for i in 0..4 {
        for j in 0..5 {
            let dir = deep.join(format!("a{i}/b{j}"));
            std::fs::create_dir_all(&dir).unwrap();
            let data = pattern(100, (i * 5 + j) as u8);
            std::fs::write(dir.join("f"), &data).unwrap();
            std::fs::write(flat.join(format!("f{i}{j}")), &data).unwrap();
        }
        std::fs::write(deep.join(format!("a{i}/f")), pattern(100, i as u8)).unwrap();
        std::fs::write(flat.join(format!("f{i}")), pattern(100, i as u8)).unwrap();
    }
    let best_of_two = |tree: &str| {
        (0..2)
            .map(|_| {
                let out = scratch("wan-walk");
                let v = ok(&run(cp_in_b(
                    &wan,
                    &["-r", &srv.url(tree), out.to_str().unwrap()],
                )));
                assert_eq!(v["files"], 24);
                let _ = std::fs::remove_dir_all(&out);
                v["seconds"].as_f64().unwrap()
            })
            .fold(f64::MAX, f64::min)
    };
    let (t_deep, t_flat) = (best_of_two("deep"), best_of_two("flat"));
    let extra = (t_deep - t_flat) / RTT.as_secs_f64();
    eprintln!("25 directories: {t_deep:.2} s, the same files in one: {t_flat:.2} s ({extra:.1} round trips more)");
    assert!(
        extra < 12.0,
        "the walk took {extra:.1} round trips more than one directory's"
    );
}

/// The link goes dead for 5 s in the middle of a download: `--retries` reconnects once it
/// is back and finishes the file byte for byte, fetching only what had not landed.
#[test]
fn a_cut_link_is_survived_by_retries() {
    let _g = serial();
    let Some(wan) = wan_or_skip(path(200_000_000)) else {
        return;
    };
    let srv = serve_in_a(&wan);
    // 96 MiB: about 4 s at 200 Mbit/s; the cut comes 2.5 s in, past the receiver's first
    // journal checkpoints (every 8 MiB or second).
    let size = 96 << 20;
    std::fs::write(srv.root.join("big"), pattern(size, 7)).unwrap();
    let out = scratch("wan-cut");
    let dst = out.join("big");
    let cp = cp_in_b(
        &wan,
        &[
            "--retries",
            "8",
            "--idle-timeout",
            "2",
            &srv.url("big"),
            dst.to_str().unwrap(),
        ],
    );
    let copy = std::thread::spawn(move || run(cp));
    std::thread::sleep(Duration::from_millis(2500));
    wan.set_cut(true);
    std::thread::sleep(Duration::from_secs(5));
    wan.set_cut(false);
    let v = ok(&copy.join().unwrap());
    same_file(&srv.root.join("big"), &dst);
    let (wire, resumed) = (
        v["wire_bytes"].as_u64().unwrap(),
        v["resumed_bytes"].as_u64().unwrap(),
    );
    eprintln!(
        "after a 5 s cut: {} reconnection(s), {resumed} bytes kept, {wire} bytes sent for {size}, in {:.1} s",
        v["retries"],
        v["seconds"].as_f64().unwrap()
    );
    assert!(v["retries"].as_u64().unwrap() >= 1, "{v}");
    assert!(resumed > 0, "nothing of the first attempt was kept: {v}");
    // The first attempt moved what it kept plus what arrived unjournaled; the second the
    // rest: what crossed twice is the excess over the file, at most what arrived after the
    // last checkpoint, far less than what was kept.
    let twice = wire.saturating_sub(size as u64);
    assert!(
        twice < resumed,
        "{wire} bytes crossed for {size}, {resumed} kept: completed ranges were sent again"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// 1 % of segments lost at random on a 50 ms path: the copy completes and says its rate.
#[test]
fn a_lossy_path_completes_and_reports_its_rate() {
    let _g = serial();
    let Some(wan) = wan_or_skip(Config {
        loss: 0.01,
        ..path(GBIT)
    }) else {
        return;
    };
    let srv = serve_in_a(&wan);
    let v = ok(&run(cp_in_b(&wan, &[&srv.at("mem/zero/64M"), "null:"])));
    assert_eq!(v["bytes"], 64 << 20);
    let bps = rate(&v);
    assert!(bps > 0.0 && v["gbps"].as_f64().unwrap() > 0.0, "{v}");
    eprintln!(
        "1 % loss at 50 ms: {:.0} Mbit/s ({} segments lost on the way)",
        bps / 1e6,
        wan.stats_a_to_b().random_drops.load(Ordering::Relaxed)
    );
}

/// The server sizes a connection's send ring to the path, as the client does its own: at
/// 50 ms its default 8 blocks of 4 MiB (about 1.3 Gbit/s for one stream, a block being busy
/// two round trips) grow to the bandwidth-delay product, on every connection from another
/// host (a download's and an upload's). Both sides take the path's round trip from TCP's
/// own measurement (`TCP_INFO`), which a busy host does not lengthen: the client reports it
/// (`path.tcp_rtt_ms`), and the server's estimate is the path's, not the time its client
/// took to send a first request (a PROTECT sent with the HELLO comes at once; the request
/// after it, once the client allocated its buffers).
#[test]
fn the_server_sizes_its_ring_to_the_path() {
    let _g = serial();
    let Some(wan) = wan_or_skip(path(GBIT)) else {
        return;
    };
    let log = scratch("wan-serve-log").join("serve.log");
    let mut srv = serve_in_a_logging(&wan, &log);
    let down = ok(&run(cp_in_b(&wan, &[&srv.at("mem/zero/16M"), "null:"])));
    assert_eq!(down["bytes"], 16 << 20);
    let up = ok(&run(cp_in_b(&wan, &["zero:16M", &srv.at("mem/null")])));
    assert_eq!(up["bytes"], 16 << 20);
    stop(&mut srv.child);
    let text = std::fs::read_to_string(&log).unwrap();
    let grown: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("send ring grown from 8 to"))
        .collect();
    assert!(
        grown.len() >= 2,
        "no ring grown in the server's log:\n{text}"
    );
    // The line adds 0.1–0.2 ms; TCP's samples are taken in the kernel as segments arrive.
    let near_the_path =
        |ms: f64| (RTT.as_secs_f64() * 1e3..RTT.as_secs_f64() * 1e3 + 5.0).contains(&ms);
    for line in grown {
        let ms: f64 = line
            .split("round trip ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no round trip in {line}"));
        assert!(
            near_the_path(ms),
            "the server took the path for {ms} ms: {line}"
        );
    }
    for v in [&down, &up] {
        let tcp = v["path"]["tcp_rtt_ms"].as_f64();
        assert!(
            tcp.is_some_and(near_the_path),
            "TCP's round trip: {}",
            v["path"]
        );
        let rtt = v["path"]["rtt_ms"].as_f64().unwrap();
        assert!(
            rtt <= tcp.unwrap(),
            "the least sample counts: {}",
            v["path"]
        );
    }
}
