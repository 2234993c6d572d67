//! The emulator's errors: what [`crate::Wan::up`] and its helpers return.

use std::io;

/// Errors of setting up the emulator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This machine or user cannot run it (not root, no /dev/net/tun, no `ip`): tests skip.
    #[error("the WAN emulator cannot run here: {0}")]
    Unsupported(String),
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("`{cmd}` failed: {stderr}")]
    Command { cmd: String, stderr: String },
}

impl Error {
    pub(crate) fn io(what: String, source: io::Error) -> Error {
        Error::Io { what, source }
    }
}
