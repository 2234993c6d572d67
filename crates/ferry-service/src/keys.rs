//! Client key pairs (protocol 1.9): Ed25519 keys made by `ferry keygen`, accepted by a
//! server's authorized-keys file, proven by signing the connection's TLS exporter value
//! (channel binding), so a captured SELECT is useless on any other connection.
//!
//! Files, as ssh's: the private key is PKCS#8 in PEM (`-----BEGIN PRIVATE KEY-----`), mode
//! 0600, refused if others may read it; the public key is one line,
//! `ferry-ed25519 BASE64 COMMENT`, BASE64 being the 32 bytes of the key. An authorized-keys
//! line is a public-key line, optionally after options and a blank
//! (`roots=data,ro ferry-ed25519 AAAA... alice`, [`crate::auth::Rights::parse`]).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use ring::signature::{Ed25519KeyPair, KeyPair as _, UnparsedPublicKey, ED25519};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivatePkcs8KeyDer;

use crate::error::{Error, Kind, Result};
use crate::rights::Rights;

/// The key type word of a public-key line.
pub const KEY_TYPE: &str = "ferry-ed25519";

/// What a client signs ahead of the exporter value: names the purpose, so a signature
/// made for a ferry SELECT means nothing anywhere else.
pub const SIGN_CONTEXT: &[u8] = b"ferry client key proof v1\0";

/// The private key file a client uses when given none (`$XDG_CONFIG_HOME/ferry/id_ed25519`,
/// `~/.config/ferry/id_ed25519`), next to its known hosts.
pub fn default_identity() -> PathBuf {
    crate::secure::known_hosts::config_dir().join("id_ed25519")
}

/// A client's key pair, loaded from its private key file.
pub struct ClientKey {
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientKey({})", fingerprint(&self.public()))
    }
}

impl ClientKey {
    /// Reads a private key file, refusing one others may read
    /// ([`crate::secure::identity::check_private`]).
    pub fn load(path: &Path) -> Result<ClientKey> {
        crate::secure::identity::check_private(path)?;
        let pem = std::fs::read(path).map_err(|e| Error::io(path.display(), &e))?;
        let bad = |why: &str| {
            Error::new(
                Kind::Usage,
                format!(
                    "{}: not a ferry private key ({why}); make one with `ferry keygen`",
                    path.display()
                ),
            )
        };
        let der =
            PrivatePkcs8KeyDer::from_pem_slice(&pem).map_err(|_| bad("no PKCS#8 key in it"))?;
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der())
            .map_err(|_| bad("not an Ed25519 key"))?;
        Ok(ClientKey { pair })
    }

    /// The key pair whose 32-byte secret is `seed` (a grant's: the grants module).
    pub fn from_seed(seed: &[u8; 32]) -> Result<ClientKey> {
        let pair = Ed25519KeyPair::from_seed_unchecked(seed)
            .map_err(|_| Error::new(Kind::Usage, "not an Ed25519 seed"))?;
        Ok(ClientKey { pair })
    }

    /// The public key.
    pub fn public(&self) -> [u8; 32] {
        let mut k = [0u8; 32];
        k.copy_from_slice(self.pair.public_key().as_ref());
        k
    }

    /// The proof for a connection whose exporter value is `binding`: the public key and
    /// its signature of [`SIGN_CONTEXT`] and the binding.
    pub fn prove(&self, binding: &[u8; 32]) -> ([u8; 32], [u8; 64]) {
        let sig = self.pair.sign(&signed(binding));
        let mut s = [0u8; 64];
        s.copy_from_slice(sig.as_ref());
        (self.public(), s)
    }
}

/// The bytes a key signs for a connection whose exporter value is `binding`.
fn signed(binding: &[u8; 32]) -> Vec<u8> {
    [SIGN_CONTEXT, binding.as_slice()].concat()
}

/// Whether `signature` is `key`'s signature for the exporter value `binding`.
pub fn verify(key: &[u8; 32], binding: &[u8; 32], signature: &[u8; 64]) -> bool {
    UnparsedPublicKey::new(&ED25519, key)
        .verify(&signed(binding), signature)
        .is_ok()
}

/// How a key is named in logs, the audit and messages: `SHA256:` and the hex SHA-256 of
/// its 32 bytes (as server fingerprints are written).
pub fn fingerprint(key: &[u8; 32]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, key);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("SHA256:{hex}")
}

/// The public-key line of `key`: `ferry-ed25519 BASE64 COMMENT`.
pub fn public_line(key: &[u8; 32], comment: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(key);
    format!("{KEY_TYPE} {b64} {comment}").trim_end().to_string()
}

/// Makes a key pair: the private key at `path` (mode 0600, never over an existing file)
/// and its public-key line at `path.pub`; returns the public key.
pub fn generate(path: &Path, comment: &str) -> Result<[u8; 32]> {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng)
        .map_err(|_| Error::new(Kind::Io, "make a key pair: no randomness"))?;
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
        .map_err(|_| Error::new(Kind::Io, "make a key pair: unreadable"))?;
    let mut public = [0u8; 32];
    public.copy_from_slice(pair.public_key().as_ref());
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), &e))?;
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref());
    let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END PRIVATE KEY-----\n");
    let exists = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            Error::new(
                Kind::Usage,
                format!(
                    "{} exists: not overwriting a key (give another -f PATH)",
                    path.display()
                ),
            )
        } else {
            Error::io(path.display(), &e)
        }
    };
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(pem.as_bytes()))
        .map_err(exists)?;
    let pub_path = public_path(path);
    std::fs::write(&pub_path, public_line(&public, comment) + "\n")
        .map_err(|e| Error::io(pub_path.display(), &e))?;
    Ok(public)
}

/// Where the public key of the private key `path` goes: `path.pub`.
pub fn public_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".pub");
    PathBuf::from(p)
}

/// One line of an authorized-keys file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorizedKey {
    /// The public key.
    pub key: [u8; 32],
    /// What its holder may do.
    pub rights: Rights,
    /// The line's comment (who it is, for people).
    pub comment: String,
}

/// Parses one authorized-keys line (not blank, not a comment): `[OPTIONS] ferry-ed25519
/// BASE64 [COMMENT]`.
pub fn parse_authorized(line: &str) -> std::result::Result<AuthorizedKey, String> {
    let mut words = line.split_whitespace();
    let first = words.next().ok_or("an empty line")?;
    let (rights, key_type) = if first == KEY_TYPE {
        (Rights::default(), first)
    } else {
        let rights = Rights::parse(first)?;
        (rights, words.next().ok_or("options but no key")?)
    };
    if key_type != KEY_TYPE {
        return Err(format!(
            "key type {key_type:?}: only {KEY_TYPE} keys (ferry keygen)"
        ));
    }
    let b64 = words.next().ok_or("no key after the key type")?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| "the key is not base64".to_string())?;
    let key: [u8; 32] = bytes
        .try_into()
        .map_err(|_| "the key is not 32 bytes".to_string())?;
    let comment = words.collect::<Vec<_>>().join(" ");
    Ok(AuthorizedKey {
        key,
        rights,
        comment,
    })
}

/// The keys of an authorized-keys file: one per line; blank lines and lines starting with
/// `#` are skipped; a line not understood is an error naming it. A file others may write
/// is refused (whoever writes it gets in).
pub fn read_authorized_keys(path: &Path) -> Result<Vec<AuthorizedKey>> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::io(format!("authorized keys {}", path.display()), &e))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(Error::new(
            Kind::Permission,
            format!(
                "{} decides who gets in but others may write it (mode {mode:03o}); refusing it: run chmod 644 {}",
                path.display(),
                path.display()
            ),
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("authorized keys {}", path.display()), &e))?;
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        keys.push(parse_authorized(line).map_err(|e| {
            Error::new(
                Kind::Usage,
                format!("authorized keys {} line {}: {e}", path.display(), n + 1),
            )
        })?);
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generate_load_sign_verify() {
        let dir = std::env::temp_dir().join(format!("ferry-keys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("id_ed25519");
        let public = generate(&path, "alice@host").unwrap();
        assert!(generate(&path, "again").is_err(), "never over a key");
        let line = std::fs::read_to_string(public_path(&path)).unwrap();
        assert!(line.starts_with("ferry-ed25519 ") && line.trim_end().ends_with(" alice@host"));
        let key = ClientKey::load(&path).unwrap();
        assert_eq!(key.public(), public);
        let binding = [7u8; 32];
        let (k, sig) = key.prove(&binding);
        assert!(verify(&k, &binding, &sig));
        assert!(!verify(&k, &[8u8; 32], &sig), "bound to one exporter value");
        let parsed = parse_authorized(&format!("roots=data,ro {}", line.trim())).unwrap();
        assert_eq!(parsed.key, public);
        assert_eq!(parsed.comment, "alice@host");
        assert!(parsed.rights.read_only && parsed.rights.grants("data"));
        assert!(!parsed.rights.grants("other"));
        assert_eq!(
            parse_authorized(line.trim()).unwrap().rights,
            Rights::default()
        );
        assert!(parse_authorized("ssh-ed25519 AAAA x").is_err());
        assert!(parse_authorized("ferry-ed25519 AAAA").is_err());
        assert!(parse_authorized("bogus ferry-ed25519 AAAA").is_err());
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            ClientKey::load(&path).is_err(),
            "a readable private key is refused"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
