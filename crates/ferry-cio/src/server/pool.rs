//! Buffers of a session's finished calls, kept for its next ones.
//!
//! A collective call of megabytes allocates each rank's data stream, its extents and the
//! file-domain buffer; fresh memory that large comes from `mmap` and is faulted in page by
//! page on every call, and given back at its end. A session's calls are alike (the seed's
//! loop makes the same call a hundred times), so their buffers are kept: taken at the
//! start of a call, handed back once it is answered, at most a few per rank.

use std::sync::{Mutex, MutexGuard};

use crate::view::{Extent, Extents};

/// Buffers kept per rank of the session, of each kind.
const PER_RANK: usize = 3;

/// A session's spare buffers.
pub struct Pool {
    bytes: Mutex<Vec<Vec<u8>>>,
    extents: Mutex<Vec<Vec<Extent>>>,
    keep: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Pool {
    /// A pool for a session of `ranks` ranks.
    pub fn new(ranks: usize) -> Pool {
        Pool {
            bytes: Mutex::new(Vec::new()),
            extents: Mutex::new(Vec::new()),
            keep: PER_RANK * ranks + 1,
        }
    }

    /// An empty byte buffer with room for `want` bytes: the smallest spare one that has
    /// it (a rank's stream and a call's domain, twice as large, each find their like),
    /// else a new one.
    pub fn bytes(&self, want: usize) -> Vec<u8> {
        let mut v = self.take(want);
        v.clear();
        v
    }

    /// A buffer of `want` bytes holding what a spare one held (zeros past its old
    /// length): for a buffer whose every byte read is written first, which need not be
    /// cleared (8 MiB of zeros a call, else).
    pub fn dirty(&self, want: usize) -> Vec<u8> {
        let mut v = self.take(want);
        v.truncate(want);
        v.resize(want, 0);
        v
    }

    /// The smallest spare buffer with room for `want` bytes, as it was given back, or a
    /// new one.
    fn take(&self, want: usize) -> Vec<u8> {
        let mut spare = lock(&self.bytes);
        let fit = (spare.iter().enumerate())
            .filter(|(_, v)| v.capacity() >= want)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i);
        match fit {
            Some(i) => spare.swap_remove(i),
            None => Vec::with_capacity(want),
        }
    }

    /// Keeps `v` for a later call; if enough are kept, it replaces the smallest one
    /// (when it is larger), so the spares follow the calls' sizes.
    pub fn give_bytes(&self, v: Vec<u8>) {
        let mut spare = lock(&self.bytes);
        if v.capacity() == 0 {
            return;
        }
        if spare.len() < self.keep {
            spare.push(v);
        } else if let Some(small) = spare.iter_mut().min_by_key(|s| s.capacity()) {
            if small.capacity() < v.capacity() {
                *small = v;
            }
        }
    }

    /// An empty extent list, with an earlier call's room if one is spare.
    pub fn extents(&self) -> Vec<Extent> {
        let mut v = lock(&self.extents).pop().unwrap_or_default();
        v.clear();
        v
    }

    /// Keeps a list's room for a later call (dropped if enough are kept).
    pub fn give_extents(&self, e: Extents) {
        let Extents::List(v) = e else {
            return;
        };
        let mut spare = lock(&self.extents);
        if v.capacity() > 0 && spare.len() < self.keep {
            spare.push(v);
        }
    }
}
