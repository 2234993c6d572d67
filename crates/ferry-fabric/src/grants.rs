//! Which registered regions one connection's peer may reach, and whether it may reach any
//! yet: the target-side half of ferry's remote-access rules, shared by the drivers that check
//! RMA in software (native tcp, and ofi's checked-RMA path).
//!
//! - A key is honoured only on a connection it was granted to ([`crate::Endpoint::grant`]):
//!   a region registered on a listener's domain is not reachable from every connection that
//!   listener accepted.
//! - An accepted connection serves no RMA until the layer above has authenticated the peer
//!   and called [`crate::Endpoint::enable_remote_access`]; a connecting one starts enabled
//!   (its peer is the server it chose).
//! - A peer that asks for anything it was never granted, or asks before remote access is
//!   enabled, gets one uniform refusal ([`crate::RemoteAccessError::UnknownKey`]) whatever
//!   the key, range or rights, so it learns nothing about other connections' keys; once it
//!   has been refused [`REFUSALS_BEFORE_CLOSE`] different keys its connection is closed (a
//!   caller that retries one bad key, or whose one bad transfer splits into many RMAs, is not
//!   a prober). A key it was granted
//!   gets exact reasons (stale, out of bounds, no permission), which help debugging and tell
//!   it nothing it did not hold already.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::mem::{MemoryRegion, WeakRegion};

/// Different keys refused alike on one connection before the driver closes it: a peer that
/// never held a key gets a few tries (a buggy client gets a clear error), not a guessing loop.
pub const REFUSALS_BEFORE_CLOSE: u32 = 8;

/// Grants kept without pruning the dead; pruning then keeps the map within twice its live size.
const PRUNE_FLOOR: usize = 64;

/// Why a key is not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Never granted on this connection, or remote access not enabled: the uniform refusal.
    Uniform,
    /// Granted on this connection, but the region has since been deregistered.
    Stale,
}

struct Map {
    regions: HashMap<u64, WeakRegion>,
    prune_at: usize,
    /// The different keys refused alike so far (at most [`REFUSALS_BEFORE_CLOSE`]).
    refused: Vec<u64>,
}

/// One connection's grants.
pub(crate) struct Grants {
    enabled: AtomicBool,
    map: Mutex<Map>,
}

impl Grants {
    /// No grants; remote access on (`enabled`) or off until [`Grants::enable`].
    pub(crate) fn new(enabled: bool) -> Self {
        Self {
            enabled: AtomicBool::new(enabled),
            map: Mutex::new(Map {
                regions: HashMap::new(),
                prune_at: PRUNE_FLOOR,
                refused: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Map> {
        // Every critical section leaves the map consistent, so a poisoned lock is usable.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets the peer use the keys granted to it (now and later).
    pub(crate) fn enable(&self) {
        self.enabled.store(true, Ordering::Release);
    }

    /// Whether remote access is enabled.
    pub(crate) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// Lets the peer reach `region` by its key, with the rights it was registered with, for as
    /// long as it stays registered. Idempotent and O(1) (amortised: deregistered regions are
    /// dropped from the map when it has doubled since the last sweep).
    pub(crate) fn grant(&self, region: &MemoryRegion) {
        let mut m = self.lock();
        if m.regions.contains_key(&region.key()) {
            return;
        }
        if m.regions.len() >= m.prune_at {
            m.regions.retain(|_, w| w.is_live());
            m.prune_at = (m.regions.len() * 2).max(PRUNE_FLOOR);
        }
        m.regions.insert(region.key(), region.downgrade());
    }

    /// The region `key` names for this connection's peer. Checks nothing else (bounds and
    /// rights are the driver's, on the region returned).
    pub(crate) fn lookup(&self, key: u64) -> Result<MemoryRegion, Refusal> {
        if !self.enabled() {
            return Err(Refusal::Uniform);
        }
        // Upgrade outside the lock: dropping the last handle of a region deregisters it.
        let weak = self.lock().regions.get(&key).cloned();
        match weak {
            None => Err(Refusal::Uniform),
            Some(w) => w.upgrade().ok_or(Refusal::Stale),
        }
    }

    /// Records a uniform refusal of `key`; true once [`REFUSALS_BEFORE_CLOSE`] different keys
    /// have been refused and the connection must close.
    pub(crate) fn refused(&self, key: u64) -> bool {
        let mut m = self.lock();
        let limit = REFUSALS_BEFORE_CLOSE as usize;
        // Bounded: requests that still arrive while the connection closes add nothing.
        if m.refused.len() < limit && !m.refused.contains(&key) {
            m.refused.push(key);
        }
        m.refused.len() >= limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drivers::tcp;
    use crate::{Access, Buffer, Domain};

    fn domain() -> std::sync::Arc<dyn Domain> {
        tcp::open(&"tcp://127.0.0.1:1".parse().unwrap()).unwrap()
    }

    #[test]
    fn only_granted_keys_of_an_enabled_connection_are_served() {
        let d = domain();
        let a = d.register(&Buffer::new(8), Access::ALL).unwrap();
        let b = d.register(&Buffer::new(8), Access::ALL).unwrap();
        let g = Grants::new(false);
        g.grant(&a);
        assert_eq!(g.lookup(a.key()).err(), Some(Refusal::Uniform), "disabled");
        g.enable();
        assert_eq!(g.lookup(a.key()).unwrap().key(), a.key());
        assert_eq!(
            g.lookup(b.key()).err(),
            Some(Refusal::Uniform),
            "not granted"
        );
        let key = a.key();
        drop(a);
        assert_eq!(g.lookup(key).err(), Some(Refusal::Stale));
    }

    #[test]
    fn dead_grants_are_pruned() {
        let d = domain();
        let g = Grants::new(true);
        let keep = d.register(&Buffer::new(1), Access::ALL).unwrap();
        g.grant(&keep);
        for _ in 0..10 * PRUNE_FLOOR {
            g.grant(&d.register(&Buffer::new(1), Access::ALL).unwrap());
        }
        assert!(g.lock().regions.len() <= 2 * PRUNE_FLOOR);
        assert!(g.lookup(keep.key()).is_ok());
    }

    #[test]
    fn the_connection_closes_after_the_limit_of_different_keys() {
        let g = Grants::new(true);
        for key in 1..u64::from(REFUSALS_BEFORE_CLOSE) {
            assert!(!g.refused(key));
            assert!(!g.refused(key), "a retried key counts once");
        }
        assert!(g.refused(0));
    }
}
