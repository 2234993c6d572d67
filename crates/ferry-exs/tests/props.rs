//! Property tests: two connections exchange random traffic both ways through the simulated
//! fabric under random interleavings, random credits, sizes and rendezvous modes.

mod sim;

use ferry_exs::proto::{Config, EventKind, Flags};
use ferry_exs::ExsError;
use proptest::prelude::*;
use sim::{pattern, Sim, RECV};

/// Sizes from empty to 1 MiB, weighted towards the interesting small end around the
/// immediate threshold.
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 0usize..600,
        3 => 600usize..70_000,
        1 => 0usize..=1 << 20,
    ]
}

/// One direction's traffic: message sizes, and for each recv how much buffer it posts
/// (`None`: exactly enough or more; `Some(n)`: a short buffer).
fn traffic() -> impl Strategy<Value = Vec<(usize, Option<usize>, usize)>> {
    prop::collection::vec(
        (
            size(),
            prop::option::weighted(0.15, 0usize..2048),
            0usize..64,
        ),
        0..10,
    )
}

fn config(send_credits: u16, recv_credits: u16, small: u32, push: bool) -> Config {
    Config {
        send_credits,
        recv_credits,
        small_packet_max_size: small,
        push,
    }
}

/// Checks one direction: recv i got exactly the prefix of send i it had room for.
fn check_direction(sim: &Sim, from: usize, msgs: &[Vec<u8>], bufs: &[u64]) {
    let sends = sim.completions(from, EventKind::Send);
    let recvs = sim.completions(1 - from, EventKind::Recv);
    assert_eq!(sends.len(), msgs.len());
    assert_eq!(recvs.len(), msgs.len());
    for (i, msg) in msgs.iter().enumerate() {
        let want = msg.len().min(bufs[i] as usize);
        let r = &recvs[&(i as u64 | RECV)];
        assert_eq!(r.len, want as u64, "recv {i} length");
        let data = r.data.as_ref().expect("recv returns its buffer");
        assert_eq!(&data[..want], &msg[..want], "recv {i} bytes");
        assert!(
            data[want..].iter().all(|&b| b == 0xEE),
            "recv {i} written past the message"
        );
        let truncated = want < msg.len();
        let expected = if truncated {
            Err(ExsError::MessageSize)
        } else {
            Ok(())
        };
        assert_eq!(r.result, expected, "recv {i} result");
        let s = &sends[&(i as u64)];
        assert_eq!((s.result, s.len), (Ok(()), want as u64), "send {i}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn every_recv_gets_exactly_its_send_in_order(
        seed: u64,
        ab in traffic(),
        ba in traffic(),
        credits in (1u16..64, 1u16..64, 1u16..64, 1u16..64),
        small in prop_oneof![Just(0u32), 0u32..1024, Just(65_536u32)],
        push in (any::<bool>(), any::<bool>()),
        windows in (1usize..80, 1usize..80, 1usize..80, 1usize..80),
    ) {
        let a = config(credits.0, credits.1, small, push.0);
        let b = config(credits.2, credits.3, small / 2, push.1);
        let mut sim = Sim::new(seed, a, b);
        let mut expect = Vec::new();
        for (from, traffic, (sw, rw)) in [(0, &ab, (windows.0, windows.1)), (1, &ba, (windows.2, windows.3))] {
            let msgs: Vec<Vec<u8>> = traffic
                .iter()
                .enumerate()
                .map(|(i, &(len, _, _))| pattern(seed ^ (from as u64) << 40 ^ i as u64, len))
                .collect();
            let bufs: Vec<u64> = traffic
                .iter()
                .map(|&(len, short, slack)| short.map_or(len + slack, |s| s.min(len)) as u64)
                .collect();
            sim.plan_sends(from, msgs.clone(), Flags::NONE, sw);
            sim.plan_recvs(1 - from, bufs.clone(), rw);
            expect.push((from, msgs, bufs));
        }
        sim.run();
        sim.assert_quiescent();
        sim.assert_credits_restored();
        for (from, msgs, bufs) in &expect {
            check_direction(&sim, *from, msgs, bufs);
        }
        for side in &sim.sides {
            let c = side.conn.credits();
            prop_assert!(side.max_unsolicited_out <= i64::from(c.send_window));
        }
    }

    /// A link that flips, drops, duplicates and cuts frames under live traffic in every
    /// mode: neither side panics or touches memory outside its buffers, and after both close
    /// every operation has completed exactly once.
    #[test]
    fn a_corrupting_link_never_breaks_local_safety(
        seed: u64,
        one_in in 2u32..40,
        ab in traffic(),
        ba in traffic(),
        credits in 1u16..8,
        small in prop_oneof![Just(0u32), Just(300u32)],
        push: bool,
        persistent in 0u8..3,
    ) {
        let c = config(credits, credits, small, push);
        let mut sim = Sim::new(seed, c.clone(), c);
        sim.tamper = Some(one_in);
        match persistent {
            1 => {
                sim.send(0, 1000, &pattern(seed, 5000), Flags::PERSISTENT | Flags::NOTIFY_ON_READ, 0);
            }
            2 => {
                sim.recv(1, 1000, 5000, Flags::PERSISTENT, 0);
            }
            _ => {}
        }
        for (from, traffic) in [(0, &ab), (1, &ba)] {
            let msgs = traffic.iter().map(|&(len, _, _)| pattern(len as u64, len)).collect();
            let bufs = traffic.iter().map(|&(len, short, _)| short.unwrap_or(len) as u64).collect();
            sim.plan_sends(from, msgs, Flags::NONE, 4);
            sim.plan_recvs(1 - from, bufs, 4);
        }
        sim.run_steps(200_000);
        sim.close(0);
        sim.close(1);
        sim.tamper = None;
        sim.run();
        sim.assert_quiescent();
    }

    #[test]
    fn a_burst_larger_than_the_credits_stalls_and_still_delivers(
        seed: u64,
        credits in 1u16..16,
        extra in 1usize..40,
        push: bool,
        small in prop_oneof![Just(0u32), Just(256u32)],
    ) {
        let cfg = config(credits, credits, small, push);
        let mut sim = Sim::new(seed, cfg.clone(), cfg);
        let n = usize::from(credits) + extra;
        let msgs: Vec<Vec<u8>> = (0..n).map(|i| pattern(i as u64, (i * 37) % 700)).collect();
        // The whole burst is posted before the connection is even up.
        for (i, m) in msgs.iter().enumerate() {
            sim.send(0, i as u64, m, Flags::NONE, 0);
        }
        let lens: Vec<u64> = msgs.iter().map(|m| m.len() as u64).collect();
        sim.plan_recvs(1, lens.clone(), n);
        sim.run();
        sim.assert_quiescent();
        sim.assert_credits_restored();
        check_direction(&sim, 0, &msgs, &lens);
        let stats = sim.sides[0].conn.stats();
        prop_assert!(stats.credit_stalls >= 1, "{stats:?}");
        prop_assert_eq!(sim.sides[1].conn.stats().credit_stalls, 0);
    }
}
