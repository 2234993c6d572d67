//! Serving reads: GET of files and of the memory root.

use super::{id_in_use, reply_refusal, send_entries, Server, GET_PIECE};
use crate::conv::download::{self as conv, Reply, Responder};
use crate::conv::serve::DRAINING;
use crate::error::{Kind, Result, XferError};
use crate::export::{refuse, Refusal};
use crate::link::{BlockSender, BlockWriter, Digest, Link, Source, Span};
use crate::mem::{Virtual, MEM_ROOT};
use crate::proto::{Entry, EntryKind, ErrorCode, Msg};
use crate::session::{Session, Upload};
use ferry_service::ring::sender::zero_copy_sends;
use ferry_service::secure::protect::BlockCheck;
use ferry_service::stamp::Stamp;
use ferry_service::sumcache::{self, Blocks, Checks, Reading};
use std::cell::RefCell;
use std::fs::File;

/// A GET's open source: the file, the stamp it is held to, and (a file large enough for the
/// checksum cache) its registration as a reader, which keeps the stamp across the cache's
/// own writes and stores the hash the GET computed.
struct Held<'a> {
    file: &'a File,
    stamp: RefCell<Stamp>,
    reading: Option<Reading>,
    /// The root the file's entry held when looked up ([`Held::entry`]): storing it again
    /// would only read the entry to find it there.
    found: std::cell::Cell<Option<[u8; 32]>>,
}

impl<'a> Held<'a> {
    /// Opens the hold on `file` (opened after [`sumcache::epoch`] said `epoch`, `st` its
    /// `fstat` then).
    fn new(
        file: &'a File,
        st: &rustix::fs::Stat,
        epoch: u64,
        cache: bool,
        path: &str,
    ) -> Result<Held<'a>> {
        let (reading, stamp) = if st.st_size as u64 >= sumcache::MIN_CACHED {
            let (r, s) =
                Reading::start(file, st, epoch, cache).map_err(|e| XferError::io(path, &e))?;
            (Some(r), s)
        } else {
            (None, Stamp::of(st))
        };
        Ok(Held {
            file,
            stamp: RefCell::new(stamp),
            reading,
            found: Default::default(),
        })
    }

    /// The file's BLAKE3 from the checksum cache.
    fn cached(&self) -> Option<[u8; 32]> {
        self.entry().map(|e| e.root)
    }

    /// The file's checksum cache entry (its BLAKE3, and its blocks' checks if kept).
    fn entry(&self) -> Option<sumcache::Entry> {
        let entry = self.reading.as_ref().and_then(|r| r.entry(self.file));
        self.found.set(entry.as_ref().map(|e| e.root));
        entry
    }

    /// Fails (integrity) if the file changed since it was opened.
    fn check(&self, path: &str) -> Result<()> {
        let mut stamp = self.stamp.borrow_mut();
        match &self.reading {
            Some(r) => r.check(&mut stamp, self.file, path),
            None => stamp.check(self.file, path),
        }
    }

    /// Keeps `root`, just computed from the unchanged file, in the checksum cache, with
    /// its blocks' checks if they were gathered in the same pass.
    fn store(&self, root: &[u8; 32], blocks: Option<Blocks>) {
        if blocks.is_none() && self.found.get() == Some(*root) {
            return;
        }
        if let Some(r) = &self.reading {
            let mut stamp = self.stamp.borrow_mut();
            match blocks {
                Some(b) => r.store_blocks(&mut stamp, self.file, root, &b),
                None => r.store(&mut stamp, self.file, root),
            }
        }
    }
}

/// Whether `blocks` are checks a sender of blocks of `block` bytes under `check` sends.
fn fits(blocks: &Blocks, block: u64, check: BlockCheck) -> bool {
    blocks.block == block
        && matches!(
            (&blocks.checks, check),
            (Checks::Crc(_), BlockCheck::Crc) | (Checks::Spans(_), BlockCheck::Tag(_))
        )
}

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
                let up = Upload::new(path, (*size, 0), *mode, 0, None)
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
            known: None,
        });
        conv.get((file_id, offset, length), "mem/zero", zeros);
        self.answer(link, tx, &mut conv, "mem/zero", None, None)
    }

    /// Answers a GET of a file ([`Responder`]): READY, BLOCKs, FILE_DONE; or, when `tx` sends
    /// FILE frames (a 1.3 client), for a whole file that fits in one frame, one FILE frame. A
    /// file that changes while it is read ([`ferry_service::stamp`]) gets an ERROR
    /// (integrity) instead of its FILE_DONE or FILE frame, so no client, of any version,
    /// commits it. A whole-file GET's BLAKE3 comes from the checksum cache when it holds the
    /// file's ([`ferry_service::sumcache`]), else from hashing what is sent, which then goes
    /// into the cache.
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
        let epoch = sumcache::epoch();
        let (file, st) = match self.roots.open_read(path) {
            Ok(f) => f,
            Err(r) => {
                conv.get(req, path, Err(r.into()));
                return self.answer(link, tx, &mut conv, path, None, None);
            }
        };
        let held = match Held::new(&file, &st, epoch, self.cfg.checksum_cache, path) {
            Ok(h) => h,
            Err(e) => {
                // This GET fails (its file could not be stat'ed); the connection stays.
                conv.get(req, path, Err(refuse(ErrorCode::Io, e.msg)));
                return self.answer(link, tx, &mut conv, path, None, None);
            }
        };
        let size = st.st_size as u64;
        super::note_served_size(size);
        let whole = offset == 0 && length >= size;
        let entry = held.entry();
        let source = conv::Source {
            size,
            mode: st.st_mode & 0o7777,
            fits: tx.file_fits(size),
            hash: !ferry_service::hash::checksums_off(),
            // Not for a GET of an exact length (what a client asks again for a small file
            // whose FILE frame failed its hash): that one is hashed as read, which also
            // mends a stale entry (the cache's blind spot).
            known: entry
                .as_ref()
                .filter(|_| whole && length == u64::MAX)
                .map(|e| e.root),
        };
        let (block, check) = (tx.block(), link.protection().send);
        let blocks = entry.and_then(|e| e.blocks.into_iter().find(|b| fits(b, block, check)));
        let kept = blocks.is_some();
        // The entry's blocks' checks vouch for the file as opened: its blocks go with them,
        // no checksum computed (read into staging, or unread from a mapping of the file's
        // pages, `vouched_copies`; on every driver: one that copies a mapping in user space
        // is safe from a truncation too, `Buffer::file_torn`). A GET of at most one block is
        // read and checked: that is what a client asks again for a block that failed its
        // check (from a stale entry, the blind spot), so it gets the block's real check.
        let vouch = blocks.filter(|_| length > block && zero_copy_sends());
        // A whole file sent in blocks gives its blocks' checks to the cache, if it lacks them.
        if whole && !kept && self.cfg.checksum_cache && size >= sumcache::MIN_CACHED {
            tx.collect_checks(size);
        }
        conv.get(req, path, Ok(source));
        let res = self.answer(link, tx, &mut conv, path, Some(&held), vouch.as_ref());
        // Checks not stored (the GET failed, or was answered in one FILE frame) go.
        let _ = tx.take_checks();
        res
    }

    /// Answers a SUM of `path` ([`Responder::sum`]): the whole file's BLAKE3 (from the
    /// checksum cache, or read and then kept there), or an ERROR if it cannot be read or
    /// changed while it was (such a hash matches no version of it).
    pub(super) fn sum(&self, link: &mut Link, tx: &mut BlockSender, path: &str) -> Result<()> {
        let epoch = sumcache::epoch();
        let found =
            self.roots
                .open_read(path)
                .map_err(Refusal::from)
                .and_then(|(f, st)| {
                    let size = st.st_size as u64;
                    let io = |e: String| refuse(ErrorCode::Io, e);
                    let held = Held::new(&f, &st, epoch, self.cfg.checksum_cache, path)
                        .map_err(|e| io(e.msg))?;
                    if let Some(hash) = held.cached() {
                        return Ok((size, hash));
                    }
                    let changed = |e: XferError| refuse(ErrorCode::Integrity, e.msg);
                    // A read cut short by a truncation is a changed file, not a disk error.
                    // A resumed download waits for this answer before its first block:
                    // hashed on every core there is.
                    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
                    let hash = ferry_service::tree::hash_file_parallel(&f, size, threads).map_err(
                        |e| match held.check(path) {
                            Err(c) => changed(c),
                            Ok(()) => io(format!("{path}: {e}")),
                        },
                    )?;
                    held.check(path).map_err(changed)?;
                    held.store(&hash, None);
                    Ok((size, hash))
                });
        let mut conv = Responder::new(false, GET_PIECE);
        conv.sum(found);
        self.answer(link, tx, &mut conv, path, None, None)
    }

    /// Carries out a GET's replies: frames, FILE frames and pieces read from `file` (held to
    /// its stamp; those of its blocks `vouch` has checks of sent unread), or zeros if `None`.
    /// A broken connection ends the GET (and the connection) at once; a drain stops it
    /// between pieces.
    fn answer(
        &self,
        link: &mut Link,
        tx: &mut BlockSender,
        conv: &mut Responder,
        path: &str,
        file: Option<&Held<'_>>,
        vouch: Option<&Blocks>,
    ) -> Result<()> {
        let unchanged = || file.map_or(Ok(()), |h| h.check(path));
        let mut pieces = 0;
        while let Some(reply) = conv.poll() {
            let piece = matches!(reply, Reply::Read { .. });
            let sent = match reply {
                Reply::Send(msg) => {
                    // Answers leave in request order: an open PACK goes first.
                    tx.flush_pack(link)?;
                    link.send(&msg)?;
                    if let (
                        Msg::FileDone {
                            blake3: Some(h), ..
                        },
                        Some(held),
                    ) = (&msg, file)
                    {
                        // Read from the file as its stamp still was after the last piece.
                        held.store(h, tx.take_checks());
                    }
                    continue;
                }
                Reply::SendFile {
                    file_id,
                    size,
                    mode,
                    known,
                } => {
                    let Some(held) = file else {
                        return Err(XferError::conn("a FILE frame of no file"));
                    };
                    let sent =
                        tx.send_file(link, held.file, (file_id, mode), size, known, &unchanged);
                    if let (Ok(hash), None) = (&sent, known) {
                        // Read from the file as its stamp still was after the read.
                        held.store(hash, None);
                    }
                    sent.map(|_| ())
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
                    let source = match (file, vouch) {
                        (Some(h), Some(b)) => Source::Vouched(h.file, b),
                        (Some(h), None) => Source::File(h.file),
                        (None, _) => Source::Zero,
                    };
                    // Checked after every piece: a change stops the rest from being read
                    // and sent.
                    // At `integrity` a whole file is hashed by its blocks' places, from the
                    // spans their tags read: each byte once.
                    let by_spans = link.protection().send.reads_spans();
                    let tree = by_spans.then(|| conv.tree(tx.block())).flatten();
                    let digest = match &tree {
                        Some(t) => Digest::Tree(t),
                        None => conv.hasher().map_or(Digest::None, Digest::Stream),
                    };
                    tx.send_range(link, source, span, digest, &|_| {})
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
                    // A read that failed because the file shrank under it is a changed
                    // source (integrity), not a disk error.
                    let e = match e.kind {
                        Kind::Integrity => e,
                        _ => unchanged().err().unwrap_or(e),
                    };
                    conv.failed(e);
                }
            }
        }
        Ok(())
    }
}
