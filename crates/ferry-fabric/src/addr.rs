//! Fabric addresses: `tcp://host:port`, `ofi+tcp://host:port`, `ofi+shm://name`, `ofi+<provider>://...`.

use std::fmt;
use std::str::FromStr;

use crate::error::FabricError;

/// Which driver an address selects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// ferry's native TCP driver.
    Tcp,
    /// libfabric, with the named provider (`tcp`, `shm`, `verbs`, `efa`, `tcp;ofi_rxm`, ...).
    Ofi(String),
}

impl Scheme {
    /// Whether a process may open a connection of this driver while its other connections
    /// of the driver move data. Not on libfabric: with 1.17's tcp;ofi_rxm a domain opened
    /// then was seen to break a busy connection of the same process (the provider defects
    /// in the ofi driver's documentation), so a caller opening several connections to one
    /// peer opens them all before data moves.
    pub fn connects_beside_busy_ones(&self) -> bool {
        matches!(self, Scheme::Tcp)
    }
}

/// A parsed endpoint address.
///
/// `host` is a host name or IP literal for network providers and an arbitrary name for `shm`;
/// `port` is absent for providers addressed by name. IPv6 literals are written in brackets.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    /// Driver selection.
    pub scheme: Scheme,
    /// Host, IP literal or endpoint name.
    pub host: String,
    /// Port, where the provider uses one.
    pub port: Option<u16>,
}

impl Address {
    /// `host:port` (or just `host`), bracketing IPv6 literals.
    pub fn host_port(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match self.port {
            Some(p) => format!("{host}:{p}"),
            None => host,
        }
    }

    /// The same address with another port.
    pub fn with_port(&self, port: u16) -> Self {
        Self {
            port: Some(port),
            ..self.clone()
        }
    }

    /// The driver's short name as used in tables: `tcp`, `ofi+shm`, ...
    pub fn driver_name(&self) -> String {
        match &self.scheme {
            Scheme::Tcp => "tcp".into(),
            Scheme::Ofi(p) => format!("ofi+{p}"),
        }
    }
}

impl FromStr for Address {
    type Err = FabricError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| FabricError::BadAddress {
            addr: s.to_string(),
            why: why.to_string(),
        };
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| bad("expected SCHEME://..., e.g. tcp://127.0.0.1:7000"))?;
        let scheme = match scheme {
            "tcp" => Scheme::Tcp,
            other => match other.strip_prefix("ofi+") {
                Some(p) if !p.is_empty() => Scheme::Ofi(p.to_string()),
                _ => return Err(bad("scheme must be tcp or ofi+<provider>")),
            },
        };
        let rest = rest.trim_end_matches('/');
        if rest.is_empty() {
            return Err(bad("missing host or name"));
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
            match after.strip_prefix(':') {
                Some(p) => (h.to_string(), Some(p)),
                None if after.is_empty() => (h.to_string(), None),
                None => return Err(bad("junk after ']'")),
            }
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (rest.to_string(), None),
            }
        };
        let port = port
            .map(|p| p.parse::<u16>().map_err(|_| bad("port must be 0..=65535")))
            .transpose()?;
        if host.is_empty() {
            return Err(bad("missing host or name"));
        }
        if scheme == Scheme::Tcp && port.is_none() {
            return Err(bad("tcp addresses need a port"));
        }
        Ok(Self { scheme, host, port })
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.driver_name(), self.host_port())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kernel_tcp_connects_beside_busy_connections() {
        let scheme = |a: &str| a.parse::<Address>().unwrap().scheme;
        assert!(scheme("tcp://127.0.0.1:7370").connects_beside_busy_ones());
        for ofi in [
            "ofi+tcp://127.0.0.1:7370",
            "ofi+shm://ferry",
            "ofi+verbs://h:1",
        ] {
            assert!(!scheme(ofi).connects_beside_busy_ones(), "{ofi}");
        }
    }

    #[test]
    fn parses_every_form() {
        let a: Address = "tcp://127.0.0.1:7000".parse().unwrap();
        assert_eq!(
            (a.scheme, a.host.as_str(), a.port),
            (Scheme::Tcp, "127.0.0.1", Some(7000))
        );
        let a: Address = "ofi+shm://ferry-srv".parse().unwrap();
        assert_eq!(a.scheme, Scheme::Ofi("shm".into()));
        assert_eq!(a.port, None);
        let a: Address = "ofi+verbs://[fe80::1]:7000".parse().unwrap();
        assert_eq!((a.host.as_str(), a.port), ("fe80::1", Some(7000)));
        assert_eq!(a.to_string(), "ofi+verbs://[fe80::1]:7000");
        let a: Address = "ofi+tcp;ofi_rxm://127.0.0.1:1".parse().unwrap();
        assert_eq!(a.scheme, Scheme::Ofi("tcp;ofi_rxm".into()));
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "",
            "tcp:/x",
            "udp://h:1",
            "ofi+://h",
            "tcp://h",
            "tcp://h:99999",
            "tcp://:1",
            "ofi+shm://[x",
        ] {
            assert!(s.parse::<Address>().is_err(), "{s} should not parse");
        }
    }
}
