//! The C face's conventions, called as C calls them: constructors return NULL on error and
//! file calls a ferry error class, each with the reason in `ferry_cio_last_error`; sizes
//! and extents of the types the interposer builds. (The calls against a server, under
//! real MPI, are in crates/ferry-cli/tests/mpiio.rs.)

use std::ffi::{CStr, CString};
use std::ptr;

use ferry_mpiio::*;

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string owned by this thread.
    unsafe { CStr::from_ptr(ferry_cio_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn constructors_build_mpi_types_and_report_bad_ones() {
    let int = ferry_dt_primitive(4);
    assert!(!int.is_null());
    // SAFETY: every handle passed is live or NULL, every array holds `n` elements.
    unsafe {
        // MPI_Type_vector(3, 1, 2, MPI_INT): 12 bytes over an extent of 20.
        let v = ferry_dt_vector(3, 1, 2, 0, int);
        assert_eq!((ferry_dt_size(v), ferry_dt_extent(v)), (12, 20));
        let r = ferry_dt_resized(v, 0, 24);
        assert_eq!(ferry_dt_extent(r), 24);
        let (sizes, subsizes, starts) = ([4u64, 6], [2u64, 3], [1u64, 2]);
        let sub = ferry_dt_subarray(
            2,
            sizes.as_ptr(),
            subsizes.as_ptr(),
            starts.as_ptr(),
            1,
            int,
        );
        assert_eq!((ferry_dt_size(sub), ferry_dt_extent(sub)), (24, 96));
        let (bl, dl) = ([1u64, 1], [0i64, 8]);
        let types = [int as *const FerryDt, r as *const FerryDt];
        let st = ferry_dt_struct(2, bl.as_ptr(), dl.as_ptr(), types.as_ptr());
        assert_eq!(ferry_dt_size(st), 16);

        assert!(ferry_dt_vector(3, 1, 2, 0, ptr::null()).is_null());
        assert!(last_error().contains("NULL datatype"), "{}", last_error());
        let bad = [5u64, 6];
        let out = ferry_dt_subarray(2, sizes.as_ptr(), bad.as_ptr(), starts.as_ptr(), 1, int);
        assert!(out.is_null(), "a window past the array");
        assert!(!last_error().is_empty());
        for t in [st, sub, r, v, int] {
            ferry_dt_free(t);
        }
    }
}

#[test]
fn open_failures_are_classes_with_messages() {
    let mut f: *mut FerryCioFile = ptr::null_mut();
    // Nothing listens on port 1.
    let addr = CString::new("tcp://127.0.0.1:1").unwrap();
    let path = CString::new("d/x").unwrap();
    let open = |addr: *const std::ffi::c_char, f: &mut *mut FerryCioFile| {
        // SAFETY: NULL or NUL-terminated strings, a writable output handle.
        unsafe {
            ferry_cio_open(
                addr,
                path.as_ptr(),
                1,
                0,
                1,
                8,
                ptr::null(),
                f,
                ptr::null_mut(),
            )
        }
    };
    assert_eq!(
        open(addr.as_ptr(), &mut f),
        16,
        "a refused connection: Connection"
    );
    assert!(f.is_null());
    assert!(last_error().contains("127.0.0.1:1"), "{}", last_error());
    assert_eq!(open(ptr::null(), &mut f), 1, "a NULL address: Arg");
    // SAFETY: a NULL handle is refused, not dereferenced.
    assert_eq!(
        unsafe { ferry_cio_sync(ptr::null_mut()) },
        1,
        "a NULL file: Arg"
    );
    assert!(last_error().contains("NULL file"), "{}", last_error());
}
