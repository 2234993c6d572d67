//! Checked RMA, for providers whose own target-side checks cannot be relied on (see
//! `info::Quirks`): before the initiator hands an RMA to the provider, the target's driver
//! checks that the key was granted to this connection and remote access is enabled
//! ([`crate::grants`]: otherwise one uniform refusal, and the connection is closed after a
//! few), then bounds and rights, and, if granted, holds the region (registration and memory)
//! until the initiator reports the access done.
//!
//! ```text
//! initiator                                   target
//!   post_write/read ── RMA_REQUEST{token} ──▶ check key, bounds, rights; lease the region
//!   provider RMA    ◀── RMA_ANSWER{0} ───────
//!   completion      ── RMA_DONE{token} ─────▶ release the lease
//!        (or: ◀── RMA_ANSWER{refusal}: the op completes with RemoteAccess, nothing touched)
//! ```
//!
//! It costs one round trip per request and gives exact refusal reasons for granted keys. RMAs posted while a
//! request for the same connection, key and direction is unanswered wait for it and then
//! share one request for the range spanning them all (the EXIO pattern posts one RMA per
//! destination segment, all together: 16 segments cost 2 requests, not 16), and one
//! RMA_DONE once the last of them completes. RMAs posted while their connection is held
//! (`Endpoint::hold_rma`) wait without a request and share the one sent at the release:
//! ferry-noncontig's zero-copy transfer of EXIO's 4 MiB message then costs one request, not
//! 2–3, and its later writes no longer wait for the target to finish copying the first
//! before their request is answered (shm's target handles control messages after the copies
//! queued ahead of them; measured: docs/fabric.md, "Driver tuning"). A refused shared
//! request is retried one RMA per request, so each still fails (or not) for its own reason.

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use super::domain::Shared;
use super::endpoint::Conn;
use super::gate::Job;
use super::lock;
use super::progress::{Op, Purpose};
use super::wire::Control;
use crate::cq::Completion;
use crate::error::{FabricError, RemoteAccessError, Result};
use crate::grants::{Refusal, REFUSALS_BEFORE_CLOSE};
use crate::mem::{Access, MemoryRegion, RemoteSlice};

/// An RMA waiting for the target's answer.
struct Pending {
    op: Op,
    conn: Arc<Conn>,
    /// Its remote ranges (at least one, all of one key).
    remote: Vec<RemoteSlice>,
    read: bool,
}

impl Pending {
    /// The key of its remote ranges.
    fn key(&self) -> u64 {
        self.remote.first().map_or(0, |r| r.key)
    }
}

/// What RMAs share a request: connection id, key, write.
type BatchKey = (u64, u64, bool);

/// One domain's checked-RMA state, both as initiator and as target.
#[derive(Default)]
pub(super) struct Checked {
    /// Granted accesses by (our connection id, token).
    leases: Mutex<HashMap<(u64, u64), MemoryRegion>>,
    /// Unanswered requests by token, with the RMAs each one covers.
    pending: Mutex<HashMap<u64, Vec<Pending>>>,
    /// A request is unanswered for this connection, key and direction: RMAs posted
    /// meanwhile wait here to share the next one.
    batches: Mutex<HashMap<BatchKey, Vec<Pending>>>,
    /// RMAs waiting in `batches` (lets the progress thread skip the lock when none do).
    queued: AtomicUsize,
    /// Granted tokens shared by several RMAs: how many have not completed yet.
    shares: Mutex<HashMap<u64, usize>>,
    next_token: AtomicU64,
}

impl Checked {
    /// True if peers hold grants to our regions.
    pub fn granted(&self) -> bool {
        !lock(&self.leases).is_empty()
    }

    /// True if RMAs wait for the target's answer.
    pub fn waiting(&self) -> bool {
        !lock(&self.pending).is_empty() || lock(&self.batches).values().any(|q| !q.is_empty())
    }
}

/// Checks an access to `region` (which the peer was granted) for bounds and rights.
fn check(
    region: MemoryRegion,
    remote: RemoteSlice,
    write: bool,
    virt_addr: bool,
) -> Result<MemoryRegion, RemoteAccessError> {
    let need = if write {
        Access::REMOTE_WRITE
    } else {
        Access::REMOTE_READ
    };
    if !region.access().contains(need) {
        return Err(RemoteAccessError::NoPermission);
    }
    let base = if virt_addr {
        region.buffer().addr() as u64
    } else {
        0
    };
    let end = remote
        .addr
        .checked_sub(base)
        .and_then(|start| start.checked_add(remote.len));
    match end {
        Some(end) if end <= region.len() as u64 => Ok(region),
        _ => Err(RemoteAccessError::OutOfBounds),
    }
}

impl Shared {
    /// Initiator: asks the target to grant `op` (an RMA of the ranges `remote`, all of one
    /// key) before posting it, or, if a request for the same key and direction is
    /// unanswered, queues it to share the next one. `rma` is this domain's checked-RMA state.
    pub fn post_checked(
        &self,
        rma: &Checked,
        conn: &Arc<Conn>,
        read: bool,
        op: Op,
        remote: Vec<RemoteSlice>,
    ) -> Result<()> {
        let pending = Pending {
            op,
            conn: conn.clone(),
            remote,
            read,
        };
        let key = pending.key();
        {
            let mut batches = lock(&rma.batches);
            match batches.get_mut(&(conn.id, key, !read)) {
                Some(queue) => {
                    crate::timeline::mark("rma.wait", pending.remote.first().map_or(0, |r| r.addr));
                    queue.push(pending);
                    rma.queued.fetch_add(1, SeqCst);
                    return Ok(());
                }
                // Held (`Endpoint::hold_rma`): wait for the release, which sends one
                // request for everything posted meanwhile.
                None if conn.held.load(SeqCst) => {
                    crate::timeline::mark("rma.hold", pending.remote.first().map_or(0, |r| r.addr));
                    batches.insert((conn.id, key, !read), vec![pending]);
                    rma.queued.fetch_add(1, SeqCst);
                    return Ok(());
                }
                None => {
                    batches.insert((conn.id, key, !read), Vec::new());
                }
            }
        }
        self.request(rma, vec![pending]).map_err(|(e, _)| {
            lock(&rma.batches).remove(&(conn.id, key, !read));
            e
        })
    }

    /// Sends one request covering every RMA of `ops` (one connection, key and direction):
    /// the range from the lowest address to the highest end among all their ranges (so the
    /// grant bounds-checks every range). On failure the RMAs come back unposted.
    fn request(
        &self,
        rma: &Checked,
        ops: Vec<Pending>,
    ) -> std::result::Result<(), (FabricError, Vec<Pending>)> {
        let Some(first) = ops.first() else {
            return Ok(());
        };
        let (conn, read, key) = (first.conn.clone(), first.read, first.key());
        let ranges = || ops.iter().flat_map(|p| p.remote.iter());
        let lo = ranges().map(|r| r.addr).min().unwrap_or(0);
        // A range that wraps saturates, so the span leaves the region and is refused.
        let hi = ranges()
            .map(|r| r.addr.saturating_add(r.len))
            .max()
            .unwrap_or(lo);
        let span = RemoteSlice {
            addr: lo,
            len: hi - lo,
            key,
        };
        let token = rma.next_token.fetch_add(1, SeqCst);
        crate::timeline::mark("rma.ask", token);
        lock(&rma.pending).insert(token, ops);
        let ask = Control::RmaRequest {
            target: conn.peer_id,
            sender: conn.id,
            token,
            remote: span,
            write: !read,
        };
        // Queued behind a copy and then refused: the RMAs fail as if the target had not
        // answered.
        let fail = move |sh: &Shared, e: FabricError| {
            let ops = sh
                .rma
                .as_ref()
                .and_then(|r| lock(&r.pending).remove(&token));
            if let Some(ops) = ops {
                fail_all(ops, &e);
            }
        };
        if let Err(e) = self.send_control_or(conn.peer, &ask, fail) {
            let ops = lock(&rma.pending).remove(&token).unwrap_or_default();
            return Err((e, ops));
        }
        Ok(())
    }

    /// Target: checks a request from the peer of connection `target` and answers it.
    pub fn on_rma_request(
        &self,
        target: u64,
        sender: u64,
        token: u64,
        remote: RemoteSlice,
        write: bool,
    ) {
        let (Some(rma), Some(conn)) = (&self.rma, self.conn(target)) else {
            tracing::debug!("RMA request for unknown connection {target}");
            return;
        };
        if conn.peer_id != sender {
            return;
        }
        crate::timeline::mark("rma.req", token);
        let granted = match conn.grants.lookup(remote.key) {
            Ok(region) => check(region, remote, write, self.caps.virt_addr),
            Err(Refusal::Stale) => Err(RemoteAccessError::StaleKey),
            Err(Refusal::Uniform) => {
                if conn.grants.refused(remote.key) {
                    let why = "the peer kept asking for memory it was not granted";
                    if self.abort_because(&conn, why) {
                        tracing::warn!(
                            "ofi: closing the connection of {}: remote memory accesses with \
                             {REFUSALS_BEFORE_CLOSE} keys it was never granted (or before it \
                             was authenticated)",
                            conn.peer_text
                        );
                    }
                    return;
                }
                Err(RemoteAccessError::UnknownKey)
            }
        };
        let status = match granted {
            Ok(region) => {
                lock(&rma.leases).insert((target, token), region);
                0
            }
            Err(why) => why as u8,
        };
        let answer = Control::RmaAnswer {
            target: sender,
            token,
            status,
        };
        let release = move |sh: &Shared, e: FabricError| {
            tracing::debug!("cannot answer an RMA request: {e}");
            if let Some(rma) = &sh.rma {
                lock(&rma.leases).remove(&(target, token));
            }
        };
        if let Err(e) = self.send_control_or(conn.peer, &answer, release) {
            tracing::debug!("cannot answer an RMA request: {e}");
            lock(&rma.leases).remove(&(target, token));
        }
    }

    /// Initiator: the target answered the request `token` of our connection `target`; post
    /// its RMAs or fail them, then send the request the RMAs queued meanwhile share.
    pub fn on_rma_answer(&self, target: u64, token: u64, status: u8) {
        let Some(rma) = &self.rma else {
            return;
        };
        crate::timeline::mark("rma.ans", token);
        let ops = {
            let mut pending = lock(&rma.pending);
            match pending.get(&token) {
                Some(ops) if ops.first().is_some_and(|p| p.conn.id == target) => {
                    pending.remove(&token)
                }
                _ => None,
            }
        };
        let Some(ops) = ops else {
            // Failed meanwhile (peer closed, connection lost): give a grant back.
            if let Some(conn) = self.conn(target).filter(|_| status == 0) {
                self.rma_done(&conn, token);
            }
            return;
        };
        let Some(batch) = ops.first().map(|p| (p.conn.id, p.key(), !p.read)) else {
            return;
        };
        if status != 0 && ops.len() > 1 {
            // A shared request refused: ask again one RMA at a time, for exact reasons.
            for p in ops {
                if let Err((e, back)) = self.request(rma, vec![p]) {
                    fail_all(back, &e);
                }
            }
        } else if status != 0 {
            let why = RemoteAccessError::from_wire(status);
            ops.into_iter()
                .for_each(|p| fail(p, FabricError::RemoteAccess(why)));
        } else {
            if ops.len() > 1 {
                lock(&rma.shares).insert(token, ops.len());
            }
            for p in ops {
                self.post_granted(p, token);
            }
        }
        // The RMAs that waited for this answer share the next request.
        let queued = {
            let mut batches = lock(&rma.batches);
            match batches.get_mut(&batch) {
                Some(q) if !q.is_empty() => {
                    rma.queued.fetch_sub(q.len(), SeqCst);
                    std::mem::take(q)
                }
                Some(_) => {
                    batches.remove(&batch);
                    Vec::new()
                }
                None => Vec::new(),
            }
        };
        if let Err((e, back)) = self.request(rma, queued) {
            lock(&rma.batches).remove(&batch);
            fail_all(back, &e);
        }
    }

    /// Initiator: sends one request for each group of RMAs queued behind an unanswered one
    /// (the progress thread calls this on every round, so a burst of posts shares requests
    /// that are already in flight while the first one is answered), or held by a connection
    /// that is no longer held (`Endpoint::release_rma` calls it). Returns the requests
    /// sent.
    pub fn flush_rma_batches(&self) -> usize {
        let Some(rma) = &self.rma else {
            return 0;
        };
        if rma.queued.load(SeqCst) == 0 {
            return 0;
        }
        let groups: Vec<(BatchKey, Vec<Pending>)> = {
            let mut batches = lock(&rma.batches);
            batches
                .iter_mut()
                .filter(|(_, q)| q.first().is_some_and(|p| !p.conn.held.load(SeqCst)))
                .map(|(k, q)| {
                    rma.queued.fetch_sub(q.len(), SeqCst);
                    (*k, std::mem::take(q))
                })
                .collect()
        };
        let n = groups.len();
        for (batch, ops) in groups {
            if let Err((e, back)) = self.request(rma, ops) {
                lock(&rma.batches).remove(&batch);
                fail_all(back, &e);
            }
        }
        n
    }

    /// Initiator: hands a granted RMA to the provider.
    fn post_granted(&self, p: Pending, token: u64) {
        let Purpose::User { context, kind, .. } = &p.op.purpose else {
            return;
        };
        let (context, kind) = (*context, *kind);
        let mut op = p.op;
        if let Purpose::User { done, .. } = &mut op.purpose {
            *done = Some(token);
        }
        let (read, remote, conn) = (p.read, p.remote, p.conn);
        let fail = |failed: Arc<Conn>| {
            move |sh: &Shared, e: FabricError| {
                sh.rma_done(&failed, token);
                failed.cq.push(Completion::err(context, kind, e));
            }
        };
        let queued_fail = fail(conn.clone());
        let now_fail = fail(conn.clone());
        let run = move |sh: &Shared| {
            let inside = sh.gate.enter_wait(sh)?;
            let at = remote.first().map_or(0, |r| r.addr);
            crate::timeline::mark("copy.beg", at);
            let r = inside.long(|| {
                sh.fab
                    .rma(read, op, conn.peer, &remote, conn.id, &mut sh.again())
            });
            crate::timeline::mark("copy.end", at);
            r
        };
        // Run by the CQ reader after the completions and calls before it (`gate.rs`).
        if let Err(e) = self.gate.defer(self, Job::new(run, queued_fail)) {
            now_fail(self, e);
        }
    }

    /// Initiator: a granted RMA finished; once every RMA sharing its grant has, the target
    /// may release the region.
    pub fn rma_done(&self, conn: &Conn, token: u64) {
        if let Some(rma) = &self.rma {
            let mut shares = lock(&rma.shares);
            if let Some(left) = shares.get_mut(&token) {
                *left -= 1;
                if *left > 0 {
                    return;
                }
                shares.remove(&token);
            }
        }
        crate::timeline::mark("rma.done", token);
        let done = Control::RmaDone {
            target: conn.peer_id,
            sender: conn.id,
            token,
        };
        if let Err(e) = self.send_control(conn.peer, &done) {
            tracing::debug!("cannot release an RMA grant: {e}");
        }
    }

    /// Target: the peer finished a granted access.
    pub fn on_rma_done(&self, target: u64, token: u64) {
        if let Some(rma) = &self.rma {
            lock(&rma.leases).remove(&(target, token));
        }
    }

    /// Initiator: fails the RMAs of `conn` still waiting for an answer.
    pub fn fail_pending_rma(&self, conn: u64, why: impl Fn() -> FabricError) {
        let Some(rma) = &self.rma else {
            return;
        };
        let failed: Vec<Pending> = {
            let mut pending = lock(&rma.pending);
            let tokens: Vec<u64> = pending
                .iter()
                .filter(|(_, ops)| ops.first().is_some_and(|p| p.conn.id == conn))
                .map(|(&t, _)| t)
                .collect();
            let mut failed: Vec<Pending> = tokens
                .iter()
                .filter_map(|t| pending.remove(t))
                .flatten()
                .collect();
            let mut batches = lock(&rma.batches);
            let keys: Vec<BatchKey> = batches.keys().filter(|k| k.0 == conn).copied().collect();
            for k in keys {
                let q = batches.remove(&k).unwrap_or_default();
                rma.queued.fetch_sub(q.len(), SeqCst);
                failed.extend(q);
            }
            failed
        };
        for p in failed {
            fail(p, why());
        }
    }

    /// Domain close: fails every unanswered RMA; regions still leased to peers are leaked,
    /// since a peer may still be accessing them.
    pub fn close_rma(&self) {
        let Some(rma) = &self.rma else {
            return;
        };
        let mut pending: Vec<Pending> = lock(&rma.pending).drain().flat_map(|(_, p)| p).collect();
        pending.extend(lock(&rma.batches).drain().flat_map(|(_, q)| q));
        rma.queued.store(0, SeqCst);
        for p in pending {
            fail(p, FabricError::Cancelled);
        }
        for (_, region) in lock(&rma.leases).drain() {
            std::mem::forget(region);
        }
    }
}

/// Completes unanswered RMAs whose request could not be sent.
fn fail_all(ops: Vec<Pending>, e: &FabricError) {
    for p in ops {
        fail(
            p,
            FabricError::ConnectionLost(format!("RMA request not sent: {e}")),
        );
    }
}

/// Completes an unanswered RMA with `err`, releasing its memory first.
fn fail(p: Pending, err: FabricError) {
    let Op { slices, purpose } = p.op;
    drop(slices);
    if let Purpose::User { context, kind, .. } = purpose {
        p.conn.cq.push(Completion::err(context, kind, err));
    }
}
