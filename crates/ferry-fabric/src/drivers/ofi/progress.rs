//! Driving the provider and routing its completions.
//!
//! tcp (through ofi_rxm) and shm progress data only when their CQ is read, and the target
//! side of an RMA needs that as much as the initiator, so every domain runs one progress
//! thread. Completions are routed by their context (the op record) to the owning
//! connection's ferry queue, wherever they are read: user threads also read the CQ while a
//! post waits out -FI_EAGAIN.
//!
//! Idle strategy, for 2-core hosts: after the last completion (or the end of a CQ read
//! that worked inside the provider for [`BUSY_CALL`] or more), poll between `yield`s for
//! [`SPIN`], on up to [`YIELD`] while sends or RMAs are in flight and up to [`RECV_YIELD`]
//! while only receives are posted; then nap, doubling from
//! [`MIN_NAP`] to [`MAX_NAP`] ([`GRANTED_NAP`] at most on shm while peers hold checked-RMA
//! grants to our memory; [`DEEP_NAP`] for a domain long quiet with no operation posted). A
//! post wakes a napping thread at once (`unpark`), so only traffic nobody on this side
//! initiated (an incoming message for a receive posted long ago, the target side of RMA)
//! can wait up to one nap.
//!
//! On shm, while a peer holds this endpoint's region lock (its CMA copy of an RMA into or
//! out of our memory), the thread waits [`HELD_NAP`] at a time instead of entering the
//! provider, where a CQ read would spin on that lock until the copy ends
//! (`region_lock.rs`).
//!
//! Polling with `yield` beat busy-polling (which starves the application's own threads on 2
//! cores) and napping early in 8-byte ping-pong, and costs little CPU idle (figures:
//! docs/fabric.md, "Driver tuning").

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::domain::{Reply, Shared};
use super::endpoint::Conn;
use super::ffi::{errno, strerror, CqError, Event};
use super::region_lock::RegionLock;
use crate::cq::{Completion, OpKind};
use crate::error::{FabricError, RemoteAccessError};
use crate::mem::LocalSlice;

/// Polling after the last completion, in any case.
const SPIN: Duration = Duration::from_micros(50);
/// Polling with `yield` while sends or RMAs are in flight.
const YIELD: Duration = Duration::from_millis(2);
/// Polling with `yield` while only receives are posted. Upper layers keep receives posted
/// all the time (EXS: one per credit), so polling for them as long as for RMAs kept a
/// thread spinning on every EXS connection, taking CPU from the copies on 2 cores; this
/// window still covers a reply in a ping-pong (EXS round trips are well under 250 µs).
const RECV_YIELD: Duration = Duration::from_micros(250);
/// Shortest and longest nap.
const MIN_NAP: Duration = Duration::from_micros(50);
const MAX_NAP: Duration = Duration::from_millis(1);
/// Longest nap of a domain quiet for [`DEEP_IDLE_AFTER`] with nothing posted but its
/// control receives (no connection, no user operation): a server waiting for clients. At
/// [`MAX_NAP`] such a domain woke about 900 times a second, and twelve idle servers beside
/// a copy slowed it by a sixth (docs/fabric.md, "Driver tuning"). What it costs: the first
/// message of a new peer waits up to one such nap; anything posted here wakes the thread.
const DEEP_NAP: Duration = Duration::from_millis(10);
/// How long a domain with no user operation must be without a completion before it naps
/// up to [`DEEP_NAP`].
const DEEP_IDLE_AFTER: Duration = Duration::from_secs(1);
/// Longest nap on shm (where the initiator copies, `gate.rs`) while peers hold grants to
/// our memory (checked RMA): they are reading or writing it and will speak soon (RMA_DONE,
/// then typically an EXS ACK that frees the next send). Napping up to [`MAX_NAP`] there
/// delayed ACKs by up to a millisecond on the sending side of EXS transfers over shm. Only
/// there: on tcp;ofi_rxm it was not shown to help (docs/fabric.md, "Driver tuning").
const GRANTED_NAP: Duration = Duration::from_micros(100);

/// A CQ read that took at least this long did work inside the provider even if it returned
/// no completion: shm's command path (a peer's RMA over several remote ranges) copies in
/// the *target's* `fi_cq_read`, about 300 µs for 4 MiB, and yields nothing on the target's
/// CQ. Counting from the call's end, not from the last completion, keeps the thread polling
/// for the message that typically follows the copy (EXIO's completion notification);
/// before, the idle clock ran out during the copy and the thread napped at once. An empty CQ
/// read takes about a microsecond (measured: docs/fabric.md, "Driver tuning").
const BUSY_CALL: Duration = Duration::from_micros(20);

/// A peer holding this endpoint's shm region lock longer than this is copying (a CMA copy
/// of an RMA: about a millisecond per 4 MiB piece), not putting a message in our queue.
const HELD_SHORT: Duration = Duration::from_micros(20);
/// How long the progress thread waits, off the CPU, while a peer copies, before it looks
/// again.
const HELD_NAP: Duration = Duration::from_micros(50);
/// How long the lock may stay held before the thread enters the provider anyway, to spin
/// there under the watchdog's eye (`wedge.rs`: a peer killed holding it): far longer than
/// any copy.
const HELD_MAX: Duration = Duration::from_millis(100);

/// For how long a peer has held our shm region's lock (`region_lock.rs`), if it holds it
/// now, so that a CQ read would spin until it lets go; `since` keeps when that began, and
/// after [`HELD_MAX`] the answer is `None`.
fn peer_holds_region(lock: Option<&RegionLock>, since: &mut Option<Instant>) -> Option<Duration> {
    if !lock.is_some_and(RegionLock::held) {
        *since = None;
        return None;
    }
    let held = since.get_or_insert_with(Instant::now).elapsed();
    (held < HELD_MAX).then_some(held)
}

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
        /// A checked RMA's token, to release the target's grant when done.
        done: Option<u64>,
    },
    /// One of the domain's standing control receives.
    ControlRecv,
    /// A control message; `connect` is the connection attempt waiting on it.
    ControlSend { connect: Option<u64> },
}

/// Reads one batch of completions and routes them. Returns how many were handled.
/// 0 also when another thread is in the provider (`gate.rs`): that thread progresses.
pub(super) fn progress(shared: &Shared) -> usize {
    let Some(inside) = shared.gate.enter(shared) else {
        return 0;
    };
    let mut events = Vec::new();
    shared.fab.read_cq(16, &mut events);
    let n = events.len() + shared.flush_rma_batches();
    for ev in events {
        route(shared, ev);
        // Calls that queued while this completion was handled (an shm RMA copies inside
        // its post) go before the next one.
        inside.run_queued();
    }
    // One granted RMA per round, so the completions of each are routed before the next.
    n + inside.run_bulk_one()
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
            done: token,
        } => {
            let (done, result) = match ev.err {
                // More than the buffer holds arrived: the rest went to the sink.
                None if kind == OpKind::Recv && ev.len as u64 > len => {
                    shared.fab.release_sink();
                    let msg_len = ev.len as u64;
                    (
                        len,
                        Err(FabricError::Truncated {
                            msg_len,
                            buf_len: len,
                        }),
                    )
                }
                None if kind == OpKind::Recv => (ev.len as u64, Ok(())),
                None => (len, Ok(())),
                Some(e) => {
                    // What the provider says it placed, never more than the buffer.
                    let placed = if e.code == errno::ETRUNC {
                        (ev.len as u64).min(len)
                    } else {
                        0
                    };
                    (placed, Err(map_error(kind, e, meta.lost, len)))
                }
            };
            // Release the memory before reporting, so a caller woken by the completion finds
            // itself the sole owner of its buffer again.
            drop(slices);
            let lost_transport = ev.err.is_some_and(|e| transport_lost(kind, e.code));
            let received = kind == OpKind::Recv
                && (result.is_ok() || matches!(result, Err(FabricError::Truncated { .. })));
            // Release the target's grant before reporting too: the caller may answer its peer
            // at once (an EXS ACK), and the peer may deregister the region as soon as it reads
            // that answer; the release must be ahead of it on the wire.
            if let Some(token) = token {
                shared.rma_done(&conn, token);
            }
            crate::timeline::mark("ofi.cq", kind as u64);
            // Counted before it is reported: a caller woken by this completion that posts
            // another receive on a connection its peer closed must find it counted, or that
            // receive is taken (and only failed later) instead of refused at once.
            if received {
                conn.received.fetch_add(1, SeqCst);
            }
            conn.cq.push(Completion {
                context,
                op: kind,
                len: done,
                result,
            });
            if received {
                shared.reap(&conn);
            }
            if lost_transport {
                shared.abort(&conn);
            }
        }
        Purpose::ControlRecv => shared.on_control(ev, slices),
        Purpose::ControlSend { connect } => {
            if let Some(e) = ev.err {
                let err = map_error(OpKind::Send, e, false, 0);
                match connect {
                    // Refused outright (nobody listens) fails; a transport being torn down
                    // (tcp after a refused RMA, until ofi_rxm reconnects) is retried.
                    Some(id)
                        if e.code != errno::ECONNREFUSED
                            && transport_lost(OpKind::Send, e.code) =>
                    {
                        shared.connect_failed(id, Reply::Retry(err))
                    }
                    Some(id) => shared.connect_failed(id, Reply::Failed(err)),
                    None => tracing::debug!("control send failed: {err}"),
                }
            }
        }
    }
}

/// True if an error means the provider tore down the transport under the connection (tcp
/// does so when the target refuses an RMA, or the peer dies): messages may have been lost.
fn transport_lost(kind: OpKind, code: i32) -> bool {
    is_transport_error(code) || (code == errno::ECANCELED && kind != OpKind::Recv)
}

/// Errors by which a provider says the connection underneath is gone.
fn is_transport_error(code: i32) -> bool {
    matches!(
        code,
        errno::ECONNREFUSED
            | errno::ECONNRESET
            | errno::ECONNABORTED
            | errno::ENOTCONN
            | errno::EPIPE
            | errno::EHOSTUNREACH
            | errno::ETIMEDOUT
    )
}

/// Turns a provider error completion into the ferry error for an operation of `kind`
/// covering `len` bytes.
pub(super) fn map_error(kind: OpKind, e: CqError, lost: bool, len: u64) -> FabricError {
    let rma = matches!(kind, OpKind::Write | OpKind::Read);
    let text = || format!("{} (provider errno {})", strerror(e.code), e.prov_errno);
    match e.code {
        errno::ECANCELED if kind == OpKind::Recv && lost => FabricError::ConnectionLost(
            "the peer closed the connection, or the provider lost it".into(),
        ),
        errno::ECANCELED if kind == OpKind::Recv => FabricError::Cancelled,
        // ferry cancels only receives: anything else was aborted by the provider, which is how
        // tcp refuses a bad RMA (the target drops the connection when ofi_mr_verify fails).
        errno::ECANCELED if rma => FabricError::RemoteAccess(RemoteAccessError::Other),
        errno::ECANCELED => {
            FabricError::ConnectionLost(format!("the provider aborted the operation: {}", text()))
        }
        // Where the provider does not say by how much, only a lower bound is known.
        errno::ETRUNC => FabricError::Truncated {
            msg_len: len.saturating_add((e.olen as u64).max(1)),
            buf_len: len,
        },
        errno::EKEYREJECTED | errno::ENOKEY if rma => {
            FabricError::RemoteAccess(RemoteAccessError::UnknownKey)
        }
        errno::EACCES | errno::EINVAL | errno::EFAULT | errno::EIO | errno::EREMOTEIO if rma => {
            FabricError::RemoteAccess(RemoteAccessError::Other)
        }
        code if is_transport_error(code) => FabricError::ConnectionLost(text()),
        code => FabricError::Ofi {
            call: "fi_cq_readerr",
            code,
            msg: text(),
        },
    }
}

/// The longest nap after `quiet` without a completion: [`DEEP_NAP`] once a domain with no
/// user operation in flight has been quiet for [`DEEP_IDLE_AFTER`], else [`MAX_NAP`].
fn longest_nap(quiet: Duration, user_ops_in_flight: bool) -> Duration {
    if !user_ops_in_flight && quiet >= DEEP_IDLE_AFTER {
        DEEP_NAP
    } else {
        MAX_NAP
    }
}

/// The progress thread's loop; returns when the domain stops.
pub(super) fn run(shared: Arc<Shared>) {
    let mut last = Instant::now();
    // When a completion last came or a peer last copied into our memory: unlike `last`,
    // not moved by a CQ read that only took long (one preempted on a loaded host would
    // keep an idle domain out of its long naps).
    let mut last_completion = Instant::now();
    let mut nap = MIN_NAP;
    let sweep_every = (shared.keepalive.every / 2).max(Duration::from_millis(10));
    let mut next_sweep = Instant::now();
    let region_lock = shared
        .gate
        .enabled()
        .then(|| shared.own_shm_region())
        .filter(|_| std::env::var_os("FERRY_TEST_NO_REGION_LOCK").is_none())
        .flatten()
        .and_then(|name| RegionLock::find(&name));
    let mut held_since = None;
    #[cfg(feature = "test-hooks")]
    let wedge_at = super::wedge::test_wedge_at();
    while !shared.stopping() {
        #[cfg(feature = "test-hooks")]
        if wedge_at.is_some_and(|t| Instant::now() >= t) {
            super::wedge::simulate_stuck_call(&shared);
        }
        if Instant::now() >= next_sweep {
            shared.keepalive();
            next_sweep = Instant::now() + sweep_every;
        }
        if let Some(held) = peer_holds_region(region_lock.as_ref(), &mut held_since) {
            // A message being put in our queue holds the lock for a microsecond or two;
            // only a copy holds it longer.
            if held < HELD_SHORT {
                std::hint::spin_loop();
            } else {
                std::thread::park_timeout(HELD_NAP);
            }
            last = Instant::now();
            last_completion = last;
            nap = MIN_NAP;
            continue;
        }
        let began = Instant::now();
        let handled = progress(&shared);
        if handled > 0 || began.elapsed() >= BUSY_CALL {
            last = Instant::now();
            if handled > 0 {
                last_completion = last;
            }
            // A long CQ read with no completion is a copy into our memory (shm), which
            // only happens with user operations posted. Without them it is the provider's
            // own slow read after a nap (tcp;ofi_rxm), and must not end the long naps.
            if handled > 0 || shared.user_ops_in_flight() {
                nap = MIN_NAP;
            }
            continue;
        }
        let idle = last.elapsed();
        let poll = idle < SPIN
            || (idle < YIELD && shared.active_ops())
            || (idle < RECV_YIELD && shared.user_ops_in_flight());
        if poll {
            std::thread::yield_now();
            continue;
        }
        shared.sleeping.store(true, SeqCst);
        // One more look after announcing the nap: a post that saw this thread awake did not
        // wake it.
        if progress(&shared) == 0 {
            if shared.gate.enabled() && shared.rma.as_ref().is_some_and(|r| r.granted()) {
                nap = nap.min(GRANTED_NAP);
            }
            crate::timeline::mark("ofi.nap", nap.as_micros() as u64);
            std::thread::park_timeout(nap);
            crate::timeline::mark("ofi.up", 0);
            let quiet = last_completion.elapsed();
            nap = (nap * 2).min(longest_nap(quiet, shared.user_ops_in_flight()));
        } else {
            last = Instant::now();
            last_completion = last;
            nap = MIN_NAP;
        }
        shared.sleeping.store(false, SeqCst);
    }
}
