//! `exs_sendv` / `exs_recvv`: noncontiguous messages from and into lists of segments of one
//! registered memory (`ExsSocket::send_layout` / `recv_layout` underneath; see
//! `docs/noncontig.md`).

use std::ffi::{c_int, c_void};

use ferry_exs::runtime::{ExsBuf, Layout, LayoutError, Segment};

use crate::error::{Errno, Res};
use crate::handle;
use crate::queue::{op_forget, op_token, OpRec};
use crate::status;

/// `struct exs_iovec`: one segment, inside the registered memory the call names.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct exs_iovec {
    /// Start of the segment.
    pub iov_base: *mut c_void,
    /// Its length in bytes.
    pub iov_len: usize,
}

/// Most segments one call takes (a list, not a datatype: longer layouts belong in Rust).
const MAX_IOV: c_int = 1 << 20;

fn errno_of(e: &LayoutError) -> Errno {
    match e {
        LayoutError::Staging(_) => Errno(libc::ENOMEM),
        _ => Errno::INVAL,
    }
}

/// # Safety
/// `iov` must point to `iovcnt` readable `exs_iovec`s (or be anything when `iovcnt` is 0).
unsafe fn postv(
    send: bool,
    sock: c_int,
    iov: *const exs_iovec,
    iovcnt: c_int,
    mh: c_int,
    q: c_int,
    ctx: *mut c_void,
) -> Res<()> {
    if !(0..=MAX_IOV).contains(&iovcnt) || (iovcnt > 0 && iov.is_null()) {
        return Err(Errno::INVAL);
    }
    let list: &[exs_iovec] = if iovcnt == 0 {
        &[]
    } else {
        // SAFETY: the caller promises `iovcnt` readable entries at `iov` (checked non-null).
        unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) }
    };
    let s = handle::sock(sock)?;
    let mem = handle::mem(mh)?;
    let q = handle::queue(q)?;
    let exs = s.connected()?;
    let mut segs = Vec::with_capacity(list.len());
    for v in list {
        let r = mem.range(v.iov_base as usize, v.iov_len)?;
        let offset = i64::try_from(r.start).map_err(|_| Errno::FAULT)?;
        segs.push(Segment::new(offset, v.iov_len as u64));
    }
    let layout = Layout::segments(&segs).map_err(|e| errno_of(&e))?;
    let xb = ExsBuf::new(mem.region(&s, &exs)?);
    let first = list.first().map_or(0, |v| v.iov_base as usize);
    let token = op_token(OpRec {
        sock,
        ctx: ctx as usize,
        buf: first,
    });
    let posted = if send {
        exs.send_layout_to(Some(&q.rt), xb, &layout, token)
    } else {
        exs.recv_layout_to(Some(&q.rt), xb, &layout, token)
    };
    posted.map_err(|r| {
        op_forget(token);
        errno_of(&r.error)
    })
}

/// `exs_sendv`.
///
/// # Safety
/// `iov` must point to `iovcnt` readable `exs_iovec`s.
#[no_mangle]
pub unsafe extern "C" fn exs_sendv(
    sock: c_int,
    iov: *const exs_iovec,
    iovcnt: c_int,
    mh: c_int,
    q: c_int,
    ctx: *mut c_void,
) -> c_int {
    // SAFETY: forwarded from our caller.
    status(|| unsafe { postv(true, sock, iov, iovcnt, mh, q, ctx) })
}

/// `exs_recvv`.
///
/// # Safety
/// `iov` must point to `iovcnt` readable `exs_iovec`s.
#[no_mangle]
pub unsafe extern "C" fn exs_recvv(
    sock: c_int,
    iov: *const exs_iovec,
    iovcnt: c_int,
    mh: c_int,
    q: c_int,
    ctx: *mut c_void,
) -> c_int {
    // SAFETY: forwarded from our caller.
    status(|| unsafe { postv(false, sock, iov, iovcnt, mh, q, ctx) })
}
