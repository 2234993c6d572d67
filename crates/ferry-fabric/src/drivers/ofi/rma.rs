//! Checked RMA, for providers whose own target-side checks cannot be relied on (see
//! `info::Quirks`): before the initiator hands an RMA to the provider, the target's driver
//! checks key, bounds and rights against its own table of registrations and, if granted,
//! holds the region (registration and memory) until the initiator reports the access done.
//!
//! ```text
//! initiator                                   target
//!   post_write/read ── RMA_REQUEST{token} ──▶ check key, bounds, rights; lease the region
//!   provider RMA    ◀── RMA_ANSWER{0} ───────
//!   completion      ── RMA_DONE{token} ─────▶ release the lease
//!        (or: ◀── RMA_ANSWER{refusal}: the op completes with RemoteAccess, nothing touched)
//! ```
//!
//! It costs one round trip per RMA and gives exact refusal reasons.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};

use super::domain::Shared;
use super::endpoint::Conn;
use super::gate::Job;
use super::lock;
use super::progress::{Op, Purpose};
use super::wire::Control;
use crate::cq::Completion;
use crate::error::{FabricError, RemoteAccessError, Result};
use crate::mem::{Access, MemoryRegion, RemoteSlice, WeakRegion};

/// Deregistered keys remembered to tell "stale" from "unknown".
const STALE_KEYS: usize = 4096;
/// Registrations between sweeps of dead entries.
const SWEEP_EVERY: usize = 256;

#[derive(Default)]
struct Regions {
    live: HashMap<u64, WeakRegion>,
    stale: VecDeque<u64>,
    added: usize,
}

/// An RMA waiting for the target's answer.
struct Pending {
    op: Op,
    conn: Arc<Conn>,
    remote: RemoteSlice,
    read: bool,
}

/// One domain's checked-RMA state, both as initiator and as target.
#[derive(Default)]
pub(super) struct Checked {
    regions: Mutex<Regions>,
    /// Granted accesses by (our connection id, token).
    leases: Mutex<HashMap<(u64, u64), MemoryRegion>>,
    pending: Mutex<HashMap<u64, Pending>>,
    next_token: AtomicU64,
}

impl Checked {
    /// Makes `region` reachable by its key.
    pub fn add(&self, region: &MemoryRegion) {
        let mut r = lock(&self.regions);
        r.added += 1;
        if r.added.is_multiple_of(SWEEP_EVERY) {
            let dead: Vec<u64> = r
                .live
                .iter()
                .filter(|(_, w)| w.upgrade().is_none())
                .map(|(&k, _)| k)
                .collect();
            for k in dead {
                r.live.remove(&k);
                r.stale.push_back(k);
            }
            while r.stale.len() > STALE_KEYS {
                r.stale.pop_front();
            }
        }
        r.live.insert(region.key(), region.downgrade());
    }

    /// True if peers hold grants to our regions.
    pub fn granted(&self) -> bool {
        !lock(&self.leases).is_empty()
    }

    /// True if RMAs wait for the target's answer.
    pub fn waiting(&self) -> bool {
        !lock(&self.pending).is_empty()
    }

    /// The region `remote` names, if the access is allowed.
    fn check(
        &self,
        remote: RemoteSlice,
        write: bool,
        virt_addr: bool,
    ) -> Result<MemoryRegion, RemoteAccessError> {
        let region = {
            let r = lock(&self.regions);
            match r.live.get(&remote.key) {
                Some(w) => w.upgrade().ok_or(RemoteAccessError::StaleKey)?,
                None if r.stale.contains(&remote.key) => return Err(RemoteAccessError::StaleKey),
                None => return Err(RemoteAccessError::UnknownKey),
            }
        };
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
}

impl Shared {
    /// Initiator: asks the target to grant `op` (an RMA of `remote`) before posting it.
    /// `rma` is this domain's checked-RMA state.
    pub fn post_checked(
        &self,
        rma: &Checked,
        conn: &Arc<Conn>,
        read: bool,
        op: Op,
        remote: RemoteSlice,
    ) -> Result<()> {
        let token = rma.next_token.fetch_add(1, SeqCst);
        let pending = Pending {
            op,
            conn: conn.clone(),
            remote,
            read,
        };
        lock(&rma.pending).insert(token, pending);
        let ask = Control::RmaRequest {
            target: conn.peer_id,
            sender: conn.id,
            token,
            remote,
            write: !read,
        };
        // Queued behind a copy and then refused: the RMA fails as if the target had not
        // answered.
        let fail = move |sh: &Shared, e: FabricError| {
            let p = sh
                .rma
                .as_ref()
                .and_then(|r| lock(&r.pending).remove(&token));
            if let Some(p) = p {
                fail(p, e);
            }
        };
        if let Err(e) = self.send_control_or(conn.peer, &ask, fail) {
            lock(&rma.pending).remove(&token);
            return Err(e);
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
        let status = match rma.check(remote, write, self.caps.virt_addr) {
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

    /// Initiator: the target answered the RMA `token` of our connection `target`; post the
    /// RMA or fail it.
    pub fn on_rma_answer(&self, target: u64, token: u64, status: u8) {
        let p = self.rma.as_ref().and_then(|r| {
            let mut pending = lock(&r.pending);
            match pending.get(&token) {
                Some(p) if p.conn.id == target => pending.remove(&token),
                _ => None,
            }
        });
        let Some(p) = p else {
            // Failed meanwhile (peer closed, connection lost): give a grant back.
            if let Some(conn) = self.conn(target).filter(|_| status == 0) {
                self.rma_done(&conn, token);
            }
            return;
        };
        let Purpose::User { context, kind, .. } = &p.op.purpose else {
            return;
        };
        let (context, kind) = (*context, *kind);
        if status != 0 {
            let why = RemoteAccessError::from_wire(status);
            drop(p.op);
            p.conn.cq.push(Completion::err(
                context,
                kind,
                FabricError::RemoteAccess(why),
            ));
            return;
        }
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
            let inside = sh.gate.enter_wait(sh);
            inside.long(|| {
                sh.fab
                    .rma(read, op, conn.peer, remote, conn.id, &mut sh.again())
            })
        };
        // Completions are routed inside the gate, so this normally runs at once.
        if let Err(e) = self.gate.call(self, Job::new(run, queued_fail)) {
            now_fail(self, e);
        }
    }

    /// Initiator: a granted RMA finished; the target may release the region.
    pub fn rma_done(&self, conn: &Conn, token: u64) {
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
                .filter(|(_, p)| p.conn.id == conn)
                .map(|(&t, _)| t)
                .collect();
            tokens.iter().filter_map(|t| pending.remove(t)).collect()
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
        let pending: Vec<Pending> = lock(&rma.pending).drain().map(|(_, p)| p).collect();
        for p in pending {
            fail(p, FabricError::Cancelled);
        }
        for (_, region) in lock(&rma.leases).drain() {
            std::mem::forget(region);
        }
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
