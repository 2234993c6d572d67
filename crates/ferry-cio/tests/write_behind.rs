//! Write-behind through a real server on loopback: a collective write is answered once
//! every rank's data is in and reaches the file behind. What must hold: every rank reads
//! the others' data as soon as the write returned (with or without SYNC), a rank reads
//! its own writes with independent calls, and a write that fails behind is reported by
//! the session's next collective call (SYNC or CLOSE) on every rank, never lost. The
//! failure is real: a server process whose file size limit (`ulimit -f`) makes the
//! kernel refuse the write (EFBIG).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{ranks, start, start_with};
use ferry_cio::{CioConfig, ErrorClass, File, Pipeline};
use ferry_dtype::Datatype;

const T: Duration = Duration::from_secs(10);

/// Rank `rank`'s view of the seed's pattern over `size` ranks: one int every `size` ints.
fn interleaved(f: &mut File, rank: u32, size: u32) {
    let int = Datatype::primitive(4).unwrap();
    let every = Datatype::resized(&int, 0, 4 * i64::from(size)).unwrap();
    f.set_view(4 * i64::from(rank), &int, &every).unwrap();
}

/// `n` ints of rank `rank`, call `call`: each int says whose and which.
fn ints(rank: u32, call: u32, n: u32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (rank << 28 | call << 20 | i).to_le_bytes())
        .collect()
}

/// Collective writes followed at once by reads of the other ranks' data (collective, no
/// SYNC between) and by independent reads of the rank's own: each sees the last write,
/// call after call, so a read never overtakes a write still behind.
#[test]
fn reads_after_a_collective_write_see_it_without_sync() {
    let srv = start("tcp", T);
    const N: u32 = 50_000;
    ranks(&srv.addr, "d/ryw.bin", 2, move |rank, mut f| {
        let int = Datatype::primitive(4).unwrap();
        interleaved(&mut f, rank, 2);
        let other = 1 - rank;
        for call in 0..6 {
            let mine = ints(rank, call, N);
            f.write_at_all(0, &mine, u64::from(N), &int).unwrap();
            // The other rank's ints: a collective read through its view.
            interleaved(&mut f, other, 2);
            let mut theirs = vec![0u8; mine.len()];
            f.read_at_all(0, &mut theirs, u64::from(N), &int).unwrap();
            assert!(theirs == ints(other, call, N), "call {call}: rank {rank}");
            interleaved(&mut f, rank, 2);
            // Its own, independently, right after the next write.
            let next = ints(rank, call + 100, N);
            f.write_at_all(0, &next, u64::from(N), &int).unwrap();
            let mut back = vec![0u8; next.len()];
            f.read_at(0, &mut back, u64::from(N), &int).unwrap();
            assert!(back == next, "call {call}: rank {rank} reads its own write");
            assert_eq!(f.size().unwrap(), 8 * u64::from(N));
        }
        f.close().unwrap();
    });
    // And the file, once closed, holds the last writes.
    let file = std::fs::read(srv.root.join("ryw.bin")).unwrap();
    for (i, got) in file.chunks(4).enumerate() {
        let (rank, k) = (i as u32 % 2, i as u32 / 2);
        assert_eq!(got, (rank << 28 | 105 << 20 | k).to_le_bytes(), "int {i}");
    }
}

/// The child side of [`a_write_that_fails_behind_is_reported_by_sync_or_close`]: a server
/// in a process whose file size limit the parent set; prints its address and root.
#[test]
#[ignore]
fn child_server_with_a_file_size_limit() {
    let Ok(cap) = std::env::var("CIO_FSIZE_CHILD") else {
        return;
    };
    let srv = start_with(
        "tcp",
        CioConfig {
            write_behind: cap.parse().unwrap(),
            ..CioConfig::default()
        },
    );
    println!("SERVER {} {}", srv.addr, srv.root.display());
    std::thread::sleep(Duration::from_secs(60));
}

/// Starts [`child_server_with_a_file_size_limit`] under `ulimit -f 2048` (1 or 2 MiB by
/// the shell's unit) with SIGXFSZ ignored, so a write past the limit fails with EFBIG;
/// its address and root. `write_behind` is its `[cio] write_behind`.
fn limited_server(write_behind: u64) -> (Child, String, std::path::PathBuf) {
    let mut child = Command::new("sh")
        .args([
            "-c",
            "trap '' XFSZ; ulimit -f 2048 && exec \"$@\"",
            "sh",
            std::env::current_exe().unwrap().to_str().unwrap(),
            "--exact",
            "child_server_with_a_file_size_limit",
            "--ignored",
            "--nocapture",
        ])
        .env("CIO_FSIZE_CHILD", write_behind.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let started = out.lines().map_while(Result::ok).find_map(|line| {
        let (addr, root) = line.strip_prefix("SERVER ")?.split_once(' ')?;
        Some((addr.to_string(), root.into()))
    });
    match started {
        Some((addr, root)) => (child, addr, root),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server child did not start");
        }
    }
}

#[test]
fn a_write_that_fails_behind_is_reported_by_sync_or_close() {
    let (mut child, addr, root) = limited_server(CioConfig::default().write_behind);
    // Each rank writes 4 KiB at 8 MiB: past the limit, so the kernel refuses the write.
    const FAR: u64 = 8 << 20;
    let write = |rank: u32, f: &mut File| {
        let data = vec![rank as u8 + 1; 4096];
        f.write_at_all(FAR + 4096 * u64::from(rank), &data, 4096, &Datatype::byte())
    };
    // Reported by SYNC on every rank (once), then CLOSE is clean.
    let synced = ranks(&addr, "d/full-sync.bin", 2, move |rank, mut f| {
        let wrote = write(rank, &mut f).map_err(|e| e.class);
        let sync = f.sync();
        let close = f.close();
        (wrote, sync, close)
    });
    for (wrote, sync, close) in synced {
        assert_eq!(wrote, Ok(4096), "answered before the file refused it");
        let e = sync.unwrap_err();
        assert_eq!(e.class, ErrorClass::Io, "{e}");
        assert!(
            e.message.contains("earlier collective write") && e.message.contains("large"),
            "{e}"
        );
        close.unwrap();
    }
    // With no SYNC, CLOSE reports it (and still closes).
    let closed = ranks(&addr, "d/full-close.bin", 2, move |rank, mut f| {
        let wrote = write(rank, &mut f).map_err(|e| e.class);
        (wrote, f.close())
    });
    for (wrote, close) in closed {
        assert_eq!(wrote, Ok(4096));
        assert_eq!(close.unwrap_err().class, ErrorClass::Io);
    }
    // A write within the limit still works in the same server.
    ranks(&addr, "d/fits.bin", 2, move |rank, mut f| {
        let data = vec![rank as u8 + 1; 4096];
        let n = f
            .write_at_all(4096 * u64::from(rank), &data, 4096, &Datatype::byte())
            .unwrap();
        f.close().unwrap();
        n
    });
    let fits = std::fs::read(root.join("fits.bin")).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(fits.len(), 8192);
    assert!(fits[..4096].iter().all(|&b| b == 1) && fits[4096..].iter().all(|&b| b == 2));
}

/// With `write_behind = 0` the same failing write fails its own call on every rank.
#[test]
fn without_write_behind_the_failing_write_fails_its_call() {
    let (mut child, addr, root) = limited_server(0);
    let got = ranks(&addr, "d/full-now.bin", 2, move |rank, mut f| {
        f.set_pipeline(Pipeline::OFF).unwrap();
        let data = vec![rank as u8 + 1; 4096];
        let wrote = f.write_at_all(
            (8 << 20) + 4096 * u64::from(rank),
            &data,
            4096,
            &Datatype::byte(),
        );
        (wrote.map_err(|e| e.class), f.close().map_err(|e| e.class))
    });
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(
        got,
        [(Err(ErrorClass::Io), Ok(())), (Err(ErrorClass::Io), Ok(()))]
    );
}

/// With write pipelining on a client and `write_behind = 0` on the server, the failing
/// write returns at once with the bytes it asked for; its error (the server's answer to
/// it) comes back from the rank's next call that learns of it, with its class — here
/// `sync`, `close`, or the independent `size` — once, and never lost.
#[test]
fn a_pipelined_write_that_fails_is_reported_by_a_later_call() {
    let (mut child, addr, root) = limited_server(0);
    let far = |rank: u32, f: &mut File| {
        let data = vec![rank as u8 + 1; 4096];
        f.set_pipeline(Pipeline::ON).unwrap();
        f.write_at_all(
            (8 << 20) + 4096 * u64::from(rank),
            &data,
            4096,
            &Datatype::byte(),
        )
        .map_err(|e| e.class)
    };
    let is_deferred_efbig = |e: &ferry_cio::CioError| {
        e.class == ErrorClass::Io
            && e.message.contains("earlier write")
            && e.message.contains("large")
    };
    // SYNC reports it on every rank, then CLOSE is clean.
    let synced = ranks(&addr, "d/pipe-sync.bin", 2, move |rank, mut f| {
        let wrote = far(rank, &mut f);
        (wrote, f.sync(), f.close())
    });
    for (wrote, sync, close) in synced {
        assert_eq!(wrote, Ok(4096), "returned before its answer");
        let e = sync.unwrap_err();
        assert!(is_deferred_efbig(&e), "{e}");
        close.unwrap();
    }
    // CLOSE reports it (and still closes).
    let closed = ranks(&addr, "d/pipe-close.bin", 2, move |rank, mut f| {
        (far(rank, &mut f), f.close())
    });
    for (wrote, close) in closed {
        assert_eq!(wrote, Ok(4096));
        let e = close.unwrap_err();
        assert!(is_deferred_efbig(&e), "{e}");
    }
    // An independent call that needs an answer reports it too; the file stays usable.
    let sized = ranks(&addr, "d/pipe-size.bin", 2, move |rank, mut f| {
        let wrote = far(rank, &mut f);
        let size = f.size();
        let again = f.size();
        (wrote, size, again, f.close())
    });
    for (wrote, size, again, close) in sized {
        assert_eq!(wrote, Ok(4096));
        let e = size.unwrap_err();
        assert!(is_deferred_efbig(&e), "{e}");
        assert_eq!(again.unwrap(), 0, "reported once; nothing was written");
        close.unwrap();
    }
    // A later write that finds the error returns it, and is written all the same.
    let later = ranks(&addr, "d/pipe-next.bin", 1, move |_, mut f| {
        let wrote = far(0, &mut f);
        // Its answer is in by the time the next write looks for answers.
        std::thread::sleep(Duration::from_millis(500));
        let next = f.write_at(0, &[7u8; 4096], 4096, &Datatype::byte());
        (wrote, next, f.close())
    });
    let (wrote, next, close) = later.into_iter().next().unwrap();
    assert_eq!(wrote, Ok(4096));
    let e = next.unwrap_err();
    assert!(is_deferred_efbig(&e), "{e}");
    close.unwrap();
    let next_file = std::fs::read(root.join("pipe-next.bin")).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(next_file, vec![7u8; 4096]);
}

/// With the server's write-behind (the default) and write pipelining together, a write
/// that fails behind is still reported, by SYNC, on every rank.
#[test]
fn a_pipelined_write_that_fails_behind_is_reported_by_sync() {
    let (mut child, addr, root) = limited_server(CioConfig::default().write_behind);
    let got = ranks(&addr, "d/pipe-behind.bin", 2, move |rank, mut f| {
        f.set_pipeline(Pipeline::ON).unwrap();
        let data = vec![rank as u8 + 1; 4096];
        let wrote = f
            .write_at_all(
                (8 << 20) + 4096 * u64::from(rank),
                &data,
                4096,
                &Datatype::byte(),
            )
            .map_err(|e| e.class);
        (wrote, f.sync(), f.close())
    });
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&root);
    for (wrote, sync, close) in got {
        assert_eq!(wrote, Ok(4096));
        let e = sync.unwrap_err();
        assert_eq!(e.class, ErrorClass::Io, "{e}");
        assert!(e.message.contains("large"), "{e}");
        close.unwrap();
    }
}
