//! `ferry bench cp --quick --json` end to end (about 30 s): one JSON object with a row per
//! tool and workload, ferry's memory-to-memory, small-file and start-up rows measured on
//! every driver, the summary keys the issue names (numbers, or null with the reason in a
//! row when a peer is missing), and each target with a verdict.

use std::process::Command;

use serde_json::Value;

#[test]
fn quick_json_run() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["bench", "cp", "--quick", "--json"])
        .env("RUST_LOG", "warn")
        .output()
        .expect("ferry runs");
    assert!(
        out.status.success(),
        "bench cp failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {text}"));
    assert_eq!(v["bench"], "cp");
    assert_eq!(v["quick"], true);
    let rows = v["rows"].as_array().expect("rows");
    for d in ["tcp", "ofi+tcp", "ofi+shm"] {
        let mem = rows
            .iter()
            .find(|r| r["workload"] == "mem" && r["tool"] == "ferry" && r["variant"] == d)
            .unwrap_or_else(|| panic!("no ferry mem row for {d}"));
        assert!(mem["gbps"].as_f64().is_some_and(|g| g > 0.0), "{mem}");
        assert!(mem["server_cpu_s"].as_f64().is_some(), "{mem}");
        assert_eq!(mem["bytes"].as_u64(), Some(256 << 20));
        let small = rows
            .iter()
            .find(|r| r["workload"] == "small" && r["tool"] == "ferry" && r["variant"] == d)
            .unwrap_or_else(|| panic!("no ferry small-files row for {d}"));
        assert!(
            small["files_per_s"].as_f64().is_some_and(|f| f > 0.0),
            "{small}"
        );
        let start = rows
            .iter()
            .find(|r| r["workload"] == "start" && r["tool"] == "ferry" && r["variant"] == d)
            .unwrap_or_else(|| panic!("no ferry start row for {d}"));
        assert!(start["secs"].as_f64().is_some_and(|s| s > 0.0), "{start}");
    }
    // Every peer row either measured or says why not.
    for r in rows {
        assert!(
            r["gbps"].as_f64().is_some() || r["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{r}"
        );
    }
    let s = &v["summary"];
    for k in [
        "mem_vs_gridftp",
        "mem_vs_iperf3",
        "disk_vs_gridftp",
        "smallfiles_vs_gridftp",
        "cpu_vs_gridftp",
    ] {
        assert!(s[k].is_number() || s[k].is_null(), "{k}: {s}");
        if s[k].is_number() {
            assert!(
                v["best"][k]
                    .as_str()
                    .is_some_and(|b| b.starts_with("ferry ")),
                "{v}"
            );
        }
    }
    // ferry's private rows are measured on the memory and shm workloads, and OpenSSH's
    // rows either measured or say why not (sshd absent).
    for w in ["mem", "shm"] {
        let p = rows
            .iter()
            .find(|r| r["workload"] == w && r["tool"] == "ferry" && r["variant"] == "tcp private")
            .unwrap_or_else(|| panic!("no ferry private {w} row"));
        assert!(p["gbps"].as_f64().is_some_and(|g| g > 0.0), "{p}");
    }
    for tool in ["scp", "rsync"] {
        assert!(rows.iter().any(|r| r["tool"] == tool), "no {tool} row");
    }
    assert!(
        s["private_vs_clear_mem"].as_f64().is_some_and(|x| x > 0.0),
        "{s}"
    );
    // iperf3 is a long-standing dependency: that ratio must be there.
    assert!(s["mem_vs_iperf3"].as_f64().is_some_and(|x| x > 0.0), "{s}");
    let targets = v["targets"].as_array().expect("targets");
    // A verdict for every goal the issues set (issue 20 added shm, checksum and CPU, issue 16
    // the integrity and private ratios, issue 20 the default-disk ratios).
    let metrics: Vec<&str> = targets
        .iter()
        .filter_map(|t| t["metric"].as_str())
        .collect();
    assert_eq!(
        metrics,
        [
            "mem_vs_gridftp",
            "mem_vs_iperf3",
            "disk_vs_gridftp",
            "smallfiles_vs_gridftp",
            "cpu_vs_gridftp",
            "shm_vs_gridftp",
            "checksum_cost",
            "cpu_vs_gridftp_shm",
            "integrity_vs_clear_mem",
            "private_vs_clear_mem",
            "private_vs_scp",
            "disk_default_vs_gridftp",
            "disk_default_vs_device"
        ],
        "{v}"
    );
    assert!(targets.iter().all(|t| t["target"].is_number()));
}
