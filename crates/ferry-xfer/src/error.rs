//! Errors of the transfer client and server, each with the exit code `ferry` returns.

use crate::proto::ErrorCode;

/// What went wrong, in the classes the command line reports as exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Bad command-line arguments or an unsupported combination (exit 1).
    Usage,
    /// The server refused the token (exit 2).
    Auth,
    /// A root, file or directory does not exist (exit 3).
    NotFound,
    /// A checksum kept failing after every retry (exit 4).
    Integrity,
    /// A local or remote disk read/write failed, or the disk is full (exit 5).
    Io,
    /// The connection could not be made, broke, or the peer spoke nonsense (exit 6).
    Connection,
    /// The path leaves its root, or the OS denied access (exit 7).
    Permission,
}

impl Kind {
    /// The process exit code for this class (documented in `docs/xfer.md` and `ferry --help`).
    pub fn exit_code(self) -> i32 {
        match self {
            Kind::Usage => 1,
            Kind::Auth => 2,
            Kind::NotFound => 3,
            Kind::Integrity => 4,
            Kind::Io => 5,
            Kind::Connection => 6,
            Kind::Permission => 7,
        }
    }
}

/// A transfer error: its class and a message saying what happened and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct XferError {
    /// The class (and exit code).
    pub kind: Kind,
    /// What happened and what to do.
    pub msg: String,
}

impl XferError {
    /// An error of `kind` saying `msg`.
    pub fn new(kind: Kind, msg: impl Into<String>) -> Self {
        Self {
            kind,
            msg: msg.into(),
        }
    }

    /// A local I/O error on `what` (a path or an action), classified by errno.
    pub fn io(what: impl std::fmt::Display, e: &std::io::Error) -> Self {
        let kind = match e.kind() {
            std::io::ErrorKind::NotFound => Kind::NotFound,
            std::io::ErrorKind::PermissionDenied => Kind::Permission,
            _ => Kind::Io,
        };
        let hint = match e.raw_os_error() {
            Some(libc_enospc) if libc_enospc == rustix::io::Errno::NOSPC.raw_os_error() => {
                " (the disk is full: free space or pick another destination)"
            }
            _ => "",
        };
        Self::new(kind, format!("{what}: {e}{hint}"))
    }

    /// The error an ERROR frame from the peer stands for.
    pub fn remote(code: ErrorCode, message: &str) -> Self {
        let kind = match code {
            ErrorCode::AuthRefused => Kind::Auth,
            ErrorCode::NotFound => Kind::NotFound,
            ErrorCode::PermissionDenied => Kind::Permission,
            ErrorCode::Integrity => Kind::Integrity,
            ErrorCode::Io | ErrorCode::NoSpace => Kind::Io,
            ErrorCode::NotADirectory | ErrorCode::IsADirectory | ErrorCode::Unsupported => {
                Kind::Usage
            }
            // Retryable: `ferry cp --retries` reconnects and resumes.
            ErrorCode::Unavailable => Kind::Connection,
            _ => Kind::Connection,
        };
        Self::new(kind, format!("server: {code}: {message}"))
    }

    /// The peer broke the protocol or the connection failed.
    pub fn conn(msg: impl Into<String>) -> Self {
        Self::new(Kind::Connection, msg)
    }

    /// The ERROR code to send a peer for this error.
    pub fn code(&self) -> ErrorCode {
        match self.kind {
            Kind::Usage => ErrorCode::BadRequest,
            Kind::Auth => ErrorCode::AuthRefused,
            Kind::NotFound => ErrorCode::NotFound,
            Kind::Integrity => ErrorCode::Integrity,
            Kind::Io => ErrorCode::Io,
            Kind::Connection => ErrorCode::Unreachable,
            Kind::Permission => ErrorCode::PermissionDenied,
        }
    }
}

/// Result with [`XferError`].
pub type Result<T, E = XferError> = std::result::Result<T, E>;
