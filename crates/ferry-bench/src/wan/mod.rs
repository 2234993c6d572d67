//! `ferry bench wan`: the seed's figures 7–10 (ADTS GridFTP at distance) on the WAN
//! emulator (`ferry-wan`), with GridFTP and iperf3 on the same path in the same run.
//!
//! Every row crosses the emulated path: servers in namespace A, clients in namespace B,
//! a bottleneck (2 Gbit/s by default) and a round trip per row. Transfers are downloads
//! (the seed's FTP GET). Per round trip the path is brought up once, its servers started,
//! every tool warmed up, and the cells measured in an order that rotates each repetition
//! (so drift hits every tool alike); the rows hold medians. See docs/wan.md for what each
//! figure means in ferry's terms (figure 8's "without staging" is `--direct`).

mod data;
mod meter;
mod plot;
mod report;
mod servers;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use ferry_wan::{Config, HostLimits, Wan};

use super::cp::tools::{installed, run_client};
use super::report::{emit, median, round, DriverStatus, Machine, Report};
use data::Workspace;
use report::WanReport;
pub use report::WanRow;
use servers::Remote;

/// Options of `ferry bench wan`.
#[derive(Args)]
pub struct WanArgs {
    /// Short run (a few minutes): round trips 0, 50 and 100 ms, file buffers 4 and 32 MiB,
    /// disk at 50 ms only, small files and traces scaled down, one repetition.
    #[arg(long)]
    quick: bool,
    /// Print exactly one JSON object on stdout instead of the table (files only with --out).
    #[arg(long)]
    json: bool,
    /// Bottleneck rate (`2gbit`, `500mbit`).
    #[arg(long, default_value = "2gbit", value_parser = ferry_wan::units::parse_rate)]
    rate: u64,
    /// Round trips of figures 7–9 in ms, comma-separated [default: 0,1,10,30,50,80,100;
    /// --quick: 0,50,100 (disk: 50)].
    #[arg(long, value_delimiter = ',')]
    rtts: Vec<u32>,
    /// File buffers (ferry --buffer, GridFTP -tcp-bs) in MiB, comma-separated [default:
    /// 1,4,16,32,64; --quick: 4,32].
    #[arg(long, value_delimiter = ',')]
    buffers: Vec<u64>,
    /// ferry drivers, comma-separated (the buffer sweep runs on the first).
    #[arg(long, value_delimiter = ',', default_value = "tcp,ofi+tcp")]
    drivers: Vec<String>,
    /// Run only these workloads, comma-separated (mem, disk, trace, small) [default: all].
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Bytes of one memory-to-memory and one disk-to-disk transfer (`1G`, `512M`) [default:
    /// 2 GiB and 1 GiB; --quick: 1 GiB and 128 MiB].
    #[arg(long, value_parser = ferry_wan::units::parse_bytes)]
    size: Option<u64>,
    /// The ferry servers' staging ring in blocks (`ring` of `ferry serve`'s config), for
    /// A/B runs of the server's ring [default: the server's own, 8].
    #[arg(long, value_name = "BLOCKS")]
    server_ring: Option<usize>,
    /// Repetitions [default: 3; --quick: 1].
    #[arg(long)]
    reps: Option<usize>,
    /// Where to write CSV, JSON and PNG [default without --json: bench/results/wan].
    #[arg(long)]
    out: Option<PathBuf>,
}

const WORKLOADS: [&str; 4] = ["mem", "disk", "trace", "small"];
/// The variant flag of a ferry row whose client checks nothing (`FERRY_TEST_NO_CHECKSUMS`):
/// a reference, never a result.
pub const NO_CHECKSUMS: &str = "no-checksums";
/// The round trips of the application traces and of the small-file tree.
const CCSM_RTT: u32 = 30;
const VIZ_RTT: u32 = 80;
const SMALL_RTT: u32 = 50;
const MIB: u64 = 1 << 20;

/// Sizes, counts and round trips of a run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Round trips of figure 7 (memory to memory), ms.
    pub rtts: Vec<u32>,
    /// Round trips of figures 8 and 9 (disk to disk), ms.
    pub disk_rtts: Vec<u32>,
    /// File buffers, bytes.
    pub buffers: Vec<u64>,
    /// Bytes of one memory-to-memory transfer.
    pub mem_bytes: u64,
    /// Bytes of one disk-to-disk transfer.
    pub disk_bytes: u64,
    /// (files, bytes each) of the CCSM trace (the seed: 256 MB files at 30 ms).
    pub ccsm: (usize, u64),
    /// (files, bytes each) of the visualization trace (2.6 GB files at 80 ms).
    pub viz: (usize, u64),
    /// (files, bytes each) of the small-file tree.
    pub small: (usize, u64),
    pub reps: usize,
    /// Longest one transfer may take.
    pub timeout: Duration,
}

impl Plan {
    /// The full run or `--quick`, with the round trips, buffers and repetitions given.
    pub fn new(args: &WanArgs) -> Plan {
        let mut p = match args.quick {
            true => Plan {
                rtts: vec![0, 50, 100],
                disk_rtts: vec![50],
                buffers: vec![4 * MIB, 32 * MIB],
                // 4 s at 2 Gbit/s: at 50 ms a quarter of 256 MiB's 1 s went to set-up and
                // slow start, so its average said little about the path's rate.
                mem_bytes: 1 << 30,
                disk_bytes: 128 * MIB,
                ccsm: (4, 32 * MIB),
                viz: (1, 256 * MIB),
                small: (1000, 64 << 10),
                reps: 1,
                timeout: Duration::from_secs(90),
            },
            false => Plan {
                rtts: vec![0, 1, 10, 30, 50, 80, 100],
                disk_rtts: vec![0, 1, 10, 30, 50, 80, 100],
                buffers: [1, 4, 16, 32, 64].map(|m| m * MIB).to_vec(),
                mem_bytes: 2 << 30,
                disk_bytes: 1 << 30,
                ccsm: (8, 256 * MIB),
                viz: (2, 2_600_000_000),
                small: (1000, 64 << 10),
                reps: 3,
                timeout: Duration::from_secs(600),
            },
        };
        if !args.rtts.is_empty() {
            p.rtts = args.rtts.clone();
            p.disk_rtts = args.rtts.clone();
        }
        if !args.buffers.is_empty() {
            p.buffers = args.buffers.iter().map(|m| m * MIB).collect();
        }
        if let Some(b) = args.size {
            (p.mem_bytes, p.disk_bytes) = (b, b);
        }
        if let Some(r) = args.reps {
            p.reps = r.max(1);
        }
        p
    }
}

/// What one transfer took.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Client wall seconds (iperf3: from its own receiver rate).
    secs: f64,
    /// Streams ferry used (its `--json` `path`).
    streams: Option<u64>,
    /// Staging bytes per stream ferry used.
    staging: Option<u64>,
    /// The best rate the line carried over 2 s within the first 20 s, bit/s (IP bytes).
    reached_bps: Option<f64>,
}

/// One tool on one workload at one round trip, gathering samples over the repetitions.
struct Cell {
    row: WanRow,
    samples: Vec<Sample>,
}

impl Cell {
    fn new(workload: &str, rtt: u32, tool: &str, variant: String, bytes: u64, files: u64) -> Self {
        let buffer = variant
            .split_whitespace()
            .skip_while(|w| *w != "--buffer" && *w != "-tcp-bs")
            .nth(1)
            .and_then(|b| b.strip_suffix('M')?.parse::<u64>().ok())
            .map(|m| m * MIB);
        Cell {
            row: WanRow {
                workload: workload.into(),
                rtt_ms: rtt,
                tool: tool.into(),
                variant,
                buffer,
                bytes,
                files,
                ..WanRow::default()
            },
            samples: Vec::new(),
        }
    }

    fn failed(&self) -> bool {
        self.row.error.is_some()
    }

    fn fail(&mut self, why: String) {
        tracing::warn!("{} at {} ms: {why}", self.row.label(), self.row.rtt_ms);
        self.row.error = Some(why);
    }

    fn finish(mut self, rate_bps: u64) -> WanRow {
        if self.row.error.is_some() || self.samples.is_empty() {
            self.row.error.get_or_insert_with(|| "not run".into());
            return self.row;
        }
        let r = &mut self.row;
        let mut gbit: Vec<f64> = self
            .samples
            .iter()
            .map(|s| r.bytes as f64 * 8.0 / s.secs / 1e9)
            .collect();
        r.gbit_s = median(&mut gbit).map(|g| round(g, 3));
        r.link_share = r.gbit_s.map(|g| round(g * 1e9 / rate_bps as f64, 3));
        let mut reached: Vec<f64> = self.samples.iter().filter_map(|s| s.reached_bps).collect();
        let reached = median(&mut reached);
        r.reached_gbit_s = reached.map(|b| round(b / 1e9, 3));
        r.reached_share = reached.map(|b| round(b / rate_bps as f64, 3));
        let med_u = |f: fn(&Sample) -> Option<u64>| {
            let mut v: Vec<f64> = self
                .samples
                .iter()
                .filter_map(f)
                .map(|x| x as f64)
                .collect();
            median(&mut v).map(|x| x.round() as u64)
        };
        r.streams = med_u(|s| s.streams);
        r.staging = med_u(|s| s.staging);
        r.reps = self.samples.len();
        self.row
    }
}

/// `--buffer` flags for `bytes`: below four 4 MiB blocks the block shrinks to a quarter of
/// the buffer (at least 256 KiB), so a small file buffer is still four blocks deep, as
/// the seed's was, rather than rounded up to two default blocks.
fn buffer_flags(bytes: u64) -> Vec<String> {
    let mut v = vec!["--buffer".to_string(), format!("{}M", bytes / MIB)];
    if bytes < 4 * FERRY_BLOCK {
        v.push("--block-size".into());
        v.push((bytes / 4).max(256 << 10).to_string());
    }
    v
}

/// `ferry cp`'s default `--block-size`.
const FERRY_BLOCK: u64 = 4 << 20;

/// Every cell of the run, in run order within a repetition.
fn cells_of(plan: &Plan, drivers: &[String], runs: &dyn Fn(&str) -> bool) -> Vec<Cell> {
    let mut v = Vec::new();
    let mb = |b: u64| b / MIB;
    let sweep = drivers.first().cloned().unwrap_or_else(|| "tcp".into());
    if runs("mem") {
        for &rtt in &plan.rtts {
            let cell =
                |tool: &str, var: String| Cell::new("mem", rtt, tool, var, plan.mem_bytes, 1);
            for d in drivers {
                v.push(cell("ferry", d.clone()));
            }
            // The reference of what integrity costs at line rate (`checksum_cost_line`).
            v.push(cell("ferry", format!("{sweep} {NO_CHECKSUMS}")));
            for &b in &plan.buffers {
                v.push(cell("ferry", format!("{sweep} --buffer {}M", mb(b))));
            }
            v.push(cell("gridftp", "-p 1".into()));
            v.push(cell("gridftp", "-p 4".into()));
            for &b in &plan.buffers {
                v.push(cell("gridftp", format!("-p 4 -tcp-bs {}M", mb(b))));
            }
            v.push(cell("iperf3", "-P 1".into()));
            v.push(cell("iperf3", "-P 4".into()));
        }
    }
    if runs("disk") {
        for &rtt in &plan.disk_rtts {
            let cell =
                |w: &str, tool: &str, var: String| Cell::new(w, rtt, tool, var, plan.disk_bytes, 1);
            for &b in &plan.buffers {
                v.push(cell(
                    "disk",
                    "ferry",
                    format!("{sweep} --direct --buffer {}M", mb(b)),
                ));
            }
            v.push(cell("staged", "ferry", sweep.clone()));
            for &b in &plan.buffers {
                v.push(cell(
                    "staged",
                    "ferry",
                    format!("{sweep} --buffer {}M", mb(b)),
                ));
            }
            v.push(cell("staged", "gridftp", "-p 1".into()));
            v.push(cell("staged", "gridftp", "-p 4".into()));
        }
    }
    if runs("trace") {
        for (w, rtt, (n, size)) in [("ccsm", CCSM_RTT, plan.ccsm), ("viz", VIZ_RTT, plan.viz)] {
            let cell =
                |tool: &str, var: String| Cell::new(w, rtt, tool, var, n as u64 * size, n as u64);
            for d in drivers {
                v.push(cell("ferry", d.clone()));
            }
            v.push(cell("gridftp", "-p 1".into()));
            v.push(cell("gridftp", "-p 4".into()));
        }
    }
    if runs("small") {
        let (n, size) = plan.small;
        let cell = |tool: &str, var: String| {
            Cell::new("small", SMALL_RTT, tool, var, n as u64 * size, n as u64)
        };
        for d in drivers {
            v.push(cell("ferry", d.clone()));
        }
        for p in ["-p 1", "-p 4", "-cc 4"] {
            v.push(cell("gridftp", p.into()));
        }
    }
    v
}

/// The servers of one path (absent where a peer is missing or failed to start).
struct Servers {
    ferry: Vec<(String, Result<Remote>)>,
    gridftp: Result<Remote>,
    iperf3: Result<Remote>,
}

fn need(prog: &str) -> Result<()> {
    match installed(prog) {
        true => Ok(()),
        false => bail!("{prog} not installed (run scripts/install-deps.sh): skipped"),
    }
}

impl Servers {
    fn start(wan: &Wan, drivers: &[String], ws: &Workspace) -> Servers {
        let roots = [("shm", ws.shm.as_path()), ("disk", ws.disk.as_path())];
        let config = ws.serve_config.as_deref();
        Servers {
            ferry: drivers
                .iter()
                .map(|d| (d.clone(), servers::ferry(wan, d, &roots, config)))
                .collect(),
            gridftp: need("globus-url-copy")
                .and_then(|()| need("globus-gridftp-server"))
                .and_then(|()| servers::gridftp(wan)),
            iperf3: need("iperf3").and_then(|()| servers::iperf3(wan)),
        }
    }
}

/// Runs the benchmark and prints (and writes) the report.
pub fn run(args: &WanArgs) -> Result<()> {
    ferry_wan::supported().context("bench wan runs on the WAN emulator")?;
    if let Some(w) = args.only.iter().find(|w| !WORKLOADS.contains(&w.as_str())) {
        bail!("--only: unknown workload {w:?} (mem, disk, trace, small)");
    }
    let plan = Plan::new(args);
    let drivers = super::addr::drivers(&args.drivers)?;
    let runs = |w: &str| args.only.is_empty() || args.only.iter().any(|x| x == w);
    let mut notes = host_notes(args.rate);
    let ws =
        Workspace::create(&plan, &runs, args.server_ring).context("preparing the test data")?;
    let mut cells = cells_of(&plan, &drivers, &runs);
    let mut status: Vec<DriverStatus> = drivers.iter().map(|d| DriverStatus::new(d)).collect();
    let rtts: BTreeSet<u32> = cells.iter().map(|c| c.row.rtt_ms).collect();
    for rtt in rtts {
        let mut here: Vec<&mut Cell> = cells.iter_mut().filter(|c| c.row.rtt_ms == rtt).collect();
        run_path(
            &plan,
            args.rate,
            rtt,
            &drivers,
            &ws,
            &mut here,
            &mut status,
            &mut notes,
        );
    }
    drop(ws);
    let rows: Vec<WanRow> = cells.into_iter().map(|c| c.finish(args.rate)).collect();
    let (summary, best) = report::summary(&rows, args.rate);
    let report = WanReport {
        report: Report {
            bench: "wan",
            quick: args.quick,
            machine: Machine::detect(None),
            drivers: status,
            targets: report::targets(&summary),
            rows,
            summary,
        },
        rate_bps: args.rate,
        best,
        notes,
    };
    let png = |p: &Path| report.png(p);
    emit(
        "wan",
        &report,
        &report.report.rows,
        &report.table(),
        &png,
        args.json,
        args.out.as_deref(),
    )
}

/// What the host itself would allow one stream (the emulator's namespaces raise their own
/// TCP buffer ceilings; GridFTP's `-tcp-bs` is clamped by the host's `core.rmem_max`).
fn host_notes(rate: u64) -> Vec<String> {
    let Ok(h) = HostLimits::read() else {
        return Vec::new();
    };
    let at50 = h
        .single_stream_bps(Duration::from_millis(50))
        .map_or(String::new(), |b| {
            format!(
                " (one autotuned stream outside the emulator: about {:.2} Gbit/s at 50 ms)",
                b / 1e9
            )
        });
    vec![format!(
        "host: tcp_rmem/tcp_wmem ceiling {} / {} MiB{at50}; net.core.rmem_max/wmem_max {} / {} KiB cap an explicit socket buffer (GridFTP -tcp-bs); bottleneck {:.2} Gbit/s",
        h.tcp_rmem_max / MIB,
        h.tcp_wmem_max / MIB,
        h.core_rmem_max >> 10,
        h.core_wmem_max >> 10,
        rate as f64 / 1e9
    )]
}

/// Brings the path of round trip `rtt` up, starts its servers and measures `cells`.
#[allow(clippy::too_many_arguments)]
fn run_path(
    plan: &Plan,
    rate: u64,
    rtt: u32,
    drivers: &[String],
    ws: &Workspace,
    cells: &mut [&mut Cell],
    status: &mut [DriverStatus],
    notes: &mut Vec<String>,
) {
    tracing::info!("path: {rtt} ms round trip, {:.2} Gbit/s", rate as f64 / 1e9);
    let wan = match Wan::up(Config {
        rtt: Duration::from_millis(rtt.into()),
        rate_bps: Some(rate),
        ..Config::default()
    }) {
        Ok(w) => w,
        Err(e) => {
            cells
                .iter_mut()
                .for_each(|c| c.fail(format!("emulator: {e}")));
            return;
        }
    };
    let servers = Servers::start(&wan, drivers, ws);
    for (d, s) in &servers.ferry {
        if let (Err(e), Some(st)) = (s, status.iter_mut().find(|st| st.driver == *d)) {
            st.error.get_or_insert_with(|| format!("{e:#}"));
        }
    }
    for (name, s) in [("GridFTP", &servers.gridftp), ("iperf3", &servers.iperf3)] {
        if let Err(e) = s {
            let n = format!("{name}: {e:#}");
            if !notes.contains(&n) {
                notes.push(n);
            }
        }
    }
    warm_up(plan, &wan, ws, &servers);
    let n = cells.len();
    for rep in 0..plan.reps {
        // A different first tool each repetition.
        let mut order: Vec<usize> = (0..n).collect();
        order.rotate_left(rep % n.max(1));
        for i in order {
            let c = &mut cells[i];
            if c.failed() {
                continue;
            }
            if ws.reads_disk(&c.row.workload) && !super::cp::data::drop_caches() {
                let n =
                    "could not drop the page cache (needs root): disk rows may read from memory";
                if !notes.iter().any(|x| x == n) {
                    notes.push(n.into());
                }
            }
            let mut got = transfer(plan, &wan, ws, &servers, &c.row);
            if got.is_err() && c.row.tool == "iperf3" {
                // iperf3 -s serves one test at a time and resets a client that comes
                // while it winds the last one down.
                std::thread::sleep(Duration::from_secs(1));
                got = transfer(plan, &wan, ws, &servers, &c.row);
            }
            match got {
                Ok(s) => c.samples.push(s),
                Err(e) => c.fail(format!("{e:#}")),
            }
        }
    }
    drop(servers);
}

/// One short transfer per ferry driver and one GridFTP get on the path before measuring
/// (connections, caches, lazy loading).
fn warm_up(plan: &Plan, wan: &Wan, ws: &Workspace, servers: &Servers) {
    let rtt = 0;
    for (d, _) in &servers.ferry {
        let c = Cell::new("mem", rtt, "ferry", d.clone(), 16 * MIB, 1);
        let _ = transfer(plan, wan, ws, servers, &c.row);
    }
    let c = Cell::new("warm", rtt, "gridftp", "-p 1".into(), data::WARM_BYTES, 1);
    let _ = transfer(plan, wan, ws, servers, &c.row);
}

fn ok<'a>(s: &'a Result<Remote>, name: &str) -> Result<&'a Remote> {
    s.as_ref().map_err(|e| anyhow::anyhow!("{name}: {e:#}"))
}

/// The ferry driver of a variant (`tcp --buffer 4M` → `tcp`).
fn driver_of(variant: &str) -> &str {
    variant.split_whitespace().next().unwrap_or("")
}

/// Runs one transfer of `row` across the path.
fn transfer(
    plan: &Plan,
    wan: &Wan,
    ws: &Workspace,
    servers: &Servers,
    row: &WanRow,
) -> Result<Sample> {
    let (src, dst) = ws.paths(&row.workload);
    let cmd = match row.tool.as_str() {
        "ferry" => {
            let d = driver_of(&row.variant);
            let server = servers
                .ferry
                .iter()
                .find(|(x, _)| x == d)
                .map(|(_, s)| ok(s, &format!("ferry serve ({d})")))
                .context("no server for this driver")??;
            let exe = std::env::current_exe().context("locating the ferry binary")?;
            let mut c = Command::new(exe);
            c.env("RUST_LOG", "warn").args(["cp", "--json"]);
            let flags: Vec<&str> = row.variant.split_whitespace().skip(1).collect();
            for (i, f) in flags.iter().enumerate() {
                match *f {
                    "--buffer" => {
                        let mib: u64 = flags
                            .get(i + 1)
                            .and_then(|b| b.strip_suffix('M')?.parse().ok())
                            .context("--buffer NM")?;
                        c.args(buffer_flags(mib * MIB));
                    }
                    "--direct" => {
                        c.arg("--direct");
                    }
                    // The receiver checks no block (a zero source's tags cost its server
                    // one digest per block length): what the client's checks cost.
                    NO_CHECKSUMS => {
                        c.env("FERRY_TEST_NO_CHECKSUMS", "1");
                    }
                    _ => {}
                }
            }
            let remote = |rel: &str| format!("{}/{rel}", server.addr);
            match row.workload.as_str() {
                "mem" | "warm" => c
                    .arg(remote(&format!("mem/zero/{}", row.bytes)))
                    .arg("null:"),
                "disk" | "staged" => c.arg(remote(&ws.remote(&src)?)).arg(&dst),
                _ => c
                    .arg("-r")
                    .arg(format!("{}/", remote(&ws.remote(&src)?)))
                    .arg(&dst),
            };
            c
        }
        "gridftp" => {
            let server = ok(&servers.gridftp, "GridFTP")?;
            let mut c = Command::new("globus-url-copy");
            c.arg("-fast").args(row.variant.split_whitespace());
            let url = |p: &Path| format!("ftp://{}:{}{}", wan.a().addr, server.addr, p.display());
            match row.workload.as_str() {
                "ccsm" | "viz" | "small" => c
                    .args(["-r", "-cd"])
                    .arg(format!("{}/", url(&src)))
                    .arg(format!("file://{}/", dst.display())),
                _ => c.arg(url(&src)).arg(format!("file://{}", dst.display())),
            };
            c
        }
        "iperf3" => {
            let server = ok(&servers.iperf3, "iperf3")?;
            let mut c = Command::new("iperf3");
            c.args([
                "-c",
                &wan.a().addr.to_string(),
                "-p",
                &server.addr,
                "-J",
                "-R",
            ])
            .args(row.variant.split_whitespace())
            .args(["-n", &row.bytes.to_string()]);
            c
        }
        t => bail!("unknown tool {t}"),
    };
    ws.clear_output(&row.workload)?;
    let (ran, reached_bps) = meter::while_metering(wan, || {
        run_client(wan.exec_in_b(cmd), None, plan.timeout, || {
            data::sync_output(&row.workload)
        })
    });
    let (m, out) = ran?;
    let mut secs = m.secs;
    let (mut streams, mut staging) = (None, None);
    match row.tool.as_str() {
        "iperf3" => {
            // iperf3's own receiver rate (its start-up and negotiation are not transfer).
            let s = super::refs::parse_iperf3(&out)?;
            secs = row.bytes as f64 / (s.value * 1e9);
        }
        "ferry" => {
            let v: serde_json::Value =
                serde_json::from_slice(&out).context("ferry cp --json output")?;
            streams = v["path"]["streams"].as_u64();
            staging = v["path"]["buffer"].as_u64();
            ws.check_output(row)?;
        }
        _ => ws.check_output(row)?,
    }
    ws.clear_output(&row.workload)?;
    Ok(Sample {
        secs,
        streams,
        staging,
        reached_bps,
    })
}
