//! One server, several listeners, and the service selection (protocol 1.6), against a real
//! in-process server on loopback: a HELLO without selection is still file transfer's, a
//! SELECT of `xfer` is answered SELECTED and the pipelined HELLO WELCOME, a SELECT of a
//! service not hosted is refused naming the hosted ones, and a bad SELECT loses only its
//! own connection.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ferry_service::registry::{probe_with, Answer};
use ferry_service::select::{self, Floor};
use ferry_xfer::client::{Client, Options};
use ferry_xfer::config::{AuthConfig, RootConfig, ServerConfig};
use ferry_xfer::link::Link;
use ferry_xfer::proto::{self, Msg};
use ferry_xfer::server::Server;

const T: Duration = Duration::from_secs(10);

/// Starts a server listening on every address of `listen`, exporting a fresh directory as
/// `d` (token "tok"); returns the bound addresses and the directory.
fn start(listen: &[&str]) -> (Vec<String>, std::path::PathBuf) {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ferry-registry-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = ServerConfig {
        listen: listen.iter().map(|l| l.to_string()).collect(),
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
    let server = Server::new(cfg).unwrap();
    let listeners = server.bind().unwrap();
    let addrs = listeners.iter().map(|l| l.local_addr()).collect();
    std::thread::spawn(move || server.serve(&listeners));
    (addrs, dir)
}

fn shm_name(tag: &str) -> String {
    format!("ofi+shm://ferry-registry-{tag}-{}", std::process::id())
}

fn hello() -> Msg {
    Msg::Hello {
        major: proto::VERSION_MAJOR,
        minor: proto::VERSION_MINOR,
        block_size: 64 * 1024,
        session: 0,
        stream: 0,
        token: "tok".into(),
    }
}

/// Connects, sends SELECT `service` and a HELLO right behind it (not waiting for the
/// answer, as a client may); returns the link and the floor's answer.
fn select_then_hello(addr: &str, service: &str) -> (Link, Floor) {
    let mut link = common::connect(addr, T);
    link.post_ring(2, proto::MAX_CONTROL).unwrap();
    let sel = select::encode(&Floor::Select {
        service: service.into(),
        token: None,
        proof: None,
        key: None,
    })
    .unwrap();
    link.send_frame(&sel).unwrap();
    link.send(&hello()).unwrap();
    let mut answer = Vec::new();
    link.recv_into(&mut answer).unwrap();
    assert!(select::is_floor(&answer), "{answer:?}");
    (link, select::decode(&answer).unwrap())
}

/// A client that selects nothing (every client before 1.6) gets file transfer, on tcp
/// and ofi+shm.
#[test]
fn a_hello_without_selection_is_still_served() {
    let shm = shm_name("legacy");
    let (addrs, dir) = start(&["tcp://127.0.0.1:0", &shm]);
    std::fs::write(dir.join("f"), b"legacy").unwrap();
    for addr in &addrs {
        let mut link = common::connect(addr, T);
        link.post_ring(1, proto::MAX_CONTROL).unwrap();
        link.send(&hello()).unwrap();
        assert!(
            matches!(link.recv_msg().unwrap(), Msg::Welcome { minor, .. } if minor == proto::VERSION_MINOR),
            "{addr}"
        );
        let mut c = Client::connect(
            addr,
            &Options {
                token: "tok".into(),
                security: common::security(),
                ..Options::default()
            },
        )
        .unwrap();
        assert_eq!(c.stat("d/f").unwrap().size, 6, "{addr}");
        c.bye();
    }
}

/// SELECT xfer is answered SELECTED, and the HELLO sent behind it WELCOME: the face's
/// handshake goes on as if nothing came before it.
#[test]
fn selecting_xfer_is_answered_then_the_hello() {
    let (addrs, _) = start(&["tcp://127.0.0.1:0"]);
    let (mut link, answer) = select_then_hello(&addrs[0], "xfer");
    assert_eq!(answer, Floor::Selected);
    assert!(matches!(link.recv_msg().unwrap(), Msg::Welcome { .. }));
    // A 1.9 client on a secure connection agrees on the data protection first.
    link.send(&Msg::Protect { level: 1 }).unwrap();
    assert_eq!(link.recv_msg().unwrap(), Msg::Ok { file_id: 0 });
    link.send(&Msg::List {
        path: String::new(),
    })
    .unwrap();
    assert!(matches!(link.recv_msg().unwrap(), Msg::Entries { .. }));
    assert_eq!(
        probe_with(&addrs[0], "xfer", T, &common::security()).unwrap(),
        Answer::Selected
    );
}

/// A service the server does not run is refused with the list of those it does, and the
/// connection closes: the HELLO behind the SELECT is never answered.
#[test]
fn an_unhosted_service_is_refused_naming_the_hosted_ones() {
    let (addrs, _) = start(&["tcp://127.0.0.1:0"]);
    let (mut link, answer) = select_then_hello(&addrs[0], "nbd");
    assert_eq!(
        answer,
        Floor::Services {
            requested: "nbd".into(),
            hosted: vec!["xfer".into()],
        }
    );
    let next = link.recv_msg();
    assert!(next.is_err(), "the connection must close, got {next:?}");
    assert_eq!(
        probe_with(&addrs[0], "nbd", T, &common::security()).unwrap(),
        Answer::Hosted(vec!["xfer".into()])
    );
    // An empty name only asks for the list.
    assert_eq!(
        probe_with(&addrs[0], "", T, &common::security()).unwrap(),
        Answer::Hosted(vec!["xfer".into()])
    );
}

/// A malformed floor frame ends its own connection only; the next client is served.
#[test]
fn a_bad_selection_loses_only_its_connection() {
    let (addrs, _) = start(&["tcp://127.0.0.1:0"]);
    let mut link = common::connect(&addrs[0], T);
    link.post_ring(1, proto::MAX_CONTROL).unwrap();
    // SELECT of a name with an upper-case letter and a control character.
    let mut bad = select::encode(&Floor::Select {
        service: "xfer".into(),
        token: None,
        proof: None,
        key: None,
    })
    .unwrap();
    bad[10] = b'X';
    bad[11] = 0x1b;
    link.send_frame(&bad).unwrap();
    assert!(
        link.recv_msg().is_err(),
        "a bad SELECT closes its connection"
    );
    assert_eq!(
        probe_with(&addrs[0], "xfer", T, &common::security()).unwrap(),
        Answer::Selected
    );
}

/// Two listeners on two drivers share one server: a file uploaded through one is read
/// through the other.
#[test]
fn two_listeners_serve_one_server() {
    let shm = shm_name("two");
    let (addrs, dir) = start(&["tcp://127.0.0.1:0", &shm]);
    assert_eq!(addrs.len(), 2);
    assert!(addrs[0].starts_with("tcp://") && addrs[1].starts_with("ofi+shm://"));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let opts = Options {
        token: "tok".into(),
        security: common::security(),
        ..Options::default()
    };
    for addr in &addrs {
        let mut c = Client::connect(addr, &opts).unwrap();
        let names: Vec<String> = c.list("d").unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["sub"], "{addr}");
        c.bye();
    }
}
