//! `copy`: scp-like copies of files and trees, with retries, resume and third-party copies.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::download::{mtime_secs, Dest, DlJob};
use super::{
    join, remote_err, unexpected, Client, Options, Progress, Skip, Stats, Tree, RETRY_DELAY,
    RETRY_MAX_DELAY,
};
use crate::error::{Kind, Result, XferError};
use crate::proto::{self, EntryKind, ErrorCode, Msg};
use crate::url::{Location, Remote};
use ferry_service::journal::Ident;

/// Copies `src` to `dst` (one of them local, one remote), like `scp`: into an existing
/// directory the source keeps its name. `recursive` copies trees. After a connection
/// failure it reconnects and resumes up to `opts.retries` times.
pub fn copy(
    src: &Location,
    dst: &Location,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Stats> {
    // -n between two servers: the source server cannot see the destination, so a sync's
    // plan (a client on each) chooses the files it sends.
    if let (Skip::Existing, Location::Remote(_), Location::Remote(_)) = (opts.skip, src, dst) {
        return super::sync::copy_no_clobber(src, dst, recursive, opts, progress);
    }
    let mut total = Stats::default();
    let mut opts = opts.clone();
    let mut delay = RETRY_DELAY;
    loop {
        // A copy that chooses its stream count looks at the path first: its first
        // connection's handshake measures the round trip, and the copy goes on with it.
        let mut first = None;
        let spread = match data_remote(src, dst) {
            Some(r) if opts.auto_streams => {
                // The path's STAT (and, for a tree download, the top level's listing)
                // goes with the handshake; its answer is kept for the plan, and an error
                // is the plan's to report. TCP's own round trip is the second sample (the
                // handshake's includes the server allocating the connection's staging).
                let list = recursive && matches!(src, Location::Remote(_));
                let c = Client::connect_and_look(&r.addr, &opts, &r.path, list).map(|mut c| {
                    c.sample_path();
                    c
                });
                // A long path grows its streams; a tree download over a short one opens
                // a stream per core ([`super::tune::short_tree_streams`]).
                let spread = c.as_ref().is_ok_and(|c| {
                    let tree = list && super::tune::short_tree_streams_here() > 1;
                    (super::tune::long_path(c.rtt()) || tree) && c.minor >= proto::MINOR_STREAMS
                });
                first = Some(c);
                spread
            }
            _ => opts.streams > 1,
        };
        let mut first = match first.transpose() {
            Ok(c) => c,
            Err(e) if e.kind == Kind::Connection => {
                retry_or_fail(e, &mut total, &opts, &mut delay, progress)?;
                opts.resume = true;
                continue;
            }
            Err(e) => return Err(e),
        };
        let (total_, first_) = (&mut total, &mut first);
        let res = match (src, dst) {
            (Location::Remote(r), Location::Local(l)) if spread => {
                crate::parallel::download(first_, r, Some(l), recursive, &opts, progress, total_)
            }
            (Location::Remote(r), Location::Null) if spread => {
                crate::parallel::download(first_, r, None, recursive, &opts, progress, total_)
            }
            (Location::Local(l), Location::Remote(r)) if spread => crate::parallel::upload(
                first_,
                Some(l),
                0,
                r,
                recursive,
                &opts,
                progress,
                total_,
            ),
            (Location::Zero(n), Location::Remote(r)) if spread => crate::parallel::upload(
                first_, None, *n, r, recursive, &opts, progress, total_,
            ),
            (Location::Remote(r), Location::Local(l)) => {
                download(first_, r, Some(l), recursive, &opts, progress, total_)
            }
            (Location::Remote(r), Location::Null) => {
                download(first_, r, None, recursive, &opts, progress, total_)
            }
            (Location::Local(l), Location::Remote(r)) => {
                upload(first_, l, r, recursive, &opts, progress, total_)
            }
            (Location::Remote(s), Location::Remote(d)) => {
                third_party(s, d, recursive, &opts, progress, total_)
            }
            (Location::Zero(n), Location::Remote(r)) => {
                with_client(first_, r, &opts, total_, |c| {
                    let target = c.target("zero", false, &r.path)?;
                    progress.total(*n);
                    c.upload_zero(*n, &target, progress)
                })
            }
            (_, Location::Zero(_)) => Err(XferError::new(
                Kind::Usage,
                "zero:SIZE is a source only; to discard data write to null: (or the server's mem/null)",
            )),
            (Location::Null, _) => Err(XferError::new(
                Kind::Usage,
                "null: is a sink only; to send zeros read zero:SIZE (or the server's mem/zero/SIZE)",
            )),
            (Location::Zero(_) | Location::Local(_), Location::Null | Location::Local(_)) => {
                Err(XferError::new(
                    Kind::Usage,
                    "both ends are local: one of SRC and DST must be remote (host:root/path or ferry://host/root/path)",
                ))
            }
        };
        match res {
            Ok(()) => return Ok(total),
            Err(e) => {
                retry_or_fail(e, &mut total, &opts, &mut delay, progress)?;
                // A retry continues what the failed attempt left.
                opts.resume = true;
                if opts.skip == Skip::Nothing {
                    opts.skip = Skip::Unchanged;
                }
            }
        }
    }
}

/// After `e`: `Ok` (having paused) if the copy is to try again, else `Err(e)`.
fn retry_or_fail(
    e: XferError,
    total: &mut Stats,
    opts: &Options,
    delay: &mut std::time::Duration,
    progress: &dyn Progress,
) -> Result<()> {
    if e.kind != Kind::Connection || total.retries >= u64::from(opts.retries) {
        return Err(e);
    }
    total.retries += 1;
    tracing::warn!(
        "{e}; retrying in {:.1} s ({} of {}), resuming",
        delay.as_secs_f64(),
        total.retries,
        opts.retries
    );
    std::thread::sleep(*delay);
    *delay = (*delay * 2).min(RETRY_MAX_DELAY);
    progress.restart();
    Ok(())
}

/// The server a copy of file data between `src` and `dst` talks to (not for a
/// third-party copy, whose source server chooses its own streams).
fn data_remote<'a>(src: &'a Location, dst: &'a Location) -> Option<&'a Remote> {
    match (src, dst) {
        (Location::Remote(r), Location::Local(_) | Location::Null)
        | (Location::Local(_) | Location::Zero(_), Location::Remote(r)) => Some(r),
        _ => None,
    }
}

/// Runs `f` on `first` (taken) or a new connection and adds its counters to `total`,
/// whatever the outcome.
pub(crate) fn with_client(
    first: &mut Option<Client>,
    r: &Remote,
    opts: &Options,
    total: &mut Stats,
    f: impl FnOnce(&mut Client) -> Result<()>,
) -> Result<()> {
    let mut c = match first.take() {
        Some(c) => c,
        None => Client::connect(&r.addr, opts)?,
    };
    let res = f(&mut c);
    total.add(&c.stats);
    if res.is_ok() {
        c.bye();
    }
    res
}

/// Downloads to `local` (`None`: the null sink, nothing is written).
fn download(
    first: &mut Option<Client>,
    r: &Remote,
    local: Option<&Path>,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
    total: &mut Stats,
) -> Result<()> {
    with_client(first, r, opts, total, |c| {
        let jobs = plan_download(c, r, local, recursive, opts, progress)?;
        c.download_files(jobs, progress)
    })
}

/// What a download of `r` to `local` fetches: STATs (and walks) the source, creates the
/// local directories, and skips (counting them) files a resume finds complete.
pub(crate) fn plan_download(
    c: &mut Client,
    r: &Remote,
    local: Option<&Path>,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Vec<DlJob>> {
    {
        let entry = c.look_once(&r.path, recursive)?;
        let is_tree = entry.kind == EntryKind::Dir;
        // Where it lands, and the directory the rule creates: created only once the
        // source's listing was accepted, so a refused one leaves nothing behind.
        let placed = match local {
            Some(local) if entry.kind == EntryKind::File || recursive => {
                Some(super::place::local_place(&r.path, is_tree, local)?)
            }
            _ => None,
        };
        let dest = placed.as_ref().map(|(target, _)| target.clone());
        let make_dir = || match &placed {
            Some((_, Some(dir))) => super::place::create_last_level(dir),
            _ => Ok(()),
        };
        let files = match entry.kind {
            EntryKind::File => {
                make_dir()?;
                let to = dest.as_deref().map(Dest::file).transpose()?;
                vec![(r.path.clone(), to, entry.size, entry.mtime)]
            }
            EntryKind::Dir if recursive => {
                // Names were checked as they arrived (Client::list); everything is created
                // beneath the destination, held open.
                let tree = c
                    .walk_remote(&r.path, opts.follow_links, &opts.filter)?
                    .filtered(&opts.filter);
                c.stats.entries_skipped += tree.skipped.len() as u64;
                let (dirs, files) = (tree.dirs, tree.files);
                let base = match &dest {
                    Some(dest) => {
                        make_dir()?;
                        std::fs::create_dir_all(dest)
                            .map_err(|e| XferError::io(dest.display(), &e))?;
                        let base = Dest::open_base(dest)?;
                        for d in &dirs {
                            Dest::under(&base, dest, d).mkdir()?;
                        }
                        Some((base, dest))
                    }
                    None => None,
                };
                files
                    .into_iter()
                    .map(|(rel, size, mtime)| {
                        let to = base.as_ref().map(|(b, d)| Dest::under(b, d, &rel));
                        (join(&r.path, &rel), to, size, mtime)
                    })
                    .collect()
            }
            EntryKind::Dir => {
                return Err(XferError::new(
                    Kind::Usage,
                    format!("{}: is a directory; use -r to copy trees", r.path),
                ))
            }
            _ => {
                return Err(XferError::new(
                    Kind::Usage,
                    format!("{}: not a regular file or directory", r.path),
                ))
            }
        };
        let bytes: u64 = files.iter().map(|f| f.2).sum();
        progress.total(bytes);
        progress.files(files.len() as u64);
        c.fit_window(super::tune::mean_size(bytes, files.len()));
        let mut jobs = Vec::new();
        for (path, dest, size, mtime) in files {
            let ident = Ident { size, mtime };
            // Nothing is kept unless asked: then there is nothing to stat.
            let asked = opts.skip != Skip::Nothing;
            let there = dest.as_ref().filter(|_| asked).and_then(|d| d.existing());
            if there.is_some_and(|t| opts.skip.keeps(t, (size, mtime))) {
                c.stats.files += 1;
                c.stats.files_skipped += 1;
                c.stats.bytes += size;
                progress.already_there(size);
                progress.file_done();
                continue;
            }
            jobs.push(DlJob {
                path,
                dest,
                ident,
                chunk: None,
            });
        }
        Ok(jobs)
    }
}

fn upload(
    first: &mut Option<Client>,
    local: &Path,
    r: &Remote,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
    total: &mut Stats,
) -> Result<()> {
    let md = std::fs::metadata(local).map_err(|e| XferError::io(local.display(), &e))?;
    if md.is_dir() && !recursive {
        return Err(XferError::new(
            Kind::Usage,
            format!("{}: is a directory; use -r to copy trees", local.display()),
        ));
    }
    if !md.is_dir() && !md.is_file() {
        return Err(XferError::new(
            Kind::Usage,
            format!(
                "{}: not a regular file (a FIFO, socket or device); only files are copied",
                local.display()
            ),
        ));
    }
    with_client(first, r, opts, total, |c| {
        let files = plan_upload(c, local, &md, r, opts, progress)?;
        c.upload_files(
            files.into_iter().map(|(src, path, _)| (src, path)),
            progress,
        )
    })
}

/// What an upload of `local` (metadata `md`) to `r` sends: (source, remote path, size) of
/// each file. STATs the target, creates the remote directories and skips (counting them)
/// files a resume finds complete there.
pub(crate) fn plan_upload(
    c: &mut Client,
    local: &Path,
    md: &std::fs::Metadata,
    r: &Remote,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Vec<(PathBuf, String, u64)>> {
    {
        let src = local.to_string_lossy();
        let target = c.target(&src, md.is_dir(), &r.path)?;
        let existing = if md.is_file() && opts.skip != Skip::Nothing {
            c.stat(&target).ok()
        } else {
            None
        };
        // What the destination already holds, for a resume's quick check (size, mtime s).
        let mut there: HashMap<String, (u64, i64)> = HashMap::new();
        let files = if md.is_file() {
            if let Some(e) = existing.filter(|e| e.kind == EntryKind::File) {
                there.insert(String::new(), (e.size, e.mtime));
            }
            vec![(String::new(), md.len(), mtime_secs(md))]
        } else {
            let Tree {
                dirs,
                files,
                skipped,
            } = walk_local(local, opts.follow_links, &opts.filter)?.filtered(&opts.filter);
            c.stats.entries_skipped += skipped.len() as u64;
            if opts.skip != Skip::Nothing {
                if let Ok(remote) = c.walk_remote(&target, false, &super::Filter::default()) {
                    there = remote
                        .files
                        .into_iter()
                        .map(|(p, s, m)| (p, (s, m)))
                        .collect();
                }
            }
            let made = dirs.iter().map(|d| (join(&target, d), 0o755));
            c.mkdirs(std::iter::once((target.clone(), 0o755)).chain(made))?;
            files
        };
        progress.total(files.iter().map(|f| f.1).sum());
        progress.files(files.len() as u64);
        let mut out = Vec::new();
        for (rel, size, mtime) in files {
            if there
                .get(&rel)
                .is_some_and(|&t| opts.skip.keeps(t, (size, mtime)))
            {
                c.stats.files += 1;
                c.stats.files_skipped += 1;
                c.stats.bytes += size;
                progress.already_there(size);
                progress.file_done();
                continue;
            }
            let src = if rel.is_empty() {
                local.to_path_buf()
            } else {
                local.join(&rel)
            };
            out.push((src, join(&target, &rel), size));
        }
        Ok(out)
    }
}

/// A third-party copy: the source server sends straight to the destination server, and
/// this client only watches. The filter and `-L` travel with the request (1.9); a sync's
/// list of the files to copy goes in as many requests as its frames need.
fn third_party(
    src: &Remote,
    dst: &Remote,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
    total: &mut Stats,
) -> Result<()> {
    with_client(&mut None, src, opts, total, |c| {
        if c.minor < 1 {
            return Err(XferError::new(
                Kind::Usage,
                format!(
                    "{} speaks transfer protocol 1.{} and cannot make third-party copies: upgrade it, or copy through this host in two steps",
                    src.addr, c.minor
                ),
            ));
        }
        let selects = !opts.filter.is_empty() || opts.follow_links;
        if selects && c.minor < proto::MINOR_SEND_FILTER {
            return Err(XferError::new(
                Kind::Usage,
                format!(
                    "{} speaks transfer protocol 1.{}: its third-party copies take no --include, --exclude, -L, -n or sync's list of files (1.{} does); upgrade it, or copy through this host in two steps",
                    src.addr,
                    c.minor,
                    proto::MINOR_SEND_FILTER
                ),
            ));
        }
        // Without -p a third-party copy keeps one stream: the source server would have to
        // measure the path to the destination to choose.
        let streams = if opts.auto_streams {
            1
        } else {
            opts.streams.clamp(1, proto::MAX_STREAMS)
        };
        if streams > 1 && c.minor < proto::MINOR_SEND_STREAMS {
            tracing::warn!(
                "{} speaks transfer protocol 1.{}, which sends third-party copies over one stream",
                src.addr,
                c.minor
            );
        }
        let streams = if c.minor >= proto::MINOR_SEND_STREAMS {
            streams
        } else {
            1
        };
        let request = |file_id, only, (dest_path, token, grant): Credential| Msg::SendTo {
            flags: if recursive { proto::SEND_RECURSIVE } else { 0 },
            file_id,
            path: src.path.clone(),
            dest: dst.addr.clone(),
            dest_path,
            token,
            streams,
            follow: opts.follow_links,
            patterns: opts.filter.patterns(),
            only,
            grant,
        };
        let mut cred = dest_credential(c, src, dst, recursive, opts)?;
        // Patterns too long for one frame are the user's to shorten, not a retry's.
        let base = proto::to_vec(&request(0, None, cred.clone()))
            .map_err(|e| XferError::new(Kind::Usage, format!("--include/--exclude: {e}")))?
            .len();
        let chunks = only_chunks(opts.filter.only_files(), base);
        let mut sent = 0;
        for (i, only) in chunks.into_iter().enumerate() {
            if i > 0 && cred.2.is_some() {
                // A grant serves one copy: each request of a long list gets its own.
                cred = dest_credential(c, src, dst, recursive, opts)?;
            }
            let file_id = c.id();
            c.link.send(&request(file_id, only, cred.clone()))?;
            sent += watch_copy(c, progress, sent)?;
        }
        Ok(())
    })
}

/// The only-lists a sync's narrowed copy sends, each filling one SEND_TO of `base` bytes
/// without a list up to [`proto::MAX_CONTROL`] (at least one, maybe empty: it still creates
/// the tree's directories); without a narrowing, one request without a list.
fn only_chunks(only: Option<&HashSet<String>>, base: usize) -> Vec<Option<Vec<String>>> {
    let Some(only) = only else {
        return vec![None];
    };
    let mut files: Vec<&String> = only.iter().collect();
    files.sort();
    // The list's count, and each path's length and bytes.
    let room = proto::MAX_CONTROL.saturating_sub(base + 2);
    let mut chunks = vec![Vec::new()];
    let mut used = 0;
    for f in files {
        let len = 2 + f.len();
        if used + len > room && used > 0 {
            chunks.push(Vec::new());
            used = 0;
        }
        used += len;
        if let Some(last) = chunks.last_mut() {
            last.push(f.clone());
        }
    }
    chunks.into_iter().map(Some).collect()
}

/// Watches one SEND_TO to its end: PROGRESS frames to `progress` (after `before` bytes of
/// the copy's earlier requests), then the counts of COPIED into the connection's stats.
/// Returns the bytes it copied.
fn watch_copy(c: &mut Client, progress: &dyn Progress, before: u64) -> Result<u64> {
    let mut shown = 0;
    loop {
        match c.link.recv_msg()? {
            Msg::Progress { done, total, .. } => {
                if shown == 0 {
                    progress.total(before + total);
                }
                progress.add(done.saturating_sub(shown));
                shown = shown.max(done);
            }
            Msg::Copied {
                files,
                bytes,
                blocks_resent,
                skipped,
                ..
            } => {
                progress.add(bytes.saturating_sub(shown));
                c.stats.files += files;
                c.stats.entries_skipped += skipped;
                c.stats.bytes += bytes;
                c.stats.wire_bytes += bytes;
                c.stats.blocks_resent += blocks_resent;
                return Ok(bytes);
            }
            // Only the destination refuses a credential here (the source took ours at
            // HELLO): a forwarded token, or a grant (expired, or used already).
            Msg::Error {
                code: ErrorCode::AuthRefused,
                message,
                ..
            } => {
                return Err(XferError::new(
                    Kind::Auth,
                    format!("the destination refused the source server: {message}"),
                ))
            }
            Msg::Error { code, message, .. } => return Err(remote_err(code, &message)),
            m => return Err(unexpected(&m)),
        }
    }
}

/// What the source server of a third-party copy presents to the destination, and where
/// the copy lands there: `(dest_path, token, grant)`.
type Credential = (String, String, Option<[u8; 32]>);

/// The [`Credential`] of a third-party copy.
///
/// Both servers speak protocol 1.9: this client, authenticated to the destination with its
/// own key or token, places the copy there (the rule of `ferry cp`, creating the directory
/// it names) and asks for a grant to write that one path (a tree for a directory); the
/// source proves the grant there, and the user's token stays here. With an older server the
/// user's destination token is sent to the source instead, inside its sealed channel, only
/// when the user allows it (`--forward-token`): refused otherwise.
fn dest_credential(
    c: &mut Client,
    src: &Remote,
    dst: &Remote,
    recursive: bool,
    opts: &Options,
) -> Result<Credential> {
    let token = opts
        .dest_token
        .clone()
        .unwrap_or_else(|| opts.token.clone());
    let dopts = Options {
        token: token.clone(),
        ..opts.clone()
    };
    let mut d = Client::connect(&dst.addr, &dopts).map_err(|e| match e.kind {
        Kind::Auth => dest_refused(dst),
        _ => XferError::new(e.kind, format!("destination {}: {}", dst.addr, e.msg)),
    })?;
    if c.minor.min(d.minor) < proto::MINOR_GRANTS {
        d.bye();
        return without_grants((c.minor, &src.addr), dst, token, opts.forward_token);
    }
    let entry = c.stat(&src.path)?;
    let tree = entry.kind == EntryKind::Dir;
    if tree && !recursive {
        return Err(XferError::new(
            Kind::Usage,
            format!("{}: is a directory; use -r to copy trees", src.path),
        ));
    }
    let target = d.target(&src.path, tree, &dst.path)?;
    let (_, secret) = d.grant(&target, tree, 0).map_err(|e| {
        XferError::new(
            e.kind,
            format!("the destination {} gave no grant: {}", dst.addr, e.msg),
        )
    })?;
    d.bye();
    Ok((target, String::new(), Some(secret)))
}

/// [`dest_credential`] when the source (its minor and address) or the destination is older
/// than grants: the destination token goes to the source only if the user allows it.
fn without_grants(
    (src_minor, src_addr): (u16, &str),
    dst: &Remote,
    token: String,
    forward: bool,
) -> Result<Credential> {
    let old = if src_minor < proto::MINOR_GRANTS {
        src_addr
    } else {
        &dst.addr
    };
    if forward && !token.is_empty() {
        tracing::warn!(
            "{old} speaks a transfer protocol without grants (before 1.{}): sending the source server your destination token (--forward-token)",
            proto::MINOR_GRANTS
        );
        return Ok((dst.path.clone(), token, None));
    }
    Err(XferError::new(
        Kind::Usage,
        format!(
            "{old} speaks a transfer protocol too old for grants (before 1.{}): the source server would need your destination token itself; allow that with --forward-token (it travels inside the source's TLS channel), or upgrade the older server",
            proto::MINOR_GRANTS
        ),
    ))
}

/// The error for a destination that refused this client's credential (its own answer
/// names the source's options, which are not the ones to change).
fn dest_refused(dst: &Remote) -> XferError {
    XferError::new(
        Kind::Auth,
        format!(
            "the destination {} refused your credential: pass its token with --dest-token or FERRY_DEST_TOKEN (without either, the source's token is used), or add your key to its authorized_keys",
            dst.addr
        ),
    )
}

/// A local tree: its directories (relative, parents first) and files, and what was
/// skipped — symlinks unless `follow` (a followed link that leads nowhere too), special
/// files, a link back to a directory above it (a loop). What `filter` excludes is passed
/// over, not walked or counted. Names that are not UTF-8 are refused.
pub(super) fn walk_local(root: &Path, follow: bool, filter: &super::Filter) -> Result<Tree> {
    use std::os::unix::fs::MetadataExt;
    let mut tree = Tree::default();
    // Each directory to list, with the directories above it (device, inode): a link to
    // one of those is a loop.
    let top = std::fs::metadata(root).map_err(|e| XferError::io(root.display(), &e))?;
    let mut todo = vec![(String::new(), vec![(top.dev(), top.ino())])];
    while let Some((rel, above)) = todo.pop() {
        let here = root.join(&rel);
        let rd = std::fs::read_dir(&here).map_err(|e| XferError::io(here.display(), &e))?;
        for ent in rd {
            let ent = ent.map_err(|e| XferError::io(here.display(), &e))?;
            let name = ent.file_name().into_string().map_err(|n| {
                XferError::new(
                    Kind::Usage,
                    format!("{}: name is not UTF-8; rename it", here.join(n).display()),
                )
            })?;
            let r = join(&rel, &name);
            if filter.excluded(&r) {
                continue;
            }
            let path = ent.path();
            let ft = ent
                .file_type()
                .map_err(|e| XferError::io(path.display(), &e))?;
            let md = if ft.is_symlink() && !follow {
                tracing::warn!(
                    "{}: skipping a symlink (-L follows symlinks)",
                    path.display()
                );
                tree.skipped.push(r);
                continue;
            } else {
                // Follows a link (the others are what they are).
                match std::fs::metadata(&path) {
                    Ok(md) => md,
                    Err(e) if ft.is_symlink() => {
                        tracing::warn!(
                            "{}: skipping a symlink that cannot be followed: {e}",
                            path.display()
                        );
                        tree.skipped.push(r);
                        continue;
                    }
                    Err(e) => return Err(XferError::io(path.display(), &e)),
                }
            };
            if md.is_dir() {
                let id = (md.dev(), md.ino());
                if above.contains(&id) {
                    tracing::warn!(
                        "{}: skipping a symlink loop (it leads to a directory above it)",
                        path.display()
                    );
                    tree.skipped.push(r);
                    continue;
                }
                let mut chain = above.clone();
                chain.push(id);
                tree.dirs.push(r.clone());
                todo.push((r, chain));
            } else if md.is_file() {
                tree.files.push((r, md.len(), mtime_secs(&md)));
            } else {
                tracing::warn!(
                    "{}: skipping (not a file, directory or symlink)",
                    path.display()
                );
                tree.skipped.push(r);
            }
        }
    }
    tree.dirs.sort();
    Ok(tree)
}

/// BLAKE3 of a local file, as `ferry sum` prints it.
pub fn sum_local(path: &Path) -> Result<(u64, [u8; 32])> {
    // Opened as an upload source is: a FIFO is refused, not waited on.
    let (f, meta) = super::upload::open_source(path)?;
    let h = ferry_service::hash::hash_file(&f, meta.size)
        .map_err(|e| XferError::io(path.display(), &e))?;
    Ok((meta.size, h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lists_fill_frames_and_never_vanish() {
        assert_eq!(only_chunks(None, 100), [None]);
        let none = HashSet::new();
        assert_eq!(only_chunks(Some(&none), 100), [Some(Vec::new())]);
        let many: HashSet<String> = (0..600).map(|i| format!("{i:0>200}")).collect();
        let chunks = only_chunks(Some(&many), 100);
        assert!(chunks.len() >= 2, "{}", chunks.len());
        let mut all: Vec<String> = chunks.into_iter().flatten().flatten().collect();
        all.sort();
        assert_eq!(all.len(), 600);
        all.dedup();
        assert_eq!(all.len(), 600);
        // Each request fits a control frame.
        for chunk in only_chunks(Some(&many), 100).into_iter().flatten() {
            let msg = Msg::SendTo {
                flags: proto::SEND_RECURSIVE,
                file_id: 1,
                path: "p".into(),
                dest: "d".into(),
                dest_path: "q".into(),
                token: String::new(),
                streams: 1,
                follow: false,
                patterns: None,
                only: Some(chunk),
                grant: None,
            };
            assert!(proto::to_vec(&msg).is_ok());
        }
    }
}
