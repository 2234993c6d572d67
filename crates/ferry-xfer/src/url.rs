//! Where a `ferry cp` argument points: a local path, or a server and a path on it.
//!
//! Accepted forms:
//! - `ferry://host[:port]/root/path` — the driver comes from `--driver` (default `tcp`);
//!   with `ofi+shm` the host is the shm name;
//! - `tcp://host:port/root/path`, `ofi+tcp://host:port/root/path`, `ofi+shm://name/root/path`;
//! - `host:root/path` — scp-like shorthand, default port and driver;
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
            return Ok(Location::Remote(Remote {
                addr: host_port(driver, host)?,
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
            parse("./a:b", "tcp").unwrap(),
            Location::Local("./a:b".into())
        );
        assert_eq!(
            parse("/tmp/a", "tcp").unwrap(),
            Location::Local("/tmp/a".into())
        );
        assert!(parse("http://x/y", "tcp").is_err());
        assert!(parse("x", "udp").is_err());
    }
}
