//! `ExsBuf`: an owned slice of registered memory, the only kind of buffer EXS operations take.
//!
//! Operations take the `ExsBuf` by value and hand it back in their completion event, so the
//! type system keeps the user from touching or reusing a buffer while the fabric may access it.

use std::ops::RangeBounds;
use std::sync::Arc;

use ferry_fabric::{Access, Buffer, LocalSlice, MemoryRegion};

use crate::proto::{LocalBuf, RemoteSlice};

/// A range of a registered region (`exs_mregister`'s result), owned by one operation at a time.
///
/// Deliberately not `Clone`: an operation takes it and its completion event gives it back, so
/// safe code cannot reuse a buffer the fabric may still be reading or writing. (Someone who
/// keeps the [`MemoryRegion`] can still reach the memory, with copy semantics; it is never
/// freed while an operation holds it.)
#[derive(Debug)]
pub struct ExsBuf {
    region: MemoryRegion,
    offset: usize,
    len: usize,
}

impl ExsBuf {
    /// The whole of `region`.
    pub fn new(region: MemoryRegion) -> Self {
        let len = region.len();
        ExsBuf {
            region,
            offset: 0,
            len,
        }
    }

    /// A sub-range of this buffer (for offsets within a larger registration).
    pub fn slice(self, range: impl RangeBounds<usize>) -> Result<Self, ferry_fabric::FabricError> {
        let (start, end) = resolve(range, self.len).ok_or_else(|| {
            ferry_fabric::FabricError::InvalidArgument(format!(
                "range outside buffer of {} bytes",
                self.len
            ))
        })?;
        Ok(ExsBuf {
            region: self.region,
            offset: self.offset + start,
            len: end - start,
        })
    }

    /// The registration this buffer lies in.
    pub fn region(&self) -> &MemoryRegion {
        &self.region
    }

    /// Where in the registration this buffer starts.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Start address (what the C API hands back in events).
    pub fn addr(&self) -> usize {
        self.region.buffer().addr() + self.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the bytes out (the region is shared with the fabric, so no borrow is handed out).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        self.region.buffer().read_at(self.offset, &mut v);
        v
    }

    /// Copies `data` in at `offset`; an error if it does not fit.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), ferry_fabric::FabricError> {
        if offset
            .checked_add(data.len())
            .is_none_or(|end| end > self.len)
        {
            return Err(ferry_fabric::FabricError::InvalidArgument(format!(
                "{} bytes at {offset} outside buffer of {} bytes",
                data.len(),
                self.len
            )));
        }
        self.region.buffer().write_at(self.offset + offset, data);
        Ok(())
    }

    /// Fills the buffer with `byte`.
    pub fn fill(&self, byte: u8) {
        self.region
            .buffer()
            .write_at(self.offset, &vec![byte; self.len]);
    }

    /// The fabric slice `offset..offset + len` of this buffer (callers check bounds first).
    pub(crate) fn local(&self, offset: u64, len: u64) -> LocalSlice {
        LocalSlice {
            region: self.region.clone(),
            offset: self.offset + offset as usize,
            len: len as usize,
        }
    }

    /// The registered memory underneath.
    pub fn buffer(&self) -> &Buffer {
        self.region.buffer()
    }
}

fn resolve(range: impl RangeBounds<usize>, len: usize) -> Option<(usize, usize)> {
    use std::ops::Bound;
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1)?,
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    (start <= end && end <= len).then_some((start, end))
}

/// The core's handle to an [`ExsBuf`] it holds: the core clones handles freely (an operation,
/// its RMA actions, its event), the user never sees them.
#[derive(Clone, Debug)]
pub(crate) struct Held(Arc<ExsBuf>, Option<Arc<HeldLayout>>);

/// Where the message lies in a held buffer, for layout operations (`runtime/layout.rs`).
#[derive(Debug)]
pub(crate) struct HeldLayout {
    pub(crate) layout: super::layout::Layout,
    /// What a send advertises (pull sends only).
    pub(crate) wire: Option<crate::proto::WireLayout>,
    /// A send (its buffer is advertised whole); a receive is never reachable by the peer.
    pub(crate) send: bool,
}

impl Held {
    pub(crate) fn new(buf: ExsBuf) -> Self {
        Held(Arc::new(buf), None)
    }

    /// A buffer whose message lies where `layout` says (checked against it already).
    pub(crate) fn with_layout(buf: ExsBuf, layout: HeldLayout) -> Self {
        Held(Arc::new(buf), Some(Arc::new(layout)))
    }

    /// The layout, if the message is noncontiguous.
    pub(crate) fn layout(&self) -> Option<&HeldLayout> {
        self.1.as_deref()
    }

    /// The user's buffer back. The core hands a buffer back in its completion event after
    /// dropping its other handles; should one still live, the user gets an equal handle.
    pub(crate) fn into_buf(self) -> ExsBuf {
        Arc::try_unwrap(self.0).unwrap_or_else(|shared| ExsBuf {
            region: shared.region.clone(),
            offset: shared.offset,
            len: shared.len,
        })
    }

    pub(crate) fn buf(&self) -> &ExsBuf {
        &self.0
    }
}

impl LocalBuf for Held {
    fn len(&self) -> u64 {
        match &self.1 {
            Some(l) => l.layout.size(),
            None => self.0.len as u64,
        }
    }

    fn remote(&self) -> Option<RemoteSlice> {
        match &self.1 {
            Some(l) if !l.send => None,
            _ => self.0.remote(),
        }
    }

    fn layout(&self) -> Option<crate::proto::WireLayout> {
        self.1.as_ref().and_then(|l| l.wire.clone())
    }
}

impl ExsBuf {
    fn remote(&self) -> Option<RemoteSlice> {
        // The core asks only when the peer must reach the buffer; a region without remote
        // rights then fails the operation with NotRemoteAccessible instead of an RMA fault.
        let access = self.region.access();
        if !access.contains(Access::REMOTE_READ) && !access.contains(Access::REMOTE_WRITE) {
            return None;
        }
        self.region.remote(self.offset..self.offset + self.len).ok()
    }
}
