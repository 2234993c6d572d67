//! Where a copy lands: one rule for every direction (download, upload, server to server)
//! and every driver, decided before any data moves (docs/xfer.md, "Where a copy lands").
//!
//! - A destination **names a directory** when it ends in `/`, when it is an existing
//!   directory, or when the source is a tree (a tree always lands in a directory). The
//!   source then lands inside it under its own name; a tree source ending in `/` lands its
//!   contents instead (rsync's rule).
//! - A directory so named that does not exist is created — that one level only: a missing
//!   parent is refused before any data moves, so a typo does not grow a path.
//! - Otherwise the destination is the file's new name.
//!
//! A tree copied again therefore lands in the same place: `cp -r src dst` puts it in
//! `dst/src` whether or not `dst` existed, and the second run resumes there instead of
//! nesting a copy inside the first (scp and cp nest it).

use std::path::{Path, PathBuf};

use crate::error::{Kind, Result, XferError};

/// What is at the destination path now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtDest {
    /// A directory (or a link to one).
    Dir,
    /// Anything else: a file, a device, a link to a file.
    Other,
    /// Nothing.
    Nothing,
}

/// Where a source lands relative to its destination argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Inside the destination directory; `create` it first (one level); the source keeps
    /// its name unless `contents` (a tree source ending in `/`: its entries land directly).
    Into { create: bool, contents: bool },
    /// At the destination path itself (a file's new name).
    As,
}

/// The rule: `tree` whether the source is a directory copied with `-r`, `src_slash` and
/// `dst_slash` whether the arguments end in `/`, `at` what the destination holds now.
pub(crate) fn place(tree: bool, src_slash: bool, dst_slash: bool, at: AtDest) -> Result<Place> {
    let names_dir = tree || dst_slash || at == AtDest::Dir;
    if !names_dir {
        return Ok(Place::As);
    }
    if at == AtDest::Other {
        return Err(XferError::new(
            Kind::Usage,
            if tree {
                "is not a directory, and a tree lands inside a directory: remove it or name another destination"
            } else {
                "is not a directory (the destination ends in /): remove the slash to replace the file"
            },
        ));
    }
    Ok(Place::Into {
        create: at == AtDest::Nothing,
        contents: tree && src_slash,
    })
}

/// A remote destination: the path the source takes on the server, and the directory to
/// create first, if any. `src` is the source's path (either side), `dst` the destination's.
pub(crate) fn remote_target(
    src: &str,
    tree: bool,
    dst: &str,
    at: AtDest,
) -> Result<(String, Option<String>)> {
    let how = place(tree, src.ends_with('/'), dst.ends_with('/'), at)
        .map_err(|e| XferError::new(e.kind, format!("{dst}: {}", e.msg)))?;
    let dir = dst.trim_end_matches('/');
    Ok(match how {
        Place::As => (dst.to_string(), None),
        Place::Into { create, contents } => {
            let name = super::basename(src);
            let target = if contents || name.is_empty() {
                dir.to_string()
            } else {
                super::join(dir, name)
            };
            (target, create.then(|| dir.to_string()))
        }
    })
}

/// A local destination by the rule, without touching it: the path the source takes, and
/// the directory to create first, if any.
pub(crate) fn local_place(src: &str, tree: bool, dst: &Path) -> Result<(PathBuf, Option<PathBuf>)> {
    use std::os::unix::ffi::OsStrExt;
    let at = match std::fs::metadata(dst) {
        Ok(md) if md.is_dir() => AtDest::Dir,
        Ok(_) => AtDest::Other,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => AtDest::Nothing,
        Err(e) => return Err(XferError::io(dst.display(), &e)),
    };
    let dst_slash = dst.as_os_str().as_bytes().ends_with(b"/");
    let how = place(tree, src.ends_with('/'), dst_slash, at)
        .map_err(|e| XferError::new(e.kind, format!("{}: {}", dst.display(), e.msg)))?;
    Ok(match how {
        Place::As => (dst.to_path_buf(), None),
        Place::Into { create, contents } => {
            let name = super::basename(src);
            let target = if contents || name.is_empty() {
                dst.to_path_buf()
            } else {
                dst.join(name)
            };
            (target, create.then(|| dst.to_path_buf()))
        }
    })
}

/// Creates `dir` (the directory [`local_place`] names), whose parent must exist.
pub(crate) fn create_last_level(dir: &Path) -> Result<()> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = dir.parent().unwrap_or(Path::new("/"));
            Err(XferError::new(
                Kind::NotFound,
                format!(
                    "{}: no such directory; ferry cp creates only the last level of a destination (mkdir -p {} first)",
                    parent.display(),
                    parent.display()
                ),
            ))
        }
        Err(e) => Err(XferError::io(dir.display(), &e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AtDest::*;

    #[test]
    fn files_take_a_new_name_unless_the_destination_names_a_directory() {
        assert_eq!(place(false, false, false, Nothing).unwrap(), Place::As);
        assert_eq!(place(false, false, false, Other).unwrap(), Place::As);
        let into = |create| Place::Into {
            create,
            contents: false,
        };
        assert_eq!(place(false, false, false, Dir).unwrap(), into(false));
        assert_eq!(place(false, false, true, Dir).unwrap(), into(false));
        assert_eq!(place(false, false, true, Nothing).unwrap(), into(true));
        assert!(place(false, false, true, Other).is_err());
    }

    #[test]
    fn trees_always_land_in_a_directory() {
        for dst_slash in [false, true] {
            for src_slash in [false, true] {
                let p = |at| place(true, src_slash, dst_slash, at).unwrap();
                let into = |create| Place::Into {
                    create,
                    contents: src_slash,
                };
                assert_eq!(p(Dir), into(false));
                assert_eq!(p(Nothing), into(true));
                assert!(place(true, src_slash, dst_slash, Other).is_err());
            }
        }
    }

    #[test]
    fn a_second_run_lands_where_the_first_did() {
        // First run: dst missing, created; second: dst there. Same target both times.
        let first = remote_target("src/t", true, "dst/new", Nothing).unwrap();
        let second = remote_target("src/t", true, "dst/new", Dir).unwrap();
        assert_eq!(first, ("dst/new/t".into(), Some("dst/new".into())));
        assert_eq!(second.0, first.0);
        let first = remote_target("src/t/", true, "dst/new", Nothing).unwrap();
        assert_eq!(first, ("dst/new".into(), Some("dst/new".into())));
        assert_eq!(
            remote_target("src/t/", true, "dst/new", Dir).unwrap().0,
            "dst/new"
        );
    }

    #[test]
    fn remote_targets() {
        assert_eq!(
            remote_target("a/f1.dat", false, "dst/newdir2/", Nothing).unwrap(),
            ("dst/newdir2/f1.dat".into(), Some("dst/newdir2".into()))
        );
        assert_eq!(
            remote_target("a/f1.dat", false, "dst/g", Nothing).unwrap(),
            ("dst/g".into(), None)
        );
        assert_eq!(
            remote_target("a/f1.dat", false, "dst", Dir).unwrap(),
            ("dst/f1.dat".into(), None)
        );
        let e = remote_target("a/f", false, "dst/g/", Other).unwrap_err();
        assert!(e.msg.starts_with("dst/g/: is not a directory"), "{}", e.msg);
    }

    #[test]
    fn local_targets_create_one_level_only() {
        let t = std::env::temp_dir().join(format!("ferry-place-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        std::fs::create_dir(&t).unwrap();
        let d = t.join("new/");
        let (target, create) = local_place("r/f", false, &d).unwrap();
        assert_eq!(target, t.join("new/f"));
        assert!(!t.join("new").exists(), "placing touches nothing");
        create_last_level(&create.unwrap()).unwrap();
        assert!(t.join("new").is_dir());
        let deep = t.join("no/such/x/");
        let (_, create) = local_place("r/f", false, &deep).unwrap();
        let e = create_last_level(&create.unwrap()).unwrap_err();
        assert_eq!(e.kind, Kind::NotFound);
        assert!(e.msg.contains("no/such: no such directory"), "{}", e.msg);
        assert!(!t.join("no").exists());
        std::fs::remove_dir_all(&t).unwrap();
    }
}
