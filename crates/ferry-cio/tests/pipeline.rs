//! Client-side write pipelining through a real server on loopback: a write returns once its
//! data is handed to the connection and its answer is collected later. What must hold:
//! many small writes, collective and independent, all land and a read right after them
//! sees them; a rank may run calls ahead of the others, as far as its bounds let it and
//! no further, and the session completes (no deadlock between a rank's requests waiting
//! in the server and its answers waiting in the client); a rank whose connection drops
//! mid-pipeline gives the others a clear `RankLost`, within a bounded time. (A deferred
//! write's error, reported by a later call: `write_behind.rs`, whose server can refuse
//! writes.)

mod common;

use std::time::{Duration, Instant};

use common::{ranks, start, Watchdog};
use ferry_cio::{ErrorClass, File, Pipeline};
use ferry_dtype::Datatype;

const T: Duration = Duration::from_secs(10);

fn int() -> Datatype {
    Datatype::primitive(4).unwrap()
}

/// Rank `rank`'s view of the seed's pattern over `size` ranks: one int every `size` ints.
fn interleaved(f: &mut File, rank: u32, size: u32) {
    let every = Datatype::resized(&int(), 0, 4 * i64::from(size)).unwrap();
    f.set_view(4 * i64::from(rank), &int(), &every).unwrap();
}

/// `n` ints of rank `rank`, call `call`: each int says whose and which.
fn ints(rank: u32, call: u32, n: u32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (rank << 28 | call << 16 | i).to_le_bytes())
        .collect()
}

/// 200 collective writes of the bench's smallest count (4,000 ints per rank) and then an
/// independent write into each of their blocks, all pipelined, then one collective read
/// of everything: it sees every write, in order (the independent one over the collective
/// one), and so does the file.
#[test]
fn many_small_writes_then_a_read_sees_them() {
    let srv = start("tcp", T);
    const N: u32 = 4000;
    const CALLS: u32 = 200;
    let _dog = Watchdog::new("many small writes", Duration::from_secs(120));
    ranks(&srv.addr, "d/many.bin", 2, |rank, mut f| {
        f.set_pipeline(Pipeline::ON).unwrap();
        interleaved(&mut f, rank, 2);
        for call in 0..CALLS {
            let n = f
                .write_at_all(u64::from(call * N), &ints(rank, call, N), N.into(), &int())
                .unwrap();
            assert_eq!(
                n,
                4 * u64::from(N),
                "a write returns the bytes it asked for"
            );
        }
        // The first int of each block again, independently: it must land after the
        // collective write of the same block.
        for call in 0..CALLS {
            let mark = (rank << 28 | 0xfff_ffff).to_le_bytes();
            f.write_at(u64::from(call * N), &mark, 1, &int()).unwrap();
        }
        let mut back = vec![0u8; 4 * (N * CALLS) as usize];
        let got = f
            .read_at_all(0, &mut back, u64::from(N * CALLS), &int())
            .unwrap();
        assert_eq!(got, back.len() as u64);
        for call in 0..CALLS {
            let mut want = ints(rank, call, N);
            want[..4].copy_from_slice(&(rank << 28 | 0xfff_ffff).to_le_bytes());
            let at = (4 * call * N) as usize;
            assert!(
                back[at..at + 4 * N as usize] == want[..],
                "rank {rank} call {call}"
            );
        }
        assert_eq!(f.size().unwrap(), 8 * u64::from(N * CALLS));
        f.close().unwrap();
    });
    let file = std::fs::read(srv.root.join("many.bin")).unwrap();
    assert_eq!(file.len(), 8 * (N * CALLS) as usize);
    for (i, got) in file.chunks(4).enumerate() {
        let (rank, k) = (i as u32 % 2, i as u32 / 2);
        let (call, j) = (k / N, k % N);
        let want = if j == 0 {
            rank << 28 | 0xfff_ffff
        } else {
            rank << 28 | call << 16 | j
        };
        assert_eq!(got, want.to_le_bytes(), "int {i}");
    }
}

/// Rank 0 runs far ahead: it makes 100 collective writes while rank 1 sleeps. Its first
/// `calls` return at once (no rank 1 yet, so none of them can have been answered); the
/// next one waits until rank 1 comes, so the rank ahead is stopped by its bound, not
/// buffered without end. Then both finish, and every write landed: no deadlock, although
/// the rank ahead had more requests in flight than either side keeps receive buffers.
#[test]
fn a_rank_many_calls_ahead_completes_without_deadlock() {
    let srv = start("tcp", T);
    const N: u32 = 1024;
    const CALLS: u32 = 100;
    const LATE: Duration = Duration::from_millis(1500);
    let depth = Pipeline {
        calls: 20,
        bytes: 64 << 20,
    };
    let _dog = Watchdog::new("a rank ahead", Duration::from_secs(120));
    let times = ranks(&srv.addr, "d/ahead.bin", 2, move |rank, mut f| {
        f.set_pipeline(depth).unwrap();
        interleaved(&mut f, rank, 2);
        if rank == 1 {
            std::thread::sleep(LATE);
        }
        let began = Instant::now();
        let mut first = Duration::ZERO;
        for call in 0..CALLS {
            f.write_at_all(u64::from(call * N), &ints(rank, call, N), N.into(), &int())
                .unwrap();
            if call + 1 == depth.calls as u32 {
                first = began.elapsed();
            }
        }
        let all = began.elapsed();
        f.sync().unwrap();
        f.close().unwrap();
        (first, all)
    });
    let (first, all) = times[0];
    assert!(
        first < LATE / 2,
        "rank 0's first {} writes took {first:?}: they should not wait for rank 1",
        depth.calls
    );
    assert!(
        all >= LATE - LATE / 5,
        "rank 0's {CALLS} writes took {all:?}: the bound should have stopped it until rank 1 came"
    );
    let file = std::fs::read(srv.root.join("ahead.bin")).unwrap();
    assert_eq!(file.len(), 8 * (N * CALLS) as usize);
    for (i, got) in file.chunks(4).enumerate() {
        let (rank, k) = (i as u32 % 2, i as u32 / 2);
        let want = rank << 28 | (k / N) << 16 | (k % N);
        assert_eq!(got, want.to_le_bytes(), "int {i}");
    }
}

/// A write larger than the byte bound goes alone, and writes of a few MiB each, more
/// than the bound holds together, still all land.
#[test]
fn the_byte_bound_lets_a_large_write_go_alone() {
    let srv = start("tcp", T);
    const N: u32 = 300_000; // 1.2 MB per rank and call
    let small = Pipeline {
        calls: 16,
        bytes: 1 << 20,
    };
    let _dog = Watchdog::new("large writes", Duration::from_secs(120));
    ranks(&srv.addr, "d/large.bin", 2, move |rank, mut f| {
        f.set_pipeline(small).unwrap();
        interleaved(&mut f, rank, 2);
        for call in 0..6 {
            f.write_at_all(u64::from(call * N), &ints(rank, call, N), N.into(), &int())
                .unwrap();
        }
        let mut back = vec![0u8; 4 * 6 * N as usize];
        f.read_at_all(0, &mut back, u64::from(6 * N), &int())
            .unwrap();
        for call in 0..6u32 {
            let at = (4 * call * N) as usize;
            assert!(back[at..at + 4 * N as usize] == ints(rank, call, N)[..]);
        }
        f.close().unwrap();
    });
}

/// Rank 1 drops its file (its connection ends) in the middle of a run of pipelined
/// writes; rank 0's writes go on returning, and its next call that needs an answer
/// (`sync`) fails with `RankLost` naming rank 1 — at once, not after the collective
/// timeout — as does its `close`. A third session on the same server is unharmed.
#[test]
fn a_connection_dropped_mid_pipeline_gives_the_others_a_clear_error() {
    let srv = start("tcp", Duration::from_secs(30));
    const N: u32 = 4000;
    let _dog = Watchdog::new("a dropped rank", Duration::from_secs(120));
    let got = ranks(&srv.addr, "d/dropped.bin", 2, |rank, mut f| {
        f.set_pipeline(Pipeline::ON).unwrap();
        interleaved(&mut f, rank, 2);
        let calls = if rank == 1 { 5 } else { 40 };
        let mut writes = Vec::new();
        for call in 0..calls {
            let w = f.write_at_all(u64::from(call * N), &ints(rank, call, N), N.into(), &int());
            writes.push(w.map_err(|e| e.class));
        }
        if rank == 1 {
            drop(f);
            return None;
        }
        let began = Instant::now();
        let sync = f.sync();
        let waited = began.elapsed();
        let close = f.close();
        Some((writes, sync, waited, close))
    });
    let (writes, sync, waited, close) = got[0].clone().unwrap();
    for w in &writes {
        assert!(
            matches!(w, Ok(_) | Err(ErrorClass::RankLost)),
            "a write saw {w:?}"
        );
    }
    let e = sync.unwrap_err();
    assert_eq!(e.class, ErrorClass::RankLost, "{e}");
    assert!(e.message.contains("rank 1"), "{e}");
    assert!(waited < Duration::from_secs(10), "sync took {waited:?}");
    assert_eq!(close.unwrap_err().class, ErrorClass::RankLost);
    // Another session on the same server works.
    ranks(&srv.addr, "d/after.bin", 2, |rank, mut f| {
        f.set_pipeline(Pipeline::ON).unwrap();
        interleaved(&mut f, rank, 2);
        f.write_at_all(0, &ints(rank, 0, N), N.into(), &int())
            .unwrap();
        f.close().unwrap();
    });
    assert_eq!(
        std::fs::metadata(srv.root.join("after.bin")).unwrap().len(),
        8 * u64::from(N)
    );
}

/// The knob's syntax: `off`, `on`, `CALLS`, `CALLS,BYTES`; anything else is an argument
/// error naming the forms.
#[test]
fn the_setting_parses() {
    assert_eq!(Pipeline::parse("off").unwrap(), Pipeline::OFF);
    assert_eq!(Pipeline::parse("0").unwrap().calls, 0);
    assert_eq!(Pipeline::parse("on").unwrap(), Pipeline::ON);
    assert_eq!(
        Pipeline::parse(" 4 ").unwrap(),
        Pipeline {
            calls: 4,
            bytes: Pipeline::ON.bytes
        }
    );
    assert_eq!(
        Pipeline::parse("8,65536").unwrap(),
        Pipeline {
            calls: 8,
            bytes: 65536
        }
    );
    for bad in ["", "yes", "-1", "4,", "4,0", "4,x"] {
        let e = Pipeline::parse(bad).unwrap_err();
        assert_eq!(e.class, ErrorClass::Arg, "{bad:?}");
        assert!(e.message.contains("CALLS,BYTES"), "{bad:?}: {e}");
    }
}
