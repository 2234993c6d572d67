//! A server's identity: a key pair and its self-signed certificate, made at first start in
//! the server's state directory and kept there (`server.pem`, mode 0600), and the
//! certificate's SHA-256 fingerprint that clients pin.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{Error, Kind, Result};

/// The file in the state directory holding the certificate and its private key (PEM).
pub const IDENTITY_FILE: &str = "server.pem";

/// The name in the certificate (clients pin the fingerprint; they do not check names).
const CERT_NAME: &str = "ferry";

/// The state directory a server uses when none is configured: `$FERRY_STATE_DIR`, else
/// `/var/lib/ferry` for root, else `$XDG_STATE_HOME/ferry` (`~/.local/state/ferry`).
pub fn default_state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FERRY_STATE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if rustix::process::geteuid().is_root() {
        return PathBuf::from("/var/lib/ferry");
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("ferry");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
    PathBuf::from(home).join(".local/state/ferry")
}

/// A server's certificate and key.
pub struct Identity {
    /// The server's certificate (DER): self-signed as made at first start, or one a CA
    /// signed, put in the file by the site.
    pub cert: CertificateDer<'static>,
    /// The certificates after the first in the file: the chain to the site's CA, if any.
    pub chain: Vec<CertificateDer<'static>>,
    /// Its private key.
    pub key: PrivateKeyDer<'static>,
    /// Where it is kept.
    pub path: PathBuf,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        write!(
            f,
            "Identity({}, {})",
            self.path.display(),
            self.fingerprint()
        )
    }
}

impl Identity {
    /// The identity kept in `state_dir`, made there (with the directory, mode 0700) if
    /// there is none yet. A file others may read is refused, as ssh refuses such keys.
    pub fn load_or_create(state_dir: &Path) -> Result<Identity> {
        let path = state_dir.join(IDENTITY_FILE);
        if !path.exists() {
            create(state_dir, &path)?;
        }
        load(&path)
    }

    /// The certificate's fingerprint (what clients pin): `SHA256:` and 64 hex digits.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.cert)
    }
}

/// The fingerprint of a certificate: `SHA256:` and the hex of the SHA-256 of its DER.
pub fn fingerprint(cert: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, cert);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("SHA256:{hex}")
}

/// Whether `s` is a fingerprint as [`fingerprint`] writes it (`sha256:` in any case, hex
/// in any case); the canonical spelling if so.
pub fn parse_fingerprint(s: &str) -> Option<String> {
    let (scheme, hex) = s.trim().split_once(':')?;
    (scheme.eq_ignore_ascii_case("sha256")
        && hex.len() == 64
        && hex.bytes().all(|b| b.is_ascii_hexdigit()))
    .then(|| format!("SHA256:{}", hex.to_ascii_lowercase()))
}

/// Refuses a secret-bearing file (a server key, a token file) that anyone but its owner
/// may read or write, saying the chmod that fixes it.
pub fn check_private(path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path.display(), &e))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(Error::new(
            Kind::Permission,
            format!(
                "{} holds secrets but others may read or write it (mode {mode:03o}); refusing it: run chmod 600 {}",
                path.display(),
                path.display()
            ),
        ));
    }
    Ok(())
}

/// Makes a new key and certificate and writes them to `path` (mode 0600) so that two
/// servers starting at once both end with the same one: written aside, then linked into
/// place, the loser reading the winner's.
fn create(state_dir: &Path, path: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)
        .map_err(|e| Error::io(format!("state directory {}", state_dir.display()), &e))?;
    let made = rcgen::generate_simple_self_signed(vec![CERT_NAME.to_string()])
        .map_err(|e| Error::new(Kind::Io, format!("make the server's key pair: {e}")))?;
    let pem = format!("{}{}", made.cert.pem(), made.key_pair.serialize_pem());
    // Unique to this call: threads of one process may race here too.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let aside = state_dir.join(format!(".{IDENTITY_FILE}.{}.{call}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&aside)
        .and_then(|mut f| {
            f.write_all(pem.as_bytes())?;
            f.sync_all()
        });
    let placed = written.and_then(|()| match std::fs::hard_link(&aside, path) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        r => r,
    });
    let _ = std::fs::remove_file(&aside);
    placed.map_err(|e| Error::io(path.display(), &e))
}

/// Reads the identity kept at `path`.
fn load(path: &Path) -> Result<Identity> {
    check_private(path)?;
    let pem = std::fs::read(path).map_err(|e| Error::io(path.display(), &e))?;
    let bad = |what: &str| {
        Error::new(
            Kind::Usage,
            format!(
                "{}: {what}; move it away and start again for a new identity (clients will see a changed key)",
                path.display()
            ),
        )
    };
    let mut certs = CertificateDer::pem_slice_iter(&pem);
    let cert = certs
        .next()
        .and_then(|c| c.ok())
        .ok_or_else(|| bad("no certificate in it"))?;
    let chain = certs
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| bad("a certificate after the first is unreadable"))?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|_| bad("no private key in it"))?;
    Ok(Identity {
        cert,
        chain,
        key,
        path: path.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_kept_private_and_refused_when_readable() {
        let dir = std::env::temp_dir().join(format!("ferry-identity-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = Identity::load_or_create(&dir).unwrap();
        let b = Identity::load_or_create(&dir).unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint(), "kept, not made again");
        assert_eq!(parse_fingerprint(&a.fingerprint()), Some(a.fingerprint()));
        assert_eq!(parse_fingerprint("SHA256:12"), None);
        let path = dir.join(IDENTITY_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = Identity::load_or_create(&dir).unwrap_err();
        assert!(e.msg.contains("chmod 600"), "{e}");
        assert!(!format!("{a:?}").contains("PRIVATE"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
