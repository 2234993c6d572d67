//! A quick measurement of the seed's pattern (ignored by default): 4-byte ints, block
//! length 1, stride 2 (two ranks interleaving per half of the file), counts 4k to 1,024k
//! over 2 and 4 ranks on tcp and ofi+shm, through an in-process server on loopback. Prints
//! the median time per collective write and read (each rank its own thread and
//! connection). Not the comparison with ROMIO and OMPIO (that is `ferry bench cio`, next):
//! `cargo test --release -p ferry-cio --test seed_bench -- --ignored --nocapture`.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{job, start, TOKEN};
use ferry_cio::{amode, Comm};
use ferry_dtype::Datatype;

const ROUNDS: usize = 5;

/// Median write and read seconds of `count` ints over `p` ranks.
fn measure(addr: &str, p: u64, count: u64) -> (f64, f64) {
    let key = job();
    let barrier = Arc::new(Barrier::new(p as usize));
    let ranks: Vec<_> = (0..p)
        .map(|r| {
            let (addr, barrier) = (addr.to_string(), barrier.clone());
            std::thread::spawn(move || {
                let n = count / p;
                let comm = Comm {
                    job: key,
                    rank: r as u32,
                    size: p as u32,
                };
                let path = format!("d/bench-{key:x}.bin");
                let mut f =
                    common::open(&addr, &path, comm, amode::CREATE | amode::RDWR, TOKEN).unwrap();
                let int = Datatype::primitive(4).unwrap();
                let v = Datatype::vector(n, 1, 2, &int).unwrap();
                let ft = Datatype::resized(&v, 0, 8 * n as i64).unwrap();
                f.set_view(((r / 2) * 8 * n + (r % 2) * 4) as i64, &int, &ft)
                    .unwrap();
                let mine = vec![r as u8; 4 * n as usize];
                let mut back = vec![0u8; mine.len()];
                let (mut w, mut rd) = (Vec::new(), Vec::new());
                for _ in 0..ROUNDS {
                    barrier.wait();
                    let t = Instant::now();
                    f.write_at_all(0, &mine, n, &int).unwrap();
                    w.push(t.elapsed());
                    barrier.wait();
                    let t = Instant::now();
                    f.read_at_all(0, &mut back, n, &int).unwrap();
                    rd.push(t.elapsed());
                }
                f.close().unwrap();
                (w, rd)
            })
        })
        .collect();
    let mut w: Vec<Duration> = Vec::new();
    let mut rd: Vec<Duration> = Vec::new();
    for t in ranks {
        let (a, b) = t.join().unwrap();
        // A collective call takes as long as its slowest rank.
        if w.is_empty() {
            w = a;
            rd = b;
        } else {
            for i in 0..ROUNDS {
                w[i] = w[i].max(a[i]);
                rd[i] = rd[i].max(b[i]);
            }
        }
    }
    w.sort();
    rd.sort();
    (w[ROUNDS / 2].as_secs_f64(), rd[ROUNDS / 2].as_secs_f64())
}

#[test]
#[ignore]
fn seed_pattern_times() {
    println!("driver   np  count    write_ms  read_ms  write_MB/s");
    for driver in ["tcp", "ofi+shm"] {
        let srv = start(driver, Duration::from_secs(60));
        for p in [2u64, 4] {
            for count in [4_000u64, 64_000, 256_000, 1_024_000] {
                let (w, r) = measure(&srv.addr, p, count);
                println!(
                    "{driver:8} {p:2}  {count:8}  {:8.2}  {:7.2}  {:9.1}",
                    w * 1e3,
                    r * 1e3,
                    4.0 * count as f64 / w / 1e6
                );
            }
        }
    }
}
