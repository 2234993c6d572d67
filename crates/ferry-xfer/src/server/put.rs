//! Serving single-stream writes: PUT, its blocks, RESEND rounds and the commit.

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{busy, reply_refusal, write_refusal, PutReq, Received, Received2, Server, RECV_SLICE};
use crate::error::{Result, XferError};
use crate::export::{refuse, PResult};
use crate::link::{BlockWriter, Link};
use crate::proto::{self, ErrorCode, Msg};
use ferry_service::landing::Found;
use ferry_service::roots::PartFile;
use ferry_service::sink::BlockSink;

impl Server {
    /// Answers a PUT_FILE: a whole small file in one frame. Checked against its BLAKE3
    /// (a mismatch is refused with Integrity; the client sends the file again by PUT),
    /// written to a temporary file, committed, and answered OK; or ERROR.
    pub(super) fn put_file(
        &self,
        link: &mut Link,
        commits: &mut Commits,
        req: &PutReq,
        path: &str,
        payload: &[u8],
        blake3: &[u8; 32],
    ) -> Result<()> {
        if commits.holds(path) {
            // The same file again: the earlier one lands first.
            commits.flush(link)?;
        }
        match self.write_whole(path, payload, blake3, req.force) {
            Ok((part, claim)) => commits.add(link, Waiting::new(part, claim, req, path)),
            Err(r) => {
                // Answers keep request order: the files before this one are answered first.
                commits.flush(link)?;
                reply_refusal(link, req.file_id, r)
            }
        }
    }

    /// Checks a PUT_FILE's payload against its BLAKE3 and writes it to a temporary file of
    /// `path`, under a claim on the path (held until the commit).
    fn write_whole(
        &self,
        path: &str,
        payload: &[u8],
        blake3: &[u8; 32],
        force: bool,
    ) -> PResult<(PartFile, ferry_service::claims::Claim)> {
        let claim = self.claim(path).ok_or_else(|| busy(path))?;
        if blake3::hash(payload).as_bytes() != blake3 {
            tracing::warn!(
                path,
                "uploaded file's BLAKE3 mismatch; the client sends it again"
            );
            return Err(refuse(
                ErrorCode::Integrity,
                format!("{path}: the file's BLAKE3 does not match what was sent"),
            ));
        }
        let part = PartFile::whole(&self.roots, path, force)?;
        if let Err(e) = std::os::unix::fs::FileExt::write_all_at(&part.file, payload, 0) {
            part.discard();
            return Err(write_refusal(path, &e));
        }
        Ok((part, claim))
    }

    pub(super) fn put(&self, link: &mut Link, req: &PutReq, path: &str) -> Result<()> {
        let file_id = req.file_id;
        let Some(claim) = self.claim(path) else {
            return reply_refusal(link, file_id, busy(path));
        };
        let (part, progress, found) =
            match PartFile::open(&self.roots, path, req.ident(), req.block, req.target()) {
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
        match self.receive(link, &part, sink, req.ring, &claim.yield_to_newer, path) {
            // Connection-level failure: the connection ends; the part and its journal stay
            // for a resume if the journal holds verified bytes (the part's drop decides).
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
        ring: usize,
        superseded: &AtomicBool,
        path: &str,
    ) -> Result<Option<PResult<()>>> {
        let (file_id, size) = (sink.transfer(), sink.size());
        let writer = BlockWriter::with_sink(sink, &part.file, ring)?;
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
            // The writer finishes its queue first: a range's sink reports the blocks it
            // writes to its file's shared journal, which journals them when the upload ends.
            let saved = w.finish().map(|mut s| match file {
                Some(file) => s.checkpoint(file),
                None => Ok(()),
            });
            match saved {
                Ok(Ok(())) => {}
                Ok(Err(io)) => tracing::warn!("{path}: journal: {io}"),
                Err(f) => tracing::warn!("{path}: journal: {f}"),
            }
            Err(e)
        };
        let mut rounds = 0;
        let mut idle = Duration::ZERO;
        loop {
            if self.stopping() {
                return keep(writer, self.stopped(path));
            }
            if superseded.load(Ordering::SeqCst) {
                let e = XferError::conn(format!("{path}: a newer PUT of this file took over"));
                return keep(writer, e);
            }
            // A BLOCK goes to the writer in its receive buffer (held until written, no copy).
            let held = match link.recv_held_within(RECV_SLICE) {
                Ok(Some(held)) => held,
                Ok(None) => {
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
            };
            idle = Duration::ZERO;
            let (blake3, length) = match held.with_bytes(decode_step) {
                Ok(Step::Block(h, at)) => {
                    if let Err(e) = writer.push_held(&h, held, at) {
                        return keep(writer, e);
                    }
                    continue;
                }
                Ok(Step::Done { blake3, length }) => (blake3, length),
                Ok(Step::GaveUp) => return Ok(None),
                Err(e) => return keep(writer, e),
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
                Ok((Msg::Block(h), payload)) => writer.push_block(&h, payload).map(|()| None),
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

/// What a frame received during a PUT means.
enum Step {
    /// A BLOCK, its payload at this offset of the frame.
    Block(proto::BlockHeader, usize),
    /// FILE_DONE: the client's length and hash.
    Done {
        blake3: Option<[u8; 32]>,
        length: u64,
    },
    /// ERROR: the client gave the file up.
    GaveUp,
}

/// Decodes a frame received during a PUT (anything but BLOCK, FILE_DONE or ERROR breaks
/// the protocol).
fn decode_step(buf: &[u8]) -> Result<Step> {
    match proto::decode(buf) {
        Ok((Msg::Block(h), payload)) => Ok(Step::Block(h, buf.len() - payload.len())),
        Ok((Msg::FileDone { blake3, length, .. }, _)) => Ok(Step::Done { blake3, length }),
        Ok((Msg::Error { .. }, _)) => Ok(Step::GaveUp),
        Ok((m, _)) => Err(XferError::conn(format!(
            "unexpected frame during a PUT: {m:?}"
        ))),
        Err(e) => Err(XferError::conn(format!("the peer sent a bad frame: {e}"))),
    }
}

/// The source's mtime of a PUT (ns since the epoch) as a time to set.
fn mtime_of(req: &PutReq) -> Option<std::time::SystemTime> {
    req.mtime.and_then(|ns| {
        let ns = u64::try_from(ns).ok()?;
        std::time::UNIX_EPOCH.checked_add(Duration::from_nanos(ns))
    })
}

/// Commits a whole, verified upload (mode, the source's mtime, fsync, rename) and answers
/// OK, or ERROR if the commit failed.
fn commit_and_answer(link: &mut Link, part: PartFile, req: &PutReq, path: &str) -> Result<()> {
    match part.commit(req.mode, mtime_of(req)) {
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

/// The most PUT_FILEs whose commits wait together.
const COMMIT_GROUP: usize = 32;

/// Threads fsyncing a group's files at once (their time is spent waiting for the disk).
const SYNC_THREADS: usize = 8;

/// Whole, verified PUT_FILEs waiting to be committed together: their fsyncs run in
/// parallel, each directory is fsynced once, and then each gets its answer, in order. The
/// server commits a group when no request is waiting, before it answers anything else, and
/// at [`COMMIT_GROUP`] files: a client streaming small files has many in flight, and on a
/// disk one file's fsync and its directory's took longer than receiving the next.
#[derive(Default)]
pub(super) struct Commits {
    pending: Vec<Waiting>,
}

/// A PUT_FILE written and verified, waiting for its commit.
pub(super) struct Waiting {
    part: PartFile,
    /// Keeps other connections off the path until the rename.
    _claim: ferry_service::claims::Claim,
    file_id: u32,
    mode: u32,
    mtime: Option<std::time::SystemTime>,
    path: String,
}

impl Waiting {
    fn new(
        part: PartFile,
        claim: ferry_service::claims::Claim,
        req: &PutReq,
        path: &str,
    ) -> Waiting {
        Waiting {
            part,
            _claim: claim,
            file_id: req.file_id,
            mode: req.mode,
            mtime: mtime_of(req),
            path: path.to_string(),
        }
    }
}

impl Commits {
    /// Whether files are waiting.
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Whether a file of `path` is waiting.
    fn holds(&self, path: &str) -> bool {
        self.pending.iter().any(|w| w.path == path)
    }

    fn add(&mut self, link: &mut Link, waiting: Waiting) -> Result<()> {
        self.pending.push(waiting);
        if self.pending.len() >= COMMIT_GROUP {
            return self.flush(link);
        }
        Ok(())
    }

    /// Commits every waiting file and answers each, OK or ERROR, in order.
    pub(super) fn flush(&mut self, link: &mut Link) -> Result<()> {
        let pending = std::mem::take(&mut self.pending);
        if pending.is_empty() {
            return Ok(());
        }
        let settled = settle_all(&pending);
        // Rename the good ones into place; fsync each directory once.
        let mut placed = Vec::with_capacity(pending.len());
        type Dir = std::sync::Arc<std::os::fd::OwnedFd>;
        let mut dirs: Vec<((u64, u64), Dir, std::io::Result<()>)> = Vec::new();
        for (w, ok) in pending.into_iter().zip(settled) {
            let Waiting {
                part,
                _claim,
                file_id,
                path,
                ..
            } = w;
            let res = ok.and_then(|()| part.place()).and_then(|dir| {
                let st = rustix::fs::fstat(&*dir)?;
                let key = (st.st_dev, st.st_ino);
                let at = match dirs.iter().position(|(k, _, _)| *k == key) {
                    Some(i) => i,
                    None => {
                        dirs.push((key, dir, Ok(())));
                        dirs.len() - 1
                    }
                };
                Ok(at)
            });
            placed.push((file_id, path, res));
        }
        for (_, dir, res) in &mut dirs {
            *res = rustix::fs::fsync(&*dir).map_err(std::io::Error::from);
        }
        // Every answer is tried; the first that cannot be sent is the result (the files are
        // committed all the same: they were whole and verified).
        let mut sent = Ok(());
        for (file_id, path, res) in placed {
            let res = res.and_then(|at| match &dirs[at].2 {
                Ok(()) => Ok(()),
                Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
            });
            if sent.is_err() {
                continue;
            }
            sent = match res {
                Ok(()) => link.send(&Msg::Ok { file_id }),
                Err(e) => reply_refusal(
                    link,
                    file_id,
                    refuse(ErrorCode::Io, format!("{path}: commit failed: {e}")),
                ),
            };
        }
        sent
    }
}

/// Sets mode and mtime and fsyncs each waiting file: in parallel on [`SYNC_THREADS`]
/// threads where fsync waits for a disk, in order where it is free (tmpfs). One result per
/// file, in order.
fn settle_all(pending: &[Waiting]) -> Vec<std::io::Result<()>> {
    let settle = |w: &Waiting| w.part.settle(w.mode, w.mtime);
    let serial = match pending {
        [] | [_] => true,
        [first, ..] => ferry_service::commit::fsync_is_free(&first.part.file),
    };
    if serial {
        return pending.iter().map(settle).collect();
    }
    let per = pending.len().div_ceil(SYNC_THREADS);
    std::thread::scope(|s| {
        let threads: Vec<_> = pending
            .chunks(per)
            .map(|c| {
                (
                    c.len(),
                    s.spawn(move || c.iter().map(settle).collect::<Vec<_>>()),
                )
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|(n, t)| {
                t.join().unwrap_or_else(|_| {
                    (0..n)
                        .map(|_| Err(std::io::Error::other("fsync thread panicked")))
                        .collect()
                })
            })
            .collect()
    })
}
