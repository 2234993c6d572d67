//! `sync`: make a destination hold what a source holds, moving only what differs
//! (`ferry sync`; docs/xfer.md, "Sync").
//!
//! The source lands where `ferry cp -r` puts it (the one rule of [`super::place`]). Both
//! trees are walked (through the same `--include`/`--exclude` filter, so what the filter
//! leaves out is neither copied nor deleted); a source file is copied when the destination
//! has none with its size and mtime (`--checksum`: none with its size and BLAKE3); with
//! `delete`, destination entries the source does not have are removed after the copy
//! succeeded, deepest first. A dry run reports both lists and touches nothing.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::place::{local_place, remote_target, AtDest};
use super::{join, walk_local, Client, Options, Progress, Skip, Stats, Tree};
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

/// One side of a sync: a tree here or on the server `c` is connected to.
enum Side<'a> {
    Local(&'a Path),
    Remote(&'a str),
}

/// Syncs `src` to `dst` (one local, one remote).
pub fn sync(
    src: &Location,
    dst: &Location,
    how: SyncHow,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<SyncReport> {
    let remote = match (src, dst) {
        (Location::Local(_), Location::Remote(r)) | (Location::Remote(r), Location::Local(_)) => r,
        _ => return Err(one_local_one_remote()),
    };
    let mut c = Client::connect(&remote.addr, opts)?;
    let plan = plan(&mut c, src, dst, how, opts)?;
    let mut report = SyncReport {
        copied: plan.copy.iter().cloned().collect(),
        removed: plan.remove.clone(),
        ..SyncReport::default()
    };
    report.copied.sort();
    if how.dry_run {
        c.bye();
        return Ok(report);
    }
    if !plan.copy.is_empty() || plan.missing_dirs {
        let narrowed = Options {
            filter: opts.filter.only(plan.copy),
            skip: Skip::Nothing,
            ..opts.clone()
        };
        report.stats = super::copy(src, dst, true, &narrowed, progress)?;
    }
    report.stats.files += plan.unchanged;
    report.stats.files_skipped += plan.unchanged;
    for rel in &plan.remove {
        match &plan.target {
            Target::Local(t) => remove_local(&t.join(rel))?,
            Target::Remote(t) => c.remove(&join(t, rel))?,
        }
    }
    c.bye();
    Ok(report)
}

fn one_local_one_remote() -> XferError {
    XferError::new(
        Kind::Usage,
        "ferry sync needs one local and one remote end (server-to-server syncs are not there yet)",
    )
}

/// Where the source lands.
enum Target {
    Local(PathBuf),
    Remote(String),
}

/// What a sync will do.
struct Plan {
    target: Target,
    /// Source files to copy (relative).
    copy: HashSet<String>,
    /// Files left alone as unchanged.
    unchanged: u64,
    /// Whether the copy has directories to create even if no file differs.
    missing_dirs: bool,
    /// Destination entries to remove, deepest first.
    remove: Vec<String>,
}

fn plan(
    c: &mut Client,
    src: &Location,
    dst: &Location,
    how: SyncHow,
    opts: &Options,
) -> Result<Plan> {
    let (src_side, src_name) = match src {
        Location::Local(p) => (Side::Local(p), p.to_string_lossy().into_owned()),
        Location::Remote(r) => (Side::Remote(&r.path), r.path.clone()),
        _ => return Err(one_local_one_remote()),
    };
    let (source, tree) = walk(c, &src_side, opts.follow_links)?;
    let source = source.filtered(&opts.filter);
    let target = match dst {
        Location::Local(p) => Target::Local(local_place(&src_name, tree, p)?.0),
        Location::Remote(Remote { path, .. }) => {
            let at = match c.stat(path) {
                Ok(e) if e.kind == EntryKind::Dir => AtDest::Dir,
                Ok(_) => AtDest::Other,
                Err(e) if e.kind == Kind::NotFound => AtDest::Nothing,
                Err(e) => return Err(e),
            };
            Target::Remote(remote_target(&src_name, tree, path, at)?.0)
        }
        _ => return Err(one_local_one_remote()),
    };
    let dest_side = match &target {
        Target::Local(p) => Side::Local(p),
        Target::Remote(p) => Side::Remote(p),
    };
    // What is there now (nothing if the target is missing), through the same filter:
    // what it leaves out is protected from --delete.
    let (there, there_at_all) = match walk(c, &dest_side, false) {
        Ok((t, _)) => (t.filtered(&opts.filter), true),
        Err(e) if e.kind == Kind::NotFound => (Tree::default(), false),
        Err(e) => return Err(e),
    };
    let theirs: std::collections::HashMap<&str, (u64, i64)> = there
        .files
        .iter()
        .map(|(p, s, m)| (p.as_str(), (*s, *m)))
        .collect();
    let mut copy = HashSet::new();
    let mut unchanged = 0;
    for (rel, size, mtime) in &source.files {
        let same = match theirs.get(rel.as_str()) {
            Some(&(s, _)) if how.checksum => {
                s == *size && same_content(c, &src_side, &dest_side, rel)?
            }
            Some(&t) => t == (*size, *mtime),
            None => false,
        };
        if same {
            unchanged += 1;
        } else {
            copy.insert(rel.clone());
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
        copy,
        unchanged,
        missing_dirs,
        remove,
    })
}

/// Walks one side: its tree (a single file is a tree of one file named ""), and whether it
/// is a directory. A missing side is NotFound.
fn walk(c: &mut Client, side: &Side<'_>, follow: bool) -> Result<(Tree, bool)> {
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
        Side::Remote(p) => {
            let e = c.stat(p)?;
            (e.kind, e.size, e.mtime)
        }
    };
    match (kind, side) {
        (EntryKind::Dir, Side::Local(p)) => Ok((walk_local(p, follow)?, true)),
        (EntryKind::Dir, Side::Remote(p)) => Ok((c.walk_remote(p, follow)?, true)),
        _ => Ok((
            Tree {
                files: vec![(String::new(), size, mtime)],
                ..Tree::default()
            },
            false,
        )),
    }
}

/// Whether `rel` has the same BLAKE3 on both sides (one local, one remote).
fn same_content(c: &mut Client, a: &Side<'_>, b: &Side<'_>, rel: &str) -> Result<bool> {
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
            Side::Remote(p) => Ok(c.sum(&join(p, rel))?.1),
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
}
