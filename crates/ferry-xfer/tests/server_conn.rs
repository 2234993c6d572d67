//! A real server (in-process, on loopback) driven frame by frame by a hand-written client:
//! version and auth refusals, ranged GETs, requests this version refuses, and a client that
//! breaks the protocol losing only its own connection.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ferry_xfer::client::{Client, Options};
use ferry_xfer::config::{AuthConfig, RootConfig, ServerConfig};
use ferry_xfer::link::Link;
use ferry_xfer::proto::{self, BlockHeader, ErrorCode, Msg, BLOCK_HEADER_LEN};
use ferry_xfer::server::Server;

const T: Duration = Duration::from_secs(10);

/// Starts a server exporting a fresh directory as `d`; returns its address and the directory.
fn start(driver: &str, anonymous: bool) -> (String, std::path::PathBuf) {
    start_with(driver, anonymous, false)
}

/// [`start`], with memory mode (the virtual root `mem`) on or off.
fn start_with(driver: &str, anonymous: bool, mem: bool) -> (String, std::path::PathBuf) {
    start_cfg(driver, |c| {
        c.mem = mem;
        c.auth.anonymous = anonymous;
    })
}

/// [`start`], with the configuration changed by `tweak`.
fn start_cfg(driver: &str, tweak: impl FnOnce(&mut ServerConfig)) -> (String, std::path::PathBuf) {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ferry-xfer-conn-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let listen = match driver {
        "ofi+shm" => format!("ofi+shm://ferry-xfer-conn-{}-{n}", std::process::id()),
        d => format!("{d}://127.0.0.1:0"),
    };
    let cfg = ServerConfig {
        listen: vec![listen],
        block_size: 64 * 1024,
        ring: 4,
        auth: AuthConfig {
            tokens: vec!["tok".into()],
            anonymous: false,
            ..AuthConfig::default()
        },
        roots: vec![RootConfig {
            name: "d".into(),
            path: dir.clone(),
            read_only: false,
        }],
        ..ServerConfig::default()
    };
    let mut cfg = cfg;
    tweak(&mut cfg);
    let server = Server::new(cfg).unwrap();
    let listeners = server.bind().unwrap();
    let addr = listeners[0].local_addr();
    std::thread::spawn(move || server.serve(&listeners));
    (addr, dir)
}

/// Connects and sends HELLO; returns the link and the server's answer.
fn hello(addr: &str, major: u16, token: &str) -> (Link, Msg) {
    let mut link = common::connect(addr, T);
    link.post_ring(1, proto::MAX_CONTROL).unwrap();
    link.send(&Msg::Hello {
        major,
        minor: 0,
        block_size: 64 * 1024,
        session: 0,
        stream: 0,
        token: token.into(),
    })
    .unwrap();
    let answer = link.recv_msg().unwrap();
    (link, answer)
}

/// Connects and sends HELLO as a client of `minor` with a 64 KiB block, as `ferry cp` does
/// (the handshake's buffer holds a block too); once answered, posts 4 block-sized buffers.
fn hello_minor(addr: &str, minor: u16) -> (Link, Msg) {
    let mut link = common::connect(addr, T);
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

fn code(m: &Msg) -> ErrorCode {
    match m {
        Msg::Error { code, .. } => *code,
        m => panic!("expected ERROR, got {m:?}"),
    }
}

#[test]
fn version_and_auth_refusals() {
    let (addr, _) = start("tcp", false);
    assert_eq!(code(&hello(&addr, 2, "tok").1), ErrorCode::VersionMismatch);
    let (_, m) = hello(&addr, proto::VERSION_MAJOR, "");
    assert_eq!(code(&m), ErrorCode::AuthRefused);
    assert!(format!("{m:?}").contains("FERRY_TOKEN"));
    assert_eq!(
        code(&hello(&addr, 1, "tok-but-longer").1),
        ErrorCode::AuthRefused
    );
    assert!(matches!(
        hello(&addr, 1, "tok").1,
        Msg::Welcome {
            block_size: 65536,
            ..
        }
    ));
    // Anonymous servers take anyone.
    let (addr, _) = start("tcp", true);
    assert!(matches!(hello(&addr, 1, "").1, Msg::Welcome { .. }));
}

/// GET of a range returns exactly it, with FILE_DONE carrying no hash; an offset past the
/// end is refused, and the connection stays usable.
fn ranges_and_refusals(driver: &str) {
    let (addr, dir) = start(driver, false);
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
    std::fs::write(dir.join("f"), &data).unwrap();
    let (mut link, m) = hello(&addr, 1, "tok");
    assert!(matches!(m, Msg::Welcome { .. }));
    link.post_ring(4, BLOCK_HEADER_LEN + 64 * 1024).unwrap();
    link.send(&Msg::Get {
        file_id: 9,
        offset: 70_000,
        length: 100_000,
        path: "d/f".into(),
    })
    .unwrap();
    assert!(matches!(
        link.recv_msg().unwrap(),
        Msg::Ready {
            file_id: 9,
            size: 200_000,
            ..
        }
    ));
    let mut got = Vec::new();
    let mut buf = Vec::new();
    loop {
        link.recv_into(&mut buf).unwrap();
        match proto::decode(&buf).unwrap() {
            (Msg::Block(h), payload) => {
                assert_eq!(h.offset, 70_000 + got.len() as u64);
                assert_eq!(crc32c::crc32c(payload), h.crc32c);
                got.extend_from_slice(payload);
            }
            (
                Msg::FileDone {
                    file_id,
                    length,
                    blake3,
                },
                _,
            ) => {
                assert_eq!((file_id, length, blake3), (9, 100_000, None));
                break;
            }
            (m, _) => panic!("unexpected {m:?}"),
        }
    }
    assert!(got == data[70_000..170_000]);
    link.send(&Msg::Get {
        file_id: 10,
        offset: 200_001,
        length: 1,
        path: "d/f".into(),
    })
    .unwrap();
    assert_eq!(code(&link.recv_msg().unwrap()), ErrorCode::BadRequest);
    link.send(&Msg::Stat { path: "d/f".into() }).unwrap();
    assert!(matches!(link.recv_msg().unwrap(), Msg::Entry(e) if e.size == 200_000));
}

/// Sends `data[from..]` of transfer `file_id` as 64 KiB BLOCKs.
fn send_blocks(link: &Link, file_id: u32, data: &[u8], from: usize, to: usize) {
    let mut pos = from;
    while pos < to {
        let n = (to - pos).min(64 * 1024);
        let h = BlockHeader {
            file_id,
            stream: 0,
            offset: pos as u64,
            len: n as u32,
            crc32c: crc32c::crc32c(&data[pos..pos + n]),
            spans: false,
        };
        let mut v = proto::encode_block_header(&h).unwrap().to_vec();
        v.extend_from_slice(&data[pos..pos + n]);
        let buf = link.socket().alloc(v.len()).unwrap();
        buf.write_at(0, &v).unwrap();
        link.socket()
            .send(buf, ferry_exs::proto::Flags::NONE, u64::MAX);
        pos += n;
    }
}

fn put(link: &mut Link, file_id: u32, size: u64, mtime: i64) -> Msg {
    link.send(&Msg::Put {
        file_id,
        flags: proto::PUT_RESUME,
        mode: 0o640,
        size,
        mtime: Some(mtime),
        path: "d/r".into(),
    })
    .unwrap();
    link.recv_msg().unwrap()
}

/// Protocol 1.1 upload resume, frame by frame: a PUT cut off by a dropped connection leaves
/// a journaled part; PUT with RESUME of the same source continues at the journaled offset
/// (READY's `offset`) and lands the whole file with the source's mtime; a PUT with RESUME
/// of another mtime starts over at 0.
fn resume_put(driver: &str) {
    let (addr, dir) = start(driver, false);
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i * 13 + i / 7) as u8).collect();
    let size = data.len() as u64;
    let mtime = 1_700_000_000_123_456_789i64;
    let (mut link, _) = hello(&addr, 1, "tok");
    link.post_ring(4, BLOCK_HEADER_LEN + 64 * 1024).unwrap();
    assert_eq!(
        put(&mut link, 1, size, mtime),
        Msg::Ready {
            file_id: 1,
            size,
            mode: 0o640,
            offset: 0
        }
    );
    // Eight blocks, then the connection drops.
    send_blocks(&link, 1, &data, 0, 8 * 64 * 1024);
    std::thread::sleep(Duration::from_millis(300));
    link.close();
    drop(link);
    let journal = dir.join(".r.ferry-part.journal");
    let t = std::time::Instant::now();
    let offset = loop {
        let (mut link, _) = hello(&addr, 1, "tok");
        link.post_ring(4, BLOCK_HEADER_LEN + 64 * 1024).unwrap();
        match put(&mut link, 2, size, mtime) {
            Msg::Ready { offset, .. } => {
                assert!(journal.exists());
                assert_eq!(offset, 8 * 64 * 1024, "the journaled prefix");
                send_blocks(&link, 2, &data, offset as usize, data.len());
                link.send(&Msg::FileDone {
                    file_id: 2,
                    length: size,
                    blake3: Some(*blake3::hash(&data).as_bytes()),
                })
                .unwrap();
                assert_eq!(link.recv_msg().unwrap(), Msg::Ok { file_id: 2 });
                break offset;
            }
            m => {
                assert_eq!(code(&m), ErrorCode::Unavailable);
                assert!(t.elapsed() < Duration::from_secs(30));
            }
        }
    };
    assert!(offset > 0);
    assert!(std::fs::read(dir.join("r")).unwrap() == data);
    assert!(!journal.exists() && !dir.join(".r.ferry-part").exists());
    let md = std::fs::metadata(dir.join("r")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_700_000_000, 123_456_789));
    // A part of another source (mtime differs) is not continued: it starts over.
    let (mut link, _) = hello(&addr, 1, "tok");
    link.post_ring(4, BLOCK_HEADER_LEN + 64 * 1024).unwrap();
    assert!(matches!(
        put(&mut link, 3, size, mtime),
        Msg::Ready { offset: 0, .. }
    ));
    send_blocks(&link, 3, &data, 0, 4 * 64 * 1024);
    std::thread::sleep(Duration::from_millis(300));
    link.close();
    drop(link);
    let t = std::time::Instant::now();
    loop {
        let (mut link, _) = hello(&addr, 1, "tok");
        link.post_ring(4, BLOCK_HEADER_LEN + 64 * 1024).unwrap();
        match put(&mut link, 4, size, mtime + 1) {
            Msg::Ready { offset, .. } => {
                assert_eq!(offset, 0);
                break;
            }
            m => {
                assert_eq!(code(&m), ErrorCode::Unavailable);
                assert!(t.elapsed() < Duration::from_secs(30));
            }
        }
    }
}

/// A newer PUT of a file takes over from a connection still writing it (a client that
/// vanished without the fabric noticing): the older PUT journals and is cut off, the newer
/// one continues from the journaled prefix at once.
#[test]
fn newer_put_takes_over() {
    let (addr, dir) = start("tcp", false);
    let data: Vec<u8> = (0..600_000u32).map(|i| (i * 31 + i / 3) as u8).collect();
    let size = data.len() as u64;
    let (mut old, _) = hello(&addr, 1, "tok");
    old.post_ring(4, BLOCK_HEADER_LEN + 64 * 1024).unwrap();
    assert!(matches!(
        put(&mut old, 1, size, 5),
        Msg::Ready { offset: 0, .. }
    ));
    send_blocks(&old, 1, &data, 0, 4 * 64 * 1024);
    std::thread::sleep(Duration::from_millis(300));
    // `old` stays open and silent; a new connection resumes the same file.
    let (mut new, _) = hello(&addr, 1, "tok");
    new.post_ring(4, BLOCK_HEADER_LEN + 64 * 1024).unwrap();
    let t = std::time::Instant::now();
    let offset = match put(&mut new, 2, size, 5) {
        Msg::Ready { offset, .. } => offset,
        m => panic!("expected READY, got {m:?}"),
    };
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(offset, 4 * 64 * 1024, "the older PUT journaled what it had");
    send_blocks(&new, 2, &data, offset as usize, data.len());
    new.send(&Msg::FileDone {
        file_id: 2,
        length: size,
        blake3: Some(*blake3::hash(&data).as_bytes()),
    })
    .unwrap();
    assert_eq!(new.recv_msg().unwrap(), Msg::Ok { file_id: 2 });
    assert!(std::fs::read(dir.join("r")).unwrap() == data);
    // The superseded connection was closed.
    old.timeout = Duration::from_secs(5);
    assert!(old.recv_msg().is_err());
}

#[test]
fn resume_put_tcp() {
    resume_put("tcp");
}

#[test]
fn resume_put_ofi_shm() {
    resume_put("ofi+shm");
}

#[test]
fn ranges_and_refusals_tcp() {
    ranges_and_refusals("tcp");
}

#[test]
fn ranges_and_refusals_ofi_shm() {
    ranges_and_refusals("ofi+shm");
}

/// A client that sends a BLOCK where a request belongs is disconnected; a client connected
/// meanwhile is unaffected.
#[test]
fn protocol_breaker_loses_only_its_connection() {
    let (addr, dir) = start("tcp", false);
    std::fs::write(dir.join("a"), b"abc").unwrap();
    let mut good = Client::connect(
        &addr,
        &Options {
            token: "tok".into(),
            security: common::security(),
            ..Options::default()
        },
    )
    .unwrap();
    let (mut bad, m) = hello(&addr, 1, "tok");
    assert!(matches!(m, Msg::Welcome { .. }));
    let mut frame = proto::encode_block_header(&BlockHeader {
        file_id: 1,
        stream: 0,
        offset: 0,
        len: 3,
        crc32c: 0,
        spans: false,
    })
    .unwrap()
    .to_vec();
    frame.extend_from_slice(b"xyz");
    let sb = bad.socket().alloc(frame.len()).unwrap();
    sb.write_at(0, &frame).unwrap();
    bad.socket().send(sb, ferry_exs::proto::Flags::NONE, 1);
    bad.timeout = T;
    assert!(
        bad.recv_msg().is_err(),
        "the server must close the connection"
    );
    assert_eq!(good.stat("d/a").unwrap().size, 3);
    assert_eq!(good.list("").unwrap()[0].name, "d");
    good.bye();
}

/// Connects and sends HELLO joining `session` as `stream`; returns the link and the answer.
fn join(addr: &str, session: u64, stream: u16, token: &str) -> (Link, Msg) {
    let mut link = common::connect(addr, T);
    link.post_ring(1, proto::MAX_CONTROL).unwrap();
    link.send(&Msg::Hello {
        major: proto::VERSION_MAJOR,
        minor: proto::VERSION_MINOR,
        block_size: 64 * 1024,
        session,
        stream,
        token: token.into(),
    })
    .unwrap();
    let answer = link.recv_msg().unwrap();
    (link, answer)
}

/// A stream naming a session that does not exist (or with another token, or numbered 0)
/// is refused with a clear error; the server keeps serving, and a real session's streams
/// join it.
fn bogus_sessions(driver: &str) {
    let (addr, dir) = start(driver, true);
    std::fs::write(dir.join("a"), b"abc").unwrap();
    let (_, m) = join(&addr, 0xdead_beef, 1, "tok");
    assert_eq!(code(&m), ErrorCode::BadRequest);
    assert!(format!("{m:?}").contains("unknown session"), "{m:?}");
    // Stream 0 of a session, and a stream of no session.
    let (s0, m) = join(&addr, 0, 0, "tok");
    let session = match m {
        Msg::Welcome { session, minor, .. } => {
            assert!(minor >= proto::MINOR_STREAMS);
            session
        }
        m => panic!("expected WELCOME, got {m:?}"),
    };
    assert_ne!(session, 0);
    let (_, m) = join(&addr, 0, 3, "tok");
    assert_eq!(code(&m), ErrorCode::BadRequest);
    let (_, m) = join(&addr, session, 0, "tok");
    assert_eq!(code(&m), ErrorCode::BadRequest);
    let (_, m) = join(&addr, session, proto::MAX_STREAMS, "tok");
    assert_eq!(code(&m), ErrorCode::BadRequest);
    // Another client (anonymous here) cannot join a session opened with a token.
    let (_, m) = join(&addr, session, 1, "");
    assert_eq!(code(&m), ErrorCode::AuthRefused);
    // The right token joins, and the joined stream serves requests.
    let (mut s1, m) = join(&addr, session, 1, "tok");
    assert!(
        matches!(m, Msg::Welcome { session: s, .. } if s == session),
        "{m:?}"
    );
    s1.post_ring(2, proto::MAX_CONTROL).unwrap();
    s1.send(&Msg::Stat { path: "d/a".into() }).unwrap();
    assert!(matches!(s1.recv_msg().unwrap(), Msg::Entry(e) if e.size == 3));
    // Once every stream is gone the session is too.
    drop((s0, s1));
    std::thread::sleep(Duration::from_millis(300));
    let (_, m) = join(&addr, session, 1, "tok");
    assert_eq!(code(&m), ErrorCode::BadRequest);
    // Others are still served.
    let mut c = Client::connect(
        &addr,
        &Options {
            token: "tok".into(),
            security: common::security(),
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(c.stat("d/a").unwrap().size, 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bogus_sessions_tcp() {
    bogus_sessions("tcp");
}

#[test]
fn bogus_sessions_ofi_shm() {
    bogus_sessions("ofi+shm");
}

/// The answer to a whole-file GET of `path` (transfer `id`): the frame and its payload.
fn get_whole(link: &mut Link, id: u32, path: &str) -> (Msg, Vec<u8>) {
    link.send(&Msg::Get {
        file_id: id,
        offset: 0,
        length: u64::MAX,
        path: path.into(),
    })
    .unwrap();
    let mut buf = Vec::new();
    link.recv_into(&mut buf).unwrap();
    let (m, payload) = proto::decode(&buf).unwrap();
    (m, payload.to_vec())
}

/// Reads the rest of a READY → BLOCKs → FILE_DONE answer; the bytes and FILE_DONE's hash.
fn rest_of_blocks(link: &mut Link) -> (Vec<u8>, Option<[u8; 32]>) {
    let mut got = Vec::new();
    let mut buf = Vec::new();
    loop {
        link.recv_into(&mut buf).unwrap();
        match proto::decode(&buf).unwrap() {
            (Msg::Block(h), payload) => {
                assert_eq!(crc32c::crc32c(payload), h.crc32c);
                got.extend_from_slice(payload);
            }
            (Msg::FileDone { blake3, .. }, _) => return (got, blake3),
            (m, _) => panic!("unexpected {m:?}"),
        }
    }
}

/// The CRC-32C a FILE frame of `bytes` carries to a client of `minor`: none (0) from 1.12
/// on, where the client checks the frame's hash alone.
fn file_crc(minor: u16, bytes: &[u8]) -> u32 {
    if minor < proto::MINOR_FILE_HASH_ONLY {
        crc32c::crc32c(bytes)
    } else {
        0
    }
}

/// A 1.3 client gets a whole small file (up to the block size less 24 bytes) as one FILE
/// frame with the file's CRC-32C, BLAKE3 and mode (a 1.12 client CRC 0: it checks the
/// hash alone); a larger file, a ranged GET, and any GET of a client older than 1.3 get
/// READY, BLOCKs, FILE_DONE.
fn small_files_in_one_frame(driver: &str) {
    use std::os::unix::fs::PermissionsExt;
    let (addr, dir) = start(driver, false);
    let fits = 64 * 1024 - (proto::FILE_HEADER_LEN - BLOCK_HEADER_LEN);
    let data: Vec<u8> = (0..fits as u32 + 1).map(|i| (i * 13 + 5) as u8).collect();
    std::fs::write(dir.join("fits"), &data[..fits]).unwrap();
    std::fs::set_permissions(dir.join("fits"), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::write(dir.join("over"), &data).unwrap();
    std::fs::write(dir.join("empty"), b"").unwrap();
    let before = proto::MINOR_FILE_HASH_ONLY - 1;
    for minor in [before, proto::VERSION_MINOR] {
        let (mut link, m) = hello_minor(&addr, minor);
        assert!(matches!(m, Msg::Welcome { minor, .. } if minor >= proto::MINOR_FILE));
        for (id, name, len) in [(1, "fits", fits), (2, "empty", 0)] {
            match get_whole(&mut link, id, &format!("d/{name}")) {
                (
                    Msg::File {
                        file_id,
                        mode,
                        crc32c,
                        blake3,
                        len: n,
                    },
                    payload,
                ) => {
                    assert_eq!((file_id, n as usize), (id, len));
                    assert!(payload == data[..len]);
                    assert_eq!(crc32c, file_crc(minor, &data[..len]), "minor {minor}");
                    assert_eq!(blake3, *blake3::hash(&data[..len]).as_bytes());
                    if id == 1 {
                        assert_eq!(mode, 0o640);
                    }
                }
                (m, _) => panic!("{name}: expected FILE, got {m:?}"),
            }
        }
    }
    let (mut link, _) = hello_minor(&addr, proto::VERSION_MINOR);
    // One byte more than fits: the three-frame answer, whole and hashed.
    let (m, _) = get_whole(&mut link, 3, "d/over");
    assert!(matches!(m, Msg::Ready { file_id: 3, .. }), "{m:?}");
    let (got, hash) = rest_of_blocks(&mut link);
    assert!(got == data);
    assert_eq!(hash, Some(*blake3::hash(&data).as_bytes()));
    // A ranged GET (a re-fetch) of a small file: READY, BLOCK, FILE_DONE without hash.
    link.send(&Msg::Get {
        file_id: 4,
        offset: 0,
        length: fits as u64,
        path: "d/fits".into(),
    })
    .unwrap();
    assert!(matches!(
        link.recv_msg().unwrap(),
        Msg::Ready { file_id: 4, .. }
    ));
    assert_eq!(rest_of_blocks(&mut link).0, data[..fits]);
    // A 1.0 client (HELLO minor 0) never receives FILE.
    let (mut old, m) = hello(&addr, 1, "tok");
    assert!(matches!(m, Msg::Welcome { .. }));
    old.post_ring(4, BLOCK_HEADER_LEN + 64 * 1024).unwrap();
    let (m, _) = get_whole(&mut old, 5, "d/fits");
    assert!(matches!(m, Msg::Ready { file_id: 5, .. }), "{m:?}");
    let (got, hash) = rest_of_blocks(&mut old);
    assert!(got == data[..fits]);
    assert_eq!(hash, Some(*blake3::hash(&data[..fits]).as_bytes()));
}

#[test]
fn small_files_in_one_frame_tcp() {
    small_files_in_one_frame("tcp");
}

#[test]
fn small_files_in_one_frame_ofi_shm() {
    small_files_in_one_frame("ofi+shm");
}

/// A GETS frame is answered as its GETs one by one, in order: a FILE per small file, an
/// ERROR (with its `file_id`) for one that does not exist, READY… for one too large.
#[test]
fn gets_are_answered_in_order() {
    let (addr, dir) = start("tcp", false);
    let big: Vec<u8> = (0..100_000u32).map(|i| (i * 3) as u8).collect();
    std::fs::write(dir.join("a"), b"alpha").unwrap();
    std::fs::write(dir.join("big"), &big).unwrap();
    std::fs::write(dir.join("b"), b"beta").unwrap();
    let (mut link, m) = hello_minor(&addr, proto::VERSION_MINOR);
    assert!(matches!(m, Msg::Welcome { .. }));
    let files = ["d/a", "d/missing", "d/big", "d/b"];
    link.send(&Msg::Gets {
        files: files
            .iter()
            .enumerate()
            .map(|(i, p)| (i as u32 + 1, p.to_string()))
            .collect(),
    })
    .unwrap();
    let mut buf = Vec::new();
    let mut next = || {
        link.recv_into(&mut buf).unwrap();
        let (m, payload) = proto::decode(&buf).unwrap();
        (m, payload.to_vec())
    };
    assert!(matches!(next(), (Msg::File { file_id: 1, len: 5, .. }, p) if p == b"alpha"));
    assert!(matches!(
        next().0,
        Msg::Error {
            file_id: 2,
            code: ErrorCode::NotFound,
            ..
        }
    ));
    assert!(matches!(
        next().0,
        Msg::Ready {
            file_id: 3,
            size: 100_000,
            ..
        }
    ));
    let mut got = Vec::new();
    loop {
        match next() {
            (Msg::Block(h), p) => {
                assert_eq!(h.file_id, 3);
                got.extend_from_slice(&p);
            }
            (
                Msg::FileDone {
                    file_id: 3, blake3, ..
                },
                _,
            ) => {
                assert_eq!(blake3, Some(*blake3::hash(&big).as_bytes()));
                break;
            }
            (m, _) => panic!("unexpected {m:?}"),
        }
    }
    assert!(got == big);
    assert!(matches!(next(), (Msg::File { file_id: 4, len: 4, .. }, p) if p == b"beta"));
}

/// To a 1.4 client the FILE frames of one GETS batch travel several to a PACK, in order,
/// as many as one receive buffer holds; any other answer (an ERROR, a large file's READY…)
/// first sends what is packed, so answers keep request order; a pack of one goes bare. A
/// 1.3 client gets bare FILE frames only.
fn packs_gather_a_gets_batch(driver: &str, mem: bool) {
    let (addr, dir) = start_with(driver, false, mem);
    let body = |i: u32, n: usize| -> Vec<u8> { (0..n as u32).map(|j| (i * 7 + j) as u8).collect() };
    // a, b, c: 3 frames fit in one 64 KiB buffer; x, y, z of 30,000 bytes: 2 do.
    let small = [
        ("a", 100),
        ("b", 0),
        ("c", 5000),
        ("x", 30_000),
        ("y", 30_000),
        ("z", 30_000),
    ];
    for (i, (name, n)) in small.iter().enumerate() {
        std::fs::write(dir.join(name), body(i as u32, *n)).unwrap();
    }
    std::fs::write(dir.join("big"), body(9, 100_000)).unwrap();
    std::fs::write(dir.join("last"), b"end").unwrap();
    let order = ["a", "b", "c", "missing", "x", "y", "z", "big", "last"];
    let expect = |name: &str| -> Vec<u8> {
        match small.iter().position(|(n, _)| *n == name) {
            Some(i) => body(i as u32, small[i].1),
            None => b"end".to_vec(),
        }
    };
    for minor in [proto::VERSION_MINOR, proto::MINOR_PACK - 1] {
        let (mut link, m) = hello_minor(&addr, minor);
        assert!(matches!(m, Msg::Welcome { .. }));
        link.send(&Msg::Gets {
            files: order
                .iter()
                .enumerate()
                .map(|(i, p)| (i as u32 + 1, format!("d/{p}")))
                .collect(),
        })
        .unwrap();
        // Each message as the file ids it answers, in arrival order.
        let mut messages: Vec<Vec<u32>> = Vec::new();
        let mut buf = Vec::new();
        while messages.last().is_none_or(|m| m != &[9]) {
            link.recv_into(&mut buf).unwrap();
            let (m, payload) = proto::decode(&buf).unwrap();
            let files = match m {
                Msg::Pack { count, .. } => {
                    assert!(minor >= proto::MINOR_PACK, "a PACK to a 1.{minor} client");
                    assert!(count >= 2, "a pack of {count}");
                    proto::decode_pack(count, payload).unwrap()
                }
                Msg::File { .. } => vec![(m, payload)],
                Msg::Error { file_id, code, .. } => {
                    assert_eq!((file_id, code), (4, ErrorCode::NotFound));
                    messages.push(vec![file_id]);
                    continue;
                }
                Msg::Ready { file_id, .. }
                | Msg::Block(proto::BlockHeader { file_id, .. })
                | Msg::FileDone { file_id, .. } => {
                    assert_eq!(file_id, 8);
                    if messages.last() != Some(&vec![8]) {
                        messages.push(vec![8]);
                    }
                    continue;
                }
                m => panic!("unexpected {m:?}"),
            };
            let mut ids = Vec::new();
            for (m, payload) in files {
                let Msg::File {
                    file_id,
                    crc32c,
                    blake3,
                    ..
                } = m
                else {
                    panic!("not a FILE: {m:?}");
                };
                let want = expect(order[file_id as usize - 1]);
                assert!(payload == &want[..], "file {file_id}");
                assert_eq!(crc32c, file_crc(minor, &want));
                assert_eq!(blake3, *blake3::hash(&want).as_bytes());
                ids.push(file_id);
            }
            messages.push(ids);
        }
        let want: Vec<Vec<u32>> = if minor >= proto::MINOR_PACK {
            vec![
                vec![1, 2, 3],
                vec![4],
                vec![5, 6],
                vec![7],
                vec![8],
                vec![9],
            ]
        } else {
            (1..=9).map(|i| vec![i]).collect()
        };
        assert_eq!(messages, want, "minor {minor}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn packs_gather_a_gets_batch_tcp() {
    packs_gather_a_gets_batch("tcp", false);
}

#[test]
fn packs_gather_a_gets_batch_ofi_shm() {
    packs_gather_a_gets_batch("ofi+shm", false);
}

/// A server in memory mode (as `ferry bench cp` runs it) packs its real files the same.
#[test]
fn packs_gather_a_gets_batch_in_memory_mode() {
    packs_gather_a_gets_batch("tcp", true);
}

/// A PUT_FILE frame of `data` to `path` (with `hash` as its BLAKE3).
fn put_file(id: u32, path: &str, data: &[u8], hash: [u8; 32]) -> Vec<u8> {
    put_file_as(id, path, data, hash, (0, 0o640))
}

/// [`put_file`] with PUT_FILE `flags` and `mode`.
fn put_file_as(
    id: u32,
    path: &str,
    data: &[u8],
    hash: [u8; 32],
    (flags, mode): (u8, u32),
) -> Vec<u8> {
    let mut v = proto::to_vec(&Msg::PutFile {
        flags,
        file_id: id,
        mode,
        mtime: 1_500_000_000_123_456_789,
        blake3: hash,
        path: path.into(),
        len: data.len() as u32,
    })
    .unwrap();
    v.extend_from_slice(data);
    v
}

/// A PACK of `frames` (PUT_FILE frames, 1.11), sealed by the channel's TLS when sent.
fn put_pack(frames: &[Vec<u8>]) -> Vec<u8> {
    let body: Vec<u8> = frames.concat();
    let mut v =
        proto::encode_pack_header(frames.len() as u16, None, false, body.len() as u32).unwrap();
    v.extend_from_slice(&body);
    v
}

/// The next `n` answers to PUT_FILEs: (file_id, None) for each committed (OK, or OKS for a
/// run of consecutive ids), (file_id, Some(code)) for each refused.
fn put_answers(link: &mut Link, n: usize) -> Vec<(u32, Option<ErrorCode>)> {
    let mut answers = Vec::new();
    while answers.len() < n {
        match link.recv_msg().unwrap() {
            Msg::Ok { file_id } => answers.push((file_id, None)),
            Msg::Oks { file_id, count } => {
                assert!(count >= 2, "a run of {count}");
                answers.extend((file_id + 1 - count..=file_id).map(|id| (id, None)));
            }
            Msg::Error { file_id, code, .. } => answers.push((file_id, Some(code))),
            m => panic!("unexpected {m:?}"),
        }
    }
    answers
}

/// PUT_FILEs sent back to back, the first as the first request after WELCOME and larger
/// than the handshake's buffer: each answered in order, OK or ERROR (or OKS for a run, to a
/// client of 1.11), without waiting for the client (the server commits them in groups; a
/// refusal waits for the files before it, and a second upload of a file lands after the
/// first). Good files land whole with their mode and mtime; a damaged one (BLAKE3) is
/// refused with Integrity, one leaving its root with PermissionDenied, and neither leaves a
/// file or a temporary behind. `packed`: all but the first in one PACK (1.11), each
/// answered as if it had come alone.
fn put_files_stream(driver: &str, minor: u16, packed: bool) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // The token may use root `d` only: a PUT_FILE to `ro` is refused by its route.
    let (addr, dir) = start_cfg(driver, |cfg| {
        cfg.roots.push(RootConfig {
            name: "ro".into(),
            path: std::env::temp_dir(),
            read_only: false,
        });
        let only_d = ferry_service::rights::Rights {
            roots: Some(vec!["d".into()]),
            ..ferry_service::rights::Rights::ALL
        };
        cfg.auth.token_rights.insert("tok".into(), only_d);
    });
    let (mut link, m) = hello_minor(&addr, minor);
    assert!(matches!(m, Msg::Welcome { minor, .. } if minor >= proto::MINOR_PUT_FILE));
    // 65,563 bytes with its header: more than the 64 KiB handshake buffer, within a block.
    let big: Vec<u8> = (0..65_500u32).map(|i| (i * 11) as u8).collect();
    let hash = |d: &[u8]| *blake3::hash(d).as_bytes();
    let mut bad_hash = hash(b"two");
    bad_hash[5] ^= 1;
    let frames = [
        put_file(1, "d/big", &big, hash(&big)),
        put_file(2, "d/two", b"two", bad_hash),
        put_file(3, "d/../../escape", b"x", hash(b"x")),
        put_file(4, "d/empty", b"", hash(b"")),
        put_file(5, "d/five", b"five", hash(b"five")),
        // The same file again: it lands after the first.
        put_file(6, "d/five", b"FIVE!", hash(b"FIVE!")),
        // Refused by the request's route (a root the token may not use), before anything
        // is read: still answered after the files before it.
        put_file(7, "ro/f", b"f", hash(b"f")),
    ];
    if packed {
        link.send_frame(&frames[0]).unwrap();
        link.send_frame(&put_pack(&frames[1..])).unwrap();
    } else {
        for f in &frames {
            link.send_frame(f).unwrap();
        }
    }
    let answers = put_answers(&mut link, frames.len());
    assert_eq!(
        answers,
        vec![
            (1, None),
            (2, Some(ErrorCode::Integrity)),
            (3, Some(ErrorCode::PermissionDenied)),
            (4, None),
            (5, None),
            (6, None),
            (7, Some(ErrorCode::NotFound))
        ]
    );
    assert!(std::fs::read(dir.join("big")).unwrap() == big);
    let md = std::fs::metadata(dir.join("big")).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o640);
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_500_000_000, 123_456_789));
    assert_eq!(std::fs::read(dir.join("empty")).unwrap(), b"");
    assert_eq!(std::fs::read(dir.join("five")).unwrap(), b"FIVE!");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["big", "empty", "five"]);
    // The connection still serves.
    link.send(&Msg::Stat {
        path: "d/five".into(),
    })
    .unwrap();
    assert!(matches!(link.recv_msg().unwrap(), Msg::Entry(e) if e.size == 5));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn put_files_stream_tcp() {
    put_files_stream("tcp", proto::VERSION_MINOR, false);
    put_files_stream("tcp", proto::MINOR_PUT_PACK - 1, false);
}

#[test]
fn put_files_stream_ofi_shm() {
    put_files_stream("ofi+shm", proto::VERSION_MINOR, false);
}

#[test]
fn put_files_packed_tcp() {
    put_files_stream("tcp", proto::VERSION_MINOR, true);
}

#[test]
fn put_files_packed_ofi_shm() {
    put_files_stream("ofi+shm", proto::VERSION_MINOR, true);
}

/// A PACK from a client of 1.10 (which has none to send), or one that carries other
/// frames than PUT_FILE, or fewer than it counts, ends that connection; the server serves
/// the next.
#[test]
fn a_bad_put_pack_ends_its_connection() {
    let (addr, dir) = start("tcp", false);
    let hash = *blake3::hash(b"x").as_bytes();
    let one = put_file(1, "d/x", b"x", hash);
    let stat = proto::to_vec(&Msg::Stat { path: "d".into() }).unwrap();
    // Two counted, one there.
    let mut short = put_pack(&[one.clone(), one.clone()]);
    short.truncate(short.len() - one.len());
    let len = (short.len() as u32).to_le_bytes();
    short[..4].copy_from_slice(&len);
    for (minor, pack) in [
        (
            proto::MINOR_PUT_PACK - 1,
            put_pack(std::slice::from_ref(&one)),
        ),
        (proto::VERSION_MINOR, put_pack(&[stat])),
        (proto::VERSION_MINOR, short),
    ] {
        let (mut link, _) = hello_minor(&addr, minor);
        link.send_frame(&pack).unwrap();
        assert!(
            link.recv_msg().is_err(),
            "minor {minor}: the connection ends"
        );
        assert!(!dir.join("x").exists());
    }
    let (mut link, _) = hello_minor(&addr, proto::VERSION_MINOR);
    link.send_frame(&put_pack(&[one])).unwrap();
    assert_eq!(put_answers(&mut link, 1), [(1, None)]);
    assert_eq!(std::fs::read(dir.join("x")).unwrap(), b"x");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sends PUT of `size` bytes to `path` with `flags` and `mode`; the server's answer.
fn put_to(link: &mut Link, file_id: u32, path: &str, (flags, mode): (u8, u32), size: u64) -> Msg {
    link.send(&Msg::Put {
        file_id,
        flags,
        mode,
        size,
        mtime: Some(1),
        path: path.into(),
    })
    .unwrap();
    link.recv_msg().unwrap()
}

/// Sends `data` as the blocks and FILE_DONE of the PUT `file_id` (after its READY); the
/// server's answer.
fn put_body(link: &mut Link, file_id: u32, data: &[u8]) -> Msg {
    send_blocks(link, file_id, data, 0, data.len());
    link.send(&Msg::FileDone {
        file_id,
        length: data.len() as u64,
        blake3: Some(*blake3::hash(data).as_bytes()),
    })
    .unwrap();
    link.recv_msg().unwrap()
}

/// The names of temporary files (parts, journals) in `dir`.
fn temporaries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".ferry-part"))
        .collect()
}

/// Waits up to 10 s for `dir` to hold no temporary files (the server notices a dropped
/// connection on its own time); the ones left, if any.
fn temporaries_gone(dir: &std::path::Path) -> Vec<String> {
    let t = std::time::Instant::now();
    loop {
        let left = temporaries(dir);
        if left.is_empty() || t.elapsed() > Duration::from_secs(10) {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn mode_of(p: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// The test process's umask (the in-process server shares it).
fn umask() -> u32 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let l = s.lines().find(|l| l.starts_with("Umask:")).unwrap();
    u32::from_str_radix(l.trim_start_matches("Umask:").trim(), 8).unwrap()
}

/// An uploaded file's mode loses setuid, setgid and sticky and gets the server's umask, by
/// PUT, PUT_FILE and OPEN/CLOSE alike (and MKDIR's); `keep_special_bits = true` keeps them.
#[test]
fn uploads_lose_special_mode_bits_unless_configured() {
    let u = umask();
    for keep in [false, true] {
        let (addr, dir) = start_cfg("tcp", |c| c.keep_special_bits = keep);
        let (mut link, _) = hello_minor(&addr, proto::VERSION_MINOR);
        let want = |m: u32| if keep { m & !u } else { m & 0o777 & !u };
        link.send_frame(&put_file_as(
            1,
            "d/small",
            b"#!/bin/sh\n",
            *blake3::hash(b"#!/bin/sh\n").as_bytes(),
            (0, 0o6777),
        ))
        .unwrap();
        assert_eq!(link.recv_msg().unwrap(), Msg::Ok { file_id: 1 });
        assert_eq!(mode_of(&dir.join("small")), want(0o6777));
        let data: Vec<u8> = (0..150_000u32).map(|i| (i * 3) as u8).collect();
        assert!(matches!(
            put_to(&mut link, 2, "d/big", (0, 0o4775), data.len() as u64),
            Msg::Ready { .. }
        ));
        assert_eq!(put_body(&mut link, 2, &data), Msg::Ok { file_id: 2 });
        assert_eq!(mode_of(&dir.join("big")), want(0o4775));
        link.send(&Msg::Mkdir {
            mode: 0o1777,
            path: "d/sub".into(),
        })
        .unwrap();
        assert_eq!(link.recv_msg().unwrap(), Msg::Ok { file_id: 0 });
        // (mkdir takes no setgid bit from its mode on Linux: it is inherited; sticky is kept.)
        assert_eq!(mode_of(&dir.join("sub")), want(0o1777));
        // A parallel upload (OPEN, PUT_RANGE, CLOSE) on the session's first stream.
        link.send(&Msg::Open {
            flags: 0,
            file_id: 3,
            mode: 0o2755,
            size: data.len() as u64,
            mtime: 1,
            path: "d/par".into(),
        })
        .unwrap();
        assert!(matches!(link.recv_msg().unwrap(), Msg::Have { .. }));
        link.send(&Msg::PutRange {
            file_id: 3,
            offset: 0,
            length: data.len() as u64,
        })
        .unwrap();
        assert!(matches!(link.recv_msg().unwrap(), Msg::Ready { .. }));
        send_blocks(&link, 3, &data, 0, data.len());
        link.send(&Msg::FileDone {
            file_id: 3,
            length: data.len() as u64,
            blake3: None,
        })
        .unwrap();
        assert_eq!(link.recv_msg().unwrap(), Msg::Ok { file_id: 3 });
        link.send(&Msg::Close {
            file_id: 3,
            length: data.len() as u64,
            blake3: Some(*blake3::hash(&data).as_bytes()),
        })
        .unwrap();
        assert_eq!(link.recv_msg().unwrap(), Msg::Ok { file_id: 3 });
        assert_eq!(mode_of(&dir.join("par")), want(0o2755));
    }
}

/// A read-only file is not replaced by PUT, PUT_FILE or OPEN unless the FORCE flag asks;
/// the refusal comes before any data moves and leaves nothing behind.
#[test]
fn read_only_files_are_replaced_only_when_forced() {
    use std::os::unix::fs::PermissionsExt;
    let (addr, dir) = start("tcp", false);
    let ro = dir.join("ro");
    std::fs::write(&ro, b"old").unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
    let (mut link, _) = hello_minor(&addr, proto::VERSION_MINOR);
    let refused = |m: &Msg| matches!(m, Msg::Error { code: ErrorCode::PermissionDenied, message, .. } if message.contains("read-only"));
    let m = put_to(&mut link, 1, "d/ro", (0, 0o644), 100_000);
    assert!(refused(&m), "{m:?}");
    let new = b"new contents";
    let hash = *blake3::hash(new).as_bytes();
    link.send_frame(&put_file_as(2, "d/ro", new, hash, (0, 0o644)))
        .unwrap();
    let m = link.recv_msg().unwrap();
    assert!(refused(&m), "{m:?}");
    link.send(&Msg::Open {
        flags: 0,
        file_id: 3,
        mode: 0o644,
        size: 100_000,
        mtime: 1,
        path: "d/ro".into(),
    })
    .unwrap();
    let m = link.recv_msg().unwrap();
    assert!(refused(&m), "{m:?}");
    assert_eq!(std::fs::read(&ro).unwrap(), b"old");
    assert_eq!(temporaries(&dir), Vec::<String>::new());
    // Forced: replaced.
    link.send_frame(&put_file_as(
        4,
        "d/ro",
        new,
        hash,
        (proto::PUT_FILE_FORCE, 0o644),
    ))
    .unwrap();
    assert_eq!(link.recv_msg().unwrap(), Msg::Ok { file_id: 4 });
    assert_eq!(std::fs::read(&ro).unwrap(), new);
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o400)).unwrap();
    assert!(matches!(
        put_to(&mut link, 5, "d/ro", (proto::PUT_FORCE, 0o644), 3),
        Msg::Ready { .. }
    ));
    assert_eq!(put_body(&mut link, 5, b"abc"), Msg::Ok { file_id: 5 });
    assert_eq!(std::fs::read(&ro).unwrap(), b"abc");
}

/// An upload onto a directory, a FIFO or a device is refused before any data moves (PUT
/// gets no READY, OPEN no HAVE), and leaves no temporary file.
#[test]
fn uploads_onto_non_files_are_refused_before_data_moves() {
    use rustix::fs::{FileType, Mode, CWD};
    let (addr, dir) = start("tcp", false);
    std::fs::create_dir(dir.join("adir")).unwrap();
    rustix::fs::mknodat(
        CWD,
        dir.join("fifo"),
        FileType::Fifo,
        Mode::from_raw_mode(0o666),
        0,
    )
    .unwrap();
    let (mut link, _) = hello_minor(&addr, proto::VERSION_MINOR);
    let data = b"payload";
    let hash = *blake3::hash(data).as_bytes();
    for (name, want) in [
        ("adir", ErrorCode::IsADirectory),
        ("fifo", ErrorCode::Unsupported),
    ] {
        let path = format!("d/{name}");
        let m = put_to(&mut link, 1, &path, (0, 0o644), 1 << 20);
        assert_eq!(code(&m), want, "PUT {name}: {m:?}");
        link.send_frame(&put_file_as(
            2,
            &path,
            data,
            hash,
            (proto::PUT_FILE_FORCE, 0o644),
        ))
        .unwrap();
        let m = link.recv_msg().unwrap();
        assert_eq!(code(&m), want, "PUT_FILE {name}: {m:?}");
        link.send(&Msg::Open {
            flags: proto::OPEN_FORCE,
            file_id: 3,
            mode: 0o644,
            size: 1 << 20,
            mtime: 1,
            path,
        })
        .unwrap();
        let m = link.recv_msg().unwrap();
        assert_eq!(code(&m), want, "OPEN {name}: {m:?}");
    }
    // A FIFO planted under a part file's name is not written into (the writes would block
    // the connection's thread once the pipe is full): refused, and removed.
    rustix::fs::mknodat(
        CWD,
        dir.join(".planted.ferry-part"),
        FileType::Fifo,
        Mode::from_raw_mode(0o666),
        0,
    )
    .unwrap();
    let m = put_to(&mut link, 5, "d/planted", (0, 0o644), 1 << 20);
    assert_eq!(code(&m), ErrorCode::Io, "{m:?}");
    assert!(dir.join("adir").is_dir());
    assert_eq!(temporaries(&dir), Vec::<String>::new());
    // The connection still serves.
    link.send_frame(&put_file_as(4, "d/adir/inside", data, hash, (0, 0o644)))
        .unwrap();
    assert_eq!(link.recv_msg().unwrap(), Msg::Ok { file_id: 4 });
}

/// A GET or SUM of a FIFO (or a device) is refused at once instead of blocking its thread
/// waiting for a writer; the connection goes on.
#[test]
fn reads_of_non_files_are_refused_at_once() {
    use rustix::fs::{FileType, Mode, CWD};
    let (addr, dir) = start("tcp", false);
    rustix::fs::mknodat(
        CWD,
        dir.join("fifo"),
        FileType::Fifo,
        Mode::from_raw_mode(0o666),
        0,
    )
    .unwrap();
    let mut names = vec!["fifo"];
    // /dev/null's device (1, 3), where this process may make device nodes (root).
    let dev = rustix::fs::makedev(1, 3);
    if rustix::fs::mknodat(
        CWD,
        dir.join("null"),
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        dev,
    )
    .is_ok()
    {
        names.push("null");
    } else {
        eprintln!("not root: the device-node case is skipped");
    }
    let (mut link, _) = hello_minor(&addr, proto::VERSION_MINOR);
    link.timeout = Duration::from_secs(5);
    for name in names {
        let t = std::time::Instant::now();
        link.send(&Msg::Get {
            file_id: 1,
            offset: 0,
            length: u64::MAX,
            path: format!("d/{name}"),
        })
        .unwrap();
        let m = link.recv_msg().unwrap();
        assert_eq!(code(&m), ErrorCode::Unsupported, "GET {name}: {m:?}");
        link.send(&Msg::Sum {
            path: format!("d/{name}"),
        })
        .unwrap();
        let m = link.recv_msg().unwrap();
        assert_eq!(code(&m), ErrorCode::Unsupported, "SUM {name}: {m:?}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
    link.send(&Msg::Stat {
        path: "d/fifo".into(),
    })
    .unwrap();
    assert!(matches!(link.recv_msg().unwrap(), Msg::Entry(_)));
}

/// Uploads that fail leave no temporary files: a PUT whose connection drops before any
/// verified data, a PUT the client abandons, one whose hash fails, an OPEN whose session
/// ends with nothing written, and a parallel upload the client abandons mid-range. (A PUT
/// cut off after verified blocks keeps its part for a resume: `resume_put_tcp`.)
#[test]
fn failed_uploads_leave_no_temporary_files() {
    let (addr, dir) = start("tcp", false);
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + 1) as u8).collect();
    let size = data.len() as u64;
    // Dropped right after READY.
    let (mut link, _) = hello_minor(&addr, proto::VERSION_MINOR);
    assert!(matches!(
        put_to(&mut link, 1, "d/a", (0, 0o644), size),
        Msg::Ready { .. }
    ));
    link.close();
    drop(link);
    assert_eq!(
        temporaries_gone(&dir),
        Vec::<String>::new(),
        "dropped after READY"
    );
    // Abandoned by the client (ERROR) part way.
    let (mut link, _) = hello_minor(&addr, proto::VERSION_MINOR);
    assert!(matches!(
        put_to(&mut link, 2, "d/b", (0, 0o644), size),
        Msg::Ready { .. }
    ));
    send_blocks(&link, 2, &data, 0, 128 * 1024);
    link.send(&Msg::Error {
        code: ErrorCode::Io,
        file_id: 2,
        message: "source truncated".into(),
    })
    .unwrap();
    // A bad whole-file hash.
    assert!(matches!(
        put_to(&mut link, 3, "d/c", (0, 0o644), size),
        Msg::Ready { .. }
    ));
    send_blocks(&link, 3, &data, 0, data.len());
    link.send(&Msg::FileDone {
        file_id: 3,
        length: size,
        blake3: Some([7; 32]),
    })
    .unwrap();
    assert_eq!(code(&link.recv_msg().unwrap()), ErrorCode::Integrity);
    assert_eq!(
        temporaries(&dir),
        Vec::<String>::new(),
        "abandoned or refused"
    );
    // OPEN and nothing more, then a parallel upload abandoned mid-range; the session ends.
    link.send(&Msg::Open {
        flags: 0,
        file_id: 4,
        mode: 0o644,
        size,
        mtime: 1,
        path: "d/d".into(),
    })
    .unwrap();
    assert!(matches!(link.recv_msg().unwrap(), Msg::Have { .. }));
    link.send(&Msg::Open {
        flags: 0,
        file_id: 5,
        mode: 0o644,
        size,
        mtime: 1,
        path: "d/e".into(),
    })
    .unwrap();
    assert!(matches!(link.recv_msg().unwrap(), Msg::Have { .. }));
    link.send(&Msg::PutRange {
        file_id: 5,
        offset: 0,
        length: size,
    })
    .unwrap();
    assert!(matches!(link.recv_msg().unwrap(), Msg::Ready { .. }));
    send_blocks(&link, 5, &data, 0, 128 * 1024);
    link.send(&Msg::Error {
        code: ErrorCode::Io,
        file_id: 5,
        message: "source truncated".into(),
    })
    .unwrap();
    link.send(&Msg::Bye).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    link.close();
    drop(link);
    assert_eq!(temporaries_gone(&dir), Vec::<String>::new(), "parallel");
    for n in ["a", "b", "c", "d", "e"] {
        assert!(!dir.join(n).exists(), "{n}");
    }
}

/// A LIST answer longer than the link's immediate size comes in several ENTRIES frames, each
/// short enough to cross inside its advertisement (half a round trip, not one and a half),
/// together every entry once.
#[test]
fn a_long_listing_comes_in_frames_that_travel_immediately() {
    let (addr, dir) = start("tcp", false);
    let names: Vec<String> = (0..300)
        .map(|i| format!("a-rather-long-name-{i:05}"))
        .collect();
    for n in &names {
        std::fs::write(dir.join(n), b"x").unwrap();
    }
    let (mut link, answer) = hello(&addr, proto::VERSION_MAJOR, "tok");
    assert!(matches!(answer, Msg::Welcome { .. }), "{answer:?}");
    let room = link.frame_room();
    assert!(room >= 1024, "immediate size {room}");
    link.send(&Msg::List { path: "d".into() }).unwrap();
    let (mut frames, mut got) = (0, Vec::new());
    loop {
        let m = link.recv_msg().unwrap();
        let len = proto::to_vec(&m).unwrap().len();
        let Msg::Entries { more, entries } = m else {
            panic!("not ENTRIES: {m:?}");
        };
        assert!(len <= room, "a frame of {len} bytes, room {room}");
        frames += 1;
        got.extend(entries.into_iter().map(|e| e.name));
        if !more {
            break;
        }
    }
    got.sort();
    assert_eq!(got, names);
    assert!(frames > 1, "one frame of {} entries", got.len());
}
