//! ferry's fabric layer: one API over every fabric.
//!
//! Endpoints are addressed by URL-like strings (`tcp://127.0.0.1:7000`, `ofi+tcp://…`,
//! `ofi+shm://name`, `ofi+verbs://…`). An endpoint offers two-sided send/receive and one-sided
//! RMA write (local gather list → remote range) and read (remote range → local scatter list)
//! on memory registered with its [`Domain`]. Every posted operation ends with exactly one
//! [`Completion`] on the endpoint's [`CompletionQueue`]; a post that returns an error posted
//! nothing.
//!
//! Drivers: `tcp` (ferry's native TCP driver, RMA emulated by its progress engine with grant,
//! registration, bounds and rights checks) and `ofi` (libfabric, any provider by name), chosen
//! by the address. Each reports its [`Capabilities`], and its health through the generic
//! [`health()`] and [`on_unrecoverable`] (a wedged provider: [`FabricError::Wedged`]); nothing
//! above this crate names a driver. A peer reaches memory by RMA only through keys granted on
//! its own connection, and an accepted connection not before the layer above enables it
//! ([`grants`]; `docs/fabric.md`, "Threat model").
//!
//! `unsafe` is denied here except in the memory modules ([`mem`], the tcp driver's byte views
//! for vectored socket I/O) and the FFI module of the ofi driver; each block there says why it
//! is sound (`// SAFETY:`).

#![deny(unsafe_code)]

pub mod addr;
pub mod caps;
pub mod cq;
/// The drivers behind [`open`] and [`listen`]. Public only for the tests and fuzz targets
/// that speak a driver's wire by hand; use the generic API instead.
#[doc(hidden)]
pub mod drivers;
pub mod error;
pub mod grants;
mod health;
#[allow(unsafe_code)] // memory: page-aligned buffers, mappings, views for the fabric.
pub mod mem;
pub mod rcache;
#[allow(unsafe_code)] // FFI: libc calls outside any driver.
mod sys;
pub mod timeline;

use std::sync::Arc;
use std::time::Duration;

pub use addr::{Address, Scheme};
pub use caps::{Capabilities, Ordering, Progress};
pub use cq::{Completion, CompletionQueue, OpKind};
pub use error::{FabricError, RemoteAccessError, Result};
pub use health::{exit_now, health, on_unrecoverable, Health};
pub use mem::{Access, Buffer, DomainId, LocalSlice, MemoryRegion, RemoteSlice};
pub use rcache::{CacheStats, RegistrationCache};

/// A local fabric access point. Memory registered here can be used by every endpoint the
/// domain (or its listener) creates; a peer reaches it by RMA only on the connections it was
/// granted on ([`Endpoint::grant`]).
pub trait Domain: Send + Sync {
    /// Process-unique id; regions carry it so they cannot be used with another domain.
    fn id(&self) -> DomainId;
    /// What this driver can do.
    fn capabilities(&self) -> &Capabilities;
    /// Registers `buf` (sharing it) with the given remote rights.
    fn register(&self, buf: &Buffer, access: Access) -> Result<MemoryRegion>;
    /// Connects to a listener at `addr`.
    fn connect(&self, addr: &Address, timeout: Duration) -> Result<Box<dyn Endpoint>>;
}

/// A bound, listening address that yields connected endpoints.
pub trait Listener: Send + Sync {
    /// The domain accepted endpoints belong to.
    fn domain(&self) -> Arc<dyn Domain>;
    /// The address actually bound (an ephemeral port resolved), for clients to connect to.
    fn local_addr(&self) -> Address;
    /// Waits up to `timeout` for the next connection. It serves no RMA to its peer until
    /// [`Endpoint::enable_remote_access`].
    fn accept(&self, timeout: Duration) -> Result<Box<dyn Endpoint>>;
}

/// One connection. All methods may be called from any thread.
pub trait Endpoint: Send + Sync {
    /// The domain whose registrations this endpoint uses.
    fn domain(&self) -> Arc<dyn Domain>;
    /// What this driver can do.
    fn capabilities(&self) -> &Capabilities;
    /// Where completions of this endpoint's operations arrive.
    fn cq(&self) -> &CompletionQueue;
    /// The peer, as text (for logs and errors).
    fn peer(&self) -> String;
    /// This side of the connection, as text (`getsockname`).
    fn local(&self) -> String;
    /// Lets this connection's peer reach `region` by RMA, through the key
    /// [`MemoryRegion::remote`] gives, with the rights it was registered with, for as long as
    /// it stays registered. A key is honoured only on the connections it was granted to:
    /// register once per domain, grant on each connection whose peer is told the key (before
    /// telling it). Idempotent and cheap (O(1)). Drivers whose RMA the NIC checks (ofi
    /// providers other than the checked-RMA ones, e.g. verbs) cannot scope keys per
    /// connection and do nothing here: see docs/fabric.md, "Threat model".
    fn grant(&self, region: &MemoryRegion) -> Result<()> {
        let _ = region;
        Ok(())
    }
    /// The smallest round trip the transport itself measured on this connection so far
    /// (TCP's, from `TCP_INFO`), if it measures one: unlike a request timed by the
    /// application, it does not grow while a busy host keeps the process from running.
    /// Default: `None`.
    fn path_rtt(&self) -> Option<std::time::Duration> {
        None
    }
    /// Turns on RMA from the peer. Endpoints a [`Listener`] accepts start with it off (every
    /// RMA request refused alike) so that nothing is served before the layer above has
    /// authenticated the peer; call this once it has. Connected endpoints start with it on.
    /// Default (drivers whose RMA the NIC checks): nothing.
    fn enable_remote_access(&self) {}
    /// Sends the concatenation of `data` as one message.
    fn post_send(&self, data: &[LocalSlice], context: u64) -> Result<()>;
    /// Posts a receive for one message, scattered over `buf`. Receives match messages in order.
    fn post_recv(&self, buf: &[LocalSlice], context: u64) -> Result<()>;
    /// Writes the concatenation of `local` into `remote` (whose length must equal the total).
    fn post_write(&self, local: &[LocalSlice], remote: RemoteSlice, context: u64) -> Result<()>;
    /// Reads `remote` and scatters it over `local` (whose total must equal its length).
    fn post_read(&self, local: &[LocalSlice], remote: RemoteSlice, context: u64) -> Result<()>;
    /// Writes the concatenation of `local` over the ranges of `remote` in order, as one
    /// operation (one completion). The ranges must share one key, number at most
    /// [`Capabilities::rma_iov_limit`], and total the local bytes. Drivers without gathered
    /// RMA accept one range (the same as [`Endpoint::post_write`]) and refuse more.
    fn post_write_v(
        &self,
        local: &[LocalSlice],
        remote: &[RemoteSlice],
        context: u64,
    ) -> Result<()> {
        check_rma_v(local, remote, self.domain().id(), self.capabilities())?;
        match remote {
            [one] => self.post_write(local, *one, context),
            _ => Err(unsupported_v(remote.len())),
        }
    }
    /// Lets the driver hold the RMAs posted from now on until [`Endpoint::release_rma`], so
    /// it can set them up together: under checked RMA (ofi shm and tcp) they share one grant
    /// request instead of the first asking alone and the rest sharing a second. A caller must
    /// release before it waits for their completions. Default (drivers with nothing to
    /// share): nothing.
    fn hold_rma(&self) {}
    /// Sends what [`Endpoint::hold_rma`] held (nothing if nothing was). Default: nothing.
    fn release_rma(&self) -> Result<()> {
        Ok(())
    }
    /// Reads the ranges of `remote` in order and scatters their concatenation over `local`:
    /// the mirror of [`Endpoint::post_write_v`].
    fn post_read_v(
        &self,
        local: &[LocalSlice],
        remote: &[RemoteSlice],
        context: u64,
    ) -> Result<()> {
        check_rma_v(local, remote, self.domain().id(), self.capabilities())?;
        match remote {
            [one] => self.post_read(local, *one, context),
            _ => Err(unsupported_v(remote.len())),
        }
    }
}

/// The refusal of a gathered RMA by a driver that has none.
fn unsupported_v(n: usize) -> FabricError {
    FabricError::Unsupported(format!(
        "this driver addresses one remote range per RMA, not {n}"
    ))
}

/// Opens a client-side domain for the driver `addr` names, bound to a local interface that
/// reaches `addr`.
pub fn open(addr: &Address) -> Result<Arc<dyn Domain>> {
    match &addr.scheme {
        Scheme::Tcp => drivers::tcp::open(addr),
        Scheme::Ofi(_) => drivers::ofi::open(addr),
    }
}

/// Binds and listens on `addr` (port 0 picks a free port; see [`Listener::local_addr`]).
pub fn listen(addr: &Address) -> Result<Box<dyn Listener>> {
    match &addr.scheme {
        Scheme::Tcp => drivers::tcp::listen(addr),
        Scheme::Ofi(_) => drivers::ofi::listen(addr),
    }
}

/// Opens a domain and connects it to `addr`.
pub fn connect(addr: &Address, timeout: Duration) -> Result<Box<dyn Endpoint>> {
    open(addr)?.connect(addr, timeout)
}

/// Checks a gather/scatter list against the endpoint's domain and capabilities; drivers call
/// this before posting so that every driver rejects the same mistakes the same way.
pub fn check_local(list: &[LocalSlice], domain: DomainId, caps: &Capabilities) -> Result<u64> {
    check_list(list, domain, caps, caps.max_gather)
}

/// [`check_local`] with a gather limit of `limit` segments.
fn check_list(
    list: &[LocalSlice],
    domain: DomainId,
    caps: &Capabilities,
    limit: usize,
) -> Result<u64> {
    if list.len() > limit {
        return Err(FabricError::Unsupported(format!(
            "{} segments exceed the driver's gather limit of {limit}",
            list.len(),
        )));
    }
    for s in list {
        if s.region.domain() != domain {
            return Err(FabricError::InvalidArgument(
                "memory region belongs to another domain".into(),
            ));
        }
        // LocalSlice fields are public, so a slice may have been built by hand.
        if s.offset
            .checked_add(s.len)
            .is_none_or(|end| end > s.region.len())
        {
            return Err(FabricError::InvalidArgument(format!(
                "slice {}+{} outside its region of {} bytes",
                s.offset,
                s.len,
                s.region.len()
            )));
        }
    }
    let total = LocalSlice::total(list);
    if total > caps.max_msg_size {
        return Err(FabricError::Unsupported(format!(
            "{total} bytes exceed the driver's message limit of {}",
            caps.max_msg_size
        )));
    }
    Ok(total)
}

/// Like [`check_local`] with the RMA gather limit ([`Capabilities::rma_gather`]), and also
/// that the remote range has the same length as the list.
pub fn check_rma(
    list: &[LocalSlice],
    remote: &RemoteSlice,
    domain: DomainId,
    caps: &Capabilities,
) -> Result<u64> {
    let total = check_list(list, domain, caps, caps.rma_gather)?;
    if list.is_empty() {
        return Err(FabricError::InvalidArgument(
            "RMA needs at least one local segment".into(),
        ));
    }
    if total != remote.len {
        return Err(FabricError::InvalidArgument(format!(
            "local segments total {total} bytes but the remote range is {} bytes",
            remote.len
        )));
    }
    Ok(total)
}

/// Like [`check_rma`] for several remote ranges: at least one, at most the driver's
/// `rma_iov_limit`, all of one key, totalling the local bytes (bounds are the target's to
/// check).
pub fn check_rma_v(
    list: &[LocalSlice],
    remote: &[RemoteSlice],
    domain: DomainId,
    caps: &Capabilities,
) -> Result<u64> {
    let total = check_list(list, domain, caps, caps.rma_gather)?;
    if list.is_empty() || remote.is_empty() {
        return Err(FabricError::InvalidArgument(
            "RMA needs at least one local segment and one remote range".into(),
        ));
    }
    if remote.len() > caps.rma_iov_limit {
        return Err(FabricError::Unsupported(format!(
            "{} remote ranges exceed the driver's limit of {} per RMA",
            remote.len(),
            caps.rma_iov_limit
        )));
    }
    let key = remote[0].key;
    let mut sum = 0u64;
    for r in remote {
        if r.key != key {
            return Err(FabricError::InvalidArgument(
                "the remote ranges of one RMA must share one key".into(),
            ));
        }
        sum = sum.checked_add(r.len).ok_or_else(|| {
            FabricError::InvalidArgument("the remote ranges total more than 2^64 bytes".into())
        })?;
    }
    if total != sum {
        return Err(FabricError::InvalidArgument(format!(
            "local segments total {total} bytes but the remote ranges {sum} bytes"
        )));
    }
    Ok(total)
}
