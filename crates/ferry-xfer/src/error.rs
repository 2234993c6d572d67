//! Errors of the transfer client and server: the floor's [`ferry_service::Error`] (a class
//! with its exit code, and a message), and how the file-transfer protocol carries them in
//! ERROR frames.

use crate::proto::ErrorCode;

pub use ferry_service::error::Kind;

/// A transfer error: its class and a message saying what happened and what to do.
pub type XferError = ferry_service::Error;

/// Result with [`XferError`].
pub type Result<T, E = XferError> = std::result::Result<T, E>;

/// The error an ERROR frame from the peer stands for.
pub fn remote(code: ErrorCode, message: &str) -> XferError {
    let kind = match code {
        ErrorCode::AuthRefused => Kind::Auth,
        ErrorCode::NotFound => Kind::NotFound,
        ErrorCode::PermissionDenied => Kind::Permission,
        ErrorCode::Integrity => Kind::Integrity,
        ErrorCode::Io | ErrorCode::NoSpace => Kind::Io,
        ErrorCode::NotADirectory | ErrorCode::IsADirectory | ErrorCode::Unsupported => Kind::Usage,
        // Stopped on purpose by its owner: running it again is theirs to decide.
        ErrorCode::Cancelled => Kind::Usage,
        // Retryable: `ferry cp --retries` reconnects and resumes.
        ErrorCode::Unavailable => Kind::Connection,
        _ => Kind::Connection,
    };
    XferError::new(kind, format!("server: {code}: {message}"))
}

/// The ERROR code to send a peer for `e`.
pub fn code_of(e: &XferError) -> ErrorCode {
    match e.kind {
        Kind::Usage => ErrorCode::BadRequest,
        Kind::Auth => ErrorCode::AuthRefused,
        Kind::NotFound => ErrorCode::NotFound,
        Kind::Integrity => ErrorCode::Integrity,
        Kind::Io => ErrorCode::Io,
        Kind::Connection => ErrorCode::Unreachable,
        Kind::Permission => ErrorCode::PermissionDenied,
    }
}
