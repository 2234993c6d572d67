//! Datatypes: immutable layout descriptions built with MPI's constructors.
//!
//! Every constructor computes the new type's size, bounds and density once, with checked
//! arithmetic, so that everything derived from a type later (cursor offsets, packed positions)
//! fits 64 bits by construction.

use std::fmt;
use std::sync::Arc;

use crate::error::{DtypeError, Result};

/// The public constructor that made a type, with its arguments as given (element
/// displacements stay in elements), so the description says what the caller said.
pub(crate) enum Ctor {
    /// `primitive(size)` (the size is the node's).
    Primitive,
    /// `contiguous(count, old)`.
    Contiguous { count: u64, old: Datatype },
    /// `vector` (stride in elements) or `hvector` (`bytes`: in bytes).
    Vector {
        bytes: bool,
        count: u64,
        blocklen: u64,
        stride: i64,
        old: Datatype,
    },
    /// `indexed` or `hindexed` (also `from_segments`: bytes of `byte()`).
    Indexed {
        bytes: bool,
        blocklens: Box<[u64]>,
        displs: Box<[i64]>,
        old: Datatype,
    },
    /// `indexed_block` or `hindexed_block`.
    IndexedBlock {
        bytes: bool,
        blocklen: u64,
        displs: Box<[i64]>,
        old: Datatype,
    },
    /// `structure`.
    Struct {
        blocklens: Box<[u64]>,
        displs: Box<[i64]>,
        types: Box<[Datatype]>,
    },
    /// `resized(old, lb, extent)`.
    Resized { lb: i64, extent: i64, old: Datatype },
    /// `subarray`.
    Subarray {
        sizes: Box<[u64]>,
        subsizes: Box<[u64]>,
        starts: Box<[u64]>,
        order: Order,
        old: Datatype,
    },
}

/// An immutable description of where the bytes of one value lie relative to its origin: an
/// MPI-like datatype.
///
/// Cheap to clone (a shared handle). Built with the constructors below, which mirror MPI's
/// (`MPI_Type_contiguous`, `MPI_Type_vector`, ...), nest to any depth, and return
/// [`DtypeError`] for an inconsistent or overflowing description. See the crate documentation
/// for the model (type map, bounds, extent).
#[derive(Clone)]
pub struct Datatype(pub(crate) Arc<Node>);

/// Storage order of a [`Datatype::subarray`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Order {
    /// Row-major: the last dimension varies fastest (`MPI_ORDER_C`).
    C,
    /// Column-major: the first dimension varies fastest (`MPI_ORDER_FORTRAN`).
    Fortran,
}

/// One type: what it is made of plus the figures computed when it was built.
pub(crate) struct Node {
    pub(crate) kind: Kind,
    /// The constructor that made it (for `Debug`).
    name: &'static str,
    /// Data bytes in one instance.
    pub(crate) size: u64,
    pub(crate) lb: i64,
    pub(crate) ub: i64,
    pub(crate) extent: i64,
    /// Explicit (sticky) bound markers, from `resized` somewhere below.
    lb_mark: Option<i64>,
    ub_mark: Option<i64>,
    /// Lowest data offset and one past the highest (the true bounds); 0, 0 without data.
    pub(crate) true_lb: i64,
    pub(crate) true_ub: i64,
    /// The data of one instance is a single run `[true_lb, true_lb + size)` in stream order
    /// (trivially so without data).
    pub(crate) dense: bool,
    /// Dense, with data, and `extent == size`: consecutive instances form one run too.
    pub(crate) tiles: bool,
    /// Nesting depth (a primitive is 1).
    pub(crate) depth: usize,
    /// Leaf runs the cursor visits for one instance before merging (saturating).
    pub(crate) raw_segments: u64,
    /// The public constructor and arguments that made it, for the wire description
    /// ([`Datatype::encode`]); `None` for the intermediate nodes constructors build inside.
    pub(crate) ctor: Option<Ctor>,
}

/// The shapes the cursor walks. Every constructor lowers to one of these.
pub(crate) enum Kind {
    /// `size` contiguous bytes at offset 0.
    Bytes,
    /// `count` blocks `stride` bytes apart, each `blocklen` copies of `child` laid out by its
    /// extent (contiguous, vector, hvector).
    Vector {
        count: u64,
        blocklen: u64,
        stride: i64,
        child: Datatype,
    },
    /// Blocks of `child` at byte displacements (indexed, hindexed, indexed_block, segment
    /// lists). Only blocks holding data are kept; `prefix[i]` counts the elements before
    /// block `i` (one more entry than blocks).
    Indexed {
        blocks: Box<[(u64, i64)]>,
        prefix: Box<[u64]>,
        child: Datatype,
    },
    /// Blocks of different types (struct). Only blocks holding data are kept; `prefix[i]`
    /// counts the bytes before block `i`.
    Struct {
        blocks: Box<[(u64, i64, Datatype)]>,
        prefix: Box<[u64]>,
    },
    /// The child's data with new bounds.
    Resized { child: Datatype },
}

impl Kind {
    /// Number of blocks.
    pub(crate) fn nblocks(&self) -> u64 {
        match self {
            Kind::Bytes => 0,
            Kind::Vector { count, .. } => *count,
            Kind::Indexed { blocks, .. } => blocks.len() as u64,
            Kind::Struct { blocks, .. } => blocks.len() as u64,
            Kind::Resized { .. } => 1,
        }
    }

    /// Block `b` (`b < nblocks()`): copies, displacement from the node's origin, element type.
    ///
    /// The displacement is computed wrapping: the constructor proved every data offset below
    /// it fits `i64`, so the final sums the cursor forms are exact (two's complement addition
    /// is exact modulo 2^64).
    pub(crate) fn block(&self, b: u64) -> Option<(u64, i64, &Datatype)> {
        match self {
            Kind::Bytes => None,
            Kind::Vector {
                blocklen,
                stride,
                child,
                ..
            } => Some((*blocklen, (b as i64).wrapping_mul(*stride), child)),
            Kind::Indexed { blocks, child, .. } => {
                let &(len, disp) = blocks.get(usize::try_from(b).ok()?)?;
                Some((len, disp, child))
            }
            Kind::Struct { blocks, .. } => {
                let (len, disp, ty) = blocks.get(usize::try_from(b).ok()?)?;
                Some((*len, *disp, ty))
            }
            Kind::Resized { child } => Some((1, 0, child)),
        }
    }

    /// The block holding data byte `pos` of an instance (`pos < size`) and `pos`'s offset in
    /// that block's data: O(1) for vectors, a binary search for indexed and struct types.
    pub(crate) fn locate(&self, pos: u64) -> Option<(u64, u64)> {
        match self {
            Kind::Bytes => None,
            Kind::Vector {
                blocklen, child, ..
            } => {
                let block = blocklen.checked_mul(child.0.size).filter(|&b| b > 0)?;
                Some((pos / block, pos % block))
            }
            Kind::Indexed { prefix, child, .. } => {
                let elem = pos.checked_div(child.0.size)?;
                let b = prefix.partition_point(|&p| p <= elem).checked_sub(1)?;
                Some((b as u64, pos - prefix[b] * child.0.size))
            }
            Kind::Struct { prefix, .. } => {
                let b = prefix.partition_point(|&p| p <= pos).checked_sub(1)?;
                Some((b as u64, pos - prefix[b]))
            }
            Kind::Resized { .. } => Some((0, pos)),
        }
    }
}

/// `(min, max)` of `j * step` for `j` in `0..n` (`n >= 1`).
fn spread(op: &'static str, n: u64, step: i64) -> Result<(i64, i64)> {
    let last = i64::try_from(n - 1)
        .ok()
        .and_then(|k| k.checked_mul(step))
        .ok_or(DtypeError::Overflow {
            op,
            what: "displacement",
        })?;
    Ok((last.min(0), last.max(0)))
}

/// Accumulates a new type's figures block by block.
struct Acc {
    op: &'static str,
    size: u64,
    data: Option<(i64, i64)>,
    lb_mark: Option<i64>,
    ub_mark: Option<i64>,
    dense: bool,
    /// End of the single data run so far, while `dense`.
    run_end: Option<i64>,
    raw_segments: u64,
    depth: usize,
}

impl Acc {
    fn new(op: &'static str) -> Self {
        Self {
            op,
            size: 0,
            data: None,
            lb_mark: None,
            ub_mark: None,
            dense: true,
            run_end: None,
            raw_segments: 0,
            depth: 1,
        }
    }

    fn overflow(&self, what: &'static str) -> DtypeError {
        DtypeError::Overflow { op: self.op, what }
    }

    fn add(&self, a: i64, b: i64, what: &'static str) -> Result<i64> {
        a.checked_add(b).ok_or_else(|| self.overflow(what))
    }

    /// Adds instances of `child` whose displacements range over `[lo, hi]`.
    fn bounds(&mut self, child: &Node, lo: i64, hi: i64) -> Result<()> {
        if child.size > 0 {
            let a = self.add(lo, child.true_lb, "lower bound")?;
            let b = self.add(hi, child.true_ub, "upper bound")?;
            self.data = Some(match self.data {
                Some((x, y)) => (x.min(a), y.max(b)),
                None => (a, b),
            });
        }
        if let Some(m) = child.lb_mark {
            let m = self.add(lo, m, "lower bound")?;
            self.lb_mark = Some(self.lb_mark.map_or(m, |x| x.min(m)));
        }
        if let Some(m) = child.ub_mark {
            let m = self.add(hi, m, "upper bound")?;
            self.ub_mark = Some(self.ub_mark.map_or(m, |x| x.max(m)));
        }
        self.depth = self.depth.max(child.depth + 1);
        Ok(())
    }

    /// Adds `copies` bytes of data: `size` accounting.
    fn grow(&mut self, bytes: u64) -> Result<()> {
        self.size = self
            .size
            .checked_add(bytes)
            .ok_or_else(|| self.overflow("size"))?;
        Ok(())
    }

    /// Adds one block: `copies` instances of `child` from displacement `disp`, by its extent.
    fn block(&mut self, copies: u64, disp: i64, child: &Node) -> Result<()> {
        if copies == 0 {
            return Ok(());
        }
        let (lo, hi) = spread(self.op, copies, child.extent)?;
        let (lo, hi) = (
            self.add(disp, lo, "displacement")?,
            self.add(disp, hi, "displacement")?,
        );
        self.bounds(child, lo, hi)?;
        if child.size == 0 {
            return Ok(());
        }
        let bytes = copies
            .checked_mul(child.size)
            .ok_or_else(|| self.overflow("size"))?;
        self.grow(bytes)?;
        let leaf = child.dense && (copies == 1 || child.tiles);
        self.raw_segments = self.raw_segments.saturating_add(if leaf {
            1
        } else {
            copies.saturating_mul(child.raw_segments)
        });
        if self.dense {
            let start = self.add(disp, child.true_lb, "displacement")?;
            let continues = match self.run_end {
                Some(end) => end == start,
                None => true,
            };
            if leaf && continues {
                let len = i64::try_from(bytes).map_err(|_| self.overflow("extent"))?;
                self.run_end = Some(self.add(start, len, "upper bound")?);
            } else {
                self.dense = false;
            }
        }
        Ok(())
    }

    fn finish(self, name: &'static str, kind: Kind) -> Result<Datatype> {
        let (true_lb, true_ub) = self.data.unwrap_or((0, 0));
        if true_ub.checked_sub(true_lb).is_none() {
            return Err(self.overflow("true extent"));
        }
        let lb = self.lb_mark.unwrap_or(true_lb);
        let ub = self.ub_mark.unwrap_or(true_ub);
        let extent = ub.checked_sub(lb).ok_or_else(|| self.overflow("extent"))?;
        let dense = self.dense || self.size == 0;
        Ok(Datatype(Arc::new(Node {
            kind,
            name,
            size: self.size,
            lb,
            ub,
            extent,
            lb_mark: self.lb_mark,
            ub_mark: self.ub_mark,
            true_lb,
            true_ub,
            dense,
            tiles: dense && self.size > 0 && i64::try_from(self.size) == Ok(extent),
            depth: self.depth,
            raw_segments: if dense {
                u64::from(self.size > 0)
            } else {
                self.raw_segments
            },
            ctor: None,
        })))
    }
}

impl Datatype {
    /// Records the public constructor that made this freshly built type (its wire
    /// description). A type still shared cannot be changed and keeps what it had; a fresh
    /// one never is.
    fn made_by(mut self, ctor: Ctor) -> Datatype {
        if let Some(node) = Arc::get_mut(&mut self.0) {
            node.ctor = Some(ctor);
        }
        self
    }
}

/// Converts element counts or displacements to bytes.
fn times(op: &'static str, what: &'static str, n: i64, extent: i64) -> Result<i64> {
    n.checked_mul(extent)
        .ok_or(DtypeError::Overflow { op, what })
}

fn same_len(op: &'static str, what: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(DtypeError::LengthMismatch {
            op,
            what,
            got,
            expected,
        })
    }
}

impl Datatype {
    /// A primitive (predefined) type of `size` contiguous bytes: `[0, size)`, extent `size`.
    /// `primitive(8)` stands for `MPI_DOUBLE`, `primitive(1)` for `MPI_BYTE`. ferry moves
    /// bytes and converts no representation, and adds no alignment padding to extents
    /// (MPI's epsilon): describe padding with [`Datatype::resized`]. `primitive(0)` holds no
    /// data (bounds 0, 0).
    #[doc(alias = "MPI_BYTE")]
    pub fn primitive(size: u64) -> Result<Datatype> {
        let op = "primitive";
        let mut acc = Acc::new(op);
        if size > 0 {
            let end = i64::try_from(size).map_err(|_| acc.overflow("size"))?;
            acc.size = size;
            acc.data = Some((0, end));
            acc.raw_segments = 1;
        }
        Ok(acc.finish(op, Kind::Bytes)?.made_by(Ctor::Primitive))
    }

    /// One byte (`MPI_BYTE`).
    pub fn byte() -> Datatype {
        Datatype(Arc::new(Node {
            kind: Kind::Bytes,
            name: "byte",
            size: 1,
            lb: 0,
            ub: 1,
            extent: 1,
            lb_mark: None,
            ub_mark: None,
            true_lb: 0,
            true_ub: 1,
            dense: true,
            tiles: true,
            depth: 1,
            raw_segments: 1,
            ctor: Some(Ctor::Primitive),
        }))
    }

    /// `count` copies of `old`, each `old.extent()` bytes after the previous one.
    #[doc(alias = "MPI_Type_contiguous")]
    pub fn contiguous(count: u64, old: &Datatype) -> Result<Datatype> {
        let t = Self::vector_bytes("contiguous", 1, count, 0, old)?;
        Ok(t.made_by(Ctor::Contiguous {
            count,
            old: old.clone(),
        }))
    }

    /// `count` blocks of `blocklen` copies of `old`; block `i` starts `i * stride` elements
    /// (`stride * old.extent()` bytes) from the origin. The stride may be negative.
    #[doc(alias = "MPI_Type_vector")]
    pub fn vector(count: u64, blocklen: u64, stride: i64, old: &Datatype) -> Result<Datatype> {
        let op = "vector";
        let bytes = times(op, "stride", stride, old.0.extent)?;
        let t = Self::vector_bytes(op, count, blocklen, bytes, old)?;
        Ok(t.made_by(Ctor::Vector {
            bytes: false,
            count,
            blocklen,
            stride,
            old: old.clone(),
        }))
    }

    /// Like [`Datatype::vector`] with the stride in bytes.
    #[doc(alias = "MPI_Type_create_hvector")]
    pub fn hvector(count: u64, blocklen: u64, stride: i64, old: &Datatype) -> Result<Datatype> {
        let t = Self::vector_bytes("hvector", count, blocklen, stride, old)?;
        Ok(t.made_by(Ctor::Vector {
            bytes: true,
            count,
            blocklen,
            stride,
            old: old.clone(),
        }))
    }

    fn vector_bytes(
        op: &'static str,
        count: u64,
        blocklen: u64,
        stride: i64,
        old: &Datatype,
    ) -> Result<Datatype> {
        let c = &old.0;
        let mut acc = Acc::new(op);
        acc.depth = c.depth + 1;
        if count > 0 && blocklen > 0 {
            let (blo, bhi) = spread(op, count, stride)?;
            let (clo, chi) = spread(op, blocklen, c.extent)?;
            let lo = acc.add(blo, clo, "displacement")?;
            let hi = acc.add(bhi, chi, "displacement")?;
            acc.bounds(c, lo, hi)?;
            let block = blocklen
                .checked_mul(c.size)
                .ok_or_else(|| acc.overflow("size"))?;
            acc.grow(
                block
                    .checked_mul(count)
                    .ok_or_else(|| acc.overflow("size"))?,
            )?;
            let leaf = c.dense && (blocklen == 1 || c.tiles);
            acc.raw_segments = if leaf {
                count
            } else {
                count.saturating_mul(blocklen.saturating_mul(c.raw_segments))
            };
            acc.dense = leaf && (count == 1 || i64::try_from(block) == Ok(stride));
        }
        let kind = Kind::Vector {
            count,
            blocklen,
            stride,
            child: old.clone(),
        };
        acc.finish(op, kind)
    }

    /// Blocks of `blocklens[i]` copies of `old` at `displs[i]` elements
    /// (`displs[i] * old.extent()` bytes) from the origin, in the order given.
    #[doc(alias = "MPI_Type_indexed")]
    pub fn indexed(blocklens: &[u64], displs: &[i64], old: &Datatype) -> Result<Datatype> {
        let op = "indexed";
        same_len(op, "displs", displs.len(), blocklens.len())?;
        let bytes = displs
            .iter()
            .map(|&d| times(op, "displacement", d, old.0.extent))
            .collect::<Result<Vec<_>>>()?;
        let t = Self::indexed_bytes(op, blocklens.iter().copied().zip(bytes), old)?;
        Ok(t.made_by(Ctor::Indexed {
            bytes: false,
            blocklens: blocklens.into(),
            displs: displs.into(),
            old: old.clone(),
        }))
    }

    /// Like [`Datatype::indexed`] with displacements in bytes.
    #[doc(alias = "MPI_Type_create_hindexed")]
    pub fn hindexed(blocklens: &[u64], displs: &[i64], old: &Datatype) -> Result<Datatype> {
        let op = "hindexed";
        same_len(op, "displs", displs.len(), blocklens.len())?;
        let t = Self::indexed_bytes(
            op,
            blocklens.iter().copied().zip(displs.iter().copied()),
            old,
        )?;
        Ok(t.made_by(Ctor::Indexed {
            bytes: true,
            blocklens: blocklens.into(),
            displs: displs.into(),
            old: old.clone(),
        }))
    }

    /// Blocks of the same length `blocklen` at `displs[i]` elements of `old`.
    #[doc(alias = "MPI_Type_create_indexed_block")]
    pub fn indexed_block(blocklen: u64, displs: &[i64], old: &Datatype) -> Result<Datatype> {
        let op = "indexed_block";
        let bytes = displs
            .iter()
            .map(|&d| times(op, "displacement", d, old.0.extent))
            .collect::<Result<Vec<_>>>()?;
        let t = Self::indexed_bytes(op, bytes.into_iter().map(|d| (blocklen, d)), old)?;
        Ok(t.made_by(Ctor::IndexedBlock {
            bytes: false,
            blocklen,
            displs: displs.into(),
            old: old.clone(),
        }))
    }

    /// Blocks of the same length `blocklen` at `displs[i]` bytes.
    #[doc(alias = "MPI_Type_create_hindexed_block")]
    pub fn hindexed_block(blocklen: u64, displs: &[i64], old: &Datatype) -> Result<Datatype> {
        let t = Self::indexed_bytes("hindexed_block", displs.iter().map(|&d| (blocklen, d)), old)?;
        Ok(t.made_by(Ctor::IndexedBlock {
            bytes: true,
            blocklen,
            displs: displs.into(),
            old: old.clone(),
        }))
    }

    /// A segment list as a datatype: the bytes `[offset, offset + len)` of each segment, in
    /// list order (an hindexed type of bytes). Zero-length segments are allowed and carry
    /// nothing. To check a list meant for receiving, see [`crate::validate_receive_segments`].
    pub fn from_segments(segments: &[crate::Segment]) -> Result<Datatype> {
        let byte = Self::byte();
        let t = Self::indexed_bytes(
            "from_segments",
            segments.iter().map(|s| (s.len, s.offset)),
            &byte,
        )?;
        Ok(t.made_by(Ctor::Indexed {
            bytes: true,
            blocklens: segments.iter().map(|s| s.len).collect(),
            displs: segments.iter().map(|s| s.offset).collect(),
            old: byte,
        }))
    }

    pub(crate) fn indexed_bytes(
        op: &'static str,
        blocks: impl Iterator<Item = (u64, i64)>,
        old: &Datatype,
    ) -> Result<Datatype> {
        let c = &old.0;
        let mut acc = Acc::new(op);
        acc.depth = c.depth + 1;
        let mut kept = Vec::with_capacity(blocks.size_hint().0);
        let mut prefix = vec![0u64];
        let mut elems = 0u64;
        for (len, disp) in blocks {
            acc.block(len, disp, c)?;
            if len > 0 && c.size > 0 {
                kept.push((len, disp));
                // Cannot overflow: `acc.block` checked len * size (>= len) into the size.
                elems += len;
                prefix.push(elems);
            }
        }
        let kind = Kind::Indexed {
            blocks: kept.into(),
            prefix: prefix.into(),
            child: old.clone(),
        };
        acc.finish(op, kind)
    }

    /// Blocks of `blocklens[i]` copies of `types[i]` at `displs[i]` bytes (a C struct).
    /// No alignment padding is added to the extent: use [`Datatype::resized`] to match a
    /// struct's `sizeof`.
    #[doc(alias = "MPI_Type_create_struct")]
    pub fn structure(blocklens: &[u64], displs: &[i64], types: &[Datatype]) -> Result<Datatype> {
        let op = "struct";
        same_len(op, "displs", displs.len(), blocklens.len())?;
        same_len(op, "types", types.len(), blocklens.len())?;
        let mut acc = Acc::new(op);
        let mut kept = Vec::new();
        let mut prefix = vec![0u64];
        for ((&len, &disp), ty) in blocklens.iter().zip(displs).zip(types) {
            let before = acc.size;
            acc.block(len, disp, &ty.0)?;
            if acc.size > before {
                kept.push((len, disp, ty.clone()));
                prefix.push(acc.size);
            }
        }
        let kind = Kind::Struct {
            blocks: kept.into(),
            prefix: prefix.into(),
        };
        Ok(acc.finish(op, kind)?.made_by(Ctor::Struct {
            blocklens: blocklens.into(),
            displs: displs.into(),
            types: types.into(),
        }))
    }

    /// The data of `old` with lower bound `lb` and extent `extent` (upper bound
    /// `lb + extent`), replacing any bounds `old` had: the tool to add padding, to
    /// interleave instances, or to match a C struct's `sizeof`.
    #[doc(alias = "MPI_Type_create_resized")]
    pub fn resized(old: &Datatype, lb: i64, extent: i64) -> Result<Datatype> {
        let t = Self::resized_named("resized", old, lb, extent)?;
        Ok(t.made_by(Ctor::Resized {
            lb,
            extent,
            old: old.clone(),
        }))
    }

    fn resized_named(op: &'static str, old: &Datatype, lb: i64, extent: i64) -> Result<Datatype> {
        let c = &old.0;
        let mut acc = Acc::new(op);
        let ub = acc.add(lb, extent, "upper bound")?;
        acc.size = c.size;
        acc.data = (c.size > 0).then_some((c.true_lb, c.true_ub));
        acc.lb_mark = Some(lb);
        acc.ub_mark = Some(ub);
        acc.dense = c.dense;
        acc.raw_segments = c.raw_segments;
        acc.depth = c.depth + 1;
        acc.finish(op, Kind::Resized { child: old.clone() })
    }

    /// An `n`-dimensional subarray of an `n`-dimensional array of `old`: `sizes` are the
    /// array's dimensions, `subsizes` and `starts` the window's, `order` says which dimension
    /// varies fastest. Like MPI, the result has lower bound 0 and the extent of the whole
    /// array (`product(sizes) * old.extent()`), so consecutive instances tile whole arrays.
    #[doc(alias = "MPI_Type_create_subarray")]
    pub fn subarray(
        sizes: &[u64],
        subsizes: &[u64],
        starts: &[u64],
        order: Order,
        old: &Datatype,
    ) -> Result<Datatype> {
        let op = "subarray";
        same_len(op, "subsizes", subsizes.len(), sizes.len())?;
        same_len(op, "starts", starts.len(), sizes.len())?;
        if sizes.is_empty() {
            return Err(DtypeError::Invalid {
                op,
                reason: "a subarray needs at least one dimension",
            });
        }
        for (dim, ((&size, &subsize), &start)) in sizes.iter().zip(subsizes).zip(starts).enumerate()
        {
            let fits = start.checked_add(subsize).is_some_and(|end| end <= size);
            if size == 0 || subsize == 0 || !fits {
                return Err(DtypeError::SubarrayOutOfRange {
                    dim,
                    size,
                    subsize,
                    start,
                });
            }
        }
        let overflow = |what| DtypeError::Overflow { op, what };
        let dims: Vec<usize> = match order {
            Order::C => (0..sizes.len()).rev().collect(),
            Order::Fortran => (0..sizes.len()).collect(),
        };
        // Walk the dimensions fastest first: `stride` is the byte distance between neighbours
        // along the current dimension, `offset` the window's start.
        let (mut t, mut stride, mut offset) = (old.clone(), old.0.extent, 0i64);
        for d in dims {
            t = Self::vector_bytes(op, subsizes[d], 1, stride, &t)?;
            let start = i64::try_from(starts[d]).map_err(|_| overflow("displacement"))?;
            offset = times(op, "displacement", start, stride)?
                .checked_add(offset)
                .ok_or(overflow("displacement"))?;
            let size = i64::try_from(sizes[d]).map_err(|_| overflow("extent"))?;
            stride = times(op, "extent", size, stride)?;
        }
        if offset != 0 {
            t = Self::indexed_bytes(op, std::iter::once((1, offset)), &t)?;
        }
        let t = Self::resized_named(op, &t, 0, stride)?;
        Ok(t.made_by(Ctor::Subarray {
            sizes: sizes.into(),
            subsizes: subsizes.into(),
            starts: starts.into(),
            order,
            old: old.clone(),
        }))
    }

    /// Data bytes in one instance (`MPI_Type_size`).
    #[doc(alias = "MPI_Type_size")]
    pub fn size(&self) -> u64 {
        self.0.size
    }

    /// Distance from one instance to the next in a count or array: `ub - lb`
    /// (`MPI_Type_get_extent`). Negative only if [`Datatype::resized`] made it so.
    #[doc(alias = "MPI_Type_get_extent")]
    pub fn extent(&self) -> i64 {
        self.0.extent
    }

    /// Lower bound: the lowest explicit lower-bound marker if `resized` placed any,
    /// otherwise the lowest data offset (0 without data). May be negative.
    pub fn lb(&self) -> i64 {
        self.0.lb
    }

    /// Upper bound: the highest explicit upper-bound marker if `resized` placed any,
    /// otherwise one past the highest data byte (0 without data).
    pub fn ub(&self) -> i64 {
        self.0.ub
    }

    /// Lowest offset holding data, ignoring markers (`MPI_Type_get_true_extent`); 0 without data.
    #[doc(alias = "MPI_Type_get_true_extent")]
    pub fn true_lb(&self) -> i64 {
        self.0.true_lb
    }

    /// One past the highest offset holding data; 0 without data.
    pub fn true_ub(&self) -> i64 {
        self.0.true_ub
    }

    /// `true_ub - true_lb`: the span of memory one instance touches.
    pub fn true_extent(&self) -> i64 {
        // Checked when the type was built.
        self.0.true_ub - self.0.true_lb
    }

    /// True if the data of one instance is one run of bytes `[true_lb, true_lb + size)` in
    /// stream order, so sending it is sending one slice.
    pub fn is_contiguous(&self) -> bool {
        self.0.dense
    }

    /// Nesting depth (a primitive is 1); a cursor keeps at most `depth + 1` frames.
    pub fn depth(&self) -> usize {
        self.0.depth
    }

    /// An upper bound on the number of segments a cursor over `count` instances yields,
    /// computed without walking: exact unless some of the runs touch and merge.
    pub fn segment_count_hint(&self, count: u64) -> u64 {
        let n = &self.0;
        if n.size == 0 || count == 0 {
            0
        } else if n.tiles {
            1
        } else {
            count.saturating_mul(n.raw_segments)
        }
    }

    /// The offsets `[lo, hi)` that `count` instances touch (relative to the origin), or
    /// `None` if they hold no data. A buffer holding them needs its origin at index `-lo` or
    /// later and `origin + hi` bytes.
    pub fn true_range(&self, count: u64) -> Result<Option<std::ops::Range<i64>>> {
        let whole = Self::contiguous(count, self)?;
        Ok((whole.0.size > 0).then_some(whole.0.true_lb..whole.0.true_ub))
    }

    /// The type's data as repetitions of one period, if it is built that way (a vector,
    /// hvector or contiguous type, under any resizing): `(count, stride, period)`, the data
    /// of `count` copies of `period` in order, copy `i` at `i * stride` bytes from the
    /// origin. A caller can then flatten one period rather than every run of a long vector
    /// (an MPI-IO file type of a million strided ints is one period of one int).
    pub fn repeats(&self) -> Option<(u64, i64, Datatype)> {
        match &self.0.kind {
            Kind::Resized { child } => child.repeats(),
            Kind::Vector {
                count,
                blocklen,
                stride,
                child,
            } => Some((*count, *stride, Self::contiguous(*blocklen, child).ok()?)),
            _ => None,
        }
    }

    /// The merged segments of `count` instances, materialized: for tests and small types.
    /// Large layouts should be walked with a [`crate::Cursor`].
    pub fn flatten(&self, count: u64) -> Result<Vec<crate::Segment>> {
        Ok(crate::Cursor::new(self, count)?.collect())
    }
}

impl fmt::Debug for Datatype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = &self.0;
        f.debug_struct("Datatype")
            .field("kind", &n.name)
            .field("size", &n.size)
            .field("lb", &n.lb)
            .field("extent", &n.extent)
            .field("true_lb", &n.true_lb)
            .field("true_ub", &n.true_ub)
            .field("depth", &n.depth)
            .finish_non_exhaustive()
    }
}
