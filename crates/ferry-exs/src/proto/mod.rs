//! The EXS protocol core: a deterministic state machine with no I/O.
//!
//! The runtime feeds a [`Connection`] with user calls (`send`, `recv`, `close`) and with what
//! the fabric reported (`handle_frame`, `rma_done`, `frame_sent`), then drains
//! [`Connection::poll_action`] and carries out each [`Action`] in order. Nothing in here
//! touches memory, sockets, threads or clocks, which is what lets the tests drive two
//! connections through a simulated fabric with seeded interleavings.
//!
//! # What the runtime must do
//! - Before connecting, post [`Config::control_buffers`] receive buffers of
//!   [`Config::control_buf_size`] bytes each, and repost each one right after passing its
//!   bytes to [`Connection::handle_frame`] (before executing the actions that follow): the
//!   credit rules guarantee the peer never has more frames in flight than that.
//! - Execute actions in the order polled: a `CopyIn` precedes the event that reports it.
//! - Answer every [`Action::SendFrame`] with [`Connection::frame_sent`] and every
//!   [`Action::RmaRead`]/[`Action::RmaWrite`] with [`Connection::rma_done`], also after
//!   close (an error result is fine): buffers in use are released only then.
//! - On an [`EventKind::Close`] event, shut the endpoint down before handing the buffers of
//!   the completion events that follow back to the user, so no peer RMA can still reach them.

mod conn;
mod credit;
mod layout;
mod remote;
mod stats;
pub mod wire;

pub use conn::Connection;
pub use credit::CreditState;
pub use layout::WireLayout;
pub use remote::RemoteSlice;
pub use stats::Stats;

use crate::error::ExsError;

/// The largest `small_packet_max_size` accepted: control buffers stay small.
pub const MAX_IMMEDIATE: u32 = 65_536;

/// Per-socket settings, fixed before connecting (`exs_fcntl` in the C API).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Unsolicited frames this side wants to have outstanding at the peer (1..=65535).
    pub send_credits: u16,
    /// Unsolicited frames this side accepts outstanding (1..=65535).
    pub recv_credits: u16,
    /// Messages up to this size travel inside the advertisement (eager path).
    pub small_packet_max_size: u32,
    /// Sends use the sender-push rendezvous (request, grant, RMA write, done) instead of the
    /// receiver pulling by RMA read.
    pub push: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            send_credits: 16,
            recv_credits: 16,
            small_packet_max_size: 512,
            push: false,
        }
    }
}

impl Config {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), ExsError> {
        let ok = self.send_credits > 0
            && self.recv_credits > 0
            && self.small_packet_max_size <= MAX_IMMEDIATE;
        ok.then_some(()).ok_or(ExsError::InvalidConfig)
    }

    /// Size of each control receive buffer: the largest frame this side can be sent.
    pub fn control_buf_size(&self) -> usize {
        wire::MAX_FIXED_FRAME + self.small_packet_max_size as usize
    }

    /// Control receive buffers to keep posted: one per credit each way (the peer's
    /// unsolicited frames, plus one response or CREDIT per operation of ours), plus one for
    /// HELLO or CLOSE.
    pub fn control_buffers(&self) -> usize {
        usize::from(self.send_credits) + usize::from(self.recv_credits) + 1
    }
}

/// Flags of `send` and `recv` (`EXS_PERSISTENT`, `EXS_NOTIFY_ON_READ`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flags(pub u32);

impl Flags {
    /// No flags.
    pub const NONE: Flags = Flags(0);
    /// The block stays exposed: the peer receives from (or sends into) it repeatedly.
    pub const PERSISTENT: Flags = Flags(1);
    /// With `PERSISTENT` on a send: an event each time the peer reads the block.
    pub const NOTIFY_ON_READ: Flags = Flags(2);

    /// True if every flag in `other` is set.
    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Flags {
    type Output = Flags;
    fn bitor(self, rhs: Flags) -> Flags {
        Flags(self.0 | rhs.0)
    }
}

/// The runtime's handle to a local registered buffer. Opaque to the core except for its
/// length and, when the peer must reach it by RMA, its remote descriptor.
pub trait LocalBuf: Clone {
    /// Length in bytes.
    fn len(&self) -> u64;
    /// True if the buffer is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// How the peer reaches the whole buffer, if it is registered for remote access. Needed
    /// for pull sends, persistent sends, push receives and persistent receives.
    fn remote(&self) -> Option<RemoteSlice>;
    /// For a send from a noncontiguous buffer (EXS 1.1): where the message's [`len`]
    /// bytes lie inside [`remote`], advertised with the ADVERT so the receiver gathers them.
    /// `None` (the default) for a contiguous buffer. The core uses it only for pulled
    /// messages, with a peer of minor 1 or later, and when it fits the immediate limit.
    ///
    /// [`len`]: LocalBuf::len
    /// [`remote`]: LocalBuf::remote
    fn layout(&self) -> Option<WireLayout> {
        None
    }
}

/// Identifies one RMA the core asked for; echoed in [`Connection::rma_done`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u64);

/// Identifies one frame the core asked to send; echoed in [`Connection::frame_sent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameId(pub u64);

/// What the runtime must do next.
#[derive(Debug)]
pub enum Action<B> {
    /// Send one control message: `bytes`, followed (gathered) by all of `payload` for an
    /// immediate ADVERT.
    SendFrame {
        /// Report its completion with [`Connection::frame_sent`].
        id: FrameId,
        /// Header and body.
        bytes: Vec<u8>,
        /// Immediate data, sent from the user's registered buffer without a copy.
        payload: Option<B>,
    },
    /// RMA-read `remote` into `local` at `local_offset` (`remote.len` bytes).
    RmaRead {
        /// Report its completion with [`Connection::rma_done`].
        op: OpId,
        /// Destination buffer.
        local: B,
        /// Where in `local` the bytes land.
        local_offset: u64,
        /// Source range at the peer.
        remote: RemoteSlice,
    },
    /// RMA-read the first `len` bytes of the message stream `layout` describes inside
    /// `remote` (the peer's noncontiguous send, EXS 1.1) into `local` at `local_offset`.
    RmaReadLayout {
        /// Report its completion with [`Connection::rma_done`].
        op: OpId,
        /// Destination buffer.
        local: B,
        /// Where in `local` the bytes land.
        local_offset: u64,
        /// The peer's advertised slice.
        remote: RemoteSlice,
        /// Where the message's bytes lie inside `remote`.
        layout: WireLayout,
        /// Bytes of the stream to read (a prefix when the recv is smaller).
        len: u64,
    },
    /// RMA-write `remote.len` bytes of `local` from `local_offset` into `remote`.
    RmaWrite {
        /// Report its completion with [`Connection::rma_done`].
        op: OpId,
        /// Source buffer.
        local: B,
        /// Where in `local` the bytes start.
        local_offset: u64,
        /// Destination range at the peer.
        remote: RemoteSlice,
    },
    /// Copy immediate data into `buf` at `offset` (always in bounds).
    CopyIn {
        /// Destination buffer.
        buf: B,
        /// Where in `buf`.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Deliver an event to the user.
    Event(Event<B>),
}

/// What an [`Event`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The HELLO exchange finished; the connection is up.
    Connect,
    /// A send completed.
    Send,
    /// A recv completed.
    Recv,
    /// The peer read a persistent NOTIFY_ON_READ send; the send itself stays posted.
    ReadNotify,
    /// The connection ended; `result` says why (Ok for a local close).
    Close,
    /// A one-sided RMA the user posted ([`crate::runtime::ExsSocket::rma`]) completed.
    Rma,
}

/// A completion or notification for the user (the `exs_event` of the C API, less the socket,
/// which the runtime knows).
#[derive(Debug)]
pub struct Event<B> {
    /// What happened.
    pub kind: EventKind,
    /// The user context given to `send`/`recv` (0 for connection events).
    pub ctx: u64,
    /// The operation's buffer, handed back (None for connection events and notifications).
    pub buf: Option<B>,
    /// Bytes transferred (for a truncated recv, the bytes written: the buffer's length).
    pub len: u64,
    /// Outcome.
    pub result: Result<(), ExsError>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_ranges_and_control_buffer_needs() {
        let c = Config::default();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.control_buffers(), 33);
        assert_eq!(c.control_buf_size(), 48 + 512);
        for bad in [
            Config {
                send_credits: 0,
                ..Config::default()
            },
            Config {
                recv_credits: 0,
                ..Config::default()
            },
            Config {
                small_packet_max_size: MAX_IMMEDIATE + 1,
                ..Config::default()
            },
        ] {
            assert_eq!(bad.validate(), Err(ExsError::InvalidConfig));
            assert!(Connection::<Nothing>::new(bad).is_err());
        }
    }

    #[derive(Clone)]
    struct Nothing;

    impl LocalBuf for Nothing {
        fn len(&self) -> u64 {
            0
        }
        fn remote(&self) -> Option<RemoteSlice> {
            None
        }
    }
}
