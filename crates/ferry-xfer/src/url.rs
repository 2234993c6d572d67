//! Where a `ferry cp` argument points: a local path, or a server and a path on it.
//!
//! Accepted forms:
//! - `ferry://host[:port]/root/path` — the driver comes from `--driver` (default `tcp`);
//!   with `ofi+shm` the host is the shm name;
//! - `tcp://host:port/root/path`, `ofi+tcp://host:port/root/path`, `ofi+shm://name/root/path`;
//! - `host:root/path` — scp-like shorthand, default port and driver; `host:port:root/path`
//!   names a port;
//! - `zero:SIZE` (a source of SIZE zero bytes) and `null:` or `/dev/null` (a sink that
//!   discards), memory-to-memory mode: no file is read or written (a host named `zero` or
//!   `null` needs the `ferry://` form);
//! - anything else is a local path (write `./a:b` for a local name with a colon).

use crate::error::{Kind, Result, XferError};

/// A path on a `ferry serve`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// The fabric address to connect to, e.g. `tcp://host:7370` or `ofi+shm://name`.
    pub addr: String,
    /// `root/relative/path` on the server ("" for the list of roots).
    pub path: String,
}

/// A parsed `ferry cp` argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A path on this host.
    Local(std::path::PathBuf),
    /// A path on a server.
    Remote(Remote),
    /// `zero:SIZE`: SIZE zero bytes, no file read (memory-to-memory mode; a source only).
    Zero(u64),
    /// `null:` or `/dev/null`: data received is checked and discarded (a sink only).
    Null,
}

const DRIVERS: [&str; 3] = ["tcp", "ofi+tcp", "ofi+shm"];

fn host_port(driver: &str, authority: &str) -> Result<String> {
    if driver == "ofi+shm" {
        if authority.is_empty() {
            return Err(XferError::new(
                Kind::Usage,
                "ofi+shm needs a name: ofi+shm://NAME/root/path",
            ));
        }
        return Ok(format!("ofi+shm://{authority}"));
    }
    let hp = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_string()
    } else if authority.is_empty() {
        return Err(XferError::new(Kind::Usage, "missing host"));
    } else {
        format!("{authority}:{}", crate::DEFAULT_PORT)
    };
    Ok(format!("{driver}://{hp}"))
}

/// Parses `arg`; `driver` (tcp, ofi+tcp, ofi+shm) applies to `ferry://` and `host:path`.
pub fn parse(arg: &str, driver: &str) -> Result<Location> {
    if !DRIVERS.contains(&driver) {
        return Err(XferError::new(
            Kind::Usage,
            format!("unknown driver {driver:?}: use tcp, ofi+tcp or ofi+shm"),
        ));
    }
    if arg == "null:" || arg == "/dev/null" {
        return Ok(Location::Null);
    }
    if let Some(size) = arg.strip_prefix("zero:") {
        return crate::mem::parse_size(size).map(Location::Zero).ok_or_else(|| {
            XferError::new(
                Kind::Usage,
                format!("{arg}: write zero:SIZE with SIZE in bytes or with K, M, G, T (e.g. zero:4G)"),
            )
        });
    }
    if let Some((scheme, rest)) = arg.split_once("://") {
        let drv = match scheme {
            "ferry" => driver,
            s if DRIVERS.contains(&s) => s,
            s => {
                return Err(XferError::new(
                    Kind::Usage,
                    format!(
                        "unknown scheme {s}://: use ferry://, tcp://, ofi+tcp:// or ofi+shm://"
                    ),
                ))
            }
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        return Ok(Location::Remote(Remote {
            addr: host_port(drv, authority)?,
            path: path.trim_start_matches('/').to_string(),
        }));
    }
    if let Some((host, path)) = arg.split_once(':') {
        if !host.is_empty() && !host.contains('/') && !arg.starts_with('.') {
            // HOST:PORT:PATH: a port between two colons (no root name is all digits
            // followed by a colon, so nothing else is taken away).
            let (authority, path) = match path.split_once(':') {
                Some((port, rest)) if port.parse::<u16>().is_ok() => {
                    (format!("{host}:{port}"), rest)
                }
                _ => (host.to_string(), path),
            };
            return Ok(Location::Remote(Remote {
                addr: host_port(driver, &authority)?,
                path: path.trim_start_matches('/').to_string(),
            }));
        }
    }
    Ok(Location::Local(arg.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(addr: &str, path: &str) -> Location {
        Location::Remote(Remote {
            addr: addr.into(),
            path: path.into(),
        })
    }

    #[test]
    fn forms() {
        assert_eq!(
            parse("ferry://h:9/d/x", "tcp").unwrap(),
            remote("tcp://h:9", "d/x")
        );
        assert_eq!(
            parse("ferry://h/d/x", "ofi+tcp").unwrap(),
            remote("ofi+tcp://h:7370", "d/x")
        );
        assert_eq!(
            parse("ofi+shm://n/d", "tcp").unwrap(),
            remote("ofi+shm://n", "d")
        );
        assert_eq!(
            parse("h:d/x", "tcp").unwrap(),
            remote("tcp://h:7370", "d/x")
        );
        assert_eq!(
            parse("h:7371:d/x", "ofi+tcp").unwrap(),
            remote("ofi+tcp://h:7371", "d/x")
        );
        assert_eq!(
            parse("h:d/x:y", "tcp").unwrap(),
            remote("tcp://h:7370", "d/x:y")
        );
        assert_eq!(
            parse("./a:b", "tcp").unwrap(),
            Location::Local("./a:b".into())
        );
        assert_eq!(
            parse("/tmp/a", "tcp").unwrap(),
            Location::Local("/tmp/a".into())
        );
        assert_eq!(parse("zero:4G", "tcp").unwrap(), Location::Zero(4 << 30));
        assert_eq!(parse("null:", "tcp").unwrap(), Location::Null);
        assert_eq!(parse("/dev/null", "tcp").unwrap(), Location::Null);
        assert!(parse("zero:lots", "tcp").is_err());
        assert!(parse("http://x/y", "tcp").is_err());
        assert!(parse("x", "udp").is_err());
    }
}
