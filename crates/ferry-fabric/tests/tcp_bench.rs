//! Throughput of the native tcp driver for 4 MiB RMA writes and reads with several in flight.
//! Run: `cargo test --release -p ferry-fabric --test tcp_bench -- --ignored --nocapture`
//! (compare with `iperf3 -c 127.0.0.1` on the same machine; see docs/protocol.md).

mod tcp_util;

use std::time::{Duration, Instant};

use ferry_fabric::{Access, OpKind};
use tcp_util::*;

const MSG: usize = 4 << 20;
const WINDOW: usize = 8;
const RUN: Duration = Duration::from_secs(2);

/// Streams `op`s of 4 MiB with `WINDOW` in flight for `RUN`; returns GB/s.
fn stream(p: &Pair, op: OpKind) -> f64 {
    let target = register(&*p.server, MSG * WINDOW, Access::ALL);
    let remote = advertise(p, &target);
    let local = register(&*p.client, MSG * WINDOW, Access::LOCAL);
    let same = std::env::var("SAME").is_ok();
    let post = |i: usize| {
        let j = if same { 0 } else { i };
        let l = [local.slice(j * MSG..(j + 1) * MSG).unwrap()];
        let r = remote.sub((j * MSG) as u64, MSG as u64).unwrap();
        match op {
            OpKind::Write => p.client.post_write(&l, r, i as u64),
            _ => p.client.post_read(&l, r, i as u64),
        }
        .unwrap()
    };
    // Warm up: one full window.
    (0..WINDOW).for_each(post);
    (0..WINDOW).for_each(|_| drop(ok(&*p.client)));
    (0..WINDOW).for_each(post);
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed() < RUN {
        let c = ok(&*p.client);
        bytes += c.len;
        post(c.context as usize);
    }
    let secs = start.elapsed().as_secs_f64();
    (0..WINDOW).for_each(|_| drop(ok(&*p.client)));
    bytes as f64 / secs / 1e9
}

#[test]
#[ignore = "benchmark: run in release with --ignored --nocapture"]
fn rma_4mib_throughput() {
    let p = pair();
    for round in 0..2 {
        let w = stream(&p, OpKind::Write);
        let r = stream(&p, OpKind::Read);
        println!("round {round}: tcp 4 MiB x{WINDOW}: write {w:.2} GB/s, read {r:.2} GB/s");
    }
}
