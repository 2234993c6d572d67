//! The registry hosting two services side by side on two listeners, over real EXS
//! connections on loopback: each SELECT reaches its own service (the face's first message
//! pipelined behind it), SERVICES lists both, a SELECT's token is checked by the floor before
//! the service sees the connection, a first frame without SELECT on a server that hosts no
//! `xfer` is closed, and `serve_until` returns once asked to quit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_exs::proto::{EventKind, Flags};
use ferry_exs::runtime::{default_config, EventQueue, ExsSocket};
use ferry_fabric::Access;
use ferry_service::admit::{Admission, LimitsConfig};
use ferry_service::auth::AuthConfig;
use ferry_service::registry::{probe, Answer, Registry};
use ferry_service::registry::{Conn, Service};
use ferry_service::select::{self, Floor};
use ferry_service::serve::{bind_all, serve_until};

const T: Duration = Duration::from_secs(10);

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
            token,
            ..
        } = conn;
        assert!(
            first.is_none(),
            "a selected service receives its own first frame"
        );
        let Some(msg) = recv(&sock, &queue) else {
            return;
        };
        let mut answer = if token.is_some() {
            b"+".to_vec()
        } else {
            Vec::new()
        };
        answer.extend((self.0)(&msg));
        send(&sock, &answer);
        // Wait for the client to close (the send completes meanwhile).
        let _ = recv(&sock, &queue);
    }
}

/// The next message on `sock`, or `None` if the connection ends first.
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

/// Connects, sends SELECT `service` and `msg` right behind it; returns the floor's answer
/// and the next message (`None`: the connection closed).
fn ask(addr: &str, service: &str, msg: &[u8]) -> (Floor, Option<Vec<u8>>) {
    ask_with(addr, service, None, msg)
}

/// [`ask`], the SELECT carrying `token`.
fn ask_with(
    addr: &str,
    service: &str,
    token: Option<&str>,
    msg: &[u8],
) -> (Floor, Option<Vec<u8>>) {
    let q = EventQueue::new().unwrap();
    let sock = ExsSocket::connect(addr, default_config(&addr.parse().unwrap()), &q, T).unwrap();
    send(
        &sock,
        &select::encode(&Floor::Select {
            service: service.into(),
            token: token.map(String::from),
        })
        .unwrap(),
    );
    send(&sock, msg);
    let answer = select::decode(&recv(&sock, &q).expect("an answer")).unwrap();
    let next = recv(&sock, &q);
    let _ = sock.close();
    (answer, next)
}

#[test]
fn two_services_on_two_listeners() {
    let mut reg = Registry::new(AuthConfig {
        tokens: vec!["tok".into()],
        anonymous: false,
        ..AuthConfig::default()
    });
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
            probe(addr, "", T).unwrap(),
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
    }

    // A first frame without SELECT is xfer's; this server does not run it: closed.
    let q = EventQueue::new().unwrap();
    let addr = &addrs[0];
    let sock = ExsSocket::connect(addr, default_config(&addr.parse().unwrap()), &q, T).unwrap();
    send(&sock, &[8, 0, 0, 0, 1, 0, 0, 0]);
    assert_eq!(recv(&sock, &q), None, "closed without an answer");

    quit.store(true, Ordering::SeqCst);
    server.join().unwrap();
}
