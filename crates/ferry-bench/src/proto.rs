//! The control protocol between `ferry bench fabric` and its peer process, carried as
//! fixed-size frames over the fabric endpoint under test.
//!
//! The client drives; the peer answers each request with exactly one reply. The peer keeps one
//! control receive posted, except during a send phase, where it keeps `slots` bulk receives
//! posted instead. 8-byte messages outside a phase are pings, answered by an 8-byte pong.
//!
//! Send phase: `SendPhase` → `Ready`; bulk messages; `End{sent}` → `Drain{leftover}`;
//! `leftover` × `Fill` (consuming the receives still posted) → `Done{received}`.

use anyhow::{bail, Context, Result};
use ferry_fabric::RemoteSlice;

/// Size of every control frame; bulk messages are always larger.
pub const CTRL_LEN: usize = 64;
/// Size of a ping or pong.
pub const PING_LEN: usize = 8;
const MAGIC: &[u8; 4] = b"FRB1";

/// One control frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    /// Client: register a target region of this many bytes.
    Hello { bytes: u64 },
    /// Peer: the registered region, for RMA.
    Advert(RemoteSlice),
    /// Client: report your CPU usage so far.
    Usage,
    /// Peer: CPU (user plus system) microseconds used so far.
    UsageReply { cpu_us: u64 },
    /// Client: post `slots` receives of `size` bytes for a stream of sends.
    SendPhase { size: u64, slots: u64 },
    /// Peer: receives are posted.
    Ready,
    /// Client: the stream is over after `sent` bulk messages.
    End { sent: u64 },
    /// Peer: send this many fill frames to consume my leftover receives.
    Drain { leftover: u64 },
    /// Client: a filler frame.
    Fill,
    /// Peer: the send phase is over; this many bytes arrived.
    Done { received: u64 },
    /// Client: report usage and exit.
    Bye,
    /// Client (`bench noncontig`): `size` packed bytes are at offset `stage` of the region;
    /// unpack them into [`UNPACK_BLOCKS`] blocks of `size / UNPACK_BLOCKS` bytes, `stride`
    /// apart, from offset `origin`. The peer answers `Done`.
    Unpack {
        size: u64,
        stride: u64,
        stage: u64,
        origin: u64,
    },
    /// Client (`bench noncontig`): a message of `bytes` has landed by RMA; the peer answers
    /// `Done` (the notification EXIO sends after its RMA writes).
    Notify { bytes: u64 },
}

/// Blocks of the noncontiguous layout [`Msg::Unpack`] names (EXIO's 16 segments).
pub const UNPACK_BLOCKS: u64 = 16;

impl Msg {
    /// Encodes the frame: magic, type byte, then up to four little-endian u64 at 8, 16, 24, 32.
    pub fn encode(&self) -> [u8; CTRL_LEN] {
        let (ty, words): (u8, [u64; 4]) = match *self {
            Msg::Hello { bytes } => (1, [bytes, 0, 0, 0]),
            Msg::Advert(r) => (2, [r.addr, r.len, r.key, 0]),
            Msg::Usage => (3, [0; 4]),
            Msg::UsageReply { cpu_us } => (4, [cpu_us, 0, 0, 0]),
            Msg::SendPhase { size, slots } => (5, [size, slots, 0, 0]),
            Msg::Ready => (6, [0; 4]),
            Msg::End { sent } => (7, [sent, 0, 0, 0]),
            Msg::Drain { leftover } => (8, [leftover, 0, 0, 0]),
            Msg::Fill => (9, [0; 4]),
            Msg::Done { received } => (10, [received, 0, 0, 0]),
            Msg::Bye => (11, [0; 4]),
            Msg::Unpack {
                size,
                stride,
                stage,
                origin,
            } => (12, [size, stride, stage, origin]),
            Msg::Notify { bytes } => (13, [bytes, 0, 0, 0]),
        };
        let mut b = [0u8; CTRL_LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4] = ty;
        for (i, w) in words.iter().enumerate() {
            b[8 + 8 * i..16 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// Decodes a frame received from the other side.
    pub fn decode(b: &[u8]) -> Result<Msg> {
        if b.len() != CTRL_LEN || &b[..4] != MAGIC {
            bail!("not a bench control frame ({} bytes)", b.len());
        }
        let w = |i: usize| -> Result<u64> {
            let bytes = b.get(8 + 8 * i..16 + 8 * i).context("short frame")?;
            Ok(u64::from_le_bytes(bytes.try_into()?))
        };
        Ok(match b[4] {
            1 => Msg::Hello { bytes: w(0)? },
            2 => Msg::Advert(RemoteSlice::decode(&b[8..]).context("short advert")?),
            3 => Msg::Usage,
            4 => Msg::UsageReply { cpu_us: w(0)? },
            5 => Msg::SendPhase {
                size: w(0)?,
                slots: w(1)?,
            },
            6 => Msg::Ready,
            7 => Msg::End { sent: w(0)? },
            8 => Msg::Drain { leftover: w(0)? },
            9 => Msg::Fill,
            10 => Msg::Done { received: w(0)? },
            11 => Msg::Bye,
            12 => Msg::Unpack {
                size: w(0)?,
                stride: w(1)?,
                stage: w(2)?,
                origin: w(3)?,
            },
            13 => Msg::Notify { bytes: w(0)? },
            t => bail!("unknown control frame type {t}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_garbage_is_an_error() {
        let r = RemoteSlice {
            addr: 1,
            len: 2,
            key: 3,
        };
        for m in [
            Msg::Hello { bytes: 64 << 20 },
            Msg::Advert(r),
            Msg::UsageReply { cpu_us: 5 },
            Msg::SendPhase {
                size: 4096,
                slots: 16,
            },
            Msg::Done { received: 9 },
            Msg::Bye,
            Msg::Unpack {
                size: 1 << 20,
                stride: 1 << 20,
                stage: 16 << 20,
                origin: 3 << 20,
            },
            Msg::Notify { bytes: 7 },
        ] {
            assert_eq!(Msg::decode(&m.encode()).unwrap(), m);
        }
        assert!(Msg::decode(&[0; CTRL_LEN]).is_err());
        assert!(Msg::decode(&Msg::Bye.encode()[..8]).is_err());
        let mut bad = Msg::Bye.encode();
        bad[4] = 200;
        assert!(Msg::decode(&bad).is_err());
    }
}
