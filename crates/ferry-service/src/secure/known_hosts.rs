//! The client's known-hosts file, ssh-like: one `HOST:PORT FINGERPRINT` a line (`#` starts a
//! comment). A server seen for the first time is pinned (unless strict); a changed key is
//! refused loudly.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Kind, Result};

/// The known-hosts file a client uses when none is given: `$FERRY_KNOWN_HOSTS`, else
/// `$XDG_CONFIG_HOME/ferry/known_hosts` (`~/.config/ferry/known_hosts`).
pub fn default_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FERRY_KNOWN_HOSTS").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    config_dir().join("known_hosts")
}

/// A client's ferry configuration directory: `$XDG_CONFIG_HOME/ferry`, else
/// `~/.config/ferry`.
pub fn config_dir() -> PathBuf {
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into())).join(".config")
        });
    config.join("ferry")
}

/// The name a server has in the known-hosts file: its address without the driver
/// (`host:port`, or an `ofi+shm` name), so one server reached by several drivers is one host.
pub fn host_key(addr: &str) -> String {
    addr.split_once("://")
        .map_or(addr, |(_, rest)| rest)
        .to_string()
}

/// What the known-hosts file says of a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    /// Not in it.
    Unknown,
    /// In it with this fingerprint, on this line (1-based).
    Pinned(String, usize),
}

/// Looks `host` up in the file at `path` (a missing file knows no host).
pub fn lookup(path: &Path, host: &str) -> Result<Known> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Known::Unknown),
        Err(e) => return Err(Error::io(format!("known hosts {}", path.display()), &e)),
    };
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        if let (Some(h), Some(fp)) = (words.next(), words.next()) {
            if h == host {
                return Ok(Known::Pinned(fp.to_string(), n + 1));
            }
        }
    }
    Ok(Known::Unknown)
}

/// Adds `host` with `fingerprint` to the file at `path` (made, with its directory, if
/// missing), in one append so that clients pinning at once do not mix their lines.
pub fn remember(path: &Path, host: &str, fingerprint: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("known hosts directory {}", dir.display()), &e))?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(format!("{host} {fingerprint}\n").as_bytes()))
        .map_err(|e| Error::io(format!("known hosts {}", path.display()), &e))
}

/// The refusal of a server whose key is not the one pinned: both fingerprints and the line
/// to remove, as ssh says it.
pub fn changed(host: &str, pinned: &str, offered: &str, path: &Path, line: usize) -> Error {
    Error::new(
        Kind::Auth,
        format!(
            "THE SERVER'S KEY HAS CHANGED: {host} presented {offered}, but {} line {line} pins {pinned}. \
             Someone may be intercepting the connection (man in the middle), or the server's key was replaced. \
             If you know it was replaced, remove line {line} from {} (sed -i '{line}d' {}) and connect again",
            path.display(),
            path.display(),
            path.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_lookup_and_hosts() {
        let f = std::env::temp_dir().join(format!("ferry-kh-{}/known_hosts", std::process::id()));
        let _ = std::fs::remove_file(&f);
        assert_eq!(lookup(&f, "h:1").unwrap(), Known::Unknown);
        remember(&f, "h:1", "SHA256:aa").unwrap();
        remember(&f, "h:2", "SHA256:bb").unwrap();
        assert_eq!(
            lookup(&f, "h:2").unwrap(),
            Known::Pinned("SHA256:bb".into(), 2)
        );
        assert_eq!(host_key("ofi+tcp://127.0.0.1:7"), "127.0.0.1:7");
        assert_eq!(host_key("ofi+shm://name"), "name");
        let e = changed("h:1", "SHA256:aa", "SHA256:cc", &f, 1);
        assert!(
            e.msg.contains("SHA256:aa") && e.msg.contains("SHA256:cc") && e.msg.contains("'1d'")
        );
        let _ = std::fs::remove_dir_all(f.parent().unwrap());
    }
}
