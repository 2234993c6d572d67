//! The `[block]` table of `ferry serve`'s configuration:
//!
//! ```toml
//! [block]
//! listen = ["127.0.0.1:10809", "unix:/run/ferry/nbd.sock"]   # default: 127.0.0.1:10809
//! max_connections = 256          # clients in transmission at once
//! max_per_address = 32           # of them from one address
//! max_handshakes = 32            # connections in their handshake at once
//! handshake_timeout = 5.0        # seconds a client has to finish its handshake
//! tls_certificate = "/etc/ferry/nbd-cert.pem"  # offer NBD_OPT_STARTTLS with this
//! tls_key = "/etc/ferry/nbd-key.pem"           # certificate chain and key (PEM)
//!
//! [[block.export]]
//! name = "disk"                  # what clients ask for (nbd://host/disk); the first export
//!                                # is also the default one (an empty name)
//! path = "/srv/images/disk.img"  # a regular file or a block device ...
//! readonly = false               # true: writes are refused (EPERM)
//! direct = false                 # true: O_DIRECT, 4096-byte minimum block
//! description = "scratch disk"   # shown by nbdinfo
//! tls = "require"                # clear clients are refused (NBD_REP_ERR_TLS_REQD);
//!                                # default "allow": TLS when the client starts it
//!
//! [[block.export]]
//! name = "ram"
//! memory = "8GiB"                # ... or memory (sparse, for benchmarks)
//! ```

use std::path::PathBuf;

use serde::Deserialize;

use ferry_service::admit::LimitsConfig;
use ferry_service::config::parse_size;
use ferry_service::error::{Error, Kind, Result};

/// The NBD port (IANA).
pub const DEFAULT_PORT: u16 = 10809;

/// The block service's configuration.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BlockConfig {
    /// Where to listen: `HOST:PORT` (TCP) or `unix:PATH`, one string or a list.
    #[serde(
        default = "default_listen",
        deserialize_with = "ferry_service::config::one_or_more"
    )]
    pub listen: Vec<String>,
    /// The exports.
    #[serde(default, rename = "export")]
    pub exports: Vec<ExportConfig>,
    /// Clients in transmission at once; one more is refused at the end of its handshake.
    #[serde(default = "defaults::max_connections")]
    pub max_connections: usize,
    /// Clients in transmission at once from one address (every Unix-socket client is one).
    #[serde(default = "defaults::max_per_address")]
    pub max_per_address: usize,
    /// Connections in their handshake at once; a newer one past the limit takes the place
    /// of the oldest of the address that holds the most.
    #[serde(default = "defaults::max_handshakes")]
    pub max_handshakes: usize,
    /// Seconds from accepting a connection to the end of its handshake; a slower client
    /// is disconnected.
    #[serde(default = "defaults::handshake_timeout")]
    pub handshake_timeout: f64,
    /// The server's certificate chain (PEM) for `NBD_OPT_STARTTLS`; TLS is offered only
    /// with one (and [`BlockConfig::tls_key`]).
    #[serde(default)]
    pub tls_certificate: Option<PathBuf>,
    /// The private key (PEM) of [`BlockConfig::tls_certificate`].
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// The RMA path: chunks registered and delegated to each session (its credits, the
    /// requests it may have in flight).
    #[serde(default = "defaults::pool_chunks")]
    pub pool_chunks: u16,
    /// The RMA path: bytes per chunk, the largest request (`"1MiB"` or a number of bytes).
    #[serde(default = "defaults::chunk_size", deserialize_with = "size_u32")]
    pub chunk_size: u32,
}

/// The admission defaults: the service floor's (`[limits]` of file transfer).
mod defaults {
    use ferry_service::admit::LimitsConfig;

    pub fn max_connections() -> usize {
        LimitsConfig::default().max_connections
    }
    pub fn max_per_address() -> usize {
        LimitsConfig::default().max_per_address
    }
    pub fn max_handshakes() -> usize {
        LimitsConfig::default().max_handshakes
    }
    pub fn handshake_timeout() -> f64 {
        LimitsConfig::default().handshake_timeout
    }
    /// 16 chunks of 1 MiB: 1 MiB requests at queue depth 16.
    pub fn pool_chunks() -> u16 {
        16
    }
    pub fn chunk_size() -> u32 {
        1 << 20
    }
}

/// One export.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExportConfig {
    /// The name clients ask for.
    pub name: String,
    /// A regular file or block device to export.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Or: export this many bytes of memory (`"8GiB"`, `"512MiB"` or a number of bytes).
    #[serde(default, deserialize_with = "size_opt")]
    pub memory: Option<u64>,
    /// Refuse writes.
    #[serde(default)]
    pub readonly: bool,
    /// Read and write with `O_DIRECT` (files and devices).
    #[serde(default)]
    pub direct: bool,
    /// A line for humans.
    #[serde(default)]
    pub description: String,
    /// Whether a client must start TLS before it may use the export.
    #[serde(default)]
    pub tls: TlsPolicy,
}

/// An export's TLS policy.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TlsPolicy {
    /// Clear or TLS, as the client chooses (TLS only when the server has a certificate).
    #[default]
    Allow,
    /// TLS only: a clear client is refused the export (`NBD_REP_ERR_TLS_REQD`).
    Require,
}

/// An export's storage, as the configuration names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storage {
    /// A file or block device.
    Path(PathBuf),
    /// Memory of this many bytes.
    Memory(u64),
}

impl ExportConfig {
    /// An export of `path` named `name`, writable, buffered, with no description.
    pub fn file(name: &str, path: impl Into<PathBuf>) -> Self {
        ExportConfig {
            name: name.into(),
            path: Some(path.into()),
            memory: None,
            readonly: false,
            direct: false,
            description: String::new(),
            tls: TlsPolicy::Allow,
        }
    }

    /// An export of `size` bytes of memory named `name`.
    pub fn memory(name: &str, size: u64) -> Self {
        ExportConfig {
            memory: Some(size),
            path: None,
            ..ExportConfig::file(name, "")
        }
    }

    /// Where the data lives (after [`BlockConfig::validate`], exactly one is set).
    pub fn storage(&self) -> Storage {
        match (&self.path, self.memory) {
            (Some(p), _) => Storage::Path(p.clone()),
            (None, Some(m)) => Storage::Memory(m),
            (None, None) => Storage::Memory(0),
        }
    }
}

/// Where the service listens, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A TCP `HOST:PORT`.
    Tcp(String),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl ListenAddr {
    /// Parses `HOST:PORT` (also `tcp://HOST:PORT` or `nbd://HOST:PORT`) or `unix:PATH`.
    pub fn parse(s: &str) -> Result<ListenAddr> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return usage(format!("listen address {s:?}: unix: needs a socket path"));
            }
            return Ok(ListenAddr::Unix(PathBuf::from(p)));
        }
        let hp = s
            .strip_prefix("tcp://")
            .or_else(|| s.strip_prefix("nbd://"))
            .unwrap_or(s);
        match hp.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                Ok(ListenAddr::Tcp(hp.to_string()))
            }
            _ => usage(format!(
                "listen address {s:?} is neither HOST:PORT nor unix:PATH (e.g. 127.0.0.1:{DEFAULT_PORT})"
            )),
        }
    }
}

fn usage<T>(msg: String) -> Result<T> {
    Err(Error::new(Kind::Usage, msg))
}

fn default_listen() -> Vec<String> {
    vec![format!("127.0.0.1:{DEFAULT_PORT}")]
}

impl Default for BlockConfig {
    fn default() -> Self {
        BlockConfig {
            listen: default_listen(),
            exports: Vec::new(),
            max_connections: defaults::max_connections(),
            max_per_address: defaults::max_per_address(),
            max_handshakes: defaults::max_handshakes(),
            handshake_timeout: defaults::handshake_timeout(),
            tls_certificate: None,
            tls_key: None,
            pool_chunks: defaults::pool_chunks(),
            chunk_size: defaults::chunk_size(),
        }
    }
}

impl BlockConfig {
    /// Reads the `[block]` table of `ferry serve`'s configuration and checks it
    /// ([`BlockConfig::validate`]).
    pub fn from_table(table: toml::Table) -> Result<BlockConfig> {
        let c = Self::parse_table(table)?;
        c.validate()?;
        Ok(c)
    }

    /// Reads the `[block]` table without checking it, for a caller that adds to it (the
    /// command line's exports) before [`BlockConfig::validate`].
    pub fn parse_table(table: toml::Table) -> Result<BlockConfig> {
        toml::Value::Table(table)
            .try_into()
            .map_err(|e| Error::new(Kind::Usage, format!("bad [block] configuration: {e}")))
    }

    /// Parses a TOML document holding only the block table's fields (for tests and
    /// `--config` files of the block service alone).
    pub fn from_toml(text: &str) -> Result<BlockConfig> {
        let t: toml::Table = text
            .parse()
            .map_err(|e| Error::new(Kind::Usage, format!("bad [block] configuration: {e}")))?;
        Self::from_table(t)
    }

    /// The admission limits of the service: the floor's, with the connection and
    /// handshake limits of this table (a client's staging memory is not budgeted: a
    /// connection holds its request buffers only).
    pub fn limits(&self) -> LimitsConfig {
        LimitsConfig {
            max_connections: self.max_connections,
            max_per_address: self.max_per_address,
            max_handshakes: self.max_handshakes,
            handshake_timeout: self.handshake_timeout,
            ..LimitsConfig::default()
        }
    }

    /// Checks the configuration makes a usable service: an address to listen on, at least
    /// one export, unique valid names, exactly one of `path` and `memory` per export,
    /// limits in their ranges.
    pub fn validate(&self) -> Result<()> {
        self.limits()
            .validate()
            .map_err(|e| Error::new(Kind::Usage, e.msg.replace("[limits]", "[block]")))?;
        if self.listen.is_empty() {
            return usage("[block] listen = []: give at least one address to listen on".into());
        }
        for a in &self.listen {
            ListenAddr::parse(a)?;
        }
        check_pool(self.pool_chunks, self.chunk_size)?;
        if self.exports.is_empty() {
            return usage(
                "[block] exports nothing: add a [[block.export]] with name and path (or memory)"
                    .into(),
            );
        }
        let has_cert = match (&self.tls_certificate, &self.tls_key) {
            (Some(_), Some(_)) => true,
            (None, None) => false,
            _ => return usage("[block] tls_certificate and tls_key go together".into()),
        };
        for (i, e) in self.exports.iter().enumerate() {
            check_export(e)?;
            if e.tls == TlsPolicy::Require && !has_cert {
                return usage(format!(
                    "block export {:?} has tls = \"require\": give [block] tls_certificate and tls_key",
                    e.name
                ));
            }
            if self.exports[..i].iter().any(|o| o.name == e.name) {
                return usage(format!("block export {:?} is configured twice", e.name));
            }
        }
        Ok(())
    }
}

/// The RMA path's pool within the protocol's bounds.
fn check_pool(chunks: u16, chunk_size: u32) -> Result<()> {
    use crate::deleg::proto::{MAX_CHUNK, MAX_CHUNKS, MIN_CHUNK};
    if chunks == 0 || chunks > MAX_CHUNKS {
        return usage(format!(
            "[block] pool_chunks = {chunks}: give 1 to {MAX_CHUNKS} chunks per session"
        ));
    }
    if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk_size) {
        return usage(format!(
            "[block] chunk_size = {chunk_size}: give {} KiB to {} MiB",
            MIN_CHUNK >> 10,
            MAX_CHUNK >> 20
        ));
    }
    Ok(())
}

fn check_export(e: &ExportConfig) -> Result<()> {
    use crate::nbd::consts::MAX_STRING;
    let name = &e.name;
    if name.is_empty() || name.len() > MAX_STRING || name.contains('\0') {
        return usage(format!(
            "block export name {name:?} must be 1 to {MAX_STRING} bytes without NUL"
        ));
    }
    if e.description.len() > MAX_STRING || e.description.contains('\0') {
        return usage(format!(
            "block export {name:?}: description longer than {MAX_STRING} bytes or with a NUL"
        ));
    }
    match (&e.path, e.memory) {
        (Some(_), Some(_)) => usage(format!(
            "block export {name:?} has both path and memory: pick one"
        )),
        (None, None) => usage(format!(
            "block export {name:?} needs path = \"FILE-OR-DEVICE\" or memory = \"SIZE\""
        )),
        (None, Some(0)) => usage(format!("block export {name:?}: memory = 0 exports nothing")),
        (None, Some(_)) if e.direct => usage(format!(
            "block export {name:?}: direct applies to files and devices, not memory"
        )),
        _ => Ok(()),
    }
}

fn size_opt<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }
    match Size::deserialize(d)? {
        Size::Bytes(n) => Ok(Some(n)),
        Size::Text(t) => parse_size(&t).map(Some).map_err(serde::de::Error::custom),
    }
}

/// A size in bytes (`"1MiB"` or a number) that fits 32 bits.
fn size_u32<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<u32, D::Error> {
    let n = size_opt(d)?.unwrap_or(0);
    u32::try_from(n).map_err(|_| serde::de::Error::custom(format!("{n} bytes is too large")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_table() {
        let c = BlockConfig::from_toml(
            r#"
            listen = ["127.0.0.1:10809", "unix:/tmp/nbd.sock"]
            [[export]]
            name = "disk"
            path = "/srv/disk.img"
            readonly = true
            description = "a disk"
            [[export]]
            name = "ram"
            memory = "8GiB"
            "#,
        )
        .unwrap();
        assert_eq!(c.listen.len(), 2);
        assert_eq!(
            c.exports[0].storage(),
            Storage::Path("/srv/disk.img".into())
        );
        assert!(c.exports[0].readonly);
        assert_eq!(c.exports[1].storage(), Storage::Memory(8 << 30));
    }

    #[test]
    fn refuses_what_is_wrong_with_a_reason() {
        let bad = |t: &str, needle: &str| {
            let e = BlockConfig::from_toml(t).unwrap_err();
            assert!(e.msg.contains(needle), "{t}: {}", e.msg);
            assert_eq!(e.kind, Kind::Usage);
        };
        bad("listn = []", "unknown field");
        bad(
            "[[export]]\nname = \"a\"\npath = \"/x\"\nsize = 3",
            "unknown field",
        );
        bad("", "exports nothing");
        bad("[[export]]\nname = \"a\"", "needs path");
        bad(
            "[[export]]\nname = \"a\"\npath = \"/x\"\nmemory = 5",
            "both path and memory",
        );
        bad(
            "[[export]]\nname = \"a\"\nmemory = \"5 parsecs\"",
            "unknown unit",
        );
        bad(
            "[[export]]\nname = \"a\"\npath = \"/x\"\n[[export]]\nname = \"a\"\npath = \"/y\"",
            "twice",
        );
        bad(
            "listen = \"nowhere\"\n[[export]]\nname = \"a\"\npath = \"/x\"",
            "neither",
        );
        bad(
            "[[export]]\nname = \"a\"\nmemory = 5\ntls = \"require\"",
            "tls_certificate and tls_key",
        );
        bad(
            "tls_key = \"/k\"\n[[export]]\nname = \"a\"\nmemory = 5",
            "go together",
        );
        bad(
            "[[export]]\nname = \"a\"\nmemory = 5\ntls = \"maybe\"",
            "unknown variant",
        );
    }

    #[test]
    fn limits_default_to_the_floors_and_are_checked() {
        let c = BlockConfig::from_toml("[[export]]\nname = \"a\"\nmemory = 5").unwrap();
        // Without TLS configured, only this machine can reach the service by default.
        assert_eq!(c.listen, vec![format!("127.0.0.1:{DEFAULT_PORT}")]);
        assert_eq!(
            (&c.tls_certificate, c.exports[0].tls),
            (&None, TlsPolicy::Allow)
        );
        let floor = LimitsConfig::default();
        assert_eq!(c.limits().max_connections, floor.max_connections);
        assert_eq!(c.limits().handshake_timeout, floor.handshake_timeout);
        let c = BlockConfig::from_toml(
            "max_connections = 2\nhandshake_timeout = 0.5\n[[export]]\nname = \"a\"\nmemory = 5",
        )
        .unwrap();
        assert_eq!(c.limits().max_connections, 2);
        assert_eq!(c.limits().handshake().as_millis(), 500);
        let e = BlockConfig::from_toml("max_connections = 0\n[[export]]\nname = \"a\"\nmemory = 5")
            .unwrap_err();
        assert!(e.msg.contains("[block] max_connections"), "{}", e.msg);
    }

    #[test]
    fn the_rma_pool_is_configured_and_checked() {
        let c = BlockConfig::from_toml("[[export]]\nname = \"a\"\nmemory = 5").unwrap();
        assert_eq!((c.pool_chunks, c.chunk_size), (16, 1 << 20));
        let c = BlockConfig::from_toml(
            "pool_chunks = 32\nchunk_size = \"256KiB\"\n[[export]]\nname = \"a\"\nmemory = 5",
        )
        .unwrap();
        assert_eq!((c.pool_chunks, c.chunk_size), (32, 256 << 10));
        for (t, needle) in [
            ("pool_chunks = 0", "pool_chunks = 0"),
            ("pool_chunks = 257", "1 to 256"),
            ("chunk_size = 100", "chunk_size = 100"),
            ("chunk_size = \"32MiB\"", "4 KiB to 16 MiB"),
            ("chunk_size = \"8GiB\"", "too large"),
        ] {
            let e = BlockConfig::from_toml(&format!("{t}\n[[export]]\nname = \"a\"\nmemory = 5"))
                .unwrap_err();
            assert!(e.msg.contains(needle), "{t}: {}", e.msg);
        }
    }
}
