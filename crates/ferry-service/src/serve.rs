//! The server skeleton every service runs on: listen on one or more addresses (any driver,
//! [`bind_all`]), accept on each on a thread of its own, pass each connection through
//! admission ([`crate::admit`]) and serve it on a thread of its own ([`serve_until`]) by the
//! service it selected ([`crate::registry`], whose [`Service`](crate::registry::Service)
//! says what a connection does), and count the transfers in flight so a SIGTERM can drain
//! them ([`Drain`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_exs::runtime::{default_config, ExsListener};

use crate::admit::{more, Admission, Turned};
use crate::error::{Error, Kind, Result};
use crate::registry::Registry;

pub use crate::admit::Handshake;

/// Binds `addr` (`tcp://HOST:PORT`, `ofi+tcp://HOST:PORT`, `ofi+shm://NAME`) for a server
/// that authenticates its clients: their sockets serve no RMA until the service says so.
pub fn bind(addr: &str) -> Result<ExsListener> {
    let fabric: ferry_fabric::Address = addr
        .parse()
        .map_err(|e| Error::new(Kind::Usage, format!("bad listen address {addr}: {e}")))?;
    ExsListener::bind(addr, default_config(&fabric))
        .map(ExsListener::defer_remote_access)
        .map_err(|e| {
            Error::conn(format!(
                "cannot listen on {addr}: {e} (is another server using it? pick another with --listen)"
            ))
        })
}

/// Binds every address of `addrs` ([`bind`]); the first that fails is the error (the
/// listeners bound before it close).
pub fn bind_all(addrs: &[String]) -> Result<Vec<ExsListener>> {
    if addrs.is_empty() {
        return Err(Error::new(
            Kind::Usage,
            "no address to listen on: set listen in the config or pass --listen",
        ));
    }
    addrs.iter().map(|a| bind(a)).collect()
}

/// Accepts connections on every listener (each on a thread of its own) until `quit` is set
/// (checked a few times a second), each first through [`Admission::arrive`] (one bounded
/// handshake pool for all listeners), then on its own thread, where the service it selects
/// in `registry` serves it. Returns when `quit` is set, leaving the connections running
/// (see [`Drain`]).
pub fn serve_until(
    registry: &Arc<Registry>,
    admission: &Arc<Admission>,
    listeners: &[ExsListener],
    quit: &AtomicBool,
) {
    std::thread::scope(|s| {
        for l in listeners {
            let spawned = std::thread::Builder::new()
                .name("ferry-accept".into())
                .spawn_scoped(s, move || accept_until(registry, admission, l, quit));
            if let Err(e) = spawned {
                tracing::warn!("cannot start the accept thread of {}: {e}", l.local_addr());
            }
        }
    });
}

/// One listener's accept loop of [`serve_until`].
fn accept_until(
    registry: &Arc<Registry>,
    admission: &Arc<Admission>,
    listener: &ExsListener,
    quit: &AtomicBool,
) {
    loop {
        if quit.load(Ordering::SeqCst) {
            return;
        }
        let inc = match listener.accept_incoming(Duration::from_millis(100)) {
            Ok(i) => i,
            Err(ferry_exs::runtime::Error::Timeout) => continue,
            Err(e) => {
                accept_failed(admission, &e);
                continue;
            }
        };
        let peer = inc.peer_addr();
        let hs = match admission.arrive(&peer_key(&peer)) {
            Ok(h) => h,
            Err(Turned(why)) => {
                if let Some(held) = admission.log_refused.pass() {
                    tracing::warn!(
                        "closed a connection from {peer} at once: {why}{}",
                        more(held)
                    );
                }
                continue;
            }
        };
        let reg = registry.clone();
        let spawned = std::thread::Builder::new()
            .name("ferry-conn".into())
            .spawn(move || reg.connection(inc, hs, peer));
        if let Err(e) = spawned {
            tracing::warn!("cannot start a connection thread: {e}");
        }
    }
}

/// A failed accept: a connection whose driver handshake failed concerns only itself; a
/// listener out of descriptors or memory is logged (rate-limited) and given a moment,
/// rather than retried in a busy loop.
fn accept_failed(admission: &Admission, e: &ferry_exs::runtime::Error) {
    use ferry_exs::runtime::Error;
    match e {
        Error::Fabric(ferry_fabric::FabricError::Io { context, .. }) if context == "accept" => {
            if let Some(held) = admission.log_accept.pass() {
                tracing::warn!("cannot accept connections: {e}{}", more(held));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        e => tracing::debug!("accept: {e}"),
    }
}

/// The address a peer's limits are counted under: its IP for IP drivers
/// (`tcp://10.0.0.7:40112` → `10.0.0.7`); the driver name for local-only ones (every
/// `ofi+shm` peer is this host).
pub fn peer_key(peer: &str) -> String {
    match peer.parse::<ferry_fabric::Address>() {
        Ok(a) if a.port.is_some() => a.host,
        Ok(_) => peer.split("://").next().unwrap_or(peer).to_string(),
        Err(_) => peer.to_string(),
    }
}

/// A server's transfers in flight and its drain: once a drain begins, new requests are
/// refused; after the grace period, the transfers still running are told to stop.
#[derive(Debug)]
pub struct Drain {
    /// Set once a drain starts: new requests are refused.
    draining: AtomicBool,
    /// Set when the drain's grace period is over: transfers in flight journal and stop.
    stop: AtomicBool,
    /// Transfers being served.
    in_flight: AtomicUsize,
    /// Transfers stopped by the drain.
    interrupted: AtomicUsize,
    /// Transfers in flight when the drain began (`usize::MAX` before).
    at_drain: AtomicUsize,
}

/// What [`Drain::run`] did (summed over a daemon's faces with `+`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Transfers in flight when the drain began.
    pub in_flight: usize,
    /// Transfers stopped after the grace period (uploads journaled here; downloads are
    /// journaled by their clients).
    pub interrupted: usize,
    /// Transfers that neither finished nor stopped in time (their journals hold their last
    /// checkpoint).
    pub abandoned: usize,
}

impl std::ops::Add for DrainReport {
    type Output = DrainReport;

    fn add(self, o: DrainReport) -> DrainReport {
        DrainReport {
            in_flight: self.in_flight + o.in_flight,
            interrupted: self.interrupted + o.interrupted,
            abandoned: self.abandoned + o.abandoned,
        }
    }
}

/// Counts a transfer in flight while it lives ([`Drain::count`]).
#[derive(Debug)]
pub struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            draining: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            interrupted: AtomicUsize::new(0),
            at_drain: AtomicUsize::new(usize::MAX),
        }
    }
}

impl Drain {
    /// Nothing in flight, no drain.
    pub fn new() -> Drain {
        Drain::default()
    }

    /// Counts one transfer in flight until the guard drops.
    pub fn count(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(&self.in_flight)
    }

    /// Whether a drain began (new requests are refused).
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Whether the grace period is over (transfers in flight stop).
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Notes one transfer stopped by the drain.
    pub fn interrupted(&self) {
        self.interrupted.fetch_add(1, Ordering::SeqCst);
    }

    /// Starts refusing new requests and notes how many transfers are in flight; cheap and
    /// callable from any thread (e.g. a signal-watching one) before [`Drain::run`].
    /// Idempotent.
    pub fn begin(&self) {
        self.draining.store(true, Ordering::SeqCst);
        let n = self.in_flight.load(Ordering::SeqCst);
        let _ = self
            .at_drain
            .compare_exchange(usize::MAX, n, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Drains: begins (if not yet), lets the transfers in flight run for up to `grace`,
    /// then tells the rest to stop and waits a little (5 s) for them.
    pub fn run(&self, grace: Duration) -> DrainReport {
        self.begin();
        let in_flight = self.at_drain.load(Ordering::SeqCst);
        let wait = |limit: Duration| {
            let end = Instant::now() + limit;
            while self.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        wait(grace);
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            self.stop.store(true, Ordering::SeqCst);
            wait(Duration::from_secs(5));
        }
        DrainReport {
            in_flight,
            interrupted: self.interrupted.load(Ordering::SeqCst),
            abandoned: self.in_flight.load(Ordering::SeqCst),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_ips_or_the_local_driver() {
        assert_eq!(peer_key("tcp://10.0.0.7:40112"), "10.0.0.7");
        assert_eq!(peer_key("ofi+tcp://[::1]:7370"), "::1");
        assert_eq!(peer_key("ofi+shm://ferry-42"), "ofi+shm");
    }

    /// A transfer that ends within the grace period is not stopped; one that outlives it
    /// sees `stopping()` and is counted as interrupted once it stops.
    #[test]
    fn a_drain_waits_then_stops_what_is_left() {
        let d = Arc::new(Drain::new());
        let quick = d.count();
        drop(quick);
        let d2 = d.clone();
        let slow = std::thread::spawn(move || {
            let _c = d2.count();
            while !d2.stopping() {
                std::thread::sleep(Duration::from_millis(5));
            }
            d2.interrupted();
        });
        while d.in_flight.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let r = d.run(Duration::from_millis(50));
        slow.join().unwrap();
        assert!(d.draining());
        assert_eq!(
            r,
            DrainReport {
                in_flight: 1,
                interrupted: 1,
                abandoned: 0
            }
        );
    }
}
