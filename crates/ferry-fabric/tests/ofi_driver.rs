//! The ofi driver against real libfabric providers: tcp (served as tcp;ofi_rxm) and shm.
//! Every test runs on both; every wait has a timeout.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ferry_fabric::{
    listen, open, Access, Address, Buffer, Completion, Domain, Endpoint, FabricError, Listener,
    LocalSlice, MemoryRegion, OpKind, RemoteAccessError, RemoteSlice,
};

const T: Duration = Duration::from_secs(20);

fn shm_addr() -> Address {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("ofi+shm://ferry-test-{}-{n}", std::process::id())
        .parse()
        .unwrap()
}

/// Runs `f` on every provider under test (`FERRY_OFI_ONLY=shm` or `=tcp` narrows it).
fn each(f: impl Fn(&Address)) {
    let only = std::env::var("FERRY_OFI_ONLY").unwrap_or_default();
    for a in ["ofi+tcp://127.0.0.1:0".parse().unwrap(), shm_addr()] {
        if !a.driver_name().contains(only.as_str()) {
            continue;
        }
        eprintln!("== {a}");
        f(&a);
    }
}

struct Pair {
    listener: Box<dyn Listener>,
    server: Box<dyn Endpoint>,
    client: Box<dyn Endpoint>,
    client_domain: Arc<dyn Domain>,
}

fn connect_to(addr: &Address) -> thread::JoinHandle<(Arc<dyn Domain>, Box<dyn Endpoint>)> {
    let addr = addr.clone();
    thread::spawn(move || {
        let d = open(&addr).expect("open");
        let ep = d.connect(&addr, T).expect("connect");
        (d, ep)
    })
}

fn pair(addr: &Address) -> Pair {
    let listener = listen(addr).expect("listen");
    let h = connect_to(&listener.local_addr());
    let server = listener.accept(T).expect("accept");
    // As after the layer above authenticated the client.
    server.enable_remote_access();
    let (client_domain, client) = h.join().unwrap();
    Pair {
        listener,
        server,
        client,
        client_domain,
    }
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ seed) as u8)
        .collect()
}

fn reg(d: &dyn Domain, data: &[u8], access: Access) -> MemoryRegion {
    d.register(&Buffer::from_slice(data), access)
        .expect("register")
}

/// Registers `len` bytes on `ep`'s domain and grants them to `ep`'s peer.
fn granted(ep: &dyn Endpoint, len: usize, access: Access) -> MemoryRegion {
    let r = ep
        .domain()
        .register(&Buffer::new(len), access)
        .expect("register");
    ep.grant(&r).expect("grant");
    r
}

fn done(ep: &dyn Endpoint) -> Completion {
    ep.cq().wait(T).expect("completion")
}

fn done_ok(ep: &dyn Endpoint, context: u64, op: OpKind, len: u64) {
    let c = done(ep);
    assert!(c.result.is_ok(), "{op:?} {context} failed: {:?}", c.result);
    assert_eq!((c.context, c.op, c.len), (context, op, len));
}

#[test]
fn capabilities_are_reported() {
    each(|a| {
        let p = pair(a);
        let caps = p.client.capabilities();
        eprintln!("{caps:?}");
        assert_eq!(caps.driver, a.driver_name());
        assert!(caps.rma && caps.max_gather >= 1);
        assert!(caps.ordering.send_after_send);
        // The measured piece sizes (info::rma_piece): 1 MiB on tcp;ofi_rxm, 4 MiB on shm.
        let piece = if caps.provider == "shm" {
            4 << 20
        } else {
            1 << 20
        };
        assert_eq!(caps.rma_piece, piece, "{}", caps.provider);
        assert_eq!(caps, p.server.capabilities());
        assert!(!p.client.peer().is_empty());
        let la = p.listener.local_addr();
        assert_eq!(la.scheme, a.scheme);
        if a.port.is_some() {
            assert_ne!(la.port, Some(0), "listener must report its real port");
        } else {
            assert_eq!(la.host, a.host, "shm listens under the name asked for");
        }
    });
}

#[test]
fn send_recv_sizes() {
    each(|a| {
        let p = pair(a);
        let inline = p.client.capabilities().inline_size;
        let sd = p.server.domain();
        for (i, size) in [0, 1, inline, inline + 1, 4 << 20].into_iter().enumerate() {
            let data = pattern(size, i);
            let src = reg(&*p.client_domain, &data, Access::LOCAL);
            let dst = sd.register(&Buffer::new(size), Access::LOCAL).unwrap();
            p.server.post_recv(&[dst.full()], 10 + i as u64).unwrap();
            p.client.post_send(&[src.full()], 20 + i as u64).unwrap();
            done_ok(&*p.client, 20 + i as u64, OpKind::Send, size as u64);
            done_ok(&*p.server, 10 + i as u64, OpKind::Recv, size as u64);
            assert!(dst.buffer().to_vec() == data, "{size} bytes arrived wrong");
        }
        // The other direction, with the receive posted only after the message arrived.
        let data = pattern(4 << 20, 99);
        let src = reg(&*sd, &data, Access::LOCAL);
        let dst = p
            .client_domain
            .register(&Buffer::new(4 << 20), Access::LOCAL)
            .unwrap();
        p.server.post_send(&[src.full()], 1).unwrap();
        thread::sleep(Duration::from_millis(50));
        p.client.post_recv(&[dst.full()], 2).unwrap();
        done_ok(&*p.server, 1, OpKind::Send, 4 << 20);
        done_ok(&*p.client, 2, OpKind::Recv, 4 << 20);
        assert!(dst.buffer().to_vec() == data);
    });
}

#[test]
fn send_gathers_and_recv_scatters() {
    each(|a| {
        let p = pair(a);
        let n = p.client.capabilities().max_gather;
        let sizes: Vec<usize> = (0..n).map(|i| 1000 * (i + 1) + i).collect();
        let parts: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| pattern(s, i))
            .collect();
        let regions: Vec<MemoryRegion> = parts
            .iter()
            .map(|d| reg(&*p.client_domain, d, Access::LOCAL))
            .collect();
        let gather: Vec<LocalSlice> = regions.iter().map(|r| r.full()).collect();
        let total: usize = sizes.iter().sum();
        let dst = p
            .server
            .domain()
            .register(&Buffer::new(total), Access::LOCAL)
            .unwrap();
        let half = total / 2;
        let scatter = [dst.slice(..half).unwrap(), dst.slice(half..).unwrap()];
        p.server.post_recv(&scatter, 1).unwrap();
        p.client.post_send(&gather, 2).unwrap();
        done_ok(&*p.client, 2, OpKind::Send, total as u64);
        done_ok(&*p.server, 1, OpKind::Recv, total as u64);
        assert!(dst.buffer().to_vec() == parts.concat());
        // One segment too many is refused at post time, posting nothing.
        let mut too_many = gather.clone();
        too_many.push(regions[0].full());
        assert!(matches!(
            p.client.post_send(&too_many, 3),
            Err(FabricError::Unsupported(_))
        ));
        assert!(p.client.cq().wait(Duration::from_millis(50)).is_err());
    });
}

#[test]
fn rma_write_gathers_1_2_and_max_segments() {
    each(|a| {
        let p = pair(a);
        let max = p.client.capabilities().max_gather;
        let target = granted(&*p.server, 64 << 10, Access::REMOTE_WRITE);
        let mut counts = vec![1, 2, max];
        counts.dedup();
        for (round, n) in counts.into_iter().enumerate() {
            let parts: Vec<Vec<u8>> = (0..n)
                .map(|i| pattern(777 * (i + 1), round * 10 + i))
                .collect();
            let regions: Vec<MemoryRegion> = parts
                .iter()
                .map(|d| reg(&*p.client_domain, d, Access::LOCAL))
                .collect();
            let local: Vec<LocalSlice> = regions.iter().map(|r| r.full()).collect();
            let total = parts.iter().map(Vec::len).sum::<usize>();
            let at = 100 + round * 5;
            let remote = target.remote(at..at + total).unwrap();
            p.client.post_write(&local, remote, round as u64).unwrap();
            done_ok(&*p.client, round as u64, OpKind::Write, total as u64);
            let mut got = vec![0; total];
            target.buffer().read_at(at, &mut got);
            assert!(got == parts.concat(), "write of {n} segments landed wrong");
        }
        // Large single-segment write.
        let big = pattern(4 << 20, 5);
        let src = reg(&*p.client_domain, &big, Access::LOCAL);
        let dst = granted(&*p.server, 4 << 20, Access::REMOTE_WRITE);
        p.client
            .post_write(&[src.full()], dst.remote(..).unwrap(), 9)
            .unwrap();
        done_ok(&*p.client, 9, OpKind::Write, 4 << 20);
        assert!(dst.buffer().to_vec() == big);
    });
}

#[test]
fn rma_read_scatters_into_two_segments() {
    each(|a| {
        let p = pair(a);
        let data = pattern(3 << 20, 3);
        let target = reg(&*p.server.domain(), &data, Access::REMOTE_READ);
        p.server.grant(&target).unwrap();
        let l1 = p
            .client_domain
            .register(&Buffer::new(1 << 20), Access::LOCAL)
            .unwrap();
        let l2 = p
            .client_domain
            .register(&Buffer::new(2 << 20), Access::LOCAL)
            .unwrap();
        let remote = target.remote(..).unwrap();
        p.client
            .post_read(&[l1.full(), l2.full()], remote, 7)
            .unwrap();
        done_ok(&*p.client, 7, OpKind::Read, 3 << 20);
        assert!(l1.buffer().to_vec() == data[..1 << 20]);
        assert!(l2.buffer().to_vec() == data[1 << 20..]);
        // A small sub-range read.
        let l3 = p
            .client_domain
            .register(&Buffer::new(10), Access::LOCAL)
            .unwrap();
        let sub = remote.sub(12345, 10).unwrap();
        p.client.post_read(&[l3.full()], sub, 8).unwrap();
        done_ok(&*p.client, 8, OpKind::Read, 10);
        assert!(l3.buffer().to_vec() == data[12345..12355]);
        // Mismatched lengths are refused at post time.
        assert!(matches!(
            p.client.post_read(&[l3.full()], remote, 9),
            Err(FabricError::InvalidArgument(_))
        ));
    });
}

/// Sizes cycle through inline, eager and (on tcp) rendezvous-sized messages.
fn window_size(k: usize) -> usize {
    [8, 300, 5000, 40_000][k % 4]
}

#[test]
fn ten_thousand_sends_window_64() {
    each(|a| {
        const N: usize = 10_000;
        const W: usize = 64;
        const SLOT: usize = 40_000;
        let p = pair(a);
        let server = p.server;
        let rx = thread::spawn(move || {
            let d = server.domain();
            let ring = d.register(&Buffer::new(W * SLOT), Access::LOCAL).unwrap();
            // Receives match messages in posting order, so the n-th receive posted gets message
            // n; completions may come back in any order, so remember which slot holds which.
            let mut posted_as = [0usize; W];
            let mut next = 0;
            let post = |slot: usize, posted_as: &mut [usize; W], next: &mut usize| {
                posted_as[slot] = *next;
                let s = ring.slice(slot * SLOT..(slot + 1) * SLOT).unwrap();
                server.post_recv(&[s], slot as u64).unwrap();
                *next += 1;
            };
            for slot in 0..W {
                post(slot, &mut posted_as, &mut next);
            }
            for _ in 0..N {
                let c = server.cq().wait(T).expect("receive completion");
                assert!(c.result.is_ok(), "{:?}", c.result);
                let slot = c.context as usize;
                let k = posted_as[slot];
                let len = window_size(k);
                assert_eq!(c.len, len as u64, "message {k}");
                let mut got = vec![0; len];
                ring.buffer().read_at(slot * SLOT, &mut got);
                assert_eq!(
                    got[..8],
                    (k as u64).to_le_bytes(),
                    "message {k} out of order"
                );
                assert!(got[8..].iter().all(|&b| b == k as u8));
                if next < N {
                    post(slot, &mut posted_as, &mut next);
                }
            }
            server
        });
        let ring = p
            .client_domain
            .register(&Buffer::new(W * SLOT), Access::LOCAL)
            .unwrap();
        let mut free: Vec<usize> = (0..W).collect();
        let start = Instant::now();
        for k in 0..N {
            while free.is_empty() {
                let c = p.client.cq().wait(T).expect("send completion");
                assert!(c.result.is_ok(), "{:?}", c.result);
                free.push(c.context as usize);
            }
            let slot = free.pop().unwrap();
            let len = window_size(k);
            let mut msg = vec![k as u8; len];
            msg[..8].copy_from_slice(&(k as u64).to_le_bytes());
            ring.buffer().write_at(slot * SLOT, &msg);
            let s = ring.slice(slot * SLOT..slot * SLOT + len).unwrap();
            p.client.post_send(&[s], slot as u64).unwrap();
        }
        while free.len() < W {
            let c = p.client.cq().wait(T).expect("send completion");
            assert!(c.result.is_ok());
            free.push(c.context as usize);
        }
        rx.join().unwrap();
        eprintln!("{N} sends in {:?}", start.elapsed());
    });
}

#[test]
fn truncation_is_reported_and_stays_in_bounds() {
    each(|a| {
        let p = pair(a);
        let sd = p.server.domain();
        for (i, (msg, buf)) in [(1usize << 20, 64usize << 10), (100, 10), (8000, 5000)]
            .into_iter()
            .enumerate()
        {
            let data = pattern(msg, i);
            let src = reg(&*p.client_domain, &data, Access::LOCAL);
            let dst = sd
                .register(&Buffer::new(buf + 4096), Access::LOCAL)
                .unwrap();
            dst.buffer().fill(0xEE);
            p.server.post_recv(&[dst.slice(..buf).unwrap()], 1).unwrap();
            p.client.post_send(&[src.full()], 2).unwrap();
            done_ok(&*p.client, 2, OpKind::Send, msg as u64);
            let c = done(&*p.server);
            match c.result {
                Err(FabricError::Truncated { msg_len, buf_len }) => {
                    assert_eq!(buf_len, buf as u64);
                    assert_eq!(msg_len, msg as u64);
                }
                other => panic!("expected truncation, got {other:?}"),
            }
            let got = dst.buffer().to_vec();
            assert_eq!(c.len, buf as u64);
            assert!(got[..buf] == data[..buf], "prefix");
            assert!(
                got[buf..].iter().all(|&b| b == 0xEE),
                "written outside the buffer"
            );
            // The connection still works.
            let ok = reg(&*p.client_domain, b"after", Access::LOCAL);
            let into = sd.register(&Buffer::new(5), Access::LOCAL).unwrap();
            p.server.post_recv(&[into.full()], 3).unwrap();
            p.client.post_send(&[ok.full()], 4).unwrap();
            done_ok(&*p.client, 4, OpKind::Send, 5);
            done_ok(&*p.server, 3, OpKind::Recv, 5);
            assert_eq!(into.buffer().to_vec(), b"after");
        }
    });
}

/// A bad RMA must fail at the requester with a remote access error, touching nothing.
#[test]
fn rma_errors_reach_the_requester_and_the_target_keeps_serving() {
    each(|a| {
        let listener = listen(a).unwrap();
        let la = listener.local_addr();
        let good = connect_to(&la);
        let good_server = listener.accept(T).unwrap();
        let (good_domain, good_client) = good.join().unwrap();
        good_server.enable_remote_access();
        let target = granted(&*good_server, 8192, Access::ALL);
        target.buffer().fill(0x11);
        let whole = target.remote(..).unwrap();
        let gone = granted(&*good_server, 4096, Access::ALL);
        let stale = gone.remote(..).unwrap();
        drop(gone);
        let read_only = granted(&*good_server, 4096, Access::REMOTE_READ);
        let write_only = granted(&*good_server, 4096, Access::REMOTE_WRITE);
        let local_only = granted(&*good_server, 4096, Access::LOCAL);

        let bad_domain = open(&la).unwrap();
        let foreign = bad_domain
            .register(&Buffer::new(4096), Access::ALL)
            .unwrap();
        let local = bad_domain
            .register(&Buffer::new(4096), Access::LOCAL)
            .unwrap();
        local.buffer().fill(0x22);
        let oob = RemoteSlice {
            addr: whole.addr + 8000,
            len: 400,
            key: whole.key,
        };
        let cases = [
            ("write out of bounds", false, oob),
            ("read out of bounds", true, oob),
            ("write with a stale key", false, stale),
            ("read with a stale key", true, stale),
            (
                "write with a foreign key",
                false,
                foreign.remote(..).unwrap(),
            ),
            ("read with a foreign key", true, foreign.remote(..).unwrap()),
            (
                "write to a read-only region",
                false,
                read_only.remote(..).unwrap(),
            ),
            (
                "read from a write-only region",
                true,
                write_only.remote(..).unwrap(),
            ),
            (
                "write to a local-only region",
                false,
                local_only.remote(..).unwrap(),
            ),
        ];
        for (i, (what, read, remote)) in cases.into_iter().enumerate() {
            // A fresh connection each time, as a caller would after a refused access.
            let h = {
                let (d, la) = (bad_domain.clone(), la.clone());
                thread::spawn(move || d.connect(&la, T).unwrap())
            };
            let _bad_server = listener.accept(T).unwrap();
            let bad = h.join().unwrap();
            let l = [local.slice(..remote.len as usize).unwrap()];
            if read {
                bad.post_read(&l, remote, i as u64).unwrap();
            } else {
                bad.post_write(&l, remote, i as u64).unwrap();
            }
            let c = done(&*bad);
            eprintln!("  {what}: {:?}", c.result);
            // Every key here was granted to the good connection, not to this one: the one
            // refusal, whatever the key's state, range or rights.
            assert!(
                matches!(
                    c.result,
                    Err(FabricError::RemoteAccess(RemoteAccessError::UnknownKey))
                ),
                "{what}: expected the uniform refusal, got {:?}",
                c.result
            );
            // The target keeps serving its other connection.
            let v = good_domain
                .register(&Buffer::from_slice(&[i as u8; 8]), Access::LOCAL)
                .unwrap();
            good_client
                .post_write(&[v.full()], whole.sub(8 * i as u64, 8).unwrap(), 100)
                .unwrap();
            done_ok(&*good_client, 100, OpKind::Write, 8);
        }
        let mut got = vec![0; 8192];
        target.buffer().read_at(0, &mut got);
        for (i, chunk) in got[..8 * 9].chunks(8).enumerate() {
            assert!(chunk.iter().all(|&b| b == i as u8));
        }
        assert!(
            got[8 * 9..].iter().all(|&b| b == 0x11),
            "target modified out of bounds"
        );
        for r in [&read_only, &local_only] {
            assert!(
                r.buffer().to_vec().iter().all(|&b| b == 0),
                "protected region modified"
            );
        }
    });
}

#[test]
fn waits_time_out() {
    each(|a| {
        let p = pair(a);
        let t0 = Instant::now();
        assert!(matches!(
            p.client.cq().wait(Duration::from_millis(100)),
            Err(FabricError::Timeout(_))
        ));
        let r = p
            .client_domain
            .register(&Buffer::new(8), Access::LOCAL)
            .unwrap();
        p.client.post_recv(&[r.full()], 1).unwrap();
        assert!(matches!(
            p.client.cq().wait(Duration::from_millis(100)),
            Err(FabricError::Timeout(_))
        ));
        assert!(matches!(
            p.listener.accept(Duration::from_millis(100)),
            Err(FabricError::Timeout(_))
        ));
        assert!(t0.elapsed() < Duration::from_secs(5));
    });
}

#[test]
fn connect_to_nobody_fails_or_times_out() {
    let tcp: Address = {
        // A port nobody listens on: bind, note, close.
        let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = s.local_addr().unwrap().port();
        drop(s);
        format!("ofi+tcp://127.0.0.1:{port}").parse().unwrap()
    };
    for a in [tcp, shm_addr()] {
        let t0 = Instant::now();
        let r = open(&a).and_then(|d| d.connect(&a, Duration::from_secs(2)));
        eprintln!("{a}: {:?} after {:?}", r.as_ref().err(), t0.elapsed());
        assert!(r.is_err());
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "connect overran its timeout"
        );
    }
}

#[test]
fn listening_twice_on_one_address_fails() {
    each(|a| {
        let l = listen(a).unwrap();
        assert!(listen(&l.local_addr()).is_err());
    });
}

#[test]
fn connections_are_kept_apart() {
    each(|a| {
        let listener = listen(a).unwrap();
        let la = listener.local_addr();
        let d = open(&la).unwrap();
        let h = {
            let (d, la) = (d.clone(), la.clone());
            thread::spawn(move || {
                let c1 = d.connect(&la, T).unwrap();
                let c2 = d.connect(&la, T).unwrap();
                (c1, c2)
            })
        };
        let s1 = listener.accept(T).unwrap();
        let s2 = listener.accept(T).unwrap();
        let (c1, c2) = h.join().unwrap();
        let sd = s1.domain();
        let r1 = sd.register(&Buffer::new(8 << 20), Access::LOCAL).unwrap();
        let r2 = sd.register(&Buffer::new(8 << 20), Access::LOCAL).unwrap();
        // Receives posted on the second connection first: a message for the first must not
        // land there.
        s2.post_recv(&[r2.full()], 2).unwrap();
        s1.post_recv(&[r1.full()], 1).unwrap();
        let m1 = reg(&*d, &pattern(8 << 20, 1), Access::LOCAL);
        let m2 = reg(&*d, b"second", Access::LOCAL);
        c1.post_send(&[m1.full()], 1).unwrap();
        done_ok(&*c1, 1, OpKind::Send, 8 << 20);
        done_ok(&*s1, 1, OpKind::Recv, 8 << 20);
        assert!(s2.cq().wait(Duration::from_millis(100)).is_err());
        c2.post_send(&[m2.full()], 2).unwrap();
        done_ok(&*c2, 2, OpKind::Send, 6);
        done_ok(&*s2, 2, OpKind::Recv, 6);
        let mut got = [0u8; 6];
        r2.buffer().read_at(0, &mut got);
        assert_eq!(&got, b"second");
        assert!(r1.buffer().to_vec() == pattern(8 << 20, 1));
    });
}

#[test]
fn closing_an_endpoint_fails_the_peers_surplus_receives() {
    each(|a| {
        let p = pair(a);
        let sd = p.server.domain();
        let bufs: Vec<MemoryRegion> = (0..3)
            .map(|_| sd.register(&Buffer::new(100_000), Access::LOCAL).unwrap())
            .collect();
        p.server.post_recv(&[bufs[0].full()], 0).unwrap();
        let m1 = reg(&*p.client_domain, &pattern(100_000, 1), Access::LOCAL);
        let m2 = reg(&*p.client_domain, b"two", Access::LOCAL);
        p.client.post_send(&[m1.full()], 1).unwrap();
        p.client.post_send(&[m2.full()], 2).unwrap();
        let mut sent: Vec<(u64, u64)> = (0..2)
            .map(|_| done(&*p.client))
            .map(|c| (c.context, c.len))
            .collect();
        sent.sort();
        assert_eq!(sent, [(1, 100_000), (2, 3)]);
        drop(p.client);
        // Posted after the close: the second message still arrives, the third receive fails.
        thread::sleep(Duration::from_millis(100));
        p.server.post_recv(&[bufs[1].full()], 1).unwrap();
        let third = p.server.post_recv(&[bufs[2].full()], 2);
        let mut results: Vec<Completion> = (0..2).map(|_| done(&*p.server)).collect();
        if third.is_ok() {
            results.push(done(&*p.server));
        }
        results.sort_by_key(|c| c.context);
        assert!(results[0].result.is_ok() && results[0].len == 100_000);
        assert!(results[1].result.is_ok() && results[1].len == 3);
        if let Some(c) = results.get(2) {
            assert!(
                matches!(c.result, Err(FabricError::ConnectionLost(_))),
                "{:?}",
                c.result
            );
        } else {
            assert!(matches!(third, Err(FabricError::ConnectionLost(_))));
        }
        assert!(matches!(
            p.server.post_send(&[bufs[0].full()], 9),
            Err(FabricError::ConnectionLost(_))
        ));
        assert!(matches!(
            p.server.post_recv(&[bufs[0].full()], 9),
            Err(FabricError::ConnectionLost(_))
        ));
    });
}

#[test]
fn pending_receive_fails_when_the_peer_closes() {
    each(|a| {
        let p = pair(a);
        let r = p
            .server
            .domain()
            .register(&Buffer::new(64), Access::LOCAL)
            .unwrap();
        p.server.post_recv(&[r.full()], 5).unwrap();
        thread::sleep(Duration::from_millis(20));
        drop(p.client);
        let c = done(&*p.server);
        assert_eq!(c.context, 5);
        assert!(
            matches!(c.result, Err(FabricError::ConnectionLost(_))),
            "{:?}",
            c.result
        );
    });
}

#[test]
fn dropping_releases_memory_and_regions_outlive_domains() {
    each(|a| {
        let p = pair(a);
        let buf = Buffer::new(1 << 20);
        let r = p.server.domain().register(&buf, Access::ALL).unwrap();
        p.server.post_recv(&[r.full()], 1).unwrap();
        p.server.post_recv(&[r.slice(..10).unwrap()], 2).unwrap();
        let Pair {
            listener,
            server,
            client,
            client_domain,
        } = p;
        drop((server, listener, client, client_domain));
        // The receives were cancelled and released their hold on the region; only `r` is left.
        let t0 = Instant::now();
        while buf.handle_count() > 2 && t0.elapsed() < T {
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(buf.handle_count(), 2);
        assert!(r.remote(..).is_ok());
        drop(r);
        assert_eq!(buf.handle_count(), 1);
    });
}

#[test]
fn foreign_and_out_of_bounds_slices_are_refused_at_post_time() {
    each(|a| {
        let p = pair(a);
        let other = p
            .server
            .domain()
            .register(&Buffer::new(8), Access::LOCAL)
            .unwrap();
        assert!(matches!(
            p.client.post_send(&[other.full()], 1),
            Err(FabricError::InvalidArgument(_))
        ));
        assert!(matches!(
            p.client.post_recv(&[other.full()], 1),
            Err(FabricError::InvalidArgument(_))
        ));
        // A hand-made slice past the end of its region (the fields are public).
        let mine = p
            .client_domain
            .register(&Buffer::new(100), Access::LOCAL)
            .unwrap();
        let bad = [LocalSlice {
            region: mine.clone(),
            offset: 90,
            len: 20,
        }];
        let nowhere = RemoteSlice {
            addr: 0,
            len: 20,
            key: 1,
        };
        for r in [
            p.client.post_send(&bad, 2),
            p.client.post_recv(&bad, 3),
            p.client.post_send(&[mine.full(), bad[0].clone()], 4),
            p.client.post_write(&bad, nowhere, 5),
            p.client.post_read(&bad, nowhere, 6),
        ] {
            assert!(matches!(r, Err(FabricError::InvalidArgument(_))), "{r:?}");
        }
        assert!(p.client.cq().wait(Duration::from_millis(50)).is_err());
    });
}

/// Child side of `killed_peer_never_hangs`: connect, advertise a readable region, then wait to
/// be killed.
fn killed_peer_child(addr: &str) {
    let a: Address = addr.parse().unwrap();
    let d = open(&a).unwrap();
    let ep = d.connect(&a, T).unwrap();
    let r = reg(&*d, &pattern(1 << 20, 7), Access::REMOTE_READ);
    ep.grant(&r).unwrap();
    let ad = reg(&*d, &r.remote(..).unwrap().encode(), Access::LOCAL);
    ep.post_send(&[ad.full()], 0).unwrap();
    ep.cq().wait(T).unwrap();
    thread::sleep(Duration::from_secs(60));
}

#[test]
fn killed_peer_never_hangs() {
    if let Ok(addr) = std::env::var("FERRY_OFI_KILLED_CHILD") {
        killed_peer_child(&addr);
        return;
    }
    each(|a| {
        let l = listen(a).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "killed_peer_never_hangs", "--nocapture"])
            .env("FERRY_OFI_KILLED_CHILD", l.local_addr().to_string())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let ep = l.accept(T).expect("child connects");
        let d = ep.domain();
        let ad = d
            .register(&Buffer::new(RemoteSlice::WIRE_LEN), Access::LOCAL)
            .unwrap();
        ep.post_recv(&[ad.full()], 0).unwrap();
        done_ok(&*ep, 0, OpKind::Recv, RemoteSlice::WIRE_LEN as u64);
        let remote = RemoteSlice::decode(&ad.buffer().to_vec()).unwrap();
        let local = d.register(&Buffer::new(1 << 20), Access::LOCAL).unwrap();
        ep.post_read(&[local.full()], remote, 1).unwrap();
        done_ok(&*ep, 1, OpKind::Read, 1 << 20);
        assert!(local.buffer().to_vec() == pattern(1 << 20, 7));

        child.kill().unwrap();
        child.wait().unwrap();
        // A killed shm peer cannot remove its shared-memory file.
        if let Some(name) = ep.peer().strip_prefix("fi_shm://") {
            let _ = std::fs::remove_file(format!("/dev/shm/{name}"));
        }
        let t0 = Instant::now();
        let recv = ep.post_recv(&[local.slice(..64).unwrap()], 2);
        let read = ep.post_read(&[local.full()], remote, 3);
        let send = ep.post_send(&[local.full()], 4);
        eprintln!("  posts after the kill: recv {recv:?}, read {read:?}, send {send:?}");
        let posted = [recv.is_ok(), read.is_ok(), send.is_ok()]
            .iter()
            .filter(|&&x| x)
            .count();
        for _ in 0..posted {
            match ep.cq().wait(Duration::from_secs(3)) {
                Ok(c) => eprintln!("  {:?} {}: {:?}", c.op, c.context, c.result),
                Err(e) => eprintln!("  no further completion: {e}"),
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "took {:?}",
            t0.elapsed()
        );
    });
}

#[test]
fn zero_length_operations() {
    each(|a| {
        let p = pair(a);
        let target = granted(&*p.server, 64, Access::ALL);
        let local = p
            .client_domain
            .register(&Buffer::new(64), Access::LOCAL)
            .unwrap();
        let nothing = target.remote(10..10).unwrap();
        let empty = [local.slice(0..0).unwrap()];
        p.client.post_write(&empty, nothing, 1).unwrap();
        done_ok(&*p.client, 1, OpKind::Write, 0);
        p.client.post_read(&empty, nothing, 2).unwrap();
        done_ok(&*p.client, 2, OpKind::Read, 0);
        p.server.post_recv(&[], 3).unwrap();
        p.client.post_send(&[], 4).unwrap();
        done_ok(&*p.client, 4, OpKind::Send, 0);
        done_ok(&*p.server, 3, OpKind::Recv, 0);
    });
}

#[test]
fn posts_from_several_threads() {
    each(|a| {
        const PER: usize = 500;
        let p = pair(a);
        let rb = p
            .server
            .domain()
            .register(&Buffer::new(8 * 2 * PER), Access::LOCAL)
            .unwrap();
        for i in 0..2 * PER {
            let s = rb.slice(i * 8..i * 8 + 8).unwrap();
            p.server.post_recv(&[s], i as u64).unwrap();
        }
        let client: Arc<dyn Endpoint> = Arc::from(p.client);
        let senders: Vec<_> = (0..2u8)
            .map(|k| {
                let (c, d) = (client.clone(), p.client_domain.clone());
                thread::spawn(move || {
                    let m = d
                        .register(&Buffer::from_slice(&[k + 1; 8]), Access::LOCAL)
                        .unwrap();
                    for i in 0..PER {
                        c.post_send(&[m.full()], i as u64).unwrap();
                    }
                })
            })
            .collect();
        for s in senders {
            s.join().unwrap();
        }
        for _ in 0..2 * PER {
            assert!(done(&*client).result.is_ok());
            assert!(done(&*p.server).result.is_ok());
        }
        let got = rb.buffer().to_vec();
        let ones = got.chunks(8).filter(|c| c.iter().all(|&b| b == 1)).count();
        let twos = got.chunks(8).filter(|c| c.iter().all(|&b| b == 2)).count();
        assert_eq!((ones, twos), (PER, PER));
    });
}

#[test]
fn missing_providers_are_reported_as_unavailable() {
    for a in [
        "ofi+nosuchprovider://127.0.0.1:0",
        "ofi+verbs://127.0.0.1:0",
    ] {
        let a: Address = a.parse().unwrap();
        let l = listen(&a).err().expect("no such listener");
        let o = open(&a).err().expect("no such domain");
        eprintln!("{a}: {l} / {o}");
        assert!(matches!(l, FabricError::Unavailable(_)), "{l:?}");
        assert!(matches!(o, FabricError::Unavailable(_)), "{o:?}");
    }
}

/// RMAs posted together share the target's grants (one request for the span of those
/// posted while one is unanswered); a refused shared request is retried per RMA, so only
/// the bad one fails, for its own reason, and nothing outside the region is touched.
#[test]
fn rmas_posted_together_share_grants_and_keep_their_own_errors() {
    each(|a| {
        let p = pair(a);
        let target = granted(&*p.server, 64 << 10, Access::ALL);
        target.buffer().fill(0x11);
        let whole = target.remote(..).unwrap();
        let src = pattern(32 << 10, 5);
        let local = reg(&*p.client_domain, &src, Access::LOCAL);
        let bad = 17u64;
        for i in 0..32u64 {
            let l = [local
                .slice(i as usize * 1024..(i as usize + 1) * 1024)
                .unwrap()];
            let remote = if i == bad {
                RemoteSlice {
                    addr: whole.addr + (64 << 10) - 512,
                    len: 1024,
                    key: whole.key,
                }
            } else {
                whole.sub(i * 2048, 1024).unwrap()
            };
            p.client.post_write(&l, remote, i).unwrap();
        }
        let mut seen = [false; 32];
        for _ in 0..32 {
            let c = done(&*p.client);
            let i = c.context as usize;
            assert!(!seen[i], "completion {i} twice");
            seen[i] = true;
            if c.context == bad {
                assert!(
                    matches!(
                        c.result,
                        Err(FabricError::RemoteAccess(RemoteAccessError::OutOfBounds))
                    ),
                    "{:?}",
                    c.result
                );
            } else {
                assert!(c.result.is_ok(), "write {i}: {:?}", c.result);
            }
        }
        let got = target.buffer().to_vec();
        for i in 0..32usize {
            let at = i * 2048;
            if i as u64 == bad {
                assert!(got[at..at + 2048].iter().all(|&b| b == 0x11));
            } else {
                assert_eq!(&got[at..at + 1024], &src[i * 1024..(i + 1) * 1024]);
                assert!(got[at + 1024..at + 2048].iter().all(|&b| b == 0x11));
            }
        }
        // Reads posted together come back too, and the target keeps serving.
        let back = p
            .client_domain
            .register(&Buffer::new(32 << 10), Access::LOCAL)
            .unwrap();
        for i in 0..32u64 {
            let l = [back
                .slice(i as usize * 1024..(i as usize + 1) * 1024)
                .unwrap()];
            let from = if i == bad { 0 } else { i * 2048 };
            p.client
                .post_read(&l, whole.sub(from, 1024).unwrap(), 100 + i)
                .unwrap();
        }
        for _ in 0..32 {
            let c = done(&*p.client);
            assert!(c.result.is_ok(), "read {}: {:?}", c.context, c.result);
        }
        let b = back.buffer().to_vec();
        assert_eq!(&b[..1024], &src[..1024]);
        assert_eq!(&b[31 * 1024..], &src[31 * 1024..]);
    });
}

/// Sends posted while large RMA reads run (on shm the read copies inside the provider, and
/// the driver queues other calls meanwhile, see `ofi/gate.rs`) arrive complete and in
/// posting order, each with exactly one completion, small (injected) and large alike.
#[test]
fn sends_posted_during_large_reads_keep_their_order() {
    each(|a| {
        const MSGS: usize = 900;
        const SLOT: usize = 8 << 10;
        const READ: usize = 8 << 20;
        const READS: usize = 10;
        let p = pair(a);
        let sd = p.server.domain();
        let source = sd
            .register(&Buffer::from_slice(&pattern(READ, 7)), Access::ALL)
            .unwrap();
        p.server.grant(&source).unwrap();
        let rb = sd
            .register(&Buffer::new(MSGS * SLOT), Access::LOCAL)
            .unwrap();
        for i in 0..MSGS {
            let s = rb.slice(i * SLOT..(i + 1) * SLOT).unwrap();
            p.server.post_recv(&[s], i as u64).unwrap();
        }
        let client: Arc<dyn Endpoint> = Arc::from(p.client);
        let sink = p
            .client_domain
            .register(&Buffer::new(READS * READ), Access::LOCAL)
            .unwrap();
        let remote = source.remote(..).unwrap();
        let sb = p
            .client_domain
            .register(&Buffer::new(MSGS * SLOT), Access::LOCAL)
            .unwrap();
        for i in 0..MSGS {
            sb.buffer().write_at(i * SLOT, &(i as u64).to_le_bytes());
        }
        let reader = {
            let (c, sink) = (client.clone(), sink.clone());
            thread::spawn(move || {
                for r in 0..READS {
                    let local = sink.slice(r * READ..(r + 1) * READ).unwrap();
                    c.post_read(&[local], remote, (1 << 32) | r as u64).unwrap();
                }
            })
        };
        for i in 0..MSGS {
            // Alternately injected (8 bytes) and sent from the buffer (a whole slot).
            let len = if i.is_multiple_of(2) { 8 } else { SLOT };
            let s = sb.slice(i * SLOT..i * SLOT + len).unwrap();
            client.post_send(&[s], i as u64).unwrap();
        }
        reader.join().unwrap();
        let (mut sends, mut reads) = (vec![0u32; MSGS], vec![0u32; READS]);
        for _ in 0..MSGS + READS {
            let c = done(&*client);
            assert!(c.result.is_ok(), "{c:?}");
            match c.op {
                OpKind::Send => sends[c.context as usize] += 1,
                OpKind::Read => reads[(c.context & 0xffff) as usize] += 1,
                op => panic!("unexpected {op:?}"),
            }
        }
        assert!(sends.iter().chain(&reads).all(|&n| n == 1));
        for i in 0..MSGS {
            let c = done(&*p.server);
            assert!(c.result.is_ok(), "{c:?}");
            let len = if c.context.is_multiple_of(2) {
                8
            } else {
                SLOT as u64
            };
            assert_eq!(
                (c.context, c.len),
                (i as u64, len),
                "receives complete in order"
            );
            let mut seq = [0u8; 8];
            rb.buffer().read_at(i * SLOT, &mut seq);
            assert_eq!(
                u64::from_le_bytes(seq),
                i as u64,
                "message {i} out of order"
            );
        }
        let got = sink.buffer().to_vec();
        for r in 0..READS {
            assert!(
                got[r * READ..(r + 1) * READ] == pattern(READ, 7)[..],
                "read {r}"
            );
        }
    });
}

/// The checked-RMA path serves nothing before the layer above enables remote access, refuses
/// alike whatever the key, and gives up on a connection after a few refusals.
#[test]
fn checked_rma_waits_for_enable_and_cuts_off_a_prober() {
    each(|a| {
        let listener = listen(a).unwrap();
        let h = connect_to(&listener.local_addr());
        let server = listener.accept(T).unwrap();
        let (client_domain, client) = h.join().unwrap();
        let secret = granted(&*server, 4096, Access::ALL);
        secret.buffer().fill(0x5e);
        let local = reg(&*client_domain, &[0; 4096], Access::LOCAL);
        let read = |key: u64, ctx: u64| {
            let r = RemoteSlice {
                key,
                ..secret.remote(0..64).unwrap()
            };
            // After the close a post may fail at once instead of completing with an error.
            client
                .post_read(&[local.slice(0..64).unwrap()], r, ctx)
                .and_then(|()| done(&*client).result)
        };
        // Not enabled yet: even the granted key is refused, like any other.
        let uniform: Result<(), FabricError> =
            Err(FabricError::RemoteAccess(RemoteAccessError::UnknownKey));
        assert_eq!(
            format!("{:?}", read(secret.key(), 1)),
            format!("{uniform:?}")
        );
        assert_eq!(
            format!("{:?}", read(secret.key() ^ 1, 2)),
            format!("{uniform:?}")
        );
        server.enable_remote_access();
        assert!(read(secret.key(), 3).is_ok());
        assert!(local.buffer().to_vec()[..64].iter().all(|&b| b == 0x5e));
        // Six more refusals (eight in all) and the target closes the connection.
        for i in 0..5 {
            assert_eq!(
                format!("{:?}", read(1000 + i, 4 + i)),
                format!("{uniform:?}")
            );
        }
        let last = read(2000, 9);
        assert!(
            matches!(
                last,
                Err(FabricError::RemoteAccess(RemoteAccessError::UnknownKey))
                    | Err(FabricError::ConnectionLost(_))
            ),
            "{last:?}"
        );
        let after = read(secret.key(), 10);
        assert!(after.is_err(), "the connection is closed: {after:?}");
    });
}
