//! The receiver half: the peer's messages are matched with posted recvs in order and pulled
//! (RMA read), copied (immediate), granted (push), read from the peer's persistent block, or
//! placed into our persistent recv block.

use std::collections::{HashMap, VecDeque};

use super::send::block_range;
use super::{Connection, Violation};
use crate::error::ExsError;
use crate::proto::wire::{Frame, Status, F_IMMEDIATE, F_LAYOUT, F_NOTIFY, F_PERSISTENT, NO_REMOTE};
use crate::proto::{Action, EventKind, Flags, LocalBuf, OpId, RemoteSlice, WireLayout};

/// A posted recv.
pub(super) struct RecvOp<B> {
    pub ctx: u64,
    pub buf: B,
    pub flags: Flags,
    pub offset: u64,
}

/// A peer message waiting for a recv.
enum Incoming {
    Advert {
        id: u64,
        flags: u8,
        offset: u64,
        remote: RemoteSlice,
        /// Immediate bytes, copied out of the control buffer so it can be reposted at once.
        data: Vec<u8>,
        /// Where the bytes lie inside `remote` (a noncontiguous send, EXS 1.1).
        layout: Option<WireLayout>,
    },
    Push {
        id: u64,
        offset: u64,
        len: u64,
    },
}

impl Incoming {
    fn persistent(&self) -> bool {
        matches!(self, Incoming::Advert { flags, .. } if flags & F_PERSISTENT != 0)
    }

    fn id(&self) -> u64 {
        match self {
            Incoming::Advert { id, .. } | Incoming::Push { id, .. } => *id,
        }
    }

    fn offset(&self) -> u64 {
        match self {
            Incoming::Advert { offset, .. } | Incoming::Push { offset, .. } => *offset,
        }
    }

    fn len(&self) -> u64 {
        match self {
            Incoming::Advert {
                layout: Some(l), ..
            } => l.size(),
            Incoming::Advert { remote, .. } => remote.len,
            Incoming::Push { len, .. } => *len,
        }
    }
}

/// Where a transfer lands: a user's recv, or our persistent recv block (no event).
enum Target<B> {
    Recv(RecvOp<B>),
    Block,
}

/// What an RMA read reads from.
enum Source {
    /// A contiguous range of the peer's memory.
    Slice(RemoteSlice),
    /// The first `len` bytes of a noncontiguous message inside the peer's slice.
    Layout(RemoteSlice, WireLayout, u64),
}

/// An RMA read in flight.
pub(super) struct Reading<B> {
    target: Target<B>,
    len: u64,
    msg_len: u64,
    /// The ADVERT to ACK when done.
    ack: Option<u64>,
    /// The peer's persistent send to notify (id, offset) when done.
    notify: Option<(u64, u64)>,
}

/// A push granted, waiting for its DONE.
pub(super) struct Granted<B> {
    target: Target<B>,
    len: u64,
    msg_len: u64,
}

/// The peer's persistent send, once a recv accepted it.
#[derive(Clone, Copy)]
struct PeerBlock {
    id: u64,
    remote: RemoteSlice,
    notify: bool,
}

/// Our persistent recv block.
struct Block<B> {
    op: RecvOp<B>,
    remote: RemoteSlice,
    /// RMA reads into it in flight; close waits for them before handing the buffer back.
    reads: usize,
}

pub(super) struct RecvSide<B> {
    queue: VecDeque<RecvOp<B>>,
    incoming: VecDeque<Incoming>,
    /// The peer sent a persistent ADVERT; nothing may follow it.
    peer_sent_persistent: bool,
    peer_block: Option<PeerBlock>,
    reading: HashMap<OpId, Reading<B>>,
    granted: HashMap<u64, Granted<B>>,
    block: Option<Block<B>>,
    /// A persistent recv is posted, so later recvs could never match.
    persistent_posted: bool,
    /// RECV_ADVERTs and READ_NOTIFYs waiting for a credit (with their stall mark).
    ctl: VecDeque<(Frame, bool)>,
}

impl<B> RecvSide<B> {
    pub fn new() -> Self {
        RecvSide {
            queue: VecDeque::new(),
            incoming: VecDeque::new(),
            peer_sent_persistent: false,
            peer_block: None,
            reading: HashMap::new(),
            granted: HashMap::new(),
            block: None,
            persistent_posted: false,
            ctl: VecDeque::new(),
        }
    }

    /// Peer messages no posted recv has taken yet.
    pub fn waiting(&self) -> usize {
        self.incoming.len()
    }

    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
            && self.incoming.is_empty()
            && self.reading.is_empty()
            && self.granted.is_empty()
            && self.block.is_none()
            && self.ctl.is_empty()
    }
}

impl<B: LocalBuf> Connection<B> {
    pub(super) fn recv_op(&mut self, op: RecvOp<B>) {
        let persistent = op.flags.contains(Flags::PERSISTENT);
        let check = if self.closed_err().is_some() {
            Err(ExsError::NotConnected)
        } else if op.flags.0 & !Flags::PERSISTENT.0 != 0 || (persistent && op.offset != 0) {
            Err(ExsError::InvalidFlags)
        } else if self.rx.persistent_posted {
            Err(ExsError::AfterPersistent)
        } else if persistent && op.buf.remote().is_none() {
            Err(ExsError::NotRemoteAccessible)
        } else {
            Ok(())
        };
        match check {
            Err(e) => self.finish_recv(op, 0, Err(e)),
            Ok(()) => {
                self.rx.persistent_posted |= persistent;
                self.rx.queue.push_back(op);
                self.match_recvs();
            }
        }
    }

    fn finish_recv(&mut self, op: RecvOp<B>, len: u64, result: Status) {
        if result.is_ok() || result == Err(ExsError::MessageSize) {
            self.stats.bytes_received += len;
        }
        self.event(EventKind::Recv, op.ctx, Some(op.buf), len, result);
    }

    /// Sends control frames of the receiver half while credits last.
    pub(super) fn pump_ctl(&mut self) {
        while let Some((_, stalled)) = self.rx.ctl.front_mut() {
            if !self.credits.try_take() {
                if !*stalled {
                    *stalled = true;
                    self.stats.credit_stalls += 1;
                }
                return;
            }
            let (frame, _) = self.rx.ctl.pop_front().expect("front exists");
            self.queue_frame(frame, false);
        }
    }

    /// An ADVERT or PUSH_REQ arrived (its credit already counted).
    pub(super) fn on_message(&mut self, frame: Frame, payload: &[u8]) -> Result<(), Violation> {
        if self.rx.peer_sent_persistent {
            return Err("message after a persistent ADVERT");
        }
        let msg = match frame {
            Frame::Advert {
                id,
                flags,
                offset,
                remote,
            } => {
                if flags & F_IMMEDIATE != 0 && remote.len > self.imm_max {
                    return Err("immediate data larger than agreed");
                }
                let layout = if flags & F_LAYOUT != 0 {
                    if payload.len() as u64 > self.imm_max {
                        return Err("layout longer than the immediate limit");
                    }
                    Some(WireLayout::decode(payload, remote.len).ok_or("bad layout")?)
                } else {
                    None
                };
                Incoming::Advert {
                    id,
                    flags,
                    offset,
                    remote,
                    data: if layout.is_some() {
                        Vec::new()
                    } else {
                        payload.to_vec()
                    },
                    layout,
                }
            }
            Frame::PushReq { id, offset, len } => Incoming::Push { id, offset, len },
            _ => unreachable!("dispatch routes only messages here"),
        };
        self.rx.peer_sent_persistent = msg.persistent();
        if self.rx.block.is_some() {
            self.place_in_block(msg);
        } else {
            self.rx.incoming.push_back(msg);
            self.match_recvs();
        }
        Ok(())
    }

    /// Matches the head recv with the head message for as long as both exist.
    fn match_recvs(&mut self) {
        while let Some(head) = self.rx.queue.front() {
            if head.flags.contains(Flags::PERSISTENT) {
                let op = self.rx.queue.pop_front().expect("front exists");
                if self.rx.peer_block.is_some() {
                    // The peer's block already serves our recvs; it was first.
                    self.rx.persistent_posted = false;
                    self.finish_recv(op, 0, Err(ExsError::BothPersistent));
                } else {
                    self.open_block(op);
                }
                continue;
            }
            if let Some(pb) = self.rx.peer_block {
                let op = self.rx.queue.pop_front().expect("front exists");
                self.read_block(op, pb);
                continue;
            }
            let Some(msg) = self.rx.incoming.pop_front() else {
                return;
            };
            if let Incoming::Advert {
                id, flags, remote, ..
            } = msg
            {
                if flags & F_PERSISTENT != 0 {
                    self.rx.peer_block = Some(PeerBlock {
                        id,
                        remote,
                        notify: flags & F_NOTIFY != 0,
                    });
                    self.respond_ack(id, 0, Ok(()));
                    continue;
                }
            }
            let op = self.rx.queue.pop_front().expect("front exists");
            if op.offset != 0 {
                self.rx.incoming.push_front(msg);
                self.finish_recv(op, 0, Err(ExsError::NotPersistent));
            } else if msg.offset() != 0 {
                self.rx.queue.push_front(op);
                self.refuse(msg, ExsError::NotPersistent);
            } else {
                self.deliver(msg, op);
            }
        }
    }

    /// Moves `msg` into the recv `op`: only its prefix if `op` is smaller.
    fn deliver(&mut self, msg: Incoming, op: RecvOp<B>) {
        let len = msg.len().min(op.buf.len());
        let msg_len = msg.len();
        match msg {
            Incoming::Advert {
                id,
                flags,
                mut data,
                ..
            } if flags & F_IMMEDIATE != 0 => {
                data.truncate(len as usize);
                self.copy_in(op.buf.clone(), 0, data);
                self.respond_ack(id, len, Ok(()));
                self.finish_recv(op, len, truncation(len, msg_len));
            }
            Incoming::Advert {
                id,
                remote,
                layout: Some(layout),
                ..
            } => {
                let src = Source::Layout(remote, layout, len);
                self.read(Target::Recv(op), 0, src, msg_len, Some(id), None);
            }
            Incoming::Advert { id, remote, .. } => {
                let src = remote.sub(0, len).expect("prefix of a checked range");
                let src = Source::Slice(src);
                self.read(Target::Recv(op), 0, src, msg_len, Some(id), None);
            }
            Incoming::Push { id, .. } => {
                let Some(dst) = op.buf.remote().and_then(|r| r.sub(0, len).ok()) else {
                    // This recv cannot take a push; the message waits for the next one.
                    self.rx.incoming.push_front(msg);
                    return self.finish_recv(op, 0, Err(ExsError::NotRemoteAccessible));
                };
                self.grant(id, Target::Recv(op), dst, msg_len);
            }
        }
    }

    /// A recv served from the peer's persistent block: the range at its offset, as much as
    /// the buffer holds (reading a part is the point of offsets, so no truncation error).
    fn read_block(&mut self, op: RecvOp<B>, pb: PeerBlock) {
        if op.offset > pb.remote.len {
            return self.finish_recv(op, 0, Err(ExsError::OffsetOutOfRange));
        }
        self.stats.block_reads += 1;
        let len = op.buf.len().min(pb.remote.len - op.offset);
        let notify = pb.notify.then_some((pb.id, op.offset));
        let src = pb.remote.sub(op.offset, len).expect("checked range");
        self.read(Target::Recv(op), 0, Source::Slice(src), len, None, notify);
    }

    /// Posts an RMA read, or finishes at once if there is nothing to move.
    fn read(
        &mut self,
        target: Target<B>,
        local_offset: u64,
        src: Source,
        msg_len: u64,
        ack: Option<u64>,
        notify: Option<(u64, u64)>,
    ) {
        let len = match &src {
            Source::Slice(s) => s.len,
            Source::Layout(_, _, len) => *len,
        };
        let rd = Reading {
            target,
            len,
            msg_len,
            ack,
            notify,
        };
        if len == 0 {
            return self.finish_read(rd, Ok(()));
        }
        let local = match &rd.target {
            Target::Recv(op) => op.buf.clone(),
            Target::Block => {
                let block = self.rx.block.as_mut().expect("block target needs a block");
                block.reads += 1;
                block.op.buf.clone()
            }
        };
        let op = OpId(self.fresh_id());
        self.action(match src {
            Source::Slice(remote) => Action::RmaRead {
                op,
                local,
                local_offset,
                remote,
            },
            Source::Layout(remote, layout, len) => Action::RmaReadLayout {
                op,
                local,
                local_offset,
                remote,
                layout,
                len,
            },
        });
        self.rx.reading.insert(op, rd);
    }

    /// Completes an RMA read; false if `op` is not one.
    pub(super) fn read_done(&mut self, op: OpId, result: Status) -> bool {
        let Some(rd) = self.rx.reading.remove(&op) else {
            return false;
        };
        if let Target::Block = rd.target {
            let block = self.rx.block.as_mut().expect("block outlives its reads");
            block.reads -= 1;
        }
        match self.closed_err() {
            Some(e) => {
                if let Target::Recv(op) = rd.target {
                    self.finish_recv(op, 0, Err(e));
                }
                self.release_block_if_closed();
            }
            None => self.finish_read(rd, result),
        }
        true
    }

    fn finish_read(&mut self, rd: Reading<B>, result: Status) {
        let len = if result.is_ok() { rd.len } else { 0 };
        if let Some(id) = rd.ack {
            self.respond_ack(id, len, result);
        }
        if let (Some((id, offset)), Ok(())) = (rd.notify, result) {
            self.rx
                .ctl
                .push_back((Frame::ReadNotify { id, offset, len }, false));
        }
        match rd.target {
            Target::Recv(op) => {
                let result = result.and(truncation(len, rd.msg_len));
                self.finish_recv(op, len, result);
            }
            Target::Block => self.stats.bytes_received += len,
        }
    }

    fn grant(&mut self, id: u64, target: Target<B>, dst: RemoteSlice, msg_len: u64) {
        self.queue_frame(
            Frame::PushGrant {
                id,
                status: Ok(()),
                remote: dst,
            },
            false,
        );
        let g = Granted {
            target,
            len: dst.len,
            msg_len,
        };
        self.rx.granted.insert(id, g);
    }

    pub(super) fn on_done(&mut self, id: u64, len: u64, status: Status) -> Result<(), Violation> {
        let g = self.rx.granted.get(&id).ok_or("PUSH_DONE for no grant")?;
        if len != if status.is_ok() { g.len } else { 0 } {
            return Err("PUSH_DONE length differs from the grant");
        }
        let g = self.rx.granted.remove(&id).expect("looked up");
        self.credits.free();
        match g.target {
            Target::Recv(op) => self.finish_recv(op, len, status.and(truncation(len, g.msg_len))),
            Target::Block => self.stats.bytes_received += len,
        }
        Ok(())
    }

    /// Our persistent recv reached the head: advertise it and let everything already
    /// waiting land in it.
    fn open_block(&mut self, op: RecvOp<B>) {
        let Some(remote) = op.buf.remote().and_then(|r| r.sub(0, op.buf.len()).ok()) else {
            self.rx.persistent_posted = false;
            return self.finish_recv(op, 0, Err(ExsError::NotRemoteAccessible));
        };
        let id = self.fresh_id();
        self.rx
            .ctl
            .push_back((Frame::RecvAdvert { id, remote }, false));
        self.rx.block = Some(Block {
            op,
            remote,
            reads: 0,
        });
        for msg in std::mem::take(&mut self.rx.incoming) {
            self.place_in_block(msg);
        }
    }

    /// A peer message for our persistent block, at the message's offset. A persistent send
    /// meeting it is refused: the block was advertised first.
    fn place_in_block(&mut self, msg: Incoming) {
        let block = self.rx.block.as_ref().expect("placing needs a block");
        let (block_len, block_remote) = (block.op.buf.len(), block.remote);
        if msg.persistent() {
            return self.refuse(msg, ExsError::BothPersistent);
        }
        let (offset, msg_len) = (msg.offset(), msg.len());
        let dst = match block_range(block_remote, offset, msg_len) {
            Ok(dst) => dst,
            Err(e) => return self.refuse(msg, e),
        };
        debug_assert!(offset + msg_len <= block_len);
        match msg {
            Incoming::Advert {
                id, flags, data, ..
            } if flags & F_IMMEDIATE != 0 => {
                let buf = self.rx.block.as_ref().expect("checked").op.buf.clone();
                self.copy_in(buf, offset, data);
                self.stats.bytes_received += msg_len;
                self.respond_ack(id, msg_len, Ok(()));
            }
            Incoming::Advert {
                id,
                remote,
                layout: Some(layout),
                ..
            } => {
                let src = Source::Layout(remote, layout, msg_len);
                self.read(Target::Block, offset, src, msg_len, Some(id), None);
            }
            Incoming::Advert { id, remote, .. } => {
                let src = Source::Slice(remote);
                self.read(Target::Block, offset, src, msg_len, Some(id), None);
            }
            Incoming::Push { id, .. } => self.grant(id, Target::Block, dst, msg_len),
        }
    }

    /// The final answer to a message this side will not take; it returns the credit.
    fn refuse(&mut self, msg: Incoming, e: ExsError) {
        if msg.persistent() {
            // The peer's persistent send fails, so it may send again.
            self.rx.peer_sent_persistent = false;
        }
        let id = msg.id();
        match msg {
            Incoming::Advert { .. } => self.respond_ack(id, 0, Err(e)),
            Incoming::Push { .. } => self.queue_frame(
                Frame::PushGrant {
                    id,
                    status: Err(e),
                    remote: NO_REMOTE,
                },
                true,
            ),
        }
    }

    fn respond_ack(&mut self, id: u64, len: u64, status: Status) {
        self.queue_frame(Frame::Ack { id, len, status }, true);
    }

    fn copy_in(&mut self, buf: B, offset: u64, data: Vec<u8>) {
        if !data.is_empty() {
            self.action(Action::CopyIn { buf, offset, data });
        }
    }

    /// On close: recvs without a transfer in flight finish now; the persistent block once
    /// no read into it is in flight.
    pub(super) fn cancel_recvs(&mut self, err: ExsError) {
        for op in std::mem::take(&mut self.rx.queue) {
            self.finish_recv(op, 0, Err(err));
        }
        self.rx.incoming.clear();
        self.rx.ctl.clear();
        let mut ids: Vec<u64> = self.rx.granted.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            // The peer may still be writing into a granted buffer: the Close event comes
            // first so the runtime shuts the endpoint down before handing it back.
            if let Some(Granted {
                target: Target::Recv(op),
                ..
            }) = self.rx.granted.remove(&id)
            {
                self.finish_recv(op, 0, Err(err));
            }
        }
        self.release_block_if_closed();
    }

    fn release_block_if_closed(&mut self) {
        let Some(e) = self.closed_err() else { return };
        if self.rx.block.as_ref().is_some_and(|b| b.reads == 0) {
            let block = self.rx.block.take().expect("checked");
            self.finish_recv(block.op, 0, Err(e));
        }
    }
}

/// A recv that took less than the message reports [`ExsError::MessageSize`].
fn truncation(len: u64, msg_len: u64) -> Status {
    if len < msg_len {
        Err(ExsError::MessageSize)
    } else {
        Ok(())
    }
}
