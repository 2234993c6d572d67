//! Errors of the fabric layer.

use std::io;

/// Everything that can go wrong in the fabric layer, as a value the caller can act on.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// The endpoint URL could not be understood.
    #[error("bad fabric address {addr:?}: {why}")]
    BadAddress {
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        why: String,
    },
    /// The driver or provider named in the address is not available on this host.
    #[error("fabric driver unavailable: {0}")]
    Unavailable(String),
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What ferry was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A libfabric call failed.
    #[error("libfabric {call} failed: {msg} ({code})")]
    Ofi {
        /// The libfabric function.
        call: &'static str,
        /// The (positive) libfabric error number.
        code: i32,
        /// fi_strerror's text.
        msg: String,
    },
    /// The request exceeds what the driver can do (see [`crate::Capabilities`]).
    #[error("not supported by this driver: {0}")]
    Unsupported(String),
    /// A bad argument from the caller (empty gather list, slice out of its region, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The remote side refused an RMA access: unknown or stale key, out of bounds, or missing rights.
    #[error("remote access denied: {0}")]
    RemoteAccess(RemoteAccessError),
    /// A received message did not fit in the posted receive buffer; the buffer holds its prefix.
    #[error("message of {msg_len} bytes truncated to the {buf_len}-byte receive buffer")]
    Truncated {
        /// Size of the message that arrived.
        msg_len: u64,
        /// Size of the receive buffer.
        buf_len: u64,
    },
    /// The peer violated the wire protocol; the connection was closed.
    #[error("protocol error from peer: {0}")]
    Protocol(String),
    /// The peer speaks an incompatible protocol version.
    #[error("peer speaks ferry wire protocol {peer_major}.x, this build speaks {our_major}.x")]
    VersionMismatch {
        /// The peer's major version.
        peer_major: u16,
        /// Ours.
        our_major: u16,
    },
    /// The connection is gone (peer exited, reset, or closed); pending operations fail with this.
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    /// The driver is stuck for good (a provider call that never returns, e.g. libfabric shm
    /// spinning on a lock a killed peer held): every operation of its domain fails with this,
    /// and the process must restart to use the driver again ([`crate::health`]). It reads as
    /// a lost connection, which it also is.
    #[error("connection lost: {0}")]
    Wedged(String),
    /// The operation was cancelled because its endpoint was closed.
    #[error("operation cancelled: endpoint closed")]
    Cancelled,
    /// A wait ran out of time.
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
}

/// Why a remote memory access was refused. Travels on the wire as one byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[repr(u8)]
pub enum RemoteAccessError {
    /// No region has this key (never registered, or from another domain).
    #[error("unknown key")]
    UnknownKey = 1,
    /// The key names a region that has been deregistered.
    #[error("stale key (region deregistered)")]
    StaleKey = 2,
    /// The range falls outside the region.
    #[error("access out of bounds")]
    OutOfBounds = 3,
    /// The region does not grant the requested remote right.
    #[error("access right not granted")]
    NoPermission = 4,
    /// The provider reported a failure without a finer reason.
    #[error("refused by the provider")]
    Other = 5,
}

impl RemoteAccessError {
    /// Decodes the wire byte; unknown values map to [`RemoteAccessError::Other`].
    pub fn from_wire(b: u8) -> Self {
        match b {
            1 => Self::UnknownKey,
            2 => Self::StaleKey,
            3 => Self::OutOfBounds,
            4 => Self::NoPermission,
            _ => Self::Other,
        }
    }
}

impl FabricError {
    /// Wraps an I/O error with what ferry was doing.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

/// Result alias of the fabric layer.
pub type Result<T, E = FabricError> = std::result::Result<T, E>;
