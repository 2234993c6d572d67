//! A seeded simulation of the collective session machine: several ranks make the same
//! collective calls in random interleavings, sometimes a different call (a mismatch),
//! sometimes a rank vanishes mid-collective or goes silent. Checked after every event:
//! answers go only to ranks waiting, each once; a call runs only when every rank made it;
//! a mismatch fails every rank; after a rank is lost nobody is left waiting, and every
//! later call fails at once; a silent rank fails the others once the timeout passed.
//! `CIO_SIM_SEEDS=N` runs more seeds.

use std::time::{Duration, Instant};

use ferry_cio::session::{CallKind, Output, Rank, Session, Work};
use ferry_cio::view::Extent;
use ferry_cio::ErrorClass;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TIMEOUT: Duration = Duration::from_secs(30);

/// The calls every rank makes, in order.
fn script(rng: &mut StdRng) -> Vec<CallKind> {
    let kinds = [
        CallKind::SetView,
        CallKind::WriteAtAll,
        CallKind::ReadAtAll,
        CallKind::SetSize,
        CallKind::Sync,
    ];
    let mut s = vec![CallKind::Open];
    for _ in 0..rng.random_range(3..12) {
        s.push(kinds[rng.random_range(0..kinds.len())]);
    }
    s.push(CallKind::Close);
    s
}

/// What rank `r` of `size` brings to `kind`: writes are disjoint across ranks.
fn work(kind: CallKind, r: Rank, size: Rank) -> Work {
    let ext = |i: u64| Extent {
        file: (i * u64::from(size) + u64::from(r)) * 4,
        len: 4,
    };
    match kind {
        CallKind::Open => Work::Value(8),
        CallKind::SetSize | CallKind::Preallocate => Work::Value(64),
        CallKind::WriteAtAll => Work::Write {
            extents: (0..3).map(ext).collect::<Vec<_>>().into(),
            data: vec![r as u8; 12],
        },
        CallKind::ReadAtAll => Work::Read {
            extents: (0..3).map(ext).collect::<Vec<_>>().into(),
        },
        _ => Work::Nothing,
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum St {
    Ready,
    Waiting(CallKind),
    Dead,
    Done,
}

/// What one simulation saw: calls run, calls failed with a mismatch, sessions lost.
#[derive(Default)]
struct Seen {
    runs: usize,
    not_same: usize,
    lost: usize,
}

fn simulate(seed: u64, seen: &mut Seen) {
    let mut rng = StdRng::seed_from_u64(seed);
    let size: Rank = rng.random_range(1..=6);
    let calls = script(&mut rng);
    let t0 = Instant::now();
    let mut now = t0;
    let mut s = Session::new(size, TIMEOUT);
    let mut st = vec![St::Ready; size as usize];
    let mut next = vec![0usize; size as usize];
    // When the first rank arrived at the call in progress.
    let mut started: Option<Instant> = None;
    let mut lost = false;

    for _ in 0..10_000 {
        if st.iter().all(|x| matches!(x, St::Dead | St::Done)) {
            break;
        }
        let roll = rng.random_range(0..100);
        let r = rng.random_range(0..size);
        let outs = if roll < 3 {
            // A rank vanishes (its connection ends), maybe mid-collective.
            if st[r as usize] == St::Dead {
                continue;
            }
            let was_waiting = matches!(st[r as usize], St::Waiting(_));
            st[r as usize] = St::Dead;
            let outs = s.gone(r);
            let outs = apply(&outs, &mut st, &mut next, &calls, &mut lost, seen);
            if !was_waiting && !s.is_over() {
                panic!("seed {seed}: a rank left outside a call and the session lives on");
            }
            if !was_waiting {
                assert!(
                    st.iter().all(|x| !matches!(x, St::Waiting(_))),
                    "seed {seed}: ranks still waiting after rank {r} left: {st:?}"
                );
            }
            outs
        } else if roll < 8 {
            // Time passes.
            now += Duration::from_secs(rng.random_range(1..20));
            let outs = s.tick(now);
            let outs = apply(&outs, &mut st, &mut next, &calls, &mut lost, seen);
            if let Some(t) = started {
                if st.iter().any(|x| matches!(x, St::Waiting(_))) {
                    assert!(
                        now.duration_since(t) < TIMEOUT,
                        "seed {seed}: ranks still waiting past the timeout: {st:?}"
                    );
                }
            }
            outs
        } else {
            if st[r as usize] != St::Ready {
                continue;
            }
            let mut kind = calls[next[r as usize]];
            if rng.random_range(0..100) < 3 {
                // A mismatch: this rank makes another call.
                kind = if kind == CallKind::Sync {
                    CallKind::SetView
                } else {
                    CallKind::Sync
                };
            }
            st[r as usize] = St::Waiting(kind);
            let outs = s.arrive(r, kind, Ok(work(kind, r, size)), now);
            let broken_before = lost;
            let outs = apply(&outs, &mut st, &mut next, &calls, &mut lost, seen);
            if broken_before {
                assert!(
                    !matches!(st[r as usize], St::Waiting(_)),
                    "seed {seed}: a call on a lost session waits"
                );
            }
            outs
        };
        let _ = outs;
        if st.iter().any(|x| matches!(x, St::Waiting(_))) {
            started.get_or_insert(now);
        } else {
            started = None;
        }
    }
    // Whatever is left waiting is released once the timeout passes.
    now += TIMEOUT;
    let outs = s.tick(now);
    apply(&outs, &mut st, &mut next, &calls, &mut lost, seen);
    assert!(
        st.iter().all(|x| !matches!(x, St::Waiting(_))),
        "seed {seed}: ranks left waiting at the end: {st:?}"
    );
}

/// Applies the machine's outputs to the ranks, checking each.
fn apply(
    outs: &[Output],
    st: &mut [St],
    next: &mut [usize],
    calls: &[CallKind],
    lost: &mut bool,
    seen: &mut Seen,
) -> usize {
    for o in outs {
        match o {
            Output::Run { kind, .. } => {
                seen.runs += 1;
                // Every rank made this very call (a rank that vanished after making it
                // counts).
                for (r, x) in st.iter().enumerate() {
                    match x {
                        St::Waiting(k) => assert_eq!(k, kind, "rank {r} ran another call"),
                        St::Dead => {}
                        other => panic!("call {kind:?} ran without rank {r} ({other:?})"),
                    }
                }
                for (r, x) in st.iter_mut().enumerate() {
                    if let St::Waiting(_) = x {
                        next[r] += 1;
                        *x = if next[r] == calls.len() {
                            St::Done
                        } else {
                            St::Ready
                        };
                    }
                }
            }
            Output::Fail { ranks, error } => {
                if error.class == ErrorClass::RankLost {
                    *lost = true;
                    seen.lost += 1;
                }
                if error.class == ErrorClass::NotSame {
                    seen.not_same += 1;
                }
                for &r in ranks {
                    let r = r as usize;
                    if st[r] == St::Dead {
                        continue; // it vanished after making the call
                    }
                    assert!(
                        matches!(st[r], St::Waiting(_)),
                        "a failure for rank {r}, not waiting ({:?})",
                        st[r]
                    );
                    // A failed call is over for the rank; it moves on (a lost session fails
                    // every later call too).
                    next[r] += 1;
                    st[r] = if next[r] >= calls.len() {
                        St::Done
                    } else {
                        St::Ready
                    };
                }
            }
        }
    }
    outs.len()
}

#[test]
fn seeded_interleavings() {
    let seeds = std::env::var("CIO_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300u64);
    let mut seen = Seen::default();
    for seed in 0..seeds {
        simulate(seed, &mut seen);
    }
    // The simulation is not degenerate: calls ran, mismatches and lost ranks happened.
    assert!(
        seen.runs > seeds as usize && seen.not_same > 0 && seen.lost > 0,
        "runs {} mismatches {} lost {}",
        seen.runs,
        seen.not_same,
        seen.lost
    );
}

#[test]
fn a_mismatch_fails_every_rank_together() {
    let now = Instant::now();
    let mut s = Session::new(3, TIMEOUT);
    assert!(s
        .arrive(0, CallKind::Sync, Ok(Work::Nothing), now)
        .is_empty());
    assert!(s
        .arrive(1, CallKind::SetView, Ok(Work::Nothing), now)
        .is_empty());
    let out = s.arrive(2, CallKind::Sync, Ok(Work::Nothing), now);
    assert!(
        matches!(&out[..], [Output::Fail { ranks, error }] if ranks == &[0, 1, 2] && error.class == ErrorClass::NotSame),
        "{out:?}"
    );
}
