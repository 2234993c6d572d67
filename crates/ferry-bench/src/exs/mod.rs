//! `ferry bench exs`: the UNH-EXS paper's measurements on each driver, with the EXS peer in
//! its own process — throughput by payload in normal, immediate and persistent mode,
//! throughput by transfers in flight, latency, CPU of each side — against a plain blocking TCP
//! socket blast and the driver's raw fabric RMA read, interleaved per repetition (A B A B).
//!
//! The fabric reference reuses `bench fabric`'s [`Session`]: a fabric-peer process, RMA read
//! (EXS's pull path) of 16 MiB with 4 reads in flight, exactly as `bench fabric` measures it.

mod capi;
mod client;
mod cmd;
mod conn;
mod grid;
mod peer;
mod plot;
mod report;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use super::addr;
use super::refs::Memcpy;
use super::report::{emit, DriverStatus, Machine, Report};
use super::session::{Op, Session};
use client::{Client, Measured};
use conn::Wait;
use grid::{grid_of, Cell, Kind, Plan, REGION};
use report::ExsRow;
pub use report::ExsSummary;

pub use peer::run as run_peer;

/// Options of `ferry bench exs`.
#[derive(Args)]
pub struct ExsArgs {
    /// Short run (under a minute): fewer sizes and rounds, smaller totals, one repetition.
    #[arg(long)]
    quick: bool,
    /// Measure only the 16 MiB stream point (normal and persistent) and the fabric
    /// reference: the `large_vs_fabric` ratios, in a fraction of the time.
    #[arg(long)]
    large_only: bool,
    /// Print exactly one JSON object on stdout instead of the table (files only with --out).
    #[arg(long)]
    json: bool,
    /// Drivers to measure, comma-separated (tcp, ofi+tcp, ofi+shm, ofi+<provider>).
    #[arg(long, value_delimiter = ',', default_value = "tcp,ofi+tcp,ofi+shm")]
    drivers: Vec<String>,
    /// Where to write CSV, JSON and PNG [default without --json: bench/results/exs].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Runs the benchmark and prints (and writes) the report.
pub fn run(args: &ExsArgs) -> Result<()> {
    let plan = match args.large_only {
        true => Plan::new(args.quick).large_only(),
        false => Plan::new(args.quick),
    };
    let drivers = addr::drivers(&args.drivers)?;
    let mut grid: Vec<Vec<Cell>> = drivers.iter().map(|d| grid_of(d, &plan)).collect();
    let mut status: Vec<DriverStatus> = drivers.iter().map(|d| DriverStatus::new(d)).collect();
    let mut blast = Cell::new("socket", "stream", Kind::Blast(grid::LARGE));
    let memcpy = Memcpy::new().measure(5).value;
    let mut c_api = c_ping_pong(&grid);
    let mut n = 0;
    for rep in 1..=plan.reps {
        for (cells, st) in grid.iter_mut().zip(&mut status) {
            if st.error.is_some() {
                continue;
            }
            tracing::info!("{}: repetition {rep}/{}", st.driver, plan.reps);
            n += 1;
            if let Err(e) = exs_session(&plan, n, cells, st) {
                let why = format!("{e:#}");
                tracing::warn!("{} failed: {why}", st.driver);
                for c in cells.iter_mut().filter(|c| c.mode().is_some()) {
                    c.fail(why.clone());
                }
                st.error = Some(why);
            }
            if let Some(c) = cells
                .iter_mut()
                .find(|c| matches!(c.kind, Kind::CapiLatency(_)))
            {
                n += 1;
                c_api_latency(&plan, n, &mut c_api, c);
            }
            n += 1;
            if let Some(c) = cells.last_mut() {
                match fabric_read(&plan, &st.driver, n) {
                    Ok(m) => c.add(m),
                    Err(e) => c.fail(format!("fabric reference: {e:#}")),
                }
            }
        }
        tracing::info!("reference: TCP socket blast");
        n += 1;
        match socket_blast(&plan, n) {
            Ok(m) => blast.add(m),
            Err(e) => blast.fail(format!("{e:#}")),
        }
    }
    let mut rows: Vec<ExsRow> = grid.into_iter().flatten().map(Cell::row).collect();
    rows.push(blast.row());
    let summary = report::summary(&rows, &drivers);
    let report = Report {
        bench: "exs",
        quick: args.quick,
        machine: Machine::detect(Some(super::report::round(memcpy, 3))),
        drivers: status,
        targets: report::targets(&summary),
        rows,
        summary,
    };
    output(&report, args)
}

/// One peer process for `cell`'s driver: each mode on its own connection, warmed up, then
/// every cell of that mode once.
fn exs_session(plan: &Plan, n: usize, cells: &mut [Cell], st: &mut DriverStatus) -> Result<()> {
    let mut client = Client::spawn(&addr::address(&st.driver, n)?)?;
    for mode in conn::Mode::ALL {
        if !cells.iter().any(|c| c.mode() == Some(mode)) {
            continue;
        }
        client
            .open(mode, REGION)
            .with_context(|| format!("opening a {} connection", mode.name()))?;
        st.provider = client.provider.clone();
        client
            .stream(64 << 10, 64, 8)
            .with_context(|| format!("{} warm-up", mode.name()))?;
        for c in cells.iter_mut().filter(|c| c.mode() == Some(mode)) {
            let m = match c.kind {
                Kind::Stream(_, size, window) => {
                    client.stream(size, plan.count(c.op, size, window), window)
                }
                Kind::Latency(_, size) => client.latency(size, plan.warm, plan.pings, Wait::Block),
                Kind::PollLatency(size) => client.latency(size, plan.warm, plan.pings, Wait::Poll),
                Kind::CapiLatency(_) | Kind::FabricRead(_) | Kind::Blast(_) => continue,
            };
            let what = format!("{} {} {} B", mode.name(), c.op, grid_size(c.kind));
            c.add(m.with_context(|| what)?);
        }
        client.close()?;
    }
    Ok(())
}

/// The C ping-pong, built if the grid has a C-API cell (or why it could not be).
fn c_ping_pong(grid: &[Vec<Cell>]) -> Option<Result<capi::CPingPong, String>> {
    let wanted = grid
        .iter()
        .flatten()
        .any(|c| matches!(c.kind, Kind::CapiLatency(_)));
    if !wanted {
        return None;
    }
    tracing::info!("building libferry.so and tests/c/latency.c for the C-API row");
    let built = capi::CPingPong::build().map_err(|e| format!("C-API row not built: {e:#}"));
    if let Err(why) = &built {
        tracing::warn!("{why}");
    }
    Some(built)
}

/// One repetition of `cell`'s C-API ping-pong (the cell fails if the program is missing).
fn c_api_latency(
    plan: &Plan,
    n: usize,
    c_api: &mut Option<Result<capi::CPingPong, String>>,
    cell: &mut Cell,
) {
    let m = match c_api {
        Some(Ok(pp)) => addr::address(&cell.driver, n)
            .and_then(|a| pp.run(&a, grid_size(cell.kind), plan.warm, plan.pings)),
        Some(Err(why)) => return cell.fail(why.clone()),
        None => return cell.fail("C-API row not built"),
    };
    match m {
        Ok(m) => cell.add(m),
        Err(e) => cell.fail(format!("C-API ping-pong: {e:#}")),
    }
}

fn grid_size(k: Kind) -> usize {
    match k {
        Kind::Stream(_, s, _)
        | Kind::Latency(_, s)
        | Kind::PollLatency(s)
        | Kind::CapiLatency(s)
        | Kind::FabricRead(s)
        | Kind::Blast(s) => s,
    }
}

/// The driver's raw RMA read bandwidth at 16 MiB through `bench fabric`'s session (after a
/// short warm-up); the peer is the target, so its CPU counts as the sender's.
fn fabric_read(plan: &Plan, driver: &str, n: usize) -> Result<Measured> {
    let mut s = Session::open(&addr::address(driver, n)?, REGION)?;
    let cap = Duration::from_secs(30);
    s.bandwidth(Op::Read, 1 << 20, 32 << 20, cap)
        .context("warm-up")?;
    let size = grid::LARGE;
    let total = plan.count("stream", size, grid::window(size)) * size as u64;
    let m = s.bandwidth(Op::Read, size, total, cap)?;
    ferry_fabric::timeline::flush();
    s.close()?;
    let send_cpu = m.peer_cpu_s.unwrap_or(0.0);
    Ok(Measured {
        value: m.value,
        bytes: (m.value * m.secs * 1e9) as u64,
        send_cpu,
        recv_cpu: m.cpu_s.unwrap_or(0.0) - send_cpu,
    })
}

/// The plain TCP socket reference: as many bytes as EXS moves at 16 MiB, in 16 MiB writes.
fn socket_blast(plan: &Plan, n: usize) -> Result<Measured> {
    let mut c = Client::spawn(&addr::address("tcp", n)?)?;
    let size = grid::LARGE;
    c.blast(size, 64 << 20).context("warm-up")?;
    c.blast(
        size,
        plan.count("stream", size, grid::window(size)) * size as u64,
    )
}

fn output(report: &Report<ExsRow, ExsSummary>, args: &ExsArgs) -> Result<()> {
    let png = |p: &std::path::Path| report.png(p);
    emit(
        "exs",
        report,
        &report.rows,
        &report.table(),
        &png,
        args.json,
        args.out.as_deref(),
    )
}
