//! Block aggregation (the seed's section 3.3): writes handed to a session together whose
//! ranges follow one another on the export travel as one request. Their data, staged in
//! several of the client's buffers, is gathered by one RMA into the first one's chunk, and
//! the server makes one write of it: fewer RMAs, request messages and replies per byte.
//!
//! Writes in flight together have no order among themselves (NBD's rule, and the client's:
//! a call returns only once its requests are answered), so a stretch of them may be sorted
//! by offset before it is cut into runs. Nothing else moves: a request that is not a write
//! stays where it was, between the stretches before and after it.

/// What the merge looks at in a request waiting to be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// A WRITE whose data sits in a staging buffer (only these merge).
    pub write: bool,
    /// The request's flags: pieces merge only with equal flags (FUA stays per request).
    pub flags: u8,
    /// Where it starts on the export.
    pub offset: u64,
    /// Its bytes.
    pub len: u32,
}

impl Piece {
    fn end(&self) -> u64 {
        self.offset + u64::from(self.len)
    }
}

/// How large one merged request may grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Its bytes: the size of the chunk that receives them.
    pub max_len: u32,
    /// Its pieces: the most local buffers one RMA gathers on the connection's driver.
    pub max_parts: usize,
}

/// Cuts `pieces` (in submission order) into requests, each a list of indices into
/// `pieces`: a write alone, or writes that follow one another on the export (in that
/// order), of equal flags, within `limits`; anything else alone, in its place.
pub fn plan(pieces: &[Piece], limits: Limits) -> Vec<Vec<usize>> {
    let mut out = Vec::with_capacity(pieces.len());
    let mut i = 0;
    while i < pieces.len() {
        if !pieces[i].write {
            out.push(vec![i]);
            i += 1;
            continue;
        }
        let end = (i..pieces.len())
            .find(|&j| !pieces[j].write)
            .unwrap_or(pieces.len());
        let mut stretch: Vec<usize> = (i..end).collect();
        stretch.sort_by_key(|&k| pieces[k].offset);
        cut_runs(pieces, &stretch, limits, &mut out);
        i = end;
    }
    out
}

/// Cuts a stretch of writes, sorted by offset, into runs (greedily: each run as long as
/// the next piece follows it and fits).
fn cut_runs(pieces: &[Piece], stretch: &[usize], limits: Limits, out: &mut Vec<Vec<usize>>) {
    let mut run: Vec<usize> = Vec::new();
    let mut bytes = 0u64;
    for &k in stretch {
        let p = pieces[k];
        let joins = run.last().is_some_and(|&last| {
            let l = pieces[last];
            l.flags == p.flags
                && l.end() == p.offset
                && bytes + u64::from(p.len) <= u64::from(limits.max_len)
                && run.len() < limits.max_parts
        });
        if !joins && !run.is_empty() {
            out.push(std::mem::take(&mut run));
            bytes = 0;
        }
        run.push(k);
        bytes += u64::from(p.len);
    }
    if !run.is_empty() {
        out.push(run);
    }
}

#[cfg(test)]
mod tests {
    use super::{plan, Limits, Piece};

    fn w(offset: u64, len: u32) -> Piece {
        Piece {
            write: true,
            flags: 0,
            offset,
            len,
        }
    }

    const LIMITS: Limits = Limits {
        max_len: 16 << 10,
        max_parts: 4,
    };

    #[test]
    fn adjacent_writes_become_one_request_in_offset_order() {
        let p = [w(8192, 4096), w(0, 4096), w(4096, 4096)];
        assert_eq!(plan(&p, LIMITS), vec![vec![1, 2, 0]]);
    }

    #[test]
    fn a_gap_a_flag_or_a_limit_starts_a_new_request() {
        let gap = [w(0, 4096), w(8192, 4096)];
        assert_eq!(plan(&gap, LIMITS), vec![vec![0], vec![1]]);
        let mut fua = w(4096, 4096);
        fua.flags = 1;
        assert_eq!(plan(&[w(0, 4096), fua], LIMITS), vec![vec![0], vec![1]]);
        let five: Vec<Piece> = (0..5).map(|i| w(i * 1024, 1024)).collect();
        assert_eq!(plan(&five, LIMITS), vec![vec![0, 1, 2, 3], vec![4]]);
        let big = [w(0, 12 << 10), w(12 << 10, 8 << 10)];
        assert_eq!(plan(&big, LIMITS), vec![vec![0], vec![1]]);
    }

    #[test]
    fn other_requests_keep_their_place_between_stretches() {
        let flush = Piece {
            write: false,
            flags: 0,
            offset: 0,
            len: 0,
        };
        let p = [w(4096, 4096), flush, w(0, 4096), w(8192, 4096)];
        assert_eq!(plan(&p, LIMITS), vec![vec![0], vec![1], vec![2], vec![3]]);
    }
}
