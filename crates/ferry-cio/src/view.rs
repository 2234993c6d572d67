//! File views: where the bytes of a rank's data stream lie in the file (MPI-IO semantics).
//!
//! A view is a displacement, an elementary type (etype) and a file type. The file type is
//! tiled from the displacement, one tile every extent; the view's data stream is the data
//! of those tiles in order, and an offset counts etypes of that stream. A call at `offset`
//! moving `len` bytes covers stream bytes `[offset * etype.size, + len)`, and
//! [`View::extents`] turns that window into file extents.
//!
//! The tile is flattened once, when the view is set ([`View::new`]): its runs and where
//! each starts in the tile's stream. A call then finds its first run by a binary search
//! and steps run by run, tile by tile, with arithmetic only (the seed's view, one 4-byte
//! int per tile, costs one step per int, not a walk of the type tree per piece). A file
//! type of very many runs per tile is not kept flat; its calls walk it lazily
//! ([`ferry_dtype::Cursor`], seeked to the window), never materializing the tiles before
//! the window.

use std::sync::Arc;

use ferry_dtype::{Cursor, Datatype, Segment};

use crate::error::{CioError, ErrorClass, Result};

/// The most file extents one call of one rank may cover (16 bytes each on the server):
/// a call of more, smaller pieces is refused, to be split.
pub const MAX_EXTENTS: usize = 1 << 24;

/// A run of file bytes: `len` bytes at `file`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    /// Byte offset in the file.
    pub file: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Equal runs at a fixed period: `count` runs of `len` bytes, the first at file offset
/// `first`, each `period` bytes after the one before (the seed's view: one 4-byte int
/// every 8 bytes). A call of such a view is kept in these four numbers, not listed run
/// by run, and placed and gathered with a tight loop ([`crate::domain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strided {
    /// File offset of the first run.
    pub first: u64,
    /// Bytes in each run (at least 1).
    pub len: u64,
    /// Bytes from one run's start to the next's (at least 1).
    pub period: u64,
    /// Runs (at least 1).
    pub count: u64,
}

impl Strided {
    /// Run `i` (below `count`).
    #[inline]
    pub fn run(&self, i: u64) -> Extent {
        Extent {
            file: self.first + i * self.period,
            len: self.len,
        }
    }

    /// The file offset just past the last run.
    pub fn end(&self) -> u64 {
        self.first + (self.count - 1) * self.period + self.len
    }
}

/// The file extents of one call: equal runs at a fixed period, or a list in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extents {
    /// Equal runs at a fixed period, none touching the next.
    Strided(Strided),
    /// Any extents.
    List(Vec<Extent>),
}

impl Default for Extents {
    fn default() -> Self {
        Extents::List(Vec::new())
    }
}

impl From<Vec<Extent>> for Extents {
    fn from(v: Vec<Extent>) -> Self {
        Extents::List(v)
    }
}

impl Extents {
    /// Every extent, in stream order.
    pub fn iter(&self) -> impl Iterator<Item = Extent> + '_ {
        let (list, strided) = match self {
            Extents::List(v) => (v.as_slice(), None),
            Extents::Strided(s) => (&[][..], Some(*s)),
        };
        let runs = strided
            .into_iter()
            .flat_map(|s| (0..s.count).map(move |i| s.run(i)));
        list.iter().copied().chain(runs)
    }

    /// How many extents.
    pub fn count(&self) -> u64 {
        match self {
            Extents::List(v) => v.len() as u64,
            Extents::Strided(s) => s.count,
        }
    }

    /// The bytes of data stream they hold.
    pub fn bytes(&self) -> u64 {
        match self {
            Extents::List(v) => v.iter().map(|e| e.len).sum(),
            Extents::Strided(s) => s.count * s.len,
        }
    }

    /// The extents as a list (a strided call listed run by run; `spare` gives the room).
    pub fn into_list(self, mut spare: Vec<Extent>) -> Vec<Extent> {
        match self {
            Extents::List(v) => v,
            Extents::Strided(s) => {
                spare.clear();
                spare.extend((0..s.count).map(|i| s.run(i)));
                spare
            }
        }
    }

    /// Cuts a stream's extents at file offset `size`: all of them up to the first that
    /// reaches it, that one shortened (a read stops at the end of the file).
    pub fn clip(&mut self, size: u64) {
        match self {
            Extents::List(v) => clip_list(v, size),
            Extents::Strided(s) => {
                if s.end() <= size {
                    return;
                }
                // Runs wholly before `size`; a run cut short makes the list irregular.
                let whole = match size.checked_sub(s.first + s.len) {
                    Some(room) => room / s.period + 1,
                    None => 0,
                };
                let next = s.first + whole * s.period;
                if whole > 0 && next >= size {
                    s.count = whole;
                } else {
                    let mut v = std::mem::take(self).into_list(Vec::new());
                    clip_list(&mut v, size);
                    *self = Extents::List(v);
                }
            }
        }
    }
}

/// [`Extents::clip`] of a list.
fn clip_list(extents: &mut Vec<Extent>, size: u64) {
    let Some(i) = extents.iter().position(|e| e.file + e.len > size) else {
        return;
    };
    let e = extents[i];
    if e.file < size {
        extents[i].len = size - e.file;
        extents.truncate(i + 1);
    } else {
        extents.truncate(i);
    }
}

/// The most runs a file type's tile may have to be kept flat (16 bytes and 8 bytes each
/// per view); a larger tile is walked by a cursor in each call.
const MAX_FLAT_RUNS: u64 = 1 << 16;

/// The most extents [`View::extents`] makes room for up front (32 MiB of them).
const MAX_RESERVE: u64 = 1 << 21;

/// One tile of a file type, flattened: `reps` repetitions, `step` bytes apart, of one
/// period's runs (the whole tile is one period unless it is a long vector, whose block is
/// the period).
#[derive(Debug)]
struct Tile {
    /// The period's merged runs, relative to the tile's origin, in stream order.
    runs: Vec<Segment>,
    /// `starts[i]`: the stream bytes of the runs before `runs[i]` (`starts[0]` is 0).
    starts: Vec<u64>,
    /// Stream bytes in one period.
    size: u64,
    /// Periods in a tile.
    reps: u64,
    /// Bytes from one period to the next.
    step: i64,
}

impl Tile {
    /// The flattened tile of `filetype`: whole if it has at most `max_runs` runs, else as
    /// repetitions of a period of at most that many; None if neither.
    fn of(filetype: &Datatype, max_runs: u64) -> Option<Tile> {
        if filetype.segment_count_hint(1) <= max_runs {
            return Tile::periodic(filetype, 1, 0);
        }
        match filetype.repeats() {
            Some((reps, step, period)) if reps > 1 && period.segment_count_hint(1) <= max_runs => {
                Tile::periodic(&period, reps, step)
            }
            _ => None,
        }
    }

    fn periodic(period: &Datatype, reps: u64, step: i64) -> Option<Tile> {
        let runs = period.flatten(1).ok()?;
        let starts = runs
            .iter()
            .scan(0u64, |at, r| {
                let start = *at;
                *at += r.len;
                Some(start)
            })
            .collect();
        let size = period.size();
        (size > 0).then_some(Tile {
            runs,
            starts,
            size,
            reps,
            step,
        })
    }

    /// The period holding stream byte `within` of the tile (below the tile's size), the
    /// run of the period holding it, and how far into that run it lies.
    fn find(&self, within: u64) -> (u64, usize, u64) {
        let (rep, inner) = (within / self.size, within % self.size);
        let i = self
            .starts
            .partition_point(|&s| s <= inner)
            .saturating_sub(1);
        (rep, i, inner - self.starts.get(i).copied().unwrap_or(0))
    }
}

/// A validated file view.
#[derive(Debug, Clone)]
pub struct View {
    disp: u64,
    etype: Datatype,
    filetype: Datatype,
    /// The file type's tile flattened, unless it has too many runs.
    tile: Option<Arc<Tile>>,
}

impl Default for View {
    /// The view every file starts with: displacement 0, bytes for etype and file type.
    fn default() -> Self {
        View::new(0, Datatype::byte(), Datatype::byte()).unwrap_or_else(|_| View {
            disp: 0,
            etype: Datatype::byte(),
            filetype: Datatype::byte(),
            tile: None,
        })
    }
}

fn arg(message: String) -> CioError {
    CioError::new(ErrorClass::Arg, message)
}

fn ty(message: String) -> CioError {
    CioError::new(ErrorClass::Type, message)
}

impl View {
    /// Checks a view as MPI-IO requires it, and what this server needs to place it: a
    /// displacement of at least 0, an etype holding data, a file type holding a whole
    /// number of etypes with a positive extent, and no tile reaching before the start of
    /// the file.
    pub fn new(disp: i64, etype: Datatype, filetype: Datatype) -> Result<View> {
        let disp = u64::try_from(disp).map_err(|_| {
            arg(format!(
                "the view's displacement is {disp}: it must be 0 or more bytes from the start of the file"
            ))
        })?;
        if etype.size() == 0 {
            return Err(ty("the etype holds no data".into()));
        }
        let (fsize, esize) = (filetype.size(), etype.size());
        if fsize == 0 || !fsize.is_multiple_of(esize) {
            return Err(ty(format!(
                "the file type holds {fsize} bytes, not a positive multiple of the etype's {esize}"
            )));
        }
        if filetype.extent() <= 0 {
            return Err(ty(format!(
                "the file type's extent is {}: tiles must follow each other (use a resized type)",
                filetype.extent()
            )));
        }
        if i128::from(disp) + i128::from(filetype.true_lb()) < 0 {
            return Err(arg(format!(
                "the file type reaches {} bytes below its origin, before the start of the file at displacement {disp}",
                -filetype.true_lb()
            )));
        }
        let tile = Tile::of(&filetype, MAX_FLAT_RUNS).map(Arc::new);
        Ok(View {
            disp,
            etype,
            filetype,
            tile,
        })
    }

    /// Bytes in one etype.
    pub fn etype_size(&self) -> u64 {
        self.etype.size()
    }

    /// The displacement.
    pub fn disp(&self) -> u64 {
        self.disp
    }

    /// The elementary type.
    pub fn etype(&self) -> &Datatype {
        &self.etype
    }

    /// The file type.
    pub fn filetype(&self) -> &Datatype {
        &self.filetype
    }

    /// Appends to `out` the file extents of data-stream bytes `[offset * etype size, + len)`,
    /// in stream order (merged where they touch). `len` must be a whole number of etypes;
    /// an offset or an extent beyond what a file can address, or more than
    /// [`MAX_EXTENTS`] pieces, is an error.
    pub fn extents(&self, offset: u64, len: u64, out: &mut Vec<Extent>) -> Result<()> {
        match self.window(offset, len)? {
            None => Ok(()),
            Some(w) => match &self.tile {
                Some(tile) => self.extents_by_tile(tile, &w, out),
                None => self.extents_by_cursor(&w, out),
            },
        }
    }

    /// The extents [`View::extents`] lists, kept as [`Strided`] where the view is one run
    /// per period at a fixed period and the window holds whole runs (`spare` is the room
    /// for a list otherwise). Errors are [`View::extents`]'s.
    pub fn pieces(&self, offset: u64, len: u64, mut spare: Vec<Extent>) -> Result<Extents> {
        if let Some(s) = self.strided(offset, len)? {
            return Ok(Extents::Strided(s));
        }
        spare.clear();
        self.extents(offset, len, &mut spare)?;
        Ok(Extents::List(spare))
    }

    /// The window as equal runs at a fixed period, if it is that (None leaves the window,
    /// and any error in it, to the general mapping).
    fn strided(&self, offset: u64, len: u64) -> Result<Option<Strided>> {
        let (Some(tile), Some(w)) = (&self.tile, self.window(offset, len)?) else {
            return Ok(None);
        };
        let [run] = tile.runs[..] else {
            return Ok(None);
        };
        // One run per period; the periods of a tile and those of the next tile must be
        // equally far apart.
        let extent = i128::from(self.filetype.extent());
        let period = match tile.reps {
            1 => extent,
            reps if i128::from(tile.step) * i128::from(reps) == extent => i128::from(tile.step),
            _ => return Ok(None),
        };
        if run.len == 0 {
            return Ok(None);
        }
        let whole_runs = w.within.is_multiple_of(run.len) && len.is_multiple_of(run.len);
        // Runs that touch (or overlap) are merged (or kept) by the list.
        if !whole_runs || period <= i128::from(run.len) {
            return Ok(None);
        }
        let count = len / run.len;
        if count > MAX_EXTENTS as u64 {
            return Ok(None);
        }
        let first =
            i128::from(w.base) + i128::from(run.offset) + i128::from(w.within / run.len) * period;
        let end = first + i128::from(count - 1) * period + i128::from(run.len);
        if first < 0 || end > i128::from(i64::MAX) {
            return Ok(None);
        }
        Ok(Some(Strided {
            first: first as u64,
            len: run.len,
            period: period as u64,
            count,
        }))
    }

    /// Where the window of `len` bytes at etype `offset` starts, or None if it is empty.
    fn window(&self, offset: u64, len: u64) -> Result<Option<Window>> {
        let esize = self.etype.size();
        if !len.is_multiple_of(esize) {
            return Err(ty(format!(
                "{len} bytes of data is not a whole number of {esize}-byte etypes"
            )));
        }
        if len == 0 {
            return Ok(None);
        }
        let start = offset
            .checked_mul(esize)
            .ok_or_else(|| too_far(offset, len))?;
        let fsize = self.filetype.size();
        let (tile, within) = (start / fsize, start % fsize);
        // The first tile's origin: disp + tile * extent, which must fit a file offset.
        let base = i128::from(self.disp) + i128::from(tile) * i128::from(self.filetype.extent());
        let base = i64::try_from(base).map_err(|_| too_far(offset, len))?;
        Ok(Some(Window {
            offset,
            len,
            within,
            base,
        }))
    }

    /// [`View::extents`] from the flattened tile: run by run, period by period, tile by
    /// tile.
    fn extents_by_tile(&self, tile: &Tile, w: &Window, out: &mut Vec<Extent>) -> Result<()> {
        let extent = i128::from(self.filetype.extent());
        let step = i128::from(tile.step);
        let (mut rep, mut i, mut skip) = tile.find(w.within);
        let mut origin = i128::from(w.base);
        let mut period = origin + i128::from(rep) * step;
        if let ([run], 1) = (&tile.runs[..], tile.reps) {
            if i128::from(run.len) == extent {
                // Tiles that continue each other (a contiguous file type): one extent.
                let at = origin + i128::from(run.offset) + i128::from(w.within);
                return push(out, at, w.len, w);
            }
        }
        // At most one piece per run met: room up front (within reason) rather than a
        // dozen reallocations of a million pieces.
        let runs = u64::try_from(tile.runs.len()).unwrap_or(u64::MAX);
        let periods = (w.within % tile.size + w.len).div_ceil(tile.size);
        let room = periods.saturating_mul(runs).min(MAX_RESERVE);
        out.reserve(usize::try_from(room).unwrap_or(0));
        let mut left = w.len;
        while left > 0 {
            let run = tile.runs.get(i).ok_or_else(|| w.too_far())?;
            let n = (run.len - skip).min(left);
            push(
                out,
                period + i128::from(run.offset) + i128::from(skip),
                n,
                w,
            )?;
            left -= n;
            skip = 0;
            i += 1;
            if i == tile.runs.len() {
                i = 0;
                rep += 1;
                if rep == tile.reps {
                    rep = 0;
                    origin += extent;
                    period = origin;
                } else {
                    period += step;
                }
            }
        }
        Ok(())
    }

    /// [`View::extents`] by walking the file type with a cursor (tiles of many runs).
    fn extents_by_cursor(&self, w: &Window, out: &mut Vec<Extent>) -> Result<()> {
        let tiles = (w.within + w.len).div_ceil(self.filetype.size());
        let mut c = Cursor::new(&self.filetype, tiles).map_err(|_| w.too_far())?;
        c.seek(w.within).map_err(|_| w.too_far())?;
        let mut left = w.len;
        while left > 0 {
            let s = c.next_segment(left).ok_or_else(|| w.too_far())?;
            push(out, i128::from(w.base) + i128::from(s.offset), s.len, w)?;
            left -= s.len;
        }
        Ok(())
    }
}

/// A call's window of a view's stream, located.
struct Window {
    offset: u64,
    len: u64,
    /// The window's first stream byte within its first tile.
    within: u64,
    /// The file offset of the first tile's origin.
    base: i64,
}

impl Window {
    fn too_far(&self) -> CioError {
        too_far(self.offset, self.len)
    }
}

fn too_far(offset: u64, len: u64) -> CioError {
    arg(format!(
        "offset {offset} (+{len} bytes) lies beyond what a file can address"
    ))
}

/// Appends the extent of `len` bytes at file offset `at` to `out`, merged with the last
/// one if they touch; an offset outside a file, or one piece too many, is an error.
#[inline]
fn push(out: &mut Vec<Extent>, at: i128, len: u64, w: &Window) -> Result<()> {
    let end = at + i128::from(len);
    if at < 0 || end > i128::from(i64::MAX) {
        return Err(w.too_far());
    }
    let file = at as u64;
    let full = out.len() >= MAX_EXTENTS;
    match out.last_mut() {
        Some(last) if last.file + last.len == file => last.len += len,
        _ if full => {
            return Err(arg(format!(
                "the call covers more than {MAX_EXTENTS} separate pieces of the file; split it"
            )))
        }
        _ => out.push(Extent { file, len }),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_dtype::Order;
    use proptest::prelude::*;
    use proptest::test_runner::RngSeed;

    fn int() -> Datatype {
        Datatype::primitive(4).unwrap()
    }

    /// The seed's view: every other int, rank r starting at int r.
    #[test]
    fn strided_view_of_two_ranks() {
        let ft = Datatype::resized(&int(), 0, 8).unwrap();
        let v = View::new(4, int(), ft).unwrap();
        let mut out = Vec::new();
        v.extents(1, 8, &mut out).unwrap();
        assert_eq!(
            out,
            [Extent { file: 12, len: 4 }, Extent { file: 20, len: 4 }]
        );
    }

    #[test]
    fn the_window_starts_mid_tile() {
        // Tiles of [0, 6) and [10, 12) with extent 16; the stream has 8 bytes per tile.
        let ft = Datatype::resized(
            &Datatype::from_segments(&[(0, 6).into(), (10, 2).into()]).unwrap(),
            0,
            16,
        )
        .unwrap();
        let v = View::new(100, Datatype::byte(), ft).unwrap();
        let mut out = Vec::new();
        v.extents(5, 7, &mut out).unwrap();
        assert_eq!(
            out,
            [
                Extent { file: 105, len: 1 },
                Extent { file: 110, len: 2 },
                Extent { file: 116, len: 4 },
            ]
        );
    }

    #[test]
    fn bad_views_are_clear_errors() {
        let e = View::new(-4, int(), int()).unwrap_err();
        assert_eq!(e.class, ErrorClass::Arg);
        assert!(e.message.contains("displacement"), "{e}");
        let e = View::new(0, int(), Datatype::primitive(6).unwrap()).unwrap_err();
        assert_eq!(e.class, ErrorClass::Type);
        let below = Datatype::hindexed(&[1], &[-8], &int()).unwrap();
        assert_eq!(
            View::new(4, int(), below.clone()).unwrap_err().class,
            ErrorClass::Arg
        );
        assert!(View::new(8, int(), below).is_ok());
        let v = View::new(0, int(), int()).unwrap();
        let mut out = Vec::new();
        assert_eq!(
            v.extents(u64::MAX / 2, 4, &mut out).unwrap_err().class,
            ErrorClass::Arg
        );
        assert_eq!(
            v.extents(0, 3, &mut out).unwrap_err().class,
            ErrorClass::Type
        );
        assert!(out.is_empty());
    }

    /// The extents of a window both ways: from the flattened tile and by the cursor.
    fn both_ways(v: &View, offset: u64, len: u64) -> (Result<Vec<Extent>>, Result<Vec<Extent>>) {
        both_ways_flat(v, offset, len, MAX_FLAT_RUNS)
    }

    /// [`both_ways`] with tiles kept flat up to `max_runs` runs (a smaller limit makes
    /// vectors repeat their period).
    fn both_ways_flat(
        v: &View,
        offset: u64,
        len: u64,
        max_runs: u64,
    ) -> (Result<Vec<Extent>>, Result<Vec<Extent>>) {
        let tile = Tile::of(&v.filetype, max_runs);
        let run = |by_tile: bool| -> Result<Vec<Extent>> {
            let mut out = Vec::new();
            if let Some(w) = v.window(offset, len)? {
                match (&tile, by_tile) {
                    (Some(tile), true) => v.extents_by_tile(tile, &w, &mut out)?,
                    _ => v.extents_by_cursor(&w, &mut out)?,
                }
            }
            Ok(out)
        };
        (run(true), run(false))
    }

    /// A vector or subarray file type (of a vector, or resized), with holes, negative
    /// strides and lower bounds below the origin.
    fn filetype() -> impl Strategy<Value = Option<Datatype>> {
        let prim = (1u64..=4).prop_map(|n| Datatype::primitive(n).ok());
        let vector = (1u64..5, 1u64..4, -6i64..9, prim.clone())
            .prop_map(|(c, b, st, t)| Datatype::vector(c, b, st, &t?).ok());
        let subarray = (
            prop::collection::vec((1u64..6, 0u64..6, 0u64..6), 1..=3),
            any::<bool>(),
            prim,
        )
            .prop_map(|(dims, c_order, t)| {
                let sizes: Vec<u64> = dims.iter().map(|d| d.0).collect();
                let subs: Vec<u64> = dims.iter().map(|d| 1 + d.1 % d.0).collect();
                let starts: Vec<u64> = dims
                    .iter()
                    .zip(&subs)
                    .map(|(d, s)| d.2 % (d.0 - s + 1))
                    .collect();
                let order = if c_order { Order::C } else { Order::Fortran };
                Datatype::subarray(&sizes, &subs, &starts, order, &t?).ok()
            });
        let base = prop_oneof![vector, subarray];
        (base, 0u8..3, -8i64..8, 1i64..48, 1u64..3, -5i64..6).prop_map(
            |(t, how, lb, extent, count, stride)| {
                let t = t?;
                match how {
                    0 => Some(t),
                    1 => Datatype::resized(&t, lb, extent).ok(),
                    _ => Datatype::hvector(count, 1, stride * 4, &t).ok(),
                }
            },
        )
    }

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 512,
            rng_seed: RngSeed::Fixed(17),
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    proptest! {
        #![proptest_config(config())]

        /// The arithmetic mapping over the flattened tile gives exactly the cursor's file
        /// ranges: any view (a displacement, an etype of 1 or more bytes), any window
        /// (starting mid-tile, spanning tiles), errors alike.
        #[test]
        fn the_tile_mapping_matches_the_cursor(
            ft in filetype(),
            disp in 0i64..64,
            etype in prop_oneof![Just(1u64), 1u64..=4],
            offset in 0u64..40,
            count in 0u64..60,
        ) {
            let Some(ft) = ft else { return Err(TestCaseError::reject("no type")) };
            let Ok(et) = Datatype::primitive(etype) else { return Err(TestCaseError::reject("etype")) };
            let Ok(v) = View::new(disp, et, ft) else { return Err(TestCaseError::reject("bad view")) };
            prop_assert!(v.tile.is_some());
            let (by_tile, by_cursor) = both_ways(&v, offset, count * etype);
            prop_assert_eq!(by_tile, by_cursor);
            // Tiles of more than one run repeat the period of their vector, if they are one.
            let (by_period, by_cursor) = both_ways_flat(&v, offset, count * etype, 1);
            prop_assert_eq!(by_period, by_cursor);
        }
    }

    /// A file type of one run per period: a block of ints resized to a longer extent, or
    /// the seed's vector of single blocks resized to its whole length (its tile repeats
    /// a period), with a lower bound that may shift the run; sometimes a tile whose
    /// periods do not continue into the next tile's.
    fn one_run_filetype() -> impl Strategy<Value = Option<Datatype>> {
        (1u64..4, 1u64..6, -3i64..4, 0u8..3, 1u64..6, 0i64..3).prop_map(
            |(block, gap, lb, how, count, slack)| {
                let run = Datatype::contiguous(block, &int()).ok()?;
                let period = 4 * (block + gap) as i64;
                match how {
                    0 => Datatype::resized(&run, lb, period).ok(),
                    _ => {
                        let stride = (block + gap) as i64;
                        let v = Datatype::vector(count, block, stride, &int()).ok()?;
                        let extent = period * count as i64 + 4 * slack * i64::from(how - 1);
                        Datatype::resized(&v, 0, extent).ok()
                    }
                }
            },
        )
    }

    proptest! {
        #![proptest_config(config())]

        /// A call kept strided is exactly the list [`View::extents`] makes of it, errors
        /// alike: any one-run view, windows starting mid-run or mid-tile, and the general
        /// file types (which mostly stay lists).
        #[test]
        fn strided_pieces_match_the_list(
            ft in prop_oneof![one_run_filetype(), filetype()],
            disp in 0i64..64,
            etype in prop_oneof![Just(4u64), 1u64..=4],
            offset in 0u64..40,
            count in 0u64..60,
        ) {
            let Some(ft) = ft else { return Err(TestCaseError::reject("no type")) };
            let Ok(et) = Datatype::primitive(etype) else { return Err(TestCaseError::reject("etype")) };
            let Ok(v) = View::new(disp, et, ft) else { return Err(TestCaseError::reject("bad view")) };
            let len = count * etype;
            let mut listed = Vec::new();
            let listed = v.extents(offset, len, &mut listed).map(|()| listed);
            let pieces = v.pieces(offset, len, Vec::new());
            let as_list = pieces.as_ref().map(|p| p.iter().collect::<Vec<_>>()).map_err(Clone::clone);
            prop_assert_eq!(as_list, listed);
            if let Ok(p) = &pieces {
                prop_assert_eq!(p.count(), p.iter().count() as u64);
                prop_assert_eq!(p.bytes(), if p.count() == 0 { 0 } else { len });
            }
        }

        /// A strided read cut at the end of the file keeps exactly the runs (and the part
        /// of a run) a list cut there keeps.
        #[test]
        fn strided_clip_matches_the_list(
            first in 0u64..40, len in 1u64..6, gap in 1u64..6, count in 1u64..20, size in 0u64..160,
        ) {
            let s = Extents::Strided(Strided { first, len, period: len + gap, count });
            let mut list = Extents::List(s.iter().collect());
            let mut cut = s.clone();
            cut.clip(size);
            list.clip(size);
            prop_assert_eq!(cut.iter().collect::<Vec<_>>(), list.iter().collect::<Vec<_>>());
        }
    }

    /// The seed's view is kept strided: one int every 8 bytes, a million of them.
    #[test]
    fn the_seed_view_is_strided() {
        let n = 1_024_000u64;
        let vector = Datatype::vector(n, 1, 2, &int()).unwrap();
        let seed = Datatype::resized(&vector, 0, 8 * n as i64).unwrap();
        let v = View::new(4, int(), seed).unwrap();
        assert_eq!(
            v.pieces(0, 4 * n, Vec::new()).unwrap(),
            Extents::Strided(Strided {
                first: 4,
                len: 4,
                period: 8,
                count: n
            })
        );
    }

    /// The seed's view on a million ints: every other int, starting at the rank's, as
    /// the seed program sets it (one tile: a vector of a million ints, resized) and as one
    /// int per tile; a window starting mid-stream.
    #[test]
    fn the_seed_view_maps_by_arithmetic() {
        let n = 1_024_000;
        let vector = Datatype::vector(n, 1, 2, &int()).unwrap();
        let seed = Datatype::resized(&vector, 0, 8 * n as i64).unwrap();
        let per_int = Datatype::resized(&int(), 0, 8).unwrap();
        for ft in [seed, per_int] {
            let v = View::new(4, int(), ft).unwrap();
            assert!(v.tile.as_ref().is_some_and(|t| t.runs.len() == 1), "{v:?}");
            let (by_tile, by_cursor) = both_ways(&v, 1000, 4 * (n - 1000));
            let by_tile = by_tile.unwrap();
            assert_eq!(by_tile.len(), n as usize - 1000);
            assert_eq!(by_tile[0], Extent { file: 8004, len: 4 });
            assert_eq!(by_tile, by_cursor.unwrap());
        }
        // A contiguous view is one extent, however long.
        let v = View::new(0, int(), int()).unwrap();
        let mut out = Vec::new();
        v.extents(3, 1 << 40, &mut out).unwrap();
        assert_eq!(
            out,
            [Extent {
                file: 12,
                len: 1 << 40
            }]
        );
    }
}
