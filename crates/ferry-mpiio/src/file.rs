//! Files for C: one rank's [`ferry_cio::File`] and the view it last set (the interposer
//! asks it for byte offsets).

use std::ffi::{c_char, c_void, CStr};

use ferry_cio::view::{Extent, View};
use ferry_cio::{parse_read_cache, CioError, Comm, ErrorClass, File, Pipeline};
use ferry_dtype::Datatype;

use crate::dt::{dt, FerryDt};
use crate::last_error::{bad_arg, fail};

/// A file handle for C.
pub struct FerryCioFile {
    file: File,
    view: View,
}

/// Runs `f` on the file behind `p`, turning its result into a return code.
///
/// # Safety
/// `p` is NULL or a live handle from [`ferry_cio_open`].
unsafe fn with_file(
    p: *mut FerryCioFile,
    f: impl FnOnce(&mut FerryCioFile) -> ferry_cio::Result<()>,
) -> i32 {
    // SAFETY: the caller passes NULL or a live handle, used by one thread at a time.
    let Some(file) = (unsafe { p.as_mut() }) else {
        return bad_arg("a NULL file handle");
    };
    match f(file) {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

fn cstr<'a>(p: *const c_char, what: &str) -> Result<&'a str, i32> {
    if p.is_null() {
        return Err(bad_arg(&format!("{what} is NULL")));
    }
    // SAFETY: a non-NULL pointer from C is a NUL-terminated string (the C contract).
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| bad_arg(&format!("{what} is not UTF-8")))
}

/// Collective: opens `path` (`root/relative/path`) on the server at `addr` (`tcp://h:p`,
/// `ofi+tcp://h:p`, `ofi+shm://name`) as rank `rank` of `size` ranks sharing the session
/// id `job`, with `amode` (ferry's access-mode bits, equal to Open MPI's `MPI_MODE_*`) and
/// `token` (NULL for none). On success `*out` is the file and `*size_at_open` its size.
///
/// # Safety
/// The strings are NUL-terminated (or NULL); `out` and `size_at_open` are writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ferry_cio_open(
    addr: *const c_char,
    path: *const c_char,
    job: u64,
    rank: u32,
    size: u32,
    amode: u32,
    token: *const c_char,
    out: *mut *mut FerryCioFile,
    size_at_open: *mut u64,
) -> i32 {
    if out.is_null() {
        return bad_arg("the output handle pointer is NULL");
    }
    let args = cstr(addr, "the address").and_then(|a| Ok((a, cstr(path, "the path")?)));
    let (addr, path) = match args {
        Ok(v) => v,
        Err(code) => return code,
    };
    let token = if token.is_null() {
        ""
    } else {
        match cstr(token, "the token") {
            Ok(t) => t,
            Err(code) => return code,
        }
    };
    match File::open(addr, path, Comm { job, rank, size }, amode, token) {
        Ok(file) => {
            if !size_at_open.is_null() {
                // SAFETY: a non-NULL `size_at_open` is writable (caller contract).
                unsafe { *size_at_open = file.size_at_open() };
            }
            let h = Box::new(FerryCioFile {
                file,
                view: View::default(),
            });
            // SAFETY: `out` is non-NULL and writable (caller contract).
            unsafe { *out = Box::into_raw(h) };
            0
        }
        Err(e) => fail(&e),
    }
}

/// Collective: sets the view (`disp` bytes, `etype`, `filetype`).
///
/// # Safety
/// `f` is a live file handle, the types live handles.
#[no_mangle]
pub unsafe extern "C" fn ferry_cio_set_view(
    f: *mut FerryCioFile,
    disp: i64,
    etype: *const FerryDt,
    filetype: *const FerryDt,
) -> i32 {
    // SAFETY: forwarded caller contract.
    let (Some(e), Some(t)) = (unsafe { dt(etype) }, unsafe { dt(filetype) }) else {
        return i32::from(ferry_wire::Code16::to_u16(ErrorClass::Arg));
    };
    // SAFETY: forwarded caller contract.
    unsafe {
        with_file(f, |h| {
            // Checked here first, so a bad view fails before any rank waits for it.
            let view = View::new(disp, e.clone(), t.clone())?;
            h.file.set_view(disp, e, t)?;
            h.view = view;
            Ok(())
        })
    }
}

/// Where `count` instances of `memtype` lie relative to `buf`: the first byte they touch
/// and the number of bytes from it, with the type moved so that its data starts at 0.
/// `None` if they hold no data.
fn span(memtype: &Datatype, count: u64) -> ferry_cio::Result<Option<(i64, usize, Datatype)>> {
    let Some(range) = memtype.true_range(count)? else {
        return Ok(None);
    };
    let len = usize::try_from(range.end - range.start)
        .map_err(|_| CioError::new(ErrorClass::Type, "the memory type spans more than memory"))?;
    // The same type map shifted by -lo, so that the buffer slice starts at its first byte
    // (a type whose data starts far from its origin, e.g. absolute addresses from
    // MPI_BOTTOM, must not make a slice reaching back to the origin).
    let shifted = if range.start == 0 {
        memtype.clone()
    } else {
        Datatype::hindexed(&[1], &[-range.start], memtype)?
    };
    Ok(Some((range.start, len, shifted)))
}

/// Writes `count` instances of `memtype` from `buf` at `offset` etypes of the view,
/// collectively (`collective != 0`) or independently; `*done` is the bytes written.
///
/// # Safety
/// `f` is a live file handle, `memtype` a live handle, `buf` the memory `count` instances
/// of `memtype` describe (readable), `done` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_cio_write(
    f: *mut FerryCioFile,
    collective: i32,
    offset: u64,
    buf: *const c_void,
    count: u64,
    memtype: *const FerryDt,
    done: *mut u64,
) -> i32 {
    // SAFETY: forwarded caller contract.
    let Some(memtype) = (unsafe { dt(memtype) }) else {
        return i32::from(ferry_wire::Code16::to_u16(ErrorClass::Arg));
    };
    // SAFETY: forwarded caller contract.
    unsafe {
        with_file(f, |h| {
            let n = match span(memtype, count)? {
                None => {
                    // No data: the call still counts as this rank's part of a collective.
                    let t = Datatype::byte();
                    write(h, collective != 0, offset, &[], 0, &t)?
                }
                Some((lo, len, t)) => {
                    // SAFETY: `buf` + lo .. + len is the memory the type describes, readable
                    // (caller contract); the pointer arithmetic stays inside it.
                    let data = std::slice::from_raw_parts(
                        (buf as *const u8).wrapping_offset(lo as isize),
                        len,
                    );
                    write(h, collective != 0, offset, data, count, &t)?
                }
            };
            if !done.is_null() {
                *done = n;
            }
            Ok(())
        })
    }
}

fn write(
    h: &mut FerryCioFile,
    collective: bool,
    offset: u64,
    data: &[u8],
    count: u64,
    t: &Datatype,
) -> ferry_cio::Result<u64> {
    if collective {
        h.file.write_at_all(offset, data, count, t)
    } else {
        h.file.write_at(offset, data, count, t)
    }
}

/// Reads `count` instances of `memtype` into `buf` from `offset` etypes of the view,
/// collectively or independently; `*done` is the bytes read (fewer at the end of file).
///
/// # Safety
/// As [`ferry_cio_write`], with `buf` writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_cio_read(
    f: *mut FerryCioFile,
    collective: i32,
    offset: u64,
    buf: *mut c_void,
    count: u64,
    memtype: *const FerryDt,
    done: *mut u64,
) -> i32 {
    // SAFETY: forwarded caller contract.
    let Some(memtype) = (unsafe { dt(memtype) }) else {
        return i32::from(ferry_wire::Code16::to_u16(ErrorClass::Arg));
    };
    // SAFETY: forwarded caller contract.
    unsafe {
        with_file(f, |h| {
            let (data, count, t): (&mut [u8], u64, Datatype) = match span(memtype, count)? {
                None => (&mut [], 0, Datatype::byte()),
                // SAFETY: `buf` + lo .. + len is the writable memory the type describes.
                Some((lo, len, t)) => (
                    std::slice::from_raw_parts_mut(
                        (buf as *mut u8).wrapping_offset(lo as isize),
                        len,
                    ),
                    count,
                    t,
                ),
            };
            let n = if collective != 0 {
                h.file.read_at_all(offset, data, count, &t)?
            } else {
                h.file.read_at(offset, data, count, &t)?
            };
            if !done.is_null() {
                *done = n;
            }
            Ok(())
        })
    }
}

/// Independent: the file's size now.
///
/// # Safety
/// `f` is a live file handle, `size` writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_cio_get_size(f: *mut FerryCioFile, size: *mut u64) -> i32 {
    // SAFETY: forwarded caller contract.
    unsafe {
        with_file(f, |h| {
            let n = h.file.size()?;
            if !size.is_null() {
                *size = n;
            }
            Ok(())
        })
    }
}

/// Collective: truncates or extends the file to `size` bytes.
///
/// # Safety
/// `f` is a live file handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_cio_set_size(f: *mut FerryCioFile, size: u64) -> i32 {
    // SAFETY: forwarded caller contract.
    unsafe { with_file(f, |h| h.file.set_size(size)) }
}

/// Collective: the file grows to at least `size` bytes, allocated.
///
/// # Safety
/// `f` is a live file handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_cio_preallocate(f: *mut FerryCioFile, size: u64) -> i32 {
    // SAFETY: forwarded caller contract.
    unsafe { with_file(f, |h| h.file.preallocate(size)) }
}

/// Collective: every rank's writes durable and visible to every rank.
///
/// # Safety
/// `f` is a live file handle.
#[no_mangle]
pub unsafe extern "C" fn ferry_cio_sync(f: *mut FerryCioFile) -> i32 {
    // SAFETY: forwarded caller contract.
    unsafe { with_file(f, |h| h.file.sync()) }
}

/// Sets write pipelining for this file from `spec` (`off`, `on`, `CALLS` or
/// `CALLS,BYTES`, as `FERRY_CIO_PIPELINE`), after collecting the answers of the writes
/// outstanding. A bad `spec` is `Arg` and changes nothing.
///
/// # Safety
/// `f` is a live file handle, `spec` NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn ferry_cio_set_pipeline(f: *mut FerryCioFile, spec: *const c_char) -> i32 {
    let spec = match cstr(spec, "the pipelining setting") {
        Ok(s) => s,
        Err(code) => return code,
    };
    // SAFETY: forwarded caller contract.
    unsafe {
        with_file(f, |h| {
            let p = Pipeline::parse(spec)?;
            h.file.set_pipeline(p)
        })
    }
}

/// Sets the read cache for this file from `spec` (`off`, `on` or a size in bytes with an
/// optional `K`, `M` or `G` suffix, as `FERRY_CIO_READ_CACHE`), forgetting what it held.
/// A bad `spec` is `Arg` and changes nothing.
///
/// # Safety
/// `f` is a live file handle, `spec` NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn ferry_cio_set_read_cache(
    f: *mut FerryCioFile,
    spec: *const c_char,
) -> i32 {
    let spec = match cstr(spec, "the read cache setting") {
        Ok(s) => s,
        Err(code) => return code,
    };
    // SAFETY: forwarded caller contract.
    unsafe {
        with_file(f, |h| {
            let bytes = parse_read_cache(spec)?;
            h.file.set_read_cache(bytes);
            Ok(())
        })
    }
}

/// The byte offset in the file of etype `offset` of the current view.
///
/// # Safety
/// `f` is a live file handle, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn ferry_cio_byte_offset(
    f: *mut FerryCioFile,
    offset: u64,
    out: *mut u64,
) -> i32 {
    // SAFETY: forwarded caller contract.
    unsafe {
        with_file(f, |h| {
            let mut ext: Vec<Extent> = Vec::new();
            h.view.extents(offset, h.view.etype_size(), &mut ext)?;
            let first = ext.first().map_or(h.view.disp(), |e| e.file);
            if !out.is_null() {
                *out = first;
            }
            Ok(())
        })
    }
}

/// Collective: closes the file (durable) and frees the handle, whatever the result.
///
/// # Safety
/// `f` is a live file handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ferry_cio_close(f: *mut FerryCioFile) -> i32 {
    if f.is_null() {
        return bad_arg("a NULL file handle");
    }
    // SAFETY: `f` came from `Box::into_raw` in `ferry_cio_open` and is freed once.
    let h = unsafe { Box::from_raw(f) };
    match h.file.close() {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

/// Frees the handle without closing: the connection ends and the other ranks' collective
/// calls fail, as if this process had died (for a rank giving up after an error).
///
/// # Safety
/// `f` is NULL or a live file handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ferry_cio_abandon(f: *mut FerryCioFile) {
    if !f.is_null() {
        // SAFETY: `f` came from `Box::into_raw` in `ferry_cio_open` and is freed once.
        drop(unsafe { Box::from_raw(f) });
    }
}
