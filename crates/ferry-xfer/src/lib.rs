//! ferry's file-transfer face (ADTS/GridFTP style): `ferry serve` and `ferry cp`.
//!
//! - [`proto`]: the versioned control protocol, pure encode/decode (fuzzed).
//! - [`link`]: one transfer connection in this protocol's frames, over the service floor's
//!   EXS message channel and staging ring: control frames as small (immediate) EXS
//!   messages, file blocks as EXS sends of registered staging blocks the receiver pulls by
//!   RMA (disk reader → registered blocks → network → disk writer), with bounded depth and
//!   back-pressure.
//! - [`server`]: exported roots behind an `openat2(RESOLVE_BENEATH)` sandbox, token auth,
//!   a thread per connection.
//! - `third_party`: server-to-server copies (SEND_TO): the source server uploads to the
//!   destination as an ordinary client, to destinations its operator allowed.
//! - [`conv`]: the download and upload conversations and the server's request routing as
//!   sans-I/O state machines (client and server sides), which the client and server run
//!   and seeded simulations drive.
//! - [`client`]: download and upload of files and trees with per-block CRC-32C (bad blocks
//!   are fetched again) and whole-file BLAKE3, landing by temp name + fsync + rename;
//!   `--resume` and `--retries` continue interrupted transfers.
//! - [`parallel`]: parallel streams (`ferry cp -p N`): one copy over N connections of a
//!   session, large files split into chunks that land in place.
//! - [`mem`]: memory-to-memory mode (a zero source, a null sink) for benchmarking.
//!
//! Below it, the service floor (`ferry-service`) holds what does not depend on this
//! protocol: sandboxed paths, part files and their resume journals, commit, writeback,
//! direct I/O, source stamps and file hashes, the EXS message channel and the staging ring.
//!
//! The wire format is `docs/protocol.md`, section "File transfer protocol"; the user guide
//! is `docs/xfer.md`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod client;
pub mod config;
pub mod conv;
pub mod error;
mod export;
pub mod link;
pub mod mem;
pub mod parallel;
pub mod proto;
pub mod server;
mod session;
mod third_party;
pub mod url;

pub use error::{Kind, Result, XferError};
/// The resume journal and part-file landing live in the service floor; re-exported for the
/// tools and tests that read a receiver's journal.
pub use ferry_service::{journal, landing};

/// The TCP port `ferry serve` listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 7370;
/// Default staging block size (4 MiB).
pub const DEFAULT_BLOCK: u32 = 4 << 20;
/// Default staging ring depth (blocks in flight per direction).
pub const DEFAULT_RING: usize = 8;
/// How many times a block whose CRC fails is fetched again before the transfer fails.
pub const BLOCK_RETRIES: u32 = 3;

/// What a receiver says when a transfer's blocks still fail their CRC after
/// [`BLOCK_RETRIES`] rounds.
pub(crate) fn crc_exhausted(path: &str) -> String {
    format!(
        "{path}: blocks kept failing their CRC after {BLOCK_RETRIES} retries; nothing was written. Check the network path (NIC, cable, memory) and try again"
    )
}
