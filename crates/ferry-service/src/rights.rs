//! What a credential may do (a token's or a key's options): which roots it sees and
//! whether it may write there. Its own module so that the authorized-keys reader
//! ([`crate::keys`]) and the credential check ([`crate::auth`]) both use it without
//! importing each other.

/// What one credential may do: which roots it sees, and whether it may write there.
/// Enforced where a face resolves a path ([`crate::roots::Roots::permit`]), on top of the
/// roots' own read-only setting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rights {
    /// The roots it may use (`None`: every root); any other is "no root named ...".
    pub roots: Option<Vec<String>>,
    /// Reading only: uploads, removals and new directories are refused.
    pub read_only: bool,
}

impl Rights {
    /// Every right.
    pub const ALL: Rights = Rights {
        roots: None,
        read_only: false,
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
