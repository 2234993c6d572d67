//! Inline writes (protocol 1.2) through a real server on loopback: a write whose data
//! stream fits [`MAX_INLINE`] travels as one frame, the request with its data. What must
//! hold: the server applies it exactly as the request-then-DATA form (placement by the
//! view, collective matching with ranks that sent the other form, error classes and
//! messages, in both pipeline modes); the client sends it only to a server that said 1.2,
//! and never when it is switched off (`File::set_inline(0)`), which is the old form. A
//! read's answer of at most [`MAX_INLINE`] bytes comes back as one DATA_DONE frame to a
//! client that said 1.2, and as DATA frames and DONE to an older one.

mod common;

use std::time::Duration;

use common::{job, ranks, start, start_with, TOKEN};
use ferry_cio::proto::{self, Msg, MAX_INLINE, VERSION_MAJOR, VERSION_MINOR};
use ferry_cio::{amode, CioConfig, CioError, Comm, ErrorClass, File, Pipeline};
use ferry_dtype::Datatype;
use ferry_service::channel::Channel;
use ferry_service::select::{self, Floor};

const T: Duration = Duration::from_secs(10);

/// Bytes of a recognisable stream: `seed` mixed with the position.
fn stream(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// Rank 0 writes 100 bytes (inline) and rank 1 8 MiB (request and DATA frames) in the
/// same collective call, then each writes the other size independently: every byte lands
/// where its view says, in both pipeline modes.
#[test]
fn an_inline_and_a_large_write_in_one_collective_call() {
    let srv = start("tcp", T);
    const SMALL: usize = 100;
    const LARGE: usize = 8 << 20;
    for (i, pipeline) in [Pipeline::OFF, Pipeline::ON].into_iter().enumerate() {
        let path = format!("d/mixed-{i}.bin");
        ranks(&srv.addr, &path, 2, move |rank, mut f| {
            assert_eq!(f.server_minor(), VERSION_MINOR);
            assert_eq!(f.inline(), MAX_INLINE, "the test server's chunk is 64 KiB");
            f.set_pipeline(pipeline).unwrap();
            let (mine, at) = match rank {
                0 => (stream(1, SMALL), 0),
                _ => (stream(2, LARGE), SMALL as i64),
            };
            f.set_view(at, &Datatype::byte(), &Datatype::byte())
                .unwrap();
            let n = f
                .write_at_all(0, &mine, mine.len() as u64, &Datatype::byte())
                .unwrap();
            assert_eq!(n, mine.len() as u64);
            // Independently, past the collective part: rank 1 small, rank 0 large.
            let (theirs, from) = match rank {
                0 => (stream(3, LARGE), (SMALL + LARGE) as u64),
                _ => (stream(4, SMALL), (2 * LARGE) as u64),
            };
            f.write_at(from, &theirs, theirs.len() as u64, &Datatype::byte())
                .unwrap();
            f.sync().unwrap();
            // Read back its own collective part.
            let mut back = vec![0u8; mine.len()];
            f.read_at_all(0, &mut back, mine.len() as u64, &Datatype::byte())
                .unwrap();
            assert!(back == mine, "rank {rank} reads its write back");
            f.close().unwrap();
        });
        let file = std::fs::read(srv.root.join(&path[2..])).unwrap();
        let mut want = stream(1, SMALL);
        want.extend(stream(2, LARGE));
        want.extend(stream(3, LARGE));
        want.extend(stream(4, SMALL));
        assert_eq!(file.len(), want.len(), "{pipeline:?}");
        assert!(file == want, "{pipeline:?}: the file's bytes");
    }
}

/// What a failing write reports, in each form and pipeline mode: its class and message.
fn outcome(r: Result<u64, CioError>) -> Result<u64, (ErrorClass, String)> {
    r.map_err(|e| (e.class, e.message))
}

/// Two ranks whose first ints overlap write 16 bytes each: every rank gets `Arg`
/// "overlapping" and nothing is written, whether the writes go inline or not and whether
/// pipelined (the error then comes from `sync`) or not; both forms say the same.
#[test]
fn an_inline_write_that_overlaps_fails_as_the_two_frame_one() {
    let srv = start("tcp", T);
    let mut seen = Vec::new();
    for (i, inline) in [MAX_INLINE, 0].into_iter().enumerate() {
        for (j, pipeline) in [Pipeline::OFF, Pipeline::ON].into_iter().enumerate() {
            let path = format!("d/overlap-{i}-{j}.bin");
            let got = ranks(&srv.addr, &path, 2, move |rank, mut f| {
                f.set_inline(inline);
                assert_eq!(f.inline(), inline);
                f.set_pipeline(pipeline).unwrap();
                let data = vec![rank as u8 + 1; 16];
                let int = Datatype::primitive(4).unwrap();
                let wrote = outcome(f.write_at_all(0, &data, 4, &int));
                let sync = outcome(f.sync().map(|()| 0));
                f.close().unwrap();
                (wrote, sync)
            });
            for (wrote, sync) in &got {
                let (class, message) = match pipeline.calls {
                    0 => {
                        assert_eq!(sync, &Ok(0));
                        wrote.clone().unwrap_err()
                    }
                    _ => {
                        assert_eq!(wrote, &Ok(16));
                        let (class, m) = sync.clone().unwrap_err();
                        assert!(m.contains("earlier write"), "{m}");
                        (class, m)
                    }
                };
                assert_eq!(class, ErrorClass::Arg, "{message}");
                assert!(message.contains("overlapping"), "{message}");
            }
            let len = std::fs::metadata(srv.root.join(&path[2..])).unwrap().len();
            assert_eq!(len, 0, "nothing written");
            seen.push((pipeline.calls, got));
        }
    }
    // Inline (first two) and two-frame (last two) report the very same.
    assert_eq!(seen[0], seen[2]);
    assert_eq!(seen[1], seen[3]);
}

/// A one-rank open of `path` with mode `mode`.
fn open_one(addr: &str, path: &str, mode: u32) -> File {
    let comm = Comm {
        job: job(),
        rank: 0,
        size: 1,
    };
    common::open(addr, path, comm, mode, TOKEN).unwrap()
}

/// A file opened read-only refuses an inline write with `Access`, at once without
/// pipelining and from the next call with it, as the two-frame form does; the file is
/// unchanged and the connection stays in step (a read after it works).
#[test]
fn an_inline_write_to_a_read_only_file_is_refused_in_both_modes() {
    let srv = start("tcp", T);
    std::fs::write(srv.root.join("ro.bin"), b"x").unwrap();
    let mut seen = Vec::new();
    for inline in [MAX_INLINE, 0] {
        let mut f = open_one(&srv.addr, "d/ro.bin", amode::RDONLY);
        f.set_inline(inline);
        f.set_pipeline(Pipeline::OFF).unwrap();
        let own = outcome(f.write_at(0, b"y", 1, &Datatype::byte()));
        f.set_pipeline(Pipeline::ON).unwrap();
        assert_eq!(f.write_at(0, b"y", 1, &Datatype::byte()).unwrap(), 1);
        let mut one = [0u8; 1];
        let later = f.read_at(0, &mut one, 1, &Datatype::byte()).unwrap_err();
        assert_eq!(later.class, ErrorClass::Access, "{later}");
        assert!(later.message.contains("earlier write"), "{later}");
        assert_eq!(f.read_at(0, &mut one, 1, &Datatype::byte()).unwrap(), 1);
        assert_eq!(&one, b"x");
        f.close().unwrap();
        let (class, message) = own.unwrap_err();
        assert_eq!(class, ErrorClass::Access, "{message}");
        seen.push((class, message, later.message));
    }
    assert_eq!(
        seen[0], seen[1],
        "inline and two-frame refusals say the same"
    );
    assert_eq!(std::fs::read(srv.root.join("ro.bin")).unwrap(), b"x");
}

/// A server whose `max_call_bytes` is below an inline write refuses it with `Arg` and
/// stays in step: the next, smaller write lands.
#[test]
fn an_inline_write_over_max_call_bytes_is_refused() {
    let srv = start_with(
        "tcp",
        CioConfig {
            collective_timeout: T.as_secs_f64(),
            chunk: 64 * 1024,
            max_call_bytes: 50,
            ..CioConfig::default()
        },
    );
    let mut f = open_one(&srv.addr, "d/max.bin", amode::CREATE | amode::RDWR);
    f.set_pipeline(Pipeline::OFF).unwrap();
    assert!(f.inline() >= 100);
    let e = f
        .write_at(0, &[7; 100], 100, &Datatype::byte())
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Arg, "{e}");
    assert!(e.message.contains("max_call_bytes"), "{e}");
    assert_eq!(f.write_at(0, &[8; 40], 40, &Datatype::byte()).unwrap(), 40);
    f.close().unwrap();
    assert_eq!(
        std::fs::read(srv.root.join("max.bin")).unwrap(),
        vec![8; 40]
    );
}

/// Writes of every size around the inline limit, and zero bytes, land alike with inline
/// writes on and off (off is what a 1.1 server gets), and read back whole (answers of up
/// to the limit come inline, larger ones as DATA frames), also past the end of the file.
#[test]
fn sizes_around_the_limit_land_with_inline_on_and_off() {
    let srv = start("tcp", T);
    let sizes = [
        0,
        1,
        MAX_INLINE - 1,
        MAX_INLINE,
        MAX_INLINE + 1,
        3 * MAX_INLINE,
    ];
    for inline in [MAX_INLINE, 0] {
        let path = format!("d/sizes-{inline}.bin");
        let mut f = open_one(&srv.addr, &path, amode::CREATE | amode::RDWR);
        f.set_inline(inline);
        let mut at = 0u64;
        for (k, &n) in sizes.iter().enumerate() {
            let data = stream(k as u8, n);
            let wrote = f.write_at(at, &data, n as u64, &Datatype::byte()).unwrap();
            assert_eq!(wrote, n as u64);
            let mut back = vec![0u8; n];
            let read = f
                .read_at(at, &mut back, n as u64, &Datatype::byte())
                .unwrap();
            assert_eq!(read, n as u64);
            assert!(back == data, "{n} bytes read back");
            at += n as u64;
        }
        // A read reaching past the end gets what there is.
        let mut tail = vec![0u8; 200];
        let read = f
            .read_at(at - 100, &mut tail, 200, &Datatype::byte())
            .unwrap();
        assert_eq!(read, 100);
        f.close().unwrap();
        let file = std::fs::read(srv.root.join(&path[2..])).unwrap();
        let want: Vec<u8> = sizes
            .iter()
            .enumerate()
            .flat_map(|(k, &n)| stream(k as u8, n))
            .collect();
        assert!(file == want, "inline {inline}");
    }
}

/// A raw connection that selected `cio` and opened `path` alone, saying protocol
/// `1.minor`; the server's OPENED.
fn raw_open(addr: &str, path: &str, minor: u16) -> (Channel, Msg) {
    let mut ch = Channel::connect_with(addr, T, &common::security()).unwrap();
    ch.post_ring(2, 1 << 20).unwrap();
    let sel = Floor::Select {
        service: "cio".into(),
        token: None,
        proof: None,
        key: None,
    };
    ch.send_frame(&select::encode(&sel).unwrap()).unwrap();
    let open = Msg::Open {
        major: VERSION_MAJOR,
        minor,
        job: job(),
        rank: 0,
        size: 1,
        amode: amode::CREATE | amode::RDWR,
        path: path.into(),
        token: TOKEN.into(),
    };
    ch.send_frame(&proto::to_vec(&open).unwrap()).unwrap();
    let mut v = Vec::new();
    ch.recv_into(&mut v).unwrap();
    assert_eq!(select::decode(&v).unwrap(), Floor::Selected);
    let opened = next(&mut ch).0;
    (ch, opened)
}

/// The next frame and its payload.
fn next(ch: &mut Channel) -> (Msg, Vec<u8>) {
    let mut v = Vec::new();
    ch.recv_into(&mut v).unwrap();
    let (m, p) = proto::decode(&v).unwrap();
    (m, p.to_vec())
}

/// A frame with a payload.
fn with_payload(msg: &Msg, payload: &[u8]) -> Vec<u8> {
    let mut v = proto::to_vec(msg).unwrap();
    v.extend_from_slice(payload);
    v
}

/// A client that says 1.1 writes in the two-frame form and gets a small read's answer as
/// DATA then DONE; one that says 1.2 writes inline and gets it as one DATA_DONE. Both
/// see the same bytes.
#[test]
fn a_read_answer_is_inline_only_for_a_client_of_1_2() {
    let srv = start("tcp", T);
    let data = stream(9, 100);
    for minor in [1, 2] {
        let (mut ch, opened) = raw_open(&srv.addr, &format!("d/raw-{minor}.bin"), minor);
        assert!(
            matches!(opened, Msg::Opened { minor: m, .. } if m == VERSION_MINOR),
            "{opened:?}"
        );
        if minor < 2 {
            let head = Msg::WriteAt {
                offset: 0,
                len: 100,
            };
            ch.send_frame(&proto::to_vec(&head).unwrap()).unwrap();
            let mut frame = proto::data_header(100).unwrap().to_vec();
            frame.extend_from_slice(&data);
            ch.send_frame(&frame).unwrap();
        } else {
            let head = Msg::WriteAtInline {
                offset: 0,
                len: 100,
            };
            ch.send_frame(&with_payload(&head, &data)).unwrap();
        }
        assert_eq!(next(&mut ch).0, Msg::Done(100));
        let read = Msg::ReadAt {
            offset: 0,
            len: 100,
        };
        ch.send_frame(&proto::to_vec(&read).unwrap()).unwrap();
        if minor < 2 {
            assert_eq!(next(&mut ch), (Msg::Data { len: 100 }, data.clone()));
            assert_eq!(next(&mut ch).0, Msg::Done(100));
        } else {
            assert_eq!(next(&mut ch), (Msg::DataDone { len: 100 }, data.clone()));
        }
        ch.send_frame(&proto::to_vec(&Msg::Close).unwrap()).unwrap();
        assert_eq!(next(&mut ch).0, Msg::Done(0));
        ch.close();
    }
}
