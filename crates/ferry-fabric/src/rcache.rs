//! A bounded registration cache: repeated transfers from the same buffer reuse one registration.
//!
//! Registration is expensive on real hardware (page pinning, NIC translation tables), so
//! layers that move caller-owned buffers look registrations up here instead of registering
//! per transfer. Each entry shares its buffer, so cached memory cannot be freed while it is
//! registered; an entry whose buffer no caller holds any more ("the memory went away" from the
//! caller's side) is invalidated on the next lookup instead of pinning dead memory. Entries are
//! evicted least-recently-used when the byte or entry bound is exceeded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::Result;
use crate::mem::{Access, Buffer, MemoryRegion};
use crate::Domain;

/// Counters of a [`RegistrationCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups served by an existing registration.
    pub hits: u64,
    /// Lookups that had to register.
    pub misses: u64,
    /// Entries dropped to stay within bounds.
    pub evictions: u64,
    /// Entries dropped because their memory went away or the caller invalidated them.
    pub invalidations: u64,
    /// Entries now held.
    pub entries: usize,
    /// Bytes now registered through the cache.
    pub bytes: usize,
}

struct Entry {
    region: MemoryRegion,
    last_use: u64,
    /// Buffer handles held by the registration itself (the region, and any the driver keeps);
    /// more than this means a caller still holds the memory.
    internal_handles: usize,
}

struct Inner {
    entries: HashMap<(usize, usize, Access), Entry>,
    clock: u64,
    stats: CacheStats,
}

/// A registration cache over one domain. Thread-safe.
pub struct RegistrationCache {
    domain: Arc<dyn Domain>,
    max_bytes: usize,
    max_entries: usize,
    inner: Mutex<Inner>,
}

impl RegistrationCache {
    /// A cache holding at most `max_entries` registrations and `max_bytes` registered bytes.
    pub fn new(domain: Arc<dyn Domain>, max_entries: usize, max_bytes: usize) -> Self {
        Self {
            domain,
            max_bytes,
            max_entries: max_entries.max(1),
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                clock: 0,
                stats: CacheStats::default(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The registration of `buf` with at least `access`, registering on a miss.
    pub fn get(&self, buf: &Buffer, access: Access) -> Result<MemoryRegion> {
        let key = (buf.addr(), buf.len(), access);
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        Self::sweep_dead(&mut inner);
        if let Some(e) = inner.entries.get_mut(&key) {
            if e.region.buffer().same_memory(buf) {
                e.last_use = now;
                let region = e.region.clone();
                inner.stats.hits += 1;
                return Ok(region);
            }
        }
        inner.stats.misses += 1;
        let before = buf.handle_count();
        let region = self.domain.register(buf, access)?;
        let internal_handles = buf.handle_count().saturating_sub(before);
        if let Some(old) = inner.entries.insert(
            key,
            Entry {
                region: region.clone(),
                last_use: now,
                internal_handles,
            },
        ) {
            // Same address and length but other memory: the old allocation is gone.
            inner.stats.bytes -= old.region.len();
            inner.stats.invalidations += 1;
        }
        inner.stats.bytes += buf.len();
        self.evict(&mut inner, key);
        inner.stats.entries = inner.entries.len();
        Ok(region)
    }

    /// Drops every registration of `buf`'s memory (call when deregistering it by hand or when
    /// the memory is about to be reused for something else).
    pub fn invalidate(&self, buf: &Buffer) {
        let mut inner = self.lock();
        let before = inner.entries.len();
        let mut freed = 0;
        inner.entries.retain(|_, e| {
            let keep = !e.region.buffer().same_memory(buf);
            if !keep {
                freed += e.region.len();
            }
            keep
        });
        let gone = before - inner.entries.len();
        inner.stats.invalidations += gone as u64;
        inner.stats.bytes -= freed;
        inner.stats.entries = inner.entries.len();
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> CacheStats {
        self.lock().stats
    }

    /// Drops entries whose buffer is held by nobody but the registration itself.
    fn sweep_dead(inner: &mut Inner) {
        let mut freed = 0;
        let mut gone = 0;
        inner.entries.retain(|_, e| {
            let alive = e.region.buffer().handle_count() > e.internal_handles;
            if !alive {
                freed += e.region.len();
                gone += 1;
            }
            alive
        });
        inner.stats.bytes -= freed;
        inner.stats.invalidations += gone;
        inner.stats.entries = inner.entries.len();
    }

    fn evict(&self, inner: &mut Inner, keep: (usize, usize, Access)) {
        while inner.entries.len() > self.max_entries
            || (inner.stats.bytes > self.max_bytes && inner.entries.len() > 1)
        {
            let victim = inner
                .entries
                .iter()
                .filter(|(k, _)| **k != keep)
                .min_by_key(|(_, e)| e.last_use)
                .map(|(k, _)| *k);
            let Some(victim) = victim else { break };
            if let Some(e) = inner.entries.remove(&victim) {
                inner.stats.bytes -= e.region.len();
                inner.stats.evictions += 1;
            }
        }
    }
}
