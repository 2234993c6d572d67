//! `ferry bench cio`: the ECIO seed's tables 1 to 4 — the seed's pattern (MPI_INTs, block
//! length 1, stride 2) written and read collectively by 2 and 4 ranks, counts 4k to 1,024k
//! — through Open MPI's MPI-IO (ROMIO two-phase and with collective buffering off, OMPIO
//! vulcan and individual) on a local path in the server's root, and through ferry's
//! interposer (`ecio` on tcp and ofi+shm, `independent`) against a `ferry serve` the bench
//! starts, all in one run. Each point is one `mpirun` of c/mpiio/tests/seed.c repeating the
//! timed call; the configurations take turns, the first changing from point to point
//! (see docs/cio.md, "Benchmark").

mod mpi;
mod plot;
mod report;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;

use super::cp::tools::Server;
use super::report::{emit, median, round, DriverStatus, Machine, Report};
use mpi::{Io, SeedRun, Times};
use report::{CioReport, CioRow};

/// Options of `ferry bench cio`.
#[derive(Args)]
pub struct CioArgs {
    /// Short run (a few minutes): counts 4k, 64k and 1,024k, at most 10 calls or 2 s per
    /// point.
    #[arg(long)]
    quick: bool,
    /// Print exactly one JSON object on stdout instead of the table (files only with --out).
    #[arg(long)]
    json: bool,
    /// Where to write CSV, JSON and PNG [default without --json: bench/results/cio].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Directory for the server's root, where every configuration writes its file
    /// [default: the system's temporary directory].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Counts of MPI_INTs, comma-separated [default: 4000, 8000, ... 1024000; --quick:
    /// 4000,64000,1024000].
    #[arg(long, value_delimiter = ',')]
    counts: Vec<u64>,
    /// Rank counts, comma-separated [default: 2,4].
    #[arg(long, value_delimiter = ',')]
    np: Vec<u32>,
    /// Timed calls per point at most [default: 100 as in the seed, 10 with --quick].
    #[arg(long)]
    iters: Option<usize>,
    /// Seconds of timed calls per point at most [default: 10, 2 with --quick].
    #[arg(long)]
    budget: Option<f64>,
    /// Only the configurations whose label (`romio two-phase`, `ferry ecio ofi+shm`, ...)
    /// contains one of these words, comma-separated (e.g. `ferry`, `cb-off,ecio`). The
    /// row `ferry ecio-nocache tcp` (ECIO with the client's write pipelining and read
    /// cache off) runs only when a word holds `nocache` (e.g. `ecio,nocache,cb-off`).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// The interposer [default: libferry-mpiio.so beside the ferry binary, where `make
    /// build-mpiio` puts it].
    #[arg(long)]
    mpiio_lib: Option<PathBuf>,
}

/// What a run measures.
#[derive(Debug, Clone)]
struct Plan {
    counts: Vec<u64>,
    nps: Vec<u32>,
    iters: usize,
    budget_s: f64,
}

impl Plan {
    fn new(a: &CioArgs) -> Plan {
        let counts = match (a.counts.is_empty(), a.quick) {
            (false, _) => a.counts.clone(),
            (true, true) => vec![4_000, 64_000, report::FULL_COUNT],
            (true, false) => (0..9).map(|k| 4_000u64 << k).collect(),
        };
        Plan {
            counts,
            nps: if a.np.is_empty() {
                vec![2, 4]
            } else {
                a.np.clone()
            },
            iters: a.iters.unwrap_or(if a.quick { 10 } else { 100 }).max(1),
            budget_s: a.budget.unwrap_or(if a.quick { 2.0 } else { 10.0 }),
        }
    }
}

/// One MPI-IO configuration of the run.
struct Config {
    io: &'static str,
    variant: &'static str,
    /// `local`, or the ferry driver.
    driver: &'static str,
    how: Io,
    /// Aggregators of a two-phase collective (0: no redistribution among ranks).
    aggregators: u64,
    /// ferry's client settings (`pipeline`, `plain`); empty for MPI-IO.
    client: &'static str,
    /// Run only when `--only` names it (a word holding `nocache`).
    opt_in: bool,
}

impl Config {
    /// `romio two-phase`, `ferry ecio tcp` (as the rows say it).
    fn label(&self) -> String {
        format!("{} {} {}", self.io, self.variant, self.driver)
    }
}

const ROMIO: &[(&str, &str)] = &[("io", "romio321")];
const ROMIO_CB_OFF: &[&str] = &["romio_cb_write=disable", "romio_cb_read=disable"];

/// The configurations, in the order of the table.
fn configs() -> Vec<Config> {
    let local = |io, variant, mca, hints, aggregators| Config {
        io,
        variant,
        driver: "local",
        how: Io::Local { mca, hints },
        aggregators,
        client: "",
        opt_in: false,
    };
    // The interposer's defaults: write pipelining on, the read cache off unless the
    // environment the ranks inherit turns it on.
    let cached =
        std::env::var("FERRY_CIO_READ_CACHE").is_ok_and(|v| !matches!(v.trim(), "" | "off" | "0"));
    let ferry = |variant, driver, hints| Config {
        io: "ferry",
        variant,
        driver,
        how: Io::Ferry { hints },
        aggregators: 0,
        client: if cached { "pipeline+cache" } else { "pipeline" },
        opt_in: false,
    };
    vec![
        local("romio", "two-phase", ROMIO, &[], 1),
        local("romio", "cb-off", ROMIO, ROMIO_CB_OFF, 0),
        local(
            "ompio",
            "vulcan",
            &[("io", "ompio"), ("fcoll", "vulcan")],
            &[],
            1,
        ),
        local(
            "ompio",
            "individual",
            &[("io", "ompio"), ("fcoll", "individual")],
            &[],
            0,
        ),
        ferry("ecio", "tcp", &[]),
        ferry("ecio", "ofi+shm", &[]),
        ferry("independent", "tcp", &["ferry_mode=independent"]),
        // The gain of the client's pipelining and cache, visible in one run; not an ECIO
        // row of the summary.
        Config {
            client: "plain",
            opt_in: true,
            ..ferry(
                "ecio-nocache",
                "tcp",
                &["ferry_pipeline=off", "ferry_read_cache=off"],
            )
        },
    ]
}

/// The token of the bench's servers (theirs alone; given in the environment, not on the
/// command line).
fn token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("ferry-bench-cio-{}-{nanos:09}", std::process::id())
}

/// The ferry servers of the run (one per driver, sharing the root), the interposer and the
/// environment of the ranks; why a driver is missing.
struct Ferry {
    servers: Vec<(&'static str, Server)>,
    missing: Vec<(&'static str, String)>,
    lib: Option<PathBuf>,
    env: Vec<(String, String)>,
}

impl Ferry {
    fn start(dir: &Path, root: &Path, lib: Result<PathBuf>) -> Ferry {
        let env = vec![
            ("FERRY_TOKEN".into(), token()),
            (
                "FERRY_STATE_DIR".into(),
                dir.join("state").display().to_string(),
            ),
            (
                "FERRY_KNOWN_HOSTS".into(),
                dir.join("known_hosts").display().to_string(),
            ),
        ];
        let mut f = Ferry {
            servers: Vec::new(),
            missing: Vec::new(),
            lib: None,
            env,
        };
        let lib = match lib {
            Ok(l) => l,
            Err(e) => {
                let why = format!("{e:#}");
                f.missing = vec![("tcp", why.clone()), ("ofi+shm", why)];
                return f;
            }
        };
        f.lib = Some(lib);
        let env: Vec<(&str, &str)> = (f.env.iter())
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let shm = format!("ofi+shm://ferry-bench-cio-{}", std::process::id());
        for (driver, listen) in [("tcp", "tcp://127.0.0.1:0"), ("ofi+shm", shm.as_str())] {
            let started = Server::ferry(listen, &[("d", root)], &[], &env);
            match started {
                Ok(s) => f.servers.push((driver, s)),
                Err(e) => f.missing.push((driver, format!("{e:#}"))),
            }
        }
        f
    }

    fn server(&self, driver: &str) -> Option<&Server> {
        self.servers
            .iter()
            .find(|(d, _)| *d == driver)
            .map(|x| &x.1)
    }

    fn missing(&self, driver: &str) -> Option<&String> {
        self.missing
            .iter()
            .find(|(d, _)| *d == driver)
            .map(|x| &x.1)
    }
}

/// Runs the benchmark and prints (and writes) the report.
pub fn run(args: &CioArgs) -> Result<()> {
    let plan = Plan::new(args);
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("ferry-bench-cio-{}", std::process::id()));
    let root = dir.join("root");
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let _clean = RemoveOnDrop(dir.clone());
    let seed = mpi::build_seed(&dir)?;
    let ferry = Ferry::start(&dir, &root, mpi::interposer(args.mpiio_lib.as_deref()));
    let configs: Vec<Config> = (configs().into_iter())
        .filter(|c| {
            let named = |w: &String| c.label().contains(w.as_str());
            if c.opt_in {
                args.only.iter().any(|w| w.contains("nocache") && named(w))
            } else {
                args.only.is_empty() || args.only.iter().any(named)
            }
        })
        .collect();
    let mut notes = vec![
        format!(
            "every configuration writes {} (ferry: the server's root d); each point is one \
             mpirun of c/mpiio/tests/seed.c repeating the timed call (at most {} calls or \
             {} s), the configurations taking turns",
            root.display(),
            plan.iters,
            plan.budget_s
        ),
        "resent_bytes: for two-phase configurations, the bytes whose owner is not the \
         aggregator of their file domain, with one aggregator per node (ROMIO's default \
         cb_config_list *:1; taken for OMPIO vulcan too); 0 where ranks exchange no data"
            .into(),
        "server_cpu_ms: ferry serve's CPU over the whole mpirun (open, one call of the \
         other direction, sync, close included) divided by the timed calls"
            .into(),
    ];
    for (d, why) in &ferry.missing {
        notes.push(format!("ferry {d}: {why}"));
    }
    warm_up(&seed, &root);
    let mut rows = Vec::new();
    let mut turn = 0;
    for &np in &plan.nps {
        for &count in &plan.counts {
            for phase in ["w", "r"] {
                let mut order: Vec<&Config> = configs.iter().collect();
                let n = order.len().max(1);
                order.rotate_left(turn % n);
                turn += 1;
                for c in order {
                    let point = Point {
                        np,
                        count,
                        phase,
                        plan: &plan,
                    };
                    rows.push(measure(c, &point, &seed, &root, &ferry));
                }
            }
        }
    }
    drop(ferry.servers);
    // The table's order: np, count, op, then configuration.
    let rank = |r: &CioRow| {
        configs
            .iter()
            .position(|c| c.variant == r.variant && c.driver == r.driver)
    };
    rows.sort_by_key(|r| (r.np, r.count, r.op != "write", rank(r)));
    let summary = report::summary(&rows);
    let mut drivers = vec![DriverStatus::new("local")];
    for d in ["tcp", "ofi+shm"] {
        let mut s = DriverStatus::new(d);
        s.error = ferry.missing.iter().find(|m| m.0 == d).map(|m| m.1.clone());
        drivers.push(s);
    }
    let report = CioReport {
        report: Report {
            bench: "cio",
            quick: args.quick,
            machine: Machine::detect(None),
            drivers,
            targets: report::targets(&summary),
            rows,
            summary,
        },
        notes,
    };
    let png = |p: &Path| report.png(p);
    emit(
        "cio",
        &report,
        &report.report.rows,
        &report.table(),
        &png,
        args.json,
        args.out.as_deref(),
    )
}

/// Where a configuration is measured.
struct Point<'a> {
    np: u32,
    count: u64,
    /// `w` or `r`.
    phase: &'static str,
    plan: &'a Plan,
}

/// One `mpirun` of configuration `c` at `p`: its row.
fn measure(c: &Config, p: &Point, seed: &Path, root: &Path, ferry: &Ferry) -> CioRow {
    let op = if p.phase == "w" { "write" } else { "read" };
    let mut row = CioRow {
        io: c.io.into(),
        variant: c.variant.into(),
        driver: c.driver.into(),
        client: c.client.into(),
        np: p.np,
        count: p.count,
        op: op.into(),
        bytes: 4 * p.count,
        ..CioRow::default()
    };
    let name = format!("{}-{}-{}.bin", c.io, c.variant, c.driver.replace('+', "-"));
    let path = root.join(&name);
    let server = ferry.server(c.driver);
    let file = match (&c.how, server) {
        (Io::Local { .. }, _) => path.display().to_string(),
        (Io::Ferry { .. }, Some(s)) => format!("ferry+{}/d/{name}", s.addr),
        (Io::Ferry { .. }, None) => {
            row.error = Some(ferry.missing(c.driver).cloned().unwrap_or_default());
            return row;
        }
    };
    let run = SeedRun {
        seed,
        np: p.np,
        count: p.count,
        phase: p.phase,
        iters: p.plan.iters,
        budget_s: p.plan.budget_s,
        io: &c.how,
        file: &file,
        ferry_env: &ferry.env,
        lib: ferry.lib.as_deref(),
    };
    let s0 = server.and_then(Server::cpu);
    let measured = run.run();
    let server_cpu = match (s0, server.and_then(Server::cpu)) {
        (Some(a), Some(b)) => Some((b - a).max(0.0)),
        _ => None,
    };
    let _ = std::fs::remove_file(&path);
    match measured {
        Ok(t) => fill(&mut row, &t, server_cpu, c.aggregators),
        Err(e) => {
            let why = format!("{e:#}");
            tracing::warn!("{} np {} count {} {op}: {why}", row.label(), p.np, p.count);
            row.error = Some(why);
        }
    }
    row
}

/// The row's values from the seed's times.
fn fill(row: &mut CioRow, t: &Times, server_cpu_s: Option<f64>, aggregators: u64) {
    let n = t.ms.len();
    let mut ms = t.ms.clone();
    let med = median(&mut ms);
    row.iters = n;
    row.ms = med.map(|m| round(m, 3));
    row.ms_min = ms.first().map(|m| round(*m, 3));
    row.mb_s = med
        .filter(|m| *m > 0.0)
        .map(|m| round(row.bytes as f64 / (m / 1e3) / 1e6, 1));
    row.rank_cpu_ms = Some(round(t.cpu_s * 1e3 / n as f64, 3));
    row.server_cpu_ms = server_cpu_s.map(|s| round(s * 1e3 / n as f64, 3));
    if aggregators > 0 {
        row.resent_bytes = report::resent_bytes(row.count, row.np.into(), aggregators);
    }
}

/// One untimed run first, so the first measured point does not pay for loading Open MPI.
fn warm_up(seed: &Path, root: &Path) {
    let io = Io::Local {
        mca: ROMIO,
        hints: &[],
    };
    let path = root.join("warm-up.bin");
    let file = path.display().to_string();
    let run = SeedRun {
        seed,
        np: 2,
        count: 4_000,
        phase: "w",
        iters: 1,
        budget_s: 0.0,
        io: &io,
        file: &file,
        ferry_env: &[],
        lib: None,
    };
    if let Err(e) = run.run() {
        tracing::warn!("warm-up: {e:#}");
    }
    let _ = std::fs::remove_file(&path);
}

/// Removes a scratch directory when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
