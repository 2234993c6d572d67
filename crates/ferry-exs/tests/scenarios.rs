//! Scenario tests: every transfer mode, persistent blocks and offsets at their edges,
//! truncation, misuse, version refusal, protocol violations and closing with work pending.

mod sim;

use ferry_exs::proto::wire::{self, Frame};
use ferry_exs::proto::{Config, EventKind, Flags, RemoteSlice};
use ferry_exs::ExsError;
use sim::{pattern, Rec, Sim, RECV};

const NONE: Flags = Flags::NONE;
const PERSISTENT: Flags = Flags::PERSISTENT;
const NOTIFY: Flags = Flags::NOTIFY_ON_READ;

fn cfg(small: u32, push: bool) -> Config {
    Config {
        small_packet_max_size: small,
        push,
        ..Config::default()
    }
}

fn connected(seed: u64, c: Config) -> Sim {
    let mut sim = Sim::new(seed, c.clone(), c);
    sim.run();
    sim
}

fn one(sim: &Sim, side: usize, kind: EventKind, ctx: u64) -> Rec {
    sim.completions(side, kind)
        .remove(&ctx)
        .unwrap_or_else(|| panic!("no {kind:?} event for ctx {ctx:#x} at side {side}"))
}

fn events(sim: &Sim, side: usize, kind: EventKind) -> Vec<Rec> {
    sim.sides[side]
        .events
        .iter()
        .filter(|r| r.kind == kind)
        .cloned()
        .collect()
}

/// Three modes (pull, immediate, push) and both persistent directions move the same bytes.
#[test]
fn every_transfer_mode_delivers_identical_bytes() {
    let data = pattern(7, 3000);
    for seed in 0..8 {
        for (small, push) in [(0, false), (4096, false), (0, true)] {
            let mut sim = Sim::new(seed, cfg(small, push), cfg(small, push));
            sim.send(0, 1, &data, NONE, 0);
            sim.recv(1, 1, 4000, NONE, 0);
            sim.run();
            sim.assert_quiescent();
            sim.assert_credits_restored();
            let r = one(&sim, 1, EventKind::Recv, 1 | RECV);
            assert_eq!((r.result, r.len), (Ok(()), 3000));
            assert_eq!(&r.data.unwrap()[..3000], &data[..]);
            let st = sim.sides[0].conn.stats();
            let used = [st.adverts, st.immediates, st.pushes];
            let want = match (small, push) {
                (0, false) => [1, 0, 0],
                (_, false) => [0, 1, 0],
                _ => [0, 0, 1],
            };
            assert_eq!(used, want, "small={small} push={push}");
        }

        // Persistent send: the reader pulls from the exposed block.
        let mut sim = connected(seed, cfg(0, false));
        sim.send(0, 1, &data, PERSISTENT, 0);
        sim.recv(1, 1, 3000, NONE, 0);
        sim.run();
        assert_eq!(one(&sim, 1, EventKind::Recv, 1 | RECV).data.unwrap(), data);

        // Persistent recv: the sender writes into the block, before and after knowing it.
        for block_first in [true, false] {
            let mut sim = connected(seed, cfg(0, false));
            let block = if block_first {
                let b = sim.recv(1, 1, 3000, PERSISTENT, 0);
                sim.run();
                sim.send(0, 1, &data, NONE, 0);
                b
            } else {
                sim.send(0, 1, &data, NONE, 0);
                sim.run_steps(2);
                sim.recv(1, 1, 3000, PERSISTENT, 0)
            };
            sim.run();
            assert_eq!(one(&sim, 0, EventKind::Send, 1).result, Ok(()));
            assert_eq!(sim.mem(block.key), &data[..]);
            assert!(sim.sides[1]
                .events
                .iter()
                .all(|e| e.kind == EventKind::Connect));
            let writes = sim.sides[0].conn.stats().block_writes;
            assert_eq!(writes, u64::from(block_first));
        }
    }
}

/// The double-buffered transaction pattern: the sender changes its block between reads and
/// learns of each read; recv offsets address the block up to and past its edges.
#[test]
fn persistent_send_is_read_repeatedly_with_notifications_and_offsets() {
    for seed in 0..6 {
        let mut sim = connected(seed, cfg(64, false));
        let block = sim.send(0, 9, &pattern(0, 100), PERSISTENT | NOTIFY, 0);
        for round in 1..=3u64 {
            let fresh = pattern(round, 100);
            sim.mem_mut(block.key).copy_from_slice(&fresh);
            sim.recv(1, round, 100, NONE, 0);
            sim.run();
            assert_eq!(
                one(&sim, 1, EventKind::Recv, round | RECV).data.unwrap(),
                fresh
            );
            let notes = events(&sim, 0, EventKind::ReadNotify);
            assert_eq!(notes.len() as u64, round);
            assert!(notes.iter().all(|n| n.ctx == 9 && n.len == 100));
        }
        let content = sim.mem(block.key).to_vec();
        // (offset, buffer) -> expected bytes read or error.
        let cases: [(u64, u64, Result<std::ops::Range<usize>, ExsError>); 6] = [
            (0, 10, Ok(0..10)),
            (90, 10, Ok(90..100)),
            (95, 10, Ok(95..100)),
            (100, 10, Ok(100..100)),
            (101, 10, Err(ExsError::OffsetOutOfRange)),
            (u64::MAX, 1, Err(ExsError::OffsetOutOfRange)),
        ];
        for (i, (offset, len, want)) in cases.iter().enumerate() {
            let ctx = 100 + i as u64;
            sim.recv(1, ctx, *len, NONE, *offset);
            sim.run();
            let r = one(&sim, 1, EventKind::Recv, ctx | RECV);
            match want {
                Ok(range) => {
                    assert_eq!((r.result, r.len), (Ok(()), range.len() as u64));
                    assert_eq!(&r.data.unwrap()[..range.len()], &content[range.clone()]);
                }
                Err(e) => assert_eq!(r.result, Err(*e)),
            }
        }
        assert_eq!(events(&sim, 0, EventKind::ReadNotify).len(), 3 + 4);
        // The block stays posted until close, which hands it back.
        assert!(!sim.sides[0].conn.is_idle());
        sim.close(0);
        sim.run();
        sim.assert_quiescent();
        assert_eq!(
            one(&sim, 0, EventKind::Send, 9).result,
            Err(ExsError::Canceled)
        );
    }
}

/// Sends land in the peer's persistent block at their offsets; out-of-range ones fail and
/// write nothing, whether the sender knew the block (RMA write) or not (advert placed by the
/// receiver), for every rendezvous mode.
#[test]
fn persistent_recv_places_sends_at_offsets_and_rejects_out_of_range() {
    let sends: [(u64, usize, Result<(), ExsError>); 6] = [
        (0, 10, Ok(())),
        (90, 10, Ok(())),
        (100, 0, Ok(())),
        (40, 30, Ok(())),
        (101, 0, Err(ExsError::OffsetOutOfRange)),
        (95, 10, Err(ExsError::MessageSize)),
    ];
    for seed in 0..6 {
        for (small, push) in [(0, false), (64, false), (0, true)] {
            for block_first in [true, false] {
                let mut sim = connected(seed, cfg(small, push));
                let block = if block_first {
                    let b = sim.recv(1, 0, 100, PERSISTENT, 0);
                    sim.run();
                    Some(b)
                } else {
                    None
                };
                for (i, (offset, len, _)) in sends.iter().enumerate() {
                    sim.send(0, i as u64, &pattern(i as u64, *len), NONE, *offset);
                }
                let block = block.unwrap_or_else(|| {
                    sim.run_steps(5);
                    sim.recv(1, 0, 100, PERSISTENT, 0)
                });
                sim.run();
                let mut want = [0xEE; 100];
                for (i, (offset, len, result)) in sends.iter().enumerate() {
                    let s = one(&sim, 0, EventKind::Send, i as u64);
                    assert_eq!(s.result, *result, "send {i} small={small} push={push}");
                    if result.is_ok() {
                        let at = *offset as usize;
                        want[at..at + len].copy_from_slice(&pattern(i as u64, *len));
                    }
                }
                assert_eq!(sim.mem(block.key), &want[..]);
                assert!(events(&sim, 1, EventKind::Recv).is_empty());
                sim.close(1);
                sim.run();
                sim.assert_quiescent();
                let r = one(&sim, 1, EventKind::Recv, RECV);
                assert_eq!(r.result, Err(ExsError::Canceled));
            }
        }
    }
}

/// A short recv buffer gets the prefix and a truncation error; the stream goes on.
#[test]
fn truncation_writes_only_the_prefix_and_the_next_message_still_matches() {
    for seed in 0..8 {
        for (small, push) in [(0, false), (2048, false), (0, true)] {
            let mut sim = Sim::new(seed, cfg(small, push), cfg(small, push));
            let big = pattern(1, 1000);
            let next = pattern(2, 50);
            sim.send(0, 0, &big, NONE, 0);
            sim.send(0, 1, &next, NONE, 0);
            sim.recv(1, 0, 300, NONE, 0);
            sim.recv(1, 1, 50, NONE, 0);
            sim.run();
            sim.assert_quiescent();
            sim.assert_credits_restored();
            let r = one(&sim, 1, EventKind::Recv, RECV);
            assert_eq!((r.result, r.len), (Err(ExsError::MessageSize), 300));
            assert_eq!(r.data.unwrap(), &big[..300]);
            assert_eq!(one(&sim, 1, EventKind::Recv, 1 | RECV).data.unwrap(), next);
            let s = one(&sim, 0, EventKind::Send, 0);
            assert_eq!((s.result, s.len), (Ok(()), 300));
        }
    }
}

/// One side of a direction must drive: persistent on both ends fails clearly, whichever
/// order things happen in, and the surviving persistent end keeps working.
#[test]
fn both_sides_persistent_is_refused() {
    for seed in 0..8 {
        // The block is known to the sender: its persistent send fails at once.
        let mut sim = connected(seed, cfg(0, false));
        sim.recv(1, 0, 64, PERSISTENT, 0);
        sim.run();
        sim.send(0, 1, &pattern(1, 64), PERSISTENT, 0);
        assert_eq!(
            one(&sim, 0, EventKind::Send, 1).result,
            Err(ExsError::BothPersistent)
        );

        // Crossing: both posted before either hears of the other. The recv block wins.
        let mut sim = connected(seed, cfg(0, false));
        sim.send(0, 1, &pattern(1, 64), PERSISTENT, 0);
        let block = sim.recv(1, 0, 64, PERSISTENT, 0);
        sim.run();
        assert_eq!(
            one(&sim, 0, EventKind::Send, 1).result,
            Err(ExsError::BothPersistent)
        );
        let data = pattern(2, 64);
        sim.send(0, 2, &data, NONE, 0);
        sim.run();
        assert_eq!(one(&sim, 0, EventKind::Send, 2).result, Ok(()));
        assert_eq!(sim.mem(block.key), &data[..]);
        sim.close(0);
        sim.run();
        sim.assert_quiescent();

        // The peer's block already served a recv: a persistent recv after it fails.
        let mut sim = connected(seed, cfg(0, false));
        sim.send(0, 1, &pattern(1, 64), PERSISTENT, 0);
        sim.recv(1, 0, 64, NONE, 0);
        sim.recv(1, 1, 64, PERSISTENT, 0);
        sim.run();
        let r = one(&sim, 1, EventKind::Recv, 1 | RECV);
        assert_eq!(r.result, Err(ExsError::BothPersistent));
        assert_eq!(r.result.unwrap_err().errno(), libc_einval());
        sim.recv(1, 2, 64, NONE, 0);
        sim.run();
        assert_eq!(one(&sim, 1, EventKind::Recv, 2 | RECV).result, Ok(()));
    }
}

fn libc_einval() -> i32 {
    ExsError::InvalidFlags.errno()
}

/// Arguments that can never work are refused with a specific error, and the connection
/// goes on.
#[test]
fn misuse_is_reported_per_operation() {
    let mut sim = connected(1, cfg(0, false));
    sim.send(0, 1, b"x", NOTIFY, 0);
    sim.send(0, 2, b"x", PERSISTENT, 5);
    sim.recv(1, 1, 8, NOTIFY, 0);
    sim.recv(1, 2, 8, PERSISTENT, 3);
    sim.run();
    assert_eq!(
        one(&sim, 0, EventKind::Send, 1).result,
        Err(ExsError::InvalidFlags)
    );
    assert_eq!(
        one(&sim, 0, EventKind::Send, 2).result,
        Err(ExsError::InvalidFlags)
    );
    assert_eq!(
        one(&sim, 1, EventKind::Recv, 1 | RECV).result,
        Err(ExsError::InvalidFlags)
    );
    assert_eq!(
        one(&sim, 1, EventKind::Recv, 2 | RECV).result,
        Err(ExsError::InvalidFlags)
    );

    // A buffer the peer cannot reach cannot be pulled from.
    let buf = sim.alloc(0, &[1; 100], false);
    sim.send_buf(0, 3, buf, NONE, 0);
    assert_eq!(
        one(&sim, 0, EventKind::Send, 3).result,
        Err(ExsError::NotRemoteAccessible)
    );

    // Offsets only make sense against a persistent peer; the message waits for a plain recv.
    let msg = pattern(4, 20);
    sim.send(0, 4, &msg, NONE, 0);
    sim.recv(1, 4, 20, NONE, 7);
    sim.recv(1, 5, 20, NONE, 0);
    sim.run();
    assert_eq!(
        one(&sim, 1, EventKind::Recv, 4 | RECV).result,
        Err(ExsError::NotPersistent)
    );
    assert_eq!(one(&sim, 1, EventKind::Recv, 5 | RECV).data.unwrap(), msg);
    sim.send(0, 5, &msg, NONE, 7);
    sim.send(0, 6, &msg, NONE, 0);
    sim.recv(1, 6, 20, NONE, 0);
    sim.run();
    assert_eq!(
        one(&sim, 0, EventKind::Send, 5).result,
        Err(ExsError::NotPersistent)
    );
    assert_eq!(one(&sim, 1, EventKind::Recv, 6 | RECV).data.unwrap(), msg);

    // After a persistent operation nothing later in that direction could match.
    sim.send(0, 7, &msg, PERSISTENT, 0);
    sim.send(0, 8, &msg, NONE, 0);
    sim.run();
    assert_eq!(
        one(&sim, 0, EventKind::Send, 8).result,
        Err(ExsError::AfterPersistent)
    );
    sim.recv(0, 9, 20, PERSISTENT, 0);
    sim.recv(0, 10, 20, NONE, 0);
    assert_eq!(
        one(&sim, 0, EventKind::Recv, 10 | RECV).result,
        Err(ExsError::AfterPersistent)
    );
    sim.close(0);
    sim.run();
    sim.assert_quiescent();
    sim.send(0, 11, &msg, NONE, 0);
    assert_eq!(
        one(&sim, 0, EventKind::Send, 11).result,
        Err(ExsError::NotConnected)
    );
}

/// A connector's early first message crosses right behind its HELLO, before the peer's
/// has come (the peer needs nothing new: it takes HELLO, then the ADVERT, in order), and
/// the credit it spent is accounted once the windows are agreed.
#[test]
fn an_early_first_message_crosses_with_the_handshake() {
    let data = pattern(5, 300);
    for seed in 0..8 {
        let mut sim = Sim::new(seed, cfg(512, false), cfg(512, false));
        sim.send_early(0, 1, &data);
        // Before anything arrives, the HELLO and the message's ADVERT are both on the link.
        let frames = sim.take_link(1);
        let kinds: Vec<_> = frames
            .iter()
            .map(|f| std::mem::discriminant(&wire::decode(f).unwrap().frame))
            .collect();
        assert_eq!(
            kinds.len(),
            2,
            "seed {seed}: HELLO and ADVERT, nothing else"
        );
        for f in &frames {
            sim.inject(1, f);
        }
        sim.recv(1, 1, 1000, NONE, 0);
        sim.send(0, 2, &data[..10], NONE, 0);
        sim.recv(1, 2, 1000, NONE, 0);
        sim.run();
        sim.assert_quiescent();
        sim.assert_credits_restored();
        let r = one(&sim, 1, EventKind::Recv, 1 | RECV);
        assert_eq!((r.result, r.len), (Ok(()), 300));
        assert_eq!(&r.data.unwrap()[..300], &data[..]);
        assert_eq!(one(&sim, 0, EventKind::Send, 1).result, Ok(()));
        assert_eq!(one(&sim, 1, EventKind::Recv, 2 | RECV).len, 10);
        assert_eq!(sim.sides[0].conn.stats().immediates, 2);
    }
    // Too long for this side's immediate size, or not the first: a plain send.
    let mut sim = Sim::new(1, cfg(64, false), cfg(4096, false));
    sim.send_early(0, 1, &data);
    assert_eq!(
        sim.take_link(1).len(),
        1,
        "only the HELLO before the peer's"
    );
}

/// A peer whose immediate size cannot hold the early message: the connector fails with
/// MessageSize as soon as the peer's HELLO shows it, the peer refuses the frame, and
/// neither side panics or delivers it.
#[test]
fn an_early_message_the_peer_cannot_take_fails_the_connection() {
    let data = pattern(6, 300);
    let mut sim = Sim::new(2, cfg(512, false), cfg(100, false));
    sim.send_early(0, 1, &data);
    sim.recv(1, 1, 1000, NONE, 0);
    sim.run();
    assert_eq!(
        one(&sim, 0, EventKind::Close, 0).result,
        Err(ExsError::MessageSize)
    );
    assert_eq!(
        one(&sim, 0, EventKind::Send, 1).result,
        Err(ExsError::MessageSize)
    );
    assert!(one(&sim, 1, EventKind::Recv, 1 | RECV).result.is_err());
}

/// A HELLO of another major version is refused with a clear error on both sides.
#[test]
fn another_major_version_is_refused() {
    let mut sim = Sim::new(3, Config::default(), Config::default());
    sim.recv(1, 0, 10, NONE, 0);
    let mut hello = sim.take_link(1).remove(0);
    // Body offset 4: the major version, frozen across versions.
    hello[wire::HEADER_LEN + 4..wire::HEADER_LEN + 6].copy_from_slice(&2u16.to_le_bytes());
    sim.inject(1, &hello);
    let refused = ExsError::VersionMismatch {
        peer_major: 2,
        our_major: wire::VERSION_MAJOR,
    };
    assert_eq!(one(&sim, 1, EventKind::Close, 0).result, Err(refused));
    assert_eq!(refused.errno(), 93, "EPROTONOSUPPORT");
    assert!(refused.to_string().contains("2.x"));
    assert_eq!(one(&sim, 1, EventKind::Recv, RECV).result, Err(refused));
    // The refusal reaches the other side as a CLOSE naming the refusing side's version.
    let frames = sim.take_link(0);
    let last = wire::decode(frames.last().unwrap()).unwrap();
    assert!(matches!(
        last.frame,
        Frame::Close {
            reason: wire::CLOSE_VERSION,
            major: 1,
            ..
        }
    ));
    for f in &frames {
        sim.inject(0, f);
    }
    let r = one(&sim, 0, EventKind::Close, 0).result;
    assert!(matches!(r, Err(ExsError::VersionMismatch { .. })), "{r:?}");
    assert!(!sim.sides[0].conn.is_connected());
}

/// Bytes that break the protocol close the connection with EPROTO, and the peer hears why.
#[test]
fn protocol_violations_close_the_connection() {
    let advert = |id: u64| {
        let mut b = Vec::new();
        let remote = RemoteSlice {
            addr: 1 << 40,
            len: 10,
            key: 99,
        };
        let frame = Frame::Advert {
            id,
            flags: 0,
            offset: 0,
            remote,
        };
        wire::encode(&frame, 0, 0, &mut b);
        b
    };
    let garbage: Vec<Vec<u8>> = vec![
        vec![],
        vec![1, 2, 3],
        vec![9, 0, 0, 0, 200, 0, 0, 0, 0],
        {
            // More unsolicited frames than the window (16) allows.
            let mut many = Vec::new();
            for id in 0..17 {
                many.extend(advert(id));
            }
            many
        },
        {
            let mut b = Vec::new();
            wire::encode(
                &Frame::Ack {
                    id: 77,
                    len: 0,
                    status: Ok(()),
                },
                0,
                0,
                &mut b,
            );
            b
        },
        {
            let mut b = Vec::new();
            wire::encode(&Frame::Credit, 16, 0, &mut b);
            b
        },
    ];
    for (i, bad) in garbage.iter().enumerate() {
        let mut sim = connected(i as u64, Config::default());
        sim.send(1, 5, &pattern(5, 5000), NONE, 0);
        sim.recv(1, 6, 10, NONE, 0);
        sim.run_steps(1);
        if i == 3 {
            // Feed the adverts one frame at a time.
            for chunk in bad.chunks(wire::frame_len(bad).unwrap()) {
                sim.inject(1, chunk);
            }
        } else {
            sim.inject(1, bad);
        }
        let close = one(&sim, 1, EventKind::Close, 0);
        assert_eq!(close.result, Err(ExsError::Protocol), "case {i}");
        assert_eq!(close.result.unwrap_err().errno(), 71, "EPROTO");
        sim.run();
        assert_eq!(
            one(&sim, 0, EventKind::Close, 0).result,
            Err(ExsError::Protocol)
        );
        assert!(sim.violations.is_empty(), "{:?}", sim.violations);
        sim.assert_quiescent();
        for e in &sim.sides[1].events {
            assert!(e.kind == EventKind::Connect || e.result.is_err(), "{e:?}");
        }
    }
}

/// Closing with work everywhere (queued for credit, advertised, mid-RMA, mid-push) completes
/// every operation exactly once, and buffers come back only when nothing can touch them.
#[test]
fn close_completes_every_pending_operation() {
    for seed in 0..40 {
        for (small, push) in [(0, false), (128, false), (0, true)] {
            let c = Config {
                send_credits: 2,
                recv_credits: 2,
                small_packet_max_size: small,
                push,
            };
            let mut sim = Sim::new(seed, c.clone(), c);
            let msgs: Vec<Vec<u8>> = (0..12)
                .map(|i| pattern(i, (i as usize * 97) % 400))
                .collect();
            sim.plan_sends(0, msgs.clone(), NONE, 12);
            sim.plan_recvs(1, vec![400; 6], 6);
            sim.plan_sends(1, msgs, NONE, 3);
            sim.plan_recvs(0, vec![400; 12], 2);
            sim.run_steps(seed as usize * 3);
            let closer = (seed % 2) as usize;
            sim.close(closer);
            sim.run();
            sim.assert_quiescent();
            let reset = Err(ExsError::PeerClosed);
            assert_eq!(one(&sim, closer, EventKind::Close, 0).result, Ok(()));
            assert_eq!(one(&sim, 1 - closer, EventKind::Close, 0).result, reset);
            // The simulated users keep posting after the close: those fail at once.
            let late = Err(ExsError::NotConnected);
            for e in &sim.sides[closer].events {
                let ok = e.result.is_ok() || e.result == late;
                assert!(ok || e.result == Err(ExsError::Canceled), "{e:?}");
            }
            // The peer's transfers may also fail first: the closed side's endpoint is gone.
            for e in &sim.sides[1 - closer].events {
                let ok = e.result.is_ok() || e.result == reset || e.result == late;
                assert!(ok || e.result == Err(ExsError::Transfer), "{e:?}");
            }
        }
    }
}

/// A failed RMA fails that one transfer at both ends and nothing else.
#[test]
fn rma_failures_fail_exactly_their_transfer_at_both_ends() {
    let mut total_failed = 0;
    for seed in 0..30 {
        let push = seed % 2 == 1;
        let mut sim = Sim::new(seed, cfg(32, push), cfg(32, push));
        sim.fail_rma = Some(3);
        let msgs: Vec<Vec<u8>> = (0..20)
            .map(|i| pattern(i, (i as usize * 61) % 300))
            .collect();
        sim.plan_sends(0, msgs.clone(), NONE, 5);
        sim.plan_recvs(1, vec![300; 20], 5);
        sim.run();
        sim.assert_quiescent();
        sim.assert_credits_restored();
        let (sends, recvs) = (
            sim.completions(0, EventKind::Send),
            sim.completions(1, EventKind::Recv),
        );
        let mut failed = 0;
        for (i, m) in msgs.iter().enumerate() {
            let (s, r) = (&sends[&(i as u64)], &recvs[&(i as u64 | RECV)]);
            assert_eq!(s.result, r.result, "message {i}");
            match r.result {
                Ok(()) => assert_eq!(&r.data.as_ref().unwrap()[..m.len()], &m[..]),
                Err(e) => {
                    assert_eq!((e, r.len, s.len), (ExsError::Transfer, 0, 0));
                    failed += 1;
                }
            }
        }
        assert!(failed < msgs.len());
        total_failed += failed;
    }
    assert!(total_failed > 30, "{total_failed}");
}

/// 100,000 small messages with a posting window far above the credits: nothing lost,
/// reordered or stuck, credits restored, stalls counted.
#[test]
fn a_hundred_thousand_small_messages() {
    let c = Config {
        send_credits: 8,
        recv_credits: 8,
        small_packet_max_size: 64,
        push: false,
    };
    let mut sim = Sim::new(42, c.clone(), c);
    let n = 100_000u64;
    let msgs: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            // Mostly immediates, every 16th just over the limit so it is pulled.
            let len = if i % 16 == 0 { 65 + (i % 7) } else { i % 65 };
            let mut m = vec![0u8; len as usize];
            for (j, b) in m.iter_mut().enumerate() {
                *b = (i as usize + j) as u8;
            }
            m
        })
        .collect();
    sim.plan_sends(0, msgs.clone(), NONE, 64);
    sim.plan_recvs(1, vec![80; n as usize], 48);
    sim.run();
    sim.assert_quiescent();
    sim.assert_credits_restored();
    let recvs = sim.completions(1, EventKind::Recv);
    assert_eq!(recvs.len() as u64, n);
    for (i, m) in msgs.iter().enumerate() {
        let r = &recvs[&(i as u64 | RECV)];
        assert_eq!(r.result, Ok(()));
        assert_eq!(&r.data.as_ref().unwrap()[..m.len()], &m[..], "message {i}");
    }
    let st = sim.sides[0].conn.stats();
    assert_eq!(st.immediates + st.adverts, n);
    assert!(st.credit_stalls > 0, "{st:?}");
    assert!(sim.sides[0].max_unsolicited_out <= 8);
}
