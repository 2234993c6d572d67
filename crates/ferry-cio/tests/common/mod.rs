//! What the collective I/O tests share: an in-process server on a real listener, scratch
//! roots, and the reference placement of MPI-IO's view semantics.

// Each test binary uses its own subset.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_cio::server::Server;
use ferry_cio::{amode, CioConfig, Comm, File};
use ferry_dtype::Datatype;
use ferry_service::admit::{Admission, LimitsConfig};
use ferry_service::auth::AuthConfig;

/// The token every test server accepts.
pub const TOKEN: &str = "cio-test-token-0001";

/// A client's security whose known-hosts file is this test process's own, in the
/// temporary directory: a test run never pins its servers into the user's
/// (`~/.config/ferry/known_hosts`).
pub fn security() -> ferry_service::secure::ClientSecurity {
    let file = format!("ferry-cio-test-{}.known_hosts", std::process::id());
    ferry_service::secure::ClientSecurity {
        known_hosts: std::env::temp_dir().join(file),
        ..Default::default()
    }
}

/// [`File::open`] with [`security`].
pub fn open(addr: &str, path: &str, comm: Comm, mode: u32, token: &str) -> ferry_cio::Result<File> {
    File::open_with(addr, path, comm, mode, token, &security())
}

/// A running in-process server exporting a scratch directory as root `d`; stops on drop.
pub struct Running {
    pub addr: String,
    pub root: PathBuf,
    pub server: Arc<Server>,
    quit: Arc<AtomicBool>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.quit.store(true, Ordering::SeqCst);
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Starts a server on `driver` (`tcp`, `ofi+tcp`, `ofi+shm`), collective timeout `timeout`.
pub fn start(driver: &str, timeout: Duration) -> Running {
    start_with(
        driver,
        CioConfig {
            collective_timeout: timeout.as_secs_f64(),
            chunk: 64 * 1024,
            ..CioConfig::default()
        },
    )
}

/// Starts a server on `driver` with the settings `cfg`.
pub fn start_with(driver: &str, cfg: CioConfig) -> Running {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let tag = format!("ferry-cio-{}-{n}", std::process::id());
    let root = std::env::temp_dir().join(&tag);
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let listen = match driver {
        "ofi+shm" => format!("ofi+shm://{tag}"),
        d => format!("{d}://127.0.0.1:0"),
    };
    let auth = AuthConfig {
        tokens: vec![TOKEN.into()],
        ..AuthConfig::default()
    };
    let admission = Admission::new(&LimitsConfig::default(), |_, _| 0);
    let audit = Arc::new(ferry_service::audit::Audit::open(None).unwrap());
    let server = Server::new(cfg, &[("d".into(), root.clone())], (auth, admission), audit).unwrap();
    let listeners = ferry_service::serve::bind_all(&[listen]).unwrap();
    let addr = listeners[0].local_addr();
    let quit = Arc::new(AtomicBool::new(false));
    let (q, s) = (quit.clone(), server.clone());
    std::thread::spawn(move || s.serve_until(&listeners, &q));
    Running {
        addr,
        root,
        server,
        quit,
    }
}

/// A job key no other test of this process uses.
pub fn job() -> u64 {
    static J: AtomicU64 = AtomicU64::new(1);
    (u64::from(std::process::id()) << 32) | J.fetch_add(1, Ordering::Relaxed)
}

/// Where MPI-IO's view semantics put each byte of a data stream: the file offset of
/// stream bytes `start..start + len` of the view (`disp`, `filetype` tiled every extent),
/// computed byte by byte from one flattened tile.
pub fn reference_offsets(disp: u64, filetype: &Datatype, start: u64, len: u64) -> Vec<u64> {
    let tile: Vec<i64> = filetype
        .flatten(1)
        .unwrap()
        .iter()
        .flat_map(|s| (0..s.len as i64).map(move |b| s.offset + b))
        .collect();
    let per = tile.len() as u64;
    (start..start + len)
        .map(|p| {
            let (k, i) = (p / per, p % per);
            let at = disp as i64 + k as i64 * filetype.extent() + tile[i as usize];
            at as u64
        })
        .collect()
}

/// Places `stream` into `image` (grown as needed) the reference way.
pub fn reference_place(image: &mut Vec<u8>, offsets: &[u64], stream: &[u8]) {
    for (&o, &b) in offsets.iter().zip(stream) {
        let o = o as usize;
        if image.len() <= o {
            image.resize(o + 1, 0);
        }
        image[o] = b;
    }
}

/// Runs `f(rank, file)` on `size` ranks of one job opening `path`, each on its thread.
pub fn ranks<R: Send + 'static>(
    addr: &str,
    path: &str,
    size: u32,
    f: impl Fn(u32, File) -> R + Send + Sync + Copy + 'static,
) -> Vec<R> {
    let key = job();
    let handles: Vec<_> = (0..size)
        .map(|rank| {
            let (addr, path) = (addr.to_string(), path.to_string());
            std::thread::spawn(move || {
                let comm = Comm {
                    job: key,
                    rank,
                    size,
                };
                f(
                    rank,
                    open(&addr, &path, comm, amode::CREATE | amode::RDWR, TOKEN).unwrap(),
                )
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Ends the test process if `what` is not done within `limit`: a deadlock fails the test
/// instead of hanging it. Dropped (done) it stands down.
pub struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    pub fn new(what: &'static str, limit: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            while start.elapsed() < limit {
                if d.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            eprintln!("{what}: not done within {limit:?} (deadlock?)");
            std::process::exit(101);
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}
