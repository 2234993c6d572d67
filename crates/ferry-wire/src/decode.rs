//! The decode error of the faces' frame codecs.

use crate::ReadError;

/// Why bytes are not a valid frame of a face's protocol (file transfer, collective I/O):
/// the one decode error of every [`frames!`] table with the common header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than the frame needs.
    #[error("truncated frame")]
    Truncated,
    /// The header's length disagrees with the message length.
    #[error("frame length {header} but message of {actual} bytes")]
    Length {
        /// What the header says.
        header: u32,
        /// What arrived.
        actual: usize,
    },
    /// A frame over its limit.
    #[error("frame too large")]
    TooLarge,
    /// Unknown frame type.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// Unknown flags, nonzero reserved bytes, bad values, invalid UTF-8, bytes left over.
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
}

impl From<ReadError> for DecodeError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Short => DecodeError::Truncated,
            ReadError::TooLong { .. } => DecodeError::TooLarge,
            ReadError::NotUtf8 => DecodeError::Malformed("string is not UTF-8"),
            ReadError::Trailing(_) => DecodeError::Malformed("bytes after frame"),
            ReadError::Invalid(why) => DecodeError::Malformed(why),
            // Only a frame table reports it, and its `decode` names the type.
            ReadError::UnknownType => DecodeError::Malformed("unknown frame type"),
        }
    }
}
