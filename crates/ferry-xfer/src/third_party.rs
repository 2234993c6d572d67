//! Third-party (server-to-server) copies, the server's half.
//!
//! A client connected to the source server sends SEND_TO; the source server connects to the
//! destination server as an ordinary client and uploads, so the data goes straight from one
//! server to the other and the destination needs nothing new: it sees a PUT like any other,
//! with its own sandbox, token check, CRCs and BLAKE3. The client watches PROGRESS frames
//! and gets COPIED or ERROR at the end; if it goes away first, the copy is cancelled.
//!
//! A server makes outgoing connections only to the destinations its operator listed
//! (`third_party` in the config, `--allow-third-party`), so an authenticated client cannot
//! turn it into a probe of other hosts.
//!
//! The destination credential is a grant the destination minted for the client (protocol
//! 1.9, `ferry_service::grants`): proven there like a key, it lets this server write the one
//! path the client placed, once, for a minute; the user's own token travels only to a
//! destination too old for grants, and only when the user allows it (`--forward-token`).
//!
//! The copies in progress are listed ([`Copies`]): their owner (the credential that asked)
//! can see them from another connection (COPIES) and stop one (ABORT_COPY), as
//! `ferry copies` does.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::client::{join, walk_entries, Client, Filter, Options, Progress, Stats};
use crate::config::ServerConfig;
use crate::error::XferError;
use crate::export::{refuse, Refusal};
use crate::link::{FileMeta, Link};
use crate::parallel::{join_streams, upload_planned, Early};
use crate::proto::{self, EntryKind, ErrorCode, Msg};
use crate::url::Remote;
use ferry_exs::runtime::Closer;
use ferry_service::auth::Principal;
use ferry_service::roots::Roots;

/// How often PROGRESS frames go to the watching client.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// A SEND_TO request.
pub(crate) struct SendTo<'a> {
    /// Request id.
    pub file_id: u32,
    /// Copy a tree.
    pub recursive: bool,
    /// Source path on this server.
    pub path: &'a str,
    /// Destination server address.
    pub dest: &'a str,
    /// Destination path there.
    pub dest_path: &'a str,
    /// Token for the destination (empty with a grant).
    pub token: &'a str,
    /// The destination's grant (protocol 1.9), proven there instead of a token; `dest_path`
    /// is then the placed target, which this server does not look at (a grant only writes).
    pub grant: Option<[u8; 32]>,
    /// Streams to the destination.
    pub streams: u16,
    /// Follow symbolic links that stay inside the root (`-L`).
    pub follow: bool,
    /// `--include` and `--exclude` patterns.
    pub patterns: Option<&'a (Vec<String>, Vec<String>)>,
    /// Copy only these files of the tree (a sync's plan).
    pub only: Option<&'a [String]>,
    /// Staging blocks in flight per stream (reserved from the memory budget).
    pub ring: usize,
    /// Block size to ask the destination for (reserved from the memory budget).
    pub block: u32,
    /// The asking client's protocol minor version (what COPIED may tell it).
    pub client_minor: u16,
    /// Who asked: who may list and abort the copy.
    pub owner: Owner,
}

/// Who may see and stop a third-party copy: the credential that asked for it; anonymous
/// clients only from the same host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner(String);

impl Owner {
    /// The owner of what `principal`, connected from `peer`, asks for.
    pub fn of(principal: &Principal, peer: &str) -> Owner {
        if principal.is_anonymous() {
            // Every anonymous client has the same credential; its host tells them apart.
            let host = peer.rsplit_once(':').map_or(peer, |(h, _)| h);
            Owner(format!("anonymous from {host}"))
        } else {
            Owner(principal.id.clone())
        }
    }
}

/// The third-party copies a server is making.
#[derive(Default)]
pub(crate) struct Copies {
    next: AtomicU64,
    running: Mutex<Vec<Arc<Running>>>,
}

/// One copy in progress.
struct Running {
    id: u64,
    owner: Owner,
    path: String,
    dest: String,
    dest_path: String,
    started: Instant,
    /// Bytes uploaded so far.
    done: AtomicU64,
    /// Bytes to upload in all (known once the source is walked).
    total: AtomicU64,
    /// Its owner asked for it to stop (ABORT_COPY).
    aborted: AtomicBool,
}

/// A copy's place in [`Copies`], given up when the copy ends.
struct Listed<'a> {
    copies: &'a Copies,
    running: Arc<Running>,
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        lock(&self.copies.running).retain(|r| !Arc::ptr_eq(r, &self.running));
    }
}

impl Copies {
    fn start(&self, req: &SendTo) -> Listed<'_> {
        let running = Arc::new(Running {
            id: self.next.fetch_add(1, Ordering::Relaxed) + 1,
            owner: req.owner.clone(),
            path: req.path.into(),
            dest: req.dest.into(),
            dest_path: req.dest_path.into(),
            started: Instant::now(),
            done: AtomicU64::new(0),
            total: AtomicU64::new(0),
            aborted: AtomicBool::new(false),
        });
        lock(&self.running).push(running.clone());
        Listed {
            copies: self,
            running,
        }
    }

    /// COPY frames for the copies of `owner`, oldest first.
    pub fn list(&self, owner: &Owner) -> Vec<Msg> {
        lock(&self.running)
            .iter()
            .filter(|r| &r.owner == owner)
            .map(|r| Msg::Copy {
                id: r.id,
                done: r.done.load(Ordering::Relaxed),
                total: r.total.load(Ordering::Relaxed),
                secs: u32::try_from(r.started.elapsed().as_secs()).unwrap_or(u32::MAX),
                path: r.path.clone(),
                dest: r.dest.clone(),
                dest_path: r.dest_path.clone(),
            })
            .collect()
    }

    /// Asks copy `id` of `owner` to stop; false if `owner` has no such copy.
    pub fn abort(&self, owner: &Owner, id: u64) -> bool {
        let running = lock(&self.running);
        let Some(r) = running.iter().find(|r| r.id == id && &r.owner == owner) else {
            return false;
        };
        tracing::info!(
            "third-party copy {id} ({} -> {}) aborted by its owner",
            r.path,
            r.dest
        );
        r.aborted.store(true, Ordering::Release);
        true
    }
}

/// Whether `cfg` lets this server connect to `dest` for a third-party copy.
fn allowed(cfg: &ServerConfig, dest: &str) -> bool {
    cfg.third_party.iter().any(|a| a == "*" || a == dest)
}

/// Runs a SEND_TO and answers it with COPIED or ERROR. Only a failure to answer the client
/// is an error of this connection.
pub(crate) fn serve(
    cfg: &ServerConfig,
    (roots, copies): (&Roots, &Copies),
    link: &Link,
    req: SendTo,
) -> crate::Result<()> {
    let listed = copies.start(&req);
    match copy(cfg, roots, link, &req, &listed.running) {
        Ok(s) => link.send(&Msg::Copied {
            file_id: req.file_id,
            files: s.files,
            bytes: s.bytes,
            blocks_resent: s.blocks_resent,
            // An older client cannot read the count (the walk logged each entry).
            skipped: if req.client_minor >= proto::MINOR_COPIED_SKIPPED {
                s.entries_skipped
            } else {
                0
            },
        }),
        Err(r) => {
            tracing::info!(
                "third-party copy {} -> {}: {}",
                req.path,
                req.dest,
                r.message
            );
            link.send(&Msg::Error {
                code: r.code,
                file_id: req.file_id,
                message: r.message,
            })
        }
    }
}

fn copy(
    cfg: &ServerConfig,
    roots: &Roots,
    link: &Link,
    req: &SendTo,
    running: &Running,
) -> Result<Stats, Refusal> {
    if !allowed(cfg, req.dest) {
        let how = "its operator can allow destinations with `third_party = [\"ADDR\"]` in serve.toml or --allow-third-party ADDR";
        return Err(refuse(
            ErrorCode::PermissionDenied,
            if cfg.third_party.is_empty() {
                format!("this server makes no third-party copies; {how}")
            } else {
                format!("this server may not copy to {}; {how}", req.dest)
            },
        ));
    }
    let entry = crate::export::stat(roots, req.path)?;
    let (dirs, files, skipped) = match entry.kind {
        EntryKind::File => (
            Vec::new(),
            vec![(String::new(), entry.size, entry.mtime)],
            Vec::new(),
        ),
        EntryKind::Dir if req.recursive => {
            let filter = Filter::from_wire(req.patterns, req.only)
                .map_err(|e| refuse(ErrorCode::BadRequest, e.msg))?;
            // The sandbox's stat follows a link only while it stays inside the root: one
            // that leaves it is skipped (and counted), never followed.
            let t = walk_entries(
                req.path,
                req.follow,
                &filter,
                |ps| ps.iter().map(|p| crate::export::list(roots, p)).collect(),
                |p| crate::export::stat(roots, p).map_err(|r| r.message),
            )?
            .filtered(&filter);
            (t.dirs, t.files, t.skipped)
        }
        EntryKind::Dir => {
            return Err(refuse(
                ErrorCode::IsADirectory,
                format!("{}: is a directory; use -r to copy trees", req.path),
            ))
        }
        _ => {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!("{}: not a regular file or directory", req.path),
            ))
        }
    };
    let at_dest = |e: XferError| {
        refuse(
            crate::error::code_of(&e),
            format!("destination {}: {}", req.dest, e.msg),
        )
    };
    let key = match &req.grant {
        Some(seed) => Some(std::sync::Arc::new(
            ferry_service::grants::key_of(seed).map_err(at_dest)?,
        )),
        None => None,
    };
    let opts = Options {
        token: req.token.to_string(),
        key,
        block_size: req.block,
        ring: req.ring,
        streams: req.streams,
        ..Options::default()
    };
    let mut c = Client::connect(req.dest, &opts).map_err(at_dest)?;
    let target = match req.grant {
        // The client placed it, with its own credential; the grant may not look.
        Some(_) => req.dest_path.to_string(),
        None => c
            .target(req.path, entry.kind == EntryKind::Dir, req.dest_path)
            .map_err(at_dest)?,
    };
    running
        .total
        .store(files.iter().map(|f| f.1).sum(), Ordering::Relaxed);
    let relay = Relay {
        link,
        file_id: req.file_id,
        running,
        last: Mutex::new(Instant::now()),
    };
    relay.send();
    if entry.kind == EntryKind::Dir {
        let made = dirs.iter().map(|d| (join(&target, d), 0o755));
        c.mkdirs(std::iter::once((target.clone(), entry.mode)).chain(made))
            .map_err(at_dest)?;
    }
    // Sources open in this server's sandbox as they go; a file it cannot read ends the copy
    // with its own refusal, not the destination's.
    let unreadable = Mutex::new(None);
    let open = |rel: &Path| -> crate::Result<(std::fs::File, FileMeta)> {
        let rel = rel.to_string_lossy();
        let (file, st) = roots.open_read(&join(req.path, &rel)).map_err(|r| {
            let e = XferError::new(crate::Kind::Io, r.message.clone());
            *lock(&unreadable) = Some(Refusal::from(r));
            e
        })?;
        let meta = FileMeta {
            stamp: ferry_service::stamp::Stamp::of(&st),
            size: st.st_size as u64,
            mode: st.st_mode & 0o7777,
            mtime: st
                .st_mtime
                .saturating_mul(1_000_000_000)
                .saturating_add(st.st_mtime_nsec as i64),
        };
        Ok((file, meta))
    };
    let dest = Remote {
        addr: req.dest.to_string(),
        path: target.clone(),
    };
    let planned: Vec<_> = files
        .iter()
        .map(|(rel, size, _)| (Some(PathBuf::from(rel)), join(&target, rel), *size))
        .collect();
    // Only regular files and directories travel (and, with -L, what links inside the root
    // lead to); the walk named what it left out, and the client gets the count.
    let mut stats = Stats {
        entries_skipped: skipped.len() as u64,
        ..Stats::default()
    };
    let res = match join_streams(&c, &dest, &opts) {
        Ok(others) => {
            let to_dest: Vec<Closer> = std::iter::once(&c)
                .chain(&others)
                .map(|d| d.link.socket().closer())
                .collect();
            let client = link.socket().closer();
            let copying = AtomicBool::new(true);
            std::thread::scope(|s| {
                s.spawn(|| cancel_when_gone(&client, &to_dest, &copying, &running.aborted));
                let streams = (others, None, &Early::none());
                let res = upload_planned(c, streams, planned, &open, &opts, &relay, &mut stats);
                copying.store(false, Ordering::Release);
                res
            })
        }
        Err(e) => Err(e),
    };
    match res {
        Ok(()) => Ok(stats),
        Err(_) if running.aborted.load(Ordering::Acquire) => Err(refuse(
            ErrorCode::Cancelled,
            format!(
                "copy {} aborted by its owner from another connection (ferry copies --abort); what the destination verified stays there for a resume",
                running.id
            ),
        )),
        Err(e) => Err(lock(&unreadable).take().unwrap_or_else(|| at_dest(e))),
    }
}

/// How often a copy checks that the client that asked for it is still there.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// Cancels a copy whose client went away (Ctrl-C, a crash, a broken link) or whose owner
/// aborted it: closes the connections to the destination, so the upload ends at once —
/// what the destination verified stays journaled there, and the same command resumes it.
fn cancel_when_gone(
    client: &Closer,
    to_dest: &[Closer],
    copying: &AtomicBool,
    aborted: &AtomicBool,
) {
    while copying.load(Ordering::Acquire) {
        let gone = !client.is_connected();
        if gone || aborted.load(Ordering::Acquire) {
            if gone {
                tracing::info!(
                    "third-party copy cancelled: the client that asked for it went away"
                );
            }
            for d in to_dest {
                d.close();
            }
            return;
        }
        std::thread::sleep(WATCH_EVERY);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Relays upload progress to the watching client as PROGRESS frames, a few per second.
struct Relay<'a> {
    link: &'a Link,
    file_id: u32,
    /// Where the copy's counts are kept (also for COPIES).
    running: &'a Running,
    last: Mutex<Instant>,
}

impl Relay<'_> {
    fn send(&self) {
        // A client that went away misses the news; `cancel_when_gone` stops the copy.
        let _ = self.link.send(&Msg::Progress {
            file_id: self.file_id,
            done: self.running.done.load(Ordering::Relaxed),
            total: self.running.total.load(Ordering::Relaxed),
        });
        *lock(&self.last) = Instant::now();
    }
}

impl Progress for Relay<'_> {
    fn add(&self, bytes: u64) {
        self.running.done.fetch_add(bytes, Ordering::Relaxed);
        if lock(&self.last).elapsed() >= PROGRESS_EVERY {
            self.send();
        }
    }
}
