//! Runtime basics on every driver: ping-pong, and normal, immediate, push and persistent
//! transfers delivering identical bytes.

mod runtime_util;

use ferry_exs::proto::{Config, EventKind, Flags};
use runtime_util::*;

fn ping_pong(driver: &str) {
    let p = pair(driver);
    for round in 0..50u8 {
        let rb = p.b.alloc(64).unwrap();
        p.b.recv(rb, Flags::NONE, 1);
        let sa = p.a.alloc(64).unwrap();
        sa.write_at(0, &pattern(64, round)).unwrap();
        p.a.send(sa, Flags::NONE, 2);
        let ev = ok(&p.qb, EventKind::Recv);
        assert_eq!(ev.len, 64);
        assert_eq!(ev.buf.unwrap().to_vec(), pattern(64, round));
        assert_eq!(ok(&p.qa, EventKind::Send).ctx, 2);
        // And back.
        let ra = p.a.alloc(64).unwrap();
        p.a.recv(ra, Flags::NONE, 3);
        let sb = p.b.alloc(64).unwrap();
        sb.write_at(0, &pattern(64, round ^ 0xff)).unwrap();
        p.b.send(sb, Flags::NONE, 4);
        assert_eq!(
            ok(&p.qa, EventKind::Recv).buf.unwrap().to_vec(),
            pattern(64, round ^ 0xff)
        );
        ok(&p.qb, EventKind::Send);
    }
}

/// Sends `len` bytes from a to b with the given configs and returns what b received.
fn one_transfer(driver: &str, push: bool, len: usize) {
    let cfg = Config {
        push,
        ..Config::default()
    };
    let p = pair_with(driver, cfg.clone(), cfg);
    let data = pattern(len, len as u8);
    let rb = p.b.alloc(len).unwrap();
    p.b.recv(rb, Flags::NONE, 7);
    let sa = p.a.alloc(len).unwrap();
    sa.write_at(0, &data).unwrap();
    p.a.send(sa, Flags::NONE, 8);
    let ev = ok(&p.qb, EventKind::Recv);
    assert_eq!((ev.ctx, ev.len), (7, len as u64));
    assert!(
        ev.buf.unwrap().to_vec() == data,
        "{driver} push={push} len={len}: bytes differ"
    );
    let ev = ok(&p.qa, EventKind::Send);
    assert_eq!((ev.ctx, ev.len), (8, len as u64));
}

fn transfers(driver: &str) {
    // Immediate (<= 512), pull, push, and a large one.
    for len in [1, 512, 513, 100_000, 4 << 20] {
        one_transfer(driver, false, len);
        one_transfer(driver, true, len);
    }
}

/// A persistent send block read repeatedly by ordinary recvs, at offsets.
fn persistent(driver: &str) {
    let p = pair(driver);
    let data = pattern(8192, 3);
    let block = p.a.alloc(8192).unwrap();
    block.write_at(0, &data).unwrap();
    p.a.send(block, Flags::PERSISTENT, 100);
    for i in 0..20u64 {
        let off = (i * 397) % 8000;
        let rb = p.b.alloc(192).unwrap();
        p.b.recv_offset(rb, off, Flags::NONE, i);
        let ev = ok(&p.qb, EventKind::Recv);
        assert_eq!(ev.ctx, i);
        let o = off as usize;
        assert_eq!(ev.buf.unwrap().to_vec(), data[o..o + 192].to_vec());
    }
    // Exactly at the edge, then past it.
    let rb = p.b.alloc(192).unwrap();
    p.b.recv_offset(rb, 8192 - 192, Flags::NONE, 50);
    assert_eq!(
        ok(&p.qb, EventKind::Recv).buf.unwrap().to_vec(),
        data[8000..].to_vec()
    );
    // Near the end the read is short: only what the block holds past the offset.
    let rb = p.b.alloc(192).unwrap();
    p.b.recv_offset(rb, 8192 - 191, Flags::NONE, 51);
    let ev = ok(&p.qb, EventKind::Recv);
    assert_eq!(ev.len, 191);
    assert_eq!(ev.buf.unwrap().to_vec()[..191], data[8001..]);
    let rb = p.b.alloc(192).unwrap();
    p.b.recv_offset(rb, 8193, Flags::NONE, 51);
    let ev = next(&p.qb, "out-of-range recv");
    assert_eq!(ev.kind, EventKind::Recv);
    assert_eq!(
        ev.result,
        Err(ferry_exs::ExsError::OffsetOutOfRange),
        "{ev:?}"
    );
    assert!(ev.buf.is_some());
    // The block is still there.
    let rb = p.b.alloc(8192).unwrap();
    p.b.recv(rb, Flags::NONE, 52);
    assert_eq!(ok(&p.qb, EventKind::Recv).buf.unwrap().to_vec(), data);
    // Closing hands the persistent block back.
    p.a.close().unwrap();
    let mut got_block = false;
    while let Some(ev) = p.qa.dequeue(T) {
        if ev.ctx == 100 {
            got_block = ev.buf.is_some();
            break;
        }
    }
    assert!(got_block);
}

/// A persistent recv block written by sends at offsets (no recv events), and a persistent
/// NOTIFY_ON_READ send reporting each read.
fn persistent_recv_and_notify(driver: &str) {
    let p = pair(driver);
    let block = p.b.alloc(4096).unwrap();
    let view = block.region().clone();
    let before = p.a.stats().frames_received;
    p.b.recv(block, Flags::PERSISTENT, 1);
    // The sends need the block's advert first (else they are plain sends with an offset).
    let deadline = std::time::Instant::now() + T;
    while p.a.stats().frames_received == before {
        assert!(
            std::time::Instant::now() < deadline,
            "RECV_ADVERT never arrived"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let mut want = vec![0u8; 4096];
    for (i, (off, len)) in [
        (0usize, 100usize),
        (1000, 700),
        (4096 - 600, 600),
        (3000, 64),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(len, i as u8);
        let s = p.a.alloc(len).unwrap();
        s.write_at(0, &data).unwrap();
        p.a.send_offset(s, off as u64, Flags::NONE, i as u64);
        let ev = ok(&p.qa, EventKind::Send);
        assert_eq!((ev.ctx, ev.len), (i as u64, len as u64));
        want[off..off + len].copy_from_slice(&data);
    }
    assert!(view.buffer().to_vec() == want, "block content differs");
    // Past the end of the block: the send fails, nothing is written.
    p.a.send_offset(p.a.alloc(100).unwrap(), 4000, Flags::NONE, 9);
    let ev = next(&p.qa, "send past the block");
    assert_eq!(ev.result, Err(ferry_exs::ExsError::MessageSize));
    assert!(view.buffer().to_vec() == want);
    assert!(p.qb.is_empty(), "a persistent recv reports no events");

    // The other direction: b exposes a NOTIFY_ON_READ block, a reads it twice.
    let data = pattern(2048, 77);
    let sblock = p.b.alloc(2048).unwrap();
    sblock.write_at(0, &data).unwrap();
    p.b.send(sblock, Flags::PERSISTENT | Flags::NOTIFY_ON_READ, 5);
    for round in 0..2 {
        p.a.recv_offset(p.a.alloc(1024).unwrap(), 512, Flags::NONE, 20 + round);
        let ev = ok(&p.qa, EventKind::Recv);
        assert_eq!(ev.buf.unwrap().to_vec(), data[512..1536].to_vec());
        let ev = ok(&p.qb, EventKind::ReadNotify);
        assert_eq!(ev.len, 1024);
        assert!(ev.buf.is_none());
    }
}

/// Transfers split into many RMA pieces arrive whole, pull and push.
fn chunked_rma(driver: &str) {
    for push in [false, true] {
        let cfg = Config {
            push,
            ..Config::default()
        };
        let p = pair_with(driver, cfg.clone(), cfg);
        p.a.set_rma_chunk(4096);
        p.b.set_rma_chunk(4096);
        let data = pattern(100_001, 5);
        p.b.recv(p.b.alloc(100_001).unwrap(), Flags::NONE, 1);
        let s = p.a.alloc(100_001).unwrap();
        s.write_at(0, &data).unwrap();
        p.a.send(s, Flags::NONE, 2);
        assert!(ok(&p.qb, EventKind::Recv).buf.unwrap().to_vec() == data);
        ok(&p.qa, EventKind::Send);
        let split = if push {
            p.a.runtime_stats()
        } else {
            p.b.runtime_stats()
        };
        assert_eq!((split.rma_split, split.rma_pieces), (1, 25), "{split:?}");
    }
}

/// The per-driver default configuration is valid and connects.
fn default_config_connects(driver: &str) {
    let addr: ferry_fabric::Address = listen_url(driver).parse().unwrap();
    let cfg = ferry_exs::runtime::default_config(&addr);
    assert_eq!(cfg.validate(), Ok(()));
    let p = pair_with(driver, cfg.clone(), cfg);
    p.b.recv(p.b.alloc(100_000).unwrap(), Flags::NONE, 1);
    p.a.send(p.a.alloc(100_000).unwrap(), Flags::NONE, 2);
    ok(&p.qb, EventKind::Recv);
    ok(&p.qa, EventKind::Send);
}

/// exs_sendfile delivers exactly the file's range, whether it travels as immediate data or
/// is pulled from the mapped page cache, at unaligned offsets too; a range past the end is
/// refused before anything is sent.
fn sendfile(driver: &str) {
    use std::io::Write;
    let p = pair(driver);
    let path = std::env::temp_dir().join(format!("ferry-sendfile-{}-{driver}", std::process::id()));
    let data = pattern(3 << 20, 5);
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(&data))
        .unwrap();
    let file = std::fs::File::open(&path).unwrap();
    for (off, len) in [
        (0usize, 0usize),
        (7, 100),
        (4_097, 1 << 20),
        (0, 3 << 20),
        (1, (3 << 20) - 1),
    ] {
        p.b.recv(p.b.alloc(len.max(1)).unwrap(), Flags::NONE, 1);
        p.a.sendfile(None, &file, off as u64, len as u64, Flags::NONE, 2)
            .unwrap();
        let ev = ok(&p.qb, EventKind::Recv);
        assert_eq!(ev.len, len as u64);
        assert!(
            ev.buf.unwrap().to_vec()[..len] == data[off..off + len],
            "{off}+{len}"
        );
        let ev = ok(&p.qa, EventKind::Send);
        assert_eq!((ev.ctx, ev.len), (2, len as u64));
    }
    assert!(p
        .a
        .sendfile(None, &file, 1, 3 << 20, Flags::NONE, 3)
        .is_err());
    assert!(p
        .a
        .sendfile(None, &file, u64::MAX, 2, Flags::NONE, 3)
        .is_err());
    assert!(p.qa.dequeue(std::time::Duration::from_millis(50)).is_none());
    std::fs::remove_file(&path).unwrap();
}

/// An operation reports to the queue it names, with the caller's ctx; notifications of a
/// persistent send follow its queue; the socket's own queue sees nothing of them.
fn per_operation_queues(driver: &str) {
    let p = pair(driver);
    let other = ferry_exs::runtime::EventQueue::new().unwrap();
    p.b.recv_to(
        Some(&other),
        p.b.alloc(10).unwrap(),
        0,
        Flags::NONE,
        u64::MAX,
    );
    p.a.send_to(Some(&other), p.a.alloc(10).unwrap(), 0, Flags::NONE, 0);
    let mut got: Vec<_> = (0..2).map(|_| next(&other, "routed")).collect();
    got.sort_by_key(|e| e.ctx);
    assert_eq!((got[0].kind, got[0].ctx), (EventKind::Send, 0));
    assert_eq!((got[1].kind, got[1].ctx), (EventKind::Recv, u64::MAX));
    assert_eq!(got[1].socket, p.b.id());
    p.b.send_to(
        Some(&other),
        p.b.alloc(64).unwrap(),
        0,
        Flags::PERSISTENT | Flags::NOTIFY_ON_READ,
        42,
    );
    for _ in 0..2 {
        p.a.recv_to(Some(&p.qa), p.a.alloc(64).unwrap(), 0, Flags::NONE, 7);
        assert_eq!(ok(&p.qa, EventKind::Recv).ctx, 7);
        assert_eq!(ok(&other, EventKind::ReadNotify).ctx, 42);
    }
    assert!(p.qa.is_empty() && p.qb.is_empty());
}

/// Addresses name both ends consistently, and readiness follows messages and close.
fn names_and_readiness(driver: &str) {
    let p = pair(driver);
    assert_eq!(p.a.local_addr(), p.b.peer_addr());
    assert_eq!(p.a.peer_addr(), p.b.local_addr());
    let r = p.b.readiness();
    assert!(!r.readable && r.writable && !r.closed, "{r:?}");
    p.a.send(p.a.alloc(10).unwrap(), Flags::NONE, 1);
    let deadline = std::time::Instant::now() + T;
    while !p.b.readiness().readable {
        assert!(
            std::time::Instant::now() < deadline,
            "message never became readable"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    p.b.recv(p.b.alloc(10).unwrap(), Flags::NONE, 2);
    ok(&p.qb, EventKind::Recv);
    assert!(!p.b.readiness().readable);
    p.a.close().unwrap();
    while !p.b.readiness().closed {
        assert!(std::time::Instant::now() < deadline, "close never seen");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(!p.b.readiness().writable);
}

/// A first message sent with the HELLO (`connect_early`) reaches the listener's side as any
/// message does, on every driver; one the listener's immediate size cannot hold fails the
/// connection with MessageSize, and the listener goes on accepting.
fn early_first_message(driver: &str) {
    use ferry_exs::runtime::{EventQueue, ExsListener, ExsSocket};
    use ferry_exs::ExsError;
    let small = Config {
        small_packet_max_size: 100,
        ..Config::default()
    };
    let listener = ExsListener::bind(&listen_url(driver), small).expect("bind");
    let addr = listener.local_addr();
    let (qa, qb) = (EventQueue::new().unwrap(), EventQueue::new().unwrap());
    let first = pattern(80, 9);
    let (a, b) = std::thread::scope(|s| {
        let acc = s.spawn(|| listener.accept(&qb, T));
        let a = ExsSocket::connect_early(&addr, Config::default(), &qa, T, (&first, 5));
        (
            a.expect("connect early"),
            acc.join().unwrap().expect("accept"),
        )
    });
    b.recv(b.alloc(200).unwrap(), Flags::NONE, 6);
    let ev = ok(&qb, EventKind::Recv);
    assert_eq!(ev.buf.unwrap().to_vec()[..80], first[..]);
    assert_eq!(ok(&qa, EventKind::Send).ctx, 5);
    // Then the connection carries on as any other.
    a.send(a.alloc(10).unwrap(), Flags::NONE, 7);
    b.recv(b.alloc(10).unwrap(), Flags::NONE, 8);
    assert_eq!(ok(&qb, EventKind::Recv).ctx, 8);
    drop((a, b));
    // Too long for the listener's immediates: refused, and the listener still serves.
    let long = pattern(300, 1);
    let refused = std::thread::scope(|s| {
        let acc = s.spawn(|| listener.accept(&qb, T));
        let r = ExsSocket::connect_early(&addr, Config::default(), &qa, T, (&long, 9));
        let _ = acc.join();
        r
    });
    let e = refused.expect_err("an early message over the peer's immediate size");
    assert!(
        matches!(e, ferry_exs::runtime::Error::Exs(ExsError::MessageSize)),
        "{e:?}"
    );
    let qc = EventQueue::new().unwrap();
    std::thread::scope(|s| {
        let acc = s.spawn(|| listener.accept(&qb, T));
        let c = ExsSocket::connect(&addr, Config::default(), &qc, T).expect("plain connect after");
        acc.join().unwrap().expect("accept after");
        drop(c);
    });
}

macro_rules! on_all_drivers {
    ($($name:ident),*) => {
        mod tcp { $( #[test] fn $name() { super::$name("tcp") } )* }
        mod ofi_tcp { $( #[test] fn $name() { super::$name("ofi+tcp") } )* }
        mod ofi_shm { $( #[test] fn $name() { super::$name("ofi+shm") } )* }
    };
}

on_all_drivers!(
    ping_pong,
    transfers,
    persistent,
    persistent_recv_and_notify,
    chunked_rma,
    default_config_connects,
    sendfile,
    names_and_readiness,
    per_operation_queues,
    early_first_message
);
