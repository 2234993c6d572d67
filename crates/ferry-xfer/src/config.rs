//! `ferry serve` configuration (TOML).
//!
//! ```toml
//! listen = ["tcp://0.0.0.0:7370"]    # default; ofi+tcp://host:port and ofi+shm://name work too;
//!                                    # one address or a list, each accepted on its own thread
//! block_size = 4194304               # staging block, bytes (default 4 MiB)
//! ring = 8                           # staging blocks in flight per connection (default 8)
//! third_party = ["tcp://dtn2:7370"]  # servers this one may send third-party copies to ("*": any)
//! mem = false                        # true: export the virtual root `mem` (zero/SIZE, null)
//! direct = false                     # true: O_DIRECT reads and writes (large files on disks: writes anyway)
//! checksum_cache = true              # false: no user.ferry.blake3 attribute (docs/xfer.md)
//! keep_special_bits = false          # true: uploads keep setuid, setgid and sticky bits
//! audit_log = "/var/log/ferry/audit.jsonl"  # one JSON line per request (default: a line per
//!                                    # transfer in the server's log)
//!
//! [auth]
//! tokens = ["s3cret-token"]          # clients send one of these (ferry cp --token / FERRY_TOKEN)
//! token_files = ["/etc/ferry/tokens"] # more tokens, one a line, each optionally after
//!                                    # options: `roots=data,scratch,ro TOKEN` (mode 600)
//! authorized_keys = "/etc/ferry/authorized_keys"  # client keys (ferry keygen), one a line:
//!                                    # `[roots=NAME,...][,ro] ferry-ed25519 BASE64 COMMENT`
//! anonymous = false                  # true: no token needed (trusted networks only)
//! anonymous_write = false            # true: anonymous clients may write (else read only)
//!
//! [limits]                           # every key optional; defaults shown
//! max_connections = 256              # authenticated connections at once
//! max_per_address = 32               # connections (authenticated or not) per client address
//! max_handshakes = 32                # connections not yet authenticated, at once
//! handshake_timeout = 5.0            # seconds from accept to an accepted HELLO
//! idle_timeout = 120.0               # seconds a session may send nothing between requests
//! memory_budget = 4294967296         # bytes of staging memory for all connections (default: RAM/4)
//! auth_failures = 5                  # failed tokens from one address before it is locked out
//! auth_backoff = 60.0                # seconds the lock-out lasts
//!
//! [[root]]
//! name = "data"                      # clients write ferry://host/data/...
//! path = "/srv/data"
//! ```

use std::path::PathBuf;

use serde::Deserialize;

use crate::error::{Kind, Result, XferError};
pub use ferry_service::admit::LimitsConfig;
pub use ferry_service::auth::AuthConfig;
pub use ferry_service::secure::SecurityConfig;

/// One exported directory.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RootConfig {
    /// The name clients use as the first path component.
    pub name: String,
    /// The directory on this host.
    pub path: PathBuf,
    /// Serve it for reading only: uploads, directories and part files are refused (exit 7).
    #[serde(default)]
    pub read_only: bool,
}

/// The whole server configuration.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Fabric addresses to listen on (in TOML one string or a list), all served alike.
    #[serde(
        default = "default_listen",
        deserialize_with = "ferry_service::config::one_or_more"
    )]
    pub listen: Vec<String>,
    /// Largest staging block (the client may ask for less).
    #[serde(default = "default_block")]
    pub block_size: u32,
    /// Staging blocks in flight per connection and direction.
    #[serde(default = "default_ring")]
    pub ring: usize,
    /// Export the memory-mode root `mem` (`mem/zero/SIZE`, `mem/null`; see [`crate::mem`]).
    #[serde(default)]
    pub mem: bool,
    /// Read and write file data with direct I/O (`O_DIRECT`), bypassing the page cache,
    /// where the filesystem allows it (a warning says when it does not). Without it, files
    /// of 64 MiB or more on a disk filesystem are written with direct I/O anyway
    /// ([`ferry_service::direct::direct_helps`]), and read with it where their pages are
    /// not cached ([`ferry_service::direct::direct_read_helps`]).
    #[serde(default)]
    pub direct: bool,
    /// Keep each file's BLAKE3 (1 MiB and larger) in its `user.ferry.blake3` extended
    /// attribute, so a file served again unchanged is not hashed again
    /// ([`ferry_service::sumcache`]); on by default.
    #[serde(default = "yes")]
    pub checksum_cache: bool,
    /// Keep the setuid, setgid and sticky bits an upload's mode asks for. Off (the
    /// default), they are cleared: a client must not plant a setuid file owned by the
    /// server's user. The server's umask applies either way.
    #[serde(default)]
    pub keep_special_bits: bool,
    /// Authentication.
    #[serde(default)]
    pub auth: AuthConfig,
    /// Exported roots.
    #[serde(default, rename = "root")]
    pub roots: Vec<RootConfig>,
    /// Servers this one may send third-party copies to, as fabric addresses
    /// (`tcp://host:7370`, `ofi+shm://name`), or `"*"` for any. Empty: none.
    #[serde(default)]
    pub third_party: Vec<String>,
    /// Connection, memory, idle and authentication limits.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// TLS: where the server's identity is kept, whether clear clients are let in
    /// (`[security]`, docs/security.md).
    #[serde(default)]
    pub security: SecurityConfig,
    /// The audit log: one JSON line per client request ([`ferry_service::audit`]); `None`:
    /// a line per transfer in the server's log.
    #[serde(default)]
    pub audit_log: Option<PathBuf>,
}

fn default_listen() -> Vec<String> {
    vec![format!("tcp://0.0.0.0:{}", crate::DEFAULT_PORT)]
}

fn default_block() -> u32 {
    crate::DEFAULT_BLOCK
}
fn default_ring() -> usize {
    crate::DEFAULT_RING
}
fn yes() -> bool {
    true
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: default_listen(),
            block_size: default_block(),
            ring: default_ring(),
            mem: false,
            direct: false,
            checksum_cache: true,
            keep_special_bits: false,
            auth: AuthConfig::default(),
            roots: Vec::new(),
            third_party: Vec::new(),
            limits: LimitsConfig::default(),
            security: SecurityConfig::default(),
            audit_log: None,
        }
    }
}

fn bad_config(e: toml::de::Error) -> XferError {
    XferError::new(Kind::Usage, format!("bad server configuration: {e}"))
}

impl ServerConfig {
    /// Parses a TOML configuration.
    pub fn from_toml(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(bad_config)
    }

    /// Takes a parsed TOML configuration: a daemon's file with the tables of its other
    /// faces (`[block]`, `[cio]`) taken out.
    pub fn from_table(table: toml::Table) -> Result<Self> {
        toml::Value::Table(table).try_into().map_err(bad_config)
    }

    /// Checks the configuration makes a usable server: at least one root, unique plain
    /// names, a sane block size, and either tokens or anonymous access.
    pub fn validate(&self) -> Result<()> {
        let usage = |m: String| Err(XferError::new(Kind::Usage, m));
        if self.roots.is_empty() && !self.mem {
            return usage(
                "no roots exported: add a [[root]] name/path to the config or pass --root NAME=PATH (or --mem for memory mode only)"
                    .into(),
            );
        }
        for (i, r) in self.roots.iter().enumerate() {
            if r.name.is_empty() || r.name.contains('/') || r.name == "." || r.name == ".." {
                return usage(format!(
                    "root name {:?} must be one plain path component",
                    r.name
                ));
            }
            if self.mem && r.name == crate::mem::MEM_ROOT {
                return usage(format!(
                    "root name {:?} is taken by memory mode (--mem): pick another name",
                    r.name
                ));
            }
            if self.roots[..i].iter().any(|o| o.name == r.name) {
                return usage(format!("root name {:?} is exported twice", r.name));
            }
        }
        if self.listen.is_empty() {
            return usage("listen = []: give at least one address to listen on".into());
        }
        // The same address twice is left to bind, which says the address is in use; port
        // 0 twice is two ports.
        for a in &self.listen {
            if let Err(e) = a.parse::<ferry_fabric::Address>() {
                return usage(format!("bad listen address {a}: {e}"));
            }
        }
        if !(crate::proto::MIN_BLOCK..=crate::proto::MAX_BLOCK).contains(&self.block_size) {
            return usage(format!(
                "block_size {} outside {}..={}",
                self.block_size,
                crate::proto::MIN_BLOCK,
                crate::proto::MAX_BLOCK
            ));
        }
        if self.ring == 0 || self.ring > 1024 {
            return usage(format!("ring {} outside 1..=1024", self.ring));
        }
        for a in &self.third_party {
            if a != "*" && a.parse::<ferry_fabric::Address>().is_err() {
                return usage(format!(
                    "third_party entry {a:?} is not a fabric address (tcp://HOST:PORT, ofi+tcp://HOST:PORT, ofi+shm://NAME) or \"*\""
                ));
            }
        }
        self.limits.validate()?;
        if self.auth.tokens.is_empty() && self.auth.keys.is_empty() && !self.auth.anonymous {
            return usage(
                "no way to authenticate: add [auth] tokens = [\"...\"] (or --token, --token-file), authorized_keys = \"FILE\" (or --authorized-keys), or allow anonymous access with [auth] anonymous = true (or --anonymous)"
                    .into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let c = ServerConfig::from_toml(
            r#"
listen = "tcp://0.0.0.0:7370"
block_size = 4194304
ring = 8
direct = true
[auth]
tokens = ["s3cret-token"]
anonymous = false
[[root]]
name = "data"
path = "/srv/data"
"#,
        )
        .unwrap();
        assert_eq!(c.roots[0].name, "data");
        assert!(c.direct);
        assert_eq!(c.auth.tokens, vec!["s3cret-token".to_string()]);
        c.validate().unwrap();
        let d = ServerConfig::from_toml("[[root]]\nname='a'\npath='/x'\n").unwrap();
        assert_eq!(d.listen, ["tcp://0.0.0.0:7370"]);
        assert!(!d.direct, "direct I/O is off unless asked for");
        assert!(d.validate().is_err(), "no auth configured must be refused");
        assert!(ServerConfig::from_toml("lisen = 'x'").is_err());
        assert_eq!(d.limits, LimitsConfig::default());
    }

    #[test]
    fn limits_parse_and_are_checked() {
        let base = "[auth]\nanonymous = true\n[[root]]\nname='a'\npath='/x'\n";
        let c = ServerConfig::from_toml(&format!(
            "{base}[limits]\nmax_connections = 4\nidle_timeout = 1.5\nmemory_budget = 1048576\n"
        ))
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.limits.max_connections, 4);
        assert_eq!(c.limits.idle(), std::time::Duration::from_millis(1500));
        assert_eq!(c.limits.budget(), 1 << 20);
        assert_eq!(
            c.limits.max_per_address, 32,
            "unset keys keep their defaults"
        );
        assert!(LimitsConfig::default().budget() >= 1 << 20);
        for bad in [
            "max_connections = 0",
            "idle_timeout = 0",
            "handshake_timeout = -1",
            "auth_failures = 0",
        ] {
            let c = ServerConfig::from_toml(&format!("{base}[limits]\n{bad}\n")).unwrap();
            assert!(c.validate().is_err(), "{bad}");
        }
        assert!(ServerConfig::from_toml(&format!("{base}[limits]\nmax_conns = 1\n")).is_err());
    }

    /// `listen` takes one address (as before) or a list; every entry must be an address.
    #[test]
    fn listen_is_one_address_or_a_list() {
        let base = "[auth]\nanonymous = true\n[[root]]\nname='a'\npath='/x'\n";
        let one = ServerConfig::from_toml(&format!("listen = 'tcp://[::1]:7000'\n{base}")).unwrap();
        assert_eq!(one.listen, ["tcp://[::1]:7000"]);
        one.validate().unwrap();
        let two = ServerConfig::from_toml(&format!(
            "listen = ['tcp://0.0.0.0:7370', 'ofi+shm://ferry']\n{base}"
        ))
        .unwrap();
        assert_eq!(two.listen, ["tcp://0.0.0.0:7370", "ofi+shm://ferry"]);
        two.validate().unwrap();
        for (bad, says) in [
            ("[]", "at least one"),
            ("['tcp://a:1', 'a:1']", "bad listen address"),
        ] {
            let c = ServerConfig::from_toml(&format!("listen = {bad}\n{base}")).unwrap();
            let e = c.validate().unwrap_err();
            assert!(e.msg.contains(says), "{bad}: {}", e.msg);
        }
        assert!(ServerConfig::from_toml(&format!("listen = 7\n{base}")).is_err());
    }

    #[test]
    fn third_party_destinations_must_be_addresses() {
        let base = "[auth]\nanonymous = true\n[[root]]\nname='a'\npath='/x'\n";
        for (list, ok) in [
            ("['tcp://dtn2:7370', 'ofi+shm://n']", true),
            ("['*']", true),
            ("['dtn2:7370']", false),
        ] {
            let c = ServerConfig::from_toml(&format!("third_party = {list}\n{base}")).unwrap();
            assert_eq!(c.validate().is_ok(), ok, "{list}");
        }
    }
}
