//! Native tcp driver: connection, two-sided and one-sided transfers over real loopback sockets.

mod tcp_util;

use ferry_fabric::{Access, FabricError, OpKind, Progress, RemoteSlice};
use tcp_util::*;

#[test]
fn connect_accept_and_capabilities() {
    let p = pair();
    let caps = p.client.capabilities();
    assert_eq!(
        (caps.driver.as_str(), caps.provider.as_str()),
        ("tcp", "tcp")
    );
    assert!(caps.rma && !caps.virt_addr);
    assert_eq!(caps.progress, Progress::Auto);
    assert_eq!(caps, p.server.capabilities());
    assert!(p.client.peer().starts_with("tcp://127.0.0.1:"));
    // The accepted endpoint shares the listener's domain; the client has its own.
    assert_eq!(p.server.domain().id(), p.listener.domain().id());
    assert_ne!(p.server.domain().id(), p.client.domain().id());
    let (s2, c2) = connect(&*p.listener);
    assert_eq!(s2.domain().id(), p.listener.domain().id());
    drop((s2, c2));
    assert!(matches!(
        p.listener.accept(std::time::Duration::from_millis(50)),
        Err(FabricError::Timeout(_))
    ));
}

#[test]
fn send_recv_sizes() {
    let p = pair();
    let inline = p.client.capabilities().inline_size;
    for (i, len) in [0, 1, inline, inline + 1, 4 << 20].into_iter().enumerate() {
        let data = pattern(len, i as u8);
        let src = register_data(&*p.client, &data, Access::LOCAL);
        let dst = register(&*p.server, len + 64, Access::LOCAL);
        p.server.post_recv(&[dst.full()], 100 + i as u64).unwrap();
        p.client.post_send(&[src.full()], i as u64).unwrap();
        let s = ok(&*p.client);
        assert_eq!(
            (s.op, s.context, s.len),
            (OpKind::Send, i as u64, len as u64)
        );
        let r = ok(&*p.server);
        assert_eq!(
            (r.op, r.context, r.len),
            (OpKind::Recv, 100 + i as u64, len as u64)
        );
        let got = dst.buffer().to_vec();
        assert!(got[..len] == data[..], "{len}-byte message corrupted");
        assert!(got[len..].iter().all(|&b| b == 0));
    }
}

#[test]
fn messages_before_receives_are_buffered_in_order() {
    let p = pair();
    let sizes = [10, 0, 100_000, 7];
    for (i, &len) in sizes.iter().enumerate() {
        let src = register_data(&*p.client, &pattern(len, i as u8), Access::LOCAL);
        p.client.post_send(&[src.full()], i as u64).unwrap();
        ok(&*p.client);
    }
    // Give the reader time to buffer them all before any receive exists.
    std::thread::sleep(std::time::Duration::from_millis(100));
    for (i, &len) in sizes.iter().enumerate() {
        let dst = register(&*p.server, 100_000, Access::LOCAL);
        // A scatter list of two segments with a gap between them.
        let list = [dst.slice(0..len / 2).unwrap(), dst.slice(50_000..).unwrap()];
        p.server.post_recv(&list, i as u64).unwrap();
        let c = ok(&*p.server);
        assert_eq!((c.context, c.len), (i as u64, len as u64));
        let got = dst.buffer().to_vec();
        let want = pattern(len, i as u8);
        assert_eq!(got[..len / 2], want[..len / 2]);
        assert_eq!(got[50_000..50_000 + len - len / 2], want[len / 2..]);
    }
}

#[test]
fn truncation_keeps_prefix_and_connection() {
    let p = pair();
    let data = pattern(300_000, 9);
    let src = register_data(&*p.client, &data, Access::LOCAL);
    let dst = register(&*p.server, 300_000, Access::LOCAL);
    // Posted before the message arrives, and (second round) after it was buffered.
    for round in 0..2u64 {
        dst.buffer().fill(0);
        if round == 0 {
            p.server
                .post_recv(&[dst.slice(0..100).unwrap()], 1)
                .unwrap();
        }
        p.client.post_send(&[src.full()], 1).unwrap();
        ok(&*p.client);
        if round == 1 {
            std::thread::sleep(std::time::Duration::from_millis(50));
            p.server
                .post_recv(&[dst.slice(0..100).unwrap()], 1)
                .unwrap();
        }
        let (c, e) = failed(&*p.server);
        assert_eq!(c.len, 100);
        assert!(
            matches!(
                e,
                FabricError::Truncated {
                    msg_len: 300_000,
                    buf_len: 100
                }
            ),
            "{e}"
        );
        let got = dst.buffer().to_vec();
        assert_eq!(got[..100], data[..100], "prefix lands");
        assert!(
            got[100..].iter().all(|&b| b == 0),
            "nothing written past the buffer"
        );
        // The remainder was discarded: the next message arrives intact.
        p.server.post_recv(&[dst.full()], 2).unwrap();
        p.client
            .post_send(&[src.slice(0..1000).unwrap()], 2)
            .unwrap();
        ok(&*p.client);
        assert_eq!(ok(&*p.server).len, 1000);
        assert_eq!(dst.buffer().to_vec()[..1000], data[..1000]);
    }
}

#[test]
fn rma_write_gathers_1_2_and_max_segments() {
    let p = pair();
    let max = p.client.capabilities().max_gather;
    let len = 1 << 20;
    let target = register(&*p.server, len, Access::REMOTE_WRITE);
    let remote = advertise(&p, &target);
    for (i, n) in [1, 2, max].into_iter().enumerate() {
        let data = pattern(len, 10 + i as u8);
        let src = register_data(&*p.client, &data, Access::LOCAL);
        p.client
            .post_write(&split(&src, len, n), remote, i as u64)
            .unwrap();
        let c = ok(&*p.client);
        assert_eq!(
            (c.op, c.context, c.len),
            (OpKind::Write, i as u64, len as u64)
        );
        assert!(target.buffer().to_vec() == data, "write with {n} segments");
    }
    // A sub-range in the middle, from the middle of a source region.
    let src = register_data(&*p.client, &[0xab; 100], Access::LOCAL);
    p.client
        .post_write(
            &[src.slice(10..60).unwrap()],
            remote.sub(1000, 50).unwrap(),
            9,
        )
        .unwrap();
    ok(&*p.client);
    let got = target.buffer().to_vec();
    assert!(got[1000..1050].iter().all(|&b| b == 0xab));
    assert_eq!(got[999], pattern(len, 12)[999]);
    assert_eq!(got[1050], pattern(len, 12)[1050]);
}

#[test]
fn rma_read_scatters_into_segments() {
    let p = pair();
    let len = 1 << 20;
    let data = pattern(len, 77);
    let target = register_data(&*p.server, &data, Access::REMOTE_READ);
    let remote = advertise(&p, &target);
    for n in [1, 3, p.client.capabilities().max_gather] {
        let dst = register(&*p.client, len, Access::LOCAL);
        p.client
            .post_read(&split(&dst, len, n), remote, n as u64)
            .unwrap();
        let c = ok(&*p.client);
        assert_eq!(
            (c.op, c.context, c.len),
            (OpKind::Read, n as u64, len as u64)
        );
        assert!(dst.buffer().to_vec() == data, "read with {n} segments");
    }
    // Segments out of address order, from two regions, at the far edge of the target.
    let a = register(&*p.client, 8, Access::LOCAL);
    let b = register(&*p.client, 8, Access::LOCAL);
    let list = [b.slice(4..8).unwrap(), a.slice(0..6).unwrap()];
    p.client
        .post_read(&list, remote.sub(len as u64 - 10, 10).unwrap(), 9)
        .unwrap();
    ok(&*p.client);
    assert_eq!(b.buffer().to_vec()[4..], data[len - 10..len - 6]);
    assert_eq!(a.buffer().to_vec()[..6], data[len - 6..]);
}

#[test]
fn both_sides_serve_each_others_reads_concurrently() {
    let p = pair();
    let len = 8 << 20;
    let (ds, dc) = (pattern(len, 1), pattern(len, 2));
    let ts = register_data(&*p.server, &ds, Access::REMOTE_READ);
    let tc = register_data(&*p.client, &dc, Access::REMOTE_READ);
    let rs = advertise(&p, &ts);
    let rc = tc.remote(..).unwrap();
    let into_c = register(&*p.client, len, Access::LOCAL);
    let into_s = register(&*p.server, len, Access::LOCAL);
    for i in 0..4 {
        p.client.post_read(&[into_c.full()], rs, i).unwrap();
        p.server.post_read(&[into_s.full()], rc, i).unwrap();
    }
    for _ in 0..4 {
        ok(&*p.client);
        ok(&*p.server);
    }
    assert!(into_c.buffer().to_vec() == ds && into_s.buffer().to_vec() == dc);
}

#[test]
fn ten_thousand_rma_ops_window_64() {
    const OPS: u64 = 10_000;
    const WINDOW: u64 = 64;
    const SLOT: usize = 256;
    let p = pair();
    let target = register(&*p.server, SLOT * WINDOW as usize, Access::ALL);
    let remote = advertise(&p, &target);
    let wsrc = register(&*p.client, SLOT * WINDOW as usize, Access::LOCAL);
    let rdst = register(&*p.client, SLOT * WINDOW as usize, Access::LOCAL);
    let range = |i: u64| (i % WINDOW) as usize * SLOT..(i % WINDOW + 1) as usize * SLOT;
    // Even ops write slot i with a stamp; odd ops read back the slot the previous op wrote.
    let stamp = |i: u64| pattern(SLOT, (i / 2) as u8 ^ (i / 512) as u8);
    let mut in_flight = std::collections::VecDeque::new();
    let check = |c: ferry_fabric::Completion, want: u64| {
        assert!(c.result.is_ok(), "op {} failed: {:?}", c.context, c.result);
        assert_eq!(c.context, want, "completions in posting order");
        if want % 2 == 1 {
            let mut got = vec![0; SLOT];
            rdst.buffer().read_at(range(want).start, &mut got);
            assert_eq!(
                got,
                stamp(want - 1),
                "op {want} read back what op {} wrote",
                want - 1
            );
        }
    };
    for i in 0..OPS {
        if in_flight.len() == WINDOW as usize {
            check(
                p.client.cq().wait(T).unwrap(),
                in_flight.pop_front().unwrap(),
            );
        }
        // A pair's remote slot is reused only after both of its ops completed: a read is not
        // ordered before a later write to the same range (as without a fence on RDMA).
        let at = (i / 2 % WINDOW) * SLOT as u64;
        let remote = remote.sub(at, SLOT as u64).unwrap();
        if i % 2 == 0 {
            wsrc.buffer().write_at(range(i).start, &stamp(i));
            p.client
                .post_write(&[wsrc.slice(range(i)).unwrap()], remote, i)
                .unwrap();
        } else {
            p.client
                .post_read(&[rdst.slice(range(i)).unwrap()], remote, i)
                .unwrap();
        }
        in_flight.push_back(i);
    }
    while let Some(want) = in_flight.pop_front() {
        check(p.client.cq().wait(T).unwrap(), want);
    }
    assert!(
        p.client.cq().is_empty() && p.server.cq().is_empty(),
        "no extra completions"
    );
}

#[test]
fn ten_thousand_sends_window_64() {
    const OPS: u64 = 10_000;
    const WINDOW: u64 = 64;
    let p = pair();
    let size = |i: u64| [8, 5000, 64, 70_000][(i % 4) as usize];
    let src = register(&*p.client, 70_000 * WINDOW as usize, Access::LOCAL);
    let dst = register(&*p.server, 70_000 * WINDOW as usize, Access::LOCAL);
    let at = |i: u64| (i % WINDOW) as usize * 70_000;
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut next = 0;
            while next < WINDOW {
                p.server
                    .post_recv(&[dst.slice(at(next)..at(next) + 70_000).unwrap()], next)
                    .unwrap();
                next += 1;
            }
            for want in 0..OPS {
                let c = ok(&*p.server);
                assert_eq!((c.context, c.len), (want, size(want) as u64), "in order");
                let mut got = vec![0; size(want)];
                dst.buffer().read_at(at(want), &mut got);
                assert_eq!(got, pattern(size(want), want as u8), "message {want}");
                if next < OPS {
                    p.server
                        .post_recv(&[dst.slice(at(next)..at(next) + 70_000).unwrap()], next)
                        .unwrap();
                    next += 1;
                }
            }
        });
        let mut in_flight = std::collections::VecDeque::new();
        for i in 0..OPS {
            if in_flight.len() == WINDOW as usize {
                let c = ok(&*p.client);
                assert_eq!(
                    Some(c.context),
                    in_flight.pop_front(),
                    "send completions in order"
                );
            }
            src.buffer().write_at(at(i), &pattern(size(i), i as u8));
            p.client
                .post_send(&[src.slice(at(i)..at(i) + size(i)).unwrap()], i)
                .unwrap();
            in_flight.push_back(i);
        }
        while let Some(want) = in_flight.pop_front() {
            assert_eq!(ok(&*p.client).context, want);
        }
    });
    assert!(
        p.client.cq().is_empty() && p.server.cq().is_empty(),
        "no extra completions"
    );
}

#[test]
fn bad_posts_are_rejected_and_complete_nothing() {
    let p = pair();
    let max = p.client.capabilities().max_gather;
    let r = register(&*p.client, 4096 * (max + 1), Access::LOCAL);
    assert!(
        p.client.post_send(&split(&r, r.len(), max + 1), 0).is_err(),
        "gather limit"
    );
    let theirs = register(&*p.server, 64, Access::LOCAL);
    assert!(
        p.client.post_send(&[theirs.full()], 0).is_err(),
        "other domain"
    );
    let mut outside = r.full();
    outside.offset = 1;
    assert!(matches!(
        p.client.post_send(&[outside.clone()], 0),
        Err(FabricError::InvalidArgument(_))
    ));
    assert!(
        p.client.post_recv(&[outside], 0).is_err(),
        "slice past its region"
    );
    let overlap = [r.slice(0..100).unwrap(), r.slice(50..150).unwrap()];
    assert!(
        p.client.post_recv(&overlap, 0).is_err(),
        "overlapping receive segments"
    );
    let remote = RemoteSlice {
        addr: 0,
        len: 200,
        key: 1,
    };
    assert!(
        p.client.post_read(&overlap, remote, 0).is_err(),
        "overlapping read segments"
    );
    assert!(
        p.client.post_write(&overlap, remote, 0).is_ok(),
        "gathering may overlap"
    );
    assert!(matches!(failed(&*p.client).1, FabricError::RemoteAccess(_)));
    let remote = RemoteSlice {
        addr: 0,
        len: 10,
        key: 1,
    };
    assert!(
        p.client
            .post_write(&[r.slice(0..5).unwrap()], remote, 0)
            .is_err(),
        "length"
    );
    assert!(p.client.post_read(&[], remote, 0).is_err(), "empty list");
    assert!(p
        .client
        .cq()
        .wait(std::time::Duration::from_millis(200))
        .is_err());
}

#[test]
fn inline_and_large_sends_complete_in_posting_order() {
    let p = pair();
    let big = register(&*p.client, 8 << 20, Access::LOCAL);
    let small = register(&*p.client, 16, Access::LOCAL);
    let dst = register(&*p.server, 8 << 20, Access::LOCAL);
    for i in 0..6 {
        p.server.post_recv(&[dst.full()], i).unwrap();
    }
    for i in 0..6 {
        let s = if i % 3 == 0 { big.full() } else { small.full() };
        p.client.post_send(&[s], i).unwrap();
    }
    let got: Vec<u64> = (0..6).map(|_| ok(&*p.client).context).collect();
    assert_eq!(got, [0, 1, 2, 3, 4, 5]);
    let got: Vec<u64> = (0..6).map(|_| ok(&*p.server).len).collect();
    assert_eq!(got, [8 << 20, 16, 16, 8 << 20, 16, 16]);
}

/// Sends small enough to be written by the posting thread, posted faster than the peer
/// drains them, from both sides at once: the socket fills, direct writes end part-way and
/// the writer takes over the rest; every message still arrives whole and in order, and send
/// completions keep posting order.
#[test]
fn direct_writes_hand_over_to_the_writer_when_the_socket_fills() {
    const N: usize = 3000;
    const LEN: usize = 12_000;
    let p = pair();
    let eps = [&*p.client, &*p.server];
    let srcs: Vec<_> = eps
        .iter()
        .enumerate()
        .map(|(side, ep)| {
            let data: Vec<u8> = (0..N)
                .flat_map(|i| pattern(LEN, (i * 7 + side) as u8))
                .collect();
            register_data(*ep, &data, Access::LOCAL)
        })
        .collect();
    std::thread::scope(|s| {
        for (side, ep) in eps.iter().enumerate() {
            let src = &srcs[side];
            s.spawn(move || {
                for i in 0..N {
                    let slice = src.slice(i * LEN..(i + 1) * LEN).unwrap();
                    ep.post_send(&[slice], i as u64).unwrap();
                }
            });
        }
    });
    for (side, ep) in eps.iter().enumerate() {
        let dst = register(*ep, LEN, Access::LOCAL);
        let peer = 1 - side;
        let mut sends = 0u64;
        let take_send = |c: &ferry_fabric::Completion, sends: &mut u64| {
            assert_eq!(c.context, *sends, "send completions out of order");
            *sends += 1;
        };
        for i in 0..N {
            ep.post_recv(&[dst.full()], 1 << 40).unwrap();
            loop {
                let c = ok(*ep);
                if c.op == OpKind::Send {
                    take_send(&c, &mut sends);
                    continue;
                }
                assert_eq!(c.len, LEN as u64);
                let want = pattern(LEN, (i * 7 + peer) as u8);
                assert!(dst.buffer().to_vec() == want, "message {i} differs");
                break;
            }
        }
        while sends < N as u64 {
            take_send(&ok(*ep), &mut sends);
        }
    }
}

/// A buffer of a header and a file's pages (`Buffer::map_file_after`) travels whole, the
/// file's part by `sendfile`, as a send and as an RMA read's source; a file truncated under
/// it makes the send fail and the connection end, and the process carries on.
#[test]
fn a_file_after_a_header_is_sent_and_a_truncated_one_fails() {
    let path = std::env::temp_dir().join(format!("ferry-tcp-file-{}", std::process::id()));
    let data = pattern(3 << 20, 7);
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let p = pair();
    let buf = ferry_fabric::Buffer::map_file_after(&file, 1 << 20, 2 << 20, 16, false).unwrap();
    buf.write_at(0, b"sixteen bytes!!!");
    let src = p
        .client
        .domain()
        .register(&buf, Access::REMOTE_READ)
        .unwrap();
    let mut want = b"sixteen bytes!!!".to_vec();
    want.extend_from_slice(&data[1 << 20..]);
    let dst = register(&*p.server, want.len(), Access::LOCAL);
    p.server.post_recv(&[dst.full()], 1).unwrap();
    p.client.post_send(&[src.full()], 2).unwrap();
    assert_eq!(ok(&*p.client).len, want.len() as u64);
    assert_eq!(ok(&*p.server).len, want.len() as u64);
    assert!(dst.buffer().to_vec() == want, "sent bytes differ");
    // Truncated: the file's part cannot be sent; the send fails, nothing crashes.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let dst = register(&*p.server, want.len(), Access::LOCAL);
    p.server.post_recv(&[dst.full()], 3).unwrap();
    p.client.post_send(&[src.full()], 4).unwrap();
    let (c, _) = failed(&*p.client);
    assert_eq!(c.context, 4);
    let _ = std::fs::remove_file(&path);
}
