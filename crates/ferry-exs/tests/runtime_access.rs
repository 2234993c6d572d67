//! Remote access on EXS sockets: a listener that defers it (servers that authenticate over
//! EXS) serves no RMA before `enable_remote_access`, and buffers registered with the least
//! rights their use needs still carry every message under pull.

mod runtime_util;

use ferry_exs::proto::{Config, EventKind, Flags};
use ferry_exs::runtime::{EventQueue, ExsListener, ExsSocket};
use ferry_fabric::Access;
use runtime_util::*;

const BIG: usize = 64 << 10;

/// `a` connected, `b` accepted by a listener that defers remote access.
fn deferred_pair(driver: &str) -> (ExsSocket, ExsSocket, EventQueue, EventQueue, ExsListener) {
    let listener = ExsListener::bind(&listen_url(driver), Config::default())
        .expect("bind")
        .defer_remote_access();
    let addr = listener.local_addr();
    let (qa, qb) = (EventQueue::new().unwrap(), EventQueue::new().unwrap());
    let (a, b) = std::thread::scope(|s| {
        let acc = s.spawn(|| listener.accept(&qb, T));
        let a = ExsSocket::connect(&addr, Config::default(), &qa, T).expect("connect");
        (a, acc.join().unwrap().expect("accept"))
    });
    (a, b, qa, qb, listener)
}

/// Sends `data` from `from` (a buffer registered `REMOTE_READ`, as a pull sender needs) to
/// `to` (a `LOCAL` buffer, as a pull receiver needs) and returns the receive's event.
fn transfer(
    from: &ExsSocket,
    to: &ExsSocket,
    qto: &EventQueue,
    data: &[u8],
) -> ferry_exs::runtime::ExsEvent {
    let src = from.alloc_with(data.len(), Access::REMOTE_READ).unwrap();
    src.write_at(0, data).unwrap();
    let dst = to.alloc_with(data.len(), Access::LOCAL).unwrap();
    to.recv(dst, Flags::NONE, 1);
    from.send(src, Flags::NONE, 2);
    next(qto, "Recv")
}

fn deferred_until_enabled(driver: &str) {
    let (a, b, qa, qb, _l) = deferred_pair(driver);
    // Before: the accepted side receives (it pulls from the client itself) and sends what
    // fits in a control frame.
    let data = pattern(BIG, 3);
    let ev = transfer(&a, &b, &qb, &data);
    assert_eq!((ev.kind, ev.result), (EventKind::Recv, Ok(())));
    assert_eq!(ev.buf.unwrap().to_vec(), data);
    ok(&qa, EventKind::Send);
    let ev = transfer(&b, &a, &qa, b"small");
    assert_eq!((ev.kind, ev.result), (EventKind::Recv, Ok(())));
    ok(&qb, EventKind::Send);
    // ... but what the client would have to read from it is refused.
    let ev = transfer(&b, &a, &qa, &data);
    assert_eq!(ev.kind, EventKind::Recv);
    assert!(ev.result.is_err(), "read before enable: {ev:?}");
    drop((a, b));

    // Enabled (the peer authenticated): everything flows, from least-rights buffers.
    let (a, b, qa, qb, _l) = deferred_pair(driver);
    b.enable_remote_access();
    let ev = transfer(&b, &a, &qa, &data);
    assert_eq!((ev.kind, ev.result), (EventKind::Recv, Ok(())));
    assert_eq!(ev.buf.unwrap().to_vec(), data);
    ok(&qb, EventKind::Send);
}

fn a_local_only_send_buffer_is_refused_under_pull(driver: &str) {
    let p = pair(driver);
    let src = p.a.alloc_with(BIG, Access::LOCAL).unwrap();
    p.a.send(src, Flags::NONE, 1);
    let ev = next(&p.qa, "Send");
    assert_eq!(ev.kind, EventKind::Send);
    assert!(ev.result.is_err(), "{ev:?}");
}

macro_rules! on_every_driver {
    ($($name:ident),*) => {
        mod tcp { $( #[test] fn $name() { super::$name("tcp") } )* }
        mod ofi_tcp { $( #[test] fn $name() { super::$name("ofi+tcp") } )* }
        mod ofi_shm { $( #[test] fn $name() { super::$name("ofi+shm") } )* }
    };
}

on_every_driver!(
    deferred_until_enabled,
    a_local_only_send_buffer_is_refused_under_pull
);
