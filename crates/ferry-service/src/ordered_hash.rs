//! The whole-file BLAKE3 of a file whose ranges arrive out of order (parallel streams): a
//! thread hashes the part file in order, re-reading each byte once as soon as the verified
//! prefix reaches it, so hashing overlaps the transfer instead of following it.

use std::fs::File;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

#[derive(Debug, Default)]
struct State {
    /// How far the file is verified and written (the hasher may read up to here).
    ready: u64,
    /// Give up (the transfer failed).
    stop: bool,
}

/// A hashing thread following a part file's verified prefix.
#[derive(Debug)]
pub struct OrderedHash {
    shared: Arc<(Mutex<State>, Condvar)>,
    thread: Option<JoinHandle<std::io::Result<[u8; 32]>>>,
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl OrderedHash {
    /// Starts hashing `file` (a duplicate handle is taken), `size` bytes, of which the first
    /// `ready` are already verified.
    pub fn start(file: &File, size: u64, ready: u64) -> std::io::Result<OrderedHash> {
        let file = file.try_clone()?;
        let shared = Arc::new((Mutex::new(State { ready, stop: false }), Condvar::new()));
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ferry-hash".into())
            .spawn(move || {
                let mut h = blake3::Hasher::new();
                let mut buf = Vec::new();
                let mut pos = 0u64;
                while pos < size {
                    let upto = {
                        let mut st = lock(&s.0);
                        while st.ready <= pos && !st.stop {
                            st = s.1.wait(st).unwrap_or_else(|p| p.into_inner());
                        }
                        if st.stop {
                            return Err(std::io::Error::other("hashing abandoned"));
                        }
                        st.ready.min(size)
                    };
                    crate::hash::hash_range(&file, pos, upto - pos, &mut h, &mut buf)?;
                    pos = upto;
                }
                Ok(*h.finalize().as_bytes())
            })?;
        Ok(OrderedHash {
            shared,
            thread: Some(thread),
        })
    }

    /// The file is verified up to `prefix`.
    pub fn advance(&self, prefix: u64) {
        let mut st = lock(&self.shared.0);
        if prefix > st.ready {
            st.ready = prefix;
            self.shared.1.notify_one();
        }
    }

    /// Waits for the hash of the whole file (every byte must have been made ready).
    pub fn finish(mut self) -> std::io::Result<[u8; 32]> {
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            _ => Err(std::io::Error::other("the hashing thread failed")),
        }
    }
}

impl Drop for OrderedHash {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            lock(&self.shared.0).stop = true;
            self.shared.1.notify_one();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_in_order_as_ranges_become_ready() {
        let p = std::env::temp_dir().join(format!("ferry-ohash-{}", std::process::id()));
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let f = File::open(&p).unwrap();
        let h = OrderedHash::start(&f, data.len() as u64, 10).unwrap();
        h.advance(1_000_000);
        h.advance(500);
        h.advance(data.len() as u64);
        assert_eq!(h.finish().unwrap(), *blake3::hash(&data).as_bytes());
        // Dropped before the end: the thread stops instead of waiting forever.
        let h = OrderedHash::start(&f, data.len() as u64, 0).unwrap();
        h.advance(100);
        drop(h);
        let _ = std::fs::remove_file(&p);
    }
}
