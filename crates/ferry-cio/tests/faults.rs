//! Faults and bad input through a real server on loopback: each a clear error with its MPI
//! class, nothing written outside the call's range, and the server keeps serving other
//! sessions. Overlapping pieces in one collective write, a negative displacement, an
//! offset or a description whose extent overflows, paths outside the roots, a bad token,
//! a garbage client, a rank that goes silent, a rank whose process is killed while the
//! others wait in a collective call.

mod common;

use std::time::{Duration, Instant};

use common::{job, ranks, start, TOKEN};
use ferry_cio::proto::{self, Desc, Msg};
use ferry_cio::{amode, CioError, Comm, ErrorClass, File, Pipeline};
use ferry_dtype::Datatype;
use ferry_service::channel::Channel;
use ferry_service::select::{self, Floor};

const T: Duration = Duration::from_secs(10);
const RW: u32 = amode::CREATE | amode::RDWR;

fn int() -> Datatype {
    Datatype::primitive(4).unwrap()
}

fn class<T>(r: Result<T, CioError>) -> ErrorClass {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.class,
    }
}

/// An error of a deferred write: its class, and a message saying it was an earlier write.
fn deferred(e: &CioError, class: ErrorClass, says: &str) -> bool {
    e.class == class && e.message.contains("earlier write") && e.message.contains(says)
}

#[test]
fn overlapping_pieces_fail_every_rank_and_write_nothing() {
    let srv = start("tcp", T);
    let errs = ranks(&srv.addr, "d/overlap.bin", 2, |rank, mut f| {
        // Pipelining off: the failing write reports its own error.
        f.set_pipeline(Pipeline::OFF).unwrap();
        // Both ranks' views start at byte 0: their first ints overlap.
        let data = vec![rank as u8 + 1; 16];
        let e = f.write_at_all(0, &data, 4, &int()).unwrap_err();
        f.close().unwrap();
        e
    });
    for e in errs {
        assert_eq!(e.class, ErrorClass::Arg, "{e}");
        assert!(e.message.contains("overlapping"), "{e}");
    }
    assert_eq!(
        std::fs::metadata(srv.root.join("overlap.bin"))
            .unwrap()
            .len(),
        0
    );
}

/// With write pipelining (the default) the overlapping write returns at once; its error
/// comes back from `sync` on every rank with its class, and nothing is written.
#[test]
fn overlapping_pieces_pipelined_fail_the_next_sync() {
    let srv = start("tcp", T);
    let got = ranks(&srv.addr, "d/overlap-pipe.bin", 2, |rank, mut f| {
        assert!(f.pipeline().calls > 0, "pipelining is on by default");
        let data = vec![rank as u8 + 1; 16];
        let wrote = f.write_at_all(0, &data, 4, &int()).map_err(|e| e.class);
        (wrote, f.sync(), f.close())
    });
    for (wrote, sync, close) in got {
        assert_eq!(wrote, Ok(16));
        let e = sync.unwrap_err();
        assert!(deferred(&e, ErrorClass::Arg, "overlapping"), "{e}");
        close.unwrap();
    }
    assert_eq!(
        std::fs::metadata(srv.root.join("overlap-pipe.bin"))
            .unwrap()
            .len(),
        0
    );
}

#[test]
fn a_negative_displacement_fails_the_collective_view() {
    let srv = start("tcp", T);
    let errs = ranks(&srv.addr, "d/negative.bin", 2, |rank, mut f| {
        let disp = if rank == 0 { -4 } else { 4 };
        let e = f.set_view(disp, &int(), &int()).unwrap_err();
        // The old view stands: a write still works, at the start of the file.
        let data = [rank as u8; 4];
        let n = f
            .write_at_all(4 * u64::from(rank), &data, 1, &int())
            .unwrap();
        f.close().unwrap();
        (e, n)
    });
    for (e, n) in errs {
        assert_eq!(e.class, ErrorClass::Arg, "{e}");
        assert!(
            e.message.contains("rank 0") && e.message.contains("displacement"),
            "{e}"
        );
        assert_eq!(n, 4);
    }
}

#[test]
fn an_offset_beyond_any_file_is_refused() {
    let srv = start("tcp", T);
    let errs = ranks(&srv.addr, "d/far.bin", 1, |_, mut f| {
        f.set_pipeline(Pipeline::OFF).unwrap();
        f.set_view(0, &int(), &int()).unwrap();
        let e = f
            .write_at_all(u64::MAX / 2, &[0; 4], 1, &int())
            .unwrap_err();
        f.close().unwrap();
        e
    });
    assert_eq!(errs[0].class, ErrorClass::Arg, "{}", errs[0]);
    assert_eq!(
        std::fs::metadata(srv.root.join("far.bin")).unwrap().len(),
        0
    );
}

/// Pipelined (the default), the far write returns at once and `close` reports its error.
#[test]
fn an_offset_beyond_any_file_pipelined_fails_the_close() {
    let srv = start("tcp", T);
    let got = ranks(&srv.addr, "d/far-pipe.bin", 1, |_, mut f| {
        f.set_view(0, &int(), &int()).unwrap();
        let wrote = f.write_at_all(u64::MAX / 2, &[0; 4], 1, &int());
        (wrote.map_err(|e| e.class), f.close())
    });
    let (wrote, close) = got.into_iter().next().unwrap();
    assert_eq!(wrote, Ok(4));
    let e = close.unwrap_err();
    assert!(deferred(&e, ErrorClass::Arg, ""), "{e}");
    assert_eq!(
        std::fs::metadata(srv.root.join("far-pipe.bin"))
            .unwrap()
            .len(),
        0
    );
}

/// A raw connection that selected `cio` and sent `first` (its face's first frame).
fn raw(addr: &str, first: &[u8]) -> Channel {
    let mut ch = Channel::connect_with(addr, T, &common::security()).unwrap();
    ch.post_ring(2, 1 << 20).unwrap();
    let sel = Floor::Select {
        service: "cio".into(),
        token: None,
        proof: None,
        key: None,
    };
    ch.send_frame(&select::encode(&sel).unwrap()).unwrap();
    ch.send_frame(first).unwrap();
    let mut v = Vec::new();
    ch.recv_into(&mut v).unwrap();
    assert_eq!(select::decode(&v).unwrap(), Floor::Selected);
    ch
}

fn recv(ch: &mut Channel) -> Result<Msg, ferry_service::Error> {
    let mut v = Vec::new();
    ch.recv_into(&mut v)?;
    Ok(proto::decode(&v).unwrap().0)
}

fn open_frame(job: u64, path: &str, token: &str) -> Vec<u8> {
    proto::to_vec(&Msg::Open {
        major: proto::VERSION_MAJOR,
        minor: proto::VERSION_MINOR,
        job,
        rank: 0,
        size: 1,
        amode: RW,
        path: path.into(),
        token: token.into(),
    })
    .unwrap()
}

#[test]
fn a_description_whose_extent_overflows_is_a_type_error() {
    let srv = start("tcp", T);
    let mut ch = raw(&srv.addr, &open_frame(job(), "d/desc.bin", TOKEN));
    assert!(matches!(recv(&mut ch).unwrap(), Msg::Opened { .. }));
    // contiguous(2^62) of 8-byte elements: the extent does not fit 64 bits.
    let mut desc = vec![1u8, 2];
    desc.extend_from_slice(&(1u64 << 62).to_le_bytes());
    desc.push(1);
    desc.extend_from_slice(&8u64.to_le_bytes());
    let view = Msg::SetView {
        disp: 0,
        etype: Desc::Inline(Datatype::byte().encode()),
        filetype: Desc::Inline(desc),
    };
    ch.send_frame(&proto::to_vec(&view).unwrap()).unwrap();
    match recv(&mut ch).unwrap() {
        Msg::Error { class, message } => {
            assert_eq!(class, ErrorClass::Type);
            assert!(message.contains("overflow"), "{message}");
        }
        m => panic!("{m:?}"),
    }
    // A hash never described.
    let view = Msg::SetView {
        disp: 0,
        etype: Desc::Hash([9; 32]),
        filetype: Desc::Hash([9; 32]),
    };
    ch.send_frame(&proto::to_vec(&view).unwrap()).unwrap();
    assert!(matches!(
        recv(&mut ch).unwrap(),
        Msg::Error {
            class: ErrorClass::Type,
            ..
        }
    ));
}

#[test]
fn paths_outside_the_roots_and_bad_tokens_are_refused() {
    let srv = start("tcp", T);
    let open = |path: &str, token: &str| {
        common::open(
            &srv.addr,
            path,
            Comm {
                job: job(),
                rank: 0,
                size: 1,
            },
            RW,
            token,
        )
    };
    assert_eq!(class(open("d/../escape.bin", TOKEN)), ErrorClass::Access);
    assert_eq!(class(open("/etc/passwd", TOKEN)), ErrorClass::Access);
    assert_eq!(class(open("nope/x.bin", TOKEN)), ErrorClass::NoSuchFile);
    assert_eq!(
        class(open("d/no/such/dir.bin", TOKEN)),
        ErrorClass::NoSuchFile
    );
    assert_eq!(class(open("d/x.bin", "wrong")), ErrorClass::Access);
    assert!(
        !srv.root.join("x.bin").exists(),
        "a refused open created the file"
    );
    assert!(!srv.root.parent().unwrap().join("escape.bin").exists());
    // Access modes.
    let bad = common::open(
        &srv.addr,
        "d/m.bin",
        Comm {
            job: job(),
            rank: 0,
            size: 1,
        },
        amode::RDONLY | amode::CREATE,
        TOKEN,
    );
    assert_eq!(class(bad), ErrorClass::Amode);
    std::fs::write(srv.root.join("exists.bin"), b"x").unwrap();
    let excl = common::open(
        &srv.addr,
        "d/exists.bin",
        Comm {
            job: job(),
            rank: 0,
            size: 1,
        },
        amode::CREATE | amode::EXCL | amode::WRONLY,
        TOKEN,
    );
    assert_eq!(class(excl), ErrorClass::FileExists);
    // A read-only file refuses writes; a write-only one, reads.
    let mut f = common::open(
        &srv.addr,
        "d/exists.bin",
        Comm {
            job: job(),
            rank: 0,
            size: 1,
        },
        amode::RDONLY,
        TOKEN,
    )
    .unwrap();
    f.set_pipeline(Pipeline::OFF).unwrap();
    assert_eq!(
        class(f.write_at(0, b"y", 1, &Datatype::byte())),
        ErrorClass::Access
    );
    let mut one = [0u8; 1];
    assert_eq!(f.read_at(0, &mut one, 1, &Datatype::byte()).unwrap(), 1);
    assert_eq!(&one, b"x");
    // Pipelined, the refused write returns at once and the next call that needs an
    // answer reports it (a read, which still reads); it is reported once.
    f.set_pipeline(Pipeline::ON).unwrap();
    assert_eq!(f.write_at(0, b"y", 1, &Datatype::byte()).unwrap(), 1);
    let e = f.read_at(0, &mut one, 1, &Datatype::byte()).unwrap_err();
    assert!(deferred(&e, ErrorClass::Access, ""), "{e}");
    assert_eq!(f.read_at(0, &mut one, 1, &Datatype::byte()).unwrap(), 1);
    assert_eq!(&one, b"x");
    f.close().unwrap();
    let mut f = common::open(
        &srv.addr,
        "d/exists.bin",
        Comm {
            job: job(),
            rank: 0,
            size: 1,
        },
        amode::WRONLY,
        TOKEN,
    )
    .unwrap();
    assert_eq!(
        class(f.read_at(0, &mut one, 1, &Datatype::byte())),
        ErrorClass::Access
    );
    assert_eq!(f.write_at(0, b"z", 1, &Datatype::byte()).unwrap(), 1);
    f.close().unwrap();
    assert_eq!(std::fs::read(srv.root.join("exists.bin")).unwrap(), b"z");
}

#[test]
fn a_garbage_client_loses_only_its_own_connection() {
    let srv = start("tcp", T);
    let mut bad = raw(&srv.addr, &[0xde, 0xad, 0xbe, 0xef, 1, 2, 3]);
    assert!(recv(&mut bad).is_err(), "the garbage connection is closed");
    // A client that opens, then sends a DATA frame out of place: closed too.
    let mut rude = raw(&srv.addr, &open_frame(job(), "d/rude.bin", TOKEN));
    assert!(matches!(recv(&mut rude).unwrap(), Msg::Opened { .. }));
    let mut data = proto::data_header(3).unwrap().to_vec();
    data.extend_from_slice(b"abc");
    rude.send_frame(&data).unwrap();
    assert!(recv(&mut rude).is_err());
    // Everyone else is served.
    let sizes = ranks(&srv.addr, "d/fine.bin", 2, |rank, mut f| {
        f.set_view(
            4 * i64::from(rank),
            &int(),
            &Datatype::resized(&int(), 0, 8).unwrap(),
        )
        .unwrap();
        f.write_at_all(0, &[rank as u8; 40], 10, &int()).unwrap();
        let n = f.size().unwrap();
        f.close().unwrap();
        n
    });
    assert_eq!(sizes, [80, 80]);
}

#[test]
fn a_silent_rank_fails_the_others_after_the_timeout() {
    let srv = start("tcp", Duration::from_secs(1));
    let key = job();
    let addr = srv.addr.clone();
    let silent = std::thread::spawn(move || {
        let f = common::open(
            &addr,
            "d/silent.bin",
            Comm {
                job: key,
                rank: 1,
                size: 2,
            },
            RW,
            TOKEN,
        )
        .unwrap();
        std::thread::sleep(Duration::from_secs(4));
        drop(f);
    });
    let mut f = common::open(
        &srv.addr,
        "d/silent.bin",
        Comm {
            job: key,
            rank: 0,
            size: 2,
        },
        RW,
        TOKEN,
    )
    .unwrap();
    let t = Instant::now();
    let e = f.sync().unwrap_err();
    assert_eq!(e.class, ErrorClass::RankLost, "{e}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // The session is over: later collective calls fail at once.
    assert_eq!(class(f.sync()), ErrorClass::RankLost);
    silent.join().unwrap();
}

/// The child side of [`a_killed_rank_fails_the_others_at_once`]: opens as rank 1 and
/// waits to be killed (run only as that test's child process).
#[test]
#[ignore]
fn child_rank_that_gets_killed() {
    let Ok(spec) = std::env::var("CIO_CHILD") else {
        return;
    };
    let mut it = spec.split(' ');
    let (addr, job) = (it.next().unwrap(), it.next().unwrap().parse().unwrap());
    let path = it.next().unwrap_or("d/killed.bin");
    let _f = common::open(
        addr,
        path,
        Comm {
            job,
            rank: 1,
            size: 2,
        },
        RW,
        TOKEN,
    )
    .unwrap();
    println!("CHILD OPEN");
    std::thread::sleep(Duration::from_secs(60));
}

/// Opens `path` as rank 0 of 2 with a child process as rank 1, which is killed 300 ms
/// later (the killer thread's handle is returned).
fn open_with_a_doomed_rank(addr: &str, path: &str) -> (File, std::thread::JoinHandle<()>) {
    let key = job();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_rank_that_gets_killed",
            "--ignored",
            "--nocapture",
        ])
        .env("CIO_CHILD", format!("{addr} {key} {path}"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let f = common::open(
        addr,
        path,
        Comm {
            job: key,
            rank: 0,
            size: 2,
        },
        RW,
        TOKEN,
    )
    .unwrap();
    // Both opened (the open is collective); kill rank 1 while rank 0 waits in a call.
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        child.kill().unwrap();
        child.wait().unwrap();
    });
    (f, killer)
}

#[test]
fn a_killed_rank_fails_the_others_at_once() {
    let srv = start("tcp", Duration::from_secs(60));
    let (mut f, killer) = open_with_a_doomed_rank(&srv.addr, "d/killed.bin");
    f.set_pipeline(Pipeline::OFF).unwrap();
    let t = Instant::now();
    let e = f.write_at_all(0, &[7; 8], 2, &int()).unwrap_err();
    assert_eq!(e.class, ErrorClass::RankLost, "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    killer.join().unwrap();
    assert_eq!(
        std::fs::metadata(srv.root.join("killed.bin"))
            .unwrap()
            .len(),
        0
    );
    // The server keeps serving other sessions.
    let n = ranks(&srv.addr, "d/after.bin", 1, |_, mut f| {
        let n = f.write_at_all(0, &[1; 4], 4, &Datatype::byte()).unwrap();
        f.close().unwrap();
        n
    });
    assert_eq!(n, [4]);
}

/// Pipelined (the default), the write returns at once and the next `sync` reports the
/// lost rank (for the write, then its own failure) within a bounded time.
#[test]
fn a_killed_rank_pipelined_fails_the_next_sync() {
    let srv = start("tcp", Duration::from_secs(60));
    let (mut f, killer) = open_with_a_doomed_rank(&srv.addr, "d/killed-pipe.bin");
    let t = Instant::now();
    assert_eq!(f.write_at_all(0, &[7; 8], 2, &int()).unwrap(), 8);
    let e = f.sync().unwrap_err();
    assert!(deferred(&e, ErrorClass::RankLost, ""), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    killer.join().unwrap();
    drop(f);
    assert_eq!(
        std::fs::metadata(srv.root.join("killed-pipe.bin"))
            .unwrap()
            .len(),
        0
    );
}

/// A drain refuses new opens (Busy) and lets open files work through the grace period;
/// once it is over, a connection ends between requests.
#[test]
fn a_drain_refuses_new_opens_and_then_ends_open_files() {
    use ferry_service::registry::Service;
    let srv = start("tcp", T);
    let one = || Comm {
        job: job(),
        rank: 0,
        size: 1,
    };
    let mut f = common::open(&srv.addr, "d/drain.bin", one(), RW, TOKEN).unwrap();
    srv.server.begin_drain();
    assert_eq!(
        class(common::open(&srv.addr, "d/new.bin", one(), RW, TOKEN)),
        ErrorClass::Busy
    );
    assert_eq!(f.write_at(0, b"still", 5, &Datatype::byte()).unwrap(), 5);
    let report = srv.server.drain(Duration::ZERO);
    assert_eq!(
        (report.in_flight, report.interrupted, report.abandoned),
        (1, 1, 0)
    );
    assert!(f.size().is_err(), "the connection ended after the grace");
    assert_eq!(std::fs::read(srv.root.join("drain.bin")).unwrap(), b"still");
}
