//! A real server (in-process, on loopback) under its `[limits]`: connection limits refuse
//! with a message while the connections already in keep working, and a silent session is
//! closed after `idle_timeout` while one that keeps asking stays.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ferry_xfer::config::{AuthConfig, LimitsConfig, RootConfig, ServerConfig};
use ferry_xfer::link::Link;
use ferry_xfer::proto::{self, ErrorCode, Msg, BLOCK_HEADER_LEN};
use ferry_xfer::server::Server;

const T: Duration = Duration::from_secs(10);

/// Starts a tcp server with `limits`, exporting a fresh directory as `d`.
fn start(limits: LimitsConfig) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ferry-xfer-limits-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("f"), b"hello").unwrap();
    let cfg = ServerConfig {
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
        limits,
        ..ServerConfig::default()
    };
    let server = Server::new(cfg).unwrap();
    let listeners = server.bind().unwrap();
    let addr = listeners[0].local_addr();
    std::thread::spawn(move || server.serve(&listeners));
    addr
}

/// Connects and sends HELLO with the good token; returns the link (its ring posted) and the
/// server's answer.
fn hello(addr: &str) -> (Link, Msg) {
    let mut link = common::connect(addr, T);
    link.post_ring(1, BLOCK_HEADER_LEN + 64 * 1024).unwrap();
    link.send(&Msg::Hello {
        major: proto::VERSION_MAJOR,
        minor: proto::VERSION_MINOR,
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

/// STAT of `d/f` answers its entry: the connection works.
fn works(link: &mut Link) {
    link.send(&Msg::Stat { path: "d/f".into() }).unwrap();
    match link.recv_msg().unwrap() {
        Msg::Entry(e) => assert_eq!(e.size, 5),
        m => panic!("expected ENTRY, got {m:?}"),
    }
}

fn refused(m: &Msg, says: &str) {
    match m {
        Msg::Error { code, message, .. } => {
            assert_eq!(*code, ErrorCode::Unavailable, "{message}");
            assert!(message.contains(says), "{says:?} not in {message:?}");
        }
        m => panic!("expected ERROR, got {m:?}"),
    }
}

#[test]
fn connections_past_the_limits_are_refused_with_a_message() {
    let addr = start(LimitsConfig {
        max_connections: 4,
        ..LimitsConfig::default()
    });
    let mut held: Vec<Link> = (0..4)
        .map(|_| {
            let (link, m) = hello(&addr);
            assert!(matches!(m, Msg::Welcome { .. }), "{m:?}");
            link
        })
        .collect();
    let (_, m) = hello(&addr);
    refused(&m, "max_connections");
    for link in &mut held {
        works(link);
    }
    // One leaves: the next one gets its place.
    held.pop().unwrap().send(&Msg::Bye).unwrap();
    let since = Instant::now();
    loop {
        let (mut link, m) = hello(&addr);
        if matches!(m, Msg::Welcome { .. }) {
            works(&mut link);
            break;
        }
        assert!(
            since.elapsed() < T,
            "the freed place never came back: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Per address (loopback is one): the third from 127.0.0.1 is refused.
    let addr = start(LimitsConfig {
        max_per_address: 2,
        ..LimitsConfig::default()
    });
    let mut two: Vec<Link> = (0..2).map(|_| hello(&addr).0).collect();
    let (_, m) = hello(&addr);
    refused(&m, "max_per_address");
    for link in &mut two {
        works(link);
    }
}

#[test]
fn a_silent_session_is_closed_after_the_idle_timeout() {
    let addr = start(LimitsConfig {
        idle_timeout: 1.0,
        ..LimitsConfig::default()
    });
    let (mut silent, m) = hello(&addr);
    assert!(matches!(m, Msg::Welcome { .. }));
    let (mut busy, _) = hello(&addr);
    let since = Instant::now();
    // The busy one asks every 0.4 s for 2 s and stays.
    while since.elapsed() < Duration::from_secs(2) {
        works(&mut busy);
        std::thread::sleep(Duration::from_millis(400));
    }
    // The silent one was closed after about a second.
    silent.timeout = Duration::from_millis(100);
    let e = silent
        .recv_msg()
        .expect_err("the idle connection is still open");
    assert!(
        e.to_string().contains("closed"),
        "expected the connection closed, got: {e}"
    );
    works(&mut busy);
}
