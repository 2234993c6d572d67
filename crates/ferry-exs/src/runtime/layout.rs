//! Noncontiguous sends and receives: a [`Layout`] says where a message's bytes lie in an
//! [`ExsBuf`](super::ExsBuf) (a datatype or a segment list), and
//! [`ExsSocket::send_layout`](super::ExsSocket::send_layout) /
//! [`ExsSocket::recv_layout`](super::ExsSocket::recv_layout) move them zero-copy where the
//! segments are large enough, packing where they are not. See `docs/noncontig.md`.

use ferry_dtype::{Cursor, Datatype, DtypeError, Segment};
use ferry_noncontig::Path;

use super::buf::ExsBuf;
use crate::proto::WireLayout;

/// Segments a sender collects while looking for a layout it can advertise (the frame limit
/// refuses most lists long before this).
const MAX_WIRE_SEGMENTS: usize = 4096;

/// Where a message's bytes lie in a buffer: `count` instances of a datatype, displacement 0
/// at byte `origin` of the buffer. The message is the datatype's data stream (what packing
/// produces); one send matches one recv whatever the two layouts are, as long as the
/// receiver's holds the message.
#[derive(Debug, Clone)]
pub struct Layout {
    dtype: Datatype,
    count: u64,
    origin: usize,
    path: Path,
}

/// Why a layout was refused before anything moved.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// The datatype is invalid or its arithmetic overflows (size, extent or `count` copies),
    /// or receive segments overlap ([`DtypeError::Overlap`]).
    #[error(transparent)]
    Dtype(#[from] DtypeError),
    /// The layout reaches outside the buffer it was given with.
    #[error("layout touches bytes {lo}..{hi} from origin {origin}, outside the {len}-byte buffer")]
    OutOfBuffer {
        /// Lowest offset touched, relative to the origin.
        lo: i64,
        /// One past the highest offset touched.
        hi: i64,
        /// The layout's origin in the buffer.
        origin: usize,
        /// The buffer's length.
        len: usize,
    },
    /// A persistent flag or an offset was asked for: layouts travel as ordinary messages.
    #[error("layouts take no persistent flags or offsets")]
    Unsupported,
    /// Registering a staging buffer, or packing into it, failed.
    #[error("staging failed: {0}")]
    Staging(String),
}

/// A layout operation refused at once, with the buffer handed back.
#[derive(Debug)]
pub struct Refused {
    /// The buffer the operation was given.
    pub buf: ExsBuf,
    /// Why.
    pub error: LayoutError,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for Refused {}

/// What a socket's layout operations did: which path ran, and what it cost. Counted per
/// socket (`ExsSocket::layout_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LayoutStats {
    /// Sends whose bytes left straight from the user's segments: the layout was advertised
    /// (the receiver gathers) or gathered by the sender's RMA writes (push).
    pub sends_zero_copy: u64,
    /// Sends packed into a registered staging buffer first (tiny segments, a message up to
    /// the immediate size, a layout too long to advertise, or a peer older than EXS 1.1).
    pub sends_packed: u64,
    /// Receives whose RMA reads scattered straight into the user's segments.
    pub recvs_zero_copy: u64,
    /// Receives read into a staging buffer and unpacked (tiny segments; push sockets).
    pub recvs_packed: u64,
    /// Immediate messages unpacked from the control frame into the user's segments.
    pub recvs_immediate: u64,
    /// RMA operations the layout transfers posted.
    pub rma_ops: u64,
    /// Of those, operations that gathered or scattered the user's own segments.
    pub zero_copy_ops: u64,
    /// Local segments gathered or scattered in place.
    pub local_segments: u64,
    /// Remote contiguous segments addressed (cut at the driver's RMA piece size).
    pub remote_segments: u64,
    /// Remote segments that needed more than one operation because their local segments
    /// exceeded the driver's gather limit (software splitting).
    pub splits: u64,
    /// Bytes copied through staging buffers (packing and unpacking).
    pub packed_bytes: u64,
}

impl Layout {
    /// `count` instances of `dtype`, displacement 0 at byte `origin` of the buffer. Fails if
    /// the type's arithmetic overflows for `count` instances (a type whose extent overflows).
    pub fn new(dtype: Datatype, count: u64, origin: usize) -> Result<Layout, LayoutError> {
        let range = dtype.true_range(count)?;
        if let Some(r) = range {
            let o = i128::try_from(origin).unwrap_or(i128::MAX);
            if o + i128::from(r.start) < 0 || o.checked_add(i128::from(r.end)).is_none() {
                return Err(LayoutError::OutOfBuffer {
                    lo: r.start,
                    hi: r.end,
                    origin,
                    len: 0,
                });
            }
        }
        Ok(Layout {
            dtype,
            count,
            origin,
            path: Path::Auto,
        })
    }

    /// A segment list (`offset`, `len` from the start of the buffer), in stream order.
    pub fn segments(segments: &[Segment]) -> Result<Layout, LayoutError> {
        Layout::new(Datatype::from_segments(segments)?, 1, 0)
    }

    /// `len` contiguous bytes at the start of the buffer.
    pub fn contiguous(len: u64) -> Layout {
        Layout {
            dtype: Datatype::byte(),
            count: len,
            origin: 0,
            path: Path::Auto,
        }
    }

    /// Forces a path: [`Path::ZeroCopy`] or [`Path::Packed`] instead of the automatic choice
    /// (packing when the mean segment is below the socket's pack threshold).
    pub fn with_path(mut self, path: Path) -> Layout {
        self.path = path;
        self
    }

    /// Bytes in the message.
    pub fn size(&self) -> u64 {
        self.dtype.size().saturating_mul(self.count)
    }

    /// The datatype.
    pub fn dtype(&self) -> &Datatype {
        &self.dtype
    }

    /// Instances of the datatype.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Buffer offset of displacement 0.
    pub fn origin(&self) -> usize {
        self.origin
    }

    /// The forced path, or [`Path::Auto`].
    pub fn path(&self) -> Path {
        self.path
    }

    /// The mean segment length (an upper bound on the segments, so a lower bound on it).
    pub(crate) fn mean_segment(&self) -> u64 {
        self.size() / self.dtype.segment_count_hint(self.count).max(1)
    }

    /// Checks the layout against a buffer of `len` bytes, and for a receive that no byte
    /// belongs to two segments.
    pub(crate) fn check_in(&self, len: usize, receive: bool) -> Result<(), LayoutError> {
        if let Some(r) = self.dtype.true_range(self.count)? {
            let o = i128::try_from(self.origin).unwrap_or(i128::MAX);
            let end = i128::try_from(len).unwrap_or(i128::MAX);
            if o + i128::from(r.start) < 0 || o + i128::from(r.end) > end {
                return Err(LayoutError::OutOfBuffer {
                    lo: r.start,
                    hi: r.end,
                    origin: self.origin,
                    len,
                });
            }
        }
        if receive {
            self.dtype.check_receive(self.count)?;
        }
        Ok(())
    }

    /// The compact form a sender can advertise for a buffer of `span` bytes: one segment
    /// repeated at a regular stride (vectors), or a short list. `None` if neither fits.
    /// Call after [`Layout::check_in`].
    pub(crate) fn wire(&self, span: u64) -> Option<WireLayout> {
        let mut c = Cursor::new(&self.dtype, self.count).ok()?;
        let origin = i128::try_from(self.origin).ok()?;
        let abs = |s: Segment| u64::try_from(origin + i128::from(s.offset)).ok();
        let s0 = c.next()?;
        let first = abs(s0)?;
        let mut list = vec![(first, s0.len)];
        // Regular: every segment as long as the first, at one stride from the previous.
        let (mut regular, mut stride, mut n, mut prev) = (true, None, 1u64, first);
        for s in c {
            let off = abs(s)?;
            if regular {
                let d = off.checked_sub(prev);
                regular = s.len == s0.len && d.is_some() && (stride.is_none() || stride == d);
                stride = d;
            }
            prev = off;
            n += 1;
            if list.len() < MAX_WIRE_SEGMENTS {
                list.push((off, s.len));
            } else if !regular {
                return None;
            }
        }
        if regular && n > 1 {
            WireLayout::new(n, stride?, vec![(first, s0.len)], span)
        } else if list.len() as u64 == n {
            WireLayout::new(1, 0, list, span)
        } else {
            None
        }
    }
}
