//! The `[cio]` table of `ferry serve`'s configuration (TOML). Every key is optional:
//!
//! ```toml
//! [cio]
//! collective_timeout = 120.0   # seconds a collective call waits for the last rank
//! max_call_bytes = 1073741824  # the most data-stream bytes one rank moves in one call
//! chunk = 4194304              # DATA payload size (4096 ..= 4 MiB)
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
}

fn default_timeout() -> f64 {
    120.0
}

fn default_max_call() -> u64 {
    1 << 30
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
