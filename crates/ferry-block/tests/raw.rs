//! The server driven byte by byte from raw sockets: an option it does not know answered
//! and negotiation going on, garbage and truncated handshakes and requests losing only
//! their own connection, requests answered out of order, the Unix socket listener, and
//! admission (the handshake deadline, the connection limit).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::*;
use ferry_block::config::{BlockConfig, ExportConfig};
use ferry_block::nbd::consts::*;
use ferry_block::nbd::option::{encode_option, ClientOption, GoRequest};
use ferry_block::nbd::request::{encode_request, RequestHeader};

const T: Duration = Duration::from_secs(10);

fn connect(s: &Running) -> TcpStream {
    let c = TcpStream::connect(s.addr()).unwrap();
    c.set_read_timeout(Some(T)).unwrap();
    c
}

fn read_n(c: &mut impl Read, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    c.read_exact(&mut b).unwrap();
    b
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}

/// Reads one option reply: (type, data).
fn option_reply(c: &mut impl Read) -> (u32, Vec<u8>) {
    let h = read_n(c, 20);
    assert_eq!(&h[..8], &OPT_REPLY_MAGIC.to_be_bytes());
    let len = be32(&h[16..]) as usize;
    (be32(&h[12..]), read_n(c, len))
}

/// Greeting and client flags.
fn hello(c: &mut (impl Read + Write)) {
    let g = read_n(c, 18);
    assert_eq!(&g[..8], &NBDMAGIC.to_be_bytes());
    c.write_all(&[0, 0, 0, 3]).unwrap();
}

/// NBD_OPT_GO for `name` (simple replies); the export size.
fn go(c: &mut (impl Read + Write), name: &str) -> u64 {
    let o = ClientOption::Go(GoRequest {
        name: name.into(),
        info: vec![],
    });
    c.write_all(&encode_option(&o)).unwrap();
    let mut size = 0;
    loop {
        let (t, d) = option_reply(c);
        match t {
            REP_INFO if d[..2] == INFO_EXPORT.to_be_bytes() => {
                size = u64::from_be_bytes(d[2..10].try_into().unwrap())
            }
            REP_INFO => {}
            REP_ACK => return size,
            other => panic!("GO answered {other:#x}"),
        }
    }
}

fn request(c: &mut impl Write, kind: u16, cookie: u64, offset: u64, len: u32) {
    let h = RequestHeader {
        flags: 0,
        kind,
        cookie,
        offset,
        len,
    };
    c.write_all(&encode_request(&h)).unwrap();
}

/// Reads a simple reply: (error, cookie).
fn simple_reply(c: &mut impl Read) -> (u32, u64) {
    let h = read_n(c, 16);
    assert_eq!(be32(&h), SIMPLE_REPLY_MAGIC);
    (
        be32(&h[4..]),
        u64::from_be_bytes(h[8..16].try_into().unwrap()),
    )
}

/// A read on a fresh, fully negotiated connection returns the export's bytes.
fn served(s: &Running, expect: &[u8]) {
    let mut c = connect(s);
    hello(&mut c);
    go(&mut c, "");
    request(&mut c, CMD_READ, 9, 0, expect.len() as u32);
    assert_eq!(simple_reply(&mut c), (0, 9));
    assert_eq!(read_n(&mut c, expect.len()), expect);
}

/// A 1 MiB file with data in its first 64 KiB (in a scratch directory that lives as long
/// as the first element); its path and its first 4096 bytes.
fn disk(tag: &str) -> (Scratch, std::path::PathBuf, Vec<u8>) {
    let dir = scratch(tag);
    let img = dir.join("disk.img");
    sparse_file(&img, 1 << 20, &[(0, 65536)]);
    (dir, img, pattern(0, 4096))
}

#[test]
fn unknown_option_is_answered_and_negotiation_goes_on() {
    let (_dir, img, first) = disk("unknown");
    let s = start(vec![ExportConfig::file("disk", &img)], &[]);
    let mut c = connect(&s);
    hello(&mut c);
    for o in [
        ClientOption::Unknown(4242),
        ClientOption::StartTls,
        ClientOption::ExtendedHeaders,
    ] {
        c.write_all(&encode_option(&o)).unwrap();
        let (t, msg) = option_reply(&mut c);
        assert_eq!(t, REP_ERR_UNSUP, "{o:?}");
        assert!(!msg.is_empty(), "the refusal says why");
    }
    assert_eq!(go(&mut c, "disk"), 1 << 20);
    request(&mut c, CMD_READ, 1, 0, 4096);
    assert_eq!(simple_reply(&mut c), (0, 1));
    assert_eq!(read_n(&mut c, 4096), first);
}

/// Garbage, a truncated handshake left hanging, a bad request magic and a write claiming
/// 1 GiB of data each lose their own connection; other clients are served throughout.
#[test]
fn broken_clients_lose_only_their_connection() {
    let (_dir, img, first) = disk("garbage");
    let s = start(vec![ExportConfig::file("disk", &img)], &[]);

    let mut garbage = connect(&s);
    read_n(&mut garbage, 18);
    garbage.write_all(&[0xAB; 200]).unwrap();
    let mut hanging = connect(&s);
    hanging.write_all(&[0, 0]).unwrap();
    served(&s, &first);
    // The garbage connection is closed with nothing more sent.
    let mut rest = Vec::new();
    let _ = garbage.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the server answered garbage");

    let mut bad_magic = connect(&s);
    hello(&mut bad_magic);
    go(&mut bad_magic, "disk");
    bad_magic.write_all(&[0x55; 28]).unwrap();
    let mut tail = Vec::new();
    let _ = bad_magic.read_to_end(&mut tail);
    assert!(tail.is_empty(), "a bad request magic got an answer");

    let mut huge = connect(&s);
    hello(&mut huge);
    go(&mut huge, "disk");
    request(&mut huge, CMD_WRITE, 5, 0, 1 << 30);
    let _ = huge.read_to_end(&mut tail);
    assert!(tail.is_empty(), "an oversized write got an answer");

    // A request header cut short, then the client goes away.
    let mut cut = connect(&s);
    hello(&mut cut);
    go(&mut cut, "disk");
    cut.write_all(
        &encode_request(&RequestHeader {
            flags: 0,
            kind: CMD_READ,
            cookie: 1,
            offset: 0,
            len: 512,
        })[..11],
    )
    .unwrap();
    drop(cut);
    drop(hanging);
    served(&s, &first);
}

/// Refused requests (unknown command, bad flag, out of range) get an error and the same
/// connection goes on; many requests in flight are each answered once.
#[test]
fn errors_keep_the_connection_and_replies_match_cookies() {
    let (_dir, img, first) = disk("errors");
    let s = start(vec![ExportConfig::file("disk", &img)], &[]);
    let mut c = connect(&s);
    hello(&mut c);
    go(&mut c, "disk");
    request(&mut c, 99, 1, 0, 0);
    assert_eq!(simple_reply(&mut c), (EINVAL, 1));
    request(&mut c, CMD_READ, 2, 1 << 20, 1);
    assert_eq!(simple_reply(&mut c), (EINVAL, 2));
    request(&mut c, CMD_WRITE, 3, (1 << 20) - 2, 4);
    c.write_all(b"abcd").unwrap();
    assert_eq!(simple_reply(&mut c), (ENOSPC, 3));
    // Block status was never negotiated.
    request(&mut c, CMD_BLOCK_STATUS, 4, 0, 4096);
    assert_eq!(simple_reply(&mut c), (EINVAL, 4));

    // 64 flushes and reads in flight at once: every cookie answered exactly once.
    for i in 0..64u64 {
        if i % 2 == 0 {
            request(&mut c, CMD_FLUSH, 100 + i, 0, 0);
        } else {
            request(&mut c, CMD_READ, 100 + i, 0, 4096);
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..64 {
        let (err, cookie) = simple_reply(&mut c);
        assert_eq!(err, 0);
        if (cookie - 100) % 2 == 1 {
            assert_eq!(read_n(&mut c, 4096), first);
        }
        assert!(seen.insert(cookie), "cookie {cookie} answered twice");
    }
    request(&mut c, CMD_DISC, 0, 0, 0);
    let mut tail = Vec::new();
    let _ = c.read_to_end(&mut tail);
    assert!(tail.is_empty());
}

#[test]
fn unix_socket_listener_serves() {
    let (_dir, img, first) = disk("unix");
    let sock = img.with_file_name("nbd.sock");
    let s = start(
        vec![ExportConfig::file("disk", &img)],
        &[format!("unix:{}", sock.display())],
    );
    assert!(s.server.local_addrs()[1].starts_with("nbd+unix:///?socket="));
    let mut c = UnixStream::connect(&sock).unwrap();
    c.set_read_timeout(Some(T)).unwrap();
    hello(&mut c);
    go(&mut c, "disk");
    request(&mut c, CMD_READ, 7, 0, 4096);
    assert_eq!(simple_reply(&mut c), (0, 7));
    assert_eq!(read_n(&mut c, 4096), first);
    drop(s);
    assert!(!sock.exists(), "the socket file outlived its server");
}

/// A drain answers requests that arrive after it began with ESHUTDOWN (clients then
/// disconnect), and closes the connections once nothing is in flight.
#[test]
fn a_drain_refuses_new_requests_then_closes() {
    let (_dir, img, _) = disk("drain");
    let s = start(vec![ExportConfig::file("disk", &img)], &[]);
    let mut c = connect(&s);
    hello(&mut c);
    go(&mut c, "disk");
    s.server.begin_drain();
    request(&mut c, CMD_READ, 1, 0, 4096);
    assert_eq!(simple_reply(&mut c), (ESHUTDOWN, 1));
    let report = s.server.drain(Duration::from_secs(2));
    assert_eq!((report.interrupted, report.abandoned), (0, 0));
    let mut tail = Vec::new();
    let _ = c.read_to_end(&mut tail);
    assert!(tail.is_empty(), "the drained connection still answered");
}

/// A server of `img` on loopback with `limits` applied to its table.
fn limited(img: &std::path::Path, limits: impl FnOnce(&mut BlockConfig)) -> Running {
    let mut cfg = BlockConfig {
        listen: vec!["127.0.0.1:0".into()],
        exports: vec![ExportConfig::file("disk", img)],
        ..BlockConfig::default()
    };
    limits(&mut cfg);
    start_config(cfg)
}

/// A client that dribbles its handshake a byte at a time (each byte well within any
/// per-read timeout) is closed at the handshake deadline, and others are served meanwhile.
#[test]
fn a_handshake_dribbled_past_its_deadline_is_closed() {
    let (_dir, img, first) = disk("deadline");
    let s = limited(&img, |c| c.handshake_timeout = 0.5);
    let mut c = connect(&s);
    hello(&mut c);
    served(&s, &first);
    c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    // NBD_OPT_LIST over and over: every one is answered, so only the deadline ends it.
    let list = encode_option(&ClientOption::List);
    let t0 = Instant::now();
    let closed_after = 'dribble: loop {
        for b in &list {
            if t0.elapsed() > Duration::from_secs(5) {
                break 'dribble None;
            }
            if c.write_all(&[*b]).is_err() {
                break 'dribble Some(t0.elapsed());
            }
            let mut sink = [0u8; 4096];
            match c.read(&mut sink) {
                Ok(0) => break 'dribble Some(t0.elapsed()),
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break 'dribble Some(t0.elapsed()),
            }
        }
    };
    let after = closed_after.expect("the dribbling client was still connected after 5 s");
    assert!(
        after < Duration::from_secs(3),
        "closed only after {after:?}"
    );
    served(&s, &first);
}

/// Past `max_connections` a client's GO is refused with `NBD_REP_ERR_POLICY` and a
/// message naming the limit, then closed; the place is free again once a client leaves.
#[test]
fn the_connection_limit_refuses_go_with_a_reason() {
    let (_dir, img, first) = disk("limit");
    let s = limited(&img, |c| c.max_connections = 1);
    let mut a = connect(&s);
    hello(&mut a);
    go(&mut a, "disk");

    let mut b = connect(&s);
    hello(&mut b);
    let o = ClientOption::Go(GoRequest {
        name: "disk".into(),
        info: vec![],
    });
    b.write_all(&encode_option(&o)).unwrap();
    let (t, msg) = option_reply(&mut b);
    assert_eq!(t, REP_ERR_POLICY);
    let msg = String::from_utf8_lossy(&msg);
    assert!(msg.contains("max_connections"), "{msg}");
    let mut tail = Vec::new();
    let _ = b.read_to_end(&mut tail);
    assert!(tail.is_empty(), "the refused connection was not closed");

    // The first client still works; once it leaves, a new one gets its place.
    request(&mut a, CMD_READ, 3, 0, 4096);
    assert_eq!(simple_reply(&mut a), (0, 3));
    assert_eq!(read_n(&mut a, 4096), first);
    request(&mut a, CMD_DISC, 4, 0, 0);
    let _ = a.read_to_end(&mut tail);
    let deadline = Instant::now() + T;
    loop {
        let mut c = connect(&s);
        hello(&mut c);
        c.write_all(&encode_option(&o)).unwrap();
        let (t, _) = option_reply(&mut c);
        if t == REP_INFO || Instant::now() > deadline {
            assert_eq!(t, REP_INFO, "the place was not freed");
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
