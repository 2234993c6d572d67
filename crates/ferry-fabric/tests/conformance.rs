//! The fabric conformance suite: every driver must pass the same tests.
//!
//! Each test runs against the native tcp driver, libfabric's tcp provider (RDM over rxm) and
//! libfabric's shm provider, through the public traits only. Peers are independent domains;
//! the killed-peer test uses a real second process (this test binary re-executed).

use std::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_fabric::{
    Access, Address, Buffer, Completion, Endpoint, FabricError, Listener, LocalSlice, MemoryRegion,
    OpKind, RegistrationCache, RemoteAccessError,
};

const T: Duration = Duration::from_secs(20);

/// A fresh listen address for a driver: port 0 for network drivers, a unique name for shm.
fn listen_url(driver: &str) -> Address {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, AtomicOrdering::Relaxed);
    let url = match driver {
        "ofi+shm" => format!("ofi+shm://ferry-conf-{}-{n}", std::process::id()),
        d => format!("{d}://127.0.0.1:0"),
    };
    url.parse().expect("test address parses")
}

struct Pair {
    listener: Box<dyn Listener>,
    server: Box<dyn Endpoint>,
    client: Box<dyn Endpoint>,
}

fn pair(driver: &str) -> Pair {
    let listener = ferry_fabric::listen(&listen_url(driver)).expect("listen");
    let addr = listener.local_addr();
    let (server, client) = std::thread::scope(|s| {
        let accept = s.spawn(|| listener.accept(T));
        let client = ferry_fabric::connect(&addr, T).expect("connect");
        (
            accept.join().expect("accept thread").expect("accept"),
            client,
        )
    });
    // As after the layer above authenticated the client.
    server.enable_remote_access();
    Pair {
        listener,
        server,
        client,
    }
}

/// Registers `len` bytes on `ep`'s domain and grants them to `ep`'s peer.
fn register(ep: &dyn Endpoint, len: usize, access: Access) -> MemoryRegion {
    let r = ep
        .domain()
        .register(&Buffer::new(len), access)
        .expect("register");
    ep.grant(&r).expect("grant");
    r
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn ok(ep: &dyn Endpoint) -> Completion {
    let c = ep.cq().wait(T).expect("completion within timeout");
    if let Err(e) = &c.result {
        panic!("{:?} (context {}) failed: {e}", c.op, c.context);
    }
    c
}

fn failed(ep: &dyn Endpoint) -> FabricError {
    let c = ep.cq().wait(T).expect("completion within timeout");
    match c.result {
        Err(e) => e,
        Ok(()) => panic!(
            "{:?} (context {}) succeeded but should have failed",
            c.op, c.context
        ),
    }
}

/// Splits `region[..len]` into `n` slices of roughly equal size (the last takes the rest).
fn split(region: &MemoryRegion, len: usize, n: usize) -> Vec<LocalSlice> {
    let step = len / n;
    (0..n)
        .map(|i| {
            let start = i * step;
            let end = if i + 1 == n { len } else { start + step };
            region.slice(start..end).expect("slice in range")
        })
        .collect()
}

fn connect_accept(driver: &str) {
    let p = pair(driver);
    // Each side names the other the way the other names itself, as a ferry address.
    assert_eq!(p.client.peer(), p.server.local());
    assert_eq!(p.server.peer(), p.client.local());
    assert!(p.client.peer().starts_with(driver), "{}", p.client.peer());
    assert!(p.client.local().parse::<Address>().is_ok());
    assert_eq!(p.client.capabilities().driver, driver);
    assert_eq!(p.server.capabilities(), p.client.capabilities());
    // The listener keeps accepting after the first connection.
    let addr = p.listener.local_addr();
    std::thread::scope(|s| {
        let second = s.spawn(|| p.listener.accept(T));
        ferry_fabric::connect(&addr, T).expect("second connect");
        second.join().expect("thread").expect("second accept");
    });
}

fn send_recv_sizes(driver: &str) {
    let p = pair(driver);
    let inline = p.client.capabilities().inline_size;
    for (i, len) in [0, 1, inline, 4 << 20].into_iter().enumerate() {
        let data = pattern(len, i as u8);
        let src = p
            .client
            .domain()
            .register(&Buffer::from_slice(&data), Access::LOCAL)
            .unwrap();
        let dst = register(&*p.server, len + 64, Access::LOCAL);
        p.server.post_recv(&[dst.full()], 100 + i as u64).unwrap();
        p.client.post_send(&[src.full()], i as u64).unwrap();
        let s = ok(&*p.client);
        assert_eq!((s.op, s.context), (OpKind::Send, i as u64));
        let r = ok(&*p.server);
        assert_eq!(
            (r.op, r.context, r.len),
            (OpKind::Recv, 100 + i as u64, len as u64)
        );
        assert!(
            dst.buffer().to_vec()[..len] == data[..],
            "{len}-byte message corrupted"
        );
    }
}

/// A send from a file mapping (a header page, then the file's pages) whose file shrank
/// after the map: whether the driver copies it in the kernel (EFAULT: the send fails) or in
/// user space (the guard's zeros: the buffer says it is torn), the process lives, no byte
/// that was not the file's arrives as the file's, and the connection goes on or reports
/// its loss: it never hangs.
fn send_from_a_truncated_file_mapping(driver: &str) {
    let p = pair(driver);
    let path =
        std::env::temp_dir().join(format!("ferry-conf-trunc-{driver}-{}", std::process::id()));
    let len = 1 << 20;
    let data = pattern(len, 7);
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let map = Buffer::map_file_after(&file, 0, len, 8, true).unwrap();
    map.write_at(0, b"HEADER!!");
    let src = p.client.domain().register(&map, Access::LOCAL).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len as u64 / 2)
        .unwrap();
    let dst = register(&*p.server, len + 64, Access::LOCAL);
    p.server.post_recv(&[dst.full()], 1).unwrap();
    p.client.post_send(&[src.full()], 2).unwrap();
    let sent = p.client.cq().wait(T).expect("the send completes");
    if sent.result.is_ok() {
        assert!(
            map.file_torn(),
            "{driver}: the lost half was sent without a trace"
        );
        let r = ok(&*p.server);
        let got = dst.buffer().to_vec();
        let half = 8 + len / 2;
        assert_eq!(r.len as usize, 8 + len);
        assert_eq!(&got[8..half], &data[..len / 2], "{driver}: the kept half");
        assert!(
            got[half..8 + len].iter().all(|&b| b == 0),
            "{driver}: zeros"
        );
    }
    drop((src, map));
    std::fs::remove_file(&path).unwrap();
}

fn send_gather_recv_scatter(driver: &str) {
    let p = pair(driver);
    let n = p.client.capabilities().max_gather.min(4);
    let data = pattern(10_000, 3);
    let src = p
        .client
        .domain()
        .register(&Buffer::from_slice(&data), Access::LOCAL)
        .unwrap();
    let dst = register(&*p.server, 10_000, Access::LOCAL);
    p.server.post_recv(&split(&dst, 10_000, n), 1).unwrap();
    p.client.post_send(&split(&src, 10_000, n), 2).unwrap();
    ok(&*p.client);
    assert_eq!(ok(&*p.server).len, 10_000);
    assert_eq!(dst.buffer().to_vec(), data);
}

fn truncation(driver: &str) {
    let p = pair(driver);
    let src = p
        .client
        .domain()
        .register(&Buffer::from_slice(&pattern(1000, 9)), Access::LOCAL)
        .unwrap();
    let dst = register(&*p.server, 1000, Access::LOCAL);
    let small = dst.slice(0..100).unwrap();
    p.server.post_recv(&[small], 1).unwrap();
    p.client.post_send(&[src.full()], 1).unwrap();
    ok(&*p.client);
    assert!(matches!(failed(&*p.server), FabricError::Truncated { .. }));
    let got = dst.buffer().to_vec();
    assert_eq!(got[..100], pattern(1000, 9)[..100], "prefix lands");
    assert!(
        got[100..].iter().all(|&b| b == 0),
        "nothing written past the buffer"
    );
    // The connection still works afterwards.
    let dst2 = register(&*p.server, 1000, Access::LOCAL);
    p.server.post_recv(&[dst2.full()], 2).unwrap();
    p.client.post_send(&[src.full()], 2).unwrap();
    ok(&*p.client);
    assert_eq!(ok(&*p.server).len, 1000);
}

/// Grants the target region to the client and sends it its descriptor, as upper layers do.
fn advertise(p: &Pair, target: &MemoryRegion) -> ferry_fabric::RemoteSlice {
    p.server.grant(target).expect("grant");
    let remote = target.remote(..).unwrap();
    let msg = p
        .server
        .domain()
        .register(&Buffer::from_slice(&remote.encode()), Access::LOCAL)
        .unwrap();
    let inbox = register(&*p.client, 64, Access::LOCAL);
    p.client.post_recv(&[inbox.full()], 0).unwrap();
    p.server.post_send(&[msg.full()], 0).unwrap();
    ok(&*p.server);
    ok(&*p.client);
    ferry_fabric::RemoteSlice::decode(&inbox.buffer().to_vec()).expect("descriptor decodes")
}

fn rma_write_gather(driver: &str) {
    let p = pair(driver);
    let max = p.client.capabilities().max_gather;
    let len = 1 << 20;
    let target = register(&*p.server, len, Access::REMOTE_WRITE);
    let remote = advertise(&p, &target);
    for (i, n) in [1, 2, max].into_iter().enumerate() {
        let data = pattern(len, 10 + i as u8);
        let src = p
            .client
            .domain()
            .register(&Buffer::from_slice(&data), Access::LOCAL)
            .unwrap();
        p.client
            .post_write(&split(&src, len, n), remote, i as u64)
            .unwrap();
        let c = ok(&*p.client);
        assert_eq!((c.op, c.context), (OpKind::Write, i as u64));
        // Writes are visible at the target once they complete at the requester.
        assert!(target.buffer().to_vec() == data, "write with {n} segments");
    }
}

/// Gathered RMA over several remote ranges of one region: the bytes land exactly in the
/// ranges, nothing around them changes, a range out of bounds fails the whole operation with
/// RemoteAccess, and mismatched totals, mixed keys and too many ranges are refused at post.
/// Drivers with `rma_iov_limit == 1` take one range and refuse more.
fn rma_gathered(driver: &str) {
    let p = pair(driver);
    let caps = p.client.capabilities().clone();
    assert!(caps.rma_iov_limit >= 1 && caps.rma_gather >= caps.max_gather);
    let len = 64 << 10;
    let fill = vec![0xeeu8; len];
    let target = p
        .server
        .domain()
        .register(
            &Buffer::from_slice(&fill),
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let remote = advertise(&p, &target);
    let offsets = [0u64, 5000, 10_007, 40_000];
    let piece = 1000usize;
    let n = caps.rma_iov_limit.min(offsets.len());
    let ranges: Vec<_> = offsets[..n]
        .iter()
        .map(|&o| remote.sub(o, piece as u64).unwrap())
        .collect();
    let data = pattern(n * piece, 3);
    let src = p
        .client
        .domain()
        .register(&Buffer::from_slice(&data), Access::LOCAL)
        .unwrap();
    let local = split(&src, n * piece, caps.rma_gather.min(3));
    p.client.post_write_v(&local, &ranges, 1).unwrap();
    assert_eq!(ok(&*p.client).op, OpKind::Write);
    let mut expect = fill.clone();
    for (i, &o) in offsets[..n].iter().enumerate() {
        expect[o as usize..o as usize + piece].copy_from_slice(&data[i * piece..(i + 1) * piece]);
    }
    assert!(
        target.buffer().to_vec() == expect,
        "{n} ranges written exactly"
    );
    let back = register(&*p.client, n * piece, Access::LOCAL);
    p.client
        .post_read_v(&split(&back, n * piece, 2), &ranges, 2)
        .unwrap();
    assert_eq!(ok(&*p.client).op, OpKind::Read);
    assert!(
        back.buffer().to_vec() == data,
        "{n} ranges read back in order"
    );

    let two = [
        remote.sub(0, 500).unwrap(),
        remote.sub(8000, (n * piece - 500) as u64).unwrap(),
    ];
    if n == 1 {
        for r in [
            p.client.post_write_v(&local, &two, 3),
            p.client.post_read_v(&local, &two, 3),
        ] {
            assert!(matches!(r, Err(FabricError::Unsupported(_))), "{r:?}");
        }
        return;
    }
    // Too many ranges, mixed keys, mismatched totals, none: refused, nothing posted.
    let many = vec![remote.sub(0, 1).unwrap(); caps.rma_iov_limit + 1];
    let one = register(&*p.client, many.len(), Access::LOCAL);
    let r = p.client.post_write_v(&[one.full()], &many, 4);
    assert!(matches!(r, Err(FabricError::Unsupported(_))), "{r:?}");
    let mut mixed = two;
    mixed[1].key ^= 1;
    let r = p.client.post_write_v(&local, &mixed, 5);
    assert!(matches!(r, Err(FabricError::InvalidArgument(_))), "{r:?}");
    let short = [two[0], remote.sub(8000, 10).unwrap()];
    let r = p.client.post_write_v(&local, &short, 6);
    assert!(matches!(r, Err(FabricError::InvalidArgument(_))), "{r:?}");
    let r = p.client.post_read_v(&local, &short, 6);
    assert!(matches!(r, Err(FabricError::InvalidArgument(_))), "{r:?}");
    let r = p.client.post_write_v(&local, &[], 7);
    assert!(matches!(r, Err(FabricError::InvalidArgument(_))), "{r:?}");
    assert!(
        p.client.cq().try_next().is_none(),
        "refused posts complete nothing"
    );

    // One range past the end: the whole operation fails, the in-bounds range is untouched.
    let other = pattern(n * piece, 99);
    let src2 = p
        .client
        .domain()
        .register(&Buffer::from_slice(&other), Access::LOCAL)
        .unwrap();
    let past = ferry_fabric::RemoteSlice {
        addr: remote.addr + len as u64 - 100,
        len: (n * piece - 500) as u64,
        key: remote.key,
    };
    for read in [false, true] {
        let bad = [two[0], past];
        if read {
            p.client.post_read_v(&[src2.full()], &bad, 8).unwrap();
        } else {
            p.client.post_write_v(&[src2.full()], &bad, 8).unwrap();
        }
        let e = failed(&*p.client);
        assert!(matches!(e, FabricError::RemoteAccess(_)), "{e:?}");
        assert!(
            target.buffer().to_vec() == expect,
            "a refused op touches nothing"
        );
    }
    // The target still serves gathered writes afterwards.
    p.client.post_write_v(&local, &ranges, 9).unwrap();
    ok(&*p.client);
}

/// RMAs posted between `hold_rma` and `release_rma` (under checked RMA: one grant request for
/// all of them) each complete exactly once with their own result: a refused one among them
/// fails alone (the shared request is refused and asked again one RMA at a time) and the
/// others land. A release with nothing held does nothing.
fn held_rmas(driver: &str) {
    let p = pair(driver);
    let len = 64 << 10;
    let piece = len / 4;
    let target = register(&*p.server, len, Access::REMOTE_WRITE);
    let remote = advertise(&p, &target);
    let mut expect = vec![0u8; len];
    for (round, bad) in [None, Some(2usize)].into_iter().enumerate() {
        let data = pattern(len, 42 + round as u8);
        let src = p
            .client
            .domain()
            .register(&Buffer::from_slice(&data), Access::LOCAL)
            .unwrap();
        p.client.hold_rma();
        for i in 0..4 {
            let to = if bad == Some(i) {
                ferry_fabric::RemoteSlice {
                    addr: remote.addr + len as u64 - 10,
                    len: piece as u64,
                    key: remote.key,
                }
            } else {
                remote.sub((i * piece) as u64, piece as u64).unwrap()
            };
            let from = src.slice(i * piece..(i + 1) * piece).unwrap();
            p.client.post_write(&[from], to, i as u64).unwrap();
        }
        p.client.release_rma().unwrap();
        p.client.release_rma().unwrap();
        let mut got: Vec<(u64, bool)> = (0..4)
            .map(|_| {
                let c = p.client.cq().wait(Duration::from_secs(10)).unwrap();
                assert_eq!(c.op, OpKind::Write);
                if let Err(e) = &c.result {
                    assert!(matches!(e, FabricError::RemoteAccess(_)), "{e:?}");
                }
                (c.context, c.result.is_ok())
            })
            .collect();
        got.sort();
        let want: Vec<(u64, bool)> = (0..4).map(|i| (i as u64, bad != Some(i))).collect();
        assert_eq!(
            got, want,
            "round {round}: one completion each, its own result"
        );
        assert!(p.client.cq().try_next().is_none(), "nothing more completes");
        for i in (0..4).filter(|&i| bad != Some(i)) {
            expect[i * piece..(i + 1) * piece].copy_from_slice(&data[i * piece..(i + 1) * piece]);
        }
        assert!(target.buffer().to_vec() == expect, "round {round}: bytes");
    }
}

fn rma_read_scatter(driver: &str) {
    let p = pair(driver);
    let max = p.client.capabilities().max_gather;
    let len = 1 << 20;
    let data = pattern(len, 77);
    let target = p
        .server
        .domain()
        .register(&Buffer::from_slice(&data), Access::REMOTE_READ)
        .unwrap();
    let remote = advertise(&p, &target);
    for n in [1, 2, max] {
        let dst = register(&*p.client, len, Access::LOCAL);
        p.client
            .post_read(&split(&dst, len, n), remote, n as u64)
            .unwrap();
        let c = ok(&*p.client);
        assert_eq!((c.op, c.len), (OpKind::Read, len as u64));
        assert!(dst.buffer().to_vec() == data, "read with {n} segments");
    }
    // A sub-range at the far edge.
    let dst = register(&*p.client, 10, Access::LOCAL);
    p.client
        .post_read(&[dst.full()], remote.sub(len as u64 - 10, 10).unwrap(), 9)
        .unwrap();
    ok(&*p.client);
    assert_eq!(dst.buffer().to_vec(), data[len - 10..]);
}

fn completion_order(driver: &str) {
    let p = pair(driver);
    let src = register(&*p.client, 64, Access::LOCAL);
    let dst = register(&*p.server, 64 * 32, Access::LOCAL);
    for i in 0..32 {
        p.server
            .post_recv(&[dst.slice(i * 64..(i + 1) * 64).unwrap()], i as u64)
            .unwrap();
    }
    for i in 0..32u64 {
        src.buffer().write_at(0, &i.to_le_bytes());
        p.client.post_send(&[src.full()], i).unwrap();
        ok(&*p.client);
    }
    // Receives match messages in posting order on every driver.
    let got: Vec<u64> = (0..32).map(|_| ok(&*p.server).context).collect();
    if p.server.capabilities().ordering.completion_in_order {
        assert_eq!(got, (0..32).collect::<Vec<_>>());
    }
    for i in 0..32 {
        let mut b = [0u8; 8];
        dst.buffer().read_at(i * 64, &mut b);
        assert_eq!(
            u64::from_le_bytes(b),
            i as u64,
            "message {i} in receive {i}"
        );
    }
}

/// A driver that promises `send_after_write` keeps it: a message posted right after an RMA
/// write (without waiting for its completion) finds the written bytes in place when it is
/// delivered, every time.
fn send_after_write(driver: &str) {
    let p = pair(driver);
    if !p.client.capabilities().ordering.send_after_write {
        return;
    }
    const LEN: usize = 256 << 10;
    let target = register(&*p.server, LEN, Access::REMOTE_WRITE);
    let remote = advertise(&p, &target);
    let inbox = register(&*p.server, 64, Access::LOCAL);
    let note = register(&*p.client, 8, Access::LOCAL);
    for round in 0..50u8 {
        let data = pattern(LEN, round);
        let src = p
            .client
            .domain()
            .register(&Buffer::from_slice(&data), Access::LOCAL)
            .unwrap();
        p.server.post_recv(&[inbox.full()], 1).unwrap();
        p.client.post_write(&[src.full()], remote, 2).unwrap();
        p.client.post_send(&[note.full()], 3).unwrap();
        let delivered = ok(&*p.server);
        assert_eq!(delivered.op, OpKind::Recv);
        assert!(
            target.buffer().to_vec() == data,
            "round {round}: the message overtook the write"
        );
        ok(&*p.client);
        ok(&*p.client);
    }
}

fn window_of_64(driver: &str) {
    const OPS: u64 = 10_000;
    const WINDOW: u64 = 64;
    let p = pair(driver);
    let src = register(&*p.client, 8 * WINDOW as usize, Access::LOCAL);
    let dst = register(&*p.server, 8 * WINDOW as usize, Access::LOCAL);
    let slot = |r: &MemoryRegion, i: u64| {
        r.slice((i % WINDOW) as usize * 8..(i % WINDOW + 1) as usize * 8)
            .unwrap()
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut next = 0;
            while next < OPS.min(WINDOW) {
                p.server.post_recv(&[slot(&dst, next)], next).unwrap();
                next += 1;
            }
            for expect in 0..OPS {
                let c = ok(&*p.server);
                assert_eq!(c.context, expect, "receives complete in order");
                let mut b = [0u8; 8];
                dst.buffer().read_at((expect % WINDOW) as usize * 8, &mut b);
                assert_eq!(u64::from_le_bytes(b), expect, "message {expect} intact");
                if next < OPS {
                    p.server.post_recv(&[slot(&dst, next)], next).unwrap();
                    next += 1;
                }
            }
        });
        let mut in_flight = 0;
        let mut done = 0;
        for i in 0..OPS {
            while in_flight == WINDOW {
                ok(&*p.client);
                in_flight -= 1;
                done += 1;
            }
            src.buffer()
                .write_at((i % WINDOW) as usize * 8, &i.to_le_bytes());
            p.client.post_send(&[slot(&src, i)], i).unwrap();
            in_flight += 1;
        }
        while done < OPS {
            ok(&*p.client);
            done += 1;
        }
    });
    assert!(
        p.client.cq().is_empty() && p.server.cq().is_empty(),
        "no extra completions"
    );
}

fn registration_cache(driver: &str) {
    let p = pair(driver);
    let cache = RegistrationCache::new(p.client.domain(), 2, 1 << 30);
    let (a, b, c) = (Buffer::new(4096), Buffer::new(4096), Buffer::new(8192));
    let ra = cache.get(&a, Access::LOCAL).unwrap();
    let ra2 = cache.get(&a, Access::LOCAL).unwrap();
    assert_eq!(ra.key(), ra2.key());
    let s = cache.stats();
    assert_eq!((s.hits, s.misses, s.evictions), (1, 1, 0));
    cache.get(&b, Access::LOCAL).unwrap();
    cache.get(&a, Access::LOCAL).unwrap(); // a is now most recent
    cache.get(&c, Access::LOCAL).unwrap(); // evicts b
    let s = cache.stats();
    assert_eq!((s.hits, s.misses, s.evictions, s.entries), (2, 3, 1, 2));
    cache.get(&b, Access::LOCAL).unwrap();
    assert_eq!(cache.stats().misses, 4, "evicted entry registers again");
    // A cached registration is usable for a transfer.
    let dst = register(&*p.server, 4096, Access::LOCAL);
    p.server.post_recv(&[dst.full()], 0).unwrap();
    p.client
        .post_send(&[cache.get(&a, Access::LOCAL).unwrap().full()], 0)
        .unwrap();
    ok(&*p.client);
    ok(&*p.server);
    // Invalidation: explicit, and when the caller's memory goes away.
    cache.invalidate(&a);
    drop((ra, ra2));
    drop(b);
    cache.get(&c, Access::LOCAL).unwrap();
    let s = cache.stats();
    assert!(s.invalidations >= 2, "{s:?}");
    assert_eq!(s.entries, 1);
}

fn rma_errors_keep_target_serving(driver: &str) {
    let p = pair(driver);
    let target = register(&*p.server, 4096, Access::REMOTE_WRITE | Access::REMOTE_READ);
    let remote = advertise(&p, &target);
    let src = register(&*p.client, 8192, Access::LOCAL);

    // Out of bounds: one byte past the end.
    let past = ferry_fabric::RemoteSlice {
        len: 4097,
        ..remote
    };
    p.client
        .post_write(&[src.slice(0..4097).unwrap()], past, 1)
        .unwrap();
    assert!(
        matches!(failed(&*p.client), FabricError::RemoteAccess(_)),
        "out-of-bounds write"
    );
    p.client
        .post_read(&[src.slice(0..4097).unwrap()], past, 2)
        .unwrap();
    assert!(
        matches!(failed(&*p.client), FabricError::RemoteAccess(_)),
        "out-of-bounds read"
    );

    // A foreign key: a region of another domain (a second listener) on the target host.
    let other = ferry_fabric::listen(&listen_url(driver)).unwrap();
    let foreign = other
        .domain()
        .register(&Buffer::new(4096), Access::ALL)
        .unwrap();
    let foreign_remote = ferry_fabric::RemoteSlice {
        key: foreign.key(),
        ..remote
    };
    if foreign.key() != target.key() {
        p.client
            .post_write(
                &[src.slice(0..64).unwrap()],
                foreign_remote.sub(0, 64).unwrap(),
                3,
            )
            .unwrap();
        assert!(
            matches!(failed(&*p.client), FabricError::RemoteAccess(_)),
            "foreign key"
        );
    }

    // A stale key: the region was deregistered.
    let stale = register(&*p.server, 4096, Access::REMOTE_WRITE);
    let stale_remote = stale.remote(..).unwrap();
    drop(stale);
    p.client
        .post_write(
            &[src.slice(0..64).unwrap()],
            stale_remote.sub(0, 64).unwrap(),
            4,
        )
        .unwrap();
    assert!(
        matches!(failed(&*p.client), FabricError::RemoteAccess(_)),
        "stale key"
    );

    // Missing right: a read-only region written to.
    let ro = register(&*p.server, 4096, Access::REMOTE_READ);
    let ro_remote = advertise(&p, &ro);
    p.client
        .post_write(
            &[src.slice(0..64).unwrap()],
            ro_remote.sub(0, 64).unwrap(),
            5,
        )
        .unwrap();
    assert!(
        matches!(failed(&*p.client), FabricError::RemoteAccess(_)),
        "write to read-only region"
    );
    assert!(
        ro.buffer().to_vec().iter().all(|&b| b == 0),
        "read-only region untouched"
    );

    // The target keeps serving: this connection and a new one.
    src.buffer().write_at(0, b"still here");
    p.client
        .post_write(&[src.slice(0..10).unwrap()], remote.sub(0, 10).unwrap(), 6)
        .unwrap();
    ok(&*p.client);
    assert_eq!(&target.buffer().to_vec()[..10], b"still here");
    let addr = p.listener.local_addr();
    std::thread::scope(|s| {
        let acc = s.spawn(|| p.listener.accept(T));
        let c2 = ferry_fabric::connect(&addr, T).expect("new connection after errors");
        let s2 = acc.join().unwrap().unwrap();
        let m = c2
            .domain()
            .register(&Buffer::from_slice(b"hello"), Access::LOCAL)
            .unwrap();
        let d = register(&*s2, 5, Access::LOCAL);
        s2.post_recv(&[d.full()], 0).unwrap();
        c2.post_send(&[m.full()], 0).unwrap();
        ok(&*c2);
        ok(&*s2);
        assert_eq!(d.buffer().to_vec(), b"hello");
    });
    let _ = RemoteAccessError::OutOfBounds;
}

fn bad_posts_are_rejected(driver: &str) {
    let p = pair(driver);
    let caps = p.client.capabilities().clone();
    let r = register(&*p.client, 4096 * (caps.max_gather + 1), Access::LOCAL);
    let too_many = split(&r, r.len(), caps.max_gather + 1);
    assert!(
        p.client.post_send(&too_many, 0).is_err(),
        "gather limit enforced"
    );
    let foreign = register(&*p.server, 64, Access::LOCAL);
    assert!(
        p.client.post_send(&[foreign.full()], 0).is_err(),
        "region of another domain"
    );
    let remote = ferry_fabric::RemoteSlice {
        addr: 0,
        len: 10,
        key: 1,
    };
    assert!(
        p.client
            .post_write(&[r.slice(0..5).unwrap()], remote, 0)
            .is_err(),
        "length mismatch"
    );
    assert!(p.client.post_read(&[], remote, 0).is_err(), "empty list");
    assert!(
        p.client.cq().wait(Duration::from_millis(200)).is_err(),
        "rejected posts complete nothing"
    );
}

/// The child side of `peer_killed`: connect, post a stream of sends, then wait to be killed.
fn killed_peer_child(addr: &str) {
    let addr: Address = addr.parse().unwrap();
    let ep = ferry_fabric::connect(&addr, T).unwrap();
    let src = register(&*ep, 1 << 20, Access::LOCAL);
    for i in 0..4 {
        ep.post_send(&[src.full()], i).unwrap();
    }
    println!("streaming");
    std::thread::sleep(Duration::from_secs(60));
}

fn peer_killed(driver: &str) {
    let listener = ferry_fabric::listen(&listen_url(driver)).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args([
            "--exact",
            "killed_peer_child_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FERRY_KILLED_PEER_ADDR", listener.local_addr().to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ep = listener.accept(T).expect("child connects");
    let dst = register(&*ep, 1 << 20, Access::LOCAL);
    ep.post_recv(&[dst.full()], 0).unwrap();
    ok(&*ep);
    child.kill().unwrap();
    child.wait().unwrap();
    // Give the provider time to see the connection drop, so the receives below meet the dead
    // peer's unexpected messages (ofi_rxm 1.17 crashed here on a rendezvous one).
    std::thread::sleep(Duration::from_millis(300));
    // Keep using the connection: every operation must end (error or timeout), never hang.
    let start = Instant::now();
    let src = register(&*ep, 1 << 20, Access::LOCAL);
    let mut posted = 0;
    for i in 1..8 {
        if ep.post_recv(&[dst.full()], i).is_ok() {
            posted += 1;
        }
        if ep.post_send(&[src.full()], 100 + i).is_ok() {
            posted += 1;
        }
    }
    let mut errors = 0;
    for _ in 0..posted {
        match ep.cq().wait(Duration::from_secs(5)) {
            Ok(c) if c.result.is_err() => errors += 1,
            Ok(_) => {}
            Err(FabricError::Timeout(_)) => break,
            Err(e) => panic!("unexpected wait error {e}"),
        }
    }
    assert!(start.elapsed() < Duration::from_secs(60), "bounded");
    if ep.capabilities().progress == ferry_fabric::Progress::Auto {
        // Drivers that own the connection must notice the peer is gone.
        assert!(errors > 0, "pending operations fail after the peer died");
    }
}

#[test]
fn killed_peer_child_entry() {
    if let Ok(addr) = std::env::var("FERRY_KILLED_PEER_ADDR") {
        killed_peer_child(&addr);
    }
}

macro_rules! conformance {
    ($module:ident, $driver:literal) => {
        mod $module {
            #[test]
            fn connect_accept() {
                super::connect_accept($driver)
            }
            #[test]
            fn send_recv_sizes() {
                super::send_recv_sizes($driver)
            }
            #[test]
            fn send_from_a_truncated_file_mapping() {
                super::send_from_a_truncated_file_mapping($driver)
            }
            #[test]
            fn send_gather_recv_scatter() {
                super::send_gather_recv_scatter($driver)
            }
            #[test]
            fn truncation() {
                super::truncation($driver)
            }
            #[test]
            fn rma_write_gather() {
                super::rma_write_gather($driver)
            }
            #[test]
            fn rma_gathered() {
                super::rma_gathered($driver)
            }
            #[test]
            fn held_rmas() {
                super::held_rmas($driver)
            }
            #[test]
            fn rma_read_scatter() {
                super::rma_read_scatter($driver)
            }
            #[test]
            fn completion_order() {
                super::completion_order($driver)
            }
            #[test]
            fn send_after_write() {
                super::send_after_write($driver)
            }
            #[test]
            fn window_of_64() {
                super::window_of_64($driver)
            }
            #[test]
            fn registration_cache() {
                super::registration_cache($driver)
            }
            #[test]
            fn rma_errors_keep_target_serving() {
                super::rma_errors_keep_target_serving($driver)
            }
            #[test]
            fn bad_posts_are_rejected() {
                super::bad_posts_are_rejected($driver)
            }
            #[test]
            fn peer_killed() {
                super::peer_killed($driver)
            }
        }
    };
}

conformance!(native_tcp, "tcp");
conformance!(ofi_tcp, "ofi+tcp");
conformance!(ofi_shm, "ofi+shm");

#[allow(dead_code)]
fn _assert_send_sync(_: Arc<dyn Endpoint>) {}
