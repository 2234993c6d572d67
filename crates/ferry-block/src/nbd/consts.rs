//! The protocol's numbers, named as the NBD specification (`doc/proto.md` of the
//! NetworkBlockDevice/nbd project) names them. Magics and fields are big-endian on the wire.

/// `NBDMAGIC`, the first 8 bytes a server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle greeting's second magic and the magic of every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// The magic of every option reply (fixed newstyle).
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// `NBD_REQUEST_MAGIC`.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// `NBD_EXTENDED_REQUEST_MAGIC` (extended headers; refused in this version).
pub const EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
/// `NBD_SIMPLE_REPLY_MAGIC`.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// `NBD_STRUCTURED_REPLY_MAGIC`.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server, 16 bits).
/// `NBD_FLAG_FIXED_NEWSTYLE`.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// `NBD_FLAG_NO_ZEROES`.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;

// Client flags (32 bits).
/// `NBD_FLAG_C_FIXED_NEWSTYLE`.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// `NBD_FLAG_C_NO_ZEROES`.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags (16 bits).
/// `NBD_FLAG_HAS_FLAGS` (always set).
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
/// `NBD_FLAG_READ_ONLY`.
pub const FLAG_READ_ONLY: u16 = 1 << 1;
/// `NBD_FLAG_SEND_FLUSH`.
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
/// `NBD_FLAG_SEND_FUA`.
pub const FLAG_SEND_FUA: u16 = 1 << 3;
/// `NBD_FLAG_ROTATIONAL`.
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
/// `NBD_FLAG_SEND_TRIM`.
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
/// `NBD_FLAG_SEND_WRITE_ZEROES`.
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// `NBD_FLAG_SEND_DF` (only with structured replies).
pub const FLAG_SEND_DF: u16 = 1 << 7;
/// `NBD_FLAG_CAN_MULTI_CONN`.
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// `NBD_FLAG_SEND_CACHE`.
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
/// `NBD_FLAG_SEND_FAST_ZERO`.
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// Options.
/// `NBD_OPT_EXPORT_NAME`.
pub const OPT_EXPORT_NAME: u32 = 1;
/// `NBD_OPT_ABORT`.
pub const OPT_ABORT: u32 = 2;
/// `NBD_OPT_LIST`.
pub const OPT_LIST: u32 = 3;
/// `NBD_OPT_STARTTLS` (refused with `NBD_REP_ERR_UNSUP` by a server with no certificate).
pub const OPT_STARTTLS: u32 = 5;
/// `NBD_OPT_INFO`.
pub const OPT_INFO: u32 = 6;
/// `NBD_OPT_GO`.
pub const OPT_GO: u32 = 7;
/// `NBD_OPT_STRUCTURED_REPLY`.
pub const OPT_STRUCTURED_REPLY: u32 = 8;
/// `NBD_OPT_LIST_META_CONTEXT`.
pub const OPT_LIST_META_CONTEXT: u32 = 9;
/// `NBD_OPT_SET_META_CONTEXT`.
pub const OPT_SET_META_CONTEXT: u32 = 10;
/// `NBD_OPT_EXTENDED_HEADERS` (refused with `NBD_REP_ERR_UNSUP` in this version).
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// Option replies.
/// `NBD_REP_ACK`.
pub const REP_ACK: u32 = 1;
/// `NBD_REP_SERVER`.
pub const REP_SERVER: u32 = 2;
/// `NBD_REP_INFO`.
pub const REP_INFO: u32 = 3;
/// `NBD_REP_META_CONTEXT`.
pub const REP_META_CONTEXT: u32 = 4;
/// `NBD_REP_ERR_UNSUP`.
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
/// `NBD_REP_ERR_POLICY`.
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
/// `NBD_REP_ERR_INVALID`.
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
/// `NBD_REP_ERR_TLS_REQD`.
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
/// `NBD_REP_ERR_UNKNOWN`.
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
/// `NBD_REP_ERR_SHUTDOWN`.
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;
/// `NBD_REP_ERR_TOO_BIG`.
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

// Information types of `NBD_REP_INFO`.
/// `NBD_INFO_EXPORT`.
pub const INFO_EXPORT: u16 = 0;
/// `NBD_INFO_NAME`.
pub const INFO_NAME: u16 = 1;
/// `NBD_INFO_DESCRIPTION`.
pub const INFO_DESCRIPTION: u16 = 2;
/// `NBD_INFO_BLOCK_SIZE`.
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands.
/// `NBD_CMD_READ`.
pub const CMD_READ: u16 = 0;
/// `NBD_CMD_WRITE`.
pub const CMD_WRITE: u16 = 1;
/// `NBD_CMD_DISC`.
pub const CMD_DISC: u16 = 2;
/// `NBD_CMD_FLUSH`.
pub const CMD_FLUSH: u16 = 3;
/// `NBD_CMD_TRIM`.
pub const CMD_TRIM: u16 = 4;
/// `NBD_CMD_CACHE`.
pub const CMD_CACHE: u16 = 5;
/// `NBD_CMD_WRITE_ZEROES`.
pub const CMD_WRITE_ZEROES: u16 = 6;
/// `NBD_CMD_BLOCK_STATUS`.
pub const CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
/// `NBD_CMD_FLAG_FUA`.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// `NBD_CMD_FLAG_NO_HOLE`.
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// `NBD_CMD_FLAG_DF`.
pub const CMD_FLAG_DF: u16 = 1 << 2;
/// `NBD_CMD_FLAG_REQ_ONE`.
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// `NBD_CMD_FLAG_FAST_ZERO`.
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// Structured replies.
/// `NBD_REPLY_FLAG_DONE`.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
/// `NBD_REPLY_TYPE_NONE`.
pub const REPLY_TYPE_NONE: u16 = 0;
/// `NBD_REPLY_TYPE_OFFSET_DATA`.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// `NBD_REPLY_TYPE_OFFSET_HOLE`.
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
/// `NBD_REPLY_TYPE_BLOCK_STATUS`.
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// `NBD_REPLY_TYPE_ERROR`.
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

// `base:allocation` status flags.
/// `NBD_STATE_HOLE`.
pub const STATE_HOLE: u32 = 1 << 0;
/// `NBD_STATE_ZERO`.
pub const STATE_ZERO: u32 = 1 << 1;

/// The one metadata context this server offers.
pub const BASE_ALLOCATION: &str = "base:allocation";

// Error values of replies.
/// `NBD_EPERM`.
pub const EPERM: u32 = 1;
/// `NBD_EIO`.
pub const EIO: u32 = 5;
/// `NBD_ENOMEM`.
pub const ENOMEM: u32 = 12;
/// `NBD_EINVAL`.
pub const EINVAL: u32 = 22;
/// `NBD_ENOSPC`.
pub const ENOSPC: u32 = 28;
/// `NBD_EOVERFLOW`.
pub const EOVERFLOW: u32 = 75;
/// `NBD_ENOTSUP`.
pub const ENOTSUP: u32 = 95;
/// `NBD_ESHUTDOWN`.
pub const ESHUTDOWN: u32 = 108;

/// Longest string (export name, description, query) the specification allows.
pub const MAX_STRING: usize = 4096;
/// Longest option payload this server reads; a longer one ends the connection (a client
/// that sends more is out of the specification or attacking it).
pub const MAX_OPTION_LEN: u32 = 64 * 1024;
/// Most metadata-context queries in one option.
pub const MAX_QUERIES: u32 = 128;
/// Largest request payload (WRITE data) and read length served: the specification's
/// 2^25, which it says no peer should treat as an attack. Advertised as the maximum payload.
pub const MAX_PAYLOAD: u32 = 32 * 1024 * 1024;
/// Size of a request header on the wire.
pub const REQUEST_LEN: usize = 28;
/// Size of an option request header on the wire.
pub const OPTION_HEADER_LEN: usize = 16;
