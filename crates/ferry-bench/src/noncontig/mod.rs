//! `ferry bench noncontig`: the EXIO experiment (figure 5 of the paper) on each driver.
//!
//! Each message is split into 16 segments 1 MiB apart (a vector: 16 blocks of size/16,
//! stride 1 MiB) on both sides. Three methods move it, per message, each ending with the
//! notification EXIO sends after its writes (a request the peer answers):
//!
//! - `contig`: one RMA write of the whole message from a contiguous buffer into a
//!   contiguous range — the ceiling;
//! - `pack`: pack locally into a registered staging buffer, one contiguous RMA write into
//!   the peer's staging area, and the peer unpacks into its noncontiguous layout;
//! - `zerocopy`: the noncontig engine, noncontiguous local → noncontiguous remote, one
//!   gathered RMA write per destination segment, all in flight together.
//!
//! The peer is `bench fabric`'s peer process ([`Session`]), which also unpacks. Messages
//! use 4 slots of 16 MiB in turn on each side (64 MiB of application data, beyond the
//! last-level cache, as EXIO's layouts were on its machines); staging is one reused area.
//! Methods interleave per size and repetition (A B C A B C …); CPU is getrusage of both
//! processes.

mod report;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use clap::Args;
use ferry_fabric::{Access, Buffer, MemoryRegion};
use ferry_noncontig::{pack_to_buffer, Datatype, LocalLayout, Options, Path, RemoteLayout};

use super::addr;
use super::cpu;
use super::refs::Memcpy;
use super::report::{emit, median, round, DriverStatus, Machine, Report};
use super::session::Session;
pub use report::{NcRow, NcSummary};

/// Segments per message.
const BLOCKS: u64 = super::proto::UNPACK_BLOCKS;
/// Distance between the starts of consecutive segments.
const STRIDE: u64 = 1 << 20;
/// Largest message: 16 segments of 1 MiB.
const MAX_SIZE: u64 = BLOCKS * STRIDE;
/// Message slots on each side, used in turn: the application data spans 64 MiB, more than
/// the last-level cache (32 MiB here), as EXIO's 16 MiB layouts did on its 2008 machines —
/// with one reused slot, packing would run at cache speed and measure the cache.
const SLOTS: u64 = 4;
/// Where the staging area starts in each side's region, after the slots. Staging is one
/// reused area, as a real packing layer's would be.
const STAGE: u64 = SLOTS * MAX_SIZE;
/// Each side's region: the slots, then staging.
const REGION: usize = ((SLOTS + 1) * MAX_SIZE) as usize;

/// The methods, in the order they run and are reported.
pub const METHODS: [&str; 3] = ["contig", "pack", "zerocopy"];

/// Options of `ferry bench noncontig`.
#[derive(Args)]
pub struct NoncontigArgs {
    /// Short run (under a minute): fewer sizes and messages, one repetition.
    #[arg(long)]
    quick: bool,
    /// Print exactly one JSON object on stdout instead of the table (files only with --out).
    #[arg(long)]
    json: bool,
    /// Drivers to measure, comma-separated (tcp, ofi+tcp, ofi+shm, ofi+<provider>).
    #[arg(long, value_delimiter = ',', default_value = "tcp,ofi+shm")]
    drivers: Vec<String>,
    /// Where to write CSV, JSON and PNG [default without --json: bench/results/noncontig].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Only these message sizes, in bytes, comma-separated (each 16 blocks of at most
    /// 1 MiB), e.g. `--sizes 4194304` to iterate on one point.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<u64>,
    /// Repetitions (interleaved; medians are reported) instead of the plan's 3 (1 quick).
    #[arg(long)]
    reps: Option<usize>,
    /// Only these methods (contig, pack, zerocopy), e.g. to profile one.
    #[arg(long, value_delimiter = ',')]
    methods: Vec<String>,
    /// Zero-copy: at most this many destination segments per operation (the engine's
    /// `Options::max_remote_segments`; default: the driver's `rma_iov_limit`).
    #[arg(long)]
    max_remote_segments: Option<usize>,
}

/// Sizes, message counts and repetitions.
struct Plan {
    sizes: Vec<u64>,
    messages: u64,
    warm: u64,
    /// Most bytes per point (large messages send fewer than `messages`).
    cap_bytes: u64,
    reps: usize,
    /// Methods to run (all when empty).
    only: Vec<String>,
    /// Zero-copy's cap on destination segments per operation (`None`: the driver's).
    max_remote_segments: Option<usize>,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                sizes: vec![64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20],
                messages: 400,
                warm: 10,
                cap_bytes: 1 << 30,
                reps: 1,
                only: Vec::new(),
                max_remote_segments: None,
            }
        } else {
            Plan {
                sizes: (16..=24).map(|s| 1u64 << s).collect(),
                messages: 2000,
                warm: 50,
                cap_bytes: 2 << 30,
                reps: 3,
                only: Vec::new(),
                max_remote_segments: None,
            }
        }
    }

    fn count(&self, size: u64) -> u64 {
        self.messages.min(self.cap_bytes / size).max(8)
    }
}

/// One method's measurement at one size.
#[derive(Debug, Clone, Copy)]
struct Measured {
    gbps: f64,
    client_cpu_s: f64,
    peer_cpu_s: f64,
    messages: u64,
    /// RMA operations per message.
    ops: u64,
    /// The 10th percentile of the per-message wall times, µs (data and notification).
    p10_us: f64,
}

/// Runs the benchmark and prints (and writes) the report.
pub fn run(args: &NoncontigArgs) -> Result<()> {
    let mut plan = Plan::new(args.quick);
    if !args.sizes.is_empty() {
        plan.sizes = args.sizes.clone();
    }
    if let Some(r) = args.reps {
        plan.reps = r.max(1);
    }
    plan.only = args.methods.clone();
    plan.max_remote_segments = args.max_remote_segments;
    let drivers = addr::drivers(&args.drivers)?;
    let memcpy = Memcpy::new().measure(5).value;
    let mut status: Vec<DriverStatus> = drivers.iter().map(|d| DriverStatus::new(d)).collect();
    let mut rows = Vec::new();
    for (i, st) in status.iter_mut().enumerate() {
        tracing::info!("{}: noncontig", st.driver);
        match driver_rows(&plan, &st.driver, i) {
            Ok((provider, r)) => {
                st.provider = Some(provider);
                rows.extend(r);
            }
            Err(e) => {
                let why = format!("{e:#}");
                tracing::warn!("{} failed: {why}", st.driver);
                for size in &plan.sizes {
                    for m in METHODS {
                        rows.push(NcRow::failed(&st.driver, m, *size, &why));
                    }
                }
                st.error = Some(why);
            }
        }
    }
    let summary = NcSummary::from_rows(&rows);
    let report = Report {
        bench: "noncontig",
        quick: args.quick,
        machine: Machine::detect(Some(round(memcpy, 3))),
        drivers: status,
        targets: summary.targets(),
        rows,
        summary,
    };
    output(&report, args)
}

/// Every size and method on one driver, `plan.reps` times interleaved; medians.
fn driver_rows(plan: &Plan, driver: &str, n: usize) -> Result<(String, Vec<NcRow>)> {
    let mut s = Session::open(&addr::address(driver, n)?, REGION)?;
    let provider = s.caps().provider.clone();
    let local = s
        .endpoint()
        .domain()
        .register(&Buffer::new(REGION), Access::LOCAL)?;
    for (i, chunk) in (0..REGION).step_by(4096).enumerate() {
        local.buffer().write_at(chunk, &[i as u8; 1]);
    }
    let mut samples: Vec<Vec<Vec<Measured>>> =
        vec![vec![Vec::new(); METHODS.len()]; plan.sizes.len()];
    for rep in 1..=plan.reps {
        tracing::info!("{driver}: repetition {rep}/{}", plan.reps);
        for (si, &size) in plan.sizes.iter().enumerate() {
            for (mi, m) in METHODS.iter().enumerate() {
                if !plan.only.is_empty() && !plan.only.iter().any(|o| o == m) {
                    continue;
                }
                if rep == 1 {
                    measure(&mut s, &local, m, size, plan.warm, plan.max_remote_segments)
                        .with_context(|| format!("{m} {size} B warm-up"))?;
                }
                let got = measure(
                    &mut s,
                    &local,
                    m,
                    size,
                    plan.count(size),
                    plan.max_remote_segments,
                )
                .with_context(|| format!("{m} {size} B"))?;
                samples[si][mi].push(got);
            }
        }
    }
    s.close()?;
    let mut rows = Vec::new();
    for (si, &size) in plan.sizes.iter().enumerate() {
        for (mi, m) in METHODS.iter().enumerate() {
            if samples[si][mi].is_empty() {
                continue;
            }
            rows.push(NcRow::from_samples(driver, m, size, &samples[si][mi]));
        }
    }
    Ok((provider, rows))
}

fn vector(size: u64) -> Result<Datatype> {
    Ok(Datatype::hvector(
        BLOCKS,
        size / BLOCKS,
        STRIDE as i64,
        &Datatype::byte(),
    )?)
}

/// Sends `count` messages of `size` bytes with method `m`; returns GB/s and CPU.
fn measure(
    s: &mut Session,
    local: &MemoryRegion,
    m: &str,
    size: u64,
    count: u64,
    max_remote_segments: Option<usize>,
) -> Result<Measured> {
    ensure!(
        size.is_multiple_of(BLOCKS) && size <= MAX_SIZE,
        "size {size} is not 16 blocks of at most 1 MiB"
    );
    let remote = s.remote();
    let layout = vector(size)?;
    let contig = Datatype::byte();
    let stage_remote = RemoteLayout::new(remote.sub(STAGE, size)?, 0, contig.clone(), size);
    let stage_local = LocalLayout::new(local.clone(), STAGE as usize, contig.clone(), size);
    let zero_copy = Options {
        path: Path::ZeroCopy,
        ..Options::default()
    };
    let gathered = Options {
        max_remote_segments,
        ..zero_copy.clone()
    };
    let (u0, p0) = (cpu::self_usage(), s.peer_cpu()?);
    let t0 = Instant::now();
    let mut ops = 0;
    let mut times = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
    for i in 0..count {
        let started = Instant::now();
        ferry_fabric::timeline::mark("nc.msg", i);
        let slot = (i % SLOTS) * MAX_SIZE;
        let nc_local = LocalLayout::new(local.clone(), slot as usize, layout.clone(), 1);
        let nc_remote = RemoteLayout::new(remote, slot, layout.clone(), 1);
        match m {
            "contig" => {
                let l = LocalLayout::new(local.clone(), slot as usize, contig.clone(), size);
                let r = RemoteLayout::new(remote, slot, contig.clone(), size);
                ops += ferry_noncontig::write(s.endpoint(), &l, &r, &zero_copy)?.ops;
                s.notify(size)?;
            }
            "pack" => {
                let stage = STAGE as usize;
                let n = pack_to_buffer(&nc_local, 0, local.buffer(), stage, size as usize)?;
                ensure!(n as u64 == size, "packed {n} of {size} bytes");
                ops +=
                    ferry_noncontig::write(s.endpoint(), &stage_local, &stage_remote, &zero_copy)?
                        .ops;
                s.unpack(size, STRIDE, STAGE, slot)?;
            }
            _ => {
                let st = ferry_noncontig::write(s.endpoint(), &nc_local, &nc_remote, &gathered)?;
                ensure!(st.packed_bytes == 0, "the zero-copy path packed");
                ops += st.ops;
                s.notify(size)?;
            }
        }
        times.push(started.elapsed().as_secs_f64() * 1e6);
        ferry_fabric::timeline::mark("nc.end", i);
    }
    ferry_fabric::timeline::flush();
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    times.sort_by(f64::total_cmp);
    let p10_us = times.get(times.len() / 10).copied().unwrap_or(0.0);
    let peer = s.peer_cpu()?.secs_since(p0);
    Ok(Measured {
        gbps: (count * size) as f64 / secs / 1e9,
        client_cpu_s: cpu::self_usage().secs_since(u0),
        peer_cpu_s: peer,
        messages: count,
        ops: ops / count.max(1),
        p10_us,
    })
}

fn output(report: &Report<NcRow, NcSummary>, args: &NoncontigArgs) -> Result<()> {
    let png = |p: &std::path::Path| report.png(p);
    emit(
        "noncontig",
        report,
        &report.rows,
        &report.table(),
        &png,
        args.json,
        args.out.as_deref(),
    )
}

/// Median of one field over samples.
fn med(samples: &[Measured], f: impl Fn(&Measured) -> f64) -> Option<f64> {
    let mut v: Vec<f64> = samples.iter().map(f).collect();
    median(&mut v)
}
