//! The RMA path: buffer-management delegation over ferry's fabric (the GNBD design), a face
//! of `ferry serve` beside the NBD server, selected on the fabric port as `block`.
//!
//! At connect the server registers a pool of chunks for this session alone, grants them on
//! its connection only, and delegates them: their remote ranges and keys, and the credits
//! (requests the client may have outstanding), go to the client in DELEGATE. The client
//! allocates chunks itself (first fit) with no round trip: a write RMA-writes the data into
//! a chunk, then names it in a WRITE; a read either has the server fill a chunk that the
//! client then RMA-reads (the seed's scheme) or names a range of the client's own registered
//! memory the server RMA-writes into (the RTRS scheme). A copy-based variant carries the
//! data inside the messages instead. Every chunk range a request names is checked against
//! the session's pool; one outside it ends that session alone.
//!
//! - [`proto`]: the frames, a sans-I/O codec with a fuzzed decoder.
//! - [`pool`]: the client's first-fit allocator and the server's range check.
//! - [`merge`]: block aggregation: adjacent writes as one request, their data gathered.
//! - [`server`]: the face ([`server::FabricService`]), one thread per session.
//! - [`client`]: the Rust API ([`client::Client`]).
//! - [`attach`]: a remote export as a local backend, for `ferry block attach`.

pub mod attach;
pub mod client;
pub mod merge;
pub mod pool;
pub mod proto;
pub mod server;

/// The face's name in the floor's SELECT.
pub const SERVICE: &str = "block";
