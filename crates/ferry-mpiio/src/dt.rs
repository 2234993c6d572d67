//! Datatype constructors for C: each mirrors one MPI type constructor and returns a new
//! handle (a boxed [`Datatype`]) or NULL, with the reason in `ferry_cio_last_error`.
//! Arrays are (pointer, length) pairs; a child handle stays the caller's to free.

use std::slice;

use ferry_cio::CioError;
use ferry_dtype::{Datatype, Order};

use crate::last_error::{bad_arg, fail};

/// A datatype handle for C.
pub struct FerryDt(pub(crate) Datatype);

fn boxed(r: ferry_dtype::Result<Datatype>) -> *mut FerryDt {
    match r {
        Ok(t) => Box::into_raw(Box::new(FerryDt(t))),
        Err(e) => {
            fail(&CioError::from(e));
            std::ptr::null_mut()
        }
    }
}

/// The datatype behind `p`, or None (and a recorded error) for NULL.
///
/// # Safety
/// `p` is NULL or a live handle from this library.
pub(crate) unsafe fn dt<'a>(p: *const FerryDt) -> Option<&'a Datatype> {
    // SAFETY: the caller passes NULL or a handle from `boxed`, not yet freed.
    match unsafe { p.as_ref() } {
        Some(t) => Some(&t.0),
        None => {
            bad_arg("a NULL datatype handle");
            None
        }
    }
}

/// `n` elements at `p` (an empty slice for `n == 0`, whatever `p`).
///
/// # Safety
/// `p` points to `n` readable `T`s when `n > 0`.
unsafe fn arr<'a, T>(p: *const T, n: usize) -> Option<&'a [T]> {
    if n == 0 {
        return Some(&[]);
    }
    if p.is_null() {
        bad_arg("a NULL array");
        return None;
    }
    // SAFETY: the caller promises `n` readable elements at the non-NULL `p`.
    Some(unsafe { slice::from_raw_parts(p, n) })
}

macro_rules! try_or_null {
    ($e:expr) => {
        match $e {
            Some(v) => v,
            None => return std::ptr::null_mut(),
        }
    };
}

/// A type of `size` contiguous bytes (an MPI named type).
#[no_mangle]
pub extern "C" fn ferry_dt_primitive(size: u64) -> *mut FerryDt {
    boxed(Datatype::primitive(size))
}

/// `MPI_Type_contiguous`.
///
/// # Safety
/// `old` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_dt_contiguous(count: u64, old: *const FerryDt) -> *mut FerryDt {
    // SAFETY: forwarded caller contract.
    let old = try_or_null!(unsafe { dt(old) });
    boxed(Datatype::contiguous(count, old))
}

/// `MPI_Type_vector` (`hbytes == 0`: stride in elements of `old`) or
/// `MPI_Type_create_hvector` (`hbytes != 0`: stride in bytes).
///
/// # Safety
/// `old` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_dt_vector(
    count: u64,
    blocklen: u64,
    stride: i64,
    hbytes: i32,
    old: *const FerryDt,
) -> *mut FerryDt {
    // SAFETY: forwarded caller contract.
    let old = try_or_null!(unsafe { dt(old) });
    boxed(if hbytes != 0 {
        Datatype::hvector(count, blocklen, stride, old)
    } else {
        Datatype::vector(count, blocklen, stride, old)
    })
}

/// `MPI_Type_indexed` (`hbytes == 0`: displacements in extents of `old`) or
/// `MPI_Type_create_hindexed` (bytes): `n` blocks.
///
/// # Safety
/// `blocklens` and `displs` hold `n` elements; `old` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_dt_indexed(
    n: usize,
    blocklens: *const u64,
    displs: *const i64,
    hbytes: i32,
    old: *const FerryDt,
) -> *mut FerryDt {
    // SAFETY: forwarded caller contract.
    let (bl, d, old) = unsafe { (arr(blocklens, n), arr(displs, n), dt(old)) };
    let (bl, d, old) = (try_or_null!(bl), try_or_null!(d), try_or_null!(old));
    boxed(if hbytes != 0 {
        Datatype::hindexed(bl, d, old)
    } else {
        Datatype::indexed(bl, d, old)
    })
}

/// `MPI_Type_create_indexed_block` (`hbytes == 0`) or `MPI_Type_create_hindexed_block`.
///
/// # Safety
/// `displs` holds `n` elements; `old` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_dt_indexed_block(
    n: usize,
    blocklen: u64,
    displs: *const i64,
    hbytes: i32,
    old: *const FerryDt,
) -> *mut FerryDt {
    // SAFETY: forwarded caller contract.
    let (d, old) = unsafe { (arr(displs, n), dt(old)) };
    let (d, old) = (try_or_null!(d), try_or_null!(old));
    boxed(if hbytes != 0 {
        Datatype::hindexed_block(blocklen, d, old)
    } else {
        Datatype::indexed_block(blocklen, d, old)
    })
}

/// `MPI_Type_create_struct`: `n` blocks, byte displacements, one type each.
///
/// # Safety
/// `blocklens`, `displs` and `types` hold `n` elements, each type a live handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_dt_struct(
    n: usize,
    blocklens: *const u64,
    displs: *const i64,
    types: *const *const FerryDt,
) -> *mut FerryDt {
    // SAFETY: forwarded caller contract.
    let (bl, d, ts) = unsafe { (arr(blocklens, n), arr(displs, n), arr(types, n)) };
    let (bl, d, ts) = (try_or_null!(bl), try_or_null!(d), try_or_null!(ts));
    let mut owned = Vec::with_capacity(n);
    for &t in ts {
        // SAFETY: each element is a live handle (caller contract).
        owned.push(try_or_null!(unsafe { dt(t) }).clone());
    }
    boxed(Datatype::structure(bl, d, &owned))
}

/// `MPI_Type_create_resized`.
///
/// # Safety
/// `old` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_dt_resized(
    old: *const FerryDt,
    lb: i64,
    extent: i64,
) -> *mut FerryDt {
    // SAFETY: forwarded caller contract.
    let old = try_or_null!(unsafe { dt(old) });
    boxed(Datatype::resized(old, lb, extent))
}

/// `MPI_Type_create_subarray`: `ndims` dimensions, `order_c != 0` for `MPI_ORDER_C`.
///
/// # Safety
/// `sizes`, `subsizes` and `starts` hold `ndims` elements; `old` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_dt_subarray(
    ndims: usize,
    sizes: *const u64,
    subsizes: *const u64,
    starts: *const u64,
    order_c: i32,
    old: *const FerryDt,
) -> *mut FerryDt {
    // SAFETY: forwarded caller contract.
    let (s, ss, st, old) = unsafe {
        (
            arr(sizes, ndims),
            arr(subsizes, ndims),
            arr(starts, ndims),
            dt(old),
        )
    };
    let (s, ss, st, old) = (
        try_or_null!(s),
        try_or_null!(ss),
        try_or_null!(st),
        try_or_null!(old),
    );
    let order = if order_c != 0 {
        Order::C
    } else {
        Order::Fortran
    };
    boxed(Datatype::subarray(s, ss, st, order, old))
}

/// Frees a handle (NULL is ignored).
///
/// # Safety
/// `t` is NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ferry_dt_free(t: *mut FerryDt) {
    if !t.is_null() {
        // SAFETY: `t` came from `Box::into_raw` in `boxed` and is freed once.
        drop(unsafe { Box::from_raw(t) });
    }
}

/// Bytes of data in one instance (0 for NULL).
///
/// # Safety
/// `t` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_dt_size(t: *const FerryDt) -> u64 {
    // SAFETY: forwarded caller contract.
    unsafe { t.as_ref() }.map_or(0, |t| t.0.size())
}

/// The extent (0 for NULL).
///
/// # Safety
/// `t` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_dt_extent(t: *const FerryDt) -> i64 {
    // SAFETY: forwarded caller contract.
    unsafe { t.as_ref() }.map_or(0, |t| t.0.extent())
}
