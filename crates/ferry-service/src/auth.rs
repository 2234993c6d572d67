//! Authentication: who may use a server's services (`[auth]` of its config). One check for
//! every service, so a daemon hosting several has one set of tokens; failed attempts are
//! counted and locked out by [`crate::admit::Admission`].

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Kind, Result};

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
    /// Files holding more accepted tokens, one per line ([`read_token_file`]), so that no
    /// secret needs to be on a command line or in a config others may read.
    #[serde(default)]
    pub token_files: Vec<PathBuf>,
}

impl AuthConfig {
    /// Adds the tokens of every token file to the accepted ones, and says what is unsafe
    /// about the tokens ([`weak_token_warning`]). A token file others may read is refused
    /// ([`crate::secure::identity::check_private`]), as ssh refuses such keys.
    pub fn load_token_files(&mut self) -> Result<Vec<String>> {
        let mut warnings = Vec::new();
        for f in &self.token_files {
            crate::secure::identity::check_private(f)?;
            self.tokens.extend(read_token_file(f)?);
        }
        warnings.extend(self.tokens.iter().filter_map(|t| weak_token_warning(t)));
        warnings.dedup();
        Ok(warnings)
    }

    /// Whether `token` gets in: any token when anonymous clients are accepted, else one of
    /// the configured tokens. Every configured token is compared, each in time independent
    /// of where it differs, so the answer's timing tells nothing about them.
    pub fn accepts(&self, token: &str) -> bool {
        let mut ok = self.anonymous;
        for t in &self.tokens {
            ok |= ct_eq(t.as_bytes(), token.as_bytes());
        }
        ok
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
}

/// The tokens of a token file: one per line, surrounding blanks trimmed; empty lines and
/// lines starting with `#` are skipped.
pub fn read_token_file(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("token file {}", path.display()), &e))?;
    let tokens: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
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
            anonymous: false,
            token_files: Vec::new(),
        };
        assert!(a.accepts("s3cret") && a.accepts("other"));
        assert!(!a.accepts("s3cre") && !a.accepts("s3cret!") && !a.accepts(""));
        let anon = AuthConfig {
            anonymous: true,
            ..a
        };
        assert!(anon.accepts("") && anon.accepts("anything"));
        assert!(ct_eq(b"", b"") && !ct_eq(b"a", b"b"));
    }

    #[test]
    fn token_files_warnings_and_new_tokens() {
        let dir = std::env::temp_dir().join(format!("ferry-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("tokens");
        std::fs::write(&f, "# ours\n\n  first-token-0123456789  \nsecond\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            read_token_file(&f).unwrap(),
            vec!["first-token-0123456789".to_string(), "second".to_string()]
        );
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
