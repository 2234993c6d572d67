//! Transfer buffers: data aligned for `O_DIRECT`, with room in front for a reply header so
//! a header and its data go out in one write, recycled per connection.

use std::sync::Mutex;

use ferry_service::direct::DIRECT_ALIGN;

/// Bytes kept free in front of the data for a reply header (a structured `OFFSET_DATA`
/// header is 28 bytes, a simple reply 16).
pub const HEADROOM: usize = 32;

/// A buffer whose data starts on a [`DIRECT_ALIGN`] boundary with [`HEADROOM`] bytes
/// before it. It never reallocates, so the alignment holds for its whole life.
#[derive(Debug)]
pub struct Buf {
    v: Vec<u8>,
    start: usize,
    cap: usize,
}

impl Buf {
    /// A buffer for up to `cap` bytes of data.
    pub fn new(cap: usize) -> Buf {
        let v = vec![0u8; cap + HEADROOM + DIRECT_ALIGN];
        let first = v.as_ptr() as usize + HEADROOM;
        let start = HEADROOM + (DIRECT_ALIGN - first % DIRECT_ALIGN) % DIRECT_ALIGN;
        Buf { v, start, cap }
    }

    /// Capacity in data bytes.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// The first `len` data bytes.
    pub fn data(&self, len: usize) -> &[u8] {
        &self.v[self.start..self.start + len.min(self.cap)]
    }

    /// The first `len` data bytes, to fill.
    pub fn data_mut(&mut self, len: usize) -> &mut [u8] {
        let end = self.start + len.min(self.cap);
        &mut self.v[self.start..end]
    }

    /// `header` (at most [`HEADROOM`] bytes) copied just before the data, and the slice
    /// from it through `len` data bytes: one contiguous write.
    pub fn framed(&mut self, header: &[u8], len: usize) -> &[u8] {
        let h = header.len().min(HEADROOM);
        let from = self.start - h;
        self.v[from..self.start].copy_from_slice(&header[..h]);
        &self.v[from..self.start + len.min(self.cap)]
    }
}

/// Buffers returned after use, handed out again (a connection's transfers reuse a few
/// buffers instead of allocating one per request).
#[derive(Debug, Default)]
pub struct Pool {
    free: Mutex<Vec<Buf>>,
}

/// Most buffers a pool keeps.
const KEEP: usize = 16;
/// Largest buffer a pool keeps.
const KEEP_LARGEST: usize = 4 << 20;

impl Pool {
    /// A buffer of at least `len` data bytes.
    pub fn get(&self, len: usize) -> Buf {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        match free.iter().position(|b| b.capacity() >= len) {
            Some(i) => free.swap_remove(i),
            // Small requests get a common size so their buffers serve each other.
            None => Buf::new(len.max(128 * 1024)),
        }
    }

    /// Gives a buffer back.
    pub fn put(&self, b: Buf) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        // Buffers of outsized requests go back to the allocator.
        if free.len() < KEEP && b.capacity() <= KEEP_LARGEST {
            free.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_is_aligned_with_headroom() {
        for cap in [0, 1, 4096, 100_000] {
            let mut b = Buf::new(cap);
            assert_eq!(b.data(cap).as_ptr() as usize % DIRECT_ALIGN, 0);
            b.data_mut(cap).fill(7);
            let f = b.framed(&[1, 2, 3], cap);
            assert_eq!(f.len(), 3 + cap);
            assert_eq!(&f[..3], &[1, 2, 3]);
            assert!(f[3..].iter().all(|&x| x == 7));
        }
    }
}
