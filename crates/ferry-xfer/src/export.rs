//! The service floor as this protocol sees it: the entries of its sandboxed roots
//! ([`ferry_service::roots`]) as LIST and STAT replies carry them, its refusals (roots,
//! admission) as ERROR frames.

use ferry_service::error::Denial;
use ferry_service::roots::{FileKind, Meta, Roots};

use crate::proto::{Entry, EntryKind, ErrorCode};

/// Why a request failed, as the ERROR frame the client gets.
#[derive(Debug)]
pub struct Refusal {
    /// The code.
    pub code: ErrorCode,
    /// The message.
    pub message: String,
}

/// Result of a request that may be refused.
pub(crate) type PResult<T> = std::result::Result<T, Refusal>;

/// A refusal with `code` saying `message`.
pub(crate) fn refuse(code: ErrorCode, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

/// The ERROR code of a floor refusal's class.
fn code_of(d: Denial) -> ErrorCode {
    match d {
        Denial::BadRequest => ErrorCode::BadRequest,
        Denial::NotFound => ErrorCode::NotFound,
        Denial::PermissionDenied => ErrorCode::PermissionDenied,
        Denial::NoSpace => ErrorCode::NoSpace,
        Denial::NotADirectory => ErrorCode::NotADirectory,
        Denial::IsADirectory => ErrorCode::IsADirectory,
        Denial::Unsupported => ErrorCode::Unsupported,
        Denial::Io => ErrorCode::Io,
        Denial::Unavailable => ErrorCode::Unavailable,
    }
}

impl From<ferry_service::error::Refusal> for Refusal {
    fn from(r: ferry_service::error::Refusal) -> Self {
        refuse(code_of(r.code), r.message)
    }
}

/// The listing entry of a floor [`Meta`].
fn entry(m: Meta) -> Entry {
    Entry {
        kind: match m.kind {
            FileKind::File => EntryKind::File,
            FileKind::Dir => EntryKind::Dir,
            FileKind::Symlink => EntryKind::Symlink,
            FileKind::Other => EntryKind::Other,
        },
        mode: m.mode,
        size: m.size,
        mtime: m.mtime,
        name: m.name,
    }
}

/// What `path` names (STAT).
pub(crate) fn stat(roots: &Roots, path: &str) -> PResult<Entry> {
    Ok(entry(roots.stat(path)?))
}

/// The directory `path`, listed ("" lists the roots) (LIST).
pub(crate) fn list(roots: &Roots, path: &str) -> PResult<Vec<Entry>> {
    Ok(roots.list(path)?.into_iter().map(entry).collect())
}
