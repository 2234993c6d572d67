//! Process signal dispositions `ferry serve` needs before it installs its own handlers.

/// Puts SIGTERM and SIGINT back to their default disposition.
///
/// libfabric pulls in libinfinipath (its psm provider), whose load-time constructor installs
/// handlers for SIGTERM and SIGINT that print a backtrace and `exit(1)`. signal-hook chains
/// to whatever handler was there before it, so without this the first SIGTERM would end the
/// server before it could drain and journal its transfers.
pub fn reset_term_signals() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: `signal` with SIG_DFL installs no code of ours as a handler and touches no
        // memory; it only replaces the disposition of these two signals, on the main thread,
        // before signal-hook registers its handlers (which then chain to the default, i.e.
        // to nothing).
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
}
