//! The collective I/O protocol, version 1.2: pure encode/decode, no I/O.
//!
//! A connection is one rank's handle of one file: the client selects the floor's service
//! `cio`, sends OPEN (the job, its rank, the rank count, the path, the access mode and its
//! token), and every later request is answered in order. Every EXS message is exactly one
//! frame: an 8-byte header (`len u32` total length, `type u8`, `flags u8`, 2 reserved zero
//! bytes) and a body; only DATA and the inline frames (1.2) carry a payload. All integers
//! are little-endian; strings are `len u16` + UTF-8. The decoder accepts only what the
//! encoder produces and never panics. The specification is `docs/protocol.md`, section
//! "Collective I/O protocol".

use ferry_wire::{Code, Cx, Field, Le, Payload, ReadError, Reader, Str, TooLong, Writer};

use crate::error::ErrorClass;

/// Protocol major version: a peer with another major is refused at OPEN.
pub const VERSION_MAJOR: u16 = 1;
/// Protocol minor version: 1.1 removes a file opened with DELETE_ON_CLOSE at its close
/// (1.0 answered Unsupported); 1.2 adds the inline writes (WRITE_AT_ALL_INLINE,
/// WRITE_AT_INLINE), which a client sends only to a server that said 1.2 or later, and
/// the inline read answer (DATA_DONE), which a server sends only to a client that did.
pub const VERSION_MINOR: u16 = 2;
/// The first minor version whose server takes the inline writes and whose client takes
/// the inline read answer.
pub const MINOR_INLINE: u16 = 2;
/// Header length in bytes.
pub const HEADER_LEN: usize = 8;
/// The largest frame but DATA, SET_VIEW and the inline writes.
pub const MAX_CONTROL: usize = 64 * 1024;
/// The most data-stream bytes an inline write (WRITE_AT_ALL_INLINE, WRITE_AT_INLINE)
/// carries: a write this small travels as one message instead of a request and a DATA
/// frame (one send, one receive and one wake-up fewer on each side), and its frame
/// still fits every server's receive buffers (at least [`MAX_SET_VIEW`]).
pub const MAX_INLINE: usize = 64 * 1024;
/// The largest DATA payload (a chunk of a data stream); the server's OPENED says the chunk
/// both sides use, at most this.
pub const MAX_CHUNK: u32 = 4 << 20;
/// The smallest chunk a server may choose.
pub const MIN_CHUNK: u32 = 4096;
/// The longest datatype description in a SET_VIEW (bytes).
pub const MAX_DESC: usize = 1 << 20;
/// The longest SET_VIEW frame (two descriptions of the longest). A server keeps receive
/// buffers of of the larger of this and the chunk (with its header).
pub const MAX_SET_VIEW: usize = HEADER_LEN + 8 + 2 * (1 + 4 + MAX_DESC);
/// The most ranks one session may have (the server keeps a little state per rank).
pub const MAX_RANKS: u32 = 1 << 20;
/// The longest path (bytes).
pub const MAX_PATH: usize = 4096;
/// The longest token (bytes).
pub const MAX_TOKEN: usize = 1024;
/// The longest error message (bytes).
pub const MAX_MESSAGE: usize = 4096;
/// The most datatype descriptions either side keeps by hash per connection. Both sides
/// apply the same rule (when a new one would be one too many, every cached one is
/// forgotten first), so a client knows which hashes the server still holds.
pub const MAX_CACHED_TYPES: usize = 64;

/// Access modes of OPEN (the values MPICH and Open MPI give `MPI_MODE_*`).
pub mod amode {
    /// Create the file if it does not exist.
    pub const CREATE: u32 = 1;
    /// Read only.
    pub const RDONLY: u32 = 2;
    /// Write only.
    pub const WRONLY: u32 = 4;
    /// Read and write.
    pub const RDWR: u32 = 8;
    /// Delete the file when the session closes it (since 1.1).
    pub const DELETE_ON_CLOSE: u32 = 16;
    /// The file is not opened concurrently elsewhere (a hint; accepted).
    pub const UNIQUE_OPEN: u32 = 32;
    /// Fail if the file exists (with [`CREATE`]).
    pub const EXCL: u32 = 64;
    /// Set the initial file pointers to the end (no effect on explicit offsets).
    pub const APPEND: u32 = 128;
    /// Sequential access only (not supported by this server).
    pub const SEQUENTIAL: u32 = 256;
    /// Every bit this protocol defines.
    pub const ALL: u32 = 511;
}

/// A datatype in SET_VIEW: its compact description ([`ferry_dtype::Datatype::encode`]),
/// or the BLAKE3 of a description sent earlier on this connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Desc {
    /// The description itself.
    Inline(Vec<u8>),
    /// The BLAKE3 of a description the server holds for this connection.
    Hash([u8; 32]),
}

ferry_wire::frames! {
    /// One frame.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Msg: u8 {
        /// Client → server, first frame: this rank's collective open of `path`. Every rank
        /// of the job sends one; the answer (OPENED or ERROR) comes once all `size` have.
        Open = 1 {
            /// Client major version.
            major: u16 as Le,
            /// Client minor version.
            minor: u16 as Le,
            /// The job key: the same on every rank of one communicator's open, and
            /// different from any other job's open of the same path at the same time.
            job: u64 as Le,
            /// This rank (`< size`).
            rank: u32 as Le,
            /// Ranks in the communicator.
            size: u32 as Le,
            /// [`amode`] bits (the same on every rank).
            amode: u32 as Le,
            /// `root/relative/path`.
            path: String as Str<MAX_PATH>,
            /// Auth token ("" for anonymous).
            token: String as Str<MAX_TOKEN>,
        },
        /// Server → client: the file is open on every rank.
        Opened = 2 {
            /// Server major.
            major: u16 as Le,
            /// Server minor.
            minor: u16 as Le,
            /// The DATA payload size both sides use (at most [`MAX_CHUNK`]).
            chunk: u32 as Le,
            /// The file's size at open.
            size: u64 as Le,
        },
        /// Collective: this rank's file view (answer DONE or ERROR).
        SetView = 3 {
            /// Bytes from the start of the file to the view's first tile (not negative).
            disp: i64 as Le,
            /// The elementary type: offsets count it.
            etype: Desc as DescCodec,
            /// The file type, tiled from `disp` every extent.
            filetype: Desc as DescCodec,
        },
        /// Collective write of `len` bytes of this rank's data stream at `offset` etypes
        /// of its view; DATA frames with exactly `len` bytes follow. Answer DONE or ERROR.
        WriteAtAll = 4 {
            /// Offset in etypes of the view.
            offset: u64 as Le,
            /// Bytes of data stream (the packed memory buffer).
            len: u64 as Le,
        },
        /// Collective read of `len` bytes of data stream at `offset` etypes. Answer: DATA
        /// frames with the bytes read, then DONE (or ERROR alone).
        ReadAtAll = 5 {
            /// Offset in etypes of the view.
            offset: u64 as Le,
            /// Bytes of data stream wanted.
            len: u64 as Le,
        },
        /// Independent write, as WRITE_AT_ALL for this rank alone.
        WriteAt = 6 {
            /// Offset in etypes of the view.
            offset: u64 as Le,
            /// Bytes of data stream.
            len: u64 as Le,
        },
        /// Independent read, as READ_AT_ALL for this rank alone.
        ReadAt = 7 {
            /// Offset in etypes of the view.
            offset: u64 as Le,
            /// Bytes of data stream wanted.
            len: u64 as Le,
        },
        /// A chunk of a data stream (at most the agreed chunk); the payload follows.
        Data = 8 {
            /// Payload length (not encoded; the frame length gives it).
            len: u32 as Payload<{ MAX_CHUNK as usize }>,
        },
        /// Independent: the file's size (answer SIZE or ERROR).
        GetSize = 9,
        /// Collective: truncate or extend the file to `size` (answer DONE or ERROR).
        SetSize = 10 (size: u64 as Le),
        /// Collective: allocate the first `size` bytes (the file grows to at least
        /// `size`). Answer DONE or ERROR.
        Preallocate = 11 (size: u64 as Le),
        /// Collective: make every rank's writes durable (answer DONE or ERROR).
        Sync = 12,
        /// Collective: close the file (answer DONE or ERROR; the connection ends after it).
        Close = 13,
        /// A request succeeded: the bytes of data stream it moved (0 for those moving none).
        Done = 14 (bytes: u64 as Le),
        /// Answer to GET_SIZE.
        Size = 15 (size: u64 as Le),
        /// A request failed.
        Error = 16 {
            /// The class, mappable to an MPI error class.
            class: ErrorClass as Code,
            /// What happened, with what to do.
            message: String as Str<MAX_MESSAGE>,
        },
        /// Since 1.2: WRITE_AT_ALL with its whole data stream in this frame's payload (no
        /// DATA follows). Answer DONE or ERROR.
        WriteAtAllInline = 17 {
            /// Offset in etypes of the view.
            offset: u64 as Le,
            /// Bytes of data stream: the payload's length (not encoded; the frame length
            /// gives it), at most [`MAX_INLINE`].
            len: u32 as Payload<MAX_INLINE>,
        },
        /// Since 1.2: WRITE_AT with its whole data stream in this frame's payload.
        WriteAtInline = 18 {
            /// Offset in etypes of the view.
            offset: u64 as Le,
            /// Bytes of data stream (the payload's length, at most [`MAX_INLINE`]).
            len: u32 as Payload<MAX_INLINE>,
        },
        /// Since 1.2, server → a 1.2 client: the whole answer to READ_AT_ALL or READ_AT
        /// that moved at most [`MAX_INLINE`] bytes: the bytes read as the payload, and
        /// DONE with their count (in place of DATA frames and DONE).
        DataDone = 19 {
            /// Bytes read (the payload's length, at most [`MAX_INLINE`]).
            len: u32 as Payload<MAX_INLINE>,
        },
    }
}

pub use ferry_wire::DecodeError;

/// [`Desc`]: `kind u8` then, for 0, `len u32` and that many bytes (at most [`MAX_DESC`]),
/// for 1, the 32-byte hash.
struct DescCodec;

impl Field<Desc> for DescCodec {
    const MIN: usize = 1 + 4;
    const MAX: usize = 1 + 4 + MAX_DESC;
    fn put(
        v: &Desc,
        w: &mut Writer<'_>,
        _: &mut Cx<'_>,
        what: &'static str,
    ) -> Result<(), TooLong> {
        match v {
            Desc::Inline(bytes) => {
                let len = u32::try_from(bytes.len())
                    .ok()
                    .filter(|_| bytes.len() <= MAX_DESC)
                    .ok_or(TooLong(what))?;
                w.u8(0);
                w.u32(len);
                w.bytes(bytes);
            }
            Desc::Hash(h) => {
                w.u8(1);
                w.bytes(h);
            }
        }
        Ok(())
    }
    fn get<'a>(r: &mut Reader<'a>, _: &mut Cx<'a>) -> Result<Desc, ReadError> {
        match r.u8()? {
            0 => {
                let len = r.u32()? as usize;
                if len > MAX_DESC {
                    return Err(ReadError::TooLong { len, max: MAX_DESC });
                }
                Ok(Desc::Inline(r.take(len)?.to_vec()))
            }
            1 => Ok(Desc::Hash(r.array()?)),
            _ => Err(ReadError::Invalid("unknown datatype description kind")),
        }
    }
}

/// Appends the encoding of `msg` to `out`. For [`Msg::Data`] and the inline frames only
/// the header and body are written: the caller appends exactly `len` payload bytes.
pub fn encode(msg: &Msg, out: &mut Vec<u8>) -> Result<(), TooLong> {
    let mut w = Writer::new(out);
    w.zeros(HEADER_LEN);
    let mut cx = Cx::default();
    if let Err(e) = msg.encode_body(&mut w, &mut cx) {
        w.undo();
        return Err(e);
    }
    let code = msg.code();
    let total = w.len() + cx.payload_len;
    if total > max_frame(code) {
        w.undo();
        return Err(TooLong("frame"));
    }
    // At most MAX_CHUNK plus a header, or a SET_VIEW of two MAX_DESC descriptions.
    w.patch_u32(0, total as u32);
    w.patch(4, &[code, cx.flags]);
    Ok(())
}

/// Encodes a frame into a new vector.
pub fn to_vec(msg: &Msg) -> Result<Vec<u8>, TooLong> {
    let mut v = Vec::new();
    encode(msg, &mut v)?;
    Ok(v)
}

/// The header of a DATA frame carrying `len` payload bytes.
pub fn data_header(len: u32) -> Result<[u8; HEADER_LEN], TooLong> {
    let mut v = Vec::with_capacity(HEADER_LEN);
    encode(&Msg::Data { len }, &mut v)?;
    let mut a = [0u8; HEADER_LEN];
    a.copy_from_slice(&v);
    Ok(a)
}

/// SET_VIEW's type code: with DATA, the frames longer than [`MAX_CONTROL`].
const SET_VIEW: u8 = 3;

/// The longest frame of type `code` (header included).
fn max_frame(code: u8) -> usize {
    match Msg::body_bounds(code) {
        Some((_, max)) if Msg::carries_payload(code) || code == SET_VIEW => HEADER_LEN + max,
        Some(_) => MAX_CONTROL,
        None => 0,
    }
}

/// Decodes one whole message: the frame, and for DATA and the inline frames its payload
/// (empty otherwise).
pub fn decode(b: &[u8]) -> Result<(Msg, &[u8]), DecodeError> {
    let mut r = Reader::new(b);
    let len = r.u32()?;
    if len as usize != b.len() {
        return Err(DecodeError::Length {
            header: len,
            actual: b.len(),
        });
    }
    let t = r.u8()?;
    let flags = r.u8()?;
    if !r.zeros(2)? {
        return Err(DecodeError::Malformed("reserved header bytes"));
    }
    if Msg::body_bounds(t).is_none() {
        return Err(DecodeError::UnknownType(t));
    }
    if b.len() > max_frame(t) {
        return Err(DecodeError::TooLarge);
    }
    if flags & !Msg::flags_allowed(t) != 0 {
        return Err(DecodeError::Malformed("unknown flags"));
    }
    let mut cx = Cx {
        flags,
        ..Cx::default()
    };
    let msg = Msg::decode_body(t, &mut r, &mut cx)?;
    r.finish()?;
    Ok((msg, cx.payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_frame() -> Vec<Msg> {
        vec![
            Msg::Open {
                major: 1,
                minor: 0,
                job: 0x1122_3344_5566_7788,
                rank: 3,
                size: 4,
                amode: amode::CREATE | amode::RDWR,
                path: "d/out.bin".into(),
                token: "tok".into(),
            },
            Msg::Opened {
                major: 1,
                minor: 0,
                chunk: 1 << 20,
                size: 42,
            },
            Msg::SetView {
                disp: 4,
                etype: Desc::Inline(vec![1, 1, 4, 0, 0, 0, 0, 0, 0, 0]),
                filetype: Desc::Hash([7; 32]),
            },
            Msg::WriteAtAll { offset: 1, len: 2 },
            Msg::ReadAtAll { offset: 3, len: 4 },
            Msg::WriteAt { offset: 5, len: 6 },
            Msg::ReadAt { offset: 7, len: 8 },
            Msg::GetSize,
            Msg::SetSize(9),
            Msg::Preallocate(10),
            Msg::Sync,
            Msg::Close,
            Msg::Done(11),
            Msg::Size(12),
            Msg::Error {
                class: ErrorClass::NotSame,
                message: "ranks disagree".into(),
            },
            // 1.2 (here without payload bytes; `inline_writes_carry_their_data` with).
            Msg::WriteAtAllInline { offset: 13, len: 0 },
            Msg::WriteAtInline { offset: 14, len: 0 },
            Msg::DataDone { len: 0 },
        ]
    }

    #[test]
    fn every_frame_round_trips_and_rejects_damage() {
        for m in every_frame() {
            let v = to_vec(&m).unwrap();
            assert_eq!(decode(&v).unwrap(), (m.clone(), &[][..]), "{m:?}");
            assert!(decode(&v[..v.len() - 1]).is_err(), "{m:?} short");
            // One byte more is damage, but for a frame with a payload (the byte is then
            // its payload: `inline_writes_carry_their_data`).
            let mut long = v.clone();
            long.push(0);
            long[0] = long[0].wrapping_add(1);
            let payload = Msg::carries_payload(v[4]);
            assert_eq!(decode(&long).is_err(), !payload, "{m:?} long");
            let mut flagged = v.clone();
            flagged[5] = 0x80;
            assert!(decode(&flagged).is_err(), "{m:?} flags");
        }
    }

    #[test]
    fn the_longest_set_view_is_what_servers_receive() {
        assert_eq!(max_frame(SET_VIEW), MAX_SET_VIEW);
        assert_eq!(max_frame(8), HEADER_LEN + MAX_CHUNK as usize);
    }

    /// The bytes of every frame (1.0, and 1.2's inline writes): the wire must not change.
    #[test]
    fn golden_bytes() {
        let got: Vec<String> = every_frame()
            .iter()
            .map(|m| ferry_wire::bench::to_hex(&to_vec(m).unwrap()))
            .collect();
        if std::env::var_os("CIO_PRINT_GOLDEN").is_some() {
            for g in &got {
                println!("    \"{g}\",");
            }
        }
        assert_eq!(got, GOLDEN, "a frame changed on the wire");
    }

    const GOLDEN: &[&str] = &[
    "30000000010000000100000088776655443322110300000004000000090000000900642f6f75742e62696e0300746f6b",
    "180000000200000001000000000010002a00000000000000",
    "40000000030000000400000000000000000a00000001010400000000000000010707070707070707070707070707070707070707070707070707070707070707",
    "180000000400000001000000000000000200000000000000",
    "180000000500000003000000000000000400000000000000",
    "180000000600000005000000000000000600000000000000",
    "180000000700000007000000000000000800000000000000",
    "0800000009000000",
    "100000000a0000000900000000000000",
    "100000000b0000000a00000000000000",
    "080000000c000000",
    "080000000d000000",
    "100000000e0000000b00000000000000",
    "100000000f0000000c00000000000000",
    "1a000000100000000b000e0072616e6b73206469736167726565",
    "10000000110000000d00000000000000",
    "10000000120000000e00000000000000",
    "0800000013000000",
    ];

    /// An inline write with `n` payload bytes.
    fn inline(collective: bool, offset: u64, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let msg = if collective {
            Msg::WriteAtAllInline { offset, len }
        } else {
            Msg::WriteAtInline { offset, len }
        };
        let mut v = to_vec(&msg).unwrap();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn inline_writes_carry_their_data() {
        for collective in [true, false] {
            for n in [1, 100, 4096, MAX_INLINE] {
                let data: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
                let v = inline(collective, 42, &data);
                assert_eq!(v.len(), HEADER_LEN + 8 + n);
                let (msg, payload) = decode(&v).unwrap();
                assert_eq!(payload, &data[..]);
                let want = if collective {
                    Msg::WriteAtAllInline {
                        offset: 42,
                        len: n as u32,
                    }
                } else {
                    Msg::WriteAtInline {
                        offset: 42,
                        len: n as u32,
                    }
                };
                assert_eq!(msg, want);
            }
        }
    }

    #[test]
    fn a_read_answer_carries_its_data() {
        let mut v = to_vec(&Msg::DataDone { len: 3 }).unwrap();
        v.extend_from_slice(b"xyz");
        assert_eq!(decode(&v).unwrap(), (Msg::DataDone { len: 3 }, &b"xyz"[..]));
        assert!(to_vec(&Msg::DataDone {
            len: MAX_INLINE as u32 + 1
        })
        .is_err());
        let mut over = to_vec(&Msg::DataDone {
            len: MAX_INLINE as u32,
        })
        .unwrap();
        over.resize(over.len() + MAX_INLINE + 1, 0);
        let n = over.len() as u32;
        over[..4].copy_from_slice(&n.to_le_bytes());
        assert_eq!(decode(&over), Err(DecodeError::TooLarge));
        assert!(decode(&v[..v.len() - 1]).is_err());
    }

    #[test]
    fn inline_writes_refuse_truncation_and_excess() {
        let v = inline(true, 1, &[9; 100]);
        // A frame cut short: its length says more than arrived.
        assert!(matches!(
            decode(&v[..v.len() - 1]),
            Err(DecodeError::Length { .. })
        ));
        // A body cut short (the offset incomplete) with a matching length.
        let mut cut = v[..HEADER_LEN + 4].to_vec();
        cut[..4].copy_from_slice(&((HEADER_LEN + 4) as u32).to_le_bytes());
        assert!(decode(&cut).is_err());
        // One byte over the inline limit is refused both ways.
        assert!(to_vec(&Msg::WriteAtInline {
            offset: 0,
            len: MAX_INLINE as u32 + 1,
        })
        .is_err());
        let mut over = inline(false, 0, &vec![0; MAX_INLINE]);
        over.push(0);
        let n = over.len() as u32;
        over[..4].copy_from_slice(&n.to_le_bytes());
        assert_eq!(decode(&over), Err(DecodeError::TooLarge));
        assert_eq!(max_frame(17), HEADER_LEN + 8 + MAX_INLINE);
        // Inline frames fit the receive buffers every server keeps.
        assert!(max_frame(17) <= MAX_SET_VIEW);
        // No flags are defined for them.
        let mut flagged = v.clone();
        flagged[5] = 1;
        assert!(decode(&flagged).is_err());
    }

    #[test]
    fn data_carries_its_payload() {
        let mut v = data_header(3).unwrap().to_vec();
        v.extend_from_slice(b"abc");
        assert_eq!(decode(&v).unwrap(), (Msg::Data { len: 3 }, &b"abc"[..]));
        assert!(to_vec(&Msg::Data { len: MAX_CHUNK + 1 }).is_err());
    }

    #[test]
    fn limits() {
        let big = Msg::SetView {
            disp: 0,
            etype: Desc::Inline(vec![0; MAX_DESC + 1]),
            filetype: Desc::Hash([0; 32]),
        };
        assert!(to_vec(&big).is_err());
        let path = Msg::Open {
            major: 1,
            minor: 0,
            job: 0,
            rank: 0,
            size: 1,
            amode: amode::RDONLY,
            path: "x".repeat(MAX_PATH + 1),
            token: String::new(),
        };
        assert!(to_vec(&path).is_err());
        // An unknown type, an unknown description kind.
        assert_eq!(
            decode(&[8, 0, 0, 0, 99, 0, 0, 0]),
            Err(DecodeError::UnknownType(99))
        );
        let mut v = to_vec(&every_frame()[2]).unwrap();
        v[16] = 9;
        assert!(decode(&v).is_err());
    }
}
