//! The measurement behind `Options::measured_threshold` (ignored: a benchmark).
//!
//! For each segment size, 4 MiB of the local layout (blocks of that size, every other block)
//! are written into a contiguous remote range, zero-copy and packed, on tcp, ofi+shm and ofi+tcp;
//! prints GB/s of each and the smallest segment size from which zero-copy stays ahead.
//!
//! `cargo test -p ferry-noncontig --release --test threshold -- --ignored --nocapture`

mod common;

use std::time::Instant;

use common::*;
use ferry_dtype::Datatype;
use ferry_noncontig::{write, Options, Path};

const TOTAL: u64 = 4 << 20;

fn gbps(p: &Pair, seg: u64, path: Path) -> f64 {
    let n = TOTAL / seg;
    let t = Datatype::hvector(n, seg, 2 * seg as i64, &Datatype::byte()).expect("vector");
    let lr = p.local(&vec![7; 2 * TOTAL as usize]);
    let rr = p.target(&vec![0; TOTAL as usize]);
    let o = Options {
        path,
        ..Options::default()
    };
    let run = || {
        write(
            p.client.as_ref(),
            &local_layout(&lr, 0, &t, 1),
            &remote_layout(&rr, 0, &Datatype::byte(), TOTAL),
            &o,
        )
        .expect("write")
    };
    run();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        run();
        best = best.min(t0.elapsed().as_secs_f64());
    }
    TOTAL as f64 / best / 1e9
}

#[test]
#[ignore = "benchmark: run with --release --ignored --nocapture"]
fn sweep_segment_sizes() {
    let only = std::env::var("THRESHOLD_DRIVERS").unwrap_or_else(|_| "tcp,ofi+shm,ofi+tcp".into());
    for d in only.split(',') {
        let p = pair(d);
        println!(
            "{d} (max_gather {}): segment  zero-copy GB/s  packed GB/s",
            p.client.capabilities().max_gather
        );
        let mut crossover = None;
        for shift in 3..=18 {
            let seg = 1u64 << shift;
            let (z, k) = (gbps(&p, seg, Path::ZeroCopy), gbps(&p, seg, Path::Packed));
            println!("{d}: {seg:>8} {z:>14.3} {k:>12.3}");
            if z >= k {
                crossover.get_or_insert(seg);
            } else {
                crossover = None;
            }
        }
        println!("{d}: zero-copy ahead from {crossover:?} bytes per segment");
    }
}
