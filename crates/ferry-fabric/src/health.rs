//! Driver health through the generic API: how a driver that got stuck for good says so, and
//! how a process chooses what to do then, without naming the driver.
//!
//! A driver whose provider can hang inside a call that never returns (libfabric 1.17's shm,
//! spinning on a lock a killed peer held: `drivers/ofi/wedge.rs`) detects it, fails every
//! operation of the stuck domain with [`FabricError::Wedged`], and raises the verdict here
//! once per process. The process sees it through [`health()`], and through the hook it
//! installed with [`on_unrecoverable`]; a CLI exits there with [`exit_now`], because nothing
//! short of a restart makes the provider usable again (`docs/fabric.md`, "wedge").
//!
//! [`FabricError::Wedged`]: crate::FabricError::Wedged

use std::sync::OnceLock;

/// How this process's fabric drivers stand ([`health()`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// No driver is stuck.
    Ok,
    /// A driver is stuck for good: one of its calls will never return, its domains fail
    /// every operation with [`crate::FabricError::Wedged`], and no new domain of it opens in
    /// this process. The process must restart to use that driver again. The text says which
    /// driver and why.
    Unrecoverable(String),
}

/// The first unrecoverable verdict of this process.
static VERDICT: OnceLock<String> = OnceLock::new();
/// Run once, with the verdict, when the first one is raised.
static HOOK: OnceLock<fn(&str)> = OnceLock::new();

/// How this process's fabric drivers stand: [`Health::Unrecoverable`] from the first time a
/// driver got stuck for good, on.
pub fn health() -> Health {
    match VERDICT.get() {
        Some(why) => Health::Unrecoverable(why.clone()),
        None => Health::Ok,
    }
}

/// Installs `hook`, run with the verdict's text when a driver of this process first gets
/// stuck for good (on the thread that noticed: a driver's watchdog). A process that cannot
/// carry on without the driver exits there with [`exit_now`]. Only the first hook installed
/// counts; install it before opening domains.
pub fn on_unrecoverable(hook: fn(&str)) {
    let _ = HOOK.set(hook);
}

/// Ends the process with `code` at once: stdout and stderr are flushed and the drivers'
/// names in shared memory unlinked, but exit handlers and destructors do not run, because a
/// stuck provider's own cleanup at exit would spin like its stuck thread. For the hook
/// installed with [`on_unrecoverable`].
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // Never block here: the thread that registers may be the stuck one.
    if let Ok(cleanups) = BEFORE_EXIT.try_lock() {
        for cleanup in cleanups.iter() {
            cleanup();
        }
    }
    crate::sys::exit_immediately(code)
}

/// Cleanups [`exit_now`] runs before it exits (a driver's: unlinking its names in shared
/// memory), since it skips the process's exit handlers.
static BEFORE_EXIT: std::sync::Mutex<Vec<fn()>> = std::sync::Mutex::new(Vec::new());

/// Registers `cleanup` to run in [`exit_now`]; a driver calls it once.
pub(crate) fn before_exit_now(cleanup: fn()) {
    if let Ok(mut cleanups) = BEFORE_EXIT.lock() {
        cleanups.push(cleanup);
    }
}

/// A driver declares itself stuck for good, with why: the first verdict of the process is
/// kept and runs the hook; later ones are only logged by their drivers.
pub(crate) fn raise_unrecoverable(why: &str) {
    if VERDICT.set(why.to_owned()).is_ok() {
        if let Some(hook) = HOOK.get() {
            hook(why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    static HOOK_RUNS: AtomicUsize = AtomicUsize::new(0);

    fn count(why: &str) {
        assert_eq!(why, "stuck");
        HOOK_RUNS.fetch_add(1, SeqCst);
    }

    /// The first verdict is kept and runs the hook once; the first hook installed counts.
    /// (The only test of this process that raises one: the state is process-wide.)
    #[test]
    fn the_first_verdict_is_kept_and_runs_the_hook_once() {
        assert_eq!(health(), Health::Ok);
        on_unrecoverable(count);
        on_unrecoverable(|_| panic!("a second hook must not replace the first"));
        raise_unrecoverable("stuck");
        raise_unrecoverable("stuck again");
        assert_eq!(health(), Health::Unrecoverable("stuck".into()));
        assert_eq!(HOOK_RUNS.load(SeqCst), 1);
    }
}
