//! `ferry bench cio`'s rows, the "resent size" estimate, summary, targets and table.

use std::fmt::Write as _;

use serde::Serialize;

use crate::exs::ExsSummary as Summary;
use crate::report::{num, round, summary_text, Report, Target};

/// One MPI-IO configuration, rank count, count and direction: medians over the timed calls
/// of one `mpirun`, or an error.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct CioRow {
    /// `romio`, `ompio` or `ferry`.
    pub io: String,
    /// `two-phase`, `cb-off` (ROMIO), `vulcan`, `individual` (OMPIO), `ecio`,
    /// `independent` (ferry).
    pub variant: String,
    /// `local` (MPI-IO on the server's root directory) or the ferry driver.
    pub driver: String,
    /// ferry's client settings: `pipeline` (the defaults: write pipelining on, the read
    /// cache off) or `plain` (both off, row `ecio-nocache`); empty for MPI-IO.
    pub client: String,
    /// Ranks.
    pub np: u32,
    /// MPI_INTs over all ranks.
    pub count: u64,
    /// `write` (MPI_File_write_at_all) or `read` (MPI_File_read_at_all).
    pub op: String,
    /// Bytes one collective call moves (4 × count).
    pub bytes: u64,
    /// Timed calls behind the medians.
    pub iters: usize,
    /// Median time of a collective call (its slowest rank), ms.
    pub ms: Option<f64>,
    /// Fastest call, ms.
    pub ms_min: Option<f64>,
    /// Bandwidth at the median, MB/s (10^6 B/s).
    pub mb_s: Option<f64>,
    /// CPU of all ranks per call (user + system, getrusage over the timed calls), ms.
    pub rank_cpu_ms: Option<f64>,
    /// CPU of `ferry serve` per call (its /proc times over the whole `mpirun`, open and
    /// close included, divided by the timed calls), ms; empty for MPI-IO rows.
    pub server_cpu_ms: Option<f64>,
    /// Bytes moved between ranks per call (the seed's "resent size"; see [`resent_bytes`]).
    pub resent_bytes: u64,
    /// Why there is no value.
    pub error: Option<String>,
}

impl CioRow {
    /// `romio two-phase`, `ferry ecio ofi+shm`.
    pub fn label(&self) -> String {
        match self.driver.as_str() {
            "local" => format!("{} {}", self.io, self.variant),
            d => format!("{} {} {d}", self.io, self.variant),
        }
    }

    /// MPI-IO (not ferry).
    pub fn is_mpiio(&self) -> bool {
        self.io != "ferry"
    }
}

/// The report's JSON: the common envelope plus notes on the run.
#[derive(Debug, Clone, Serialize)]
pub struct CioReport {
    /// The common envelope (bench, quick, machine, drivers, rows, summary, targets).
    #[serde(flatten)]
    pub report: Report<CioRow, Summary>,
    /// Notes (missing pieces, the machine's load, how the resent size is estimated).
    pub notes: Vec<String>,
}

/// The seed's pattern: which rank owns int `i` of a file of `count` ints over `np` ranks
/// (ranks 2k and 2k+1 interleave, block length 1, stride 2, in the k-th part of the file).
fn owner(i: u64, count: u64, np: u64) -> u64 {
    if np < 2 {
        return 0;
    }
    let part = (2 * (count / np)).max(1);
    (i / part) * 2 + i % 2
}

/// Bytes a two-phase collective call moves between ranks for the seed's pattern: the file
/// is cut into `aggregators` equal contiguous file domains, aggregator `a` being rank
/// `a × np / aggregators`; every int whose owner is not its domain's aggregator crosses
/// from one rank to another (to the aggregator when writing, from it when reading). On one
/// node ROMIO's default (`cb_config_list` `*:1`) makes one aggregator, which gives
/// (np − 1)/np of the bytes; ECIO, ROMIO with collective buffering off and OMPIO
/// `individual` move nothing between ranks.
pub fn resent_bytes(count: u64, np: u64, aggregators: u64) -> u64 {
    let a = aggregators.clamp(1, np.max(1));
    let moved = (0..count)
        .filter(|&i| {
            let domain = i * a / count.max(1);
            owner(i, count, np) != domain * np / a
        })
        .count() as u64;
    4 * moved
}

/// The goals: (summary key, op, bound).
pub const GOALS: [(&str, &str, f64); 6] = [
    ("ecio_vs_best_mpiio_write_np2_1m", ">=", 1.5),
    ("ecio_vs_best_mpiio_read_np2_1m", ">=", 1.5),
    ("ecio_vs_best_mpiio_write_np4_1m", ">=", 1.5),
    ("ecio_vs_best_mpiio_read_np4_1m", ">=", 1.5),
    ("ecio_vs_twophase_write_np2_1m", ">=", 1.2),
    ("ecio_min_vs_best_mpiio", ">=", 1.0),
];

/// The count the `_1m` keys compare at (the seed's largest).
pub const FULL_COUNT: u64 = 1_024_000;

/// Speed-up of `fast` over `slow` (time ratio slow / fast), three decimals.
fn speedup(slow: Option<f64>, fast: Option<f64>) -> Option<f64> {
    match (slow, fast) {
        (Some(s), Some(f)) if f > 0.0 => Some(round(s / f, 3)).filter(|x| x.is_finite()),
        _ => None,
    }
}

/// The fastest median among `rows` matching `keep` at (np, count, op).
fn fastest(
    rows: &[CioRow],
    np: u32,
    count: u64,
    op: &str,
    keep: &dyn Fn(&CioRow) -> bool,
) -> Option<f64> {
    rows.iter()
        .filter(|r| r.np == np && r.count == count && r.op == op && keep(r))
        .filter_map(|r| r.ms)
        .min_by(f64::total_cmp)
}

/// ECIO (the faster of its drivers) over the best MPI-IO configuration at (np, count, op):
/// how many times faster ferry's collective call is.
fn ecio_vs_best(rows: &[CioRow], np: u32, count: u64, op: &str) -> Option<f64> {
    let ecio = fastest(rows, np, count, op, &|r| r.variant == "ecio");
    speedup(fastest(rows, np, count, op, &CioRow::is_mpiio), ecio)
}

/// The summary: ECIO's speed-up over the best MPI-IO configuration at 1,024k ints for
/// each rank count and direction, over ROMIO two-phase (the seed's comparison), and the
/// lowest speed-up over every measured point.
pub fn summary(rows: &[CioRow]) -> Summary {
    let mut out = Vec::new();
    for np in [2, 4] {
        for op in ["write", "read"] {
            let k = format!("ecio_vs_best_mpiio_{op}_np{np}_1m");
            out.push((k, ecio_vs_best(rows, np, FULL_COUNT, op)));
        }
    }
    let twophase = fastest(rows, 2, FULL_COUNT, "write", &|r| {
        r.io == "romio" && r.variant == "two-phase"
    });
    let ecio = fastest(rows, 2, FULL_COUNT, "write", &|r| r.variant == "ecio");
    out.push((
        "ecio_vs_twophase_write_np2_1m".into(),
        speedup(twophase, ecio),
    ));
    let mut points: Vec<(u32, u64, &str)> = rows
        .iter()
        .map(|r| (r.np, r.count, r.op.as_str()))
        .collect();
    points.sort();
    points.dedup();
    let min = points
        .iter()
        .filter_map(|&(np, count, op)| ecio_vs_best(rows, np, count, op))
        .min_by(f64::total_cmp);
    out.push(("ecio_min_vs_best_mpiio".into(), min));
    Summary(out)
}

/// Each goal checked.
pub fn targets(s: &Summary) -> Vec<Target> {
    GOALS
        .iter()
        .map(|(k, op, t)| Target::check(k, op, *t, s.get(k)))
        .collect()
}

impl CioReport {
    /// The human-readable table.
    pub fn table(&self) -> String {
        let rep = &self.report;
        let m = &rep.machine;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "ferry bench cio{}: the seed's pattern (MPI_INT, block length 1, stride 2), \
             {} cores, Linux {}, load {}; median time per collective call (slowest rank)",
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
            "\n{:<28} {:>2} {:>8} {:<5} {:>5} {:>10} {:>10} {:>9} {:>9} {:>9} {:>10} client",
            "MPI-IO",
            "np",
            "count",
            "op",
            "iters",
            "ms",
            "min ms",
            "MB/s",
            "rank cpu",
            "srv cpu",
            "resent B"
        );
        for r in &rep.rows {
            let _ = write!(
                s,
                "{:<28} {:>2} {:>8} {:<5} ",
                r.label(),
                r.np,
                r.count,
                r.op
            );
            if let Some(e) = &r.error {
                let _ = writeln!(s, "{e}");
                continue;
            }
            let _ = writeln!(
                s,
                "{:>5} {} {} {} {} {} {:>10} {}",
                r.iters,
                num(r.ms, 10, 2),
                num(r.ms_min, 10, 2),
                num(r.mb_s, 9, 1),
                num(r.rank_cpu_ms, 9, 2),
                num(r.server_cpu_ms, 9, 2),
                r.resent_bytes,
                r.client
            );
        }
        let _ = writeln!(
            s,
            "\nsummary (speed-up: MPI-IO's time / ferry ECIO's, higher is better):"
        );
        summary_text(&mut s, &rep.summary.0, &rep.targets, None, 36);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(io: &str, variant: &str, np: u32, count: u64, op: &str, ms: f64) -> CioRow {
        CioRow {
            io: io.into(),
            variant: variant.into(),
            driver: if io == "ferry" { "tcp" } else { "local" }.into(),
            np,
            count,
            op: op.into(),
            bytes: 4 * count,
            iters: 3,
            ms: Some(ms),
            ..CioRow::default()
        }
    }

    #[test]
    fn resent_size_of_the_seed_pattern() {
        // One aggregator: every byte of the other ranks moves.
        assert_eq!(resent_bytes(1000, 2, 1), 2000);
        assert_eq!(resent_bytes(1000, 4, 1), 3000);
        // Two aggregators at np 4 (ranks 0 and 2), each domain one interleaved part:
        // half of each domain's ints belong to the other rank of its pair.
        assert_eq!(resent_bytes(1000, 4, 2), 2000);
        // As many aggregators as ranks at np 2: the domains cut the interleaving.
        assert_eq!(resent_bytes(1000, 2, 2), 2000);
    }

    #[test]
    fn csv_columns_are_the_documented_ones() {
        let csv = crate::report::csv::<CioRow>(&[]).unwrap();
        assert_eq!(
            csv,
            "io,variant,driver,client,np,count,op,bytes,iters,ms,ms_min,mb_s,rank_cpu_ms,\
             server_cpu_ms,resent_bytes,error\n"
        );
    }

    #[test]
    fn ratios_against_the_best_mpiio() {
        let rows = vec![
            row("romio", "two-phase", 2, FULL_COUNT, "write", 600.0),
            row("romio", "cb-off", 2, FULL_COUNT, "write", 60.0),
            row("ompio", "individual", 2, FULL_COUNT, "write", 90.0),
            row("ferry", "ecio", 2, FULL_COUNT, "write", 30.0),
            row("ferry", "independent", 2, FULL_COUNT, "write", 10.0),
            row("romio", "cb-off", 2, 4000, "read", 1.0),
            row("ferry", "ecio", 2, 4000, "read", 2.0),
        ];
        let s = summary(&rows);
        assert_eq!(s.get("ecio_vs_best_mpiio_write_np2_1m"), Some(2.0));
        assert_eq!(s.get("ecio_vs_twophase_write_np2_1m"), Some(20.0));
        assert_eq!(s.get("ecio_min_vs_best_mpiio"), Some(0.5));
        assert_eq!(s.get("ecio_vs_best_mpiio_read_np4_1m"), None);
        let t = targets(&s);
        let verdict = |k: &str| t.iter().find(|t| t.metric == k).map(Target::verdict);
        assert_eq!(verdict("ecio_vs_best_mpiio_write_np2_1m"), Some("pass"));
        assert_eq!(verdict("ecio_min_vs_best_mpiio"), Some("FAIL"));
        assert_eq!(verdict("ecio_vs_best_mpiio_read_np4_1m"), Some("missing"));
    }
}
