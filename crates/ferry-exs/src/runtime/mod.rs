//! The EXS runtime: runs the sans-I/O [`crate::proto`] core over `ferry-fabric` endpoints.
//!
//! One [`ExsSocket`] owns one fabric endpoint, its core [`crate::proto::Connection`] (behind a
//! mutex), registered control receive and frame send buffers, and a progress thread that feeds
//! completions to the core. User calls run the core and post to the fabric from the caller's
//! thread, so no wake-up hop sits on the fast path. Completions arrive on an [`EventQueue`].

mod buf;
mod engine;
mod layout;
mod queue;
mod socket;

pub use buf::ExsBuf;
/// The datatype vocabulary layouts are built from (re-exported from `ferry-dtype`).
pub use ferry_dtype::{Datatype, Segment};
/// The path of a layout transfer (re-exported from `ferry-noncontig`).
pub use ferry_noncontig::Path as LayoutPath;
pub use layout::{Layout, LayoutError, LayoutStats, Refused};
pub use queue::{EventQueue, ExsEvent, SocketId};
pub use socket::{default_config, Closer, ExsIncoming, ExsListener, ExsSocket};

use crate::error::ExsError;

/// Why a runtime call failed before any operation was started.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An EXS-level error (bad configuration, socket already closed, ...).
    #[error(transparent)]
    Exs(#[from] ExsError),
    /// The fabric refused (bad address, driver unavailable, registration failed, ...).
    #[error(transparent)]
    Fabric(#[from] ferry_fabric::FabricError),
    /// The HELLO exchange did not finish in time.
    #[error("EXS handshake timed out")]
    Timeout,
}

/// What `exs_poll` reports for a connected socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Readiness {
    /// A peer message waits for a recv (POLLIN).
    pub readable: bool,
    /// A send would go out at once: the connection is open with a send credit free
    /// (POLLOUT). Sends are accepted either way; without credit they wait in order.
    pub writable: bool,
    /// The connection has closed (POLLHUP).
    pub closed: bool,
}

/// What a socket's runtime did beyond the protocol core's own [`crate::proto::Stats`]: the
/// software stand-ins for missing driver capabilities, made visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RuntimeStats {
    /// Immediate payloads copied into a send buffer because the driver cannot gather.
    pub payload_copies: u64,
    /// RMA operations posted to the fabric (pieces included).
    pub rma_pieces: u64,
    /// Transfers split into several pieces (driver `rma_piece` or `max_msg_size`, or
    /// [`ExsSocket::set_rma_chunk`]).
    pub rma_split: u64,
    /// Frame send buffers registered (the pool grows to the most frames ever in flight).
    pub send_buffers: u64,
}
