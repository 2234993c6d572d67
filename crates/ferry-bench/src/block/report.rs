//! `ferry bench block`'s rows, summary, targets and table.

use std::fmt::Write as _;

use serde::Serialize;

pub use crate::exs::ExsSummary as Summary;
use crate::report::{human_size, num, round, summary_text, Report, Target};

/// One server, export and workload: medians over the repetitions, or an error.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct BlockRow {
    /// `ferry`, `nbdkit` or `qemu-nbd`.
    pub server: String,
    /// How the data travels: `nbd` (the NBD protocol on a socket), or `ext4` for the
    /// application rows (a file system on the export through nbdfuse and fuse2fs). The
    /// fabric path's schemes (`zcopy`, `bcopy`) get rows of their own.
    pub path: String,
    /// `tcp` (loopback) or `unix` (a Unix socket).
    pub transport: String,
    /// `memory` or `file` (every file server exports the same backing file).
    pub backend: String,
    /// `seqwrite`, `seqread`, `randwrite`, `randread`; `untar`, `postmark`, `fileop` on
    /// `ext4` (their IOPS: operations per second, GB/s: bytes unpacked per second).
    pub workload: String,
    /// Block size, bytes.
    pub bs: u64,
    /// Queue depth.
    pub qd: u32,
    /// GB/s (10^9 B/s).
    pub gbps: Option<f64>,
    /// Requests per second.
    pub iops: Option<f64>,
    /// Mean latency, µs.
    pub lat_mean_us: Option<f64>,
    /// 99th percentile latency, µs.
    pub lat_p99_us: Option<f64>,
    /// CPU seconds of fio (user + system).
    pub client_cpu_s: Option<f64>,
    /// CPU seconds of the server meanwhile.
    pub server_cpu_s: Option<f64>,
    /// Repetitions behind the medians.
    pub reps: usize,
    /// Why there is no value (a peer not installed, a failure).
    pub error: Option<String>,
}

impl BlockRow {
    /// `ferry memory tcp`.
    pub fn label(&self) -> String {
        format!("{} {} {}", self.server, self.backend, self.transport)
    }

    /// `seqwrite 1M qd16` (an application row: its name).
    pub fn job(&self) -> String {
        if self.path == "ext4" {
            return self.workload.clone();
        }
        let bs = human_size(self.bs)
            .replace(" KiB", "K")
            .replace(" MiB", "M");
        format!("{} {bs} qd{}", self.workload, self.qd)
    }
}

/// The report's JSON: the common envelope plus notes on the run.
#[derive(Debug, Clone, Serialize)]
pub struct BlockReport {
    /// The common envelope (bench, quick, machine, drivers, rows, summary, targets).
    #[serde(flatten)]
    pub report: Report<BlockRow, Summary>,
    /// Notes (peers missing, the machine's load, the metrics of a later slice).
    pub notes: Vec<String>,
}

/// What a ratio compares: a value of ferry's row against the peer's, where higher or lower
/// is better for ferry.
#[derive(Clone, Copy)]
enum Value {
    Gbps,
    Iops,
    LatMean,
    LatP99,
}

impl Value {
    fn of(self, r: &BlockRow) -> Option<f64> {
        match self {
            Value::Gbps => r.gbps,
            Value::Iops => r.iops,
            Value::LatMean => r.lat_mean_us,
            Value::LatP99 => r.lat_p99_us,
        }
    }
}

/// The metrics of each comparison: (name, workload, qd, value). Throughput ratios are
/// ferry / peer (above 1: ferry ahead), latency ratios too (below 1: ferry ahead).
const METRICS: [(&str, &str, u32, Value); 8] = [
    ("nbd_seq_write", "seqwrite", 16, Value::Gbps),
    ("nbd_seq_read", "seqread", 16, Value::Gbps),
    ("nbd_randread_qd1_iops", "randread", 1, Value::Iops),
    ("nbd_randread_qd32_iops", "randread", 32, Value::Iops),
    ("nbd_randread_qd1_lat_mean", "randread", 1, Value::LatMean),
    ("nbd_randread_qd1_lat_p99", "randread", 1, Value::LatP99),
    ("nbd_randwrite_qd1_iops", "randwrite", 1, Value::Iops),
    ("nbd_randwrite_qd32_iops", "randwrite", 32, Value::Iops),
];

/// An export's backend and transport: `("memory", "tcp")`.
type Export = (&'static str, &'static str);

/// The comparisons: (suffix, ferry's export, the peer, its export). The first, with no
/// suffix, is the issue's: memory exports over TCP.
const PAIRS: [(&str, Export, &str, Export); 4] = [
    ("_vs_nbdkit", ("memory", "tcp"), "nbdkit", ("memory", "tcp")),
    (
        "_vs_nbdkit_unix",
        ("memory", "unix"),
        "nbdkit",
        ("memory", "unix"),
    ),
    (
        "_vs_nbdkit_file",
        ("file", "tcp"),
        "nbdkit",
        ("file", "tcp"),
    ),
    (
        "_vs_qemu_nbd_file",
        ("file", "tcp"),
        "qemu-nbd",
        ("file", "tcp"),
    ),
];

/// Metrics of the fabric path: null here, filled in once its rows ran (`fabric_summary` in
/// the bench's run; they stay null when the fabric rows did not run).
pub const LATER: [&str; 4] = [
    "zcopy_vs_bcopy_write_1m",
    "zcopy_vs_nbdtcp_write_1m",
    "merge_gain_seqwrite_4k_shm",
    "merge_gain_seqwrite_4k_tcp",
];

/// The goals: (summary key, op, bound).
pub const GOALS: [(&str, &str, f64); 9] = [
    ("nbd_seq_write_vs_nbdkit", ">=", 1.0),
    ("nbd_seq_read_vs_nbdkit", ">=", 1.0),
    ("nbd_randread_qd1_iops_vs_nbdkit", ">=", 1.0),
    ("nbd_randread_qd32_iops_vs_nbdkit", ">=", 1.0),
    ("nbd_randread_qd1_lat_mean_vs_nbdkit", "<=", 1.0),
    ("nbd_randread_qd1_lat_p99_vs_nbdkit", "<=", 1.0),
    ("untar_vs_nbdkit", ">=", 1.0),
    ("zcopy_vs_bcopy_write_1m", ">=", 1.3),
    ("zcopy_vs_nbdtcp_write_1m", ">=", 1.5),
];

/// The summary: every metric for every comparison (ferry's value over the peer's), then
/// the later slice's metrics as null.
pub fn summary(rows: &[BlockRow]) -> Summary {
    let find = |server: &str, (backend, transport): (&str, &str), w: &str, qd: u32| {
        rows.iter().find(|r| {
            r.server == server
                && r.path == "nbd"
                && r.backend == backend
                && r.transport == transport
                && r.workload == w
                && r.qd == qd
        })
    };
    let mut out = Vec::new();
    for (suffix, mine, peer, theirs) in PAIRS {
        for (name, w, qd, value) in METRICS {
            let f = find("ferry", mine, w, qd).and_then(|r| value.of(r));
            let p = find(peer, theirs, w, qd).and_then(|r| value.of(r));
            let ratio = match (f, p) {
                (Some(f), Some(p)) if p > 0.0 => Some(round(f / p, 3)).filter(|x| x.is_finite()),
                _ => None,
            };
            out.push((format!("{name}{suffix}"), ratio));
        }
    }
    // The application runs: ferry's rate over nbdkit's, memory exports over TCP.
    for app in super::apps::APPS {
        let rate = |server: &str| {
            let r = rows.iter().find(|r| {
                (r.server.as_str(), r.path.as_str(), r.workload.as_str()) == (server, "ext4", app)
            });
            r.and_then(|r| r.iops)
        };
        let ratio = match (rate("ferry"), rate("nbdkit")) {
            (Some(f), Some(p)) if p > 0.0 => Some(round(f / p, 3)).filter(|x| x.is_finite()),
            _ => None,
        };
        out.push((format!("{app}_vs_nbdkit"), ratio));
    }
    out.extend(LATER.iter().map(|k| (k.to_string(), None)));
    Summary(out)
}

/// Each goal checked.
pub fn targets(s: &Summary) -> Vec<Target> {
    GOALS
        .iter()
        .map(|(k, op, t)| Target::check(k, op, *t, s.get(k)))
        .collect()
}

impl BlockReport {
    /// The human-readable table.
    pub fn table(&self) -> String {
        let rep = &self.report;
        let m = &rep.machine;
        let mut s = String::new();
        let reps = rep.rows.iter().map(|r| r.reps).max().unwrap_or(0);
        let _ = writeln!(
            s,
            "ferry bench block{}: fio ioengine=nbd on loopback, {} cores, Linux {}, load {}; \
             median of {reps}; CPU = user+sys",
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
            "\n{:<22} {:<5} {:<18} {:>7} {:>9} {:>9} {:>9} {:>8} {:>8}",
            "server", "path", "job", "GB/s", "IOPS", "mean µs", "p99 µs", "fio cpu", "srv cpu"
        );
        for r in &rep.rows {
            let _ = write!(s, "{:<22} {:<5} {:<18} ", r.label(), r.path, r.job());
            if let Some(e) = &r.error {
                let _ = writeln!(s, "{e}");
                continue;
            }
            let _ = writeln!(
                s,
                "{} {} {} {} {} {}",
                num(r.gbps, 7, 3),
                num(r.iops, 9, 0),
                num(r.lat_mean_us, 9, 1),
                num(r.lat_p99_us, 9, 1),
                num(r.client_cpu_s, 8, 2),
                num(r.server_cpu_s, 8, 2)
            );
        }
        let _ = writeln!(
            s,
            "\nsummary (ferry / peer; latency ratios: lower is better):"
        );
        summary_text(&mut s, &rep.summary.0, &rep.targets, None, 44);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(server: &str, backend: &str, transport: &str, w: &str, qd: u32, x: f64) -> BlockRow {
        BlockRow {
            server: server.into(),
            path: "nbd".into(),
            transport: transport.into(),
            backend: backend.into(),
            workload: w.into(),
            bs: if w.starts_with("seq") { 1 << 20 } else { 4096 },
            qd,
            gbps: Some(x),
            iops: Some(x * 1000.0),
            lat_mean_us: Some(100.0 / x),
            lat_p99_us: Some(200.0 / x),
            reps: 3,
            ..BlockRow::default()
        }
    }

    #[test]
    fn csv_columns_are_the_documented_ones() {
        let csv = crate::report::csv::<BlockRow>(&[]).unwrap();
        assert_eq!(
            csv,
            "server,path,transport,backend,workload,bs,qd,gbps,iops,lat_mean_us,lat_p99_us,client_cpu_s,server_cpu_s,reps,error\n"
        );
    }

    #[test]
    fn ratios_compare_like_with_like() {
        let rows = vec![
            row("ferry", "memory", "tcp", "seqwrite", 16, 3.0),
            row("ferry", "memory", "unix", "seqwrite", 16, 9.0),
            row("nbdkit", "memory", "tcp", "seqwrite", 16, 2.0),
            row("nbdkit", "file", "tcp", "seqwrite", 16, 1.0),
            row("ferry", "memory", "tcp", "randread", 1, 2.0),
            row("nbdkit", "memory", "tcp", "randread", 1, 4.0),
            row("ferry", "file", "tcp", "seqwrite", 16, 1.5),
        ];
        let mut rows = rows;
        for (server, rate) in [("ferry", 90.0), ("nbdkit", 60.0)] {
            rows.push(BlockRow {
                server: server.into(),
                path: "ext4".into(),
                transport: "tcp".into(),
                backend: "memory".into(),
                workload: "untar".into(),
                iops: Some(rate),
                ..BlockRow::default()
            });
        }
        let s = summary(&rows);
        assert_eq!(s.get("untar_vs_nbdkit"), Some(1.5));
        assert_eq!(s.get("postmark_vs_nbdkit"), None);
        assert_eq!(s.get("nbd_seq_write_vs_nbdkit"), Some(1.5));
        assert_eq!(s.get("nbd_seq_write_vs_nbdkit_file"), Some(1.5));
        assert_eq!(s.get("nbd_randread_qd1_iops_vs_nbdkit"), Some(0.5));
        // Latency: ferry's over nbdkit's, so 2 means twice as slow.
        assert_eq!(s.get("nbd_randread_qd1_lat_mean_vs_nbdkit"), Some(2.0));
        // Missing peers are null, not skipped.
        assert_eq!(s.get("nbd_seq_write_vs_nbdkit_unix"), None);
        assert!(s.0.iter().any(|(k, _)| k == "nbd_seq_write_vs_nbdkit_unix"));
        assert!(s
            .0
            .iter()
            .any(|(k, v)| k == "zcopy_vs_bcopy_write_1m" && v.is_none()));
        let t = targets(&s);
        let verdict = |k: &str| t.iter().find(|t| t.metric == k).map(Target::verdict);
        assert_eq!(verdict("nbd_seq_write_vs_nbdkit"), Some("pass"));
        assert_eq!(verdict("nbd_randread_qd1_iops_vs_nbdkit"), Some("FAIL"));
        assert_eq!(verdict("nbd_randread_qd1_lat_mean_vs_nbdkit"), Some("FAIL"));
        assert_eq!(verdict("nbd_seq_read_vs_nbdkit"), Some("missing"));
    }
}
