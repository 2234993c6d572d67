//! ferry's collective I/O face (ECIO): MPI-IO programs write and read one shared file on a
//! ferry server through file views, each rank's pieces going straight to the server once,
//! with no redistribution among the ranks.
//!
//! In MPI-IO's two-phase collective I/O the ranks first exchange their pieces so that a
//! few aggregators can write large contiguous regions: every byte crosses the network
//! twice, and the analysis costs the compute nodes CPU. Here each rank sends its view once
//! (a compact datatype description, [`ferry_dtype::Datatype::encode`], cached by hash) and
//! then only its packed data; the server flattens each view's tile once when the view is
//! set and maps each call's window onto the file by tile arithmetic ([`view`]), gathers
//! one collective call from every rank and places the pieces of all ranks — in one buffer
//! over the span they cover when they are many and close together ([`domain`]), else
//! merged by offset — writing each run of touching pieces at once, never reading to fill
//! holes. Reads are symmetric: the regions the ranks' views cover are read once and each
//! rank gets exactly its pieces. A session keeps its calls' buffers for the next calls.
//!
//! - [`proto`]: the protocol's frames (sans-I/O), specified in `docs/protocol.md`.
//! - [`session`]: the collective session machine (pure): which calls complete, which fail,
//!   what file action each runs.
//! - [`domain`]: file-domain buffers for calls of many small pieces.
//! - [`view`]: file views and the file extents of a window of a view's data stream.
//! - [`server`]: the floor's service `cio` (sandboxed roots, the floor's authentication).
//! - [`File`]: the Rust API, in MPI-IO's shape; the MPI-IO interposer `libferry-mpiio.so`
//!   (crate ferry-mpiio) wraps it.
//!
//! The guide is `docs/cio.md`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod client;
pub mod config;
pub mod domain;
pub mod error;
pub mod proto;
mod readcache;
pub mod server;
pub mod session;
pub mod view;

pub use client::{Comm, File, Pipeline, INLINE_ENV, PIPELINE_ENV};
pub use config::CioConfig;
pub use error::{CioError, ErrorClass, Result};
pub use proto::amode;
pub use readcache::{parse_read_cache, DEFAULT_READ_CACHE, READ_CACHE_ENV};
