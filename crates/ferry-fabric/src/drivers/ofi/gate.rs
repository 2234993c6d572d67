//! One thread at a time in the provider (on providers that need it, see `Quirks::funnel`).
//!
//! shm performs an RMA read or write inside the post call (its fast path copies with
//! `process_vm_readv`), holding the *peer's* region spinlock, and its own CQ lock, for the
//! whole copy: about a millisecond for 16 MiB. Every other call that needs one of those locks
//! spins meanwhile (an ACK or RMA request injected to the same peer), burning CPU the copy
//! may need. So on such providers every call into the provider passes a gate, one thread at
//! a time. A thread that finds it taken by a long call (an RMA, which copies) does not wait
//! but queues its call (a [`Job`]); the thread inside runs the queued jobs, in order, when
//! its own call returns and between the completions it routes. Behind a short call (a CQ
//! poll, a small send) it waits its turn instead, yielding: queueing there would hand every
//! small message to another thread, and spinning would keep a descheduled holder off the
//! CPU on 2 cores (both slower in ping-pong: docs/fabric.md, "Driver tuning"). Queued
//! calls enter the provider before any later one, so posts keep their order.
//!
//! A queued post that fails reports the failure the way the operation would have completed
//! (an error completion, a failed grant, a log line): [`Job::fail`].
//!
//! Granted RMAs (`rma.rs`) are not run where their grant is routed but deferred to a second
//! lane, [`Gate::defer`], which only the thread reading the CQ runs, one RMA per round
//! ([`Inside::run_bulk_one`]): the completions of one copy are routed, and the calls queued
//! meanwhile (an EXS ACK, a grant request) made, before the next copy starts. Run inline, the
//! grant shared by every piece of several messages copied them all back to back, so no
//! message completed (and no ACK freed the sender's next send) until the last one had.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Mutex;

use super::domain::Shared;
use super::lock;
use crate::error::{FabricError, Result};

/// How long a call waits behind a short call before taking the provider for stuck.
const WEDGED: std::time::Duration = std::time::Duration::from_secs(5);

/// Makes a provider call.
type Run = Box<dyn FnOnce(&Shared) -> Result<()> + Send>;
/// Reports a failed call.
type Fail = Box<dyn FnOnce(&Shared, FabricError) + Send>;

/// A provider call waiting for the gate.
pub(super) struct Job {
    /// Makes the call.
    run: Run,
    /// Reports a failed call (the caller was told `Ok` when the job was queued).
    fail: Fail,
}

impl Job {
    /// A job making a call with `run`, reporting its failure with `fail`.
    pub fn new(
        run: impl FnOnce(&Shared) -> Result<()> + Send + 'static,
        fail: impl FnOnce(&Shared, FabricError) + Send + 'static,
    ) -> Job {
        Job {
            run: Box::new(run),
            fail: Box::new(fail),
        }
    }

    /// A job whose failure is only logged, as `what`.
    pub fn logged(
        what: &'static str,
        run: impl FnOnce(&Shared) -> Result<()> + Send + 'static,
    ) -> Job {
        Job::new(run, move |_, e| tracing::debug!("{what}: {e}"))
    }
}

thread_local! {
    /// The gate this thread is inside (its address), or 0.
    static INSIDE: Cell<usize> = const { Cell::new(0) };
}

/// The gate of one domain.
pub(super) struct Gate {
    /// False: every call goes straight to the provider, from any thread.
    enabled: bool,
    busy: AtomicBool,
    /// The thread inside is in a long call: queue rather than wait.
    long: AtomicBool,
    queue: Mutex<VecDeque<Job>>,
    queued: AtomicUsize,
    /// Deferred long calls (granted RMAs), run one per progress round.
    bulk: Mutex<VecDeque<Job>>,
    bulk_queued: AtomicUsize,
    /// The provider is stuck for good (`wedge.rs`): every call fails at once.
    wedged: AtomicBool,
}

/// Being inside the gate; leaving runs what was queued meanwhile.
pub(super) struct Inside<'a> {
    gate: &'a Gate,
    shared: &'a Shared,
    /// This guard took the gate (false: disabled, or the thread was inside already).
    owner: bool,
    /// What `INSIDE` held before.
    prev: usize,
}

impl Gate {
    /// A gate; a disabled one lets every call through at once.
    pub fn new(enabled: bool) -> Gate {
        Gate {
            enabled,
            busy: AtomicBool::new(false),
            long: AtomicBool::new(false),
            queue: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
            bulk: Mutex::new(VecDeque::new()),
            bulk_queued: AtomicUsize::new(0),
            wedged: AtomicBool::new(false),
        }
    }

    /// True if calls pass one at a time (shm: the provider copies inside RMA posts).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Marks the provider stuck for good; false if it was already.
    pub fn set_wedged(&self) -> bool {
        !self.wedged.swap(true, SeqCst)
    }

    /// True once the provider is stuck for good (`wedge.rs`).
    pub fn is_wedged(&self) -> bool {
        self.wedged.load(SeqCst)
    }

    /// Fails if the provider is stuck for good.
    pub fn check(&self) -> Result<()> {
        if self.is_wedged() {
            return Err(super::wedge::wedged_error());
        }
        Ok(())
    }

    fn addr(&self) -> usize {
        self as *const Gate as usize
    }

    /// Enters if no other thread is inside (or this one already is).
    pub fn enter<'a>(&'a self, shared: &'a Shared) -> Option<Inside<'a>> {
        let inside = |owner, prev| Inside {
            gate: self,
            shared,
            owner,
            prev,
        };
        if !self.enabled || INSIDE.get() == self.addr() {
            return Some(inside(false, 0));
        }
        if self
            .busy
            .compare_exchange(false, true, SeqCst, SeqCst)
            .is_err()
        {
            return None;
        }
        let prev = INSIDE.replace(self.addr());
        let g = inside(true, prev);
        // Calls queued before this one go first.
        g.run_queued();
        Some(g)
    }

    /// Enters, waiting (yielding) while another thread is inside. For rare calls whose
    /// caller needs the outcome at once (handshakes, closing). Fails once the provider is
    /// wedged (the thread inside will never leave).
    pub fn enter_wait<'a>(&'a self, shared: &'a Shared) -> Result<Inside<'a>> {
        loop {
            self.check()?;
            if let Some(g) = self.enter(shared) {
                return Ok(g);
            }
            std::thread::yield_now();
        }
    }

    /// Runs `job` now if the gate is free or soon free (returning its outcome), else (the
    /// thread inside is in a long call) queues it for that thread and returns `Ok`.
    ///
    /// A short call that has not left after [`WEDGED`] is taken to be stuck in the provider
    /// (shm spins forever on a lock that a killed peer held): this call then fails with
    /// `Timeout` instead of waiting with it, so the connection fails and its user can
    /// reconnect.
    pub fn call(&self, shared: &Shared, job: Job) -> Result<()> {
        let start = std::time::Instant::now();
        loop {
            self.check()?;
            if let Some(_inside) = self.enter(shared) {
                return (job.run)(shared);
            }
            if self.long.load(SeqCst) {
                break;
            }
            if start.elapsed() > WEDGED {
                return Err(FabricError::Timeout(WEDGED));
            }
            std::thread::yield_now();
        }
        lock(&self.queue).push_back(job);
        self.queued.fetch_add(1, SeqCst);
        crate::timeline::mark("gate.q", 0);
        // The thread inside may have left between our look and the push: then nobody else
        // would run the job.
        drop(self.enter(shared));
        Ok(())
    }

    /// True if calls wait for the thread inside.
    pub fn has_queued(&self) -> bool {
        self.queued.load(SeqCst) > 0
    }

    /// Defers `job`, a long call (a granted RMA), to the thread that reads the CQ, which
    /// runs such calls one per round, oldest first, after every call queued with
    /// [`Gate::call`] (see the module doc). On a disabled gate it runs at once, as `call`.
    pub fn defer(&self, shared: &Shared, job: Job) -> Result<()> {
        if !self.enabled {
            return self.call(shared, job);
        }
        lock(&self.bulk).push_back(job);
        self.bulk_queued.fetch_add(1, SeqCst);
        crate::timeline::mark("gate.bulk", 0);
        shared.wake();
        Ok(())
    }

    /// True if deferred long calls wait.
    pub fn has_bulk(&self) -> bool {
        self.bulk_queued.load(SeqCst) > 0
    }

    /// Fails every deferred call with `err` (the domain is closing).
    pub fn fail_bulk(&self, shared: &Shared, err: impl Fn() -> FabricError) {
        let jobs: Vec<Job> = lock(&self.bulk).drain(..).collect();
        self.bulk_queued.store(0, SeqCst);
        for job in jobs {
            (job.fail)(shared, err());
        }
    }
}

impl Inside<'_> {
    /// Runs `f`, a long call (an RMA copy): meanwhile other threads queue their calls.
    pub fn long<R>(&self, f: impl FnOnce() -> R) -> R {
        if !self.gate.enabled {
            return f();
        }
        let was = self.gate.long.swap(true, SeqCst);
        let r = f();
        self.gate.long.store(was, SeqCst);
        r
    }

    /// Runs the oldest deferred long call, then the calls queued meanwhile (only the owner
    /// does). Returns how many deferred calls ran (0 or 1).
    pub fn run_bulk_one(&self) -> usize {
        if !self.owner || !self.gate.has_bulk() {
            return 0;
        }
        let job = lock(&self.gate.bulk).pop_front();
        let Some(job) = job else { return 0 };
        self.gate.bulk_queued.fetch_sub(1, SeqCst);
        if let Err(e) = (job.run)(self.shared) {
            (job.fail)(self.shared, e);
        }
        self.run_queued();
        1
    }

    /// Runs every queued call, oldest first (only the owner does; others return at once).
    pub fn run_queued(&self) {
        if !self.owner {
            return;
        }
        while self.gate.has_queued() {
            let job = lock(&self.gate.queue).pop_front();
            let Some(job) = job else { break };
            self.gate.queued.fetch_sub(1, SeqCst);
            if let Err(e) = (job.run)(self.shared) {
                (job.fail)(self.shared, e);
            }
        }
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        loop {
            self.run_queued();
            INSIDE.set(self.prev);
            self.gate.busy.store(false, SeqCst);
            // A call queued after the last look but before the release found the gate
            // taken and relies on us.
            if !self.gate.has_queued()
                || self
                    .gate
                    .busy
                    .compare_exchange(false, true, SeqCst, SeqCst)
                    .is_err()
            {
                return;
            }
            INSIDE.set(self.gate.addr());
        }
    }
}
