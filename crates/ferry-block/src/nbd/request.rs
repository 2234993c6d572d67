//! Transmission requests: the 28-byte header decoded, then checked against what the session
//! negotiated (flags, range, alignment, read-only) into a [`Command`] or a [`Refusal`] that
//! becomes an error reply. Nothing here panics on any input; a header that is not a request
//! at all ([`Fatal`]) ends the connection, everything else is answered.

use super::consts::*;
use super::wire::{Fields, PutBe};

/// A request header as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// Command flags (`NBD_CMD_FLAG_*`).
    pub flags: u16,
    /// Command type (`NBD_CMD_*`).
    pub kind: u16,
    /// The client's handle, echoed in the reply.
    pub cookie: u64,
    /// Byte offset in the export.
    pub offset: u64,
    /// Length in bytes.
    pub len: u32,
}

/// Why a request header ends the connection (the stream cannot be followed any more).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fatal {
    /// Not the request magic.
    #[error("request without the NBD request magic (got {0:#010x})")]
    Magic(u32),
    /// An extended-header request, which this server did not negotiate.
    #[error("an extended-header request, never negotiated")]
    Extended,
    /// A write whose payload is beyond what the server accepts.
    #[error("a write of {0} bytes, more than the {max} the server accepts", max = MAX_PAYLOAD)]
    PayloadTooBig(u32),
}

/// Decodes a request header.
pub fn decode_request(b: &[u8; REQUEST_LEN]) -> Result<RequestHeader, Fatal> {
    let mut f = Fields::new(b);
    let magic = f.u32().unwrap_or(0);
    if magic == EXTENDED_REQUEST_MAGIC {
        return Err(Fatal::Extended);
    }
    if magic != REQUEST_MAGIC {
        return Err(Fatal::Magic(magic));
    }
    Ok(RequestHeader {
        flags: f.u16().unwrap_or(0),
        kind: f.u16().unwrap_or(0),
        cookie: f.u64().unwrap_or(0),
        offset: f.u64().unwrap_or(0),
        len: f.u32().unwrap_or(0),
    })
}

/// Encodes a request header as a client sends it.
pub fn encode_request(h: &RequestHeader) -> [u8; REQUEST_LEN] {
    let mut v = Vec::with_capacity(REQUEST_LEN);
    v.put_u32(REQUEST_MAGIC);
    v.put_u16(h.flags);
    v.put_u16(h.kind);
    v.put_u64(h.cookie);
    v.put_u64(h.offset);
    v.put_u32(h.len);
    let mut out = [0u8; REQUEST_LEN];
    out.copy_from_slice(&v);
    out
}

/// A checked request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Read `len` bytes at `offset`; `df`: in one content chunk.
    Read {
        /// Offset.
        offset: u64,
        /// Length.
        len: u32,
        /// `NBD_CMD_FLAG_DF`.
        df: bool,
    },
    /// Write the `len` payload bytes at `offset`; `fua`: durable before the reply.
    Write {
        /// Offset.
        offset: u64,
        /// Length.
        len: u32,
        /// `NBD_CMD_FLAG_FUA`.
        fua: bool,
    },
    /// End the session after the requests in flight.
    Disconnect,
    /// Make every write already answered durable.
    Flush,
    /// Discard a range (a hint; punched as a hole where the backend can).
    Trim {
        /// Offset.
        offset: u64,
        /// Length.
        len: u32,
        /// `NBD_CMD_FLAG_FUA`.
        fua: bool,
    },
    /// Read ahead a range.
    Cache {
        /// Offset.
        offset: u64,
        /// Length.
        len: u32,
    },
    /// Make a range read as zeroes.
    WriteZeroes {
        /// Offset.
        offset: u64,
        /// Length.
        len: u32,
        /// `NBD_CMD_FLAG_FUA`.
        fua: bool,
        /// `NBD_CMD_FLAG_NO_HOLE` clear: a hole may be punched.
        may_trim: bool,
        /// `NBD_CMD_FLAG_FAST_ZERO`: fail with `ENOTSUP` rather than be slow.
        fast: bool,
    },
    /// Report allocation (`base:allocation`) from `offset`.
    BlockStatus {
        /// Offset.
        offset: u64,
        /// Length.
        len: u32,
        /// `NBD_CMD_FLAG_REQ_ONE`: one extent.
        req_one: bool,
    },
}

/// A request answered with an error and no effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The NBD error value.
    pub errno: u32,
    /// Why, for the error chunk's message.
    pub why: &'static str,
}

fn refuse(errno: u32, why: &'static str) -> Refusal {
    Refusal { errno, why }
}

/// What the transmission phase of one session knows: the export's shape and what the
/// handshake negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// Export size in bytes.
    pub size: u64,
    /// The export refuses writes.
    pub readonly: bool,
    /// Offsets and lengths must be multiples of this.
    pub min_block: u32,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// `base:allocation` was selected (its context id).
    pub base_allocation: Option<u32>,
}

impl Session {
    /// Bytes of payload that follow `h` on the wire (the data of a WRITE), which the
    /// runtime reads even when the request is refused; a payload beyond [`MAX_PAYLOAD`]
    /// ends the connection.
    pub fn payload_len(&self, h: &RequestHeader) -> Result<u32, Fatal> {
        if h.kind != CMD_WRITE {
            return Ok(0);
        }
        if h.len > MAX_PAYLOAD {
            return Err(Fatal::PayloadTooBig(h.len));
        }
        Ok(h.len)
    }

    /// Checks `h` against the session: a command to run, or the error to answer.
    pub fn check(&self, h: &RequestHeader) -> Result<Command, Refusal> {
        let (offset, len, flags) = (h.offset, h.len, h.flags);
        let fua = flags & CMD_FLAG_FUA != 0;
        // FUA is valid on every command (clients are known to set it on reads).
        let allowed = CMD_FLAG_FUA
            | match h.kind {
                CMD_READ if self.structured => CMD_FLAG_DF,
                CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
                _ => 0,
            };
        if flags & !allowed != 0 && h.kind != CMD_DISC {
            return Err(refuse(EINVAL, "a command flag not valid for this command"));
        }
        let cmd = match h.kind {
            CMD_READ => Command::Read {
                offset,
                len,
                df: flags & CMD_FLAG_DF != 0,
            },
            CMD_WRITE => Command::Write { offset, len, fua },
            CMD_DISC => return Ok(Command::Disconnect),
            CMD_FLUSH => return Ok(Command::Flush),
            CMD_TRIM => Command::Trim { offset, len, fua },
            CMD_CACHE => Command::Cache { offset, len },
            CMD_WRITE_ZEROES => Command::WriteZeroes {
                offset,
                len,
                fua,
                may_trim: flags & CMD_FLAG_NO_HOLE == 0,
                fast: flags & CMD_FLAG_FAST_ZERO != 0,
            },
            CMD_BLOCK_STATUS => Command::BlockStatus {
                offset,
                len,
                req_one: flags & CMD_FLAG_REQ_ONE != 0,
            },
            _ => return Err(refuse(EINVAL, "unknown command")),
        };
        self.check_range(&cmd, offset, len)?;
        Ok(cmd)
    }

    /// The range, alignment, size and permission rules of a command with a range.
    fn check_range(&self, cmd: &Command, offset: u64, len: u32) -> Result<(), Refusal> {
        let writes = matches!(
            cmd,
            Command::Write { .. } | Command::Trim { .. } | Command::WriteZeroes { .. }
        );
        if writes && self.readonly {
            return Err(refuse(EPERM, "the export is read-only"));
        }
        let past_end = match offset.checked_add(u64::from(len)) {
            Some(end) => end > self.size,
            None => true,
        };
        if past_end {
            // The specification's values: ENOSPC for writes, EINVAL for the rest.
            let errno = match cmd {
                Command::Write { .. } | Command::WriteZeroes { .. } => ENOSPC,
                _ => EINVAL,
            };
            return Err(refuse(
                errno,
                "the request reaches past the end of the export",
            ));
        }
        let m = u64::from(self.min_block.max(1));
        if !offset.is_multiple_of(m) || !u64::from(len).is_multiple_of(m) {
            return Err(refuse(
                EINVAL,
                "the request is not aligned to the export's minimum block size",
            ));
        }
        match cmd {
            Command::Read { .. } if len > MAX_PAYLOAD => Err(refuse(
                EINVAL,
                "a read longer than the maximum payload (32 MiB)",
            )),
            Command::BlockStatus { .. } if self.base_allocation.is_none() => Err(refuse(
                EINVAL,
                "block status without a metadata context selected",
            )),
            // A reply must hold at least one nonzero extent: a zero-length query has none.
            Command::BlockStatus { .. } if len == 0 => {
                Err(refuse(EINVAL, "block status of zero bytes"))
            }
            _ => Ok(()),
        }
    }
}
