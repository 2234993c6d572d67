//! The download conversation (`ferry_xfer::conv::download`) simulated: the client's and the
//! server's state machines over a wire that cuts, corrupts and reorders, with slow and
//! failing disks and resumes from the journal, across thousands of seeds. A failure prints
//! its seed; `FERRY_SIM_SEED=<seed> cargo test -p ferry-xfer --test sim_download` replays it.

#[path = "sim/download.rs"]
mod download;
mod sim;

use std::sync::Mutex;

use download::{Seen, Sim};

/// Seeds per run: a few seconds in a debug build.
const SEEDS: u64 = 2000;

#[test]
fn every_file_lands_whole_through_cuts_corruption_and_slow_disks() {
    let total = Mutex::new(Seen::default());
    sim::run_seeds("sim_download", SEEDS, |seed| {
        let mut sim = Sim::new(seed);
        sim.run()?;
        *total.lock().unwrap() += sim.seen;
        Ok(())
    });
    let seen = *total.lock().unwrap();
    eprintln!("{seen:?}");
    if std::env::var("FERRY_SIM_SEED").is_err() {
        // The faults were met, not just planned.
        for (what, n) in [
            ("cuts", seen.cuts),
            ("resumes from a journaled prefix", seen.resumed),
            ("re-fetches after a bad CRC", seen.refetched),
            ("files failed by CRC retries running out", seen.exhausted),
            ("disk or read failures", seen.io_failures),
            ("reordered blocks", seen.reordered),
            ("late disk completions", seen.slow),
            ("chunks of shared files", seen.chunks),
        ] {
            assert!(n >= 5, "only {n} {what} over {SEEDS} seeds");
        }
    }
}

/// Properties of the client's machine alone.
mod machine {
    use ferry_xfer::conv::download::{Action, Downloader, Job, Landing, Settings};
    use ferry_xfer::proto::{self, BlockHeader, ErrorCode, Msg};
    use proptest::prelude::*;

    fn landing() -> impl Strategy<Value = Landing> {
        prop_oneof![
            (0u64..1 << 20, 0u64..1 << 20).prop_map(|(size, held)| Landing::Part {
                size,
                held: held.min(size)
            }),
            Just(Landing::Null),
            (0u64..1 << 20, 1u64..1 << 20, any::<bool>()).prop_map(|(lo, n, sum)| {
                Landing::Chunk {
                    lo,
                    hi: lo + n,
                    sum,
                }
            }),
        ]
    }

    fn settings() -> impl Strategy<Value = Settings> {
        (
            1u16..=proto::VERSION_MINOR,
            1usize..64,
            0usize..70,
            prop_oneof![Just(proto::MAX_CONTROL), 0usize..4096],
            1usize..4,
        )
            .prop_map(|(minor, window, refill, frame, chunks_ahead)| Settings {
                minor,
                window,
                refill,
                frame,
                chunks_ahead,
                retries: ferry_xfer::BLOCK_RETRIES,
            })
    }

    /// The requests the machine sent: (file, offset, length) of each GET, the files whose
    /// SUM came just before their GET. A GETS frame of several files stays within `frame`
    /// bytes (one file alone may exceed it: every file must be asked for).
    fn requests(conv: &mut Downloader, frame: usize) -> (Vec<(u32, u64, u64)>, Vec<u32>) {
        let (mut gets, mut summed, mut sum_pending) = (Vec::new(), Vec::new(), false);
        while let Some(a) = conv.poll() {
            match a {
                Action::Send(Msg::Gets { files }) => {
                    assert!(!files.is_empty() && files.len() <= proto::MAX_GETS);
                    let len = proto::to_vec(&Msg::Gets {
                        files: files.clone(),
                    })
                    .map(|v| v.len());
                    assert!(len.is_ok());
                    assert!(files.len() == 1 || len.is_ok_and(|n| n <= frame));
                    gets.extend(files.into_iter().map(|(f, _)| (f, 0, u64::MAX)));
                }
                Action::Send(Msg::Get {
                    file_id,
                    offset,
                    length,
                    ..
                }) => {
                    if std::mem::take(&mut sum_pending) {
                        summed.push(file_id);
                    }
                    gets.push((file_id, offset, length));
                }
                Action::Send(Msg::Sum { .. }) => sum_pending = true,
                a => panic!("unexpected action before any answer: {a:?}"),
            }
        }
        (gets, summed)
    }

    proptest! {
        /// However jobs and settings are mixed, each started job is asked for exactly once
        /// (in a GET or a GETS), from its first missing byte, within the window; a resumed
        /// part and a chunk that wants it ask for the source's hash first.
        #[test]
        fn every_job_is_asked_for_once_within_the_window(
            s in settings(),
            landings in proptest::collection::vec(landing(), 0..200),
            paths in proptest::collection::vec("[a-z/]{1,300}", 1..4),
        ) {
            let mut conv = Downloader::new(s);
            let mut started = Vec::new();
            let mut jobs = landings.into_iter().enumerate();
            if conv.refill_open() {
                while conv.has_room() {
                    let Some((i, landing)) = jobs.next() else { break };
                    let job = Job { file: i as u32, path: paths[i % paths.len()].clone(), landing };
                    started.push(job.clone());
                    conv.start(job);
                }
            }
            conv.flush();
            prop_assert!(conv.in_flight() <= s.window);
            prop_assert_eq!(conv.in_flight(), started.len());
            let chunks = started.iter().filter(|j| matches!(j.landing, Landing::Chunk { .. })).count();
            prop_assert!(chunks <= s.chunks_ahead);
            let (gets, summed) = requests(&mut conv, s.frame);
            prop_assert_eq!(gets.len(), started.len());
            for job in &started {
                let asked: Vec<_> = gets.iter().filter(|g| g.0 == job.file).collect();
                prop_assert_eq!(asked.len(), 1);
                let (want, sum) = match job.landing {
                    Landing::Part { held, .. } => ((held, u64::MAX), held > 0),
                    Landing::Null => ((0, u64::MAX), false),
                    Landing::Chunk { lo, hi, sum } => ((lo, hi - lo), sum),
                };
                prop_assert_eq!((asked[0].1, asked[0].2), want);
                prop_assert_eq!(summed.contains(&job.file), sum);
            }
        }

        /// Whatever a (hostile) server sends, and whatever the runtime reports, the machine
        /// answers with actions or an error, never a panic; and it never commits a file
        /// whose hash it was not given as the source's.
        #[test]
        fn any_answer_is_taken_without_panic(
            s in settings(),
            landings in proptest::collection::vec(landing(), 1..8),
            events in proptest::collection::vec((0u8..7, 0u32..10, any::<u64>(), any::<u32>(), any::<[u8; 32]>()), 0..60),
        ) {
            let mut conv = Downloader::new(s);
            for (i, landing) in landings.into_iter().enumerate() {
                conv.start(Job { file: i as u32, path: format!("r/f{i}"), landing });
            }
            conv.flush();
            let mut told: Vec<[u8; 32]> = Vec::new();
            for (kind, file, n, m, hash) in events {
                let res = match kind {
                    0 => conv.on_msg(Msg::Ready { file_id: file, size: n % 4096, mode: m, offset: 0 }),
                    1 => conv.on_msg(Msg::FileDone { file_id: file, length: n, blake3: (m % 2 == 0).then_some(hash) }),
                    2 => conv.on_msg(Msg::SumReply { size: n, blake3: hash }),
                    3 => conv.on_msg(Msg::Block(BlockHeader { file_id: file, stream: 0, offset: n, len: m, crc32c: m, spans: false })),
                    4 => conv.on_msg(Msg::Error { code: ErrorCode::Io, file_id: file, message: "no".into() }),
                    5 => conv.checked(file, if m % 2 == 0 { vec![] } else { vec![(n, m)] }),
                    _ => conv.hashed(file, hash),
                };
                if matches!(kind, 1 | 2) {
                    told.push(hash);
                }
                let hashed = (kind == 6).then_some(hash);
                while let Some(a) = conv.poll() {
                    if let Action::Commit { .. } = a {
                        let h = hashed.expect("a commit only follows a hash report");
                        prop_assert!(told.contains(&h), "committed with a hash the server never sent");
                    }
                }
                if res.is_err() {
                    break;
                }
            }
        }
    }

    use ferry_xfer::conv::download::{Reply, Responder, Source};

    proptest! {
        /// The server's half answers a GET of any range of any source with READY, reads
        /// that cover exactly the asked range clipped to the source, in pieces no larger
        /// than asked, and FILE_DONE with that length and a hash only for a whole file; or
        /// a FILE frame for a small whole file to a 1.3 client; or an ERROR for a range past
        /// the end.
        #[test]
        fn a_get_is_answered_by_reads_of_exactly_its_range(
            size in 0u64..10_000,
            offset in 0u64..12_000,
            length in prop_oneof![Just(u64::MAX), 0u64..12_000],
            piece in 1u64..5000,
            inline in any::<bool>(),
            fits in any::<bool>(),
        ) {
            let mut conv = Responder::new(inline, piece);
            let src = Source { size, mode: 0o640, fits, hash: true, known: None };
            conv.get((7, offset, length), "r/f", Ok(src));
            let mut replies = Vec::new();
            let mut read = offset;
            while let Some(r) = conv.poll() {
                if let Reply::Read { offset: at, len, .. } = r {
                    prop_assert_eq!(at, read);
                    prop_assert!(len <= piece);
                    read += len;
                }
                if matches!(r, Reply::Read { .. } | Reply::SendFile { .. }) {
                    conv.sent();
                }
                replies.push(r);
            }
            prop_assert!(conv.is_idle());
            if inline && fits && offset == 0 && length == u64::MAX {
                prop_assert_eq!(replies, vec![Reply::SendFile { file_id: 7, size, mode: 0o640, known: None }]);
                return Ok(());
            }
            if offset > size {
                let refused = matches!(&replies[..], [Reply::Send(Msg::Error { code: ErrorCode::BadRequest, file_id: 7, .. })]);
                prop_assert!(refused, "a GET past the end is refused: {:?}", replies);
                return Ok(());
            }
            let len = length.min(size - offset);
            prop_assert_eq!(&replies[0], &Reply::Send(Msg::Ready { file_id: 7, size, mode: 0o640, offset }));
            prop_assert_eq!(read, offset + len);
            let Some(Reply::Send(Msg::FileDone { file_id: 7, length: done, blake3 })) = replies.last() else {
                return Err(TestCaseError::fail("no FILE_DONE last"));
            };
            prop_assert_eq!(*done, len);
            prop_assert_eq!(blake3.is_some(), offset == 0 && len == size);
        }
    }
}
