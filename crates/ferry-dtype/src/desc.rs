//! The compact wire description of a datatype: its constructor tree, not its type map.
//!
//! A file view or a memory layout travels as the constructors and arguments that built it
//! (a vector of a resized struct is a few dozen bytes however many bytes it covers), and the
//! receiver rebuilds it with the same constructors, so every check a constructor makes
//! applies to what arrives: an overflowing extent or an inconsistent subarray is an error,
//! never a panic. The encoding is specified in `docs/protocol.md`, "Datatype descriptions".
//!
//! ```text
//! description := version u8 (= 1), node
//! node        := tag u8, arguments, child nodes
//! ```
//!
//! A node already written once (a type used twice in a struct, say) is written again as a
//! reference to it, so a description is never larger than the constructor calls that made
//! the type. Decoding bounds what a peer can make it build: [`MAX_DEPTH`] levels of nesting,
//! [`MAX_NODES`] nodes, [`MAX_ENTRIES`] array entries in all, [`MAX_DIMS`] subarray
//! dimensions.

use std::collections::HashMap;
use std::sync::Arc;

use ferry_wire::{ReadError, Reader, Writer};

use crate::error::{DtypeError, Result};
use crate::types::{Ctor, Datatype, Kind, Node, Order};

/// The version byte every description starts with.
pub const VERSION: u8 = 1;
/// The deepest nesting a description may build (a primitive is depth 1).
pub const MAX_DEPTH: usize = 64;
/// The most nodes (constructor calls) in one description.
pub const MAX_NODES: usize = 1 << 16;
/// The most array entries (block lengths, displacements, dimensions) in one description.
pub const MAX_ENTRIES: usize = 1 << 22;
/// The most dimensions of one subarray.
pub const MAX_DIMS: usize = 32;

/// Node tags.
mod tag {
    pub const REF: u8 = 0;
    pub const PRIMITIVE: u8 = 1;
    pub const CONTIGUOUS: u8 = 2;
    pub const VECTOR: u8 = 3;
    pub const HVECTOR: u8 = 4;
    pub const INDEXED: u8 = 5;
    pub const HINDEXED: u8 = 6;
    pub const INDEXED_BLOCK: u8 = 7;
    pub const HINDEXED_BLOCK: u8 = 8;
    pub const STRUCT: u8 = 9;
    pub const RESIZED: u8 = 10;
    pub const SUBARRAY: u8 = 11;
}

impl Datatype {
    /// The compact wire description of this type: its constructor tree (see the module
    /// documentation of `desc` and `docs/protocol.md`). [`Datatype::decode`] rebuilds a type
    /// with the same type map, bounds and size.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = Writer::new(&mut out);
        w.u8(VERSION);
        Encoder::default().node(self, &mut w);
        out
    }

    /// Rebuilds a type from its description ([`Datatype::encode`]). Never panics: a
    /// truncated, over-long or inconsistent description, one nested deeper than
    /// [`MAX_DEPTH`] or larger than [`MAX_NODES`] nodes or [`MAX_ENTRIES`] array entries,
    /// and any argument a constructor refuses, is a [`DtypeError`].
    pub fn decode(bytes: &[u8]) -> Result<Datatype> {
        let mut r = Reader::new(bytes);
        if r.u8().map_err(read_err)? != VERSION {
            return Err(invalid("unknown description version"));
        }
        let mut d = Decoder {
            r,
            nodes: Vec::new(),
            entries: 0,
        };
        let t = d.node(0)?;
        d.r.finish().map_err(read_err)?;
        Ok(t)
    }
}

fn invalid(reason: &'static str) -> DtypeError {
    DtypeError::Invalid {
        op: "decode",
        reason,
    }
}

fn read_err(e: ReadError) -> DtypeError {
    invalid(match e {
        ReadError::Short => "the description is truncated",
        ReadError::Trailing(_) => "bytes after the end of the description",
        _ => "malformed description",
    })
}

/// Writes nodes, each shared node once (later uses are references to its index).
#[derive(Default)]
struct Encoder {
    /// Index of each node written, by its address (nodes are numbered as they complete).
    seen: HashMap<*const Node, u32>,
}

impl Encoder {
    fn node(&mut self, t: &Datatype, w: &mut Writer<'_>) {
        let key = Arc::as_ptr(&t.0);
        if let Some(&i) = self.seen.get(&key) {
            w.u8(tag::REF);
            w.u32(i);
            return;
        }
        match &t.0.ctor {
            Some(c) => self.ctor(t, c, w),
            None => self.lowered(t, w),
        }
        let i = u32::try_from(self.seen.len()).unwrap_or(u32::MAX);
        self.seen.insert(key, i);
    }

    fn ctor(&mut self, t: &Datatype, c: &Ctor, w: &mut Writer<'_>) {
        match c {
            Ctor::Primitive => {
                w.u8(tag::PRIMITIVE);
                w.u64(t.size());
            }
            Ctor::Contiguous { count, old } => {
                w.u8(tag::CONTIGUOUS);
                w.u64(*count);
                self.node(old, w);
            }
            Ctor::Vector {
                bytes,
                count,
                blocklen,
                stride,
                old,
            } => {
                w.u8(if *bytes { tag::HVECTOR } else { tag::VECTOR });
                w.u64(*count);
                w.u64(*blocklen);
                w.i64(*stride);
                self.node(old, w);
            }
            Ctor::Indexed {
                bytes,
                blocklens,
                displs,
                old,
            } => {
                w.u8(if *bytes { tag::HINDEXED } else { tag::INDEXED });
                put_len(w, blocklens.len());
                blocklens.iter().for_each(|&b| w.u64(b));
                displs.iter().for_each(|&d| w.i64(d));
                self.node(old, w);
            }
            Ctor::IndexedBlock {
                bytes,
                blocklen,
                displs,
                old,
            } => {
                w.u8(if *bytes {
                    tag::HINDEXED_BLOCK
                } else {
                    tag::INDEXED_BLOCK
                });
                w.u64(*blocklen);
                put_len(w, displs.len());
                displs.iter().for_each(|&d| w.i64(d));
                self.node(old, w);
            }
            Ctor::Struct {
                blocklens,
                displs,
                types,
            } => {
                w.u8(tag::STRUCT);
                put_len(w, blocklens.len());
                for ((&b, &d), ty) in blocklens.iter().zip(displs.iter()).zip(types.iter()) {
                    w.u64(b);
                    w.i64(d);
                    self.node(ty, w);
                }
            }
            Ctor::Resized { lb, extent, old } => {
                w.u8(tag::RESIZED);
                w.i64(*lb);
                w.i64(*extent);
                self.node(old, w);
            }
            Ctor::Subarray {
                sizes,
                subsizes,
                starts,
                order,
                old,
            } => {
                w.u8(tag::SUBARRAY);
                w.u8(match order {
                    Order::C => 0,
                    Order::Fortran => 1,
                });
                put_len(w, sizes.len());
                for list in [sizes, subsizes, starts] {
                    list.iter().for_each(|&v| w.u64(v));
                }
                self.node(old, w);
            }
        }
    }

    /// A node without a recorded constructor (built inside another constructor): written
    /// as the shape the cursor walks, which has the same data. Public constructors always
    /// record theirs, so descriptions of user types never take this path.
    fn lowered(&mut self, t: &Datatype, w: &mut Writer<'_>) {
        let n = &t.0;
        match &n.kind {
            Kind::Bytes => {
                w.u8(tag::PRIMITIVE);
                w.u64(n.size);
            }
            Kind::Vector {
                count,
                blocklen,
                stride,
                child,
            } => {
                w.u8(tag::HVECTOR);
                w.u64(*count);
                w.u64(*blocklen);
                w.i64(*stride);
                self.node(child, w);
            }
            Kind::Indexed { blocks, child, .. } => {
                w.u8(tag::HINDEXED);
                put_len(w, blocks.len());
                blocks.iter().for_each(|&(len, _)| w.u64(len));
                blocks.iter().for_each(|&(_, disp)| w.i64(disp));
                self.node(child, w);
            }
            Kind::Struct { blocks, .. } => {
                w.u8(tag::STRUCT);
                put_len(w, blocks.len());
                for (len, disp, ty) in blocks.iter() {
                    w.u64(*len);
                    w.i64(*disp);
                    self.node(ty, w);
                }
            }
            Kind::Resized { child } => {
                w.u8(tag::RESIZED);
                w.i64(n.lb);
                w.i64(n.extent);
                self.node(child, w);
            }
        }
    }
}

/// An array length (`u32`). Lengths of valid types fit: they are bounded by memory long
/// before 2^32 entries (a longer one would not decode anyway, see [`MAX_ENTRIES`]).
fn put_len(w: &mut Writer<'_>, n: usize) {
    w.u32(u32::try_from(n).unwrap_or(u32::MAX));
}

/// Reads nodes, rebuilding each with its constructor.
struct Decoder<'a> {
    r: Reader<'a>,
    /// Every node decoded so far, by index (what a reference names).
    nodes: Vec<Datatype>,
    /// Array entries read so far.
    entries: usize,
}

impl Decoder<'_> {
    fn node(&mut self, depth: usize) -> Result<Datatype> {
        if depth >= MAX_DEPTH {
            return Err(invalid("the description nests too deep"));
        }
        let t = self.r.u8().map_err(read_err)?;
        if t == tag::REF {
            let i = self.r.u32().map_err(read_err)?;
            return usize::try_from(i)
                .ok()
                .and_then(|i| self.nodes.get(i))
                .cloned()
                .ok_or(invalid("a reference to a node not described yet"));
        }
        if self.nodes.len() >= MAX_NODES {
            return Err(invalid("the description has too many nodes"));
        }
        let ty = self.build(t, depth)?;
        // A reference reuses a whole subtree, so nesting is checked on what was built,
        // not only on the recursion here: a chain of references must not build a type too
        // deep to walk or to drop.
        if ty.depth() > MAX_DEPTH {
            return Err(invalid("the description nests too deep"));
        }
        self.nodes.push(ty.clone());
        Ok(ty)
    }

    fn build(&mut self, t: u8, depth: usize) -> Result<Datatype> {
        let d = depth + 1;
        match t {
            tag::PRIMITIVE => Datatype::primitive(self.u64()?),
            tag::CONTIGUOUS => {
                let count = self.u64()?;
                Datatype::contiguous(count, &self.node(d)?)
            }
            tag::VECTOR | tag::HVECTOR => {
                let (count, blocklen, stride) = (self.u64()?, self.u64()?, self.i64()?);
                let old = self.node(d)?;
                if t == tag::VECTOR {
                    Datatype::vector(count, blocklen, stride, &old)
                } else {
                    Datatype::hvector(count, blocklen, stride, &old)
                }
            }
            tag::INDEXED | tag::HINDEXED => {
                let n = self.len(16)?;
                let lens = self.u64s(n)?;
                let displs = self.i64s(n)?;
                let old = self.node(d)?;
                if t == tag::INDEXED {
                    Datatype::indexed(&lens, &displs, &old)
                } else {
                    Datatype::hindexed(&lens, &displs, &old)
                }
            }
            tag::INDEXED_BLOCK | tag::HINDEXED_BLOCK => {
                let blocklen = self.u64()?;
                let n = self.len(8)?;
                let displs = self.i64s(n)?;
                let old = self.node(d)?;
                if t == tag::INDEXED_BLOCK {
                    Datatype::indexed_block(blocklen, &displs, &old)
                } else {
                    Datatype::hindexed_block(blocklen, &displs, &old)
                }
            }
            tag::STRUCT => {
                // Each field is at least its two integers and a 5-byte reference.
                let n = self.len(16 + 5)?;
                let (mut lens, mut displs, mut types) = (vec![], vec![], vec![]);
                for _ in 0..n {
                    lens.push(self.u64()?);
                    displs.push(self.i64()?);
                    types.push(self.node(d)?);
                }
                Datatype::structure(&lens, &displs, &types)
            }
            tag::RESIZED => {
                let (lb, extent) = (self.i64()?, self.i64()?);
                Datatype::resized(&self.node(d)?, lb, extent)
            }
            tag::SUBARRAY => {
                let order = match self.r.u8().map_err(read_err)? {
                    0 => Order::C,
                    1 => Order::Fortran,
                    _ => return Err(invalid("unknown subarray order")),
                };
                let n = self.len(24)?;
                if n > MAX_DIMS {
                    return Err(invalid("a subarray has too many dimensions"));
                }
                let (sizes, subsizes, starts) = (self.u64s(n)?, self.u64s(n)?, self.u64s(n)?);
                Datatype::subarray(&sizes, &subsizes, &starts, order, &self.node(d)?)
            }
            _ => Err(invalid("unknown constructor tag")),
        }
    }

    /// An array length, counted towards [`MAX_ENTRIES`] and checked against the bytes
    /// left (each entry taking at least `entry` bytes) before anything is allocated.
    fn len(&mut self, entry: usize) -> Result<usize> {
        let n = usize::try_from(self.r.u32().map_err(read_err)?)
            .map_err(|_| invalid("an array is too long"))?;
        if n.saturating_mul(entry) > self.r.remaining() {
            return Err(read_err(ReadError::Short));
        }
        self.entries = self.entries.saturating_add(n);
        if self.entries > MAX_ENTRIES {
            return Err(invalid("the description has too many array entries"));
        }
        Ok(n)
    }

    fn u64(&mut self) -> Result<u64> {
        self.r.u64().map_err(read_err)
    }

    fn i64(&mut self) -> Result<i64> {
        self.r.i64().map_err(read_err)
    }

    fn u64s(&mut self, n: usize) -> Result<Vec<u64>> {
        (0..n).map(|_| self.u64()).collect()
    }

    fn i64s(&mut self, n: usize) -> Result<Vec<i64>> {
        (0..n).map(|_| self.i64()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(a: &Datatype, b: &Datatype) {
        assert_eq!(a.flatten(2).unwrap(), b.flatten(2).unwrap());
        assert_eq!(
            (a.size(), a.lb(), a.extent(), a.true_lb(), a.true_ub()),
            (b.size(), b.lb(), b.extent(), b.true_lb(), b.true_ub())
        );
    }

    #[test]
    fn shared_nodes_are_written_once() {
        let int = Datatype::primitive(4).unwrap();
        let pair = Datatype::contiguous(2, &int).unwrap();
        let s = Datatype::structure(
            &[1, 1, 1],
            &[0, 16, 32],
            &[pair.clone(), pair.clone(), pair],
        )
        .unwrap();
        let bytes = s.encode();
        // version, struct tag, n, three fields (16 bytes each + a node): the pair once
        // (contiguous: 1 + 8 + primitive 9), then two 5-byte references.
        assert_eq!(bytes.len(), 1 + 1 + 4 + 3 * 16 + 18 + 2 * 5);
        same(&Datatype::decode(&bytes).unwrap(), &s);
    }

    #[test]
    fn the_seed_view_is_a_few_dozen_bytes() {
        let int = Datatype::primitive(4).unwrap();
        let v = Datatype::vector(1_024_000, 1, 2, &int).unwrap();
        let ft = Datatype::resized(&v, 0, 8 * 1_024_000).unwrap();
        let bytes = ft.encode();
        assert!(bytes.len() < 64, "{}", bytes.len());
        same(&Datatype::decode(&bytes).unwrap(), &ft);
    }

    /// The bytes of a description (version 1): the format must not change.
    #[test]
    fn golden_bytes() {
        let int = Datatype::primitive(4).unwrap();
        let v = Datatype::vector(3, 1, 2, &int).unwrap();
        let ft = Datatype::resized(&v, -8, 24).unwrap();
        let s = Datatype::structure(&[1, 2], &[0, 16], &[int.clone(), int]).unwrap();
        let hex =
            |t: &Datatype| -> String { t.encode().iter().map(|b| format!("{b:02x}")).collect() };
        assert_eq!(
            hex(&ft),
            concat!(
                "01",               // version
                "0a",               // resized
                "f8ffffffffffffff", // lb -8
                "1800000000000000", // extent 24
                "03",               // vector
                "0300000000000000", // count 3
                "0100000000000000", // blocklen 1
                "0200000000000000", // stride 2
                "01",               // primitive
                "0400000000000000", // size 4
            )
        );
        assert_eq!(
            hex(&s),
            concat!(
                "01",                 // version
                "09",                 // struct
                "02000000",           // 2 fields
                "0100000000000000",   // blocklen 1
                "0000000000000000",   // displ 0
                "010400000000000000", // primitive 4 (node 0)
                "0200000000000000",   // blocklen 2
                "1000000000000000",   // displ 16
                "0000000000",         // reference to node 0
            )
        );
    }

    #[test]
    fn bad_descriptions_are_errors() {
        let int = Datatype::primitive(4).unwrap();
        let good = Datatype::vector(3, 1, 2, &int).unwrap().encode();
        for cut in 0..good.len() {
            assert!(Datatype::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(Datatype::decode(&trailing).is_err());
        // A reference to itself, an unknown tag, a wrong version.
        assert!(Datatype::decode(&[VERSION, tag::REF, 0, 0, 0, 0]).is_err());
        assert!(Datatype::decode(&[VERSION, 99]).is_err());
        assert!(Datatype::decode(&[2, tag::PRIMITIVE, 1, 0, 0, 0, 0, 0, 0, 0]).is_err());
        // An extent that overflows: contiguous(2^62) of 8-byte elements.
        let mut big = vec![VERSION, tag::CONTIGUOUS];
        big.extend_from_slice(&(1u64 << 62).to_le_bytes());
        big.push(tag::PRIMITIVE);
        big.extend_from_slice(&8u64.to_le_bytes());
        assert!(matches!(
            Datatype::decode(&big),
            Err(DtypeError::Overflow { .. })
        ));
        // An array longer than the bytes that follow: refused before allocating.
        let mut long = vec![VERSION, tag::HINDEXED];
        long.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Datatype::decode(&long).is_err());
    }

    #[test]
    fn nesting_is_bounded_even_through_references() {
        // Nesting by recursion.
        let mut deep = vec![VERSION];
        for _ in 0..MAX_DEPTH + 1 {
            deep.push(tag::CONTIGUOUS);
            deep.extend_from_slice(&1u64.to_le_bytes());
        }
        deep.push(tag::PRIMITIVE);
        deep.extend_from_slice(&1u64.to_le_bytes());
        assert!(Datatype::decode(&deep).is_err());
        // Nesting by a chain of references inside one struct: field i wraps field i - 1.
        let n = MAX_DEPTH as u32 + 2;
        let mut chain = vec![VERSION, tag::STRUCT];
        chain.extend_from_slice(&n.to_le_bytes());
        for i in 0..n {
            chain.extend_from_slice(&1u64.to_le_bytes());
            chain.extend_from_slice(&0i64.to_le_bytes());
            if i == 0 {
                chain.push(tag::PRIMITIVE);
                chain.extend_from_slice(&1u64.to_le_bytes());
            } else {
                chain.push(tag::CONTIGUOUS);
                chain.extend_from_slice(&1u64.to_le_bytes());
                chain.push(tag::REF);
                chain.extend_from_slice(&(i - 1).to_le_bytes());
            }
        }
        assert!(Datatype::decode(&chain).is_err());
    }
}
