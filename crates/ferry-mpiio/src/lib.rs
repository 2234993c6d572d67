//! The C face of ferry's collective I/O client: the calls `libferry-mpiio.so` (the MPI-IO
//! interposer, `c/mpiio/`) makes to open a file on a ferry server, set a view, write and
//! read collectively or independently, and build the datatypes those calls take.
//!
//! The interposer decodes MPI datatypes (`MPI_Type_get_envelope` / `get_contents`) into
//! [`ferry_dtype::Datatype`]s with the `ferry_dt_*` constructors, then calls
//! `ferry_cio_*` on a [`ferry_cio::File`]. Memory buffers are described by their MPI type
//! too (decoded the same way), so data is packed from the caller's buffer straight into
//! the messages the client sends: no `MPI_Pack` copy in between.
//!
//! Conventions: a function building a datatype returns a new handle, or NULL on error;
//! a function on a file returns 0 or the ferry error class of the failure (the wire code
//! of [`ferry_cio::ErrorClass`]); either way the failure's message is
//! [`ferry_cio_last_error`] on the calling thread. Handles are freed by their own
//! `*_free` / `ferry_cio_close` / `ferry_cio_abandon`. The header is
//! `include/ferry/cio.h`.

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod dt;
mod file;
mod last_error;

pub use dt::*;
pub use file::*;
pub use last_error::ferry_cio_last_error;
