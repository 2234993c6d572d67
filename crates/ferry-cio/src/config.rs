//! The `[cio]` table of `ferry serve`'s configuration (TOML). Every key is optional:
//!
//! ```toml
//! [cio]
//! collective_timeout = 120.0   # seconds a collective call waits for the last rank
//! max_call_bytes = 1073741824  # the most data-stream bytes one rank moves in one call
//! chunk = 4194304              # DATA payload size (4096 ..= 4 MiB)
//! write_behind = 268435456     # a collective write of up to this many bytes is answered
//!                              # before it is written (0: never)
//! ```
//!
//! The files are those of the server's exported roots (`[[root]]`), behind its `[auth]`.

use std::time::Duration;

use serde::Deserialize;

use crate::error::{CioError, ErrorClass, Result};
use crate::proto::{MAX_CHUNK, MIN_CHUNK};

/// The collective I/O face's settings.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CioConfig {
    /// Seconds a collective call waits for its last rank before it fails on every rank
    /// and the session ends (a rank that is alive but never calls).
    #[serde(default = "default_timeout")]
    pub collective_timeout: f64,
    /// The most bytes of data stream one rank moves in one call: a collective write is
    /// held in memory until every rank's data is in.
    #[serde(default = "default_max_call")]
    pub max_call_bytes: u64,
    /// The DATA payload size (a message of the data stream).
    #[serde(default = "default_chunk")]
    pub chunk: u32,
    /// The most data bytes (all ranks') of a collective write answered before it reaches
    /// the file: its buffers are held until it is written, one such write per session
    /// ([`crate::server`]'s write-behind). A larger call is written, then answered. 0:
    /// every collective write is written before it is answered.
    #[serde(default = "default_write_behind")]
    pub write_behind: u64,
}

fn default_timeout() -> f64 {
    120.0
}

fn default_max_call() -> u64 {
    1 << 30
}

fn default_write_behind() -> u64 {
    256 << 20
}

fn default_chunk() -> u32 {
    MAX_CHUNK
}

impl Default for CioConfig {
    fn default() -> Self {
        CioConfig {
            collective_timeout: default_timeout(),
            max_call_bytes: default_max_call(),
            chunk: default_chunk(),
            write_behind: default_write_behind(),
        }
    }
}

impl CioConfig {
    /// Parses a `[cio]` table's text.
    pub fn from_toml(text: &str) -> Result<Self> {
        let c: CioConfig = toml::from_str(text)
            .map_err(|e| CioError::new(ErrorClass::Arg, format!("[cio]: {e}")))?;
        c.validate()?;
        Ok(c)
    }

    /// Takes the `[cio]` table of a daemon's configuration file.
    pub fn from_table(table: toml::Table) -> Result<Self> {
        let c: CioConfig = toml::Value::Table(table)
            .try_into()
            .map_err(|e| CioError::new(ErrorClass::Arg, format!("[cio]: {e}")))?;
        c.validate()?;
        Ok(c)
    }

    /// Checks the values.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(CioError::new(ErrorClass::Arg, m));
        if !(self.collective_timeout.is_finite() && self.collective_timeout > 0.0) {
            return bad(format!(
                "[cio] collective_timeout = {}: a positive number of seconds",
                self.collective_timeout
            ));
        }
        if !(MIN_CHUNK..=MAX_CHUNK).contains(&self.chunk) {
            return bad(format!(
                "[cio] chunk = {}: between {MIN_CHUNK} and {MAX_CHUNK} bytes",
                self.chunk
            ));
        }
        Ok(())
    }

    /// The collective timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.collective_timeout)
    }
}
