//! Failure paths on every driver: the peer closing or dying mid-transfer, local close with
//! work pending, and misuse. Every wait has a timeout; nothing may hang or panic.

mod runtime_util;

use std::time::Duration;

use ferry_exs::proto::{EventKind, Flags};
use ferry_exs::runtime::{EventQueue, ExsEvent};
use ferry_exs::ExsError;
use runtime_util::*;

/// Collects events until `want` operation completions (Send/Recv) and a Close were seen.
fn until_closed(q: &EventQueue, want: usize) -> (Vec<ExsEvent>, ExsEvent) {
    let mut ops = Vec::new();
    let mut close = None;
    while ops.len() < want || close.is_none() {
        let ev = next(q, "completion after the peer went away");
        if ev.kind == EventKind::Close {
            close = Some(ev);
        } else {
            ops.push(ev);
        }
    }
    (ops, close.expect("seen"))
}

const BIG: usize = 8 << 20;

fn peer_closes_mid_transfer(driver: &str) {
    let p = pair(driver);
    // One send the peer is receiving, and two it never asked for.
    p.b.recv(p.b.alloc(BIG).unwrap(), Flags::NONE, 1);
    for ctx in 0..3 {
        p.a.send(p.a.alloc(BIG).unwrap(), Flags::NONE, ctx);
    }
    p.a.recv(p.a.alloc(64).unwrap(), Flags::NONE, 10);
    p.b.close().unwrap();
    let (ops, close) = until_closed(&p.qa, 4);
    assert_eq!(close.result, Err(ExsError::PeerClosed));
    // The sends the peer never took, and our recv, fail; every buffer comes back.
    assert!(ops.iter().all(|e| e.buf.is_some()));
    assert!(
        ops.iter().filter(|e| e.result.is_err()).count() >= 3,
        "{ops:?}"
    );
    // The closing side completes its own recv too (success if it won the race, else Canceled).
    let (ops, close) = until_closed(&p.qb, 1);
    assert_eq!(close.result, Ok(()));
    assert!(ops[0].buf.is_some());
    assert!(!p.a.is_connected() && !p.b.is_connected());
}

fn peer_dies_mid_transfer(driver: &str) {
    let p = pair(driver);
    p.b.recv(p.b.alloc(BIG).unwrap(), Flags::NONE, 1);
    for ctx in 0..3 {
        p.a.send(p.a.alloc(BIG).unwrap(), Flags::NONE, ctx);
    }
    p.a.recv(p.a.alloc(64).unwrap(), Flags::NONE, 10);
    std::thread::sleep(Duration::from_millis(5));
    let Pair { a, b, qa, .. } = p;
    b.abort();
    let (ops, close) = until_closed(&qa, 4);
    assert!(close.result.is_err(), "{close:?}");
    assert!(ops.iter().all(|e| e.buf.is_some()));
    assert!(ops.iter().any(|e| e.result.is_err()));
    assert_eq!(a.close(), Err(ExsError::NotConnected).or(Ok(())));
}

fn misuse(driver: &str) {
    let p = pair(driver);
    // NOTIFY_ON_READ without PERSISTENT, and on a recv.
    p.a.send(p.a.alloc(8).unwrap(), Flags::NOTIFY_ON_READ, 1);
    let ev = next(&p.qa, "bad-flags send");
    assert_eq!((ev.ctx, ev.result), (1, Err(ExsError::InvalidFlags)));
    assert!(ev.buf.is_some());
    p.b.recv(p.b.alloc(8).unwrap(), Flags::NOTIFY_ON_READ, 2);
    assert_eq!(
        next(&p.qb, "bad-flags recv").result,
        Err(ExsError::InvalidFlags)
    );
    // An offset on a recv whose peer send is not persistent.
    p.b.recv_offset(p.b.alloc(8).unwrap(), 4, Flags::NONE, 3);
    p.a.send(p.a.alloc(8).unwrap(), Flags::NONE, 4);
    assert_eq!(
        next(&p.qb, "offset recv").result,
        Err(ExsError::NotPersistent)
    );
    // The message waits for a plain recv.
    p.b.recv(p.b.alloc(8).unwrap(), Flags::NONE, 6);
    assert_eq!(ok(&p.qb, EventKind::Recv).ctx, 6);
    ok(&p.qa, EventKind::Send);
    // Writing past a buffer is an error, not a panic.
    let b = p.a.alloc(8).unwrap();
    assert!(b.write_at(4, &[0; 5]).is_err());
    assert!(b.write_at(usize::MAX, &[0; 2]).is_err());
    assert!(b.slice(4..9).is_err());
    // Close twice; use after close.
    assert_eq!(p.a.close(), Ok(()));
    assert_eq!(p.a.close(), Err(ExsError::NotConnected));
    assert_eq!(ok(&p.qa, EventKind::Close).kind, EventKind::Close);
    p.a.send(p.a.alloc(8).unwrap(), Flags::NONE, 5);
    let ev = next(&p.qa, "send after close");
    assert_eq!((ev.ctx, ev.result), (5, Err(ExsError::NotConnected)));
    assert!(ev.buf.is_some());
    // The peer learns of the close.
    let ev = next(&p.qb, "peer close");
    assert_eq!(
        (ev.kind, ev.result),
        (EventKind::Close, Err(ExsError::PeerClosed))
    );
    assert_eq!(p.b.close(), Ok(()));
    assert_eq!(p.b.close(), Err(ExsError::NotConnected));
}

fn local_close_cancels_pending(driver: &str) {
    let p = pair(driver);
    for ctx in 0..4 {
        p.a.recv(p.a.alloc(1024).unwrap(), Flags::NONE, ctx);
    }
    p.a.send(p.a.alloc(BIG).unwrap(), Flags::NONE, 9);
    p.a.close().unwrap();
    let (ops, close) = until_closed(&p.qa, 5);
    assert_eq!(close.result, Ok(()));
    assert!(ops
        .iter()
        .all(|e| e.result == Err(ExsError::Canceled) && e.buf.is_some()));
}

/// The queue's fd is readable exactly while events wait, and one queue serves many sockets.
fn queue_fd_and_sharing(driver: &str) {
    use rustix::event::{poll, PollFd, PollFlags};
    let q = EventQueue::new().unwrap();
    let readable = |q: &EventQueue| {
        let mut fds = [PollFd::new(q, PollFlags::IN)];
        poll(
            &mut fds,
            Some(&rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            }),
        )
        .unwrap()
            == 1
    };
    let l = ferry_exs::runtime::ExsListener::bind(&listen_url(driver), Default::default()).unwrap();
    let addr = l.local_addr();
    let (a1, b1, a2, b2) = std::thread::scope(|s| {
        let acc = s.spawn(|| (l.accept(&q, T).unwrap(), l.accept(&q, T).unwrap()));
        let a1 = ferry_exs::runtime::ExsSocket::connect(&addr, Default::default(), &q, T).unwrap();
        let a2 = ferry_exs::runtime::ExsSocket::connect(&addr, Default::default(), &q, T).unwrap();
        let (b1, b2) = acc.join().unwrap();
        (a1, b1, a2, b2)
    });
    assert!(!readable(&q));
    b1.recv(b1.alloc(8).unwrap(), Flags::NONE, 1);
    b2.recv(b2.alloc(8).unwrap(), Flags::NONE, 2);
    a1.send(a1.alloc(8).unwrap(), Flags::NONE, 3);
    a2.send(a2.alloc(8).unwrap(), Flags::NONE, 4);
    let mut seen = Vec::new();
    for _ in 0..4 {
        let mut fds = [PollFd::new(&q, PollFlags::IN)];
        poll(
            &mut fds,
            Some(&rustix::time::Timespec {
                tv_sec: 20,
                tv_nsec: 0,
            }),
        )
        .unwrap();
        assert!(readable(&q));
        let ev = q.try_dequeue().expect("fd said an event waits");
        assert_eq!(ev.result, Ok(()));
        seen.push((ev.socket, ev.ctx));
    }
    assert!(!readable(&q));
    seen.sort();
    let mut want = vec![(b1.id(), 1), (b2.id(), 2), (a1.id(), 3), (a2.id(), 4)];
    want.sort();
    assert_eq!(seen, want);
}

/// Connecting with a bad configuration, or to a listener that never accepts, fails cleanly.
fn bad_connect(driver: &str) {
    use ferry_exs::proto::Config;
    use ferry_exs::runtime::{Error, ExsListener, ExsSocket};
    let q = EventQueue::new().unwrap();
    let l = ExsListener::bind(&listen_url(driver), Config::default()).unwrap();
    let bad = Config {
        send_credits: 0,
        ..Config::default()
    };
    assert!(matches!(
        ExsSocket::connect(&l.local_addr(), bad.clone(), &q, T),
        Err(Error::Exs(ExsError::InvalidConfig))
    ));
    assert!(ExsListener::bind(&listen_url(driver), bad).is_err());
    assert!(ExsSocket::connect("nonsense://x", Config::default(), &q, T).is_err());
    // Nobody accepts: the handshake (or the fabric connect) times out; nothing hangs.
    let start = std::time::Instant::now();
    let r = ExsSocket::connect(
        &l.local_addr(),
        Config::default(),
        &q,
        Duration::from_millis(300),
    );
    assert!(r.is_err(), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(10));
}

macro_rules! on_all_drivers {
    ($($name:ident),*) => {
        mod tcp { $( #[test] fn $name() { super::$name("tcp") } )* }
        mod ofi_tcp { $( #[test] fn $name() { super::$name("ofi+tcp") } )* }
        mod ofi_shm { $( #[test] fn $name() { super::$name("ofi+shm") } )* }
    };
}

on_all_drivers!(
    peer_closes_mid_transfer,
    peer_dies_mid_transfer,
    misuse,
    local_close_cancels_pending,
    queue_fd_and_sharing,
    bad_connect
);
