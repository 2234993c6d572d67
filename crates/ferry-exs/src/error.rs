//! EXS error codes: one enum, each variant mapping to an errno for the C API and to a status
//! code for the wire (so a receiver's verdict reaches the sender's completion event intact).

/// Why an EXS operation or connection failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ExsError {
    /// A flag combination that is not allowed: NOTIFY_ON_READ without PERSISTENT, a recv with
    /// NOTIFY_ON_READ, or an offset on a persistent operation itself.
    #[error("invalid flags: NOTIFY_ON_READ needs PERSISTENT on a send, and persistent operations take no offset")]
    InvalidFlags,
    /// An offset lies beyond the end of the peer's persistent block.
    #[error("offset lies outside the peer's persistent block")]
    OffsetOutOfRange,
    /// An offset was given but the matching peer operation is not persistent.
    #[error("an offset was given but the matching peer operation is not persistent")]
    NotPersistent,
    /// Both ends of one direction of a socket tried to be persistent; one side must drive.
    #[error("both sides of a socket direction cannot be persistent: make one side an ordinary send or recv")]
    BothPersistent,
    /// A persistent send (recv) is already posted on this socket, so no later send (recv)
    /// could ever be matched.
    #[error("a persistent operation is active on this socket; later operations in that direction can never match")]
    AfterPersistent,
    /// The buffer has no remote descriptor but the transfer needs the peer to reach it.
    #[error("buffer is not registered for remote access, which this transfer needs")]
    NotRemoteAccessible,
    /// The configuration is out of range (credits must be 1..=65535, immediate size at most
    /// [`crate::proto::MAX_IMMEDIATE`]).
    #[error(
        "invalid configuration: credits must be at least 1 and small_packet_max_size at most 65536"
    )]
    InvalidConfig,
    /// The message is larger than the receive buffer (the buffer holds its prefix) or does not
    /// fit in the peer's persistent block at the given offset (nothing was written).
    #[error("message larger than the buffer or block it was matched with")]
    MessageSize,
    /// The socket is not connected (closed, or never connected).
    #[error("socket is not connected")]
    NotConnected,
    /// The peer closed the connection or the transport broke.
    #[error("connection reset by peer or transport")]
    ConnectionReset,
    /// The peer broke the EXS wire protocol; the connection was closed.
    #[error("protocol violation by peer; connection closed")]
    Protocol,
    /// The operation was cancelled because the connection was closed locally.
    #[error("operation cancelled: the connection was closed")]
    Canceled,
    /// The peer speaks another major version of the EXS wire protocol.
    #[error("peer speaks EXS wire protocol {peer_major}.x, this build speaks {our_major}.x: upgrade one side")]
    VersionMismatch {
        /// The peer's major version.
        peer_major: u16,
        /// Ours.
        our_major: u16,
    },
    /// The fabric failed the data transfer (RMA error: bad key, bounds, or a broken link).
    #[error("the fabric failed the data transfer")]
    Transfer,
    /// The peer closed the connection in an orderly way (`exs_close`).
    #[error("the peer closed the connection")]
    PeerClosed,
}

impl ExsError {
    /// The errno value the C API reports for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Self::InvalidFlags
            | Self::OffsetOutOfRange
            | Self::NotPersistent
            | Self::BothPersistent
            | Self::AfterPersistent
            | Self::NotRemoteAccessible
            | Self::InvalidConfig => libc::EINVAL,
            Self::MessageSize => libc::EMSGSIZE,
            Self::NotConnected => libc::ENOTCONN,
            Self::ConnectionReset => libc::ECONNRESET,
            Self::Protocol => libc::EPROTO,
            Self::Canceled => libc::ECANCELED,
            Self::VersionMismatch { .. } => libc::EPROTONOSUPPORT,
            Self::Transfer => libc::EIO,
            Self::PeerClosed => libc::EPIPE,
        }
    }

    /// Status code on the wire (0 means success and is not an error).
    pub(crate) fn code(&self) -> u16 {
        match self {
            Self::InvalidFlags => 1,
            Self::OffsetOutOfRange => 2,
            Self::NotPersistent => 3,
            Self::BothPersistent => 4,
            Self::AfterPersistent => 5,
            Self::NotRemoteAccessible => 6,
            Self::InvalidConfig => 7,
            Self::MessageSize => 8,
            Self::NotConnected => 9,
            Self::ConnectionReset => 10,
            Self::Protocol => 11,
            Self::Canceled => 12,
            Self::VersionMismatch { .. } => 13,
            Self::Transfer => 14,
            Self::PeerClosed => 15,
        }
    }

    /// The error a status code names. Version mismatches travel only in CLOSE (with the
    /// versions), so code 13 is not accepted here.
    pub(crate) fn from_code(code: u16) -> Option<Self> {
        Some(match code {
            1 => Self::InvalidFlags,
            2 => Self::OffsetOutOfRange,
            3 => Self::NotPersistent,
            4 => Self::BothPersistent,
            5 => Self::AfterPersistent,
            6 => Self::NotRemoteAccessible,
            7 => Self::InvalidConfig,
            8 => Self::MessageSize,
            9 => Self::NotConnected,
            10 => Self::ConnectionReset,
            11 => Self::Protocol,
            12 => Self::Canceled,
            14 => Self::Transfer,
            15 => Self::PeerClosed,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_map_to_errno() {
        for code in 0..32u16 {
            if let Some(e) = ExsError::from_code(code) {
                assert_eq!(e.code(), code);
                assert!(e.errno() > 0);
            }
        }
        let v = ExsError::VersionMismatch {
            peer_major: 2,
            our_major: 1,
        };
        assert_eq!(v.errno(), libc::EPROTONOSUPPORT);
        assert_eq!(ExsError::from_code(v.code()), None);
        assert!(v.to_string().contains("2.x"));
    }
}
