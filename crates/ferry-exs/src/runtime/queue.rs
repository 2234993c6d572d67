//! Event queues (`exs_qcreate`): where sockets report completions. Many sockets may share one
//! queue; a queue has an eventfd readable exactly while events wait, so it can sit in epoll.

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use rustix::event::{eventfd, EventfdFlags};

use super::buf::ExsBuf;
use crate::error::ExsError;
use crate::proto::EventKind;

/// Identifies a socket in events (process-unique).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SocketId(pub u64);

/// A completion or notification (`exs_event`).
#[derive(Debug)]
pub struct ExsEvent {
    /// What happened.
    pub kind: EventKind,
    /// The socket it happened on.
    pub socket: SocketId,
    /// The user context given to the operation (0 for connection events).
    pub ctx: u64,
    /// The operation's buffer, handed back (None for connection events and notifications).
    pub buf: Option<ExsBuf>,
    /// Bytes transferred.
    pub len: u64,
    /// Outcome.
    pub result: Result<(), ExsError>,
}

/// A socket whose completions a waiting dequeuer may process itself.
pub(crate) trait Drive: Send + Sync {
    /// Handles whatever completions wait, without blocking; true if there were any.
    fn drive(&self) -> bool;
    /// Nobody drives the socket any more: its progress thread takes over at once.
    fn wake(&self);
}

/// How long `dequeue` keeps driving its sockets after the last sign of life before it
/// sleeps: a reply on the same host comes back well within it, and the dequeuing thread
/// then handles it itself instead of waiting for two wake-ups (progress thread, then us).
const SPIN: Duration = Duration::from_micros(50);

struct Shared {
    events: Mutex<VecDeque<ExsEvent>>,
    ready: Condvar,
    efd: OwnedFd,
    /// The sockets that report here.
    sources: Mutex<Vec<Weak<dyn Drive>>>,
    /// When a dequeuer last drove the sockets (µs since `epoch`; 0: it went to sleep).
    driven_at: AtomicU64,
    epoch: Instant,
    /// Set by [`EventQueue::wake`]: the next (or current) `dequeue` returns `None` at once.
    woken: AtomicBool,
}

/// A queue sockets deliver events to. Cheap to clone (shared handle).
#[derive(Clone)]
pub struct EventQueue {
    shared: Arc<Shared>,
}

impl EventQueue {
    /// An empty queue.
    pub fn new() -> std::io::Result<Self> {
        let efd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(EventQueue {
            shared: Arc::new(Shared {
                events: Mutex::new(VecDeque::new()),
                ready: Condvar::new(),
                efd,
                sources: Mutex::new(Vec::new()),
                driven_at: AtomicU64::new(0),
                epoch: Instant::now(),
                woken: AtomicBool::new(false),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<ExsEvent>> {
        // Only push/pop happen under this lock, so a poisoned queue is still consistent.
        self.shared.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn push(&self, ev: ExsEvent) {
        let mut q = self.lock();
        if q.is_empty() {
            // The fd's count goes non-zero on the empty → non-empty edge only.
            let _ = rustix::io::write(&self.shared.efd, &1u64.to_ne_bytes());
        }
        q.push_back(ev);
        self.shared.ready.notify_one();
    }

    /// Lets dequeuers drive `source` (a socket reporting here).
    pub(crate) fn attach(&self, source: Weak<dyn Drive>) {
        let mut s = self
            .shared
            .sources
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        s.retain(|w| w.strong_count() > 0);
        s.push(source);
    }

    fn sources(&self) -> Vec<Arc<dyn Drive>> {
        let s = self
            .shared
            .sources
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        s.iter().filter_map(Weak::upgrade).collect()
    }

    /// Processes the completions waiting on every attached socket; true if any did work.
    fn drive(&self, sources: &[Arc<dyn Drive>]) -> bool {
        let now = self.shared.epoch.elapsed().as_micros().max(1);
        self.shared
            .driven_at
            .store(u64::try_from(now).unwrap_or(u64::MAX), Ordering::Release);
        let mut any = false;
        for src in sources {
            any |= src.drive();
        }
        any
    }

    /// True while a dequeuer drives this queue's sockets (it did within `within` and has not
    /// gone to sleep since): their progress threads then stay out of its way.
    pub(crate) fn driven(&self, within: Duration) -> bool {
        let at = self.shared.driven_at.load(Ordering::Acquire);
        at != 0 && self.shared.epoch.elapsed().as_micros() < u128::from(at) + within.as_micros()
    }

    /// For a caller that polls (`exs_qdequeue` with a zero timeout) and found no event:
    /// handles the completions waiting on this queue's sockets on the calling thread, as a
    /// blocking [`Self::dequeue`] does while it spins, so an event surfaces as soon as the
    /// driver has its completion (look again with [`Self::try_dequeue`]). While a caller
    /// keeps polling, the sockets' progress threads stand by (they take over within half a
    /// millisecond once it stops). A look that finds nothing yields the CPU, so a caller
    /// polling in a tight loop leaves the drivers' threads on a busy core room to run.
    /// True if completions were handled.
    pub fn drive_now(&self) -> bool {
        let any = self.drive(&self.sources());
        if !any {
            std::thread::yield_now();
        }
        any
    }

    /// For a caller about to block elsewhere (on [`Self::wait_fd`], or an epoll set that
    /// holds it, as the C API does): first handles the sockets' completions on the calling
    /// thread while they keep coming, for up to [`SPIN`] after the last (never past
    /// `deadline`), exactly as [`Self::dequeue`] does before it sleeps; then, if nothing
    /// surfaced, hands progress back to the sockets' threads. True if an event waits.
    pub fn spin_before_sleep(&self, deadline: Option<Instant>) -> bool {
        let sources = self.sources();
        let mut busy = Instant::now();
        loop {
            if !self.is_empty() {
                return true;
            }
            if self.drive(&sources) {
                busy = Instant::now();
                continue;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) || now - busy >= SPIN {
                break;
            }
            std::thread::yield_now();
        }
        ferry_fabric::timeline::mark("exs.sleep", 0);
        self.shared.driven_at.store(0, Ordering::Release);
        for src in &sources {
            src.wake();
        }
        !self.is_empty()
    }

    /// Makes the thread blocked in [`Self::dequeue`] on this queue return `None` now (or the
    /// next call, if none is waiting): for a thread that waits both for its sockets and for
    /// work other threads finish (they wake it when they have).
    pub fn wake(&self) {
        self.shared.woken.store(true, Ordering::Release);
        // Taken so a dequeuer between its look at the flag and its sleep cannot miss it.
        let _q = self.lock();
        self.shared.ready.notify_all();
    }

    /// Whether [`Self::wake`] was called since the last look (which clears it).
    fn take_wake(&self) -> bool {
        self.shared.woken.swap(false, Ordering::AcqRel)
    }

    /// Takes the next event without blocking.
    pub fn try_dequeue(&self) -> Option<ExsEvent> {
        let mut q = self.lock();
        let ev = q.pop_front();
        if ev.is_some() && q.is_empty() {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&self.shared.efd, &mut b);
        }
        ev
    }

    /// Waits up to `timeout` for the next event (`exs_qdequeue`); None on timeout.
    ///
    /// While it waits, the calling thread processes its sockets' completions itself for a
    /// short while (the socket's progress thread does the same work otherwise), which takes
    /// two thread wake-ups off every round trip.
    pub fn dequeue(&self, timeout: Duration) -> Option<ExsEvent> {
        let start = Instant::now();
        let deadline = start + timeout;
        let mut busy = start;
        let sources = self.sources();
        loop {
            if let Some(ev) = self.try_dequeue() {
                return Some(ev);
            }
            if self.take_wake() {
                return None;
            }
            if self.drive(&sources) {
                busy = Instant::now();
                continue;
            }
            let now = Instant::now();
            if now >= deadline || now - busy >= SPIN {
                break;
            }
            std::thread::yield_now();
        }
        // Going to sleep: the progress threads take over now, not when they next look.
        ferry_fabric::timeline::mark("exs.sleep", 0);
        self.shared.driven_at.store(0, Ordering::Release);
        for src in &sources {
            src.wake();
        }
        let mut q = self.lock();
        loop {
            if let Some(ev) = q.pop_front() {
                if q.is_empty() {
                    let mut b = [0u8; 8];
                    let _ = rustix::io::read(&self.shared.efd, &mut b);
                }
                return Some(ev);
            }
            if self.take_wake() {
                return None;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            q = self
                .shared
                .ready
                .wait_timeout(q, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// True if both handles name one queue.
    pub fn same_queue(&self, other: &EventQueue) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True if no event waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A file descriptor readable exactly while events wait, for poll/epoll. Valid as long as
    /// any handle to the queue lives; after it fires, drain with [`Self::try_dequeue`].
    pub fn wait_fd(&self) -> RawFd {
        self.shared.efd.as_fd().as_raw_fd()
    }
}

impl AsFd for EventQueue {
    /// The same descriptor as [`EventQueue::wait_fd`], borrowed safely.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.efd.as_fd()
    }
}
