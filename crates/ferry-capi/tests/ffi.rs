//! The exported functions driven from Rust, in one process: handle misuse, settings, and a
//! connection on every driver through the C API (the C programs in tests/c cover the rest
//! across processes).

use std::ffi::{c_void, CString};
use std::ptr::null_mut;

use ferry::*;

const DRIVERS: [&str; 3] = ["tcp", "ofi+tcp", "ofi+shm"];
const T: i32 = 20_000;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Asserts `r` is -1 with errno `e`.
#[track_caller]
fn fails(r: i32, e: i32) {
    assert_eq!((r, errno()), (-1, e), "expected -1/{e}");
}

fn url(driver: &str, tag: &str) -> CString {
    CString::new(match driver {
        "ofi+shm" => format!("ofi+shm://ferry-capi-{}-{tag}", std::process::id()),
        d => format!("{d}://127.0.0.1:0"),
    })
    .unwrap()
}

/// A context value for events.
fn ctx(n: usize) -> *mut c_void {
    n as *mut c_void
}

fn sock() -> i32 {
    let s = exs_socket(libc::AF_UNSPEC, libc::SOCK_SEQPACKET, 0);
    assert!(s > 0);
    s
}

fn next(q: i32) -> exs_event_t {
    let mut ev = [exs_event_t::EMPTY];
    // SAFETY: one writable event.
    let n = unsafe { exs_qdequeue(q, ev.as_mut_ptr(), 1, T) };
    assert_eq!(n, 1, "no event within {T} ms");
    ev[0]
}

fn name(f: unsafe extern "C" fn(i32, *mut std::ffi::c_char, usize) -> i32, s: i32) -> String {
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: 256 writable bytes.
    assert_eq!(unsafe { f(s, buf.as_mut_ptr(), buf.len()) }, 0);
    // SAFETY: NUL-terminated by the call.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .unwrap()
        .to_owned()
}

#[test]
fn bad_handles_and_arguments() {
    assert_eq!(exs_init(ferry::VERSION_MAJOR << 16), 0);
    fails(exs_init(2 << 16), libc::ENOTSUP);
    fails(
        exs_socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0),
        libc::EAFNOSUPPORT,
    );
    fails(exs_socket(0, libc::SOCK_STREAM, 0), libc::EINVAL);
    fails(
        exs_socket(0, libc::SOCK_SEQPACKET, 6),
        libc::EPROTONOSUPPORT,
    );
    for bad in [-1, 0, 999_999] {
        fails(exs_close(bad), libc::EBADF);
        fails(exs_listen(bad, 1), libc::EBADF);
        fails(exs_qdelete(bad), libc::EBADF);
        fails(exs_qfd(bad), libc::EBADF);
        fails(exs_mderegister(bad), libc::EBADF);
        fails(exs_fcntl(bad, 1, 0), libc::EBADF);
        fails(
            exs_send(bad, null_mut(), 0, 0, bad, bad, null_mut()),
            libc::EBADF,
        );
    }
    let q = exs_qcreate(8);
    let s = sock();
    // Kinds do not mix.
    fails(exs_close(q), libc::EBADF);
    fails(exs_qdelete(s), libc::EBADF);
    // Not connected, not bound.
    let mut mem = vec![0u8; 64];
    // SAFETY: `mem` outlives the registration (deregistered below).
    let mh = unsafe { exs_mregister(mem.as_mut_ptr().cast(), mem.len(), 0) };
    assert!(mh > 0);
    fails(
        exs_send(s, mem.as_mut_ptr().cast(), 8, 0, mh, q, null_mut()),
        libc::ENOTCONN,
    );
    fails(exs_listen(s, 1), libc::EDESTADDRREQ);
    let bad = CString::new("nonsense://x").unwrap();
    // SAFETY: NUL-terminated strings.
    unsafe {
        fails(exs_bind(s, bad.as_ptr()), libc::EINVAL);
        fails(exs_bind(s, std::ptr::null()), libc::EFAULT);
        fails(exs_connect(s, bad.as_ptr(), q, null_mut()), libc::EINVAL);
        fails(exs_mregister(null_mut(), 8, 0), libc::EINVAL);
        fails(exs_mregister(mem.as_mut_ptr().cast(), 0, 0), libc::EINVAL);
        fails(exs_mregister(mem.as_mut_ptr().cast(), 8, 1), libc::EINVAL);
        fails(exs_qdequeue(q, null_mut(), 1, 0), libc::EFAULT);
        fails(
            exs_qdequeue(q, [exs_event_t::EMPTY].as_mut_ptr(), 0, 0),
            libc::EINVAL,
        );
        assert_eq!(exs_qdequeue(q, [exs_event_t::EMPTY].as_mut_ptr(), 1, 0), 0);
    }
    // fcntl ranges.
    assert_eq!(exs_fcntl(s, 1, 0), 16);
    fails(exs_fcntl(s, 2, 0), libc::EINVAL);
    fails(exs_fcntl(s, 2, 70_000), libc::EINVAL);
    fails(exs_fcntl(s, 6, 65_537), libc::EINVAL);
    fails(exs_fcntl(s, 8, 2), libc::EINVAL);
    fails(exs_fcntl(s, 99, 0), libc::EINVAL);
    assert_eq!(exs_fcntl(s, 2, 5), 0);
    assert_eq!(exs_fcntl(s, 1, 0), 5);
    // Poll: bad handles are NVAL, fresh sockets quiet.
    let mut fds = [
        exs_pollfd {
            fd: 999_999,
            events: libc::POLLIN,
            revents: 0,
        },
        exs_pollfd {
            fd: s,
            events: libc::POLLIN | libc::POLLOUT,
            revents: 0,
        },
        exs_pollfd {
            fd: -1,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: three writable entries.
    assert_eq!(unsafe { exs_poll(fds.as_mut_ptr(), 3, 0) }, 1);
    assert_eq!(
        (fds[0].revents, fds[1].revents, fds[2].revents),
        (libc::POLLNVAL, 0, 0)
    );
    assert_eq!(exs_close(s), 0);
    fails(exs_close(s), libc::EBADF);
    assert_eq!(exs_mderegister(mh), 0);
    fails(exs_mderegister(mh), libc::EBADF);
    assert_eq!(exs_qdelete(q), 0);
    fails(exs_qdelete(q), libc::EBADF);
}

/// A listener, a client, one message each way, names, poll, close events.
fn conversation(driver: &str) {
    let q = exs_qcreate(0);
    let l = sock();
    let u = url(driver, "conv");
    // SAFETY: NUL-terminated strings; buffers below outlive their registrations.
    unsafe {
        assert_eq!(exs_bind(l, u.as_ptr()), 0);
        assert_eq!(exs_listen(l, 4), 0);
        let addr = CString::new(name(exs_getsockname, l)).unwrap();
        let c = sock();
        assert_eq!(
            exs_fcntl(c, ferry::socket::cmd::SET_SMALL_PACKET_MAX, 16),
            0
        );
        assert_eq!(exs_connect(c, addr.as_ptr(), q, ctx(7)), 0);
        fails(exs_fcntl(c, 2, 3), libc::EISCONN);
        fails(exs_fcntl(l, 2, 3), libc::EINVAL);
        // The connection sits in the backlog: the listener is readable.
        let mut fds = [exs_pollfd {
            fd: l,
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(exs_poll(fds.as_mut_ptr(), 1, T), 1);
        assert_eq!(fds[0].revents, libc::POLLIN);
        assert_eq!(exs_accept(l, q, ctx(9)), 0);
        let (mut acc, mut con) = (None, None);
        for _ in 0..2 {
            let ev = next(q);
            assert_eq!(ev.err, 0, "{ev:?}");
            match ev.type_ {
                3 => acc = Some(ev),
                4 => con = Some(ev),
                t => panic!("unexpected event {t}"),
            }
        }
        let (acc, con) = (acc.unwrap(), con.unwrap());
        assert_eq!((acc.sock, acc.context as usize), (l, 9));
        assert_eq!((con.sock, con.context as usize), (c, 7));
        let a = acc.accepted;
        assert!(a > 0);
        assert_eq!(name(exs_getsockname, c), name(exs_getpeername, a));
        assert_eq!(name(exs_getpeername, c), name(exs_getsockname, a));
        let mut small = [0 as std::ffi::c_char; 4];
        fails(
            exs_getsockname(c, small.as_mut_ptr(), small.len()),
            libc::ERANGE,
        );

        let mut sbuf = vec![0u8; 100_000];
        for (i, b) in sbuf.iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        let mut rbuf = vec![0u8; 100_000];
        let smh = exs_mregister(sbuf.as_mut_ptr().cast(), sbuf.len(), 0);
        let rmh = exs_mregister(rbuf.as_mut_ptr().cast(), rbuf.len(), 0);
        let rptr = rbuf.as_mut_ptr().add(10);
        assert_eq!(exs_recv(a, rptr.cast(), 50_000, 0, rmh, q, ctx(1)), 0);
        // Outside the registration.
        fails(
            exs_send(
                c,
                sbuf.as_mut_ptr().add(1).cast(),
                sbuf.len(),
                0,
                smh,
                q,
                null_mut(),
            ),
            libc::EFAULT,
        );
        fails(
            exs_send(c, sbuf.as_mut_ptr().cast(), 8, 4, smh, q, null_mut()),
            libc::EINVAL,
        );
        let sptr = sbuf.as_mut_ptr().add(5);
        assert_eq!(exs_send(c, sptr.cast(), 40_000, 0, smh, q, ctx(2)), 0);
        fails(exs_mderegister(smh), libc::EBUSY);
        for _ in 0..2 {
            let ev = next(q);
            assert_eq!(ev.err, 0, "{ev:?}");
            match ev.type_ {
                1 => assert_eq!(
                    (ev.sock, ev.buf, ev.len, ev.context as usize),
                    (c, sptr.cast(), 40_000, 2)
                ),
                2 => assert_eq!(
                    (ev.sock, ev.buf, ev.len, ev.context as usize),
                    (a, rptr.cast(), 40_000, 1)
                ),
                t => panic!("unexpected event {t}"),
            }
        }
        assert!(rbuf[10..40_010] == sbuf[5..40_005]);
        assert_eq!(exs_mderegister(smh), 0);

        // Close: the peer sees a close event; ours follows too.
        assert_eq!(exs_close(c), 0);
        fails(exs_close(c), libc::EBADF);
        let mut closes = vec![];
        for _ in 0..2 {
            let ev = next(q);
            assert_eq!(ev.type_, 6, "{ev:?}");
            closes.push((ev.sock, ev.err));
        }
        closes.sort();
        assert!(closes.iter().any(|&(s, e)| s == c && e == 0), "{closes:?}");
        assert!(closes.iter().any(|&(s, _)| s == a), "{closes:?}");
        let mut fds = [exs_pollfd {
            fd: a,
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(exs_poll(fds.as_mut_ptr(), 1, 0), 1);
        assert_eq!(fds[0].revents & libc::POLLHUP, libc::POLLHUP);
        assert_eq!(exs_close(a), 0);
        assert_eq!(exs_mderegister(rmh), 0);

        // A pending accept fails with ECANCELED when its listener closes.
        assert_eq!(exs_accept(l, q, ctx(3)), 0);
        assert_eq!(exs_close(l), 0);
        let ev = next(q);
        assert_eq!(
            (ev.type_, ev.sock, ev.err, ev.context as usize),
            (3, l, libc::ECANCELED, 3)
        );
        assert_eq!(exs_qdelete(q), 0);
    }
}

#[test]
fn conversation_tcp() {
    conversation(DRIVERS[0]);
}

#[test]
fn conversation_ofi_tcp() {
    conversation(DRIVERS[1]);
}

#[test]
fn conversation_ofi_shm() {
    conversation(DRIVERS[2]);
}

#[test]
fn connect_refused_reports_an_event_and_may_retry() {
    let q = exs_qcreate(0);
    let s = sock();
    let u = CString::new("tcp://127.0.0.1:1").unwrap();
    // SAFETY: NUL-terminated string.
    let again = unsafe {
        assert_eq!(exs_connect(s, u.as_ptr(), q, null_mut()), 0);
        exs_connect(s, u.as_ptr(), q, null_mut())
    };
    // EALREADY while the first attempt runs; a refusal can be that fast, though, and then
    // the second attempt was accepted and reports its own event.
    if again == 0 {
        assert_ne!(next(q).err, 0);
    } else {
        fails(again, libc::EALREADY);
    }
    let ev = next(q);
    assert_eq!((ev.type_, ev.sock), (4, s));
    assert_ne!(ev.err, 0);
    let mut fds = [exs_pollfd {
        fd: s,
        events: 0,
        revents: 0,
    }];
    // SAFETY: one writable entry.
    assert_eq!(unsafe { exs_poll(fds.as_mut_ptr(), 1, 0) }, 1);
    assert_eq!(fds[0].revents, libc::POLLERR);
    // SAFETY: as above.
    unsafe {
        assert_eq!(exs_connect(s, u.as_ptr(), q, null_mut()), 0);
    }
    assert_ne!(next(q).err, 0);
    assert_eq!(exs_close(s), 0);
    assert_eq!(exs_qdelete(q), 0);
}

/// Memory held by an operation whose queue was deleted is released when its socket closes
/// (the event dies with the queue), so exs_mderegister does not stay EBUSY forever.
#[test]
fn deleted_queue_releases_memory_at_close() {
    let q = exs_qcreate(0);
    let l = sock();
    let u = url("tcp", "lost");
    // SAFETY: NUL-terminated strings; `mem` outlives its registration.
    unsafe {
        assert_eq!(exs_bind(l, u.as_ptr()), 0);
        assert_eq!(exs_listen(l, 1), 0);
        let addr = CString::new(name(exs_getsockname, l)).unwrap();
        let c = sock();
        assert_eq!(exs_connect(c, addr.as_ptr(), q, null_mut()), 0);
        assert_eq!(exs_accept(l, q, null_mut()), 0);
        let mut a = -1;
        for _ in 0..2 {
            let ev = next(q);
            assert_eq!(ev.err, 0);
            if ev.type_ == 3 {
                a = ev.accepted;
            }
        }
        let lost = exs_qcreate(0);
        let mut mem = vec![0u8; 4096];
        let mh = exs_mregister(mem.as_mut_ptr().cast(), mem.len(), 0);
        assert_eq!(
            exs_recv(a, mem.as_mut_ptr().cast(), 4096, 0, mh, lost, null_mut()),
            0
        );
        assert_eq!(exs_qdelete(lost), 0);
        fails(exs_mderegister(mh), libc::EBUSY);
        assert_eq!(exs_close(a), 0);
        assert_eq!(exs_mderegister(mh), 0);
        assert_eq!(exs_close(c), 0);
        assert_eq!(exs_close(l), 0);
        assert_eq!(exs_qdelete(q), 0);
    }
}

/// exs_sendv / exs_recvv on every driver: scattered segments both ways (and plain exs_send
/// into exs_recvv), overlap and out-of-registration refusals, truncation.
#[test]
fn vectored_send_and_recv() {
    for driver in DRIVERS {
        let q = exs_qcreate(0);
        let l = sock();
        let u = url(driver, "vec");
        // SAFETY: NUL-terminated strings; the buffers outlive their registrations and every
        // operation on them completes before they are read or dropped.
        unsafe {
            assert_eq!(exs_bind(l, u.as_ptr()), 0);
            assert_eq!(exs_listen(l, 4), 0);
            let addr = CString::new(name(exs_getsockname, l)).unwrap();
            let c = sock();
            assert_eq!(exs_connect(c, addr.as_ptr(), q, ctx(7)), 0);
            assert_eq!(exs_accept(l, q, ctx(9)), 0);
            let mut a = -1;
            for _ in 0..2 {
                let ev = next(q);
                assert_eq!(ev.err, 0, "{ev:?}");
                if ev.type_ == 3 {
                    a = ev.accepted;
                }
            }
            assert!(a > 0);
            let mut sbuf: Vec<u8> = (0..300_000).map(|i| (i * 13 % 251) as u8).collect();
            let mut rbuf = vec![0u8; 300_000];
            let smh = exs_mregister(sbuf.as_mut_ptr().cast(), sbuf.len(), 0);
            let rmh = exs_mregister(rbuf.as_mut_ptr().cast(), rbuf.len(), 0);
            let sp = sbuf.as_mut_ptr();
            let rp = rbuf.as_mut_ptr();
            let iov = |p: *mut u8, at: usize, len: usize| exs_iovec {
                iov_base: p.add(at).cast(),
                iov_len: len,
            };
            // Refusals: overlapping receive segments, a segment outside the registration.
            let overlap = [iov(rp, 0, 100), iov(rp, 50, 100)];
            fails(
                exs_recvv(a, overlap.as_ptr(), 2, rmh, q, null_mut()),
                libc::EINVAL,
            );
            let outside = [iov(rp, 299_990, 100)];
            fails(
                exs_recvv(a, outside.as_ptr(), 1, rmh, q, null_mut()),
                libc::EFAULT,
            );
            fails(
                exs_sendv(c, outside.as_ptr(), -1, smh, q, null_mut()),
                libc::EINVAL,
            );
            // 100 000 bytes from three scattered segments into two, in list order.
            let riov = [iov(rp, 200_000, 60_000), iov(rp, 1_000, 40_000)];
            assert_eq!(exs_recvv(a, riov.as_ptr(), 2, rmh, q, ctx(1)), 0);
            let siov = [
                iov(sp, 150_000, 30_000),
                iov(sp, 10, 50_000),
                iov(sp, 90_000, 20_000),
            ];
            assert_eq!(exs_sendv(c, siov.as_ptr(), 3, smh, q, ctx(2)), 0);
            for _ in 0..2 {
                let ev = next(q);
                assert_eq!((ev.err, ev.len), (0, 100_000), "{ev:?}");
                match ev.context as usize {
                    1 => assert_eq!(ev.buf, riov[0].iov_base),
                    2 => assert_eq!(ev.buf, siov[0].iov_base),
                    n => panic!("unexpected context {n}"),
                }
            }
            let stream: Vec<u8> = [
                &sbuf[150_000..180_000],
                &sbuf[10..50_010],
                &sbuf[90_000..110_000],
            ]
            .concat();
            assert_eq!(&rbuf[200_000..260_000], &stream[..60_000]);
            assert_eq!(&rbuf[1_000..41_000], &stream[60_000..]);
            assert!(rbuf[..1_000].iter().all(|&b| b == 0));
            assert!(rbuf[41_000..200_000].iter().all(|&b| b == 0));
            // A plain send larger than the segments: truncated, nothing outside written.
            rbuf.fill(0);
            let small = [iov(rp, 500, 10), iov(rp, 100, 10)];
            assert_eq!(exs_recvv(a, small.as_ptr(), 2, rmh, q, ctx(3)), 0);
            assert_eq!(exs_send(c, sp.cast(), 1000, 0, smh, q, ctx(4)), 0);
            for _ in 0..2 {
                let ev = next(q);
                match ev.context as usize {
                    3 => assert_eq!((ev.err, ev.len), (libc::EMSGSIZE, 20), "{ev:?}"),
                    4 => assert_eq!(ev.err, 0, "{ev:?}"),
                    n => panic!("unexpected context {n}"),
                }
            }
            assert_eq!(&rbuf[500..510], &sbuf[..10]);
            assert_eq!(&rbuf[100..110], &sbuf[10..20]);
            assert_eq!(
                rbuf.iter().filter(|&&b| b != 0).count(),
                20 - sbuf[..20].iter().filter(|&&b| b == 0).count()
            );
            assert_eq!(exs_close(c), 0);
            assert_eq!(exs_close(a), 0);
            assert_eq!(exs_close(l), 0);
            while exs_qdequeue(q, [exs_event_t::EMPTY].as_mut_ptr(), 1, 200) > 0 {}
            assert_eq!(exs_mderegister(smh), 0);
            assert_eq!(exs_mderegister(rmh), 0);
            assert_eq!(exs_qdelete(q), 0);
        }
    }
}
