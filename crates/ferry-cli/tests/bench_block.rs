//! `ferry bench block --quick --json` end to end (about a minute): one JSON object with a
//! row per server, export and fio job, ferry's rows measured on both transports and both
//! backends, the application rows (ext4 on the export: untar, postmark, fileop), the block
//! aggregation rows (4 KiB writes through the attach, merged and not), the
//! summary keys the issue names (numbers, or null when a peer is missing), and each
//! target with a verdict.

use std::process::Command;

use serde_json::Value;

#[test]
fn quick_json_run() {
    // The bench's servers have identities of their own, so its clients must leave the
    // user's known-hosts file alone: a pin left there would refuse the next server to take
    // the same port.
    let known_hosts = std::env::temp_dir().join(format!(
        "ferry-bench-block-known-hosts-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&known_hosts);
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["bench", "block", "--quick", "--json"])
        .env("RUST_LOG", "warn")
        .env("FERRY_KNOWN_HOSTS", &known_hosts)
        .output()
        .expect("ferry runs");
    let pinned = std::fs::read_to_string(&known_hosts).unwrap_or_default();
    let _ = std::fs::remove_file(&known_hosts);
    assert_eq!(pinned, "", "bench block wrote to the known-hosts file");
    assert!(
        out.status.success(),
        "bench block failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {text}"));
    assert_eq!(v["bench"], "block");
    assert_eq!(v["quick"], true);
    let rows = v["rows"].as_array().expect("rows");
    let jobs = [
        ("seqwrite", 16),
        ("seqread", 16),
        ("randwrite", 1),
        ("randread", 1),
        ("randwrite", 32),
        ("randread", 32),
    ];
    for transport in ["tcp", "unix"] {
        for backend in ["memory", "file"] {
            for (w, qd) in jobs {
                let r = rows
                    .iter()
                    .find(|r| {
                        r["server"] == "ferry"
                            && r["transport"] == transport
                            && r["backend"] == backend
                            && r["workload"] == w
                            && r["qd"] == qd
                    })
                    .unwrap_or_else(|| panic!("no ferry {backend} {transport} {w} qd{qd} row"));
                assert!(r["iops"].as_f64().is_some_and(|x| x > 0.0), "{r}");
                assert!(r["lat_p99_us"].as_f64().is_some_and(|x| x > 0.0), "{r}");
                assert!(r["server_cpu_s"].as_f64().is_some(), "{r}");
            }
        }
    }
    // Every peer has its rows: measured, or with the reason it is missing.
    for (server, backend, transport) in [
        ("nbdkit", "memory", "tcp"),
        ("nbdkit", "memory", "unix"),
        ("nbdkit", "file", "tcp"),
        ("qemu-nbd", "file", "tcp"),
    ] {
        let n = rows
            .iter()
            .filter(|r| {
                r["server"] == server
                    && r["path"] == "nbd"
                    && r["backend"] == backend
                    && r["transport"] == transport
            })
            .inspect(|r| assert!(r["iops"].is_number() || r["error"].is_string(), "{r}"))
            .count();
        assert_eq!(n, jobs.len(), "{server} {backend} {transport} rows");
    }
    // The application rows (ext4 on the export): measured, or why FUSE cannot run here.
    for server in ["ferry", "nbdkit"] {
        for app in ["untar", "postmark", "fileop"] {
            let r = rows
                .iter()
                .find(|r| r["server"] == server && r["path"] == "ext4" && r["workload"] == app)
                .unwrap_or_else(|| panic!("no {server} {app} row"));
            assert!(
                r["iops"].as_f64().is_some_and(|x| x > 0.0) || r["error"].is_string(),
                "{r}"
            );
        }
    }
    // Block aggregation: fio's 4 KiB sequential writes through the attach, merged and not.
    for transport in ["tcp", "ofi+shm"] {
        for path in ["zcopy", "zcopy-nomerge"] {
            let r = rows
                .iter()
                .find(|r| {
                    r["server"] == "ferry attach"
                        && r["path"] == path
                        && r["transport"] == transport
                        && r["bs"] == 4096
                })
                .unwrap_or_else(|| panic!("no attach {path} {transport} 4 KiB row"));
            assert!(r["gbps"].as_f64().is_some_and(|x| x > 0.0), "{r}");
        }
    }
    let summary = &v["summary"];
    for k in ["merge_gain_seqwrite_4k_shm", "merge_gain_seqwrite_4k_tcp"] {
        assert!(summary[k].is_number(), "summary {k} = {}", summary[k]);
    }
    for k in [
        "nbd_seq_write_vs_nbdkit",
        "nbd_seq_read_vs_nbdkit",
        "nbd_randread_qd1_iops_vs_nbdkit",
        "nbd_randread_qd32_iops_vs_nbdkit",
        "nbd_randread_qd1_lat_mean_vs_nbdkit",
        "nbd_randread_qd1_lat_p99_vs_nbdkit",
        "zcopy_vs_bcopy_write_1m",
        "zcopy_vs_nbdtcp_write_1m",
        "untar_vs_nbdkit",
        "postmark_vs_nbdkit",
        "fileop_vs_nbdkit",
    ] {
        let x = &summary[k];
        assert!(x.is_number() || x.is_null(), "summary {k} = {x}");
    }
    let targets = v["targets"].as_array().expect("targets");
    // The six NBD goals, untar, and the fabric path's two.
    assert_eq!(targets.len(), 9, "{targets:?}");
    for t in targets {
        assert!(t["pass"].is_boolean() || t["pass"].is_null(), "{t}");
    }
}
