//! Throughput of the native tcp driver: 4 MiB RMA writes and reads, `WINDOW` in flight.
//!
//! `cargo test --release -p ferry-fabric --test tcp_bench -- --ignored --nocapture`, next to
//! `iperf3 -s -1 -p 5999 & iperf3 -c 127.0.0.1 -p 5999 -t 5` on the same machine.

mod tcp_util;

use std::time::{Duration, Instant};

use ferry_fabric::{Access, OpKind};
use tcp_util::*;

const MSG: usize = 4 << 20;
const WINDOW: usize = 8;
const RUN: Duration = Duration::from_secs(3);

/// Streams 4 MiB `op`s for `RUN` and returns GB/s. Each op in the window uses its own 4 MiB
/// on both sides (64 MiB in all, more than the caches), or with `hot` all share one 4 MiB.
fn stream(p: &Pair, op: OpKind, hot: bool) -> f64 {
    let slots = if hot { 1 } else { WINDOW };
    let target = register(&*p.server, MSG * slots, Access::ALL);
    let remote = advertise(p, &target);
    let local = register(&*p.client, MSG * slots, Access::LOCAL);
    let post = |i: usize| {
        let at = i % slots * MSG;
        let l = [local.slice(at..at + MSG).unwrap()];
        let r = remote.sub(at as u64, MSG as u64).unwrap();
        match op {
            OpKind::Write => p.client.post_write(&l, r, i as u64),
            _ => p.client.post_read(&l, r, i as u64),
        }
        .unwrap()
    };
    // One window to warm up (first touch of every page), then the timed run.
    (0..WINDOW).for_each(post);
    (0..WINDOW).for_each(|_| drop(ok(&*p.client)));
    (0..WINDOW).for_each(post);
    let start = Instant::now();
    let mut bytes = 0;
    while start.elapsed() < RUN {
        let c = ok(&*p.client);
        bytes += c.len;
        post(c.context as usize);
    }
    let gbps = bytes as f64 / start.elapsed().as_secs_f64() / 1e9;
    (0..WINDOW).for_each(|_| drop(ok(&*p.client)));
    gbps
}

#[test]
#[ignore = "benchmark: run in release with --ignored --nocapture"]
fn rma_4mib_throughput() {
    let p = pair();
    for hot in [false, true] {
        let w = stream(&p, OpKind::Write, hot);
        let r = stream(&p, OpKind::Read, hot);
        let what = if hot {
            "one shared 4 MiB"
        } else {
            "distinct 4 MiB"
        };
        println!("tcp 4 MiB x{WINDOW} ({what}): write {w:.2} GB/s, read {r:.2} GB/s");
    }
}
