//! The files of a session: opened beneath an exported root, written by placing pieces and
//! read by regions.
//!
//! Paths are `root/relative/path`; the relative part is opened with the floor's sandbox
//! discipline ([`ferry_service::beneath`]: `openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS` below the root's directory descriptor), so `..`, absolute paths
//! and symlinks leading out of the root are refused by the kernel. Unlike file transfer's
//! uploads (a part file renamed into place), a collective file is written in place: every
//! rank writes its pieces of the same file.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use super::pool::Pool;
use crate::domain;
use crate::error::{CioError, ErrorClass, Result};
use crate::proto::amode;
use crate::session::{Action, Piece};
use crate::view::Extents;

/// The most bytes gathered into one write: runs of touching pieces longer than this are
/// written in several.
const GATHER: usize = 8 << 20;

/// The exported roots, each held open.
pub struct Exports {
    roots: Vec<(String, OwnedFd)>,
}

impl Exports {
    /// Opens every root directory (name, directory).
    pub fn open<'a>(roots: impl IntoIterator<Item = (&'a str, &'a Path)>) -> Result<Exports> {
        let mut open = Vec::new();
        for (name, path) in roots {
            let dir = rustix::fs::open(
                path,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| {
                CioError::new(
                    ErrorClass::Io,
                    format!(
                        "root {name} ({}): {}",
                        path.display(),
                        std::io::Error::from(e)
                    ),
                )
            })?;
            open.push((name.to_string(), dir));
        }
        Ok(Exports { roots: open })
    }

    /// Checks an access mode: exactly one of read-only, write-only and read-write; no
    /// create or exclusive with read-only; nothing this server does not implement
    /// (SEQUENTIAL). DELETE_ON_CLOSE is the session's to honour at its close.
    pub fn check_amode(mode: u32) -> Result<()> {
        let bad = |m: &str| {
            Err(CioError::new(
                ErrorClass::Amode,
                format!("access mode {mode:#x}: {m}"),
            ))
        };
        let rw = [amode::RDONLY, amode::WRONLY, amode::RDWR]
            .iter()
            .filter(|&&b| mode & b != 0)
            .count();
        if mode & !amode::ALL != 0 {
            return bad("unknown bits");
        }
        if rw != 1 {
            return bad("exactly one of RDONLY, WRONLY and RDWR");
        }
        if mode & amode::RDONLY != 0 && mode & (amode::CREATE | amode::EXCL) != 0 {
            return bad("CREATE and EXCL need write access");
        }
        if mode & amode::SEQUENTIAL != 0 {
            return Err(CioError::new(
                ErrorClass::Unsupported,
                "SEQUENTIAL is not supported by this server",
            ));
        }
        Ok(())
    }

    /// Opens `path` (`root/relative/path`) with access mode `mode` (checked by
    /// [`Exports::check_amode`]). Only a regular file opens: a FIFO is opened non-blocking
    /// and refused, like a directory or a device.
    pub fn open_file(&self, path: &str, mode: u32) -> Result<File> {
        Self::check_amode(mode)?;
        let (dir, rel) = self.split(path)?;
        let mut flags = OFlags::NONBLOCK | OFlags::CLOEXEC;
        flags |= if mode & amode::RDONLY != 0 {
            OFlags::RDONLY
        } else if mode & amode::WRONLY != 0 {
            OFlags::WRONLY
        } else {
            OFlags::RDWR
        };
        // openat2 takes a mode only with O_CREAT (EINVAL otherwise).
        let mut perm = Mode::empty();
        if mode & amode::CREATE != 0 {
            flags |= OFlags::CREATE;
            perm = Mode::from_raw_mode(0o644);
        }
        if mode & amode::EXCL != 0 {
            flags |= OFlags::EXCL;
        }
        let fd = rustix::fs::openat2(dir, rel, flags, perm, ferry_service::beneath::BENEATH)
            .map_err(|e| errno(path, e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| errno(path, e))?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(CioError::new(
                ErrorClass::BadFile,
                format!("{path}: not a regular file"),
            ));
        }
        Ok(File::from(fd))
    }

    /// Removes the file `path` (`root/relative/path`): its directory is opened beneath the
    /// root like any file, and the name removed there, so nothing outside the root goes.
    pub fn remove_file(&self, path: &str) -> Result<()> {
        let (root, rel) = self.split(path)?;
        let (parent, name) = rel.rsplit_once('/').unwrap_or((".", rel));
        let dir = rustix::fs::openat2(
            root,
            parent,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ferry_service::beneath::BENEATH,
        )
        .map_err(|e| errno(path, e))?;
        rustix::fs::unlinkat(&dir, name, rustix::fs::AtFlags::empty()).map_err(|e| errno(path, e))
    }

    /// The root's directory and the relative path of `path`.
    /// Whether a credential with `rights` may open `path` with access mode `mode`: a root
    /// not granted is "no root named ..." (naming only the granted ones), a mode that
    /// writes (write, create, delete on close) by a read-only credential is refused.
    pub fn permit(
        &self,
        rights: &ferry_service::auth::Rights,
        path: &str,
        mode: u32,
    ) -> Result<()> {
        let name = path.split('/').next().unwrap_or("");
        if !name.is_empty() && !rights.grants(name) {
            let names: Vec<&str> = self
                .roots
                .iter()
                .map(|(n, _)| n.as_str())
                .filter(|n| rights.grants(n))
                .collect();
            return Err(CioError::new(
                ErrorClass::NoSuchFile,
                format!("no root named {name:?} (exported: {})", names.join(", ")),
            ));
        }
        let writes = amode::WRONLY | amode::RDWR | amode::CREATE | amode::DELETE_ON_CLOSE;
        if rights.read_only && mode & writes != 0 {
            return Err(CioError::new(
                ErrorClass::Access,
                format!("{path}: refused, your credential is read-only on this server"),
            ));
        }
        Ok(())
    }

    fn split<'p>(&self, path: &'p str) -> Result<(&OwnedFd, &'p str)> {
        let denied = |m: String| Err(CioError::new(ErrorClass::Access, m));
        if path.starts_with('/') {
            return denied(format!(
                "{path}: refused, paths are root/relative/path, never absolute"
            ));
        }
        if path.contains('\0') {
            return Err(CioError::new(
                ErrorClass::BadFile,
                "the path holds a NUL byte",
            ));
        }
        let (name, rel) = path.split_once('/').unwrap_or((path, ""));
        let Some((_, dir)) = self.roots.iter().find(|(n, _)| n == name) else {
            let names: Vec<&str> = self.roots.iter().map(|(n, _)| n.as_str()).collect();
            return Err(CioError::new(
                ErrorClass::NoSuchFile,
                format!("no root named {name:?} (exported: {})", names.join(", ")),
            ));
        };
        let rel = rel.trim_end_matches('/');
        if rel.is_empty() || rel.starts_with('/') {
            return Err(CioError::new(
                ErrorClass::BadFile,
                format!("{path}: name a file inside the root"),
            ));
        }
        Ok((dir, rel))
    }
}

/// An open error as the client sees it.
fn errno(path: &str, e: Errno) -> CioError {
    let class = match e {
        Errno::NOENT => ErrorClass::NoSuchFile,
        Errno::EXIST => ErrorClass::FileExists,
        Errno::XDEV | Errno::LOOP => {
            return CioError::new(
                ErrorClass::Access,
                format!("{path}: refused, the path leads outside its root"),
            )
        }
        Errno::ACCESS | Errno::PERM => ErrorClass::Access,
        Errno::ROFS => ErrorClass::ReadOnly,
        Errno::NOSPC | Errno::DQUOT => ErrorClass::NoSpace,
        Errno::ISDIR | Errno::NOTDIR => ErrorClass::BadFile,
        _ => ErrorClass::Io,
    };
    CioError::new(class, format!("{path}: {}", std::io::Error::from(e)))
}

/// A read or write error as the client sees it.
pub fn io_error(what: &str, e: &std::io::Error) -> CioError {
    let class = match e.raw_os_error().map(Errno::from_raw_os_error) {
        Some(Errno::NOSPC) | Some(Errno::DQUOT) => ErrorClass::NoSpace,
        Some(Errno::BADF) => ErrorClass::Access,
        _ => ErrorClass::Io,
    };
    CioError::new(class, format!("{what}: {e}"))
}

/// Runs a write action ([`Action::PlaceWrite`] or [`Action::PlaceDomain`], whose buffer
/// comes from `pool`); any other action writes nothing.
pub fn write(file: &File, action: &Action, pool: &Pool) -> Result<()> {
    match action {
        Action::PlaceWrite { pieces, data } => place_write(file, pieces, data),
        Action::PlaceDomain {
            lo,
            hi,
            regions,
            ranks,
        } => {
            let span = usize::try_from(hi - lo)
                .map_err(|_| CioError::new(ErrorClass::Arg, "a write's span too large"))?;
            // The holes between regions are never written: a spare buffer's old bytes
            // there are harmless, so it is not cleared.
            let mut buf = pool.dirty(span);
            let written = write_domain(file, &mut buf, *lo, regions, ranks);
            pool.give_bytes(buf);
            written
        }
        _ => Ok(()),
    }
}

/// Copies every rank's pieces into `buf` (the file's bytes from `lo`) and writes the
/// claimed regions, each at once.
fn write_domain(
    file: &File,
    buf: &mut [u8],
    lo: u64,
    regions: &[(u64, u64)],
    ranks: &[(Extents, Vec<u8>)],
) -> Result<()> {
    domain::place(buf, lo, ranks)
        .ok_or_else(|| CioError::new(ErrorClass::Arg, "a piece outside its rank's data"))?;
    for &(at, len) in regions {
        let from = (at - lo) as usize;
        file.write_all_at(&buf[from..from + len as usize], at)
            .map_err(|e| io_error("collective write", &e))?;
    }
    Ok(())
}

/// Writes `pieces` (sorted by file offset, disjoint) from `data[rank]`: each run of pieces
/// that touch is gathered and written at once (in writes of at most [`GATHER`] bytes), a
/// lone piece straight from its rank's stream. Only the pieces' bytes are written: holes
/// between runs are never filled, so nothing is read before it is written.
fn place_write(file: &File, pieces: &[Piece], data: &[Vec<u8>]) -> Result<()> {
    let write = |buf: &[u8], at: u64| {
        file.write_all_at(buf, at)
            .map_err(|e| io_error("collective write", &e))
    };
    let mut i = 0;
    let mut stage = Vec::new();
    while i < pieces.len() {
        // The run: pieces i..j, each starting where the last ended, at most GATHER bytes.
        let start = pieces[i].file;
        let mut end = start + pieces[i].len;
        let mut j = i + 1;
        while j < pieces.len() && pieces[j].file == end && (end - start) < GATHER as u64 {
            end += pieces[j].len;
            j += 1;
        }
        if j == i + 1 {
            write(piece_bytes(data, &pieces[i])?, start)?;
        } else {
            stage.clear();
            for p in &pieces[i..j] {
                stage.extend_from_slice(piece_bytes(data, p)?);
            }
            write(&stage, start)?;
        }
        i = j;
    }
    Ok(())
}

/// The bytes of piece `p` in its rank's stream.
fn piece_bytes<'a>(data: &'a [Vec<u8>], p: &Piece) -> Result<&'a [u8]> {
    let d = data.get(p.rank as usize).map(Vec::as_slice).unwrap_or(&[]);
    usize::try_from(p.at)
        .ok()
        .zip(usize::try_from(p.len).ok())
        .and_then(|(at, len)| d.get(at..at.checked_add(len)?))
        .ok_or_else(|| CioError::new(ErrorClass::Arg, "a piece outside its rank's data"))
}

/// Reads what every rank wants (`wants[r]`, rank `r`'s extents in stream order): the file
/// regions their extents cover are read once each (overlapping wants share them), and each
/// rank gets exactly its bytes, in its stream's order (many small pieces close together:
/// the span they cover is read at once into a buffer of `pool`'s, see [`domain`]). A rank's
/// stream stops at the end of the file: it gets the bytes of its extents that lie before
/// it, up to the first that does not (`wants` is cut there). The streams are `pool`'s
/// buffers, to be given back once sent.
pub fn read_regions(file: &File, wants: &mut [Extents], pool: &Pool) -> Result<Vec<Vec<u8>>> {
    let size = file
        .metadata()
        .map_err(|e| io_error("collective read", &e))?
        .len();
    for w in wants.iter_mut() {
        w.clip(size);
    }
    if let Some((lo, hi)) = domain::dense_span(wants.iter()) {
        // Read whole (zeros past the end of the file): not cleared first.
        let mut span = pool.dirty((hi - lo) as usize);
        let streams = read_domain(file, &mut span, lo, wants, pool);
        pool.give_bytes(span);
        return streams;
    }
    read_pieces(file, wants, pool)
}

/// Reads the span from `lo` into `span` at once and copies each rank's pieces out of it.
fn read_domain(
    file: &File,
    span: &mut [u8],
    lo: u64,
    wants: &[Extents],
    pool: &Pool,
) -> Result<Vec<Vec<u8>>> {
    read_fully(file, span, lo)?;
    let mut out = Vec::with_capacity(wants.len());
    for extents in wants {
        let mut stream = pool.dirty(extents.bytes() as usize);
        domain::gather(extents, lo, span, &mut stream).ok_or_else(|| {
            CioError::new(ErrorClass::Io, "internal: a read extent outside its span")
        })?;
        out.push(stream);
    }
    Ok(out)
}

/// [`read_regions`] region by region: the union of every rank's extents, merged by file
/// offset, read into one buffer back to back.
fn read_pieces(file: &File, wants: &[Extents], pool: &Pool) -> Result<Vec<Vec<u8>>> {
    let lists = wants.iter().map(|w| w.iter().collect()).collect();
    let all = crate::session::merge_by_offset(lists, |e| e.file);
    let mut regions: Vec<(u64, u64, usize)> = Vec::new(); // (file, len, buffer offset)
    for e in all {
        if let Some((f, l, _)) = regions.last_mut() {
            if e.file <= *f + *l {
                *l = (*l).max(e.file + e.len - *f);
                continue;
            }
        }
        regions.push((e.file, e.len, 0));
    }
    let mut total = 0usize;
    for r in regions.iter_mut() {
        r.2 = total;
        total += r.1 as usize;
    }
    let mut buf = vec![0u8; total];
    for &(f, l, at) in &regions {
        read_fully(file, &mut buf[at..at + l as usize], f)?;
    }
    // Each rank's stream from the regions.
    let mut out = Vec::with_capacity(wants.len());
    for extents in wants {
        let mut stream = pool.bytes(extents.bytes() as usize);
        let mut r = 0;
        for e in extents.iter() {
            // Every extent lies inside the region that starts at or before it: the one of
            // the extent before (views mostly ascend), else found by binary search.
            let inside = |r: usize| {
                regions
                    .get(r)
                    .is_some_and(|&(f, l, _)| f <= e.file && e.file < f + l)
            };
            if !inside(r) {
                r = regions
                    .partition_point(|&(f, _, _)| f <= e.file)
                    .saturating_sub(1);
            }
            let piece = regions.get(r).and_then(|&(f, _, at)| {
                let from = at + usize::try_from(e.file.checked_sub(f)?).ok()?;
                buf.get(from..from + e.len as usize)
            });
            let piece = piece.ok_or_else(|| {
                CioError::new(ErrorClass::Io, "internal: a read extent outside its region")
            })?;
            stream.extend_from_slice(piece);
        }
        out.push(stream);
    }
    Ok(out)
}

/// Reads `buf.len()` bytes at `at`; bytes past the end of the file (it shrank meanwhile)
/// are zeroed (a spare buffer must not show an earlier call's bytes).
fn read_fully(file: &File, buf: &mut [u8], at: u64) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error("collective read", &e)),
        }
    }
    buf[done..].fill(0);
    Ok(())
}

/// Grows the file to at least `size` bytes with its blocks allocated (`fallocate`; where
/// the file system cannot, only the size grows).
pub fn preallocate(file: &File, size: u64) -> Result<()> {
    if size == 0 {
        return Ok(());
    }
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, size) {
        Ok(()) => Ok(()),
        Err(Errno::OPNOTSUPP) => {
            let now = file
                .metadata()
                .map_err(|e| io_error("preallocate", &e))?
                .len();
            if size > now {
                file.set_len(size)
                    .map_err(|e| io_error("preallocate", &e))?;
            }
            Ok(())
        }
        Err(e) => Err(io_error("preallocate", &std::io::Error::from(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_service::auth::Rights;

    #[test]
    fn rights_limit_roots_and_writes() {
        let dir = std::env::temp_dir();
        let ex = Exports::open([("a", dir.as_path()), ("b", dir.as_path())]).unwrap();
        let ro_a = Rights::parse("roots=a,ro").unwrap();
        assert!(ex.permit(&ro_a, "a/f", amode::RDONLY).is_ok());
        let e = ex
            .permit(&ro_a, "a/f", amode::WRONLY | amode::CREATE)
            .unwrap_err();
        assert_eq!(e.class, ErrorClass::Access);
        let e = ex.permit(&ro_a, "b/f", amode::RDONLY).unwrap_err();
        assert_eq!(e.class, ErrorClass::NoSuchFile);
        assert!(e.message.contains("(exported: a)"), "{}", e.message);
        assert!(ex.permit(&Rights::ALL, "b/f", amode::RDWR).is_ok());
    }
}
