//! The client's read cache: data-stream windows this rank read since its last sync point,
//! served again with no message (MPI's nonatomic consistency: another rank's write is only
//! guaranteed visible after sync-barrier-sync, so data fetched since the last sync may be
//! served). See `docs/cio.md`, "Read cache".
//!
//! An entry is one read's answer: the view it was read through (by the hash of its
//! displacement and type descriptions), where its window starts in that view's data
//! stream, how many bytes were asked and the bytes that came back (fewer at the end of the
//! file). A later read through the same view whose window lies inside an entry's bytes,
//! or asks exactly an entry's window, is served from it. Keying by stream window, not by
//! file byte, keeps the client free of view flattening: a window of a view always maps to
//! the same file bytes.

use std::collections::VecDeque;

use crate::error::{CioError, ErrorClass, Result};

/// The environment variable that sets the read cache for every file a process opens
/// (`off`, `on` or a size in bytes, with an optional `K`, `M` or `G` suffix); the
/// interposer's hint `ferry_read_cache` takes the same values for one file.
pub const READ_CACHE_ENV: &str = "FERRY_CIO_READ_CACHE";

/// The read cache's size when turned on (`on`, 64 MiB): a few large calls or very many
/// small ones.
pub const DEFAULT_READ_CACHE: u64 = 64 << 20;

/// The most entries kept: a lookup scans them, newest first.
const MAX_ENTRIES: usize = 1024;

/// Parses a read cache setting: `off` / `0`, `on` ([`DEFAULT_READ_CACHE`]), or bytes
/// with an optional `K`, `M` or `G` suffix (binary: `64M` is 64 MiB).
pub fn parse_read_cache(s: &str) -> Result<u64> {
    let bad = || {
        CioError::new(
            ErrorClass::Arg,
            format!("read cache {s:?}: off, on or a size in bytes (say 64M)"),
        )
    };
    let s = s.trim();
    match s {
        "off" => return Ok(0),
        "on" => return Ok(DEFAULT_READ_CACHE),
        _ => {}
    }
    let (digits, shift) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 10),
        Some((i, 'm' | 'M')) => (&s[..i], 20),
        Some((i, 'g' | 'G')) => (&s[..i], 30),
        _ => (s, 0),
    };
    let n: u64 = digits.trim().parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift).ok_or_else(bad)
}

/// The setting of [`READ_CACHE_ENV`] (off when unset). Off by default: with it on, data
/// another rank wrote after this rank read it stays unseen until this rank's next sync
/// point, as MPI's nonatomic mode allows but a program that only puts a barrier between
/// the write and the read (which works on a local file system) does not expect.
pub fn read_cache_from_env() -> Result<u64> {
    match std::env::var(READ_CACHE_ENV) {
        Ok(v) => parse_read_cache(&v)
            .map_err(|e| CioError::new(e.class, format!("{READ_CACHE_ENV}: {}", e.message))),
        Err(std::env::VarError::NotPresent) => Ok(0),
        Err(e) => Err(CioError::new(
            ErrorClass::Arg,
            format!("{READ_CACHE_ENV}: {e}"),
        )),
    }
}

/// One read's answer.
struct Entry {
    view: [u8; 32],
    start: u64,
    asked: u64,
    data: Vec<u8>,
}

/// A bounded cache of read answers, oldest evicted first.
pub(crate) struct ReadCache {
    limit: u64,
    held: u64,
    entries: VecDeque<Entry>,
}

impl ReadCache {
    /// A cache of at most `limit` bytes (0: off).
    pub(crate) fn new(limit: u64) -> ReadCache {
        ReadCache {
            limit,
            held: 0,
            entries: VecDeque::new(),
        }
    }

    /// Its size in bytes (0: off).
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// Sets its size, forgetting everything held.
    pub(crate) fn set_limit(&mut self, limit: u64) {
        self.clear();
        self.limit = limit;
    }

    /// Forgets everything held (a sync point, or this rank wrote).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.held = 0;
    }

    /// Whether a read of `len` bytes is kept: at most half the cache, so one call never
    /// evicts everything.
    pub(crate) fn keeps(&self, len: u64) -> bool {
        len <= self.limit / 2
    }

    /// The bytes a read of `len` bytes at stream byte `start` of `view` returns, if held:
    /// a window inside an entry's bytes, or exactly an entry's window (then possibly fewer
    /// bytes, the file having ended inside it).
    pub(crate) fn lookup(&self, view: &[u8; 32], start: u64, len: u64) -> Option<&[u8]> {
        self.entries.iter().rev().find_map(|e| {
            if e.view != *view || start < e.start {
                return None;
            }
            let from = usize::try_from(start - e.start).ok()?;
            let to = from.checked_add(usize::try_from(len).ok()?)?;
            if let Some(bytes) = e.data.get(from..to) {
                return Some(bytes);
            }
            (start == e.start && len == e.asked).then_some(&e.data[..])
        })
    }

    /// Keeps the answer `data` of a read of `asked` bytes at stream byte `start` of `view`,
    /// evicting the oldest entries beyond the bounds.
    pub(crate) fn insert(&mut self, view: [u8; 32], start: u64, asked: u64, data: Vec<u8>) {
        if !self.keeps(data.len() as u64) {
            return;
        }
        self.held += data.len() as u64;
        self.entries.push_back(Entry {
            view,
            start,
            asked,
            data,
        });
        while self.held > self.limit || self.entries.len() > MAX_ENTRIES {
            match self.entries.pop_front() {
                Some(e) => self.held -= e.data.len() as u64,
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse() {
        assert_eq!(parse_read_cache("off").unwrap(), 0);
        assert_eq!(parse_read_cache("0").unwrap(), 0);
        assert_eq!(parse_read_cache("on").unwrap(), DEFAULT_READ_CACHE);
        assert_eq!(parse_read_cache("4096").unwrap(), 4096);
        assert_eq!(parse_read_cache("8k").unwrap(), 8192);
        assert_eq!(parse_read_cache(" 64M ").unwrap(), 64 << 20);
        assert_eq!(parse_read_cache("1G").unwrap(), 1 << 30);
        for bad in ["", "lots", "-1", "M", "99999999999999999999G"] {
            let e = parse_read_cache(bad).unwrap_err();
            assert_eq!(e.class, ErrorClass::Arg, "{bad}");
        }
    }

    #[test]
    fn windows_inside_an_entry_hit_others_miss() {
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let mut c = ReadCache::new(1 << 20);
        c.insert(a, 100, 10, (0..10).collect());
        assert_eq!(
            c.lookup(&a, 100, 10),
            Some(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9][..])
        );
        assert_eq!(c.lookup(&a, 104, 3), Some(&[4, 5, 6][..]));
        assert_eq!(c.lookup(&a, 99, 3), None, "starts before");
        assert_eq!(c.lookup(&a, 105, 10), None, "ends after");
        assert_eq!(c.lookup(&b, 100, 10), None, "another view");
        // A short answer (the file ended) serves its own window and windows inside it.
        c.insert(b, 0, 16, vec![7; 5]);
        assert_eq!(c.lookup(&b, 0, 16), Some(&[7; 5][..]));
        assert_eq!(c.lookup(&b, 1, 4), Some(&[7; 4][..]));
        assert_eq!(c.lookup(&b, 0, 8), None, "another window past the end");
        c.clear();
        assert_eq!(c.lookup(&a, 100, 10), None);
    }

    #[test]
    fn bounded_by_bytes_and_entries() {
        let v = [0u8; 32];
        let mut c = ReadCache::new(100);
        c.insert(v, 0, 60, vec![1; 60]);
        assert!(
            c.lookup(&v, 0, 60).is_none(),
            "more than half the cache is not kept"
        );
        for i in 0..3 {
            c.insert(v, i * 40, 40, vec![i as u8; 40]);
        }
        assert!(c.lookup(&v, 0, 40).is_none(), "the oldest went");
        assert_eq!(c.lookup(&v, 80, 40), Some(&[2; 40][..]));
        let mut c = ReadCache::new(1 << 30);
        for i in 0..(MAX_ENTRIES as u64 + 1) {
            c.insert(v, i, 1, vec![0]);
        }
        assert!(c.lookup(&v, 0, 1).is_none());
        assert!(c.lookup(&v, MAX_ENTRIES as u64, 1).is_some());
    }
}
