//! libc calls that belong to no driver.

/// Ends the process with `code` at once: no exit handlers, no destructors, no flushing.
pub(crate) fn exit_immediately(code: i32) -> ! {
    // SAFETY: _exit takes no pointers and never returns; skipping destructors is the point.
    unsafe { libc::_exit(code) }
}

/// The smallest round trip TCP measured on the connected socket `fd` (`TCP_INFO`'s
/// `tcpi_min_rtt`, kept by the kernel from the handshake on), or `None` if the socket gives
/// none (not TCP, or no sample yet). The kernel times segments against their
/// acknowledgements as they arrive, so a busy process does not lengthen it.
pub(crate) fn tcp_min_rtt(fd: std::os::fd::BorrowedFd<'_>) -> Option<std::time::Duration> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero tcp_info is a valid value (plain integers).
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` and `len` are live and writable for the call, `len` holds the size of
    // `info`, and the kernel writes at most `len` bytes; `fd` is borrowed, so open.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    // Kernels older than 4.6 have no tcpi_min_rtt: a shorter answer, which leaves it 0.
    (rc == 0 && info.tcpi_min_rtt > 0 && info.tcpi_min_rtt != u32::MAX)
        .then(|| std::time::Duration::from_micros(u64::from(info.tcpi_min_rtt)))
}
