//! The NBD protocol as plain state and codecs, no sockets, threads or clocks:
//! [`consts`] (the specification's numbers), [`wire`] (big-endian fields that never read
//! out of bounds), [`option`] (option requests), [`handshake`] (the server's fixed
//! newstyle negotiation as a state machine), [`request`] (transmission requests decoded
//! and checked), [`reply`] (simple and structured replies, read and block-status
//! planning). The runtime ([`crate::server`]) does the I/O.

pub mod consts;
pub mod handshake;
pub mod option;
pub mod reply;
pub mod request;
pub mod wire;
