//! Segment lists as receive targets: overlap checks.

use crate::cursor::{Cursor, Segment};
use crate::error::{DtypeError, Result};
use crate::types::Datatype;

/// One past a segment's last byte, exactly (any `i64`/`u64` pair).
fn end(seg: &Segment) -> i128 {
    i128::from(seg.offset) + i128::from(seg.len)
}

/// Checks a segment list meant for receiving: no byte may belong to two segments (which
/// byte wins would depend on arrival order). Zero-length segments hold no bytes and never
/// overlap; an empty list is valid. O(n) without allocating when the list is sorted by
/// offset (the usual case), O(n log n) otherwise.
pub fn validate_receive_segments(segments: &[Segment]) -> Result<()> {
    validate(segments.iter().copied())
}

fn validate(segments: impl Iterator<Item = Segment> + Clone) -> Result<()> {
    // Fast path: in ascending order, each segment starts at or after the previous end.
    let mut last: Option<Segment> = None;
    let mut sorted = true;
    for seg in segments.clone().filter(|s| s.len > 0) {
        if let Some(prev) = last {
            if i128::from(seg.offset) < end(&prev) {
                sorted = false;
                break;
            }
        }
        last = Some(seg);
    }
    if sorted {
        return Ok(());
    }
    let mut all: Vec<Segment> = segments.filter(|s| s.len > 0).collect();
    all.sort_unstable_by_key(|s| (s.offset, s.len));
    for pair in all.windows(2) {
        if i128::from(pair[1].offset) < end(&pair[0]) {
            return Err(DtypeError::Overlap {
                first: pair[0],
                second: pair[1],
            });
        }
    }
    Ok(())
}

impl Datatype {
    /// Checks that `count` instances of this type can be a receive target: no byte belongs
    /// to two entries of the type map (MPI makes such receives erroneous; ferry refuses
    /// them). Walks the layout with a cursor; it materializes the segments only if they are
    /// not in ascending order.
    pub fn check_receive(&self, count: u64) -> Result<()> {
        validate(Cursor::new(self, count)?)
    }
}
