//! Grants (protocol 1.9, `docs/security.md`, "Third-party copies"): what a destination
//! server gives a user's client so that a source server may write there on the user's
//! behalf, instead of the user's own token travelling to the source.
//!
//! A client authenticated with its own key or token asks for one (the transfer face's
//! GRANT) for one destination path or tree; the server mints a random 256-bit secret, the
//! seed of an Ed25519 key pair, hands it to the client, and keeps only the public half:
//! nothing on the server can be stolen and replayed. The client passes the seed to the
//! source server inside its sealed SEND_TO; the source proves it to this server exactly as
//! a client key is proven ([`crate::keys`]: a signature of the connection's TLS exporter
//! value), so the secret never crosses the wire, not even inside TLS.
//!
//! A grant is accepted only before it expires (60 s by default), for one session (its
//! first connection claims it; the parallel streams of that session join it), only for
//! writing, only at its path ([`crate::rights::Scope`]), and with no more than the
//! granting credential's own rights. The audit names it and who granted it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ring::rand::{SecureRandom, SystemRandom};

use crate::error::{Error, Kind, Result};
use crate::rights::{Principal, Rights, Scope};

/// A grant's life when the client asks for none.
pub const DEFAULT_TTL: Duration = Duration::from_secs(60);

/// The longest life a grant gets, whatever the client asks.
pub const MAX_TTL: Duration = Duration::from_secs(600);

/// The most grants a server keeps alive at once; more are refused until some expire, so a
/// client cannot fill the server's memory with them.
pub const MAX_LIVE: usize = 4096;

/// One grant, as the server keeps it: no secret, only the public key it was made from.
#[derive(Debug)]
struct Grant {
    /// Its id (the audit's `grant ID`).
    id: u64,
    /// The public key of the pair the handed-out seed makes.
    public: [u8; 32],
    /// Who granted it (its principal's id).
    granter: String,
    /// What its holder may do: the granter's roots, writing only, at the scope.
    rights: Rights,
    /// When it stops being accepted.
    expires: Instant,
    /// Its one session has claimed it ([`Grants::claim`]).
    used: bool,
}

/// A minted grant, as its client gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minted {
    /// Its id.
    pub id: u64,
    /// The secret: the seed of the key pair its holder proves.
    pub seed: [u8; 32],
    /// How long it is accepted from now.
    pub ttl: Duration,
}

/// The live grants of a server, shared by every clone (the floor checks them, the face
/// mints and claims them). Grants are runtime state, not configuration: two stores always
/// compare equal, so configurations still compare by what they say.
#[derive(Clone, Default)]
pub struct Grants {
    live: Arc<Mutex<Vec<Grant>>>,
}

impl std::fmt::Debug for Grants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Grants({} live)", self.lock().len())
    }
}

impl PartialEq for Grants {
    fn eq(&self, _: &Grants) -> bool {
        true
    }
}

impl Eq for Grants {}

impl Grants {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Grant>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Mints a grant for `granter` to write `path` (and beneath it when `tree`) for `ttl`
    /// (at most [`MAX_TTL`]; zero: [`DEFAULT_TTL`]). Refused for a read-only credential, for
    /// a grant (a grant grants nothing), and for a path its credential may not write
    /// (the caller checks the roots, [`crate::roots::Roots::permit`]).
    pub fn mint(
        &self,
        granter: &Principal,
        path: &str,
        tree: bool,
        ttl: Duration,
    ) -> Result<Minted> {
        let refused = |m: String| Err(Error::new(Kind::Auth, m));
        if granter.rights.read_only {
            return refused(format!(
                "{path}: no grant: your credential is read-only on this server"
            ));
        }
        if granter.rights.scope.is_some() {
            return refused("a grant cannot grant".into());
        }
        let path = path.strip_suffix('/').unwrap_or(path).to_string();
        let mut scope = Scope {
            grant: 0,
            path,
            tree,
        };
        if !scope.covers(&scope.path) || !scope.path.contains('/') {
            return Err(Error::new(
                Kind::Usage,
                format!(
                    "{}: a grant names one path under a root (root/path), without . or .. components",
                    scope.path
                ),
            ));
        }
        let ttl = match ttl {
            Duration::ZERO => DEFAULT_TTL,
            t => t.min(MAX_TTL),
        };
        let rng = SystemRandom::new();
        let mut seed = [0u8; 32];
        let mut id = [0u8; 8];
        rng.fill(&mut seed)
            .and_then(|()| rng.fill(&mut id))
            .map_err(|_| Error::new(Kind::Io, "no random bytes for a grant"))?;
        let public = key_of(&seed)?.public();
        let id = u64::from_le_bytes(id);
        scope.grant = id;
        let now = Instant::now();
        let mut live = self.lock();
        live.retain(|g| g.expires > now);
        if live.len() >= MAX_LIVE {
            return Err(Error::new(
                Kind::Connection,
                format!("{MAX_LIVE} grants are alive on this server: try again in a minute"),
            ));
        }
        live.push(Grant {
            id,
            public,
            granter: granter.id.clone(),
            rights: Rights {
                roots: granter.rights.roots.clone(),
                read_only: false,
                scope: Some(scope),
            },
            expires: now + ttl,
            used: false,
        });
        Ok(Minted { id, seed, ttl })
    }

    /// The holder of the live grant whose public key is `key`, when `signature` is its
    /// signature of the connection's exporter value `binding`: named `grant ID of
    /// GRANTER`, with the grant's rights. An expired grant is dropped and refused.
    pub fn accepts(
        &self,
        key: &[u8; 32],
        signature: &[u8; 64],
        binding: &[u8; 32],
    ) -> Option<Principal> {
        let now = Instant::now();
        let mut live = self.lock();
        live.retain(|g| g.expires > now);
        let g = live.iter().find(|g| &g.public == key)?;
        crate::keys::verify(key, binding, signature).then(|| Principal {
            id: label(g.id, &g.granter),
            rights: g.rights.clone(),
        })
    }

    /// Claims grant `id` for the session its holder opens: true the first time only (a
    /// grant is used once; the streams that join that session need no claim).
    pub fn claim(&self, id: u64) -> bool {
        let mut live = self.lock();
        match live.iter_mut().find(|g| g.id == id) {
            Some(g) if !g.used && g.expires > Instant::now() => {
                g.used = true;
                true
            }
            _ => false,
        }
    }
}

/// How the audit and logs name a grant's holder: the grant and who granted it.
pub fn label(id: u64, granter: &str) -> String {
    format!("grant {id:016x} of {granter}")
}

/// The key pair a grant's `seed` makes: what its holder proves ([`crate::keys`]).
pub fn key_of(seed: &[u8; 32]) -> Result<crate::keys::ClientKey> {
    crate::keys::ClientKey::from_seed(seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer() -> Principal {
        Principal {
            id: "key SHA256:ab".into(),
            rights: Rights {
                roots: Some(vec!["d".into()]),
                read_only: false,
                scope: None,
            },
        }
    }

    #[test]
    fn a_grant_is_proven_claimed_once_and_bounded_by_its_granter() {
        let grants = Grants::default();
        let m = grants
            .mint(&writer(), "d/x/", true, Duration::ZERO)
            .unwrap();
        assert_eq!(m.ttl, DEFAULT_TTL);
        let key = key_of(&m.seed).unwrap();
        let binding = [7u8; 32];
        let (public, sig) = key.prove(&binding);
        let p = grants.accepts(&public, &sig, &binding).unwrap();
        assert_eq!(p.id, label(m.id, "key SHA256:ab"));
        assert_eq!(p.rights.roots, Some(vec!["d".to_string()]));
        let scope = p.rights.scope.clone().unwrap();
        assert_eq!(
            (scope.grant, scope.path.as_str(), scope.tree),
            (m.id, "d/x", true)
        );
        // Another connection's binding: the signature proves nothing there.
        assert!(grants.accepts(&public, &sig, &[8u8; 32]).is_none());
        assert!(grants.claim(m.id) && !grants.claim(m.id));
        // No grant from a grant, from a read-only credential, or for a root itself.
        assert!(grants.mint(&p, "d/x/y", false, Duration::ZERO).is_err());
        let ro = Principal {
            rights: Rights {
                read_only: true,
                ..writer().rights
            },
            ..writer()
        };
        assert!(grants.mint(&ro, "d/x", false, Duration::ZERO).is_err());
        assert!(grants.mint(&writer(), "d", false, Duration::ZERO).is_err());
        assert!(grants
            .mint(&writer(), "d/a/../b", false, Duration::ZERO)
            .is_err());
        // An expired grant is refused.
        let short = grants
            .mint(&writer(), "d/y", false, Duration::from_millis(1))
            .unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let (public, sig) = key_of(&short.seed).unwrap().prove(&binding);
        assert!(grants.accepts(&public, &sig, &binding).is_none());
        assert!(!grants.claim(short.id));
    }
}
