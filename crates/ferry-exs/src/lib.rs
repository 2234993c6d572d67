//! ferry's Extended Sockets (EXS) face.
//!
//! This slice holds the protocol core, [`proto`]: a sans-I/O state machine for one EXS
//! connection (advertisements and acknowledgments, credit-based flow control, the pull and
//! sender-push rendezvous, immediate data, persistent sends and receives, offsets). The
//! runtime that drives it over `ferry-fabric` endpoints, and the C API, build on it.
//! The wire format is specified in `docs/protocol.md` (section "EXS control protocol").

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod error;
pub mod proto;

pub use error::ExsError;
