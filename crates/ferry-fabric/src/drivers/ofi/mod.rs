//! Driver `ofi`: libfabric, any provider by name (`ofi+tcp://host:port`, `ofi+shm://name`,
//! `ofi+verbs://host:port`, `ofi+tcp;ofi_rxm://...`).
//!
//! Every provider is used through a reliable-datagram endpoint (`FI_EP_RDM`; tcp and verbs
//! through ofi_rxm). A domain owns one such endpoint with its CQ and AV, plus a progress
//! thread; a listener owns a domain, and accepted endpoints share it, as do all connections a
//! client domain makes.
//!
//! Connections are emulated: a connection is the peer's address plus the peer's connection id.
//! Tags keep traffic apart: data for a connection carries `(receiver's conn id << 8) | DATA`,
//! control messages (the CONNECT / ACCEPT / REFUSE / DISCONNECT handshake, see `wire.rs`)
//! carry a fixed control tag that every domain keeps receives posted for. So a control receive
//! can never swallow a data message, nor one connection's receive another's message.
//!
//! Closing an endpoint tells the peer how many messages were sent; the peer's receives that
//! those messages cannot satisfy fail with `ConnectionLost`, and later posts fail at once. A
//! peer that dies without closing is noticed only where the provider notices it (tcp: sends
//! and RMA fail once the socket breaks; shm: nothing), so callers wait with timeouts.

mod domain;
mod endpoint;
mod ffi;
mod info;
mod progress;
mod rma;
mod wire;

use std::sync::Arc;

use crate::{Address, Domain, Listener, Result};

/// Tag kind of the control messages (with connection id 0).
const CONTROL_TAG: u64 = 1;
/// Tag kind of data messages.
const DATA: u64 = 2;

/// The tag of data messages for the connection the receiver calls `conn`.
fn data_tag(conn: u64) -> u64 {
    (conn << 8) | DATA
}

/// Opens a client domain bound to the local interface that reaches `addr`.
pub fn open(addr: &Address) -> Result<Arc<dyn Domain>> {
    domain::open(addr)
}

/// Listens on exactly `addr` (port 0 picks a free port; shm listens under the name given).
pub fn listen(addr: &Address) -> Result<Box<dyn Listener>> {
    domain::listen(addr)
}
