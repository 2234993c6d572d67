//! The registry hosting two services side by side on two listeners, over real EXS
//! connections on loopback: each SELECT reaches its own service (the face's first message
//! pipelined behind it), SERVICES lists both, a SELECT's token is checked by the floor before
//! the service sees the connection, a first frame without SELECT on a server that hosts no
//! `xfer` is closed, and `serve_until` returns once asked to quit. Every connection runs
//! TLS (protocol 1.7): a token proof gets in, a wrong one is refused, a clear SELECT is
//! refused with the reason.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ferry_exs::proto::{EventKind, Flags};
use ferry_exs::runtime::{default_config, EventQueue, ExsSocket};
use ferry_fabric::Access;
use ferry_service::admit::{Admission, LimitsConfig};
use ferry_service::auth::AuthConfig;
use ferry_service::channel::Channel;
use ferry_service::registry::{probe_with, Answer, Registry};
use ferry_service::registry::{Conn, Service};
use ferry_service::secure::{ClientSecurity, ServerSecurity};
use ferry_service::select::{self, Floor};
use ferry_service::serve::{bind_all, serve_until};

const T: Duration = Duration::from_secs(10);

/// The test server's identity (made once in a scratch state directory) and a client
/// security pinning it.
fn security() -> &'static (ServerSecurity, ClientSecurity) {
    static SEC: OnceLock<(ServerSecurity, ClientSecurity)> = OnceLock::new();
    SEC.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("ferry-service-registry-{}", std::process::id()));
        let server = ServerSecurity::from_state_dir(&dir, false).unwrap();
        let client = ClientSecurity {
            fingerprint: server.fingerprint().map(String::from),
            ..ClientSecurity::default()
        };
        (server, client)
    })
}

/// A face whose conversation is one message: it answers the client's first message with
/// the same bytes, upper-cased (`shout`) or reversed (`mirror`), behind a `+` if the floor
/// authenticated the client.
struct Transform(fn(&[u8]) -> Vec<u8>);

impl Service for Transform {
    fn serve_connection(&self, conn: Conn) {
        let Conn {
            sock,
            queue,
            first,
            principal,
            secure,
            ..
        } = conn;
        assert!(
            first.is_none(),
            "a selected service receives its own first frame"
        );
        assert!(secure.is_some(), "every connection here is secure");
        let mut ch = Channel::new(sock, queue);
        ch.seal(secure);
        ch.timeout = T;
        let mut msg = Vec::new();
        if ch.post_ring(1, 4096).is_err() || ch.recv_into(&mut msg).is_err() {
            return;
        }
        let mut answer = if principal.is_some() {
            b"+".to_vec()
        } else {
            Vec::new()
        };
        answer.extend((self.0)(&msg));
        let _ = ch.send_frame(&answer);
        // Wait for the client to close (the send completes meanwhile).
        let _ = ch.recv_into(&mut msg);
    }
}

/// The next message on a raw `sock`, or `None` if the connection ends first.
fn recv(sock: &ExsSocket, queue: &EventQueue) -> Option<Vec<u8>> {
    sock.recv(sock.alloc_with(4096, Access::LOCAL).ok()?, Flags::NONE, 1);
    loop {
        let ev = queue.dequeue(T)?;
        match ev.kind {
            EventKind::Recv => {
                ev.result.ok()?;
                let mut v = ev.buf?.to_vec();
                v.truncate(ev.len as usize);
                return Some(v);
            }
            EventKind::Close => return None,
            _ => {}
        }
    }
}

fn send(sock: &ExsSocket, bytes: &[u8]) {
    let buf = sock.alloc_with(bytes.len(), Access::REMOTE_READ).unwrap();
    buf.write_at(0, bytes).unwrap();
    sock.send(buf, Flags::NONE, 2);
}

/// Connects (TLS), sends SELECT `service` and `msg` right behind it; returns the floor's
/// answer and the next message (`None`: the connection closed).
fn ask(addr: &str, service: &str, msg: &[u8]) -> (Floor, Option<Vec<u8>>) {
    ask_with(addr, service, None, msg)
}

/// [`ask`], the SELECT carrying `token` (inside TLS).
fn ask_with(
    addr: &str,
    service: &str,
    token: Option<&str>,
    msg: &[u8],
) -> (Floor, Option<Vec<u8>>) {
    let mut ch = Channel::connect_with(addr, T, &security().1).unwrap();
    ch.timeout = T;
    ch.post_ring(2, 4096).unwrap();
    let select = select::encode(&Floor::Select {
        service: service.into(),
        token: token.map(String::from),
        proof: None,
        key: None,
    })
    .unwrap();
    ch.send_frame(&select).unwrap();
    ch.send_frame(msg).unwrap();
    let mut answer = Vec::new();
    ch.recv_into(&mut answer).unwrap();
    let answer = select::decode(&answer).unwrap();
    let mut next = Vec::new();
    let next = ch.recv_into(&mut next).ok().map(|()| next);
    ch.close();
    (answer, next)
}

/// Connects (TLS) and selects `service` proving `token` (never sent).
fn select_proving(addr: &str, service: &str, token: &str) -> ferry_service::Result<()> {
    let mut ch = Channel::connect_with(addr, T, &security().1)?;
    ch.timeout = T;
    let r = ch.select(addr, service, token);
    ch.close();
    r
}

#[test]
fn two_services_on_two_listeners() {
    let mut reg = Registry::new(
        AuthConfig {
            tokens: vec!["tok".into()],
            anonymous: false,
            ..AuthConfig::default()
        },
        security().0.clone(),
    );
    reg.add("shout", Arc::new(Transform(|b| b.to_ascii_uppercase())))
        .unwrap();
    reg.add(
        "mirror",
        Arc::new(Transform(|b| b.iter().rev().copied().collect())),
    )
    .unwrap();
    assert!(reg
        .add("shout", Arc::new(Transform(|b| b.to_vec())))
        .is_err());
    assert!(reg
        .add("Bad Name", Arc::new(Transform(|b| b.to_vec())))
        .is_err());
    let shm = format!("ofi+shm://ferry-service-registry-{}", std::process::id());
    let listeners = bind_all(&["tcp://127.0.0.1:0".into(), shm]).unwrap();
    let addrs: Vec<String> = listeners.iter().map(|l| l.local_addr()).collect();
    let admission = Admission::new(&LimitsConfig::default(), |_, _| 0);
    let quit = Arc::new(AtomicBool::new(false));
    let (reg, q2) = (Arc::new(reg), quit.clone());
    let server = std::thread::spawn(move || serve_until(&reg, &admission, &listeners, &q2));

    for addr in &addrs {
        assert_eq!(
            ask(addr, "shout", b"ferry"),
            (Floor::Selected, Some(b"FERRY".to_vec())),
            "{addr}"
        );
        assert_eq!(
            ask(addr, "mirror", b"ferry"),
            (Floor::Selected, Some(b"yrref".to_vec())),
            "{addr}"
        );
        assert_eq!(
            probe_with(addr, "", T, &security().1).unwrap(),
            Answer::Hosted(vec!["shout".into(), "mirror".into()])
        );
        // Not hosted: the list, and the message behind the SELECT is never answered.
        let (answer, next) = ask(addr, "xfer", b"HELLO?");
        assert_eq!(
            answer,
            Floor::Services {
                requested: "xfer".into(),
                hosted: vec!["shout".into(), "mirror".into()],
            }
        );
        assert_eq!(next, None);
        // The floor checks a SELECT's token: accepted, the service knows; refused, the
        // service never sees the connection.
        assert_eq!(
            ask_with(addr, "shout", Some("tok"), b"in"),
            (Floor::Selected, Some(b"+IN".to_vec()))
        );
        let (answer, next) = ask_with(addr, "shout", Some("wrong"), b"in");
        assert!(
            matches!(&answer, Floor::Refused { message } if message.contains("not accepted")),
            "{answer:?}"
        );
        assert_eq!(next, None);
        // A token proven over the TLS exporter gets in; a wrong one is refused.
        select_proving(addr, "shout", "tok").unwrap();
        let e = select_proving(addr, "shout", "wrong").unwrap_err();
        assert_eq!(e.kind, ferry_service::Kind::Auth, "{e}");
    }

    // A clear SELECT: this server requires TLS and says so.
    let q = EventQueue::new().unwrap();
    let addr = &addrs[0];
    let sock = ExsSocket::connect(addr, default_config(&addr.parse().unwrap()), &q, T).unwrap();
    send(
        &sock,
        &select::encode(&Floor::Select {
            service: "shout".into(),
            token: None,
            proof: None,
            key: None,
        })
        .unwrap(),
    );
    let answer = select::decode(&recv(&sock, &q).expect("an answer")).unwrap();
    assert!(
        matches!(&answer, Floor::Refused { message } if message.contains("requires TLS")),
        "{answer:?}"
    );
    let _ = sock.close();

    // A first frame without SELECT is xfer's; this server does not run it: closed.
    let q = EventQueue::new().unwrap();
    let addr = &addrs[0];
    let sock = ExsSocket::connect(addr, default_config(&addr.parse().unwrap()), &q, T).unwrap();
    send(&sock, &[8, 0, 0, 0, 1, 0, 0, 0]);
    assert_eq!(recv(&sock, &q), None, "closed without an answer");

    quit.store(true, Ordering::SeqCst);
    server.join().unwrap();
}
