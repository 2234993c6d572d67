//! Serving reads: GET of files and of the memory root.

use super::{id_in_use, reply_refusal, send_entries, Server, GET_PIECE};
use crate::conv::download::{self as conv, Reply, Responder};
use crate::conv::serve::DRAINING;
use crate::error::{Kind, Result, XferError};
use crate::export::{refuse, Refusal};
use crate::link::{BlockSender, BlockWriter, Link, Source, Span};
use crate::mem::{Virtual, MEM_ROOT};
use crate::proto::{Entry, EntryKind, ErrorCode, Msg};
use crate::session::{Session, Upload};
use ferry_service::hash::hash_file;
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
            Msg::Mkdir { path, .. } | Msg::Remove { path } => (path, 0),
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
            (Msg::Mkdir { .. } | Msg::Remove { .. }, _) => {
                reply_refusal(link, 0, denied("the memory root is fixed"))?
            }
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
        // One piece: nothing to read, nothing that can change.
        let mut conv = Responder::new(false, u64::MAX);
        let zeros = Ok(conv::Source {
            size,
            mode: 0o444,
            fits: false,
            hash: false,
        });
        conv.get((file_id, offset, length), "mem/zero", zeros);
        self.answer(link, tx, &mut conv, "mem/zero", None)
    }

    /// Answers a GET of a file ([`Responder`]): READY, BLOCKs, FILE_DONE; or, when `tx` sends
    /// FILE frames (a 1.3 client), for a whole file that fits in one frame, one FILE frame. A
    /// file that changes while it is read ([`ferry_service::stamp`]) gets an ERROR
    /// (integrity) instead of its FILE_DONE or FILE frame, so no client, of any version,
    /// commits it.
    pub(super) fn get(
        &self,
        link: &mut Link,
        tx: &mut BlockSender,
        file_id: u32,
        offset: u64,
        length: u64,
        path: &str,
    ) -> Result<()> {
        let mut conv = Responder::new(tx.inline, GET_PIECE);
        let req = (file_id, offset, length);
        let (file, st) = match self.roots.open_read(path) {
            Ok(f) => f,
            Err(r) => {
                conv.get(req, path, Err(r.into()));
                return self.answer(link, tx, &mut conv, path, None);
            }
        };
        let size = st.st_size as u64;
        let source = conv::Source {
            size,
            mode: st.st_mode & 0o7777,
            fits: tx.file_fits(size),
            hash: true,
        };
        conv.get(req, path, Ok(source));
        let stamp = Stamp::of(&st);
        self.answer(link, tx, &mut conv, path, Some((&file, &stamp)))
    }

    /// Answers a SUM of `path` ([`Responder::sum`]): the whole file's BLAKE3, or an ERROR if
    /// it cannot be read or changed while it was (such a hash matches no version of it).
    pub(super) fn sum(&self, link: &mut Link, tx: &mut BlockSender, path: &str) -> Result<()> {
        let found = self
            .roots
            .open_read(path)
            .map_err(Refusal::from)
            .and_then(|(f, st)| {
                let size = st.st_size as u64;
                let io = |e: std::io::Error| refuse(ErrorCode::Io, format!("{path}: {e}"));
                let hash = hash_file(&f, size).map_err(io)?;
                let changed = |e: XferError| refuse(ErrorCode::Integrity, e.msg);
                Stamp::of(&st).check(&f, path).map_err(changed)?;
                Ok((size, hash))
            });
        let mut conv = Responder::new(false, GET_PIECE);
        conv.sum(found);
        self.answer(link, tx, &mut conv, path, None)
    }

    /// Carries out a GET's replies: frames, FILE frames and pieces read from `file` (with
    /// the stamp it must keep), or zeros if `None`. A broken connection ends the GET (and
    /// the connection) at once; a drain stops it between pieces.
    fn answer(
        &self,
        link: &mut Link,
        tx: &mut BlockSender,
        conv: &mut Responder,
        path: &str,
        file: Option<(&std::fs::File, &Stamp)>,
    ) -> Result<()> {
        let unchanged = || file.map_or(Ok(()), |(f, stamp)| stamp.check(f, path));
        let mut pieces = 0;
        while let Some(reply) = conv.poll() {
            let piece = matches!(reply, Reply::Read { .. });
            let sent = match reply {
                Reply::Send(msg) => {
                    // Answers leave in request order: an open PACK goes first.
                    tx.flush_pack(link)?;
                    link.send(&msg)?;
                    continue;
                }
                Reply::SendFile {
                    file_id,
                    size,
                    mode,
                } => {
                    let Some((f, _)) = file else {
                        return Err(XferError::conn("a FILE frame of no file"));
                    };
                    tx.send_file(link, f, file_id, mode, size, &unchanged)
                }
                Reply::Read {
                    file_id,
                    offset,
                    len,
                } => {
                    if pieces > 0 && self.stopping() {
                        // The client hears why (and resumes with --retries) instead of
                        // finding the connection closed.
                        tx.flush().ok();
                        let refusal = refuse(ErrorCode::Unavailable, DRAINING);
                        reply_refusal(link, file_id, refusal).ok();
                        return Err(self.stopped(path));
                    }
                    pieces += 1;
                    let span = Span {
                        file_id,
                        offset,
                        len,
                    };
                    let source = file.map_or(Source::Zero, |(f, _)| Source::File(f));
                    // Checked after every piece: a change stops the rest from being read
                    // and sent.
                    tx.send_range(link, source, span, conv.hasher(), &|_| {})
                        .and_then(|()| unchanged())
                }
            };
            match sent {
                Ok(()) => conv.sent(),
                // A broken connection ends here (waiting for the completions of blocks sent
                // to a dead peer could take the whole link timeout on some providers).
                Err(e) if e.kind == Kind::Connection => return Err(e),
                Err(e) => {
                    if piece {
                        // No blocks of a failed GET linger behind its ERROR.
                        tx.flush().ok();
                    }
                    conv.failed(e);
                }
            }
        }
        Ok(())
    }
}
