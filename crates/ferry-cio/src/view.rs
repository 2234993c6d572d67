//! File views: where the bytes of a rank's data stream lie in the file (MPI-IO semantics).
//!
//! A view is a displacement, an elementary type (etype) and a file type. The file type is
//! tiled from the displacement, one tile every extent; the view's data stream is the data
//! of those tiles in order, and an offset counts etypes of that stream. A call at `offset`
//! moving `len` bytes covers stream bytes `[offset * etype.size, + len)`, and
//! [`View::extents`] turns that window into file extents by walking the file type lazily
//! ([`ferry_dtype::Cursor`], seeked to the window), never materializing the tiles before it.

use ferry_dtype::{Cursor, Datatype};

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

/// A validated file view.
#[derive(Debug, Clone)]
pub struct View {
    disp: u64,
    etype: Datatype,
    filetype: Datatype,
}

impl Default for View {
    /// The view every file starts with: displacement 0, bytes for etype and file type.
    fn default() -> Self {
        View {
            disp: 0,
            etype: Datatype::byte(),
            filetype: Datatype::byte(),
        }
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
        Ok(View {
            disp,
            etype,
            filetype,
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
        let esize = self.etype.size();
        if !len.is_multiple_of(esize) {
            return Err(ty(format!(
                "{len} bytes of data is not a whole number of {esize}-byte etypes"
            )));
        }
        if len == 0 {
            return Ok(());
        }
        let too_far = || {
            arg(format!(
                "offset {offset} (+{len} bytes) lies beyond what a file can address"
            ))
        };
        let start = offset.checked_mul(esize).ok_or_else(too_far)?;
        let fsize = self.filetype.size();
        let (tile, within) = (start / fsize, start % fsize);
        let tiles = within.checked_add(len).ok_or_else(too_far)?.div_ceil(fsize);
        // The first tile's origin: disp + tile * extent, which must fit a file offset.
        let base = i128::from(self.disp) + i128::from(tile) * i128::from(self.filetype.extent());
        let base = i64::try_from(base).map_err(|_| too_far())?;
        let mut c = Cursor::new(&self.filetype, tiles).map_err(|_| too_far())?;
        c.seek(within).map_err(|_| too_far())?;
        let mut left = len;
        while left > 0 {
            let s = c.next_segment(left).ok_or_else(too_far)?;
            let at = i128::from(base) + i128::from(s.offset);
            let end = at + i128::from(s.len);
            if at < 0 || end > i128::from(i64::MAX) {
                return Err(too_far());
            }
            let e = Extent {
                file: at as u64,
                len: s.len,
            };
            let full = out.len() >= MAX_EXTENTS;
            match out.last_mut() {
                Some(last) if last.file + last.len == e.file => last.len += e.len,
                _ if full => {
                    return Err(arg(format!(
                    "the call covers more than {MAX_EXTENTS} separate pieces of the file; split it"
                )))
                }
                _ => out.push(e),
            }
            left -= s.len;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
