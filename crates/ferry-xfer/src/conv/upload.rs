//! The upload conversation: the client's [`Uploader`] and the server's [`Receiver`], with
//! no I/O, no clock and no threads.
//!
//! One conversation moves one file (PUT) or one range of an OPENed file (PUT_RANGE):
//!
//! ```text
//! client                                   server
//! PUT / PUT_RANGE          ───────────▶    claim, open the part (journal: resume offset)
//!                          ◀───────────    READY offset | ERROR
//! BLOCK… from offset       ───────────▶    land each (CRC check, write, journal)
//! FILE_DONE length, hash   ───────────▶    sync the writer: blocks whose CRC failed?
//!                          ◀───────────    RESEND ranges (≤ BLOCK_RETRIES rounds) | …
//!                                          hash the part, compare, commit
//!                          ◀───────────    OK | ERROR
//! ```
//!
//! The runtime feeds each machine what arrived (a message, a block header, a local result)
//! and executes the actions it polls, in order. Every action that names a local result
//! (`SendRange`, `CheckSource`, `Sync`, `Finish`, `Commit`, `Claim`, `OpenPart`) is
//! answered with its event before the next message from the peer is fed in.
//!
//! The other upload requests are single decisions, not conversations: what OPEN's HAVE
//! leaves to send ([`held_ranges`]), whether a CLOSE commits ([`close_ready`] before the
//! part is hashed, [`close_matches`] after), whether a PUT_FILE's payload is written
//! ([`check_whole`]).

use std::collections::VecDeque;

use super::download::unexpected;
use crate::error::XferError;
use crate::export::{refuse, Refusal};
use crate::link::Span;
use crate::proto::{BlockHeader, ErrorCode, Msg};
use ferry_service::journal::RangeSet;

/// What a PUT says of the file it uploads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutJob {
    /// The transfer id the client chose.
    pub file_id: u32,
    /// PUT flags ([`crate::proto::PUT_RESUME`], [`crate::proto::PUT_FORCE`]).
    pub flags: u8,
    /// The source's permission bits.
    pub mode: u32,
    /// Its size.
    pub size: u64,
    /// Its mtime (ns since the epoch), sent to 1.1 servers.
    pub mtime: Option<i64>,
    /// The remote path.
    pub path: String,
    /// Whether FILE_DONE carries the source's BLAKE3 (not to the null sink of memory mode).
    pub hash: bool,
    /// Whether the source is checked for changes before each FILE_DONE (a file with its stamp).
    pub check_source: bool,
}

/// What the server says it holds of a file being resumed (OPEN's answer, HAVE), checked:
/// each range must be non-empty and lie in the file. What is left to send is the rest
/// ([`RangeSet::missing`]).
pub fn held_ranges(have: &[(u64, u64)], size: u64) -> Result<RangeSet, XferError> {
    let mut held = RangeSet::new();
    for &(a, b) in have {
        if a >= b || b > size {
            return Err(XferError::conn(format!(
                "the server holds a range {a}..{b} outside the file ({size} bytes)"
            )));
        }
        held.insert(a, b);
    }
    Ok(held)
}

/// What an [`Uploader`] asks its runtime to do.
#[derive(Debug)]
pub enum Action {
    /// Send this message.
    Send(Msg),
    /// The server holds `[0, offset)` already (resume): count it as done, and when the file
    /// is hashed, feed those bytes of the source into the running hash first.
    Resumed {
        /// Where the data to send starts.
        offset: u64,
        /// Whether the prefix must be hashed.
        hash: bool,
    },
    /// Send `span` of the source as BLOCK frames; answer with [`Event::Sent`] or
    /// [`Event::SendFailed`]. With `hash`, feed the bytes into the running hash and report
    /// its digest; `resend` marks a range the server asked for again.
    SendRange {
        /// The bytes to send.
        span: Span,
        /// Feed them into the running hash, then finish it.
        hash: bool,
        /// A RESEND round's range.
        resend: bool,
    },
    /// Check the source did not change while it was read; answer with
    /// [`Event::SourceChecked`].
    CheckSource,
    /// Tell the server to drop the file (ERROR), then fail with this error.
    Abandon(XferError),
    /// The server took the file (OK).
    Done,
    /// The conversation failed with this error (the connection is in an unknown state).
    Fail(XferError),
}

/// What an [`Uploader`] is told.
#[derive(Debug)]
pub enum Event {
    /// A message from the server.
    Msg(Msg),
    /// A [`Action::SendRange`] went out; `digest` is the finished hash if it was asked for.
    Sent {
        /// The source's BLAKE3.
        digest: Option<[u8; 32]>,
    },
    /// A [`Action::SendRange`] failed (the source could not be read, or the link broke).
    SendFailed(XferError),
    /// The answer to [`Action::CheckSource`].
    SourceChecked(Result<(), XferError>),
}

/// Where an [`Uploader`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UpState {
    /// The request went; waiting for READY.
    AwaitReady,
    /// Ranges out; waiting for this many `Sent`.
    Sending { left: usize, resend: bool },
    /// Waiting for the source check before FILE_DONE.
    Checking,
    /// FILE_DONE went; waiting for OK, RESEND or ERROR.
    AwaitVerdict,
    /// Done or failed.
    Over,
}

/// The client half of one upload conversation (see the module documentation).
#[derive(Debug)]
pub struct Uploader {
    file_id: u32,
    /// The bytes this conversation covers: the whole file, or one range of it.
    lo: u64,
    hi: u64,
    /// A whole file by PUT (resume, hash, source checks), not a PUT_RANGE.
    whole: bool,
    hash: bool,
    check_source: bool,
    digest: Option<[u8; 32]>,
    state: UpState,
    actions: VecDeque<Action>,
}

impl Uploader {
    /// Uploads a whole file by PUT.
    pub fn put(job: PutJob) -> Uploader {
        let mut up = Uploader {
            file_id: job.file_id,
            lo: 0,
            hi: job.size,
            whole: true,
            hash: job.hash,
            check_source: job.check_source,
            digest: None,
            state: UpState::AwaitReady,
            actions: VecDeque::new(),
        };
        up.actions.push_back(Action::Send(Msg::Put {
            file_id: job.file_id,
            flags: job.flags,
            mode: job.mode,
            size: job.size,
            mtime: job.mtime,
            path: job.path,
        }));
        up
    }

    /// Uploads `[lo, hi)` of an OPENed file by PUT_RANGE (no hash: CLOSE carries it).
    pub fn range(file_id: u32, lo: u64, hi: u64) -> Uploader {
        let mut up = Uploader {
            file_id,
            lo,
            hi,
            whole: false,
            hash: false,
            check_source: false,
            digest: None,
            state: UpState::AwaitReady,
            actions: VecDeque::new(),
        };
        up.actions.push_back(Action::Send(Msg::PutRange {
            file_id,
            offset: lo,
            length: hi.saturating_sub(lo),
        }));
        up
    }

    /// The transfer id of the conversation.
    pub fn file_id(&self) -> u32 {
        self.file_id
    }

    /// The next action to execute, if any.
    pub fn poll(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Whether the machine waits for a message from the server (no action is queued and
    /// none of its local requests is outstanding).
    pub fn awaits_peer(&self) -> bool {
        self.actions.is_empty() && matches!(self.state, UpState::AwaitReady | UpState::AwaitVerdict)
    }

    /// Whether the conversation ended (its last action was `Done`, `Fail` or `Abandon`).
    pub fn is_over(&self) -> bool {
        self.state == UpState::Over
    }

    /// Takes in what happened.
    pub fn handle(&mut self, ev: Event) {
        match (self.state, ev) {
            (UpState::Over, _) => {}
            (UpState::AwaitReady, Event::Msg(m)) => self.on_ready(m),
            (UpState::AwaitVerdict, Event::Msg(m)) => self.on_verdict(m),
            (UpState::Sending { left, resend }, Event::Sent { digest }) => {
                if !resend {
                    self.digest = digest;
                }
                if left > 1 {
                    self.state = UpState::Sending {
                        left: left - 1,
                        resend,
                    };
                } else {
                    self.before_done();
                }
            }
            // A first send that failed part way is dropped at the server; a resend that
            // failed ends the conversation as it is.
            (UpState::Sending { resend: false, .. }, Event::SendFailed(e)) => self.abandon(e),
            (UpState::Sending { resend: true, .. }, Event::SendFailed(e)) => self.fail(e),
            (UpState::Checking, Event::SourceChecked(Ok(()))) => self.file_done(),
            (UpState::Checking, Event::SourceChecked(Err(e))) => self.abandon(e),
            (_, Event::Msg(m)) => self.fail(unexpected(&m)),
            (state, ev) => self.fail(XferError::conn(format!(
                "internal: upload event {ev:?} in state {state:?}"
            ))),
        }
    }

    fn on_ready(&mut self, m: Msg) {
        let offset = match m {
            Msg::Ready { offset, .. } if self.whole && offset <= self.hi => offset,
            Msg::Ready { offset, .. } if self.whole => {
                let size = self.hi;
                return self.fail(XferError::conn(format!(
                    "the server would resume at {offset}, past the end ({size} bytes)"
                )));
            }
            Msg::Ready { offset, .. } if offset == self.lo => offset,
            Msg::Error { code, message, .. } => {
                return self.fail(crate::error::remote(code, &message))
            }
            m => return self.fail(unexpected(&m)),
        };
        if offset > self.lo {
            self.actions.push_back(Action::Resumed {
                offset,
                hash: self.hash,
            });
        }
        self.send_ranges(
            vec![Span {
                file_id: self.file_id,
                offset,
                len: self.hi - offset,
            }],
            false,
        );
    }

    fn on_verdict(&mut self, m: Msg) {
        match m {
            Msg::Ok { .. } => {
                self.state = UpState::Over;
                self.actions.push_back(Action::Done);
            }
            Msg::Resend { ranges, .. } => self.on_resend(&ranges),
            Msg::Error { code, message, .. } => self.fail(crate::error::remote(code, &message)),
            m => self.fail(unexpected(&m)),
        }
    }

    /// RESEND: every range must lie in what this conversation sent.
    fn on_resend(&mut self, ranges: &[(u64, u32)]) {
        let mut spans = Vec::with_capacity(ranges.len());
        for &(off, len) in ranges {
            let end = off.saturating_add(u64::from(len));
            if off < self.lo || end > self.hi {
                let why = if self.whole {
                    "the server asked for a range past the end"
                } else {
                    "the server asked for a range outside the one sent"
                };
                return self.fail(XferError::conn(why));
            }
            spans.push(Span {
                file_id: self.file_id,
                offset: off,
                len: u64::from(len),
            });
        }
        self.send_ranges(spans, true);
    }

    fn send_ranges(&mut self, spans: Vec<Span>, resend: bool) {
        if spans.is_empty() {
            return self.before_done();
        }
        self.state = UpState::Sending {
            left: spans.len(),
            resend,
        };
        for span in spans {
            self.actions.push_back(Action::SendRange {
                span,
                hash: self.hash && !resend,
                resend,
            });
        }
    }

    /// Every range went: check the source, then FILE_DONE.
    fn before_done(&mut self) {
        if self.check_source {
            self.state = UpState::Checking;
            self.actions.push_back(Action::CheckSource);
        } else {
            self.file_done();
        }
    }

    fn file_done(&mut self) {
        self.state = UpState::AwaitVerdict;
        self.actions.push_back(Action::Send(Msg::FileDone {
            file_id: self.file_id,
            length: self.hi - self.lo,
            blake3: self.digest,
        }));
    }

    fn abandon(&mut self, e: XferError) {
        self.state = UpState::Over;
        self.actions.push_back(Action::Abandon(e));
    }

    fn fail(&mut self, e: XferError) {
        self.state = UpState::Over;
        self.actions.push_back(Action::Fail(e));
    }
}

/// What a [`Receiver`] asks its runtime to do.
#[derive(Debug)]
pub enum RxAction {
    /// Send this message.
    Send(Msg),
    /// Claim the path for writing; answer with [`RxEvent::Claimed`].
    Claim,
    /// Open (or resume) the part file and its journal; answer with [`RxEvent::Opened`].
    OpenPart,
    /// Start the writer: blocks from here on are landed ([`Receiver::on_block`]).
    StartWriter,
    /// Hand the block just fed in to the writer (it checks the CRC, writes, journals).
    Land,
    /// Wait until every landed block is written; answer with [`RxEvent::Synced`].
    Sync,
    /// Stop the writer; answer with [`RxEvent::Finished`].
    Finish,
    /// Commit what arrived (PUT: mode, mtime, fsync, rename; a range: mark it in its
    /// upload); answer with [`RxEvent::Committed`].
    Commit,
    /// The client gave up on the file: drop it (PUT: the part; a range: its upload).
    Discard,
    /// Answer ERROR. With `abandon`, drop the file first, as for `Discard`.
    Refuse {
        /// The answer.
        refusal: Refusal,
        /// Drop the part (PUT) or fail the upload (range) first.
        abandon: bool,
    },
    /// The connection cannot go on: journal what is verified (the writer finishes its
    /// queue first), then end the connection with this error.
    Keep(XferError),
    /// The conversation ended; the connection goes on with its next request.
    Over,
}

/// What a [`Receiver`] is told.
#[derive(Debug)]
pub enum RxEvent {
    /// A frame other than BLOCK (BLOCKs go to [`Receiver::on_block`]).
    Msg(Msg),
    /// Whether the path was claimed (another connection may hold it).
    Claimed(bool),
    /// The part is open, holding a verified prefix of this many bytes (resume), or refused.
    Opened(Result<u64, Refusal>),
    /// The writer is idle; these ranges failed their CRC since the last sync (or the writer
    /// met an error that ends the connection).
    Synced(Result<Vec<(u64, u32)>, XferError>),
    /// The writer stopped.
    Finished {
        /// The first write error, if any (a full disk, a failing one).
        write_error: Option<std::io::Error>,
        /// The part's BLAKE3 (PUT only; `None` for a range).
        digest: Option<std::io::Result<[u8; 32]>>,
    },
    /// The answer to [`RxAction::Commit`].
    Committed(std::io::Result<()>),
    /// The connection failed, the server stops, the client went quiet or a newer PUT of the
    /// file took over.
    Interrupted(XferError),
}

/// Where a [`Receiver`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RxState {
    Claiming,
    Opening,
    /// Taking BLOCKs until FILE_DONE.
    Blocks,
    Syncing,
    Finishing,
    Committing,
    Over,
}

/// The server half of one upload conversation: PUT (a whole file) or PUT_RANGE (one range
/// of an OPENed one). See the module documentation.
#[derive(Debug)]
pub struct Receiver {
    file_id: u32,
    size: u64,
    mode: u32,
    /// The range this conversation fills (`[prefix, size)` for a PUT).
    lo: u64,
    hi: u64,
    whole: bool,
    path: String,
    /// Blocks that arrived whole (their CRC is the writer's to check).
    arrived: RangeSet,
    /// Ranges asked for again and not arrived since.
    owed: Vec<(u64, u32)>,
    /// CRC rounds so far.
    rounds: u32,
    /// FILE_DONE's length and hash.
    done: Option<(u64, Option<[u8; 32]>)>,
    state: RxState,
    actions: VecDeque<RxAction>,
}

impl Receiver {
    /// A PUT of `size` bytes to `path`: claim, open the part, READY with its verified
    /// prefix, blocks, commit.
    pub fn put(file_id: u32, size: u64, mode: u32, path: &str) -> Receiver {
        let mut rx = Receiver::new(file_id, size, mode, path, true);
        rx.state = RxState::Claiming;
        rx.actions.push_back(RxAction::Claim);
        rx
    }

    /// PUT_RANGE `[offset, offset + length)` of an OPENed upload of `size` bytes (the
    /// runtime checked the upload exists): READY, blocks of that range only, mark it.
    pub fn range(
        file_id: u32,
        (size, mode): (u64, u32),
        offset: u64,
        length: u64,
        path: &str,
    ) -> Receiver {
        let mut rx = Receiver::new(file_id, size, mode, path, false);
        let Some(end) = offset.checked_add(length).filter(|&e| e <= size) else {
            let why = format!("{path}: range {offset}+{length} past the end ({size} bytes)");
            rx.refuse(refuse(ErrorCode::BadRequest, why), false);
            return rx;
        };
        (rx.lo, rx.hi) = (offset, end);
        rx.ready();
        rx
    }

    fn new(file_id: u32, size: u64, mode: u32, path: &str, whole: bool) -> Receiver {
        Receiver {
            file_id,
            size,
            mode,
            lo: 0,
            hi: size,
            whole,
            path: path.to_string(),
            arrived: RangeSet::new(),
            owed: Vec::new(),
            rounds: 0,
            done: None,
            state: RxState::Opening,
            actions: VecDeque::new(),
        }
    }

    /// The transfer id of the conversation.
    pub fn file_id(&self) -> u32 {
        self.file_id
    }

    /// The next action to execute, if any.
    pub fn poll(&mut self) -> Option<RxAction> {
        self.actions.pop_front()
    }

    /// Whether the machine waits for a frame from the client.
    pub fn awaits_peer(&self) -> bool {
        self.actions.is_empty() && self.state == RxState::Blocks
    }

    /// Whether the conversation ended.
    pub fn is_over(&self) -> bool {
        self.state == RxState::Over
    }

    /// A BLOCK frame's header arrived (its payload stays with the runtime): it is to be
    /// landed ([`RxAction::Land`]). A block outside the conversation's range ends the
    /// connection.
    pub fn on_block(&mut self, h: &BlockHeader) {
        if self.state != RxState::Blocks {
            return self.keep(XferError::conn("a BLOCK outside a transfer"));
        }
        let end = h.offset.saturating_add(u64::from(h.len));
        if h.file_id != self.file_id || h.offset < self.lo || end > self.hi {
            return self.keep(XferError::conn(format!(
                "the peer sent a block outside the transfer (file {} offset {} len {})",
                h.file_id, h.offset, h.len
            )));
        }
        self.arrived.insert(h.offset, end);
        self.owed
            .retain(|&(o, l)| o < h.offset || o + u64::from(l) > end);
        self.actions.push_back(RxAction::Land);
    }

    /// Takes in what happened.
    pub fn handle(&mut self, ev: RxEvent) {
        match (self.state, ev) {
            (RxState::Over, _) => {}
            (_, RxEvent::Interrupted(e)) => self.keep(e),
            (RxState::Claiming, RxEvent::Claimed(true)) => {
                self.state = RxState::Opening;
                self.actions.push_back(RxAction::OpenPart);
            }
            (RxState::Claiming, RxEvent::Claimed(false)) => {
                let why = format!(
                    "{}: another connection is still writing this file; try again",
                    self.path
                );
                self.refuse(refuse(ErrorCode::Unavailable, why), false);
            }
            (RxState::Opening, RxEvent::Opened(Ok(prefix))) if prefix <= self.size => {
                self.lo = prefix;
                self.ready();
            }
            (RxState::Opening, RxEvent::Opened(Ok(prefix))) => self.keep(XferError::conn(format!(
                "{}: a part holding {prefix} bytes of {}",
                self.path, self.size
            ))),
            (RxState::Opening, RxEvent::Opened(Err(r))) => self.refuse(r, false),
            (RxState::Blocks, RxEvent::Msg(m)) => self.on_msg(m),
            (RxState::Syncing, RxEvent::Synced(Ok(bad))) => self.on_synced(bad),
            (RxState::Syncing, RxEvent::Synced(Err(e))) => self.keep(e),
            (
                RxState::Finishing,
                RxEvent::Finished {
                    write_error,
                    digest,
                },
            ) => self.on_finished(write_error, digest),
            (RxState::Committing, RxEvent::Committed(res)) => self.on_committed(res),
            (state, ev) => self.keep(XferError::conn(format!(
                "internal: upload receiver event {ev:?} in state {state:?}"
            ))),
        }
    }

    fn ready(&mut self) {
        self.state = RxState::Blocks;
        self.actions.push_back(RxAction::Send(Msg::Ready {
            file_id: self.file_id,
            size: self.size,
            mode: self.mode,
            offset: self.lo,
        }));
        self.actions.push_back(RxAction::StartWriter);
    }

    fn on_msg(&mut self, m: Msg) {
        match m {
            Msg::FileDone { length, blake3, .. } => {
                self.done = Some((length, blake3));
                self.state = RxState::Syncing;
                self.actions.push_back(RxAction::Sync);
            }
            // The client gave up on this file (its source failed or changed).
            Msg::Error { .. } => {
                self.state = RxState::Over;
                self.actions.push_back(RxAction::Discard);
                self.actions.push_back(RxAction::Over);
            }
            m => self.keep(XferError::conn(format!(
                "unexpected frame during a PUT: {m:?}"
            ))),
        }
    }

    /// After FILE_DONE the writer is idle: ask again for what failed its CRC, up to
    /// [`crate::BLOCK_RETRIES`] rounds, else stop the writer to check the whole.
    fn on_synced(&mut self, bad: Vec<(u64, u32)>) {
        if bad.is_empty() {
            self.state = RxState::Finishing;
            self.actions.push_back(RxAction::Finish);
            return;
        }
        self.rounds += 1;
        if self.rounds > crate::BLOCK_RETRIES {
            let r = refuse(ErrorCode::Integrity, crate::crc_exhausted(&self.path));
            return self.refuse(r, self.whole);
        }
        self.owed.extend_from_slice(&bad);
        self.state = RxState::Blocks;
        self.actions.push_back(RxAction::Send(Msg::Resend {
            file_id: self.file_id,
            ranges: bad,
        }));
    }

    /// Whether every byte of the conversation's range arrived and none is owed.
    fn complete(&self) -> bool {
        self.owed.is_empty() && (self.lo == self.hi || self.arrived.contains(self.lo, self.hi))
    }

    fn on_finished(
        &mut self,
        write_error: Option<std::io::Error>,
        digest: Option<std::io::Result<[u8; 32]>>,
    ) {
        let path = self.path.clone();
        if let Some(e) = write_error {
            return self.refuse(write_refusal(&path, &e), true);
        }
        let (length, blake3) = self.done.unwrap_or_default();
        if !self.whole {
            if !self.complete() {
                let why = format!(
                    "{path}: FILE_DONE before every block of range {}+{}",
                    self.lo,
                    self.hi - self.lo
                );
                return self.refuse(refuse(ErrorCode::Integrity, why), false);
            }
            return self.commit();
        }
        let got = match digest {
            Some(Ok(h)) => Some(h),
            Some(Err(e)) => {
                return self.refuse(refuse(ErrorCode::Io, format!("{path}: {e}")), true)
            }
            None => None,
        };
        if !self.complete() || length != self.size || got.is_none() || blake3 != got {
            return self.refuse(mismatch(&path), true);
        }
        self.commit();
    }

    fn commit(&mut self) {
        self.state = RxState::Committing;
        self.actions.push_back(RxAction::Commit);
    }

    fn on_committed(&mut self, res: std::io::Result<()>) {
        match res {
            Ok(()) => {
                self.state = RxState::Over;
                self.actions.push_back(RxAction::Send(Msg::Ok {
                    file_id: self.file_id,
                }));
                self.actions.push_back(RxAction::Over);
            }
            Err(e) => {
                let why = format!("{}: commit failed: {e}", self.path);
                self.refuse(refuse(ErrorCode::Io, why), false);
            }
        }
    }

    fn refuse(&mut self, refusal: Refusal, abandon: bool) {
        self.state = RxState::Over;
        self.actions
            .push_back(RxAction::Refuse { refusal, abandon });
        self.actions.push_back(RxAction::Over);
    }

    fn keep(&mut self, e: XferError) {
        self.state = RxState::Over;
        self.actions.push_back(RxAction::Keep(e));
    }
}

/// PUT_FILEs a client keeps unanswered before it waits for the oldest answer (at most;
/// also at most [`PutFiles::over`]'s bytes).
pub const PUT_WINDOW: usize = 1024;

/// The client's window of whole files sent by PUT_FILE (1.4), alone or several to a PACK
/// (1.11), whose answers are not waited for one by one: they come in request order, OK or
/// ERROR, or OKS for a run of them (1.11). A file the server found damaged (Integrity) is
/// kept to go again by PUT; any other refusal ends the upload. `K` names a file's source
/// for the caller.
#[derive(Debug)]
pub struct PutFiles<K> {
    /// Sent (or packed to be sent) and unanswered: transfer id, the caller's name of the
    /// file, its size.
    waiting: VecDeque<(u32, K, u64)>,
    /// Their bytes.
    bytes: u64,
    /// Refused as damaged: to send again by PUT.
    again: Vec<K>,
}

impl<K> Default for PutFiles<K> {
    fn default() -> Self {
        PutFiles {
            waiting: VecDeque::new(),
            bytes: 0,
            again: Vec::new(),
        }
    }
}

/// Files and bytes the server committed, from one answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Committed {
    /// Files.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl<K> PutFiles<K> {
    /// A PUT_FILE of `size` bytes went (or joined the PACK to go) as transfer `file_id`.
    pub fn sent(&mut self, file_id: u32, key: K, size: u64) {
        self.waiting.push_back((file_id, key, size));
        self.bytes += size;
    }

    /// Whether, the newest `packed` files aside (in a PACK not sent yet), more than
    /// `files` files or `bytes` bytes wait for their answer (the caller then takes one).
    pub fn over(&self, packed: usize, (files, bytes): (usize, u64)) -> bool {
        let sent = self.left(packed);
        if sent == 0 {
            return false;
        }
        let unsent: u64 = self.waiting.iter().skip(sent).map(|w| w.2).sum();
        sent > files || self.bytes - unsent > bytes
    }

    /// Files that have left, the newest `packed` (in a PACK not sent yet) aside.
    fn left(&self, packed: usize) -> usize {
        self.waiting.len().saturating_sub(packed)
    }

    /// The server's answer to the oldest files, the newest `packed` aside (not sent yet,
    /// so no answer may name them): what it committed; a file refused as damaged goes
    /// again by PUT ([`PutFiles::again`]); an error ends the upload.
    pub fn answer(&mut self, m: Msg, packed: usize) -> Result<Committed, XferError> {
        let sent = self.left(packed);
        match m {
            Msg::Ok { file_id } => self.committed((file_id, 1), sent, &m),
            Msg::Oks { file_id, count } => self.committed((file_id, count), sent, &m),
            Msg::Error {
                file_id,
                code: ErrorCode::Integrity,
                ..
            } if sent > 0 && self.waiting.front().is_some_and(|w| w.0 == file_id) => {
                if let Some((_, key, size)) = self.waiting.pop_front() {
                    self.bytes -= size;
                    self.again.push(key);
                }
                Ok(Committed::default())
            }
            Msg::Error { code, message, .. } => Err(crate::error::remote(code, &message)),
            m => Err(unexpected(&m)),
        }
    }

    /// The `count` oldest files, the last of them `file_id`, were committed (`m` said so);
    /// only the `sent` oldest may be.
    fn committed(
        &mut self,
        (file_id, count): (u32, u32),
        sent: usize,
        m: &Msg,
    ) -> Result<Committed, XferError> {
        let n = usize::try_from(count).unwrap_or(usize::MAX);
        let last = n.checked_sub(1).filter(|&i| i < sent);
        if last
            .and_then(|i| self.waiting.get(i))
            .is_none_or(|w| w.0 != file_id)
        {
            return Err(unexpected(m));
        }
        let mut done = Committed::default();
        for (_, _, size) in self.waiting.drain(..n) {
            done.files += 1;
            done.bytes += size;
        }
        self.bytes -= done.bytes;
        Ok(done)
    }

    /// The files to send again by PUT (once every answer is in).
    pub fn again(&mut self) -> Vec<K> {
        std::mem::take(&mut self.again)
    }
}

/// A CLOSE of a parallel upload (OPEN, PUT_RANGE…, CLOSE), before its part is hashed:
/// refused if a range is missing (the part is kept, journaled, for a resume: `false`) or if
/// the length differs from the OPEN's (the part is dropped: `true`).
pub fn close_ready(
    path: &str,
    complete: bool,
    length: u64,
    size: u64,
) -> Result<(), (Refusal, bool)> {
    if !complete {
        let why = format!("{path}: CLOSE before every range arrived; resume the copy");
        return Err((refuse(ErrorCode::Integrity, why), false));
    }
    if length != size {
        let why = format!("{path}: {length} bytes announced, {size} opened");
        return Err((refuse(ErrorCode::Integrity, why), true));
    }
    Ok(())
}

/// A CLOSE whose part was hashed (`got`): committed only if the client's BLAKE3 matches.
/// A refused part is dropped.
pub fn close_matches(
    path: &str,
    got: Option<std::io::Result<[u8; 32]>>,
    blake3: Option<[u8; 32]>,
) -> Result<(), Refusal> {
    match got {
        Some(Ok(h)) if blake3 == Some(h) => Ok(()),
        Some(Err(e)) => Err(refuse(
            ErrorCode::Io,
            format!("{path}: hashing the part: {e}"),
        )),
        _ => Err(mismatch(path)),
    }
}

/// A whole file in one frame (PUT_FILE) is checked against its BLAKE3 before anything is
/// written; a mismatch is refused (Integrity) and the client sends the file again by PUT.
pub fn check_whole(path: &str, payload: &[u8], blake3: &[u8; 32]) -> Result<(), Refusal> {
    if blake3::hash(payload).as_bytes() == blake3 {
        return Ok(());
    }
    tracing::warn!(
        path,
        "uploaded file's BLAKE3 mismatch; the client sends it again"
    );
    Err(refuse(
        ErrorCode::Integrity,
        format!("{path}: the file's BLAKE3 does not match what was sent"),
    ))
}

/// The refusal of a file whose whole-file BLAKE3 differs from the client's.
fn mismatch(path: &str) -> Refusal {
    refuse(
        ErrorCode::Integrity,
        format!("{path}: the whole-file BLAKE3 does not match what was sent; nothing was written, try again"),
    )
}

/// The refusal for a failed write (a full disk is told apart).
pub(crate) fn write_refusal(path: &str, e: &std::io::Error) -> Refusal {
    let code = if e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error()) {
        ErrorCode::NoSpace
    } else {
        ErrorCode::Io
    };
    refuse(code, format!("{path}: write failed: {e}"))
}
