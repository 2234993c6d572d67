//! Transmission replies: the simple reply, structured chunks (`OFFSET_DATA`, `OFFSET_HOLE`,
//! `BLOCK_STATUS`, `ERROR`, `NONE`), and the pure planning behind them: which parts of a
//! read go as data and which as holes ([`plan_read`]), and the descriptors of a block
//! status reply ([`status_descriptors`]).

use super::consts::*;
use super::handshake::truncate;
use super::wire::{len32, PutBe};

/// Length of a simple reply header.
pub const SIMPLE_LEN: usize = 16;
/// Length of a structured chunk header.
pub const CHUNK_LEN: usize = 20;
/// Length of the headers before an `OFFSET_DATA` chunk's data (chunk header + offset).
pub const DATA_HEADER_LEN: usize = CHUNK_LEN + 8;
/// Longest error message sent in an error chunk.
pub const MAX_ERROR_MESSAGE: usize = 1024;
/// Most descriptors in one block status chunk.
pub const MAX_DESCRIPTORS: usize = 1024;

/// A simple reply header (data follows for a successful read).
pub fn simple(cookie: u64, errno: u32) -> [u8; SIMPLE_LEN] {
    let mut v = Vec::with_capacity(SIMPLE_LEN);
    v.put_u32(SIMPLE_REPLY_MAGIC);
    v.put_u32(errno);
    v.put_u64(cookie);
    to_array(&v)
}

fn to_array<const N: usize>(v: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&v[..N]);
    out
}

fn chunk_header(v: &mut Vec<u8>, cookie: u64, rtype: u16, done: bool, len: u32) {
    v.put_u32(STRUCTURED_REPLY_MAGIC);
    v.put_u16(if done { REPLY_FLAG_DONE } else { 0 });
    v.put_u16(rtype);
    v.put_u64(cookie);
    v.put_u32(len);
}

/// The headers of an `OFFSET_DATA` chunk carrying `data_len` bytes at `offset`; the data
/// follows them.
pub fn offset_data(cookie: u64, offset: u64, data_len: u32, done: bool) -> [u8; DATA_HEADER_LEN] {
    let mut v = Vec::with_capacity(DATA_HEADER_LEN);
    chunk_header(
        &mut v,
        cookie,
        REPLY_TYPE_OFFSET_DATA,
        done,
        data_len.saturating_add(8),
    );
    v.put_u64(offset);
    to_array(&v)
}

/// An `OFFSET_HOLE` chunk: `len` bytes at `offset` read as zeroes.
pub fn offset_hole(cookie: u64, offset: u64, len: u32, done: bool) -> [u8; CHUNK_LEN + 12] {
    let mut v = Vec::with_capacity(CHUNK_LEN + 12);
    chunk_header(&mut v, cookie, REPLY_TYPE_OFFSET_HOLE, done, 12);
    v.put_u64(offset);
    v.put_u32(len);
    to_array(&v)
}

/// The final `NONE` chunk.
pub fn done(cookie: u64) -> [u8; CHUNK_LEN] {
    let mut v = Vec::with_capacity(CHUNK_LEN);
    chunk_header(&mut v, cookie, REPLY_TYPE_NONE, true, 0);
    to_array(&v)
}

/// A final `ERROR` chunk with a message for humans.
pub fn error_chunk(cookie: u64, errno: u32, msg: &str) -> Vec<u8> {
    let msg = truncate(msg, MAX_ERROR_MESSAGE).as_bytes();
    let mut v = Vec::with_capacity(CHUNK_LEN + 6 + msg.len());
    chunk_header(&mut v, cookie, REPLY_TYPE_ERROR, true, len32(6 + msg.len()));
    v.put_u32(errno);
    v.put_u16(u16::try_from(msg.len()).unwrap_or(0));
    v.extend_from_slice(msg);
    v
}

/// The error answer to a request: an error chunk when structured replies were negotiated
/// (a READ must not get a simple reply then), a simple reply otherwise.
pub fn error(structured: bool, cookie: u64, errno: u32, msg: &str) -> Vec<u8> {
    if structured {
        error_chunk(cookie, errno, msg)
    } else {
        simple(cookie, errno).to_vec()
    }
}

/// A final `BLOCK_STATUS` chunk for context `id` with `(length, flags)` descriptors.
pub fn block_status(cookie: u64, id: u32, descriptors: &[(u32, u32)]) -> Vec<u8> {
    let len = 4 + 8 * descriptors.len();
    let mut v = Vec::with_capacity(CHUNK_LEN + len);
    chunk_header(&mut v, cookie, REPLY_TYPE_BLOCK_STATUS, true, len32(len));
    v.put_u32(id);
    for (l, f) in descriptors {
        v.put_u32(*l);
        v.put_u32(*f);
    }
    v
}

/// A run of the export with one allocation state, as a backend reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Length in bytes.
    pub len: u64,
    /// Not allocated (`NBD_STATE_HOLE`).
    pub hole: bool,
    /// Reads as zeroes (`NBD_STATE_ZERO`).
    pub zero: bool,
}

impl Extent {
    /// The `base:allocation` flags of this extent.
    pub fn flags(&self) -> u32 {
        (if self.hole { STATE_HOLE } else { 0 }) | (if self.zero { STATE_ZERO } else { 0 })
    }
}

/// One content chunk of a structured read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Offset in the export.
    pub offset: u64,
    /// Length (nonzero).
    pub len: u32,
    /// Sent as `OFFSET_HOLE` (reads as zeroes) instead of data.
    pub hole: bool,
}

/// The content chunks of a structured read of `len` bytes at `offset`, given the extents
/// from `offset` on: zero runs become holes, the rest data, adjacent pieces of one kind
/// merge, and what the extents do not cover is data. With `df` (don't fragment) the whole
/// range is one data piece. The pieces tile the range exactly, in order.
pub fn plan_read(offset: u64, len: u32, extents: &[Extent], df: bool) -> Vec<Piece> {
    if len == 0 {
        return Vec::new();
    }
    if df {
        return vec![Piece {
            offset,
            len,
            hole: false,
        }];
    }
    let mut pieces: Vec<Piece> = Vec::new();
    let mut at: u32 = 0;
    for e in extents {
        if at == len {
            break;
        }
        let take = u32::try_from(e.len.min(u64::from(len - at))).unwrap_or(len - at);
        if take == 0 {
            continue;
        }
        push_piece(&mut pieces, offset + u64::from(at), take, e.zero);
        at += take;
    }
    if at < len {
        push_piece(&mut pieces, offset + u64::from(at), len - at, false);
    }
    pieces
}

fn push_piece(pieces: &mut Vec<Piece>, offset: u64, len: u32, hole: bool) {
    if let Some(last) = pieces.last_mut() {
        if last.hole == hole {
            last.len += len;
            return;
        }
    }
    pieces.push(Piece { offset, len, hole });
}

/// The descriptors of a block status reply for a request of `len` bytes: the extents cut
/// to the request, adjacent equal states merged, at most [`MAX_DESCRIPTORS`] (one with
/// `req_one`). Always at least one descriptor when `len > 0` (a range the extents do not
/// cover is reported allocated, the state that promises nothing).
pub fn status_descriptors(len: u32, extents: &[Extent], req_one: bool) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut at: u32 = 0;
    let limit = if req_one { 1 } else { MAX_DESCRIPTORS };
    for e in extents {
        if at == len {
            break;
        }
        let take = u32::try_from(e.len.min(u64::from(len - at))).unwrap_or(len - at);
        if take == 0 {
            continue;
        }
        let flags = e.flags();
        if out.last().is_some_and(|last| last.1 == flags) {
            if let Some(last) = out.last_mut() {
                last.0 += take;
            }
        } else if out.len() == limit {
            break;
        } else {
            out.push((take, flags));
        }
        at += take;
    }
    if out.is_empty() && len > 0 {
        out.push((len, 0));
    }
    out
}
