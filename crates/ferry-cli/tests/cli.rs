//! The `ferry` binary end to end: help, version, `bench fabric --quick --json`,
//! `bench exs --quick --json` and `bench noncontig --quick --json`.

use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

fn ferry(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("ferry runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn version() {
    let o = ferry(&["--version"]);
    assert!(o.status.success());
    assert_eq!(
        stdout(&o).trim(),
        format!("ferry {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn help_explains_and_mentions_bench() {
    let top = stdout(&ferry(&["--help"]));
    assert!(top.contains("bench") && top.contains("RDMA"), "{top}");
    let fabric = stdout(&ferry(&["bench", "fabric", "--help"]));
    for flag in ["--quick", "--json", "--drivers", "--out"] {
        assert!(fabric.contains(flag), "{flag} missing from:\n{fabric}");
    }
    assert!(
        !fabric.contains("fabric-peer"),
        "the peer subcommand is hidden"
    );
    let bench = stdout(&ferry(&["bench", "--help"]));
    assert!(
        bench.contains("exs") && !bench.contains("exs-peer"),
        "{bench}"
    );
    let exs = stdout(&ferry(&["bench", "exs", "--help"]));
    for flag in ["--quick", "--json", "--drivers", "--out"] {
        assert!(exs.contains(flag), "{flag} missing from:\n{exs}");
    }
}

/// Completions and man pages come from the command definition: every command and its flags
/// are in them.
#[test]
fn completions_and_man_pages_cover_every_command() {
    let bash = stdout(&ferry(&["completions", "bash"]));
    for word in ["serve", "cp", "ls", "--token-file", "--streams"] {
        assert!(
            bash.contains(word),
            "{word} missing from the bash completions"
        );
    }
    assert!(stdout(&ferry(&["completions", "zsh"])).contains("#compdef ferry"));
    assert!(stdout(&ferry(&["completions", "fish"])).contains("complete -c ferry"));
    let dir = std::env::temp_dir().join(format!("ferry-man-{}", std::process::id()));
    let o = ferry(&["manpages", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for page in [
        "ferry",
        "ferry-serve",
        "ferry-cp",
        "ferry-token-new",
        "ferry-bench-cp",
    ] {
        let text = std::fs::read_to_string(dir.join(format!("{page}.1")))
            .unwrap_or_else(|e| panic!("{page}.1: {e}"));
        assert!(text.contains(".TH"), "{page}.1: {text}");
    }
    let cp = std::fs::read_to_string(dir.join("ferry-cp.1")).unwrap();
    assert!(cp.contains("streams"), "ferry-cp.1 documents its flags");
    assert!(
        cp.contains("ferry\\-cp \\-") && cp.contains("ferry cp"),
        "ferry-cp.1 names itself and the command as typed: {cp}"
    );
    assert!(
        !dir.join("ferry-manpages.1").exists(),
        "the hidden command has no page"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_driver_is_a_clear_error() {
    let o = ferry(&["bench", "fabric", "--quick", "--json", "--drivers", "udp"]);
    assert!(!o.status.success());
    assert!(o.stdout.is_empty(), "nothing on stdout on error");
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown driver \"udp\""));
}

/// One `ferry bench fabric --quick --json --drivers tcp` run shared by the tests below.
fn quick_tcp() -> &'static Value {
    static RUN: OnceLock<Value> = OnceLock::new();
    RUN.get_or_init(|| {
        let o = ferry(&["bench", "fabric", "--quick", "--json", "--drivers", "tcp"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "bench failed: {err}");
        // Exactly one JSON object and nothing else on stdout.
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("stdout is not one JSON: {e}"))
    })
}

#[test]
fn quick_json_has_the_bench_shape() {
    let v = quick_tcp();
    assert_eq!(v["bench"], "fabric");
    assert_eq!(v["quick"], true);
    assert!(v["machine"]["cores"].as_u64().is_some_and(|n| n >= 1));
    assert!(v["machine"]["kernel"].is_string());
    let rows = v["rows"].as_array().expect("rows is an array");
    assert!(!rows.is_empty());
    for r in rows {
        for k in ["driver", "op", "size", "gbps", "cpu_s", "error"] {
            assert!(r.get(k).is_some(), "row without {k}: {r}");
        }
    }
    for k in [
        "tcp_write_vs_iperf3",
        "tcp_read_vs_iperf3",
        "ofi_tcp_write_vs_iperf3",
        "shm_read_vs_memcpy",
        "iperf3_gbps",
        "memcpy_gbps",
        "tcp_latency_usec",
        "ofi_tcp_latency_usec",
        "ofi_shm_latency_usec",
    ] {
        assert!(v["summary"].get(k).is_some(), "summary without {k}");
    }
    // Drivers not asked for are null, never guessed.
    assert!(v["summary"]["ofi_tcp_write_vs_iperf3"].is_null());
    assert!(v["summary"]["memcpy_gbps"]
        .as_f64()
        .is_some_and(|g| g > 0.0));
}

/// Needs a working native tcp driver (crates/ferry-fabric/src/drivers/tcp): if the driver is
/// unavailable or fails, the bench reports it as failed and this test fails with that error
/// instead of passing on an empty table.
#[test]
fn quick_json_measures_the_tcp_driver() {
    let v = quick_tcp();
    let rows: Vec<&Value> = v["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["driver"] == "tcp")
        .collect();
    assert!(!rows.is_empty(), "no tcp rows");
    for r in &rows {
        assert!(
            r["error"].is_null(),
            "tcp driver not working yet: {}",
            r["error"]
        );
        let value = if r["op"] == "latency" {
            &r["usec"]
        } else {
            &r["gbps"]
        };
        assert!(value.as_f64().is_some_and(|x| x > 0.0), "no value in {r}");
    }
    for op in ["send", "write", "read", "latency"] {
        assert!(rows.iter().any(|r| r["op"] == op), "no tcp {op} row");
    }
    assert!(v["summary"]["tcp_latency_usec"].as_f64().is_some());
    if v["summary"]["iperf3_gbps"].is_number() {
        assert!(v["summary"]["tcp_write_vs_iperf3"].as_f64().is_some());
    }
}

/// `ferry bench exs --quick --json --drivers tcp` (a few seconds): the bench shape, every
/// summary key the issue names with a finite number for the native tcp driver, and a target
/// verdict for each ratio.
#[test]
fn exs_quick_json_has_the_summary_keys() {
    let o = ferry(&["bench", "exs", "--quick", "--json", "--drivers", "tcp"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "bench failed: {err}");
    let v: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("stdout is not one JSON: {e}"));
    assert_eq!(v["bench"], "exs");
    assert_eq!(v["quick"], true);
    assert!(v["machine"]["cores"].as_u64().is_some_and(|n| n >= 1));
    for k in [
        "immediate_vs_normal_latency",
        "immediate_vs_normal_latency_tcp",
        "persistent_vs_normal_latency",
        "persistent_vs_normal_latency_tcp",
        "large_vs_fabric",
        "large_vs_fabric_tcp",
        "tcp_exs_vs_socket",
        "socket_gbps",
        // The C-API ping-pong (tests/c/latency.c built against libferry at run time) and
        // the polling one, each paired with the blocking Rust ping-pong round by round.
        "capi_vs_rust_latency",
        "capi_vs_rust_latency_tcp",
        "poll_vs_block_latency",
        "poll_vs_block_latency_tcp",
    ] {
        let x = v["summary"][k].as_f64();
        assert!(
            x.is_some_and(|x| x.is_finite() && x > 0.0),
            "summary {k} = {}",
            v["summary"][k]
        );
    }
    // Drivers not asked for are null, never guessed.
    assert!(v["summary"]["large_vs_fabric_ofi_shm"].is_null());
    assert!(v["summary"]["capi_vs_rust_latency_ofi_shm"].is_null());
    assert!(v["summary"]["poll_vs_block_latency_ofi_tcp"].is_null());
    let rows = v["rows"].as_array().expect("rows is an array");
    for r in rows {
        assert!(r["error"].is_null(), "failed row: {r}");
    }
    for mode in [
        "normal",
        "immediate",
        "persistent",
        "rust",
        "poll",
        "capi",
        "capi-poll",
        "fabric-read",
        "blast",
    ] {
        assert!(rows.iter().any(|r| r["mode"] == mode), "no {mode} row");
    }
    let targets = v["targets"].as_array().expect("targets");
    assert!(targets
        .iter()
        .any(|t| t["metric"] == "tcp_exs_vs_socket" && t["pass"].is_boolean()));
}

/// `ferry bench noncontig --quick --json` on tcp and ofi+shm (a few seconds): the bench
/// shape, the four summary keys the issue names as finite ratios, a row per driver, method
/// and size, and verdicts for the two shm targets.
#[test]
fn noncontig_quick_json_has_the_summary_keys() {
    let help = stdout(&ferry(&["bench", "noncontig", "--help"]));
    for flag in ["--quick", "--json", "--drivers", "--out"] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    let o = ferry(&[
        "bench",
        "noncontig",
        "--quick",
        "--json",
        "--drivers",
        "tcp,ofi+shm",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "bench failed: {err}");
    let v: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("stdout is not one JSON: {e}"));
    assert_eq!(v["bench"], "noncontig");
    assert_eq!(v["quick"], true);
    let summary = v["summary"].as_object().expect("summary");
    let keys = [
        "zerocopy_vs_pack_shm_4m",
        "zerocopy_vs_contig_shm_16m",
        "zerocopy_vs_pack_tcp_4m",
        "zerocopy_vs_contig_tcp_16m",
    ];
    assert_eq!(
        summary.len(),
        keys.len(),
        "exactly the issue's keys: {summary:?}"
    );
    for k in keys {
        let x = summary[k].as_f64();
        assert!(
            x.is_some_and(|x| x.is_finite() && x > 0.0),
            "summary {k} = {}",
            summary[k]
        );
    }
    let rows = v["rows"].as_array().expect("rows is an array");
    for r in rows {
        assert!(r["error"].is_null(), "failed row: {r}");
    }
    for d in ["tcp", "ofi+shm"] {
        for op in ["contig", "pack", "zerocopy"] {
            assert!(
                rows.iter()
                    .any(|r| r["driver"] == d && r["op"] == op && r["size"] == 4 << 20),
                "no {d} {op} row at 4 MiB"
            );
        }
    }
    // The engine's zero-copy path posts one write per destination segment.
    let zc = rows
        .iter()
        .find(|r| r["op"] == "zerocopy" && r["size"] == 4 << 20)
        .expect("zerocopy row");
    assert_eq!(zc["ops_per_message"], 16);
    let targets = v["targets"].as_array().expect("targets");
    for k in &keys[..2] {
        assert!(targets
            .iter()
            .any(|t| t["metric"] == *k && t["pass"].is_boolean()));
    }
}
