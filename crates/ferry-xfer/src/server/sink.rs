//! Receiving one transfer's blocks into a file: CRC check, write (direct I/O when asked), in-order hash.

use std::fs::File;
use std::os::unix::fs::FileExt;

use rustix::io::Errno;

use crate::error::{Result, XferError};
use crate::journal::{Progress, RangeSet, SharedProgress};
use crate::proto::BlockHeader;

/// Receives the BLOCKs and FILE_DONE of one transfer into `file`: verifies each block's
/// CRC-32C, writes the good ones and hashes the file in order. Shared by the server (PUT)
/// and the client (GET).
pub struct BlockSink {
    pub(super) file_id: u32,
    size: u64,
    hasher: blake3::Hasher,
    hashed: u64,
    rehash: bool,
    /// Ranges whose CRC failed in the current round.
    pub bad: Vec<(u64, u32)>,
    /// Blocks that failed their CRC, over all rounds.
    pub bad_total: u64,
    /// The first write error (the transfer keeps draining blocks, then reports it).
    pub io_error: Option<std::io::Error>,
    /// The resume journal's view of the part file, when the receiver keeps one.
    pub journal: Option<Progress>,
    /// For one range of a parallel transfer: the range blocks must lie in.
    window: Option<(u64, u64)>,
    /// For one range of a parallel transfer: what was written from good blocks.
    pub got: RangeSet,
    /// For one range of a parallel transfer: the shared file's journal, told of each block
    /// as it is written.
    shared: Option<std::sync::Arc<SharedProgress>>,
    /// A direct-I/O (`O_DIRECT`) handle on the file, when asked for and allowed.
    direct: Option<File>,
    /// An aligned copy of a payload that arrived unaligned, for direct writes.
    bounce: Vec<u8>,
}

impl BlockSink {
    /// A sink for transfer `file_id` of a file of `size` bytes.
    pub fn new(file_id: u32, size: u64) -> Self {
        BlockSink {
            file_id,
            size,
            hasher: blake3::Hasher::new(),
            hashed: 0,
            rehash: false,
            bad: Vec::new(),
            bad_total: 0,
            io_error: None,
            journal: None,
            window: None,
            got: RangeSet::new(),
            shared: None,
            direct: None,
            bounce: Vec::new(),
        }
    }

    /// Writes aligned blocks of `file` with direct I/O (`O_DIRECT`, bypassing the page
    /// cache) where its filesystem allows it; unaligned ones (a file's tail) go through the
    /// cache. Without direct I/O there (a warning says so) every write goes through the cache.
    pub fn set_direct(&mut self, file: &File) {
        self.direct = crate::link::open_direct_or_warn(file, true);
    }

    /// A sink for the range `[lo, hi)` of a file of `size` bytes, one piece of a parallel
    /// transfer: blocks outside it are refused, nothing is hashed (the whole file is hashed
    /// in order as its ranges complete), and [`BlockSink::got`] records what was written.
    pub fn range(file_id: u32, size: u64, lo: u64, hi: u64) -> Self {
        let mut s = Self::new(file_id, size);
        s.rehash = true;
        s.window = Some((lo, hi));
        s
    }

    /// Reports each block written to `journal`, the journal of the file this range is a
    /// piece of (so a kill loses no more than with one stream).
    pub fn report_to(&mut self, journal: Option<std::sync::Arc<SharedProgress>>) {
        self.shared = journal;
    }

    /// A sink that journals its verified prefix as it goes ([`crate::journal`]) and starts
    /// where the journal's prefix ends (those bytes are not expected again; the final hash
    /// then re-reads the whole file).
    pub fn journaled(file_id: u32, size: u64, journal: Progress) -> Self {
        let mut s = Self::new(file_id, size);
        s.rehash = journal.prefix() > 0;
        s.journal = Some(journal);
        s
    }

    /// The transfer's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Records what is verified so far in the journal (fsync first), e.g. before giving up
    /// on a broken connection.
    pub fn checkpoint(&mut self, file: &File) -> std::io::Result<()> {
        match &mut self.journal {
            Some(j) => j.checkpoint(file),
            None => Ok(()),
        }
    }

    /// Waits for the background checkpoints and stops their thread; an error they met
    /// becomes the transfer's write error.
    pub fn settle(&mut self) {
        if let Some(j) = &mut self.journal {
            if let Err(e) = j.settle() {
                self.io_error.get_or_insert(e);
            }
        }
    }

    /// Checks one BLOCK against its CRC-32C and the transfer's bounds; writes it if good
    /// (to `file`; `None` is the null sink of memory mode: nothing is written or hashed),
    /// remembers its range for a re-fetch if not.
    pub fn block(&mut self, file: Option<&File>, h: &BlockHeader, payload: &[u8]) -> Result<()> {
        self.check_bounds(h)?;
        if crc32c::crc32c(payload) != h.crc32c {
            self.refetch(h, "block CRC mismatch; it will be sent again");
            return Ok(());
        }
        let Some(file) = file else {
            if self.window.is_some() {
                self.got.insert(h.offset, h.offset + u64::from(h.len));
            }
            return Ok(());
        };
        self.store(file, h, payload);
        if h.offset == self.hashed && !self.rehash {
            self.hasher.update(payload);
            self.hashed += u64::from(h.len);
        } else {
            self.rehash = true;
        }
        Ok(())
    }

    /// A whole file in one block (a FILE frame), with the file's BLAKE3 from the sender:
    /// that hash covers the same bytes as the block's CRC-32C and is needed anyway, so it
    /// is the block's check instead of both. A mismatch is re-fetched like a bad CRC.
    pub fn whole_file(
        &mut self,
        file: Option<&File>,
        h: &BlockHeader,
        payload: &[u8],
        blake3: &[u8; 32],
    ) -> Result<()> {
        let fresh = h.offset == 0 && self.hashed == 0 && !self.rehash && self.window.is_none();
        let (Some(file), true) = (file, fresh && u64::from(h.len) == self.size) else {
            return self.block(file, h, payload);
        };
        self.check_bounds(h)?;
        let mut hasher = blake3::Hasher::new();
        hasher.update(payload);
        if hasher.finalize().as_bytes() != blake3 {
            self.refetch(h, "file BLAKE3 mismatch; it will be sent again");
            return Ok(());
        }
        self.store(file, h, payload);
        self.hasher = hasher;
        self.hashed = self.size;
        Ok(())
    }

    fn check_bounds(&self, h: &BlockHeader) -> Result<()> {
        let end = h.offset.saturating_add(u64::from(h.len));
        let outside = self
            .window
            .is_some_and(|(lo, hi)| h.offset < lo || end > hi);
        if h.file_id != self.file_id || end > self.size || outside {
            return Err(XferError::conn(format!(
                "the peer sent a block outside the transfer (file {} offset {} len {})",
                h.file_id, h.offset, h.len
            )));
        }
        Ok(())
    }

    fn refetch(&mut self, h: &BlockHeader, why: &str) {
        tracing::warn!(offset = h.offset, len = h.len, "{why}");
        self.bad.push((h.offset, h.len));
        self.bad_total += 1;
    }

    /// Writes a good block (bounds checked) and records it: in the range set of a parallel
    /// piece, in the journal (checkpointing when due). A write error is kept for the end.
    fn store(&mut self, file: &File, h: &BlockHeader, payload: &[u8]) {
        if self.io_error.is_some() {
            return;
        }
        if let Err(e) = write_at(file, &mut self.direct, &mut self.bounce, payload, h.offset) {
            self.io_error = Some(e);
            return;
        }
        if self.window.is_some() {
            self.got.insert(h.offset, h.offset + u64::from(h.len));
        }
        if let Some(j) = &self.shared {
            if let Err(e) = j.good(h.offset, u64::from(h.len)) {
                self.io_error = Some(e);
            }
        }
        if let Some(j) = &mut self.journal {
            j.good(h.offset, u64::from(h.len));
            if j.due() {
                if let Err(e) = j.checkpoint_in_background(file) {
                    self.io_error = Some(e);
                }
            }
        }
    }

    /// The BLAKE3 of what was written (re-reading the file if blocks arrived out of order).
    pub fn hash(&mut self, file: &File) -> std::io::Result<[u8; 32]> {
        if !self.rehash && self.hashed == self.size {
            return Ok(*self.hasher.finalize().as_bytes());
        }
        hash_file(file, self.size)
    }
}

/// Writes `payload` at `offset` of `file`: through `direct` when the block is aligned (from
/// an aligned copy in `bounce` if the payload itself is not), else through the page cache. A
/// filesystem that refuses a direct write (`EINVAL`) gets this and later blocks cached.
fn write_at(
    file: &File,
    direct: &mut Option<File>,
    bounce: &mut Vec<u8>,
    payload: &[u8],
    offset: u64,
) -> std::io::Result<()> {
    use crate::link::{direct_aligned, DIRECT_ALIGN};
    let Some(d) = direct.as_ref() else {
        return file.write_all_at(payload, offset);
    };
    if !direct_aligned(0, offset, payload.len()) {
        return file.write_all_at(payload, offset);
    }
    let res = if direct_aligned(payload.as_ptr() as usize, offset, payload.len()) {
        d.write_all_at(payload, offset)
    } else {
        if bounce.len() < payload.len() + DIRECT_ALIGN {
            bounce.resize(payload.len() + DIRECT_ALIGN, 0);
        }
        let start = bounce.as_ptr().align_offset(DIRECT_ALIGN);
        let copy = &mut bounce[start..start + payload.len()];
        copy.copy_from_slice(payload);
        d.write_all_at(copy, offset)
    };
    match res {
        Err(e) if e.raw_os_error() == Some(Errno::INVAL.raw_os_error()) => {
            tracing::warn!("direct I/O write refused ({e}): going through the page cache");
            *direct = None;
            file.write_all_at(payload, offset)
        }
        r => r,
    }
}

/// BLAKE3 of the first `size` bytes of `file`.
pub fn hash_file(file: &File, size: u64) -> std::io::Result<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    while pos < size {
        let n = (size - pos).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], pos)?;
        h.update(&buf[..n]);
        pos += n as u64;
    }
    Ok(*h.finalize().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(len: usize, crc32c: u32) -> BlockHeader {
        BlockHeader {
            file_id: 7,
            stream: 0,
            offset: 0,
            len: len as u32,
            crc32c,
        }
    }

    /// A whole file checked by its BLAKE3: written and hashed once when it matches; kept out
    /// of the file and listed for a re-fetch when it does not, whatever its CRC says.
    #[test]
    fn a_whole_file_is_checked_by_its_hash() {
        let dir = std::env::temp_dir().join(format!("ferry-sink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 31 + 7) as u8).collect();
        let good = *blake3::hash(&data).as_bytes();
        let path = dir.join("good");
        let file = File::create_new(&path).unwrap();
        let mut sink = BlockSink::new(7, data.len() as u64);
        // A CRC of 0 would fail `block`: the hash alone decides here.
        sink.whole_file(Some(&file), &header(data.len(), 0), &data, &good)
            .unwrap();
        assert!(sink.bad.is_empty());
        assert_eq!(std::fs::read(&path).unwrap(), data);
        assert_eq!(sink.hash(&file).unwrap(), good);

        let path = dir.join("bad");
        let file = File::create_new(&path).unwrap();
        let mut sink = BlockSink::new(7, data.len() as u64);
        let mut other = good;
        other[0] ^= 1;
        let crc = crc32c::crc32c(&data);
        sink.whole_file(Some(&file), &header(data.len(), crc), &data, &other)
            .unwrap();
        assert_eq!(sink.bad, vec![(0, data.len() as u32)]);
        assert_eq!(sink.bad_total, 1);
        assert!(std::fs::read(&path).unwrap().is_empty());
        // Outside the transfer is refused as before.
        let mut sink = BlockSink::new(7, 10);
        assert!(sink
            .whole_file(Some(&file), &header(data.len(), crc), &data, &good)
            .is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
