//! The client side of `ferry cp`, `ferry ls` and `ferry sum`.
//!
//! Downloads are pipelined: up to [`GET_WINDOW`] GETs are outstanding (on a long path
//! as many as cover its bandwidth-delay product: [`tune`]), the server answers
//! them in order, and every message names its transfer, so a tree of small files costs
//! little more than its bytes. Each received block is checked against its CRC-32C; bad
//! blocks are fetched again by ranged GETs (up to [`crate::BLOCK_RETRIES`] rounds) and the
//! whole file's BLAKE3 is compared before `.<name>.ferry-part` is fsynced and renamed.
//! Uploads stream a file's blocks, then FILE_DONE with its BLAKE3; the server answers OK,
//! RESEND (blocks that failed their CRC) or ERROR.
//!
//! Resume ([`Options::resume`], [`Options::retries`]): the receiving side journals the
//! verified prefix of every part file ([`ferry_service::journal`]). A resumed download continues
//! its part with a ranged GET (and asks for the source's BLAKE3 with SUM, since a ranged
//! GET brings none); a resumed upload sends PUT with RESUME and the server's READY says
//! where to continue. Either way the file lands only if its whole BLAKE3 matches the
//! source's. Trees skip files already at the destination with the same size and mtime.

mod copy;
mod download;
mod filter;
mod place;
mod sync;
pub mod tune;
mod upload;

use std::time::Duration;

use crate::error::{Kind, Result, XferError};
use crate::link::{BlockSender, Link, PackCheck, HANDSHAKE_TIMEOUT};
use crate::proto::{self, Entry, EntryKind, Msg, BLOCK_HEADER_LEN};
use ferry_service::secure::{ClientSecurity, Level};

use copy::walk_local;
pub use copy::{copy, sum_local};
pub(crate) use copy::{plan_download, plan_upload};
pub(crate) use download::{system_time, LocalPart};
pub use download::{Dest, DlJob};
pub use filter::{expand_remote, is_glob, Filter};
pub use sync::{sync, SyncHow, SyncReport};
pub use tune::{Buffer, Tuning};
pub(crate) use upload::open_source;

/// A tree a walk found: its directories (relative, parents first), its files (relative
/// path, size, mtime in seconds), and the entries it skipped (symlinks not followed, links
/// that lead nowhere or out of the root, FIFOs, sockets, devices), each warned about.
#[derive(Debug, Default)]
pub(crate) struct Tree {
    pub dirs: Vec<String>,
    pub files: Vec<(String, u64, i64)>,
    pub skipped: Vec<String>,
}

impl Tree {
    /// The part of the tree `filter` takes. The skipped entries stay (a walk never went
    /// into what the filter excludes, so they are the ones to count) unless the filter
    /// names its only files: a sync's narrowed copy, whose plan counted them.
    pub(crate) fn filtered(mut self, filter: &Filter) -> Tree {
        if !filter.is_empty() {
            self.dirs.retain(|d| filter.takes_dir(d));
            self.files.retain(|f| filter.takes_file(&f.0));
            if filter.only_files().is_some() {
                self.skipped.clear();
            }
        }
        self
    }
}

/// Symlinks to directories followed in a row at most. A server's listing has no inode
/// numbers to find a loop by, so a loop on a server is walked this deep, then skipped
/// (a local walk finds loops exactly).
pub(crate) const MAX_LINK_DEPTH: u32 = 8;

/// Directories a walk lists at once (LISTs in flight together): within the 16 frames a
/// connection may have outstanding at its peer (EXS's send credits), so they all leave at
/// once. A LIST beyond the receive buffers a server keeps posted (8) waits there only
/// until the server has answered one before it, not a round trip: at 50 ms a tree of ten
/// directories under its top was listed in two round trips of 6 and 4 LISTs before, in
/// one now.
pub(crate) const LIST_BATCH: usize = 12;

/// Walks the tree under `path` with `list` (which lists several directories, each one's
/// entries in order), level by level, up to [`LIST_BATCH`] directories a call. What
/// `filter` excludes is passed over (an excluded directory is not listed, an excluded link
/// not followed nor counted). Symlinks are followed with `stat` (which follows one, or says
/// why not) when `follow`, else skipped; special files are skipped; each skip is warned
/// about and counted in [`Tree::skipped`].
pub(crate) fn walk_entries<E>(
    path: &str,
    follow: bool,
    filter: &Filter,
    mut list: impl FnMut(&[String]) -> std::result::Result<Vec<Vec<Entry>>, E>,
    mut stat: impl FnMut(&str) -> std::result::Result<Entry, String>,
) -> std::result::Result<Tree, E> {
    let mut walk = Walk {
        path,
        follow,
        filter,
        tree: Tree::default(),
        todo: std::collections::VecDeque::from([(String::new(), 0)]),
    };
    while !walk.todo.is_empty() {
        let n = walk.todo.len().min(LIST_BATCH);
        let batch: Vec<(String, u32)> = walk.todo.drain(..n).collect();
        let paths: Vec<String> = batch.iter().map(|(rel, _)| join(path, rel)).collect();
        let listed = list(&paths)?;
        for ((rel, links), entries) in batch.into_iter().zip(listed) {
            walk.take(&rel, links, entries, &mut stat);
        }
    }
    walk.tree.dirs.sort();
    Ok(walk.tree)
}

/// A walk under way: what it found, and the directories still to list, each with how many
/// directory links led to it.
struct Walk<'a> {
    path: &'a str,
    follow: bool,
    filter: &'a Filter,
    tree: Tree,
    todo: std::collections::VecDeque<(String, u32)>,
}

impl Walk<'_> {
    /// Takes the `entries` of directory `rel` (reached through `links` directory links)
    /// into the tree, and its subdirectories into what is left to list.
    fn take(
        &mut self,
        rel: &str,
        links: u32,
        entries: Vec<Entry>,
        stat: &mut impl FnMut(&str) -> std::result::Result<Entry, String>,
    ) {
        for e in entries {
            let r = join(rel, &e.name);
            if self.filter.excluded(&r) {
                continue;
            }
            let (kind, size, mtime, links) = match e.kind {
                EntryKind::Symlink if self.follow => match stat(&join(self.path, &r)) {
                    Ok(t) => (t.kind, t.size, t.mtime, links + 1),
                    Err(why) => {
                        tracing::warn!(
                            "{}: skipping a symlink that cannot be followed: {why}",
                            join(self.path, &r)
                        );
                        self.tree.skipped.push(r);
                        continue;
                    }
                },
                k => (k, e.size, e.mtime, links),
            };
            match kind {
                EntryKind::Dir if links > MAX_LINK_DEPTH => {
                    tracing::warn!(
                        "{}: skipping: {MAX_LINK_DEPTH} directory links in a row (a loop?)",
                        join(self.path, &r)
                    );
                    self.tree.skipped.push(r);
                }
                EntryKind::Dir => {
                    self.tree.dirs.push(r.clone());
                    self.todo.push_back((r, links));
                }
                EntryKind::File => self.tree.files.push((r, size, mtime)),
                EntryKind::Symlink => {
                    tracing::warn!(
                        "{}: skipping a symlink (-L follows symlinks)",
                        join(self.path, &r)
                    );
                    self.tree.skipped.push(r);
                }
                _ => {
                    tracing::warn!(
                        "{}: skipping (not a file, directory or symlink)",
                        join(self.path, &r)
                    );
                    self.tree.skipped.push(r);
                }
            }
        }
    }
}

/// First pause before a retry; it doubles up to [`RETRY_MAX_DELAY`].
pub const RETRY_DELAY: Duration = Duration::from_millis(200);
/// Longest pause between retries.
pub const RETRY_MAX_DELAY: Duration = Duration::from_secs(5);

/// GETs a download keeps outstanding (to a 1.3 server: between half of it and all of it,
/// the other half sent in one GETS frame).
pub const GET_WINDOW: usize = 32;

/// MKDIRs [`Client::mkdirs`] sends before it waits for the oldest answer.
pub const MKDIR_WINDOW: usize = 64;

/// Client settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Token ("" for anonymous).
    pub token: String,
    /// The client's key pair (`--identity`, `~/.config/ferry/id_ed25519`), proven to the
    /// server over TLS instead of a token (protocol 1.9; docs/security.md).
    pub key: Option<std::sync::Arc<ferry_service::keys::ClientKey>>,
    /// Proposed block size.
    pub block_size: u32,
    /// Staging blocks in flight, with [`Buffer::Fixed`].
    pub ring: usize,
    /// How each connection's staging ring (and a download's window of GETs) is sized:
    /// [`Options::ring`] blocks, a number of bytes, or from the path's round trip.
    pub buffer: Buffer,
    /// Connect timeout.
    pub timeout: Duration,
    /// How long to wait for a server that sends nothing before the connection counts as
    /// broken (and, with `retries`, is replaced).
    pub idle_timeout: Duration,
    /// Continue partial files after their journaled, verified prefix (`ferry cp`'s
    /// default; `--no-resume` starts them over). A journal proves its bytes against the
    /// source's size and mtime, so nothing unverified is kept.
    pub resume: bool,
    /// Which files already at the destination are left alone ([`Skip`]).
    pub skip: Skip,
    /// Which entries of a tree are copied (`--include`, `--exclude`).
    pub filter: Filter,
    /// Reconnect and resume this many times after a connection failure (exit class 6),
    /// pausing [`RETRY_DELAY`], doubling up to [`RETRY_MAX_DELAY`].
    pub retries: u32,
    /// Token for the destination server of a third-party copy (`None`: the same token).
    pub dest_token: Option<String>,
    /// Let a third-party copy send the destination credential (the token) to the source
    /// server when either server is too old for grants (`ferry cp --forward-token`);
    /// without it such a copy is refused (docs/security.md, "Third-party copies").
    pub forward_token: bool,
    /// Parallel streams (connections) per copy, 1 to [`proto::MAX_STREAMS`]; more than one
    /// needs a protocol 1.2 server (an older one gets one stream and a note).
    pub streams: u16,
    /// Choose the stream count ([`tune::Growth`]): on a long path, start with one stream
    /// and add streams while the delivery rate grows, up to `streams` (`ferry cp` without
    /// `-p`).
    pub auto_streams: bool,
    /// With several streams, files are split into chunks of about this many bytes (rounded
    /// to the block size), handed to whichever stream is free.
    pub chunk: u64,
    /// Read (uploads) and write (downloads) local files with direct I/O (`O_DIRECT`),
    /// bypassing the page cache, where the filesystem allows it. The server's side follows
    /// its own configuration (`direct` in `ferry serve`'s config).
    pub direct: bool,
    /// Copy what symlinks in a tree point to (`ferry cp -L`): on a server, links that stay
    /// inside their root; without it they are skipped and counted
    /// ([`Stats::entries_skipped`]).
    pub follow_links: bool,
    /// Replace read-only files at the destination (`ferry cp --force`); without it an
    /// upload onto a read-only file is refused (by a 1.5 server; older ones replace it).
    pub force: bool,
    /// How the connection is secured: TLS and the server's identity pinned (known hosts,
    /// or a given fingerprint), or clear on request (protocol 1.7, docs/security.md).
    pub security: ClientSecurity,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: String::new(),
            key: None,
            block_size: crate::DEFAULT_BLOCK,
            ring: crate::DEFAULT_RING,
            buffer: Buffer::Fixed,
            timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            resume: false,
            skip: Skip::Nothing,
            filter: Filter::default(),
            retries: 0,
            dest_token: None,
            forward_token: false,
            streams: 1,
            auto_streams: false,
            chunk: crate::parallel::DEFAULT_CHUNK,
            direct: false,
            follow_links: false,
            force: false,
            security: ClientSecurity::default(),
        }
    }
}

/// Which files already at the destination a copy leaves alone (counted in
/// [`Stats::files_skipped`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Skip {
    /// None: every file is copied again (cp, scp).
    #[default]
    Nothing,
    /// Those with the source's size and mtime, the quick check rsync makes (`ferry cp
    /// --resume`, and every retry): what running an interrupted tree copy again wants.
    Unchanged,
    /// Every file that exists there (`ferry cp --no-clobber`).
    Existing,
}

impl Skip {
    /// Whether a file found at the destination with `there` (size, mtime s) is left alone
    /// when the source has `src`.
    pub(crate) fn keeps(self, there: (u64, i64), src: (u64, i64)) -> bool {
        match self {
            Skip::Nothing => false,
            Skip::Unchanged => there == src,
            Skip::Existing => true,
        }
    }
}

/// What a copy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Files copied (including files found complete and skipped).
    pub files: u64,
    /// File bytes copied (the whole size of each file, however much of it moved).
    pub bytes: u64,
    /// Blocks sent again after a CRC mismatch.
    pub blocks_resent: u64,
    /// File bytes that crossed the network (less than `bytes` after a resume).
    pub wire_bytes: u64,
    /// Bytes a resume found already in place (journaled prefixes of partial files).
    pub resumed_bytes: u64,
    /// Files a resumed tree copy found complete at the destination and skipped.
    pub files_skipped: u64,
    /// Tree entries not copied: symlinks not followed (or that lead nowhere or out of the
    /// root), FIFOs, sockets, devices.
    pub entries_skipped: u64,
    /// Reconnections after a connection failure.
    pub retries: u64,
    /// What the copy chose from its path.
    pub tuning: Tuning,
}

impl Stats {
    /// Adds another copy's counters (several sources, retries).
    pub fn add(&mut self, o: &Stats) {
        self.files += o.files;
        self.bytes += o.bytes;
        self.blocks_resent += o.blocks_resent;
        self.wire_bytes += o.wire_bytes;
        self.resumed_bytes += o.resumed_bytes;
        self.files_skipped += o.files_skipped;
        self.entries_skipped += o.entries_skipped;
        self.retries += o.retries;
        self.tuning.merge(&o.tuning);
    }
}

/// Receives progress reports.
pub trait Progress {
    /// The total number of bytes, once known.
    fn total(&self, _bytes: u64) {}
    /// `bytes` more moved.
    fn add(&self, _bytes: u64) {}
    /// `bytes` counted done without moving: a resume's verified part, a file skipped as
    /// already there. A display keeps them out of its rate and time estimate.
    fn already_there(&self, bytes: u64) {
        self.add(bytes)
    }
    /// Starting over (a retry): the next attempt reports what is already there again.
    fn restart(&self) {}
    /// The number of files the copy holds, once its listing is complete (reported with
    /// [`Progress::total`]).
    fn files(&self, _files: u64) {}
    /// One more file complete: copied and verified, or found already there and skipped.
    fn file_done(&self) {}
}

impl Progress for () {}

/// A connection to a `ferry serve`.
pub struct Client {
    pub(crate) link: Link,
    block: u32,
    pub(crate) minor: u16,
    resume: bool,
    /// [`Options::force`].
    force: bool,
    pub(crate) tx: BlockSender,
    /// Direct I/O for local files ([`Options::direct`]).
    direct: bool,
    ring: usize,
    /// The handshake's round trip (zero to this host: [`tune::is_local`]).
    pub(crate) rtt: Duration,
    /// GETs a download keeps outstanding.
    pub(crate) get_window: usize,
    /// How `opts.buffer` sizes the window once the files' sizes are known.
    buffer: Buffer,
    next_id: u32,
    /// The session WELCOME named (parallel streams join it).
    pub(crate) session: u64,
    /// What [`Client::look`] learned of a path and no one has used yet.
    looked: Option<Looked>,
    /// How this connection's PACKs are checked.
    pub(crate) packs: PackCheck,
    /// Counters so far.
    pub stats: Stats,
}

/// A path's STAT answer, and its LIST answer when it was asked for with it
/// ([`Client::look`]), kept for the plan that follows.
struct Looked {
    path: String,
    entry: Option<Entry>,
    listing: Option<Vec<Entry>>,
}

/// Agrees on the data protection `level` with the server at `addr` (protocol `minor`), or
/// fails: the connection's blocks are then checked as agreed. Fails closed: never a weaker
/// level than asked, whatever the server or the path says.
/// `sent`: the PROTECT went with the HELLO already (its answer follows WELCOME).
fn agree_protection(
    link: &mut Link,
    addr: &str,
    minor: u16,
    level: Level,
    sent: bool,
) -> Result<()> {
    if link.secure().is_none() {
        // A clear connection carries clear data only: checked before connecting.
        return Ok(());
    }
    if minor < proto::MINOR_PROTECT {
        if level == Level::Clear {
            return Ok(());
        }
        return Err(XferError::new(
            Kind::Auth,
            format!("{addr} speaks ferry protocol 1.{minor}, which has no data protection levels, and this copy requires {level}: upgrade the server, or use --protect clear (blocks checked by CRC-32C, whole files by their sealed BLAKE3)"),
        ));
    }
    if !sent {
        link.send(&Msg::Protect {
            level: level.code(),
        })?;
    }
    match link.recv_msg()? {
        Msg::Ok { file_id: 0 } => link.protect(level, false),
        Msg::Error { code, message, .. } => Err(remote_err(code, &message)),
        m => Err(unexpected(&m)),
    }
}

/// Whether a connection sends its SELECT, HELLO, PROTECT and first requests without
/// waiting for each answer (the default); `FERRY_PIPELINE_HANDSHAKE=0` turns it off (to
/// compare, or for a server that mishandles it).
fn pipelines() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("FERRY_PIPELINE_HANDSHAKE").map_or(true, |v| v != "0"))
}

pub(crate) fn remote_err(code: proto::ErrorCode, message: &str) -> XferError {
    crate::error::remote(code, message)
}

pub(crate) use crate::conv::download::unexpected;

impl Client {
    /// `flag` if this copy may replace read-only files and the server knows the FORCE
    /// flags (1.5), else 0 (an older server would refuse the frame).
    pub(crate) fn force_flag(&self, flag: u8) -> u8 {
        if self.force && self.minor >= proto::MINOR_FORCE {
            flag
        } else {
            0
        }
    }

    /// Connects and authenticates.
    pub fn connect(addr: &str, opts: &Options) -> Result<Client> {
        Self::connect_as(addr, opts, 0, 0)
    }

    /// Connects as stream `stream` of `session` (0, 0: a new session).
    pub(crate) fn connect_as(
        addr: &str,
        opts: &Options,
        session: u64,
        stream: u16,
    ) -> Result<Client> {
        Self::connect_looking(addr, opts, session, stream, None)
    }

    /// Connects and looks at `path` as [`Client::look`] does (`list`: its listing too),
    /// the STAT and LIST sent right behind the HELLO when the handshake lets them
    /// ([`pipelines`]): a round trip less before a copy's plan. What it learned is kept for
    /// the plan; an answer refused leaves nothing kept (the plan asks again and reports).
    pub fn connect_and_look(addr: &str, opts: &Options, path: &str, list: bool) -> Result<Client> {
        Self::connect_looking(addr, opts, 0, 0, Some((path, list)))
    }

    /// [`Client::connect_as`], sending `look`'s STAT (and LIST) with the handshake.
    ///
    /// Over TLS the SELECT, HELLO, PROTECT and the look leave back to back after the TLS
    /// Finished, and their answers (SELECTED, WELCOME, OK, ENTRY, ENTRIES) come back in one
    /// round trip: the server answers in order, and EXS holds the frames that arrive before
    /// the server posts a buffer for them (they count against the client's send credits
    /// until then). `FERRY_PIPELINE_HANDSHAKE=0` waits for each answer instead.
    pub(crate) fn connect_looking(
        addr: &str,
        opts: &Options,
        session: u64,
        stream: u16,
        look: Option<(&str, bool)>,
    ) -> Result<Client> {
        let level = opts.security.level();
        if opts.security.clear && level != Level::Clear {
            return Err(XferError::new(
                Kind::Usage,
                format!("data protection {level} needs TLS: a clear connection (--insecure-clear) carries clear data only (--protect clear)"),
            ));
        }
        let pipeline = pipelines();
        let mut link = Link::connect_with(addr, opts.timeout, &opts.security)?;
        link.timeout = HANDSHAKE_TIMEOUT;
        // Over TLS the token is proven in the floor's SELECT, never sent; a clear
        // connection sends it in the HELLO, as every version did.
        let secure = link.secure().is_some();
        let selecting = if secure {
            let keyed =
                link.send_select(crate::server::SERVICE, &opts.token, opts.key.as_deref())?;
            if !pipeline {
                link.selected(addr, crate::server::SERVICE, keyed)?;
            }
            Some(keyed).filter(|_| pipeline)
        } else {
            None
        };
        let token = if secure {
            String::new()
        } else {
            opts.token.clone()
        };
        let proposed = opts.block_size.clamp(proto::MIN_BLOCK, proto::MAX_BLOCK);
        // The handshake's round trip is the path's first RTT sample (plus the server's
        // token check and admission, well under a millisecond).
        let hello_sent = std::time::Instant::now();
        link.send(&Msg::Hello {
            major: proto::VERSION_MAJOR,
            minor: proto::VERSION_MINOR,
            block_size: proposed,
            session,
            stream,
            token,
        })?;
        // PROTECT goes with the HELLO, a round trip sooner, when the level needs a 1.9
        // server anyway (an older one is refused below, whatever it made of the frame);
        // `clear` waits for WELCOME: an older server serves it without PROTECT.
        let protect_early = secure && level != Level::Clear;
        if protect_early {
            link.send(&Msg::Protect {
                level: level.code(),
            })?;
        }
        // The first requests follow when nothing must come between them and the HELLO: a
        // `clear` level's PROTECT waits for WELCOME, and must be the first request.
        let looking = look.filter(|_| pipeline && (protect_early || !secure));
        if let Some((path, list)) = looking {
            link.send(&Msg::Stat { path: path.into() })?;
            if list {
                link.send(&Msg::List { path: path.into() })?;
            }
        }
        if let Some(keyed) = selecting {
            link.selected(addr, crate::server::SERVICE, keyed)?;
        }
        // The handshake's buffer is re-posted for the first answers after it, and a 1.3
        // server may answer a GET with a FILE frame as large as any block: every buffer this
        // client posts holds a block (the agreed size is at most the proposed one).
        link.post_ring(
            1,
            proto::MAX_CONTROL.max(BLOCK_HEADER_LEN + proposed as usize),
        )?;
        let (block, minor, session) = match link.recv_msg() {
            Ok(Msg::Welcome {
                block_size,
                minor,
                session,
                ..
            }) => (block_size, minor, session),
            Ok(Msg::Error { code, message, .. }) => return Err(remote_err(code, &message)),
            Ok(m) => return Err(unexpected(&m)),
            Err(e) => return Err(e),
        };
        let measured = hello_sent.elapsed();
        // TCP's own samples (from its handshake on) are not lengthened by a busy host.
        let tcp = link.socket().path_rtt();
        // This host is no distance, however long a busy scheduler made the handshake.
        let rtt = if tune::is_local(addr) {
            Duration::ZERO
        } else {
            tcp.map_or(measured, |t| t.min(measured))
        };
        if !(proto::MIN_BLOCK..=proto::MAX_BLOCK).contains(&block) {
            return Err(XferError::conn(format!(
                "the server chose a bad block size {block}"
            )));
        }
        link.timeout = opts.idle_timeout;
        let ring = tune::ring_for(opts.buffer, opts.ring, rtt, block);
        link.post_ring(ring.max(2), BLOCK_HEADER_LEN + block as usize)?;
        agree_protection(&mut link, addr, minor, level, protect_early)?;
        let packs = PackCheck::for_downloads(&mut link, minor);
        let mut tx = BlockSender::new(block, ring, opts.idle_timeout)?;
        tx.direct = opts.direct;
        // Small files go up several to a message (1.11), sealed in place at `private`.
        tx.packing = minor >= proto::MINOR_PUT_PACK;
        tx.clear_packs = tx.packing;
        let get_window = tune::get_window(opts.buffer, rtt, u64::from(block));
        let stats = Stats {
            tuning: Tuning {
                rtt_us: measured
                    .min(tcp.unwrap_or(measured))
                    .as_micros()
                    .try_into()
                    .unwrap_or(u64::MAX),
                tcp_rtt_us: tcp.map_or(0, tune::micros),
                ring,
                block,
                get_window,
                streams: 1,
                streams_auto: opts.auto_streams,
            },
            ..Stats::default()
        };
        let mut client = Client {
            link,
            block,
            minor,
            resume: opts.resume,
            force: opts.force,
            tx,
            direct: opts.direct,
            ring,
            rtt,
            get_window,
            buffer: opts.buffer,
            next_id: 1,
            session,
            looked: None,
            packs,
            stats,
        };
        match (looking, look) {
            (Some((path, list)), _) => client.looked(path, list)?,
            (None, Some((path, list))) => {
                // Refused looks are the plan's to report; a broken connection is now.
                if let Err(e) = client.look(path, list) {
                    if e.kind == Kind::Connection {
                        return Err(e);
                    }
                }
            }
            (None, None) => {}
        }
        Ok(client)
    }

    /// The handshake's round trip: the path's RTT as this connection measured it (zero to
    /// this host, [`tune::is_local`]).
    pub fn rtt(&self) -> Duration {
        self.rtt
    }

    /// Takes another round-trip sample (a request the server answers at once): the
    /// smallest counts. The handshake's may be long: the server allocates the
    /// connection's staging before it answers.
    fn sample_rtt(&mut self, rtt: Duration) {
        if rtt < self.rtt {
            self.rtt = rtt;
            self.stats.tuning.rtt_us = rtt.as_micros().try_into().unwrap_or(u64::MAX);
        }
    }

    /// Takes the transport's smallest round trip so far ([`ExsSocket::path_rtt`]: TCP's
    /// own, which a busy host does not lengthen) as a sample, and shows it.
    ///
    /// [`ExsSocket::path_rtt`]: ferry_exs::runtime::ExsSocket::path_rtt
    pub(crate) fn sample_path(&mut self) {
        if let Some(t) = self.link.socket().path_rtt() {
            self.stats.tuning.tcp_rtt_us = tune::micros(t);
            if !self.rtt.is_zero() {
                self.sample_rtt(t);
            }
        }
    }

    /// Sizes the window of GETs for files of `mean_size` bytes (from the path, unless
    /// the buffer is fixed).
    pub(crate) fn fit_window(&mut self, mean_size: u64) {
        self.get_window = tune::get_window(self.buffer, self.rtt, mean_size);
        self.stats.tuning.get_window = self.get_window;
    }

    /// The negotiated block size.
    pub fn block_size(&self) -> u32 {
        self.block
    }

    fn id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        id
    }

    /// Describes a remote path.
    pub fn stat(&mut self, path: &str) -> Result<Entry> {
        let sent = std::time::Instant::now();
        self.link.send(&Msg::Stat { path: path.into() })?;
        let answer = self.link.recv_msg()?;
        self.sample_rtt(sent.elapsed());
        match answer {
            Msg::Entry(e) => Ok(e),
            Msg::Error { code, message, .. } => Err(remote_err(code, &message)),
            m => Err(unexpected(&m)),
        }
    }

    /// Describes `path` as [`Client::stat`] does; with `list`, also lists it in the same
    /// round trip (the LIST goes with the STAT: a tree copy's plan needs both, and at 50 ms
    /// each round trip saved is 50 ms before the first byte moves). What it learns is kept
    /// for the plan: the next [`Client::look_once`] at `path` and the top level of the
    /// next walk of it take it instead of asking again. A LIST refused (the path is a
    /// file, or unreadable) leaves no listing; the STAT's answer is what counts.
    pub fn look(&mut self, path: &str, list: bool) -> Result<Entry> {
        self.looked = None;
        let sent = std::time::Instant::now();
        self.link.send(&Msg::Stat { path: path.into() })?;
        if list {
            self.link.send(&Msg::List { path: path.into() })?;
        }
        let (entry, rtt) = self.look_answers(path, list, sent)?;
        self.sample_rtt(rtt);
        Ok(entry)
    }

    /// Takes the answers to a look sent with the handshake ([`Client::connect_and_look`]):
    /// kept as [`Client::look`] keeps them; a refused STAT keeps nothing (the plan asks
    /// again and reports it). Its wait is no round-trip sample: the answers queued behind
    /// the handshake's.
    fn looked(&mut self, path: &str, list: bool) -> Result<()> {
        match self.look_answers(path, list, std::time::Instant::now()) {
            Ok(_) => Ok(()),
            Err(e) if e.kind == Kind::Connection => Err(e),
            Err(_) => {
                self.looked = None;
                Ok(())
            }
        }
    }

    /// The answers to a STAT of `path` (and its LIST, with `list`) sent at `sent`: the
    /// entry, kept with the listing for the plan, and how long the STAT's answer took.
    fn look_answers(
        &mut self,
        path: &str,
        list: bool,
        sent: std::time::Instant,
    ) -> Result<(Entry, Duration)> {
        self.looked = None;
        let answer = self.link.recv_msg()?;
        let rtt = sent.elapsed();
        let listing = match list {
            // Any other refusal is the walk's to report, if it comes to one.
            true => match self.listed(path) {
                Ok(entries) => Some(entries),
                Err(e) if e.kind == Kind::Connection => return Err(e),
                Err(_) => None,
            },
            false => None,
        };
        let entry = match answer {
            Msg::Entry(e) => e,
            Msg::Error { code, message, .. } => return Err(remote_err(code, &message)),
            m => return Err(unexpected(&m)),
        };
        self.looked = Some(Looked {
            path: path.into(),
            entry: Some(entry.clone()),
            listing: listing.filter(|_| entry.kind == EntryKind::Dir),
        });
        Ok((entry, rtt))
    }

    /// `path`'s entry from the last [`Client::look`] at it (once; [`Client::connect_and_look`]
    /// makes one with the handshake), else a fresh look.
    pub fn look_once(&mut self, path: &str, list: bool) -> Result<Entry> {
        let kept = match &mut self.looked {
            Some(l) if l.path == path => l.entry.take(),
            _ => None,
        };
        match kept {
            Some(entry) => Ok(entry),
            None => self.look(path, list),
        }
    }

    /// The listing of `path` kept by the last [`Client::look`] at it (once).
    fn looked_listing(&mut self, path: &str) -> Option<Vec<Entry>> {
        match &mut self.looked {
            Some(l) if l.path == path => l.listing.take(),
            _ => None,
        }
    }

    /// Lists `path`: the listing the last [`Client::look`] at it kept (once), else as
    /// [`Client::list`] does.
    pub fn list_once(&mut self, path: &str) -> Result<Vec<Entry>> {
        match self.looked_listing(path) {
            Some(entries) => Ok(entries),
            None => self.list(path),
        }
    }

    /// Lists a remote directory ("" lists the roots). Every name must be one plain path
    /// component ([`ferry_service::beneath::check_name`]): a listing that names anything else (a
    /// hostile or broken server) fails the whole request, before anything is written.
    pub fn list(&mut self, path: &str) -> Result<Vec<Entry>> {
        self.link.send(&Msg::List { path: path.into() })?;
        self.listed(path)
    }

    /// Lists several remote directories, their LISTs in flight together (a round trip for
    /// all of them instead of one each; the server answers in request order): each one's
    /// entries, or the first failure. An ERROR answering one LIST is taken after the others'
    /// answers, so the connection stays in step; a listing that breaks the rules fails at
    /// once, as [`Client::list`] does.
    pub fn list_many(&mut self, paths: &[String]) -> Result<Vec<Vec<Entry>>> {
        for p in paths {
            self.link.send(&Msg::List { path: p.clone() })?;
        }
        let mut out = Vec::with_capacity(paths.len());
        let mut refused = None;
        for p in paths {
            match self.listed(p) {
                Ok(entries) => out.push(entries),
                Err(e) if e.kind == Kind::Connection || e.kind == Kind::Permission => {
                    return Err(e)
                }
                Err(e) => {
                    refused.get_or_insert(e);
                }
            }
        }
        match refused {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// The answer to a LIST of `path` sent before: its entries, checked.
    fn listed(&mut self, path: &str) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        loop {
            match self.link.recv_msg()? {
                Msg::Entries { more, entries } => {
                    for e in &entries {
                        ferry_service::beneath::check_name(&e.name).map_err(|why| {
                            XferError::new(
                                Kind::Permission,
                                format!(
                                    "{path}: the server listed an entry that is not a plain name: {why}; refusing the listing (nothing was written)"
                                ),
                            )
                        })?;
                    }
                    out.extend(entries);
                    if !more {
                        return Ok(out);
                    }
                }
                Msg::Error { code, message, .. } => return Err(remote_err(code, &message)),
                m => return Err(unexpected(&m)),
            }
        }
    }

    /// BLAKE3 and size of a remote file, computed by the server.
    pub fn sum(&mut self, path: &str) -> Result<(u64, [u8; 32])> {
        self.link.send(&Msg::Sum { path: path.into() })?;
        match self.link.recv_msg()? {
            Msg::SumReply { size, blake3 } => Ok((size, blake3)),
            Msg::Error { code, message, .. } => Err(remote_err(code, &message)),
            m => Err(unexpected(&m)),
        }
    }

    /// Removes a remote file, symlink or empty directory (a 1.7 server).
    pub fn remove(&mut self, path: &str) -> Result<()> {
        self.needs(proto::MINOR_REMOVE, "remove files")?;
        self.link.send(&Msg::Remove { path: path.into() })?;
        match self.link.recv_msg()? {
            Msg::Ok { .. } => Ok(()),
            Msg::Error { code, message, .. } => Err(remote_err(code, &message)),
            m => Err(unexpected(&m)),
        }
    }

    /// The third-party copies the server is making for this client's credential
    /// (COPY frames, 1.9), oldest first.
    pub fn copies(&mut self) -> Result<Vec<Msg>> {
        self.needs(proto::MINOR_COPIES, "list third-party copies")?;
        self.link.send(&Msg::Copies)?;
        let mut out = Vec::new();
        loop {
            match self.link.recv_msg()? {
                m @ Msg::Copy { .. } => out.push(m),
                Msg::Ok { .. } => return Ok(out),
                Msg::Error { code, message, .. } => return Err(remote_err(code, &message)),
                m => return Err(unexpected(&m)),
            }
        }
    }

    /// Stops third-party copy `id` (from [`Client::copies`]) of this client's credential.
    pub fn abort_copy(&mut self, id: u64) -> Result<()> {
        self.needs(proto::MINOR_COPIES, "abort third-party copies")?;
        self.link.send(&Msg::AbortCopy { id })?;
        match self.link.recv_msg()? {
            Msg::Ok { .. } => Ok(()),
            Msg::Error { code, message, .. } => Err(remote_err(code, &message)),
            m => Err(unexpected(&m)),
        }
    }

    /// Asks the server for a grant (1.9, `ferry_service::grants`): another server may then
    /// write `path` here (and beneath it with `tree`) on this client's credential's behalf,
    /// for one session, within `ttl_secs` (0: the server's default, 60 s). Returns the
    /// grant's id and its secret, to be handed only to that server.
    pub fn grant(&mut self, path: &str, tree: bool, ttl_secs: u32) -> Result<(u64, [u8; 32])> {
        self.needs(proto::MINOR_GRANTS, "give grants")?;
        self.link.send(&Msg::Grant {
            flags: if tree { proto::GRANT_TREE } else { 0 },
            ttl_secs,
            path: path.into(),
        })?;
        match self.link.recv_msg()? {
            Msg::Granted { id, secret, .. } => Ok((id, secret)),
            Msg::Error { code, message, .. } => Err(remote_err(code, &message)),
            m => Err(unexpected(&m)),
        }
    }

    /// A usage error unless the server speaks `minor` or later (it can do `what`).
    fn needs(&self, minor: u16, what: &str) -> Result<()> {
        if self.minor < minor {
            return Err(XferError::new(
                Kind::Usage,
                format!(
                    "the server speaks transfer protocol 1.{} and cannot {what} (1.{minor} can): upgrade it",
                    self.minor
                ),
            ));
        }
        Ok(())
    }

    /// Creates a remote directory (existing is fine).
    pub fn mkdir(&mut self, path: &str, mode: u32) -> Result<()> {
        self.mkdirs([(path.to_string(), mode)])
    }

    /// Creates remote directories in order (parents first; existing is fine), up to
    /// [`MKDIR_WINDOW`] asked before the first answer: the server answers in order, so a
    /// tree's directories cost a round trip, not one each (at 50 ms, 11 took 0.55 s one
    /// after another). Every answer is taken; the first refusal is the result.
    pub fn mkdirs(&mut self, dirs: impl IntoIterator<Item = (String, u32)>) -> Result<()> {
        let mut asked = 0usize;
        let mut first_err = None;
        let mut take = |link: &mut Link| -> Result<()> {
            match link.recv_msg()? {
                Msg::Ok { .. } => {}
                Msg::Error { code, message, .. } => {
                    first_err.get_or_insert(remote_err(code, &message));
                }
                m => return Err(unexpected(&m)),
            }
            Ok(())
        };
        for (path, mode) in dirs {
            if asked == MKDIR_WINDOW {
                take(&mut self.link)?;
                asked -= 1;
            }
            self.link.send(&Msg::Mkdir { mode, path })?;
            asked += 1;
        }
        for _ in 0..asked {
            take(&mut self.link)?;
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Resume partial files in later downloads on this connection.
    pub fn set_resume(&mut self, on: bool) {
        self.resume = on;
    }

    /// Lists a remote tree: its directories (relative, parents first) and files, passing
    /// over what `filter` excludes ([`walk_entries`]). The
    /// directories found at one depth are listed together ([`Client::list_many`]): a tree
    /// costs a round trip per level, not per directory (at 50 ms, 11 directories took
    /// 0.55 s of LISTs one after another).
    fn walk_remote(&mut self, path: &str, follow: bool, filter: &Filter) -> Result<Tree> {
        let mut top = self.looked_listing(path);
        let me = std::cell::RefCell::new(self);
        walk_entries(
            path,
            follow,
            filter,
            |ps| match (top.take(), ps) {
                // The first call lists the top alone (walk_entries starts there).
                (Some(entries), [only]) if only.as_str() == path => Ok(vec![entries]),
                _ => me.borrow_mut().list_many(ps),
            },
            |p| me.borrow_mut().stat(p).map_err(|e| e.msg),
        )
    }

    /// Where a copy of `src` (a tree or not) lands when its destination on this server is
    /// `dst`, by the one rule of [`place`]; creates the directory the rule names when it is
    /// missing, so a refusal comes before any data moves.
    pub fn target(&mut self, src: &str, tree: bool, dst: &str) -> Result<String> {
        let at = match self.look_once(dst, false) {
            Ok(e) if e.kind == EntryKind::Dir => place::AtDest::Dir,
            Ok(_) => place::AtDest::Other,
            Err(e) if e.kind == Kind::NotFound => place::AtDest::Nothing,
            Err(e) => return Err(e),
        };
        let (target, create) = place::remote_target(src, tree, dst, at)?;
        if let Some(dir) = create {
            self.mkdir(&dir, 0o755)?;
        }
        Ok(target)
    }

    /// Ends the session politely: BYE, then the connection closed once BYE has left. The
    /// server answers nothing after BYE, so the close need not leave it time to (a
    /// one-byte `ferry cp` over tcp waited 25 of its 31 ms here: a 5 ms pause after BYE,
    /// then the connection's progress thread finishing its 20 ms wait).
    pub fn bye(self) {
        let _ = self.link.send(&Msg::Bye);
        self.link.hang_up();
    }
}

pub(crate) fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{}/{b}", a.trim_end_matches('/')),
    }
}

pub(crate) fn basename(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

/// Hex of a hash.
pub fn hex(h: &[u8; 32]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}
