//! ferry's noncontiguous transfer engine: moves data between a noncontiguous local layout and
//! a noncontiguous remote layout with one-sided RMA, zero-copy (EXIO's design), packing
//! through a registered staging buffer only where that is cheaper.
//!
//! # Why a crate of its own
//!
//! `ferry-dtype` is the data-layout layer: pure, no I/O, and it depends on nothing but
//! `thiserror`. This engine posts fabric operations and waits for their completions, so it
//! needs `ferry-fabric`; putting it in `ferry-dtype` would make the layout layer depend on the
//! fabric (and everything that uses datatypes, such as file views, would link the drivers).
//! The layers stay visible in the tree: dtype describes, noncontig moves, EXS and the
//! services above call it.
//!
//! # The engine
//!
//! A [`LocalLayout`] is a registered [`MemoryRegion`], an origin (the region offset of
//! displacement 0) and `count` instances of a [`Datatype`]; a [`RemoteLayout`] is the same
//! over a [`RemoteSlice`] a peer advertised. [`write()`] moves the local data stream into the
//! remote layout, [`read()`] the other way. Both walk the two layouts with lazy
//! [`ferry_dtype::Cursor`]s, so a layout of 2^20 segments costs a few hundred bytes of state.
//!
//! - **Zero-copy** ([`Path::ZeroCopy`]): consecutive remote contiguous segments, up to the
//!   driver's `rma_iov_limit` ([`Options::max_remote_segments`]) of them, and the local
//!   segments that fill them, at most its `rma_gather` ([`Options::max_gather`]), are gathered
//!   into one `post_write`/`post_write_v` (scattered by one `post_read`/`post_read_v`); with one
//!   remote segment per operation, a destination segment that needs more local segments is
//!   split in software into several operations ([`Stats::splits`]). Up to
//!   [`Options::window`] operations are in flight.
//! - **Packed** ([`Path::Packed`]): the local side is copied through a registered staging
//!   buffer (packed before a write, unpacked after a read), which is then moved with one
//!   operation per remote segment. A one-sided transfer can only pack its own side, so this
//!   pays only when the *local* segments are tiny and the *remote* ones are not: the rule
//!   ([`Options::choose`]) packs when the local mean segment is below
//!   [`Options::pack_threshold`] and the remote mean segment is at least that. When both
//!   sides are tiny, packing would still need one operation per remote segment; only the
//!   peer can unpack, which is a two-sided protocol (EXS), not this engine.
//!
//! Every check happens before anything moves: layouts of different sizes, a receive layout
//! whose segments overlap, a local layout outside its region, a remote layout outside its
//! advertised slice, an endpoint without RMA.
//!
//! The engine assumes it is the only user of the endpoint's completion queue while a
//! transfer runs (it consumes every completion it sees and checks its context tag).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use ferry_fabric::{Access, Buffer};
//! use ferry_noncontig::{write, Datatype, LocalLayout, Options, Path, RemoteLayout};
//!
//! let t = Duration::from_secs(10);
//! let listener = ferry_fabric::listen(&"tcp://127.0.0.1:0".parse()?)?;
//! let (server, client) = std::thread::scope(|s| {
//!     let accept = s.spawn(|| listener.accept(t));
//!     let client = ferry_fabric::connect(&listener.local_addr(), t);
//!     (accept.join().expect("accept thread"), client)
//! });
//! let (server, client) = (server?, client?);
//!
//! // Every other 4-byte block of 64 bytes here, into every fourth 2-byte block there.
//! let src: Vec<u8> = (0..64).collect();
//! let local = client.domain().register(&Buffer::from_slice(&src), Access::LOCAL)?;
//! let target = server.domain().register(&Buffer::new(128), Access::ALL)?;
//! // The server lets this client (authenticated, say) reach the target.
//! server.enable_remote_access();
//! server.grant(&target)?;
//! let here = Datatype::vector(8, 4, 8, &Datatype::byte())?;
//! let there = Datatype::vector(16, 2, 8, &Datatype::byte())?;
//! let stats = write(
//!     client.as_ref(),
//!     &LocalLayout::new(local, 0, here, 1),
//!     &RemoteLayout::new(target.remote(..)?, 0, there, 1),
//!     &Options::default(),
//! )?;
//! assert_eq!((stats.path, stats.ops, stats.bytes), (Path::ZeroCopy, 16, 32));
//! assert_eq!(&target.buffer().to_vec()[..10], &[0, 1, 0, 0, 0, 0, 0, 0, 2, 3]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod engine;
mod error;
mod layout;

pub use engine::{read, write, Options, Path, Stats};
pub use error::{NoncontigError, Result};
pub use layout::{pack_to_buffer, unpack_from_buffer, LocalLayout, RemoteLayout};

pub use ferry_dtype::{Datatype, Segment};
pub use ferry_fabric::{MemoryRegion, RemoteSlice};
