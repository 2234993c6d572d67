//! The key table: which registered memory a remote key names.
//!
//! A key is `salt (24 bits) | generation (20 bits) | slot (20 bits)`. The salt is random per
//! domain, so keys of another domain (or process) are recognised as unknown; the generation
//! changes each time a slot is freed, so a deregistered region's key is recognised as stale.
//! Freed slots are reused only once [`REUSE_AFTER`] of them are waiting, so one slot's
//! generation wraps only after about 2^28 registrations.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use super::io::Span;
use crate::error::{FabricError, RemoteAccessError, Result};
use crate::mem::{Access, Buffer, Registration, WeakBuffer};

const SLOT_BITS: u32 = 20;
const GEN_BITS: u32 = 20;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;
const SALT_SHIFT: u32 = SLOT_BITS + GEN_BITS;
/// Freed slots wait in a FIFO until this many are free, which spreads generation wrap-around.
const REUSE_AFTER: usize = 256;

struct Slot {
    generation: u32,
    /// Weak, because the registration cache judges whether the caller still holds a buffer by
    /// its handle count; the region itself keeps the memory alive while the key exists.
    entry: Option<(WeakBuffer, Access)>,
}

struct Slots {
    slots: Vec<Slot>,
    free: VecDeque<usize>,
}

/// A domain's registered regions, looked up by remote key.
pub(super) struct KeyTable {
    salt: u64,
    inner: Mutex<Slots>,
}

impl KeyTable {
    /// An empty table with a fresh random salt.
    pub(super) fn new() -> Self {
        Self {
            salt: rand::random::<u64>() >> SALT_SHIFT,
            inner: Mutex::new(Slots {
                slots: Vec::new(),
                free: VecDeque::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        // Every critical section leaves the table consistent, so a poisoned lock is usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a region and returns its key.
    pub(super) fn insert(&self, buf: &Buffer, access: Access) -> Result<u64> {
        let mut t = self.lock();
        let slot = if t.free.len() >= REUSE_AFTER || t.slots.len() > SLOT_MASK as usize {
            t.free.pop_front().ok_or_else(|| {
                FabricError::Unsupported(format!("more than {} live registrations", SLOT_MASK + 1))
            })?
        } else {
            t.slots.push(Slot {
                generation: 0,
                entry: None,
            });
            t.slots.len() - 1
        };
        let s = &mut t.slots[slot];
        s.entry = Some((buf.downgrade(), access));
        Ok(self.salt << SALT_SHIFT | u64::from(s.generation) << SLOT_BITS | slot as u64)
    }

    /// Removes the region `key` names, so its key turns stale.
    fn remove(&self, key: u64) {
        let mut t = self.lock();
        let slot = (key & SLOT_MASK) as usize;
        if let Some(s) = t.slots.get_mut(slot) {
            s.entry = None;
            s.generation = (s.generation + 1) & GEN_MASK;
            t.free.push_back(slot);
        }
    }

    /// Checks key, bounds and rights, in that order, before any memory is touched, and returns
    /// the addressed range.
    pub(super) fn lookup(
        &self,
        key: u64,
        offset: u64,
        len: u64,
        need: Access,
    ) -> std::result::Result<Span, RemoteAccessError> {
        if key >> SALT_SHIFT != self.salt {
            return Err(RemoteAccessError::UnknownKey);
        }
        let t = self.lock();
        let slot = t
            .slots
            .get((key & SLOT_MASK) as usize)
            .ok_or(RemoteAccessError::UnknownKey)?;
        let generation = ((key >> SLOT_BITS) as u32) & GEN_MASK;
        let (buf, access) = match &slot.entry {
            Some((weak, access)) if slot.generation == generation => (weak.upgrade(), *access),
            _ => return Err(RemoteAccessError::StaleKey),
        };
        let buf = buf.ok_or(RemoteAccessError::StaleKey)?;
        let (Ok(off), Ok(len)) = (usize::try_from(offset), usize::try_from(len)) else {
            return Err(RemoteAccessError::OutOfBounds);
        };
        let span = Span::new(buf, off, len).ok_or(RemoteAccessError::OutOfBounds)?;
        if !access.contains(need) {
            return Err(RemoteAccessError::NoPermission);
        }
        Ok(span)
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
    fn checks_key_generation_bounds_and_rights() {
        let t = KeyTable::new();
        let other = KeyTable::new();
        let b = Buffer::new(100);
        let k = t.insert(&b, Access::REMOTE_READ).unwrap();
        assert!(t.lookup(k, 90, 10, Access::REMOTE_READ).is_ok());
        let e = |r: std::result::Result<Span, RemoteAccessError>| r.err();
        assert_eq!(
            e(t.lookup(k, 91, 10, Access::REMOTE_READ)),
            Some(RemoteAccessError::OutOfBounds)
        );
        assert_eq!(
            e(t.lookup(k, u64::MAX, 2, Access::REMOTE_READ)),
            Some(RemoteAccessError::OutOfBounds)
        );
        assert_eq!(
            e(t.lookup(k, 0, 1, Access::REMOTE_WRITE)),
            Some(RemoteAccessError::NoPermission)
        );
        if other.salt != t.salt {
            let foreign = other.insert(&b, Access::ALL).unwrap();
            assert_eq!(
                e(t.lookup(foreign, 0, 1, Access::LOCAL)),
                Some(RemoteAccessError::UnknownKey)
            );
        }
        t.remove(k);
        assert_eq!(
            e(t.lookup(k, 0, 1, Access::REMOTE_READ)),
            Some(RemoteAccessError::StaleKey)
        );
        assert_eq!(
            e(t.lookup(k + 5, 0, 1, Access::REMOTE_READ)),
            Some(RemoteAccessError::UnknownKey)
        );
    }

    #[test]
    fn freed_slots_are_reused_late_with_a_new_generation() {
        let t = KeyTable::new();
        let b = Buffer::new(1);
        let first = t.insert(&b, Access::ALL).unwrap();
        t.remove(first);
        let mut keys = Vec::new();
        for _ in 0..REUSE_AFTER {
            let k = t.insert(&b, Access::ALL).unwrap();
            assert_ne!(k & SLOT_MASK, first & SLOT_MASK, "reused too early");
            keys.push(k);
        }
        for k in keys {
            t.remove(k);
        }
        let again = t.insert(&b, Access::ALL).unwrap();
        assert_eq!(again & SLOT_MASK, first & SLOT_MASK);
        assert_ne!(again, first);
        assert_eq!(
            t.lookup(first, 0, 1, Access::LOCAL).err(),
            Some(RemoteAccessError::StaleKey)
        );
        assert!(t.lookup(again, 0, 1, Access::LOCAL).is_ok());
    }
}
