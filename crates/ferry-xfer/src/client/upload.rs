//! Uploads: PUT, blocks from the staging ring, FILE_DONE with the BLAKE3, RESEND rounds.

use std::fs::File;
use std::path::Path;

use super::{remote_err, unexpected, Client, Progress};
use crate::error::{Kind, Result, XferError};
use crate::link::{Source, Span};
use crate::proto::{self, Msg};

impl Client {
    /// Uploads one local file to a remote path.
    pub fn upload_file(&mut self, src: &Path, path: &str, progress: &dyn Progress) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let file = File::open(src).map_err(|e| XferError::io(src.display(), &e))?;
        let md = file
            .metadata()
            .map_err(|e| XferError::io(src.display(), &e))?;
        if !md.is_file() {
            return Err(XferError::new(
                Kind::Usage,
                format!(
                    "{}: not a regular file (use -r for directories)",
                    src.display()
                ),
            ));
        }
        use std::os::unix::fs::MetadataExt;
        let mtime = md
            .mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(md.mtime_nsec());
        let mode = md.permissions().mode() & 0o7777;
        self.put(
            Source::File(&file),
            md.len(),
            mode,
            Some(mtime),
            path,
            progress,
        )
    }

    /// Uploads an open regular file of `size` bytes to a remote path, creating it with
    /// permission bits `mode` and, if given, the source's `mtime` (ns since the epoch).
    pub fn upload_open(
        &mut self,
        file: &File,
        size: u64,
        mode: u32,
        mtime: Option<i64>,
        path: &str,
        progress: &dyn Progress,
    ) -> Result<()> {
        self.put(Source::File(file), size, mode, mtime, path, progress)
    }

    /// Uploads `size` zero bytes (the `zero:SIZE` source of memory mode) to a remote path;
    /// no file is read. To the server's null sink (`mem/null`) nothing is hashed.
    pub fn upload_zero(&mut self, size: u64, path: &str, progress: &dyn Progress) -> Result<()> {
        self.put(Source::Zero, size, 0o644, None, path, progress)
    }

    fn put(
        &mut self,
        src: Source<'_>,
        size: u64,
        mode: u32,
        mtime: Option<i64>,
        path: &str,
        progress: &dyn Progress,
    ) -> Result<()> {
        let file_id = self.id();
        // 1.1 servers take the source's mtime (kept on the file, checked on resume) and
        // resume; a 1.0 server gets a plain PUT.
        let v11 = self.minor >= 1;
        let resume = self.resume && v11 && matches!(src, Source::File(_));
        if self.resume && !v11 {
            tracing::warn!(
                "the server speaks protocol 1.0 and cannot resume; sending the whole file"
            );
        }
        self.link.send(&Msg::Put {
            file_id,
            flags: if resume { proto::PUT_RESUME } else { 0 },
            mode,
            size,
            mtime: mtime.filter(|_| v11),
            path: path.into(),
        })?;
        let offset = match self.link.recv_msg()? {
            Msg::Ready { offset, .. } if offset <= size => offset,
            Msg::Ready { offset, .. } => {
                return Err(XferError::conn(format!(
                    "the server would resume at {offset}, past the end ({size} bytes)"
                )))
            }
            Msg::Error { code, message, .. } => return Err(remote_err(code, &message)),
            m => return Err(unexpected(&m)),
        };
        let to_null = crate::mem::classify(path) == Some(Ok(crate::mem::Virtual::Null));
        let mut hasher = (!to_null).then(blake3::Hasher::new);
        if offset > 0 {
            tracing::info!("{path}: resuming at byte {offset}");
            if let (Source::File(file), Some(h)) = (src, hasher.as_mut()) {
                hash_prefix(file, offset, h).map_err(|e| XferError::io(path, &e))?;
            }
            self.stats.resumed_bytes += offset;
            progress.add(offset);
        }
        self.stats.wire_bytes += size - offset;
        {
            let tx = &mut self.tx;
            let add = |n| progress.add(n);
            let sent = tx.send_range(
                &self.link,
                src,
                Span {
                    file_id,
                    offset,
                    len: size - offset,
                },
                hasher.as_mut(),
                &add,
            );
            if let Err(e) = sent {
                let _ = tx.flush();
                let _ = self.link.send(&Msg::Error {
                    code: e.code(),
                    file_id,
                    message: e.msg.clone(),
                });
                return Err(e);
            }
            // The server answers FILE_DONE only after taking every block: no flush needed.
        }
        let hash = hasher.map(|h| *h.finalize().as_bytes());
        loop {
            self.link.send(&Msg::FileDone {
                file_id,
                length: size,
                blake3: hash,
            })?;
            match self.link.recv_msg()? {
                Msg::Ok { .. } => break,
                Msg::Resend { ranges, .. } => {
                    self.stats.blocks_resent += ranges.len() as u64;
                    self.stats.wire_bytes += ranges.iter().map(|r| u64::from(r.1)).sum::<u64>();
                    let tx = &mut self.tx;
                    for (off, len) in ranges {
                        if off.saturating_add(u64::from(len)) > size {
                            return Err(XferError::conn(
                                "the server asked for a range past the end",
                            ));
                        }
                        tx.send_range(
                            &self.link,
                            src,
                            Span {
                                file_id,
                                offset: off,
                                len: u64::from(len),
                            },
                            None,
                            &|_| {},
                        )?;
                    }
                }
                Msg::Error { code, message, .. } => return Err(remote_err(code, &message)),
                m => return Err(unexpected(&m)),
            }
        }
        self.stats.files += 1;
        self.stats.bytes += size;
        Ok(())
    }
}

/// Feeds `file[..len]` to `h`.
fn hash_prefix(file: &File, len: u64, h: &mut blake3::Hasher) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    while pos < len {
        let n = (len - pos).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], pos)?;
        h.update(&buf[..n]);
        pos += n as u64;
    }
    Ok(())
}
