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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::client::{join, walk_entries, Client, Options, Progress, Stats};
use crate::config::ServerConfig;
use crate::error::XferError;
use crate::export::{refuse, Refusal};
use crate::link::{FileMeta, Link};
use crate::parallel::{join_streams, upload_planned};
use crate::proto::{EntryKind, ErrorCode, Msg};
use crate::url::Remote;
use ferry_exs::runtime::Closer;
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
    /// Token for the destination.
    pub token: &'a str,
    /// Streams to the destination.
    pub streams: u16,
    /// Staging blocks in flight per stream (reserved from the memory budget).
    pub ring: usize,
    /// Block size to ask the destination for (reserved from the memory budget).
    pub block: u32,
}

/// Whether `cfg` lets this server connect to `dest` for a third-party copy.
fn allowed(cfg: &ServerConfig, dest: &str) -> bool {
    cfg.third_party.iter().any(|a| a == "*" || a == dest)
}

/// Runs a SEND_TO and answers it with COPIED or ERROR. Only a failure to answer the client
/// is an error of this connection.
pub(crate) fn serve(
    cfg: &ServerConfig,
    roots: &Roots,
    link: &Link,
    req: SendTo,
) -> crate::Result<()> {
    match copy(cfg, roots, link, &req) {
        Ok(s) => link.send(&Msg::Copied {
            file_id: req.file_id,
            files: s.files,
            bytes: s.bytes,
            blocks_resent: s.blocks_resent,
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

fn copy(cfg: &ServerConfig, roots: &Roots, link: &Link, req: &SendTo) -> Result<Stats, Refusal> {
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
    let (dirs, files) = match entry.kind {
        EntryKind::File => (Vec::new(), vec![(String::new(), entry.size, entry.mtime)]),
        EntryKind::Dir if req.recursive => {
            let t = walk_entries(
                req.path,
                false,
                |ps| ps.iter().map(|p| crate::export::list(roots, p)).collect(),
                |p| crate::export::stat(roots, p).map_err(|r| r.message),
            )?;
            (t.dirs, t.files)
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
    let opts = Options {
        token: req.token.to_string(),
        block_size: req.block,
        ring: req.ring,
        streams: req.streams,
        ..Options::default()
    };
    let mut c = Client::connect(req.dest, &opts).map_err(at_dest)?;
    let target = c
        .target(req.path, entry.kind == EntryKind::Dir, req.dest_path)
        .map_err(at_dest)?;
    let relay = Relay {
        link,
        file_id: req.file_id,
        total: files.iter().map(|f| f.1).sum(),
        done: AtomicU64::new(0),
        last: Mutex::new(Instant::now()),
    };
    relay.send();
    if entry.kind == EntryKind::Dir {
        c.mkdir(&target, entry.mode).map_err(at_dest)?;
        for d in &dirs {
            c.mkdir(&join(&target, d), 0o755).map_err(at_dest)?;
        }
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
    let mut stats = Stats::default();
    let res = match join_streams(&c, &dest, &opts) {
        Ok(others) => {
            let to_dest: Vec<Closer> = std::iter::once(&c)
                .chain(&others)
                .map(|d| d.link.socket().closer())
                .collect();
            let client = link.socket().closer();
            let copying = AtomicBool::new(true);
            std::thread::scope(|s| {
                s.spawn(|| cancel_when_gone(&client, &to_dest, &copying));
                let res =
                    upload_planned(c, others, None, planned, &open, &opts, &relay, &mut stats);
                copying.store(false, Ordering::Release);
                res
            })
        }
        Err(e) => Err(e),
    };
    match res {
        Ok(()) => Ok(stats),
        Err(e) => Err(lock(&unreadable).take().unwrap_or_else(|| at_dest(e))),
    }
}

/// How often a copy checks that the client that asked for it is still there.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// Cancels a copy whose client went away (Ctrl-C, a crash, a broken link): closes the
/// connections to the destination, so the upload ends at once — what the destination
/// verified stays journaled there, and the same command resumes it.
fn cancel_when_gone(client: &Closer, to_dest: &[Closer], copying: &AtomicBool) {
    while copying.load(Ordering::Acquire) {
        if !client.is_connected() {
            tracing::info!("third-party copy cancelled: the client that asked for it went away");
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
    total: u64,
    done: AtomicU64,
    last: Mutex<Instant>,
}

impl Relay<'_> {
    fn send(&self) {
        // A client that went away misses the news; `cancel_when_gone` stops the copy.
        let _ = self.link.send(&Msg::Progress {
            file_id: self.file_id,
            done: self.done.load(Ordering::Relaxed),
            total: self.total,
        });
        *lock(&self.last) = Instant::now();
    }
}

impl Progress for Relay<'_> {
    fn add(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
        if lock(&self.last).elapsed() >= PROGRESS_EVERY {
            self.send();
        }
    }
}
