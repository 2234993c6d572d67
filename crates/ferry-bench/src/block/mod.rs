//! `ferry bench block`: ferry's NBD server against nbdkit (memory plugin for memory
//! exports, file plugin on the same backing file) and qemu-nbd (the file), all in the same
//! run and all reached by one client, fio's nbd engine: 1 MiB sequential write and read at
//! QD 16, 4 KiB random write and read at QD 1 and QD 32 (GB/s, IOPS, mean and p99
//! latency). ferry is measured over TCP and over a Unix socket, on a memory and a file
//! export; nbdkit's memory plugin over both too. Servers alternate within each job
//! (A B A B); medians over the repetitions (see docs/block.md, "Benchmark"). Then the
//! application rows ([`apps`]): ext4 on ferry's and nbdkit's memory exports over TCP, an
//! untar, a postmark-like and a fileop-like run on it; and the block face's fabric path
//! ([`fabric`]): its schemes at 1 MiB QD 16 through the direct Rust client and through
//! `ferry block attach`.

mod apps;
mod fabric;
mod fio;
mod plot;
mod report;
mod servers;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;

use super::report::{emit, median, round, DriverStatus, Machine, Report};
use apps::{Ran, Sizes, Tarball, APPS};
use fio::{Measured, Workload, WORKLOADS};
use report::{BlockReport, BlockRow};
use servers::{Listen, Proc};

/// Options of `ferry bench block`.
#[derive(Args)]
pub struct BlockArgs {
    /// Short run (about a minute): a smaller region, half a second per job, one repetition.
    #[arg(long)]
    quick: bool,
    /// Print exactly one JSON object on stdout instead of the table (files only with --out).
    #[arg(long)]
    json: bool,
    /// Where to write CSV, JSON and PNG [default without --json: bench/results/block].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Directory for the backing file and sockets [default: the system's temporary
    /// directory].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Repetitions [default: 3, 1 with --quick].
    #[arg(long)]
    reps: Option<usize>,
    /// Only the fabric path's rows (no NBD peers).
    #[arg(long)]
    fabric_only: bool,
}

/// Sizes and times of a run.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// Bytes of each export the jobs touch (the memory exports' size, the file's size).
    region: u64,
    /// Seconds per fio job.
    secs: f64,
    /// Repetitions.
    reps: usize,
}

impl Plan {
    fn new(args: &BlockArgs) -> Plan {
        let (region, secs, reps) = match args.quick {
            true => (128 << 20, 0.5, 1),
            false => (512 << 20, 3.0, 3),
        };
        Plan {
            region,
            secs,
            reps: args.reps.unwrap_or(reps).max(1),
        }
    }
}

/// An export one server offers: what the rows call it and where fio finds it.
struct Target {
    server: &'static str,
    backend: &'static str,
    listen: Listen,
    export: &'static str,
    /// Index of its process in [`Servers::procs`].
    proc: usize,
}

/// The servers of a run: processes, the exports they offer, and why a peer is missing.
struct Servers {
    procs: Vec<Proc>,
    targets: Vec<Target>,
    missing: Vec<(&'static str, &'static str, &'static str, String)>,
}

impl Servers {
    fn start(dir: &Path, file: &Path, region: u64) -> Servers {
        let mut s = Servers {
            procs: Vec::new(),
            targets: Vec::new(),
            missing: Vec::new(),
        };
        match servers::ferry(dir, file, region) {
            Ok((p, tcp, unix)) => {
                let i = s.add(p);
                for at in [tcp, unix] {
                    for (backend, export) in [("memory", "mem"), ("file", "file")] {
                        s.targets.push(Target {
                            server: "ferry",
                            backend,
                            listen: at.clone(),
                            export,
                            proc: i,
                        });
                    }
                }
            }
            Err(e) => {
                for t in ["tcp", "unix"] {
                    for b in ["memory", "file"] {
                        s.missing.push(("ferry", b, t, format!("{e:#}")));
                    }
                }
            }
        }
        let mem = vec!["memory".to_string(), format!("size={region}")];
        let on_file = vec!["file".to_string(), file.display().to_string()];
        let sock = dir.join("nbdkit.sock");
        s.peer("nbdkit", "memory", "tcp", servers::nbdkit(&mem, None));
        s.peer(
            "nbdkit",
            "memory",
            "unix",
            servers::nbdkit(&mem, Some(&sock)),
        );
        s.peer("nbdkit", "file", "tcp", servers::nbdkit(&on_file, None));
        s.peer("qemu-nbd", "file", "tcp", servers::qemu_nbd(file));
        s
    }

    fn add(&mut self, p: Proc) -> usize {
        self.procs.push(p);
        self.procs.len() - 1
    }

    /// A peer serving one export (its default one: nbdkit's is `""`, qemu-nbd's `file`).
    fn peer(
        &mut self,
        server: &'static str,
        backend: &'static str,
        transport: &'static str,
        started: Result<(Proc, Listen)>,
    ) {
        match started {
            Ok((p, listen)) => {
                let proc = self.add(p);
                let export = if server == "qemu-nbd" { "file" } else { "" };
                self.targets.push(Target {
                    server,
                    backend,
                    listen,
                    export,
                    proc,
                });
            }
            Err(e) => self
                .missing
                .push((server, backend, transport, format!("{e:#}"))),
        }
    }
}

/// One export and job, gathering samples over the repetitions.
struct Cell {
    row: BlockRow,
    work: Workload,
    /// Index in [`Servers::targets`] (None: the server is missing).
    target: Option<usize>,
    samples: Vec<(Measured, f64)>,
}

impl Cell {
    fn new(server: &str, backend: &str, transport: &str, w: &Workload) -> Cell {
        Cell {
            row: BlockRow {
                server: server.into(),
                path: "nbd".into(),
                transport: transport.into(),
                backend: backend.into(),
                workload: w.name.into(),
                bs: w.bs,
                qd: w.qd,
                ..BlockRow::default()
            },
            work: *w,
            target: None,
            samples: Vec::new(),
        }
    }

    fn finish(mut self) -> BlockRow {
        if self.row.error.is_some() || self.samples.is_empty() {
            self.row.error.get_or_insert_with(|| "not run".into());
            return self.row;
        }
        let med = |f: &dyn Fn(&(Measured, f64)) -> f64, digits: i32| {
            let mut v: Vec<f64> = self.samples.iter().map(f).collect();
            median(&mut v).map(|x| round(x, digits))
        };
        let r = &mut self.row;
        r.gbps = med(&|s| s.0.gbps, 3);
        r.iops = med(&|s| s.0.iops, 0);
        r.lat_mean_us = med(&|s| s.0.lat_mean_us, 1);
        r.lat_p99_us = med(&|s| s.0.lat_p99_us, 1);
        r.client_cpu_s = med(&|s| s.0.client_cpu_s, 2);
        r.server_cpu_s = med(&|s| s.1, 2);
        r.reps = self.samples.len();
        self.row
    }
}

/// Every (job, export) of the run: jobs in [`WORKLOADS`] order, and within a job every
/// server in turn (the first changing from job to job), so servers alternate and drift
/// hits them alike.
fn cells_of(servers: &Servers) -> Vec<Cell> {
    let mut v = Vec::new();
    for w in &WORKLOADS {
        for (i, t) in servers.targets.iter().enumerate() {
            let mut c = Cell::new(t.server, t.backend, t.listen.transport(), w);
            c.target = Some(i);
            v.push(c);
        }
        for (server, backend, transport, why) in &servers.missing {
            let mut c = Cell::new(server, backend, transport, w);
            c.row.error = Some(why.clone());
            v.push(c);
        }
    }
    v
}

/// Runs the benchmark and prints (and writes) the report.
pub fn run(args: &BlockArgs) -> Result<()> {
    let plan = Plan::new(args);
    let mut notes = Vec::new();
    servers::need("fio")?;
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("ferry-bench-block-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _clean = RemoveOnDrop(dir.clone());
    let file = dir.join("backing.img");
    backing_file(&file, plan.region)?;
    notes.push(format!(
        "file exports: {} ({} MiB, written through before the run; reads and writes go \
         through the page cache)",
        file.display(),
        plan.region >> 20
    ));
    let servers = match args.fabric_only {
        true => Servers {
            procs: Vec::new(),
            targets: Vec::new(),
            missing: Vec::new(),
        },
        false => Servers::start(&dir, &file, plan.region),
    };
    for (s, b, t, why) in &servers.missing {
        notes.push(format!("{s} {b} {t}: {why}"));
    }
    let report_path = dir.join("fio.json");
    warm_up(&servers, &plan, &file, &report_path);
    let mut cells = cells_of(&servers);
    for rep in 0..plan.reps {
        tracing::info!("repetition {}/{}", rep + 1, plan.reps);
        for (j, w) in WORKLOADS.iter().enumerate() {
            let mut turn: Vec<&mut Cell> = (cells.iter_mut())
                .filter(|c| c.work == *w && c.target.is_some() && c.row.error.is_none())
                .collect();
            // Who goes first changes from job to job and repetition to repetition.
            let n = turn.len().max(1);
            turn.rotate_left((j + rep) % n);
            for c in turn {
                measure(c, &servers, &plan, &report_path);
                if c.row.backend == "file" && w.writes() {
                    // Its dirty pages are written back now, not during the next server's
                    // turn.
                    sync_file(&file);
                }
            }
        }
    }
    let mut rows: Vec<BlockRow> = cells.into_iter().map(Cell::finish).collect();
    rows.extend(applications(&servers, &plan, &dir, args.quick, &mut notes));
    drop(servers);
    let mut summary = report::summary(&rows);
    tracing::info!("the fabric path");
    rows.extend(fabric::run(plan.region, plan.secs, plan.reps, &dir, &report_path).rows);
    fabric_summary(&rows, &mut summary);
    notes.push(
        "fabric rows (server `ferry direct`/`ferry attach`): the block face in this process over \
         a memory export; zcopy = delegation (RTRS reads), zcopy-fill = the paper's reads, \
         zcopy-inval = a key rotation after every I/O, bcopy = data in messages; \
         zcopy_vs_bcopy_write_1m compares the direct client on ofi+shm, \
         zcopy_vs_nbdtcp_write_1m fio through attach (zcopy, ofi+shm) with fio on ferry's NBD \
         over TCP (row `ferry attach nbd tcp`: in this process, memory export); \
         merge_gain_seqwrite_4k_* fio's 4 KiB sequential writes at QD 16 through attach with \
         adjacent writes merged (zcopy) over not (zcopy-nomerge)"
            .into(),
    );
    let report = BlockReport {
        report: Report {
            bench: "block",
            quick: args.quick,
            machine: Machine::detect(None),
            drivers: vec![DriverStatus::new("nbd")],
            targets: report::targets(&summary),
            rows,
            summary,
        },
        notes,
    };
    let png = |p: &Path| report.png(p);
    emit(
        "block",
        &report,
        &report.report.rows,
        &report.table(),
        &png,
        args.json,
        args.out.as_deref(),
    )
}

/// Fills the fabric path's summary keys from its rows (see the note `run` adds).
fn fabric_summary(rows: &[BlockRow], summary: &mut report::Summary) {
    const MIB: u64 = 1 << 20;
    let zb = fabric::ratio(
        rows,
        MIB,
        ("ferry direct", "zcopy", "ofi+shm"),
        ("ferry direct", "bcopy", "ofi+shm"),
    );
    let zn = fabric::ratio(
        rows,
        MIB,
        ("ferry attach", "zcopy", "ofi+shm"),
        ("ferry attach", "nbd", "tcp"),
    );
    let merge = |transport| {
        fabric::ratio(
            rows,
            4096,
            ("ferry attach", "zcopy", transport),
            ("ferry attach", "zcopy-nomerge", transport),
        )
    };
    for (k, v) in summary.0.iter_mut() {
        match k.as_str() {
            "zcopy_vs_bcopy_write_1m" => *v = zb,
            "zcopy_vs_nbdtcp_write_1m" => *v = zn,
            "merge_gain_seqwrite_4k_shm" => *v = merge("ofi+shm"),
            "merge_gain_seqwrite_4k_tcp" => *v = merge("tcp"),
            _ => {}
        }
    }
}

/// One fio run of `c`'s job against its server, recorded with the server's CPU.
fn measure(c: &mut Cell, servers: &Servers, plan: &Plan, out: &Path) {
    let Some(t) = c.target.map(|i| &servers.targets[i]) else {
        return;
    };
    let proc = &servers.procs[t.proc];
    let s0 = proc.cpu();
    let uri = t.listen.uri(t.export);
    let m = fio::run(&uri, &c.work, plan.region, Some(plan.secs), out);
    let server_cpu = match (s0, proc.cpu()) {
        (Some(a), Some(b)) => (b - a).max(0.0),
        _ => 0.0,
    };
    match m {
        Ok(m) => c.samples.push((m, server_cpu)),
        Err(e) => {
            let why = format!("{e:#}");
            tracing::warn!("{} {}: {why}", c.row.label(), c.row.job());
            c.row.error = Some(why);
        }
    }
}

/// The application rows: on ferry's and nbdkit's memory exports over TCP, taking turns
/// (who goes first changes from repetition to repetition), [`apps::run`] each time; the
/// medians of each server's runs, or why there are none.
fn applications(
    servers: &Servers,
    plan: &Plan,
    dir: &Path,
    quick: bool,
    notes: &mut Vec<String>,
) -> Vec<BlockRow> {
    let mut turn: Vec<&Target> = (servers.targets.iter())
        .filter(|t| t.backend == "memory" && t.listen.transport() == "tcp")
        .collect();
    let mut runs: Vec<AppRuns> = ["ferry", "nbdkit"]
        .into_iter()
        .map(|server| AppRuns {
            server,
            samples: Vec::new(),
            error: (!turn.iter().any(|t| t.server == server))
                .then(|| format!("{server} memory tcp is not running")),
        })
        .collect();
    let sizes = Sizes::new(quick);
    let tar = match apps::unavailable() {
        Some(why) => Err(why),
        None => Tarball::make(dir, &sizes).map_err(|e| format!("making the tarball: {e:#}")),
    };
    let tar = match tar {
        Ok(t) => t,
        Err(why) => {
            runs.iter_mut().for_each(|r| r.error = Some(why.clone()));
            return runs.iter().flat_map(AppRuns::rows).collect();
        }
    };
    notes.push(format!(
        "application rows: ext4 made on the memory exports over TCP through nbdfuse, mounted \
         with fuse2fs, each run on a fresh mount timed to the end of its unmount; untar of a \
         {:.1} MB tarball; IOPS = operations per second",
        tar.len() as f64 / 1e6
    ));
    for rep in 0..plan.reps {
        let n = turn.len().max(1);
        turn.rotate_left(rep % n);
        for t in &turn {
            let Some(r) = runs.iter_mut().find(|r| r.server == t.server) else {
                continue;
            };
            if r.error.is_some() {
                continue;
            }
            let proc = &servers.procs[t.proc];
            let work = dir.join(format!("apps-{}-{rep}", t.server));
            match apps::run(&t.listen.uri(t.export), &work, &tar, &sizes, &|| proc.cpu()) {
                Ok(ran) => r.samples.push(ran),
                Err(e) => {
                    tracing::warn!("application runs on {}: {e:#}", t.server);
                    r.error = Some(format!("{e:#}"));
                }
            }
            let _ = std::fs::remove_dir_all(&work);
        }
    }
    runs.iter().flat_map(AppRuns::rows).collect()
}

/// One server's application runs: per repetition, each run of [`APPS`].
struct AppRuns {
    server: &'static str,
    samples: Vec<Vec<Ran>>,
    error: Option<String>,
}

impl AppRuns {
    /// A row per application: medians of rate, bandwidth and time per operation.
    fn rows(&self) -> Vec<BlockRow> {
        APPS.iter()
            .enumerate()
            .map(|(i, app)| {
                let mut row = BlockRow {
                    server: self.server.into(),
                    path: "ext4".into(),
                    transport: "tcp".into(),
                    backend: "memory".into(),
                    workload: (*app).into(),
                    qd: 1,
                    error: self.error.clone(),
                    reps: self.samples.len(),
                    ..BlockRow::default()
                };
                if row.error.is_some() || self.samples.is_empty() {
                    row.error.get_or_insert_with(|| "not run".into());
                    return row;
                }
                let med = |f: &dyn Fn(&Ran) -> f64, digits: i32| {
                    let mut v: Vec<f64> = self.samples.iter().map(|s| f(&s[i])).collect();
                    median(&mut v).map(|x| round(x, digits))
                };
                row.iops = med(&|r| r.ops as f64 / r.secs, 0);
                row.lat_mean_us = med(&|r| r.secs * 1e6 / r.ops.max(1) as f64, 1);
                if *app == "untar" {
                    row.gbps = med(&|r| r.bytes as f64 / r.secs / 1e9, 3);
                }
                row.server_cpu_s = med(&|r| r.server_cpu_s, 2);
                row
            })
            .collect()
    }
}

/// Flushes the backing file's dirty pages (whoever wrote them).
fn sync_file(path: &Path) {
    if let Err(e) = std::fs::File::open(path).and_then(|f| f.sync_all()) {
        tracing::warn!("syncing {}: {e}", path.display());
    }
}

/// Writes every export's region once (memory exports then hold data, not holes, so reads
/// read pages on every server alike), which also warms each connection path.
fn warm_up(servers: &Servers, plan: &Plan, file: &Path, out: &Path) {
    let fill = Workload {
        name: "fill",
        rw: "write",
        bs: 1 << 20,
        qd: 16,
    };
    for t in &servers.targets {
        if let Err(e) = fio::run(&t.listen.uri(t.export), &fill, plan.region, None, out) {
            tracing::warn!("warm-up of {} {}: {e:#}", t.server, t.backend);
        }
    }
    sync_file(file);
}

/// The backing file of the file exports: `size` bytes, written through (allocated, so no
/// server answers a read from a hole).
fn backing_file(path: &Path, size: u64) -> Result<()> {
    use std::io::Write;
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let block: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8 | 1).collect();
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])
            .with_context(|| format!("writing {}", path.display()))?;
        left -= n as u64;
    }
    f.sync_all()
        .with_context(|| format!("syncing {}", path.display()))
}

/// Removes a scratch directory when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
