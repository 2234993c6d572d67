//! The server skeleton every service runs on: listen on one or more addresses (any driver,
//! [`bind_all`]), accept on each on a thread of its own, pass each connection through
//! admission ([`crate::admit`]) and serve it on a thread of its own ([`serve_until`]) by the
//! service it selected ([`crate::registry`], whose [`Service`](crate::registry::Service)
//! says what a connection does); each face counts its work in flight for a drain
//! ([`crate::drain`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_exs::runtime::ExsListener;

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
    ExsListener::bind(addr, crate::channel::exs_config(&fabric))
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
/// (see [`crate::drain::Drain`]).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_ips_or_the_local_driver() {
        assert_eq!(peer_key("tcp://10.0.0.7:40112"), "10.0.0.7");
        assert_eq!(peer_key("ofi+tcp://[::1]:7370"), "::1");
        assert_eq!(peer_key("ofi+shm://ferry-42"), "ofi+shm");
    }
}
