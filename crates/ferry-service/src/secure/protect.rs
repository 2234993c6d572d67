//! Data protection levels: what guards a connection's data blocks, agreed on its sealed
//! control channel (protocol 1.9, `docs/protocol.md`, "Data protection"; `docs/security.md`).
//!
//! - [`Level::Clear`]: each block carries a CRC-32C. It catches a damaged block, not an
//!   attacker, who recomputes it; only when both sides allow it explicitly.
//! - [`Level::Integrity`] (the default): each block carries a tag keyed by a session key
//!   that only the two ends know (the TLS exporter under [`DATA_LABEL`], one key per
//!   direction), so a byte changed on the path fails the block's check: the receiver
//!   re-fetches it, as it does a block whose CRC failed, and never writes it.
//! - [`Level::Private`]: each block is encrypted and authenticated with AES-256-GCM under
//!   a key per direction (the TLS exporter under [`PRIVATE_LABEL`]), in place in its
//!   staging block whether it then travels as a message or by RMA, and opened in place in
//!   the receiver's buffer; a block that fails to open is re-fetched, never written
//!   ([`BlockCheck::seal`], [`BlockCheck::open`]).
//!
//! The tag is [`tag`]: the first four bytes of BLAKE3 keyed by the session key over the
//! block's transfer, offset, length and a 32-byte digest of its bytes. It takes the
//! CRC-32C's four header bytes, so the frame keeps its length and its payload's alignment,
//! and the CRC goes (the tag catches everything it did). Four bytes are a forgery chance of
//! 2⁻³² per altered block, each attempt costing the attacker a re-fetch the receiver logs;
//! the whole-file BLAKE3, which travels sealed in FILE_DONE, is the backstop: a file is
//! committed only if it matches, so a forged block that passed its tag still fails the
//! copy.
//!
//! The digest comes in two kinds, and the BLOCK header's `TREE` flag says which:
//! - a block of a file (the sender reads a file and both ends hash it whole) is digested by
//!   its [`BlockSpans`]: the chaining values of the aligned subtrees of the file's BLAKE3
//!   tree it holds, which the file's [`crate::tree::BlockTree`] takes as they are. The bytes
//!   are hashed once per side for the tag and the whole-file hash together;
//! - any other block (a zero source's) by the plain BLAKE3 of its bytes
//!   ([`BlockCheck::digest`]), which does not depend on the block's place, so a zero source
//!   computes it once per block length, as it did its CRC.
//!
//! The flag travels outside the tag; flipping it only makes the receiver read the other
//! digest, which fails (the spans' digest is derived under its own context and never equals
//! a plain hash), so the block is re-fetched, as with any change on the path.
//!
//! Measured on this project's 2-core machine (AVX-512, VAES; one core's CPU time, 4 MiB
//! blocks, `ferry bench cp`'s `check_rates`, `docs/security.md`, "Cost"): CRC-32C 27 GB/s,
//! this tag 6.25 GB/s, AES-256-GCM seal 8.6 / open 9.3. So on a block with no file hash
//! (memory mode) integrity costs about four times the CRC per byte on each side; on a file
//! transfer it costs nothing beyond the whole-file hash, which clear transfers compute too.

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};

use crate::error::{Error, Kind, Result};
use crate::tree::BlockSpans;

/// The label of the TLS exporter value the data keys derive from (RFC 8446 7.5); the
/// context is the direction ([`Direction`]).
pub const DATA_LABEL: &[u8] = b"EXPORTER-ferry-data-integrity";

/// The label of the exporter value the `private` level's AES-256-GCM keys derive from (a
/// key of its own, never the integrity key); the context is the direction.
pub const PRIVATE_LABEL: &[u8] = b"EXPORTER-ferry-data-private";

/// The bytes a `private` block carries after its ciphertext: the 16-byte AES-GCM tag, then
/// the 8-byte sequence number its nonce was made from (little-endian).
pub const SEAL_TRAILER: usize = AEAD_TAG + 8;

/// The AES-GCM tag's length.
const AEAD_TAG: usize = 16;

/// How a connection's data blocks are protected, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// CRC-32C per block: damage, not attackers.
    Clear,
    /// A keyed tag per block (the default).
    Integrity,
    /// Encrypted and authenticated blocks (AES-256-GCM).
    Private,
}

impl Level {
    /// Its name on the command line, in configuration and on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Level::Clear => "clear",
            Level::Integrity => "integrity",
            Level::Private => "private",
        }
    }

    /// Its code in a PROTECT frame.
    pub fn code(self) -> u8 {
        match self {
            Level::Clear => 0,
            Level::Integrity => 1,
            Level::Private => 2,
        }
    }

    /// The level of a PROTECT code, if known.
    pub fn from_code(code: u8) -> Option<Level> {
        [Level::Clear, Level::Integrity, Level::Private]
            .into_iter()
            .find(|l| l.code() == code)
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Level {
    type Err = Error;
    fn from_str(s: &str) -> Result<Level> {
        match s {
            "clear" => Ok(Level::Clear),
            "integrity" => Ok(Level::Integrity),
            "private" => Ok(Level::Private),
            _ => Err(Error::new(
                Kind::Usage,
                format!("unknown protection level {s:?} (clear, integrity or private)"),
            )),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Level {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Level, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|e: Error| serde::de::Error::custom(e.msg))
    }
}

/// The levels a server allows when its configuration names none.
pub const DEFAULT_ALLOWED: &[Level] = &[Level::Integrity];

/// Checks a server's allowed levels: not empty, each one built.
pub fn check_allowed(levels: &[Level]) -> Result<()> {
    if levels.is_empty() {
        return Err(Error::new(
            Kind::Usage,
            "[security] protection lists no level: name at least one of clear, integrity, private",
        ));
    }
    Ok(())
}

/// Which way a block travels, the context of its key's exporter value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client to the server (uploads).
    ToServer,
    /// From the server to the client (downloads).
    ToClient,
}

/// A block's check value: CRC-32C, or the keyed tag of a session; or, at `private`, the
/// block's encryption, which checks it too.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub enum BlockCheck {
    /// CRC-32C of the bytes (clear data, and frames that carry their own check).
    #[default]
    Crc,
    /// The tag keyed by one direction's session key ([`tag`]).
    Tag([u8; 32]),
    /// AES-256-GCM under one direction's `private` key ([`BlockCheck::seal`]): the block's
    /// check value field is 0 and its bytes are followed by [`SEAL_TRAILER`] bytes.
    Seal([u8; 32]),
}

impl fmt::Debug for BlockCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key is a secret: never printed.
        f.write_str(match self {
            BlockCheck::Crc => "Crc",
            BlockCheck::Tag(_) => "Tag(..)",
            BlockCheck::Seal(_) => "Seal(..)",
        })
    }
}

/// The part of a block's check that reads its bytes (the expensive part, the same for
/// equal bytes wherever they lie).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockDigest {
    /// CRC-32C of the bytes: the whole check.
    Crc(u32),
    /// BLAKE3 of the bytes, keyed with the block's place by [`BlockCheck::value`].
    Hash([u8; 32]),
}

impl BlockCheck {
    /// The key of `dir` for a session whose exporter gives `export(label, context)`.
    pub fn keyed(key: [u8; 32]) -> BlockCheck {
        BlockCheck::Tag(key)
    }

    /// The session key of a keyed check ([`BlockCheck::Tag`]), for tags of other frames
    /// than blocks (a face's own, with its own domain separation); `None` otherwise.
    pub fn tag_key(&self) -> Option<&[u8; 32]> {
        match self {
            BlockCheck::Tag(key) => Some(key),
            _ => None,
        }
    }

    /// Reads the bytes of a block (a sealed block has no digest: its seal checks it, and
    /// this one fails every check).
    pub fn digest(&self, bytes: &[u8]) -> BlockDigest {
        match self {
            BlockCheck::Crc => BlockDigest::Crc(crc32c::crc32c(bytes)),
            BlockCheck::Tag(_) => BlockDigest::Hash(*blake3::hash(bytes).as_bytes()),
            BlockCheck::Seal(_) => BlockDigest::Crc(!crc32c::crc32c(bytes)),
        }
    }

    /// The check value of a block of `transfer` at `offset`, `len` bytes, whose bytes
    /// gave `digest`.
    pub fn value(&self, digest: &BlockDigest, transfer: u32, offset: u64, len: u32) -> u32 {
        match (self, digest) {
            (BlockCheck::Crc, BlockDigest::Crc(c)) => *c,
            (BlockCheck::Tag(key), BlockDigest::Hash(h)) => tag(key, transfer, offset, len, h),
            // A digest of the other kind: recomputing is the caller's bug, and this value
            // fails every check rather than passing one.
            (BlockCheck::Crc, BlockDigest::Hash(h)) => {
                !u32::from_le_bytes([h[0], h[1], h[2], h[3]])
            }
            (BlockCheck::Tag(_), BlockDigest::Crc(c)) => !c,
            // Sealed blocks are checked by opening them, never by a value.
            (BlockCheck::Seal(_), BlockDigest::Crc(c)) => !c,
            (BlockCheck::Seal(_), BlockDigest::Hash(h)) => {
                !u32::from_le_bytes([h[0], h[1], h[2], h[3]])
            }
        }
    }

    /// The check value of a block's `bytes`.
    pub fn compute(&self, transfer: u32, offset: u64, bytes: &[u8]) -> u32 {
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        self.value(&self.digest(bytes), transfer, offset, len)
    }

    /// Whether `value` is the check value of `bytes` as a block of `transfer` at `offset`
    /// (never, for a sealed block: [`BlockCheck::open`] checks those).
    pub fn verify(&self, transfer: u32, offset: u64, bytes: &[u8], value: u32) -> bool {
        !self.seals() && self.compute(transfer, offset, bytes) == value
    }

    /// Whether blocks are encrypted (`private`): sealed by [`BlockCheck::seal`] and opened
    /// by [`BlockCheck::open`] instead of carrying a check value.
    pub fn seals(&self) -> bool {
        matches!(self, BlockCheck::Seal(_))
    }

    /// The bytes a block carries after its data on the wire: [`SEAL_TRAILER`] when sealed.
    pub fn trailer(&self) -> usize {
        if self.seals() {
            SEAL_TRAILER
        } else {
            0
        }
    }

    /// Encrypts a block of `transfer` at `offset` in place: `buf` holds its bytes followed
    /// by [`SEAL_TRAILER`] bytes of room, which receive the tag and the nonce's sequence
    /// number. The associated data is the block's transfer, offset and length, so a block
    /// moved elsewhere fails to open.
    ///
    /// The nonce is the next value of a 64-bit counter shared by every sealing in this
    /// process, so it never repeats under one key: each direction's key is a connection's
    /// own (its TLS exporter), only one process seals with it (the sending side), and every
    /// seal, a re-sent block's included, takes a value no seal took before.
    pub fn seal(&self, transfer: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        let n = buf.len().saturating_sub(SEAL_TRAILER);
        self.seal_with(block_aad(transfer, offset, n).as_ref(), buf)
    }

    /// Decrypts a sealed block of `transfer` at `offset`, `len` bytes, in place: `wire` is
    /// its ciphertext and [`SEAL_TRAILER`]. Its plaintext, or `None` if it does not open
    /// (changed on the path, moved, cut, or not sealed at all): never data then.
    pub fn open<'a>(
        &self,
        transfer: u32,
        offset: u64,
        len: u32,
        wire: &'a mut [u8],
    ) -> Option<&'a [u8]> {
        let n = usize::try_from(len).ok()?;
        if wire.len() != n.checked_add(SEAL_TRAILER)? {
            return None;
        }
        self.open_with(block_aad(transfer, offset, n).as_ref(), wire)
    }

    /// Encrypts, as [`BlockCheck::seal`] does a block, a face's own frames in place, bound
    /// to `context` (their place, with the face's own domain separation: at least
    /// [`MIN_CONTEXT`] bytes, so it never reads as a block's 16).
    pub fn seal_frames(&self, context: &[u8], buf: &mut [u8]) -> Result<()> {
        if context.len() < MIN_CONTEXT {
            return Err(Error::conn("internal: a seal's context is too short"));
        }
        self.seal_with(context, buf)
    }

    /// Decrypts what [`BlockCheck::seal_frames`] sealed with `context` in place; `None` if it
    /// does not open.
    pub fn open_frames<'a>(&self, context: &[u8], wire: &'a mut [u8]) -> Option<&'a [u8]> {
        if context.len() < MIN_CONTEXT {
            return None;
        }
        self.open_with(context, wire)
    }

    /// [`BlockCheck::seal`] with associated data `aad`.
    fn seal_with(&self, aad: &[u8], buf: &mut [u8]) -> Result<()> {
        let BlockCheck::Seal(key) = self else {
            return Err(Error::conn(
                "internal: sealing on a connection without private keys",
            ));
        };
        let n = buf
            .len()
            .checked_sub(SEAL_TRAILER)
            .ok_or_else(|| Error::conn("internal: no room for a seal"))?;
        let seq = SEALED.fetch_add(1, Ordering::Relaxed);
        if seq == u64::MAX {
            return Err(Error::conn("internal: seal nonces exhausted"));
        }
        let (data, trailer) = buf.split_at_mut(n);
        let tag = with_aead(key, |k| {
            k.seal_in_place_separate_tag(nonce(seq), Aad::from(aad), data)
        })
        .map_err(|_| Error::conn("internal: encryption failed"))?;
        trailer[..AEAD_TAG].copy_from_slice(tag.as_ref());
        trailer[AEAD_TAG..].copy_from_slice(&seq.to_le_bytes());
        Ok(())
    }

    /// [`BlockCheck::open`] of `wire` (ciphertext and trailer) with associated data `aad`.
    fn open_with<'a>(&self, aad: &[u8], wire: &'a mut [u8]) -> Option<&'a [u8]> {
        let BlockCheck::Seal(key) = self else {
            return None;
        };
        let n = wire.len().checked_sub(SEAL_TRAILER)?;
        let (sealed, seq) = wire.split_at_mut(n + AEAD_TAG);
        let seq = u64::from_le_bytes(seq.try_into().ok()?);
        let plain = with_aead(key, |k| k.open_in_place(nonce(seq), Aad::from(aad), sealed)).ok()?;
        Some(&*plain)
    }

    /// Whether this check reads a file's blocks by their [`BlockSpans`] when the sender
    /// flags them so (the integrity tag; a CRC or a seal reads the bytes themselves).
    pub fn reads_spans(&self) -> bool {
        matches!(self, BlockCheck::Tag(_))
    }

    /// The tag of a block of `transfer` at `offset`, `len` bytes, whose bytes gave `spans`;
    /// for a check that does not read spans ([`BlockCheck::reads_spans`]), a value that no
    /// receiver accepts as such.
    pub fn spans_value(&self, spans: &BlockSpans, transfer: u32, offset: u64, len: u32) -> u32 {
        self.value(&BlockDigest::Hash(spans.digest()), transfer, offset, len)
    }

    /// Whether `value` is the tag of a block of `transfer` at `offset` whose bytes gave
    /// `spans` (never, for a check that does not read spans).
    pub fn verify_spans(&self, transfer: u32, offset: u64, spans: &BlockSpans, value: u32) -> bool {
        self.reads_spans() && self.spans_value(spans, transfer, offset, spans.block_len()) == value
    }

    /// Whether `digest` is of the kind this check reads (a cached digest of another kind is
    /// computed again).
    pub fn reads_as(&self, digest: &BlockDigest) -> bool {
        matches!(
            (self, digest),
            (BlockCheck::Crc, BlockDigest::Crc(_)) | (BlockCheck::Tag(_), BlockDigest::Hash(_))
        )
    }

    /// What a failed check says.
    pub fn failure(&self) -> &'static str {
        match self {
            BlockCheck::Crc => "block CRC mismatch; it will be sent again",
            BlockCheck::Tag(_) => {
                "block integrity tag mismatch (changed on the path?); it will be sent again"
            }
            BlockCheck::Seal(_) => {
                "private block failed to open (changed on the path?); it will be sent again"
            }
        }
    }
}

/// The sequence numbers of this process's block nonces ([`BlockCheck::seal`]).
static SEALED: AtomicU64 = AtomicU64::new(0);

/// A block's 96-bit nonce: its 64-bit sequence number, little-endian, then four zeros.
fn nonce(seq: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&seq.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

/// A block's associated data: its transfer, offset and length, little-endian.
fn block_aad(transfer: u32, offset: u64, len: usize) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[..4].copy_from_slice(&transfer.to_le_bytes());
    a[4..12].copy_from_slice(&offset.to_le_bytes());
    // A block is at most MAX_BLOCK bytes; a length past u32 cannot be one.
    a[12..].copy_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
    a
}

/// The shortest context of [`BlockCheck::seal_frames`]: longer than a block's associated
/// data, so no sealed frame opens as a block or the other way round.
pub const MIN_CONTEXT: usize = 17;

/// Runs `f` with the AES-256-GCM key of `key`, expanded once per thread and key (a
/// thread seals or opens one connection's blocks in a row).
fn with_aead<R>(
    key: &[u8; 32],
    f: impl FnOnce(&LessSafeKey) -> std::result::Result<R, ring::error::Unspecified>,
) -> std::result::Result<R, ring::error::Unspecified> {
    thread_local! {
        static KEY: RefCell<Option<([u8; 32], LessSafeKey)>> = const { RefCell::new(None) };
    }
    KEY.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.as_ref().is_none_or(|(k, _)| k != key) {
            let unbound = UnboundKey::new(&AES_256_GCM, key)?;
            *cached = Some((*key, LessSafeKey::new(unbound)));
        }
        match cached.as_ref() {
            Some((_, k)) => f(k),
            None => Err(ring::error::Unspecified),
        }
    })
}

/// A block's integrity tag: the first four bytes of BLAKE3 keyed by `key` over the
/// block's place (`transfer`, `offset`, `len`, little-endian) and the BLAKE3 of its bytes.
pub fn tag(key: &[u8; 32], transfer: u32, offset: u64, len: u32, hash: &[u8; 32]) -> u32 {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(&transfer.to_le_bytes());
    h.update(&offset.to_le_bytes());
    h.update(&len.to_le_bytes());
    h.update(hash);
    let out = h.finalize();
    let b = out.as_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// What a connection agreed: its level and each direction's check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protection {
    /// The agreed level.
    pub level: Level,
    /// The check of the blocks this side sends.
    pub send: BlockCheck,
    /// The check of the blocks this side receives.
    pub recv: BlockCheck,
}

impl Default for Protection {
    /// A clear connection's: CRC-32C both ways.
    fn default() -> Self {
        Protection {
            level: Level::Clear,
            send: BlockCheck::Crc,
            recv: BlockCheck::Crc,
        }
    }
}

impl Protection {
    /// `level` on a session whose exporter values `export(label, context)` gives; `server`
    /// says which side this is.
    pub fn new(
        level: Level,
        server: bool,
        export: impl Fn(&[u8], &[u8]) -> Result<[u8; 32]>,
    ) -> Result<Protection> {
        if level == Level::Clear {
            return Ok(Protection::default());
        }
        let key = |d: Direction| -> Result<BlockCheck> {
            let ctx = [d as u8];
            Ok(match level {
                Level::Private => BlockCheck::Seal(export(PRIVATE_LABEL, &ctx)?),
                _ => BlockCheck::keyed(export(DATA_LABEL, &ctx)?),
            })
        };
        let (send, recv) = if server {
            (Direction::ToClient, Direction::ToServer)
        } else {
            (Direction::ToServer, Direction::ToClient)
        };
        Ok(Protection {
            level,
            send: key(send)?,
            recv: key(recv)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(level: Level) -> (Protection, Protection) {
        // Both ends of one session see the same exporter values.
        let export = |label: &[u8], ctx: &[u8]| -> Result<[u8; 32]> {
            let mut h = blake3::Hasher::new();
            h.update(label);
            h.update(ctx);
            Ok(*h.finalize().as_bytes())
        };
        (
            Protection::new(level, false, export).unwrap(),
            Protection::new(level, true, export).unwrap(),
        )
    }

    #[test]
    fn a_tag_checks_the_bytes_and_their_place() {
        let (client, server) = pair(Level::Integrity);
        let data = vec![7u8; 5000];
        let v = client.send.compute(3, 4096, &data);
        assert!(server.recv.verify(3, 4096, &data, v));
        let mut changed = data.clone();
        changed[4999] ^= 1;
        assert!(!server.recv.verify(3, 4096, &changed, v), "a changed byte");
        assert!(!server.recv.verify(3, 8192, &data, v), "another offset");
        assert!(!server.recv.verify(4, 4096, &data, v), "another transfer");
        assert!(!server.recv.verify(3, 4096, &data[..4999], v), "cut short");
        // Each direction has its own key: a block cannot be reflected back.
        assert!(!client.recv.verify(3, 4096, &data, v));
        // An attacker's CRC is not the tag.
        assert!(!server.recv.verify(3, 4096, &data, crc32c::crc32c(&data)));
    }

    /// A file block's tag (by its spans) checks its bytes, its offset and its transfer, and
    /// is never the tag of the plain digest of the same bytes.
    #[test]
    fn a_spans_tag_checks_the_bytes_and_their_place() {
        let (client, server) = pair(Level::Integrity);
        let size = 5 << 20;
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253) as u8).collect();
        let spans = |o: u64, d: &[u8]| BlockSpans::of(o, d, size).unwrap();
        let v = client
            .send
            .spans_value(&spans(1 << 20, &data), 3, 1 << 20, 1 << 20);
        assert!(server
            .recv
            .verify_spans(3, 1 << 20, &spans(1 << 20, &data), v));
        let mut changed = data.clone();
        changed[12_345] ^= 1;
        assert!(!server
            .recv
            .verify_spans(3, 1 << 20, &spans(1 << 20, &changed), v));
        assert!(
            !server
                .recv
                .verify_spans(3, 2 << 20, &spans(2 << 20, &data), v),
            "another offset"
        );
        assert!(!server
            .recv
            .verify_spans(4, 1 << 20, &spans(1 << 20, &data), v));
        assert!(!client
            .recv
            .verify_spans(3, 1 << 20, &spans(1 << 20, &data), v));
        assert!(
            !server.recv.verify(3, 1 << 20, &data, v),
            "the plain digest"
        );
        let (clear, _) = pair(Level::Clear);
        assert!(!clear
            .recv
            .verify_spans(3, 1 << 20, &spans(1 << 20, &data), v));
    }

    #[test]
    fn clear_is_crc_and_every_level_is_offered() {
        let (c, s) = pair(Level::Clear);
        assert_eq!(c.send, BlockCheck::Crc);
        assert_eq!(s.recv.compute(1, 0, b"abc"), crc32c::crc32c(b"abc"));
        assert!(check_allowed(&[Level::Private]).is_ok());
        assert!(check_allowed(&[]).is_err());
        assert!(check_allowed(DEFAULT_ALLOWED).is_ok());
    }

    /// A private block opens only as sealed: its bytes, its place and its direction; its
    /// ciphertext shows none of its bytes, and no two seals share a nonce.
    #[test]
    fn a_sealed_block_opens_only_where_it_was_sealed() {
        let (client, server) = pair(Level::Private);
        assert!(client.send.seals() && server.recv.seals());
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let seal = |d: &[u8]| {
            let mut wire = d.to_vec();
            wire.resize(d.len() + SEAL_TRAILER, 0);
            client.send.seal(3, 4096, &mut wire).unwrap();
            wire
        };
        let wire = seal(&data);
        assert!(!wire.windows(64).any(|w| data.windows(64).any(|d| d == w)));
        let open = |check: &BlockCheck, t: u32, o: u64, len: u32, w: &[u8]| {
            let mut w = w.to_vec();
            check.open(t, o, len, &mut w).map(<[u8]>::to_vec)
        };
        assert_eq!(open(&server.recv, 3, 4096, 5000, &wire), Some(data.clone()));
        let mut flipped = wire.clone();
        flipped[17] ^= 1;
        assert_eq!(
            open(&server.recv, 3, 4096, 5000, &flipped),
            None,
            "a changed byte"
        );
        let mut seq = wire.clone();
        seq[5000 + 16] ^= 1;
        assert_eq!(
            open(&server.recv, 3, 4096, 5000, &seq),
            None,
            "another nonce"
        );
        assert_eq!(
            open(&server.recv, 3, 8192, 5000, &wire),
            None,
            "another offset"
        );
        assert_eq!(
            open(&server.recv, 4, 4096, 5000, &wire),
            None,
            "another transfer"
        );
        assert_eq!(
            open(&server.recv, 3, 4096, 4999, &wire[1..]),
            None,
            "cut short"
        );
        assert_eq!(open(&client.recv, 3, 4096, 5000, &wire), None, "reflected");
        assert_eq!(open(&server.recv, 3, 4096, 5000, &data), None, "not sealed");
        // The same block sealed again (a re-fetch) takes a new nonce.
        let again = seal(&data);
        assert_ne!(again[5000 + 16..], wire[5000 + 16..]);
        assert_ne!(again[..5000], wire[..5000]);
        assert!(
            !server.recv.verify(3, 4096, &data, 0),
            "no check value passes"
        );
    }

    #[test]
    fn levels_parse_and_order() {
        for l in [Level::Clear, Level::Integrity, Level::Private] {
            assert_eq!(l.name().parse::<Level>().unwrap(), l);
            assert_eq!(Level::from_code(l.code()), Some(l));
        }
        assert!("none".parse::<Level>().is_err());
        assert_eq!(Level::from_code(9), None);
        assert!(Level::Clear < Level::Integrity && Level::Integrity < Level::Private);
        assert_eq!(format!("{:?}", BlockCheck::Tag([1; 32])), "Tag(..)");
        assert_eq!(format!("{:?}", BlockCheck::Seal([1; 32])), "Seal(..)");
    }

    #[test]
    fn frames_sealed_in_place_open_only_in_their_context_and_never_as_a_block() {
        let check = BlockCheck::Seal([4; 32]);
        let context = [7u8; MIN_CONTEXT + 9];
        let plain = b"two FILE frames".to_vec();
        let mut wire = plain.clone();
        wire.resize(plain.len() + SEAL_TRAILER, 0);
        check.seal_frames(&context, &mut wire).unwrap();
        assert_ne!(&wire[..plain.len()], &plain[..]);
        assert!(check
            .open_frames(&[8u8; MIN_CONTEXT + 9], &mut wire.clone())
            .is_none());
        assert!(check
            .open(0, 0, plain.len() as u32, &mut wire.clone())
            .is_none());
        assert_eq!(check.open_frames(&context, &mut wire).unwrap(), &plain[..]);
        // A block sealed never opens as frames, and a short context is refused outright.
        let mut block = plain.clone();
        block.resize(plain.len() + SEAL_TRAILER, 0);
        check.seal(1, 0, &mut block).unwrap();
        assert!(check.open_frames(&context, &mut block.clone()).is_none());
        assert!(check.seal_frames(&[0; 16], &mut block).is_err());
        assert!(BlockCheck::Crc.seal_frames(&context, &mut wire).is_err());
    }
}
