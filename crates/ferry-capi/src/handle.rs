//! The handle table: sockets, queues and memory registrations are small non-negative ints,
//! like file descriptors, in one namespace (so a queue passed as a socket is caught).
//!
//! Handles count up from 1 and are not reused until the count wraps past `i32::MAX`, so a
//! stale handle (closed, then kept by mistake) fails with EBADF instead of naming a newer
//! object. 0 is never a handle, so zero-initialised C structs hold no valid handle.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};

use crate::error::{Errno, Res};
use crate::mem::Mem;
use crate::queue::Queue;
use crate::socket::Socket;

/// What a handle names.
#[derive(Clone)]
pub enum Obj {
    Sock(Arc<Socket>),
    Queue(Arc<Queue>),
    Mem(Arc<Mem>),
}

struct Table {
    map: HashMap<i32, Obj>,
    next: i32,
}

static TABLE: LazyLock<RwLock<Table>> = LazyLock::new(|| {
    RwLock::new(Table {
        map: HashMap::new(),
        next: 1,
    })
});

fn read() -> std::sync::RwLockReadGuard<'static, Table> {
    // The table is only changed by single inserts and removes: still consistent after a panic.
    TABLE.read().unwrap_or_else(|p| p.into_inner())
}

fn write() -> std::sync::RwLockWriteGuard<'static, Table> {
    TABLE.write().unwrap_or_else(|p| p.into_inner())
}

/// Adds `obj` and returns its new handle (EMFILE if all 2^31-1 handles are taken).
pub fn insert(obj: Obj) -> Res<i32> {
    let mut t = write();
    for _ in 0..=t.map.len() {
        let h = t.next;
        t.next = if t.next == i32::MAX { 1 } else { t.next + 1 };
        if let std::collections::hash_map::Entry::Vacant(v) = t.map.entry(h) {
            v.insert(obj);
            return Ok(h);
        }
    }
    Err(Errno(libc::EMFILE))
}

/// What `h` names, if anything.
pub fn get(h: i32) -> Option<Obj> {
    read().map.get(&h).cloned()
}

/// The socket `h` names (EBADF if it names nothing, or something else).
pub fn sock(h: i32) -> Res<Arc<Socket>> {
    match get(h) {
        Some(Obj::Sock(s)) => Ok(s),
        _ => Err(Errno::BADF),
    }
}

/// The queue `h` names (EBADF otherwise).
pub fn queue(h: i32) -> Res<Arc<Queue>> {
    match get(h) {
        Some(Obj::Queue(q)) => Ok(q),
        _ => Err(Errno::BADF),
    }
}

/// The registration `h` names (EBADF otherwise).
pub fn mem(h: i32) -> Res<Arc<Mem>> {
    match get(h) {
        Some(Obj::Mem(m)) => Ok(m),
        _ => Err(Errno::BADF),
    }
}

/// Removes `h` if `matches` accepts what it names; EBADF otherwise (nothing removed).
pub fn remove_if(h: i32, matches: impl FnOnce(&Obj) -> bool) -> Res<Obj> {
    let mut t = write();
    match t.map.get(&h) {
        Some(o) if matches(o) => Ok(t.map.remove(&h).ok_or(Errno::BADF)?),
        _ => Err(Errno::BADF),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_positive_unique_and_typed() {
        let q = Arc::new(Queue::new().unwrap());
        let a = insert(Obj::Queue(q.clone())).unwrap();
        let b = insert(Obj::Queue(q)).unwrap();
        assert!(a > 0 && b > 0 && a != b);
        assert!(queue(a).is_ok());
        assert_eq!(sock(a).err(), Some(Errno::BADF));
        assert_eq!(mem(a).err(), Some(Errno::BADF));
        assert!(remove_if(a, |o| matches!(o, Obj::Sock(_))).is_err());
        assert!(remove_if(a, |o| matches!(o, Obj::Queue(_))).is_ok());
        assert!(remove_if(a, |_| true).is_err());
        assert_eq!(queue(a).err(), Some(Errno::BADF));
        for bad in [-1, 0, i32::MIN, i32::MAX] {
            assert!(get(bad).is_none());
        }
        // Not reused: a fresh insert gets a new number.
        let c = insert(Obj::Queue(queue(b).unwrap())).unwrap();
        assert!(c != a && c != b);
        remove_if(b, |_| true).unwrap();
        remove_if(c, |_| true).unwrap();
    }
}
