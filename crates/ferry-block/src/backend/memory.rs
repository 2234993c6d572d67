//! An export in memory, for benchmarks and tests: sparse pages allocated on first write,
//! so an 8 GiB export costs nothing until written; unwritten pages read as zeroes and are
//! reported as holes. Pages are spread over independently locked shards so connections
//! and workers rarely wait for each other. Pages are reference counted: a read can pin
//! them ([`Backend::read_shared`]) and a reply is sent straight from them with no shard
//! lock held; a write to a pinned page writes a fresh copy of it.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, RwLock};

use super::{Backend, Extent, SharedPage, SharedRead, Zeroing};

/// Bytes per page.
const PAGE: u64 = 64 * 1024;
/// Independently locked groups of pages.
const SHARDS: u64 = 64;
/// Most extents one allocation query returns.
const MAX_EXTENTS: usize = 1024;

type Pages = HashMap<u64, SharedPage>;

/// A sparse in-memory export.
#[derive(Debug)]
pub struct MemoryBackend {
    size: u64,
    shards: Vec<RwLock<Pages>>,
}

impl MemoryBackend {
    /// An export of `size` bytes, all zero, none allocated.
    pub fn new(size: u64) -> Self {
        MemoryBackend {
            size,
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
        }
    }

    /// Bytes of memory the written pages hold.
    pub fn allocated(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| read(s).len() as u64 * PAGE)
            .sum()
    }

    fn shard(&self, page: u64) -> &RwLock<Pages> {
        &self.shards[(page % SHARDS) as usize]
    }

    /// Calls `f(page, offset in page, range in the caller's buffer)` for each page the
    /// range `[offset, offset + len)` touches.
    fn each_page(offset: u64, len: u64, mut f: impl FnMut(u64, usize, std::ops::Range<usize>)) {
        let mut at = 0u64;
        while at < len {
            let pos = offset + at;
            let in_page = pos % PAGE;
            let n = (PAGE - in_page).min(len - at);
            f(pos / PAGE, in_page as usize, at as usize..(at + n) as usize);
            at += n;
        }
    }

    /// Zeroes a range: whole pages are dropped, partial ones cleared where allocated.
    fn zero(&self, offset: u64, len: u64) {
        Self::each_page(offset, len, |page, in_page, r| {
            let mut shard = write(self.shard(page));
            if r.len() as u64 == PAGE {
                shard.remove(&page);
            } else if let Some(p) = shard.get_mut(&page) {
                Arc::make_mut(p)[in_page..in_page + r.len()].fill(0);
            }
        });
    }
}

/// A read lock that survives a panicked writer (pages are plain bytes: no invariant to
/// lose).
fn read(l: &RwLock<Pages>) -> std::sync::RwLockReadGuard<'_, Pages> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write(l: &RwLock<Pages>) -> std::sync::RwLockWriteGuard<'_, Pages> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

impl Backend for MemoryBackend {
    fn size(&self) -> u64 {
        self.size
    }

    fn in_memory(&self) -> bool {
        true
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        Self::each_page(offset, buf.len() as u64, |page, in_page, r| {
            let shard = read(self.shard(page));
            match shard.get(&page) {
                Some(p) => buf[r.clone()].copy_from_slice(&p[in_page..in_page + r.len()]),
                None => buf[r].fill(0),
            }
        });
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> io::Result<()> {
        Self::each_page(offset, buf.len() as u64, |page, in_page, r| {
            let mut shard = write(self.shard(page));
            let p = shard
                .entry(page)
                .or_insert_with(|| Arc::new(vec![0u8; PAGE as usize]));
            // A copy when a reply being sent still holds the page (see `read_shared`).
            Arc::make_mut(p)[in_page..in_page + r.len()].copy_from_slice(&buf[r]);
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64, _fua: bool) -> io::Result<()> {
        self.zero(offset, len);
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, _how: Zeroing) -> io::Result<()> {
        // Dropping or clearing pages is always faster than a write: FAST_ZERO is honoured.
        self.zero(offset, len);
        Ok(())
    }

    fn read_shared(&self, offset: u64, len: usize) -> Option<SharedRead> {
        let mut out = SharedRead::default();
        Self::each_page(offset, len as u64, |page, in_page, r| {
            // The shard's lock is held only to take a reference to the page.
            let p = read(self.shard(page)).get(&page).cloned();
            match p {
                Some(p) => out.push_page(p, in_page, r.len()),
                None => out.push_zeroes(r.len()),
            }
        });
        Some(out)
    }

    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let len = len.min(self.size.saturating_sub(offset));
        let mut out: Vec<Extent> = Vec::new();
        let mut stop = false;
        Self::each_page(offset, len, |page, _, r| {
            if stop {
                return;
            }
            let present = read(self.shard(page)).contains_key(&page);
            let n = r.len() as u64;
            if out.last().is_some_and(|last| last.hole != present) {
                if let Some(last) = out.last_mut() {
                    last.len += n;
                }
            } else if out.len() == MAX_EXTENTS {
                stop = true;
            } else {
                out.push(Extent {
                    len: n,
                    hole: !present,
                    zero: !present,
                });
            }
        });
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_until_written_and_holes_reported() {
        let m = MemoryBackend::new(8 << 30);
        assert_eq!(m.allocated(), 0);
        m.write_at(b"hello", PAGE * 3 - 2, false).unwrap();
        assert_eq!(m.allocated(), 2 * PAGE);
        let mut b = vec![1u8; 9];
        m.read_at(&mut b, PAGE * 3 - 4).unwrap();
        assert_eq!(&b, b"\0\0hello\0\0");
        let e = m.extents(0, 5 * PAGE).unwrap();
        let kinds: Vec<(u64, bool)> = e.iter().map(|x| (x.len, x.hole)).collect();
        assert_eq!(
            kinds,
            vec![(2 * PAGE, true), (2 * PAGE, false), (PAGE, true)]
        );
        // A trim over whole pages frees them; a partial one clears bytes.
        m.trim(PAGE * 2, PAGE, false).unwrap();
        assert_eq!(m.allocated(), PAGE);
        m.write_zeroes(
            PAGE * 3,
            2,
            Zeroing {
                may_trim: true,
                fast: true,
                fua: false,
            },
        )
        .unwrap();
        m.read_at(&mut b, PAGE * 3 - 4).unwrap();
        assert_eq!(&b, b"\0\0\0\0\0\0o\0\0");
    }

    /// Bytes of a shared read, gathered.
    fn gather(s: &SharedRead, from: usize, len: usize) -> Vec<u8> {
        s.slices(from, len)
            .iter()
            .flat_map(|x| x.iter().copied())
            .collect()
    }

    #[test]
    fn shared_read_is_a_snapshot_that_writers_do_not_change() {
        let m = MemoryBackend::new(1 << 20);
        let data: Vec<u8> = (0..2 * PAGE as usize)
            .map(|i| (i % 251) as u8 | 1)
            .collect();
        m.write_at(&data, PAGE, false).unwrap();
        // Half a hole page, two data pages, half a hole page.
        let s = m.read_shared(PAGE / 2, 3 * PAGE as usize).unwrap();
        assert_eq!(s.len(), 3 * PAGE as usize);
        let kinds: Vec<(u64, bool)> = s.extents().iter().map(|x| (x.len, x.hole)).collect();
        assert_eq!(
            kinds,
            vec![(PAGE / 2, true), (2 * PAGE, false), (PAGE / 2, true)]
        );
        let mut want = vec![0u8; PAGE as usize / 2];
        want.extend_from_slice(&data);
        want.resize(3 * PAGE as usize, 0);
        assert_eq!(gather(&s, 0, s.len()), want);
        // A sub-range across a page boundary.
        let (from, n) = (PAGE as usize - 10, PAGE as usize + 20);
        assert_eq!(gather(&s, from, n), want[from..from + n]);
        // Writers and trims after the read leave the pinned bytes alone.
        m.write_at(&vec![9u8; 2 * PAGE as usize], PAGE, false)
            .unwrap();
        m.trim(PAGE, PAGE, false).unwrap();
        assert_eq!(gather(&s, 0, s.len()), want);
        let mut now = vec![0u8; 8];
        m.read_at(&mut now, 2 * PAGE).unwrap();
        assert_eq!(now, vec![9u8; 8]);
    }
}
