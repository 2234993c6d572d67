//! The sender half: posted sends become ADVERTs (pull), immediates, PUSH_REQs, persistent
//! ADVERTs, or RMA writes into the peer's persistent recv block, in posting order.

use std::collections::{HashMap, VecDeque};

use super::{Connection, Violation};
use crate::error::ExsError;
use crate::proto::wire::{self, Frame, Status, F_IMMEDIATE, F_LAYOUT, F_NOTIFY, F_PERSISTENT};
use crate::proto::{Action, EventKind, Flags, LocalBuf, OpId, RemoteSlice, WireLayout};

/// A posted send.
pub(super) struct SendOp<B> {
    pub ctx: u64,
    pub buf: B,
    pub flags: Flags,
    pub offset: u64,
    /// Already counted as a credit stall.
    pub stalled: bool,
}

impl<B: LocalBuf> SendOp<B> {
    fn persistent(&self) -> bool {
        self.flags.contains(Flags::PERSISTENT)
    }
}

/// Where a send stands after its first frame went out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// ADVERT (pull or immediate) out, waiting for the ACK.
    Advertised,
    /// Persistent ADVERT out, waiting for the reader to accept it.
    Offered,
    /// Persistent block accepted: exposed until close.
    Exposed,
    /// PUSH_REQ out, waiting for the grant.
    Requested,
}

pub(super) struct Sent<B> {
    op: SendOp<B>,
    phase: Phase,
    /// The immediate payload is still being sent from the user's buffer.
    payload_pending: bool,
    /// The verdict, held until the payload frame is reported sent.
    verdict: Option<(u64, Status)>,
}

/// An RMA write in flight: a push, or a send into the peer's persistent block.
pub(super) struct Writing<B> {
    op: SendOp<B>,
    len: u64,
    /// The push's message id, for its DONE.
    push_id: Option<u64>,
}

/// How a send goes out.
pub(super) enum Plan {
    Block(RemoteSlice),
    Immediate,
    Pull(RemoteSlice),
    /// Pull from a noncontiguous buffer: the slice holding it and where the bytes lie.
    PullLayout(RemoteSlice, WireLayout),
    Push,
    Persistent(RemoteSlice),
}

pub(super) struct SendSide<B> {
    queue: VecDeque<SendOp<B>>,
    open: HashMap<u64, Sent<B>>,
    writing: HashMap<OpId, Writing<B>>,
    /// A persistent send is posted, so later sends could never match.
    persistent_posted: bool,
    /// The peer's persistent recv block.
    remote_block: Option<RemoteSlice>,
}

impl<B> SendSide<B> {
    pub fn new() -> Self {
        SendSide {
            queue: VecDeque::new(),
            open: HashMap::new(),
            writing: HashMap::new(),
            persistent_posted: false,
            remote_block: None,
        }
    }

    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.open.is_empty() && self.writing.is_empty()
    }
}

/// The advertised part of a local buffer, if the peer can reach it.
fn remote_of<B: LocalBuf>(buf: &B) -> Result<RemoteSlice, ExsError> {
    buf.remote()
        .and_then(|r| r.sub(0, buf.len()).ok())
        .ok_or(ExsError::NotRemoteAccessible)
}

impl<B: LocalBuf> Connection<B> {
    pub(super) fn send_op(&mut self, op: SendOp<B>) {
        let persistent = op.persistent();
        let check = if self.closed_err().is_some() {
            Err(ExsError::NotConnected)
        } else if op.flags.0 & !(Flags::PERSISTENT | Flags::NOTIFY_ON_READ).0 != 0
            || (op.flags.contains(Flags::NOTIFY_ON_READ) && !persistent)
            || (persistent && op.offset != 0)
        {
            Err(ExsError::InvalidFlags)
        } else if self.tx.persistent_posted {
            Err(ExsError::AfterPersistent)
        } else if persistent && self.tx.remote_block.is_some() {
            Err(ExsError::BothPersistent)
        } else {
            Ok(())
        };
        match check {
            Err(e) => self.finish_send(op, 0, Err(e)),
            Ok(()) => {
                self.tx.persistent_posted |= persistent;
                self.tx.queue.push_back(op);
            }
        }
    }

    /// Sends queued sends in order while credits last; writes into the peer's persistent
    /// block need none.
    pub(super) fn pump_sends(&mut self) {
        while let Some(op) = self.tx.queue.front() {
            let plan = self.plan(op);
            let needs_credit = !matches!(plan, Ok(Plan::Block(_)) | Err(_));
            if needs_credit && !self.credits.try_take() {
                let op = self.tx.queue.front_mut().expect("front exists");
                if !op.stalled {
                    op.stalled = true;
                    self.stats.credit_stalls += 1;
                }
                return;
            }
            let op = self.tx.queue.pop_front().expect("front exists");
            match plan {
                Ok(plan) => self.start_send(op, plan),
                Err(e) => self.finish_send(op, 0, Err(e)),
            }
        }
    }

    fn plan(&self, op: &SendOp<B>) -> Result<Plan, ExsError> {
        let len = op.buf.len();
        if let Some(block) = self.tx.remote_block {
            if op.persistent() {
                return Err(ExsError::BothPersistent);
            }
            return block_range(block, op.offset, len).map(Plan::Block);
        }
        Ok(if op.persistent() {
            Plan::Persistent(remote_of(&op.buf)?)
        } else if len <= self.imm_max && op.offset == 0 {
            Plan::Immediate
        } else if self.cfg.push {
            Plan::Push
        } else if let Some(layout) = op.buf.layout() {
            // The runtime packs instead when the peer is older or the layout too long.
            if self.peer_minor < wire::LAYOUT_MINOR || layout.encoded_len() as u64 > self.imm_max {
                return Err(ExsError::InvalidFlags);
            }
            let remote = op.buf.remote().ok_or(ExsError::NotRemoteAccessible)?;
            Plan::PullLayout(remote, layout)
        } else {
            Plan::Pull(remote_of(&op.buf)?)
        })
    }

    pub(super) fn start_send(&mut self, op: SendOp<B>, plan: Plan) {
        let len = op.buf.len();
        let id = self.fresh_id();
        let mut sent = Sent {
            op,
            phase: Phase::Advertised,
            payload_pending: false,
            verdict: None,
        };
        match plan {
            Plan::Block(remote) => {
                self.stats.block_writes += 1;
                let op = sent.op;
                if len == 0 {
                    return self.finish_send(op, 0, Ok(()));
                }
                return self.write(op, remote, None);
            }
            Plan::Immediate => {
                self.stats.immediates += 1;
                let remote = RemoteSlice {
                    addr: 0,
                    len,
                    key: 0,
                };
                let frame = Frame::Advert {
                    id,
                    flags: F_IMMEDIATE,
                    offset: 0,
                    remote,
                };
                sent.payload_pending = len > 0;
                let payload = (len > 0).then(|| sent.op.buf.clone());
                self.queue_payload_frame(frame, false, payload, Some(id));
            }
            Plan::Pull(remote) | Plan::Persistent(remote) => {
                let mut flags = 0;
                if sent.op.persistent() {
                    sent.phase = Phase::Offered;
                    flags = F_PERSISTENT;
                    if sent.op.flags.contains(Flags::NOTIFY_ON_READ) {
                        flags |= F_NOTIFY;
                    }
                } else {
                    self.stats.adverts += 1;
                }
                let offset = sent.op.offset;
                self.queue_frame(
                    Frame::Advert {
                        id,
                        flags,
                        offset,
                        remote,
                    },
                    false,
                );
            }
            Plan::PullLayout(remote, layout) => {
                self.stats.adverts += 1;
                let mut extra = Vec::with_capacity(layout.encoded_len());
                layout.encode(&mut extra);
                let frame = Frame::Advert {
                    id,
                    flags: F_LAYOUT,
                    offset: 0,
                    remote,
                };
                self.queue_frame_with(frame, extra);
            }
            Plan::Push => {
                self.stats.pushes += 1;
                sent.phase = Phase::Requested;
                let offset = sent.op.offset;
                self.queue_frame(Frame::PushReq { id, offset, len }, false);
            }
        }
        self.tx.open.insert(id, sent);
    }

    fn write(&mut self, op: SendOp<B>, remote: RemoteSlice, push_id: Option<u64>) {
        let rid = OpId(self.fresh_id());
        self.action(Action::RmaWrite {
            op: rid,
            local: op.buf.clone(),
            local_offset: 0,
            remote,
        });
        let len = remote.len;
        self.tx.writing.insert(rid, Writing { op, len, push_id });
    }

    pub(super) fn finish_send(&mut self, op: SendOp<B>, len: u64, result: Status) {
        if op.persistent() {
            self.tx.persistent_posted = false;
        }
        if result.is_ok() {
            self.stats.bytes_sent += len;
        }
        self.event(EventKind::Send, op.ctx, Some(op.buf), len, result);
    }

    pub(super) fn on_ack(&mut self, id: u64, len: u64, status: Status) -> Result<(), Violation> {
        let sent = self.tx.open.get_mut(&id).ok_or("ACK for no open send")?;
        if len > sent.op.buf.len() {
            return Err("ACK for more bytes than sent");
        }
        match (sent.phase, status) {
            (Phase::Offered, Ok(())) => sent.phase = Phase::Exposed,
            (Phase::Advertised, _) if sent.payload_pending => sent.verdict = Some((len, status)),
            (Phase::Advertised | Phase::Offered, _) => {
                let sent = self.tx.open.remove(&id).expect("looked up");
                self.finish_send(sent.op, len, status);
            }
            _ => return Err("ACK for a send in the wrong phase"),
        }
        Ok(())
    }

    pub(super) fn on_grant(
        &mut self,
        id: u64,
        status: Status,
        remote: RemoteSlice,
    ) -> Result<(), Violation> {
        let sent = self.tx.open.get(&id).ok_or("GRANT for no open send")?;
        if sent.phase != Phase::Requested {
            return Err("GRANT for a send that did not request one");
        }
        if remote.len > sent.op.buf.len() {
            return Err("GRANT larger than the message");
        }
        let sent = self.tx.open.remove(&id).expect("looked up");
        match status {
            Err(e) => self.finish_send(sent.op, 0, Err(e)),
            Ok(()) if remote.len == 0 => {
                self.queue_frame(
                    Frame::PushDone {
                        id,
                        len: 0,
                        status: Ok(()),
                    },
                    false,
                );
                self.finish_send(sent.op, 0, Ok(()));
            }
            Ok(()) => {
                self.write(sent.op, remote, Some(id));
            }
        }
        Ok(())
    }

    pub(super) fn on_notify(&mut self, id: u64, offset: u64, len: u64) -> Result<(), Violation> {
        let sent = self.tx.open.get(&id).ok_or("READ_NOTIFY for no send")?;
        let in_range = offset
            .checked_add(len)
            .is_some_and(|end| end <= sent.op.buf.len());
        if sent.phase != Phase::Exposed
            || !sent.op.flags.contains(Flags::NOTIFY_ON_READ)
            || !in_range
        {
            return Err("READ_NOTIFY that does not fit an exposed notifying block");
        }
        let ctx = sent.op.ctx;
        self.credits.free();
        self.event(EventKind::ReadNotify, ctx, None, len, Ok(()));
        Ok(())
    }

    pub(super) fn on_recv_advert(&mut self, remote: RemoteSlice) -> Result<(), Violation> {
        if self.tx.remote_block.is_some() {
            return Err("second persistent recv block");
        }
        // Accepted unconditionally: a persistent send of ours that would meet it fails
        // instead (here if still queued, at the peer if already advertised).
        self.tx.remote_block = Some(remote);
        self.credits.free();
        Ok(())
    }

    /// Completes an RMA write; false if `op` is not one.
    pub(super) fn write_done(&mut self, op: OpId, result: Status) -> bool {
        let Some(w) = self.tx.writing.remove(&op) else {
            return false;
        };
        if let Some(e) = self.closed_err() {
            self.finish_send(w.op, 0, Err(e));
            return true;
        }
        let len = if result.is_ok() { w.len } else { 0 };
        if let Some(id) = w.push_id {
            self.queue_frame(
                Frame::PushDone {
                    id,
                    len,
                    status: result,
                },
                false,
            );
        }
        self.finish_send(w.op, len, result);
        true
    }

    /// An immediate payload left the user's buffer.
    pub(super) fn payload_sent(&mut self, id: u64) {
        let Some(sent) = self.tx.open.get_mut(&id) else {
            return;
        };
        sent.payload_pending = false;
        let verdict = sent.verdict.or(self.closed_err().map(|e| (0, Err(e))));
        if let Some((len, status)) = verdict {
            let sent = self.tx.open.remove(&id).expect("looked up");
            self.finish_send(sent.op, len, status);
        }
    }

    /// On close: everything not tied to a transfer in flight finishes now.
    pub(super) fn cancel_sends(&mut self, err: ExsError) {
        for op in std::mem::take(&mut self.tx.queue) {
            self.finish_send(op, 0, Err(err));
        }
        let mut ids: Vec<u64> = self.tx.open.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if !self.tx.open[&id].payload_pending {
                let sent = self.tx.open.remove(&id).expect("listed");
                self.finish_send(sent.op, 0, Err(err));
            }
        }
    }
}

/// The range of the peer's persistent block a send at `offset` would fill.
pub(super) fn block_range(
    block: RemoteSlice,
    offset: u64,
    len: u64,
) -> Result<RemoteSlice, ExsError> {
    if offset > block.len {
        return Err(ExsError::OffsetOutOfRange);
    }
    block.sub(offset, len).map_err(|_| ExsError::MessageSize)
}
