//! What `bench exs` measures (the plan) and the cells that collect each point's repetitions.

use super::capi::Lang;
use super::client::Measured;
use super::conn::{Mode, Wait};
use super::report::ExsRow;
use crate::report::{median, round};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// Registered bytes on each side of every EXS connection (and the persistent block).
pub const REGION: usize = 64 * MIB;
/// The size the summary compares with the fabric and the socket.
pub const LARGE: usize = 16 * MIB;
/// Most transfers in flight in the size sweep (fewer when they would not fit in REGION).
pub const STREAM_WINDOW: usize = 8;
/// Latency payloads.
pub const LATENCY_SIZES: [usize; 3] = [1, 10, 100];
/// The payload of the paired ping-pongs (and of the summary's latency ratios).
pub const PING: usize = 10;

/// How much to measure.
pub struct Plan {
    /// Payloads of the throughput sweep.
    pub sizes: Vec<usize>,
    /// Bytes per point of the size sweep (and of each reference), at most.
    pub total: u64,
    /// Bytes per point of the in-flight sweep, at most.
    pub inflight_total: u64,
    /// Messages per throughput point, at most (bounds the small sizes).
    pub max_msgs: u64,
    /// Payloads and in-flight counts of the in-flight sweep (normal mode).
    pub inflight_sizes: Vec<usize>,
    /// In-flight counts.
    pub inflight: Vec<usize>,
    /// Latency rounds recorded, after this many unrecorded.
    pub pings: usize,
    /// Unrecorded warm-up rounds.
    pub warm: usize,
    /// Repetitions (median taken).
    pub reps: usize,
    /// Paired ping-pong rounds per repetition (see [`super::pairs`]).
    pub pair_rounds: usize,
    /// Round trips recorded per phase of a paired run, after [`Plan::warm`] unrecorded.
    pub pair_pings: usize,
    /// Latency payloads (none: no latency cells).
    pub latency_sizes: Vec<usize>,
}

impl Plan {
    /// The full plan, or the `--quick` one.
    pub fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                sizes: vec![1, 256, 64 * KIB, MIB, LARGE],
                total: 512 << 20,
                inflight_total: 256 << 20,
                max_msgs: 1000,
                inflight_sizes: vec![MIB],
                inflight: vec![1, 2, 4, 8],
                pings: 1000,
                warm: 100,
                reps: 1,
                pair_rounds: 3,
                pair_pings: 300,
                latency_sizes: LATENCY_SIZES.to_vec(),
            }
        } else {
            Plan {
                sizes: vec![1, 16, 256, 4 * KIB, 64 * KIB, MIB, 4 * MIB, LARGE],
                total: 2 << 30,
                inflight_total: 512 << 20,
                max_msgs: 4000,
                inflight_sizes: vec![64 * KIB, MIB],
                inflight: vec![1, 2, 4, 8],
                pings: 2000,
                warm: 200,
                reps: 3,
                pair_rounds: 5,
                pair_pings: 400,
                latency_sizes: LATENCY_SIZES.to_vec(),
            }
        }
    }

    /// Only what the `large_vs_fabric` ratio needs: the 16 MiB stream point in normal and
    /// persistent mode, and the fabric reference (same totals and repetitions as `self`).
    pub fn large_only(mut self) -> Plan {
        self.sizes = vec![LARGE];
        self.inflight_sizes.clear();
        self.latency_sizes.clear();
        self
    }

    /// Only the latency cells (every mode, the paired ping-pongs): the latency ratios, with
    /// the repetitions of `self`, in a fraction of the time.
    pub fn latency_only(mut self) -> Plan {
        self.sizes.clear();
        self.inflight_sizes.clear();
        self
    }

    /// Messages for a point of `size` bytes with `window` in flight: at most `total` bytes
    /// (the in-flight sweep's for `op` `inflight`) and `max_msgs`, at least 2 × `window`.
    pub fn count(&self, op: &str, size: usize, window: usize) -> u64 {
        let total = if op == "inflight" {
            self.inflight_total
        } else {
            self.total
        };
        let min = 2 * window as u64;
        (total / size as u64).min(self.max_msgs).max(min)
    }
}

/// Transfers in flight for `size`-byte messages in the size sweep.
pub fn window(size: usize) -> usize {
    (REGION / size).clamp(1, STREAM_WINDOW)
}

/// What a cell measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// EXS throughput: payload, transfers in flight.
    Stream(Mode, usize, usize),
    /// EXS latency: payload.
    Latency(Mode, usize),
    /// A paired normal-mode ping-pong between two fresh processes (`tests/c/latency.c` or
    /// its Rust twin `bench exs-pingpong`), both sides waiting as `Wait` says: payload.
    PingPong(Lang, Wait, usize),
    /// The driver's raw fabric RMA read bandwidth at this size.
    FabricRead(usize),
    /// The plain TCP socket blast at this write size.
    Blast(usize),
}

/// One point of the grid, accumulating repetitions.
pub struct Cell {
    /// Driver (`socket` for the blast).
    pub driver: String,
    /// `stream` (size sweep), `inflight` (in-flight sweep) or `latency`.
    pub op: &'static str,
    /// What it measures.
    pub kind: Kind,
    vals: Vec<f64>,
    send_cpu: Vec<f64>,
    recv_cpu: Vec<f64>,
    send_per: Vec<f64>,
    recv_per: Vec<f64>,
    error: Option<String>,
}

impl Cell {
    /// An empty cell.
    pub fn new(driver: &str, op: &'static str, kind: Kind) -> Cell {
        Cell {
            driver: driver.into(),
            op,
            kind,
            vals: vec![],
            send_cpu: vec![],
            recv_cpu: vec![],
            send_per: vec![],
            recv_per: vec![],
            error: None,
        }
    }

    /// Adds one repetition.
    pub fn add(&mut self, m: Measured) {
        self.vals.push(m.value);
        self.send_cpu.push(m.send_cpu);
        self.recv_cpu.push(m.recv_cpu);
        let gb = m.bytes as f64 / 1e9;
        if m.bytes > 0 && m.send_cpu > 0.0 {
            self.send_per.push(gb / m.send_cpu);
        }
        if m.bytes > 0 && m.recv_cpu > 0.0 {
            self.recv_per.push(gb / m.recv_cpu);
        }
    }

    /// Marks the cell failed (the first reason sticks).
    pub fn fail(&mut self, why: impl Into<String>) {
        self.error.get_or_insert_with(|| why.into());
    }

    /// Whether the cell has failed.
    pub fn failed(&self) -> bool {
        self.error.is_some()
    }

    /// The mode this cell measures, if it is an EXS cell.
    pub fn mode(&self) -> Option<Mode> {
        match self.kind {
            Kind::Stream(m, ..) | Kind::Latency(m, _) => Some(m),
            Kind::PingPong(..) | Kind::FabricRead(_) | Kind::Blast(_) => None,
        }
    }

    /// The row: medians, or nulls and the error.
    pub fn row(mut self) -> ExsRow {
        let ok = self.error.is_none();
        let mid = |v: &mut Vec<f64>, digits| median(v).filter(|_| ok).map(|x| round(x, digits));
        let value = mid(&mut self.vals, 7);
        let (mode, size, inflight, latency) = match self.kind {
            Kind::Stream(m, s, w) => (m.name(), s, Some(w), false),
            Kind::Latency(m, s) => (m.name(), s, None, true),
            Kind::PingPong(lang, wait, s) => (pingpong_mode(lang, wait), s, None, true),
            Kind::FabricRead(s) => ("fabric-read", s, None, false),
            Kind::Blast(s) => ("blast", s, None, false),
        };
        ExsRow {
            driver: self.driver,
            mode: mode.into(),
            op: self.op.into(),
            size: size as u64,
            inflight,
            gbps: value.filter(|_| !latency),
            usec: value.filter(|_| latency).map(|x| round(x, 2)),
            send_cpu_s: mid(&mut self.send_cpu, 4),
            recv_cpu_s: mid(&mut self.recv_cpu, 4),
            send_gb_per_cpu_s: mid(&mut self.send_per, 4),
            recv_gb_per_cpu_s: mid(&mut self.recv_per, 4),
            reps: if ok { self.vals.len() } else { 0 },
            error: self.error,
        }
    }
}

/// The row mode of a paired ping-pong: `rust` (the reference), `poll`, `capi`, `capi-poll`.
pub fn pingpong_mode(lang: Lang, wait: Wait) -> &'static str {
    match (lang, wait) {
        (Lang::Rust, Wait::Block) => "rust",
        (Lang::Rust, Wait::Poll) => "poll",
        (Lang::C, Wait::Block) => "capi",
        (Lang::C, Wait::Poll) => "capi-poll",
    }
}

/// The paired ping-pong cells, in row order.
pub const PINGPONGS: [(Lang, Wait); 4] = [
    (Lang::Rust, Wait::Block),
    (Lang::Rust, Wait::Poll),
    (Lang::C, Wait::Block),
    (Lang::C, Wait::Poll),
];

/// The cells of one driver, in the order a session measures them: per mode, the size sweep,
/// then (normal) the in-flight sweep, then latency; then the paired ping-pongs; last the
/// fabric reference.
pub fn grid_of(driver: &str, plan: &Plan) -> Vec<Cell> {
    let mut cells = Vec::new();
    for mode in Mode::ALL {
        for &s in plan.sizes.iter().filter(|&&s| s as u64 <= mode.max_size()) {
            cells.push(Cell::new(
                driver,
                "stream",
                Kind::Stream(mode, s, window(s)),
            ));
        }
        if mode == Mode::Normal {
            for &s in &plan.inflight_sizes {
                for &n in &plan.inflight {
                    cells.push(Cell::new(driver, "inflight", Kind::Stream(mode, s, n)));
                }
            }
        }
        for &s in &plan.latency_sizes {
            cells.push(Cell::new(driver, "latency", Kind::Latency(mode, s)));
        }
    }
    if plan.latency_sizes.contains(&PING) {
        for (lang, wait) in PINGPONGS {
            let kind = Kind::PingPong(lang, wait, PING);
            cells.push(Cell::new(driver, "latency", kind));
        }
    }
    // The fabric reference is for the stream points (none in a latency-only plan).
    if !plan.sizes.is_empty() {
        cells.push(Cell::new(driver, "stream", Kind::FabricRead(LARGE)));
    }
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_and_grid() {
        for quick in [true, false] {
            let p = Plan::new(quick);
            assert!(p.sizes.contains(&LARGE) && p.sizes.contains(&1));
            assert!(p.count("stream", LARGE, window(LARGE)) >= 32);
            assert!(p.count("stream", 1, 8) <= p.max_msgs);
            assert!(p.count("inflight", 1 << 20, 1) < p.count("stream", 1 << 20, 8));
        }
        assert_eq!((window(1), window(LARGE)), (8, 4));
        let g = grid_of("tcp", &Plan::new(false));
        let imm = g
            .iter()
            .filter(|c| matches!(c.kind, Kind::Stream(Mode::Immediate, ..)));
        assert_eq!(imm.count(), 5, "immediate stops at 64 KiB");
        assert_eq!(g.iter().filter(|c| c.op == "latency").count(), 13);
        let modes: Vec<&str> = PINGPONGS
            .iter()
            .map(|&(l, w)| pingpong_mode(l, w))
            .collect();
        assert_eq!(modes, ["rust", "poll", "capi", "capi-poll"]);
        let pp = |l, w| Kind::PingPong(l, w, PING);
        assert!(g.iter().any(|c| c.kind == pp(Lang::C, Wait::Poll)));
        assert_eq!(g.last().map(|c| c.kind), Some(Kind::FabricRead(LARGE)));
        let large = grid_of("ofi+shm", &Plan::new(false).large_only());
        let kinds: Vec<Kind> = large.iter().map(|c| c.kind).collect();
        assert_eq!(
            kinds,
            [
                Kind::Stream(Mode::Normal, LARGE, 4),
                Kind::Stream(Mode::Persistent, LARGE, 4),
                Kind::FabricRead(LARGE)
            ]
        );
        let lat = grid_of("tcp", &Plan::new(true).latency_only());
        assert_eq!(lat.len(), 13);
        assert!(lat.iter().all(|c| c.op == "latency"));
    }
}
