//! EXS frames: encoding and a decoder that accepts only canonical frames.
//!
//! Every frame is an 8-byte header (total length, type, flags, credits returned) and a
//! fixed-size body; only an immediate ADVERT carries a variable payload after its body. All
//! integers are little-endian. The layouts are documented in `docs/protocol.md` (section "EXS control protocol"). [`decode`] is the
//! fuzzing entry point: it never panics and rejects anything it would not itself encode.

use super::RemoteSlice;

use crate::error::ExsError;
use ferry_wire::{ReadError, Reader, Writer};

/// Protocol major version; another major is refused at connect time.
pub const VERSION_MAJOR: u16 = 1;
/// Protocol minor version; a higher minor may append fields to HELLO.
pub const VERSION_MINOR: u16 = 1;
/// The first minor that understands [`F_LAYOUT`]: a sender uses it only with such a peer.
pub const LAYOUT_MINOR: u16 = 1;
/// `"FEXS"` as a little-endian u32: the first four bytes of every HELLO body.
pub const MAGIC: u32 = u32::from_le_bytes(*b"FEXS");
/// Size of the fixed frame header.
pub const HEADER_LEN: usize = 8;

const HELLO_LEN: usize = 16;
const ADVERT_LEN: usize = 40;
const ACK_LEN: usize = 24;
const PUSH_REQ_LEN: usize = 24;
const GRANT_LEN: usize = 40;
const DONE_LEN: usize = 24;
const RECV_ADVERT_LEN: usize = 32;
const NOTIFY_LEN: usize = 24;
const CLOSE_LEN: usize = 8;

/// The largest frame without immediate data (an ADVERT); control buffers are this plus the
/// immediate payload size.
pub const MAX_FIXED_FRAME: usize = HEADER_LEN + ADVERT_LEN;

/// ADVERT flag: the message bytes follow the body.
pub const F_IMMEDIATE: u8 = 1;
/// ADVERT / RECV_ADVERT flag: the block stays exposed for repeated transfers.
pub const F_PERSISTENT: u8 = 2;
/// ADVERT flag (with [`F_PERSISTENT`]): the reader sends READ_NOTIFY after each read.
pub const F_NOTIFY: u8 = 4;
/// ADVERT flag (EXS 1.1): a [`WireLayout`](super::WireLayout) follows the body and says where
/// the message's bytes lie inside `remote`; the message length is the layout's size.
pub const F_LAYOUT: u8 = 8;

/// A remote descriptor with every field zero: what a refusal carries instead of a buffer.
pub const NO_REMOTE: RemoteSlice = RemoteSlice {
    addr: 0,
    len: 0,
    key: 0,
};

/// CLOSE reason for a refused version (the frame's own version fields say which).
pub const CLOSE_VERSION: u16 = 13;

/// Frame type bytes.
mod ty {
    pub const HELLO: u8 = 1;
    pub const ADVERT: u8 = 2;
    pub const ACK: u8 = 3;
    pub const PUSH_REQ: u8 = 4;
    pub const PUSH_GRANT: u8 = 5;
    pub const PUSH_DONE: u8 = 6;
    pub const RECV_ADVERT: u8 = 7;
    pub const READ_NOTIFY: u8 = 8;
    pub const CREDIT: u8 = 9;
    pub const CLOSE: u8 = 10;
}

/// The outcome a response frame reports.
pub type Status = Result<(), ExsError>;

/// Connection parameters each side announces once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The sender's minor version (its major is ours, or the HELLO was refused).
    pub minor: u16,
    /// Unsolicited frames this side wants to be able to send.
    pub send_credits: u16,
    /// Unsolicited frames this side can receive.
    pub recv_credits: u16,
    /// Largest immediate payload this side accepts.
    pub max_imm: u32,
}

/// One decoded frame (the immediate payload, if any, is returned beside it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// Connection parameters; the first frame each way.
    Hello(Hello),
    /// A message ready to be pulled (or carried immediately, or exposed persistently).
    Advert {
        /// Sender's message id, echoed by the ACK.
        id: u64,
        /// [`F_IMMEDIATE`], [`F_PERSISTENT`], [`F_NOTIFY`].
        flags: u8,
        /// Where to place the message in the receiver's persistent block.
        offset: u64,
        /// The sender's buffer; for immediates `addr` and `key` are 0 and `len` is the
        /// payload length.
        remote: RemoteSlice,
    },
    /// The verdict on an ADVERT or RECV_ADVERT; returns its credit.
    Ack {
        /// The advertised id.
        id: u64,
        /// Bytes transferred.
        len: u64,
        /// Outcome.
        status: Status,
    },
    /// Sender-push rendezvous: asks the receiver for a buffer of `len` bytes.
    PushReq {
        /// Sender's message id.
        id: u64,
        /// Where to place the message in the receiver's persistent block.
        offset: u64,
        /// Message length.
        len: u64,
    },
    /// The receiver's buffer for a push (or a refusal, which returns the credit).
    PushGrant {
        /// The request's id.
        id: u64,
        /// Outcome; on error `remote` is all zero.
        status: Status,
        /// Where to write (at most the message length; less means truncation).
        remote: RemoteSlice,
    },
    /// The push's RMA write finished; the receiver completes its recv and frees the credit.
    PushDone {
        /// The request's id.
        id: u64,
        /// Bytes written.
        len: u64,
        /// Outcome of the write.
        status: Status,
    },
    /// A persistent recv block the peer's sends will be written into.
    RecvAdvert {
        /// Receiver's id, echoed by the ACK.
        id: u64,
        /// The block.
        remote: RemoteSlice,
    },
    /// The reader read a NOTIFY_ON_READ persistent block.
    ReadNotify {
        /// The persistent send's id.
        id: u64,
        /// Offset read.
        offset: u64,
        /// Bytes read.
        len: u64,
    },
    /// Nothing but the credits in the header.
    Credit,
    /// The sender closes the connection; `reason` is 0 for an orderly close or an error code.
    Close {
        /// 0 or an [`ExsError`] code (13: version mismatch).
        reason: u16,
        /// Sender's protocol major version.
        major: u16,
        /// Sender's protocol minor version.
        minor: u16,
    },
}

impl Frame {
    /// True for frames that consume one of the sender's credits.
    pub fn is_unsolicited(&self) -> bool {
        matches!(
            self,
            Frame::Advert { .. }
                | Frame::PushReq { .. }
                | Frame::RecvAdvert { .. }
                | Frame::ReadNotify { .. }
        )
    }
}

/// A decoded frame with its header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// Credits the sender returns with this frame.
    pub credits: u16,
    /// The frame.
    pub frame: Frame,
    /// Immediate payload, or the encoded layout of an ADVERT with [`F_LAYOUT`] (empty
    /// otherwise).
    pub payload: &'a [u8],
}

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the header or the body needs.
    #[error("frame truncated")]
    Short,
    /// The length field disagrees with the bytes received or the type's body size.
    #[error("frame length field does not match its content")]
    BadLength,
    /// Unknown frame type.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// A field holds a value the protocol does not allow (flags, reserved bytes, status,
    /// remote range overflowing, credits on a HELLO).
    #[error("invalid field in frame type {0}")]
    BadField(u8),
    /// A HELLO without the EXS magic.
    #[error("not an EXS peer (bad HELLO magic)")]
    BadMagic,
    /// A HELLO of another major version.
    #[error("peer speaks EXS {major}.{minor}")]
    Version {
        /// Peer's major version.
        major: u16,
        /// Peer's minor version.
        minor: u16,
    },
}

/// The total length of the frame starting at `b`, once its header has arrived; for
/// transports that deliver a byte stream rather than messages.
pub fn frame_len(b: &[u8]) -> Option<usize> {
    Some(u32::from_le_bytes(b.get(0..4)?.try_into().ok()?) as usize)
}

/// Appends the encoded header and body of `frame` to `out`. `payload_len` is the length of
/// immediate data the caller sends right after (0 for every other frame).
pub fn encode(frame: &Frame, credits: u16, payload_len: usize, out: &mut Vec<u8>) {
    let (t, flags) = match frame {
        Frame::Hello(_) => (ty::HELLO, 0),
        Frame::Advert { flags, .. } => (ty::ADVERT, *flags),
        Frame::Ack { .. } => (ty::ACK, 0),
        Frame::PushReq { .. } => (ty::PUSH_REQ, 0),
        Frame::PushGrant { .. } => (ty::PUSH_GRANT, 0),
        Frame::PushDone { .. } => (ty::PUSH_DONE, 0),
        Frame::RecvAdvert { .. } => (ty::RECV_ADVERT, F_PERSISTENT),
        Frame::ReadNotify { .. } => (ty::READ_NOTIFY, 0),
        Frame::Credit => (ty::CREDIT, 0),
        Frame::Close { .. } => (ty::CLOSE, 0),
    };
    let mut w = Writer::new(out);
    w.u32(0); // the total length, patched below
    w.u8(t);
    w.u8(flags);
    w.u16(credits);
    let status = |w: &mut Writer<'_>, s: &Status| {
        w.u16(s.err().map_or(0, |e| e.code()));
        w.zeros(6);
    };
    match frame {
        Frame::Hello(h) => {
            w.u32(MAGIC);
            for v in [VERSION_MAJOR, h.minor, h.send_credits, h.recv_credits] {
                w.u16(v);
            }
            w.u32(h.max_imm);
        }
        Frame::Advert {
            id, offset, remote, ..
        } => {
            w.u64(*id);
            w.u64(*offset);
            w.bytes(&remote.encode());
        }
        Frame::Ack { id, len, status: s } | Frame::PushDone { id, len, status: s } => {
            w.u64(*id);
            w.u64(*len);
            status(&mut w, s);
        }
        Frame::PushReq { id, offset, len } | Frame::ReadNotify { id, offset, len } => {
            [id, offset, len].into_iter().for_each(|v| w.u64(*v))
        }
        Frame::PushGrant {
            id,
            status: s,
            remote,
        } => {
            w.u64(*id);
            status(&mut w, s);
            w.bytes(&remote.encode());
        }
        Frame::RecvAdvert { id, remote } => {
            w.u64(*id);
            w.bytes(&remote.encode());
        }
        Frame::Credit => {}
        Frame::Close {
            reason,
            major,
            minor,
        } => {
            for v in [*reason, *major, *minor, 0] {
                w.u16(v);
            }
        }
    }
    let total = (w.len() + payload_len) as u32;
    w.patch_u32(0, total);
}

impl From<ReadError> for WireError {
    /// Bodies are size-checked before they are read, so a short read is a short frame.
    fn from(_: ReadError) -> Self {
        WireError::Short
    }
}

/// A remote range that cannot overflow the address space when sub-ranged (`None` if it
/// could).
fn remote(r: &mut Reader<'_>) -> Result<Option<RemoteSlice>, ReadError> {
    let b: [u8; RemoteSlice::WIRE_LEN] = r.array()?;
    Ok(RemoteSlice::decode(&b).filter(|s| s.addr.checked_add(s.len).is_some()))
}

/// A status: code then six reserved zero bytes (`None` if not a valid one).
fn status(r: &mut Reader<'_>) -> Result<Option<Status>, ReadError> {
    let code = r.u16()?;
    if !r.zeros(6)? {
        return Ok(None);
    }
    Ok(match code {
        0 => Some(Ok(())),
        c => ExsError::from_code(c).map(Err),
    })
}

/// Decodes one frame occupying all of `b`.
pub fn decode(b: &[u8]) -> Result<Decoded<'_>, WireError> {
    if b.len() < HEADER_LEN {
        return Err(WireError::Short);
    }
    let mut r = Reader::new(b);
    let total = r.u32()? as usize;
    if total != b.len() {
        return Err(WireError::BadLength);
    }
    let (t, flags, credits) = (r.u8()?, r.u8()?, r.u16()?);
    let raw = r.peek_rest();
    let bad = WireError::BadField(t);
    if t == ty::HELLO {
        return decode_hello(raw, flags, credits).map(|h| Decoded {
            credits,
            frame: Frame::Hello(h),
            payload: &[],
        });
    }
    let need = match t {
        ty::ADVERT => ADVERT_LEN,
        ty::ACK => ACK_LEN,
        ty::PUSH_REQ => PUSH_REQ_LEN,
        ty::PUSH_GRANT => GRANT_LEN,
        ty::PUSH_DONE => DONE_LEN,
        ty::RECV_ADVERT => RECV_ADVERT_LEN,
        ty::READ_NOTIFY => NOTIFY_LEN,
        ty::CREDIT => 0,
        ty::CLOSE => CLOSE_LEN,
        other => return Err(WireError::UnknownType(other)),
    };
    let body = r.take(need)?;
    let payload = r.rest();
    let f = &mut Reader::new(body);
    let allowed_flags = match t {
        ty::ADVERT => F_IMMEDIATE | F_PERSISTENT | F_NOTIFY | F_LAYOUT,
        ty::RECV_ADVERT => F_PERSISTENT,
        _ => 0,
    };
    if flags & !allowed_flags != 0 {
        return Err(bad);
    }
    let frame = match t {
        ty::ADVERT => {
            let (id, offset) = (f.u64()?, f.u64()?);
            let remote = remote(f)?.ok_or(bad)?;
            let imm = flags & F_IMMEDIATE != 0;
            let persistent = flags & F_PERSISTENT != 0;
            let canonical = if imm {
                !persistent && remote.addr == 0 && remote.key == 0
            } else {
                // Persistent blocks are read at the reader's offsets, not placed at one.
                !persistent || offset == 0
            };
            if !canonical || (flags & F_NOTIFY != 0 && !persistent) {
                return Err(bad);
            }
            if flags & F_LAYOUT != 0 {
                // A layout describes an ordinary pulled message.
                if imm || persistent || offset != 0 {
                    return Err(bad);
                }
                if super::WireLayout::decode(payload, remote.len).is_none() {
                    return Err(bad);
                }
            } else {
                let want_payload = if imm { remote.len } else { 0 };
                if payload.len() as u64 != want_payload {
                    return Err(WireError::BadLength);
                }
            }
            Frame::Advert {
                id,
                flags,
                offset,
                remote,
            }
        }
        ty::ACK | ty::PUSH_DONE => {
            let (id, len) = (f.u64()?, f.u64()?);
            let status = status(f)?.ok_or(bad)?;
            if t == ty::ACK {
                Frame::Ack { id, len, status }
            } else {
                Frame::PushDone { id, len, status }
            }
        }
        ty::PUSH_REQ => Frame::PushReq {
            id: f.u64()?,
            offset: f.u64()?,
            len: f.u64()?,
        },
        ty::READ_NOTIFY => Frame::ReadNotify {
            id: f.u64()?,
            offset: f.u64()?,
            len: f.u64()?,
        },
        ty::PUSH_GRANT => {
            let id = f.u64()?;
            let status = status(f)?.ok_or(bad)?;
            let remote = remote(f)?.ok_or(bad)?;
            if status.is_err() && remote != NO_REMOTE {
                return Err(bad);
            }
            Frame::PushGrant { id, status, remote }
        }
        ty::RECV_ADVERT => {
            if flags != F_PERSISTENT {
                return Err(bad);
            }
            Frame::RecvAdvert {
                id: f.u64()?,
                remote: remote(f)?.ok_or(bad)?,
            }
        }
        ty::CREDIT => {
            if credits == 0 {
                return Err(bad);
            }
            Frame::Credit
        }
        _ => {
            let (reason, major, minor) = (f.u16()?, f.u16()?, f.u16()?);
            let known =
                reason == 0 || reason == CLOSE_VERSION || ExsError::from_code(reason).is_some();
            if !known || f.u16()? != 0 {
                return Err(bad);
            }
            Frame::Close {
                reason,
                major,
                minor,
            }
        }
    };
    if t != ty::ADVERT && !payload.is_empty() {
        return Err(WireError::BadLength);
    }
    Ok(Decoded {
        credits,
        frame,
        payload,
    })
}

/// HELLO keeps magic and version in its first eight bytes in every version, so a peer of
/// another major is recognised and refused rather than misparsed.
fn decode_hello(raw: &[u8], flags: u8, credits: u16) -> Result<Hello, WireError> {
    let mut f = Reader::new(raw);
    if f.u32()? != MAGIC {
        return Err(WireError::BadMagic);
    }
    let (major, minor) = (f.u16()?, f.u16()?);
    if major != VERSION_MAJOR {
        return Err(WireError::Version { major, minor });
    }
    // A later minor may append fields; ours is exact.
    let exact = raw.len() == HELLO_LEN;
    if !(exact || (minor > VERSION_MINOR && raw.len() > HELLO_LEN)) {
        return Err(if raw.len() < HELLO_LEN {
            WireError::Short
        } else {
            WireError::BadLength
        });
    }
    if flags != 0 || credits != 0 {
        return Err(WireError::BadField(ty::HELLO));
    }
    Ok(Hello {
        minor,
        send_credits: f.u16()?,
        recv_credits: f.u16()?,
        max_imm: f.u32()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_version_reason_is_the_version_mismatch_code() {
        let e = ExsError::VersionMismatch {
            peer_major: 0,
            our_major: 0,
        };
        assert_eq!(e.code(), CLOSE_VERSION);
    }

    /// The bytes of one frame of every type, as the hand-written codec produced them: the
    /// wire must not change.
    #[test]
    fn golden_bytes() {
        let remote = RemoteSlice {
            addr: 0x1000,
            len: 64,
            key: 0xabcd,
        };
        let frames = [
            (
                Frame::Hello(Hello {
                    minor: 1,
                    send_credits: 8,
                    recv_credits: 16,
                    max_imm: 4096,
                }),
                0,
                0,
            ),
            (
                Frame::Advert {
                    id: 1,
                    flags: 0,
                    offset: 8,
                    remote,
                },
                3,
                0,
            ),
            (
                Frame::Advert {
                    id: 2,
                    flags: F_IMMEDIATE,
                    offset: 0,
                    remote: RemoteSlice {
                        addr: 0,
                        len: 5,
                        key: 0,
                    },
                },
                0,
                5,
            ),
            (
                Frame::Advert {
                    id: 3,
                    flags: F_PERSISTENT | F_NOTIFY,
                    offset: 0,
                    remote,
                },
                1,
                0,
            ),
            (
                Frame::Ack {
                    id: 4,
                    len: 64,
                    status: Ok(()),
                },
                2,
                0,
            ),
            (
                Frame::Ack {
                    id: 5,
                    len: 0,
                    status: Err(ExsError::MessageSize),
                },
                0,
                0,
            ),
            (
                Frame::PushReq {
                    id: 6,
                    offset: 16,
                    len: 128,
                },
                0,
                0,
            ),
            (
                Frame::PushGrant {
                    id: 6,
                    status: Ok(()),
                    remote,
                },
                1,
                0,
            ),
            (
                Frame::PushDone {
                    id: 6,
                    len: 64,
                    status: Ok(()),
                },
                0,
                0,
            ),
            (Frame::RecvAdvert { id: 7, remote }, 0, 0),
            (
                Frame::ReadNotify {
                    id: 8,
                    offset: 4,
                    len: 12,
                },
                0,
                0,
            ),
            (Frame::Credit, 4, 0),
            (
                Frame::Close {
                    reason: CLOSE_VERSION,
                    major: 1,
                    minor: 1,
                },
                0,
                0,
            ),
        ];
        let got: Vec<String> = frames
            .iter()
            .map(|(f, credits, imm)| {
                let mut v = Vec::new();
                encode(f, *credits, *imm, &mut v);
                ferry_wire::bench::to_hex(&v)
            })
            .collect();
        assert_eq!(got, GOLDEN);
    }

    const GOLDEN: &[&str] = &[
        "180000000100000046455853010001000800100000100000",
        "30000000020003000100000000000000080000000000000000100000000000004000000000000000cdab000000000000",
        "350000000201000002000000000000000000000000000000000000000000000005000000000000000000000000000000",
        "30000000020601000300000000000000000000000000000000100000000000004000000000000000cdab000000000000",
        "2000000003000200040000000000000040000000000000000000000000000000",
        "2000000003000000050000000000000000000000000000000800000000000000",
        "2000000004000000060000000000000010000000000000008000000000000000",
        "30000000050001000600000000000000000000000000000000100000000000004000000000000000cdab000000000000",
        "2000000006000000060000000000000040000000000000000000000000000000",
        "2800000007020000070000000000000000100000000000004000000000000000cdab000000000000",
        "2000000008000000080000000000000004000000000000000c00000000000000",
        "0800000009000400",
        "100000000a0000000d00010001000000",
    ];

    /// Decoding speed of the golden frames (a quick A/B for codec changes):
    /// `cargo test --release -p ferry-exs --lib decode_speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing; run in release with --ignored"]
    fn decode_speed() {
        let frames: Vec<Vec<u8>> = GOLDEN
            .iter()
            .map(|h| {
                let mut b = ferry_wire::bench::from_hex(h);
                b.resize(frame_len(&b).unwrap(), 0);
                b
            })
            .collect();
        let ns = ferry_wire::bench::ns_per_decode(&frames, 200_000, |f| decode(f).is_ok());
        println!("exs decode: {ns:.1} ns/frame");
    }
}
