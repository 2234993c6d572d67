//! Pack/unpack throughput against memcpy, for later tuning (ignored by default).
//!
//! cargo test -p ferry-dtype --release --test pack_bench -- --ignored --nocapture
//!
//! The EXIO pattern: a 4 MiB message in 16 segments 1 MiB apart (EXIO's noncontiguous
//! benchmark), packed at once and in 64 KiB pieces as a staging pipeline would; then the same
//! message in 64-byte pieces to show the per-segment cost. memcpy of the same 4 MiB runs in
//! the same process as the reference. Absolute figures on a shared machine are noise; the
//! ratios are the result.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ferry_dtype::{Datatype, Packer, Unpacker};

const MSG: usize = 4 << 20;
const CHUNK: usize = 64 << 10;

/// Best-of-5 time of `op` repeated until ~50 ms passed, as GB/s of `MSG` bytes.
fn rate(mut op: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let (start, mut n) = (Instant::now(), 0u32);
        while start.elapsed() < Duration::from_millis(50) || n == 0 {
            op();
            n += 1;
        }
        best = best.min(start.elapsed().as_secs_f64() / f64::from(n));
    }
    MSG as f64 / best / 1e9
}

fn report(name: &str, t: &Datatype) {
    let span = t.true_range(1).unwrap().unwrap();
    let src: Vec<u8> = (0..span.end as usize).map(|i| i as u8).collect();
    let mut dst = vec![0u8; span.end as usize];
    let mut out = vec![0u8; MSG];
    let contiguous = vec![7u8; MSG];

    let memcpy = rate(|| {
        out.copy_from_slice(black_box(&contiguous));
        black_box(&mut out);
    });
    let mut packer = Packer::new(t, 1).unwrap();
    let whole = rate(|| {
        assert_eq!(packer.pack(black_box(&src), 0, 0, &mut out).unwrap(), MSG);
    });
    let piecewise = rate(|| {
        for (i, piece) in out.chunks_mut(CHUNK).enumerate() {
            packer
                .pack(black_box(&src), 0, (i * CHUNK) as u64, piece)
                .unwrap();
        }
    });
    let mut unpacker = Unpacker::new(t, 1).unwrap();
    let unpack = rate(|| {
        for (i, piece) in out.chunks(CHUNK).enumerate() {
            unpacker
                .unpack(&mut dst, 0, (i * CHUNK) as u64, black_box(piece))
                .unwrap();
        }
    });
    println!(
        "{name}: {} segments; memcpy {memcpy:.2} GB/s; pack at once {whole:.2} GB/s ({:.2}x), \
         in 64 KiB pieces {piecewise:.2} GB/s ({:.2}x); unpack in 64 KiB pieces {unpack:.2} \
         GB/s ({:.2}x)",
        t.segment_count_hint(1),
        whole / memcpy,
        piecewise / memcpy,
        unpack / memcpy,
    );
}

#[test]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
fn pack_throughput_vs_memcpy() {
    let byte = Datatype::byte();
    // EXIO: 16 segments of 256 KiB, 1 MiB apart.
    let exio = Datatype::hvector(16, (MSG / 16) as u64, 1 << 20, &byte).unwrap();
    assert_eq!(exio.size(), MSG as u64);
    report("EXIO 16 x 256 KiB, 1 MiB apart", &exio);
    // The same message in 64-byte pieces, 128 bytes apart: the per-segment cost.
    let fine = Datatype::hvector((MSG / 64) as u64, 64, 128, &byte).unwrap();
    report("64 B segments, 128 B apart", &fine);
}
