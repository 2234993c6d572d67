//! `ferry bench cp`: `ferry cp` against GridFTP (globus-url-copy -p 1 and -p 4, -fast),
//! XRootD (xrdcp), iperf3 and, as the encrypted peer, OpenSSH (`scp`, `rsync -e ssh`
//! against a throwaway `sshd`), in the same run, on loopback: a large file from /dev/shm to
//! /dev/null (ferry also memory to memory: zero source, null sink), disk to disk after
//! dropping the page cache, and a tree of small files. Tools interleave per repetition
//! (A B A B); medians; the summary takes ferry's best driver against the peer's best variant
//! (see bench/results/README.md).

mod costs;
pub(crate) mod data;
mod plot;
mod report;
pub(crate) mod tools;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use super::addr;
use super::report::{emit, median, round, DriverStatus, Machine, Report};
use data::Workspace;
use report::CpReport;
pub use report::CpRow;
use tools::{installed, run_client, Measured, Server, Sshd};

/// Options of `ferry bench cp`.
#[derive(Args)]
pub struct CpArgs {
    /// Short run (about a minute): small sizes, few files, one repetition.
    #[arg(long)]
    quick: bool,
    /// Print exactly one JSON object on stdout instead of the table (files only with --out).
    #[arg(long)]
    json: bool,
    /// ferry drivers to measure, comma-separated (tcp, ofi+tcp, ofi+shm).
    #[arg(long, value_delimiter = ',', default_value = "tcp,ofi+tcp,ofi+shm")]
    drivers: Vec<String>,
    /// Where to write CSV, JSON and PNG [default without --json: bench/results/cp].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run only these workloads, comma-separated (mem, shm, disk, small, start) [default: all].
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

/// The suffix of a ferry variant with direct I/O on both sides (disk workload).
const DIRECT: &str = report::DIRECT;
const STREAMS: &str = report::STREAMS;
const NO_CACHE: &str = report::NO_CACHE;
const NO_CHECKSUMS: &str = report::NO_CHECKSUMS;
const CLEAR: &str = report::CLEAR;
const PRIVATE: &str = report::PRIVATE;
/// The test switch that turns checksums off in a ferry process (`NO_CHECKSUMS` rows).
const CHECKSUMS_OFF: (&str, &str) = ("FERRY_TEST_NO_CHECKSUMS", "1");

/// The workloads of a run, in order.
const WORKLOADS: [&str; 5] = ["mem", "shm", "disk", "small", "start"];

/// Sizes and counts of a run.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// The large file (memory and /dev/shm workloads).
    pub mem_bytes: u64,
    /// The disk-to-disk file.
    pub disk_bytes: u64,
    /// Small files in the tree.
    pub small_files: usize,
    /// Bytes per small file.
    pub small_bytes: usize,
    /// Repetitions.
    pub reps: usize,
    /// Longest a single transfer may take.
    pub timeout: Duration,
}

impl Plan {
    /// The full run (4 GiB, 10,000 × 64 KiB, 3 repetitions) or `--quick`.
    pub fn new(quick: bool) -> Plan {
        match quick {
            true => Plan {
                mem_bytes: 256 << 20,
                disk_bytes: 128 << 20,
                small_files: 200,
                small_bytes: 64 << 10,
                reps: 1,
                timeout: Duration::from_secs(60),
            },
            false => Plan {
                mem_bytes: 4 << 30,
                disk_bytes: 4 << 30,
                small_files: 10_000,
                small_bytes: 64 << 10,
                reps: 3,
                timeout: Duration::from_secs(900),
            },
        }
    }
}

/// One tool on one workload, gathering samples over the repetitions.
struct Cell {
    row: CpRow,
    samples: Vec<Measured>,
}

impl Cell {
    fn new(workload: &str, tool: &str, variant: &str, bytes: u64, files: u64) -> Cell {
        Cell {
            row: CpRow {
                workload: workload.into(),
                tool: tool.into(),
                variant: variant.into(),
                bytes,
                files,
                gbps: None,
                files_per_s: None,
                secs: None,
                client_cpu_s: None,
                server_cpu_s: None,
                cpu_s: None,
                reps: 0,
                error: None,
            },
            samples: Vec::new(),
        }
    }

    fn failed(&self) -> bool {
        self.row.error.is_some()
    }

    fn record(&mut self, m: Result<Measured>) {
        match m {
            Ok(m) => self.samples.push(m),
            Err(e) => {
                let why = format!("{e:#}");
                tracing::warn!("{}: {why}", self.row.label());
                self.row.error = Some(why);
            }
        }
    }

    fn finish(mut self) -> CpRow {
        if self.row.error.is_some() || self.samples.is_empty() {
            self.row.error.get_or_insert_with(|| "not run".into());
            return self.row;
        }
        let med = |f: &dyn Fn(&Measured) -> f64| {
            let mut v: Vec<f64> = self.samples.iter().map(f).collect();
            median(&mut v)
        };
        let r = &mut self.row;
        let secs = med(&|m| m.secs);
        r.secs = secs.map(|x| round(x, 4));
        r.gbps = med(&|m| r.bytes as f64 / m.secs / 1e9).map(|x| round(x, 3));
        r.files_per_s = (r.workload == "small")
            .then(|| med(&|m| r.files as f64 / m.secs).map(|x| round(x, 1)))
            .flatten();
        r.client_cpu_s = med(&|m| m.client_cpu).map(|x| round(x, 3));
        r.server_cpu_s = med(&|m| m.server_cpu).map(|x| round(x, 3));
        r.cpu_s = med(&|m| m.client_cpu + m.server_cpu).map(|x| round(x, 3));
        r.reps = self.samples.len();
        tracing::debug!("{}: median {secs:?} s", r.label());
        self.row
    }
}

/// The servers of a run (absent where a peer is missing or failed to start).
struct Servers {
    ferry: Vec<(String, Result<Server>)>,
    gridftp: Result<Server>,
    xrootd: Result<Server>,
    iperf3: Result<Server>,
    sshd: Result<Sshd>,
}

fn need(prog: &str) -> Result<()> {
    if installed(prog) {
        Ok(())
    } else {
        bail!("{prog} not installed (run scripts/install-deps.sh): skipped")
    }
}

/// Runs the benchmark and prints (and writes) the report.
pub fn run(args: &CpArgs) -> Result<()> {
    let plan = Plan::new(args.quick);
    if let Some(w) = args.only.iter().find(|w| !WORKLOADS.contains(&w.as_str())) {
        bail!("--only: unknown workload {w:?} (mem, shm, disk, small, start)");
    }
    let drivers = addr::drivers(&args.drivers)?;
    let mut notes = Vec::new();
    let ws = Workspace::create(&plan).context("preparing the test data")?;
    let roots = [("shm", ws.shm.as_path()), ("disk", ws.disk.as_path())];
    // The disk workload also runs each driver with direct I/O on both sides (`ferry serve
    // --direct`, `ferry cp --direct`), the shm workload without the checksum cache (what a
    // first run costs) and with checksums off (the reference of `checksum_cost`): a server
    // of its own per driver and variant.
    let runs = |w: &str| args.only.is_empty() || args.only.iter().any(|x| x == w);
    let (direct, shm) = (runs("disk"), runs("shm"));
    let clear = runs("mem") || shm;
    type Variant<'a> = (String, &'a [&'a str], &'a [(&'a str, &'a str)]);
    let variants: Vec<Variant<'_>> = drivers
        .iter()
        .map(|d| (d.clone(), &[][..], &[][..]))
        .chain(
            drivers
                .iter()
                .filter(|_| direct)
                .map(|d| (format!("{d}{DIRECT}"), &["--direct"][..], &[][..])),
        )
        .chain(drivers.iter().filter(|_| shm).flat_map(|d| {
            [
                (
                    format!("{d}{NO_CACHE}"),
                    &["--no-checksum-cache"][..],
                    &[][..],
                ),
                (format!("{d}{NO_CHECKSUMS}"), &[][..], &[CHECKSUMS_OFF][..]),
            ]
        }))
        // The memory and shm workloads also run at data protection `clear` (the reference
        // of `integrity_vs_clear_*`; every other row is at the default, `integrity`).
        .chain(drivers.iter().filter(|_| clear).map(|d| {
            (
                format!("{d}{CLEAR}"),
                &["--protection", "clear,integrity"][..],
                &[][..],
            )
        }))
        // And at `private` (blocks encrypted): held against clear and against scp.
        .chain(drivers.iter().filter(|_| clear).map(|d| {
            (
                format!("{d}{PRIVATE}"),
                &["--protection", "private"][..],
                &[][..],
            )
        }))
        .collect();
    let servers = Servers {
        ferry: variants
            .iter()
            .enumerate()
            .map(|(i, (v, extra, env))| {
                let d = [DIRECT, NO_CACHE, NO_CHECKSUMS, CLEAR, PRIVATE]
                    .iter()
                    .fold(v.as_str(), |v, s| v.strip_suffix(s).unwrap_or(v));
                let s = addr::address(d, i)
                    .and_then(|a| Server::ferry(&a.to_string(), &roots, extra, env));
                (v.clone(), s)
            })
            .collect(),
        gridftp: need("globus-url-copy")
            .and_then(|()| need("globus-gridftp-server"))
            .and_then(|()| Server::gridftp()),
        xrootd: need("xrdcp")
            .and_then(|()| need("xrootd"))
            .and_then(|()| Server::xrootd(&[&ws.shm, &ws.disk], &ws.xrootd_cfg())),
        iperf3: need("iperf3").and_then(|()| Server::iperf3()),
        sshd: if shm {
            Sshd::start()
        } else {
            Err(anyhow::anyhow!("not run"))
        },
    };
    for (name, s) in [
        ("GridFTP", servers.gridftp.as_ref().err()),
        ("XRootD", servers.xrootd.as_ref().err()),
        ("iperf3", servers.iperf3.as_ref().err()),
        ("OpenSSH", servers.sshd.as_ref().err().filter(|_| shm)),
    ] {
        if let Some(e) = s {
            notes.push(format!("{name}: {e:#}"));
        }
    }
    // Measured before the transfers start, while no server or client competes for the
    // core.
    let check_rates = clear.then(costs::CheckRates::measure);
    let mut cells = cells_of(&plan, &drivers);
    cells.retain(|c| args.only.is_empty() || args.only.contains(&c.row.workload));
    warm_up(&plan, &ws, &servers);
    for rep in 1..=plan.reps {
        tracing::info!("repetition {rep}/{}", plan.reps);
        for c in cells.iter_mut().filter(|c| !c.failed()) {
            if c.row.workload == "disk" && !data::drop_caches() {
                let n =
                    "could not drop the page cache (needs root): disk rows may read from memory";
                if !notes.iter().any(|x| x == n) {
                    notes.push(n.into());
                }
            }
            let m = transfer(&plan, &ws, &servers, &c.row);
            c.record(m);
        }
    }
    let status: Vec<DriverStatus> = servers
        .ferry
        .iter()
        .map(|(d, s)| DriverStatus {
            driver: d.clone(),
            provider: None,
            error: s.as_ref().err().map(|e| format!("{e:#}")),
        })
        .collect();
    drop(servers);
    drop(ws);
    let rows: Vec<CpRow> = cells.into_iter().map(Cell::finish).collect();
    let (summary, best) = report::summary(&rows);
    let report = CpReport {
        report: Report {
            bench: "cp",
            quick: args.quick,
            machine: Machine::detect(None),
            drivers: status,
            targets: report::targets(&summary),
            rows,
            summary,
        },
        best,
        notes,
        check_rates,
    };
    let png = |p: &Path| report.png(p);
    emit(
        "cp",
        &report,
        &report.report.rows,
        &report.table(),
        &png,
        args.json,
        args.out.as_deref(),
    )
}

/// Every (workload, tool, variant) of the run, in the order they run within a repetition.
fn cells_of(plan: &Plan, drivers: &[String]) -> Vec<Cell> {
    let big = plan.mem_bytes;
    let disk = plan.disk_bytes;
    let small = (plan.small_files * plan.small_bytes) as u64;
    let files = plan.small_files as u64;
    let mut v = Vec::new();
    for d in drivers {
        v.push(Cell::new("mem", "ferry", d, big, 1));
    }
    // At data protection `clear`, the reference of integrity_vs_clear_mem, and at
    // `private` (private_vs_clear_mem).
    for suffix in [CLEAR, PRIVATE] {
        for d in drivers {
            v.push(Cell::new("mem", "ferry", &format!("{d}{suffix}"), big, 1));
        }
    }
    v.push(Cell::new("mem", "iperf3", "", big, 1));
    for d in drivers {
        v.push(Cell::new("shm", "ferry", d, big, 1));
    }
    // The same, hashing every run (a server without the checksum cache: what the first run
    // of an unchanged file costs), with checksums off (the reference of checksum_cost), and
    // at data protection `clear` (the reference of integrity_vs_clear_shm) and `private`.
    for suffix in [NO_CACHE, NO_CHECKSUMS, CLEAR, PRIVATE] {
        for d in drivers {
            v.push(Cell::new("shm", "ferry", &format!("{d}{suffix}"), big, 1));
        }
    }
    // The encrypted copies users have today: scp with OpenSSH's default cipher
    // (chacha20-poly1305) and with AES-256-GCM (what `private` uses), and rsync over ssh.
    for cipher in ["", "aes256-gcm@openssh.com"] {
        v.push(Cell::new("shm", "scp", cipher, big, 1));
    }
    v.push(Cell::new("shm", "rsync", "-e ssh", big, 1));
    for p in ["-p 1", "-p 4"] {
        v.push(Cell::new("shm", "gridftp", p, big, 1));
    }
    v.push(Cell::new("shm", "xrdcp", "", big, 1));
    for d in drivers {
        v.push(Cell::new("disk", "ferry", d, disk, 1));
    }
    for d in drivers {
        v.push(Cell::new("disk", "ferry", &format!("{d}{DIRECT}"), disk, 1));
    }
    for p in ["-p 1", "-p 4"] {
        v.push(Cell::new("disk", "gridftp", p, disk, 1));
    }
    v.push(Cell::new("disk", "xrdcp", "", disk, 1));
    for side in ["read", "write"] {
        v.push(Cell::new("disk", "fio", side, disk, 1));
    }
    for d in drivers {
        v.push(Cell::new("small", "ferry", d, small, files));
    }
    // The counterpart of GridFTP's -cc 4: the tree's files spread over four streams.
    for d in drivers {
        v.push(Cell::new(
            "small",
            "ferry",
            &format!("{d}{STREAMS}"),
            small,
            files,
        ));
    }
    // -cc 4 (four concurrent FTP connections for the files of a tree) is GridFTP's fastest
    // form for many small files, faster than plain -r and than -pp pipelining (the figures
    // are in bench/results/README.md, "cp"), so ferry is held against its best.
    for p in ["-p 1", "-p 4", "-cc 4"] {
        v.push(Cell::new("small", "gridftp", p, small, files));
    }
    v.push(Cell::new("small", "xrdcp", "", small, files));
    // What a copy costs before any data moves (start-up, connection, security, one
    // request): a one-byte file, whole-process time.
    for d in drivers {
        v.push(Cell::new("start", "ferry", d, 1, 1));
    }
    v.push(Cell::new("start", "gridftp", "-p 1", 1, 1));
    v.push(Cell::new("start", "xrdcp", "", 1, 1));
    v
}

/// fio alone on the disk, direct: reading the source (`read`) or writing a file of the
/// same size, fsynced at the end (`write`). A copy reads and writes the disk at once, so the
/// slower of the two bounds every tool's disk row from above (`disk_vs_device`). fio running
/// both at once is no such bound: it moved less than ferry's copy in the same runs (figures
/// in bench/results/README.md, "cp").
fn fio_alone(side: &str, src: &Path, dst: &Path, bytes: u64) -> Command {
    let mut c = Command::new("fio");
    c.args([
        "--output-format=terse",
        "--name=ceiling",
        "--bs=4M",
        "--direct=1",
    ])
    .args(["--ioengine=libaio", "--iodepth=4"])
    .arg(format!("--size={bytes}"));
    match side {
        "read" => c
            .args(["--rw=read"])
            .arg(format!("--filename={}", src.display())),
        _ => c
            .args(["--rw=write", "--end_fsync=1"])
            .arg(format!("--filename={}", dst.display())),
    };
    c
}

/// One transfer of each tool before the measured ones (connections, caches, lazy loading).
fn warm_up(plan: &Plan, ws: &Workspace, servers: &Servers) {
    let warm = Plan {
        mem_bytes: plan.mem_bytes.min(64 << 20),
        ..*plan
    };
    for c in cells_of(&warm, &[]) {
        if c.row.workload == "shm" && c.row.variant != "-p 4" {
            let _ = transfer(&warm, ws, servers, &c.row);
        }
    }
    for (d, _) in &servers.ferry {
        let _ = transfer(
            &warm,
            ws,
            servers,
            &Cell::new("mem", "ferry", d, 64 << 20, 1).row,
        );
    }
}

fn ok<'a>(s: &'a Result<Server>, name: &str) -> Result<&'a Server> {
    s.as_ref().map_err(|e| anyhow::anyhow!("{name}: {e:#}"))
}

/// Runs one transfer of `row`'s tool and workload.
fn transfer(plan: &Plan, ws: &Workspace, servers: &Servers, row: &CpRow) -> Result<Measured> {
    let quiet = |c: &mut Command| {
        c.env("RUST_LOG", "warn");
    };
    let (src, dst) = ws.paths(&row.workload);
    let (server, cmd) = match row.tool.as_str() {
        "ferry" => {
            let server = servers
                .ferry
                .iter()
                .find(|(d, _)| *d == row.variant.strip_suffix(STREAMS).unwrap_or(&row.variant))
                .map(|(_, s)| ok(s, &format!("ferry serve ({})", row.variant)))
                .context("no server for this driver")??;
            let exe = std::env::current_exe().context("locating the ferry binary")?;
            let mut c = Command::new(exe);
            quiet(&mut c);
            c.args(["cp", "--quiet"]);
            if row.variant.ends_with(DIRECT) {
                c.arg("--direct");
            }
            if row.variant.ends_with(STREAMS) {
                c.args(["-p", "4"]);
            }
            if row.variant.ends_with(NO_CHECKSUMS) {
                c.env(CHECKSUMS_OFF.0, CHECKSUMS_OFF.1);
            }
            if row.variant.ends_with(CLEAR) {
                c.args(["--protect", "clear"]);
            }
            if row.variant.ends_with(PRIVATE) {
                c.args(["--protect", "private"]);
            }
            let remote = |rel: &str| format!("{}/{rel}", server.addr);
            match row.workload.as_str() {
                "mem" => c
                    .arg(remote(&format!("mem/zero/{}", row.bytes)))
                    .arg("null:"),
                "shm" => c.arg(remote("shm/big")).arg("null:"),
                "start" => c.arg(remote(&format!("shm/{}", data::TINY))).arg("null:"),
                "disk" => c.arg(remote("disk/big")).arg(&dst),
                // The tree's contents into the output directory, as GridFTP's `-r -cd src/ dst/`.
                _ => c.arg("-r").arg(remote("shm/small/")).arg(&dst),
            };
            (Some(server), c)
        }
        "gridftp" => {
            let server = ok(&servers.gridftp, "GridFTP")?;
            let mut c = Command::new("globus-url-copy");
            c.arg("-fast");
            match row.variant.as_str() {
                "-p 4" => c.args(["-p", "4"]),
                "-cc 4" => c.args(["-cc", "4"]),
                _ => &mut c,
            };
            let url = |p: &Path| format!("ftp://127.0.0.1:{}{}", server.addr, p.display());
            match row.workload.as_str() {
                "small" => c
                    .args(["-r", "-cd"])
                    .arg(format!("{}/", url(&src)))
                    .arg(format!("file://{}/", dst.display())),
                _ => c.arg(url(&src)).arg(format!("file://{}", dst.display())),
            };
            (Some(server), c)
        }
        "xrdcp" => {
            let server = ok(&servers.xrootd, "XRootD")?;
            let mut c = Command::new("xrdcp");
            c.args(["-f", "-s"]);
            if row.workload == "small" {
                // xrdcp -r wants its target directory to exist (it copies into it).
                c.arg("-r");
                ws.clear_output(&row.workload)?;
                std::fs::create_dir_all(&dst)
                    .with_context(|| format!("creating {}", dst.display()))?;
            }
            c.arg(format!(
                "root://127.0.0.1:{}/{}",
                server.addr,
                src.display()
            ))
            .arg(&dst);
            (Some(server), c)
        }
        "scp" => {
            let sshd = servers
                .sshd
                .as_ref()
                .map_err(|e| anyhow::anyhow!("OpenSSH: {e:#}"))?;
            (Some(&sshd.server), sshd.scp(&row.variant, &src, &dst))
        }
        // rsync replaces its destination through a temporary file, so it writes a file in
        // /dev/shm (removed after) where the others write to /dev/null.
        "rsync" => {
            let sshd = servers
                .sshd
                .as_ref()
                .map_err(|e| anyhow::anyhow!("OpenSSH: {e:#}"))?;
            (Some(&sshd.server), sshd.rsync(&src, &rsync_out(ws)))
        }
        "iperf3" => {
            let server = ok(&servers.iperf3, "iperf3")?;
            let mut c = Command::new("iperf3");
            c.args(["-c", "127.0.0.1", "-p", &server.addr, "-J"])
                .args(["-n", &row.bytes.to_string()]);
            (Some(server), c)
        }
        "fio" => {
            need("fio")?;
            (None, fio_alone(&row.variant, &src, &dst, row.bytes))
        }
        t => bail!("unknown tool {t}"),
    };
    if !(row.tool == "xrdcp" && row.workload == "small") {
        ws.clear_output(&row.workload)?;
    }
    // fio syncs its own writes (and reading writes nothing).
    let (mut m, out) = run_client(cmd, server, plan.timeout, || match row.tool.as_str() {
        "fio" => Ok(()),
        _ => data::sync_output(&row.workload, &dst),
    })?;
    if row.tool != "fio" {
        ws.check_output(row)?;
    }
    if row.tool == "iperf3" {
        // iperf3's own receiver rate (its start-up and test negotiation are not transfer).
        let s = super::refs::parse_iperf3(&out)?;
        m.secs = row.bytes as f64 / (s.value * 1e9);
    }
    ws.clear_output(&row.workload)?;
    if row.tool == "rsync" {
        std::fs::remove_file(rsync_out(ws)).context("removing rsync's output")?;
    }
    Ok(m)
}

/// Where the rsync rows write (a file beside the shm workload's source).
fn rsync_out(ws: &Workspace) -> PathBuf {
    ws.shm.join("out-rsync")
}
