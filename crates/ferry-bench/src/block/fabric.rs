//! The block service's fabric path in `bench block`: the seed's schemes (zero-copy
//! delegation, copy-based) on ofi+shm and native tcp, 1 MiB sequential write and read at
//! QD 16, through the direct Rust client and through `ferry block attach` (fio's nbd
//! engine on the attach's Unix socket); also delegation with a key rotation after every
//! I/O (`always_invalidate`) and the paper's read scheme (server fills, client RMA-reads).
//! And block aggregation: 4 KiB sequential writes at QD 16 through the attach with adjacent
//! writes merged (`zcopy`) and not (`zcopy-nomerge`).
//! The face runs in this process on the service floor over a memory export.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use ferry_block::backend::memory::MemoryBackend;
use ferry_block::config::ExportConfig;
use ferry_block::deleg::attach::{RemoteBackend, DEFAULT_SESSIONS};
use ferry_block::deleg::client::{Client, Options};
use ferry_block::deleg::proto::{ReadMode, Scheme};
use ferry_block::deleg::server::{FabricService, PoolConfig};
use ferry_block::{BlockServer, Export};
use ferry_service::admit::{Admission, LimitsConfig};
use ferry_service::auth::AuthConfig;
use ferry_service::registry::{Registry, Service};
use ferry_service::secure::{ClientSecurity, ServerSecurity};
use ferry_service::serve::{bind_all, serve_until};

use super::fio::{self, Workload, WORKLOADS};
use super::report::BlockRow;

const TOKEN: &str = "bench";

/// A scheme as the rows name it, and how a client asks for it.
#[derive(Clone, Copy)]
struct Way {
    /// The row's path; `nbd` is the baseline: ferry's NBD server over TCP, no fabric.
    path: &'static str,
    scheme: Scheme,
    read: ReadMode,
    invalidate: bool,
    /// Adjacent writes merged into one request (block aggregation).
    merge: bool,
}

const WAYS: [Way; 5] = [
    Way {
        path: "zcopy",
        scheme: Scheme::Delegated,
        read: ReadMode::ServerWrite,
        invalidate: false,
        merge: true,
    },
    Way {
        path: "zcopy-fill",
        scheme: Scheme::Delegated,
        read: ReadMode::ServerFill,
        invalidate: false,
        merge: true,
    },
    Way {
        path: "zcopy-inval",
        scheme: Scheme::Delegated,
        read: ReadMode::ServerWrite,
        invalidate: true,
        merge: true,
    },
    Way {
        path: "bcopy",
        scheme: Scheme::Copy,
        read: ReadMode::ServerWrite,
        invalidate: false,
        merge: true,
    },
    Way {
        path: "nbd",
        scheme: Scheme::Copy,
        read: ReadMode::ServerWrite,
        invalidate: false,
        merge: true,
    },
];

/// Block aggregation's pair: the default way with merging off.
const NOMERGE: Way = Way {
    path: "zcopy-nomerge",
    merge: false,
    ..WAYS[0]
};

/// Block aggregation's job: small sequential writes, many in flight.
const SMALL_SEQ: Workload = Workload {
    name: "seqwrite",
    rw: "write",
    bs: 4096,
    qd: 16,
};

/// The fabric rows of a run.
pub struct FabricRun {
    /// One per (client, transport, scheme, workload).
    pub rows: Vec<BlockRow>,
}

/// The in-process server: the floor with the block face over a memory export, listening on
/// native tcp and ofi+shm; stops when dropped.
struct Floor {
    addrs: Vec<(&'static str, String)>,
    quit: Arc<AtomicBool>,
    server: Option<std::thread::JoinHandle<()>>,
    face: Arc<FabricService>,
}

impl Drop for Floor {
    /// Stops accepting, closes the listeners and waits for the sessions to end: the
    /// process may exit right after, and libfabric's exit-time teardown must not meet a
    /// thread still closing an endpoint (a segfault in the shm provider was seen so).
    fn drop(&mut self) {
        self.quit.store(true, Ordering::SeqCst);
        if let Some(t) = self.server.take() {
            let _ = t.join();
        }
        let left = self.face.drain(Duration::from_secs(5)).abandoned;
        if left > 0 {
            tracing::warn!("{left} block sessions still running at the bench's end");
        }
    }
}

fn floor(region: u64, dir: &Path) -> Result<Floor> {
    let backend = Arc::new(MemoryBackend::new(region));
    let export = Export::new(&ExportConfig::memory("mem", region), backend);
    let auth = AuthConfig {
        tokens: vec![TOKEN.into()],
        ..AuthConfig::default()
    };
    let admission = Admission::new(&LimitsConfig::default(), |_, _| 0);
    let face = FabricService::new(
        vec![export],
        auth.clone(),
        admission.clone(),
        PoolConfig::default(),
    );
    // Clear connections, as a trusted network's (TLS would cost the copy scheme alone).
    let security = ServerSecurity::from_state_dir(&dir.join("state"), true)?;
    let face = Arc::new(face);
    let mut reg = Registry::new(auth, security);
    reg.add(ferry_block::deleg::SERVICE, face.clone())?;
    let shm = format!("ofi+shm://ferry-bench-block-{}", std::process::id());
    let names = ["tcp", "ofi+shm"];
    let listeners = bind_all(&["tcp://127.0.0.1:0".to_string(), shm])?;
    let addrs = names
        .into_iter()
        .zip(listeners.iter().map(|l| l.local_addr()))
        .collect();
    let quit = Arc::new(AtomicBool::new(false));
    let (reg, q) = (Arc::new(reg), quit.clone());
    let server = std::thread::spawn(move || serve_until(&reg, &admission, &listeners, &q));
    Ok(Floor {
        addrs,
        quit,
        server: Some(server),
        face,
    })
}

fn options(w: &Way) -> Options {
    Options {
        token: TOKEN.into(),
        scheme: w.scheme,
        read: w.read,
        always_invalidate: w.invalidate,
        merge: w.merge,
        security: ClientSecurity {
            clear: true,
            ..ClientSecurity::default()
        },
        ..Options::new("mem")
    }
}

/// Runs every fabric row `reps` times (ways alternating within each job) and keeps the
/// median of each.
pub fn run(region: u64, secs: f64, reps: usize, dir: &Path, out: &Path) -> FabricRun {
    let jobs: Vec<Workload> = WORKLOADS
        .iter()
        .copied()
        .filter(|w| w.bs == 1 << 20)
        .collect();
    let mut rows = Vec::new();
    let fl = match floor(region, dir) {
        Ok(f) => f,
        Err(e) => {
            for w in &jobs {
                let mut r = row("ferry direct", "zcopy", "tcp", w);
                r.error = Some(format!("{e:#}"));
                rows.push(r);
            }
            return FabricRun { rows };
        }
    };
    for client in ["ferry direct", "ferry attach"] {
        for (transport, addr) in &fl.addrs {
            for w in &jobs {
                let mut samples: Vec<Vec<f64>> = vec![Vec::new(); WAYS.len()];
                let mut errors: Vec<Option<String>> = vec![None; WAYS.len()];
                // The NBD baseline once per job, beside the attaches on ofi+shm.
                let baseline = client == "ferry attach" && *transport == "ofi+shm";
                for rep in 0..reps {
                    for k in 0..WAYS.len() {
                        let i = (k + rep) % WAYS.len();
                        let way = &WAYS[i];
                        let r = match (client, way.path) {
                            (_, "nbd") if !baseline => continue,
                            (_, "nbd") => nbd_tcp(w, region, secs, out),
                            ("ferry direct", _) => direct(addr, way, w, region, secs),
                            _ => attached(addr, way, w, region, secs, dir, out),
                        };
                        match r {
                            Ok(g) => samples[i].push(g),
                            Err(e) => errors[i] = Some(format!("{e:#}")),
                        }
                    }
                }
                for (i, way) in WAYS.iter().enumerate() {
                    if way.path == "nbd" && !baseline {
                        continue;
                    }
                    let transport = if way.path == "nbd" { "tcp" } else { transport };
                    let mut r = row(client, way.path, transport, w);
                    r.reps = samples[i].len();
                    r.gbps = super::median(&mut samples[i]).map(|g| super::round(g, 3));
                    r.iops = r.gbps.map(|g| super::round(g * 1e9 / w.bs as f64, 0));
                    r.error = errors[i].take().filter(|_| r.gbps.is_none());
                    rows.push(r);
                }
            }
        }
    }
    for (transport, addr) in &fl.addrs {
        rows.extend(aggregation(transport, addr, region, secs, reps, dir, out));
    }
    FabricRun { rows }
}

/// The block aggregation rows on one transport: fio's 4 KiB sequential writes through an
/// attach with merging on and off, alternated, `reps` times each.
fn aggregation(
    transport: &str,
    addr: &str,
    region: u64,
    secs: f64,
    reps: usize,
    dir: &Path,
    out: &Path,
) -> Vec<BlockRow> {
    let ways = [WAYS[0], NOMERGE];
    let mut samples = [Vec::new(), Vec::new()];
    let mut errors = [None, None];
    for rep in 0..reps {
        for k in 0..ways.len() {
            let i = (k + rep) % ways.len();
            match attached(addr, &ways[i], &SMALL_SEQ, region, secs, dir, out) {
                Ok(g) => samples[i].push(g),
                Err(e) => errors[i] = Some(format!("{e:#}")),
            }
        }
    }
    let mut rows = Vec::new();
    for (i, way) in ways.iter().enumerate() {
        let mut r = row("ferry attach", way.path, transport, &SMALL_SEQ);
        r.reps = samples[i].len();
        r.gbps = super::median(&mut samples[i]).map(|g| super::round(g, 3));
        r.iops = r
            .gbps
            .map(|g| super::round(g * 1e9 / SMALL_SEQ.bs as f64, 0));
        r.error = errors[i].take().filter(|_| r.gbps.is_none());
        rows.push(r);
    }
    rows
}

fn row(client: &str, path: &str, transport: &str, w: &Workload) -> BlockRow {
    BlockRow {
        server: client.into(),
        path: path.into(),
        transport: transport.into(),
        backend: "memory".into(),
        workload: w.name.into(),
        bs: w.bs,
        qd: w.qd,
        ..BlockRow::default()
    }
}

/// GB/s of the direct client streaming `w` over the region for `secs` (its requests are
/// pipelined up to the server's credits: QD 16 with the default pool).
fn direct(addr: &str, way: &Way, w: &Workload, region: u64, secs: f64) -> Result<f64> {
    let c = Client::connect(addr, &options(way))?;
    let call = (64u64 << 20).min(region);
    let mut buf = vec![0x5au8; call as usize];
    let (start, mut bytes, mut at) = (Instant::now(), 0u64, 0u64);
    let limit = Duration::from_secs_f64(secs);
    while start.elapsed() < limit {
        if at + call > region {
            at = 0;
        }
        if w.writes() {
            c.write_at(at, &buf, false)?;
        } else {
            c.read_at(at, &mut buf)?;
        }
        bytes += call;
        at += call;
    }
    let gbps = bytes as f64 / start.elapsed().as_secs_f64() / 1e9;
    c.close();
    Ok(gbps)
}

/// GB/s fio's nbd engine gets through an attach (in this process) to the export.
fn attached(
    addr: &str,
    way: &Way,
    w: &Workload,
    region: u64,
    secs: f64,
    dir: &Path,
    out: &Path,
) -> Result<f64> {
    let remote = RemoteBackend::connect(addr, &options(way), DEFAULT_SESSIONS)?;
    let sock = dir.join(format!("attach-{}.sock", way.path));
    let _ = std::fs::remove_file(&sock);
    let cfg = ExportConfig::memory("mem", region);
    let nbd = Arc::new(BlockServer::with_exports(
        &[format!("unix:{}", sock.display())],
        vec![Export::new(&cfg, Arc::new(remote))],
    )?);
    let quit = Arc::new(AtomicBool::new(false));
    let (n, q) = (nbd.clone(), quit.clone());
    let t = std::thread::spawn(move || n.serve_until(&q));
    let uri = format!("nbd+unix:///mem?socket={}", sock.display());
    let m = fio::run(&uri, w, region, Some(secs), out);
    quit.store(true, Ordering::SeqCst);
    t.join()
        .map_err(|_| anyhow!("the attach's NBD server panicked"))?;
    nbd.drain(Duration::from_millis(200));
    Ok(m?.gbps)
}

/// GB/s fio's nbd engine gets from ferry's NBD server (in this process, memory export)
/// over TCP: the scheme without the fabric.
fn nbd_tcp(w: &Workload, region: u64, secs: f64, out: &Path) -> Result<f64> {
    let export = Export::new(
        &ExportConfig::memory("mem", region),
        Arc::new(MemoryBackend::new(region)),
    );
    let nbd = Arc::new(BlockServer::with_exports(
        &["127.0.0.1:0".to_string()],
        vec![export],
    )?);
    let uri = format!("{}/mem", nbd.local_addrs()[0]);
    let quit = Arc::new(AtomicBool::new(false));
    let (n, q) = (nbd.clone(), quit.clone());
    let t = std::thread::spawn(move || n.serve_until(&q));
    // Reads need pages, not holes: fill the region first (untimed).
    if !w.writes() {
        let fill = WORKLOADS[0];
        fio::run(&uri, &fill, region, None, out)?;
    }
    let m = fio::run(&uri, w, region, Some(secs), out);
    quit.store(true, Ordering::SeqCst);
    t.join().map_err(|_| anyhow!("the NBD server panicked"))?;
    nbd.drain(Duration::from_millis(200));
    Ok(m?.gbps)
}

/// `a ÷ b` of two rows' GB/s (sequential writes of `bs` bytes), rounded.
pub fn ratio(
    rows: &[BlockRow],
    bs: u64,
    a: (&str, &str, &str),
    b: (&str, &str, &str),
) -> Option<f64> {
    let find = |(server, path, transport): (&str, &str, &str)| {
        rows.iter()
            .find(|r| {
                r.server == server
                    && r.path == path
                    && r.transport == transport
                    && r.workload == "seqwrite"
                    && r.bs == bs
                    && r.backend == "memory"
            })
            .and_then(|r| r.gbps)
    };
    match (find(a), find(b)) {
        (Some(x), Some(y)) if y > 0.0 => Some(super::round(x / y, 3)),
        _ => None,
    }
}
