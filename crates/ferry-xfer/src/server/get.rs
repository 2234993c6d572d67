//! Serving reads: GET of files and of the memory root.

use super::{id_in_use, ready, reply_refusal, send_entries, Server, GET_PIECE};
use crate::error::{Kind, Result, XferError};
use crate::export::refuse;
use crate::link::{BlockSender, BlockWriter, Link, Source, Span};
use crate::mem::{Virtual, MEM_ROOT};
use crate::proto::{Entry, EntryKind, ErrorCode, Msg};
use crate::session::{Session, Upload};
use ferry_service::stamp::Stamp;

impl Server {
    /// Answers a request on the memory root (`mem/...`, see [`crate::mem`]); false if
    /// `msg` is not about it.
    pub(super) fn virtual_request(
        &self,
        link: &mut Link,
        tx: &mut BlockSender,
        msg: &Msg,
        session: &Session,
    ) -> Result<bool> {
        let (path, file_id) = match msg {
            Msg::Stat { path } | Msg::List { path } | Msg::Sum { path } => (path, 0),
            Msg::Mkdir { path, .. } => (path, 0),
            Msg::Get { path, file_id, .. }
            | Msg::Put { path, file_id, .. }
            | Msg::Open { path, file_id, .. } => (path, *file_id),
            _ => return Ok(false),
        };
        let v = match crate::mem::classify(path) {
            None => return Ok(false),
            Some(Ok(v)) => v,
            Some(Err(m)) => {
                reply_refusal(link, file_id, refuse(ErrorCode::NotFound, m))?;
                return Ok(true);
            }
        };
        let entry = |kind, mode, size, name: &str| Entry {
            kind,
            mode,
            size,
            mtime: 0,
            name: name.into(),
        };
        let denied = |what: &str| refuse(ErrorCode::PermissionDenied, format!("{path}: {what}"));
        match (msg, v) {
            (Msg::Stat { .. }, Virtual::Root) => {
                link.send(&Msg::Entry(entry(EntryKind::Dir, 0o555, 0, MEM_ROOT)))?
            }
            (Msg::Stat { .. }, Virtual::ZeroDir) => {
                link.send(&Msg::Entry(entry(EntryKind::Dir, 0o555, 0, "zero")))?
            }
            (Msg::Stat { .. }, Virtual::Zero(n)) => {
                let name = path.trim_end_matches('/').rsplit('/').next().unwrap_or("");
                link.send(&Msg::Entry(entry(EntryKind::File, 0o444, n, name)))?
            }
            (Msg::Stat { .. }, Virtual::Null) => {
                link.send(&Msg::Entry(entry(EntryKind::Other, 0o222, 0, "null")))?
            }
            (Msg::List { .. }, Virtual::Root) => send_entries(
                link,
                vec![
                    entry(EntryKind::Other, 0o222, 0, "null"),
                    entry(EntryKind::Dir, 0o555, 0, "zero"),
                ],
            )?,
            (Msg::List { .. }, Virtual::ZeroDir) => send_entries(link, vec![])?,
            (Msg::Get { offset, length, .. }, Virtual::Zero(size)) => {
                self.send_zero(link, tx, file_id, *offset, *length, size)?
            }
            (Msg::Put { size, .. }, Virtual::Null) => {
                link.send(&Msg::Ready {
                    file_id,
                    size: *size,
                    mode: 0o222,
                    offset: 0,
                })?;
                let mut sink = BlockWriter::null(file_id, *size);
                match self.receive_into(link, &mut sink, file_id, path)? {
                    None => {}
                    Some((_, Err(r))) => reply_refusal(link, file_id, r)?,
                    Some((length, Ok(_))) if length != *size => reply_refusal(
                        link,
                        file_id,
                        refuse(
                            ErrorCode::Integrity,
                            format!("{path}: {length} bytes announced, {size} received"),
                        ),
                    )?,
                    Some((_, Ok(_))) => link.send(&Msg::Ok { file_id })?,
                }
            }
            (Msg::Open { size, mode, .. }, Virtual::Null) => {
                let up = Upload::new(path, *size, *mode, 0, None)
                    .map_err(|e| XferError::io(path, &e))?;
                if session.add_upload(file_id, up) {
                    link.send(&Msg::Have {
                        file_id,
                        ranges: vec![],
                    })?
                } else {
                    reply_refusal(link, file_id, id_in_use(file_id))?
                }
            }
            (Msg::Put { .. } | Msg::Open { .. }, _) => {
                reply_refusal(link, file_id, denied("read-only (write to mem/null)"))?
            }
            (Msg::Get { .. }, Virtual::Null) => reply_refusal(
                link,
                file_id,
                denied("write-only (read from mem/zero/SIZE)"),
            )?,
            (Msg::Sum { .. }, _) => reply_refusal(
                link,
                0,
                refuse(
                    ErrorCode::Unsupported,
                    format!("{path}: no checksums on the memory root (nothing is stored)"),
                ),
            )?,
            (Msg::Get { .. }, _) => reply_refusal(
                link,
                file_id,
                refuse(
                    ErrorCode::IsADirectory,
                    format!("{path}: not a file; read mem/zero/SIZE, e.g. mem/zero/4G"),
                ),
            )?,
            (Msg::List { .. }, _) => reply_refusal(
                link,
                0,
                refuse(ErrorCode::NotADirectory, format!("{path}: not a directory")),
            )?,
            (Msg::Mkdir { .. }, _) => reply_refusal(link, 0, denied("the memory root is fixed"))?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Answers a GET of `mem/zero/SIZE`: READY, zero BLOCKs (each with its CRC-32C),
    /// FILE_DONE without a hash.
    fn send_zero(
        &self,
        link: &mut Link,
        tx: &mut BlockSender,
        file_id: u32,
        offset: u64,
        length: u64,
        size: u64,
    ) -> Result<()> {
        let Some(len) = ready(link, file_id, "mem/zero", offset, length, size, 0o444)? else {
            return Ok(());
        };
        let span = Span {
            file_id,
            offset,
            len,
        };
        tx.send_range(link, Source::Zero, span, None, &|_| {})?;
        link.send(&Msg::FileDone {
            file_id,
            length: len,
            blake3: None,
        })
    }

    /// Answers a GET of a file: READY, BLOCKs, FILE_DONE; or, when `tx` sends FILE frames
    /// (a 1.3 client), for a whole file that fits in one frame, one FILE frame. A file that
    /// changes while it is read ([`ferry_service::stamp`]) gets an ERROR (integrity) instead of its
    /// FILE_DONE or FILE frame, so no client, of any version, commits it.
    pub(super) fn get(
        &self,
        link: &mut Link,
        tx: &mut BlockSender,
        file_id: u32,
        offset: u64,
        length: u64,
        path: &str,
    ) -> Result<()> {
        let (file, st) = match self.roots.open_read(path) {
            Ok(f) => f,
            Err(r) => {
                tx.flush_pack(link)?;
                return reply_refusal(link, file_id, r);
            }
        };
        let size = st.st_size as u64;
        let mode = st.st_mode & 0o7777;
        let stamp = Stamp::of(&st);
        let unchanged = || stamp.check(&file, path);
        if tx.inline && offset == 0 && length == u64::MAX && tx.file_fits(size) {
            // A small file whole: READY, its block and FILE_DONE in one FILE frame.
            return match tx.send_file(link, &file, file_id, mode, size, &unchanged) {
                Err(e) if e.kind == Kind::Integrity => {
                    tx.flush_pack(link)?;
                    reply_refusal(link, file_id, refuse(ErrorCode::Integrity, e.msg))
                }
                Err(e) if e.kind != Kind::Connection => {
                    tx.flush_pack(link)?;
                    reply_refusal(
                        link,
                        file_id,
                        refuse(ErrorCode::Io, format!("{path}: {}", e.msg)),
                    )
                }
                res => res,
            };
        }
        tx.flush_pack(link)?;
        let Some(len) = ready(link, file_id, path, offset, length, size, mode)? else {
            return Ok(());
        };
        let whole = offset == 0 && len == size;
        let mut hasher = whole.then(blake3::Hasher::new);
        let end = offset + len;
        let mut pos = offset;
        let sent = loop {
            let n = (end - pos).min(GET_PIECE);
            let span = Span {
                file_id,
                offset: pos,
                len: n,
            };
            if let Err(e) = tx.send_range(link, Source::File(&file), span, hasher.as_mut(), &|_| {})
            {
                break Err(e);
            }
            // Checked after every piece: a change stops the rest from being read and sent.
            if let Err(e) = unchanged() {
                break Err(e);
            }
            pos += n;
            if pos >= end {
                break Ok(());
            }
            if self.stopping() {
                return Err(self.stopped(path));
            }
        };
        // A broken connection ends here (waiting for the completions of blocks sent to a
        // dead peer could take the whole link timeout on some providers).
        if let Err(e) = sent.as_ref() {
            if e.kind == Kind::Connection {
                return Err(e.clone());
            }
        }
        if let Err(e) = sent {
            tx.flush().ok();
            // The source changed, or a mid-file read failed: tell the client (no FILE_DONE,
            // nothing to commit), keep the connection.
            let refusal = match e.kind {
                Kind::Integrity => refuse(ErrorCode::Integrity, e.msg),
                _ => refuse(ErrorCode::Io, format!("{path}: {}", e.msg)),
            };
            tracing::warn!("{}", refusal.message);
            return reply_refusal(link, file_id, refusal);
        }
        // No flush: blocks and FILE_DONE leave in order; blocks are reaped as the ring needs them.
        link.send(&Msg::FileDone {
            file_id,
            length: len,
            blake3: hasher.map(|h| *h.finalize().as_bytes()),
        })
    }
}
