//! Serving writes: the runtime of the upload receiver ([`crate::conv::upload::Receiver`])
//! for PUT and PUT_RANGE, whole files by PUT_FILE and their grouped commits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{busy, reply_refusal, PutReq, Received, Refusal, Server, RECV_SLICE};
use crate::conv::upload::{check_whole, write_refusal, Receiver, RxAction, RxEvent};
use crate::error::{Result, XferError};
use crate::export::{refuse, PResult};
use crate::link::{received, BlockWriter, Link};
use crate::proto::{self, BlockHeader, ErrorCode, Msg};
use crate::session::Upload;
use ferry_service::channel::Held;
use ferry_service::claims::Claim;
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
        check_whole(path, payload, blake3)?;
        let part = PartFile::whole(&self.roots, path, force)?;
        if let Err(e) = std::os::unix::fs::FileExt::write_all_at(&part.file, payload, 0) {
            part.discard();
            return Err(write_refusal(path, &e));
        }
        Ok((part, claim))
    }

    /// PUT: one upload conversation ([`Receiver::put`]) into the path's part file.
    pub(super) fn put(&self, link: &mut Link, req: &PutReq, path: &str) -> Result<()> {
        let rx = Receiver::put(req.file_id, req.size, req.mode, path);
        let dest = Dest::Put {
            req,
            claim: None,
            part: None,
            sink: None,
        };
        self.converse(link, rx, dest, req.ring, path)
    }

    /// Runs one receiving conversation to its end, executing the [`Receiver`]'s actions:
    /// frames from `link`, blocks through the staging ring's writer into `dest`. If the
    /// connection fails, the server stops, the client goes quiet or a newer PUT takes the
    /// file over, the verified prefix is journaled first (`Keep`).
    pub(super) fn converse(
        &self,
        link: &mut Link,
        mut rx: Receiver,
        mut dest: Dest,
        ring: usize,
        path: &str,
    ) -> Result<()> {
        let file_id = rx.file_id();
        let mut writer: Option<BlockWriter> = None;
        let mut frame = Frame::default();
        loop {
            let Some(action) = rx.poll() else {
                self.next_frame(link, &mut rx, &mut frame, dest.superseded(), path);
                continue;
            };
            match action {
                RxAction::Send(m) => link.send(&m)?,
                RxAction::Claim => {
                    let claimed = dest.claim(self, path);
                    rx.handle(RxEvent::Claimed(claimed))
                }
                RxAction::OpenPart => rx.handle(RxEvent::Opened(dest.open(self, path))),
                RxAction::StartWriter => {
                    writer = Some(dest.writer(file_id, (self.cfg.direct, ring))?)
                }
                RxAction::Land => {
                    let pushed = match (writer.as_mut(), frame.block.take()) {
                        (Some(w), Some((h, at, held))) => {
                            w.push_held(received(&h, link.recv_check()), held, at)
                        }
                        _ => Err(XferError::conn(
                            "internal: a block to land without a writer",
                        )),
                    };
                    if let Err(e) = pushed {
                        rx.handle(RxEvent::Interrupted(e));
                    }
                }
                RxAction::Sync => {
                    let synced = match writer.as_mut() {
                        Some(w) => w.sync(),
                        None => Ok(Vec::new()),
                    };
                    rx.handle(RxEvent::Synced(synced))
                }
                RxAction::Finish => {
                    let Some(w) = writer.take() else {
                        return Err(XferError::conn("internal: no writer to finish"));
                    };
                    let mut sink = w.finish()?;
                    let write_error = sink.io_error.take();
                    let digest = match write_error {
                        None => dest.digest(&mut sink),
                        Some(_) => None,
                    };
                    rx.handle(RxEvent::Finished {
                        write_error,
                        digest,
                    })
                }
                RxAction::Commit => rx.handle(RxEvent::Committed(dest.commit())),
                RxAction::Discard => dest.discard(),
                RxAction::Refuse { refusal, abandon } => {
                    if abandon {
                        dest.discard();
                    }
                    reply_refusal(link, file_id, refusal)?
                }
                RxAction::Keep(e) => {
                    if let Some(w) = writer.take() {
                        dest.keep(w, path);
                    }
                    return Err(e);
                }
                RxAction::Over => return Ok(()),
            }
        }
    }

    /// Waits for the next frame of a receiving conversation (a slice at a time, looking at
    /// the drain and takeover flags in between) and feeds it to `rx`: a BLOCK's header (its
    /// frame kept in `frame` to land), another message, or what interrupted the wait.
    fn next_frame(
        &self,
        link: &mut Link,
        rx: &mut Receiver,
        frame: &mut Frame,
        superseded: Option<&AtomicBool>,
        path: &str,
    ) {
        if self.stopping() {
            return rx.handle(RxEvent::Interrupted(self.stopped(path)));
        }
        if superseded.is_some_and(|s| s.load(Ordering::SeqCst)) {
            let e = XferError::conn(format!("{path}: a newer PUT of this file took over"));
            return rx.handle(RxEvent::Interrupted(e));
        }
        // A BLOCK the conversation did not land goes back to the peer.
        if let Some((_, _, held)) = frame.block.take() {
            if let Err(e) = link.give_back(held) {
                return rx.handle(RxEvent::Interrupted(e));
            }
        }
        let held = match link.recv_held_within(RECV_SLICE) {
            Ok(Some(held)) => {
                frame.idle = Duration::ZERO;
                held
            }
            Ok(None) => {
                frame.idle += RECV_SLICE;
                if frame.idle >= link.timeout {
                    let e = XferError::conn(format!(
                        "the client sent nothing for {} s; giving up",
                        frame.idle.as_secs()
                    ));
                    rx.handle(RxEvent::Interrupted(e));
                }
                return;
            }
            Err(e) => return rx.handle(RxEvent::Interrupted(e)),
        };
        let decoded = held.with_bytes(|buf| match proto::decode(buf) {
            Ok((Msg::Block(h), payload)) => Ok(Ok((h, buf.len() - payload.len()))),
            Ok((m, _)) => Ok(Err(m)),
            Err(e) => Err(XferError::conn(format!("the peer sent a bad frame: {e}"))),
        });
        match decoded {
            Ok(Ok((h, at))) => {
                frame.block = Some((h, at, held));
                rx.on_block(&h);
            }
            Ok(Err(m)) => match link.give_back(held) {
                Ok(()) => rx.handle(RxEvent::Msg(m)),
                Err(e) => rx.handle(RxEvent::Interrupted(e)),
            },
            Err(e) => rx.handle(RxEvent::Interrupted(e)),
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
        let check = link.recv_check();
        loop {
            let step = link.recv_with(|buf| match proto::decode(buf) {
                Ok((Msg::Block(h), payload)) => writer
                    .push_block(received(&h, check), payload)
                    .map(|()| None),
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

/// The frame a receiving conversation is taking in.
#[derive(Default)]
pub(super) struct Frame {
    /// The BLOCK waiting to be landed: its header, where its payload starts, and the
    /// frame itself, held in its receive buffer (handed to the writer whole, no copy).
    block: Option<(BlockHeader, usize, Held)>,
    /// How long nothing arrived.
    idle: Duration,
}

/// Where a receiving conversation lands its blocks.
pub(super) enum Dest<'a> {
    /// A PUT: the path's part file, claimed and opened when the conversation asks.
    Put {
        /// The request.
        req: &'a PutReq,
        /// Keeps other connections off the path.
        claim: Option<Claim>,
        /// The part file (taken by the commit or discard).
        part: Option<PartFile>,
        /// The journaled sink, until the writer takes it.
        sink: Option<Box<BlockSink>>,
    },
    /// A PUT_RANGE: `[offset, end)` of an OPENed upload's shared part.
    Range {
        /// The upload (let go once the range is marked).
        up: Option<Arc<Upload>>,
        /// The range.
        offset: u64,
        /// Its end.
        end: u64,
    },
}

impl Dest<'_> {
    /// The flag a newer PUT of the same file raises.
    fn superseded(&self) -> Option<&AtomicBool> {
        match self {
            Dest::Put { claim, .. } => claim.as_ref().map(|c| &*c.yield_to_newer),
            Dest::Range { up, .. } => up.as_ref().map(|u| u.superseded()),
        }
    }

    fn claim(&mut self, server: &Server, path: &str) -> bool {
        match self {
            Dest::Put { claim, .. } => {
                *claim = server.claim(path);
                claim.is_some()
            }
            Dest::Range { .. } => true,
        }
    }

    /// Opens the part (resuming what its journal holds): the verified prefix.
    fn open(&mut self, server: &Server, path: &str) -> std::result::Result<u64, Refusal> {
        let Dest::Put {
            req, part, sink, ..
        } = self
        else {
            return Ok(0);
        };
        let (p, progress, found) =
            PartFile::open(&server.roots, path, req.ident(), req.block, req.target())?;
        let offset = progress.prefix();
        match found {
            Found::Resumed => tracing::info!("{path}: resuming an upload at byte {offset}"),
            Found::Restarted => tracing::info!(
                "{path}: the partial upload is of another source (size or mtime differ); starting over"
            ),
            Found::Fresh => {}
        }
        let mut s = BlockSink::journaled(req.file_id, req.size, progress);
        if s.choose_direct(&p.file, server.cfg.direct) {
            tracing::debug!("{path}: writing with direct I/O");
        }
        s.hash_held_behind(&p.file);
        (*part, *sink) = (Some(p), Some(Box::new(s)));
        Ok(offset)
    }

    /// The writer transfer `file_id`'s blocks go to, with at most `ring` queued; a range of
    /// a parallel upload writes with direct I/O on the same terms as a whole file (`direct`:
    /// asked for in the config; else where it helps).
    fn writer(&mut self, file_id: u32, (direct, ring): (bool, usize)) -> Result<BlockWriter> {
        match self {
            Dest::Put {
                part: Some(p),
                sink,
                ..
            } => match sink.take() {
                Some(s) => BlockWriter::with_sink(*s, &p.file, ring),
                None => Err(XferError::conn("internal: the writer started twice")),
            },
            Dest::Put { .. } => Err(XferError::conn("internal: no part to write")),
            Dest::Range { up: None, .. } => Err(XferError::conn("internal: no upload")),
            Dest::Range {
                up: Some(up),
                offset,
                end,
            } => {
                let mut sink = BlockSink::range(file_id, up.size, *offset, *end);
                sink.report_to(up.journal());
                sink.hash_into(up.tree());
                match &up.file {
                    Some(f) => {
                        sink.choose_direct(f, direct);
                        BlockWriter::with_sink(sink, f, ring)
                    }
                    None => Ok(BlockWriter::null_sink(sink)),
                }
            }
        }
    }

    /// The whole part's BLAKE3 (a PUT; a range is hashed with its file at CLOSE).
    fn digest(&self, sink: &mut BlockSink) -> Option<std::io::Result<[u8; 32]>> {
        match self {
            Dest::Put { part: Some(p), .. } => Some(sink.hash(&p.file)),
            _ => None,
        }
    }

    /// PUT: mode, the source's mtime, fsync, rename. A range: marked in its upload, which
    /// is let go before the answer (the client may CLOSE on another stream as soon as the
    /// OK arrives, and CLOSE needs the only reference).
    fn commit(&mut self) -> std::io::Result<()> {
        match self {
            Dest::Put { req, part, .. } => match part.take() {
                Some(p) => p.commit(req.mode, mtime_of(req)),
                None => Err(std::io::Error::other("internal: no part to commit")),
            },
            Dest::Range { up, offset, end } => {
                if let Some(up) = up.take() {
                    up.mark(*offset, *end);
                }
                Ok(())
            }
        }
    }

    /// Drops the file: a PUT's part, or the whole upload a range belongs to.
    fn discard(&mut self) {
        match self {
            Dest::Put { part, .. } => {
                if let Some(p) = part.take() {
                    p.discard();
                }
            }
            Dest::Range { up, .. } => {
                if let Some(up) = up.take() {
                    up.fail();
                }
            }
        }
    }

    /// The connection ends mid-transfer: the writer finishes its queue first (a range's
    /// sink reports the blocks it writes to its file's shared journal, which journals them
    /// when the upload ends), then a PUT's journal records the verified prefix.
    fn keep(&self, w: BlockWriter, path: &str) {
        let saved = w.finish().map(|mut s| match self {
            Dest::Put { part: Some(p), .. } => s.checkpoint(&p.file),
            _ => Ok(()),
        });
        match saved {
            Ok(Ok(())) => {}
            Ok(Err(io)) => tracing::warn!("{path}: journal: {io}"),
            Err(f) => tracing::warn!("{path}: journal: {f}"),
        }
    }
}

/// The source's mtime of a PUT (ns since the epoch) as a time to set.
fn mtime_of(req: &PutReq) -> Option<std::time::SystemTime> {
    req.mtime.and_then(|ns| {
        let ns = u64::try_from(ns).ok()?;
        std::time::UNIX_EPOCH.checked_add(Duration::from_nanos(ns))
    })
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
    /// Answer a run of committed files with one OKS frame (a client of 1.11).
    oks: bool,
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
    /// No file waiting yet; runs of OKs go as one OKS frame if `oks` (a client of 1.11).
    pub(super) fn new(oks: bool) -> Commits {
        Commits {
            pending: Vec::new(),
            oks,
        }
    }

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
        // committed all the same: they were whole and verified). A run of OKs goes as one
        // OKS frame to a client that takes it.
        let mut answers = Answers {
            run: None,
            oks: self.oks,
        };
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
                Ok(()) => answers.ok(link, file_id),
                Err(e) => answers.end(link).and_then(|()| {
                    reply_refusal(
                        link,
                        file_id,
                        refuse(ErrorCode::Io, format!("{path}: commit failed: {e}")),
                    )
                }),
            };
        }
        sent.and(answers.end(link))
    }
}

/// The OKs of a group of commits, in order: each alone, or runs of them as OKS frames.
struct Answers {
    /// The run not sent yet: its last file and how many files.
    run: Option<(u32, u32)>,
    /// Whether the client takes OKS (1.11).
    oks: bool,
}

impl Answers {
    /// `file_id` was committed.
    fn ok(&mut self, link: &mut Link, file_id: u32) -> Result<()> {
        if !self.oks {
            return link.send(&Msg::Ok { file_id });
        }
        let count = self.run.map_or(0, |(_, n)| n) + 1;
        self.run = Some((file_id, count));
        Ok(())
    }

    /// Sends the run (before another answer, and at the end).
    fn end(&mut self, link: &mut Link) -> Result<()> {
        match self.run.take() {
            Some((file_id, 1)) => link.send(&Msg::Ok { file_id }),
            Some((file_id, count)) => link.send(&Msg::Oks { file_id, count }),
            None => Ok(()),
        }
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
