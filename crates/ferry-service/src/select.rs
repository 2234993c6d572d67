//! The floor's own frames (protocol 1.6; 1.7 adds a SELECT's token proof and the TLS frame
//! of the secure channel, 1.9 a SELECT's key proof): the service selection a client may send before its face's first
//! frame, and the server's answer. Pure encode/decode, no I/O; the
//! specification is `docs/protocol.md`, "Service selection".
//!
//! They use the header every ferry face's frames use (`len u32` total length, `type u8`,
//! `flags u8`, 2 reserved zero bytes, little-endian), with type codes from
//! [`FLOOR_TYPES`], which no face uses: the server tells a SELECT from a face's first frame
//! by its type byte alone, without knowing the face's protocol. Every frame the server sends
//! is at most [`MAX_ANSWER`] bytes, under every driver's immediate size, so it crosses before
//! the client is authenticated (the server serves no RMA until then; it reads what the
//! client sends itself).

use ferry_wire::{Cx, Field, IfFlag, List, Raw, ReadError, Reader, Str, TooLong, Writer};

/// The type codes of the floor's frames; face protocols keep their codes below.
pub const FLOOR_TYPES: std::ops::RangeInclusive<u8> = 0xF0..=0xFF;
/// Header length in bytes (as in every face).
pub const HEADER_LEN: usize = 8;
/// The longest service name (bytes).
pub const MAX_NAME: usize = 32;
/// The most services one server hosts (and one SERVICES frame lists).
pub const MAX_SERVICES: usize = 8;
/// The longest token in a SELECT (bytes), as in a file-transfer HELLO.
pub const MAX_TOKEN: usize = 1024;
/// The longest message in a REFUSED (bytes).
pub const MAX_MESSAGE: usize = 256;
/// SELECT flag: a token follows the name; the floor authenticates the client before the
/// service sees the connection.
pub const SELECT_TOKEN: u8 = 1;
/// SELECT flag (protocol 1.7, TLS only): a token proof follows, the token's identifier and
/// HMAC-SHA256(token, TLS exporter value) (made by the secure channel), in place of a token.
pub const SELECT_PROOF: u8 = 2;
/// SELECT flag (protocol 1.9, TLS only): a key proof follows, the client's Ed25519 public
/// key and its signature of the TLS exporter value ([`crate::keys`]). A server older than
/// 1.9 takes it for a bad frame and closes the connection.
pub const SELECT_KEY: u8 = 4;
/// Bytes of a key proof: the public key and the signature.
pub const KEY_PROOF_LEN: usize = 32 + 64;
/// Bytes of a token's identifier in a proof.
pub const TOKEN_ID_LEN: usize = 8;
/// Bytes of a token proof: the identifier and the HMAC.
pub const PROOF_LEN: usize = TOKEN_ID_LEN + 32;
/// The longest frame a server sends: a SERVICES naming a request and [`MAX_SERVICES`]
/// services of [`MAX_NAME`] bytes (316 bytes, under the 512-byte default immediate size).
pub const MAX_ANSWER: usize = HEADER_LEN + 2 * (2 + MAX_NAME) + 2 + MAX_SERVICES * (2 + MAX_NAME);
/// The longest floor frame: a SELECT with a name and a token of the longest.
pub const MAX_FRAME: usize = HEADER_LEN + 2 + MAX_NAME + 2 + MAX_TOKEN + PROOF_LEN + KEY_PROOF_LEN;

ferry_wire::frames! {
    /// One floor frame.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Floor: u8 {
        /// Client → server, the connection's first message: the service the rest of the
        /// connection is for. The face's own first frame may follow at once, without
        /// waiting for the answer. An empty name only asks for the list (answered SERVICES).
        Select = 0xF0 {
            /// The service's name (`xfer`, ...), or empty.
            service: String as Name,
            /// The client's token (flag [`SELECT_TOKEN`]), checked by the floor before the
            /// service sees the connection; without it the service checks the token its own
            /// first frame carries.
            token: Option<String> as IfFlag<SELECT_TOKEN, Str<MAX_TOKEN>>,
            /// The proof of the client's token (flag [`SELECT_PROOF`], only inside TLS):
            /// its identifier and HMAC over the connection's exporter value.
            proof: Option<([u8; 8], [u8; 32])> as IfFlag<SELECT_PROOF, (Raw, Raw)>,
            /// The proof of the client's key (flag [`SELECT_KEY`], only inside TLS): its
            /// public key and signature of the connection's exporter value.
            key: Option<([u8; 32], [u8; 64])> as IfFlag<SELECT_KEY, (Raw, Raw)>,
        },
        /// Server → client: the service was selected; the face's frames follow.
        Selected = 0xF1,
        /// Server → client: this server does not run the service asked for; the connection
        /// closes after it.
        Services = 0xF2 {
            /// The name the client asked for.
            requested: String as Name,
            /// The services this server runs.
            hosted: Vec<String> as List<Name, MAX_SERVICES>,
        },
        /// Server → client: the SELECT's token was refused (the answer a wrong token and an
        /// address locked out for failed tokens both get); the connection closes after it.
        Refused = 0xF3 {
            /// What the client is told.
            message: String as Str<MAX_MESSAGE>,
        },
    }
}

/// Why bytes are not a floor frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not a floor frame, or a malformed one.
    #[error("bad service-selection frame: {0}")]
    Bad(&'static str),
}

impl From<ReadError> for DecodeError {
    fn from(e: ReadError) -> Self {
        DecodeError::Bad(match e {
            ReadError::Short => "truncated",
            ReadError::TooLong { .. } => "a field over its limit",
            ReadError::NotUtf8 => "a name is not UTF-8",
            ReadError::Trailing(_) => "bytes after the frame",
            ReadError::Invalid(why) => why,
            ReadError::UnknownType => "unknown frame type",
        })
    }
}

/// Whether a service name is well formed: at most [`MAX_NAME`] bytes of lowercase ASCII
/// letters, digits, `-`, `_` and `.` (empty is well formed: it asks for the list).
pub fn valid_name(name: &str) -> bool {
    name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

/// A service name: `len u16` + bytes, [`valid_name`] (so a name a server sends cannot hold
/// control characters for a terminal).
struct Name;

impl Field<String> for Name {
    const MIN: usize = 2;
    const MAX: usize = 2 + MAX_NAME;
    fn put(v: &String, w: &mut Writer<'_>, _: &mut Cx<'_>, _: &'static str) -> Result<(), TooLong> {
        if !valid_name(v) {
            return Err(TooLong("service name"));
        }
        w.str_u16(v, MAX_NAME, "service name")
    }
    fn get<'a>(r: &mut Reader<'a>, _: &mut Cx<'a>) -> Result<String, ReadError> {
        let s = r.str_u16(MAX_NAME)?;
        if !valid_name(s) {
            return Err(ReadError::Invalid(
                "service name with characters outside a-z 0-9 - _ .",
            ));
        }
        Ok(s.to_owned())
    }
}

/// Whether a message is a floor frame (its type byte is in [`FLOOR_TYPES`]); anything else
/// is a face's frame.
pub fn is_floor(msg: &[u8]) -> bool {
    msg.len() >= HEADER_LEN && FLOOR_TYPES.contains(&msg[4])
}

/// Encodes a floor frame (an invalid name or too many services is an error).
pub fn encode(f: &Floor) -> Result<Vec<u8>, TooLong> {
    let mut out = Vec::with_capacity(64);
    let mut w = Writer::new(&mut out);
    w.zeros(HEADER_LEN);
    let mut cx = Cx::default();
    f.encode_body(&mut w, &mut cx)?;
    // At most MAX_FRAME bytes: fits a u32.
    let total = w.len() as u32;
    w.patch_u32(0, total);
    w.patch(4, &[f.code(), cx.flags]);
    Ok(out)
}

/// Decodes one whole message as a floor frame; never panics. Accepts only what
/// [`encode`] produces.
pub fn decode(b: &[u8]) -> Result<Floor, DecodeError> {
    let mut r = Reader::new(b);
    let len = r.u32()?;
    if len as usize != b.len() {
        return Err(DecodeError::Bad("length disagrees with the message"));
    }
    if b.len() > MAX_FRAME {
        return Err(DecodeError::Bad("longer than any floor frame"));
    }
    let t = r.u8()?;
    if !FLOOR_TYPES.contains(&t) {
        return Err(DecodeError::Bad("not a floor frame type"));
    }
    let flags = r.u8()?;
    if flags & !Floor::flags_allowed(t) != 0 || !r.zeros(2)? {
        return Err(DecodeError::Bad("unknown flags or reserved bytes set"));
    }
    let mut cx = Cx {
        flags,
        ..Cx::default()
    };
    let f = Floor::decode_body(t, &mut r, &mut cx)?;
    r.finish()?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golden() -> Vec<(&'static str, Floor)> {
        vec![
            (
                "select",
                Floor::Select {
                    service: "xfer".into(),
                    token: None,
                    proof: None,
                    key: None,
                },
            ),
            (
                "select_list",
                Floor::Select {
                    service: String::new(),
                    token: None,
                    proof: None,
                    key: None,
                },
            ),
            (
                "select_token",
                Floor::Select {
                    service: "xfer".into(),
                    token: Some("tok".into()),
                    proof: None,
                    key: None,
                },
            ),
            (
                "select_proof",
                Floor::Select {
                    service: "xfer".into(),
                    token: None,
                    proof: Some(([1; 8], [2; 32])),
                    key: None,
                },
            ),
            (
                "select_key",
                Floor::Select {
                    service: "xfer".into(),
                    token: None,
                    proof: None,
                    key: Some(([3; 32], [4; 64])),
                },
            ),
            ("selected", Floor::Selected),
            (
                "services",
                Floor::Services {
                    requested: "nbd".into(),
                    hosted: vec!["xfer".into(), "coll-io".into()],
                },
            ),
            (
                "refused",
                Floor::Refused {
                    message: "no".into(),
                },
            ),
        ]
    }

    /// The bytes of each floor frame as specified in docs/protocol.md: the wire must not
    /// change.
    #[test]
    fn golden_bytes() {
        let got: Vec<(&str, String)> = golden()
            .into_iter()
            .map(|(n, f)| (n, ferry_wire::bench::to_hex(&encode(&f).unwrap())))
            .collect();
        assert_eq!(got.len(), GOLDEN.len(), "golden table out of date");
        for ((n, h), (gn, gh)) in got.iter().zip(GOLDEN) {
            assert_eq!(
                (*n, h.as_str()),
                (*gn, *gh),
                "frame {n} changed on the wire"
            );
        }
        for (n, f) in golden() {
            let b = encode(&f).unwrap();
            assert!(is_floor(&b), "{n}");
            assert_eq!(decode(&b).unwrap(), f, "{n}");
        }
    }

    const GOLDEN: &[(&str, &str)] = &[
        ("select", "0e000000f0000000040078666572"),
        ("select_list", "0a000000f00000000000"),
        ("select_token", "13000000f00100000400786665720300746f6b"),
        (
            "select_proof",
            "36000000f002000004007866657201010101010101010202020202020202020202020202020202020202020202020202020202020202",
        ),
        ("select_key", "6e000000f0040000040078666572030303030303030303030303030303030303030303030303030303030303030304040404040404040404040404040404040404040404040404040404040404040404040404040404040404040404040404040404040404040404040404040404"),
        ("selected", "08000000f1000000"),
        (
            "services",
            "1e000000f200000003006e626402000400786665720700636f6c6c2d696f",
        ),
        ("refused", "0c000000f300000002006e6f"),
    ];
}
