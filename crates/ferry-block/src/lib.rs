//! ferry's block face: an NBD server that standard clients (nbdinfo, nbdcopy, qemu-img,
//! qemu-nbd --list, fio's nbd engine, nbdfuse, the kernel's nbd-client) use unchanged, a
//! service of `ferry serve` beside file transfer on the service floor.
//!
//! - [`nbd`]: the protocol as a sans-I/O core: constants, option and request decoders that
//!   never panic, the server handshake as a state machine, replies and their planning.
//! - [`backend`]: the storage behind an export: a regular file (sparse), a block device,
//!   memory.
//! - [`server`]: the runtime: TCP and Unix listeners, the service floor's admission
//!   (handshake deadline and pool, connection limits), a thread per connection, workers
//!   per connection that take turns reading requests and answer out of order, the drain.
//! - [`config`]: the `[block]` table of `ferry serve`'s configuration.
//! - [`buf`]: aligned, recycled transfer buffers.
//! - [`tls`]: `NBD_OPT_STARTTLS` (rustls, X.509), a TLS session the workers share.
//! - [`deleg`]: the RMA path by buffer-management delegation, a face of the fabric port
//!   (`block`), and its Rust client.
//!
//! Not in this version: extended headers, TLS with pre-shared keys.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
pub mod buf;
pub mod config;
pub mod deleg;
pub mod nbd;
pub mod server;
pub mod tls;

pub use config::{BlockConfig, ExportConfig};
pub use server::{BlockServer, Export};
