//! `ferry bench noncontig`'s rows, summary and targets, and their table, CSV and PNG.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use super::{med, Measured, METHODS};
use crate::plot::{self, Axis, Corner, Panel, Series};
use crate::report::{human_size, num, round, Report, Target};

/// One measured point (median over repetitions) or a failed one (values null, `error` set).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct NcRow {
    /// Driver.
    pub driver: String,
    /// `contig`, `pack` or `zerocopy`.
    pub op: String,
    /// Message bytes (16 segments of size/16, 1 MiB apart, for pack and zerocopy).
    pub size: u64,
    /// Message bytes per second, GB/s (10^9 B/s).
    pub gbps: Option<f64>,
    /// User+system CPU seconds of both processes.
    pub cpu_s: Option<f64>,
    /// CPU seconds of the sending (benchmark) process.
    pub client_cpu_s: Option<f64>,
    /// CPU seconds of the peer (target; it unpacks for `pack`).
    pub peer_cpu_s: Option<f64>,
    /// Messages per repetition.
    pub messages: Option<u64>,
    /// RMA operations per message.
    pub ops_per_message: Option<u64>,
    /// The 10th percentile of the per-message times (data plus notification), µs, median
    /// over repetitions: on a shared machine the messages nobody preempted, so ratios of it
    /// vary far less with the load than ratios of `gbps`.
    pub msg_us_p10: Option<f64>,
    /// Repetitions that produced the median.
    pub reps: usize,
    /// Why the point has no value.
    pub error: Option<String>,
}

impl NcRow {
    pub(super) fn from_samples(driver: &str, op: &str, size: u64, s: &[Measured]) -> NcRow {
        let client = med(s, |m| m.client_cpu_s);
        let peer = med(s, |m| m.peer_cpu_s);
        NcRow {
            driver: driver.into(),
            op: op.into(),
            size,
            gbps: med(s, |m| m.gbps).map(|g| round(g, 4)),
            cpu_s: client.zip(peer).map(|(a, b)| round(a + b, 3)),
            client_cpu_s: client.map(|c| round(c, 3)),
            peer_cpu_s: peer.map(|c| round(c, 3)),
            messages: s.first().map(|m| m.messages),
            ops_per_message: s.first().map(|m| m.ops),
            msg_us_p10: med(s, |m| m.p10_us).map(|t| round(t, 1)),
            reps: s.len(),
            error: None,
        }
    }

    pub(super) fn failed(driver: &str, op: &str, size: u64, why: &str) -> NcRow {
        NcRow {
            driver: driver.into(),
            op: op.into(),
            size,
            gbps: None,
            cpu_s: None,
            client_cpu_s: None,
            peer_cpu_s: None,
            messages: None,
            ops_per_message: None,
            msg_us_p10: None,
            reps: 0,
            error: Some(why.into()),
        }
    }
}

/// The headline ratios the issue names (null where a side is missing).
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct NcSummary {
    /// Zero-copy over pack/unpack bandwidth, ofi+shm, 4 MiB messages.
    pub zerocopy_vs_pack_shm_4m: Option<f64>,
    /// Zero-copy over contiguous bandwidth, ofi+shm, 16 MiB messages.
    pub zerocopy_vs_contig_shm_16m: Option<f64>,
    /// Zero-copy over pack/unpack bandwidth, native tcp, 4 MiB messages.
    pub zerocopy_vs_pack_tcp_4m: Option<f64>,
    /// Zero-copy over contiguous bandwidth, native tcp, 16 MiB messages.
    pub zerocopy_vs_contig_tcp_16m: Option<f64>,
}

const GOALS: [(&str, &str, f64); 2] = [
    ("zerocopy_vs_pack_shm_4m", ">=", 2.0),
    ("zerocopy_vs_contig_shm_16m", ">=", 0.9),
];

impl NcSummary {
    /// The ratios from the rows.
    pub fn from_rows(rows: &[NcRow]) -> NcSummary {
        let find = |d: &str, op: &str, size: u64| {
            rows.iter()
                .find(|r| r.driver == d && r.op == op && r.size == size)
                .and_then(|r| r.gbps)
        };
        let ratio = |d: &str, other: &str, size: u64| {
            Some(round(find(d, "zerocopy", size)? / find(d, other, size)?, 4))
                .filter(|r| r.is_finite())
        };
        NcSummary {
            zerocopy_vs_pack_shm_4m: ratio("ofi+shm", "pack", 4 << 20),
            zerocopy_vs_contig_shm_16m: ratio("ofi+shm", "contig", 16 << 20),
            zerocopy_vs_pack_tcp_4m: ratio("tcp", "pack", 4 << 20),
            zerocopy_vs_contig_tcp_16m: ratio("tcp", "contig", 16 << 20),
        }
    }

    /// The goals, checked.
    pub fn targets(&self) -> Vec<Target> {
        let value = |k: &str| match k {
            "zerocopy_vs_pack_shm_4m" => self.zerocopy_vs_pack_shm_4m,
            _ => self.zerocopy_vs_contig_shm_16m,
        };
        GOALS
            .iter()
            .map(|(k, op, t)| Target::check(k, op, *t, value(k)))
            .collect()
    }

    fn pairs(&self) -> [(&'static str, Option<f64>); 4] {
        [
            ("zerocopy_vs_pack_shm_4m", self.zerocopy_vs_pack_shm_4m),
            (
                "zerocopy_vs_contig_shm_16m",
                self.zerocopy_vs_contig_shm_16m,
            ),
            ("zerocopy_vs_pack_tcp_4m", self.zerocopy_vs_pack_tcp_4m),
            (
                "zerocopy_vs_contig_tcp_16m",
                self.zerocopy_vs_contig_tcp_16m,
            ),
        ]
    }
}

impl Report<NcRow, NcSummary> {
    /// The readable table: one line per driver and size, GB/s and CPU of each method.
    pub fn table(&self) -> String {
        let m = &self.machine;
        let mut s = String::new();
        let reps = self.rows.iter().map(|r| r.reps).max().unwrap_or(0);
        let _ = writeln!(
            s,
            "ferry bench noncontig{}: loopback, {} cores, Linux {}, load {}, memcpy {} GB/s; \
             median of {reps}",
            if self.quick { " --quick" } else { "" },
            m.cores,
            m.kernel,
            num(m.loadavg, 0, 2),
            num(m.memcpy_gbps, 0, 2)
        );
        let _ = writeln!(
            s,
            "each message: 16 segments of size/16, 1 MiB apart, both sides; contig = one RMA \
             write of the whole message; pack = pack, contiguous write, peer unpacks; \
             zerocopy = gathered writes of up to rma_iov_limit destination segments each. CPU s = this process + peer"
        );
        for d in &self.drivers {
            let provider = d.provider.as_deref().unwrap_or("-");
            let _ = writeln!(s, "\n{} ({provider})", d.driver);
            if let Some(e) = &d.error {
                let _ = writeln!(s, "  missing: {e}");
                continue;
            }
            let _ = writeln!(
                s,
                "  {:>8}  {:>9} {:>9} {:>9}  {:>8} {:>8} {:>8}  {:>6}",
                "size", "contig", "pack", "zerocopy", "cpu c", "cpu p", "cpu z", "msgs"
            );
            let mut sizes: Vec<u64> = self
                .rows
                .iter()
                .filter(|r| r.driver == d.driver)
                .map(|r| r.size)
                .collect();
            sizes.dedup();
            for size in sizes {
                let row = |op: &str| {
                    self.rows
                        .iter()
                        .find(|r| r.driver == d.driver && r.op == op && r.size == size)
                };
                let g = |op: &str| row(op).and_then(|r| r.gbps);
                let c = |op: &str| row(op).and_then(|r| r.cpu_s);
                let _ = writeln!(
                    s,
                    "  {:>8}  {} {} {}  {} {} {}  {:>6}",
                    human_size(size),
                    num(g("contig"), 9, 3),
                    num(g("pack"), 9, 3),
                    num(g("zerocopy"), 9, 3),
                    num(c("contig"), 8, 2),
                    num(c("pack"), 8, 2),
                    num(c("zerocopy"), 8, 2),
                    row("zerocopy")
                        .and_then(|r| r.messages)
                        .map_or("-".into(), |n| n.to_string())
                );
            }
        }
        let _ = writeln!(s, "\nsummary");
        for (k, v) in self.summary.pairs() {
            let goal = self.targets.iter().find(|t| t.metric == k);
            let verdict = goal.map_or(String::from("(reported)"), |t| {
                format!("target {} {} → {}", t.op, t.target, t.verdict())
            });
            let _ = writeln!(s, "  {k:<28} {}  {verdict}", num(v, 7, 3));
        }
        let fast = self.p10_ratios();
        if !fast.is_empty() {
            let _ = writeln!(
                s,
                "\nper-message p10 (the least preempted tenth; steadier under load), µs"
            );
            for (driver, size, z, p, c) in fast {
                let _ = writeln!(
                    s,
                    "  {driver:<8} {:>8}  zerocopy {z:.0}  pack {p:.0}  contig {c:.0}  \
                     pack ÷ zerocopy {:.3}  contig ÷ zerocopy {:.3}",
                    human_size(size),
                    p / z,
                    c / z
                );
            }
        }
        s
    }

    /// Per driver and size with all three methods: the per-message p10 times of zerocopy,
    /// pack and contig.
    fn p10_ratios(&self) -> Vec<(String, u64, f64, f64, f64)> {
        let t = |d: &str, op: &str, size: u64| {
            self.rows
                .iter()
                .find(|r| r.driver == d && r.op == op && r.size == size)
                .and_then(|r| r.msg_us_p10)
                .filter(|&t| t > 0.0)
        };
        self.rows
            .iter()
            .filter(|r| r.op == "zerocopy")
            .filter_map(|r| {
                let (d, size) = (r.driver.as_str(), r.size);
                Some((
                    d.to_string(),
                    size,
                    t(d, "zerocopy", size)?,
                    t(d, "pack", size)?,
                    t(d, "contig", size)?,
                ))
            })
            .collect()
    }

    /// Figure 5 of the EXIO paper per driver: bandwidth against message size, one line per
    /// method. False if the font is missing.
    pub fn png(&self, path: &Path) -> Result<bool> {
        let panels: Vec<Panel> = self
            .drivers
            .iter()
            .map(|d| {
                let series = METHODS
                    .iter()
                    .map(|op| Series {
                        name: match *op {
                            "contig" => "contiguous".into(),
                            "pack" => "pack/unpack".into(),
                            _ => "zero-copy gather".into(),
                        },
                        points: self
                            .rows
                            .iter()
                            .filter(|r| r.driver == d.driver && r.op == *op)
                            .filter_map(|r| Some((r.size as f64, r.gbps?)))
                            .collect(),
                    })
                    .collect();
                Panel {
                    title: format!("{}: noncontiguous I/O, 16 segments 1 MiB apart", d.driver),
                    x_desc: "message size".into(),
                    y_desc: "GB/s".into(),
                    x: Axis::Log2Bytes,
                    log_y: false,
                    series,
                    refs: vec![],
                    legend: Corner::UpperLeft,
                }
            })
            .collect();
        let title = format!(
            "ferry bench noncontig{} — loopback, {} cores, peer in its own process",
            if self.quick { " --quick" } else { "" },
            self.machine.cores
        );
        plot::write_png(path, &title, &panels, panels.len().max(1), (640, 440))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_columns_are_the_documented_ones() {
        let csv = crate::report::csv::<NcRow>(&[]).unwrap();
        assert_eq!(csv, "driver,op,size,gbps,cpu_s,client_cpu_s,peer_cpu_s,messages,ops_per_message,msg_us_p10,reps,error\n");
    }

    fn row(d: &str, op: &str, size: u64, gbps: f64) -> NcRow {
        let mut r = NcRow::failed(d, op, size, "");
        r.error = None;
        r.gbps = Some(gbps);
        r
    }

    #[test]
    fn summary_keys_ratios_and_targets() {
        let rows = vec![
            row("ofi+shm", "pack", 4 << 20, 2.0),
            row("ofi+shm", "zerocopy", 4 << 20, 5.0),
            row("ofi+shm", "contig", 16 << 20, 10.0),
            row("ofi+shm", "zerocopy", 16 << 20, 8.0),
            row("tcp", "zerocopy", 4 << 20, 1.0),
        ];
        let s = NcSummary::from_rows(&rows);
        assert_eq!(s.zerocopy_vs_pack_shm_4m, Some(2.5));
        assert_eq!(s.zerocopy_vs_contig_shm_16m, Some(0.8));
        assert_eq!(s.zerocopy_vs_pack_tcp_4m, None);
        let t = s.targets();
        assert_eq!(t[0].verdict(), "pass");
        assert_eq!(t[1].verdict(), "FAIL");
        let json = serde_json::to_value(&s).unwrap();
        for k in [
            "zerocopy_vs_pack_shm_4m",
            "zerocopy_vs_contig_shm_16m",
            "zerocopy_vs_pack_tcp_4m",
            "zerocopy_vs_contig_tcp_16m",
        ] {
            assert!(json.get(k).is_some(), "{k}");
        }
    }

    /// The p10 lines pair the three methods of one driver and size, and only those.
    #[test]
    fn p10_ratios_need_all_three_methods() {
        let timed = |d: &str, op: &str, size: u64, us: f64| {
            let mut r = row(d, op, size, 1.0);
            r.msg_us_p10 = Some(us);
            r
        };
        let report = Report {
            bench: "noncontig",
            quick: true,
            machine: crate::report::Machine::detect(None),
            drivers: Vec::new(),
            targets: Vec::new(),
            rows: vec![
                timed("ofi+shm", "contig", 4 << 20, 250.0),
                timed("ofi+shm", "pack", 4 << 20, 600.0),
                timed("ofi+shm", "zerocopy", 4 << 20, 300.0),
                timed("tcp", "zerocopy", 4 << 20, 900.0),
                timed("tcp", "pack", 4 << 20, 1000.0),
            ],
            summary: NcSummary::default(),
        };
        let r = report.p10_ratios();
        assert_eq!(r, vec![("ofi+shm".into(), 4 << 20, 300.0, 600.0, 250.0)]);
        let table = report.table();
        assert!(table.contains("pack ÷ zerocopy 2.000"), "{table}");
        assert!(table.contains("contig ÷ zerocopy 0.833"), "{table}");
        let csv = crate::report::csv(&report.rows).unwrap();
        assert!(
            csv.lines()
                .nth(1)
                .is_some_and(|l| l.contains(",250.000000,")),
            "{csv}"
        );
    }
}
