//! `ferry bench wan`'s rows, summary (with the rows each ratio took), targets, table and CSV.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::exs::ExsSummary as Summary;
use crate::report::{human_size, num, round, summary_text, Report, Target};

/// One tool on one workload at one round trip: medians over the repetitions, or an error.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct WanRow {
    /// `mem` (the seed's figure 7: ferry zero source → null sink, the peers a file in
    /// /dev/shm → /dev/null), `disk` (figure 8: disk → disk without staging), `staged`
    /// (figure 9: disk → disk with staging), `ccsm` / `viz` (figure 10's traces, disk →
    /// disk), `small` (a tree of small files, /dev/shm → /dev/shm).
    pub workload: String,
    /// The emulated round trip, milliseconds.
    pub rtt_ms: u32,
    /// `ferry`, `gridftp` or `iperf3`.
    pub tool: String,
    /// ferry's driver and flags (`tcp`, `ofi+tcp`, `tcp --buffer 16M`, `tcp --direct
    /// --buffer 4M`), or the peer's (`-p 4`, `-p 4 -tcp-bs 16M`, `-P 1`).
    pub variant: String,
    /// The file buffer asked for (`--buffer`, GridFTP's `-tcp-bs`), bytes; none: the
    /// tool's default.
    pub buffer: Option<u64>,
    /// Bytes per transfer.
    pub bytes: u64,
    /// Files per transfer.
    pub files: u64,
    /// Data rate, Gbit/s (10^9 bit/s) over the client's wall time (iperf3: its receiver's
    /// own rate).
    pub gbit_s: Option<f64>,
    /// `gbit_s` ÷ the bottleneck rate.
    pub link_share: Option<f64>,
    /// The rate the transfer reached: IP bytes the emulated line carried towards the
    /// client over the best 2-second window of the transfer's first 20 s (its whole span
    /// if shorter), Gbit/s; measured alike for every tool (set-up and slow start left out).
    pub reached_gbit_s: Option<f64>,
    /// `reached_gbit_s` ÷ the bottleneck rate (which bills IP bytes, so at most about 1).
    pub reached_share: Option<f64>,
    /// What ferry chose (its `--json` `path`): streams used.
    pub streams: Option<u64>,
    /// What ferry chose: staging bytes per stream.
    pub staging: Option<u64>,
    /// Repetitions behind the medians.
    pub reps: usize,
    /// Why there is no value (a peer not installed, a failure).
    pub error: Option<String>,
}

impl WanRow {
    /// `ferry tcp --buffer 16M`, `gridftp -p 4`, `iperf3 -P 1`.
    pub fn label(&self) -> String {
        format!("{} {}", self.tool, self.variant)
    }

    /// A ferry row without tuning flags (what a user gets): the bare driver.
    pub fn is_default(&self) -> bool {
        self.tool == "ferry" && !self.variant.contains(' ')
    }

    /// A ferry row whose client checked nothing: the reference of `checksum_cost_line`,
    /// never a result.
    pub fn is_unchecked(&self) -> bool {
        self.tool == "ferry"
            && self
                .variant
                .split_whitespace()
                .any(|w| w == super::NO_CHECKSUMS)
    }
}

/// The report's JSON: the common envelope plus which rows each summary ratio used.
#[derive(Debug, Clone, Serialize)]
pub struct WanReport {
    /// The common envelope (bench, quick, machine, drivers, rows, summary, targets).
    #[serde(flatten)]
    pub report: Report<WanRow, Summary>,
    /// The bottleneck, bit/s.
    pub rate_bps: u64,
    /// Per summary ratio: `"<row> vs <row>"`.
    pub best: BTreeMap<String, String>,
    /// Notes on the run (peers missing, caches not dropped, the host's limits).
    pub notes: Vec<String>,
}

/// The goals: (summary key, op, bound).
pub const GOALS: [(&str, &str, f64); 7] = [
    ("wan_mem_vs_link_50ms", ">=", 0.9),
    ("wan_mem_vs_gridftp_50ms", ">=", 1.5),
    ("wan_mem_vs_gridftp_100ms", ">=", 1.5),
    ("staging_gain_disk_50ms", ">", 1.0),
    ("ccsm_vs_gridftp", ">=", 1.5),
    ("viz_vs_gridftp", ">=", 1.5),
    ("smallfiles_vs_gridftp_50ms", ">=", 1.5),
];

/// The fastest row among `rows` matching `keep`: (Gbit/s, label).
fn best(rows: &[WanRow], keep: impl Fn(&WanRow) -> bool) -> Option<(f64, String)> {
    best_by(rows, |r| r.gbit_s, keep)
}

/// The row among `rows` matching `keep` with the highest `rate`: (Gbit/s, label).
fn best_by(
    rows: &[WanRow],
    rate: impl Fn(&WanRow) -> Option<f64>,
    keep: impl Fn(&WanRow) -> bool,
) -> Option<(f64, String)> {
    rows.iter()
        .filter(|r| keep(r))
        .filter_map(|r| Some((rate(r).filter(|g| *g > 0.0)?, r.label())))
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

/// `a ÷ b` with both names, rounded.
fn ratio(a: Option<(f64, String)>, b: Option<(f64, String)>) -> Option<(f64, String)> {
    let ((x, xn), (y, yn)) = (a?, b?);
    let r = x / y;
    r.is_finite()
        .then(|| (round(r, 3), format!("{xn} vs {yn}")))
}

/// The summary and the rows each ratio took. ferry's best row (any driver, any flags)
/// against the peer's best setting, except where a key says otherwise:
/// `wan_mem_vs_link_50ms` and the `_default` keys take ferry without flags, and the
/// `_reached_` keys the rate reached on the line (`reached_gbit_s`) instead of the average:
/// ferry without flags and iperf3 `-P 1`, each ÷ the bottleneck.
pub fn summary(rows: &[WanRow], rate_bps: u64) -> (Summary, BTreeMap<String, String>) {
    let at = |w: &'static str, rtt: u32| move |r: &WanRow| r.workload == w && r.rtt_ms == rtt;
    let ferry = |w: &'static str, rtt: u32| {
        move |r: &WanRow| at(w, rtt)(r) && r.tool == "ferry" && !r.is_unchecked()
    };
    let gridftp =
        |w: &'static str, rtt: u32| move |r: &WanRow| at(w, rtt)(r) && r.tool == "gridftp";
    // The traces run at one round trip each (30 and 80 ms): any row of the workload.
    let any =
        |w: &'static str, tool: &'static str| move |r: &WanRow| r.workload == w && r.tool == tool;
    let link = Some((rate_bps as f64 / 1e9, "bottleneck".to_string()));
    let default = |w: &'static str, rtt: u32| move |r: &WanRow| ferry(w, rtt)(r) && r.is_default();
    let entries: Vec<(&str, Option<(f64, String)>)> = vec![
        ("checksum_cost_line", checksum_cost(rows)),
        (
            "wan_mem_vs_link_50ms",
            ratio(best(rows, default("mem", 50)), link.clone()),
        ),
        (
            "wan_mem_reached_vs_link_50ms",
            ratio(
                best_by(rows, |r| r.reached_gbit_s, default("mem", 50)),
                link.clone(),
            ),
        ),
        (
            "wan_mem_reached_iperf3_vs_link_50ms",
            ratio(
                best_by(
                    rows,
                    |r| r.reached_gbit_s,
                    |r| at("mem", 50)(r) && r.label() == "iperf3 -P 1",
                ),
                link.clone(),
            ),
        ),
        (
            "wan_mem_vs_gridftp_50ms",
            ratio(best(rows, ferry("mem", 50)), best(rows, gridftp("mem", 50))),
        ),
        (
            "wan_mem_vs_gridftp_100ms",
            ratio(
                best(rows, ferry("mem", 100)),
                best(rows, gridftp("mem", 100)),
            ),
        ),
        (
            "wan_mem_default_vs_gridftp_50ms",
            ratio(
                best(rows, default("mem", 50)),
                best(rows, gridftp("mem", 50)),
            ),
        ),
        (
            "wan_mem_default_vs_gridftp_100ms",
            ratio(
                best(rows, default("mem", 100)),
                best(rows, gridftp("mem", 100)),
            ),
        ),
        (
            "wan_mem_vs_iperf3_50ms",
            ratio(
                best(rows, ferry("mem", 50)),
                best(rows, |r| at("mem", 50)(r) && r.tool == "iperf3"),
            ),
        ),
        (
            "staging_gain_disk_50ms",
            ratio(
                best(rows, ferry("staged", 50)),
                best(rows, ferry("disk", 50)),
            ),
        ),
        (
            "ccsm_vs_gridftp",
            ratio(
                best(rows, any("ccsm", "ferry")),
                best(rows, any("ccsm", "gridftp")),
            ),
        ),
        (
            "viz_vs_gridftp",
            ratio(
                best(rows, any("viz", "ferry")),
                best(rows, any("viz", "gridftp")),
            ),
        ),
        (
            "smallfiles_vs_gridftp_50ms",
            ratio(
                best(rows, ferry("small", 50)),
                best(rows, gridftp("small", 50)),
            ),
        ),
        (
            "smallfiles_default_vs_gridftp_50ms",
            ratio(
                best(rows, default("small", 50)),
                best(rows, gridftp("small", 50)),
            ),
        ),
    ];
    let mut out = Vec::new();
    let mut names = BTreeMap::new();
    for (key, r) in entries {
        if let Some((_, n)) = &r {
            names.insert(key.to_string(), n.clone());
        }
        out.push((key.to_string(), r.map(|x| x.0)));
    }
    (Summary(out), names)
}

/// 1 − ferry's memory-to-memory rate ÷ the same driver's with the client checking nothing,
/// at the shortest round trip measured: what integrity costs when the line, not the CPU,
/// sets the pace.
fn checksum_cost(rows: &[WanRow]) -> Option<(f64, String)> {
    let without = rows
        .iter()
        .filter(|r| r.workload == "mem" && r.is_unchecked() && r.gbit_s.is_some())
        .min_by_key(|r| r.rtt_ms)?;
    let rtt = without.rtt_ms;
    let driver = without.variant.split_whitespace().next()?;
    let with = rows.iter().find(|r| {
        r.workload == "mem" && r.rtt_ms == rtt && r.tool == "ferry" && r.variant == driver
    })?;
    let cost = 1.0 - with.gbit_s? / without.gbit_s.filter(|g| *g > 0.0)?;
    let names = format!("{} vs {} at {rtt} ms", with.label(), without.label());
    Some((round(cost, 3), names))
}

/// Each goal checked (`>` is checked as `>=` a hair above the bound).
pub fn targets(s: &Summary) -> Vec<Target> {
    GOALS
        .iter()
        .map(|(k, op, t)| match *op {
            ">" => {
                let mut t = Target::check(k, ">=", *t, s.get(k));
                t.pass = s.get(k).map(|v| v > t.target);
                t.op = ">";
                t
            }
            _ => Target::check(k, op, *t, s.get(k)),
        })
        .collect()
}

impl WanReport {
    /// The human-readable table.
    pub fn table(&self) -> String {
        let rep = &self.report;
        let m = &rep.machine;
        let mut s = String::new();
        let reps = rep.rows.iter().map(|r| r.reps).max().unwrap_or(0);
        let _ = writeln!(
            s,
            "ferry bench wan{}: emulated path (ferry-wan), bottleneck {} Gbit/s, {} cores, \
             Linux {}, load {}; median of {reps}; Gbit/s of data over the client's wall time",
            if rep.quick { " --quick" } else { "" },
            self.rate_bps as f64 / 1e9,
            m.cores,
            m.kernel,
            num(m.loadavg, 0, 2)
        );
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        let _ = writeln!(
            s,
            "\n{:<7} {:>5} {:<34} {:>9} {:>6} {:>8} {:>6} {:>8} {:>4} {:>9}",
            "work", "RTT", "tool", "size", "files", "Gbit/s", "link", "reached", "str", "staging"
        );
        for r in &rep.rows {
            let _ = write!(
                s,
                "{:<7} {:>3}ms {:<34} {:>9} {:>6} ",
                r.workload,
                r.rtt_ms,
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
                "{} {} {} {} {:>9}",
                num(r.gbit_s, 8, 3),
                num(r.link_share, 6, 2),
                num(r.reached_gbit_s, 8, 3),
                num(r.streams.map(|x| x as f64), 4, 0),
                r.staging.map_or("-".into(), human_size)
            );
        }
        let _ = writeln!(s, "\nsummary:");
        summary_text(&mut s, &rep.summary.0, &rep.targets, Some(&self.best), 34);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(workload: &str, rtt: u32, tool: &str, variant: &str, gbit: f64) -> WanRow {
        WanRow {
            workload: workload.into(),
            rtt_ms: rtt,
            tool: tool.into(),
            variant: variant.into(),
            bytes: 1 << 30,
            files: 1,
            gbit_s: Some(gbit),
            reps: 1,
            ..WanRow::default()
        }
    }

    #[test]
    fn csv_columns_are_the_documented_ones() {
        let csv = crate::report::csv::<WanRow>(&[]).unwrap();
        assert_eq!(
            csv,
            "workload,rtt_ms,tool,variant,buffer,bytes,files,gbit_s,link_share,reached_gbit_s,reached_share,streams,staging,reps,error\n"
        );
    }

    /// The client-checks-nothing row is the reference of `checksum_cost_line` and never
    /// ferry's best row, even when it is the fastest.
    #[test]
    fn the_unchecked_row_is_a_reference_not_a_result() {
        let rows = vec![
            row("mem", 0, "ferry", "tcp", 1.9),
            row("mem", 0, "ferry", "tcp no-checksums", 2.0),
            row("mem", 0, "gridftp", "-p 4", 1.0),
            row("mem", 50, "ferry", "tcp", 1.5),
            row("mem", 50, "ferry", "tcp no-checksums", 1.5),
            row("mem", 50, "gridftp", "-p 4", 1.0),
        ];
        let (s, names) = summary(&rows, 2_000_000_000);
        assert_eq!(s.get("checksum_cost_line"), Some(0.05));
        assert_eq!(
            names["checksum_cost_line"],
            "ferry tcp vs ferry tcp no-checksums at 0 ms"
        );
        assert_eq!(s.get("wan_mem_vs_gridftp_50ms"), Some(1.5));
        assert_eq!(
            names["wan_mem_vs_gridftp_50ms"],
            "ferry tcp vs gridftp -p 4"
        );
    }

    #[test]
    fn ratios_take_the_best_rows_at_their_round_trip() {
        let rows = vec![
            row("mem", 50, "ferry", "tcp", 1.8),
            row("mem", 50, "ferry", "tcp --buffer 64M", 1.9),
            row("mem", 50, "gridftp", "-p 1", 0.5),
            row("mem", 50, "gridftp", "-p 4 -tcp-bs 16M", 1.0),
            row("mem", 50, "iperf3", "-P 4", 1.9),
            row("mem", 100, "ferry", "tcp", 1.5),
            row("mem", 100, "gridftp", "-p 4", 0.5),
            row("mem", 10, "gridftp", "-p 4", 0.1),
            row("disk", 50, "ferry", "tcp --direct --buffer 4M", 0.4),
            row("staged", 50, "ferry", "tcp --buffer 4M", 0.6),
            row("ccsm", 30, "ferry", "tcp", 1.2),
            row("ccsm", 30, "gridftp", "-p 4", 0.6),
            row("small", 50, "ferry", "tcp", 0.3),
            row("small", 50, "gridftp", "-cc 4", 0.1),
        ];
        let (s, names) = summary(&rows, 2_000_000_000);
        assert_eq!(s.get("wan_mem_vs_link_50ms"), Some(0.9));
        assert_eq!(names["wan_mem_vs_link_50ms"], "ferry tcp vs bottleneck");
        assert_eq!(s.get("wan_mem_vs_gridftp_50ms"), Some(1.9));
        assert_eq!(
            names["wan_mem_vs_gridftp_50ms"],
            "ferry tcp --buffer 64M vs gridftp -p 4 -tcp-bs 16M"
        );
        assert_eq!(s.get("wan_mem_default_vs_gridftp_50ms"), Some(1.8));
        assert_eq!(s.get("wan_mem_vs_gridftp_100ms"), Some(3.0));
        assert_eq!(s.get("wan_mem_vs_iperf3_50ms"), Some(1.0));
        assert_eq!(s.get("staging_gain_disk_50ms"), Some(1.5));
        assert_eq!(s.get("ccsm_vs_gridftp"), Some(2.0));
        assert_eq!(s.get("viz_vs_gridftp"), None);
        assert_eq!(s.get("smallfiles_vs_gridftp_50ms"), Some(3.0));
        assert_eq!(
            s.get("wan_mem_reached_vs_link_50ms"),
            None,
            "no line samples"
        );
        let t = targets(&s);
        let verdict = |k: &str| t.iter().find(|t| t.metric == k).map(Target::verdict);
        assert_eq!(verdict("wan_mem_vs_link_50ms"), Some("pass"));
        assert_eq!(verdict("staging_gain_disk_50ms"), Some("pass"));
        assert_eq!(verdict("viz_vs_gridftp"), Some("missing"));
        let t = targets(&Summary(vec![("staging_gain_disk_50ms".into(), Some(1.0))]));
        assert_eq!(t[3].verdict(), "FAIL", "> 1.0 is strict");
    }

    #[test]
    fn reached_keys_take_the_line_rate_of_ferry_without_flags_and_iperf3_p1() {
        let reached = |mut r: WanRow, g: f64| {
            r.reached_gbit_s = Some(g);
            r
        };
        let rows = vec![
            reached(row("mem", 50, "ferry", "tcp", 0.9), 1.8),
            reached(row("mem", 50, "ferry", "tcp --buffer 64M", 1.0), 1.96),
            reached(row("mem", 50, "iperf3", "-P 1", 1.6), 1.7),
            reached(row("mem", 50, "iperf3", "-P 4", 1.8), 1.9),
            reached(row("mem", 100, "ferry", "tcp", 0.5), 1.0),
        ];
        let (s, names) = summary(&rows, 2_000_000_000);
        assert_eq!(
            s.get("wan_mem_vs_link_50ms"),
            Some(0.45),
            "the average unchanged"
        );
        assert_eq!(s.get("wan_mem_reached_vs_link_50ms"), Some(0.9));
        assert_eq!(
            names["wan_mem_reached_vs_link_50ms"],
            "ferry tcp vs bottleneck"
        );
        assert_eq!(s.get("wan_mem_reached_iperf3_vs_link_50ms"), Some(0.85));
    }

    #[test]
    fn failed_rows_do_not_count() {
        let mut bad = row("mem", 50, "ferry", "tcp", 9.0);
        bad.gbit_s = None;
        bad.error = Some("boom".into());
        let rows = vec![bad, row("mem", 50, "gridftp", "-p 1", 2.0)];
        assert_eq!(summary(&rows, 1).0.get("wan_mem_vs_gridftp_50ms"), None);
    }
}
