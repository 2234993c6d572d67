//! Errors of the collective I/O face: an MPI-mappable class and a message saying what
//! happened and what to do.

use std::fmt;

/// The class of a failed call, chosen so that an MPI-IO layer maps each to one MPI error
/// class ([`ErrorClass::mpi_name`]). Unknown codes from a later minor decode as
/// [`ErrorClass::Other`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// An invalid argument: a negative displacement, an offset that overflows, pieces of
    /// one collective write that overlap (`MPI_ERR_ARG`).
    Arg,
    /// An invalid datatype or description (`MPI_ERR_TYPE`).
    Type,
    /// An invalid or unsupported access mode (`MPI_ERR_AMODE`).
    Amode,
    /// The token was refused, the path leads outside its root, or the OS denied access; or
    /// a read of a write-only file, a write of a read-only one (`MPI_ERR_ACCESS`).
    Access,
    /// No such root, file or directory (`MPI_ERR_NO_SUCH_FILE`).
    NoSuchFile,
    /// The file exists and the open was exclusive (`MPI_ERR_FILE_EXISTS`).
    FileExists,
    /// Not a regular file, a bad name (`MPI_ERR_BAD_FILE`).
    BadFile,
    /// A read or write failed (`MPI_ERR_IO`).
    Io,
    /// The disk is full (`MPI_ERR_NO_SPACE`).
    NoSpace,
    /// The file system is read-only (`MPI_ERR_READ_ONLY`).
    ReadOnly,
    /// The ranks of a collective call disagree: different calls, access modes or sizes
    /// (`MPI_ERR_NOT_SAME`).
    NotSame,
    /// Not supported by this server (`MPI_ERR_UNSUPPORTED_OPERATION`).
    Unsupported,
    /// A rank of the session left (its connection ended) or did not make a collective call
    /// in time; the session is over (`MPI_ERR_OTHER`; `MPI_ERR_PROC_FAILED` with ULFM).
    RankLost,
    /// The server is at a limit or shutting down; try again later (`MPI_ERR_OTHER`).
    Busy,
    /// The peer speaks another major version of the protocol (`MPI_ERR_OTHER`).
    Version,
    /// The connection broke or the peer broke the protocol (`MPI_ERR_OTHER`).
    Connection,
    /// A code this build does not know.
    Other(u16),
}

impl ferry_wire::Code16 for ErrorClass {
    /// The wire value.
    fn to_u16(self) -> u16 {
        match self {
            ErrorClass::Arg => 1,
            ErrorClass::Type => 2,
            ErrorClass::Amode => 3,
            ErrorClass::Access => 4,
            ErrorClass::NoSuchFile => 5,
            ErrorClass::FileExists => 6,
            ErrorClass::BadFile => 7,
            ErrorClass::Io => 8,
            ErrorClass::NoSpace => 9,
            ErrorClass::ReadOnly => 10,
            ErrorClass::NotSame => 11,
            ErrorClass::Unsupported => 12,
            ErrorClass::RankLost => 13,
            ErrorClass::Busy => 14,
            ErrorClass::Version => 15,
            ErrorClass::Connection => 16,
            ErrorClass::Other(n) => n,
        }
    }

    /// From the wire value.
    fn from_u16(n: u16) -> Self {
        match n {
            1 => ErrorClass::Arg,
            2 => ErrorClass::Type,
            3 => ErrorClass::Amode,
            4 => ErrorClass::Access,
            5 => ErrorClass::NoSuchFile,
            6 => ErrorClass::FileExists,
            7 => ErrorClass::BadFile,
            8 => ErrorClass::Io,
            9 => ErrorClass::NoSpace,
            10 => ErrorClass::ReadOnly,
            11 => ErrorClass::NotSame,
            12 => ErrorClass::Unsupported,
            13 => ErrorClass::RankLost,
            14 => ErrorClass::Busy,
            15 => ErrorClass::Version,
            16 => ErrorClass::Connection,
            n => ErrorClass::Other(n),
        }
    }
}

impl ErrorClass {
    /// The MPI error class an MPI-IO layer reports for it.
    pub fn mpi_name(self) -> &'static str {
        match self {
            ErrorClass::Arg => "MPI_ERR_ARG",
            ErrorClass::Type => "MPI_ERR_TYPE",
            ErrorClass::Amode => "MPI_ERR_AMODE",
            ErrorClass::Access => "MPI_ERR_ACCESS",
            ErrorClass::NoSuchFile => "MPI_ERR_NO_SUCH_FILE",
            ErrorClass::FileExists => "MPI_ERR_FILE_EXISTS",
            ErrorClass::BadFile => "MPI_ERR_BAD_FILE",
            ErrorClass::Io => "MPI_ERR_IO",
            ErrorClass::NoSpace => "MPI_ERR_NO_SPACE",
            ErrorClass::ReadOnly => "MPI_ERR_READ_ONLY",
            ErrorClass::NotSame => "MPI_ERR_NOT_SAME",
            ErrorClass::Unsupported => "MPI_ERR_UNSUPPORTED_OPERATION",
            ErrorClass::RankLost
            | ErrorClass::Busy
            | ErrorClass::Version
            | ErrorClass::Connection
            | ErrorClass::Other(_) => "MPI_ERR_OTHER",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorClass::Other(n) => write!(f, "error class {n}"),
            c => f.write_str(c.mpi_name()),
        }
    }
}

/// A failed call: its class and what happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} ({class:?})")]
pub struct CioError {
    /// The class (and MPI error class).
    pub class: ErrorClass,
    /// What happened and what to do.
    pub message: String,
}

impl CioError {
    /// An error of `class` saying `message`.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
        }
    }

    /// The connection broke or the peer broke the protocol.
    pub fn conn(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Connection, message)
    }
}

impl From<ferry_service::Error> for CioError {
    fn from(e: ferry_service::Error) -> Self {
        use ferry_service::Kind;
        let class = match e.kind {
            Kind::Usage => ErrorClass::Arg,
            Kind::Auth | Kind::Permission => ErrorClass::Access,
            Kind::NotFound => ErrorClass::NoSuchFile,
            Kind::Io | Kind::Integrity => ErrorClass::Io,
            Kind::Connection => ErrorClass::Connection,
        };
        Self::new(class, e.msg)
    }
}

impl From<ferry_dtype::DtypeError> for CioError {
    fn from(e: ferry_dtype::DtypeError) -> Self {
        Self::new(ErrorClass::Type, e.to_string())
    }
}

/// Result with [`CioError`].
pub type Result<T, E = CioError> = std::result::Result<T, E>;
