//! A regular file (sparse) or a block device as an export. TRIM punches holes;
//! WRITE_ZEROES punches (when a hole is allowed) or zeroes the range in place
//! (`FALLOC_FL_ZERO_RANGE`) and writes zeroes only when neither works (refused with
//! `ENOTSUP` when the client asked for a fast zero); allocation comes from
//! `SEEK_DATA` / `SEEK_HOLE`; FLUSH is `fdatasync`, and FUA an `fdatasync` after the write.
//! With `direct`, aligned transfers bypass the page cache (`O_DIRECT`) and the export
//! advertises a 4096-byte minimum block.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{FallocateFlags, SeekFrom};
use rustix::io::Errno;

use super::{not_fast, unsupported, Backend, Extent, Zeroing};
use ferry_service::direct::{direct_aligned, DIRECT_ALIGN};

/// Most extents one allocation query returns (the client asks again from where it ends).
const MAX_EXTENTS: usize = 1024;
/// Size of the zero buffer used when zeroes must be written.
const ZERO_CHUNK: usize = 1 << 20;

/// A file or block device export.
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    /// An `O_DIRECT` handle on the same file, for aligned transfers.
    direct: Option<File>,
    size: u64,
    device: bool,
    path: PathBuf,
}

impl FileBackend {
    /// Opens `path` (a regular file or a block device); read-only when `readonly`;
    /// with `direct`, also through `O_DIRECT` (a warning and the page cache where the
    /// filesystem refuses it).
    pub fn open(path: &Path, readonly: bool, direct: bool) -> io::Result<FileBackend> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(!readonly)
            .open(path)?;
        let kind = file.metadata()?.file_type();
        let device = kind.is_block_device();
        if !device && !kind.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or a block device",
            ));
        }
        // The size of a block device is where its end is (what BLKGETSIZE64 reports, with
        // no ioctl needed).
        let size = rustix::fs::seek(&file, SeekFrom::End(0))?;
        let direct = if direct {
            open_direct(path, readonly, size)?
        } else {
            None
        };
        Ok(FileBackend {
            file,
            direct,
            size,
            device,
            path: path.to_path_buf(),
        })
    }

    /// The path the export was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether transfers may bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The handle for a transfer of `len` bytes at `pos` from or to `addr`: the direct
    /// one when the transfer meets its alignment, the buffered one otherwise (Linux keeps
    /// the two coherent).
    fn handle(&self, addr: usize, pos: u64, len: usize) -> &File {
        match &self.direct {
            Some(d) if direct_aligned(addr, pos, len) => d,
            _ => &self.file,
        }
    }

    /// The file's length now (a regular file may have been truncated since it was opened).
    fn current_len(&self) -> io::Result<u64> {
        let st = rustix::fs::fstat(&self.file)?;
        Ok(u64::try_from(st.st_size).unwrap_or(0))
    }

    fn sync(&self) -> io::Result<()> {
        rustix::fs::fdatasync(&self.file).map_err(io::Error::from)
    }

    fn fallocate(&self, flags: FallocateFlags, offset: u64, len: u64) -> io::Result<()> {
        rustix::fs::fallocate(&self.file, flags | FallocateFlags::KEEP_SIZE, offset, len)
            .map_err(io::Error::from)
    }

    fn write_zero_bytes(&self, mut offset: u64, len: u64) -> io::Result<()> {
        let zeroes = vec![0u8; ZERO_CHUNK.min(usize::try_from(len).unwrap_or(ZERO_CHUNK))];
        let end = offset + len;
        while offset < end {
            let n = (end - offset).min(zeroes.len() as u64) as usize;
            self.file.write_all_at(&zeroes[..n], offset)?;
            offset += n as u64;
        }
        Ok(())
    }
}

/// The `O_DIRECT` handle, or `None` (with a warning) where the filesystem refuses it.
fn open_direct(path: &Path, readonly: bool, size: u64) -> io::Result<Option<File>> {
    if !size.is_multiple_of(DIRECT_ALIGN as u64) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "direct = true needs a size that is a multiple of {DIRECT_ALIGN} bytes (this one is {size})"
            ),
        ));
    }
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(!readonly)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(path);
    match opened {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.raw_os_error() == Some(Errno::INVAL.raw_os_error()) => {
            tracing::warn!(
                "{}: direct I/O (O_DIRECT) refused by the filesystem: served through the page cache",
                path.display()
            );
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

impl Backend for FileBackend {
    fn size(&self) -> u64 {
        self.size
    }

    fn min_block(&self) -> u32 {
        if self.direct.is_some() {
            DIRECT_ALIGN as u32
        } else {
            1
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let f = self.handle(buf.as_ptr() as usize, offset, buf.len());
        f.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        let f = self.handle(buf.as_ptr() as usize, offset, buf.len());
        f.write_all_at(buf, offset)?;
        if fua {
            self.sync()?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.sync()
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        match self.fallocate(FallocateFlags::PUNCH_HOLE, offset, len) {
            Err(e) if unsupported(&e) => return Ok(()),
            r => r?,
        }
        if fua {
            self.sync()?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, how: Zeroing) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let mut done = false;
        if how.may_trim {
            match self.fallocate(FallocateFlags::PUNCH_HOLE, offset, len) {
                Err(e) if unsupported(&e) => {}
                r => done = r.map(|()| true)?,
            }
        }
        if !done {
            match self.fallocate(FallocateFlags::ZERO_RANGE, offset, len) {
                Err(e) if unsupported(&e) => {}
                r => done = r.map(|()| true)?,
            }
        }
        if !done {
            if how.fast {
                return Err(not_fast());
            }
            self.write_zero_bytes(offset, len)?;
        }
        if how.fua {
            self.sync()?;
        }
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let end = offset.saturating_add(len).min(self.size);
        if self.device {
            // A block device has no holes to report.
            return Ok(vec![data(end.saturating_sub(offset))]);
        }
        let mut out = Vec::new();
        let mut pos = offset;
        while pos < end && out.len() < MAX_EXTENTS {
            let next_data = match rustix::fs::seek(&self.file, SeekFrom::Data(pos)) {
                Ok(d) => d,
                // No data after pos: a hole to the end of the file, or a file cut short
                // since it was opened (its lost end must not read as zeroes).
                Err(Errno::NXIO) => {
                    if self.current_len()? < end {
                        return Err(truncated());
                    }
                    end
                }
                // No SEEK_DATA here: everything is data.
                Err(_) => return Ok(vec![data(end - offset)]),
            };
            if next_data > pos {
                let stop = next_data.min(end);
                out.push(hole(stop - pos));
                pos = stop;
                continue;
            }
            let next_hole = rustix::fs::seek(&self.file, SeekFrom::Hole(pos)).unwrap_or(end);
            let stop = next_hole.clamp(pos + 1, end);
            out.push(data(stop - pos));
            pos = stop;
        }
        Ok(out)
    }

    fn send_source(&self, offset: u64, len: u64) -> Option<io::Result<BorrowedFd<'_>>> {
        if self.direct.is_some() {
            // Reads bypass the page cache: sendfile would fill it, and read what a direct
            // write may not have reached yet.
            return None;
        }
        if !self.device {
            // The header promises `len` bytes: a file cut short since it was opened is
            // found now, while an error reply can still be sent.
            let end = match self.current_len() {
                Ok(n) => n,
                Err(e) => return Some(Err(e)),
            };
            if offset.saturating_add(len) > end {
                return Some(Err(truncated()));
            }
        }
        Some(Ok(self.file.as_fd()))
    }

    fn cache(&self, offset: u64, len: u64) -> io::Result<()> {
        let len = std::num::NonZeroU64::new(len);
        rustix::fs::fadvise(&self.file, offset, len, rustix::fs::Advice::WillNeed)
            .map_err(io::Error::from)
    }
}

/// The error of a read past the end of a file truncated under the export (an NBD EIO).
pub(crate) fn truncated() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the file ends before the range read (truncated under the export)",
    )
}

fn data(len: u64) -> Extent {
    Extent {
        len,
        hole: false,
        zero: false,
    }
}

fn hole(len: u64) -> Extent {
    Extent {
        len,
        hole: true,
        zero: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str, size: u64) -> PathBuf {
        let p =
            std::env::temp_dir().join(format!("ferry-block-file-{}-{name}", std::process::id()));
        let f = File::create(&p).unwrap();
        f.set_len(size).unwrap();
        p
    }

    #[test]
    fn holes_trim_and_zeroes_on_a_sparse_file() {
        let p = scratch("sparse", 1 << 20);
        let b = FileBackend::open(&p, false, false).unwrap();
        assert_eq!(b.size(), 1 << 20);
        b.write_at(&[7u8; 8192], 65536, true).unwrap();
        let e = b.extents(0, 1 << 20).unwrap();
        assert!(e[0].hole && e[0].len == 65536, "{e:?}");
        assert!(!e[1].hole && e[1].len >= 8192, "{e:?}");
        // Trim punches: reads zero, reported as a hole again.
        b.trim(65536, 8192, false).unwrap();
        let mut r = [1u8; 8192];
        b.read_at(&mut r, 65536).unwrap();
        assert!(r.iter().all(|&x| x == 0));
        assert_eq!(b.extents(0, 1 << 20).unwrap().len(), 1);
        // Zeroes that must stay allocated still read as zeroes, fast.
        b.write_at(&[9u8; 4096], 0, false).unwrap();
        let how = Zeroing {
            may_trim: false,
            fast: true,
            fua: true,
        };
        b.write_zeroes(0, 4096, how).unwrap();
        b.read_at(&mut r[..4096], 0).unwrap();
        assert!(r[..4096].iter().all(|&x| x == 0));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn read_only_and_direct() {
        let p = scratch("direct", 1 << 20);
        let ro = FileBackend::open(&p, true, false).unwrap();
        assert!(ro.write_at(b"x", 0, false).is_err());
        let d = FileBackend::open(&p, false, true).unwrap();
        if d.is_direct() {
            assert_eq!(d.min_block(), 4096);
        }
        let mut buf = crate::buf::Buf::new(4096);
        buf.data_mut(4096).fill(3);
        d.write_at(buf.data(4096), 4096, false).unwrap();
        let mut back = [0u8; 4096];
        d.read_at(&mut back, 4096).unwrap();
        assert!(back.iter().all(|&x| x == 3));
        let odd = scratch("odd", 1000);
        let e = FileBackend::open(&odd, false, true).unwrap_err();
        assert!(e.to_string().contains("multiple of 4096"), "{e}");
        let _ = std::fs::remove_file(&p);
        let _ = std::fs::remove_file(&odd);
    }
}
