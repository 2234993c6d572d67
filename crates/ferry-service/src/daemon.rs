//! A server process's life, shared by every face: the faces it hosts (EXS services chosen
//! in the handshake, and endpoints on sockets of their own such as NBD's), the signals that
//! drain it, and the exit a wedged fabric provider forces.
//!
//! `ferry serve` is a composition root over this: it builds each face from its part of the
//! configuration, adds it to a [`Daemon`], and then:
//!
//! ```text
//! let running = daemon.start()?;          // signals, wedge exit, bind every address
//! for a in running.addresses() { println!("listening on {a}") }
//! running.serve_until_signal();           // accept until SIGTERM/SIGINT
//! let report = running.drain(grace);      // every face finishes or stops its work
//! ```
//!
//! The first SIGTERM or SIGINT stops accepting and starts every face's drain; a second one
//! exits at once with status 1. A wedged provider (a peer died holding its lock, see
//! `docs/fabric.md`) leaves the listeners and connections on its domain dead with threads
//! stuck inside it, so the process exits with [`WEDGED_EXIT`] for a supervisor to restart it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_exs::runtime::ExsListener;

use crate::admit::Admission;
use crate::auth::AuthConfig;
use crate::drain::DrainReport;
use crate::error::{Error, Result};
use crate::registry::{Registry, Service};
use crate::secure::ServerSecurity;
use crate::serve;

/// A server's exit status when its libfabric provider wedged (EX_TEMPFAIL): restart it.
pub const WEDGED_EXIT: i32 = 75;

/// A face that accepts on sockets of its own (NBD on port 10809), not through the daemon's
/// EXS listeners; it authenticates and limits its own connections.
pub trait Endpoint: Send + Sync + 'static {
    /// The addresses it listens on, for the daemon's `listening on` lines.
    fn local_addrs(&self) -> Vec<String>;

    /// Accepts and serves until `quit` is set (looked at a few times a second), then
    /// returns, leaving its connections running until [`Endpoint::drain`].
    fn serve_until(&self, quit: &AtomicBool);

    /// Starts refusing new work; cheap, idempotent, callable from the signal thread.
    fn begin_drain(&self) {}

    /// Lets the work in flight run for up to `grace`, then stops the rest.
    fn drain(&self, grace: Duration) -> DrainReport {
        let _ = grace;
        DrainReport::default()
    }
}

/// One face of the daemon, for its drain.
#[derive(Clone)]
enum Face {
    Service(Arc<dyn Service>),
    Endpoint(Arc<dyn Endpoint>),
}

impl Face {
    fn begin_drain(&self) {
        match self {
            Face::Service(s) => s.begin_drain(),
            Face::Endpoint(e) => e.begin_drain(),
        }
    }

    fn drain(&self, grace: Duration) -> DrainReport {
        match self {
            Face::Service(s) => s.drain(grace),
            Face::Endpoint(e) => e.drain(grace),
        }
    }
}

/// The faces one server process hosts behind one authentication and one admission.
pub struct Daemon {
    listen: Vec<String>,
    registry: Registry,
    admission: Arc<Admission>,
    endpoints: Vec<Arc<dyn Endpoint>>,
    faces: Vec<Face>,
}

impl Daemon {
    /// A daemon listening for EXS connections on `listen` (any driver's addresses), secured
    /// as `security` says, which authenticate against `auth` and pass `admission`.
    pub fn new(
        listen: Vec<String>,
        auth: AuthConfig,
        admission: Arc<Admission>,
        security: ServerSecurity,
    ) -> Daemon {
        Daemon {
            listen,
            registry: Registry::new(auth, security),
            admission,
            endpoints: Vec::new(),
            faces: Vec::new(),
        }
    }

    /// Hosts `service` as `name`, chosen by clients in the handshake (see
    /// [`Registry::add`] for the names allowed).
    pub fn add_service(&mut self, name: &str, service: Arc<dyn Service>) -> Result<()> {
        self.registry.add(name, service.clone())?;
        self.faces.push(Face::Service(service));
        Ok(())
    }

    /// Hosts a face with sockets of its own.
    pub fn add_endpoint(&mut self, endpoint: Arc<dyn Endpoint>) {
        self.endpoints.push(endpoint.clone());
        self.faces.push(Face::Endpoint(endpoint));
    }

    /// Installs the wedge exit and the signal thread, and binds every EXS address (the
    /// endpoints bound theirs when built).
    pub fn start(self) -> Result<Running> {
        ferry_fabric::on_unrecoverable(exit_wedged);
        let faces = Arc::new(self.faces);
        let quit = Arc::new(AtomicBool::new(false));
        watch_signals(faces.clone(), quit.clone())?;
        let listeners = if self.registry.names().is_empty() {
            Vec::new()
        } else {
            serve::bind_all(&self.listen)?
        };
        Ok(Running {
            registry: Arc::new(self.registry),
            admission: self.admission,
            listeners,
            endpoints: self.endpoints,
            faces,
            quit,
        })
    }
}

/// A started [`Daemon`]: bound, signals watched, not yet accepting.
pub struct Running {
    registry: Arc<Registry>,
    admission: Arc<Admission>,
    listeners: Vec<ExsListener>,
    endpoints: Vec<Arc<dyn Endpoint>>,
    faces: Arc<Vec<Face>>,
    quit: Arc<AtomicBool>,
}

impl Running {
    /// Every address served: the EXS listeners', then each endpoint's.
    pub fn addresses(&self) -> Vec<String> {
        let exs = self.listeners.iter().map(|l| l.local_addr());
        exs.chain(self.endpoints.iter().flat_map(|e| e.local_addrs()))
            .collect()
    }

    /// Accepts on every address until the first SIGTERM or SIGINT,
    /// then stops accepting and returns; the connections keep running.
    pub fn serve_until_signal(&mut self) {
        let quit = &*self.quit;
        std::thread::scope(|s| {
            for e in &self.endpoints {
                let spawned = std::thread::Builder::new()
                    .name("ferry-endpoint".into())
                    .spawn_scoped(s, move || e.serve_until(quit));
                if let Err(e) = spawned {
                    tracing::warn!("cannot start an endpoint's accept thread: {e}");
                }
            }
            serve::serve_until(&self.registry, &self.admission, &self.listeners, quit);
        });
        self.listeners.clear();
    }

    /// Drains every face at once, each given `grace`, and sums what they report.
    pub fn drain(self, grace: Duration) -> DrainReport {
        let reports: Vec<DrainReport> = std::thread::scope(|s| {
            let drains: Vec<_> = self
                .faces
                .iter()
                .map(|f| s.spawn(move || f.drain(grace)))
                .collect();
            drains
                .into_iter()
                .map(|d| d.join().unwrap_or_default())
                .collect()
        });
        reports
            .into_iter()
            .fold(DrainReport::default(), |a, r| a + r)
    }
}

/// The first SIGTERM/SIGINT begins every face's drain and stops accepting; a second exits
/// at once (status 1).
fn watch_signals(faces: Arc<Vec<Face>>, quit: Arc<AtomicBool>) -> Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
        .map_err(|e| Error::io("install signal handlers", &e))?;
    std::thread::Builder::new()
        .name("ferry-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                faces.iter().for_each(Face::begin_drain);
                if quit.swap(true, Ordering::SeqCst) {
                    eprintln!("ferry serve: second signal {sig}; exiting without draining");
                    ferry_fabric::exit_now(1);
                }
            }
        })
        .map_err(|e| Error::io("start the signal thread", &e))?;
    Ok(())
}

/// The wedge hook: the listener and every connection on the wedged domain are dead and
/// threads are stuck in the provider, so exit for a supervisor to restart us.
fn exit_wedged(msg: &str) {
    eprintln!("ferry serve: {msg}; exiting with status {WEDGED_EXIT} so a supervisor restarts it");
    ferry_fabric::exit_now(WEDGED_EXIT);
}
