//! Uploads: the runtime of the upload conversation ([`crate::conv::upload`]): PUT_FILEs in a
//! window, PUTs whose blocks go through the staging ring with the running BLAKE3.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::{Client, Progress};
use crate::conv::upload::{Action, Event, PutFiles, PutJob, Uploader, PUT_WINDOW};
use crate::error::{Kind, Result, XferError};
use crate::link::{Digest, FileMeta, Source, Span};
use crate::proto;
use ferry_service::tree::{BlockTree, SharedTree};

/// Opens a local regular file for upload: the file and what a PUT says of it. The open is
/// non-blocking (opening a FIFO waits for a writer) and anything but a regular file is
/// refused from the open descriptor.
pub(crate) fn open_source(src: &Path) -> Result<(File, FileMeta)> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(src)
        .map_err(|e| XferError::io(src.display(), &e))?;
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
    rustix::fs::fcntl_setfl(&file, rustix::fs::OFlags::empty())
        .map_err(|e| XferError::io(src.display(), &e.into()))?;
    let meta = FileMeta {
        stamp: ferry_service::stamp::Stamp::of_metadata(&md),
        size: md.len(),
        mode: md.permissions().mode() & 0o7777,
        mtime: md
            .mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(md.mtime_nsec()),
    };
    Ok((file, meta))
}

impl Client {
    /// Uploads one local file to a remote path.
    pub fn upload_file(&mut self, src: &Path, path: &str, progress: &dyn Progress) -> Result<()> {
        let (file, meta) = open_source(src)?;
        self.put_meta(&file, &meta, path, progress)
    }

    /// Uploads local files, each to its remote path, in order. To a 1.4 server, a file that
    /// fits in one frame goes as a PUT_FILE whose answer is not waited for (up to
    /// [`PUT_WINDOW`] unanswered), so many small files stream instead of taking two round
    /// trips each; one the server found damaged is sent again by PUT at the end. Larger
    /// files, and every file to an older server, go by PUT one at a time.
    pub fn upload_files(
        &mut self,
        files: impl IntoIterator<Item = (PathBuf, String)>,
        progress: &dyn Progress,
    ) -> Result<()> {
        self.upload_each(files, &|src: &PathBuf| open_source(src), progress)
    }

    /// [`Client::upload_files`] for sources named by `K`, which `open` opens (again, for a
    /// file sent a second time by PUT).
    pub(crate) fn upload_each<K>(
        &mut self,
        files: impl IntoIterator<Item = (K, String)>,
        open: &dyn Fn(&K) -> Result<(File, FileMeta)>,
        progress: &dyn Progress,
    ) -> Result<()> {
        let mut window = PutFiles::default();
        self.put_each(files, &mut window, open, progress)?;
        self.settle_puts(&mut window, open, progress)
    }

    /// Sends `files`: each small one whole (PUT_FILE, several to a PACK for a 1.11 server)
    /// into `window`, whose answers are taken as they come and when it is full; a larger
    /// one, or any to an older server, by PUT once every answer is in. Ends with answers
    /// still to come: [`Client::settle_puts`] takes them.
    pub(crate) fn put_each<K>(
        &mut self,
        files: impl IntoIterator<Item = (K, String)>,
        window: &mut PutFiles<(K, String)>,
        open: &dyn Fn(&K) -> Result<(File, FileMeta)>,
        progress: &dyn Progress,
    ) -> Result<()> {
        // Unanswered: what the staging ring holds (sized to the path), as files at most
        // PUT_WINDOW.
        let room = (PUT_WINDOW, self.ring as u64 * u64::from(self.block));
        for (src, path) in files {
            // A file small enough for one frame has nothing worth resuming: it goes whole
            // (the server's whole-file write drops any earlier part and journal of it).
            let whole =
                self.minor >= proto::MINOR_PUT_FILE && crate::mem::classify(&path).is_none();
            let (file, meta) = open(&src)?;
            if !(whole && self.tx.put_file_fits(&path, meta.size)) {
                self.take_answers(window, None, progress)?;
                self.put_meta(&file, &meta, &path, progress)?;
                continue;
            }
            let file_id = self.id();
            let flags = self.force_flag(proto::PUT_FILE_FORCE);
            self.tx
                .send_put_file(&self.link, &file, (file_id, flags), &path, &meta)?;
            self.stats.wire_bytes += meta.size;
            window.sent(file_id, (src, path), meta.size);
            self.take_answers(window, Some(room), progress)?;
        }
        Ok(())
    }

    /// Takes every answer of `window`, then sends again by PUT what arrived damaged.
    pub(crate) fn settle_puts<K>(
        &mut self,
        window: &mut PutFiles<(K, String)>,
        open: &dyn Fn(&K) -> Result<(File, FileMeta)>,
        progress: &dyn Progress,
    ) -> Result<()> {
        self.take_answers(window, None, progress)?;
        // What arrived damaged goes again by PUT, with its CRC-checked blocks and RESENDs.
        for (src, path) in window.again() {
            self.stats.blocks_resent += 1;
            let (file, meta) = open(&src)?;
            self.put_meta(&file, &meta, &path, progress)?;
        }
        Ok(())
    }

    /// PUTs an open file described by `meta`.
    fn put_meta(
        &mut self,
        file: &File,
        meta: &FileMeta,
        path: &str,
        progress: &dyn Progress,
    ) -> Result<()> {
        self.put(
            Source::File(file),
            meta.size,
            meta.mode,
            Some(meta.mtime),
            Some(&meta.stamp),
            path,
            progress,
        )
    }

    /// Takes the server's answers to PUT_FILEs, oldest first: those that are there, then
    /// more until the files sent and unanswered fit in `room` (files, bytes); with no room,
    /// every answer, the open PACK sent first ([`PutFiles::answer`]).
    fn take_answers<K>(
        &mut self,
        window: &mut PutFiles<K>,
        room: Option<(usize, u64)>,
        progress: &dyn Progress,
    ) -> Result<()> {
        if room.is_none() {
            self.tx.flush_pack(&self.link)?;
        }
        let room = room.unwrap_or((0, 0));
        loop {
            let m = if window.over(self.tx.packed(), room) {
                self.link.recv_msg()?
            } else if window.over(self.tx.packed(), (0, 0)) {
                match self.link.try_recv_msg()? {
                    Some(m) => m,
                    None => return Ok(()),
                }
            } else {
                return Ok(());
            };
            let done = window.answer(m, self.tx.packed())?;
            self.stats.files += done.files;
            self.stats.bytes += done.bytes;
            progress.add(done.bytes);
            for _ in 0..done.files {
                progress.file_done();
            }
        }
    }

    /// Uploads `size` zero bytes (the `zero:SIZE` source of memory mode) to a remote path;
    /// no file is read. To the server's null sink (`mem/null`) nothing is hashed.
    pub fn upload_zero(&mut self, size: u64, path: &str, progress: &dyn Progress) -> Result<()> {
        self.put(Source::Zero, size, 0o644, None, None, path, progress)
    }

    /// PUTs `size` bytes of `src` to `path`, executing the [`Uploader`]'s actions. A file
    /// source with its `stamp` is checked before each FILE_DONE: if it changed while being
    /// read, the server is told to drop the part (ERROR) and the upload fails (integrity).
    #[allow(clippy::too_many_arguments)]
    fn put(
        &mut self,
        src: Source<'_>,
        size: u64,
        mode: u32,
        mtime: Option<i64>,
        stamp: Option<&ferry_service::stamp::Stamp>,
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
        let to_null = crate::mem::classify(path) == Some(Ok(crate::mem::Virtual::Null));
        let up = Uploader::put(PutJob {
            file_id,
            flags: if resume { proto::PUT_RESUME } else { 0 } | self.force_flag(proto::PUT_FORCE),
            mode,
            size,
            mtime: mtime.filter(|_| v11),
            path: path.into(),
            hash: !to_null,
            check_source: stamp.is_some() && matches!(src, Source::File(_)),
        });
        self.converse(up, (src, None), stamp, path, progress)?;
        self.stats.files += 1;
        self.stats.bytes += size;
        progress.file_done();
        Ok(())
    }

    /// Runs one upload conversation to its end: executes the [`Uploader`]'s actions on this
    /// connection, reading `src` (checked against `stamp` before each FILE_DONE), and
    /// hashing what it sends of a range into `tree`, the file's hash tree, if given.
    pub(crate) fn converse(
        &mut self,
        mut up: Uploader,
        (src, tree): (Source<'_>, Option<&SharedTree>),
        stamp: Option<&ferry_service::stamp::Stamp>,
        path: &str,
        progress: &dyn Progress,
    ) -> Result<()> {
        let mut hasher = blake3::Hasher::new();
        // At `integrity` a whole file is hashed by its blocks' places, from the spans their
        // tags read (each byte once): its own tree, made when its first range goes out,
        // with what a resume skipped read back behind it.
        let by_spans = self.link.protection().send.reads_spans()
            && tree.is_none()
            && matches!(src, Source::File(_));
        let mut own: Option<SharedTree> = None;
        let mut skipped = 0;
        loop {
            let Some(action) = up.poll() else {
                let m = self.link.recv_msg()?;
                up.handle(Event::Msg(m));
                continue;
            };
            match action {
                Action::Send(m) => self.link.send(&m)?,
                Action::Resumed { offset, hash } => {
                    tracing::info!("{path}: resuming at byte {offset}");
                    if let (Source::File(file), true) = (src, hash) {
                        if by_spans {
                            skipped = offset;
                        } else {
                            hash_prefix(file, offset, &mut hasher, path)?;
                        }
                    }
                    self.stats.resumed_bytes += offset;
                    progress.already_there(offset);
                }
                Action::SendRange { span, hash, resend } => {
                    if let (true, true, None, Source::File(file)) = (hash, by_spans, &own, src) {
                        own = self.own_tree(file, span, skipped);
                        if own.is_none() {
                            hash_prefix(file, skipped, &mut hasher, path)?;
                        }
                    }
                    let digest = match (hash, tree, &own) {
                        (true, _, Some(t)) => Digest::Tree(t),
                        (true, _, None) => Digest::Stream(&mut hasher),
                        (false, Some(t), _) => Digest::Tree(t),
                        (false, None, _) => Digest::None,
                    };
                    let sent = self.send_span(src, span, digest, resend, progress);
                    let digest = || match (&own, src) {
                        (Some(t), Source::File(file)) => t
                            .root_filling_from(file)
                            .map_err(|e| XferError::io(path, &e)),
                        _ => Ok(*hasher.finalize().as_bytes()),
                    };
                    up.handle(match sent.and_then(|()| hash.then(digest).transpose()) {
                        Ok(digest) => Event::Sent { digest },
                        Err(e) => Event::SendFailed(e),
                    });
                }
                Action::CheckSource => {
                    let checked = match (stamp, src) {
                        (Some(stamp), Source::File(file)) => stamp.check(file, path),
                        _ => Ok(()),
                    };
                    up.handle(Event::SourceChecked(checked));
                }
                Action::Abandon(e) => return self.tx.abandon(&self.link, up.file_id(), e),
                Action::Fail(e) => return Err(e),
                Action::Done => return Ok(()),
            }
        }
    }

    /// The hash tree of the whole file `file` whose first range out is `span` (it ends the
    /// file), the `skipped` bytes before it (a resume) hashed from the file on a thread
    /// meanwhile; `None` if the blocks cannot cut it in units.
    fn own_tree(&self, file: &std::fs::File, span: Span, skipped: u64) -> Option<SharedTree> {
        let size = span.offset.checked_add(span.len)?;
        let tree = SharedTree::new(BlockTree::new(size, self.tx.block())?);
        if skipped > 0 {
            tree.fill_behind(file, vec![(0, skipped)]);
        }
        Some(tree)
    }

    /// Sends `span` of `src` as BLOCKs, counting its bytes as they go (a connection that
    /// breaks part way sent only some); a first send counts as progress too, a resend (one
    /// counted block more) does not. The bytes go to `digest` as they are read.
    fn send_span(
        &mut self,
        src: Source<'_>,
        span: Span,
        digest: Digest<'_>,
        resend: bool,
        progress: &dyn Progress,
    ) -> Result<()> {
        let wire = std::cell::Cell::new(0);
        let add = |n| {
            wire.set(wire.get() + n);
            if !resend {
                progress.add(n)
            }
        };
        if resend {
            self.stats.blocks_resent += 1;
        }
        let sent = self.tx.send_range(&self.link, src, span, digest, &add);
        self.stats.wire_bytes += wire.take();
        sent
    }
}

/// Feeds the first `len` bytes of `file` (what a resumed upload does not send) to `hasher`.
fn hash_prefix(
    file: &std::fs::File,
    len: u64,
    hasher: &mut blake3::Hasher,
    path: &str,
) -> Result<()> {
    ferry_service::hash::hash_range(file, 0, len, hasher, &mut Vec::new())
        .map_err(|e| XferError::io(path, &e))
}
