//! Serving single-stream writes: PUT, its blocks, RESEND rounds and the commit.

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::roots::{refuse, PResult, PartFile};
use super::sink::BlockSink;
use super::{busy, reply_refusal, write_refusal, PutReq, Received, Received2, Server, RECV_SLICE};
use crate::error::{Result, XferError};
use crate::journal::{Found, Ident};
use crate::link::{BlockWriter, Link};
use crate::proto::{self, ErrorCode, Msg};

impl Server {
    /// Answers a PUT_FILE: a whole small file in one frame. Checked against its BLAKE3
    /// (a mismatch is refused with Integrity; the client sends the file again by PUT),
    /// written to a temporary file, committed, and answered OK; or ERROR.
    pub(super) fn put_file(
        &self,
        link: &mut Link,
        req: &PutReq,
        path: &str,
        payload: &[u8],
        blake3: &[u8; 32],
    ) -> Result<()> {
        let file_id = req.file_id;
        let Some(_claim) = self.claim(path) else {
            return reply_refusal(link, file_id, busy(path));
        };
        if blake3::hash(payload).as_bytes() != blake3 {
            tracing::warn!(
                path,
                "uploaded file's BLAKE3 mismatch; the client sends it again"
            );
            return reply_refusal(
                link,
                file_id,
                refuse(
                    ErrorCode::Integrity,
                    format!("{path}: the file's BLAKE3 does not match what was sent"),
                ),
            );
        }
        let part = match PartFile::whole(&self.roots, path) {
            Ok(p) => p,
            Err(r) => return reply_refusal(link, file_id, r),
        };
        if let Err(e) = std::os::unix::fs::FileExt::write_all_at(&part.file, payload, 0) {
            part.discard();
            return reply_refusal(link, file_id, write_refusal(path, &e));
        }
        commit_and_answer(link, part, req, path)
    }

    pub(super) fn put(&self, link: &mut Link, req: &PutReq, path: &str) -> Result<()> {
        let file_id = req.file_id;
        let Some(claim) = self.claim(path) else {
            return reply_refusal(link, file_id, busy(path));
        };
        let ident = Ident {
            size: req.size,
            mtime: req.mtime.unwrap_or(0),
        };
        let (part, progress, found) =
            match PartFile::open(&self.roots, path, ident, req.block, req.resume) {
                Ok(p) => p,
                Err(r) => return reply_refusal(link, file_id, r),
            };
        let offset = progress.prefix();
        match found {
            Found::Resumed => tracing::info!("{path}: resuming an upload at byte {offset}"),
            Found::Restarted => tracing::info!(
                "{path}: the partial upload is of another source (size or mtime differ); starting over"
            ),
            Found::Fresh => {}
        }
        link.send(&Msg::Ready {
            file_id,
            size: req.size,
            mode: req.mode,
            offset,
        })?;
        let mut sink = BlockSink::journaled(file_id, req.size, progress);
        if self.cfg.direct {
            sink.set_direct(&part.file);
        }
        match self.receive(link, &part, sink, &claim.yield_to_newer, path) {
            // Connection-level failure: the connection ends; the part and its journal stay
            // for a resume.
            Err(e) => Err(e),
            // The client gave up on this file.
            Ok(None) => {
                part.discard();
                Ok(())
            }
            Ok(Some(Err(r))) => {
                part.discard();
                reply_refusal(link, file_id, r)
            }
            Ok(Some(Ok(()))) => commit_and_answer(link, part, req, path),
        }
    }

    /// Receives a PUT's blocks through the staging ring's writer until the file is whole
    /// and verified (`Some(Ok)`), refused (`Some(Err)`) or abandoned by the client (`None`).
    /// If the connection fails or the server stops, the verified prefix is journaled first.
    fn receive(
        &self,
        link: &mut Link,
        part: &PartFile,
        sink: BlockSink,
        superseded: &AtomicBool,
        path: &str,
    ) -> Result<Option<PResult<()>>> {
        let (file_id, size) = (sink.file_id, sink.size());
        let writer = BlockWriter::with_sink(sink, &part.file, self.cfg.ring)?;
        let file = Some(&part.file);
        let (mut sink, length, blake3) =
            match self.receive_blocks(link, writer, file_id, file, superseded, path)? {
                None => return Ok(None),
                Some(Err(r)) => return Ok(Some(Err(r))),
                Some(Ok(got)) => got,
            };
        if let Some(e) = sink.io_error.take() {
            return Ok(Some(Err(write_refusal(path, &e))));
        }
        let got = match sink.hash(&part.file) {
            Ok(h) => h,
            Err(e) => return Ok(Some(Err(refuse(ErrorCode::Io, format!("{path}: {e}"))))),
        };
        if length != size || blake3 != Some(got) {
            return Ok(Some(Err(refuse(
                ErrorCode::Integrity,
                format!("{path}: the whole-file BLAKE3 does not match what was sent; nothing was written, try again"),
            ))));
        }
        Ok(Some(Ok(())))
    }

    /// Feeds BLOCKs to `writer` until a FILE_DONE finds every block good (`Some(Ok)`: the
    /// sink, FILE_DONE's `length` and hash), the CRC rounds run out (`Some(Err)`) or the
    /// client gives up (`None`). Bad blocks are asked for again with RESEND. If the
    /// connection fails, the server stops or a newer PUT takes the file over, the sink's
    /// journal (if any) is checkpointed into `file` first.
    pub(super) fn receive_blocks(
        &self,
        link: &mut Link,
        mut writer: BlockWriter,
        file_id: u32,
        file: Option<&File>,
        superseded: &AtomicBool,
        path: &str,
    ) -> Result<Option<PResult<Received2>>> {
        let keep = |w: BlockWriter, e: XferError| -> Result<Option<PResult<Received2>>> {
            if let Some(file) = file {
                match w.finish().map(|mut s| s.checkpoint(file)) {
                    Ok(Ok(())) => {}
                    Ok(Err(io)) => tracing::warn!("{path}: journal: {io}"),
                    Err(f) => tracing::warn!("{path}: journal: {f}"),
                }
            }
            Err(e)
        };
        let mut rounds = 0;
        let mut buf = Vec::new();
        let mut idle = Duration::ZERO;
        loop {
            if self.stopping() {
                return keep(writer, self.stopped(path));
            }
            if superseded.load(Ordering::SeqCst) {
                let e = XferError::conn(format!("{path}: a newer PUT of this file took over"));
                return keep(writer, e);
            }
            if buf.capacity() == 0 {
                buf = writer.spare();
            }
            match link.recv_within(&mut buf, RECV_SLICE) {
                Ok(true) => idle = Duration::ZERO,
                Ok(false) => {
                    idle += RECV_SLICE;
                    if idle >= link.timeout {
                        let e = XferError::conn(format!(
                            "the client sent nothing for {} s; giving up",
                            idle.as_secs()
                        ));
                        return keep(writer, e);
                    }
                    continue;
                }
                Err(e) => return keep(writer, e),
            }
            let (blake3, length) = match proto::decode(&buf) {
                Ok((Msg::Block(_), _)) => {
                    if let Err(e) = writer.push(std::mem::take(&mut buf)) {
                        return keep(writer, e);
                    }
                    continue;
                }
                Ok((Msg::FileDone { blake3, length, .. }, _)) => (blake3, length),
                Ok((Msg::Error { .. }, _)) => return Ok(None),
                Ok((m, _)) => {
                    let e = XferError::conn(format!("unexpected frame during a PUT: {m:?}"));
                    return keep(writer, e);
                }
                Err(e) => {
                    let e = XferError::conn(format!("the peer sent a bad frame: {e}"));
                    return keep(writer, e);
                }
            };
            let bad = match writer.sync() {
                Ok(b) => b,
                Err(e) => return keep(writer, e),
            };
            if !bad.is_empty() {
                rounds += 1;
                if rounds > crate::BLOCK_RETRIES {
                    return Ok(Some(Err(refuse(
                        ErrorCode::Integrity,
                        crate::crc_exhausted(path),
                    ))));
                }
                link.send(&Msg::Resend {
                    file_id,
                    ranges: bad,
                })?;
                continue;
            }
            let sink = writer.finish()?;
            return Ok(Some(Ok((sink, length, blake3))));
        }
    }

    /// Feeds a PUT's BLOCKs to `writer` (checked in place in the receive buffers) until a
    /// FILE_DONE finds every block good: its `length` and hash. Bad blocks are asked for
    /// again (RESEND) up to the retry limit (then `Err`); `None` if the client gave up.
    pub(super) fn receive_into(
        &self,
        link: &mut Link,
        writer: &mut BlockWriter,
        file_id: u32,
        path: &str,
    ) -> Result<Option<Received>> {
        let mut rounds = 0;
        loop {
            let step = link.recv_with(|buf| match proto::decode(buf) {
                Ok((Msg::Block(_), _)) => writer.push_slice(buf).map(|()| None),
                Ok((Msg::FileDone { blake3, length, .. }, _)) => Ok(Some(Some((blake3, length)))),
                Ok((Msg::Error { .. }, _)) => Ok(Some(None)),
                Ok((m, _)) => Err(XferError::conn(format!(
                    "unexpected frame during a PUT: {m:?}"
                ))),
                Err(e) => Err(XferError::conn(format!("the peer sent a bad frame: {e}"))),
            })??;
            let (blake3, length) = match step {
                None => continue,
                Some(None) => return Ok(None),
                Some(Some(done)) => done,
            };
            let bad = writer.sync()?;
            if !bad.is_empty() {
                rounds += 1;
                if rounds > crate::BLOCK_RETRIES {
                    return Ok(Some((
                        length,
                        Err(refuse(ErrorCode::Integrity, crate::crc_exhausted(path))),
                    )));
                }
                link.send(&Msg::Resend {
                    file_id,
                    ranges: bad,
                })?;
                continue;
            }
            return Ok(Some((length, Ok(blake3))));
        }
    }
}

/// Commits a whole, verified upload (mode, the source's mtime, fsync, rename) and answers
/// OK, or ERROR if the commit failed.
fn commit_and_answer(link: &mut Link, part: PartFile, req: &PutReq, path: &str) -> Result<()> {
    let mtime = req.mtime.and_then(|ns| {
        let ns = u64::try_from(ns).ok()?;
        std::time::UNIX_EPOCH.checked_add(Duration::from_nanos(ns))
    });
    match part.commit(req.mode, mtime) {
        Ok(()) => link.send(&Msg::Ok {
            file_id: req.file_id,
        }),
        Err(e) => reply_refusal(
            link,
            req.file_id,
            refuse(ErrorCode::Io, format!("{path}: commit failed: {e}")),
        ),
    }
}
