//! Byte views into registered memory for vectored socket I/O: the driver's only `unsafe`.
//!
//! A [`Span`] is bounds-checked when it is made, and a scatter list is checked to be free of
//! overlaps, so the slices handed to the kernel are in bounds and a receive never creates two
//! mutable views of the same bytes.

use std::io::{self, IoSlice, IoSliceMut, Read};
use std::net::TcpStream;

use crate::error::{FabricError, Result};
use crate::mem::{Buffer, LocalSlice};

/// Most iovecs one readv/writev accepts (Linux `UIO_MAXIOV`).
pub(super) const IOV_MAX: usize = 1024;

/// A bounds-checked byte range of a buffer, holding the buffer alive.
#[derive(Clone)]
pub(super) struct Span {
    buf: Buffer,
    off: usize,
    len: usize,
}

impl Span {
    /// The range `off..off + len` of `buf`, or `None` if it is out of bounds.
    pub(super) fn new(buf: Buffer, off: usize, len: usize) -> Option<Self> {
        let end = off.checked_add(len)?;
        (end <= buf.len()).then_some(Self { buf, off, len })
    }

    /// Length in bytes.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The part of the span in a file ([`Buffer::file_part`]): the bytes before it (in
    /// memory), then the file, its offset and the bytes there. `None` for a span of memory.
    pub(super) fn in_file(&self) -> Option<(usize, &std::fs::File, u64, usize)> {
        let part = self.buf.file_part()?;
        let before = part.head.saturating_sub(self.off).min(self.len);
        let start = self.off + before;
        let offset = part.offset + (start - part.head) as u64;
        Some((before, &part.file, offset, self.len - before))
    }

    /// The span's bytes `from..to` (clamped to it), for writev.
    pub(super) fn io_part(&self, from: usize, to: usize) -> IoSlice<'_> {
        let to = to.min(self.len);
        let from = from.min(to);
        // SAFETY: as `io_slice`, over a part of the checked range.
        IoSlice::new(unsafe { self.buf.bytes(self.off + from, to - from) })
    }

    /// The span without its first `n` bytes (at most its length).
    pub(super) fn after(&self, n: usize) -> Span {
        let n = n.min(self.len);
        Span {
            buf: self.buf.clone(),
            off: self.off + n,
            len: self.len - n,
        }
    }

    /// The bytes, for writev.
    pub(super) fn io_slice(&self) -> IoSlice<'_> {
        // SAFETY: `new` checked the range. A peer-granted concurrent write into memory being
        // sent may change the bytes on the wire, which the contract of `bytes` accepts.
        IoSlice::new(unsafe { self.buf.bytes(self.off, self.len) })
    }
}

fn span_of(s: &LocalSlice) -> Result<Span> {
    Span::new(s.region.buffer().clone(), s.offset, s.len).ok_or_else(|| {
        FabricError::InvalidArgument(format!(
            "slice {}+{} outside its region of {} bytes",
            s.offset,
            s.len,
            s.region.len()
        ))
    })
}

/// A gather list (send, RMA write source), checked against its regions' bounds.
pub(super) fn gather(list: &[LocalSlice]) -> Result<Vec<Span>> {
    list.iter().map(span_of).collect()
}

/// A scatter list (receive, RMA read destination): in bounds and without overlaps, because
/// the driver writes all of its segments with one readv.
pub(super) fn scatter(list: &[LocalSlice]) -> Result<Vec<Span>> {
    let spans = gather(list)?;
    let mut ranges: Vec<(usize, usize)> = list
        .iter()
        .filter(|s| s.len > 0)
        .map(|s| (s.addr(), s.addr() + s.len))
        .collect();
    ranges.sort_unstable();
    if ranges.windows(2).any(|w| w[1].0 < w[0].1) {
        return Err(FabricError::InvalidArgument(
            "scatter segments overlap".into(),
        ));
    }
    Ok(spans)
}

/// Copies the bytes of a gather list (inline sends, so the caller's buffer is free at once).
pub(super) fn copy_out(spans: &[Span]) -> Vec<u8> {
    let mut out = vec![0; spans.iter().map(Span::len).sum()];
    let mut at = 0;
    for s in spans {
        s.buf.read_at(s.off, &mut out[at..at + s.len]);
        at += s.len;
    }
    out
}

/// Fills the first bytes of a scatter list, from memory or straight from a socket.
pub(super) struct Fill<'a> {
    spans: &'a [Span],
    idx: usize,
    pos: usize,
    left: usize,
}

impl<'a> Fill<'a> {
    /// Will place `n` bytes (at most the list's total) into `spans`.
    pub(super) fn new(spans: &'a [Span], n: usize) -> Self {
        let total = spans.iter().map(Span::len).sum();
        Self {
            spans,
            idx: 0,
            pos: 0,
            left: n.min(total),
        }
    }

    /// Bytes still to place.
    pub(super) fn left(&self) -> usize {
        self.left
    }

    fn advance(&mut self, mut n: usize) {
        self.left -= n;
        while n > 0 {
            let room = self.spans[self.idx].len - self.pos;
            let step = room.min(n);
            self.pos += step;
            n -= step;
            if self.pos == self.spans[self.idx].len {
                self.idx += 1;
                self.pos = 0;
            }
        }
    }

    /// Copies as much of `data` as still fits; returns the bytes taken.
    pub(super) fn copy_from(&mut self, data: &[u8]) -> usize {
        let take = data.len().min(self.left);
        let mut done = 0;
        while done < take {
            let s = &self.spans[self.idx];
            let step = (s.len - self.pos).min(take - done);
            s.buf.write_at(s.off + self.pos, &data[done..done + step]);
            done += step;
            self.advance(step);
        }
        take
    }

    /// One readv from `stream` straight into the remaining destination bytes.
    pub(super) fn read_from(&mut self, mut stream: &TcpStream) -> io::Result<usize> {
        let mut iov = Vec::with_capacity((self.spans.len() - self.idx).min(IOV_MAX));
        let (mut want, mut pos) = (self.left, self.pos);
        for s in &self.spans[self.idx..] {
            if want == 0 || iov.len() == IOV_MAX {
                break;
            }
            let n = (s.len - pos).min(want);
            // SAFETY: the span was bounds-checked at creation and `pos + n <= s.len`. The list
            // has no overlapping segments (`scatter`), so these slices are disjoint; they live
            // only for this one readv and Rust code never reads or writes through them. Within
            // a connection only its reader thread writes receive and RMA-write targets. Peers
            // writing one range over different connections race inside the kernel's copy, as
            // they would on RDMA hardware (the contract of `bytes_mut`).
            iov.push(IoSliceMut::new(unsafe { s.buf.bytes_mut(s.off + pos, n) }));
            want -= n;
            pos = 0;
        }
        let n = stream.read_vectored(&mut iov)?;
        drop(iov);
        self.advance(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_bounds_checked() {
        let b = Buffer::new(10);
        assert!(Span::new(b.clone(), 10, 0).is_some());
        assert!(Span::new(b.clone(), 5, 6).is_none());
        assert!(Span::new(b, usize::MAX, 2).is_none());
    }

    #[test]
    fn fill_scatters_across_segments_and_stops_at_n() {
        let b = Buffer::new(10);
        let spans = [
            Span::new(b.clone(), 0, 3).unwrap(),
            Span::new(b.clone(), 5, 5).unwrap(),
        ];
        let mut f = Fill::new(&spans, 6);
        assert_eq!(f.copy_from(&[1, 2]), 2);
        assert_eq!(f.copy_from(&[3, 4, 5, 6, 7]), 4);
        assert_eq!(f.left(), 0);
        assert_eq!(b.to_vec(), [1, 2, 3, 0, 0, 4, 5, 6, 0, 0]);
        assert_eq!(copy_out(&spans), [1, 2, 3, 4, 5, 6, 0, 0]);
    }
}
