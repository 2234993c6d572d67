//! ferry's service floor: what every service face (file transfer today; collective I/O and
//! a block service next) needs below its own protocol. It speaks bytes, byte ranges and
//! checksums, never a face's messages, and depends on no face.
//!
//! - [`daemon`]: a server process's life (its faces, the signals that drain it, the exit a
//!   wedged provider forces); [`drain`]: work in flight and its drain; [`serve`]: the
//!   server skeleton (listen on one or more addresses of any driver, a
//!   thread per connection through a [`registry::Service`]);
//!   [`registry`]: the services one server hosts and how a connection selects one, on the
//!   floor's own frames ([`select`]).
//! - [`config`]: what every face's configuration reads alike (sizes, one-or-more keys).
//! - [`secure`]: TLS 1.3 on every connection's control messages, the server's identity
//!   and the client's known hosts, tokens proven over the TLS exporter.
//! - [`auth`]: who may use a server's services (tokens); [`admit`]: admission limits
//!   (handshakes, connections per address, staging memory, lock-out after failed tokens).
//! - [`beneath`]: opening and creating files beneath a directory held open
//!   (`openat2(RESOLVE_BENEATH)`), the sandbox of exported roots and download destinations;
//!   [`roots`]: the exported roots themselves and the part files written in them;
//!   [`claims`]: one writer per destination file at a time.
//! - [`stamp`]: catching a source file that changes while it is read; [`sumcache`]: a
//!   file's BLAKE3 kept in an extended attribute for the next time it is read.
//! - [`hash`]: the one BLAKE3 of a file's range; [`tree`]: the hash of a file from the
//!   chaining values of its blocks, hashed where they land, in any order.
//! - [`direct`]: direct I/O (`O_DIRECT`) handles and alignment.
//! - [`sink`]: landing checked blocks in a file (CRC-32C, holes, in-order hash, journal);
//!   [`writer`]: feeding a sink received blocks, inline or on a disk writer thread.
//! - [`channel`]: the EXS message channel (a face's frames as messages, a posted receive
//!   ring of registered buffers); [`ring`]: the staging ring, its sans-I/O core (slots,
//!   credits, fsync cadence) and its sending runtime over EXS.
//! - [`journal`]: the resume journal of a part file (its pure codec and range set, then
//!   its file); [`landing`]: a part file with its journal and checkpoints; [`writeback`]:
//!   those checkpoints off the receiving thread; [`commit`]: fsync and rename of finished
//!   files on a small pool.
//!
//! Data flows down: a face hands the floor byte ranges and checksums; the floor hands the
//! operating system reads, writes and fsyncs.

// Unsafe only in the one FFI module below (libc calls std and rustix do not offer).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod admit;
pub mod audit;
pub mod auth;
pub mod beneath;
pub mod channel;
pub mod claims;
pub mod commit;
pub mod config;
pub mod daemon;
pub mod direct;
pub mod drain;
pub mod error;
pub mod grants;
pub mod hash;
pub mod journal;
pub mod keys;
pub mod landing;
#[allow(unsafe_code)] // FFI: setgroups, setgid, setuid for every thread (glibc).
pub mod privs;
pub mod registry;
pub mod rights;
pub mod ring;
pub mod roots;
pub mod secure;
pub mod select;
pub mod serve;
pub mod sink;
pub mod stamp;
pub mod sumcache;
pub mod tree;
pub mod writeback;
pub mod writer;

pub use error::{Error, Kind, Result};
