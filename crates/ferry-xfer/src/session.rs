//! Server-side sessions (protocol 1.2): the streams of one client and the parallel uploads
//! they share.
//!
//! Stream 0's HELLO creates a session; streams 1..N-1 join it by id with the same token.
//! A session lives while any of its streams does. An upload OPENed in a session is one
//! `.ferry-part` that every stream writes ranges of (PUT_RANGE); its verified ranges are
//! journaled as a range set, each block is hashed into the file's hash tree as it lands
//! ([`ferry_service::tree`]), and CLOSE commits it.
//! A session that ends without CLOSE checkpoints the journals of its open uploads, so a
//! resumed copy sends only the missing ranges.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_service::auth::Principal;
use ferry_service::claims::Claim;
use ferry_service::journal::RangeSet;
use ferry_service::landing::{Progress, SharedProgress};
use ferry_service::roots::PartFile;
use ferry_service::tree::{BlockTree, SharedTree};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One client's streams.
pub(crate) struct Session {
    /// The id WELCOME gave stream 0.
    pub id: u64,
    /// Who stream 0 authenticated as, and what it may do: joining streams must be the same.
    pub principal: Principal,
    /// Streams connected now.
    pub streams: AtomicUsize,
    uploads: Mutex<HashMap<u32, Arc<Upload>>>,
    /// Streams working on a request now.
    working: AtomicUsize,
    /// When a stream last began or finished a request (or the session began).
    last_active: Mutex<Instant>,
}

/// A stream of a session working on a request (see [`Session::working`]).
pub(crate) struct Working<'a>(&'a Session);

impl Drop for Working<'_> {
    fn drop(&mut self) {
        *lock(&self.0.last_active) = Instant::now();
        self.0.working.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Session {
    /// A new session with one stream.
    pub fn new(id: u64, principal: Principal) -> Session {
        Session {
            id,
            principal,
            streams: AtomicUsize::new(1),
            uploads: Mutex::new(HashMap::new()),
            working: AtomicUsize::new(0),
            last_active: Mutex::new(Instant::now()),
        }
    }

    /// Marks a stream busy with a request until the guard drops.
    pub fn working(&self) -> Working<'_> {
        self.working.fetch_add(1, Ordering::SeqCst);
        *lock(&self.last_active) = Instant::now();
        Working(self)
    }

    /// How long the whole session has been idle: zero while any stream works on a
    /// request, else the time since the last request began or ended.
    pub fn idle_for(&self) -> Duration {
        if self.working.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        lock(&self.last_active).elapsed()
    }

    /// Registers an OPENed upload; false if its id is taken.
    pub fn add_upload(&self, file_id: u32, up: Upload) -> bool {
        let mut map = lock(&self.uploads);
        if map.contains_key(&file_id) {
            return false;
        }
        map.insert(file_id, Arc::new(up));
        true
    }

    /// The upload OPENed as `file_id`.
    pub fn upload(&self, file_id: u32) -> Option<Arc<Upload>> {
        lock(&self.uploads).get(&file_id).cloned()
    }

    /// Removes the upload `file_id` (CLOSE); `None` if unknown or a stream still sends a
    /// range of it.
    pub fn take_upload(&self, file_id: u32) -> Option<std::result::Result<Upload, ()>> {
        let mut map = lock(&self.uploads);
        let up = map.remove(&file_id)?;
        match Arc::try_unwrap(up) {
            Ok(u) => Some(Ok(u)),
            Err(up) => {
                map.insert(file_id, up);
                Some(Err(()))
            }
        }
    }

    /// Drops the uploads a newer OPEN or PUT of the same file asked for and that no stream
    /// is receiving: each journals what it holds and lets go of its file.
    pub fn release_superseded(&self) {
        let gone: Vec<Arc<Upload>> = {
            let mut map = lock(&self.uploads);
            let ids: Vec<u32> = map
                .iter()
                .filter(|(_, u)| {
                    Arc::strong_count(u) == 1
                        && u.superseded().load(std::sync::atomic::Ordering::SeqCst)
                })
                .map(|(&id, _)| id)
                .collect();
            ids.into_iter().filter_map(|id| map.remove(&id)).collect()
        };
        for u in &gone {
            tracing::info!("{}: a newer upload of this file took over", u.path);
        }
    }

    /// The session ended: its open uploads journal what they hold and let go of their files.
    pub fn end(&self) {
        let ups: Vec<_> = lock(&self.uploads).drain().map(|(_, u)| u).collect();
        drop(ups);
    }
}

/// A parallel upload: one part file that the session's streams write ranges of.
pub(crate) struct Upload {
    /// `root/path` (for messages).
    pub path: String,
    /// Final size.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// The source's mtime (ns), set on the file.
    pub mtime: i64,
    /// The part file (`None`: the memory root's null sink).
    part: Option<PartFile>,
    /// A handle on the part for writers (the same file).
    pub file: Option<File>,
    /// The part's journal, fed block by block by every stream's sink (`None`: null sink).
    journal: Option<Arc<SharedProgress>>,
    state: Mutex<State>,
    /// The part's hash tree, fed block by block by every stream's sink (`None`: null sink,
    /// or a block size no tree aligns to: the part is then hashed at CLOSE).
    tree: Option<SharedTree>,
    /// Set when the upload cannot succeed (a write failed, the client gave up on it): its
    /// part is removed when the upload ends instead of kept for a resume.
    failed: std::sync::atomic::AtomicBool,
    claim: Option<Claim>,
}

struct State {
    /// The ranges whose every block arrived.
    done: RangeSet,
}

impl Upload {
    /// An upload into `part` (journal `progress`, whose ranges are already good), or into
    /// the null sink (`part` `None`), in blocks of `block` bytes.
    pub fn new(
        path: &str,
        (size, block): (u64, u32),
        mode: u32,
        mtime: i64,
        part: Option<(PartFile, Progress, Claim)>,
    ) -> std::io::Result<Upload> {
        let (part, journal, claim) = match part {
            Some((p, j, c)) => (Some(p), Some(j), Some(c)),
            None => (None, None, None),
        };
        let done = journal
            .as_ref()
            .map(|j| j.ranges().clone())
            .unwrap_or_default();
        let (file, journal) = match (&part, journal) {
            (Some(p), Some(j)) => (
                Some(p.file.try_clone()?),
                Some(Arc::new(SharedProgress::new(&p.file, j)?)),
            ),
            _ => (None, None),
        };
        // What a resume found in place is hashed into the tree on a thread meanwhile.
        let tree = file
            .as_ref()
            .and_then(|_| BlockTree::new(size, u64::from(block)))
            .map(SharedTree::new);
        if let (Some(t), Some(f)) = (&tree, &file) {
            t.fill_behind(f, done.iter().collect());
        }
        Ok(Upload {
            path: path.to_string(),
            size,
            mode,
            mtime,
            part,
            file,
            journal,
            state: Mutex::new(State { done }),
            tree,
            failed: std::sync::atomic::AtomicBool::new(false),
            claim,
        })
    }

    /// Raised when a newer PUT or OPEN of the same file wants it.
    pub fn superseded(&self) -> &std::sync::atomic::AtomicBool {
        static NEVER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        self.claim.as_ref().map_or(&NEVER, |c| &*c.yield_to_newer)
    }

    /// What is verified already (HAVE).
    pub fn have(&self) -> Vec<(u64, u64)> {
        lock(&self.state).done.iter().collect()
    }

    /// The part's journal, for the sinks of its ranges to report their blocks to.
    pub fn journal(&self) -> Option<Arc<SharedProgress>> {
        self.journal.clone()
    }

    /// The part's hash tree, for the sinks of its ranges to hash their blocks into.
    pub fn tree(&self) -> Option<SharedTree> {
        self.tree.clone()
    }

    /// Every block of `[lo, hi)` was written (and journaled and hashed by the sink).
    pub fn mark(&self, lo: u64, hi: u64) {
        lock(&self.state).done.insert(lo, hi);
    }

    /// Marks the upload as failed: nothing of it is kept for a resume.
    pub fn fail(&self) {
        self.failed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether [`Upload::fail`] was called.
    pub fn failed(&self) -> bool {
        self.failed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether every byte arrived.
    pub fn complete(&self) -> bool {
        lock(&self.state).done.contains(0, self.size)
    }

    /// The whole file's BLAKE3 from its tree (reading what the blocks did not supply:
    /// a resumed part's ranges), or by reading the part; `None` for the null sink.
    pub fn hash(&self) -> Option<std::io::Result<[u8; 32]>> {
        let file = self.file.as_ref()?;
        Some(match &self.tree {
            Some(t) => t.root_filling_from(file),
            None => ferry_service::hash::hash_file(file, self.size),
        })
    }

    /// Takes the part file out (to commit or discard it); the journal is not written again.
    pub fn take_part(&mut self) -> Option<PartFile> {
        if let Some(j) = &self.journal {
            j.close();
        }
        self.part.take()
    }
}

impl Drop for Upload {
    /// A failed upload's part goes. Otherwise the upload ends unfinished (its session ended
    /// or a newer upload took over): its journal records every block written and is not
    /// written again, and the part's own guard keeps it only if that journal holds verified
    /// bytes.
    fn drop(&mut self) {
        if self.failed() {
            if let Some(p) = self.take_part() {
                p.discard();
            }
            return;
        }
        if let Some(j) = &self.journal {
            if let Err(e) = j.finish() {
                tracing::warn!("{}: journal: {e}", self.path);
            }
        }
    }
}
