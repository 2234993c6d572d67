//! Frames of the native TCP driver: a pure, sans-I/O encoder and decoder.
//!
//! Every frame is a fixed-size header chosen by its type byte, followed by `len` payload bytes
//! (SEND, WRITE and READ_RESP only). All integers are little-endian. The decoder only parses
//! headers; the connection moves payloads straight between the socket and registered memory.
//! See `docs/protocol.md` for the byte layout.

use ferry_wire::{ReadError, Reader};

use crate::error::RemoteAccessError;

/// Protocol major version: peers with another major refuse each other at HELLO.
pub const VERSION_MAJOR: u16 = 1;
/// Protocol minor version: additions a peer of the same major may ignore.
pub const VERSION_MINOR: u16 = 1;
/// Identifies a ferry TCP peer; sent in HELLO.
pub const MAGIC: [u8; 8] = *b"FERRYTCP";
/// The common prefix of every header: payload length, type, status, reserved, request id.
pub const PREFIX_LEN: usize = 16;
/// The longest header (READ_REQ).
pub const MAX_HEADER_LEN: usize = 40;
/// Largest payload or RMA length a frame may carry. Bounded so every length fits in `usize`
/// and `isize`, as memory regions do.
pub const MAX_LEN: u64 = isize::MAX as u64;

const T_HELLO: u8 = 0x01;
const T_SEND: u8 = 0x02;
const T_WRITE: u8 = 0x03;
const T_WRITE_ACK: u8 = 0x04;
const T_READ_REQ: u8 = 0x05;
const T_READ_RESP: u8 = 0x06;

/// One decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// First frame in each direction. Its layout is the same in every protocol version, and
    /// only its magic is validated.
    Hello {
        /// Sender's protocol major version.
        major: u16,
        /// Sender's protocol minor version.
        minor: u16,
        /// Feature flags (none defined in 1.0; unknown flags are ignored).
        flags: u32,
    },
    /// A two-sided message of `len` payload bytes.
    Send {
        /// Payload length.
        len: u64,
    },
    /// RMA write of `len` payload bytes at `offset` of the target region named by `key`.
    Write {
        /// Requester-chosen id, echoed in the WRITE_ACK.
        id: u32,
        /// Target region key.
        key: u64,
        /// Offset into the target region.
        offset: u64,
        /// Payload length.
        len: u64,
    },
    /// Outcome of a WRITE.
    WriteAck {
        /// The WRITE's id.
        id: u32,
        /// Why the target refused, or `None` if the data landed.
        error: Option<RemoteAccessError>,
    },
    /// RMA read request for `len` bytes at `offset` of the region named by `key`.
    ReadReq {
        /// Requester-chosen id, echoed in the READ_RESP.
        id: u32,
        /// Target region key.
        key: u64,
        /// Offset into the target region.
        offset: u64,
        /// Bytes requested.
        len: u64,
    },
    /// Answer to a READ_REQ: `len` payload bytes on success, none on error.
    ReadResp {
        /// The READ_REQ's id.
        id: u32,
        /// Why the target refused, or `None` if the data follows.
        error: Option<RemoteAccessError>,
        /// Payload length (0 when `error` is set).
        len: u64,
    },
}

/// Why a header could not be decoded. Any of these closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The type byte names no frame of this protocol version.
    #[error("unknown frame type {0:#04x}")]
    UnknownType(u8),
    /// A reserved field, or a field this frame type does not use, is not zero.
    #[error("frame type {0:#04x} has a non-zero reserved or unused field")]
    Reserved(u8),
    /// A length exceeds [`MAX_LEN`].
    #[error("frame length {0} exceeds the protocol limit")]
    TooLong(u64),
    /// A HELLO without the ferry magic: not a ferry peer.
    #[error("bad HELLO magic (not a ferry tcp peer)")]
    BadMagic,
}

/// An encoded header, ready to be written before its payload.
#[derive(Clone, Copy)]
pub struct Header {
    bytes: [u8; MAX_HEADER_LEN],
    len: u8,
}

impl Header {
    /// No bytes (the rest of a partly written frame travels as plain payload).
    pub const EMPTY: Header = Header {
        bytes: [0; MAX_HEADER_LEN],
        len: 0,
    };

    /// The header's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// What is left of the header after its first `n` bytes.
    pub fn after(&self, n: usize) -> Header {
        let rest = self.as_bytes().get(n..).unwrap_or(&[]);
        let mut h = Header::EMPTY;
        h.bytes[..rest.len()].copy_from_slice(rest);
        h.len = rest.len() as u8;
        h
    }
}

/// Header size of a frame type, or `None` for an unknown type.
fn header_len(ty: u8) -> Option<usize> {
    match ty {
        T_HELLO => Some(32),
        T_SEND | T_WRITE_ACK | T_READ_RESP => Some(PREFIX_LEN),
        T_WRITE => Some(32),
        T_READ_REQ => Some(40),
        _ => None,
    }
}

fn status_byte(error: Option<RemoteAccessError>) -> u8 {
    error.map_or(0, |e| e as u8)
}

fn status(b: u8) -> Option<RemoteAccessError> {
    (b != 0).then(|| RemoteAccessError::from_wire(b))
}

impl Frame {
    /// Payload bytes that follow this header on the wire.
    pub fn payload_len(&self) -> u64 {
        match *self {
            Frame::Send { len } | Frame::Write { len, .. } | Frame::ReadResp { len, .. } => len,
            _ => 0,
        }
    }

    /// Encodes the header. Lengths above [`MAX_LEN`] are the caller's bug; the peer rejects them.
    pub fn encode(&self) -> Header {
        let (ty, st, id) = match *self {
            Frame::Hello { .. } => (T_HELLO, 0, 0),
            Frame::Send { .. } => (T_SEND, 0, 0),
            Frame::Write { id, .. } => (T_WRITE, 0, id),
            Frame::WriteAck { id, error } => (T_WRITE_ACK, status_byte(error), id),
            Frame::ReadReq { id, .. } => (T_READ_REQ, 0, id),
            Frame::ReadResp { id, error, .. } => (T_READ_RESP, status_byte(error), id),
        };
        let mut b = [0u8; MAX_HEADER_LEN];
        b[0..8].copy_from_slice(&self.payload_len().to_le_bytes());
        b[8] = ty;
        b[9] = st;
        b[12..16].copy_from_slice(&id.to_le_bytes());
        match *self {
            Frame::Hello {
                major,
                minor,
                flags,
            } => {
                b[16..24].copy_from_slice(&MAGIC);
                b[24..26].copy_from_slice(&major.to_le_bytes());
                b[26..28].copy_from_slice(&minor.to_le_bytes());
                b[28..32].copy_from_slice(&flags.to_le_bytes());
            }
            Frame::Write { key, offset, .. } => {
                b[16..24].copy_from_slice(&key.to_le_bytes());
                b[24..32].copy_from_slice(&offset.to_le_bytes());
            }
            Frame::ReadReq {
                key, offset, len, ..
            } => {
                b[16..24].copy_from_slice(&key.to_le_bytes());
                b[24..32].copy_from_slice(&offset.to_le_bytes());
                b[32..40].copy_from_slice(&len.to_le_bytes());
            }
            _ => {}
        }
        Header {
            bytes: b,
            len: header_len(ty).map_or(0, |n| n as u8),
        }
    }
}

/// Decodes the header at the start of `buf`.
///
/// Returns `Ok(None)` if `buf` holds only part of a header, `Ok(Some((frame, n)))` with the
/// header's size `n` (the payload, if any, starts at `buf[n]`), or an error for bytes that are
/// not a valid header. Never panics, whatever the input.
pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, DecodeError> {
    let Some(&ty) = buf.get(8) else {
        return Ok(None);
    };
    let n = header_len(ty).ok_or(DecodeError::UnknownType(ty))?;
    let Some(h) = buf.get(..n) else {
        return Ok(None);
    };
    match header(ty, &mut Reader::new(h)) {
        Ok(frame) => Ok(Some((frame, n))),
        Err(Invalid::Bad(e)) => Err(e),
        // `h` holds the type's whole header, so no read comes up short; were one to, the
        // header is simply not complete yet.
        Err(Invalid::Short) => Ok(None),
    }
}

/// Why [`header`] stopped.
enum Invalid {
    Short,
    Bad(DecodeError),
}

impl From<ReadError> for Invalid {
    fn from(_: ReadError) -> Self {
        Invalid::Short
    }
}

impl From<DecodeError> for Invalid {
    fn from(e: DecodeError) -> Self {
        Invalid::Bad(e)
    }
}

/// Decodes the header of a frame of type `ty` (its size already checked by the caller).
fn header(ty: u8, r: &mut Reader<'_>) -> Result<Frame, Invalid> {
    let len = r.u64()?;
    let _ty = r.u8()?;
    let st = r.u8()?;
    let reserved = r.u16()?;
    let id = r.u32()?;
    if ty == T_HELLO {
        // Only the magic is checked: a HELLO of any version must decode, so that a peer of
        // another major version is told so instead of being rejected as garbage.
        if r.array()? != MAGIC {
            return Err(DecodeError::BadMagic.into());
        }
        return Ok(Frame::Hello {
            major: r.u16()?,
            minor: r.u16()?,
            flags: r.u32()?,
        });
    }
    if reserved != 0 {
        return Err(DecodeError::Reserved(ty).into());
    }
    let checked = |l: u64| {
        if l > MAX_LEN {
            Err(DecodeError::TooLong(l))
        } else {
            Ok(l)
        }
    };
    let frame = match ty {
        T_SEND if st == 0 && id == 0 => Frame::Send { len: checked(len)? },
        T_WRITE if st == 0 => Frame::Write {
            id,
            key: r.u64()?,
            offset: r.u64()?,
            len: checked(len)?,
        },
        T_WRITE_ACK if len == 0 => Frame::WriteAck {
            id,
            error: status(st),
        },
        T_READ_REQ if st == 0 && len == 0 => Frame::ReadReq {
            id,
            key: r.u64()?,
            offset: r.u64()?,
            len: checked(r.u64()?)?,
        },
        T_READ_RESP if st == 0 || len == 0 => Frame::ReadResp {
            id,
            error: status(st),
            len: checked(len)?,
        },
        _ => return Err(DecodeError::Reserved(ty).into()),
    };
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_error() -> impl Strategy<Value = Option<RemoteAccessError>> {
        prop::option::of((1u8..=5).prop_map(RemoteAccessError::from_wire))
    }

    fn any_frame() -> impl Strategy<Value = Frame> {
        let len = 0..=MAX_LEN;
        prop_oneof![
            (any::<u16>(), any::<u16>(), any::<u32>()).prop_map(|(major, minor, flags)| {
                Frame::Hello {
                    major,
                    minor,
                    flags,
                }
            }),
            len.clone().prop_map(|len| Frame::Send { len }),
            (any::<u32>(), any::<u64>(), any::<u64>(), len.clone()).prop_map(
                |(id, key, offset, len)| Frame::Write {
                    id,
                    key,
                    offset,
                    len
                }
            ),
            (any::<u32>(), any_error()).prop_map(|(id, error)| Frame::WriteAck { id, error }),
            (any::<u32>(), any::<u64>(), any::<u64>(), len.clone()).prop_map(
                |(id, key, offset, len)| Frame::ReadReq {
                    id,
                    key,
                    offset,
                    len
                }
            ),
            (any::<u32>(), any_error(), len).prop_map(|(id, error, len)| Frame::ReadResp {
                id,
                error,
                len: if error.is_some() { 0 } else { len },
            }),
        ]
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(Some((_, n))) = decode(&bytes) {
                prop_assert!(n <= bytes.len());
            }
        }

        #[test]
        fn encode_decode_round_trips(f in any_frame(), tail in prop::collection::vec(any::<u8>(), 0..8)) {
            let h = f.encode();
            let mut wire = h.as_bytes().to_vec();
            for cut in 0..wire.len() {
                prop_assert_eq!(decode(&wire[..cut]), Ok(None));
            }
            wire.extend_from_slice(&tail);
            prop_assert_eq!(decode(&wire), Ok(Some((f, h.as_bytes().len()))));
        }
    }

    #[test]
    fn rejects_bad_headers() {
        let send = Frame::Send { len: 5 }.encode();
        let mut b = send.as_bytes().to_vec();
        b[8] = 0x7f;
        assert_eq!(decode(&b), Err(DecodeError::UnknownType(0x7f)));
        let mut b = send.as_bytes().to_vec();
        b[10] = 1;
        assert_eq!(decode(&b), Err(DecodeError::Reserved(T_SEND)));
        let mut b = send.as_bytes().to_vec();
        b[7] = 0x80;
        assert_eq!(decode(&b), Err(DecodeError::TooLong(0x8000_0000_0000_0005)));
        let mut b = Frame::Hello {
            major: 1,
            minor: 0,
            flags: 0,
        }
        .encode()
        .as_bytes()
        .to_vec();
        let future = {
            let mut f = b.clone();
            f[0..8].fill(0xff);
            f[9..16].fill(0xff);
            f[24] = 9;
            f
        };
        let hello = Frame::Hello {
            major: 9,
            minor: 0,
            flags: 0,
        };
        assert_eq!(
            decode(&future),
            Ok(Some((hello, 32))),
            "any version's HELLO decodes"
        );
        b[16] = b'X';
        assert_eq!(decode(&b), Err(DecodeError::BadMagic));
        let mut b = Frame::ReadResp {
            id: 1,
            error: Some(RemoteAccessError::StaleKey),
            len: 0,
        }
        .encode()
        .as_bytes()
        .to_vec();
        b[0] = 1;
        assert_eq!(decode(&b), Err(DecodeError::Reserved(T_READ_RESP)));
    }

    /// The bytes of one header of every type, as the hand-written codec produced them: the
    /// wire must not change.
    #[test]
    fn golden_bytes() {
        let frames = [
            Frame::Hello {
                major: 1,
                minor: 1,
                flags: 0x0102_0304,
            },
            Frame::Send {
                len: 0x0102_0304_0506,
            },
            Frame::Write {
                id: 7,
                key: 0x1122_3344_5566_7788,
                offset: 9,
                len: 10,
            },
            Frame::WriteAck { id: 7, error: None },
            Frame::WriteAck {
                id: 8,
                error: Some(RemoteAccessError::StaleKey),
            },
            Frame::ReadReq {
                id: 9,
                key: 1,
                offset: 2,
                len: 3,
            },
            Frame::ReadResp {
                id: 9,
                error: None,
                len: 3,
            },
            Frame::ReadResp {
                id: 10,
                error: Some(RemoteAccessError::from_wire(3)),
                len: 0,
            },
        ];
        let got: Vec<String> = frames
            .iter()
            .map(|f| ferry_wire::bench::to_hex(f.encode().as_bytes()))
            .collect();
        assert_eq!(got, GOLDEN);
    }

    const GOLDEN: &[&str] = &[
        "0000000000000000010000000000000046455252595443500100010004030201",
        "06050403020100000200000000000000",
        "0a00000000000000030000000700000088776655443322110900000000000000",
        "00000000000000000400000007000000",
        "00000000000000000402000008000000",
        "00000000000000000500000009000000010000000000000002000000000000000300000000000000",
        "03000000000000000600000009000000",
        "0000000000000000060300000a000000",
    ];

    /// Decoding speed of the golden frames (a quick A/B for codec changes):
    /// `cargo test --release -p ferry-fabric --lib tcp::frame::tests::decode_speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing; run in release with --ignored"]
    fn decode_speed() {
        let frames: Vec<Vec<u8>> = GOLDEN
            .iter()
            .map(|h| ferry_wire::bench::from_hex(h))
            .collect();
        let ns = ferry_wire::bench::ns_per_decode(&frames, 200_000, decode);
        println!("tcp decode: {ns:.1} ns/frame");
    }
}
