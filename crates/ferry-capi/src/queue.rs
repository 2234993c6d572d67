//! Event queues (`exs_qcreate`) and how runtime events become C events.
//!
//! A C queue joins two sources: the runtime's [`EventQueue`] (send, recv, read-notify and
//! close events, which the sockets push themselves) and a side list for the events this
//! layer makes (accept, connect). Its file descriptor (`exs_qfd`) is an epoll instance
//! watching both sources' eventfds, so it is readable exactly while either holds an event.
//!
//! Operations pass the runtime a token as their context; the token names an [`OpRec`] with
//! the caller's socket handle, context and buffer pointer, so the C event hands back exactly
//! what the call was given. Close events carry no token; they find their socket handle
//! through the socket-id map, which is filled under the queue's lock together with the
//! accept or connect event that announces the socket. A close event that overtakes its
//! announcement (the peer closed at once) waits in the queue until the socket is known, so
//! a program never sees a socket before it is announced.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_exs::proto::EventKind;

use crate::error::{Errno, Res};
use ferry_exs::runtime::{EventQueue, ExsEvent, SocketId};
use rustix::event::{epoll, eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

/// `EXS_EVT_*` values (see exs.h).
pub const EVT_SEND: i32 = 1;
pub const EVT_RECV: i32 = 2;
pub const EVT_ACCEPT: i32 = 3;
pub const EVT_CONNECT: i32 = 4;
pub const EVT_READ_NOTIFY: i32 = 5;
pub const EVT_CLOSE: i32 = 6;

/// A C event, with pointers kept as addresses so it can cross threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ev {
    pub kind: i32,
    pub sock: i32,
    pub accepted: i32,
    pub err: i32,
    pub buf: usize,
    pub len: usize,
    pub ctx: usize,
}

impl Ev {
    /// An event with no buffer: accept, connect, close.
    pub fn conn(kind: i32, sock: i32, accepted: i32, err: i32, ctx: usize) -> Ev {
        Ev {
            kind,
            sock,
            accepted,
            err,
            buf: 0,
            len: 0,
            ctx,
        }
    }
}

/// What the C caller gave an operation, found again by its token.
pub struct OpRec {
    pub sock: i32,
    pub ctx: usize,
    /// The caller's buffer pointer (0 for sendfile, whose buffer is ferry's mapping).
    pub buf: usize,
}

static OPS: LazyLock<Mutex<HashMap<u64, OpRec>>> = LazyLock::new(Default::default);
/// Runtime socket id → C handle (-1: the socket was dropped unannounced; discard its events).
static IDS: LazyLock<Mutex<HashMap<SocketId, i32>>> = LazyLock::new(Default::default);

fn ops() -> MutexGuard<'static, HashMap<u64, OpRec>> {
    OPS.lock().unwrap_or_else(|p| p.into_inner())
}

fn ids() -> MutexGuard<'static, HashMap<SocketId, i32>> {
    IDS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records an operation and returns the token to give the runtime as its context.
pub fn op_token(rec: OpRec) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let t = NEXT.fetch_add(1, Ordering::Relaxed);
    ops().insert(t, rec);
    t
}

/// Forgets an operation the runtime never took (its post failed).
pub fn op_forget(token: u64) {
    ops().remove(&token);
}

enum Conv {
    Deliver(Ev),
    Discard,
    /// A close event for a socket not announced yet.
    Early(ExsEvent),
}

fn convert(ev: ExsEvent) -> Conv {
    let err = ev.result.err().map_or(0, |e| e.errno());
    let len = usize::try_from(ev.len).unwrap_or(usize::MAX);
    let kind = match ev.kind {
        EventKind::Send => EVT_SEND,
        EventKind::Recv => EVT_RECV,
        EventKind::ReadNotify => EVT_READ_NOTIFY,
        // The C API posts no one-sided RMA of its own.
        EventKind::Rma => return Conv::Discard,
        EventKind::Close => {
            let mut ids = ids();
            return match ids.get(&ev.socket).copied() {
                None => {
                    drop(ids);
                    Conv::Early(ev)
                }
                Some(h) => {
                    ids.remove(&ev.socket);
                    if h < 0 {
                        Conv::Discard
                    } else {
                        Conv::Deliver(Ev::conn(EVT_CLOSE, h, -1, err, 0))
                    }
                }
            };
        }
        // The runtime keeps connect events to itself.
        #[allow(unreachable_patterns)]
        _ => return Conv::Discard,
    };
    let fallback_buf = ev.buf.as_ref().map_or(0, |b| b.addr());
    // The event's buffer (its hold on the registration) is dropped here, when dequeued.
    drop(ev.buf);
    let rec = if kind == EVT_READ_NOTIFY {
        // The persistent send stays posted; so does its record.
        ops().get(&ev.ctx).map(|r| (r.sock, r.ctx, r.buf))
    } else {
        ops().remove(&ev.ctx).map(|r| (r.sock, r.ctx, r.buf))
    };
    let (sock, ctx, buf) = rec.unwrap_or_else(|| {
        let sock = ids().get(&ev.socket).copied().unwrap_or(-1);
        (sock, 0, fallback_buf)
    });
    Conv::Deliver(Ev {
        kind,
        sock,
        accepted: -1,
        err,
        buf,
        len,
        ctx,
    })
}

struct Side {
    events: VecDeque<Ev>,
    early: Vec<ExsEvent>,
}

/// One `exs_qhandle_t`.
pub struct Queue {
    /// Where the runtime sockets push.
    pub rt: EventQueue,
    side: Mutex<Side>,
    side_fd: OwnedFd,
    epoll: OwnedFd,
    /// Set by `exs_qdelete`: waiting dequeuers return EBADF.
    deleted: AtomicBool,
}

impl Queue {
    pub fn new() -> std::io::Result<Queue> {
        let rt = EventQueue::new()?;
        let side_fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        for fd in [rt.as_fd(), side_fd.as_fd()] {
            epoll::add(&ep, fd, epoll::EventData::new_u64(0), epoll::EventFlags::IN)?;
        }
        Ok(Queue {
            rt,
            side: Mutex::new(Side {
                events: VecDeque::new(),
                early: Vec::new(),
            }),
            side_fd,
            epoll: ep,
            deleted: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Side> {
        self.side.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The descriptor `exs_qfd` returns: readable while events wait.
    pub fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// `exs_qdelete`: threads waiting in [`Self::dequeue`] wake and fail with EBADF (the
    /// side descriptor is left readable, so every one of them sees it).
    pub fn delete(&self) {
        self.deleted.store(true, Ordering::SeqCst);
        let _ = rustix::io::write(&self.side_fd, &1u64.to_ne_bytes());
    }

    /// Queues an accept or connect event announcing socket `id` as handle `h` (-1: the
    /// socket was dropped; its events are discarded). The id is recorded under the queue's
    /// lock, so none of the socket's events can be dequeued ahead of this one.
    pub fn announce(&self, ev: Ev, id: Option<(SocketId, i32)>) {
        let mut side = self.lock();
        if let Some((id, h)) = id {
            ids().insert(id, h);
        }
        self.push_locked(&mut side, ev);
    }

    /// Records that runtime socket `id` has no handle (a connection made for a connect
    /// already cancelled): its close event is discarded.
    pub fn disown(&self, id: SocketId) {
        let _side = self.lock();
        ids().insert(id, -1);
    }

    /// Queues an event of this layer.
    pub fn push(&self, ev: Ev) {
        let mut side = self.lock();
        self.push_locked(&mut side, ev);
    }

    fn push_locked(&self, side: &mut Side, ev: Ev) {
        if side.events.is_empty() {
            let _ = rustix::io::write(&self.side_fd, &1u64.to_ne_bytes());
        }
        side.events.push_back(ev);
    }

    /// True if an event is waiting (for `exs_poll`).
    pub fn has_events(&self) -> bool {
        !self.lock().events.is_empty() || !self.rt.is_empty()
    }

    /// Up to `max` events: this layer's first (they announce sockets), then close events
    /// that were waiting for their announcement, then the runtime's, in order.
    fn collect(&self, max: usize) -> Vec<Ev> {
        let mut out = Vec::new();
        let mut side = self.lock();
        while out.len() < max {
            match side.events.pop_front() {
                Some(ev) => out.push(ev),
                None => break,
            }
        }
        // The side descriptor is readable exactly while side events wait (written on the
        // empty → non-empty edge), so it is drained only on the way back to empty: a look
        // that took nothing makes no system call (it used to read the descriptor every
        // time, twice per dequeue on the data path).
        if !out.is_empty() && side.events.is_empty() && !self.deleted.load(Ordering::SeqCst) {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&self.side_fd, &mut b);
        }
        if !side.early.is_empty() {
            let early = std::mem::take(&mut side.early);
            for ev in early {
                if out.len() >= max {
                    side.early.push(ev);
                    continue;
                }
                match convert(ev) {
                    Conv::Deliver(e) => out.push(e),
                    Conv::Discard => {}
                    Conv::Early(ev) => side.early.push(ev),
                }
            }
        }
        while out.len() < max {
            let Some(ev) = self.rt.try_dequeue() else {
                break;
            };
            match convert(ev) {
                Conv::Deliver(e) => out.push(e),
                Conv::Discard => {}
                Conv::Early(ev) => side.early.push(ev),
            }
        }
        out
    }

    /// Waits up to `timeout` (None: forever) for events and returns up to `max` of them
    /// (none on timeout).
    /// EBADF once the queue is deleted (events still waiting are not handed out).
    pub fn dequeue(&self, max: usize, timeout: Option<Duration>) -> Res<Vec<Ev>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if self.deleted.load(Ordering::SeqCst) {
                return Err(Errno::BADF);
            }
            let out = self.collect(max);
            if !out.is_empty() {
                return Ok(out);
            }
            if timeout == Some(Duration::ZERO) {
                // Polling: make progress on this thread rather than wait for the progress
                // threads' next look (which a spinning caller may keep off the CPU).
                self.rt.drive_now();
                return Ok(self.collect(max));
            }
            // Blocking: handle completions on this thread for a moment first (a reply on
            // the same host comes within it), as the Rust API's dequeue does, instead of
            // paying two thread wake-ups (progress thread, then this one) per event.
            if self.rt.spin_before_sleep(deadline) {
                continue;
            }
            let left = match deadline {
                None => None,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(out);
                    }
                    Some(Timespec {
                        tv_sec: left.as_secs() as _,
                        tv_nsec: left.subsec_nanos() as _,
                    })
                }
            };
            let mut fds = [PollFd::new(&self.epoll, PollFlags::IN)];
            // EINTR and spurious wake-ups just go round again.
            let _ = poll(&mut fds, left.as_ref());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        // SAFETY: fd is a queue's epoll descriptor, open for the duration of the test.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        poll(&mut fds, Some(&Timespec::default())).unwrap() == 1
    }

    /// `exs_qdelete` wakes a thread blocked in `exs_qdequeue(q, ..., -1)`: EBADF.
    #[test]
    fn deleting_wakes_a_blocked_dequeuer() {
        let q = std::sync::Arc::new(Queue::new().unwrap());
        let waiter = {
            let q = q.clone();
            std::thread::spawn(move || q.dequeue(1, None))
        };
        std::thread::sleep(Duration::from_millis(50));
        q.delete();
        assert_eq!(waiter.join().unwrap().unwrap_err(), Errno::BADF);
        assert_eq!(q.dequeue(1, Some(Duration::ZERO)).unwrap_err(), Errno::BADF);
    }

    /// Read-like system calls this thread has made (`syscr` of /proc/thread-self/io).
    fn reads_so_far() -> u64 {
        let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
        let line = io.lines().find(|l| l.starts_with("syscr:")).unwrap();
        line["syscr:".len()..].trim().parse().unwrap()
    }

    /// A look at an empty queue makes no read: polling (and every blocking dequeue, which
    /// looks before and after it spins) used to read the side descriptor each time, a
    /// system call on the C ping-pong's critical path that the Rust API does not make.
    #[test]
    fn looking_at_an_empty_queue_reads_no_descriptor() {
        let q = Queue::new().unwrap();
        let before = reads_so_far();
        for _ in 0..1000 {
            assert!(q.dequeue(1, Some(Duration::ZERO)).unwrap().is_empty());
        }
        // Reading /proc itself counts a few.
        let reads = reads_so_far() - before;
        assert!(reads < 10, "{reads} reads for 1000 looks at an empty queue");
        // The descriptor still follows the side list: readable with an event, not after.
        q.push(Ev::conn(EVT_CONNECT, 1, -1, 0, 1));
        assert!(readable(q.fd()));
        assert_eq!(q.dequeue(4, Some(Duration::ZERO)).unwrap().len(), 1);
        assert!(!readable(q.fd()));
    }

    #[test]
    fn side_events_wake_the_fd_and_come_out_in_order() {
        let q = Queue::new().unwrap();
        assert!(!readable(q.fd()));
        assert!(q.dequeue(4, Some(Duration::ZERO)).unwrap().is_empty());
        for i in 0..3 {
            q.push(Ev::conn(EVT_CONNECT, i, -1, 0, i as usize));
        }
        assert!(readable(q.fd()) && q.has_events());
        let got = q.dequeue(2, Some(Duration::ZERO)).unwrap();
        assert_eq!(got.iter().map(|e| e.sock).collect::<Vec<_>>(), [0, 1]);
        assert!(readable(q.fd()));
        assert_eq!(q.dequeue(8, None).unwrap().len(), 1);
        assert!(!readable(q.fd()) && !q.has_events());
        let t = Instant::now();
        assert!(q
            .dequeue(1, Some(Duration::from_millis(30)))
            .unwrap()
            .is_empty());
        assert!(t.elapsed() >= Duration::from_millis(30));
    }
}
