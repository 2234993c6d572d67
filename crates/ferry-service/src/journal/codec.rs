//! The journal's on-disk format, pure: encoding and decoding of its slots, with no I/O.
//! The layout is described in [`crate::journal`].

use super::ranges::RangeSet;

/// Format 2's magic, at the start of each slot.
pub(crate) const MAGIC: &[u8; 8] = b"FERRYJ02";
/// Bytes of a format-2 slot (a journal file holds two).
pub(crate) const SLOT: usize = 1024;
/// Bytes before a slot's ranges.
pub(crate) const HEAD: usize = 48;
/// Format 1's magic.
pub(crate) const MAGIC_V1: &[u8; 8] = b"FERRYJ01";
/// Bytes of a format-1 slot.
pub(crate) const SLOT_V1: usize = 64;
/// The most ranges a journal slot records.
pub const MAX_RANGES: usize = (SLOT - HEAD - 4) / 16;

/// The journal's file name for a part file's name.
pub fn journal_name(part: &str) -> String {
    format!("{part}.journal")
}

/// Which source a part file holds bytes of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ident {
    /// The source's size.
    pub size: u64,
    /// The source's modification time (seconds for downloads, as STAT reports it;
    /// nanoseconds for uploads, as the client sends it; 0 when unknown).
    pub mtime: i64,
}

pub(crate) fn encode(seq: u64, ident: Ident, block: u32, done: &RangeSet) -> Vec<u8> {
    let mut s = vec![0u8; SLOT];
    s[..8].copy_from_slice(MAGIC);
    s[8..16].copy_from_slice(&seq.to_le_bytes());
    s[16..24].copy_from_slice(&ident.size.to_le_bytes());
    s[24..32].copy_from_slice(&ident.mtime.to_le_bytes());
    s[32..36].copy_from_slice(&block.to_le_bytes());
    let mut n = 0u32;
    for (i, (a, b)) in done.iter().take(MAX_RANGES).enumerate() {
        let at = HEAD + 16 * i;
        s[at..at + 8].copy_from_slice(&a.to_le_bytes());
        s[at + 8..at + 16].copy_from_slice(&b.to_le_bytes());
        n += 1;
    }
    s[36..40].copy_from_slice(&n.to_le_bytes());
    let crc = crc32c::crc32c(&s[..SLOT - 4]);
    s[SLOT - 4..].copy_from_slice(&crc.to_le_bytes());
    s
}

/// One valid slot's contents.
pub(crate) type Slot = (u64, Ident, u32, RangeSet);

fn u64_at(s: &[u8], i: usize) -> Option<u64> {
    s.get(i..i + 8)?.try_into().ok().map(u64::from_le_bytes)
}

fn u32_at(s: &[u8], i: usize) -> Option<u32> {
    s.get(i..i + 4)?.try_into().ok().map(u32::from_le_bytes)
}

/// A valid format-2 slot.
pub(crate) fn decode(s: &[u8]) -> Option<Slot> {
    if s.len() != SLOT || &s[..8] != MAGIC {
        return None;
    }
    if crc32c::crc32c(&s[..SLOT - 4]) != u32_at(s, SLOT - 4)? {
        return None;
    }
    let ident = Ident {
        size: u64_at(s, 16)?,
        mtime: u64_at(s, 24)? as i64,
    };
    let n = u32_at(s, 36)? as usize;
    if n > MAX_RANGES {
        return None;
    }
    let mut done = RangeSet::new();
    let mut last = None;
    for i in 0..n {
        let (a, b) = (u64_at(s, HEAD + 16 * i)?, u64_at(s, HEAD + 16 * i + 8)?);
        // Sorted, disjoint, not touching, inside the source: exactly what `encode` writes.
        if a >= b || b > ident.size || last.is_some_and(|l| a <= l) {
            return None;
        }
        last = Some(b);
        done.insert(a, b);
    }
    Some((u64_at(s, 8)?, ident, u32_at(s, 32)?, done))
}

/// A valid format-1 slot (one verified prefix).
pub(crate) fn decode_v1(s: &[u8]) -> Option<Slot> {
    if s.len() != SLOT_V1 || &s[..8] != MAGIC_V1 {
        return None;
    }
    if crc32c::crc32c(&s[..60]) != u32_at(s, 60)? {
        return None;
    }
    let ident = Ident {
        size: u64_at(s, 16)?,
        mtime: u64_at(s, 24)? as i64,
    };
    let done = u64_at(s, 40)?;
    if done > ident.size {
        return None;
    }
    let mut set = RangeSet::new();
    set.insert(0, done);
    Some((u64_at(s, 8)?, ident, u32_at(s, 32)?, set))
}

/// The valid slot with the highest sequence number among the bytes of a journal file
/// (format 2 first, else format 1); `None` if no slot is valid.
pub(crate) fn best_slot(b: &[u8]) -> Option<Slot> {
    b.chunks(SLOT)
        .filter_map(decode)
        .max_by_key(|s| s.0)
        .or_else(|| {
            b[..b.len().min(2 * SLOT_V1)]
                .chunks(SLOT_V1)
                .filter_map(decode_v1)
                .max_by_key(|s| s.0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Any range set inside the source survives a slot's encode and decode (its first
        /// MAX_RANGES ranges), and a slot with one flipped bit is never accepted.
        #[test]
        fn slots_round_trip_and_reject_flips(
            seq in proptest::prelude::any::<u64>(),
            mtime in proptest::prelude::any::<i64>(),
            ins in proptest::collection::vec((0u64..10_000, 1u64..500), 0..100),
            flip in 0usize..SLOT * 8,
        ) {
            let ident = Ident { size: 10_500, mtime };
            let mut done = RangeSet::new();
            for &(a, l) in &ins {
                done.insert(a, a + l);
            }
            let slot = encode(seq, ident, 4096, &done);
            let back = decode(&slot);
            proptest::prop_assert_eq!(back, Some((seq, ident, 4096, done.first(MAX_RANGES))));
            let mut bad = slot.clone();
            bad[flip / 8] ^= 1 << (flip % 8);
            proptest::prop_assert_eq!(decode(&bad), None);
            proptest::prop_assert_eq!(best_slot(&[slot.clone(), bad].concat()).map(|s| s.0), Some(seq));
        }
    }
}
