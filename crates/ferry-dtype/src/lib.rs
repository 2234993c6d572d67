//! ferry's data-layout layer: MPI-like datatypes, a lazy seekable segment cursor, resumable
//! pack/unpack, and segment lists.
//!
//! Noncontiguous transfers (scattered memory, file views) describe *where* the bytes of a
//! message lie with a [`Datatype`]; the transfer layers above walk it with a [`Cursor`] to
//! build gather/scatter lists for zero-copy sends and RMA, or with a [`Packer`]/[`Unpacker`]
//! where a copy through a staging buffer is cheaper (many tiny segments).
//!
//! # The model
//!
//! A datatype is a **type map**: an ordered list of (offset, bytes) entries relative to an
//! **origin**, the buffer position of displacement 0. Its bytes, in type-map order, form the
//! **data stream**: what packing produces and what goes on the wire. The figures:
//!
//! - **size**: bytes in the data stream of one instance.
//! - **lb**, **ub**: the lower and upper bound. Without markers, the lowest data offset and
//!   one past the highest. [`Datatype::resized`] sets them explicitly; as in MPI such markers
//!   are *sticky*: an enclosing type's bound is its lowest (highest) marker if any child has
//!   one, otherwise its lowest (highest) data offset. `lb` may be negative.
//! - **extent** = `ub - lb`: the stride from one instance to the next. A `count` of a type
//!   means `count` instances at `i * extent` (as in `MPI_Send(buf, count, type)`); every
//!   constructor that repeats its old type (contiguous, vector, indexed, ...) lays copies out
//!   this way.
//! - **true lb / true extent**: the memory actually touched, ignoring markers.
//!
//! Displacements, strides and bounds are `i64` and may be negative; sizes are `u64`. Every
//! constructor checks its arithmetic: a type whose size, extent or offsets do not fit, or an
//! inconsistent description (arrays of different lengths, a subarray window outside its
//! array), is a [`DtypeError`] from the constructor, never a panic or a wrapped value.
//! There is no implicit alignment padding (MPI's epsilon) and no representation conversion:
//! a [`Datatype::primitive`] is just `n` bytes.
//!
//! # Walking a layout
//!
//! A [`Cursor`] yields the layout as [`Segment`]s `(offset, len)` without materializing
//! them: its state is one frame per nesting level. Runs that continue each other in stream
//! order (one ends where the next begins) come out merged, so each segment is maximal.
//! It seeks to any byte of the stream in O(depth · log n) and stops at a segment or byte
//! budget, which is what a gather list needs ("the next `K` segments, at most `B` bytes, from
//! stream position `P`").
//!
//! Segment offsets are relative to the origin. For a buffer `buf` whose displacement 0 is at
//! index `origin`, segment `s` is `buf[origin + s.offset ..][.. s.len]`
//! ([`Segment::buffer_range`]); for a registered region it is `LocalSlice { offset: origin +
//! s.offset, len: s.len, .. }`. A layout of `count` instances touches the offsets
//! [`Datatype::true_range`]: the origin must be at least `-start` and the buffer at least
//! `origin + end` bytes. [`Packer`] and [`Unpacker`] check exactly that before copying.
//!
//! # Example
//!
//! ```
//! use ferry_dtype::{pack, Cursor, Datatype, Order, Segment};
//!
//! // A 2x3 window at row 1, column 1 of a 4x5 array of 4-byte integers (C order).
//! let int = Datatype::primitive(4)?;
//! let window = Datatype::subarray(&[4, 5], &[2, 3], &[1, 1], Order::C, &int)?;
//! assert_eq!((window.size(), window.lb(), window.extent()), (24, 0, 80));
//! assert_eq!((window.true_lb(), window.true_extent()), (24, 32));
//!
//! // Two runs of 12 bytes, one row (20 bytes) apart.
//! let segs: Vec<Segment> = Cursor::new(&window, 1)?.collect();
//! assert_eq!(segs, [Segment::new(24, 12), Segment::new(44, 12)]);
//!
//! // Pack it out of the array.
//! let array: Vec<u8> = (0..80).collect();
//! let packed = pack(&window, 1, &array, 0)?;
//! assert_eq!(&packed[..4], &[24, 25, 26, 27]);
//! assert_eq!(packed.len(), 24);
//! # Ok::<(), ferry_dtype::DtypeError>(())
//! ```
//!
//! A type travels as its compact description, the constructor tree that built it
//! ([`Datatype::encode`], [`Datatype::decode`], module [`desc`]).
//!
//! Segment lists are datatypes too ([`Datatype::from_segments`]); a list meant for receiving
//! must not overlap ([`validate_receive_segments`], [`Datatype::check_receive`]).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cursor;
pub mod desc;
pub mod error;
mod pack;
mod segments;
mod types;

pub use cursor::{Cursor, Segment};
pub use error::{DtypeError, Result};
pub use pack::{pack, unpack, Packer, Unpacker};
pub use segments::validate_receive_segments;
pub use types::{Datatype, Order};
