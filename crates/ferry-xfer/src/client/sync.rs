//! `sync`: make a destination hold what a source holds, moving only what differs
//! (`ferry sync`; docs/xfer.md, "Sync").
//!
//! The source lands where `ferry cp -r` puts it (the one rule of [`super::place`]). Both
//! trees are walked (through the same `--include`/`--exclude` filter, so what the filter
//! leaves out is neither copied nor deleted); a source file is copied when the destination
//! has none with its size and mtime (`--checksum`: none with its size and BLAKE3); with
//! `delete`, destination entries the source does not have are removed after the copy
//! succeeded, deepest first. A dry run reports both lists and touches nothing.
//!
//! Between two servers the plan is made the same way with a client on each, and the
//! copy is one third-party tree copy narrowed to the files that differ (the list travels
//! in SEND_TO, split over as many requests as its frames need): the data goes straight
//! from server to server, each request costs the source one connection to the
//! destination (not one per file), and the source server applies the same filter and
//! `-L` as the plan did. A file the source loses between the plan and the copy is not sent:
//! when the source's COPIED counts fewer files than the plan listed, the destination is
//! listed again and the report names as copied only the files it now holds with the
//! source's size and mtime.
//!
//! `ferry cp -n` between two servers is the same plan and copy, leaving alone every file the
//! destination already has (and deleting nothing).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::place::{local_place, remote_target, AtDest};
use super::{join, walk_local, Client, Filter, Options, Progress, Skip, Stats, Tree};
use crate::error::{Kind, Result, XferError};
use crate::proto::EntryKind;
use crate::url::{Location, Remote};

/// What a sync does besides copying.
#[derive(Debug, Clone, Copy, Default)]
pub struct SyncHow {
    /// Remove destination entries the source does not have (`--delete`).
    pub delete: bool,
    /// Report what would be copied and removed, and change nothing (`--dry-run`).
    pub dry_run: bool,
    /// Compare files by size and BLAKE3 instead of size and mtime (`--checksum`).
    pub checksum: bool,
}

/// What a sync did (or, dry, would do).
#[derive(Debug, Default)]
pub struct SyncReport {
    /// Files copied (relative to the tree's top; "" for a single file).
    pub copied: Vec<String>,
    /// Entries removed, deepest first.
    pub removed: Vec<String>,
    /// The copy's counters (files left alone as unchanged count in `files_skipped`).
    pub stats: Stats,
}

/// One side of a sync: a tree here or on the server the client `clients[i]` is connected
/// to.
enum Side<'a> {
    Local(&'a Path),
    Remote(usize, &'a str),
}

/// Syncs `src` to `dst` (one local and one remote, or two remote: a third-party copy).
pub fn sync(
    src: &Location,
    dst: &Location,
    how: SyncHow,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<SyncReport> {
    run(src, dst, how, Leave::Unchanged, opts, progress)
}

/// `ferry cp -n` between two servers: the plan of a sync that leaves alone every file the
/// destination has (counted as skipped, as `-n` counts them in other copies), then one
/// third-party copy of the others. A directory needs `recursive`.
pub(super) fn copy_no_clobber(
    src: &Location,
    dst: &Location,
    recursive: bool,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Stats> {
    let leave = Leave::Existing { recursive };
    Ok(run(src, dst, SyncHow::default(), leave, opts, progress)?.stats)
}

/// Which destination files a plan leaves alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leave {
    /// Those with the source's size and mtime (or BLAKE3, `--checksum`): a sync.
    Unchanged,
    /// Every file there (`cp -n`); a source directory needs `recursive`.
    Existing { recursive: bool },
}

fn run(
    src: &Location,
    dst: &Location,
    how: SyncHow,
    leave: Leave,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<SyncReport> {
    // Sources on clients[0], destinations on the last one (the same, unless both remote).
    let mut clients = match (src, dst) {
        (Location::Local(_), Location::Remote(r)) | (Location::Remote(r), Location::Local(_)) => {
            vec![Client::connect(&r.addr, opts)?]
        }
        (Location::Remote(a), Location::Remote(b)) => vec![
            Client::connect(&a.addr, opts)?,
            Client::connect(&b.addr, &dest_options(opts))?,
        ],
        _ => return Err(not_two_ends()),
    };
    let plan = plan(&mut clients, src, dst, how, leave, opts)?;
    if let (Leave::Existing { recursive: false }, true) = (leave, plan.tree) {
        let name = match src {
            Location::Remote(r) => r.path.as_str(),
            _ => "",
        };
        return Err(XferError::new(
            Kind::Usage,
            format!("{name}: is a directory; use -r to copy trees"),
        ));
    }
    let mut report = SyncReport {
        copied: plan.copy.keys().cloned().collect(),
        removed: plan.remove.clone(),
        ..SyncReport::default()
    };
    report.copied.sort();
    if how.dry_run {
        clients.into_iter().for_each(Client::bye);
        return Ok(report);
    }
    if !plan.copy.is_empty() || plan.missing_dirs {
        let narrowed = Options {
            filter: opts.filter.only(plan.copy.keys().cloned().collect()),
            skip: Skip::Nothing,
            ..opts.clone()
        };
        report.stats = super::copy(src, dst, true, &narrowed, progress)?;
        report.copied = copied_files(&plan.copy, report.stats.files, || {
            let side = dest_side(&plan.target, clients.len());
            match walk(&mut clients, &side, false, &opts.filter) {
                Ok((t, _)) => Ok(t),
                Err(e) if e.kind == Kind::NotFound => Ok(Tree::default()),
                Err(e) => Err(e),
            }
        })?;
    }
    report.stats.files += plan.unchanged;
    report.stats.files_skipped += plan.unchanged;
    if let Leave::Existing { .. } = leave {
        report.stats.bytes += plan.unchanged_bytes;
    }
    report.stats.entries_skipped = plan.skipped;
    for rel in &plan.remove {
        match &plan.target {
            Target::Local(t) => remove_local(&t.join(rel))?,
            Target::Remote(t) => last(&mut clients).remove(&join(t, rel))?,
        }
    }
    clients.into_iter().for_each(Client::bye);
    Ok(report)
}

/// The options of the client connected to a sync's destination server: its own token
/// (`--dest-token`) when one was given.
fn dest_options(opts: &Options) -> Options {
    Options {
        token: opts
            .dest_token
            .clone()
            .unwrap_or_else(|| opts.token.clone()),
        ..opts.clone()
    }
}

/// The client connected to the destination.
fn last(clients: &mut [Client]) -> &mut Client {
    let n = clients.len();
    &mut clients[n - 1]
}

fn not_two_ends() -> XferError {
    XferError::new(
        Kind::Usage,
        "ferry sync needs a remote end: local to remote, remote to local, or server to server",
    )
}

/// Where the source lands.
enum Target {
    Local(PathBuf),
    Remote(String),
}

/// The files a copy of `planned` (relative, with the source's size and mtime) copied,
/// sorted, when the copy counted `sent` files. The source sends what it finds when it
/// copies: a file gone since the plan is missing from the count, and then the destination's
/// tree after the copy (`relist`) says which landed — those it holds with the source's size
/// and mtime. (With `--checksum`, a lost file whose old copy already had its size and mtime
/// counts as copied: a listing cannot tell.)
fn copied_files(
    planned: &HashMap<String, (u64, i64)>,
    sent: u64,
    relist: impl FnOnce() -> Result<Tree>,
) -> Result<Vec<String>> {
    let mut out: Vec<String> = if sent >= planned.len() as u64 {
        planned.keys().cloned().collect()
    } else {
        relist()?
            .files
            .into_iter()
            .filter(|(p, s, m)| planned.get(p) == Some(&(*s, *m)))
            .map(|f| f.0)
            .collect()
    };
    out.sort();
    Ok(out)
}

/// The side a sync's target is on (`n` clients, the destination's the last).
fn dest_side(target: &Target, n: usize) -> Side<'_> {
    match target {
        Target::Local(p) => Side::Local(p),
        Target::Remote(p) => Side::Remote(n - 1, p),
    }
}

/// What a sync will do.
struct Plan {
    target: Target,
    /// Whether the source is a directory.
    tree: bool,
    /// Source files to copy (relative), with their size and mtime.
    copy: HashMap<String, (u64, i64)>,
    /// Files left alone as unchanged, and their bytes.
    unchanged: u64,
    unchanged_bytes: u64,
    /// Source entries the walk skipped (symlinks not followed, special files).
    skipped: u64,
    /// Whether the copy has directories to create even if no file differs.
    missing_dirs: bool,
    /// Destination entries to remove, deepest first.
    remove: Vec<String>,
}

fn plan(
    clients: &mut [Client],
    src: &Location,
    dst: &Location,
    how: SyncHow,
    leave: Leave,
    opts: &Options,
) -> Result<Plan> {
    let (src_side, src_name) = match src {
        Location::Local(p) => (Side::Local(p), p.to_string_lossy().into_owned()),
        Location::Remote(r) => (Side::Remote(0, &r.path), r.path.clone()),
        _ => return Err(not_two_ends()),
    };
    let (source, tree) = walk(clients, &src_side, opts.follow_links, &opts.filter)?;
    let source = source.filtered(&opts.filter);
    let target = match dst {
        Location::Local(p) => Target::Local(local_place(&src_name, tree, p)?.0),
        Location::Remote(Remote { path, .. }) => {
            let at = match last(clients).stat(path) {
                Ok(e) if e.kind == EntryKind::Dir => AtDest::Dir,
                Ok(_) => AtDest::Other,
                Err(e) if e.kind == Kind::NotFound => AtDest::Nothing,
                Err(e) => return Err(e),
            };
            Target::Remote(remote_target(&src_name, tree, path, at)?.0)
        }
        _ => return Err(not_two_ends()),
    };
    let dest_side = dest_side(&target, clients.len());
    // What is there now (nothing if the target is missing), through the same filter:
    // what it leaves out is protected from --delete.
    let (there, there_at_all) = match walk(clients, &dest_side, false, &opts.filter) {
        Ok((t, _)) => (t.filtered(&opts.filter), true),
        Err(e) if e.kind == Kind::NotFound => (Tree::default(), false),
        Err(e) => return Err(e),
    };
    let theirs: std::collections::HashMap<&str, (u64, i64)> = there
        .files
        .iter()
        .map(|(p, s, m)| (p.as_str(), (*s, *m)))
        .collect();
    let mut copy = HashMap::new();
    let (mut unchanged, mut unchanged_bytes) = (0, 0);
    for (rel, size, mtime) in &source.files {
        let same = match theirs.get(rel.as_str()) {
            Some(_) if leave != Leave::Unchanged => true,
            Some(&(s, _)) if how.checksum => {
                s == *size && same_content(clients, &src_side, &dest_side, rel)?
            }
            Some(&t) => t == (*size, *mtime),
            None => false,
        };
        if same {
            unchanged += 1;
            unchanged_bytes += size;
        } else {
            copy.insert(rel.clone(), (*size, *mtime));
        }
    }
    let dirs_there: HashSet<&str> = there.dirs.iter().map(String::as_str).collect();
    let missing_dirs =
        !there_at_all || source.dirs.iter().any(|d| !dirs_there.contains(d.as_str()));
    let remove = if how.delete && tree {
        extraneous(&source, &there)
    } else {
        Vec::new()
    };
    Ok(Plan {
        target,
        tree,
        copy,
        unchanged,
        unchanged_bytes,
        skipped: source.skipped.len() as u64,
        missing_dirs,
        remove,
    })
}

/// Walks one side (passing over what `filter` excludes): its tree (a single file is a tree
/// of one file named ""), and whether it is a directory. A missing side is NotFound.
fn walk(
    clients: &mut [Client],
    side: &Side<'_>,
    follow: bool,
    filter: &Filter,
) -> Result<(Tree, bool)> {
    let (kind, size, mtime) = match side {
        Side::Local(p) => {
            let md = std::fs::metadata(p).map_err(|e| XferError::io(p.display(), &e))?;
            let kind = if md.is_dir() {
                EntryKind::Dir
            } else {
                EntryKind::File
            };
            (kind, md.len(), super::download::mtime_secs(&md))
        }
        Side::Remote(i, p) => {
            let e = clients[*i].stat(p)?;
            (e.kind, e.size, e.mtime)
        }
    };
    match (kind, side) {
        (EntryKind::Dir, Side::Local(p)) => Ok((walk_local(p, follow, filter)?, true)),
        (EntryKind::Dir, Side::Remote(i, p)) => {
            Ok((clients[*i].walk_remote(p, follow, filter)?, true))
        }
        _ => Ok((
            Tree {
                files: vec![(String::new(), size, mtime)],
                ..Tree::default()
            },
            false,
        )),
    }
}

/// Whether `rel` has the same BLAKE3 on both sides (a server hashes its own side).
fn same_content(clients: &mut [Client], a: &Side<'_>, b: &Side<'_>, rel: &str) -> Result<bool> {
    let mut hash = |side: &Side<'_>| -> Result<[u8; 32]> {
        match side {
            Side::Local(p) => {
                let p = if rel.is_empty() {
                    p.to_path_buf()
                } else {
                    p.join(rel)
                };
                Ok(super::sum_local(&p)?.1)
            }
            Side::Remote(i, p) => Ok(clients[*i].sum(&join(p, rel))?.1),
        }
    };
    Ok(hash(a)? == hash(b)?)
}

/// Destination entries the source does not have: files, symlinks and other entries, then
/// directories, deepest first (a directory's contents go before it).
fn extraneous(source: &Tree, there: &Tree) -> Vec<String> {
    let files: HashSet<&str> = source.files.iter().map(|f| f.0.as_str()).collect();
    let dirs: HashSet<&str> = source.dirs.iter().map(String::as_str).collect();
    let gone_dir = |p: &str| !dirs.contains(p);
    // Beneath a directory that goes, everything goes with it (listed, so it is removed
    // first).
    let mut out: Vec<String> = there
        .files
        .iter()
        .map(|f| f.0.clone())
        .chain(there.skipped.iter().cloned())
        .filter(|p| !files.contains(p.as_str()))
        .collect();
    let mut gone: Vec<String> = there.dirs.iter().filter(|d| gone_dir(d)).cloned().collect();
    gone.sort_by_key(|d| std::cmp::Reverse(d.matches('/').count()));
    out.sort();
    out.extend(gone);
    out
}

/// Removes a local file, symlink or empty directory (never following a link).
fn remove_local(p: &Path) -> Result<()> {
    let md = std::fs::symlink_metadata(p).map_err(|e| XferError::io(p.display(), &e))?;
    if md.is_dir() {
        std::fs::remove_dir(p)
    } else {
        std::fs::remove_file(p)
    }
    .map_err(|e| XferError::io(p.display(), &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extraneous_entries_go_deepest_first() {
        let tree = |dirs: &[&str], files: &[&str]| Tree {
            dirs: dirs.iter().map(|s| s.to_string()).collect(),
            files: files.iter().map(|s| (s.to_string(), 1, 1)).collect(),
            skipped: Vec::new(),
        };
        let source = tree(&["a"], &["a/x", "y"]);
        let mut there = tree(&["a", "b", "b/c"], &["a/x", "a/old", "b/c/z", "y"]);
        there.skipped.push("link".into());
        assert_eq!(
            extraneous(&source, &there),
            ["a/old", "b/c/z", "link", "b/c", "b"]
        );
        assert!(extraneous(&source, &source).is_empty());
    }

    /// A copy whose COPIED counts every planned file copied them all (no second listing);
    /// one that counts fewer (the source lost "gone" after the plan) names only what the
    /// destination now holds with the source's size and mtime: not "gone", whose old copy
    /// there differs, nor "absent".
    #[test]
    fn a_file_lost_after_the_plan_is_not_reported_copied() {
        let planned: HashMap<String, (u64, i64)> =
            [("a", 10), ("d/b", 20), ("gone", 30), ("absent", 40)]
                .into_iter()
                .map(|(p, s)| (p.to_string(), (s, 7)))
                .collect();
        let all = copied_files(&planned, 4, || panic!("no listing when all were sent"));
        assert_eq!(all.unwrap(), ["a", "absent", "d/b", "gone"]);
        let after = Tree {
            dirs: vec!["d".into()],
            files: vec![
                ("a".into(), 10, 7),
                ("d/b".into(), 20, 7),
                ("gone".into(), 3, 1),
                ("other".into(), 5, 5),
            ],
            skipped: Vec::new(),
        };
        let some = copied_files(&planned, 2, || Ok(after));
        assert_eq!(some.unwrap(), ["a", "d/b"]);
    }
}
