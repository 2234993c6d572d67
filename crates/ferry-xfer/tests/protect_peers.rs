//! Data protection against peers of other versions (protocol 1.9, docs/protocol.md "Data
//! protection"): a real in-process server on loopback, driven frame by frame over TLS. A
//! server whose `[security] protection` is set refuses a client older than 1.9 and a 1.9
//! client that skips PROTECT, each with a clear error; a default server serves older
//! clients as 1.8 did; PROTECT comes once. PACKs to a 1.10 client travel clear, tagged
//! (`integrity`) or sealed in place (`private`) with the session's keys; to a 1.9 client,
//! sealed by TLS as before.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ferry_service::secure::Level;
use ferry_xfer::config::{AuthConfig, RootConfig, ServerConfig};
use ferry_xfer::link::Link;
use ferry_xfer::proto::{self, ErrorCode, Msg, BLOCK_HEADER_LEN};
use ferry_xfer::server::Server;

const T: Duration = Duration::from_secs(10);

/// A tcp server on loopback allowing `protection` (`None`: the default); its address.
fn start(protection: Option<Vec<Level>>) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ferry-protect-peers-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a"), b"abc").unwrap();
    std::fs::write(dir.join("b"), b"hello").unwrap();
    let mut cfg = ServerConfig {
        listen: vec!["tcp://127.0.0.1:0".into()],
        block_size: 64 * 1024,
        ring: 4,
        auth: AuthConfig {
            tokens: vec!["tok".into()],
            anonymous: false,
            ..AuthConfig::default()
        },
        roots: vec![RootConfig {
            name: "d".into(),
            path: dir,
            read_only: false,
        }],
        ..ServerConfig::default()
    };
    cfg.security.protection = protection;
    let server = Server::new(cfg).unwrap();
    let listeners = server.bind().unwrap();
    let addr = listeners[0].local_addr();
    std::thread::spawn(move || server.serve(&listeners));
    addr
}

/// Connects over TLS and sends the HELLO of a client of `minor`; the link and the answer.
fn hello(addr: &str, minor: u16) -> (Link, Msg) {
    let mut link = common::connect(addr, T);
    assert!(link.secure().is_some());
    link.post_ring(1, BLOCK_HEADER_LEN + 64 * 1024).unwrap();
    link.send(&Msg::Hello {
        major: proto::VERSION_MAJOR,
        minor,
        block_size: 64 * 1024,
        session: 0,
        stream: 0,
        token: "tok".into(),
    })
    .unwrap();
    let answer = link.recv_msg().unwrap();
    link.post_ring(4, BLOCK_HEADER_LEN + 64 * 1024).unwrap();
    (link, answer)
}

fn refusal(m: &Msg) -> (ErrorCode, &str) {
    match m {
        Msg::Error { code, message, .. } => (*code, message.as_str()),
        m => panic!("expected ERROR, got {m:?}"),
    }
}

#[test]
fn a_server_with_a_protection_policy_refuses_unprotected_clients() {
    let addr = start(Some(vec![Level::Integrity]));
    // A 1.8 client: refused at its HELLO, told what to do.
    let (_, m) = hello(&addr, proto::MINOR_PROTECT - 1);
    let (code, says) = refusal(&m);
    assert_eq!(code, ErrorCode::AuthRefused);
    assert!(says.contains("upgrade the client"), "{says}");
    // A 1.9 client that asks for data before it agreed on a level.
    let (mut link, m) = hello(&addr, proto::VERSION_MINOR);
    assert!(matches!(m, Msg::Welcome { .. }), "{m:?}");
    link.send(&Msg::Stat { path: "d/a".into() }).unwrap();
    let m = link.recv_msg().unwrap();
    let (code, says) = refusal(&m);
    assert_eq!(code, ErrorCode::AuthRefused);
    assert!(says.contains("data protection level"), "{says}");
    // One that agrees is served, and may not agree twice.
    let (mut link, _) = hello(&addr, proto::VERSION_MINOR);
    link.send(&Msg::Protect {
        level: Level::Integrity.code(),
    })
    .unwrap();
    assert_eq!(link.recv_msg().unwrap(), Msg::Ok { file_id: 0 });
    link.send(&Msg::Stat { path: "d/a".into() }).unwrap();
    assert!(matches!(link.recv_msg().unwrap(), Msg::Entry(e) if e.size == 3));
    link.send(&Msg::Protect {
        level: Level::Clear.code(),
    })
    .unwrap();
    assert_eq!(refusal(&link.recv_msg().unwrap()).0, ErrorCode::BadRequest);
    // An unknown level is refused, not taken for another.
    let (mut link, _) = hello(&addr, proto::VERSION_MINOR);
    link.send(&Msg::Protect { level: 9 }).unwrap();
    let m = link.recv_msg().unwrap();
    assert!(refusal(&m).1.contains("an unknown level"), "{m:?}");
}

#[test]
fn a_default_server_serves_older_clients_as_before() {
    let addr = start(None);
    let (mut link, m) = hello(&addr, proto::MINOR_PROTECT - 1);
    assert!(matches!(m, Msg::Welcome { .. }), "{m:?}");
    link.send(&Msg::Stat { path: "d/a".into() }).unwrap();
    assert!(matches!(link.recv_msg().unwrap(), Msg::Entry(e) if e.size == 3));
}

/// A 1.9 client may send its PROTECT right behind its HELLO, before WELCOME comes (a
/// round trip sooner): the server answers WELCOME, then OK, and serves the requests after.
#[test]
fn a_protect_may_travel_with_the_hello() {
    let addr = start(Some(vec![Level::Integrity]));
    let mut link = common::connect(&addr, T);
    link.post_ring(4, BLOCK_HEADER_LEN + 64 * 1024).unwrap();
    link.send(&Msg::Hello {
        major: proto::VERSION_MAJOR,
        minor: proto::VERSION_MINOR,
        block_size: 64 * 1024,
        session: 0,
        stream: 0,
        token: "tok".into(),
    })
    .unwrap();
    link.send(&Msg::Protect {
        level: Level::Integrity.code(),
    })
    .unwrap();
    let m = link.recv_msg().unwrap();
    assert!(matches!(m, Msg::Welcome { .. }), "{m:?}");
    assert_eq!(link.recv_msg().unwrap(), Msg::Ok { file_id: 0 });
    link.send(&Msg::Stat { path: "d/a".into() }).unwrap();
    assert!(matches!(link.recv_msg().unwrap(), Msg::Entry(e) if e.size == 3));
}

/// Agrees on `level` on a link (after [`hello`]).
fn agree(link: &mut Link, level: Level) {
    link.send(&Msg::Protect {
        level: level.code(),
    })
    .unwrap();
    assert_eq!(link.recv_msg().unwrap(), Msg::Ok { file_id: 0 });
    link.protect(level, false).unwrap();
}

/// Agrees on `integrity` on a link (after [`hello`]); its key for what it receives.
fn integrity(link: &mut Link) -> [u8; 32] {
    agree(link, Level::Integrity);
    *link.protection().recv.tag_key().unwrap()
}

/// Asks for `names` under `d/` with file ids from `first`; the answer's frame and payload.
fn gets(link: &mut Link, first: u32, names: &[&str]) -> std::io::Result<Vec<u8>> {
    link.send(&Msg::Gets {
        files: names
            .iter()
            .enumerate()
            .map(|(i, n)| (first + i as u32, format!("d/{n}")))
            .collect(),
    })
    .unwrap();
    let mut buf = Vec::new();
    link.recv_into(&mut buf)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(buf)
}

#[test]
fn packs_to_a_current_client_at_integrity_travel_clear_with_a_tag() {
    let addr = start(None);
    // 1.10: every PACK tagged, a pack of one file too, each tag in its connection's order.
    let (mut link, _) = hello(&addr, proto::MINOR_TAGGED_PACK);
    let key = integrity(&mut link);
    link.set_data_types(ferry_xfer::link::CLEAR_PACK_TYPES);
    for (seq, names) in [(0, vec!["a", "b"]), (1, vec!["b"])] {
        let buf = gets(&mut link, 10 * seq as u32 + 1, &names).unwrap();
        let (m, payload) = proto::decode(&buf).unwrap();
        let Msg::Pack { count, tag, .. } = m else {
            panic!("expected a PACK, got {m:?}");
        };
        assert_eq!(usize::from(count), names.len());
        assert_eq!(
            proto::decode_pack(count, payload).unwrap().len(),
            names.len()
        );
        let want = proto::pack_tag(&key, seq, count, payload).unwrap();
        assert_eq!(tag, Some(want), "pack {seq}");
    }
    // It came clear: a client that takes no clear PACK loses the connection to it.
    let (mut link, _) = hello(&addr, proto::MINOR_TAGGED_PACK);
    integrity(&mut link);
    assert!(gets(&mut link, 1, &["a", "b"]).is_err());
    // 1.9: sealed and untagged as before, a single file as a bare FILE.
    let (mut link, _) = hello(&addr, proto::MINOR_TAGGED_PACK - 1);
    integrity(&mut link);
    let buf = gets(&mut link, 1, &["a", "b"]).unwrap();
    let (m, _) = proto::decode(&buf).unwrap();
    assert!(
        matches!(
            m,
            Msg::Pack {
                count: 2,
                tag: None,
                ..
            }
        ),
        "{m:?}"
    );
    let buf = gets(&mut link, 11, &["b"]).unwrap();
    let (m, _) = proto::decode(&buf).unwrap();
    assert!(matches!(m, Msg::File { file_id: 11, .. }), "{m:?}");
}

#[test]
fn packs_to_a_current_client_at_private_travel_clear_sealed_in_place() {
    let addr = start(Some(vec![Level::Private]));
    let (mut link, _) = hello(&addr, proto::MINOR_TAGGED_PACK);
    agree(&mut link, Level::Private);
    link.set_data_types(ferry_xfer::link::CLEAR_PACK_TYPES);
    let check = link.protection().recv;
    for (seq, names) in [(0, vec!["a", "b"]), (1, vec!["b"])] {
        let mut buf = gets(&mut link, 10 * seq as u32 + 1, &names).unwrap();
        let (m, payload) = proto::decode(&buf).unwrap();
        let Msg::Pack {
            count, tag, sealed, ..
        } = m
        else {
            panic!("expected a PACK, got {m:?}");
        };
        assert!(sealed && tag.is_none());
        let at = buf.len() - payload.len();
        // Its frames are ciphertext: they open only under this session's key, in this place.
        assert!(proto::decode_pack(count, payload).is_err());
        let mut other = buf[at..].to_vec();
        let wrong = proto::pack_seal_context(seq + 1, count);
        assert!(check.open_frames(&wrong, &mut other).is_none());
        let context = proto::pack_seal_context(seq, count);
        let frames = check.open_frames(&context, &mut buf[at..]).expect("opens");
        let files = proto::decode_pack(count, frames).unwrap();
        assert_eq!(files.len(), names.len());
        let (Msg::File { blake3, .. }, data) = &files[0] else {
            panic!("not a FILE");
        };
        assert_eq!(blake3::hash(data).as_bytes(), blake3);
    }
    // It came clear: a client that takes no clear PACK loses the connection to it.
    let (mut link, _) = hello(&addr, proto::MINOR_TAGGED_PACK);
    agree(&mut link, Level::Private);
    assert!(gets(&mut link, 1, &["a", "b"]).is_err());
}
