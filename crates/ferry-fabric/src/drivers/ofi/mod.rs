//! Driver `ofi`: libfabric, any provider by name (`ofi+tcp://host:port`, `ofi+shm://name`,
//! `ofi+verbs://host:port`, `ofi+tcp;ofi_rxm://...`).
//!
//! # Model
//!
//! Every provider is used through a reliable-datagram endpoint (`FI_EP_RDM`; tcp and verbs
//! through ofi_rxm). A domain owns one such endpoint with its CQ and AV, plus a progress
//! thread (`progress.rs`); a listener owns a domain and accepted endpoints share it, as do all
//! the connections a client domain makes. A listener binds exactly the address asked for (the
//! matching `fi_info`, not the host's other interfaces); a client binds the interface that
//! routes to the server. shm listens under the name given; providers with opaque addresses
//! (efa, cxi) listen on their default address and report it as hex (`ofi+efa://<hex>`).
//! On shm, whose RMA copies inside the post call under locks other calls spin on, one thread
//! at a time calls into the provider, and calls behind a copy queue (`gate.rs`).
//!
//! Connections are emulated: a connection is the peer's address plus the peer's connection
//! id. Tags keep traffic apart: data for a connection carries `(receiver's conn id << 8) |
//! DATA`; control messages (`wire.rs`: the CONNECT / ACCEPT / REFUSE handshake, DISCONNECT,
//! and the checked-RMA messages) carry a fixed control tag that every domain keeps receives
//! posted for. So a control receive never swallows a data message, nor one connection's
//! receive another's message. A client of another major protocol version is refused.
//!
//! Closing an endpoint tells the peer how many messages it sent; the peer's receives those
//! messages cannot satisfy fail with `ConnectionLost`, and later posts fail at once. When the
//! provider reports the transport lost (tcp: the peer died, or dropped the socket), the
//! connection is aborted the same way, since messages may have been lost.
//!
//! # Provider defects worked around (libfabric 1.17, see `info::Quirks`)
//!
//! - Truncation: shm spins forever in its progress (smr_cma_loop) on a message longer than the
//!   posted receive past its 4 KiB inline size, and drops shorter ones without their length;
//!   tcp;ofi_rxm (dynamic receive buffers) places nothing and drops the TCP connection,
//!   silently losing the messages behind. Receives there get an overflow sink (`ffi::Sink`),
//!   so the provider never truncates and the driver reports `Truncated` with the exact length
//!   and the prefix in place.
//! - RMA checks: shm's fast (CMA) RMA path checks nothing: any key, any address of the target
//!   process is read or written; its checked command path, on refusing an access, never
//!   answers the initiator and wedges the pair of endpoints for good. ofi_rxm makes every
//!   region remotely readable (for its rendezvous protocol), and the tcp target refuses a bad
//!   access by dropping the connection. On both, RMA is therefore granted by the target's
//!   driver first (`rma.rs`), which costs one round trip per RMA.
//! - shm lets endpoints of one process use each other's memory directly and frees it on
//!   close; a peer still holding it crashes. Such endpoints are held open while another
//!   endpoint's AV refers to them (`ffi::LOCAL_EPS`).
//! - Rendezvous after a death: ofi_rxm keeps a rendezvous message that arrived before its
//!   receive when the peer's connection closes, and the receive that later matches it reads
//!   through the freed connection endpoint (a NULL dereference). Over tcp, messages up to
//!   1 GiB go eager instead (`ffi::provider_settings`), which never touches the connection
//!   at receive time.
//! - A domain opened while another: tcp;ofi_rxm was seen to break a connection of another
//!   domain of the same process that was exchanging messages at that moment (a message
//!   arriving again or out of order, so EXS and TLS refuse it: about 1 tree download in 30
//!   to 200 on a loaded host, a second stream connecting while the first listed the tree);
//!   never while the other domain's connections were idle (300 downloads). ferry's own
//!   state is per domain; the cause in the provider is not found, and shm was not seen
//!   failing so. [`crate::Scheme::connects_beside_busy_ones`] is false for every ofi
//!   provider, and file transfer connects a copy's extra streams while its others are idle.
//! - `fi_cq_sread` on ofi_rxm was seen spinning forever after a connection teardown, so the
//!   progress thread sleeps on its own.
//! - Exit: libfabric tears its providers down in a destructor that `exit` runs while the
//!   process's other threads go on; a thread still closing an endpoint then (an in-process
//!   server that was not joined) crashed once in shm's `smr_free`, reading a region
//!   already unmapped. So every close holds a gate that an `atexit` handler takes for good
//!   (`ffi::CLOSES`): a close that comes after it waits for the process to end. The `ferry`
//!   binary also ends with `_exit` ([`crate::exit_now`]: streams flushed, shm names
//!   unlinked), and in-process servers are joined before returning.
//!
//! # A peer that dies
//!
//! tcp: the provider notices when the socket breaks; operations in flight and later sends or
//! RMA to the peer fail with `ConnectionLost` and its receives are failed too. shm: nothing is
//! reported; messages to a dead peer queue up until posts fail with `Timeout` after 5 s of
//! back-pressure, and receives and RMA wait forever: callers bound their waits
//! (`CompletionQueue::wait`). Closing the domain cancels everything left.
//!
//! A peer killed while holding one of shm's shared-memory spinlocks leaves threads of this
//! process spinning in the provider for good: the watchdog (`wedge.rs`) then declares the
//! domain wedged, fails everything on it with `FabricError::Wedged`, and raises the verdict
//! through [`crate::health()`] (the process's [`crate::on_unrecoverable`] hook runs).

mod domain;
mod endpoint;
#[allow(unsafe_code)] // FFI: libfabric calls and the memory they are given.
mod ffi;
mod gate;
mod info;
mod progress;
#[allow(unsafe_code)] // shared memory: reads the shm provider's region lock word.
mod region_lock;
mod rma;
mod wedge;
mod wire;

pub use wedge::{wedged_error, WEDGE_MESSAGE, WEDGE_TIMEOUT};

use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Address, Domain, Listener, Result};

/// Tag kind of the control messages (with connection id 0).
const CONTROL_TAG: u64 = 1;
/// Tag kind of data messages.
const DATA: u64 = 2;

/// The tag of data messages for the connection the receiver calls `conn`.
fn data_tag(conn: u64) -> u64 {
    (conn << 8) | DATA
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its data consistent, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Opens a client domain bound to the local interface that reaches `addr`.
pub fn open(addr: &Address) -> Result<Arc<dyn Domain>> {
    domain::open(addr)
}

/// Listens on exactly `addr` (port 0 picks a free port; shm listens under the name given).
pub fn listen(addr: &Address) -> Result<Box<dyn Listener>> {
    domain::listen(addr)
}

/// Fuzzing entry point: decodes `bytes` as an ofi control message and checks that whatever
/// the decoder accepts encodes and decodes again. Must never panic on any input.
#[doc(hidden)]
pub fn fuzz_control(bytes: &[u8]) {
    if let Ok(msg) = wire::Control::decode(bytes) {
        assert!(
            wire::Control::decode(&msg.encode()).is_ok(),
            "re-encoded {msg:?} does not decode"
        );
    }
}
