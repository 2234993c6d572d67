//! The chunk pool's bookkeeping on both sides: the client allocates delegated chunks itself
//! (first fit, no round trip), and the server checks that every chunk range a request names
//! lies in the pool it delegated to that session.

/// The client's view of its delegated chunks: which are free.
#[derive(Debug, Clone)]
pub struct FirstFit {
    free: Vec<bool>,
}

impl FirstFit {
    /// `count` chunks, all free.
    pub fn new(count: usize) -> FirstFit {
        FirstFit {
            free: vec![true; count],
        }
    }

    /// The lowest free chunk, now taken; `None` when every chunk is in use.
    pub fn alloc(&mut self) -> Option<u16> {
        let i = self.free.iter().position(|f| *f)?;
        self.free[i] = false;
        u16::try_from(i).ok()
    }

    /// Gives chunk `i` back (a chunk not taken, or out of range, is ignored).
    pub fn release(&mut self, i: u16) {
        if let Some(f) = self.free.get_mut(usize::from(i)) {
            *f = true;
        }
    }

    /// Chunks in use.
    pub fn in_use(&self) -> usize {
        self.free.iter().filter(|f| !**f).count()
    }
}

/// Why a request's chunk range is not the session's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("request names chunk {chunk} bytes {at}+{len}, outside the {count} chunks of {size} bytes delegated to this session")]
pub struct NotDelegated {
    /// The chunk named.
    pub chunk: u16,
    /// Its offset.
    pub at: u32,
    /// Its length.
    pub len: u32,
    /// Chunks delegated.
    pub count: usize,
    /// Their size.
    pub size: u32,
}

/// Checks that `chunk` bytes `at..at + len` lie in a pool of `count` chunks of `size`
/// bytes: the server's check of every remote access a request asks it to trust.
pub fn check(count: usize, size: u32, chunk: u16, at: u32, len: u32) -> Result<(), NotDelegated> {
    let inside = usize::from(chunk) < count && u64::from(at) + u64::from(len) <= u64::from(size);
    if inside {
        Ok(())
    } else {
        Err(NotDelegated {
            chunk,
            at,
            len,
            count,
            size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_takes_the_lowest_free_chunk() {
        let mut p = FirstFit::new(3);
        assert_eq!(
            (p.alloc(), p.alloc(), p.alloc(), p.alloc()),
            (Some(0), Some(1), Some(2), None)
        );
        p.release(1);
        p.release(9);
        assert_eq!(p.in_use(), 2);
        assert_eq!(p.alloc(), Some(1));
    }

    #[test]
    fn ranges_outside_the_pool_are_refused() {
        assert!(check(16, 4096, 15, 0, 4096).is_ok());
        assert!(check(16, 4096, 16, 0, 1).is_err());
        assert!(check(16, 4096, 0, 4095, 2).is_err());
        assert!(check(16, 4096, 0, u32::MAX, u32::MAX).is_err());
        assert!(check(0, 4096, 0, 0, 0).is_err());
    }
}
