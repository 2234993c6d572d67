//! Authentication: who may use a server's services (`[auth]` of its config), and what each
//! credential may do there ([`Rights`]). One check for every service, so a daemon hosting
//! several has one set of tokens and keys; failed attempts are counted and locked out by
//! [`crate::admit::Admission`].

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Kind, Result};
pub use crate::rights::{Principal, Rights, Scope};

/// Tokens shorter than this draw a warning: a guessable secret protects nothing.
pub const MIN_TOKEN_LEN: usize = 16;

/// Who may connect.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Accepted tokens.
    #[serde(default)]
    pub tokens: Vec<String>,
    /// Accept clients without a token.
    #[serde(default)]
    pub anonymous: bool,
    /// Let anonymous clients write (upload, remove, make directories); without it they
    /// only read.
    #[serde(default)]
    pub anonymous_write: bool,
    /// Files holding more accepted tokens, one per line ([`read_token_file`]), so that no
    /// secret needs to be on a command line or in a config others may read.
    #[serde(default)]
    pub token_files: Vec<PathBuf>,
    /// The authorized-keys file: the client public keys accepted, one per line with their
    /// rights ([`crate::keys::read_authorized_keys`]).
    #[serde(default)]
    pub authorized_keys: Option<PathBuf>,
    /// The rights of tokens whose token-file line limits them (a token not in it has every
    /// right).
    #[serde(skip)]
    pub token_rights: HashMap<String, Rights>,
    /// The keys of the authorized-keys file, once loaded ([`AuthConfig::load_token_files`]).
    #[serde(skip)]
    pub keys: Vec<crate::keys::AuthorizedKey>,
    /// The grants this server minted and not yet dropped ([`crate::grants`]): shared by
    /// every clone, so the floor that checks them and the face that mints them agree.
    #[serde(skip)]
    pub grants: crate::grants::Grants,
}

impl Principal {
    /// The holder of `token`, with the rights its token-file line gives.
    pub fn token(auth: &AuthConfig, token: &str) -> Principal {
        Principal {
            id: token_label(token),
            rights: auth.token_rights.get(token).cloned().unwrap_or(Rights::ALL),
        }
    }
}

/// How logs and the audit name a token: `token` and its identifier in hex.
pub fn token_label(token: &str) -> String {
    let id: String = crate::secure::token_id(token)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("token {id}")
}

impl AuthConfig {
    /// Adds the tokens of every token file to the accepted ones, and says what is unsafe
    /// about the tokens ([`weak_token_warning`]). A token file others may read is refused
    /// ([`crate::secure::identity::check_private`]), as ssh refuses such keys.
    /// The authorized-keys file is read too.
    pub fn load_token_files(&mut self) -> Result<Vec<String>> {
        let mut warnings = Vec::new();
        for f in &self.token_files {
            crate::secure::identity::check_private(f)?;
            for (token, rights) in read_token_file(f)? {
                if let Some(r) = rights {
                    self.token_rights.insert(token.clone(), r);
                }
                self.tokens.push(token);
            }
        }
        if let Some(f) = &self.authorized_keys {
            self.keys = crate::keys::read_authorized_keys(f)?;
        }
        warnings.extend(self.tokens.iter().filter_map(|t| weak_token_warning(t)));
        warnings.dedup();
        Ok(warnings)
    }

    /// Who `token` gets in as: one of the configured tokens' holder, else an anonymous
    /// client when those are accepted. Every configured token is compared, each in time
    /// independent of where it differs, so the answer's timing tells nothing about them.
    pub fn accepts(&self, token: &str) -> Option<Principal> {
        let mut found = false;
        for t in &self.tokens {
            found |= ct_eq(t.as_bytes(), token.as_bytes());
        }
        if found {
            Some(Principal::token(self, token))
        } else {
            self.anonymous
                .then(|| Principal::anonymous(self.anonymous_write))
        }
    }
}

impl AuthConfig {
    /// The token a proof ([`crate::secure::prove`]) was made with, when it is one of the
    /// configured tokens: every token's identifier and HMAC are computed and compared, each
    /// in time independent of where it differs.
    pub fn accepts_proof(&self, proof: &([u8; 8], [u8; 32]), binding: &[u8; 32]) -> Option<String> {
        let mut found = None;
        for t in &self.tokens {
            let id_ok = ct_eq(&crate::secure::token_id(t), &proof.0);
            let mac_ok = ct_eq(&crate::secure::prove(t, binding), &proof.1);
            if id_ok & mac_ok {
                found = Some(t.clone());
            }
        }
        found
    }

    /// The holder of the authorized key `key` when `signature` is its signature of the
    /// connection's exporter value `binding` ([`crate::keys::verify`]), or of a live grant
    /// whose key it is ([`crate::grants::Grants::accepts`]).
    pub fn accepts_key(
        &self,
        key: &[u8; 32],
        signature: &[u8; 64],
        binding: &[u8; 32],
    ) -> Option<Principal> {
        let Some(k) = self.keys.iter().find(|k| &k.key == key) else {
            // Not an authorized key: perhaps a grant's, which is proven the same way.
            return self.grants.accepts(key, signature, binding);
        };
        crate::keys::verify(key, binding, signature).then(|| Principal {
            id: format!("key {}", crate::keys::fingerprint(key)),
            rights: k.rights.clone(),
        })
    }
}

/// The tokens of a token file, each with the rights its line gives: one per line,
/// surrounding blanks trimmed; empty lines and lines starting with `#` are skipped. A line
/// may start with options and a blank, as an authorized-keys line ([`Rights::parse`]):
/// `roots=data,ro TOKEN`; a line of one word is a token with every right, as before.
pub fn read_token_file(path: &Path) -> Result<Vec<(String, Option<Rights>)>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("token file {}", path.display()), &e))?;
    let mut tokens = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let entry = match line.split_once(char::is_whitespace) {
            Some((options, token)) => {
                let rights = Rights::parse(options).map_err(|e| {
                    Error::new(
                        Kind::Usage,
                        format!("token file {} line {}: {e}", path.display(), n + 1),
                    )
                })?;
                (token.trim().to_string(), Some(rights))
            }
            None => (line.to_string(), None),
        };
        tokens.push(entry);
    }
    if tokens.is_empty() {
        return Err(Error::new(
            Kind::Usage,
            format!("token file {}: no token in it", path.display()),
        ));
    }
    Ok(tokens)
}

/// What is wrong with a file holding secrets, if anything: readable or writable by anyone
/// but its owner.
pub fn secret_file_warning(path: &Path) -> Option<String> {
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "{} holds secrets but others may read it (mode {mode:03o}): chmod 600 {}",
            path.display(),
            path.display()
        )
    })
}

/// What is wrong with a token, if anything: too short to resist guessing.
pub fn weak_token_warning(token: &str) -> Option<String> {
    (token.len() < MIN_TOKEN_LEN).then(|| {
        format!(
            "a token of {} characters is easy to guess: use at least {MIN_TOKEN_LEN} (`ferry token new` makes one)",
            token.len()
        )
    })
}

/// A fresh random token: 24 bytes from the kernel's generator, as 48 hex digits.
pub fn new_token() -> Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Error::io("read /dev/urandom", &e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Compares two secrets in time independent of where they differ.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_anonymous() {
        let a = AuthConfig {
            tokens: vec!["s3cret".into(), "other".into()],
            ..AuthConfig::default()
        };
        assert_eq!(a.accepts("s3cret").unwrap().rights, Rights::ALL);
        assert!(a.accepts("other").is_some());
        assert!(a.accepts("s3cre").is_none() && a.accepts("s3cret!").is_none());
        assert!(a.accepts("").is_none());
        let anon = AuthConfig {
            anonymous: true,
            ..a.clone()
        };
        assert_eq!(anon.accepts("").unwrap(), Principal::anonymous(false));
        assert!(anon.accepts("anything").unwrap().rights.read_only);
        assert!(!anon.accepts("s3cret").unwrap().rights.read_only);
        let writers = AuthConfig {
            anonymous_write: true,
            ..anon
        };
        assert!(!writers.accepts("").unwrap().rights.read_only);
        assert!(ct_eq(b"", b"") && !ct_eq(b"a", b"b"));
    }

    #[test]
    fn rights_options() {
        let r = Rights::parse("roots=data,ro").unwrap();
        assert_eq!(r.roots, Some(vec!["data".to_string()]));
        assert!(r.read_only && r.grants("data") && !r.grants("other"));
        let r = Rights::parse("rw,roots=a,b").unwrap();
        assert_eq!(r.roots, Some(vec!["a".to_string(), "b".to_string()]));
        assert!(!r.read_only);
        assert!(Rights::parse("ro").unwrap().grants("anything"));
        assert!(Rights::parse("a").is_err());
        assert!(Rights::parse("roots=").is_err());
        assert!(Rights::parse("roots=a/b").is_err());
    }

    #[test]
    fn token_files_warnings_and_new_tokens() {
        let dir = std::env::temp_dir().join(format!("ferry-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("tokens");
        std::fs::write(
            &f,
            "# ours\n\n  first-token-0123456789  \nsecond\nroots=a,b,ro  third\n",
        )
        .unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let limited = Rights {
            roots: Some(vec!["a".into(), "b".into()]),
            read_only: true,
            scope: None,
        };
        assert_eq!(
            read_token_file(&f).unwrap(),
            vec![
                ("first-token-0123456789".to_string(), None),
                ("second".to_string(), None),
                ("third".to_string(), Some(limited.clone())),
            ]
        );
        let mut auth = AuthConfig {
            token_files: vec![f.clone()],
            ..AuthConfig::default()
        };
        auth.load_token_files().unwrap();
        assert_eq!(auth.accepts("third").unwrap().rights, limited);
        assert_eq!(auth.accepts("second").unwrap().rights, Rights::ALL);
        assert!(auth.accepts("third").unwrap().id.starts_with("token "));
        assert!(!auth.accepts("third").unwrap().id.contains("third"));
        std::fs::write(&f, "rx third\n").unwrap();
        assert!(read_token_file(&f).is_err(), "an unknown option is refused");
        assert_eq!(secret_file_warning(&f), None);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(secret_file_warning(&f).unwrap().contains("mode 644"));
        std::fs::write(&f, "# nothing\n").unwrap();
        assert!(read_token_file(&f).is_err());
        assert!(read_token_file(&dir.join("absent")).is_err());
        assert!(weak_token_warning("second").is_some());
        assert!(weak_token_warning("first-token-0123456789").is_none());
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 48);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()) && a != b);
        assert!(weak_token_warning(&a).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
