//! The byte floor under every ferry codec (fabric tcp frames, ofi control messages, EXS
//! frames, file-transfer frames): one bounds-checked [`Reader`], one [`Writer`], and the
//! [`frames!`] table that generates a protocol's frame enum, body encoder, body decoder and
//! length bounds from one declaration per frame.
//!
//! Every ferry protocol is little-endian (see `docs/protocol.md`), so the integer methods
//! are little-endian only. Nothing here panics on any input: a short buffer is
//! [`ReadError::Short`], an over-long length is [`ReadError::TooLong`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[doc(hidden)]
pub mod bench;
mod bytes;
mod decode;
mod field;
mod frames;

pub use bytes::{ReadError, Reader, TooLong, Writer};
pub use decode::DecodeError;
pub use field::{Code, Code16, Cx, Field, Flag, Flags, IfFlag, Le, List, Payload, Raw, Str};

#[cfg(test)]
mod tests;
