//! Which entries of a tree a copy takes: `ferry cp --include/--exclude` (docs/xfer.md,
//! "Filters").
//!
//! Patterns are shell globs (`*`, `?`, `[...]`, `**` across directories) matched against a
//! path relative to the tree's top. A pattern without `/` matches a name at any depth
//! (`*.tmp`); one with `/` matches the whole relative path (`logs/**`, `run*/out.h5`).
//! An excluded directory excludes everything beneath it. Includes select files only (a
//! directory is walked unless excluded), so `--include '*.h5'` finds the HDF5 files at any
//! depth; with no include every file is taken. Excludes win over includes.

use std::collections::HashSet;
use std::sync::Arc;

use glob::{MatchOptions, Pattern};

use super::{Client, Options};
use crate::error::{Kind, Result, XferError};
use crate::url::Remote;

/// One pattern, and whether it is matched against whole paths or names.
#[derive(Debug, Clone)]
struct Rule {
    pattern: Pattern,
    whole_path: bool,
}

impl Rule {
    fn new(text: &str) -> Result<Rule> {
        let pattern = Pattern::new(text.trim_end_matches('/'))
            .map_err(|e| XferError::new(Kind::Usage, format!("pattern {text:?}: {}", e.msg)))?;
        Ok(Rule {
            pattern,
            whole_path: text.trim_end_matches('/').contains('/'),
        })
    }

    fn matches(&self, rel: &str) -> bool {
        const HOW: MatchOptions = MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: false,
        };
        if self.whole_path {
            self.pattern.matches_with(rel, HOW)
        } else {
            let name = rel.rsplit('/').next().unwrap_or(rel);
            self.pattern.matches_with(name, HOW)
        }
    }
}

/// The `--include` and `--exclude` patterns of a copy.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    include: Vec<Rule>,
    exclude: Vec<Rule>,
    /// When set, only these files (relative paths) are taken: what a sync found to differ.
    only: Option<Arc<HashSet<String>>>,
}

impl Filter {
    /// A filter of these patterns; a malformed one is a usage error naming it.
    pub fn new(include: &[String], exclude: &[String]) -> Result<Filter> {
        let rules = |v: &[String]| v.iter().map(|p| Rule::new(p)).collect::<Result<Vec<_>>>();
        Ok(Filter {
            include: rules(include)?,
            exclude: rules(exclude)?,
            only: None,
        })
    }

    /// This filter, narrowed to the files `only` (relative paths).
    pub(crate) fn only(&self, only: HashSet<String>) -> Filter {
        Filter {
            only: Some(Arc::new(only)),
            ..self.clone()
        }
    }

    /// A filter of patterns from the wire (SEND_TO) and a list of the only files to take.
    pub(crate) fn from_wire(
        patterns: Option<&(Vec<String>, Vec<String>)>,
        only: Option<&[String]>,
    ) -> Result<Filter> {
        let filter = match patterns {
            Some((include, exclude)) => Filter::new(include, exclude)?,
            None => Filter::default(),
        };
        Ok(match only {
            Some(o) => filter.only(o.iter().cloned().collect()),
            None => filter,
        })
    }

    /// The `--include` and `--exclude` patterns, as [`Filter::new`] takes them back (none:
    /// `None`), for a server to apply (SEND_TO).
    pub(crate) fn patterns(&self) -> Option<(Vec<String>, Vec<String>)> {
        let text = |v: &[Rule]| v.iter().map(|r| r.pattern.as_str().to_string()).collect();
        (!self.include.is_empty() || !self.exclude.is_empty())
            .then(|| (text(&self.include), text(&self.exclude)))
    }

    /// The only files taken, when a sync narrowed the filter to them.
    pub(crate) fn only_files(&self) -> Option<&HashSet<String>> {
        self.only.as_deref()
    }

    /// Whether the filter takes everything.
    pub fn is_empty(&self) -> bool {
        self.include.is_empty() && self.exclude.is_empty() && self.only.is_none()
    }

    /// Whether `rel` or a directory above it is excluded.
    pub(crate) fn excluded(&self, rel: &str) -> bool {
        let mut at = rel;
        loop {
            if self.exclude.iter().any(|r| r.matches(at)) {
                return true;
            }
            match at.rsplit_once('/') {
                Some((up, _)) => at = up,
                None => return false,
            }
        }
    }

    /// Whether the directory `rel` is created and walked.
    pub fn takes_dir(&self, rel: &str) -> bool {
        !self.excluded(rel)
    }

    /// Whether the file `rel` is copied.
    pub fn takes_file(&self, rel: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|r| r.matches(rel)))
            && !self.excluded(rel)
            && self.only.as_ref().is_none_or(|o| o.contains(rel))
    }
}

/// Whether the last component of `path` is a glob (`*`, `?` or `[`): a remote source
/// the client expands ([`expand_remote`]).
pub fn is_glob(path: &str) -> bool {
    super::basename(path).contains(['*', '?', '['])
}

/// The sources a remote glob names: the entries of its directory whose names match its
/// last component (sorted; hidden names only when the pattern starts with a dot, as a
/// shell does). No match is NotFound, as a shell without `nullglob` would have it.
pub fn expand_remote(r: &Remote, opts: &Options) -> Result<Vec<Remote>> {
    let path = r.path.trim_end_matches('/');
    let (dir, pat) = path.rsplit_once('/').unwrap_or(("", path));
    let pattern = Rule::new(pat)?;
    let mut c = Client::connect(&r.addr, opts)?;
    let mut names: Vec<String> = c
        .list(dir)?
        .into_iter()
        .map(|e| e.name)
        .filter(|n| (pat.starts_with('.') || !n.starts_with('.')) && pattern.matches(n))
        .collect();
    c.bye();
    if names.is_empty() {
        return Err(XferError::new(
            Kind::NotFound,
            format!("{}: no match", r.path),
        ));
    }
    names.sort();
    Ok(names
        .into_iter()
        .map(|n| Remote {
            addr: r.addr.clone(),
            path: super::join(dir, &n),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(include: &[&str], exclude: &[&str]) -> Filter {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Filter::new(&v(include), &v(exclude)).unwrap()
    }

    #[test]
    fn names_match_at_any_depth_and_paths_whole() {
        let x = f(&[], &["*.tmp", "logs/**", "cache/"]);
        assert!(!x.takes_file("a.tmp") && !x.takes_file("d/e/a.tmp"));
        assert!(x.takes_file("a.tmpx") && x.takes_file("d/a.h5"));
        assert!(!x.takes_file("logs/x/y") && x.takes_file("d/logs/x"));
        assert!(!x.takes_dir("cache") && !x.takes_dir("d/cache"));
        assert!(!x.takes_file("d/cache/f"), "beneath an excluded directory");
    }

    #[test]
    fn includes_select_files_and_excludes_win() {
        let x = f(&["*.h5"], &["scratch"]);
        assert!(x.takes_file("run1/out.h5") && !x.takes_file("run1/out.log"));
        assert!(x.takes_dir("run1"));
        assert!(!x.takes_file("scratch/out.h5"));
        let star = f(&["run*/out.h5"], &[]);
        assert!(star.takes_file("run7/out.h5") && !star.takes_file("run7/sub/out.h5"));
    }

    #[test]
    fn patterns_travel_and_come_back_the_same() {
        let x = f(&["run*/out.h5", "*.h5"], &["cache/", "*.tmp"]);
        let (inc, exc) = x.patterns().unwrap();
        let back = Filter::from_wire(Some(&(inc, exc)), None).unwrap();
        for p in [
            "run1/out.h5",
            "a/b.h5",
            "cache/x.h5",
            "d/cache",
            "a.tmp",
            "x.log",
        ] {
            assert_eq!(back.takes_file(p), x.takes_file(p), "{p}");
            assert_eq!(back.takes_dir(p), x.takes_dir(p), "{p}");
        }
        assert!(f(&[], &[]).patterns().is_none());
        let only = Filter::from_wire(None, Some(&["a/b".to_string()])).unwrap();
        assert!(only.takes_file("a/b") && !only.takes_file("a/c") && only.takes_dir("a"));
    }

    #[test]
    fn bad_patterns_are_usage_errors() {
        let e = Filter::new(&["[".into()], &[]).unwrap_err();
        assert_eq!(e.kind, Kind::Usage);
        assert!(e.msg.contains("pattern \"[\""), "{}", e.msg);
    }
}
