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
mod pairs;
mod peer;
mod pingpong;
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
use capi::{Lang, PingPong, Programs};
use client::{Client, Measured};
use conn::Wait;
use grid::{grid_of, Cell, Kind, Plan, REGION};
use pairs::Pairs;
use pingpong::Opts;
use report::ExsRow;
pub use report::ExsSummary;

pub use peer::run as run_peer;
pub use pingpong::run as run_pingpong;

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
    /// Measure only latency (every mode, and the paired Rust and C ping-pongs): the latency
    /// ratios, `capi_vs_rust_latency` and `poll_vs_block_latency` included, in a fraction
    /// of the time.
    #[arg(long, conflicts_with = "large_only")]
    latency_only: bool,
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
    let plan = match (args.large_only, args.latency_only) {
        (true, _) => Plan::new(args.quick).large_only(),
        (_, true) => Plan::new(args.quick).latency_only(),
        _ => Plan::new(args.quick),
    };
    let drivers = addr::drivers(&args.drivers)?;
    let mut grid: Vec<Vec<Cell>> = drivers.iter().map(|d| grid_of(d, &plan)).collect();
    let mut status: Vec<DriverStatus> = drivers.iter().map(|d| DriverStatus::new(d)).collect();
    let mut blast = Cell::new("socket", "stream", Kind::Blast(grid::LARGE));
    let memcpy = Memcpy::new().measure(5).value;
    let mut programs = ping_pong_programs(&grid);
    let mut pairs: Vec<Pairs> = drivers.iter().map(|d| Pairs::new(d)).collect();
    let mut n = 0;
    for rep in 1..=plan.reps {
        for ((cells, st), pairs) in grid.iter_mut().zip(&mut status).zip(&mut pairs) {
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
            if let Some(p) = programs.as_mut() {
                latency_pairs(&plan, &mut n, p, cells, pairs);
            }
            n += 1;
            let fabric = cells
                .last_mut()
                .filter(|c| matches!(c.kind, Kind::FabricRead(_)));
            if let Some(c) = fabric {
                match fabric_read(&plan, &st.driver, n) {
                    Ok(m) => c.add(m),
                    Err(e) => c.fail(format!("fabric reference: {e:#}")),
                }
            }
        }
        if plan.sizes.is_empty() {
            continue; // latency only: no stream point to compare with the socket
        }
        tracing::info!("reference: TCP socket blast");
        n += 1;
        match socket_blast(&plan, n) {
            Ok(m) => blast.add(m),
            Err(e) => blast.fail(format!("{e:#}")),
        }
    }
    let mut rows: Vec<ExsRow> = grid.into_iter().flatten().map(Cell::row).collect();
    if !plan.sizes.is_empty() {
        rows.push(blast.row());
    }
    let summary = report::summary(&rows, &drivers, &pairs);
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
                Kind::Latency(_, size) => client.latency(size, plan.warm, plan.pings),
                Kind::PingPong(..) | Kind::FabricRead(_) | Kind::Blast(_) => continue,
            };
            let what = format!("{} {} {} B", mode.name(), c.op, grid_size(c.kind));
            c.add(m.with_context(|| what)?);
        }
        client.close()?;
    }
    Ok(())
}

/// The ping-pong programs, if the grid has paired ping-pong cells (the C one built then).
fn ping_pong_programs(grid: &[Vec<Cell>]) -> Option<Programs> {
    let wanted = grid
        .iter()
        .flatten()
        .any(|c| matches!(c.kind, Kind::PingPong(..)));
    if !wanted {
        return None;
    }
    tracing::info!("building libferry.so and tests/c/latency.c for the C-API rows");
    Some(Programs::build())
}

/// One repetition's paired ping-pong rounds on a driver (see [`pairs`]): each round a run
/// of the Rust program and one of the C program, moments apart; which goes first, and
/// whether the runs poll or block first, alternate from round to round. A program that
/// fails once fails its rows and is not run again.
fn latency_pairs(
    plan: &Plan,
    n: &mut usize,
    programs: &mut Programs,
    cells: &mut [Cell],
    pairs: &mut Pairs,
) {
    if let Some(why) = programs.c_missing() {
        let c_cells = cells.iter_mut().filter(|c| is_pingpong(c, Lang::C));
        c_cells.for_each(|c| c.fail(why));
    }
    for _ in 0..plan.pair_rounds {
        let round = pairs.rounds();
        let o = Opts {
            rounds: plan.pair_pings,
            warm: plan.warm,
            small: 0,
            poll_first: round % 2 == 1,
        };
        let order = match round % 2 {
            0 => [Lang::Rust, Lang::C],
            _ => [Lang::C, Lang::Rust],
        };
        let mut got: Vec<(Lang, PingPong)> = Vec::new();
        for lang in order {
            // A program that failed (or is missing) is not run again: its rows are void.
            if cells.iter().any(|c| is_pingpong(c, lang) && c.failed()) {
                continue;
            }
            *n += 1;
            let run = addr::address(&pairs.driver, *n).and_then(|a| programs.run(lang, &a, o));
            match run {
                Ok(m) => got.push((lang, m)),
                Err(e) => {
                    let why = format!("{lang:?} ping-pong: {e:#}");
                    tracing::warn!("{}: {why}", pairs.driver);
                    let failed = cells.iter_mut().filter(|c| is_pingpong(c, lang));
                    failed.for_each(|c| c.fail(why.clone()));
                }
            }
        }
        for (lang, m) in &got {
            for c in cells.iter_mut().filter(|c| is_pingpong(c, *lang)) {
                c.add(pingpong_measured(c.kind, m));
            }
        }
        let of = |lang| got.iter().find(|(l, _)| *l == lang).map(|(_, m)| m);
        if let Some(rust) = of(Lang::Rust) {
            pairs.add(rust, of(Lang::C));
        }
    }
}

fn is_pingpong(c: &Cell, lang: Lang) -> bool {
    matches!(c.kind, Kind::PingPong(l, ..) if l == lang)
}

/// The phase of `m` that a ping-pong cell of `kind` records (the run's CPU for either).
fn pingpong_measured(kind: Kind, m: &PingPong) -> Measured {
    let value = match kind {
        Kind::PingPong(_, Wait::Poll, _) => m.poll_us,
        _ => m.block_us,
    };
    Measured {
        value,
        bytes: 0,
        send_cpu: m.send_cpu,
        recv_cpu: m.recv_cpu,
    }
}

fn grid_size(k: Kind) -> usize {
    match k {
        Kind::Stream(_, s, _)
        | Kind::Latency(_, s)
        | Kind::PingPong(_, _, s)
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
