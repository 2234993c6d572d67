//! Errors of every service and its clients, each with the exit code `ferry` returns. A face
//! adds how its protocol carries them (file transfer: `ferry_xfer::error`).

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

/// An error: its class and a message saying what happened and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct Error {
    /// The class (and exit code).
    pub kind: Kind,
    /// What happened and what to do.
    pub msg: String,
}

impl Error {
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

    /// The peer broke the protocol or the connection failed.
    pub fn conn(msg: impl Into<String>) -> Self {
        Self::new(Kind::Connection, msg)
    }
}

/// The class of a refused request; a face maps it to its protocol's error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// The request itself is malformed (a NUL byte in a path).
    BadRequest,
    /// No such root, file or directory.
    NotFound,
    /// The path leaves its root, or the OS denied access.
    PermissionDenied,
    /// The disk (or quota) is full.
    NoSpace,
    /// A path component is not a directory.
    NotADirectory,
    /// A directory where a file was asked for.
    IsADirectory,
    /// Neither a regular file nor a directory (a FIFO, a device, a socket).
    Unsupported,
    /// Any other I/O error.
    Io,
    /// A limit is reached (connections, memory); trying again later may succeed.
    Unavailable,
}

/// Why a request was refused: its class and a message for the client.
#[derive(Debug)]
pub struct Refusal {
    /// The class.
    pub code: Denial,
    /// The message.
    pub message: String,
}

/// Result of a request that may be refused.
pub type PResult<T> = std::result::Result<T, Refusal>;

/// A refusal of class `code` saying `message`.
pub fn refuse(code: Denial, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
