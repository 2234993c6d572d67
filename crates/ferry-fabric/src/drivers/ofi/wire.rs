//! Control messages that emulate connections on a reliable-datagram (RDM) endpoint.
//!
//! Every message starts with the same header, frozen across protocol versions so that a peer
//! of another major version can still be understood well enough to be refused:
//! `magic "FOFI" | major u16 | minor u16 | kind u8`, little-endian, then the body:
//!
//! | kind | body |
//! |---|---|
//! | 1 CONNECT | client conn id u64, name length u16, client endpoint name |
//! | 2 ACCEPT | client conn id u64, server conn id u64 |
//! | 3 REFUSE | client conn id u64 |
//! | 4 DISCONNECT | receiver's conn id u64, sender's conn id u64, data messages sent u64 |
//! | 5 RMA_REQUEST | receiver's conn id u64, sender's conn id u64, token u64, key u64, addr u64, length u64, write u8 |
//! | 6 RMA_ANSWER | receiver's conn id u64, token u64, status u8 (0 granted, else the refusal) |
//! | 7 RMA_DONE | receiver's conn id u64, sender's conn id u64, token u64 |
//! | 8 PING | receiver's conn id u64, sender's conn id u64 (since 1.1) |
//! | 9 PONG | receiver's conn id u64, sender's conn id u64 (since 1.1) |
//!
//! The RMA messages implement checked RMA (see `domain.rs`): the target checks an access
//! before the initiator lets the provider make it, and holds the region until it is done.
//!
//! Control messages travel with the domain's control tag; data with the receiver's
//! connection id in the tag (see `mod.rs`), so the two never consume each other's receives.
//! Trailing bytes are ignored so later minor versions can extend a body.

use super::ffi::MAX_NAME;
use crate::mem::RemoteSlice;
use ferry_wire::{ReadError, Reader, Writer};

/// Major protocol version; a peer with another one is refused.
pub(super) const MAJOR: u16 = 1;
/// Minor protocol version (compatible additions). 1.1 added PING/PONG.
pub(super) const MINOR: u16 = 1;

const MAGIC: [u8; 4] = *b"FOFI";
const HEADER: usize = 9;

/// The largest control message (a CONNECT with the longest name).
pub(super) const MAX_LEN: usize = HEADER + 8 + 2 + MAX_NAME;

/// A decoded control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Control {
    /// A client asks to connect.
    Connect {
        /// The client's protocol major version.
        major: u16,
        /// The client's connection id (the listener tags data for the client with it).
        conn: u64,
        /// The client endpoint's address, for the listener's AV.
        name: Vec<u8>,
    },
    /// The listener accepted `target`, giving its own connection id.
    Accept {
        /// The client's connection id.
        target: u64,
        /// The listener's connection id.
        conn: u64,
    },
    /// The listener refused `target` because it speaks protocol `major`.
    Refuse {
        /// The client's connection id.
        target: u64,
        /// The listener's major version.
        major: u16,
    },
    /// The sender closed its end of connection `target` after sending `sent` data messages.
    Disconnect {
        /// The receiver's connection id.
        target: u64,
        /// The sender's connection id (checked against the connection's peer).
        sender: u64,
        /// Data messages the sender posted on the connection.
        sent: u64,
    },
    /// The sender asks to access `remote` in the receiver's memory.
    RmaRequest {
        /// The receiver's connection id.
        target: u64,
        /// The sender's connection id.
        sender: u64,
        /// Names the access in the answer and the DONE.
        token: u64,
        /// What is to be accessed.
        remote: RemoteSlice,
        /// A write (else a read).
        write: bool,
    },
    /// The answer to an RMA_REQUEST: 0 granted, else a `RemoteAccessError` wire byte.
    RmaAnswer {
        /// The receiver's (requester's) connection id.
        target: u64,
        /// The request's token.
        token: u64,
        /// 0, or why the access was refused.
        status: u8,
    },
    /// A granted access is finished; the region may go.
    RmaDone {
        /// The receiver's connection id.
        target: u64,
        /// The sender's connection id.
        sender: u64,
        /// The request's token.
        token: u64,
    },
    /// Keepalive: is the peer's driver still there? Answered with PONG.
    Ping {
        /// The receiver's connection id.
        target: u64,
        /// The sender's connection id.
        sender: u64,
    },
    /// The answer to a PING.
    Pong {
        /// The receiver's connection id.
        target: u64,
        /// The sender's connection id.
        sender: u64,
    },
}

impl Control {
    /// Encodes with our protocol version.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_as(MAJOR)
    }

    /// Encodes with the given major version (tests speak other versions with it).
    pub fn encode_as(&self, major: u16) -> Vec<u8> {
        let mut b = Vec::with_capacity(MAX_LEN);
        let mut w = Writer::new(&mut b);
        w.bytes(&MAGIC);
        w.u16(major);
        w.u16(MINOR);
        w.u8(self.kind());
        match self {
            Control::Connect { conn, name, .. } => {
                w.u64(*conn);
                // Names are at most MAX_NAME bytes (checked where they come from).
                w.u16(name.len() as u16);
                w.bytes(name);
            }
            Control::Accept { target, conn } => {
                w.u64(*target);
                w.u64(*conn);
            }
            Control::Refuse { target, .. } => w.u64(*target),
            Control::Disconnect {
                target,
                sender,
                sent,
            } => [target, sender, sent].into_iter().for_each(|v| w.u64(*v)),
            Control::RmaRequest {
                target,
                sender,
                token,
                remote,
                write,
            } => {
                for v in [
                    target,
                    sender,
                    token,
                    &remote.key,
                    &remote.addr,
                    &remote.len,
                ] {
                    w.u64(*v);
                }
                w.u8(u8::from(*write));
            }
            Control::RmaAnswer {
                target,
                token,
                status,
            } => {
                w.u64(*target);
                w.u64(*token);
                w.u8(*status);
            }
            Control::RmaDone {
                target,
                sender,
                token,
            } => [target, sender, token].into_iter().for_each(|v| w.u64(*v)),
            Control::Ping { target, sender } | Control::Pong { target, sender } => {
                w.u64(*target);
                w.u64(*sender);
            }
        }
        b
    }

    /// The message's kind byte.
    fn kind(&self) -> u8 {
        match self {
            Control::Connect { .. } => 1,
            Control::Accept { .. } => 2,
            Control::Refuse { .. } => 3,
            Control::Disconnect { .. } => 4,
            Control::RmaRequest { .. } => 5,
            Control::RmaAnswer { .. } => 6,
            Control::RmaDone { .. } => 7,
            Control::Ping { .. } => 8,
            Control::Pong { .. } => 9,
        }
    }

    /// Decodes a message from a peer. Messages of another major version decode only as
    /// CONNECT (so they can be refused) or REFUSE (so the refusal can be reported).
    pub fn decode(b: &[u8]) -> Result<Control, String> {
        let mut r = Reader::new(b);
        let header = (|| Ok((r.array()?, r.u16()?, r.u16()?, r.u8()?)))();
        let (magic, major, _minor, kind) = header.map_err(read_error)?;
        if magic != MAGIC {
            return Err("not a ferry ofi control message".into());
        }
        if !(1..=9).contains(&kind) {
            return Err(format!("unknown control message kind {kind}"));
        }
        if major != MAJOR && kind != 1 && kind != 3 {
            return Err(format!("kind {kind} from protocol version {major}"));
        }
        // Trailing bytes are left unread: later minors may extend a body.
        Self::body(kind, major, &mut r).map_err(read_error)
    }

    /// The body of a message of a known `kind`.
    fn body(kind: u8, major: u16, r: &mut Reader<'_>) -> Result<Control, ReadError> {
        match kind {
            1 => {
                let conn = r.u64()?;
                let name = r.bytes_u16(MAX_NAME)?;
                if name.is_empty() {
                    return Err(ReadError::TooLong {
                        len: 0,
                        max: MAX_NAME,
                    });
                }
                let name = name.to_vec();
                Ok(Control::Connect { major, conn, name })
            }
            3 => Ok(Control::Refuse {
                target: r.u64()?,
                major,
            }),
            2 => Ok(Control::Accept {
                target: r.u64()?,
                conn: r.u64()?,
            }),
            4 => Ok(Control::Disconnect {
                target: r.u64()?,
                sender: r.u64()?,
                sent: r.u64()?,
            }),
            5 => Ok(Control::RmaRequest {
                target: r.u64()?,
                sender: r.u64()?,
                token: r.u64()?,
                remote: {
                    let key = r.u64()?;
                    let addr = r.u64()?;
                    let len = r.u64()?;
                    RemoteSlice { addr, len, key }
                },
                write: r.u8()? != 0,
            }),
            6 => Ok(Control::RmaAnswer {
                target: r.u64()?,
                token: r.u64()?,
                status: r.u8()?,
            }),
            7 => Ok(Control::RmaDone {
                target: r.u64()?,
                sender: r.u64()?,
                token: r.u64()?,
            }),
            8 => Ok(Control::Ping {
                target: r.u64()?,
                sender: r.u64()?,
            }),
            9 => Ok(Control::Pong {
                target: r.u64()?,
                sender: r.u64()?,
            }),
            _ => Err(ReadError::Invalid("unknown control message kind")),
        }
    }
}

/// Why a control message could not be read, for the log.
fn read_error(e: ReadError) -> String {
    match e {
        ReadError::Short => "control message too short".into(),
        // Only a CONNECT's name has a length (1..=MAX_NAME).
        ReadError::TooLong { len, .. } => format!("CONNECT with a {len}-byte name"),
        e => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One message of every kind (and each layout), as the golden bytes below encode them.
    fn examples() -> Vec<Control> {
        vec![
            Control::Connect {
                major: MAJOR,
                conn: 0x0102_0304_0506_0708,
                name: b"fi_sockets://10.0.0.1:7".to_vec(),
            },
            Control::Accept { target: 7, conn: 9 },
            Control::Refuse {
                target: 7,
                major: MAJOR,
            },
            Control::Disconnect {
                target: 1,
                sender: 2,
                sent: 3,
            },
            Control::RmaRequest {
                target: 1,
                sender: 2,
                token: 3,
                remote: RemoteSlice {
                    addr: 4,
                    len: 5,
                    key: 6,
                },
                write: true,
            },
            Control::RmaRequest {
                target: 1,
                sender: 2,
                token: 3,
                remote: RemoteSlice {
                    addr: 4,
                    len: 5,
                    key: 6,
                },
                write: false,
            },
            Control::RmaAnswer {
                target: 1,
                token: 2,
                status: 3,
            },
            Control::RmaDone {
                target: 1,
                sender: 2,
                token: 3,
            },
            Control::Ping {
                target: 1,
                sender: 2,
            },
            Control::Pong {
                target: 3,
                sender: 4,
            },
        ]
    }

    #[test]
    fn round_trips() {
        for m in examples() {
            // All but CONNECT fit ofi_rxm's 64-byte inject size, so they need no registration.
            assert!(m.encode().len() <= 64 || matches!(m, Control::Connect { .. }));
            assert_eq!(Control::decode(&m.encode()), Ok(m));
        }
    }

    #[test]
    fn other_major_decodes_only_as_connect_or_refuse() {
        let c = Control::Connect {
            major: MAJOR + 1,
            conn: 1,
            name: vec![1],
        };
        assert_eq!(Control::decode(&c.encode_as(MAJOR + 1)), Ok(c));
        let a = Control::Accept { target: 1, conn: 2 };
        assert!(Control::decode(&a.encode_as(MAJOR + 1)).is_err());
        let r = Control::Refuse {
            target: 1,
            major: MAJOR + 1,
        };
        assert_eq!(Control::decode(&r.encode_as(MAJOR + 1)), Ok(r));
    }

    #[test]
    fn rejects_bad_names_and_short_input() {
        let mut m = Control::Connect {
            major: MAJOR,
            conn: 1,
            name: vec![0; 4],
        }
        .encode();
        m.truncate(m.len() - 1);
        assert!(Control::decode(&m).is_err());
        assert!(Control::decode(b"FOFI").is_err());
        assert!(Control::decode(b"XXXX\x01\x00\x00\x00\x02").is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = Control::decode(&b);
            let mut framed = MAGIC.to_vec();
            framed.extend_from_slice(&b);
            let _ = Control::decode(&framed);
        }
    }

    /// The bytes of one message of every kind, as the hand-written codec produced them: the
    /// wire must not change.
    #[test]
    fn golden_bytes() {
        let got: Vec<String> = examples()
            .iter()
            .map(|m| ferry_wire::bench::to_hex(&m.encode()))
            .collect();
        assert_eq!(got, GOLDEN);
    }

    const GOLDEN: &[&str] = &[
        "464f464901000100010807060504030201170066695f736f636b6574733a2f2f31302e302e302e313a37",
        "464f4649010001000207000000000000000900000000000000",
        "464f464901000100030700000000000000",
        "464f46490100010004010000000000000002000000000000000300000000000000",
        "464f4649010001000501000000000000000200000000000000030000000000000006000000000000000400000000000000050000000000000001",
        "464f4649010001000501000000000000000200000000000000030000000000000006000000000000000400000000000000050000000000000000",
        "464f464901000100060100000000000000020000000000000003",
        "464f46490100010007010000000000000002000000000000000300000000000000",
        "464f4649010001000801000000000000000200000000000000",
        "464f4649010001000903000000000000000400000000000000",
    ];

    /// Decoding speed of the golden frames (a quick A/B for codec changes):
    /// `cargo test --release -p ferry-fabric --lib ofi::wire::tests::decode_speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing; run in release with --ignored"]
    fn decode_speed() {
        let frames: Vec<Vec<u8>> = GOLDEN
            .iter()
            .map(|h| ferry_wire::bench::from_hex(h))
            .collect();
        let ns = ferry_wire::bench::ns_per_decode(&frames, 200_000, Control::decode);
        println!("ofi control decode: {ns:.1} ns/frame");
    }
}
