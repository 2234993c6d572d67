//! The socket's engine: the core connection plus everything it has out on the fabric.
//!
//! All of it lives behind the socket's one mutex. Whoever holds the lock (a user call or the
//! progress thread) feeds the core and then executes the actions it asks for, in order, still
//! under the lock: frames must leave in the order the core numbered them, and a `CopyIn` must
//! land before the event that reports it.

use std::collections::HashMap;
use std::sync::Arc;

use ferry_fabric::{timeline, Access, Buffer, Completion, Endpoint, MemoryRegion, OpKind};
use tracing::debug;

mod layout;
mod post;

use layout::Far;
pub(crate) use layout::{local_layout, Staged};

use super::buf::Held;
use super::queue::{EventQueue, ExsEvent, SocketId};
use crate::error::ExsError;
use crate::proto::wire::{self, Frame};
use crate::proto::{Action, Config, Connection, Event, EventKind, FrameId, OpId};

/// What a fabric context stands for.
enum Pending {
    /// Control receive slot `i`.
    CtrlRecv(usize),
    /// A frame, with the send buffer that holds its header.
    Frame(FrameId, MemoryRegion),
    /// One piece of an RMA the core asked for.
    Rma(OpId),
    /// One operation of a layout transfer (`engine/layout.rs`).
    Layout(OpId),
    /// A one-sided RMA the user posted ([`super::ExsSocket::rma`]).
    User(UserRma),
}

/// A user's one-sided RMA out on the fabric: what its completion event carries back.
pub(crate) struct UserRma {
    pub(crate) ctx: u64,
    pub(crate) queue: EventQueue,
    /// The local side, in order: one buffer, or several gathered (write) or scattered
    /// (read) by one operation.
    pub(crate) bufs: Vec<super::ExsBuf>,
}

/// Connection lifecycle as the waiting `connect` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Handshake,
    Open,
    Closed,
}

pub(crate) struct Engine {
    pub(crate) conn: Connection<Held>,
    pub(crate) phase: Phase,
    /// `close()` was called (a second call is an error).
    pub(crate) user_closed: bool,
    /// Why the connection closed, if not by a local `close()`.
    pub(crate) close_err: Option<ExsError>,
    ep: Arc<dyn Endpoint>,
    queue: EventQueue,
    /// Each operation's token (the ctx the core knows it by) → the user's ctx and the queue
    /// it reports to, when not the socket's own.
    routes: HashMap<u64, (u64, Option<EventQueue>)>,
    next_route: u64,
    id: SocketId,
    pending: HashMap<u64, Pending>,
    next_ctx: u64,
    ctrl: MemoryRegion,
    ctrl_size: usize,
    /// Free registered buffers for outgoing frames (header, plus a copied payload when the
    /// driver cannot gather).
    send_pool: Vec<MemoryRegion>,
    send_size: usize,
    gather: bool,
    /// What the runtime had to do in software, for diagnostics.
    pub(crate) stats: super::RuntimeStats,
    /// Largest RMA piece: the driver's measured `rma_piece` unless set otherwise (and never
    /// above its `max_msg_size`).
    pub(crate) rma_chunk: u64,
    /// RMAs split into driver-sized pieces: pieces still out, and the first failure.
    rma_parts: HashMap<OpId, (usize, Result<(), ExsError>)>,
    /// Noncontiguous (layout) transfers, staging buffers and their counters.
    pub(crate) nc: layout::LayoutState,
}

impl Engine {
    /// Registers and posts the control receives, then sends HELLO.
    pub(crate) fn start(
        ep: Arc<dyn Endpoint>,
        cfg: Config,
        queue: EventQueue,
        id: SocketId,
    ) -> Result<Engine, super::Error> {
        let conn = Connection::new(cfg.clone())?;
        let ctrl_size = cfg.control_buf_size();
        let n = cfg.control_buffers();
        let ctrl = ep
            .domain()
            .register(&Buffer::new(ctrl_size * n), Access::LOCAL)?;
        let caps_piece = ep.capabilities().rma_piece.max(1);
        let gather = ep.capabilities().max_gather >= 2;
        let mut e = Engine {
            conn,
            phase: Phase::Handshake,
            user_closed: false,
            close_err: None,
            ep,
            queue,
            routes: HashMap::new(),
            next_route: 0,
            id,
            pending: HashMap::new(),
            next_ctx: 1,
            ctrl,
            ctrl_size,
            send_pool: Vec::new(),
            send_size: ctrl_size,
            gather,
            rma_parts: HashMap::new(),
            rma_chunk: caps_piece,
            nc: layout::LayoutState::default(),
            stats: super::RuntimeStats::default(),
        };
        for i in 0..n {
            e.post_ctrl(i)?;
        }
        e.drain();
        Ok(e)
    }

    /// Frames posted and not yet completed.
    pub(crate) fn frames_out(&self) -> usize {
        self.pending
            .values()
            .filter(|p| matches!(p, Pending::Frame(..)))
            .count()
    }

    fn ctx(&mut self, p: Pending) -> u64 {
        let c = self.next_ctx;
        self.next_ctx += 1;
        self.pending.insert(c, p);
        c
    }

    fn post_ctrl(&mut self, i: usize) -> Result<(), ferry_fabric::FabricError> {
        let slice = self
            .ctrl
            .slice(i * self.ctrl_size..(i + 1) * self.ctrl_size)?;
        let c = self.ctx(Pending::CtrlRecv(i));
        self.ep.post_recv(&[slice], c).inspect_err(|_| {
            self.pending.remove(&c);
        })
    }

    /// The transport broke: the core learns it as a peer CLOSE with ConnectionReset, which
    /// runs exactly the shutdown path a real CLOSE would.
    fn transport_broken(&mut self) {
        let mut bytes = Vec::new();
        let frame = Frame::Close {
            reason: ExsError::ConnectionReset.code(),
            major: wire::VERSION_MAJOR,
            minor: wire::VERSION_MINOR,
        };
        wire::encode(&frame, 0, 0, &mut bytes);
        self.conn.handle_frame(&bytes);
    }

    /// Feeds one fabric completion to the core (actions are executed by `drain`).
    pub(crate) fn complete(&mut self, c: Completion) {
        let Some(p) = self.pending.remove(&c.context) else {
            // Answered already (failed locally at close); the fabric's late word is moot.
            return;
        };
        match p {
            Pending::CtrlRecv(i) => match c.result {
                Ok(()) if c.op == OpKind::Recv => {
                    let len = (c.len as usize).min(self.ctrl_size);
                    let mut bytes = vec![0; len];
                    self.ctrl.buffer().read_at(i * self.ctrl_size, &mut bytes);
                    // Repost before handling: the credit rules count on the slot being back.
                    if self.phase != Phase::Closed && self.post_ctrl(i).is_err() {
                        self.transport_broken();
                    }
                    mark_frame(false, &bytes);
                    self.conn.handle_frame(&bytes);
                }
                Ok(()) => self.transport_broken(),
                Err(e) => {
                    if self.phase != Phase::Closed {
                        debug!(%e, "EXS control receive failed");
                    }
                    // A frame too big for the slot breaks the protocol; anything else is the link.
                    match e {
                        ferry_fabric::FabricError::Truncated { .. } => {
                            self.conn.handle_frame(&[]);
                        }
                        _ => self.transport_broken(),
                    }
                }
            },
            Pending::Frame(id, buf) => {
                self.send_pool.push(buf);
                self.conn
                    .frame_sent(id, c.result.map_err(|_| ExsError::ConnectionReset));
            }
            Pending::Rma(op) => self.piece_done(op, c.result.map_err(|e| rma_failure(&e))),
            Pending::Layout(op) => {
                self.layout_piece_done(op, c.result.map_err(|e| rma_failure(&e)))
            }
            Pending::User(u) => self.user_rma_done(u, c.result.map_err(|e| rma_failure(&e))),
        }
    }

    /// Posts a user's one-sided RMA of all of `u.bufs` to or from `remote`; a post the
    /// fabric refuses (more buffers than it gathers, lengths that do not add up), or one on
    /// a closed connection, is answered at once.
    pub(crate) fn user_rma(&mut self, u: UserRma, write: bool, remote: ferry_fabric::RemoteSlice) {
        if self.phase == Phase::Closed {
            return self.user_rma_done(u, Err(ExsError::NotConnected));
        }
        let local: Result<Vec<_>, _> = u
            .bufs
            .iter()
            .map(|b| b.region().slice(b.offset()..b.offset() + b.len()))
            .collect();
        let Ok(local) = local else {
            return self.user_rma_done(u, Err(ExsError::Transfer));
        };
        let c = self.ctx(Pending::User(u));
        let posted = if write {
            self.ep.post_write(&local, remote, c)
        } else {
            self.ep.post_read(&local, remote, c)
        };
        if let Err(e) = posted {
            if let Some(Pending::User(u)) = self.pending.remove(&c) {
                self.user_rma_done(u, Err(rma_failure(&e)));
            }
        }
    }

    /// Reports a user's RMA to its queue, with its first buffer and the bytes of all.
    fn user_rma_done(&mut self, u: UserRma, result: Result<(), ExsError>) {
        let UserRma { ctx, queue, bufs } = u;
        queue.push(ExsEvent {
            kind: EventKind::Rma,
            socket: self.id,
            ctx,
            len: bufs.iter().map(|b| b.len() as u64).sum(),
            buf: bufs.into_iter().next(),
            result,
        });
    }

    /// Executes every action the core has, in order; after a close, also answers every RMA
    /// still out on the fabric so no operation waits for a completion that may never come
    /// (frames are left to complete: the CLOSE frame among them must still leave).
    pub(crate) fn drain(&mut self) {
        loop {
            while let Some(a) = self.conn.poll_action() {
                self.execute(a);
            }
            if self.phase != Phase::Closed {
                return;
            }
            let mut keys: Vec<u64> = self
                .pending
                .iter()
                .filter(|(_, p)| {
                    matches!(p, Pending::Rma(_) | Pending::Layout(_) | Pending::User(_))
                })
                .map(|(c, _)| *c)
                .collect();
            keys.sort_unstable();
            let out: Vec<(u64, Pending)> = keys
                .into_iter()
                .filter_map(|c| self.pending.remove(&c).map(|p| (c, p)))
                .collect();
            if out.is_empty() {
                return;
            }
            for (_, p) in out {
                match p {
                    Pending::Rma(op) => self.piece_done(op, Err(ExsError::Canceled)),
                    Pending::Layout(op) => self.layout_piece_done(op, Err(ExsError::Canceled)),
                    Pending::User(u) => self.user_rma_done(u, Err(ExsError::Canceled)),
                    _ => {}
                }
            }
        }
    }

    fn execute(&mut self, a: Action<Held>) {
        match a {
            Action::SendFrame { id, bytes, payload } => {
                if let Err(e) = self.send_frame(id, &bytes, payload) {
                    debug!(%e, "EXS frame post failed");
                    self.conn.frame_sent(id, Err(ExsError::ConnectionReset));
                }
            }
            Action::RmaRead {
                op,
                local,
                local_offset,
                remote,
            } if local.layout().is_some() => {
                self.layout_rma(op, false, &local, local_offset, Far::contiguous(remote))
            }
            Action::RmaRead {
                op,
                local,
                local_offset,
                remote,
            } => self.rma(op, false, &local, local_offset, remote),
            Action::RmaReadLayout {
                op,
                local,
                local_offset,
                remote,
                layout,
                len,
            } => {
                let far = Far {
                    remote,
                    layout: Some(layout),
                    len,
                };
                self.layout_rma(op, false, &local, local_offset, far)
            }
            Action::RmaWrite {
                op,
                local,
                local_offset,
                remote,
            } if local.layout().is_some() => {
                self.layout_rma(op, true, &local, local_offset, Far::contiguous(remote))
            }
            Action::RmaWrite {
                op,
                local,
                local_offset,
                remote,
            } => self.rma(op, true, &local, local_offset, remote),
            Action::CopyIn { buf, offset, data } if buf.layout().is_some() => {
                self.layout_copy_in(&buf, offset, &data);
            }
            Action::CopyIn { buf, offset, data } => {
                // The core only asks for copies within the buffer.
                if let Err(e) = buf.buf().write_at(offset as usize, &data) {
                    debug!(%e, "EXS immediate copy out of bounds");
                }
            }
            Action::Event(ev) => self.event(ev),
        }
    }

    /// Lets the peer reach `held`'s memory by RMA on this connection (and only this one), as
    /// its registration allows: called before the core may advertise it. A region without
    /// remote rights is never advertised and needs no grant; one of another domain fails the
    /// operation when it is posted.
    pub(crate) fn grant(&self, held: &Held) {
        let region = held.buf().region();
        if region.access() != Access::LOCAL {
            let _ = self.ep.grant(region);
        }
    }

    /// The token to give the core for an operation of the user's `ctx` reporting to `queue`
    /// (None: the socket's own queue). Tokens start at 1; connection events carry 0.
    pub(crate) fn route(&mut self, ctx: u64, queue: Option<&EventQueue>) -> u64 {
        self.next_route += 1;
        let queue = queue.filter(|q| !q.same_queue(&self.queue)).cloned();
        self.routes.insert(self.next_route, (ctx, queue));
        self.next_route
    }

    fn event(&mut self, ev: Event<Held>) {
        let ev = self.unstage(ev);
        if timeline::enabled() {
            let what = match ev.kind {
                EventKind::Send => "exs.ev.send",
                EventKind::Recv => "exs.ev.recv",
                _ => "exs.ev.other",
            };
            timeline::mark(what, ev.ctx);
        }
        match ev.kind {
            // `connect`/`accept` wait for this themselves; the queue never sees it.
            EventKind::Connect => {
                self.phase = Phase::Open;
                return;
            }
            EventKind::Close => {
                self.phase = Phase::Closed;
                self.close_err = ev.result.err();
            }
            _ => {}
        }
        // A notification leaves its persistent send posted, and its route with it.
        let route = if ev.kind == EventKind::ReadNotify {
            self.routes.get(&ev.ctx).cloned()
        } else {
            self.routes.remove(&ev.ctx)
        };
        let (ctx, queue) = route.unwrap_or((0, None));
        queue.as_ref().unwrap_or(&self.queue).push(ExsEvent {
            kind: ev.kind,
            socket: self.id,
            ctx,
            buf: ev.buf.map(Held::into_buf),
            len: ev.len,
            result: ev.result,
        });
    }
}

/// Marks a frame sent (`tx`) or received on the timeline (`ferry_fabric::timeline`), by type,
/// with its message id where it has one.
pub(crate) fn mark_frame(tx: bool, bytes: &[u8]) {
    if !timeline::enabled() {
        return;
    }
    let ty = bytes.get(4).copied().unwrap_or(0);
    let id = bytes
        .get(8..16)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes);
    let what = match (tx, ty) {
        (true, 2) => "exs.tx.advert",
        (true, 3) => "exs.tx.ack",
        (true, 9) => "exs.tx.credit",
        (true, _) => "exs.tx.other",
        (false, 2) => "exs.rx.advert",
        (false, 3) => "exs.rx.ack",
        (false, 9) => "exs.rx.credit",
        (false, _) => "exs.rx.other",
    };
    timeline::mark(what, id);
}

/// What a failed RMA means for its transfer: the fabric lost the connection underneath
/// (the peer died, or the transport broke) fails the whole connection with ECONNRESET;
/// anything else (a refused key, bounds) fails that transfer alone.
fn rma_failure(e: &ferry_fabric::FabricError) -> ExsError {
    use std::io::ErrorKind;
    match e {
        ferry_fabric::FabricError::ConnectionLost(_) => ExsError::ConnectionReset,
        ferry_fabric::FabricError::Io { source, .. }
            if matches!(
                source.kind(),
                ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
                    | ErrorKind::UnexpectedEof
                    | ErrorKind::NotConnected
            ) =>
        {
            ExsError::ConnectionReset
        }
        _ => ExsError::Transfer,
    }
}
