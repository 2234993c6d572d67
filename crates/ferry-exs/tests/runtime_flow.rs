//! Flow control and truncation on every driver: many small messages through a posting window
//! larger than the credits (nothing lost or reordered, stalls counted, credits restored), and
//! a receive buffer smaller than the message.

mod runtime_util;

use std::time::{Duration, Instant};

use ferry_exs::proto::{Config, EventKind, Flags};
use ferry_exs::runtime::ExsBuf;
use ferry_exs::ExsError;
use runtime_util::*;

/// Messages per run, on every driver (about 30 s for all three in a debug build since the
/// small-message fast path).
fn count(_driver: &str) -> u64 {
    100_000
}

fn many_small(driver: &str) {
    let cfg = Config {
        send_credits: 8,
        recv_credits: 8,
        ..Config::default()
    };
    let p = pair_with(driver, cfg.clone(), cfg);
    let n = count(driver);
    const WINDOW: u64 = 64;
    let (mut sent, mut send_done, mut posted, mut received) = (0u64, 0u64, 0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(120);
    while received < n || send_done < n {
        assert!(
            Instant::now() < deadline,
            "stuck at {received}/{send_done} of {n}"
        );
        while posted < n && posted - received < WINDOW {
            p.b.recv(p.b.alloc(8).unwrap(), Flags::NONE, posted);
            posted += 1;
        }
        while sent < n && sent - send_done < WINDOW {
            let b = p.a.alloc(8).unwrap();
            b.write_at(0, &sent.to_le_bytes()).unwrap();
            p.a.send(b, Flags::NONE, sent);
            sent += 1;
        }
        let mut progressed = false;
        while let Some(ev) = p.qb.try_dequeue() {
            assert_eq!((ev.kind, ev.result), (EventKind::Recv, Ok(())), "{ev:?}");
            assert_eq!(ev.ctx, received, "recv completions out of order");
            let bytes = ev.buf.expect("buffer back").to_vec();
            assert_eq!(
                u64::from_le_bytes(bytes.try_into().unwrap()),
                received,
                "message reordered"
            );
            received += 1;
            progressed = true;
        }
        while let Some(ev) = p.qa.try_dequeue() {
            assert_eq!((ev.kind, ev.result), (EventKind::Send, Ok(())), "{ev:?}");
            assert_eq!(ev.ctx, send_done, "send completions out of order");
            send_done += 1;
            progressed = true;
        }
        if !progressed {
            // Sleep on the queue rather than spin: the machine is shared.
            if let Some(ev) = p.qb.dequeue(Duration::from_millis(5)) {
                assert_eq!(ev.ctx, received);
                assert_eq!(ev.result, Ok(()));
                assert_eq!(
                    u64::from_le_bytes(ev.buf.unwrap().to_vec().try_into().unwrap()),
                    received
                );
                received += 1;
            }
        }
    }
    let stats = p.a.stats();
    assert!(
        stats.credit_stalls > 0,
        "a window of {WINDOW} over 8 credits must stall: {stats:?}"
    );
    assert_eq!(stats.immediates, n);
    // Frame send buffers are pooled: bounded by what is in flight, not by the message count.
    let rt = p.a.runtime_stats();
    assert!(rt.send_buffers < 200, "{rt:?}");
    // Every credit comes home once the receiver has returned them.
    let deadline = Instant::now() + T;
    loop {
        let c = p.a.credits();
        if c.available == u32::from(c.send_window) {
            break;
        }
        assert!(Instant::now() < deadline, "credits not restored: {c:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "{driver}: {n} messages, {} credit stalls, {} credit frames",
        stats.credit_stalls,
        p.b.stats().credit_frames
    );
}

fn truncation(driver: &str) {
    for (len, push) in [(300usize, false), (4096, false), (4096, true)] {
        let cfg = Config {
            push,
            ..Config::default()
        };
        let p = pair_with(driver, cfg.clone(), cfg);
        // The receive buffer is a 100-byte window in the middle of a guarded region.
        let region = p.b.alloc(300).unwrap();
        region.fill(0xee);
        // A second view of the region, so the test can still see all 300 bytes.
        let rb = ExsBuf::new(region.region().clone())
            .slice(100..200)
            .unwrap();
        p.b.recv(rb, Flags::NONE, 1);
        let sa = p.a.alloc(len).unwrap();
        sa.write_at(0, &pattern(len, 9)).unwrap();
        p.a.send(sa, Flags::NONE, 2);
        let ev = next(&p.qb, "truncated recv");
        assert_eq!(ev.kind, EventKind::Recv);
        assert_eq!(
            ev.result,
            Err(ExsError::MessageSize),
            "{driver} {len} push={push}"
        );
        assert_eq!(ev.len, 100);
        let all = region.to_vec();
        assert_eq!(all[100..200], pattern(len, 9)[..100], "prefix delivered");
        assert!(
            all[..100].iter().chain(&all[200..]).all(|&b| b == 0xee),
            "written outside"
        );
        // The sender succeeds, and learns how much the receiver took.
        let ev = ok(&p.qa, EventKind::Send);
        assert_eq!(ev.len, 100);
        // The connection carries on.
        p.b.recv(p.b.alloc(8).unwrap(), Flags::NONE, 3);
        p.a.send(p.a.alloc(8).unwrap(), Flags::NONE, 4);
        ok(&p.qb, EventKind::Recv);
        ok(&p.qa, EventKind::Send);
    }
}

macro_rules! on_all_drivers {
    ($($name:ident),*) => {
        mod tcp { $( #[test] fn $name() { super::$name("tcp") } )* }
        mod ofi_tcp { $( #[test] fn $name() { super::$name("ofi+tcp") } )* }
        mod ofi_shm { $( #[test] fn $name() { super::$name("ofi+shm") } )* }
    };
}

on_all_drivers!(many_small, truncation);
