//! Property tests of the upload conversation's machines alone (no link, no disk): the
//! client's `Uploader` sends exactly what the server lacks, the server's `Receiver` commits
//! only a range every block of which arrived, and asks again for what failed its CRC.

use ferry_xfer::conv::upload::{
    held_ranges, Action, Event, PutJob, Receiver, RxAction, RxEvent, Uploader,
};
use ferry_xfer::proto::{BlockHeader, ErrorCode, Msg};
use proptest::prelude::*;

fn job(size: u64) -> PutJob {
    PutJob {
        file_id: 9,
        flags: 0,
        mode: 0o644,
        size,
        mtime: Some(1),
        path: "r/f".into(),
        hash: true,
        check_source: true,
    }
}

/// Drains an uploader's actions, answering local ones: the spans sent (first round or not).
fn spans_sent(up: &mut Uploader) -> (Vec<(u64, u64, bool)>, Vec<Action>) {
    let mut spans = Vec::new();
    let mut rest = Vec::new();
    while let Some(a) = up.poll() {
        match a {
            Action::SendRange { span, resend, .. } => {
                spans.push((span.offset, span.len, resend));
                up.handle(Event::Sent {
                    digest: Some([7; 32]),
                });
            }
            Action::CheckSource => up.handle(Event::SourceChecked(Ok(()))),
            a => rest.push(a),
        }
    }
    (spans, rest)
}

fn ready(offset: u64) -> Event {
    Event::Msg(Msg::Ready {
        file_id: 9,
        size: 0,
        mode: 0,
        offset,
    })
}

proptest! {
    /// A resumed PUT sends exactly `[offset, size)` once, then FILE_DONE of the whole file
    /// with the hash the runtime computed.
    #[test]
    fn a_put_sends_exactly_what_the_server_lacks(size in 0u64..1 << 40, at in 0u64..=100) {
        let offset = size / 100 * at;
        let mut up = Uploader::put(job(size));
        let (_, first) = spans_sent(&mut up);
        prop_assert!(matches!(first.as_slice(), [Action::Send(Msg::Put { size: s, .. })] if *s == size), "no match");
        prop_assert!(up.awaits_peer());
        up.handle(ready(offset));
        let (spans, rest) = spans_sent(&mut up);
        prop_assert_eq!(spans, vec![(offset, size - offset, false)]);
        let resumed = offset > 0;
        prop_assert_eq!(rest.len(), 1 + usize::from(resumed));
        if resumed {
            prop_assert!(matches!(rest[0], Action::Resumed { offset: o, hash: true } if o == offset), "no match");
        }
        let done = &rest[rest.len() - 1];
        prop_assert!(matches!(done, Action::Send(Msg::FileDone { length, blake3: Some(h), .. }) if *length == size && *h == [7; 32]), "no match");
    }

    /// RESEND: exactly the ranges asked for go again (not hashed), then FILE_DONE again; a
    /// range outside the file ends the conversation.
    #[test]
    fn resend_sends_exactly_the_ranges_asked(
        size in 1u64..1 << 30,
        asked in proptest::collection::vec((0u64..1 << 30, 1u32..1 << 20), 1..8),
    ) {
        let mut up = Uploader::put(job(size));
        spans_sent(&mut up);
        up.handle(ready(0));
        spans_sent(&mut up);
        up.handle(Event::Msg(Msg::Resend { file_id: 9, ranges: asked.clone() }));
        let (spans, rest) = spans_sent(&mut up);
        let inside = asked.iter().all(|&(o, l)| o + u64::from(l) <= size);
        if inside {
            let want: Vec<_> = asked.iter().map(|&(o, l)| (o, u64::from(l), true)).collect();
            prop_assert_eq!(spans, want);
            prop_assert!(matches!(rest.as_slice(), [Action::Send(Msg::FileDone { blake3: Some(h), .. })] if *h == [7; 32]), "no match");
        } else {
            prop_assert!(spans.is_empty());
            prop_assert!(matches!(rest.as_slice(), [Action::Fail(_)]), "no match");
            prop_assert!(up.is_over());
        }
    }

    /// HAVE ranges inside the file are what is held; the rest is what is sent; together they
    /// are the whole file. A range outside it is refused.
    #[test]
    fn have_ranges_and_what_is_left_cover_the_file_once(
        size in 0u64..1 << 20,
        have in proptest::collection::vec((0u64..1 << 20, 0u64..1 << 20), 0..8),
    ) {
        let have: Vec<_> = have.into_iter().map(|(a, b)| (a.min(b), a.max(b))).collect();
        match held_ranges(&have, size) {
            Ok(held) => {
                prop_assert!(have.iter().all(|&(a, b)| a < b && b <= size));
                let left = held.missing(size);
                let total: u64 = left.iter().map(|(a, b)| b - a).sum::<u64>() + held.total();
                prop_assert_eq!(total, size);
                for (a, b) in left {
                    prop_assert!(!have.iter().any(|&(x, y)| x < b && a < y));
                }
            }
            Err(_) => prop_assert!(have.iter().any(|&(a, b)| a >= b || b > size)),
        }
    }

    /// The receiver of a PUT_RANGE lands blocks in any order, duplicates included, and
    /// commits the range only if every byte of it arrived; a block outside it ends the
    /// connection.
    #[test]
    fn a_range_commits_only_when_every_byte_arrived(
        lo in 0u64..1000,
        len in 1u64..4000,
        block in 1u64..700,
        order in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
    ) {
        let hi = lo + len;
        let mut rx = Receiver::range(3, (hi + 10, 0o600), lo, len, "r/f");
        prop_assert!(matches!(rx.poll(), Some(RxAction::Send(Msg::Ready { offset, .. })) if offset == lo), "no match");
        prop_assert!(matches!(rx.poll(), Some(RxAction::StartWriter)), "no match");
        let blocks: Vec<(u64, u32)> = (lo..hi)
            .step_by(block as usize)
            .map(|o| (o, (hi - o).min(block) as u32))
            .collect();
        let mut covered = vec![false; len as usize];
        for i in &order {
            let (offset, n) = *i.get(&blocks);
            rx.on_block(&BlockHeader { file_id: 3, stream: 0, offset, len: n, crc32c: 0, spans: false });
            prop_assert!(matches!(rx.poll(), Some(RxAction::Land)), "no match");
            for b in offset..offset + u64::from(n) {
                covered[(b - lo) as usize] = true;
            }
        }
        rx.handle(RxEvent::Msg(Msg::FileDone { file_id: 3, length: len, blake3: None }));
        prop_assert!(matches!(rx.poll(), Some(RxAction::Sync)), "no match");
        rx.handle(RxEvent::Synced(Ok(vec![])));
        prop_assert!(matches!(rx.poll(), Some(RxAction::Finish)), "no match");
        rx.handle(RxEvent::Finished { write_error: None, digest: None });
        if covered.iter().all(|&c| c) {
            prop_assert!(matches!(rx.poll(), Some(RxAction::Commit)), "no match");
            rx.handle(RxEvent::Committed(Ok(())));
            prop_assert!(matches!(rx.poll(), Some(RxAction::Send(Msg::Ok { file_id: 3 }))), "no match");
        } else {
            let refused = rx.poll();
            prop_assert!(matches!(&refused, Some(RxAction::Refuse { refusal, abandon: false }) if refusal.code == ErrorCode::Integrity), "{refused:?}");
        }
        prop_assert!(matches!(rx.poll(), Some(RxAction::Over)), "no match");
        prop_assert!(rx.is_over());
    }

    /// Blocks whose CRC failed are asked for again, at most BLOCK_RETRIES rounds; a round in
    /// which the client does not send them again does not pass for whole.
    #[test]
    fn bad_blocks_are_asked_again_then_refused(rounds in 1u32..6, resent in any::<bool>()) {
        let size = 300;
        let mut rx = Receiver::put(1, size, 0o644, "r/f");
        prop_assert!(matches!(rx.poll(), Some(RxAction::Claim)), "no match");
        rx.handle(RxEvent::Claimed(true));
        prop_assert!(matches!(rx.poll(), Some(RxAction::OpenPart)), "no match");
        rx.handle(RxEvent::Opened(Ok(0)));
        rx.poll();
        rx.poll();
        let h = |offset| BlockHeader { file_id: 1, stream: 0, offset, len: 100, crc32c: 0, spans: false };
        for o in [0, 100, 200] {
            rx.on_block(&h(o));
            rx.poll();
        }
        let done = || RxEvent::Msg(Msg::FileDone { file_id: 1, length: size, blake3: Some([1; 32]) });
        for round in 1..=rounds {
            rx.handle(done());
            prop_assert!(matches!(rx.poll(), Some(RxAction::Sync)), "no match");
            rx.handle(RxEvent::Synced(Ok(vec![(100, 100)])));
            let a = rx.poll();
            if round > ferry_xfer::BLOCK_RETRIES {
                prop_assert!(matches!(&a, Some(RxAction::Refuse { refusal, abandon: true }) if refusal.code == ErrorCode::Integrity), "{a:?}");
                return Ok(());
            }
            prop_assert!(matches!(&a, Some(RxAction::Send(Msg::Resend { ranges, .. })) if ranges == &[(100, 100)]), "{a:?}");
            if resent {
                rx.on_block(&h(100));
                prop_assert!(matches!(rx.poll(), Some(RxAction::Land)), "no match");
            }
        }
        rx.handle(done());
        rx.poll();
        rx.handle(RxEvent::Synced(Ok(vec![])));
        prop_assert!(matches!(rx.poll(), Some(RxAction::Finish)), "no match");
        rx.handle(RxEvent::Finished { write_error: None, digest: Some(Ok([1; 32])) });
        let a = rx.poll();
        if resent {
            prop_assert!(matches!(a, Some(RxAction::Commit)), "{a:?}");
        } else {
            prop_assert!(matches!(&a, Some(RxAction::Refuse { refusal, abandon: true }) if refusal.code == ErrorCode::Integrity), "{a:?}");
        }
    }
}

/// A PUT the server cannot claim, or whose part it cannot open, is refused without a part
/// to drop; a write error refuses it and drops the part; a hash mismatch too.
#[test]
fn refusals_say_whether_a_part_is_dropped() {
    let mut rx = Receiver::put(1, 10, 0o644, "r/f");
    rx.poll();
    rx.handle(RxEvent::Claimed(false));
    assert!(
        matches!(rx.poll(), Some(RxAction::Refuse { refusal, abandon: false }) if refusal.code == ErrorCode::Unavailable)
    );

    let to_finish = || {
        let mut rx = Receiver::put(1, 10, 0o644, "r/f");
        rx.poll();
        rx.handle(RxEvent::Claimed(true));
        rx.poll();
        rx.handle(RxEvent::Opened(Ok(4)));
        assert!(matches!(
            rx.poll(),
            Some(RxAction::Send(Msg::Ready { offset: 4, .. }))
        ));
        rx.poll();
        rx.on_block(&BlockHeader {
            file_id: 1,
            stream: 0,
            offset: 4,
            len: 6,
            crc32c: 0,
            spans: false,
        });
        rx.poll();
        rx.handle(RxEvent::Msg(Msg::FileDone {
            file_id: 1,
            length: 10,
            blake3: Some([2; 32]),
        }));
        rx.poll();
        rx.handle(RxEvent::Synced(Ok(vec![])));
        rx.poll();
        rx
    };
    let mut rx = to_finish();
    rx.handle(RxEvent::Finished {
        write_error: Some(std::io::Error::from_raw_os_error(28)),
        digest: None,
    });
    assert!(
        matches!(rx.poll(), Some(RxAction::Refuse { refusal, abandon: true }) if refusal.code == ErrorCode::NoSpace)
    );
    let mut rx = to_finish();
    rx.handle(RxEvent::Finished {
        write_error: None,
        digest: Some(Ok([3; 32])),
    });
    assert!(
        matches!(rx.poll(), Some(RxAction::Refuse { refusal, abandon: true }) if refusal.code == ErrorCode::Integrity)
    );
    let mut rx = to_finish();
    rx.handle(RxEvent::Finished {
        write_error: None,
        digest: Some(Ok([2; 32])),
    });
    assert!(matches!(rx.poll(), Some(RxAction::Commit)));
}

/// The client giving up (ERROR) drops the part; a connection failure keeps it (journal).
#[test]
fn giving_up_drops_the_part_and_a_cut_keeps_it() {
    let open = || {
        let mut rx = Receiver::put(1, 10, 0o644, "r/f");
        rx.poll();
        rx.handle(RxEvent::Claimed(true));
        rx.poll();
        rx.handle(RxEvent::Opened(Ok(0)));
        rx.poll();
        rx.poll();
        rx
    };
    let mut rx = open();
    rx.handle(RxEvent::Msg(Msg::Error {
        code: ErrorCode::Io,
        file_id: 1,
        message: "gone".into(),
    }));
    assert!(matches!(rx.poll(), Some(RxAction::Discard)));
    assert!(matches!(rx.poll(), Some(RxAction::Over)));
    let mut rx = open();
    rx.handle(RxEvent::Interrupted(ferry_xfer::XferError::conn("cut")));
    assert!(matches!(rx.poll(), Some(RxAction::Keep(_))));
    assert!(rx.poll().is_none() && rx.is_over());
}

/// CLOSE: a missing range keeps the part for a resume, a wrong length drops it, and only a
/// matching hash commits. PUT_FILE: only a payload matching its BLAKE3 is written.
#[test]
fn close_and_whole_file_verdicts() {
    use ferry_xfer::conv::upload::{check_whole, close_matches, close_ready};
    let code = |r: &ferry_xfer::server::Refusal| r.code;
    assert!(
        matches!(close_ready("f", false, 10, 10), Err((r, false)) if code(&r) == ErrorCode::Integrity)
    );
    assert!(
        matches!(close_ready("f", true, 9, 10), Err((r, true)) if code(&r) == ErrorCode::Integrity)
    );
    assert!(close_ready("f", true, 10, 10).is_ok());
    let h = *blake3::hash(b"abc").as_bytes();
    assert!(close_matches("f", Some(Ok(h)), Some(h)).is_ok());
    assert!(close_matches("f", Some(Ok(h)), None).is_err());
    assert!(close_matches("f", None, Some(h)).is_err());
    let io = close_matches(
        "f",
        Some(Err(std::io::Error::from_raw_os_error(5))),
        Some(h),
    );
    assert!(matches!(io, Err(r) if r.code == ErrorCode::Io));
    assert!(check_whole("f", b"abc", &h).is_ok());
    assert!(matches!(check_whole("f", b"abd", &h), Err(r) if r.code == ErrorCode::Integrity));
}

/// The PUT_FILE window: answers in request order, OK or OKS for a run; a damaged file goes
/// again by PUT, any other refusal or an answer to another file ends the upload.
#[test]
fn put_file_answers_come_in_order() {
    use ferry_xfer::conv::upload::{Committed, PutFiles};
    let mut w = PutFiles::default();
    for id in 1..=3 {
        w.sent(id, format!("f{id}"), u64::from(id) * 10);
    }
    assert!(w.over(0, (2, 1000)) && !w.over(0, (3, 1000)));
    assert!(w.over(0, (3, 59)) && !w.over(0, (3, 60)));
    // The newest two still in a PACK not sent yet: only the oldest counts.
    assert!(!w.over(2, (1, 10)) && w.over(2, (0, 10)) && !w.over(3, (0, 0)));
    // Nor may an answer name a file not sent yet.
    assert!(w.answer(Msg::Ok { file_id: 1 }, 3).is_err());
    let all_three = Msg::Oks {
        file_id: 3,
        count: 3,
    };
    assert!(w.answer(all_three, 1).is_err());
    let one = Committed {
        files: 1,
        bytes: 10,
    };
    assert_eq!(w.answer(Msg::Ok { file_id: 1 }, 0).unwrap(), one);
    let damaged = Msg::Error {
        code: ErrorCode::Integrity,
        file_id: 2,
        message: "bad".into(),
    };
    assert_eq!(w.answer(damaged, 0).unwrap(), Committed::default());
    assert!(w.answer(Msg::Ok { file_id: 9 }, 0).is_err());
    assert_eq!(w.answer(Msg::Ok { file_id: 3 }, 0).unwrap().bytes, 30);
    assert!(!w.over(0, (0, 0)));
    assert_eq!(w.again(), ["f2"]);
    // A run: its count and last file must be the oldest waiting.
    for id in 4..=7 {
        w.sent(id, format!("f{id}"), 1);
    }
    assert!(w
        .answer(
            Msg::Oks {
                file_id: 6,
                count: 2
            },
            0
        )
        .is_err());
    assert!(w
        .answer(
            Msg::Oks {
                file_id: 8,
                count: 5
            },
            0
        )
        .is_err());
    assert!(w
        .answer(
            Msg::Oks {
                file_id: 5,
                count: 0
            },
            0
        )
        .is_err());
    let run = w
        .answer(
            Msg::Oks {
                file_id: 6,
                count: 3,
            },
            0,
        )
        .unwrap();
    assert_eq!(run, Committed { files: 3, bytes: 3 });
    let full = Msg::Error {
        code: ErrorCode::NoSpace,
        file_id: 7,
        message: "full".into(),
    };
    assert!(w.answer(full, 0).is_err());
}
