//! The block fabric protocol, version 1.1: pure encode/decode, no I/O.
//!
//! A connection selects the floor's service `block`, sends HELLO (the export, the data
//! scheme and token) and gets DELEGATE: the export's size and the pool of chunks the server
//! registered for this session alone (one remote range and key per chunk) with the credits
//! (requests the client may have outstanding). Then REQUEST / REPLY, answered in any order (by handle).
//! Every EXS message is one frame: an 8-byte header (`len u32` total length, `type u8`,
//! `flags u8`, 2 reserved zero bytes) and a body. Integers are little-endian; strings are
//! `len u16` + UTF-8. The decoder accepts only what the encoder produces and never
//! panics. The specification is `docs/protocol.md`, "Block fabric protocol".

use ferry_fabric::RemoteSlice;
use ferry_wire::{ReadError, Reader, Writer};

/// Protocol major version: a peer with another major is refused at HELLO.
pub const VERSION_MAJOR: u16 = 1;
/// Protocol minor version.
pub const VERSION_MINOR: u16 = 1;
/// Header length in bytes.
pub const HEADER_LEN: usize = 8;
/// The fixed part of a REQUEST body.
pub const REQUEST_LEN: usize = 32;
/// The fixed part of a REPLY body.
pub const REPLY_LEN: usize = 16;
/// The most chunks one session may be delegated.
pub const MAX_CHUNKS: u16 = 256;
/// The largest chunk (and the largest request).
pub const MAX_CHUNK: u32 = 16 << 20;
/// The smallest chunk.
pub const MIN_CHUNK: u32 = 4096;
/// The longest export name, token or error message (bytes).
pub const MAX_TEXT: usize = 4096;

/// Frame types.
pub mod ty {
    /// Client → server: the session's first frame.
    pub const HELLO: u8 = 1;
    /// Server → client: the answer to HELLO.
    pub const DELEGATE: u8 = 2;
    /// Client → server: one I/O.
    pub const REQUEST: u8 = 3;
    /// Server → client: one I/O's answer.
    pub const REPLY: u8 = 4;
    /// Server → client: the session is refused or ended (a message for humans).
    pub const ERROR: u8 = 5;
}

/// How the data of a session moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Zero-copy delegation: the client RMA-writes into a delegated chunk, then names it in
    /// a WRITE; reads as [`ReadMode`] says.
    Delegated = 0,
    /// Copy-based: the data travels inside the REQUEST (writes) and REPLY (reads) messages.
    Copy = 1,
}

/// How a delegated session reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// The seed's scheme: the server fills a chunk, the client RMA-reads it (the chunk stays
    /// the client's until its read completes: the fence).
    ServerFill = 0,
    /// The RTRS scheme: the REQUEST names a range the client registered and the server
    /// RMA-writes the data there before it replies.
    ServerWrite = 1,
}

/// Commands of a REQUEST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmd {
    /// Write `len` bytes at `offset` (from the chunk, or from the message).
    Write = 1,
    /// Read `len` bytes at `offset`.
    Read = 2,
    /// Make every acknowledged write durable.
    Flush = 3,
    /// Discard a range (a hint).
    Trim = 4,
    /// Make a range read as zeroes.
    WriteZeroes = 5,
}

/// Request flags.
pub mod rflag {
    /// Durable before the reply.
    pub const FUA: u8 = 1;
    /// WRITE_ZEROES must not punch a hole.
    pub const NO_HOLE: u8 = 2;
    /// READ: a remote range of the client's follows (the RTRS scheme).
    pub const REMOTE: u8 = 4;
    /// Every flag this version defines.
    pub const ALL: u8 = 7;
}

/// Where a REQUEST's data is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Data {
    /// Nothing (FLUSH, TRIM, WRITE_ZEROES; a READ served into a chunk).
    None,
    /// In delegated chunk `chunk` from byte `at`.
    Chunk {
        /// The chunk's index in the DELEGATE list.
        chunk: u16,
        /// Byte offset in the chunk.
        at: u32,
    },
    /// A READ's destination in the client's registered memory (RTRS).
    Remote(RemoteSlice),
    /// A WRITE's bytes, inside the message (copy scheme).
    Inline(Vec<u8>),
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// The session's first frame.
    Hello {
        /// Protocol major.
        major: u16,
        /// Protocol minor.
        minor: u16,
        /// How data moves.
        scheme: Scheme,
        /// How reads move (delegated scheme).
        read: ReadMode,
        /// Rotate a chunk's key after each I/O on it.
        always_invalidate: bool,
        /// The export's name.
        export: String,
        /// The client's token (empty: none).
        token: String,
    },
    /// The server's delegation.
    Delegate {
        /// Protocol major.
        major: u16,
        /// Protocol minor.
        minor: u16,
        /// Export size in bytes.
        size: u64,
        /// The export refuses writes.
        readonly: bool,
        /// Requests the client may have outstanding.
        credits: u16,
        /// The largest request (the chunk size).
        chunk_size: u32,
        /// The chunks (empty under the copy scheme).
        chunks: Vec<RemoteSlice>,
    },
    /// One I/O.
    Request {
        /// Echoed in the reply.
        handle: u64,
        /// What to do.
        cmd: Cmd,
        /// [`rflag`] bits.
        flags: u8,
        /// Export offset.
        offset: u64,
        /// Bytes.
        len: u32,
        /// Where the data is.
        data: Data,
    },
    /// One I/O's answer.
    Reply {
        /// The request's handle.
        handle: u64,
        /// 0 or an NBD errno value.
        error: u32,
        /// The chunk's new remote range after a key rotation (always_invalidate).
        rekey: Option<RemoteSlice>,
        /// A READ's bytes (copy scheme).
        payload: Vec<u8>,
    },
    /// The session is refused or ended.
    Error {
        /// For humans.
        message: String,
    },
}

/// Why a frame was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Short, long, or inconsistent bytes.
    #[error("malformed block frame: {0}")]
    Malformed(&'static str),
    /// A frame type this version does not define.
    #[error("unknown block frame type {0}")]
    UnknownType(u8),
}

impl From<ReadError> for DecodeError {
    fn from(_: ReadError) -> Self {
        DecodeError::Malformed("truncated or too long")
    }
}

fn bad(what: &'static str) -> DecodeError {
    DecodeError::Malformed(what)
}

/// Encodes `m` as one frame.
pub fn encode(m: &Msg) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    let mut w = Writer::new(&mut out);
    w.u32(0);
    w.u8(type_of(m));
    w.u8(0);
    w.u16(0);
    match m {
        Msg::Hello {
            major,
            minor,
            scheme,
            read,
            always_invalidate,
            export,
            token,
        } => {
            w.u16(*major);
            w.u16(*minor);
            w.u8(*scheme as u8);
            w.u8(*read as u8);
            w.u8(u8::from(*always_invalidate));
            w.u8(0);
            // Lengths are bounded by the caller's checks; an over-long one is cut.
            text(&mut w, export);
            text(&mut w, token);
        }
        Msg::Delegate {
            major,
            minor,
            size,
            readonly,
            credits,
            chunk_size,
            chunks,
        } => {
            w.u16(*major);
            w.u16(*minor);
            w.u64(*size);
            w.u8(u8::from(*readonly));
            w.u8(0);
            w.u16(*credits);
            w.u32(*chunk_size);
            w.u16(chunks.len() as u16);
            w.u16(0);
            w.u32(0);
            for c in chunks {
                w.bytes(&c.encode());
            }
        }
        Msg::Request {
            handle,
            cmd,
            flags,
            offset,
            len,
            data,
        } => {
            let (chunk, at) = match data {
                Data::Chunk { chunk, at } => (*chunk, *at),
                _ => (0, 0),
            };
            let has_chunk = matches!(data, Data::Chunk { .. });
            w.u64(*handle);
            w.u64(*offset);
            w.u32(*len);
            w.u8(*cmd as u8);
            w.u8(*flags);
            w.u16(chunk);
            w.u32(at);
            w.u8(u8::from(has_chunk));
            w.zeros(3);
            match data {
                Data::Remote(r) => w.bytes(&r.encode()),
                Data::Inline(b) => w.bytes(b),
                _ => {}
            }
        }
        Msg::Reply {
            handle,
            error,
            rekey,
            payload,
        } => {
            w.u64(*handle);
            w.u32(*error);
            w.u8(u8::from(rekey.is_some()));
            w.zeros(3);
            if let Some(r) = rekey {
                w.bytes(&r.encode());
            }
            w.bytes(payload);
        }
        Msg::Error { message } => text(&mut w, message),
    }
    let len = out.len() as u32;
    out[..4].copy_from_slice(&len.to_le_bytes());
    out
}

fn text(w: &mut Writer<'_>, s: &str) {
    let mut end = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let _ = w.str_u16(&s[..end], MAX_TEXT, "text");
}

fn type_of(m: &Msg) -> u8 {
    match m {
        Msg::Hello { .. } => ty::HELLO,
        Msg::Delegate { .. } => ty::DELEGATE,
        Msg::Request { .. } => ty::REQUEST,
        Msg::Reply { .. } => ty::REPLY,
        Msg::Error { .. } => ty::ERROR,
    }
}

/// The frame type of `bytes`, if it has a header.
pub fn peek_type(bytes: &[u8]) -> Option<u8> {
    bytes.get(4).copied()
}

/// Decodes one frame; `scheme` says whether a REQUEST's or REPLY's trailing bytes are data
/// (copy) or must be absent.
pub fn decode(bytes: &[u8]) -> Result<Msg, DecodeError> {
    let mut r = Reader::new(bytes);
    let len = r.u32()? as usize;
    let t = r.u8()?;
    let flags = r.u8()?;
    let reserved = r.u16()?;
    if len != bytes.len() {
        return Err(bad("length field differs from the message"));
    }
    if flags != 0 || reserved != 0 {
        return Err(bad("reserved header bits set"));
    }
    let m = match t {
        ty::HELLO => hello(&mut r)?,
        ty::DELEGATE => delegate(&mut r)?,
        ty::REQUEST => request(&mut r)?,
        ty::REPLY => reply(&mut r)?,
        ty::ERROR => Msg::Error {
            message: r.str_u16(MAX_TEXT)?.to_string(),
        },
        t => return Err(DecodeError::UnknownType(t)),
    };
    r.finish()?;
    Ok(m)
}

fn hello(r: &mut Reader<'_>) -> Result<Msg, DecodeError> {
    let major = r.u16()?;
    let minor = r.u16()?;
    let scheme = match r.u8()? {
        0 => Scheme::Delegated,
        1 => Scheme::Copy,
        _ => return Err(bad("unknown scheme")),
    };
    let read = match r.u8()? {
        0 => ReadMode::ServerFill,
        1 => ReadMode::ServerWrite,
        _ => return Err(bad("unknown read mode")),
    };
    let always_invalidate = match r.u8()? {
        0 => false,
        1 => true,
        _ => return Err(bad("always_invalidate is 0 or 1")),
    };
    if r.u8()? != 0 {
        return Err(bad("reserved HELLO byte set"));
    }
    let export = r.str_u16(MAX_TEXT)?.to_string();
    let token = r.str_u16(MAX_TEXT)?.to_string();
    Ok(Msg::Hello {
        major,
        minor,
        scheme,
        read,
        always_invalidate,
        export,
        token,
    })
}

fn delegate(r: &mut Reader<'_>) -> Result<Msg, DecodeError> {
    let major = r.u16()?;
    let minor = r.u16()?;
    let size = r.u64()?;
    let readonly = match r.u8()? {
        0 => false,
        1 => true,
        _ => return Err(bad("readonly is 0 or 1")),
    };
    let pad = r.u8()?;
    let credits = r.u16()?;
    let chunk_size = r.u32()?;
    let count = r.u16()?;
    if pad != 0 || r.u16()? != 0 || r.u32()? != 0 {
        return Err(bad("reserved DELEGATE bytes set"));
    }
    if credits == 0 || !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk_size) || count > MAX_CHUNKS {
        return Err(bad("credits, chunk size or chunk count out of range"));
    }
    let mut chunks = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let c = RemoteSlice::decode(r.take(RemoteSlice::WIRE_LEN)?)
            .ok_or_else(|| bad("chunk range"))?;
        if c.len != u64::from(chunk_size) {
            return Err(bad("a chunk's range is not the chunk size"));
        }
        chunks.push(c);
    }
    Ok(Msg::Delegate {
        major,
        minor,
        size,
        readonly,
        credits,
        chunk_size,
        chunks,
    })
}

fn request(r: &mut Reader<'_>) -> Result<Msg, DecodeError> {
    let handle = r.u64()?;
    let offset = r.u64()?;
    let len = r.u32()?;
    let cmd = match r.u8()? {
        1 => Cmd::Write,
        2 => Cmd::Read,
        3 => Cmd::Flush,
        4 => Cmd::Trim,
        5 => Cmd::WriteZeroes,
        _ => return Err(bad("unknown command")),
    };
    let flags = r.u8()?;
    let chunk = r.u16()?;
    let at = r.u32()?;
    let has_chunk = r.u8()?;
    if flags & !rflag::ALL != 0 || !r.zeros(3)? {
        return Err(bad("unknown request flags or reserved bytes set"));
    }
    let remote = flags & rflag::REMOTE != 0;
    if remote && cmd != Cmd::Read {
        return Err(bad("only a READ names a remote range"));
    }
    let data = match has_chunk {
        1 if remote || !matches!(cmd, Cmd::Write | Cmd::Read) => {
            return Err(bad("a chunk with a remote range or a dataless command"))
        }
        1 => Data::Chunk { chunk, at },
        0 if chunk != 0 || at != 0 => return Err(bad("chunk fields without a chunk")),
        0 if remote => Data::Remote(
            RemoteSlice::decode(r.take(RemoteSlice::WIRE_LEN)?)
                .ok_or_else(|| bad("remote range"))?,
        ),
        0 if cmd == Cmd::Write => {
            let b = r.rest();
            if b.len() != len as usize {
                return Err(bad("a WRITE's inline data is not its length"));
            }
            Data::Inline(b.to_vec())
        }
        0 => Data::None,
        _ => return Err(bad("the chunk flag is 0 or 1")),
    };
    if let Data::Remote(rs) = &data {
        if rs.len != u64::from(len) {
            return Err(bad("a remote range is not the request's length"));
        }
    }
    Ok(Msg::Request {
        handle,
        cmd,
        flags,
        offset,
        len,
        data,
    })
}

fn reply(r: &mut Reader<'_>) -> Result<Msg, DecodeError> {
    let handle = r.u64()?;
    let error = r.u32()?;
    let has_rekey = r.u8()?;
    if !r.zeros(3)? {
        return Err(bad("reserved REPLY bytes set"));
    }
    let rekey = match has_rekey {
        0 => None,
        1 => Some(
            RemoteSlice::decode(r.take(RemoteSlice::WIRE_LEN)?)
                .ok_or_else(|| bad("rekeyed range"))?,
        ),
        _ => return Err(bad("the rekey flag is 0 or 1")),
    };
    Ok(Msg::Reply {
        handle,
        error,
        rekey,
        payload: r.rest().to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rs(addr: u64, len: u64, key: u64) -> RemoteSlice {
        RemoteSlice { addr, len, key }
    }

    fn samples() -> Vec<Msg> {
        vec![
            Msg::Hello {
                major: 1,
                minor: 0,
                scheme: Scheme::Delegated,
                read: ReadMode::ServerWrite,
                always_invalidate: true,
                export: "disk".into(),
                token: "tok".into(),
            },
            Msg::Delegate {
                major: 1,
                minor: 0,
                size: 1 << 30,
                readonly: false,
                credits: 16,
                chunk_size: 1 << 20,
                chunks: vec![rs(4096, 1 << 20, 7), rs(0, 1 << 20, 9)],
            },
            Msg::Request {
                handle: 5,
                cmd: Cmd::Write,
                flags: rflag::FUA,
                offset: 8192,
                len: 4096,
                data: Data::Chunk { chunk: 1, at: 512 },
            },
            Msg::Request {
                handle: 6,
                cmd: Cmd::Read,
                flags: rflag::REMOTE,
                offset: 0,
                len: 100,
                data: Data::Remote(rs(1, 100, 3)),
            },
            Msg::Request {
                handle: 7,
                cmd: Cmd::Write,
                flags: 0,
                offset: 0,
                len: 3,
                data: Data::Inline(vec![1, 2, 3]),
            },
            Msg::Request {
                handle: 8,
                cmd: Cmd::Flush,
                flags: 0,
                offset: 0,
                len: 0,
                data: Data::None,
            },
            Msg::Reply {
                handle: 9,
                error: 0,
                rekey: Some(rs(0, 4096, 11)),
                payload: vec![],
            },
            Msg::Reply {
                handle: 10,
                error: 5,
                rekey: None,
                payload: vec![9; 10],
            },
            Msg::Error {
                message: "no".into(),
            },
        ]
    }

    #[test]
    fn every_frame_round_trips() {
        for m in samples() {
            assert_eq!(decode(&encode(&m)), Ok(m.clone()), "{m:?}");
        }
    }

    #[test]
    fn inconsistent_requests_are_refused() {
        // A chunk on a FLUSH, a remote range on a WRITE, inline data of the wrong length.
        let mut f = encode(&samples()[5]);
        f[8 + 22] = 1; // chunk flag on a FLUSH
        assert!(decode(&f).is_err());
        let mut w = encode(&samples()[4]);
        w[8 + 17] = rflag::REMOTE;
        assert!(decode(&w).is_err());
        let mut short = encode(&samples()[4]);
        short.pop();
        let n = short.len() as u32;
        short[..4].copy_from_slice(&n.to_le_bytes());
        assert!(decode(&short).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn mutated_frames_decode_to_what_they_encode(i in 0usize..9, at in 0usize..64, v in any::<u8>()) {
            let mut f = encode(&samples()[i]);
            let at = at % f.len();
            f[at] = v;
            if let Ok(m) = decode(&f) {
                prop_assert_eq!(encode(&m), f);
            }
        }
    }
}
