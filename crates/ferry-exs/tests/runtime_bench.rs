//! Pull versus push rendezvous throughput on each driver, to choose
//! `runtime::default_config`'s mode. Ignored by default (timing, not correctness):
//! `cargo test --release -p ferry-exs --test runtime_bench -- --ignored --nocapture`.

mod runtime_util;

use std::time::{Duration, Instant};

use ferry_exs::proto::{Config, EventKind, Flags};
use ferry_exs::runtime::{EventQueue, ExsBuf, ExsSocket};
use runtime_util::*;

/// MB/s for `count` messages of `size` bytes, `window` in flight.
fn throughput(driver: &str, push: bool, size: usize, count: usize, window: usize) -> f64 {
    let cfg = Config {
        push,
        ..Config::default()
    };
    let p = pair_on(driver, cfg.clone(), cfg, true);
    let mut sbufs: Vec<_> = (0..window).map(|_| p.a.alloc(size).unwrap()).collect();
    let mut rbufs: Vec<_> = (0..window).map(|_| p.b.alloc(size).unwrap()).collect();
    let start = Instant::now();
    let (mut sent, mut sdone, mut posted, mut rdone) = (0, 0, 0, 0);
    while rdone < count || sdone < count {
        while posted < count && !rbufs.is_empty() {
            p.b.recv(rbufs.pop().unwrap(), Flags::NONE, posted as u64);
            posted += 1;
        }
        while sent < count && !sbufs.is_empty() {
            p.a.send(sbufs.pop().unwrap(), Flags::NONE, sent as u64);
            sent += 1;
        }
        // One queue for both sockets, so whichever completes first wakes us.
        if let Some(ev) = p.qa.dequeue(Duration::from_millis(100)) {
            assert_eq!(ev.result, Ok(()));
            if ev.socket == p.b.id() {
                assert_eq!(ev.kind, EventKind::Recv);
                rbufs.push(ev.buf.unwrap());
                rdone += 1;
            } else {
                assert_eq!(ev.kind, EventKind::Send);
                sbufs.push(ev.buf.unwrap());
                sdone += 1;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(60), "bench stuck");
    }
    (size * count) as f64 / start.elapsed().as_secs_f64() / 1e6
}

#[test]
#[ignore]
fn pull_vs_push() {
    for driver in DRIVERS {
        for (size, count, window) in [(4 << 10, 2000, 1), (64 << 10, 2000, 8), (1 << 20, 300, 8)] {
            // Alternate and keep the best of three: the test machine is shared and noisy.
            let (mut pull, mut push) = (0f64, 0f64);
            for _ in 0..3 {
                pull = pull.max(throughput(driver, false, size, count, window));
                push = push.max(throughput(driver, true, size, count, window));
            }
            eprintln!(
                "{driver:8} {:5} KiB x{window}: pull {pull:8.0} MB/s, push {push:8.0} MB/s",
                size >> 10
            );
        }
    }
}

/// Half the median round trip of `size`-byte ping-pongs (µs); `imm` allows immediate data.
fn latency(driver: &str, size: usize, imm: bool, iters: usize) -> f64 {
    let cfg = Config {
        small_packet_max_size: if imm { 512 } else { 0 },
        ..Config::default()
    };
    let p = pair_on(driver, cfg.clone(), cfg, false);
    let (mut sa, mut ra) = (
        Some(p.a.alloc(size).unwrap()),
        Some(p.a.alloc(size).unwrap()),
    );
    let (mut sb, mut rb) = (
        Some(p.b.alloc(size).unwrap()),
        Some(p.b.alloc(size).unwrap()),
    );
    let mut rtts = Vec::with_capacity(iters);
    // b echoes from a thread so each side waits on its own queue, as two processes would.
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..iters {
                p.b.recv(rb.take().unwrap(), Flags::NONE, 1);
                let ev = p.qb.dequeue(Duration::from_secs(10)).expect("ping");
                rb = ev.buf;
                p.b.send(sb.take().unwrap(), Flags::NONE, 2);
                let ev = p.qb.dequeue(Duration::from_secs(10)).expect("pong sent");
                sb = ev.buf;
            }
        });
        for _ in 0..iters {
            let t = Instant::now();
            p.a.recv(ra.take().unwrap(), Flags::NONE, 1);
            p.a.send(sa.take().unwrap(), Flags::NONE, 2);
            for _ in 0..2 {
                let ev = p.qa.dequeue(Duration::from_secs(10)).expect("pong");
                match ev.kind {
                    EventKind::Recv => ra = ev.buf,
                    _ => sa = ev.buf,
                }
            }
            rtts.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    });
    rtts.sort_by(f64::total_cmp);
    rtts[rtts.len() / 2]
}

#[test]
#[ignore]
fn ping_pong_latency() {
    for driver in DRIVERS {
        let imm = latency(driver, 10, true, 2000);
        let normal = latency(driver, 10, false, 2000);
        eprintln!("{driver:8} 10 B one-way: immediate {imm:6.1} µs, normal {normal:6.1} µs");
    }
}

/// GB/s of `count` RMA reads of `size` bytes, `window` in flight, straight on the fabric.
fn fabric_reads(driver: &str, size: usize, count: usize, window: usize) -> f64 {
    use ferry_fabric::{Access, Buffer};
    let l = ferry_fabric::listen(&listen_url(driver).parse().unwrap()).unwrap();
    let addr = l.local_addr();
    let (srv, cli) = std::thread::scope(|s| {
        let a = s.spawn(|| l.accept(Duration::from_secs(10)).unwrap());
        let c = ferry_fabric::connect(&addr, Duration::from_secs(10)).unwrap();
        (a.join().unwrap(), c)
    });
    let src = srv
        .domain()
        .register(&Buffer::new(size * window), Access::ALL)
        .unwrap();
    let dst = cli
        .domain()
        .register(&Buffer::new(size * window), Access::LOCAL)
        .unwrap();
    let remote = src.remote(..).unwrap();
    let start = Instant::now();
    let post = |slot: usize| {
        let local = [dst.slice(slot * size..(slot + 1) * size).unwrap()];
        cli.post_read(
            &local,
            remote.sub((slot * size) as u64, size as u64).unwrap(),
            slot as u64,
        )
        .unwrap();
    };
    for s in 0..window {
        post(s);
    }
    let mut done = 0;
    let mut posted = window;
    while done < count {
        let c = cli.cq().wait(Duration::from_secs(10)).unwrap();
        c.result.unwrap();
        done += 1;
        if posted < count {
            post(c.context as usize);
            posted += 1;
        }
    }
    (size * count) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// Keeps `window` operations of `size`-byte buffers of `sock` posted with `post` until
/// `count` have completed (successfully) on `q`.
fn keep_posted(
    sock: &ExsSocket,
    q: &EventQueue,
    (size, count, window): (usize, usize, usize),
    post: impl Fn(ExsBuf, u64),
) {
    let mut free: Vec<_> = (0..window).map(|_| sock.alloc(size).unwrap()).collect();
    let (mut posted, mut done) = (0, 0);
    while done < count {
        while posted < count && !free.is_empty() {
            post(free.pop().unwrap(), posted as u64);
            posted += 1;
        }
        let ev = q.dequeue(Duration::from_secs(10)).unwrap();
        assert_eq!(ev.result, Ok(()));
        free.push(ev.buf.unwrap());
        done += 1;
    }
}

/// GB/s of EXS recvs of `size` bytes pulled from the peer's persistent block.
fn exs_persistent(driver: &str, size: usize, count: usize, window: usize) -> f64 {
    let cfg = Config::default();
    let p = pair_on(driver, cfg.clone(), cfg, false);
    p.a.send(p.a.alloc(size).unwrap(), Flags::PERSISTENT, 0);
    let start = Instant::now();
    keep_posted(&p.b, &p.qb, (size, count, window), |b, i| {
        p.b.recv(b, Flags::NONE, i)
    });
    (size * count) as f64 / start.elapsed().as_secs_f64() / 1e9
}

#[test]
#[ignore]
fn large_pulls_vs_fabric() {
    for driver in DRIVERS {
        for _ in 0..3 {
            let f = fabric_reads(driver, 16 << 20, 120, 4);
            let e = exs_persistent(driver, 16 << 20, 120, 4);
            let n = throughput(driver, false, 16 << 20, 120, 4) / 1e3;
            eprintln!("{driver:8} 16 MiB x4: fabric {f:6.2} GB/s, EXS persistent {e:6.2} GB/s, normal {n:6.2}");
        }
    }
}

/// GB/s of `count` normal messages of `size` bytes, `window` in flight, sender and receiver
/// each on its own thread and queue (as two processes would be).
fn two_sided(driver: &str, size: usize, count: usize, window: usize) -> f64 {
    let cfg = Config::default();
    let p = pair_on(driver, cfg.clone(), cfg, false);
    let start = Instant::now();
    let shape = (size, count, window);
    std::thread::scope(|s| {
        s.spawn(|| keep_posted(&p.a, &p.qa, shape, |b, i| p.a.send(b, Flags::NONE, i)));
        keep_posted(&p.b, &p.qb, shape, |b, i| p.b.recv(b, Flags::NONE, i));
    });
    (size * count) as f64 / start.elapsed().as_secs_f64() / 1e9
}

#[test]
#[ignore]
fn large_two_sided_vs_fabric() {
    let driver = std::env::var("FERRY_BENCH_DRIVER").unwrap_or_else(|_| "ofi+shm".into());
    for _ in 0..3 {
        let f = fabric_reads(&driver, 16 << 20, 120, 4);
        let e = two_sided(&driver, 16 << 20, 120, 4);
        eprintln!("{driver:8} 16 MiB x4: fabric {f:6.2} GB/s, EXS normal two threads {e:6.2} GB/s");
    }
}
