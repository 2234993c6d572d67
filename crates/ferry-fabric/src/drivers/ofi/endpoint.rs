//! A connection emulated on the domain's RDM endpoint: a peer address plus the peer's
//! connection id, which tags every data message sent to it.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::data_tag;
use super::domain::{DomainCore, Shared};
use super::ffi::{self, FiAddr, Meta, ADDR_UNSPEC};
use super::gate::Job;
use super::progress::{Op, Purpose};
use super::wire::Control;
use crate::caps::Capabilities;
use crate::cq::{Completion, CompletionQueue, OpKind};
use crate::error::{FabricError, Result};
use crate::grants::Grants;
use crate::mem::{LocalSlice, MemoryRegion, RemoteSlice};
use crate::{check_local, check_rma, check_rma_v, Domain, Endpoint};

/// `peer_sent` while the peer has not closed.
const PEER_OPEN: u64 = u64::MAX;

/// One connection's state, shared with the op records of its operations in flight (which
/// deliver into its queue even after the endpoint itself is gone).
pub(super) struct Conn {
    /// Our connection id: the peer tags data for us with it.
    pub id: u64,
    /// The peer's connection id: we tag data for it with it.
    pub peer_id: u64,
    /// The peer's address handle.
    pub peer: FiAddr,
    /// The peer, as text.
    pub peer_text: String,
    /// Where this connection's completions go.
    pub cq: CompletionQueue,
    /// Data messages posted (told to the peer on close).
    pub sent: AtomicU64,
    /// Data messages received (completed receives, including truncated ones).
    pub received: AtomicU64,
    /// Data messages the peer sent before closing, or [`PEER_OPEN`]; 0 after an abort.
    pub peer_sent: AtomicU64,
    /// The peer told us it closed (so closing needs no DISCONNECT).
    pub peer_said_bye: AtomicBool,
    /// Checked RMAs posted now wait to share one request (`Endpoint::hold_rma`).
    pub held: AtomicBool,
    /// What the peer may reach by checked RMA (off until enabled: see [`Grants`]).
    pub grants: Grants,
    next_recv: AtomicU64,
    /// Keepalive: when the connection was made, when the peer's driver last spoke
    /// (milliseconds since `born`), when we last pinged it, and whether it answers PINGs
    /// at all (1.0 peers do not; they are never declared dead for silence).
    born: Instant,
    heard_ms: AtomicU64,
    pinged_ms: AtomicU64,
    answers: AtomicBool,
    /// When the keepalive last looked (a long gap: this process was stopped or starved).
    looked_ms: AtomicU64,
}

/// What the keepalive sweep should do about a connection.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Liveness {
    /// Nothing for now.
    Fine,
    /// Send a PING.
    Ping,
    /// The peer answered PINGs before and has been silent longer than allowed.
    Dead,
}

impl Conn {
    /// A new connection with an empty queue.
    pub fn new(id: u64, peer_id: u64, peer: FiAddr, peer_text: String) -> Result<Conn> {
        Ok(Conn {
            id,
            peer_id,
            peer,
            peer_text,
            cq: CompletionQueue::new()?,
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            peer_sent: AtomicU64::new(PEER_OPEN),
            peer_said_bye: AtomicBool::new(false),
            held: AtomicBool::new(false),
            grants: Grants::new(false),
            next_recv: AtomicU64::new(0),
            born: Instant::now(),
            heard_ms: AtomicU64::new(0),
            pinged_ms: AtomicU64::new(0),
            answers: AtomicBool::new(false),
            looked_ms: AtomicU64::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The peer's driver spoke (a PING or PONG); `pong` proves it answers PINGs.
    pub fn heard(&self, pong: bool) {
        self.heard_ms.fetch_max(self.now_ms(), SeqCst);
        if pong {
            self.answers.store(true, SeqCst);
        }
    }

    /// The keepalive verdict, given the ping interval and the silence allowed. A PING is
    /// due at once on a new connection (to learn whether the peer answers), then whenever
    /// both the peer and we have been quiet for `every`. A pause is not a death: silence
    /// while this process itself was not looking (stopped or starved for half the limit, at
    /// most 2 s) is forgiven, and a peer whose process is there but stopped (SIGSTOP; shm,
    /// where the peer's pid is known) is waited for.
    pub fn liveness(&self, every: Duration, limit: Duration) -> Liveness {
        let now = self.now_ms();
        // Never looked at yet counts from the connection's birth (0): a connection whose
        // first look comes after a stop of this process is forgiven like any other.
        let looked = self.looked_ms.swap(now, SeqCst);
        let pause = (limit / 2).min(Duration::from_secs(2));
        if u128::from(now.saturating_sub(looked)) > pause.as_millis() {
            self.heard_ms.fetch_max(now, SeqCst);
        }
        let mut silent = now.saturating_sub(self.heard_ms.load(SeqCst));
        let answers = self.answers.load(SeqCst);
        // Looked at from half the limit on (a live peer answers a PING within
        // milliseconds), so a peer continued after a stop still has that long to answer.
        if answers
            && u128::from(silent) > (limit / 2).as_millis()
            && super::wedge::peer_stopped(&self.peer_text)
        {
            self.heard_ms.fetch_max(now, SeqCst);
            silent = 0;
        }
        if answers && u128::from(silent) > limit.as_millis() {
            return Liveness::Dead;
        }
        let since_ping = now.saturating_sub(self.pinged_ms.load(SeqCst));
        let first = !answers && self.pinged_ms.load(SeqCst) == 0;
        if first
            || (u128::from(silent) >= every.as_millis()
                && u128::from(since_ping) >= every.as_millis())
        {
            self.pinged_ms.store(now.max(1), SeqCst);
            return Liveness::Ping;
        }
        Liveness::Fine
    }

    /// Marks the connection broken, as if the peer had closed without sending anything:
    /// every receive fails. False if it was closed already.
    pub fn abort(&self) -> bool {
        self.peer_sent
            .compare_exchange(PEER_OPEN, 0, SeqCst, SeqCst)
            .is_ok()
    }

    /// Records the peer's DISCONNECT; only the first one counts.
    pub fn peer_left(&self, sent: u64) {
        let _ = self
            .peer_sent
            .compare_exchange(PEER_OPEN, sent, SeqCst, SeqCst);
        self.peer_said_bye.store(true, SeqCst);
    }

    /// How many data messages the peer sent, if it has closed.
    pub fn peer_closed(&self) -> Option<u64> {
        Some(self.peer_sent.load(SeqCst)).filter(|&n| n != PEER_OPEN)
    }
}

/// The error of posts on, and receives cancelled for, a connection the peer closed.
pub(super) fn peer_gone() -> FabricError {
    FabricError::ConnectionLost("the peer closed the connection".into())
}

impl Conn {
    /// Why posts on this closed connection fail.
    fn closed_error(&self) -> FabricError {
        if self.peer_said_bye.load(SeqCst) {
            peer_gone()
        } else {
            FabricError::ConnectionLost("the provider lost the transport to the peer".into())
        }
    }
}

/// An ofi connection.
pub(super) struct OfiEndpoint {
    core: Arc<DomainCore>,
    conn: Arc<Conn>,
}

impl OfiEndpoint {
    /// An endpoint for an established connection of `core`'s domain.
    pub fn new(core: Arc<DomainCore>, conn: Arc<Conn>) -> Self {
        Self { core, conn }
    }

    fn shared(&self) -> &Shared {
        &self.core.shared
    }

    fn user_op(&self, slices: &[LocalSlice], context: u64, kind: OpKind, len: u64) -> Op {
        Op {
            slices: slices.to_vec(),
            purpose: Purpose::User {
                conn: self.conn.clone(),
                context,
                kind,
                len,
                done: None,
            },
        }
    }

    fn rma(
        &self,
        read: bool,
        local: &[LocalSlice],
        remote: &[RemoteSlice],
        ctx: u64,
    ) -> Result<()> {
        let sh = self.shared();
        sh.gate.check()?;
        let total = match remote {
            [one] => check_rma(local, one, sh.id, &sh.caps)?,
            _ => check_rma_v(local, remote, sh.id, &sh.caps)?,
        };
        let remote = remote.to_vec();
        if self.conn.peer_closed().is_some() {
            return Err(self.conn.closed_error());
        }
        let kind = if read { OpKind::Read } else { OpKind::Write };
        let op = self.user_op(local, ctx, kind, total);
        ffi::validate(local)?;
        match &sh.rma {
            Some(rma) => sh.post_checked(rma, &self.conn, read, op, remote)?,
            None => {
                let conn = self.conn.clone();
                let run = move |sh: &Shared| {
                    let inside = sh.gate.enter_wait(sh)?;
                    inside.long(|| {
                        sh.fab
                            .rma(read, op, conn.peer, &remote, conn.id, &mut sh.again())
                    })?;
                    sh.wake();
                    Ok(())
                };
                sh.gate.call(sh, Job::new(run, self.fail_op(ctx, kind)))?;
            }
        }
        sh.wake();
        Ok(())
    }

    /// What a queued post of operation `context` does when the provider refuses it: the
    /// operation completes with the error.
    fn fail_op(&self, context: u64, kind: OpKind) -> impl FnOnce(&Shared, FabricError) + Send {
        let conn = self.conn.clone();
        move |_, e| conn.cq.push(Completion::err(context, kind, e))
    }
}

impl Endpoint for OfiEndpoint {
    fn domain(&self) -> Arc<dyn Domain> {
        self.core.handle()
    }

    fn capabilities(&self) -> &Capabilities {
        &self.shared().caps
    }

    fn cq(&self) -> &CompletionQueue {
        &self.conn.cq
    }

    fn peer(&self) -> String {
        self.conn.peer_text.clone()
    }

    fn local(&self) -> String {
        self.shared().local_text.clone()
    }

    /// Recorded for the checked-RMA path; providers whose NIC checks RMA cannot scope keys
    /// per connection (docs/fabric.md, "Threat model").
    fn grant(&self, region: &MemoryRegion) -> Result<()> {
        if region.domain() != self.shared().id {
            return Err(FabricError::InvalidArgument(
                "memory region belongs to another domain".into(),
            ));
        }
        if self.shared().rma.is_some() {
            self.conn.grants.grant(region);
        }
        Ok(())
    }

    fn enable_remote_access(&self) {
        self.conn.grants.enable();
    }

    fn post_send(&self, data: &[LocalSlice], context: u64) -> Result<()> {
        let sh = self.shared();
        sh.gate.check()?;
        let total = check_local(data, sh.id, &sh.caps)?;
        if self.conn.peer_closed().is_some() {
            return Err(self.conn.closed_error());
        }
        let tag = data_tag(self.conn.peer_id);
        ffi::validate(data)?;
        let conn = self.conn.clone();
        let fail = self.fail_op(context, OpKind::Send);
        if total <= sh.caps.inline_size as u64 {
            // Injected: copied now (the post may be queued), and the provider reports nothing.
            let mut bytes = vec![0u8; total as usize];
            let mut at = 0;
            for s in data {
                s.region
                    .buffer()
                    .read_at(s.offset, &mut bytes[at..at + s.len]);
                at += s.len;
            }
            let run = move |sh: &Shared| {
                sh.fab
                    .inject(&bytes, conn.peer, tag, &mut sh.again())
                    .inspect_err(|e| sh.give_up_if_stalled(&conn, e))?;
                conn.sent.fetch_add(1, SeqCst);
                conn.cq.push(Completion::ok(context, OpKind::Send, total));
                sh.wake();
                Ok(())
            };
            sh.gate.call(sh, Job::new(run, fail))?;
        } else {
            let op = self.user_op(data, context, OpKind::Send, total);
            let run = move |sh: &Shared| {
                sh.fab
                    .send(op, conn.peer, tag, conn.id, &mut sh.again())
                    .inspect_err(|e| sh.give_up_if_stalled(&conn, e))?;
                conn.sent.fetch_add(1, SeqCst);
                sh.wake();
                Ok(())
            };
            sh.gate.call(sh, Job::new(run, fail))?;
        }
        Ok(())
    }

    fn post_recv(&self, buf: &[LocalSlice], context: u64) -> Result<()> {
        let sh = self.shared();
        sh.gate.check()?;
        let total = check_local(buf, sh.id, &sh.caps)?;
        if let Some(sent) = self.conn.peer_closed() {
            // Messages the peer sent before closing may still be waiting unmatched.
            let pending = sh.fab.pending_recvs(self.conn.id).len() as u64;
            if self.conn.received.load(SeqCst) + pending >= sent {
                return Err(self.conn.closed_error());
            }
        }
        let meta = Meta {
            conn: self.conn.id,
            recv_seq: Some(self.conn.next_recv.fetch_add(1, SeqCst)),
            lost: false,
        };
        let src = if sh.directed {
            self.conn.peer
        } else {
            ADDR_UNSPEC
        };
        let op = self.user_op(buf, context, OpKind::Recv, total);
        ffi::validate(buf)?;
        let conn = self.conn.clone();
        let run = move |sh: &Shared| {
            sh.fab
                .recv(op, src, data_tag(conn.id), meta, &mut sh.again())?;
            // The peer may have closed meanwhile; this receive may be one too many.
            sh.reap(&conn);
            sh.wake();
            Ok(())
        };
        sh.gate
            .call(sh, Job::new(run, self.fail_op(context, OpKind::Recv)))
    }

    fn hold_rma(&self) {
        if self.shared().rma.is_some() {
            self.conn.held.store(true, SeqCst);
        }
    }

    fn release_rma(&self) -> Result<()> {
        if self.conn.held.swap(false, SeqCst) {
            let sh = self.shared();
            sh.flush_rma_batches();
            sh.wake();
        }
        Ok(())
    }

    fn post_write(&self, local: &[LocalSlice], remote: RemoteSlice, context: u64) -> Result<()> {
        self.rma(false, local, &[remote], context)
    }

    fn post_read(&self, local: &[LocalSlice], remote: RemoteSlice, context: u64) -> Result<()> {
        self.rma(true, local, &[remote], context)
    }

    fn post_write_v(
        &self,
        local: &[LocalSlice],
        remote: &[RemoteSlice],
        context: u64,
    ) -> Result<()> {
        self.rma(false, local, remote, context)
    }

    fn post_read_v(
        &self,
        local: &[LocalSlice],
        remote: &[RemoteSlice],
        context: u64,
    ) -> Result<()> {
        self.rma(true, local, remote, context)
    }
}

impl Drop for OfiEndpoint {
    fn drop(&mut self) {
        let sh = self.shared();
        sh.remove_conn(self.conn.id);
        if !self.conn.peer_said_bye.load(SeqCst) {
            // After an abort the peer may not have heard of it yet: say nothing was sent,
            // and do not wait for a transport that is likely gone. The count is taken when
            // the DISCONNECT leaves, after every send queued before it.
            let aborted = self.conn.peer_closed().is_some();
            let conn = self.conn.clone();
            let run = move |sh: &Shared| {
                let bye = Control::Disconnect {
                    target: conn.peer_id,
                    sender: conn.id,
                    sent: if aborted { 0 } else { conn.sent.load(SeqCst) },
                };
                if aborted {
                    sh.try_send_control(conn.peer, &bye)
                } else {
                    sh.send_control(conn.peer, &bye)
                }
            };
            let text = self.conn.peer_text.clone();
            let fail = move |_: &Shared, e: FabricError| {
                tracing::debug!("cannot tell {text} about the close: {e}");
            };
            if let Err(e) = sh.gate.call(sh, Job::new(run, fail)) {
                tracing::debug!("cannot tell {} about the close: {e}", self.conn.peer_text);
            }
        }
        let id = self.conn.id;
        sh.cancel_recvs(move |m| m.conn == id);
        sh.wake();
    }
}
