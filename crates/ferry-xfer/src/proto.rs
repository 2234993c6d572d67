//! The file-transfer control protocol, version 1.10: pure encode/decode, no I/O.
//!
//! Every EXS message on a transfer connection is exactly one frame (a PACK frame carries
//! several FILE frames inside it). A frame is an 8-byte
//! header (`len u32` total length, `type u8`, `flags u8`, 2 reserved zero bytes) and a body;
//! only BLOCK and FILE carry a payload (the file bytes) after their body. All integers are
//! little-endian; strings are `len u16` + UTF-8. The decoder accepts only what the encoder
//! produces (reserved bytes zero, no unknown flags, exact lengths, limits below) and never
//! panics. The specification is `docs/protocol.md`, section "File transfer protocol".

use std::fmt;

use ferry_wire::{
    Code, Code16, Cx, Field, Flag, Flags, IfFlag, Le, List, Payload, Raw, ReadError, Reader, Str,
    TooLong, Writer,
};

/// Protocol major version: a peer with another major is refused at HELLO.
pub const VERSION_MAJOR: u16 = 1;
/// Protocol minor version.
pub const VERSION_MINOR: u16 = 12;
/// The first minor version with parallel streams (session join, OPEN/HAVE/PUT_RANGE/CLOSE).
pub const MINOR_STREAMS: u16 = 2;
/// The first minor version with FILE frames (a small file's READY, BLOCK and FILE_DONE in
/// one frame): a server sends them only to clients of this minor or later.
pub const MINOR_FILE: u16 = 3;
/// The first minor version with PACK frames (several FILE frames in one message): a server
/// packs only for clients of this minor or later.
pub const MINOR_PACK: u16 = 4;
/// The first minor version with PUT_FILE frames (a small file uploaded in one frame, its
/// answer not waited for): a client sends them only to servers of this minor or later.
pub const MINOR_PUT_FILE: u16 = 4;
/// The first minor version whose SEND_TO may ask for several streams ([`SEND_STREAMS`]).
pub const MINOR_SEND_STREAMS: u16 = 4;
/// The first minor version with the FORCE flags of PUT, OPEN and PUT_FILE (replace a
/// read-only file): a client sets them only for servers of this minor or later (an older
/// server replaces read-only files anyway).
pub const MINOR_FORCE: u16 = 5;
/// The first minor version whose servers take a service selection (the floor's SELECT,
/// `ferry_service::select`) before HELLO. A client sends one only when it wants a service
/// other than file transfer: a HELLO without one is file transfer's, on every server.
pub const MINOR_SERVICES: u16 = 6;
/// The first minor version on the secure channel (the floor's TLS, `ferry_service::secure`):
/// a client's first message is a TLS frame, its token is proven in SELECT over the TLS
/// exporter and its HELLO carries none; a server refuses clear clients unless it allows
/// them (`[security] allow_clear`).
pub const MINOR_TLS: u16 = 7;
/// The first minor version with REMOVE (`ferry sync --delete`): a client sends it only to
/// servers of this minor or later.
pub const MINOR_REMOVE: u16 = 8;
/// The first minor version whose COPIED may count the entries a third-party copy skipped
/// ([`COPIED_SKIPPED`]): a server sets it only for clients of this minor or later.
pub const MINOR_COPIED_SKIPPED: u16 = 9;
/// The first minor version whose SEND_TO may carry a filter, an only-list and the follow
/// flag ([`SEND_FILTER`], [`SEND_ONLY`], [`SEND_FOLLOW`]): a client sets them only for
/// servers of this minor or later (an older one refuses the unknown flags).
pub const MINOR_SEND_FILTER: u16 = 9;
/// The first minor version with COPIES and ABORT_COPY (`ferry copies`): a client sends them
/// only to servers of this minor or later.
pub const MINOR_COPIES: u16 = 9;
/// The first minor version with client keys (the floor's SELECT flag KEY,
/// `ferry_service::keys`) and per-credential rights: a client proves a key only to servers
/// of this minor or later (an older one closes the connection at the unknown flag).
pub const MINOR_KEYS: u16 = 9;
/// The first minor version with data protection levels: a client on a secure connection
/// sends PROTECT right after WELCOME to servers of this minor or later, and a server of it
/// serves an older client over TLS only if it allows `clear` (`docs/security.md`).
pub const MINOR_PROTECT: u16 = 9;
/// The first minor version with grants (GRANT, GRANTED, SEND_TO's [`SEND_GRANT`]): a client
/// asks a destination of this minor or later for a grant instead of sending a source
/// server the user's token (`docs/security.md`, "Third-party copies").
pub const MINOR_GRANTS: u16 = 9;
/// The first minor version with tagged PACKs ([`PACK_TAGGED`]): to a client of this minor
/// or later at the `integrity` level, a server sends every PACK in clear with a tag keyed
/// by the session instead of sealing it (and a pack of one file as a PACK too).
pub const MINOR_TAGGED_PACK: u16 = 10;
/// The first minor version with PACKs of PUT_FILE frames ([`decode_put_pack`]): a client of
/// this minor or later uploads small files to a server of this minor or later several to a
/// message, sealed by TLS (a PUT_FILE names its path) or sealed in place at `private`.
pub const MINOR_PUT_PACK: u16 = 11;
/// The first minor version whose clients check every FILE frame by its BLAKE3 alone (as a
/// server checks a PUT_FILE): a server sends such a client FILE frames with `crc32c` 0,
/// computing no CRC (6.5 % of a server's CPU in a download of 64 KiB files).
pub const MINOR_FILE_HASH_ONLY: u16 = 12;
/// The most GETs in one GETS frame.
pub const MAX_GETS: usize = 64;
/// The most streams a session may have.
pub const MAX_STREAMS: u16 = 16;
/// Header length in bytes.
pub const HEADER_LEN: usize = 8;
/// The largest control frame (every frame but BLOCK).
pub const MAX_CONTROL: usize = 64 * 1024;
/// The largest BLOCK payload either side may negotiate.
pub const MAX_BLOCK: u32 = 64 << 20;
/// The smallest block size either side may negotiate.
pub const MIN_BLOCK: u32 = 4096;
/// The length of a BLOCK frame without its payload.
pub const BLOCK_HEADER_LEN: usize = HEADER_LEN + 4 + 2 + 2 + 8 + 4 + 4;
/// BLOCK header flag (1.9, data protection `private`): the payload is the block's
/// AES-256-GCM ciphertext, `len` bytes, followed by [`BLOCK_SEAL_TRAILER`] bytes (the tag
/// and the nonce's sequence number); the check value field is 0.
pub const BLOCK_SEALED: u8 = 1;
/// BLOCK header flag (1.9, data protection `integrity`): the check value is the tag of the
/// block's spans, the chaining values of the subtrees of the file's BLAKE3 tree it holds
/// (`ferry_service::tree::BlockSpans`), which the sender of a file sets and the receiver
/// follows ("Data protection" in `docs/protocol.md`).
pub const BLOCK_SPANS: u8 = 2;
/// The bytes after a sealed BLOCK's ciphertext ([`BLOCK_SEALED`]).
pub const BLOCK_SEAL_TRAILER: usize = 24;
/// The length of a FILE frame without its payload.
pub const FILE_HEADER_LEN: usize = HEADER_LEN + 4 + 4 + 4 + 32;
/// The length of a PACK frame without the frames it carries.
pub const PACK_HEADER_LEN: usize = HEADER_LEN + 2 + 2;
/// The same with the tag of a [`PACK_TAGGED`] PACK.
pub const TAGGED_PACK_HEADER_LEN: usize = PACK_HEADER_LEN + 32;
/// The most bytes of frames one PACK carries: a PACK fills at most one receive buffer of
/// the largest block size (`BLOCK_HEADER_LEN + MAX_BLOCK`).
pub const MAX_PACK: usize = MAX_BLOCK as usize + BLOCK_HEADER_LEN - PACK_HEADER_LEN;
/// The longest path (bytes).
pub const MAX_PATH: usize = 4096;
/// The longest token (bytes).
pub const MAX_TOKEN: usize = 1024;
/// The longest error message (bytes).
pub const MAX_MESSAGE: usize = 4096;
/// The most ranges in one RESEND.
pub const MAX_RANGES: usize = 1024;

/// Why a peer refused a request (ERROR frames). Unknown codes from a later minor decode as
/// [`ErrorCode::Other`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The request was malformed or not allowed in this state.
    BadRequest,
    /// The token was missing or wrong, or anonymous access is off.
    AuthRefused,
    /// No such root, file or directory.
    NotFound,
    /// The path leaves its root (`..`, absolute, symlink escape) or the OS denied access.
    PermissionDenied,
    /// A block or file checksum kept failing.
    Integrity,
    /// A disk read or write failed.
    Io,
    /// The disk is full.
    NoSpace,
    /// The peer speaks another major version.
    VersionMismatch,
    /// A directory was expected.
    NotADirectory,
    /// A file was expected.
    IsADirectory,
    /// Not supported by this build.
    Unsupported,
    /// Try again later: the server is shutting down, or another connection still holds the
    /// file being written (1.1). Clients treat it like a broken connection (retryable).
    Unavailable,
    /// A server this one had to reach (the destination of a third-party copy) could not be
    /// reached, or its connection broke (since 1.1).
    Unreachable,
    /// The request was stopped on purpose: a third-party copy aborted by its owner from
    /// another connection (since 1.9). Not retried.
    Cancelled,
    /// A code this build does not know.
    Other(u16),
}

impl Code16 for ErrorCode {
    /// The wire value.
    fn to_u16(self) -> u16 {
        match self {
            ErrorCode::BadRequest => 1,
            ErrorCode::AuthRefused => 2,
            ErrorCode::NotFound => 3,
            ErrorCode::PermissionDenied => 4,
            ErrorCode::Integrity => 5,
            ErrorCode::Io => 6,
            ErrorCode::NoSpace => 7,
            ErrorCode::VersionMismatch => 8,
            ErrorCode::NotADirectory => 9,
            ErrorCode::IsADirectory => 10,
            ErrorCode::Unsupported => 11,
            ErrorCode::Unavailable => 12,
            ErrorCode::Unreachable => 13,
            ErrorCode::Cancelled => 14,
            ErrorCode::Other(n) => n,
        }
    }

    /// From the wire value.
    fn from_u16(n: u16) -> Self {
        match n {
            1 => ErrorCode::BadRequest,
            2 => ErrorCode::AuthRefused,
            3 => ErrorCode::NotFound,
            4 => ErrorCode::PermissionDenied,
            5 => ErrorCode::Integrity,
            6 => ErrorCode::Io,
            7 => ErrorCode::NoSpace,
            8 => ErrorCode::VersionMismatch,
            9 => ErrorCode::NotADirectory,
            10 => ErrorCode::IsADirectory,
            11 => ErrorCode::Unsupported,
            12 => ErrorCode::Unavailable,
            13 => ErrorCode::Unreachable,
            14 => ErrorCode::Cancelled,
            n => ErrorCode::Other(n),
        }
    }
}

/// What a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File = 0,
    /// A directory.
    Dir = 1,
    /// A symbolic link (listed, never followed).
    Symlink = 2,
    /// Anything else (device, socket, fifo).
    Other = 3,
}

impl EntryKind {
    fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            0 => EntryKind::File,
            1 => EntryKind::Dir,
            2 => EntryKind::Symlink,
            3 => EntryKind::Other,
            _ => return None,
        })
    }
}

/// A file or directory as STAT and LIST describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Kind.
    pub kind: EntryKind,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Size in bytes (0 for directories).
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// The name (one path component; for STAT, the last component of the path).
    pub name: String,
}

/// The header of a BLOCK frame; its `len` payload bytes follow it in the same message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    /// The transfer this block belongs to (chosen by the client in GET/PUT).
    pub file_id: u32,
    /// The stream that carried it (0 until parallel streams arrive).
    pub stream: u16,
    /// Byte offset in the file.
    pub offset: u64,
    /// Payload length.
    pub len: u32,
    /// CRC-32C (Castagnoli) of the payload, or its integrity tag (1.9).
    pub crc32c: u32,
    /// The integrity tag read the block's spans, not the plain BLAKE3 of its bytes (header
    /// flag [`BLOCK_SPANS`], 1.9).
    pub spans: bool,
}

/// PUT flag: continue the server's `.ferry-part` of this file if it holds one of the same
/// source (1.1); READY's `offset` says where the data starts.
pub const PUT_RESUME: u8 = 1;
/// PUT flag: the body carries the source's `mtime` (1.1); set from [`Msg::Put::mtime`].
pub const PUT_MTIME: u8 = 2;
/// PUT flag (1.5): replace the destination even if it is a read-only file (`ferry cp
/// --force`); without it the server refuses a read-only destination.
pub const PUT_FORCE: u8 = 4;
/// PUT_FILE flag (1.5): as [`PUT_FORCE`].
pub const PUT_FILE_FORCE: u8 = 1;
/// FILE_DONE flag: `blake3` holds the hash of the whole file.
pub const DONE_HASH: u8 = 1;
/// OPEN flag: continue the server's journaled `.ferry-part` of this file if it holds one
/// of the same source (1.2); HAVE lists what it holds.
pub const OPEN_RESUME: u8 = 1;
/// OPEN flag (1.5): as [`PUT_FORCE`].
pub const OPEN_FORCE: u8 = 2;
/// CLOSE flag: `blake3` holds the hash of the whole file.
pub const CLOSE_HASH: u8 = 1;
/// SEND_TO flag: the source is a directory; copy the tree.
pub const SEND_RECURSIVE: u8 = 1;
/// SEND_TO flag (1.4): a `streams u16` (2..=[`MAX_STREAMS`]) follows the token; the source
/// server copies over that many streams. Set exactly when `streams` > 1.
pub const SEND_STREAMS: u8 = 2;
/// SEND_TO flag (1.9): follow symbolic links in the tree, as long as they stay inside the
/// source server's root (`ferry cp -L`); a link that leaves it is skipped and counted.
pub const SEND_FOLLOW: u8 = 8;
/// SEND_TO flag (1.9): two lists of patterns follow (after `streams`): `--include`, then
/// `--exclude` (`ferry cp -r --include/--exclude`; docs/xfer.md, "Filters").
pub const SEND_FILTER: u8 = 16;
/// SEND_TO flag (1.9): a list of relative paths follows (after the patterns): of the tree,
/// copy only these files (what `ferry sync` found to differ).
pub const SEND_ONLY: u8 = 32;
/// The most patterns in each of SEND_TO's pattern lists.
pub const MAX_PATTERNS: usize = 256;
/// SEND_TO flag (1.9): a 32-byte grant from the destination follows `streams`
/// (`ferry_service::grants`): the source server proves it there instead of a token (the
/// frame's `token` is then empty), and `dest_path` is where the copy lands, already placed
/// by the client.
pub const SEND_GRANT: u8 = 4;
/// GRANT flag: the grant covers the path and everything beneath it (a tree).
pub const GRANT_TREE: u8 = 1;
/// PACK flag (1.10): a 32-byte tag follows `count` ([`pack_tag`]); the PACK travels clear.
pub const PACK_TAGGED: u8 = 1;
/// PACK flag (1.10, data protection `private`): the frames are AES-256-GCM ciphertext
/// followed by the seal trailer ([`BLOCK_SEAL_TRAILER`] bytes), sealed in place with the
/// session's `private` key over [`pack_seal_context`]; the PACK travels clear.
pub const PACK_SEALED: u8 = 2;
/// COPIED flag (1.9): a `skipped u64` follows `blocks_resent`: entries of the source tree the
/// copy left out (symbolic links, devices, sockets, FIFOs). Set exactly when `skipped` > 0.
pub const COPIED_SKIPPED: u8 = 1;
/// The longest fabric address in a frame (bytes).
pub const MAX_ADDR: usize = 512;

ferry_wire::frames! {
    /// One frame.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Msg: u8 {
        /// Client → server, first frame: version, proposed block size, auth token, and the
        /// session/stream a parallel stream will join (0/0 for a new session).
        Hello = 1 {
            /// Client major version.
            major: u16 as Le,
            /// Client minor version.
            minor: u16 as Le,
            /// Proposed block size.
            block_size: u32 as Le,
            /// Session to join (0: new).
            session: u64 as Le,
            /// Stream number within the session.
            stream: u16 as Le,
            /// Auth token ("" for anonymous).
            token: String as Str<MAX_TOKEN>,
        },
        /// Server → client: accepted; the block size both sides use and the session id.
        Welcome = 2 {
            /// Server major.
            major: u16 as Le,
            /// Server minor.
            minor: u16 as Le,
            /// Negotiated block size.
            block_size: u32 as Le,
            /// Session id.
            session: u64 as Le,
        },
        /// A refusal; `file_id` names the transfer it ends (0: the request or connection).
        Error = 3 {
            /// Why.
            code: ErrorCode as Code,
            /// Transfer it concerns, or 0.
            file_id: u32 as Le,
            /// Human-readable explanation, with what to do.
            message: String as Str<MAX_MESSAGE>,
        },
        /// Describe one path (reply: ENTRY or ERROR).
        Stat = 4 {
            /// `root/relative/path`.
            path: String as Str<MAX_PATH>,
        },
        /// Reply to STAT.
        Entry = 5 (frame: Entry as EntryCodec),
        /// List a directory (reply: ENTRIES frames until one without `more`, or ERROR).
        List = 6 {
            /// `root/relative/dir` ("" lists the roots).
            path: String as Str<MAX_PATH>,
        },
        /// A batch of directory entries.
        Entries = 7 {
            /// More ENTRIES frames follow.
            more: bool as Flag<1>,
            /// The entries.
            entries: Vec<Entry> as List<EntryCodec, { u16::MAX as usize }>,
        },
        /// Read `length` bytes at `offset` (`u64::MAX`: to the end). Reply: READY, BLOCKs,
        /// FILE_DONE, or ERROR.
        Get = 8 {
            /// Client-chosen transfer id.
            file_id: u32 as Le,
            /// Start.
            offset: u64 as Le,
            /// Length, or `u64::MAX` for the rest of the file.
            length: u64 as Le,
            /// Path.
            path: String as Str<MAX_PATH>,
        },
        /// Write a file of `size` bytes (reply READY, then the client streams BLOCKs and
        /// FILE_DONE; the server answers OK, RESEND or ERROR).
        Put = 9 {
            /// Client-chosen transfer id.
            file_id: u32 as Le,
            /// [`PUT_RESUME`], [`PUT_FORCE`] (1.5) or 0 ([`PUT_MTIME`] is derived from `mtime`).
            flags: u8 as Flags<{ PUT_RESUME | PUT_FORCE }>,
            /// Permission bits for the new file.
            mode: u32 as Le,
            /// Final size.
            size: u64 as Le,
            /// The source's modification time, nanoseconds since the epoch (1.1, flag
            /// [`PUT_MTIME`]): part of the source identity a resume checks, and set on the file.
            mtime: Option<i64> as IfFlag<PUT_MTIME, Le>,
            /// Path.
            path: String as Str<MAX_PATH>,
        },
        /// The transfer may start: the file's size and mode, and where the data starts.
        Ready = 10 {
            /// Transfer id.
            file_id: u32 as Le,
            /// File size (GET) or accepted size (PUT).
            size: u64 as Le,
            /// Permission bits.
            mode: u32 as Le,
            /// First offset that will travel (the resume point; 0 unless a resumed PUT or a
            /// ranged GET).
            offset: u64 as Le,
        },
        /// File data; the payload follows the header in the same message.
        Block = 11 (frame: BlockHeader as BlockCodec),
        /// A whole small file in one frame (1.3, server → client, answering a GET of a whole
        /// file that fits): READY, its one BLOCK and FILE_DONE at once. The payload (the
        /// whole file, `len` bytes) follows the header in the same message.
        File = 23 {
            /// Transfer id.
            file_id: u32 as Le,
            /// Permission bits.
            mode: u32 as Le,
            /// CRC-32C of the payload; 0 to a client whose HELLO said minor ≥ 12, which
            /// checks the frame by `blake3` alone ([`MINOR_FILE_HASH_ONLY`]).
            crc32c: u32 as Le,
            /// BLAKE3 of the payload (the whole file).
            blake3: [u8; 32] as Raw,
            /// Payload length: the file's size (not encoded; the frame length gives it).
            len: u32 as Payload<{ MAX_BLOCK as usize }>,
        },
        /// Several FILE frames in one message (1.4, server → client, to a client whose HELLO said
        /// minor ≥ 4): the frames follow the header back to back, each with its own header and
        /// payload; [`decode_pack`] takes them apart. From 1.11 also client → server with
        /// PUT_FILE frames ([`decode_put_pack`]), to a server whose WELCOME said minor ≥ 11.
        Pack = 25 {
            /// How many FILE frames follow (at least 1).
            count: u16 as PackCount,
            /// Flag [`PACK_TAGGED`] (1.10): the tag of the frames ([`pack_tag`]).
            tag: Option<[u8; 32]> as IfFlag<PACK_TAGGED, Raw>,
            /// Flag [`PACK_SEALED`] (1.10): the frames are sealed in place.
            sealed: bool as Flag<PACK_SEALED>,
            /// Bytes of the frames that follow (not encoded; the frame length gives it).
            len: u32 as Payload<MAX_PACK>,
        },
        /// A whole small file uploaded in one frame (1.4, client → server, to a server whose
        /// WELCOME said minor ≥ 4): PUT, its one BLOCK and FILE_DONE at once, checked by the
        /// BLAKE3. Answered OK or ERROR like a PUT's end; the client does not wait for the
        /// answer before it sends the next. The payload (the whole file, `len` bytes) follows
        /// the path in the same message.
        PutFile = 26 {
            /// [`PUT_FILE_FORCE`] (1.5) or 0.
            flags: u8 as Flags<PUT_FILE_FORCE>,
            /// Transfer id.
            file_id: u32 as Le,
            /// Permission bits.
            mode: u32 as Le,
            /// The source's modification time (nanoseconds since the epoch).
            mtime: i64 as Le,
            /// BLAKE3 of the payload (the whole file).
            blake3: [u8; 32] as Raw,
            /// Path.
            path: String as Str<MAX_PATH>,
            /// Payload length: the file's size (not encoded; the frame length gives it).
            len: u32 as Payload<{ MAX_BLOCK as usize }>,
        },
        /// The sender has sent every block of the transfer.
        FileDone = 12 {
            /// Transfer id.
            file_id: u32 as Le,
            /// Bytes covered.
            length: u64 as Le,
            /// BLAKE3 of the whole file, when the transfer covered it from offset 0.
            blake3: Option<[u8; 32]> as HashIf<DONE_HASH>,
        },
        /// Receiver of a PUT → sender: these blocks failed their CRC; send them again, then
        /// FILE_DONE again.
        Resend = 13 {
            /// Transfer id.
            file_id: u32 as Le,
            /// (offset, length) of each block.
            ranges: Vec<(u64, u32)> as List<(Le, Le), MAX_RANGES>,
        },
        /// Success (PUT committed, MKDIR done).
        Ok = 14 {
            /// Transfer id (0 for MKDIR).
            file_id: u32 as Le,
        },
        /// Success of `count` PUT_FILEs in a row (1.11, to a client whose HELLO said minor ≥
        /// 11): the `count` oldest unanswered, the last of which is `file_id`, are committed.
        Oks = 27 {
            /// The last file of the run.
            file_id: u32 as Le,
            /// How many files (at least 2).
            count: u32 as Le,
        },
        /// Create a directory (existing is fine).
        Mkdir = 15 {
            /// Permission bits.
            mode: u32 as Le,
            /// Path.
            path: String as Str<MAX_PATH>,
        },
        /// Client → server (1.9, secure connections only, right after WELCOME): the data
        /// protection the client requires ([`ferry_service::secure::Level`]'s code: 0 clear,
        /// 1 integrity, 2 private). Answered OK (file id 0), after which the connection's
        /// blocks are protected so, or ERROR (`Refused`), after which it closes.
        Protect = 36 {
            /// The level's code.
            level: u8 as Le,
        },
        /// Client → server (1.7): remove a file, a symlink or an empty directory; OK or
        /// ERROR.
        Remove = 35 {
            /// Path.
            path: String as Str<MAX_PATH>,
        },
        /// Client → server (1.9): list the third-party copies this server is making for the
        /// asking credential. Reply: one COPY frame per copy, then OK.
        Copies = 37,
        /// A third-party copy in progress (1.9, server → client, answering COPIES).
        Copy = 38 {
            /// The server's id of the copy (ABORT_COPY names it).
            id: u64 as Le,
            /// Bytes copied so far.
            done: u64 as Le,
            /// Bytes to copy in all.
            total: u64 as Le,
            /// Seconds since it started.
            secs: u32 as Le,
            /// Source path on this server.
            path: String as Str<MAX_PATH>,
            /// Destination server address.
            dest: String as Str<MAX_ADDR>,
            /// Path there.
            dest_path: String as Str<MAX_PATH>,
        },
        /// Client → server (1.9): stop the third-party copy `id` of the asking credential;
        /// OK, or ERROR NotFound. The copy's own client gets ERROR Cancelled.
        AbortCopy = 39 {
            /// The copy's id (from COPY).
            id: u64 as Le,
        },
        /// Several whole-file GETs in one frame (1.3, client → server, to a server whose
        /// WELCOME said minor ≥ 3): answered exactly as that many GETs of `(file_id, path)`
        /// with offset 0 and length `u64::MAX`, in order.
        Gets = 24 {
            /// (transfer id, path) of each file, at most [`MAX_GETS`].
            files: Vec<(u32, String)> as List<(Le, Str<MAX_PATH>), MAX_GETS>,
        },
        /// Hash a file on the server (reply: SUM_REPLY or ERROR).
        Sum = 16 {
            /// Path.
            path: String as Str<MAX_PATH>,
        },
        /// A file's size and BLAKE3.
        SumReply = 17 {
            /// Size.
            size: u64 as Le,
            /// BLAKE3.
            blake3: [u8; 32] as Raw,
        },
        /// Orderly end of the connection.
        Bye = 18,
        /// Third-party copy (since 1.1): the server copies `path` (a tree with
        /// [`SEND_RECURSIVE`]) to `dest_path` on the `ferry serve` at `dest`, connecting to it
        /// as a client with `token`. Reply: PROGRESS frames, then COPIED or ERROR.
        SendTo = 32 {
            /// [`SEND_RECURSIVE`] or 0.
            flags: u8 as Flags<SEND_RECURSIVE>,
            /// Client-chosen request id, echoed by PROGRESS, COPIED and ERROR.
            file_id: u32 as Le,
            /// Source path on this server.
            path: String as Str<MAX_PATH>,
            /// Fabric address of the destination server (`tcp://host:port`, `ofi+shm://name`…).
            dest: String as Str<MAX_ADDR>,
            /// Path on the destination server (an existing directory keeps the source's name).
            dest_path: String as Str<MAX_PATH>,
            /// Token for the destination server.
            token: String as Str<MAX_TOKEN>,
            /// Streams to the destination (1: one; more: a parallel copy, 1.4).
            streams: u16 as Streams,
            /// The destination's grant (flag [`SEND_GRANT`], 1.9): the secret the source
            /// proves there instead of a token.
            grant: Option<[u8; 32]> as IfFlag<SEND_GRANT, Raw>,
            /// Follow symbolic links that stay inside the root ([`SEND_FOLLOW`], 1.9).
            follow: bool as Flag<SEND_FOLLOW>,
            /// `--include` and `--exclude` patterns ([`SEND_FILTER`], 1.9).
            patterns: Option<(Vec<String>, Vec<String>)> as IfFlag<
                SEND_FILTER,
                (
                    List<Str<MAX_PATH>, MAX_PATTERNS>,
                    List<Str<MAX_PATH>, MAX_PATTERNS>,
                ),
            >,
            /// Copy only these files of the tree ([`SEND_ONLY`], 1.9).
            only: Option<Vec<String>> as IfFlag<SEND_ONLY, List<Str<MAX_PATH>, { u16::MAX as usize }>>,
        },
        /// Client → server (1.9, secure connections only): mint a grant for another server to
        /// write `path` here (a tree with [`GRANT_TREE`]) on the asking credential's behalf,
        /// once, within `ttl_secs` (0: the server's default, 60 s). Reply: GRANTED or ERROR.
        Grant = 40 {
            /// [`GRANT_TREE`] or 0.
            flags: u8 as Flags<GRANT_TREE>,
            /// Seconds it may wait for its use (the server caps it).
            ttl_secs: u32 as Le,
            /// `root/relative/path` it lets be written.
            path: String as Str<MAX_PATH>,
        },
        /// Server → client (1.9): the grant: its id (what the audit names) and its secret,
        /// which the client hands only to the source server, inside its sealed SEND_TO.
        Granted = 41 {
            /// The grant's id.
            id: u64 as Le,
            /// The secret (an Ed25519 seed; the server keeps only its public key).
            secret: [u8; 32] as Raw,
            /// Seconds it is accepted for.
            ttl_secs: u32 as Le,
        },
        /// How far a third-party copy has got (at most a few per second).
        Progress = 33 {
            /// Request id.
            file_id: u32 as Le,
            /// Bytes copied so far.
            done: u64 as Le,
            /// Bytes to copy in all.
            total: u64 as Le,
        },
        /// A third-party copy finished: what it moved.
        Copied = 34 {
            /// Request id.
            file_id: u32 as Le,
            /// Files copied.
            files: u64 as Le,
            /// File bytes copied.
            bytes: u64 as Le,
            /// Blocks the destination asked for again after a CRC mismatch.
            blocks_resent: u64 as Le,
            /// Entries of the source tree left out, not regular files or directories (1.9).
            skipped: u64 as CountIf<COPIED_SKIPPED>,
        },
        /// Opens a parallel upload (1.2): a file of `size` bytes whose ranges any stream of the
        /// session then sends with PUT_RANGE, closed by CLOSE. Reply: HAVE or ERROR.
        Open = 19 {
            /// [`OPEN_RESUME`], [`OPEN_FORCE`] (1.5) or 0.
            flags: u8 as Flags<{ OPEN_RESUME | OPEN_FORCE }>,
            /// Client-chosen id, unique in the session; PUT_RANGE and CLOSE name it.
            file_id: u32 as Le,
            /// Permission bits for the new file.
            mode: u32 as Le,
            /// Final size.
            size: u64 as Le,
            /// The source's modification time, nanoseconds since the epoch.
            mtime: i64 as Le,
            /// Path.
            path: String as Str<MAX_PATH>,
        },
        /// Reply to OPEN: the byte ranges `[start, end)` the server already holds verified (a
        /// resumed part; empty otherwise). The client sends the rest.
        Have = 20 {
            /// The OPEN's id.
            file_id: u32 as Le,
            /// Sorted, disjoint ranges (at most [`MAX_RANGES`]).
            ranges: Vec<(u64, u64)> as List<(Le, Le), MAX_RANGES>,
        },
        /// Sends `[offset, offset + length)` of an OPENed file on this stream (1.2). Reply:
        /// READY, then the client sends BLOCKs and FILE_DONE (without hash); the server answers
        /// OK, RESEND or ERROR, as for PUT.
        PutRange = 21 {
            /// The OPEN's id.
            file_id: u32 as Le,
            /// First byte.
            offset: u64 as Le,
            /// Length.
            length: u64 as Le,
        },
        /// Every range of an OPENed file was sent (1.2): check the whole file and commit it.
        /// Reply: OK or ERROR.
        Close = 22 {
            /// The OPEN's id.
            file_id: u32 as Le,
            /// The file's length.
            length: u64 as Le,
            /// BLAKE3 of the whole file (none for a zero source into `mem/null`).
            blake3: Option<[u8; 32]> as HashIf<CLOSE_HASH>,
        },
    }
}

pub use ferry_wire::DecodeError;

/// Why a frame cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A field over its limit (path, token, message, ranges, control frame size).
    #[error("{0} too long")]
    TooLong(&'static str),
}

impl From<TooLong> for EncodeError {
    fn from(e: TooLong) -> Self {
        EncodeError::TooLong(e.0)
    }
}

// The codecs of the fields that are more than an integer, string or list: each says how
// its field travels and what the decoder refuses.

/// [`Entry`]: `kind u8, mode u32, size u64, mtime i64, name str`.
struct EntryCodec;

impl Field<Entry> for EntryCodec {
    const MIN: usize = 1 + 4 + 8 + 8 + 2;
    const MAX: usize = Self::MIN + MAX_PATH;
    fn put(e: &Entry, w: &mut Writer<'_>, _: &mut Cx<'_>, _: &'static str) -> Result<(), TooLong> {
        w.u8(e.kind as u8);
        w.u32(e.mode);
        w.u64(e.size);
        w.i64(e.mtime);
        w.str_u16(&e.name, MAX_PATH, "entry name")
    }
    fn get<'a>(r: &mut Reader<'a>, _: &mut Cx<'a>) -> Result<Entry, ReadError> {
        let kind = EntryKind::from_u8(r.u8()?).ok_or(ReadError::Invalid("unknown entry kind"))?;
        Ok(Entry {
            kind,
            mode: r.u32()?,
            size: r.u64()?,
            mtime: r.i64()?,
            name: r.str_u16(MAX_PATH)?.to_owned(),
        })
    }
}

/// [`BlockHeader`]: `file_id u32, stream u16, reserved u16, offset u64, len u32, crc32c
/// u32`, then exactly `len` payload bytes, and [`BLOCK_SEAL_TRAILER`] more when the header
/// flag [`BLOCK_SEALED`] is set (the payload then includes them).
struct BlockCodec;

impl Field<BlockHeader> for BlockCodec {
    const MIN: usize = BLOCK_HEADER_LEN - HEADER_LEN;
    const MAX: usize = Self::MIN + MAX_BLOCK as usize + BLOCK_SEAL_TRAILER;
    const FLAGS: u8 = BLOCK_SEALED | BLOCK_SPANS;
    const PAYLOAD: bool = true;
    fn put(
        h: &BlockHeader,
        w: &mut Writer<'_>,
        cx: &mut Cx<'_>,
        _: &'static str,
    ) -> Result<(), TooLong> {
        if h.len > MAX_BLOCK {
            return Err(TooLong("block"));
        }
        w.u32(h.file_id);
        w.u16(h.stream);
        w.zeros(2);
        w.u64(h.offset);
        w.u32(h.len);
        w.u32(h.crc32c);
        if h.spans {
            cx.flags |= BLOCK_SPANS;
        }
        cx.payload_len = h.len as usize;
        Ok(())
    }
    fn get<'a>(r: &mut Reader<'a>, cx: &mut Cx<'a>) -> Result<BlockHeader, ReadError> {
        let file_id = r.u32()?;
        let stream = r.u16()?;
        if !r.zeros(2)? {
            return Err(ReadError::Invalid("reserved block bytes"));
        }
        let h = BlockHeader {
            file_id,
            stream,
            offset: r.u64()?,
            len: r.u32()?,
            crc32c: r.u32()?,
            spans: cx.flags & BLOCK_SPANS != 0,
        };
        if h.len > MAX_BLOCK {
            return Err(ReadError::TooLong {
                len: h.len as usize,
                max: MAX_BLOCK as usize,
            });
        }
        if h.offset.checked_add(u64::from(h.len)).is_none() {
            return Err(ReadError::Invalid("block range overflows"));
        }
        let sealed = cx.flags & BLOCK_SEALED != 0;
        // A sealed block's check value is its tag, in the trailer; the field is 0, so
        // each block has one encoding.
        if sealed && h.crc32c != 0 {
            return Err(ReadError::Invalid(
                "a sealed block's check value field is not 0",
            ));
        }
        let trailer = if sealed { BLOCK_SEAL_TRAILER } else { 0 };
        cx.payload = r.take(h.len as usize + trailer)?;
        Ok(h)
    }
}

/// A PACK's `count u16` (at least 1) and two reserved zero bytes.
struct PackCount;

impl Field<u16> for PackCount {
    const MIN: usize = 4;
    const MAX: usize = 4;
    fn put(
        count: &u16,
        w: &mut Writer<'_>,
        _: &mut Cx<'_>,
        _: &'static str,
    ) -> Result<(), TooLong> {
        if *count == 0 {
            return Err(TooLong("pack"));
        }
        w.u16(*count);
        w.zeros(2);
        Ok(())
    }
    fn get<'a>(r: &mut Reader<'a>, _: &mut Cx<'a>) -> Result<u16, ReadError> {
        let count = r.u16()?;
        if !r.zeros(2)? {
            return Err(ReadError::Invalid("reserved pack bytes"));
        }
        if count == 0 {
            return Err(ReadError::Invalid("empty pack"));
        }
        Ok(count)
    }
}

/// A BLAKE3 present when flag `BIT` is set: 32 bytes always, zero without the flag.
struct HashIf<const BIT: u8>;

impl<const BIT: u8> Field<Option<[u8; 32]>> for HashIf<BIT> {
    const MIN: usize = 32;
    const MAX: usize = 32;
    const FLAGS: u8 = BIT;
    fn put(
        v: &Option<[u8; 32]>,
        w: &mut Writer<'_>,
        cx: &mut Cx<'_>,
        _: &'static str,
    ) -> Result<(), TooLong> {
        if v.is_some() {
            cx.flags |= BIT;
        }
        w.bytes(v.as_ref().unwrap_or(&[0; 32]));
        Ok(())
    }
    fn get<'a>(r: &mut Reader<'a>, cx: &mut Cx<'a>) -> Result<Option<[u8; 32]>, ReadError> {
        let hash: [u8; 32] = r.array()?;
        if cx.flags & BIT != 0 {
            Ok(Some(hash))
        } else if hash != [0; 32] {
            Err(ReadError::Invalid("hash without its flag"))
        } else {
            Ok(None)
        }
    }
}

/// A count that is on the wire only when it is not zero, as a `u64` with the header flag
/// `BIT` set (zero, and absent, without it).
struct CountIf<const BIT: u8>;

impl<const BIT: u8> Field<u64> for CountIf<BIT> {
    const MIN: usize = 0;
    const MAX: usize = 8;
    const FLAGS: u8 = BIT;
    fn put(n: &u64, w: &mut Writer<'_>, cx: &mut Cx<'_>, _: &'static str) -> Result<(), TooLong> {
        if *n > 0 {
            cx.flags |= BIT;
            w.u64(*n);
        }
        Ok(())
    }
    fn get<'a>(r: &mut Reader<'a>, cx: &mut Cx<'a>) -> Result<u64, ReadError> {
        if cx.flags & BIT == 0 {
            return Ok(0);
        }
        match r.u64()? {
            0 => Err(ReadError::Invalid("a zero count with its flag")),
            n => Ok(n),
        }
    }
}

/// SEND_TO's stream count: a `u16` in 2..=[`MAX_STREAMS`] with [`SEND_STREAMS`], absent
/// (meaning 1) without.
struct Streams;

impl Field<u16> for Streams {
    const MIN: usize = 0;
    const MAX: usize = 2;
    const FLAGS: u8 = SEND_STREAMS;
    fn put(n: &u16, w: &mut Writer<'_>, cx: &mut Cx<'_>, _: &'static str) -> Result<(), TooLong> {
        if *n > MAX_STREAMS {
            return Err(TooLong("streams"));
        }
        if *n > 1 {
            cx.flags |= SEND_STREAMS;
            w.u16(*n);
        }
        Ok(())
    }
    fn get<'a>(r: &mut Reader<'a>, cx: &mut Cx<'a>) -> Result<u16, ReadError> {
        if cx.flags & SEND_STREAMS == 0 {
            return Ok(1);
        }
        let n = r.u16()?;
        if !(2..=MAX_STREAMS).contains(&n) {
            return Err(ReadError::Invalid("SEND_TO streams outside 2..=16"));
        }
        Ok(n)
    }
}

/// Appends the encoding of `msg` to `out`. For [`Msg::Block`] only the header is written:
/// the caller appends exactly `len` payload bytes (see [`encode_block_header`]).
pub fn encode(msg: &Msg, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let mut w = Writer::new(out);
    // The header (`len u32, type u8, flags u8, reserved u16`) is patched in at the end,
    // once the fields have set the flags and the length is known.
    w.zeros(HEADER_LEN);
    let mut cx = Cx::default();
    if let Err(e) = msg.encode_body(&mut w, &mut cx) {
        w.undo();
        return Err(e.into());
    }
    let code = msg.code();
    if !Msg::carries_payload(code) && w.len() > MAX_CONTROL {
        w.undo();
        return Err(EncodeError::TooLong("control frame"));
    }
    // At most a header, a path and MAX_BLOCK payload bytes: the total fits a u32.
    let total = (w.len() + cx.payload_len) as u32;
    w.patch_u32(0, total);
    w.patch(4, &[code, cx.flags]);
    Ok(())
}

/// Writes a BLOCK header into the first [`BLOCK_HEADER_LEN`] bytes of `out`.
pub fn encode_block_header(h: &BlockHeader) -> Result<[u8; BLOCK_HEADER_LEN], EncodeError> {
    let mut v = Vec::with_capacity(BLOCK_HEADER_LEN);
    encode(&Msg::Block(*h), &mut v)?;
    let mut a = [0u8; BLOCK_HEADER_LEN];
    a.copy_from_slice(&v);
    Ok(a)
}

/// The header of a sealed BLOCK ([`BLOCK_SEALED`]): `h.len` ciphertext bytes and the seal
/// trailer follow it, and its check value is 0.
pub fn encode_sealed_block_header(h: &BlockHeader) -> Result<[u8; BLOCK_HEADER_LEN], EncodeError> {
    let mut a = encode_block_header(&BlockHeader { crc32c: 0, ..*h })?;
    let total = u32::from_le_bytes([a[0], a[1], a[2], a[3]]) + BLOCK_SEAL_TRAILER as u32;
    a[..4].copy_from_slice(&total.to_le_bytes());
    a[5] |= BLOCK_SEALED;
    Ok(a)
}

/// The header of a FILE frame ([`Msg::File`]) for a payload of `len` bytes, which follows
/// it in the same message.
pub fn encode_file_header(
    file_id: u32,
    mode: u32,
    crc32c: u32,
    blake3: [u8; 32],
    len: u32,
) -> Result<[u8; FILE_HEADER_LEN], EncodeError> {
    let msg = Msg::File {
        file_id,
        mode,
        crc32c,
        blake3,
        len,
    };
    let mut v = Vec::with_capacity(FILE_HEADER_LEN);
    encode(&msg, &mut v)?;
    let mut a = [0u8; FILE_HEADER_LEN];
    a.copy_from_slice(&v);
    Ok(a)
}

/// The header of a PACK frame ([`Msg::Pack`]) of `count` FILE frames taking `len` bytes
/// (with a sealed PACK's trailer), which follow it in the same message, with `tag` if tagged
/// ([`TAGGED_PACK_HEADER_LEN`] bytes, else [`PACK_HEADER_LEN`]).
pub fn encode_pack_header(
    count: u16,
    tag: Option<[u8; 32]>,
    sealed: bool,
    len: u32,
) -> Result<Vec<u8>, EncodeError> {
    let mut v = Vec::with_capacity(TAGGED_PACK_HEADER_LEN);
    encode(
        &Msg::Pack {
            count,
            tag,
            sealed,
            len,
        },
        &mut v,
    )?;
    Ok(v)
}

/// The associated data of a [`PACK_SEALED`] PACK's seal: `"ferry 1.10 pack\0"`, `seq`
/// (sealed PACKs the connection carried that way before this one) and `count`,
/// little-endian (26 bytes: never a block's).
pub fn pack_seal_context(seq: u64, count: u16) -> [u8; 26] {
    let mut c = [0u8; 26];
    c[..16].copy_from_slice(b"ferry 1.10 pack\0");
    c[16..24].copy_from_slice(&seq.to_le_bytes());
    c[24..].copy_from_slice(&count.to_le_bytes());
    c
}

/// The tag of a [`PACK_TAGGED`] PACK: BLAKE3 keyed by `key` (the session's `integrity` key
/// of the direction) over `"ferry 1.10 pack\0"`, `seq` (how many tagged PACKs the
/// connection carried that way before this one), `count` (little-endian) and the header of
/// each of the `frames` in order (the first [`FILE_HEADER_LEN`] bytes of each FILE frame:
/// its length, `file_id`, mode, CRC-32C and BLAKE3). The header binds each payload through
/// its BLAKE3, which the receiver checks before it commits the file. `frames` must be what
/// [`decode_pack`] accepts (a receiver tags only what it took apart), else the error.
pub fn pack_tag(
    key: &[u8; 32],
    seq: u64,
    count: u16,
    frames: &[u8],
) -> Result<[u8; 32], DecodeError> {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"ferry 1.10 pack\0");
    h.update(&seq.to_le_bytes());
    h.update(&count.to_le_bytes());
    let mut rest = frames;
    while !rest.is_empty() {
        let head = rest.get(..FILE_HEADER_LEN).ok_or(DecodeError::Truncated)?;
        let n = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if n < FILE_HEADER_LEN || n > rest.len() {
            return Err(DecodeError::Truncated);
        }
        h.update(head);
        rest = &rest[n..];
    }
    Ok(*h.finalize().as_bytes())
}

/// Takes apart the frames of a PACK (`count` and `frames` as [`decode`] returned them): each
/// must be a whole FILE frame, and together exactly `count` of them fill `frames`. Returns
/// each [`Msg::File`] with its payload.
pub fn decode_pack(count: u16, frames: &[u8]) -> Result<Vec<(Msg, &[u8])>, DecodeError> {
    decode_frames(count, frames, |m| matches!(m, Msg::File { .. }))
        .map_err(|e| e.unwrap_or(DecodeError::Malformed("a pack carries only FILE frames")))
}

/// Takes apart the frames of a PACK a client sent (1.11): as [`decode_pack`], but each a
/// whole PUT_FILE frame. Returns each [`Msg::PutFile`] with its payload.
pub fn decode_put_pack(count: u16, frames: &[u8]) -> Result<Vec<(Msg, &[u8])>, DecodeError> {
    decode_frames(count, frames, |m| matches!(m, Msg::PutFile { .. })).map_err(|e| {
        e.unwrap_or(DecodeError::Malformed(
            "an upload's pack carries only PUT_FILE frames",
        ))
    })
}

/// Exactly `count` whole frames filling `frames`, each of which `kind` takes (`Err(None)`
/// when one is of another kind).
fn decode_frames(
    count: u16,
    frames: &[u8],
    kind: impl Fn(&Msg) -> bool,
) -> Result<Vec<(Msg, &[u8])>, Option<DecodeError>> {
    let mut out = Vec::with_capacity(usize::from(count));
    let mut rest = frames;
    while !rest.is_empty() {
        if out.len() == usize::from(count) {
            return Err(Some(DecodeError::Malformed(
                "bytes after the last frame of a pack",
            )));
        }
        let head: [u8; 4] = rest
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .ok_or(DecodeError::Truncated)?;
        let n = u32::from_le_bytes(head) as usize;
        let frame = rest.get(..n).ok_or(DecodeError::Truncated)?;
        let (msg, payload) = decode(frame)?;
        if !kind(&msg) {
            return Err(None);
        }
        out.push((msg, payload));
        rest = &rest[n..];
    }
    if out.len() != usize::from(count) {
        return Err(Some(DecodeError::Malformed(
            "fewer frames in a pack than it counts",
        )));
    }
    Ok(out)
}

/// The length of a PUT_FILE frame's header for `path` (its payload follows).
pub fn put_file_header_len(path: &str) -> usize {
    HEADER_LEN + 4 + 4 + 8 + 32 + 2 + path.len()
}

/// Encodes a control frame into a new vector.
pub fn to_vec(msg: &Msg) -> Result<Vec<u8>, EncodeError> {
    let mut v = Vec::new();
    encode(msg, &mut v)?;
    Ok(v)
}

/// Decodes one whole message: the frame, and for BLOCK its payload (empty otherwise). The
/// payload's CRC is not checked here; see [`BlockHeader::crc32c`].
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
    if !Msg::carries_payload(t) && b.len() > MAX_CONTROL {
        return Err(DecodeError::TooLarge);
    }
    if flags & !Msg::flags_allowed(t) != 0 {
        return Err(DecodeError::Malformed("unknown flags"));
    }
    let mut cx = Cx {
        flags,
        ..Cx::default()
    };
    match Msg::decode_body(t, &mut r, &mut cx) {
        // Matched in place rather than mapped, so the frame is not copied on its way out.
        Ok(msg) if r.is_empty() => Ok((msg, cx.payload)),
        Ok(_) => Err(DecodeError::Malformed("bytes after frame")),
        Err(ReadError::UnknownType) => Err(DecodeError::UnknownType(t)),
        Err(e) => Err(e.into()),
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ErrorCode::BadRequest => "bad request",
            ErrorCode::AuthRefused => "authentication refused",
            ErrorCode::NotFound => "not found",
            ErrorCode::PermissionDenied => "permission denied",
            ErrorCode::Integrity => "integrity failure",
            ErrorCode::Io => "I/O error",
            ErrorCode::NoSpace => "no space left",
            ErrorCode::VersionMismatch => "protocol version mismatch",
            ErrorCode::NotADirectory => "not a directory",
            ErrorCode::IsADirectory => "is a directory",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::Unavailable => "unavailable, try again",
            ErrorCode::Unreachable => "destination unreachable",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::Other(n) => return write!(f, "error code {n}"),
        };
        f.write_str(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_round_trip() {
        let h = BlockHeader {
            file_id: 7,
            stream: 0,
            offset: 1 << 40,
            len: 3,
            crc32c: crc32c::crc32c(b"abc"),
            spans: false,
        };
        let mut v = encode_block_header(&h).unwrap().to_vec();
        v.extend_from_slice(b"abc");
        assert_eq!(decode(&v).unwrap(), (Msg::Block(h), &b"abc"[..]));
        // One byte short or long.
        assert!(decode(&v[..v.len() - 1]).is_err());
        v.push(0);
        assert!(decode(&v).is_err());
        // The SPANS flag (1.9) travels in the header's flags byte, sealed or not.
        let spans = BlockHeader { spans: true, ..h };
        let mut v = encode_block_header(&spans).unwrap().to_vec();
        assert_eq!(v[5], BLOCK_SPANS);
        v.extend_from_slice(b"abc");
        assert_eq!(decode(&v).unwrap(), (Msg::Block(spans), &b"abc"[..]));
        let sealed = encode_sealed_block_header(&spans).unwrap();
        assert_eq!(sealed[5], BLOCK_SPANS | BLOCK_SEALED);
        v[5] |= 4;
        assert!(decode(&v).is_err(), "an unknown flag");
    }

    #[test]
    fn limits() {
        let long = "x".repeat(MAX_PATH + 1);
        assert!(to_vec(&Msg::Stat { path: long }).is_err());
        let many = Msg::Entries {
            more: false,
            entries: vec![
                Entry {
                    kind: EntryKind::File,
                    mode: 0,
                    size: 0,
                    mtime: 0,
                    name: "y".repeat(1000),
                };
                100
            ],
        };
        assert_eq!(to_vec(&many), Err(EncodeError::TooLong("control frame")));
    }

    /// One example of every frame (and of each flag-dependent layout), encoded.
    fn golden_frames() -> Vec<(&'static str, Vec<u8>)> {
        let entry = |name: &str| Entry {
            kind: EntryKind::Symlink,
            mode: 0o755,
            size: 0x0102_0304_0506,
            mtime: -5,
            name: name.into(),
        };
        let h = BlockHeader {
            file_id: 9,
            stream: 3,
            offset: 0x1_0000_0001,
            len: 5,
            crc32c: 0xdead_beef,
            spans: false,
        };
        let hash = [0xab; 32];
        let msgs: Vec<(&'static str, Msg)> = vec![
            (
                "hello",
                Msg::Hello {
                    major: 1,
                    minor: 5,
                    block_size: 1 << 20,
                    session: 0x1122_3344_5566_7788,
                    stream: 2,
                    token: "tok".into(),
                },
            ),
            (
                "welcome",
                Msg::Welcome {
                    major: 1,
                    minor: 5,
                    block_size: 4096,
                    session: 42,
                },
            ),
            (
                "error",
                Msg::Error {
                    code: ErrorCode::NoSpace,
                    file_id: 7,
                    message: "disk full".into(),
                },
            ),
            (
                "error_other",
                Msg::Error {
                    code: ErrorCode::Other(999),
                    file_id: 0,
                    message: String::new(),
                },
            ),
            (
                "stat",
                Msg::Stat {
                    path: "root/a".into(),
                },
            ),
            ("entry", Msg::Entry(entry("x"))),
            (
                "list",
                Msg::List {
                    path: String::new(),
                },
            ),
            (
                "entries",
                Msg::Entries {
                    more: true,
                    entries: vec![entry("a"), entry("bc")],
                },
            ),
            (
                "entries_last",
                Msg::Entries {
                    more: false,
                    entries: vec![],
                },
            ),
            (
                "get",
                Msg::Get {
                    file_id: 3,
                    offset: 10,
                    length: u64::MAX,
                    path: "r/f".into(),
                },
            ),
            (
                "put",
                Msg::Put {
                    file_id: 4,
                    flags: PUT_RESUME | PUT_FORCE,
                    mode: 0o644,
                    size: 100,
                    mtime: Some(-1_000_000_007),
                    path: "r/p".into(),
                },
            ),
            (
                "put_plain",
                Msg::Put {
                    file_id: 4,
                    flags: 0,
                    mode: 0o600,
                    size: 0,
                    mtime: None,
                    path: "r/q".into(),
                },
            ),
            (
                "ready",
                Msg::Ready {
                    file_id: 5,
                    size: 1000,
                    mode: 0o640,
                    offset: 512,
                },
            ),
            ("block", Msg::Block(h)),
            (
                "file",
                Msg::File {
                    file_id: 6,
                    mode: 0o644,
                    crc32c: 77,
                    blake3: hash,
                    len: 3,
                },
            ),
            (
                "pack",
                Msg::Pack {
                    count: 2,
                    tag: None,
                    sealed: false,
                    len: 200,
                },
            ),
            (
                "tagged pack",
                Msg::Pack {
                    count: 2,
                    tag: Some([7; 32]),
                    sealed: false,
                    len: 200,
                },
            ),
            (
                "sealed pack",
                Msg::Pack {
                    count: 2,
                    tag: None,
                    sealed: true,
                    len: 224,
                },
            ),
            (
                "put_file",
                Msg::PutFile {
                    flags: PUT_FILE_FORCE,
                    file_id: 8,
                    mode: 0o600,
                    mtime: 123_456_789,
                    blake3: hash,
                    path: "r/s".into(),
                    len: 4,
                },
            ),
            (
                "file_done",
                Msg::FileDone {
                    file_id: 9,
                    length: 4096,
                    blake3: Some(hash),
                },
            ),
            (
                "file_done_nohash",
                Msg::FileDone {
                    file_id: 9,
                    length: 4096,
                    blake3: None,
                },
            ),
            (
                "resend",
                Msg::Resend {
                    file_id: 10,
                    ranges: vec![(0, 4096), (1 << 33, 7)],
                },
            ),
            ("ok", Msg::Ok { file_id: 11 }),
            (
                "oks",
                Msg::Oks {
                    file_id: 12,
                    count: 3,
                },
            ),
            (
                "mkdir",
                Msg::Mkdir {
                    mode: 0o700,
                    path: "r/d".into(),
                },
            ),
            (
                "gets",
                Msg::Gets {
                    files: vec![(1, "r/a".into()), (2, "r/bb".into())],
                },
            ),
            ("sum", Msg::Sum { path: "r/h".into() }),
            ("remove", Msg::Remove { path: "r/x".into() }),
            ("copies", Msg::Copies),
            (
                "copy",
                Msg::Copy {
                    id: 1,
                    done: 2,
                    total: 3,
                    secs: 4,
                    path: "r/a".into(),
                    dest: "h:1".into(),
                    dest_path: "d".into(),
                },
            ),
            ("abort_copy", Msg::AbortCopy { id: 7 }),
            ("protect", Msg::Protect { level: 1 }),
            (
                "sum_reply",
                Msg::SumReply {
                    size: 12,
                    blake3: hash,
                },
            ),
            ("bye", Msg::Bye),
            (
                "send_to",
                Msg::SendTo {
                    flags: SEND_RECURSIVE,
                    file_id: 12,
                    path: "r/src".into(),
                    dest: "tcp://h:1".into(),
                    dest_path: "d/x".into(),
                    token: "t".into(),
                    streams: 1,
                    follow: false,
                    patterns: None,
                    only: None,
                    grant: None,
                },
            ),
            (
                "send_to_streams",
                Msg::SendTo {
                    flags: 0,
                    file_id: 12,
                    path: "a".into(),
                    dest: "b".into(),
                    dest_path: "c".into(),
                    token: String::new(),
                    streams: 4,
                    follow: false,
                    patterns: None,
                    only: None,
                    grant: None,
                },
            ),
            (
                "send_to_filter",
                Msg::SendTo {
                    flags: SEND_RECURSIVE,
                    file_id: 3,
                    path: "a".into(),
                    dest: "b".into(),
                    dest_path: "c".into(),
                    token: String::new(),
                    streams: 1,
                    follow: true,
                    patterns: Some((vec!["*.h5".into()], vec!["*.tmp".into(), "x/".into()])),
                    only: Some(vec!["d/e".into()]),
                    grant: None,
                },
            ),
            (
                "send_to_grant",
                Msg::SendTo {
                    flags: 0,
                    file_id: 12,
                    path: "a".into(),
                    dest: "b".into(),
                    dest_path: "c".into(),
                    token: String::new(),
                    streams: 2,
                    grant: Some([0xcd; 32]),
                    follow: false,
                    patterns: None,
                    only: None,
                },
            ),
            (
                "grant",
                Msg::Grant {
                    flags: GRANT_TREE,
                    ttl_secs: 60,
                    path: "d/x".into(),
                },
            ),
            (
                "granted",
                Msg::Granted {
                    id: 0x0102_0304_0506_0708,
                    secret: [0xef; 32],
                    ttl_secs: 60,
                },
            ),
            (
                "progress",
                Msg::Progress {
                    file_id: 13,
                    done: 5,
                    total: 10,
                },
            ),
            (
                "copied",
                Msg::Copied {
                    file_id: 14,
                    files: 2,
                    bytes: 3,
                    blocks_resent: 4,
                    skipped: 0,
                },
            ),
            (
                "copied_skipped",
                Msg::Copied {
                    file_id: 14,
                    files: 2,
                    bytes: 3,
                    blocks_resent: 4,
                    skipped: 5,
                },
            ),
            (
                "open",
                Msg::Open {
                    flags: OPEN_RESUME | OPEN_FORCE,
                    file_id: 15,
                    mode: 0o644,
                    size: 1 << 40,
                    mtime: -3,
                    path: "r/o".into(),
                },
            ),
            (
                "have",
                Msg::Have {
                    file_id: 16,
                    ranges: vec![(0, 10), (20, 30)],
                },
            ),
            (
                "put_range",
                Msg::PutRange {
                    file_id: 17,
                    offset: 4096,
                    length: 8192,
                },
            ),
            (
                "close",
                Msg::Close {
                    file_id: 18,
                    length: 99,
                    blake3: Some(hash),
                },
            ),
            (
                "close_nohash",
                Msg::Close {
                    file_id: 18,
                    length: 0,
                    blake3: None,
                },
            ),
        ];
        msgs.into_iter()
            .map(|(name, m)| (name, to_vec(&m).expect("golden frames encode")))
            .collect()
    }

    /// The bytes each frame had before the codec was generated from a table: the wire must
    /// not change.
    #[test]
    fn golden_bytes() {
        let got: Vec<(&str, String)> = golden_frames()
            .into_iter()
            .map(|(n, b)| (n, ferry_wire::bench::to_hex(&b)))
            .collect();
        assert_eq!(got.len(), GOLDEN.len(), "golden table out of date");
        for ((n, h), (gn, gh)) in got.iter().zip(GOLDEN) {
            assert_eq!(
                (*n, h.as_str()),
                (*gn, *gh),
                "frame {n} changed on the wire"
            );
        }
    }

    const GOLDEN: &[(&str, &str)] = &[
("hello", "1f000000010000000100050000001000887766554433221102000300746f6b"),
("welcome", "180000000200000001000500001000002a00000000000000"),
("error", "190000000300000007000700000009006469736b2066756c6c"),
("error_other", "1000000003000000e703000000000000"),
("stat", "10000000040000000600726f6f742f61"),
("entry", "200000000500000002ed0100000605040302010000fbffffffffffffff010078"),
("list", "0a000000060000000000"),
("entries", "3b00000007010000020002ed0100000605040302010000fbffffffffffffff01006102ed0100000605040302010000fbffffffffffffff02006263"),
("entries_last", "0a000000070000000000"),
("get", "2100000008000000030000000a00000000000000ffffffffffffffff0300722f66"),
("put", "250000000907000004000000a40100006400000000000000f93565c4ffffffff0300722f70"),
("put_plain", "1d00000009000000040000008001000000000000000000000300722f71"),
("ready", "200000000a00000005000000e803000000000000a00100000002000000000000"),
("block", "250000000b0000000900000003000000010000000100000005000000efbeadde"),
("file", "370000001700000006000000a40100004d000000abababababababababababababababababababababababababababababababab"),
("pack", "d40000001900000002000000"),
("tagged pack", "f400000019010000020000000707070707070707070707070707070707070707070707070707070707070707"),
("sealed pack", "ec0000001902000002000000"),
("put_file", "410000001a010000080000008001000015cd5b0700000000abababababababababababababababababababababababababababababababab0300722f73"),
("file_done", "340000000c010000090000000010000000000000abababababababababababababababababababababababababababababababab"),
("file_done_nohash", "340000000c0000000900000000100000000000000000000000000000000000000000000000000000000000000000000000000000"),
("resend", "260000000d0000000a0000000200000000000000000000100000000000000200000007000000"),
("ok", "0c0000000e0000000b000000"),
("oks", "100000001b0000000c00000003000000"),
("mkdir", "110000000f000000c00100000300722f64"),
("gets", "1d000000180000000200010000000300722f61020000000400722f6262"),
("sum", "0d000000100000000300722f68"),
("remove", "0d000000230000000300722f78"),
("copies", "0800000025000000"),
("copy", "3100000026000000010000000000000002000000000000000300000000000000040000000300722f610300683a31010064"),
("abort_copy", "10000000270000000700000000000000"),
("protect", "090000002400000001"),
("sum_reply", "30000000110000000c00000000000000abababababababababababababababababababababababababababababababab"),
("bye", "0800000012000000"),
("send_to", "26000000200100000c0000000500722f73726309007463703a2f2f683a310300642f78010074"),
("send_to_streams", "19000000200200000c00000001006101006201006300000400"),
("send_to_filter", "3300000020390000030000000100610100620100630000010004002a2e6835020005002a2e746d700200782f01000300642f65"),
("send_to_grant", "39000000200600000c00000001006101006201006300000200cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"),
("grant", "11000000280100003c0000000300642f78"),
("granted", "34000000290000000807060504030201efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef3c000000"),
("progress", "1c000000210000000d00000005000000000000000a00000000000000"),
("copied", "24000000220000000e000000020000000000000003000000000000000400000000000000"),
("copied_skipped", "2c000000220100000e0000000200000000000000030000000000000004000000000000000500000000000000"),
("open", "25000000130300000f000000a40100000000000000010000fdffffffffffffff0300722f6f"),
("have", "2e0000001400000010000000020000000000000000000a0000000000000014000000000000001e00000000000000"),
("put_range", "1c000000150000001100000000100000000000000020000000000000"),
("close", "3400000016010000120000006300000000000000abababababababababababababababababababababababababababababababab"),
("close_nohash", "34000000160000001200000000000000000000000000000000000000000000000000000000000000000000000000000000000000"),
    ];

    /// Every frame's length lies within the bounds the table derives, and the fixed header
    /// lengths the rest of the crate uses agree with the table.
    #[test]
    fn lengths_within_table_bounds() {
        for (name, b) in golden_frames() {
            let t = b[4];
            let (min, max) = Msg::body_bounds(t).expect("a known type");
            let body = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize - HEADER_LEN;
            assert!(
                (min..=max).contains(&body),
                "{name}: {body} not in {min}..={max}"
            );
        }
        let fixed = |m: Msg| Msg::body_bounds(m.code()).unwrap().0 + HEADER_LEN;
        let h = BlockHeader {
            file_id: 0,
            stream: 0,
            offset: 0,
            len: 0,
            crc32c: 0,
            spans: false,
        };
        assert_eq!(fixed(Msg::Block(h)), BLOCK_HEADER_LEN);
        let file = Msg::File {
            file_id: 0,
            mode: 0,
            crc32c: 0,
            blake3: [0; 32],
            len: 0,
        };
        assert_eq!(fixed(file), FILE_HEADER_LEN);
        assert_eq!(
            fixed(Msg::Pack {
                count: 1,
                tag: None,
                sealed: false,
                len: 0
            }),
            PACK_HEADER_LEN
        );
        assert_eq!(Msg::CODES.len(), 37, "every frame type has a row");
    }

    /// Decoding speed of the golden frames (a quick A/B for codec changes):
    /// `cargo test --release -p ferry-xfer --lib decode_speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing; run in release with --ignored"]
    fn decode_speed() {
        let frames: Vec<Vec<u8>> = golden_frames()
            .into_iter()
            .map(|(_, mut b)| {
                // Frames with a payload: append it, so each decodes whole.
                let total = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
                b.resize(total, 0);
                b
            })
            .collect();
        let rounds = 200_000;
        let ns = ferry_wire::bench::ns_per_decode(&frames, rounds, |f| decode(f).is_ok());
        println!("xfer decode: {ns:.1} ns/frame");
        if std::env::var_os("FERRY_DECODE_EACH").is_some() {
            for (f, (name, _)) in frames.iter().zip(golden_frames()) {
                let ns = ferry_wire::bench::ns_per_decode(std::slice::from_ref(f), rounds, |f| {
                    decode(f).is_ok()
                });
                println!("  {name}: {ns:.1} ns");
            }
        }
    }
}
