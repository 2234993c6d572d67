//! Claims on files being written: one writer per destination path at a time, and a newer
//! writer of the same path asks the older one to let go (it journals and stops), instead of
//! both writing the same part file.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The paths being written, each with its holder's "yield to a newer writer" flag.
type Busy = Arc<Mutex<HashMap<String, Arc<AtomicBool>>>>;

/// The claims of one server.
#[derive(Debug, Default)]
pub struct Claims {
    busy: Busy,
}

/// A claim on a file being written; released on drop.
#[derive(Debug)]
pub struct Claim {
    busy: Busy,
    key: String,
    /// Raised when a newer writer of the same file wants it.
    pub yield_to_newer: Arc<AtomicBool>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        lock(&self.busy).remove(&self.key);
    }
}

fn lock(b: &Busy) -> std::sync::MutexGuard<'_, HashMap<String, Arc<AtomicBool>>> {
    b.lock().unwrap_or_else(|p| p.into_inner())
}

impl Claims {
    /// No claims.
    pub fn new() -> Claims {
        Claims::default()
    }

    /// Claims `path` for writing. If another writer holds it, asks that one to let go and
    /// waits up to `wait` for it, polling; gives up early once `stopping()` says so.
    pub fn claim(&self, path: &str, wait: Duration, stopping: impl Fn() -> bool) -> Option<Claim> {
        // `a//b/./c` and `a/b/c` are the same file.
        let key = path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect::<Vec<_>>()
            .join("/");
        let end = Instant::now() + wait;
        loop {
            {
                let mut busy = lock(&self.busy);
                match busy.get(&key) {
                    Some(holder) => holder.store(true, Ordering::SeqCst),
                    None => {
                        let flag = Arc::new(AtomicBool::new(false));
                        busy.insert(key.clone(), flag.clone());
                        return Some(Claim {
                            busy: self.busy.clone(),
                            key,
                            yield_to_newer: flag,
                        });
                    }
                }
            }
            if Instant::now() >= end || stopping() {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second claim on the same file (spelled differently) asks the holder to yield and
    /// waits; it succeeds once the first is dropped.
    #[test]
    fn a_newer_writer_asks_the_holder_to_yield() {
        let claims = Claims::new();
        let first = claims.claim("r/a/b", Duration::ZERO, || false).unwrap();
        assert!(claims
            .claim("r//a/./b", Duration::from_millis(50), || false)
            .is_none());
        assert!(first.yield_to_newer.load(Ordering::SeqCst));
        assert!(claims.claim("r/a/c", Duration::ZERO, || false).is_some());
        drop(first);
        assert!(claims.claim("r/a/b", Duration::ZERO, || false).is_some());
    }
}
