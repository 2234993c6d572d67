//! The client's read cache through a real server on loopback. What must hold (MPI's
//! nonatomic consistency): a rank's read after its own write sees it; another rank's
//! write is seen after sync-barrier-sync; a read served from the cache sends no message
//! (the file changed behind the server's back is not seen until a sync); short reads at
//! the end of the file are as without the cache; a collective read in which some ranks hit
//! and others miss completes (a miss is fetched independently).

mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::{job, start, Watchdog, TOKEN};
use ferry_cio::{amode, Comm, File, DEFAULT_READ_CACHE};
use ferry_dtype::Datatype;

const T: Duration = Duration::from_secs(10);

fn int() -> Datatype {
    Datatype::primitive(4).unwrap()
}

fn ints(base: u32, n: u32) -> Vec<u8> {
    (base..base + n).flat_map(u32::to_le_bytes).collect()
}

/// Runs `f(rank, file, barrier)` on `size` ranks of one job opening `path` with the read
/// cache on (it is off by default), each on its thread, with a barrier they share
/// (MPI_Barrier's stand-in).
fn ranks_with_barrier<R: Send + 'static>(
    addr: &str,
    path: &str,
    size: u32,
    f: impl Fn(u32, File, &Barrier) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let key = job();
    let (f, barrier) = (Arc::new(f), Arc::new(Barrier::new(size as usize)));
    let handles: Vec<_> = (0..size)
        .map(|rank| {
            let (addr, path, f, b) = (
                addr.to_string(),
                path.to_string(),
                f.clone(),
                barrier.clone(),
            );
            std::thread::spawn(move || {
                let comm = Comm {
                    job: key,
                    rank,
                    size,
                };
                let mut file =
                    common::open(&addr, &path, comm, amode::CREATE | amode::RDWR, TOKEN).unwrap();
                assert_eq!(file.read_cache(), 0, "the read cache is off by default");
                file.set_read_cache(DEFAULT_READ_CACHE);
                f(rank, file, &b)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Rank 0 writes, both sync: rank 1 reads it, twice. Rank 0 writes more with no sync:
/// rank 1's read sees the old or the new data, never a mix. After sync-barrier-sync
/// rank 1 sees the new data.
#[test]
fn another_ranks_write_is_seen_after_sync_barrier_sync() {
    let srv = start("tcp", T);
    let got = ranks_with_barrier(&srv.addr, "d/other.bin", 2, |rank, mut f, b| {
        let (first, second) = (ints(0, 256), ints(5000, 256));
        if rank == 0 {
            f.write_at(0, &first, 256, &int()).unwrap();
        }
        f.sync().unwrap();
        b.wait();
        f.sync().unwrap();
        let mut back = vec![0u8; 1024];
        for _ in 0..2 {
            assert_eq!(f.read_at_all(0, &mut back, 256, &int()).unwrap(), 1024);
            assert_eq!(back, first, "rank {rank}");
        }
        // Both read before rank 0 writes again (without it rank 1's first read, a miss,
        // could reach the server after that write and see it).
        b.wait();
        if rank == 0 {
            f.write_at(0, &second, 256, &int()).unwrap();
        }
        b.wait();
        f.read_at(0, &mut back, 256, &int()).unwrap();
        let unsynced = back.clone();
        assert!(
            unsynced == first || unsynced == second,
            "rank {rank}: a mix"
        );
        f.sync().unwrap();
        b.wait();
        f.sync().unwrap();
        assert_eq!(f.read_at_all(0, &mut back, 256, &int()).unwrap(), 1024);
        f.close().unwrap();
        (unsynced == first, back == second)
    });
    // Rank 0 read its own write; both see the new data after the sync points.
    assert_eq!(got[0], (false, true));
    assert!(got[1].1);
}

/// A read served from the cache sends nothing: bytes changed on the server's disk behind
/// its back are not seen until this client's sync (with the cache off they are seen at
/// once), and a read after this rank's own write sees the write.
#[test]
fn a_hit_is_served_locally_until_a_sync_or_an_own_write() {
    let srv = start("tcp", T);
    let path = srv.root.join("local.bin");
    let outside = path.clone();
    let got = ranks_with_barrier(&srv.addr, "d/local.bin", 1, move |_, mut f, _| {
        let byte = Datatype::byte();
        f.write_at(0, &[1u8; 64], 64, &byte).unwrap();
        let mut back = [0u8; 64];
        f.read_at(0, &mut back, 64, &byte).unwrap();
        assert_eq!(back, [1u8; 64], "a read after an own write");
        // Behind the server's back.
        std::fs::write(&outside, [2u8; 64]).unwrap();
        f.read_at(8, &mut back[..16], 16, &byte).unwrap();
        let cached = back[..16] == [1u8; 16];
        f.sync().unwrap();
        f.read_at(0, &mut back, 64, &byte).unwrap();
        let after_sync = back == [2u8; 64];
        f.write_at(4, &[3u8; 4], 4, &byte).unwrap();
        f.read_at(0, &mut back, 64, &byte).unwrap();
        let own = back[..4] == [2u8; 4] && back[4..8] == [3u8; 4] && back[8..] == [2u8; 56];
        // With the cache off every read asks the server.
        f.set_read_cache(0);
        std::fs::write(&outside, [4u8; 64]).unwrap();
        f.read_at(0, &mut back, 64, &byte).unwrap();
        let off = back == [4u8; 64];
        f.close().unwrap();
        (cached, after_sync, own, off)
    });
    assert_eq!(got[0], (true, true, true, true));
    assert_eq!(std::fs::read(path).unwrap(), [4u8; 64]);
}

/// Short reads at the end of the file are what the server gives without the cache, before
/// and after `set_size` shrinks the file; a window inside a short answer is served.
#[test]
fn short_reads_and_set_size_are_as_without_the_cache() {
    let srv = start("tcp", T);
    let got = ranks_with_barrier(&srv.addr, "d/short.bin", 1, |_, mut f, _| {
        let byte = Datatype::byte();
        f.write_at(0, &[9u8; 100], 100, &byte).unwrap();
        f.sync().unwrap();
        let mut out = Vec::new();
        for cache in [true, false] {
            f.set_read_cache(if cache { 1 << 20 } else { 0 });
            f.set_size(100).unwrap();
            let mut back = [0u8; 200];
            // Twice: the second from the cache when it is on.
            let a = f.read_at(0, &mut back, 200, &byte).unwrap();
            let b = f.read_at(0, &mut back, 200, &byte).unwrap();
            let inside = f.read_at(10, &mut back[..20], 20, &byte).unwrap();
            f.set_size(40).unwrap();
            let c = f.read_at(0, &mut back, 200, &byte).unwrap();
            let d = f.read_at(0, &mut back, 200, &byte).unwrap();
            f.set_size(0).unwrap();
            let e = f.read_at_all(0, &mut back, 200, &byte).unwrap();
            out.push((a, b, inside, c, d, e));
            f.set_size(0).unwrap();
            f.write_at(0, &[9u8; 100], 100, &byte).unwrap();
        }
        f.close().unwrap();
        out
    });
    let [with, without] = &got[0][..] else {
        panic!("{got:?}")
    };
    assert_eq!(with, without);
    assert_eq!(*with, (100, 100, 20, 40, 40, 0));
}

/// One collective read in which rank 0 hits (it read the window before) and ranks 1 and 2
/// miss, then one in which rank 2 reads nothing: no hang, and every rank gets its data
/// through the seed's interleaved view.
#[test]
fn some_ranks_hit_some_miss_in_one_collective_read() {
    let _dog = Watchdog::new("mixed hits and misses", Duration::from_secs(60));
    let srv = start("tcp", T);
    let got = ranks_with_barrier(&srv.addr, "d/mixed.bin", 3, |rank, mut f, b| {
        let every = Datatype::resized(&int(), 0, 12).unwrap();
        f.set_view(4 * i64::from(rank), &int(), &every).unwrap();
        let mine = ints(rank * 10_000, 4000);
        f.write_at_all(0, &mine, 4000, &int()).unwrap();
        f.sync().unwrap();
        b.wait();
        f.sync().unwrap();
        let mut back = vec![0u8; mine.len()];
        if rank == 0 {
            f.read_at(0, &mut back, 4000, &int()).unwrap();
        }
        // Rank 0 hits, the others miss.
        let n = f.read_at_all(0, &mut back, 4000, &int()).unwrap();
        let ok = n == 16_000 && back == mine;
        // Rank 2 reads nothing; the others hit.
        let count = if rank == 2 { 0 } else { 4000 };
        let m = f.read_at_all(0, &mut back, count, &int()).unwrap();
        f.close().unwrap();
        (ok, m)
    });
    assert_eq!(got, [(true, 16_000), (true, 16_000), (true, 0)]);
}

/// A collective write reaches every rank's next read with no sync: every rank wrote, so
/// every rank's cache forgot what it held.
#[test]
fn a_collective_write_is_seen_by_every_rank_without_sync() {
    let srv = start("tcp", T);
    let got = ranks_with_barrier(&srv.addr, "d/coll.bin", 2, |rank, mut f, _| {
        let byte = Datatype::byte();
        let mut back = [0u8; 8];
        f.write_at_all(4 * u64::from(rank), &[1u8; 4], 4, &byte)
            .unwrap();
        f.read_at_all(0, &mut back, 8, &byte).unwrap();
        let before = back;
        // Rank 1 writes nothing in this collective write, and still forgets.
        let (at, data) = if rank == 0 {
            (0, &[7u8; 8][..])
        } else {
            (0, &[][..])
        };
        f.write_at_all(at, data, data.len() as u64, &byte).unwrap();
        f.read_at_all(0, &mut back, 8, &byte).unwrap();
        f.close().unwrap();
        (before, back)
    });
    for (before, after) in got {
        assert_eq!(before, [1u8; 8]);
        assert_eq!(after, [7u8; 8]);
    }
}

/// Reads through two views alternately are each served right (the cache keeps windows
/// per view).
#[test]
fn windows_of_different_views_do_not_mix() {
    let srv = start("tcp", T);
    let got = ranks_with_barrier(&srv.addr, "d/views.bin", 1, |_, mut f, _| {
        let bytes: Vec<u8> = (0..=255).collect();
        f.write_at(0, &bytes, 256, &Datatype::byte()).unwrap();
        let every_other = Datatype::resized(&int(), 0, 8).unwrap();
        let mut out = Vec::new();
        for _ in 0..2 {
            for (disp, ft) in [
                (0, int()),
                (4, every_other.clone()),
                (0, every_other.clone()),
            ] {
                f.set_view(disp, &int(), &ft).unwrap();
                let mut back = [0u8; 8];
                f.read_at(1, &mut back, 2, &int()).unwrap();
                out.push(back);
            }
        }
        f.close().unwrap();
        out
    });
    let want = [
        [4, 5, 6, 7, 8, 9, 10, 11],
        [12, 13, 14, 15, 20, 21, 22, 23],
        [8, 9, 10, 11, 16, 17, 18, 19],
    ];
    assert_eq!(got[0][..3], want);
    assert_eq!(got[0][3..], want);
}
