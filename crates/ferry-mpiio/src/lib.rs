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

pub use dt::*;
pub use file::*;

use std::cell::RefCell;
use std::ffi::{c_char, CString};

use ferry_cio::{CioError, ErrorClass};
use ferry_wire::Code16;

thread_local! {
    /// The message of this thread's last failure, NUL-terminated for C.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `e` as this thread's last failure and returns its class code.
fn fail(e: &CioError) -> i32 {
    let msg = CString::new(e.message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|m| *m.borrow_mut() = msg);
    i32::from(e.class.to_u16())
}

/// Records an invalid-argument failure (a NULL handle, a bad string) and returns its code.
fn bad_arg(message: &str) -> i32 {
    fail(&CioError::new(ErrorClass::Arg, message))
}

/// The message of the calling thread's last failure ("" if none). Valid until the thread's
/// next failing call.
#[no_mangle]
pub extern "C" fn ferry_cio_last_error() -> *const c_char {
    LAST_ERROR.with(|m| m.borrow().as_ptr())
}
