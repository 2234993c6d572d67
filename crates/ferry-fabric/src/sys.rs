//! libc calls that belong to no driver.

/// Ends the process with `code` at once: no exit handlers, no destructors, no flushing.
pub(crate) fn exit_immediately(code: i32) -> ! {
    // SAFETY: _exit takes no pointers and never returns; skipping destructors is the point.
    unsafe { libc::_exit(code) }
}
