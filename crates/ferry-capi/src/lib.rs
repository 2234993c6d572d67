//! libferry: the C face of ferry's Extended Sockets (EXS), the ES-API / UNH-EXS calls over
//! the Rust runtime in `ferry-exs`. The contract is `include/ferry/exs.h`; this crate keeps
//! to it and is the only place EXS has `unsafe` (each block says why it holds).
//!
//! Every exported function runs inside [`guard`]: a Rust panic never crosses into C, it
//! becomes -1 with errno EIO. Failures are -1 (or an invalid handle) and `errno`.
//!
//! Modules: [`handle`] (the fd-like handle table), [`socket`] (socket life cycle, listener
//! and connect threads), [`queue`] (C event queues, event conversion), [`mem`] (memory
//! registrations, registered lazily per fabric domain).

#![deny(unsafe_op_in_unsafe_fn)]

pub mod error;
pub mod handle;
pub mod mem;
pub mod queue;
pub mod socket;
pub mod vec;

pub use vec::{exs_iovec, exs_recvv, exs_sendv};

use std::ffi::{c_char, c_int, c_long, c_short, c_void, CStr};
use std::os::fd::{FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use ferry_exs::proto::Flags;
use ferry_exs::runtime::ExsBuf;

use crate::error::{set_errno, Errno, Res};
use crate::handle::Obj;
use crate::queue::{op_forget, op_token, OpRec, Queue};

/// The ABI version this library implements (`EXS_VERSION_MAJOR`/`MINOR` in exs.h).
pub const VERSION_MAJOR: c_int = 1;
pub const VERSION_MINOR: c_int = 0;

/// `exs_event_t`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct exs_event_t {
    pub type_: c_int,
    pub sock: c_int,
    pub accepted: c_int,
    pub err: c_int,
    pub buf: *mut c_void,
    pub len: usize,
    pub context: *mut c_void,
}

impl exs_event_t {
    /// An all-empty event (for callers' arrays).
    pub const EMPTY: exs_event_t = exs_event_t {
        type_: 0,
        sock: -1,
        accepted: -1,
        err: 0,
        buf: std::ptr::null_mut(),
        len: 0,
        context: std::ptr::null_mut(),
    };
}

/// `struct exs_pollfd`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct exs_pollfd {
    pub fd: c_int,
    pub events: c_short,
    pub revents: c_short,
}

/// Runs an exported call: its value, or `fail` with errno set from the error, or EIO if it
/// panicked (the panic stops here).
fn guard<T>(fail: T, f: impl FnOnce() -> Res<T>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_errno(e);
            fail
        }
        Err(_) => {
            set_errno(Errno(libc::EIO));
            fail
        }
    }
}

fn status(f: impl FnOnce() -> Res<()>) -> c_int {
    guard(-1, || f().map(|()| 0))
}

/// Reads a NUL-terminated UTF-8 string (EFAULT if NULL, EINVAL if not UTF-8).
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
unsafe fn text<'a>(p: *const c_char) -> Res<&'a str> {
    if p.is_null() {
        return Err(Errno::FAULT);
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| Errno::INVAL)
}

fn millis(timeout_ms: c_int) -> Option<Duration> {
    u64::try_from(timeout_ms).ok().map(Duration::from_millis)
}

/// `exs_init`: checks that the program was built against a compatible header.
#[no_mangle]
pub extern "C" fn exs_init(version: c_int) -> c_int {
    status(|| {
        let (major, minor) = (version >> 16, version & 0xffff);
        if major != VERSION_MAJOR || minor > VERSION_MINOR {
            return Err(Errno(libc::ENOTSUP));
        }
        Ok(())
    })
}

/// `exs_socket`.
#[no_mangle]
pub extern "C" fn exs_socket(domain: c_int, type_: c_int, protocol: c_int) -> c_int {
    guard(-1, || {
        if ![libc::AF_UNSPEC, libc::AF_INET, libc::AF_INET6].contains(&domain) {
            return Err(Errno(libc::EAFNOSUPPORT));
        }
        if type_ != libc::SOCK_SEQPACKET {
            return Err(Errno::INVAL);
        }
        if protocol != 0 {
            return Err(Errno(libc::EPROTONOSUPPORT));
        }
        socket::create()
    })
}

/// `exs_bind`.
///
/// # Safety
/// `url` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn exs_bind(sock: c_int, url: *const c_char) -> c_int {
    // SAFETY: per this function's contract.
    status(|| socket::bind(sock, unsafe { text(url) }?))
}

/// `exs_listen`.
#[no_mangle]
pub extern "C" fn exs_listen(sock: c_int, backlog: c_int) -> c_int {
    status(|| socket::listen(sock, backlog))
}

/// `exs_accept`.
#[no_mangle]
pub extern "C" fn exs_accept(sock: c_int, q: c_int, ctx: *mut c_void) -> c_int {
    status(|| {
        let q = handle::queue(q)?;
        socket::accept(sock, q, ctx as usize)
    })
}

/// `exs_connect`.
///
/// # Safety
/// `url` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn exs_connect(
    sock: c_int,
    url: *const c_char,
    q: c_int,
    ctx: *mut c_void,
) -> c_int {
    status(|| {
        // SAFETY: per this function's contract.
        let url = unsafe { text(url) }?;
        let q = handle::queue(q)?;
        socket::connect(sock, url, q, ctx as usize)
    })
}

/// The flags of an operation (EINVAL for bits other than EXS_PERSISTENT | EXS_NOTIFY_ON_READ;
/// their combinations are checked by the protocol and reported in the completion event).
fn op_flags(flags: c_int) -> Res<u32> {
    u32::try_from(flags)
        .ok()
        .filter(|f| f & !(Flags::PERSISTENT.0 | Flags::NOTIFY_ON_READ.0) == 0)
        .ok_or(Errno::INVAL)
}

/// Posts a send or recv of `buf..buf + len` (inside registration `mh`).
#[allow(clippy::too_many_arguments)]
fn post(
    send: bool,
    sock: c_int,
    buf: *mut c_void,
    len: usize,
    offset: u64,
    flags: c_int,
    mh: c_int,
    q: c_int,
    ctx: *mut c_void,
) -> Res<()> {
    let s = handle::sock(sock)?;
    let mem = handle::mem(mh)?;
    let q = handle::queue(q)?;
    let flags = op_flags(flags)?;
    let exs = s.connected()?;
    let range = mem.range(buf as usize, len)?;
    let xb = ExsBuf::new(mem.region(&s, &exs)?).slice(range)?;
    let token = op_token(OpRec {
        sock,
        ctx: ctx as usize,
        buf: buf as usize,
    });
    if send {
        exs.send_to(Some(&q.rt), xb, offset, Flags(flags), token);
    } else {
        exs.recv_to(Some(&q.rt), xb, offset, Flags(flags), token);
    }
    Ok(())
}

/// `exs_send`.
#[no_mangle]
pub extern "C" fn exs_send(
    sock: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    mh: c_int,
    q: c_int,
    ctx: *mut c_void,
) -> c_int {
    status(|| post(true, sock, buf, len, 0, flags, mh, q, ctx))
}

/// `exs_recv`.
#[no_mangle]
pub extern "C" fn exs_recv(
    sock: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    mh: c_int,
    q: c_int,
    ctx: *mut c_void,
) -> c_int {
    status(|| post(false, sock, buf, len, 0, flags, mh, q, ctx))
}

/// `exs_send_offset`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn exs_send_offset(
    sock: c_int,
    buf: *mut c_void,
    len: usize,
    offset: u64,
    flags: c_int,
    mh: c_int,
    q: c_int,
    ctx: *mut c_void,
) -> c_int {
    status(|| post(true, sock, buf, len, offset, flags, mh, q, ctx))
}

/// `exs_recv_offset`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn exs_recv_offset(
    sock: c_int,
    buf: *mut c_void,
    len: usize,
    offset: u64,
    flags: c_int,
    mh: c_int,
    q: c_int,
    ctx: *mut c_void,
) -> c_int {
    status(|| post(false, sock, buf, len, offset, flags, mh, q, ctx))
}

/// `exs_sendfile`.
#[no_mangle]
pub extern "C" fn exs_sendfile(
    sock: c_int,
    fd: c_int,
    offset: libc::off_t,
    len: usize,
    flags: c_int,
    q: c_int,
    ctx: *mut c_void,
) -> c_int {
    status(|| {
        let s = handle::sock(sock)?;
        let q = handle::queue(q)?;
        let flags = op_flags(flags)?;
        let offset = u64::try_from(offset).map_err(|_| Errno::INVAL)?;
        let exs = s.connected()?;
        // SAFETY: F_DUPFD_CLOEXEC only reads the descriptor table; a bad fd fails with EBADF.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(Errno::from(std::io::Error::last_os_error()));
        }
        // SAFETY: `dup` is a descriptor just made for us, owned by nothing else.
        let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(dup) });
        let token = op_token(OpRec {
            sock,
            ctx: ctx as usize,
            buf: 0,
        });
        exs.sendfile(Some(&q.rt), &file, offset, len as u64, Flags(flags), token)
            .inspect_err(|_| op_forget(token))?;
        Ok(())
    })
}

/// The most entries `exs_poll` takes: RLIMIT_NOFILE's soft limit, as poll(2) does.
fn poll_limit() -> libc::nfds_t {
    let cur = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    cur.map_or(libc::nfds_t::MAX, |c| {
        libc::nfds_t::try_from(c).unwrap_or(libc::nfds_t::MAX)
    })
}

/// `exs_poll`.
///
/// # Safety
/// `fds` points to `nfds` writable `exs_pollfd`s (or `nfds` is 0).
#[no_mangle]
pub unsafe extern "C" fn exs_poll(
    fds: *mut exs_pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    guard(-1, || {
        let n = usize::try_from(nfds).map_err(|_| Errno::INVAL)?;
        // poll(2)'s rule: more entries than the process may have descriptors is EINVAL, and
        // nothing is read. (A count merely larger than the caller's array cannot be seen.)
        if nfds > poll_limit() {
            return Err(Errno::INVAL);
        }
        let fds: &mut [exs_pollfd] = if n == 0 {
            &mut []
        } else if fds.is_null() {
            return Err(Errno::FAULT);
        } else {
            // SAFETY: non-null, and `nfds` writable entries per this function's contract.
            unsafe { std::slice::from_raw_parts_mut(fds, n) }
        };
        let deadline = millis(timeout).map(|t| std::time::Instant::now() + t);
        let mut nap = Duration::from_micros(50);
        loop {
            let mut ready = 0;
            for p in fds.iter_mut() {
                p.revents = if p.fd < 0 {
                    0
                } else {
                    use socket::pollbits::*;
                    let all = match handle::get(p.fd) {
                        Some(Obj::Sock(s)) => s.revents(),
                        Some(Obj::Queue(q)) => {
                            if q.has_events() {
                                IN
                            } else {
                                0
                            }
                        }
                        _ => NVAL,
                    };
                    all & (p.events | ERR | HUP | NVAL)
                };
                ready += c_int::from(p.revents != 0);
            }
            if ready > 0 || deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(ready);
            }
            let mut sleep = nap;
            if let Some(d) = deadline {
                sleep = sleep.min(d.saturating_duration_since(std::time::Instant::now()));
            }
            std::thread::sleep(sleep);
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    })
}

/// `exs_fcntl`.
#[no_mangle]
pub extern "C" fn exs_fcntl(sock: c_int, cmd: c_int, arg: c_long) -> c_int {
    // `long` is 32 bits on some targets.
    #[allow(clippy::useless_conversion)]
    guard(-1, || socket::fcntl(sock, cmd, i64::from(arg)))
}

/// `exs_close`.
#[no_mangle]
pub extern "C" fn exs_close(sock: c_int) -> c_int {
    status(|| socket::close(sock))
}

/// Copies `name` with a NUL into `buf` of `len` bytes (ERANGE if it does not fit).
///
/// # Safety
/// `buf` is NULL or points to `len` writable bytes.
unsafe fn copy_name(name: &str, buf: *mut c_char, len: usize) -> Res<()> {
    if buf.is_null() {
        return Err(Errno::FAULT);
    }
    if name.len() >= len {
        return Err(Errno(libc::ERANGE));
    }
    // SAFETY: `buf` has `len` > name.len() writable bytes per the caller's contract.
    let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), name.len() + 1) };
    out[..name.len()].copy_from_slice(name.as_bytes());
    out[name.len()] = 0;
    Ok(())
}

/// `exs_getsockname`.
///
/// # Safety
/// `buf` is NULL or points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn exs_getsockname(sock: c_int, buf: *mut c_char, len: usize) -> c_int {
    // SAFETY: per this function's contract.
    status(|| unsafe { copy_name(&socket::sockname(sock)?, buf, len) })
}

/// `exs_getpeername`.
///
/// # Safety
/// `buf` is NULL or points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn exs_getpeername(sock: c_int, buf: *mut c_char, len: usize) -> c_int {
    // SAFETY: per this function's contract.
    status(|| unsafe { copy_name(&socket::peername(sock)?, buf, len) })
}

/// `exs_qcreate`.
#[no_mangle]
pub extern "C" fn exs_qcreate(depth: c_int) -> c_int {
    guard(-1, || {
        if depth < 0 {
            return Err(Errno::INVAL);
        }
        handle::insert(Obj::Queue(Arc::new(Queue::new()?)))
    })
}

/// `exs_qdequeue`.
///
/// # Safety
/// `evs` points to `max` writable `exs_event_t`s.
#[no_mangle]
pub unsafe extern "C" fn exs_qdequeue(
    q: c_int,
    evs: *mut exs_event_t,
    max: c_int,
    timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        let q = handle::queue(q)?;
        let max = usize::try_from(max)
            .ok()
            .filter(|&m| m > 0)
            .ok_or(Errno::INVAL)?;
        if evs.is_null() {
            return Err(Errno::FAULT);
        }
        let got = q.dequeue(max, millis(timeout_ms))?;
        // SAFETY: non-null with `max` writable entries per this function's contract;
        // got.len() <= max.
        let out = unsafe { std::slice::from_raw_parts_mut(evs, got.len()) };
        for (o, e) in out.iter_mut().zip(&got) {
            *o = exs_event_t {
                type_: e.kind,
                sock: e.sock,
                accepted: e.accepted,
                err: e.err,
                buf: e.buf as *mut c_void,
                len: e.len,
                context: e.ctx as *mut c_void,
            };
        }
        Ok(got.len() as c_int)
    })
}

/// `exs_qdelete`.
#[no_mangle]
pub extern "C" fn exs_qdelete(q: c_int) -> c_int {
    status(|| {
        if let Obj::Queue(q) = handle::remove_if(q, |o| matches!(o, Obj::Queue(_)))? {
            q.delete();
        }
        Ok(())
    })
}

/// `exs_qfd`.
#[no_mangle]
pub extern "C" fn exs_qfd(q: c_int) -> c_int {
    guard(-1, || Ok(handle::queue(q)?.fd()))
}

/// `exs_mregister`.
///
/// # Safety
/// `addr..addr + len` is valid for reads and writes and stays allocated until
/// `exs_mderegister` of the returned handle succeeds.
#[no_mangle]
pub unsafe extern "C" fn exs_mregister(addr: *mut c_void, len: usize, flags: c_int) -> c_int {
    guard(-1, || {
        if flags != 0 {
            return Err(Errno::INVAL);
        }
        // SAFETY: the memory contract is this function's.
        let m = unsafe { mem::Mem::new(addr.cast(), len) }?;
        handle::insert(Obj::Mem(Arc::new(m)))
    })
}

/// `exs_mderegister`.
#[no_mangle]
pub extern "C" fn exs_mderegister(mh: c_int) -> c_int {
    status(|| {
        handle::mem(mh)?.deregister()?;
        handle::remove_if(mh, |o| matches!(o, Obj::Mem(_))).map(drop)
    })
}
