//! Seeded simulation of the file-transfer conversations (`ferry_xfer::conv`): both sides'
//! state machines connected by an in-memory wire that cuts, corrupts and reorders what it
//! carries, with every choice drawn from one seeded RNG, so that a failing seed replays
//! exactly (`FERRY_SIM_SEED=<seed> cargo test -p ferry-xfer --test sim_download`).
//!
//! This module holds what any conversation's simulation uses (the seeds, the fault plan,
//! the wire); each conversation's runtimes live in a file of their own beside it.

#![allow(dead_code)]

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The seeded RNG every choice of one simulated run comes from.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Runs `case` for the seeds `0..count`, or for the one in `FERRY_SIM_SEED` if set. A case
/// that fails (an `Err` or a panic) stops the run with its seed and how to replay it.
pub fn run_seeds(name: &str, count: u64, case: impl Fn(u64) -> Result<(), String>) {
    let seeds: Vec<u64> = match std::env::var("FERRY_SIM_SEED") {
        Ok(s) => vec![s.trim().parse().expect("FERRY_SIM_SEED must be a number")],
        Err(_) => (0..count).collect(),
    };
    for seed in seeds {
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(seed)));
        let why = match res {
            Ok(Ok(())) => continue,
            Ok(Err(why)) => why,
            Err(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into()),
        };
        panic!(
            "{name}: seed {seed} failed: {why}\nreplay: FERRY_SIM_SEED={seed} cargo test -p ferry-xfer --test {name}"
        );
    }
}

/// Which way a message travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Client to server (requests).
    Up,
    /// Server to client (answers and data).
    Down,
}

/// What may go wrong in one connection (and on the disks around it), drawn from the seed.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Cut the connection once this many messages crossed it (`None`: never).
    pub cut_after: Option<u64>,
    /// Chance that a data message's payload arrives corrupted.
    pub corrupt: f64,
    /// Chance that a message overtakes the one ahead of it, where the protocol allows.
    pub reorder: f64,
    /// Chance that a disk operation completes only later (others go on meanwhile).
    pub slow_disk: f64,
    /// Chance that a disk write fails.
    pub disk_fail: f64,
    /// Chance that the sender cannot read a piece of its source.
    pub read_fail: f64,
}

impl Faults {
    /// None at all: the run that must succeed once the faults are spent.
    pub fn none() -> Faults {
        Faults::default()
    }

    /// A plan drawn from `rng`: each kind of fault present in some connections only, so
    /// that seeds explore each alone and together.
    pub fn draw(rng: &mut StdRng) -> Faults {
        let mut some = |p: f64, max: f64| {
            if rng.random_bool(p) {
                rng.random_range(0.0..max)
            } else {
                0.0
            }
        };
        let corrupt = some(0.5, 0.25);
        let reorder = some(0.5, 0.5);
        let slow_disk = some(0.5, 0.5);
        let disk_fail = some(0.15, 0.05);
        let read_fail = some(0.15, 0.05);
        let cut_after = rng.random_bool(0.5).then(|| rng.random_range(0..60));
        Faults {
            cut_after,
            corrupt,
            reorder,
            slow_disk,
            disk_fail,
            read_fail,
        }
    }

    /// Whether a fault of chance `p` strikes now.
    pub fn strikes(rng: &mut StdRng, p: f64) -> bool {
        p > 0.0 && rng.random_bool(p.min(1.0))
    }
}

/// An in-memory connection: an in-order queue each way; it may be cut (everything in
/// flight is lost, nothing more crosses) and may deliver a message before the one ahead of
/// it where the caller says the protocol allows that.
pub struct Wire<M> {
    up: VecDeque<M>,
    down: VecDeque<M>,
    /// Messages that crossed so far.
    pub crossed: u64,
    /// Messages that overtook the one ahead of them.
    pub reordered: u64,
    cut: bool,
    /// The connection's fault plan.
    pub faults: Faults,
}

impl<M> Wire<M> {
    /// A connection with the fault plan `faults`.
    pub fn new(faults: Faults) -> Wire<M> {
        Wire {
            up: VecDeque::new(),
            down: VecDeque::new(),
            crossed: 0,
            reordered: 0,
            cut: false,
            faults,
        }
    }

    /// Sends `m` (lost if the connection is cut).
    pub fn send(&mut self, dir: Dir, m: M) {
        if self.cut {
            return;
        }
        match dir {
            Dir::Up => self.up.push_back(m),
            Dir::Down => self.down.push_back(m),
        }
    }

    /// Whether the connection was cut.
    pub fn is_cut(&self) -> bool {
        self.cut
    }

    /// Messages waiting to cross in `dir`.
    pub fn pending(&self, dir: Dir) -> usize {
        match dir {
            Dir::Up => self.up.len(),
            Dir::Down => self.down.len(),
        }
    }

    /// Delivers the next message of `dir`, or `None` if there is none or the connection is
    /// cut (which happens here once the plan's count is reached). The message may overtake
    /// the one ahead of it if `may_pass(ahead, it)` (per the plan's reorder chance).
    pub fn deliver(
        &mut self,
        dir: Dir,
        rng: &mut StdRng,
        may_pass: impl Fn(&M, &M) -> bool,
    ) -> Option<M> {
        if self.cut || self.faults.cut_after.is_some_and(|n| self.crossed >= n) {
            self.cut = true;
            self.up.clear();
            self.down.clear();
            return None;
        }
        let reorder = self.faults.reorder;
        let q = match dir {
            Dir::Up => &mut self.up,
            Dir::Down => &mut self.down,
        };
        if q.len() >= 2 && may_pass(&q[0], &q[1]) && Faults::strikes(rng, reorder) {
            q.swap(0, 1);
            self.reordered += 1;
        }
        let m = q.pop_front()?;
        self.crossed += 1;
        Some(m)
    }
}
