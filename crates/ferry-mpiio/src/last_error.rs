//! The calling thread's last failure, as the C face reports it: every failing call
//! records its message here and returns its class code ([`ferry_cio_last_error`]).

use std::cell::RefCell;
use std::ffi::{c_char, CString};

use ferry_cio::{CioError, ErrorClass};
use ferry_wire::Code16;

thread_local! {
    /// The message of this thread's last failure, NUL-terminated for C.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `e` as this thread's last failure and returns its class code.
pub(crate) fn fail(e: &CioError) -> i32 {
    let msg = CString::new(e.message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|m| *m.borrow_mut() = msg);
    i32::from(e.class.to_u16())
}

/// Records an invalid-argument failure (a NULL handle, a bad string) and returns its code.
pub(crate) fn bad_arg(message: &str) -> i32 {
    fail(&CioError::new(ErrorClass::Arg, message))
}

/// The message of the calling thread's last failure ("" if none). Valid until the thread's
/// next failing call.
#[no_mangle]
pub extern "C" fn ferry_cio_last_error() -> *const c_char {
    LAST_ERROR.with(|m| m.borrow().as_ptr())
}
