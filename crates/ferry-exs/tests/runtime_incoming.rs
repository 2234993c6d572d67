//! `ExsListener::accept_incoming`: a connection taken ahead of time and started later, with
//! the queue chosen then, works like one from `accept` (the C API's backlog relies on it).

mod runtime_util;

use std::time::Duration;

use ferry_exs::proto::{Config, EventKind, Flags};
use ferry_exs::runtime::{EventQueue, ExsListener, ExsSocket};
use runtime_util::*;

fn incoming_started_late(driver: &str) {
    let l = ExsListener::bind(&listen_url(driver), Config::default()).unwrap();
    let addr = l.local_addr();
    let (qa, qb) = (EventQueue::new().unwrap(), EventQueue::new().unwrap());
    let (a, b) = std::thread::scope(|s| {
        let acc = s.spawn(|| {
            let inc = l.accept_incoming(T).expect("accept_incoming");
            assert!(!inc.peer_addr().is_empty());
            // The client's HELLO waits at the fabric meanwhile.
            std::thread::sleep(Duration::from_millis(300));
            inc.start(&qb, T).expect("start")
        });
        let a = ExsSocket::connect(&addr, Config::default(), &qa, T).expect("connect");
        (a, acc.join().expect("accept thread"))
    });
    let data = pattern(100_000, 9);
    b.recv(b.alloc(100_000).unwrap(), Flags::NONE, 1);
    let s = a.alloc(100_000).unwrap();
    s.write_at(0, &data).unwrap();
    a.send(s, Flags::NONE, 2);
    assert!(ok(&qb, EventKind::Recv).buf.unwrap().to_vec() == data);
    ok(&qa, EventKind::Send);
    // Nobody connecting: a short wait times out and the listener stays usable.
    assert!(l.accept_incoming(Duration::from_millis(50)).is_err());
}

mod tcp {
    #[test]
    fn incoming_started_late() {
        super::incoming_started_late("tcp")
    }
}
mod ofi_tcp {
    #[test]
    fn incoming_started_late() {
        super::incoming_started_late("ofi+tcp")
    }
}
mod ofi_shm {
    #[test]
    fn incoming_started_late() {
        super::incoming_started_late("ofi+shm")
    }
}
