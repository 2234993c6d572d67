//! The key table: which remote keys a domain's live registrations hold.
//!
//! A key is 64 random bits drawn per registration (never a salt plus counters), unique among
//! the domain's live registrations and never 0 (EXS's "no remote"). Keys are not looked up
//! here: a peer reaches a region only through its connection's grants
//! ([`crate::grants::Grants`]), so one connection's key is worth nothing on another, and a
//! guess has 2^-64 odds per try and [`crate::grants::REFUSALS_BEFORE_CLOSE`] tries per
//! connection.

use std::any::Any;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::mem::Registration;

/// A domain's live keys.
pub(super) struct KeyTable {
    live: Mutex<HashSet<u64>>,
}

impl KeyTable {
    /// An empty table.
    pub(super) fn new() -> Self {
        Self {
            live: Mutex::new(HashSet::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashSet<u64>> {
        // Every critical section leaves the set consistent, so a poisoned lock is usable.
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Draws a fresh random key for a new registration.
    pub(super) fn insert(&self) -> u64 {
        let mut live = self.lock();
        loop {
            let key = rand::random::<u64>();
            // A repeat is a 2^-64 event per live key; drawing again keeps keys unique.
            if key != 0 && live.insert(key) {
                return key;
            }
        }
    }

    /// Retires `key` (its registration is gone).
    fn remove(&self, key: u64) {
        self.lock().remove(&key);
    }
}

/// The tcp driver's side of a [`crate::MemoryRegion`]: dropping it retires the key.
pub(super) struct Reg {
    pub(super) keys: Arc<KeyTable>,
    pub(super) key: u64,
}

impl Registration for Reg {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for Reg {
    fn drop(&mut self) {
        self.keys.remove(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_64_random_bits_unique_and_never_zero() {
        let t = KeyTable::new();
        let keys: Vec<u64> = (0..4096).map(|_| t.insert()).collect();
        let distinct: HashSet<u64> = keys.iter().copied().collect();
        assert_eq!(distinct.len(), keys.len());
        assert!(!keys.contains(&0));
        // Every bit position varies: no salt, generation or slot field stays fixed (a fixed
        // bit survives 4096 fair draws with odds 2^-4095).
        let (ones, zeros) = keys.iter().fold((0u64, 0u64), |(o, z), &k| (o | k, z | !k));
        assert_eq!(ones, u64::MAX, "some bit is never 1");
        assert_eq!(zeros, u64::MAX, "some bit is never 0");
        // Consecutive registrations are not related by a counter.
        let steps: HashSet<u64> = keys.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
        assert!(steps.len() > 4000, "keys follow a pattern");
        // A retired key leaves the table; the others stay.
        t.remove(keys[0]);
        assert!(!t.lock().contains(&keys[0]));
        assert!(t.lock().contains(&keys[1]));
    }
}
