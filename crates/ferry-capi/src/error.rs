//! errno values for everything the layers below can report.

use ferry_exs::runtime::Error as RuntimeError;
use ferry_exs::ExsError;
use ferry_fabric::FabricError;

/// An errno value: what a failed call leaves in `errno` (and an event's `err`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    pub const BADF: Errno = Errno(libc::EBADF);
    pub const INVAL: Errno = Errno(libc::EINVAL);
    pub const FAULT: Errno = Errno(libc::EFAULT);
}

impl From<ExsError> for Errno {
    fn from(e: ExsError) -> Self {
        Errno(e.errno())
    }
}

impl From<&FabricError> for Errno {
    fn from(e: &FabricError) -> Self {
        #[allow(unreachable_patterns)]
        Errno(match e {
            FabricError::BadAddress { .. } | FabricError::InvalidArgument(_) => libc::EINVAL,
            FabricError::Unavailable(_) => libc::EAFNOSUPPORT,
            FabricError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            // libfabric's FI_E* codes below 256 are the errno values of the same name.
            FabricError::Ofi { code, .. } if (1..256).contains(code) => *code,
            FabricError::Ofi { .. } => libc::EIO,
            FabricError::Unsupported(_) => libc::EOPNOTSUPP,
            FabricError::RemoteAccess(_) => libc::EACCES,
            FabricError::Truncated { .. } => libc::EMSGSIZE,
            FabricError::Protocol(_) => libc::EPROTO,
            FabricError::VersionMismatch { .. } => libc::EPROTONOSUPPORT,
            FabricError::ConnectionLost(_) | FabricError::Wedged(_) => libc::ECONNRESET,
            FabricError::Cancelled => libc::ECANCELED,
            FabricError::Timeout(_) => libc::ETIMEDOUT,
            _ => libc::EIO,
        })
    }
}

impl From<FabricError> for Errno {
    fn from(e: FabricError) -> Self {
        Errno::from(&e)
    }
}

impl From<RuntimeError> for Errno {
    fn from(e: RuntimeError) -> Self {
        #[allow(unreachable_patterns)]
        match e {
            RuntimeError::Exs(e) => e.into(),
            RuntimeError::Fabric(e) => e.into(),
            RuntimeError::Timeout => Errno(libc::ETIMEDOUT),
            _ => Errno(libc::EIO),
        }
    }
}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Self {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl From<rustix::io::Errno> for Errno {
    fn from(e: rustix::io::Errno) -> Self {
        Errno(e.raw_os_error())
    }
}

/// Result of the internal functions behind each exported call.
pub type Res<T> = Result<T, Errno>;

/// Sets the calling thread's `errno`.
pub fn set_errno(e: Errno) {
    // SAFETY: __errno_location returns the calling thread's errno slot, valid for the
    // thread's lifetime; writing an int there is what every libc function does.
    unsafe { *libc::__errno_location() = e.0 }
}
