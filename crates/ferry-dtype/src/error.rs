//! Errors of the data-layout layer: every bad description is one of these, never a panic.

use crate::Segment;

/// What went wrong building or using a datatype.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DtypeError {
    /// A size, extent, bound or displacement does not fit 64-bit arithmetic (sizes are `u64`,
    /// offsets, bounds and extents `i64`). Describe less data, or split the transfer.
    #[error("{op}: the {what} overflows 64-bit arithmetic; describe less data or split it")]
    Overflow {
        /// The constructor or operation that overflowed.
        op: &'static str,
        /// Which quantity overflowed (size, extent, displacement, ...).
        what: &'static str,
    },
    /// Parallel argument arrays of different lengths (MPI's `count` must match every array).
    #[error("{op}: {what} has {got} entries but {expected} were expected")]
    LengthMismatch {
        /// The constructor.
        op: &'static str,
        /// The array that does not match.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length of the first array.
        expected: usize,
    },
    /// A subarray dimension whose window does not lie inside the array.
    #[error(
        "subarray dimension {dim}: need size >= 1, subsize >= 1 and start + subsize <= size, \
         got size {size}, subsize {subsize}, start {start}"
    )]
    SubarrayOutOfRange {
        /// The dimension (index into the argument arrays).
        dim: usize,
        /// Elements in this dimension of the full array.
        size: u64,
        /// Elements in this dimension of the subarray.
        subsize: u64,
        /// First element of the subarray in this dimension.
        start: u64,
    },
    /// Any other inconsistent description.
    #[error("{op}: {reason}")]
    Invalid {
        /// The constructor or operation.
        op: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// Two receive segments share bytes: the data landing there would depend on arrival order.
    #[error(
        "receive segments overlap: [{}, +{}) and [{}, +{}); give each byte one segment",
        first.offset, first.len, second.offset, second.len
    )]
    Overlap {
        /// The segment with the lower offset.
        first: Segment,
        /// A segment starting before `first` ends.
        second: Segment,
    },
    /// A data-stream position past the end of the stream.
    #[error("position {pos} is past the end of the {total}-byte data stream")]
    PositionOutOfRange {
        /// The position asked for.
        pos: u64,
        /// Bytes in the stream.
        total: u64,
    },
    /// The layout reaches bytes outside the buffer it is applied to. Nothing was copied.
    #[error(
        "the layout touches bytes [{lo}, {hi}) around the origin at index {origin}, outside the \
         {len}-byte buffer; the origin must be at least {} and the buffer at least origin + {hi} \
         bytes",
        lo.saturating_neg().max(0)
    )]
    OutOfBuffer {
        /// Lowest offset touched, relative to the origin (the type's true lower bound).
        lo: i64,
        /// One past the highest offset touched, relative to the origin.
        hi: i64,
        /// Index in the buffer of displacement 0.
        origin: usize,
        /// Buffer length.
        len: usize,
    },
    /// A packed buffer whose length is not the packed size of the layout.
    #[error("the packed data holds {got} bytes but the layout packs to {expected}")]
    PackedLength {
        /// Bytes given.
        got: usize,
        /// The layout's packed size.
        expected: u64,
    },
}

/// Result alias of this crate.
pub type Result<T, E = DtypeError> = std::result::Result<T, E>;
