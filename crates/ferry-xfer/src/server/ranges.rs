//! Serving parallel uploads (1.2): OPEN, PUT_RANGE on any stream of the session, CLOSE.

use std::time::Duration;

use super::put::Dest;
use super::{busy, id_in_use, reply_refusal, PutReq, Server};
use crate::conv::upload::{close_matches, close_ready, Receiver};
use crate::error::{Result, XferError};
use crate::export::refuse;
use crate::link::Link;
use crate::proto::{ErrorCode, Msg};
use crate::session::{Session, Upload};
use ferry_service::landing::Found;
use ferry_service::roots::PartFile;

impl Server {
    /// OPEN (1.2): starts a parallel upload of `path` in `session` and answers HAVE with
    /// the ranges a resumed part already holds.
    pub(super) fn open(
        &self,
        link: &mut Link,
        session: &Session,
        req: &PutReq,
        path: &str,
    ) -> Result<()> {
        let file_id = req.file_id;
        if session.upload(file_id).is_some() {
            return reply_refusal(link, file_id, id_in_use(file_id));
        }
        let Some(claim) = self.claim(path) else {
            return reply_refusal(link, file_id, busy(path));
        };
        let ident = req.ident();
        let (part, progress, found) =
            match PartFile::open(&self.roots, path, ident, req.block, req.target()) {
                Ok(p) => p,
                Err(r) => return reply_refusal(link, file_id, r),
            };
        if found == Found::Resumed {
            tracing::info!(
                "{path}: resuming a parallel upload, {} bytes in place",
                progress.ranges().total()
            );
        }
        let up = Upload::new(
            path,
            (req.size, req.block),
            req.mode,
            ident.mtime,
            Some((part, progress, claim)),
        )
        .map_err(|e| XferError::io(path, &e))?;
        let ranges = up.have();
        if !session.add_upload(file_id, up) {
            return reply_refusal(link, file_id, id_in_use(file_id));
        }
        link.send(&Msg::Have { file_id, ranges })
    }

    /// PUT_RANGE (1.2): receives `[offset, offset + length)` of an OPENed upload on this
    /// stream, into the shared part file.
    pub(super) fn put_range(
        &self,
        link: &mut Link,
        session: &Session,
        ring: usize,
        file_id: u32,
        offset: u64,
        length: u64,
    ) -> Result<()> {
        let Some(up) = session.upload(file_id) else {
            let why =
                format!("PUT_RANGE of transfer {file_id}, which no OPEN of this session started");
            return reply_refusal(link, file_id, refuse(ErrorCode::BadRequest, why));
        };
        if up.failed() {
            let why = format!(
                "{}: an earlier range failed; the upload was abandoned",
                up.path
            );
            return reply_refusal(link, file_id, refuse(ErrorCode::Io, why));
        }
        let path = up.path.clone();
        let rx = Receiver::range(file_id, (up.size, up.mode), offset, length, &path);
        let dest = Dest::Range {
            up: Some(up),
            offset,
            end: offset.saturating_add(length),
        };
        self.converse(link, rx, dest, ring, &path)
    }

    /// CLOSE (1.2): every range of an OPENed upload arrived; check its BLAKE3 and commit.
    pub(super) fn close(
        &self,
        link: &mut Link,
        session: &Session,
        file_id: u32,
        length: u64,
        blake3: Option<[u8; 32]>,
    ) -> Result<()> {
        let mut up = match session.take_upload(file_id) {
            Some(Ok(u)) => u,
            Some(Err(())) => {
                let why = "CLOSE while a range of the file is still being sent";
                return reply_refusal(link, file_id, refuse(ErrorCode::BadRequest, why));
            }
            None => {
                let why =
                    format!("CLOSE of transfer {file_id}, which no OPEN of this session started");
                return reply_refusal(link, file_id, refuse(ErrorCode::BadRequest, why));
            }
        };
        let path = up.path.clone();
        if let Err((r, drop_part)) = close_ready(&path, up.complete(), length, up.size) {
            // Dropping a kept upload journals it: a resume sends the rest.
            if drop_part {
                if let Some(p) = up.take_part() {
                    p.discard();
                }
            }
            return reply_refusal(link, file_id, r);
        }
        let got = up.hash();
        let Some(part) = up.take_part() else {
            // The null sink: nothing to hash or commit.
            return link.send(&Msg::Ok { file_id });
        };
        if let Err(r) = close_matches(&path, got, blake3) {
            part.discard();
            return reply_refusal(link, file_id, r);
        }
        let mtime = u64::try_from(up.mtime)
            .ok()
            .filter(|&ns| ns > 0)
            .and_then(|ns| std::time::UNIX_EPOCH.checked_add(Duration::from_nanos(ns)));
        match part.commit(up.mode, mtime) {
            Ok(()) => link.send(&Msg::Ok { file_id }),
            Err(e) => reply_refusal(
                link,
                file_id,
                refuse(ErrorCode::Io, format!("{path}: commit failed: {e}")),
            ),
        }
    }
}
