//! What a credential may do (a token's or a key's options): which roots it sees and
//! whether it may write there. Its own module so that the authorized-keys reader
//! (the keys module) and the credential check (the auth module) both use it without
//! importing each other.

/// What one credential may do: which roots it sees, and whether it may write there.
/// Enforced where a face resolves a path (`Roots::permit` in the roots module), on top of the
/// roots' own read-only setting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rights {
    /// The roots it may use (`None`: every root); any other is "no root named ...".
    pub roots: Option<Vec<String>>,
    /// Reading only: uploads, removals and new directories are refused.
    pub read_only: bool,
    /// A grant's limit (the grants module): the one path or tree it may write, and nothing
    /// else (no reads); `None` for keys, tokens and anonymous clients.
    pub scope: Option<Scope>,
}

/// Where a grant may write: one path, or a tree (the path and everything beneath it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The grant's id (what the audit names, and what its single use is counted by).
    pub grant: u64,
    /// `root/relative/path`, without a trailing `/`.
    pub path: String,
    /// The path and everything beneath it, not only the path.
    pub tree: bool,
}

impl Scope {
    /// Whether `path` is the scope's path or, for a tree, beneath it. A path with `.`,
    /// `..` or empty components is never covered: it could lead out of the scope while
    /// staying in the root.
    pub fn covers(&self, path: &str) -> bool {
        let path = path.strip_suffix('/').unwrap_or(path);
        if path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return false;
        }
        path == self.path
            || (self.tree
                && path
                    .strip_prefix(self.path.as_str())
                    .is_some_and(|rest| rest.starts_with('/')))
    }
}

impl Rights {
    /// Every right.
    pub const ALL: Rights = Rights {
        roots: None,
        read_only: false,
        scope: None,
    };

    /// Whether the root named `name` is granted.
    pub fn grants(&self, name: &str) -> bool {
        self.roots
            .as_ref()
            .is_none_or(|r| r.iter().any(|n| n == name))
    }

    /// Parses options as authorized-keys and token-file lines write them: comma-separated
    /// `ro`, `rw` and `roots=NAME`, where a bare name after `roots=` names one more root
    /// (`roots=data,scratch,ro`). `Err` names what is not understood.
    pub fn parse(options: &str) -> std::result::Result<Rights, String> {
        let mut rights = Rights::default();
        let mut in_roots = false;
        for item in options.split(',').map(str::trim) {
            match item {
                "ro" => rights.read_only = true,
                "rw" => rights.read_only = false,
                _ => {
                    let name = match item.strip_prefix("roots=") {
                        Some(first) => {
                            in_roots = true;
                            first
                        }
                        None if in_roots => item,
                        None => {
                            return Err(format!("unknown option {item:?} (ro, rw, roots=NAME,...)"))
                        }
                    };
                    if name.is_empty() || name.contains(['/', ' ']) {
                        return Err(format!("{item:?}: a root name, without / or blanks"));
                    }
                    rights
                        .roots
                        .get_or_insert_with(Vec::new)
                        .push(name.to_string());
                }
            }
        }
        Ok(rights)
    }
}

/// Who a connection authenticated as, and what it may do: what the audit log names and the
/// faces enforce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Names the credential without revealing it: `key SHA256:...`, `token 0123abcd...`
    /// (its identifier, `crate::secure::token_id`) or `anonymous`.
    pub id: String,
    /// What it may do.
    pub rights: Rights,
}

impl Principal {
    /// A client without a credential on a server that lets anonymous clients in (reading
    /// only unless `write`).
    pub fn anonymous(write: bool) -> Principal {
        Principal {
            id: "anonymous".into(),
            rights: Rights {
                roots: None,
                read_only: !write,
                scope: None,
            },
        }
    }

    /// Whether this is an anonymous client (no credential).
    pub fn is_anonymous(&self) -> bool {
        self.id == "anonymous"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_covers_its_path_or_tree_only() {
        let file = Scope {
            grant: 1,
            path: "d/x".into(),
            tree: false,
        };
        assert!(file.covers("d/x") && !file.covers("d/x/y") && !file.covers("d/y"));
        assert!(!file.covers("d/xy") && !file.covers("d") && !file.covers("e/x"));
        let tree = Scope { tree: true, ..file };
        assert!(tree.covers("d/x") && tree.covers("d/x/y/z") && tree.covers("d/x/"));
        assert!(!tree.covers("d/xy") && !tree.covers("d/y"));
        for sneaky in ["d/x/../y", "d/x/./y", "d/x//y", "d/x/..", "/d/x"] {
            assert!(!tree.covers(sneaky), "{sneaky}");
        }
    }
}
