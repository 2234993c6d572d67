//! The collective session machine: pure, no I/O.
//!
//! A session is one job's open of one file: its ranks, each on a connection of its own,
//! make the same collective calls in the same order. The machine takes what the ranks
//! send ([`Session::arrive`]), that a rank's connection ended ([`Session::gone`]) and the
//! passing of time ([`Session::tick`]); it answers with what to do: run a file action once
//! every rank made the call ([`Output::Run`]: place a collective write, read the regions
//! of a collective read, set the size, ...), or fail the ranks waiting
//! ([`Output::Fail`]). It decides nothing about files; the server executes the actions.
//!
//! The rules:
//! - A collective call completes when every rank has made it; until then the ranks that
//!   made it wait.
//! - Ranks making different calls, or the same call with different access modes or sizes,
//!   fail together ([`ErrorClass::NotSame`]); so do all ranks of a call whose contribution
//!   one rank could not make (a bad view, say), with that rank's error.
//! - A collective write whose pieces overlap fails on every rank, and nothing is written.
//! - A rank whose connection ends, or that leaves the others waiting longer than the
//!   timeout, ends the session: the ranks waiting fail at once ([`ErrorClass::RankLost`]),
//!   and so does every later collective call. Nobody waits for a rank that will not come.

use std::time::{Duration, Instant};

use crate::domain;
use crate::error::{CioError, ErrorClass};
use crate::view::Extents;

/// A rank of the session's communicator.
pub type Rank = u32;

/// Which collective call a rank made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// The collective open.
    Open,
    /// SET_VIEW.
    SetView,
    /// WRITE_AT_ALL.
    WriteAtAll,
    /// READ_AT_ALL.
    ReadAtAll,
    /// SET_SIZE.
    SetSize,
    /// PREALLOCATE.
    Preallocate,
    /// SYNC.
    Sync,
    /// CLOSE.
    Close,
}

/// What one rank brings to a collective call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work {
    /// Nothing but its arrival (SET_VIEW, SYNC, CLOSE).
    Nothing,
    /// A value every rank must agree on: the access mode of OPEN, the size of SET_SIZE
    /// and PREALLOCATE.
    Value(u64),
    /// A write: the file extents of its data stream in stream order, and the stream.
    Write {
        /// Where each run of the stream goes.
        extents: Extents,
        /// The data stream.
        data: Vec<u8>,
    },
    /// A read: the file extents of the stream it wants, in stream order.
    Read {
        /// Where each run of the stream comes from.
        extents: Extents,
    },
}

/// One piece of a collective write: `len` bytes of `rank`'s stream from `at`, going to
/// file offset `file`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// File offset.
    pub file: u64,
    /// Length.
    pub len: u64,
    /// The rank whose stream holds it.
    pub rank: Rank,
    /// Its offset in that stream.
    pub at: u64,
}

/// A file action, run once every rank made the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Open the file with this access mode.
    Open {
        /// The access mode every rank gave.
        amode: u32,
    },
    /// Nothing to do on the file (SET_VIEW).
    Nothing,
    /// Write every rank's pieces: `pieces` sorted by file offset and disjoint; the bytes
    /// are in `data[rank]` at each piece's `at`.
    PlaceWrite {
        /// The pieces, sorted and disjoint.
        pieces: Vec<Piece>,
        /// Each rank's data stream.
        data: Vec<Vec<u8>>,
    },
    /// Write a collective call of many small pieces close together through one buffer over
    /// the file span `[lo, hi)` they cover ([`crate::domain`]): every rank's pieces copied
    /// in, then `regions` written, each at once; the holes between them never are.
    PlaceDomain {
        /// The span's first byte.
        lo: u64,
        /// The span's end.
        hi: u64,
        /// The claimed runs `(file offset, length)`, ascending and apart: what is written.
        regions: Vec<(u64, u64)>,
        /// Each rank's extents (stream order) and data stream.
        ranks: Vec<(Extents, Vec<u8>)>,
    },
    /// Read the file regions every rank's extents cover; rank `r` receives the bytes of
    /// `wants[r]`, in order.
    ReadRegions {
        /// Each rank's extents, in stream order.
        wants: Vec<Extents>,
    },
    /// Truncate or extend the file.
    SetSize(u64),
    /// Allocate the first bytes (the file grows to at least this).
    Preallocate(u64),
    /// Make the data durable.
    Sync,
    /// Close the file (the session is over once it ran).
    Close,
}

/// What the server does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Every rank made the call `kind`: run `action`, then answer every rank with its
    /// outcome.
    Run {
        /// The call.
        kind: CallKind,
        /// What to do on the file.
        action: Action,
    },
    /// Answer these ranks with this error.
    Fail {
        /// The ranks (each waiting for an answer).
        ranks: Vec<Rank>,
        /// Why.
        error: CioError,
    },
}

/// One rank's arrival at the call in progress.
#[derive(Debug)]
struct Arrival {
    kind: CallKind,
    work: Result<Work, CioError>,
}

/// The collective state of one session.
#[derive(Debug)]
pub struct Session {
    size: Rank,
    timeout: Duration,
    /// Per rank: its arrival at the call in progress.
    pending: Vec<Option<Arrival>>,
    /// When the first rank arrived at the call in progress.
    since: Option<Instant>,
    /// Ranks whose connection ended.
    gone: Vec<bool>,
    /// Why the session is over, once it is.
    broken: Option<CioError>,
    /// Set once CLOSE ran.
    closed: bool,
}

impl Session {
    /// A session of `size` ranks (at least 1) whose collective calls fail when a rank
    /// leaves the others waiting longer than `timeout`.
    pub fn new(size: Rank, timeout: Duration) -> Session {
        let n = size.max(1) as usize;
        Session {
            size: size.max(1),
            timeout,
            pending: (0..n).map(|_| None).collect(),
            since: None,
            gone: vec![false; n],
            broken: None,
            closed: false,
        }
    }

    /// Ranks in the session.
    pub fn size(&self) -> Rank {
        self.size
    }

    /// Whether the session is over: closed, or broken by a rank lost.
    pub fn is_over(&self) -> bool {
        self.closed || self.broken.is_some()
    }

    /// Why the session broke, if it did.
    pub fn broken(&self) -> Option<&CioError> {
        self.broken.as_ref()
    }

    /// Ranks waiting in the call in progress.
    pub fn waiting(&self) -> Vec<Rank> {
        (0..self.size)
            .filter(|&r| self.pending[r as usize].is_some())
            .collect()
    }

    /// `rank` made collective call `kind` bringing `work` (or the error that kept it from
    /// bringing any) at `now`.
    pub fn arrive(
        &mut self,
        rank: Rank,
        kind: CallKind,
        work: Result<Work, CioError>,
        now: Instant,
    ) -> Vec<Output> {
        if rank >= self.size {
            return vec![fail(
                vec![rank],
                ErrorClass::Arg,
                format!("rank {rank} is not in a session of {} ranks", self.size),
            )];
        }
        if let Some(e) = &self.broken {
            return vec![Output::Fail {
                ranks: vec![rank],
                error: e.clone(),
            }];
        }
        if self.closed {
            return vec![fail(
                vec![rank],
                ErrorClass::BadFile,
                format!("{kind:?} after the file was closed"),
            )];
        }
        let slot = &mut self.pending[rank as usize];
        if slot.is_some() {
            return vec![fail(
                vec![rank],
                ErrorClass::Arg,
                format!("rank {rank} made a collective call while its last one is still waiting"),
            )];
        }
        *slot = Some(Arrival { kind, work });
        self.since.get_or_insert(now);
        if self.pending.iter().all(Option::is_some) {
            self.complete()
        } else {
            Vec::new()
        }
    }

    /// `rank`'s connection ended. If it had not made the call in progress, the ranks
    /// waiting fail now, and the session is over; if it had, the call completes without
    /// it, and the session ends after it.
    pub fn gone(&mut self, rank: Rank) -> Vec<Output> {
        let Some(g) = self.gone.get_mut(rank as usize) else {
            return Vec::new();
        };
        *g = true;
        if self.closed || self.broken.is_some() {
            return Vec::new();
        }
        if self.pending[rank as usize].is_some() {
            // Its call is in; the session ends once that call completes.
            return Vec::new();
        }
        self.break_with(CioError::new(
            ErrorClass::RankLost,
            format!("rank {rank} left the session (its connection ended); the session is over"),
        ))
    }

    /// Time passed: the call in progress fails on every rank waiting if the others left
    /// them waiting `timeout` or longer, and the session is over.
    pub fn tick(&mut self, now: Instant) -> Vec<Output> {
        let Some(since) = self.since else {
            return Vec::new();
        };
        if self.broken.is_some() || now.saturating_duration_since(since) < self.timeout {
            return Vec::new();
        }
        let missing: Vec<Rank> = (0..self.size)
            .filter(|&r| self.pending[r as usize].is_none())
            .collect();
        let kind = self
            .pending
            .iter()
            .flatten()
            .map(|a| a.kind)
            .next()
            .unwrap_or(CallKind::Sync);
        self.break_with(CioError::new(
            ErrorClass::RankLost,
            format!(
                "ranks {missing:?} did not make the collective {kind:?} within {} s; the session is over",
                self.timeout.as_secs_f64()
            ),
        ))
    }

    /// Ends the session with `error`: every rank waiting fails with it, and so will every
    /// later call.
    fn break_with(&mut self, error: CioError) -> Vec<Output> {
        self.broken = Some(error.clone());
        let ranks = self.waiting();
        self.clear();
        if ranks.is_empty() {
            Vec::new()
        } else {
            vec![Output::Fail { ranks, error }]
        }
    }

    fn clear(&mut self) {
        self.pending.iter_mut().for_each(|p| *p = None);
        self.since = None;
    }

    /// Every rank arrived: the action, or the error every rank gets.
    fn complete(&mut self) -> Vec<Output> {
        let arrivals: Vec<Arrival> = self.pending.iter_mut().filter_map(Option::take).collect();
        self.since = None;
        let all: Vec<Rank> = (0..self.size).collect();
        let out = match plan(arrivals) {
            Ok((kind, action)) => {
                if kind == CallKind::Close {
                    self.closed = true;
                }
                Output::Run { kind, action }
            }
            Err(error) => Output::Fail { ranks: all, error },
        };
        let mut outs = vec![out];
        // A rank that left after making this call ends the session now that it is done.
        if let Some(r) = self.gone.iter().position(|&g| g) {
            if !self.closed {
                outs.extend(self.break_with(CioError::new(
                    ErrorClass::RankLost,
                    format!(
                        "rank {r} left the session (its connection ended); the session is over"
                    ),
                )));
            }
        }
        outs
    }
}

fn fail(ranks: Vec<Rank>, class: ErrorClass, message: String) -> Output {
    Output::Fail {
        ranks,
        error: CioError::new(class, message),
    }
}

/// The action of a complete call (every rank's arrival, in rank order), or why it fails.
fn plan(arrivals: Vec<Arrival>) -> Result<(CallKind, Action), CioError> {
    let kind = arrivals.first().map_or(CallKind::Sync, |a| a.kind);
    if let Some((r, a)) = arrivals.iter().enumerate().find(|(_, a)| a.kind != kind) {
        return Err(CioError::new(
            ErrorClass::NotSame,
            format!(
                "the ranks made different collective calls: rank 0 {kind:?}, rank {r} {:?}",
                a.kind
            ),
        ));
    }
    let mut works = Vec::with_capacity(arrivals.len());
    for (r, a) in arrivals.into_iter().enumerate() {
        match a.work {
            Ok(w) => works.push(w),
            Err(e) => return Err(CioError::new(e.class, format!("rank {r}: {}", e.message))),
        }
    }
    let action = match kind {
        CallKind::Open => Action::Open {
            amode: u32::try_from(agreed(kind, &works)?).unwrap_or(u32::MAX),
        },
        CallKind::SetSize => Action::SetSize(agreed(kind, &works)?),
        CallKind::Preallocate => Action::Preallocate(agreed(kind, &works)?),
        CallKind::SetView => Action::Nothing,
        CallKind::Sync => Action::Sync,
        CallKind::Close => Action::Close,
        CallKind::WriteAtAll => placement(works)?,
        CallKind::ReadAtAll => Action::ReadRegions {
            wants: works
                .into_iter()
                .map(|w| match w {
                    Work::Read { extents } => extents,
                    _ => Extents::default(),
                })
                .collect(),
        },
    };
    Ok((kind, action))
}

/// The value every rank gave for `kind`.
fn agreed(kind: CallKind, works: &[Work]) -> Result<u64, CioError> {
    let value = |w: &Work| match w {
        Work::Value(v) => Some(*v),
        _ => None,
    };
    let first = works.first().and_then(value);
    if let Some((r, w)) = works.iter().enumerate().find(|(_, w)| value(w) != first) {
        return Err(CioError::new(
            ErrorClass::NotSame,
            format!(
                "the ranks gave {kind:?} different values: rank 0 {first:?}, rank {r} {:?}",
                value(w)
            ),
        ));
    }
    first.ok_or_else(|| CioError::new(ErrorClass::Arg, format!("{kind:?} without its value")))
}

/// A write's placement: for many small pieces close together, one buffer over the span
/// they cover ([`Action::PlaceDomain`]); otherwise every rank's pieces (`works[r]` is rank
/// `r`'s [`Work::Write`]) sorted by file offset ([`Action::PlaceWrite`]). Pieces that
/// overlap are an error (which rank's byte would land depends on nothing MPI defines),
/// and nothing is written.
pub fn placement(works: Vec<Work>) -> Result<Action, CioError> {
    let ranks: Vec<(Extents, Vec<u8>)> = works
        .into_iter()
        .map(|w| match w {
            Work::Write { extents, data } => (extents, data),
            _ => (Extents::default(), Vec::new()),
        })
        .collect();
    let lists = || ranks.iter().map(|(e, _)| e);
    if let Some((lo, hi)) = domain::dense_span(lists()) {
        // None: an overlap, which the piece-by-piece placement below reports exactly.
        if let Some(regions) = domain::claim(lists(), (lo, hi)) {
            return Ok(Action::PlaceDomain {
                lo,
                hi,
                regions,
                ranks,
            });
        }
    }
    place_pieces(ranks)
}

/// [`placement`] piece by piece: every rank's pieces merged by file offset.
fn place_pieces(ranks: Vec<(Extents, Vec<u8>)>) -> Result<Action, CioError> {
    let mut lists = Vec::with_capacity(ranks.len());
    let mut data = Vec::with_capacity(ranks.len());
    for (rank, (extents, bytes)) in ranks.into_iter().enumerate() {
        let mut at = 0u64;
        let mut pieces = Vec::with_capacity(usize::try_from(extents.count()).unwrap_or(0));
        for e in extents.iter() {
            if e.len > 0 {
                pieces.push(Piece {
                    file: e.file,
                    len: e.len,
                    rank: rank as Rank,
                    at,
                });
            }
            at += e.len;
        }
        lists.push(pieces);
        data.push(bytes);
    }
    let pieces = merge_by_offset(lists, |p| p.file);
    for w in pieces.windows(2) {
        let (a, b) = (w[0], w[1]);
        if a.file + a.len > b.file {
            let from = b.file;
            let to = (a.file + a.len).min(b.file + b.len);
            let who = if a.rank == b.rank {
                format!("rank {} writes them twice", a.rank)
            } else {
                format!("ranks {} and {} both write them", a.rank, b.rank)
            };
            return Err(CioError::new(
                ErrorClass::Arg,
                format!(
                    "overlapping pieces in one collective write: bytes [{from}, {to}): {who}; nothing was written"
                ),
            ));
        }
    }
    Ok(Action::PlaceWrite { pieces, data })
}

/// The most lists [`merge_by_offset`] merges head by head; more are sorted instead.
const MERGE_WAYS: usize = 8;

/// Every item of `lists`, ordered by `key`. Views mostly ascend, so each rank's list
/// usually is in order already: a few such lists are merged in one pass, picking the
/// lowest head each time (linear, where a sort of a million 4-byte pieces costs most of a
/// collective call); otherwise everything is sorted.
pub fn merge_by_offset<T: Copy>(lists: Vec<Vec<T>>, key: impl Fn(&T) -> u64) -> Vec<T> {
    let ascending = |l: &Vec<T>| l.windows(2).all(|w| key(&w[0]) <= key(&w[1]));
    let total = lists.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(total);
    if lists.len() > MERGE_WAYS || !lists.iter().all(ascending) {
        out.extend(lists.into_iter().flatten());
        out.sort_unstable_by_key(|t| key(t));
        return out;
    }
    let mut heads = vec![0usize; lists.len()];
    while out.len() < total {
        let mut best: Option<(u64, usize)> = None;
        for (i, l) in lists.iter().enumerate() {
            if let Some(t) = l.get(heads[i]) {
                let k = key(t);
                match best {
                    Some((b, _)) if b <= k => {}
                    _ => best = Some((k, i)),
                }
            }
        }
        let Some((_, i)) = best else { break };
        out.push(lists[i][heads[i]]);
        heads[i] += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(10);

    fn write(extents: &[(u64, u64)]) -> Result<Work, CioError> {
        let extents: Vec<crate::view::Extent> = extents
            .iter()
            .map(|&(file, len)| crate::view::Extent { file, len })
            .collect();
        let n: u64 = extents.iter().map(|e| e.len).sum();
        Ok(Work::Write {
            extents: extents.into(),
            data: vec![0; n as usize],
        })
    }

    #[test]
    fn a_write_completes_with_the_last_rank_sorted() {
        let now = Instant::now();
        let mut s = Session::new(2, T);
        assert!(s
            .arrive(1, CallKind::WriteAtAll, write(&[(4, 4), (12, 4)]), now)
            .is_empty());
        let out = s.arrive(0, CallKind::WriteAtAll, write(&[(0, 4), (8, 4)]), now);
        let [Output::Run {
            kind: CallKind::WriteAtAll,
            action: Action::PlaceWrite { pieces, .. },
        }] = &out[..]
        else {
            panic!("{out:?}")
        };
        let files: Vec<(u64, Rank, u64)> = pieces.iter().map(|p| (p.file, p.rank, p.at)).collect();
        assert_eq!(files, [(0, 0, 0), (4, 1, 0), (8, 0, 4), (12, 1, 4)]);
    }

    /// Many small interleaved pieces: one domain buffer, one region; overlapping ones fail
    /// with the exact range, as piece by piece, and nothing is placed.
    #[test]
    fn many_small_pieces_make_one_domain_and_overlaps_still_fail() {
        let ints = |first: u64| (0..300).map(|i| (first + 8 * i, 4)).collect::<Vec<_>>();
        let now = Instant::now();
        let mut s = Session::new(2, T);
        s.arrive(0, CallKind::WriteAtAll, write(&ints(0)), now);
        let out = s.arrive(1, CallKind::WriteAtAll, write(&ints(4)), now);
        let [Output::Run {
            action: Action::PlaceDomain {
                lo, hi, regions, ..
            },
            ..
        }] = &out[..]
        else {
            panic!("{out:?}")
        };
        assert_eq!((*lo, *hi, regions.as_slice()), (0, 2400, &[(0, 2400)][..]));
        s.arrive(0, CallKind::WriteAtAll, write(&ints(0)), now);
        let out = s.arrive(1, CallKind::WriteAtAll, write(&ints(2)), now);
        assert!(
            matches!(&out[..], [Output::Fail { ranks, error }]
                if ranks == &[0, 1] && error.message.contains("overlapping pieces") && error.message.contains("[2, 4)")),
            "{out:?}"
        );
    }

    #[test]
    fn merging_sorted_and_unsorted_lists() {
        let m = merge_by_offset(vec![vec![1u64, 4, 9], vec![2, 3, 10], vec![]], |&x| x);
        assert_eq!(m, [1, 2, 3, 4, 9, 10]);
        let m = merge_by_offset(vec![vec![5u64, 1], vec![3]], |&x| x);
        assert_eq!(m, [1, 3, 5]);
    }

    #[test]
    fn overlap_and_mismatch_fail_everyone() {
        let now = Instant::now();
        let mut s = Session::new(2, T);
        s.arrive(0, CallKind::WriteAtAll, write(&[(0, 8)]), now);
        let out = s.arrive(1, CallKind::WriteAtAll, write(&[(4, 8)]), now);
        assert!(
            matches!(&out[..], [Output::Fail { ranks, error }]
                if ranks == &[0, 1] && error.class == ErrorClass::Arg && error.message.contains("[4, 8)")),
            "{out:?}"
        );
        s.arrive(0, CallKind::Sync, Ok(Work::Nothing), now);
        let out = s.arrive(1, CallKind::Close, Ok(Work::Nothing), now);
        assert!(
            matches!(&out[..], [Output::Fail { ranks, error }]
                if ranks == &[0, 1] && error.class == ErrorClass::NotSame),
            "{out:?}"
        );
        // Not broken: the next call works.
        s.arrive(0, CallKind::SetSize, Ok(Work::Value(5)), now);
        let out = s.arrive(1, CallKind::SetSize, Ok(Work::Value(5)), now);
        assert_eq!(
            out,
            [Output::Run {
                kind: CallKind::SetSize,
                action: Action::SetSize(5)
            }]
        );
    }

    #[test]
    fn a_lost_rank_fails_the_waiting_at_once() {
        let now = Instant::now();
        let mut s = Session::new(3, T);
        s.arrive(0, CallKind::Sync, Ok(Work::Nothing), now);
        s.arrive(2, CallKind::Sync, Ok(Work::Nothing), now);
        let out = s.gone(1);
        assert!(
            matches!(&out[..], [Output::Fail { ranks, error }]
                if ranks == &[0, 2] && error.class == ErrorClass::RankLost),
            "{out:?}"
        );
        let out = s.arrive(0, CallKind::Close, Ok(Work::Nothing), now);
        assert!(matches!(&out[..], [Output::Fail { ranks, .. }] if ranks == &[0]));
    }

    #[test]
    fn a_silent_rank_times_out() {
        let now = Instant::now();
        let mut s = Session::new(2, T);
        s.arrive(1, CallKind::Sync, Ok(Work::Nothing), now);
        assert!(s.tick(now + T / 2).is_empty());
        let out = s.tick(now + T);
        assert!(
            matches!(&out[..], [Output::Fail { ranks, error }]
                if ranks == &[1] && error.message.contains("[0]")),
            "{out:?}"
        );
    }
}
