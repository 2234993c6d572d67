//! `ferry bench wan --quick --json` on a tiny subset (memory to memory at one round trip,
//! one file buffer, the tcp driver: about 20 s): one JSON object with ferry's, GridFTP's
//! and iperf3's rows across the emulated path, the summary keys issue 21 names (numbers,
//! or null when their rows did not run), each target with a verdict, and the CSV and PNG
//! written with --out. Skips without root (the emulator needs network namespaces).

mod common;

use std::process::Command;

use serde_json::Value;

#[test]
fn quick_json_run_on_the_emulator() {
    if let Err(e) = ferry_wan::supported() {
        eprintln!("skipping: {e}");
        return;
    }
    let out_dir = common::scratch("bench-wan");
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["bench", "wan", "--quick", "--json", "--only", "mem"])
        .args([
            "--rtts",
            "10",
            "--buffers",
            "4",
            "--drivers",
            "tcp",
            "--size",
            "256M",
            "--out",
        ])
        .arg(&out_dir)
        .env("RUST_LOG", "warn")
        .output()
        .expect("ferry runs");
    assert!(
        out.status.success(),
        "bench wan failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {text}"));
    assert_eq!(v["bench"], "wan");
    assert_eq!(v["quick"], true);
    assert_eq!(v["rate_bps"].as_u64(), Some(2_000_000_000));
    let rows = v["rows"].as_array().expect("rows");
    let row = |tool: &str, variant: &str| {
        rows.iter()
            .find(|r| r["tool"] == tool && r["variant"] == variant)
            .unwrap_or_else(|| panic!("no {tool} {variant} row: {v}"))
    };
    // ferry without flags measured, with what it chose from the path.
    let ferry = row("ferry", "tcp");
    assert_eq!(ferry["workload"], "mem");
    assert_eq!(ferry["rtt_ms"], 10);
    assert!(ferry["gbit_s"].as_f64().is_some_and(|g| g > 0.0), "{ferry}");
    assert!(ferry["link_share"].as_f64().is_some(), "{ferry}");
    // The rate reached on the line: some, and no more than the bottleneck passes.
    let reached = ferry["reached_gbit_s"].as_f64().expect("reached_gbit_s");
    assert!(reached > 0.0 && reached <= 2.1, "{ferry}");
    assert!(ferry["streams"].as_u64().is_some_and(|s| s >= 1), "{ferry}");
    assert!(ferry["staging"].as_u64().is_some(), "{ferry}");
    // The reference of checksum_cost_line: the client checking nothing.
    let unchecked = row("ferry", "tcp no-checksums");
    assert!(
        unchecked["gbit_s"].as_f64().is_some_and(|g| g > 0.0),
        "{unchecked}"
    );
    let buffered = row("ferry", "tcp --buffer 4M");
    assert_eq!(buffered["buffer"].as_u64(), Some(4 << 20), "{buffered}");
    assert_eq!(buffered["staging"].as_u64(), Some(4 << 20), "{buffered}");
    for (tool, variant) in [
        ("gridftp", "-p 1"),
        ("gridftp", "-p 4"),
        ("gridftp", "-p 4 -tcp-bs 4M"),
        ("iperf3", "-P 1"),
        ("iperf3", "-P 4"),
    ] {
        let r = row(tool, variant);
        assert!(
            r["gbit_s"].as_f64().is_some() || r["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{r}"
        );
    }
    // iperf3 is a long-standing dependency: its rows must be measured.
    assert!(row("iperf3", "-P 1")["gbit_s"].as_f64().is_some());
    let s = &v["summary"];
    let goals = [
        "wan_mem_vs_link_50ms",
        "wan_mem_vs_gridftp_50ms",
        "wan_mem_vs_gridftp_100ms",
        "staging_gain_disk_50ms",
        "ccsm_vs_gridftp",
        "viz_vs_gridftp",
        "smallfiles_vs_gridftp_50ms",
    ];
    for k in goals {
        assert!(s[k].is_number() || s[k].is_null(), "{k}: {s}");
    }
    assert!(s["checksum_cost_line"].is_number(), "{s}");
    for k in [
        "wan_mem_reached_vs_link_50ms",
        "wan_mem_reached_iperf3_vs_link_50ms",
    ] {
        assert!(s.get(k).is_some(), "{k}: {s}");
    }
    let metrics: Vec<&str> = v["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .filter_map(|t| t["metric"].as_str())
        .collect();
    assert_eq!(metrics, goals, "{v}");
    let csv = std::fs::read_to_string(out_dir.join("wan.csv")).expect("wan.csv written");
    assert!(csv.starts_with("workload,rtt_ms,tool,variant,"), "{csv}");
    assert_eq!(csv.lines().count(), rows.len() + 1);
    assert!(out_dir.join("wan.json").exists());
    assert!(out_dir.join("wan.png").exists() || !std::path::Path::new(FONT).exists());
}

/// The font the plots need (without it no PNG is drawn).
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
