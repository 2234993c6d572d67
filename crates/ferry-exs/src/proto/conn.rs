//! The per-connection state machine: user calls and fabric reports in, actions out.
//!
//! The sender half (`send.rs`) turns sends into ADVERTs, immediates, push requests or writes
//! into the peer's persistent block; the receiver half (`recv.rs`) matches the peer's
//! messages with posted recvs in order. This file holds what both share: the handshake,
//! credits, the outgoing queue, frame dispatch and closing.

mod recv;
mod send;

use std::collections::{HashMap, VecDeque};

use tracing::debug;

use super::credit::{CreditState, Credits};
use super::wire::{self, Frame, Hello, WireError};
use super::{Action, Config, Event, EventKind, Flags, FrameId, LocalBuf, OpId, Stats};
use crate::error::ExsError;

use recv::RecvSide;
use send::SendSide;

/// A broken protocol rule, named for the log.
type Violation = &'static str;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Our HELLO is out; waiting for the peer's.
    Handshake,
    /// Established.
    Open,
    /// Closed; pending operations finish with this error as their buffers come back.
    Closed(ExsError),
}

/// Something to hand the runtime. Frames are encoded only when polled, so that they carry
/// every credit freed up to that moment.
enum Out<B> {
    Frame {
        frame: Frame,
        /// The frame is the final response of a peer operation and returns its credit.
        own_credit: bool,
        payload: Option<B>,
        /// The send whose immediate payload rides on this frame.
        send_id: Option<u64>,
        /// Bytes encoded after the body (an ADVERT's layout), empty for most frames.
        extra: Vec<u8>,
    },
    Action(Action<B>),
}

/// One EXS connection's protocol state. See the [module docs](super) for the runtime's side
/// of the contract.
pub struct Connection<B> {
    cfg: Config,
    state: State,
    credits: Credits,
    /// Largest immediate both sides accept (known after the HELLO exchange).
    imm_max: u64,
    /// The peer's minor version (known after the HELLO exchange).
    peer_minor: u16,
    /// The length of a message sent right behind HELLO, before the peer's had come
    /// ([`Connection::send_early`]): checked against the peer's limits once it has.
    early: Option<u64>,
    stats: Stats,
    /// Ids this side gives messages, recv blocks and RMAs: strictly increasing.
    next_id: u64,
    /// The last id the peer gave a message or block; a peer's ids must increase, so a
    /// replayed or duplicated frame cannot alias live state.
    last_peer_id: u64,
    next_frame: u64,
    out: VecDeque<Out<B>>,
    frames_queued: usize,
    /// Frames handed out and not yet reported sent, with the send riding on each.
    in_flight: HashMap<FrameId, Option<u64>>,
    tx: SendSide<B>,
    rx: RecvSide<B>,
}

impl<B: LocalBuf> Connection<B> {
    /// A connection about to be established: its HELLO is the first action.
    pub fn new(cfg: Config) -> Result<Self, ExsError> {
        cfg.validate()?;
        let hello = Hello {
            minor: wire::VERSION_MINOR,
            send_credits: cfg.send_credits,
            recv_credits: cfg.recv_credits,
            max_imm: cfg.small_packet_max_size,
        };
        let mut c = Connection {
            cfg,
            state: State::Handshake,
            credits: Credits::default(),
            imm_max: 0,
            peer_minor: 0,
            early: None,
            stats: Stats::default(),
            next_id: 1,
            last_peer_id: 0,
            next_frame: 1,
            out: VecDeque::new(),
            frames_queued: 0,
            in_flight: HashMap::new(),
            tx: SendSide::new(),
            rx: RecvSide::new(),
        };
        c.queue_frame(Frame::Hello(hello), false);
        Ok(c)
    }

    /// `exs_send`: sends all of `buf` as one message. With [`Flags::PERSISTENT`] the buffer
    /// stays exposed for the peer to receive from repeatedly; `offset` places the message in
    /// the peer's persistent recv block. Completion (or error) arrives as an event.
    pub fn send(&mut self, ctx: u64, buf: B, flags: Flags, offset: u64) {
        self.send_op(send::SendOp {
            ctx,
            buf,
            flags,
            offset,
            stalled: false,
        });
        self.settle();
    }

    /// Sends all of `buf` as this side's first message, right behind its HELLO and before
    /// the peer's has come: inside its advertisement, on one credit. It saves the round
    /// trip of the HELLO exchange when the first word is this side's (a connector's TLS
    /// ClientHello). Every 1.x peer takes it: frames are handled in order, so the ADVERT
    /// arrives after the HELLO that opens the peer's window (at least one credit), and an
    /// immediate payload within the peer's limit is accepted. If the peer's HELLO shows a
    /// smaller limit, the connection fails with [`ExsError::MessageSize`] (the peer refuses
    /// the frame too) and the caller may connect again without it. Anything but a first
    /// message of at most this side's immediate size is sent as [`Connection::send`] does.
    pub fn send_early(&mut self, ctx: u64, buf: B) {
        let len = buf.len();
        let first = self.state == State::Handshake && self.next_id == 1 && self.early.is_none();
        if !first || len == 0 || len > u64::from(self.cfg.small_packet_max_size) {
            return self.send(ctx, buf, Flags::NONE, 0);
        }
        self.early = Some(len);
        let op = send::SendOp {
            ctx,
            buf,
            flags: Flags::NONE,
            offset: 0,
            stalled: false,
        };
        self.start_send(op, send::Plan::Immediate);
    }

    /// `exs_recv`: receives the next message into `buf` (or, with an `offset`, that range of
    /// the peer's persistent block). With [`Flags::PERSISTENT`] the buffer becomes a block
    /// the peer's sends are written into, without events.
    pub fn recv(&mut self, ctx: u64, buf: B, flags: Flags, offset: u64) {
        self.recv_op(recv::RecvOp {
            ctx,
            buf,
            flags,
            offset,
        });
        self.settle();
    }

    /// One received control message, whole. Bad bytes close the connection with
    /// [`ExsError::Protocol`]; frames after closing are ignored.
    pub fn handle_frame(&mut self, bytes: &[u8]) {
        if matches!(self.state, State::Closed(_)) {
            return;
        }
        match wire::decode(bytes) {
            Ok(d) => {
                self.stats.frames_received += 1;
                if let Err(why) = self.dispatch(d.credits, d.frame, d.payload) {
                    debug!(why, "EXS peer broke the protocol");
                    self.shutdown(ExsError::Protocol, Some(ExsError::Protocol.code()));
                }
            }
            Err(WireError::Version { major, .. }) => {
                let e = ExsError::VersionMismatch {
                    peer_major: major,
                    our_major: wire::VERSION_MAJOR,
                };
                self.shutdown(e, Some(wire::CLOSE_VERSION));
            }
            Err(e) => {
                debug!(%e, "EXS frame rejected");
                self.shutdown(ExsError::Protocol, Some(ExsError::Protocol.code()));
            }
        }
        self.settle();
    }

    /// The RMA `op` finished. An error fails that transfer (on both sides, as
    /// [`ExsError::Transfer`]), not the connection; except [`ExsError::ConnectionReset`]
    /// (the transport under the connection is gone), which closes the connection with it,
    /// so this transfer and every other operation fail with ECONNRESET.
    pub fn rma_done(&mut self, op: OpId, result: Result<(), ExsError>) {
        if result == Err(ExsError::ConnectionReset) {
            self.shutdown(ExsError::ConnectionReset, None);
        }
        let result = result.map_err(|_| ExsError::Transfer);
        if !self.write_done(op, result) {
            self.read_done(op, result);
        }
        self.settle();
    }

    /// The frame `id` left (its buffers are free). A failed send means the transport is
    /// broken: the connection closes with [`ExsError::ConnectionReset`].
    pub fn frame_sent(&mut self, id: FrameId, result: Result<(), ExsError>) {
        let Some(send_id) = self.in_flight.remove(&id) else {
            return;
        };
        if result.is_err() {
            self.shutdown(ExsError::ConnectionReset, None);
        }
        if let Some(sid) = send_id {
            self.payload_sent(sid);
        }
        self.settle();
    }

    /// `exs_close`: tells the peer, and completes every pending operation with
    /// [`ExsError::Canceled`] (operations with transfers in flight complete when those are
    /// reported done).
    pub fn close(&mut self) {
        self.shutdown(ExsError::Canceled, Some(0));
        self.settle();
    }

    /// The next action for the runtime, in order.
    pub fn poll_action(&mut self) -> Option<Action<B>> {
        loop {
            match self.out.pop_front()? {
                Out::Action(a) => return Some(a),
                Out::Frame {
                    frame,
                    own_credit,
                    payload,
                    send_id,
                    extra,
                } => {
                    self.frames_queued -= 1;
                    if frame == Frame::Credit && self.credits.state().owed == 0 {
                        // An earlier frame already carried them.
                        continue;
                    }
                    let credits = self.credits.take_return(own_credit);
                    let mut bytes = Vec::with_capacity(wire::MAX_FIXED_FRAME);
                    let plen = payload.as_ref().map_or(0, |b| b.len() as usize);
                    wire::encode(&frame, credits, plen + extra.len(), &mut bytes);
                    bytes.extend_from_slice(&extra);
                    let id = FrameId(self.next_frame);
                    self.next_frame += 1;
                    self.in_flight.insert(id, send_id);
                    self.stats.frames_sent += 1;
                    self.stats.credit_frames += u64::from(frame == Frame::Credit);
                    return Some(Action::SendFrame { id, bytes, payload });
                }
            }
        }
    }

    /// What the connection did so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The credit counters.
    pub fn credits(&self) -> CreditState {
        self.credits.state()
    }

    /// Largest message that travels as immediate data (0 before the handshake).
    pub fn immediate_max(&self) -> u64 {
        self.imm_max
    }

    /// The settings this side was created with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The peer's protocol minor version (0 before the handshake). Layout ADVERTs need
    /// [`wire::LAYOUT_MINOR`].
    pub fn peer_minor(&self) -> u16 {
        self.peer_minor
    }

    /// Peer messages that wait for a recv (a persistent block counts as one, always waiting).
    pub fn waiting_messages(&self) -> usize {
        self.rx.waiting()
    }

    /// True once the HELLO exchange finished and until the connection closes.
    pub fn is_connected(&self) -> bool {
        self.state == State::Open
    }

    /// True if no operation is pending, no action is waiting to be polled and nothing handed
    /// out is unanswered. (A posted persistent operation keeps a connection busy until close.)
    pub fn is_idle(&self) -> bool {
        self.out.is_empty() && self.in_flight.is_empty() && self.tx.is_idle() && self.rx.is_idle()
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id - 1
    }

    fn queue_frame(&mut self, frame: Frame, own_credit: bool) {
        self.queue_payload_frame(frame, own_credit, None, None);
    }

    fn queue_payload_frame(
        &mut self,
        frame: Frame,
        own_credit: bool,
        payload: Option<B>,
        send_id: Option<u64>,
    ) {
        self.frames_queued += 1;
        self.out.push_back(Out::Frame {
            frame,
            own_credit,
            payload,
            send_id,
            extra: Vec::new(),
        });
    }

    /// Queues a frame followed by `extra` encoded bytes (an ADVERT's layout).
    fn queue_frame_with(&mut self, frame: Frame, extra: Vec<u8>) {
        self.frames_queued += 1;
        self.out.push_back(Out::Frame {
            frame,
            own_credit: false,
            payload: None,
            send_id: None,
            extra,
        });
    }

    fn action(&mut self, a: Action<B>) {
        self.out.push_back(Out::Action(a));
    }

    fn event(
        &mut self,
        kind: EventKind,
        ctx: u64,
        buf: Option<B>,
        len: u64,
        result: Result<(), ExsError>,
    ) {
        self.action(Action::Event(Event {
            kind,
            ctx,
            buf,
            len,
            result,
        }));
    }

    /// The error operations finish with once closed.
    fn closed_err(&self) -> Option<ExsError> {
        match self.state {
            State::Closed(e) => Some(e),
            _ => None,
        }
    }

    /// After every input: start what credits allow, then return credits nobody carries.
    fn settle(&mut self) {
        if self.state != State::Open {
            return;
        }
        self.pump_ctl();
        self.pump_sends();
        if self.frames_queued == 0 && self.credits.should_flush() {
            self.queue_frame(Frame::Credit, false);
        }
    }

    fn dispatch(&mut self, credits: u16, frame: Frame, payload: &[u8]) -> Result<(), Violation> {
        if let Frame::Close { reason, major, .. } = frame {
            let e = match reason {
                0 => ExsError::PeerClosed,
                wire::CLOSE_VERSION => ExsError::VersionMismatch {
                    peer_major: major,
                    our_major: wire::VERSION_MAJOR,
                },
                c => ExsError::from_code(c).unwrap_or(ExsError::ConnectionReset),
            };
            self.shutdown(e, None);
            return Ok(());
        }
        if self.state == State::Handshake {
            let Frame::Hello(h) = frame else {
                return Err("frame before HELLO");
            };
            self.credits = Credits::negotiate(&self.cfg, &h);
            self.imm_max = u64::from(self.cfg.small_packet_max_size.min(h.max_imm));
            self.peer_minor = h.minor;
            if let Some(len) = self.early {
                // The early message spent a credit of the window just agreed (never empty:
                // both sides offer at least one).
                let _ = self.credits.try_take();
                if len > self.imm_max {
                    self.shutdown(ExsError::MessageSize, None);
                    return Ok(());
                }
            }
            self.state = State::Open;
            self.event(EventKind::Connect, 0, None, 0, Ok(()));
            return Ok(());
        }
        self.credits
            .returned(credits)
            .map_err(|()| "more credits returned than spent")?;
        if frame.is_unsolicited() {
            self.credits
                .received()
                .map_err(|()| "unsolicited frame beyond the credit window")?;
        }
        if let Frame::Advert { id, .. } | Frame::PushReq { id, .. } | Frame::RecvAdvert { id, .. } =
            frame
        {
            if id <= self.last_peer_id {
                return Err("message id not above the previous one");
            }
            self.last_peer_id = id;
        }
        match frame {
            Frame::Hello(_) => Err("second HELLO"),
            Frame::Advert { .. } | Frame::PushReq { .. } => self.on_message(frame, payload),
            Frame::Ack { id, len, status } => self.on_ack(id, len, status),
            Frame::PushGrant { id, status, remote } => self.on_grant(id, status, remote),
            Frame::PushDone { id, len, status } => self.on_done(id, len, status),
            Frame::RecvAdvert { remote, .. } => self.on_recv_advert(remote),
            Frame::ReadNotify { id, offset, len } => self.on_notify(id, offset, len),
            Frame::Credit | Frame::Close { .. } => Ok(()),
        }
    }

    /// Ends the connection: a Close event first (so the runtime can shut the endpoint down
    /// before buffers go back to the user), then every operation that holds no transfer in
    /// flight completes with `err`; the others complete as their transfers are reported.
    fn shutdown(&mut self, err: ExsError, close_reason: Option<u16>) {
        if matches!(self.state, State::Closed(_)) {
            return;
        }
        if let Some(reason) = close_reason {
            self.queue_frame(
                Frame::Close {
                    reason,
                    major: wire::VERSION_MAJOR,
                    minor: wire::VERSION_MINOR,
                },
                false,
            );
        }
        self.state = State::Closed(err);
        let close_result = if err == ExsError::Canceled {
            Ok(())
        } else {
            Err(err)
        };
        self.event(EventKind::Close, 0, None, 0, close_result);
        self.cancel_sends(err);
        self.cancel_recvs(err);
    }
}
