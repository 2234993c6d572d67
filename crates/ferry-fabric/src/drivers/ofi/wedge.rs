//! Detecting a provider that is stuck for good, and failing loudly instead of hanging.
//!
//! libfabric 1.17's shm keeps each endpoint's command queue in a shared-memory region guarded
//! by a process-shared spinlock (`smr_region.lock`, a `pthread_spin_lock`): the owner takes
//! its own when its progress (inside `fi_cq_read`) consumes commands, and a sender takes the
//! *peer's* (`pthread_spin_lock(&peer_smr->lock)` in shm's `smr_generic_sendmsg`,
//! `smr_generic_rma` — held across the CMA copy of the fast RMA path — `smr_send_name` and
//! the atomics) to insert a command. A process `kill -9`ed while holding one leaves every
//! other process that touches that region spinning inside the provider forever; the stuck
//! thread cannot be interrupted. (Source read in the shm provider; the hangs themselves were
//! observed in the kill tests, not reproduced while this was written.)
//!
//! So every provider call of a domain is marked ([`Watch`]); a watchdog thread (one per
//! process) looks every [`PERIOD`] and, when a call has not returned for the domain's limit
//! (`FERRY_OFI_WEDGE_TIMEOUT` seconds, default [`WEDGE_TIMEOUT`]), marks the domain wedged:
//! its connections fail with [`wedged_error`] (`FabricError::Wedged`), every later call on
//! it fails at once, new domains of the same provider cannot be opened in this process, and
//! the verdict is raised through the generic API ([`crate::health()`]: the hook installed with
//! [`crate::on_unrecoverable`] runs, and the CLI exits there: the process must restart to
//! use the provider again). Wedged domains are leaked, never closed under the stuck thread.
//!
//! The verdict is "calls are in progress and none has returned for the limit", exact where
//! calls are funnelled one thread at a time (shm, `gate.rs`). Only there is it kept: where
//! threads call a provider concurrently (tcp;ofi_rxm) a stuck call would go unnoticed while
//! other calls keep returning, and the counter's cache line would move between threads
//! polling at once (cost: docs/fabric.md, "A peer killed inside shm"). The time is
//! measured by the watchdog's own looks, so a process stopped (SIGSTOP) or starved longer
//! than [`STALE`] starts counting again instead of declaring a wedge.
//!
//! A pause is not a death: a peer stopped (SIGSTOP) while holding a lock leaves our calls
//! spinning just like a dead one, but only until it continues. So while a call is stuck, the
//! watchdog also looks at the owners of the shm regions this process maps (its own and its
//! peers', [`a_region_owner_stopped`]): while one of them is a stopped process, the count
//! starts again. The keepalive asks the same of a silent peer ([`peer_stopped`]).

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use super::domain::Shared;
use super::lock;
use crate::error::FabricError;

/// How long a provider call may run before its domain is declared wedged, unless
/// `FERRY_OFI_WEDGE_TIMEOUT` (seconds, fractions allowed) says otherwise. Longer than the
/// longest legitimate call (an shm RMA copy takes milliseconds; -FI_EAGAIN retries return
/// between attempts).
pub const WEDGE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the watchdog looks.
const PERIOD: Duration = Duration::from_millis(250);
/// A longer gap between two looks means the watchdog did not run meanwhile.
const STALE: Duration = Duration::from_secs(2);

/// What a wedged domain's operations fail with.
pub const WEDGE_MESSAGE: &str = "the libfabric provider is wedged: a peer process died while \
    holding a lock in shared memory (libfabric 1.17 shm); this process must restart to use it again";

/// The error of every operation on a wedged domain.
pub fn wedged_error() -> FabricError {
    FabricError::Wedged(WEDGE_MESSAGE.into())
}

/// The domain's limit from the environment.
pub(super) fn timeout_from_env() -> Duration {
    std::env::var("FERRY_OFI_WEDGE_TIMEOUT")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .filter(|d| !d.is_zero())
        .unwrap_or(WEDGE_TIMEOUT)
}

/// Watches the provider calls of one domain: "wedged" means that calls are in progress and
/// none has returned for the limit. The hot path reads no clock (one counter of threads
/// inside, one of calls returned); the watchdog samples both and times how long nothing
/// returned.
pub(super) struct Watch {
    /// False: nothing is counted (providers called concurrently, see the module doc).
    enabled: bool,
    /// Threads inside a provider call.
    inside: AtomicUsize,
    /// Calls returned so far (only its changes matter).
    done: AtomicU64,
    /// The watchdog's last sample: calls returned then, when that count was first seen,
    /// and when the watchdog last looked.
    seen: Mutex<Option<(u64, Instant, Instant)>>,
}

/// A provider call in progress; leaving counts it returned.
pub(super) struct InCall<'a>(&'a Watch);

impl Watch {
    /// A watch with no call in progress; a disabled one counts nothing and never fires.
    pub fn new(enabled: bool) -> Watch {
        Watch {
            enabled,
            inside: AtomicUsize::new(0),
            done: AtomicU64::new(0),
            seen: Mutex::new(None),
        }
    }

    /// Marks a provider call as in progress until the guard drops.
    pub fn enter(&self) -> InCall<'_> {
        if self.enabled {
            self.inside.fetch_add(1, SeqCst);
        }
        InCall(self)
    }

    /// How long calls have been in progress with none returning, as seen by the calls of
    /// this method (zero at the first sight). A gap between two looks longer than
    /// [`STALE`] (the watchdog itself did not run: the process was stopped, or starved)
    /// starts the count again rather than blaming the provider.
    pub fn stuck_for(&self) -> Option<Duration> {
        let mut seen = lock(&self.seen);
        let done = self.done.load(SeqCst);
        if self.inside.load(SeqCst) == 0 {
            *seen = None;
            return None;
        }
        let now = Instant::now();
        match *seen {
            // Stuck behind a stopped process: it holds the lock until it continues.
            Some((d, since, _))
                if d == done && now - since >= PERIOD && a_region_owner_stopped() =>
            {
                *seen = Some((d, now, now));
                Some(Duration::ZERO)
            }
            Some((d, since, last)) if d == done && now - last < STALE => {
                *seen = Some((d, since, now));
                Some(now - since)
            }
            _ => {
                *seen = Some((done, now, now));
                Some(Duration::ZERO)
            }
        }
    }
}

impl Drop for InCall<'_> {
    fn drop(&mut self) {
        // A plain increment: an update lost to a concurrent return still changes the count.
        let w = self.0;
        if !w.enabled {
            return;
        }
        w.done.store(w.done.load(Relaxed).wrapping_add(1), Relaxed);
        w.inside.fetch_sub(1, SeqCst);
    }
}

/// Domains the watchdog looks at.
static DOMAINS: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());
/// Providers (address schemes) wedged in this process.
static WEDGED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Set once any domain wedged (spares [`check_scheme`] the lock until then).
static ANY: AtomicBool = AtomicBool::new(false);

/// Fails if `scheme`'s provider wedged in this process (a new domain would touch the same
/// stuck shared memory, or spin the same way).
pub(super) fn check_scheme(scheme: &str) -> crate::Result<()> {
    if ANY.load(SeqCst) && lock(&WEDGED).iter().any(|s| s == scheme) {
        return Err(wedged_error());
    }
    Ok(())
}

/// Puts `shared` under the watchdog (starting it on first use).
pub(super) fn watch(shared: &std::sync::Arc<Shared>) {
    static STARTED: std::sync::Once = std::sync::Once::new();
    lock(&DOMAINS).push(std::sync::Arc::downgrade(shared));
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("ferry-ofi-watchdog".into())
            .spawn(|| loop {
                std::thread::sleep(PERIOD);
                sweep();
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the ofi watchdog: {e}");
        }
    });
}

/// One look at every domain.
fn sweep() {
    let live: Vec<_> = {
        let mut domains = lock(&DOMAINS);
        domains.retain(|w| w.strong_count() > 0);
        domains.iter().filter_map(Weak::upgrade).collect()
    };
    for sh in live {
        if sh.check_wedge(sh.wedge_after) {
            lock(&WEDGED).push(sh.scheme());
            ANY.store(true, SeqCst);
            tracing::error!(domain = sh.id, "{WEDGE_MESSAGE}");
            crate::health::raise_unrecoverable(WEDGE_MESSAGE);
        }
    }
}

/// The shm region file of a provider name (libfabric 1.17's shm maps `/dev/shm/<name>`).
fn region_path(name: &str) -> Option<String> {
    let ok = !name.is_empty() && !name.contains('/') && name != "." && name != "..";
    ok.then(|| format!("/dev/shm/{name}"))
}

/// The process that owns the shm region `name`, if it is alive: libfabric 1.17's shm keeps
/// the owner's pid in the region's header (`smr_region.pid`, an `int` at byte 4), and that
/// process must map the region (so neither a recycled pid nor another layout misleads).
fn region_owner(name: &str) -> Option<u32> {
    use std::os::unix::fs::FileExt;
    let path = region_path(name)?;
    let mut head = [0u8; 8];
    std::fs::File::open(&path)
        .ok()?
        .read_exact_at(&mut head, 0)
        .ok()?;
    let pid = u32::try_from(i32::from_ne_bytes(head[4..8].try_into().ok()?)).ok()?;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines()
        .any(|l| {
            l.split_once("/dev/shm/")
                .is_some_and(|(_, n)| mapped_name(n) == name)
        })
        .then_some(pid)
}

/// The region name of the rest of a `/proc/PID/maps` line after `/dev/shm/`.
fn mapped_name(rest: &str) -> &str {
    rest.trim_end_matches(" (deleted)")
}

/// Whether process `pid` is stopped (state `T`, by a signal, or `t`, by a tracer).
fn stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) S ...": the state follows the last ')' (comm may hold anything).
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
        .is_some_and(|c| c == 'T' || c == 't')
}

/// True if the shm peer `peer` (`ofi+shm://NAME`) is a live process that is stopped (it
/// will answer once continued); false for other providers, or when it cannot be told.
pub(super) fn peer_stopped(peer: &str) -> bool {
    peer.strip_prefix("ofi+shm://")
        .and_then(region_owner)
        .is_some_and(stopped)
}

/// True if the owner of any shm region this process maps (its own and its peers') is
/// another process, alive and stopped: a lock it holds in one of them is released when it
/// continues.
pub(super) fn a_region_owner_stopped() -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    let names: std::collections::BTreeSet<&str> = maps
        .lines()
        .filter_map(|l| l.split_once("/dev/shm/").map(|(_, n)| mapped_name(n)))
        .collect();
    let me = std::process::id();
    for pid in names.into_iter().filter_map(region_owner) {
        if pid != me && stopped(pid) {
            return true;
        }
    }
    false
}

/// Test hook (feature `test-hooks`): when the domain's progress thread should simulate a
/// provider call that never returns, from `FERRY_OFI_TEST_WEDGE_AFTER` (seconds after the
/// domain opened).
#[cfg(feature = "test-hooks")]
pub(super) fn test_wedge_at() -> Option<Instant> {
    let secs = std::env::var("FERRY_OFI_TEST_WEDGE_AFTER").ok()?;
    let after = Duration::try_from_secs_f64(secs.parse().ok()?).ok()?;
    Some(Instant::now() + after)
}

/// Test hook: the calling thread takes the provider (the gate) and stays "in a call" for
/// good, as a thread spinning on a dead peer's lock would.
#[cfg(feature = "test-hooks")]
pub(super) fn simulate_stuck_call(shared: &Shared) -> ! {
    tracing::warn!("FERRY_OFI_TEST_WEDGE_AFTER: simulating a provider call that never returns");
    let _inside = shared.gate.enter_wait(shared);
    let _in_call = shared.fab.watch.enter();
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `cond` for up to 5 s.
    fn soon(cond: impl Fn() -> bool) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// A stopped process is told apart from a running one and from one that is gone; names
    /// that are not shm peers, or name no region, are never "stopped".
    #[test]
    fn a_stopped_process_is_told_apart() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let rpid = rustix::process::Pid::from_child(&child);
        assert!(!stopped(pid));
        rustix::process::kill_process(rpid, rustix::process::Signal::STOP).unwrap();
        assert!(soon(|| stopped(pid)), "SIGSTOP not seen");
        rustix::process::kill_process(rpid, rustix::process::Signal::CONT).unwrap();
        assert!(soon(|| !stopped(pid)), "SIGCONT not seen");
        let _ = child.kill();
        let _ = child.wait();
        assert!(!stopped(pid), "a reaped process is not stopped");
        assert!(!peer_stopped("ofi+tcp://127.0.0.1:1"));
        assert!(!peer_stopped("ofi+shm://ferry-no-such-region"));
        assert!(!peer_stopped("ofi+shm://../etc/passwd"));
        assert!(region_path("a/b").is_none() && region_path("..").is_none());
    }
}
