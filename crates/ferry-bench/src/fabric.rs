//! `ferry bench fabric`: per driver, bandwidth of send, RMA write and RMA read by size and
//! 8-byte ping-pong latency, interleaved with iperf3 and memcpy references (A B A B).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use super::addr;
use super::fabric_report::{Row, Summary};
use super::refs::{self, Memcpy, IPERF3_WRITE, MEMCPY_BYTES};
use super::report::{self, median, round, DriverStatus, Machine, Report};
use super::session::{Op, Sample, Session};

/// Buffer bytes each side sets aside for operations in flight.
const INFLIGHT: usize = 64 << 20;
const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// Options of `ferry bench fabric`.
#[derive(Args)]
pub struct FabricArgs {
    /// Short run (under a minute): fewer sizes, smaller totals, one repetition.
    #[arg(long)]
    quick: bool,
    /// Print exactly one JSON object on stdout instead of the table (files only with --out).
    #[arg(long)]
    json: bool,
    /// Drivers to measure, comma-separated (tcp, ofi+tcp, ofi+shm, ofi+<provider>).
    #[arg(long, value_delimiter = ',', default_value = "tcp,ofi+tcp,ofi+shm")]
    drivers: Vec<String>,
    /// Where to write CSV, JSON and PNG [default without --json: bench/results/fabric].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// How much to measure.
struct Plan {
    sizes: Vec<usize>,
    total: u64,
    cap: Duration,
    reps: usize,
    pings: usize,
    ping_cap: Duration,
    iperf3_secs: u32,
    memcpy_reps: usize,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                sizes: vec![64 * KIB, MIB, 4 * MIB, 16 * MIB],
                total: 512 << 20,
                cap: Duration::from_millis(800),
                reps: 1,
                pings: 2_000,
                ping_cap: Duration::from_millis(300),
                iperf3_secs: 1,
                memcpy_reps: 5,
            }
        } else {
            Plan {
                sizes: (0..7).map(|i| (4 * KIB) << (2 * i)).collect(),
                total: 1 << 30,
                cap: Duration::from_secs(2),
                reps: 3,
                pings: 20_000,
                ping_cap: Duration::from_secs(2),
                iperf3_secs: 3,
                memcpy_reps: 10,
            }
        }
    }
}

/// What a cell measures.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Bulk(Op, usize),
    Latency,
}

/// One point of the grid, accumulating repetitions.
struct Cell {
    driver: String,
    op: &'static str,
    size: u64,
    kind: Option<Kind>,
    vals: Vec<f64>,
    cpu: Vec<f64>,
    per_cpu: Vec<f64>,
    error: Option<String>,
}

impl Cell {
    fn new(driver: &str, op: &'static str, size: usize, kind: Option<Kind>) -> Cell {
        Cell {
            driver: driver.into(),
            op,
            size: size as u64,
            kind,
            vals: vec![],
            cpu: vec![],
            per_cpu: vec![],
            error: None,
        }
    }

    fn add(&mut self, s: Sample) {
        self.vals.push(s.value);
        if let Some(c) = s.cpu_s {
            self.cpu.push(c);
            if c > 0.0 && self.kind != Some(Kind::Latency) {
                self.per_cpu.push(s.value * s.secs / c);
            }
        }
    }

    fn fail(&mut self, why: impl Into<String>) {
        self.error.get_or_insert_with(|| why.into());
    }

    fn row(mut self) -> Row {
        let ok = self.error.is_none();
        // Medians, rounded to what the clocks can tell apart.
        let mid =
            |v: &mut Vec<f64>, digits: i32| median(v).filter(|_| ok).map(|x| round(x, digits));
        let value = mid(&mut self.vals, 4);
        let latency = self.kind == Some(Kind::Latency);
        Row {
            driver: self.driver,
            op: self.op.into(),
            size: self.size,
            gbps: value.filter(|_| !latency),
            usec: value.filter(|_| latency),
            cpu_s: mid(&mut self.cpu, 6),
            gb_per_cpu_s: mid(&mut self.per_cpu, 4),
            reps: if ok { self.vals.len() } else { 0 },
            error: self.error,
        }
    }
}

/// Runs the benchmark and prints (and writes) the report.
pub fn run(args: &FabricArgs) -> Result<()> {
    let plan = Plan::new(args.quick);
    let drivers = addr::drivers(&args.drivers)?;
    let mut grid: Vec<Vec<Cell>> = drivers.iter().map(|d| grid_of(d, &plan)).collect();
    let mut status: Vec<DriverStatus> = drivers.iter().map(|d| DriverStatus::new(d)).collect();
    let mut iperf3 = Cell::new("iperf3", "stream", IPERF3_WRITE, None);
    let mut memcpy = Cell::new("memcpy", "copy", MEMCPY_BYTES, None);
    let mut mc = Memcpy::new();
    mc.measure(1);
    let mut session = 0;
    for rep in 1..=plan.reps {
        for ((d, cells), st) in drivers.iter().zip(&mut grid).zip(&mut status) {
            if st.error.is_some() {
                continue;
            }
            tracing::info!("{d}: repetition {rep}/{}", plan.reps);
            session += 1;
            if let Err(e) = run_session(&plan, d, session, cells, st) {
                let why = format!("{e:#}");
                tracing::warn!("{d} failed: {why}");
                cells.iter_mut().for_each(|c| c.fail(why.clone()));
                st.error = Some(why);
            }
        }
        tracing::info!("references: iperf3, memcpy");
        match refs::iperf3(plan.iperf3_secs) {
            Ok(s) => iperf3.add(s),
            Err(e) => iperf3.fail(format!("{e:#}")),
        }
        memcpy.add(mc.measure(plan.memcpy_reps));
    }
    let mut rows: Vec<Row> = grid.into_iter().flatten().map(Cell::row).collect();
    rows.extend([iperf3.row(), memcpy.row()]);
    let summary = Summary::from_rows(&rows);
    let report = Report {
        bench: "fabric",
        quick: args.quick,
        machine: Machine::detect(summary.memcpy_gbps),
        drivers: status,
        rows,
        summary,
        targets: vec![],
    };
    let png = |p: &std::path::Path| report.png(p);
    report::emit(
        "fabric",
        &report,
        &report.rows,
        &report.table(),
        &png,
        args.json,
        args.out.as_deref(),
    )
}

fn grid_of(driver: &str, plan: &Plan) -> Vec<Cell> {
    let mut cells: Vec<Cell> = Op::ALL
        .iter()
        .flat_map(|&op| plan.sizes.iter().map(move |&s| (op, s)))
        .map(|(op, s)| Cell::new(driver, op.name(), s, Some(Kind::Bulk(op, s))))
        .collect();
    cells.push(Cell::new(driver, "latency", 8, Some(Kind::Latency)));
    cells
}

/// One connection to a fresh peer: warm-up, then every cell of the driver once.
fn run_session(
    plan: &Plan,
    driver: &str,
    n: usize,
    cells: &mut [Cell],
    st: &mut DriverStatus,
) -> Result<()> {
    let mut s = Session::open(&addr::address(driver, n)?, INFLIGHT)?;
    let caps = s.caps().clone();
    st.provider = Some(caps.provider.clone());
    let warm = if caps.rma { Op::Write } else { Op::Send };
    s.bandwidth(warm, MIB, 32 << 20, Duration::from_millis(200))
        .context("warm-up")?;
    s.latency(100, Duration::from_millis(100))
        .context("warm-up")?;
    for c in cells.iter_mut() {
        let sample = match c.kind {
            Some(Kind::Bulk(op, _)) if op != Op::Send && !caps.rma => {
                c.fail("driver reports no RMA");
                continue;
            }
            Some(Kind::Bulk(_, size)) if size as u64 > caps.max_msg_size => {
                c.fail(format!("driver's max message is {} B", caps.max_msg_size));
                continue;
            }
            Some(Kind::Bulk(op, size)) => s.bandwidth(op, size, plan.total, plan.cap),
            _ => s.latency(plan.pings, plan.ping_cap),
        };
        c.add(sample.with_context(|| format!("{} {} B", c.op, c.size))?);
    }
    s.close()
}
