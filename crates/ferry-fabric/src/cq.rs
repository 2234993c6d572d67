//! Completion queues: where every posted operation reports its end, with a file descriptor
//! that is readable exactly while completions are waiting, so a queue can sit in epoll.

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};

use crate::error::{FabricError, Result};

/// The kind of operation a completion belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Two-sided send.
    Send,
    /// Two-sided receive.
    Recv,
    /// One-sided RMA write.
    Write,
    /// One-sided RMA read.
    Read,
}

/// The outcome of one posted operation.
#[derive(Debug)]
pub struct Completion {
    /// The context the caller passed when posting.
    pub context: u64,
    /// What kind of operation it was.
    pub op: OpKind,
    /// Bytes transferred (for a receive: the bytes placed in the buffer).
    pub len: u64,
    /// Success, or why it failed.
    pub result: Result<()>,
}

impl Completion {
    /// A successful completion.
    pub fn ok(context: u64, op: OpKind, len: u64) -> Self {
        Self {
            context,
            op,
            len,
            result: Ok(()),
        }
    }

    /// A failed completion.
    pub fn err(context: u64, op: OpKind, error: FabricError) -> Self {
        Self {
            context,
            op,
            len: 0,
            result: Err(error),
        }
    }
}

struct State {
    queue: VecDeque<Completion>,
    /// The eventfd currently holds a non-zero count.
    signalled: bool,
    /// Threads blocked in `wait`.
    sleepers: usize,
    /// Bumped by [`CompletionQueue::signal`]: a waiter that sees it change returns.
    signals: u64,
    /// Sleepers the last signal woke that have not returned yet: the last of them takes
    /// the signal's count back from the eventfd.
    to_wake: usize,
}

/// A per-endpoint completion queue.
///
/// Drivers push; the owner polls, waits with a timeout, or puts [`CompletionQueue::wait_fd`]
/// into its own poll/epoll set.
pub struct CompletionQueue {
    state: Mutex<State>,
    /// Length mirror read without the lock by spinning waiters.
    len: AtomicUsize,
    /// Once the fd was handed out, it must be level-accurate at all times.
    fd_exposed: std::sync::atomic::AtomicBool,
    efd: OwnedFd,
}

/// How long `wait` spins before sleeping: long enough to catch a ping-pong reply on the same
/// host, short enough not to starve a 2-core machine.
const SPIN: Duration = Duration::from_micros(50);

impl CompletionQueue {
    /// Creates an empty queue.
    pub fn new() -> Result<Self> {
        let efd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| FabricError::io("eventfd", e.into()))?;
        Ok(Self {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                signalled: false,
                sleepers: 0,
                signals: 0,
                to_wake: 0,
            }),
            len: AtomicUsize::new(0),
            fd_exposed: false.into(),
            efd,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the queue inconsistent (push/pop only).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a completion (drivers only).
    pub(crate) fn push(&self, c: Completion) {
        let mut st = self.lock();
        st.queue.push_back(c);
        self.len.store(st.queue.len(), Ordering::Release);
        if !st.signalled && (st.sleepers > 0 || self.fd_exposed.load(Ordering::Relaxed)) {
            st.signalled = true;
            // Cannot fail short of EAGAIN at u64::MAX - 1, which one write per empty period avoids.
            let _ = rustix::io::write(&self.efd, &1u64.to_ne_bytes());
        }
    }

    /// Number of completions waiting.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// True if no completion is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes up to `max` completions without blocking, appending them to `out`.
    pub fn poll_into(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        if self.is_empty() {
            return 0;
        }
        let mut st = self.lock();
        let n = max.min(st.queue.len());
        out.extend(st.queue.drain(..n));
        self.len.store(st.queue.len(), Ordering::Release);
        if st.queue.is_empty() && st.signalled {
            st.signalled = false;
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&self.efd, &mut b);
        }
        n
    }

    /// Takes one completion without blocking.
    pub fn try_next(&self) -> Option<Completion> {
        let mut v = Vec::with_capacity(1);
        self.poll_into(&mut v, 1);
        v.pop()
    }

    /// Waits up to `timeout` for one completion, spinning briefly before it sleeps.
    pub fn wait(&self, timeout: Duration) -> Result<Completion> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(c) = self.try_next() {
                return Ok(c);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if !self.wait_ready(left, SPIN) {
                return Err(FabricError::Timeout(timeout));
            }
        }
    }

    /// Ends every wait in [`Self::wait_ready`] now, as if its timeout had passed (libfabric's
    /// `fi_cq_signal`): for an owner stopping a thread that waits here, which would
    /// otherwise sleep out its timeout first.
    pub fn signal(&self) {
        let mut st = self.lock();
        st.signals = st.signals.wrapping_add(1);
        st.to_wake = st.sleepers;
        if st.sleepers > 0 && !st.signalled {
            st.signalled = true;
            let _ = rustix::io::write(&self.efd, &1u64.to_ne_bytes());
        }
    }

    /// Waits up to `timeout` until a completion is waiting, without taking it: for a
    /// consumer that must take completions under its own lock to keep their order. Spins
    /// (yielding the CPU) for at most `spin` before it sleeps. True if one is waiting;
    /// false at the timeout or when [`Self::signal`] is called meanwhile.
    pub fn wait_ready(&self, timeout: Duration, spin: Duration) -> bool {
        let start = Instant::now();
        let signals = self.lock().signals;
        loop {
            if !self.is_empty() {
                return true;
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return false;
            }
            if waited < spin {
                std::hint::spin_loop();
                std::thread::yield_now();
                continue;
            }
            {
                let mut st = self.lock();
                if !st.queue.is_empty() {
                    return true;
                }
                if st.signals != signals {
                    return false;
                }
                st.sleepers += 1;
            }
            let left = timeout.saturating_sub(start.elapsed());
            let ts = rustix::time::Timespec::try_from(left.min(Duration::from_secs(1))).unwrap_or(
                rustix::time::Timespec {
                    tv_sec: 1,
                    tv_nsec: 0,
                },
            );
            let mut fds = [PollFd::new(&self.efd, PollFlags::IN)];
            let _ = poll(&mut fds, Some(&ts));
            if let Some(ready) = self.woken(signals) {
                return ready;
            }
        }
    }

    /// A sleeper of [`Self::wait_ready`] that slept since the signal count `signals` is
    /// awake: `Some` (whether a completion waits) when a signal came meanwhile, which ends
    /// its wait, `None` to wait on. The last sleeper a signal woke takes the signal's count
    /// back from the eventfd, so the descriptor again says only whether completions wait
    /// (a waiter that came after the signal would otherwise find it readable and spin).
    fn woken(&self, signals: u64) -> Option<bool> {
        let mut st = self.lock();
        st.sleepers -= 1;
        if st.signals == signals {
            return None;
        }
        st.to_wake = st.to_wake.saturating_sub(1);
        if st.to_wake == 0 && st.signalled && st.queue.is_empty() {
            st.signalled = false;
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&self.efd, &mut b);
        }
        Some(!st.queue.is_empty())
    }

    /// Waits up to `timeout` for `n` completions and returns them in arrival order.
    pub fn wait_many(&self, n: usize, timeout: Duration) -> Result<Vec<Completion>> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            out.push(self.wait(left)?);
        }
        Ok(out)
    }

    /// A file descriptor readable while completions wait; put it in poll/epoll.
    /// It stays valid for the queue's lifetime. After it fires, drain with [`Self::poll_into`].
    pub fn wait_fd(&self) -> RawFd {
        if !self.fd_exposed.swap(true, Ordering::SeqCst) {
            let mut st = self.lock();
            if !st.queue.is_empty() && !st.signalled {
                st.signalled = true;
                let _ = rustix::io::write(&self.efd, &1u64.to_ne_bytes());
            }
        }
        self.efd.as_fd().as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Whether the queue's wait descriptor ([`CompletionQueue::wait_fd`]) polls readable.
    fn readable(cq: &CompletionQueue) -> bool {
        let mut fds = [PollFd::new(&cq.efd, PollFlags::IN)];
        poll(
            &mut fds,
            Some(&rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            }),
        )
        .unwrap()
            == 1
    }

    #[test]
    fn fd_is_readable_exactly_while_nonempty() {
        let cq = CompletionQueue::new().unwrap();
        assert_eq!(cq.wait_fd(), cq.efd.as_raw_fd());
        assert!(!readable(&cq));
        cq.push(Completion::ok(1, OpKind::Send, 0));
        cq.push(Completion::ok(2, OpKind::Send, 0));
        assert!(readable(&cq));
        assert_eq!(cq.try_next().unwrap().context, 1);
        assert!(readable(&cq));
        assert_eq!(cq.try_next().unwrap().context, 2);
        assert!(!readable(&cq));
    }

    #[test]
    fn wait_times_out_and_wakes() {
        let cq = Arc::new(CompletionQueue::new().unwrap());
        assert!(matches!(
            cq.wait(Duration::from_millis(20)),
            Err(FabricError::Timeout(_))
        ));
        let cq2 = cq.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            cq2.push(Completion::ok(9, OpKind::Recv, 5));
        });
        let c = cq.wait(Duration::from_secs(5)).unwrap();
        assert_eq!((c.context, c.len), (9, 5));
        t.join().unwrap();
    }

    /// A signal ends a long wait at once, leaves the exposed descriptor saying only whether
    /// completions wait, and does not carry over to the next wait.
    #[test]
    fn a_signal_ends_a_wait_once() {
        let cq = Arc::new(CompletionQueue::new().unwrap());
        cq.wait_fd();
        let waiter = {
            let cq = cq.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                let ready = cq.wait_ready(Duration::from_secs(30), Duration::ZERO);
                (ready, start.elapsed())
            })
        };
        while cq.lock().sleepers == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        cq.signal();
        let (ready, waited) = waiter.join().unwrap();
        assert!(!ready, "nothing was pushed");
        assert!(waited < Duration::from_secs(10), "woken after {waited:?}");
        assert!(!readable(&cq), "the signal's count was taken back");
        let start = Instant::now();
        assert!(!cq.wait_ready(Duration::from_millis(30), Duration::ZERO));
        assert!(start.elapsed() >= Duration::from_millis(30));
        cq.push(Completion::ok(3, OpKind::Send, 0));
        assert!(readable(&cq));
        assert!(cq.wait_ready(Duration::from_secs(5), Duration::ZERO));
    }

    /// The signal's count is taken back by the last of the sleepers it woke, even while a
    /// waiter that came after it sleeps (the count must not keep waking that one).
    #[test]
    fn a_signal_is_taken_back_by_the_sleepers_it_woke() {
        let cq = CompletionQueue::new().unwrap();
        let sleep = |cq: &CompletionQueue| {
            let mut st = cq.lock();
            st.sleepers += 1;
            st.signals
        };
        let before = sleep(&cq);
        sleep(&cq);
        cq.signal();
        assert!(readable(&cq));
        let after = sleep(&cq);
        assert_eq!(cq.woken(before), Some(false));
        assert!(readable(&cq), "a sleeper it woke is still asleep");
        assert_eq!(cq.woken(before), Some(false));
        assert!(!readable(&cq), "taken back, though a later waiter sleeps");
        assert_eq!(cq.woken(after), None, "the later waiter waits on");
    }
}
