//! The download conversation: [`Downloader`], the client's side (GET window, batched GETS,
//! SUMs before ranged GETs, CRC rounds and their re-GETs, the whole-file hash check, when a
//! file is complete), and [`Responder`], the server's GET and SUM half (READY, the pieces to
//! read and send, FILE_DONE with the hash, or the ERROR that replaces it; SUM_REPLY).
//!
//! Neither touches a file or the network. The client's runtime (`client/download.rs`) opens
//! part files, writes blocks in place as they arrive (the data path never goes through the
//! machine), and executes the [`Action`]s; the server's (`server/get.rs`) opens the source
//! and sends the pieces a [`Reply`] names.

use std::collections::{HashMap, VecDeque};

use crate::error::{Kind, Result, XferError};
use crate::proto::{self, ErrorCode, Msg};
use ferry_service::tree::{BlockTree, SharedTree};

/// Where a job's data lands, as far as the conversation cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Landing {
    /// A part file for a source of `size` bytes (as STAT or LIST reported it), of which the
    /// resume journal already holds the verified prefix of `held` bytes: the rest is
    /// fetched (a ranged GET, preceded by a SUM for the source's hash), then the whole part
    /// is hashed and committed.
    Part {
        /// The source's size as listed; a READY saying otherwise fails the file.
        size: u64,
        /// Bytes at the start already in the part and verified (0: a fresh copy).
        held: u64,
    },
    /// The null sink of memory mode: blocks are checked, nothing is written or committed.
    Null,
    /// The bytes `lo..hi` of a file that parallel streams share (its part and journal
    /// belong to the parallel copy); `sum`: ask for the source's hash first.
    Chunk {
        /// First byte.
        lo: u64,
        /// End (exclusive).
        hi: u64,
        /// Send a SUM before the GET (one stream asks for the whole file's hash).
        sum: bool,
    },
}

/// One file (or chunk) to download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// The transfer id its messages carry (unique on the connection).
    pub file: u32,
    /// `root/relative/path` on the server.
    pub path: String,
    /// Where it lands.
    pub landing: Landing,
}

/// The knobs of a download conversation.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The protocol minor version the server speaks.
    pub minor: u16,
    /// GETs kept outstanding.
    pub window: usize,
    /// Free places in the window before a refill starts (to a 1.3 server or newer), so that
    /// each GETS frame carries several files: half the window on a short path; a small
    /// share of it on a long one, where the window must stay nearly full to cover the
    /// bandwidth-delay product.
    pub refill: usize,
    /// Most bytes of a GETS frame (at most a control frame's): on a long path the link's
    /// immediate size, so that a frame travels inside its advertisement (half a round
    /// trip) instead of being pulled (a round trip and a half).
    pub frame: usize,
    /// Chunks of shared files kept outstanding.
    pub chunks_ahead: usize,
    /// CRC rounds (re-GETs of the failed ranges) before a file fails.
    pub retries: u32,
}

/// What the runtime is to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send this frame.
    Send(Msg),
    /// READY of `file` came: open its writer for `size` bytes (`mode` for the commit).
    Open {
        /// The transfer.
        file: u32,
        /// The source's size.
        size: u64,
        /// Its permission bits.
        mode: u32,
    },
    /// Every answer of `file` is in: wait until what it wrote landed and report the ranges
    /// whose check failed with [`Downloader::checked`].
    Check {
        /// The transfer.
        file: u32,
    },
    /// Every block of the part of `file` is good: hash the whole part and report it with
    /// [`Downloader::hashed`] (a write error the writer kept fails the file instead).
    Hash {
        /// The transfer.
        file: u32,
    },
    /// The part of `file` matched the source's BLAKE3: commit it (mode, mtime, fsync,
    /// rename). `size` bytes.
    Commit {
        /// The transfer.
        file: u32,
        /// Its size.
        size: u64,
        /// Permission bits from READY.
        mode: u32,
    },
    /// A null-sink file or a chunk is complete and its blocks good; nothing to commit here.
    Finish {
        /// The transfer.
        file: u32,
        /// Its (whole file's) size.
        size: u64,
    },
    /// The source's BLAKE3 arrived for the chunk `file` (the parallel copy checks the
    /// whole file against it).
    SourceHash {
        /// The transfer.
        file: u32,
        /// The hash.
        hash: [u8; 32],
    },
}

/// Where one file stands.
#[derive(Debug)]
struct File {
    path: String,
    landing: Landing,
    /// Size and mode from READY (`None` until it came).
    ready: Option<(u64, u32)>,
    /// The source's hash (FILE_DONE of a whole GET, or SUM_REPLY).
    hash: Option<[u8; 32]>,
    /// GETs not yet answered by their FILE_DONE.
    outstanding: u32,
    /// CRC rounds so far.
    rounds: u32,
}

/// The client's side of a download conversation. Feed it [`Job`]s while
/// [`Downloader::has_room`], the server's messages ([`Downloader::on_msg`]; FILE frames as
/// [`Downloader::ready`] then their FILE_DONE) and the results of the local work it asks for;
/// take its [`Action`]s with [`Downloader::poll`]. An `Err` from any input ends the
/// conversation (as a failed download ends today: parts of a connection error are journaled
/// by the runtime, the others removed).
#[derive(Debug)]
pub struct Downloader {
    settings: Settings,
    live: HashMap<u32, File>,
    /// Whose hash the next SUM_REPLY carries (answers come in request order).
    sums: VecDeque<u32>,
    /// Whole-file GETs waiting to go out in one GETS frame.
    gets: Vec<(u32, String)>,
    out: VecDeque<Action>,
    /// Blocks fetched again after a failed check.
    resent: u64,
}

impl Downloader {
    /// A conversation with nothing in flight.
    pub fn new(settings: Settings) -> Downloader {
        Downloader {
            settings,
            live: HashMap::new(),
            sums: VecDeque::new(),
            gets: Vec::new(),
            out: VecDeque::new(),
            resent: 0,
        }
    }

    /// The next action, if any.
    pub fn poll(&mut self) -> Option<Action> {
        self.out.pop_front()
    }

    /// Whether actions wait to be polled (e.g. a GETS frame that filled while jobs started).
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// The next action if it is a message to send (a request), leaving any other in place.
    pub fn next_request(&mut self) -> Option<Msg> {
        match self.out.front() {
            Some(Action::Send(_)) => match self.out.pop_front() {
                Some(Action::Send(m)) => Some(m),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether no file is in flight (all started ones are finished).
    pub fn is_idle(&self) -> bool {
        self.live.is_empty()
    }

    /// Files (and chunks) in flight.
    pub fn in_flight(&self) -> usize {
        self.live.len()
    }

    /// Blocks fetched again because their check failed.
    pub fn resent(&self) -> u64 {
        self.resent
    }

    /// Whether a refill may start now: always to an older server; to a 1.3 one only once
    /// [`Settings::refill`] places of the window are free, so that each GETS batch carries
    /// several files.
    pub fn refill_open(&self) -> bool {
        let window = self.settings.window.max(1);
        let free = window.saturating_sub(self.live.len());
        self.settings.minor < proto::MINOR_FILE || free >= self.settings.refill.clamp(1, window)
    }

    /// Whether one more job fits in the window (and under the chunk limit).
    pub fn has_room(&self) -> bool {
        let chunks = self
            .live
            .values()
            .filter(|f| matches!(f.landing, Landing::Chunk { .. }))
            .count();
        self.live.len() < self.settings.window && chunks < self.settings.chunks_ahead
    }

    /// Starts `job`: its GET goes out now, or joins the GETS batch ([`Downloader::flush`]
    /// sends it).
    pub fn start(&mut self, job: Job) {
        let (offset, length, sum) = match job.landing {
            Landing::Chunk { lo, hi, sum } => (lo, hi.saturating_sub(lo), sum),
            Landing::Part { held, .. } => (held, u64::MAX, held > 0),
            Landing::Null => (0, u64::MAX, false),
        };
        let whole = offset == 0 && length == u64::MAX;
        if whole && self.settings.minor >= proto::MINOR_FILE {
            // Whole files go out in GETS frames, several per message.
            let bytes: usize = self.gets.iter().map(|(_, p)| p.len() + 6).sum();
            if self.gets.len() >= proto::MAX_GETS || bytes + job.path.len() + 6 > self.frame_room()
            {
                self.flush();
            }
            self.gets.push((job.file, job.path.clone()));
        } else {
            self.flush();
            if sum {
                // A ranged GET carries no hash: ask for the source's first.
                self.send(Msg::Sum {
                    path: job.path.clone(),
                });
                self.sums.push_back(job.file);
            }
            self.send(Msg::Get {
                file_id: job.file,
                offset,
                length,
                path: job.path.clone(),
            });
        }
        self.live.insert(
            job.file,
            File {
                path: job.path,
                landing: job.landing,
                ready: None,
                hash: None,
                outstanding: 1,
                rounds: 0,
            },
        );
    }

    /// Bytes of paths (with their ids and lengths) a GETS frame may carry: the frame's
    /// limit less room for its header (and a seal's).
    fn frame_room(&self) -> usize {
        self.settings
            .frame
            .min(proto::MAX_CONTROL)
            .saturating_sub(64)
    }

    /// Sends the batched whole-file GETs as one GETS frame.
    pub fn flush(&mut self) {
        if !self.gets.is_empty() {
            let files = std::mem::take(&mut self.gets);
            self.send(Msg::Gets { files });
        }
    }

    fn send(&mut self, msg: Msg) {
        self.out.push_back(Action::Send(msg));
    }

    /// READY of `file` (`size` bytes, permission bits `mode`): the size and mode to open
    /// its writer with the first time, `None` after (each re-GET is answered by a READY).
    /// The runtime calls this itself for a FILE frame, whose payload it writes at once.
    pub fn ready(&mut self, file: u32, size: u64, mode: u32) -> Result<Option<(u64, u32)>> {
        let f = self.live.get_mut(&file).ok_or_else(|| {
            XferError::conn(format!("the server answered unknown transfer {file}"))
        })?;
        if f.ready.is_some() {
            return Ok(None);
        }
        if let Landing::Part { size: listed, .. } = f.landing {
            if size != listed {
                return Err(XferError::new(
                    Kind::Integrity,
                    format!(
                        "{}: the file changed on the server while being copied ({listed} bytes, now {size}); try again",
                        f.path
                    ),
                ));
            }
        }
        f.ready = Some((size, mode));
        Ok(Some((size, mode)))
    }

    /// Takes one of the server's frames (a FILE frame as its FILE_DONE, after
    /// [`Downloader::ready`]; a BLOCK after the runtime wrote it).
    pub fn on_msg(&mut self, msg: Msg) -> Result<()> {
        let file = match &msg {
            Msg::Ready { file_id, .. }
            | Msg::FileDone { file_id, .. }
            | Msg::Error { file_id, .. } => *file_id,
            Msg::Block(h) => h.file_id,
            Msg::SumReply { blake3, .. } => return self.on_sum(*blake3),
            m => return Err(unexpected(m)),
        };
        if !self.live.contains_key(&file) {
            if let Msg::Error { code, message, .. } = &msg {
                return Err(crate::error::remote(*code, message));
            }
            return Err(XferError::conn(format!(
                "the server answered unknown transfer {file}"
            )));
        }
        match msg {
            Msg::Ready { size, mode, .. } => {
                if let Some((size, mode)) = self.ready(file, size, mode)? {
                    self.out.push_back(Action::Open { file, size, mode });
                }
                Ok(())
            }
            Msg::Block(_) => Ok(()),
            Msg::Error { code, message, .. } => Err(crate::error::remote(code, &message)),
            Msg::FileDone { blake3, .. } => self.on_done(file, blake3),
            m => Err(unexpected(&m)),
        }
    }

    fn on_sum(&mut self, hash: [u8; 32]) -> Result<()> {
        let file = self
            .sums
            .pop_front()
            .ok_or_else(|| XferError::conn("the server sent a SUM_REPLY unasked"))?;
        if let Some(f) = self.live.get_mut(&file) {
            f.hash = Some(hash);
            if matches!(f.landing, Landing::Chunk { .. }) {
                self.out.push_back(Action::SourceHash { file, hash });
            }
        }
        Ok(())
    }

    fn on_done(&mut self, file: u32, blake3: Option<[u8; 32]>) -> Result<()> {
        let f = self.file(file)?;
        if blake3.is_some() {
            f.hash = blake3;
        }
        f.outstanding = f.outstanding.saturating_sub(1);
        if f.outstanding > 0 {
            return Ok(());
        }
        if f.ready.is_none() {
            return Err(XferError::conn("FILE_DONE before READY"));
        }
        self.out.push_back(Action::Check { file });
        Ok(())
    }

    fn file(&mut self, file: u32) -> Result<&mut File> {
        self.live
            .get_mut(&file)
            .ok_or_else(|| XferError::conn(format!("no transfer {file} in progress")))
    }

    /// What landed of `file` was checked: `bad` are the ranges (offset, length) whose
    /// CRC (or a FILE frame's BLAKE3) failed. They are fetched again, up to
    /// [`Settings::retries`] rounds; with none the file is complete and goes to its hash
    /// check (a part) or is finished.
    pub fn checked(&mut self, file: u32, bad: Vec<(u64, u32)>) -> Result<()> {
        let retries = self.settings.retries;
        let f = self.file(file)?;
        if !bad.is_empty() {
            f.rounds += 1;
            if f.rounds > retries {
                return Err(XferError::new(
                    Kind::Integrity,
                    crate::crc_exhausted(&f.path),
                ));
            }
            f.outstanding += bad.len() as u32;
            let path = f.path.clone();
            self.resent += bad.len() as u64;
            for (offset, len) in bad {
                self.send(Msg::Get {
                    file_id: file,
                    offset,
                    length: u64::from(len),
                    path: path.clone(),
                });
            }
            return Ok(());
        }
        let size = f.ready.map_or(0, |(size, _)| size);
        match f.landing {
            Landing::Part { .. } => {
                if f.hash.is_none() && crate::mem::classify(&f.path).is_some() {
                    // A server's zero source sends no hash: what was written must be zeros.
                    f.hash = Some(crate::mem::zero_hash(size));
                }
                self.out.push_back(Action::Hash { file });
            }
            Landing::Null | Landing::Chunk { .. } => {
                self.live.remove(&file);
                self.out.push_back(Action::Finish { file, size });
            }
        }
        Ok(())
    }

    /// The whole part of `file` hashes to `got`: committed if that is the source's hash,
    /// else the file fails (and its part is to be removed).
    pub fn hashed(&mut self, file: u32, got: [u8; 32]) -> Result<()> {
        let f = self.file(file)?;
        if f.hash != Some(got) {
            return Err(XferError::new(
                Kind::Integrity,
                format!(
                    "{}: the whole-file BLAKE3 does not match the server's; nothing was written. Was the file changing on the server? Try again",
                    f.path
                ),
            ));
        }
        let (size, mode) = f.ready.unwrap_or((0, 0o644));
        self.live.remove(&file);
        self.out.push_back(Action::Commit { file, size, mode });
        Ok(())
    }
}

/// The error for a frame the server should not have sent.
pub(crate) fn unexpected(m: &Msg) -> XferError {
    XferError::conn(format!("the server sent an unexpected frame: {m:?}"))
}

/// What the server's runtime found when it opened a GET's source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// Its size.
    pub size: u64,
    /// Its permission bits.
    pub mode: u32,
    /// Whether the whole of it fits one FILE frame (see [`Responder::new`]'s `inline`).
    pub fits: bool,
    /// Whether a whole-file answer carries its BLAKE3 (not for the zero source of memory
    /// mode: the client knows what zeros hash to).
    pub hash: bool,
    /// The source's BLAKE3, already known (the checksum cache,
    /// [`ferry_service::sumcache`]): a whole-file answer carries it instead of hashing.
    pub known: Option<[u8; 32]>,
}

/// What the server's runtime is to do for a GET, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Send this frame (READY, FILE_DONE or ERROR), after any open PACK.
    Send(Msg),
    /// Send the whole source as one FILE frame (it may join an open PACK); report
    /// [`Responder::sent`] or [`Responder::failed`].
    SendFile {
        /// The transfer.
        file_id: u32,
        /// The source's size.
        size: u64,
        /// Its permission bits.
        mode: u32,
        /// Its BLAKE3, if already known (the checksum cache): the frame's bytes are then
        /// read but not hashed.
        known: Option<[u8; 32]>,
    },
    /// Read `len` bytes at `offset` of the source and send them as BLOCKs of `file_id`,
    /// feeding [`Responder::hasher`]; then check that the source did not change, and report
    /// [`Responder::sent`] or [`Responder::failed`]. A GET comes in pieces, so that a drain
    /// or a changed source stops it between them.
    Read {
        /// The transfer.
        file_id: u32,
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
    },
}

/// The GET being answered.
#[derive(Debug)]
struct Serving {
    file_id: u32,
    path: String,
    /// The range asked for, clipped to the source: `start..end`.
    start: u64,
    /// Where the piece being sent starts, and its length.
    pos: u64,
    piece: u64,
    end: u64,
    /// The whole file's hash, when the GET is for all of it and it is not known.
    hasher: Option<FileHash>,
    /// The whole file's hash, when the GET is for all of it and it is known.
    known: Option<[u8; 32]>,
    /// Answered by a FILE frame.
    frame: bool,
}

/// How a whole-file GET hashes what it sends.
#[derive(Debug)]
enum FileHash {
    /// In order (boxed: a hasher is about 2 KiB).
    Stream(Box<blake3::Hasher>),
    /// By its blocks' places ([`Responder::tree`]).
    Tree(SharedTree),
}

/// The server's half of the download conversation: GETs in (with what opening the source
/// found), the [`Reply`]s that answer them out, one GET at a time (the server answers
/// requests in order).
#[derive(Debug)]
pub struct Responder {
    inline: bool,
    piece: u64,
    serving: Option<Serving>,
    out: VecDeque<Reply>,
}

impl Responder {
    /// Answers GETs in pieces of `piece` bytes; `inline`: the client takes whole small files
    /// as FILE frames (1.3).
    pub fn new(inline: bool, piece: u64) -> Responder {
        Responder {
            inline,
            piece: piece.max(1),
            serving: None,
            out: VecDeque::new(),
        }
    }

    /// The next reply, if any.
    pub fn poll(&mut self) -> Option<Reply> {
        self.out.pop_front()
    }

    /// Whether no GET is being answered.
    pub fn is_idle(&self) -> bool {
        self.serving.is_none()
    }

    /// The hash the runtime feeds what it reads, while the GET wants one (and it is not
    /// taken by blocks, [`Responder::tree`]).
    pub fn hasher(&mut self) -> Option<&mut blake3::Hasher> {
        match self.serving.as_mut().and_then(|s| s.hasher.as_mut()) {
            Some(FileHash::Stream(h)) => Some(h),
            _ => None,
        }
    }

    /// The whole file's hash tree, for a runtime that sends it in blocks of `block` bytes
    /// and hashes each at its place (from the spans its integrity tag read,
    /// [`ferry_service::tree::BlockSpans`], so each byte is hashed once): asked before the
    /// first piece, it replaces [`Responder::hasher`] for this GET. `None` when the GET
    /// wants no hash, or the hasher was already fed.
    pub fn tree(&mut self, block: u64) -> Option<SharedTree> {
        // Blocks are cut from pieces: the tree's unit must divide both.
        let block = block.min(self.piece);
        let s = self.serving.as_mut()?;
        match &s.hasher {
            Some(FileHash::Tree(t)) => Some(t.clone()),
            Some(FileHash::Stream(_)) if s.pos == s.start => {
                let t = SharedTree::new(BlockTree::new(s.end - s.start, block)?);
                s.hasher = Some(FileHash::Tree(t.clone()));
                Some(t)
            }
            _ => None,
        }
    }

    /// A GET of `length` bytes at `offset` of `path` as transfer `file_id`; `source` is what
    /// opening it found, or why it could not be.
    pub fn get(
        &mut self,
        (file_id, offset, length): (u32, u64, u64),
        path: &str,
        source: std::result::Result<Source, crate::export::Refusal>,
    ) {
        let src = match source {
            Ok(src) => src,
            Err(r) => return self.refuse(file_id, r.code, r.message),
        };
        let mut serving = Serving {
            file_id,
            path: path.to_string(),
            start: offset,
            pos: offset,
            piece: 0,
            end: offset,
            hasher: None,
            known: None,
            frame: false,
        };
        if self.inline && offset == 0 && length == u64::MAX && src.fits {
            // A small file whole: READY, its block and FILE_DONE in one FILE frame.
            serving.frame = true;
            self.serving = Some(serving);
            self.out.push_back(Reply::SendFile {
                file_id,
                size: src.size,
                mode: src.mode,
                known: src.known,
            });
            return;
        }
        if offset > src.size {
            let why = format!("{path}: offset {offset} past the end ({} bytes)", src.size);
            return self.refuse(file_id, ErrorCode::BadRequest, why);
        }
        self.out.push_back(Reply::Send(Msg::Ready {
            file_id,
            size: src.size,
            mode: src.mode,
            offset,
        }));
        let len = length.min(src.size - offset);
        serving.end = offset + len;
        let whole = src.hash && offset == 0 && len == src.size;
        serving.known = src.known.filter(|_| whole);
        serving.hasher =
            (whole && serving.known.is_none()).then(|| FileHash::Stream(Box::default()));
        self.serving = Some(serving);
        self.next_piece();
    }

    /// A SUM: the source's size and BLAKE3 as the runtime read them (the source unchanged
    /// meanwhile), or why there are none. Answered by SUM_REPLY, or an ERROR (transfer 0).
    pub fn sum(&mut self, found: std::result::Result<(u64, [u8; 32]), crate::export::Refusal>) {
        match found {
            Ok((size, blake3)) => self
                .out
                .push_back(Reply::Send(Msg::SumReply { size, blake3 })),
            Err(r) => self.refuse(0, r.code, r.message),
        }
    }

    fn refuse(&mut self, file_id: u32, code: ErrorCode, message: String) {
        self.out.push_back(Reply::Send(Msg::Error {
            code,
            file_id,
            message,
        }));
    }

    /// Asks for the next piece (the first one even of an empty range: its check that the
    /// source is unchanged still runs).
    fn next_piece(&mut self) {
        let Some(s) = &mut self.serving else {
            return;
        };
        s.piece = (s.end - s.pos).min(self.piece);
        self.out.push_back(Reply::Read {
            file_id: s.file_id,
            offset: s.pos,
            len: s.piece,
        });
    }

    /// The last [`Reply::Read`] or [`Reply::SendFile`] went out and the source was
    /// unchanged: the next piece, or the FILE_DONE that ends the GET.
    pub fn sent(&mut self) {
        let Some(s) = &mut self.serving else {
            return;
        };
        s.pos += s.piece;
        if s.frame {
            self.serving = None;
            return;
        }
        if s.pos < s.end {
            return self.next_piece();
        }
        let Some(s) = self.serving.take() else {
            return;
        };
        let blake3 = match (s.known, s.hasher) {
            (Some(known), _) => Some(known),
            (None, Some(FileHash::Stream(h))) => Some(*h.finalize().as_bytes()),
            (None, Some(FileHash::Tree(t))) => match t.root() {
                Some(root) => Some(root),
                None => {
                    // Every block sent went into the tree: a unit missing is a bug, and the
                    // client must not take the file without its hash.
                    let why = format!("{}: internal: a part of the file was not hashed", s.path);
                    return self.refuse(s.file_id, ErrorCode::Io, why);
                }
            },
            (None, None) => None,
        };
        self.out.push_back(Reply::Send(Msg::FileDone {
            file_id: s.file_id,
            length: s.end - s.start,
            blake3,
        }));
    }

    /// The last piece (or FILE frame) could not be read, or the source changed while it
    /// was (`e` of kind integrity): the GET ends with an ERROR instead of its FILE_DONE
    /// (nothing for the client to commit), and the connection stays. A connection error is
    /// not the conversation's: the runtime ends the connection.
    pub fn failed(&mut self, e: XferError) {
        let Some(s) = self.serving.take() else {
            return;
        };
        let (code, message) = match e.kind {
            Kind::Integrity => (ErrorCode::Integrity, e.msg),
            _ => (ErrorCode::Io, format!("{}: {}", s.path, e.msg)),
        };
        if !s.frame {
            tracing::warn!("{message}");
        }
        self.refuse(s.file_id, code, message);
    }
}
