//! Shared helpers for the runtime tests: a connected socket pair on any driver, and waits
//! that always time out instead of hanging.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ferry_exs::proto::{Config, EventKind};
use ferry_exs::runtime::{EventQueue, ExsEvent, ExsListener, ExsSocket};

/// Every wait in these tests gives up after this long.
pub const T: Duration = Duration::from_secs(20);

/// The drivers every runtime test runs on.
pub const DRIVERS: [&str; 3] = ["tcp", "ofi+tcp", "ofi+shm"];

pub fn listen_url(driver: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    match driver {
        "ofi+shm" => format!("ofi+shm://ferry-exsrt-{}-{n}", std::process::id()),
        d => format!("{d}://127.0.0.1:0"),
    }
}

pub struct Pair {
    pub a: ExsSocket,
    pub b: ExsSocket,
    pub qa: EventQueue,
    pub qb: EventQueue,
    pub listener: ExsListener,
}

/// A connected pair: `a` connected, `b` accepted; each reports to its own queue.
pub fn pair_with(driver: &str, ca: Config, cb: Config) -> Pair {
    pair_on(driver, ca, cb, false)
}

/// Like [`pair_with`]; with `shared`, both sockets report to one queue (`qa` and `qb` are
/// handles to it).
pub fn pair_on(driver: &str, ca: Config, cb: Config, shared: bool) -> Pair {
    let listener = ExsListener::bind(&listen_url(driver), cb).expect("bind");
    let addr = listener.local_addr();
    let qa = EventQueue::new().expect("queue");
    let qb = if shared {
        qa.clone()
    } else {
        EventQueue::new().expect("queue")
    };
    let (a, b) = std::thread::scope(|s| {
        let acc = s.spawn(|| listener.accept(&qb, T));
        let a = ExsSocket::connect(&addr, ca, &qa, T).expect("connect");
        (a, acc.join().expect("accept thread").expect("accept"))
    });
    Pair {
        a,
        b,
        qa,
        qb,
        listener,
    }
}

pub fn pair(driver: &str) -> Pair {
    pair_with(driver, Config::default(), Config::default())
}

/// The next event, or a panic naming what was expected.
pub fn next(q: &EventQueue, what: &str) -> ExsEvent {
    q.dequeue(T)
        .unwrap_or_else(|| panic!("no {what} event within {T:?}"))
}

/// The next event, which must be a successful `kind`.
pub fn ok(q: &EventQueue, kind: EventKind) -> ExsEvent {
    let ev = next(q, &format!("{kind:?}"));
    assert_eq!(ev.kind, kind, "unexpected event {ev:?}");
    assert_eq!(ev.result, Ok(()), "{kind:?} failed: {ev:?}");
    ev
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
