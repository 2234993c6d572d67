//! `ferry bench cp`'s rows, summary (with the best ferry driver named per ratio), targets,
//! table and CSV.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::costs::CheckRates;
use crate::exs::ExsSummary as Summary;
use crate::report::{human_size, num, round, summary_text, Report, Target};

/// One tool on one workload: medians over the repetitions, or an error.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct CpRow {
    /// `mem` (ferry: zero source → null sink), `shm` (a file in /dev/shm → /dev/null),
    /// `disk` (a file on disk → a file on disk, caches dropped first), `small` (a tree of
    /// small files in /dev/shm → /dev/shm), `start` (a one-byte file → /dev/null: the cost
    /// of a copy before any data moves).
    pub workload: String,
    /// `ferry`, `gridftp`, `xrdcp`, `iperf3`, `scp`, `rsync`, or `fio` (the disk alone:
    /// `read`, `write`).
    pub tool: String,
    /// ferry's driver with what differs from the default run ([`DIRECT`], [`STREAMS`],
    /// [`NO_CACHE`], [`NO_CHECKSUMS`]), or the peer's variant (`-p 1`, `-p 4`).
    pub variant: String,
    /// Bytes per transfer.
    pub bytes: u64,
    /// Files per transfer.
    pub files: u64,
    /// Bytes per second, GB/s (10^9 B/s), wall time of the client.
    pub gbps: Option<f64>,
    /// Files per second (small files).
    pub files_per_s: Option<f64>,
    /// Seconds per transfer, wall time of the client (what the `start` workload reports).
    pub secs: Option<f64>,
    /// User+system CPU seconds of the client process.
    pub client_cpu_s: Option<f64>,
    /// User+system CPU seconds of the server meanwhile.
    pub server_cpu_s: Option<f64>,
    /// Both sides.
    pub cpu_s: Option<f64>,
    /// Repetitions behind the medians.
    pub reps: usize,
    /// Why there is no value (a peer not installed, a failure).
    pub error: Option<String>,
}

/// The variant suffix of ferry rows with direct I/O on both sides.
pub const DIRECT: &str = " --direct";
/// The variant suffix of ferry rows over four parallel streams.
pub const STREAMS: &str = " -p 4";
/// The variant suffix of ferry rows whose server keeps no checksum cache (every run hashes
/// the file: what the first run of an unchanged file costs).
pub const NO_CACHE: &str = " no-cache";
/// The variant suffix of ferry rows with checksums turned off on both sides (the test
/// switch `FERRY_TEST_NO_CHECKSUMS=1`): the reference of `checksum_cost`, never a result.
pub const NO_CHECKSUMS: &str = " no-checksums";

/// The variant suffix of ferry rows at data protection `clear` (`ferry cp --protect
/// clear`, blocks with a CRC-32C): the reference of `integrity_vs_clear_*`, never a result
/// (every other row runs at the default, `integrity`).
pub const CLEAR: &str = " clear";

/// The variant suffix of ferry rows at data protection `private` (`ferry cp --protect
/// private`, blocks encrypted with AES-256-GCM): held against [`CLEAR`] rows
/// (`private_vs_clear_*`) and OpenSSH (`private_vs_scp`), and in no other ratio.
pub const PRIVATE: &str = " private";

/// The driver of a ferry row's variant (`tcp --direct` and `tcp -p 4` are tcp).
fn driver_of(variant: &str) -> &str {
    [DIRECT, STREAMS, NO_CACHE, NO_CHECKSUMS, CLEAR, PRIVATE]
        .iter()
        .fold(variant, |v, s| v.strip_suffix(s).unwrap_or(v))
}

impl CpRow {
    /// `ferry (tcp)`, `gridftp -p 4`, `iperf3`.
    pub fn label(&self) -> String {
        match (self.tool.as_str(), self.variant.as_str()) {
            (t, "") => t.to_string(),
            ("ferry", v) => format!("ferry {v}"),
            (t, v) => format!("{t} {v}"),
        }
    }
}

/// The report's JSON: the common envelope plus which ferry driver (and which peer variant)
/// each summary ratio used.
#[derive(Debug, Clone, Serialize)]
pub struct CpReport {
    /// The common envelope (bench, quick, machine, drivers, rows, summary, targets).
    #[serde(flatten)]
    pub report: Report<CpRow, Summary>,
    /// Per summary ratio: `"ferry <driver> vs <peer variant>"`.
    pub best: BTreeMap<String, String>,
    /// Notes on the run (caches not dropped, peers missing).
    pub notes: Vec<String>,
    /// One core's rates of each protection level's per-block work (runs with the `mem`
    /// or `shm` workload).
    pub check_rates: Option<CheckRates>,
}

/// The goals: (summary key, op, bound).
pub const GOALS: [(&str, &str, f64); 13] = [
    ("mem_vs_gridftp", ">=", 1.35),
    ("mem_vs_iperf3", ">=", 1.0),
    ("disk_vs_gridftp", ">=", 1.25),
    ("smallfiles_vs_gridftp", ">=", 2.0),
    ("cpu_vs_gridftp", ">=", 2.0),
    ("shm_vs_gridftp", ">=", 1.5),
    ("checksum_cost", "<=", 0.05),
    ("cpu_vs_gridftp_shm", ">=", 2.0),
    ("integrity_vs_clear_mem", ">=", 0.95),
    ("private_vs_clear_mem", ">=", 0.8),
    ("private_vs_scp", ">=", 2.0),
    ("disk_default_vs_gridftp", ">=", 1.2),
    ("disk_default_vs_device", ">=", 0.85),
];

/// How a ratio picks its sides.
#[derive(Clone, Copy)]
enum Better {
    /// Higher is better (throughput).
    High,
    /// Lower is better (CPU seconds).
    Low,
}

/// ferry's best row against the peer's best row of `(workload, tool)`: ratio and names.
fn best_ratio(
    rows: &[CpRow],
    driver: Option<&str>,
    ferry_workload: &str,
    peer: (&str, &str),
    value: impl Fn(&CpRow) -> Option<f64>,
    better: Better,
) -> Option<(f64, String)> {
    let pick = |it: &mut dyn Iterator<Item = &CpRow>| -> Option<(f64, String)> {
        let mut best: Option<(f64, String)> = None;
        for r in it {
            let Some(v) = value(r).filter(|v| *v > 0.0) else {
                continue;
            };
            let wins = match (&best, better) {
                (None, _) => true,
                (Some((b, _)), Better::High) => v > *b,
                (Some((b, _)), Better::Low) => v < *b,
            };
            if wins {
                best = Some((v, r.label()));
            }
        }
        best
    };
    let (f, fname) = pick(
        &mut rows
            .iter()
            .filter(|r| r.tool == "ferry" && r.workload == ferry_workload)
            .filter(|r| {
                ![NO_CHECKSUMS, CLEAR, PRIVATE]
                    .iter()
                    .any(|s| r.variant.ends_with(s))
            })
            .filter(|r| driver.is_none_or(|d| driver_of(&r.variant) == d)),
    )?;
    let (p, pname) = pick(
        &mut rows
            .iter()
            .filter(|r| r.workload == peer.0 && r.tool == peer.1),
    )?;
    let ratio = match better {
        Better::High => f / p,
        Better::Low => p / f,
    };
    ratio
        .is_finite()
        .then(|| (round(ratio, 3), format!("{fname} vs {pname}")))
}

/// The summary and which sides each ratio used. Rule: ferry's best driver against the
/// peer's best variant, per ratio.
pub fn summary(rows: &[CpRow]) -> (Summary, BTreeMap<String, String>) {
    let gbps = |r: &CpRow| r.gbps;
    let fps = |r: &CpRow| r.files_per_s;
    let cpu = |r: &CpRow| r.cpu_s;
    type Pick<'a> = (
        &'a str,
        &'a str,
        (&'a str, &'a str),
        &'a dyn Fn(&CpRow) -> Option<f64>,
        Better,
    );
    let picks: [Pick<'_>; 11] = [
        (
            "mem_vs_gridftp",
            "mem",
            ("shm", "gridftp"),
            &gbps,
            Better::High,
        ),
        (
            "mem_vs_iperf3",
            "mem",
            ("mem", "iperf3"),
            &gbps,
            Better::High,
        ),
        (
            "disk_vs_gridftp",
            "disk",
            ("disk", "gridftp"),
            &gbps,
            Better::High,
        ),
        (
            "smallfiles_vs_gridftp",
            "small",
            ("small", "gridftp"),
            &fps,
            Better::High,
        ),
        (
            "cpu_vs_gridftp",
            "mem",
            ("shm", "gridftp"),
            &cpu,
            Better::Low,
        ),
        (
            "shm_vs_gridftp",
            "shm",
            ("shm", "gridftp"),
            &gbps,
            Better::High,
        ),
        ("shm_vs_xrdcp", "shm", ("shm", "xrdcp"), &gbps, Better::High),
        (
            "disk_vs_xrdcp",
            "disk",
            ("disk", "xrdcp"),
            &gbps,
            Better::High,
        ),
        (
            "smallfiles_vs_xrdcp",
            "small",
            ("small", "xrdcp"),
            &fps,
            Better::High,
        ),
        ("cpu_vs_xrdcp", "mem", ("shm", "xrdcp"), &cpu, Better::Low),
        (
            "cpu_vs_gridftp_shm",
            "shm",
            ("shm", "gridftp"),
            &cpu,
            Better::Low,
        ),
    ];
    let mut out = Vec::new();
    let mut best = BTreeMap::new();
    for (key, fw, peer, value, better) in picks {
        let r = best_ratio(rows, None, fw, peer, value, better);
        if let Some((_, names)) = &r {
            best.insert(key.to_string(), names.clone());
        }
        out.push((key.to_string(), r.map(|x| x.0)));
    }
    // Against the disk itself, with ferry's best disk row, then as a user without flags
    // gets it (no --direct): the rows of real files a user copies by default.
    let defaults: Vec<CpRow> = rows
        .iter()
        .filter(|r| !(r.tool == "ferry" && r.variant.ends_with(DIRECT)))
        .cloned()
        .collect();
    for (key, rows) in [
        ("disk_vs_device", rows),
        ("disk_default_vs_device", &defaults),
    ] {
        let r = vs_device(rows);
        if let Some((_, names)) = &r {
            best.insert(key.into(), names.clone());
        }
        out.push((key.into(), r.map(|x| x.0)));
    }
    let r = best_ratio(
        &defaults,
        None,
        "disk",
        ("disk", "gridftp"),
        gbps,
        Better::High,
    );
    if let Some((_, names)) = &r {
        best.insert("disk_default_vs_gridftp".into(), names.clone());
    }
    out.push(("disk_default_vs_gridftp".into(), r.map(|x| x.0)));
    for (key, with) in [("checksum_cost", NO_CACHE), ("checksum_cost_cached", "")] {
        let cost = checksum_cost(rows, with);
        if let Some((_, names)) = &cost {
            best.insert(key.into(), names.clone());
        }
        out.push((key.into(), cost.map(|c| c.0)));
    }
    for (level, with) in [("integrity", ""), ("private", PRIVATE)] {
        for w in ["mem", "shm"] {
            let key = format!("{level}_vs_clear_{w}");
            let r = level_vs_clear(rows, w, with);
            if let Some((_, names)) = &r {
                best.insert(key.clone(), names.clone());
            }
            out.push((key, r.map(|x| x.0)));
        }
    }
    let r = private_vs_scp(rows);
    if let Some((_, names)) = &r {
        best.insert("private_vs_scp".into(), names.clone());
    }
    out.push(("private_vs_scp".into(), r.map(|x| x.0)));
    // The same ratios with ferry on its native tcp driver alone (ofi+shm is a shared-memory
    // transport: it wins on one host but says nothing about a network).
    for (key, fw, peer, value, better) in &picks[..5] {
        let r = best_ratio(rows, Some("tcp"), fw, *peer, value, *better);
        let key = format!("{key}_tcp");
        if let Some((_, names)) = &r {
            best.insert(key.clone(), names.clone());
        }
        out.push((key, r.map(|x| x.0)));
    }
    (Summary(out), best)
}

/// ferry's best `disk` row in `rows` against the disk itself: the slower of fio reading
/// alone and fio writing alone bounds any copy on this disk, so this is the fraction of
/// that bound ferry reaches.
fn vs_device(rows: &[CpRow]) -> Option<(f64, String)> {
    let device = rows
        .iter()
        .filter(|r| r.workload == "disk" && r.tool == "fio")
        .map(|r| r.gbps)
        .collect::<Option<Vec<f64>>>()
        .filter(|v| v.len() == 2)
        .and_then(|v| v.into_iter().reduce(f64::min))
        .filter(|d| *d > 0.0)?;
    let (f, name) = rows
        .iter()
        .filter(|r| r.workload == "disk" && r.tool == "ferry")
        .filter_map(|r| r.gbps.map(|g| (g, r.label())))
        .max_by(|a, b| a.0.total_cmp(&b.0))?;
    Some((
        round(f / device, 3),
        format!("{name} vs min(fio read, fio write)"),
    ))
}

/// The cost of integrity on the `shm` workload: `1 − with ÷ without` (GB/s) for the driver
/// whose row of variant suffix `with` (`NO_CACHE`: the first run of a file, hashed; `""`:
/// later runs may take the hash from the cache) is fastest, against its
/// [`NO_CHECKSUMS`] row.
fn checksum_cost(rows: &[CpRow], with: &str) -> Option<(f64, String)> {
    let shm_row = |variant: String| {
        rows.iter().find(|r| {
            r.workload == "shm"
                && r.tool == "ferry"
                && r.variant == variant
                && r.gbps.is_some_and(|g| g > 0.0)
        })
    };
    let drivers: std::collections::BTreeSet<&str> = rows
        .iter()
        .filter(|r| r.workload == "shm" && r.tool == "ferry")
        .map(|r| driver_of(&r.variant))
        .collect();
    let gbps = |r: &CpRow| r.gbps.unwrap_or(0.0);
    let (on, off) = drivers
        .into_iter()
        .filter_map(|d| {
            let on = shm_row(format!("{d}{with}"))?;
            Some((on, shm_row(format!("{d}{NO_CHECKSUMS}"))?))
        })
        .max_by(|a, b| gbps(a.0).total_cmp(&gbps(b.0)))?;
    let cost = 1.0 - gbps(on) / gbps(off);
    Some((round(cost, 3), format!("{} vs {}", on.label(), off.label())))
}

/// What a data protection level keeps of `clear`'s throughput on `workload`: GB/s of the
/// driver's row of variant suffix `with` (`""`: the default, `integrity`; [`PRIVATE`]) ÷
/// its [`CLEAR`] row, for the driver whose row at the level is fastest.
fn level_vs_clear(rows: &[CpRow], workload: &str, with: &str) -> Option<(f64, String)> {
    let row = |variant: &str| {
        rows.iter().find(|r| {
            r.workload == workload
                && r.tool == "ferry"
                && r.variant == variant
                && r.gbps.is_some_and(|g| g > 0.0)
        })
    };
    let gbps = |r: &CpRow| r.gbps.unwrap_or(0.0);
    let (on, off) = rows
        .iter()
        .filter(|r| r.workload == workload && r.tool == "ferry")
        .filter_map(|r| r.variant.strip_suffix(CLEAR))
        .filter_map(|d| Some((row(&format!("{d}{with}"))?, row(&format!("{d}{CLEAR}"))?)))
        .max_by(|a, b| gbps(a.0).total_cmp(&gbps(b.0)))?;
    let ratio = gbps(on) / gbps(off);
    Some((
        round(ratio, 3),
        format!("{} vs {}", on.label(), off.label()),
    ))
}

/// ferry encrypting (its fastest [`PRIVATE`] row on `shm`) against OpenSSH's fastest
/// encrypted copy of the same file (`scp` or `rsync -e ssh`), GB/s.
fn private_vs_scp(rows: &[CpRow]) -> Option<(f64, String)> {
    let fastest = |pick: &dyn Fn(&CpRow) -> bool| {
        rows.iter()
            .filter(|r| r.workload == "shm" && pick(r))
            .filter_map(|r| Some((r.gbps.filter(|g| *g > 0.0)?, r.label())))
            .max_by(|a, b| a.0.total_cmp(&b.0))
    };
    let (f, fname) = fastest(&|r| r.tool == "ferry" && r.variant.ends_with(PRIVATE))?;
    let (p, pname) = fastest(&|r| r.tool == "scp" || r.tool == "rsync")?;
    Some((round(f / p, 3), format!("{fname} vs {pname}")))
}

/// Each goal checked.
pub fn targets(s: &Summary) -> Vec<Target> {
    GOALS
        .iter()
        .map(|(k, op, t)| Target::check(k, op, *t, s.get(k)))
        .collect()
}

impl CpReport {
    /// The human-readable table.
    pub fn table(&self) -> String {
        let rep = &self.report;
        let m = &rep.machine;
        let mut s = String::new();
        let reps = rep.rows.iter().map(|r| r.reps).max().unwrap_or(0);
        let _ = writeln!(
            s,
            "ferry bench cp{}: loopback, {} cores, Linux {}, load {}; median of {reps}; \
             client wall time, CPU = user+sys of client and server",
            if rep.quick { " --quick" } else { "" },
            m.cores,
            m.kernel,
            num(m.loadavg, 0, 2)
        );
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        let _ = writeln!(
            s,
            "\n{:<6} {:<16} {:>9} {:>7} {:>8} {:>9} {:>8} {:>8} {:>8}",
            "work", "tool", "size", "files", "GB/s", "files/s", "secs", "cli cpu", "srv cpu"
        );
        for r in &rep.rows {
            let _ = write!(
                s,
                "{:<6} {:<16} {:>9} {:>7} ",
                r.workload,
                r.label(),
                human_size(r.bytes),
                r.files
            );
            if let Some(e) = &r.error {
                let _ = writeln!(s, "{e}");
                continue;
            }
            let _ = writeln!(
                s,
                "{} {} {} {} {}",
                num(r.gbps, 8, 3),
                num(r.files_per_s, 9, 0),
                num(r.secs, 8, 3),
                num(r.client_cpu_s, 8, 2),
                num(r.server_cpu_s, 8, 2)
            );
        }
        let _ = writeln!(
            s,
            "\nsummary (ferry's best driver vs the peer's best variant):"
        );
        summary_text(&mut s, &rep.summary.0, &rep.targets, Some(&self.best), 26);
        if let Some(r) = &self.check_rates {
            let _ = writeln!(
                s,
                "\nper-block work on one core, GB/s: crc32c {:.2}, integrity tag {:.2}, \
                 private seal {:.2} / open {:.2}, memcpy {:.2}",
                r.crc32c, r.integrity_tag, r.private_seal, r.private_open, r.memcpy
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_columns_are_the_documented_ones() {
        let csv = crate::report::csv::<CpRow>(&[]).unwrap();
        assert_eq!(csv, "workload,tool,variant,bytes,files,gbps,files_per_s,secs,client_cpu_s,server_cpu_s,cpu_s,reps,error\n");
    }

    fn row(workload: &str, tool: &str, variant: &str, gbps: f64, cpu: f64) -> CpRow {
        CpRow {
            workload: workload.into(),
            tool: tool.into(),
            variant: variant.into(),
            bytes: 1 << 30,
            files: 1,
            gbps: Some(gbps),
            files_per_s: (workload == "small").then_some(gbps * 1000.0),
            secs: Some(1.0 / gbps),
            client_cpu_s: Some(cpu / 2.0),
            server_cpu_s: Some(cpu / 2.0),
            cpu_s: Some(cpu),
            reps: 1,
            error: None,
        }
    }

    #[test]
    fn best_driver_against_best_variant() {
        let rows = vec![
            row("mem", "ferry", "tcp", 3.0, 1.0),
            row("mem", "ferry", "ofi+shm", 4.0, 1.5),
            row("shm", "gridftp", "-p 1", 2.0, 3.0),
            row("shm", "gridftp", "-p 4", 2.5, 4.0),
            row("mem", "iperf3", "", 5.0, 1.0),
            row("small", "ferry", "tcp", 1.0, 1.0),
            row("small", "ferry", "tcp -p 4", 1.2, 1.0),
            row("small", "ferry", "ofi+shm -p 4", 1.4, 1.0),
            row("small", "gridftp", "-p 1", 0.4, 1.0),
            row("disk", "ferry", "tcp", 0.2, 1.0),
            row("disk", "ferry", "tcp --direct", 0.3, 1.0),
            row("disk", "ferry", "ofi+shm --direct", 0.6, 1.0),
            row("disk", "gridftp", "-p 1", 0.5, 1.0),
        ];
        let (s, best) = summary(&rows);
        assert_eq!(s.get("mem_vs_gridftp"), Some(1.6));
        assert_eq!(best["mem_vs_gridftp"], "ferry ofi+shm vs gridftp -p 4");
        assert_eq!(s.get("mem_vs_iperf3"), Some(0.8));
        // CPU: lowest ferry (tcp, 1.0) against lowest GridFTP (-p 1, 3.0).
        assert_eq!(s.get("cpu_vs_gridftp"), Some(3.0));
        assert_eq!(best["cpu_vs_gridftp"], "ferry tcp vs gridftp -p 1");
        assert_eq!(s.get("smallfiles_vs_gridftp"), Some(3.5));
        // A parallel-streams variant of the tcp driver counts as tcp.
        assert_eq!(s.get("smallfiles_vs_gridftp_tcp"), Some(3.0));
        assert_eq!(
            best["smallfiles_vs_gridftp_tcp"],
            "ferry tcp -p 4 vs gridftp -p 1"
        );
        assert_eq!(s.get("disk_vs_gridftp"), Some(1.2));
        assert_eq!(
            best["disk_vs_gridftp"],
            "ferry ofi+shm --direct vs gridftp -p 1"
        );
        // A direct-I/O variant of the tcp driver counts as tcp.
        assert_eq!(s.get("disk_vs_gridftp_tcp"), Some(0.6));
        // The tcp-only variant ignores the faster ofi+shm row.
        assert_eq!(s.get("mem_vs_gridftp_tcp"), Some(1.2));
        assert_eq!(best["mem_vs_gridftp_tcp"], "ferry tcp vs gridftp -p 4");
        let t = targets(&s);
        let verdict = |k: &str| t.iter().find(|t| t.metric == k).map(Target::verdict);
        assert_eq!(verdict("mem_vs_gridftp"), Some("pass"));
        assert_eq!(verdict("mem_vs_iperf3"), Some("FAIL"));
        assert_eq!(verdict("disk_vs_gridftp"), Some("FAIL"));
    }

    #[test]
    fn disk_default_ratios_use_the_rows_without_flags() {
        let rows = vec![
            row("disk", "ferry", "tcp", 0.3, 1.0),
            row("disk", "ferry", "ofi+shm", 0.4, 1.0),
            row("disk", "ferry", "tcp --direct", 0.9, 1.0),
            row("disk", "gridftp", "-p 4", 0.5, 1.0),
            row("disk", "fio", "read", 0.8, 0.0),
            row("disk", "fio", "write", 1.2, 0.0),
        ];
        let (s, best) = summary(&rows);
        assert_eq!(s.get("disk_vs_gridftp"), Some(1.8));
        assert_eq!(s.get("disk_vs_device"), Some(1.125));
        assert_eq!(s.get("disk_default_vs_gridftp"), Some(0.8));
        assert_eq!(
            best["disk_default_vs_gridftp"],
            "ferry ofi+shm vs gridftp -p 4"
        );
        assert_eq!(s.get("disk_default_vs_device"), Some(0.5));
        let t = targets(&s);
        let verdict = |k: &str| t.iter().find(|t| t.metric == k).map(Target::verdict);
        assert_eq!(verdict("disk_default_vs_gridftp"), Some("FAIL"));
        assert_eq!(verdict("disk_default_vs_device"), Some("FAIL"));
    }

    #[test]
    fn checksum_cost_and_shm_ratios_leave_out_the_unchecked_rows() {
        let rows = vec![
            row("shm", "ferry", "tcp", 2.0, 2.0),
            row("shm", "ferry", "tcp no-cache", 1.8, 2.4),
            row("shm", "ferry", "tcp no-checksums", 2.4, 1.5),
            row("shm", "ferry", "ofi+shm", 2.5, 1.8),
            row("shm", "ferry", "ofi+shm no-cache", 2.2, 2.2),
            row("shm", "ferry", "ofi+shm no-checksums", 2.75, 1.0),
            row("shm", "gridftp", "-p 4", 2.0, 3.6),
        ];
        let (s, best) = summary(&rows);
        // The unchecked ofi+shm row (2.75 GB/s, 1.0 CPU-s) is no result.
        assert_eq!(s.get("shm_vs_gridftp"), Some(1.25));
        assert_eq!(best["shm_vs_gridftp"], "ferry ofi+shm vs gridftp -p 4");
        assert_eq!(s.get("cpu_vs_gridftp_shm"), Some(2.0));
        assert_eq!(best["cpu_vs_gridftp_shm"], "ferry ofi+shm vs gridftp -p 4");
        // First runs (no cache): ofi+shm 2.2 against 2.75 unchecked.
        assert_eq!(s.get("checksum_cost"), Some(0.2));
        assert_eq!(
            best["checksum_cost"],
            "ferry ofi+shm no-cache vs ferry ofi+shm no-checksums"
        );
        assert_eq!(s.get("checksum_cost_cached"), Some(0.091));
        let t = targets(&s);
        let verdict = |k: &str| t.iter().find(|t| t.metric == k).map(Target::verdict);
        assert_eq!(verdict("checksum_cost"), Some("FAIL"));
    }

    #[test]
    fn integrity_is_measured_against_clear_and_clear_rows_are_no_result() {
        let rows = vec![
            row("mem", "ferry", "tcp", 2.0, 1.0),
            row("mem", "ferry", "tcp clear", 2.5, 0.8),
            row("mem", "ferry", "ofi+shm", 4.0, 1.0),
            row("mem", "ferry", "ofi+shm clear", 5.0, 0.5),
            row("shm", "gridftp", "-p 4", 2.0, 3.0),
        ];
        let (s, best) = summary(&rows);
        // The fastest default row (ofi+shm, 4.0) against its clear row (5.0).
        assert_eq!(s.get("integrity_vs_clear_mem"), Some(0.8));
        assert_eq!(
            best["integrity_vs_clear_mem"],
            "ferry ofi+shm vs ferry ofi+shm clear"
        );
        assert_eq!(s.get("integrity_vs_clear_shm"), None);
        // The clear rows (5.0 GB/s, 0.5 CPU-s) are no result.
        assert_eq!(s.get("mem_vs_gridftp"), Some(2.0));
        assert_eq!(s.get("cpu_vs_gridftp"), Some(3.0));
        let t = targets(&s);
        let verdict = |k: &str| t.iter().find(|t| t.metric == k).map(Target::verdict);
        assert_eq!(verdict("integrity_vs_clear_mem"), Some("FAIL"));
    }

    #[test]
    fn private_is_measured_against_clear_and_against_openssh() {
        let rows = vec![
            row("mem", "ferry", "tcp", 2.0, 1.0),
            row("mem", "ferry", "tcp clear", 2.5, 0.8),
            row("mem", "ferry", "tcp private", 2.2, 1.2),
            row("shm", "ferry", "tcp private", 1.6, 1.2),
            row("shm", "ferry", "ofi+tcp private", 1.8, 1.2),
            row("shm", "scp", "", 0.3, 2.0),
            row("shm", "scp", "aes256-gcm@openssh.com", 0.6, 2.0),
            row("shm", "rsync", "-e ssh", 0.5, 2.0),
            row("shm", "gridftp", "-p 4", 2.0, 3.0),
        ];
        let (s, best) = summary(&rows);
        assert_eq!(s.get("private_vs_clear_mem"), Some(0.88));
        assert_eq!(
            best["private_vs_clear_mem"],
            "ferry tcp private vs ferry tcp clear"
        );
        // ferry's fastest private shm row against OpenSSH's fastest copy.
        assert_eq!(s.get("private_vs_scp"), Some(3.0));
        assert_eq!(
            best["private_vs_scp"],
            "ferry ofi+tcp private vs scp aes256-gcm@openssh.com"
        );
        // Private rows are no result elsewhere: the default row (2.0) is ferry's best mem.
        assert_eq!(s.get("mem_vs_gridftp"), Some(1.0));
        let t = targets(&s);
        let verdict = |k: &str| t.iter().find(|t| t.metric == k).map(Target::verdict);
        assert_eq!(verdict("private_vs_clear_mem"), Some("pass"));
        assert_eq!(verdict("private_vs_scp"), Some("pass"));
    }

    #[test]
    fn failed_rows_do_not_count() {
        let mut bad = row("mem", "ferry", "tcp", 9.0, 1.0);
        bad.gbps = None;
        bad.error = Some("boom".into());
        let rows = vec![bad, row("shm", "gridftp", "-p 1", 2.0, 3.0)];
        assert_eq!(summary(&rows).0.get("mem_vs_gridftp"), None);
    }
}
