//! ferry's Extended Sockets (EXS) face.
//!
//! [`proto`] is the protocol core: a sans-I/O state machine for one EXS connection
//! (advertisements and acknowledgments, credit-based flow control, the pull and sender-push
//! rendezvous, immediate data, persistent sends and receives, offsets). [`runtime`] drives it
//! over `ferry-fabric` endpoints with owned registered buffers and event queues; the C API
//! will build on the runtime.
//! The wire format is specified in `docs/protocol.md` (section "EXS control protocol").

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod error;
pub mod proto;
pub mod runtime;

pub use error::ExsError;
