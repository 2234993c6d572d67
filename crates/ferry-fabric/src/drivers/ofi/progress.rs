//! Driving the provider and routing its completions.
//!
//! tcp (through ofi_rxm) and shm progress data only when their CQ is read, and the target
//! side of an RMA needs that as much as the initiator, so every domain runs one progress
//! thread. Completions are routed by their context (the op record) to the owning
//! connection's ferry queue, wherever they are read: user threads also read the CQ while a
//! post waits out -FI_EAGAIN.
//!
//! Idle strategy, for 2-core hosts: poll without pause for [`SPIN`] after the last completion
//! (a ping-pong reply on the same host comes back well within it), then, while user operations
//! are in flight, poll between `yield`s up to [`YIELD`]; after that sleep, in the kernel on the
//! CQ's wait object where the provider has one (woken by `fi_cq_signal` when a post needs
//! progress), else in naps doubling up to [`MAX_NAP`] (woken by `unpark`).

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::domain::Shared;
use super::endpoint::Conn;
use super::ffi::{errno, strerror, CqError, Event};
use crate::cq::{Completion, OpKind};
use crate::error::{FabricError, RemoteAccessError};
use crate::mem::LocalSlice;

/// Busy polling after the last completion.
const SPIN: Duration = Duration::from_micros(50);
/// Polling with `yield` while user operations are in flight.
const YIELD: Duration = Duration::from_millis(2);
/// Shortest and longest nap without a wait object.
const MIN_NAP: Duration = Duration::from_micros(50);
const MAX_NAP: Duration = Duration::from_millis(1);
/// Kernel sleep on the CQ wait object, with and without user operations in flight.
const WAIT_BUSY: Duration = Duration::from_millis(10);
const WAIT_IDLE: Duration = Duration::from_millis(100);

/// An operation handed to libfabric.
pub(super) struct Op {
    /// Memory the provider reads or writes until completion, held so it cannot be freed.
    pub slices: Vec<LocalSlice>,
    /// Where the completion goes.
    pub purpose: Purpose,
}

/// What a completion means.
pub(super) enum Purpose {
    /// A user operation: its completion goes to the connection's queue.
    User {
        conn: Arc<Conn>,
        context: u64,
        kind: OpKind,
        /// Bytes the operation covers (receives: the buffer size).
        len: u64,
    },
    /// One of the domain's standing control receives.
    ControlRecv,
    /// A control message; `connect` is the connection attempt waiting on it.
    ControlSend { connect: Option<u64> },
}

/// Reads one batch of completions (sleeping up to `wait` for the first one if the CQ has a
/// wait object) and routes them. Returns how many were handled.
pub(super) fn progress(shared: &Shared, wait: Option<Duration>) -> usize {
    let mut events = Vec::new();
    shared.fab.read_cq(16, wait, &mut events);
    let n = events.len();
    for ev in events {
        route(shared, ev);
    }
    n
}

fn route(shared: &Shared, ev: Event) {
    let Some((op, meta)) = shared.fab.take(ev.ctx) else {
        tracing::warn!("completion for an unknown context {:#x}", ev.ctx);
        return;
    };
    let Op { slices, purpose } = op;
    match purpose {
        Purpose::User {
            conn,
            context,
            kind,
            len,
        } => {
            let (done, result) = match ev.err {
                None if kind == OpKind::Recv => (ev.len as u64, Ok(())),
                None => (len, Ok(())),
                Some(e) => {
                    let placed = if e.code == errno::ETRUNC { len } else { 0 };
                    (placed, Err(map_error(kind, e, meta.lost, len)))
                }
            };
            // Release the memory before reporting, so a caller woken by the completion finds
            // itself the sole owner of its buffer again.
            drop(slices);
            let received = kind == OpKind::Recv
                && (ev.err.is_none() || ev.err.is_some_and(|e| e.code == errno::ETRUNC));
            conn.cq.push(Completion {
                context,
                op: kind,
                len: done,
                result,
            });
            if received {
                conn.received.fetch_add(1, SeqCst);
                shared.reap(&conn);
            }
        }
        Purpose::ControlRecv => shared.on_control(ev, slices),
        Purpose::ControlSend { connect } => {
            if let Some(e) = ev.err {
                let err = map_error(OpKind::Send, e, false, 0);
                match connect {
                    Some(id) => shared.connect_failed(id, err),
                    None => tracing::debug!("control send failed: {err}"),
                }
            }
        }
    }
}

/// Turns a provider error completion into the ferry error for an operation of `kind`
/// covering `len` bytes.
pub(super) fn map_error(kind: OpKind, e: CqError, lost: bool, len: u64) -> FabricError {
    let rma = matches!(kind, OpKind::Write | OpKind::Read);
    let text = || format!("{} (provider errno {})", strerror(e.code), e.prov_errno);
    match e.code {
        errno::ECANCELED if lost => {
            FabricError::ConnectionLost("the peer closed the connection".into())
        }
        errno::ECANCELED => FabricError::Cancelled,
        errno::ETRUNC => FabricError::Truncated {
            msg_len: len.saturating_add(e.olen as u64),
            buf_len: len,
        },
        errno::EKEYREJECTED | errno::ENOKEY if rma => {
            FabricError::RemoteAccess(RemoteAccessError::UnknownKey)
        }
        errno::EACCES | errno::EINVAL | errno::EFAULT | errno::EIO | errno::EREMOTEIO if rma => {
            FabricError::RemoteAccess(RemoteAccessError::Other)
        }
        errno::ECONNREFUSED
        | errno::ECONNRESET
        | errno::ECONNABORTED
        | errno::ENOTCONN
        | errno::EPIPE
        | errno::EHOSTUNREACH
        | errno::ETIMEDOUT => FabricError::ConnectionLost(text()),
        code => FabricError::Ofi {
            call: "fi_cq_readerr",
            code,
            msg: text(),
        },
    }
}

/// The progress thread's loop; returns when the domain stops.
pub(super) fn run(shared: Arc<Shared>) {
    let mut last = Instant::now();
    let mut nap = MIN_NAP;
    while !shared.stopping() {
        if progress(&shared, None) > 0 {
            last = Instant::now();
            nap = MIN_NAP;
            continue;
        }
        let idle = last.elapsed();
        if idle < SPIN {
            std::hint::spin_loop();
            continue;
        }
        let busy = shared.user_ops_in_flight();
        if busy && idle < YIELD {
            std::thread::yield_now();
            continue;
        }
        shared.sleeping.store(true, SeqCst);
        let n = if shared.fab.has_wait() {
            progress(&shared, Some(if busy { WAIT_BUSY } else { WAIT_IDLE }))
        } else {
            // One more look after announcing the sleep, so a post that saw us awake is not
            // left waiting for a whole nap.
            let n = progress(&shared, None);
            if n == 0 {
                std::thread::park_timeout(nap);
                nap = (nap * 2).min(MAX_NAP);
            }
            n
        };
        shared.sleeping.store(false, SeqCst);
        if n > 0 {
            last = Instant::now();
            nap = MIN_NAP;
        }
    }
}
