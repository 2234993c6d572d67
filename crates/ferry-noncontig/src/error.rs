//! Errors of the noncontiguous engine.

use ferry_dtype::DtypeError;
use ferry_fabric::FabricError;

/// What went wrong; every variant but [`NoncontigError::Fabric`] and
/// [`NoncontigError::Completion`] is found before anything is posted.
#[derive(Debug, thiserror::Error)]
pub enum NoncontigError {
    /// A datatype was refused (overlapping receive segments, arithmetic overflow, ...).
    #[error("layout: {0}")]
    Dtype(#[from] DtypeError),
    /// The two layouts hold different numbers of bytes.
    #[error("the local layout holds {local} bytes but the remote layout {remote}")]
    SizeMismatch {
        /// Bytes of the local data stream.
        local: u64,
        /// Bytes of the remote data stream.
        remote: u64,
    },
    /// The local layout reaches outside its registered region.
    #[error(
        "local layout touches offsets {lo}..{hi} from origin {origin}, outside the \
         {len}-byte region"
    )]
    LocalOutOfRegion {
        /// Lowest offset touched, relative to the origin.
        lo: i64,
        /// One past the highest.
        hi: i64,
        /// Region offset of displacement 0.
        origin: usize,
        /// Region length.
        len: usize,
    },
    /// The remote layout reaches outside the slice the peer advertised.
    #[error(
        "remote layout touches offsets {lo}..{hi} from origin {origin}, outside the \
         advertised {len}-byte slice"
    )]
    RemoteOutOfSlice {
        /// Lowest offset touched, relative to the origin.
        lo: i64,
        /// One past the highest.
        hi: i64,
        /// Slice offset of displacement 0.
        origin: u64,
        /// Slice length.
        len: u64,
    },
    /// Posting failed (the operations already posted were drained first).
    #[error("fabric: {0}")]
    Fabric(#[from] FabricError),
    /// An operation completed with an error (the others were drained first).
    #[error("an RMA operation failed: {0}")]
    Completion(FabricError),
    /// The options cannot work (zero window, zero staging bytes, no RMA, ...).
    #[error("invalid options: {0}")]
    Invalid(String),
}

/// Result of the engine.
pub type Result<T, E = NoncontigError> = std::result::Result<T, E>;
