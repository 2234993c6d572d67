//! Authentication: who may use a server's services (`[auth]` of its config). One check for
//! every service, so a daemon hosting several has one set of tokens; failed attempts are
//! counted and locked out by [`crate::admit::Admission`].

use serde::Deserialize;

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
}

impl AuthConfig {
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
}
