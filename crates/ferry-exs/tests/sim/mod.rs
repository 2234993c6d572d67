//! Deterministic simulation of two EXS connections over a simulated fabric.
//!
//! Each direction is an in-order link; every control message lands in a posted control
//! buffer (the harness checks the peer had one, and that it was big enough); RMA reads and
//! writes are executed against simulated registered memory with key and bounds checks, at a
//! random later moment; frame and RMA completions are reported in random order. One seeded
//! RNG chooses every interleaving, so a failing seed replays exactly.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};

use ferry_exs::proto::wire;
use ferry_exs::proto::{
    Action, Config, Connection, Event, EventKind, Flags, FrameId, LocalBuf, OpId, RemoteSlice,
};
use ferry_exs::ExsError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A handle to simulated registered memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimBuf {
    pub key: u64,
    pub len: u64,
    pub remote_ok: bool,
}

/// Addresses are virtual: each region lives at its own base, far from the others.
fn base(key: u64) -> u64 {
    key << 32
}

impl LocalBuf for SimBuf {
    fn len(&self) -> u64 {
        self.len
    }
    fn remote(&self) -> Option<RemoteSlice> {
        self.remote_ok.then_some(RemoteSlice {
            addr: base(self.key),
            len: self.len,
            key: self.key,
        })
    }
}

struct Region {
    owner: usize,
    data: Vec<u8>,
}

/// A completion the user saw, with the whole content its buffer had at that moment.
#[derive(Debug, Clone)]
pub struct Rec {
    pub kind: EventKind,
    pub ctx: u64,
    pub len: u64,
    pub result: Result<(), ExsError>,
    pub data: Option<Vec<u8>>,
}

enum Rma {
    Read,
    Write,
}

struct PendingRma {
    op: OpId,
    kind: Rma,
    local: SimBuf,
    local_offset: u64,
    remote: RemoteSlice,
}

/// Work a simulated user posts over time, at most `window` outstanding.
#[derive(Default)]
struct Workload {
    sends: VecDeque<(Vec<u8>, Flags, u64)>,
    recvs: VecDeque<(u64, Flags, u64)>,
    send_window: usize,
    recv_window: usize,
    send_ctx: u64,
    recv_ctx: u64,
}

pub struct Side {
    pub conn: Connection<SimBuf>,
    pub cfg: Config,
    /// Frames on the way to this side, in order.
    link_in: VecDeque<Vec<u8>>,
    sent_pending: Vec<FrameId>,
    rma_pending: Vec<PendingRma>,
    pub events: Vec<Rec>,
    /// Outstanding user operations: ctx -> buffer key.
    sends_out: HashMap<u64, u64>,
    recvs_out: HashMap<u64, u64>,
    work: Workload,
    /// Unsolicited frames sent minus credits received back, as the wire shows them.
    unsolicited_out: i64,
    pub max_unsolicited_out: i64,
    /// The runtime shut the endpoint down (after a Close event): frames to it are dropped
    /// and RMAs touching it fail, as a real fabric would flush them.
    pub down: bool,
}

pub struct Sim {
    rng: StdRng,
    regions: HashMap<u64, Region>,
    next_key: u64,
    pub sides: [Side; 2],
    /// Every broken rule the harness saw; tests assert it stays empty.
    pub violations: Vec<String>,
    pub steps: u64,
    /// When set, one step in this many corrupts the links (flip, drop, duplicate or cut a
    /// frame); the peer's RMA targets then may be garbage, so remote faults are not counted
    /// as violations, but everything local still is.
    pub tamper: Option<u32>,
    /// When set, one RMA in this many fails (as a NIC reports a key or link error).
    pub fail_rma: Option<u32>,
}

/// The ctx bit that marks a recv (sends and recvs share one ctx space per side).
pub const RECV: u64 = 1 << 63;

impl Sim {
    pub fn new(seed: u64, a: Config, b: Config) -> Sim {
        let side = |cfg: Config| Side {
            conn: Connection::new(cfg.clone()).expect("valid config"),
            cfg,
            link_in: VecDeque::new(),
            sent_pending: Vec::new(),
            rma_pending: Vec::new(),
            events: Vec::new(),
            sends_out: HashMap::new(),
            recvs_out: HashMap::new(),
            work: Workload::default(),
            unsolicited_out: 0,
            max_unsolicited_out: 0,
            down: false,
        };
        let mut sim = Sim {
            rng: StdRng::seed_from_u64(seed),
            regions: HashMap::new(),
            next_key: 1,
            sides: [side(a), side(b)],
            violations: Vec::new(),
            steps: 0,
            tamper: None,
            fail_rma: None,
        };
        sim.drain(0);
        sim.drain(1);
        sim
    }

    pub fn alloc(&mut self, owner: usize, data: &[u8], remote_ok: bool) -> SimBuf {
        let key = self.next_key;
        self.next_key += 1;
        self.regions.insert(
            key,
            Region {
                owner,
                data: data.to_vec(),
            },
        );
        SimBuf {
            key,
            len: data.len() as u64,
            remote_ok,
        }
    }

    pub fn mem(&self, key: u64) -> &[u8] {
        &self.regions[&key].data
    }

    pub fn mem_mut(&mut self, key: u64) -> &mut Vec<u8> {
        &mut self.regions.get_mut(&key).expect("live region").data
    }

    /// Posts a send of a copy of `data` now; returns its buffer.
    pub fn send(
        &mut self,
        side: usize,
        ctx: u64,
        data: &[u8],
        flags: Flags,
        offset: u64,
    ) -> SimBuf {
        let buf = self.alloc(side, data, true);
        self.send_buf(side, ctx, buf.clone(), flags, offset);
        buf
    }

    /// Posts `data` as `side`'s early first message ([`Connection::send_early`]) now.
    pub fn send_early(&mut self, side: usize, ctx: u64, data: &[u8]) {
        let buf = self.alloc(side, data, true);
        self.sides[side].sends_out.insert(ctx, buf.key);
        self.sides[side].conn.send_early(ctx, buf);
        self.drain(side);
    }

    /// Posts a send of an existing buffer now.
    pub fn send_buf(&mut self, side: usize, ctx: u64, buf: SimBuf, flags: Flags, offset: u64) {
        self.sides[side].sends_out.insert(ctx, buf.key);
        self.sides[side].conn.send(ctx, buf, flags, offset);
        self.drain(side);
    }

    /// Posts a recv of `len` bytes now (ctx gets the [`RECV`] bit); returns its buffer.
    pub fn recv(&mut self, side: usize, ctx: u64, len: u64, flags: Flags, offset: u64) -> SimBuf {
        let buf = self.alloc(side, &vec![0xEE; len as usize], true);
        self.sides[side].recvs_out.insert(ctx | RECV, buf.key);
        self.sides[side]
            .conn
            .recv(ctx | RECV, buf.clone(), flags, offset);
        self.drain(side);
        buf
    }

    /// Sends for the simulated user of `side` to post over time, at most `window` at once.
    pub fn plan_sends(&mut self, side: usize, msgs: Vec<Vec<u8>>, flags: Flags, window: usize) {
        let w = &mut self.sides[side].work;
        w.sends.extend(msgs.into_iter().map(|m| (m, flags, 0)));
        w.send_window = window;
    }

    /// Recvs of the given lengths to post over time, at most `window` at once.
    pub fn plan_recvs(&mut self, side: usize, lens: Vec<u64>, window: usize) {
        let w = &mut self.sides[side].work;
        w.recvs
            .extend(lens.into_iter().map(|l| (l, Flags::NONE, 0)));
        w.recv_window = window;
    }

    pub fn close(&mut self, side: usize) {
        self.sides[side].conn.close();
        self.drain(side);
    }

    /// Feeds raw bytes to `side` as if they came off the wire.
    pub fn inject(&mut self, side: usize, bytes: &[u8]) {
        self.sides[side].conn.handle_frame(bytes);
        self.drain(side);
    }

    /// Takes the frames queued towards `side` without delivering them.
    pub fn take_link(&mut self, side: usize) -> Vec<Vec<u8>> {
        self.sides[side].link_in.drain(..).collect()
    }

    /// Runs random steps until nothing can happen.
    pub fn run(&mut self) {
        while self.step() {}
    }

    /// Runs at most `n` random steps.
    pub fn run_steps(&mut self, n: usize) {
        for _ in 0..n {
            if !self.step() {
                return;
            }
        }
    }

    /// One randomly chosen enabled step; false if none is enabled.
    pub fn step(&mut self) -> bool {
        let mut choices = [(0u8, 0usize); 12];
        let mut n = 0;
        for s in 0..2 {
            let side = &self.sides[s];
            let w = &side.work;
            let options = [
                (0, !side.link_in.is_empty()),
                (1, !side.sent_pending.is_empty()),
                (2, !side.rma_pending.is_empty()),
                (
                    3,
                    !w.sends.is_empty() && side.sends_out.len() < w.send_window,
                ),
                (
                    4,
                    !w.recvs.is_empty() && side.recvs_out.len() < w.recv_window,
                ),
            ];
            for (kind, enabled) in options {
                if enabled {
                    choices[n] = (kind, s);
                    n += 1;
                }
            }
        }
        if n == 0 {
            return false;
        }
        self.steps += 1;
        if let Some(one_in) = self.tamper {
            if self.rng.random_ratio(1, one_in) && self.corrupt_link() {
                return true;
            }
        }
        let (kind, s) = choices[self.rng.random_range(0..n)];
        match kind {
            0 => self.deliver(s),
            1 => {
                let i = self.rng.random_range(0..self.sides[s].sent_pending.len());
                let id = self.sides[s].sent_pending.swap_remove(i);
                self.sides[s].conn.frame_sent(id, Ok(()));
                self.drain(s);
            }
            2 => {
                let i = self.rng.random_range(0..self.sides[s].rma_pending.len());
                let rma = self.sides[s].rma_pending.swap_remove(i);
                let result = self.execute_rma(s, &rma);
                self.sides[s].conn.rma_done(rma.op, result);
                self.drain(s);
            }
            3 => {
                let w = &mut self.sides[s].work;
                let (data, flags, offset) = w.sends.pop_front().expect("enabled");
                let ctx = w.send_ctx;
                w.send_ctx += 1;
                self.send(s, ctx, &data, flags, offset);
            }
            _ => {
                let w = &mut self.sides[s].work;
                let (len, flags, offset) = w.recvs.pop_front().expect("enabled");
                let ctx = w.recv_ctx;
                w.recv_ctx += 1;
                self.recv(s, ctx, len, flags, offset);
            }
        }
        true
    }

    /// Damages one frame in flight; false if no link holds one.
    fn corrupt_link(&mut self) -> bool {
        let s = self.rng.random_range(0..2);
        let link = &mut self.sides[s].link_in;
        if link.is_empty() {
            return false;
        }
        let i = self.rng.random_range(0..link.len());
        match self.rng.random_range(0..4) {
            0 => {
                let f = &mut link[i];
                if !f.is_empty() {
                    let j = self.rng.random_range(0..f.len());
                    f[j] ^= self.rng.random_range(1..=255u8);
                }
            }
            1 => {
                link.remove(i);
            }
            2 => {
                let f = link[i].clone();
                link.insert(i, f);
            }
            _ => {
                let f = &mut link[i];
                let keep = self.rng.random_range(0..=f.len());
                f.truncate(keep);
            }
        }
        true
    }

    fn deliver(&mut self, s: usize) {
        let bytes = self.sides[s].link_in.pop_front().expect("enabled");
        if self.sides[s].down {
            return;
        }
        if let Ok(d) = wire::decode(&bytes) {
            // The credits come back to the side receiving them.
            self.sides[s].unsolicited_out -= i64::from(d.credits);
        }
        self.sides[s].conn.handle_frame(&bytes);
        self.drain(s);
    }

    /// Carries out every action `s` has, as a runtime would.
    pub fn drain(&mut self, s: usize) {
        while let Some(action) = self.sides[s].conn.poll_action() {
            match action {
                Action::SendFrame { id, bytes, payload } => self.transmit(s, id, bytes, payload),
                Action::RmaReadLayout { .. } => {
                    unreachable!("simulated buffers advertise no layouts")
                }
                Action::RmaRead {
                    op,
                    local,
                    local_offset,
                    remote,
                } => self.sides[s].rma_pending.push(PendingRma {
                    op,
                    kind: Rma::Read,
                    local,
                    local_offset,
                    remote,
                }),
                Action::RmaWrite {
                    op,
                    local,
                    local_offset,
                    remote,
                } => self.sides[s].rma_pending.push(PendingRma {
                    op,
                    kind: Rma::Write,
                    local,
                    local_offset,
                    remote,
                }),
                Action::CopyIn { buf, offset, data } => {
                    let ok = self.check_local(s, &buf, offset, data.len() as u64);
                    if ok {
                        let at = offset as usize;
                        self.mem_mut(buf.key)[at..at + data.len()].copy_from_slice(&data);
                    }
                }
                Action::Event(e) => self.record(s, e),
            }
        }
    }

    fn transmit(&mut self, s: usize, id: FrameId, mut bytes: Vec<u8>, payload: Option<SimBuf>) {
        if let Some(p) = payload {
            if self.check_local(s, &p, 0, p.len) {
                bytes.extend_from_slice(self.mem(p.key));
            }
        }
        let peer = 1 - s;
        match wire::decode(&bytes) {
            Ok(d) if d.frame.is_unsolicited() => {
                let side = &mut self.sides[s];
                side.unsolicited_out += 1;
                side.max_unsolicited_out = side.max_unsolicited_out.max(side.unsolicited_out);
                // Every window is at least one credit (both sides offer one or more), which
                // an early first message spends before the window is known (zero here).
                let window = i64::from(side.conn.credits().send_window).max(1);
                if side.unsolicited_out > window && self.tamper.is_none() {
                    let n = side.unsolicited_out;
                    self.violations.push(format!(
                        "side {s}: {n} unsolicited frames out, window {window}"
                    ));
                }
            }
            Ok(_) => {}
            Err(e) => self
                .violations
                .push(format!("side {s} sent a bad frame: {e}")),
        }
        let cfg = &self.sides[peer].cfg;
        if bytes.len() > cfg.control_buf_size() {
            self.violations.push(format!(
                "side {s}: frame of {} B > control buffer",
                bytes.len()
            ));
        }
        if self.sides[s].down {
            self.violations
                .push(format!("side {s} sent a frame after closing"));
        }
        if self.sides[peer].link_in.len() >= cfg.control_buffers() && self.tamper.is_none() {
            self.violations.push(format!(
                "side {s} overran the peer: {} frames in flight, {} buffers posted",
                self.sides[peer].link_in.len() + 1,
                cfg.control_buffers()
            ));
        }
        // The tighter bound docs/protocol.md derives: one frame per credit each way, plus one.
        let c = self.sides[s].conn.credits();
        let bound = usize::from(c.send_window) + usize::from(c.recv_window) + 1;
        let depth = self.sides[peer].link_in.len() + 1;
        if c.send_window > 0 && depth > bound && self.tamper.is_none() {
            self.violations
                .push(format!("side {s}: {depth} frames in flight, bound {bound}"));
        }
        self.sides[peer].link_in.push_back(bytes);
        self.sides[s].sent_pending.push(id);
    }

    fn check_local(&mut self, s: usize, buf: &SimBuf, offset: u64, len: u64) -> bool {
        let ok = self.regions.get(&buf.key).is_some_and(|r| {
            r.owner == s
                && r.data.len() as u64 == buf.len
                && offset.checked_add(len).is_some_and(|e| e <= buf.len)
        });
        if !ok {
            self.violations.push(format!(
                "side {s}: local access {offset}+{len} to buffer {} invalid",
                buf.key
            ));
        }
        ok
    }

    /// Executes one RMA with the checks a real NIC makes; a failure is a protocol bug here.
    fn execute_rma(&mut self, s: usize, rma: &PendingRma) -> Result<(), ExsError> {
        if self.sides[0].down || self.sides[1].down {
            return Err(ExsError::Transfer);
        }
        if let Some(one_in) = self.fail_rma {
            if self.rng.random_ratio(1, one_in) {
                return Err(ExsError::Transfer);
            }
        }
        let len = rma.remote.len;
        let remote_ok = self.regions.get(&rma.remote.key).is_some_and(|r| {
            let start = base(rma.remote.key);
            r.owner != s
                && rma.remote.addr >= start
                && (rma.remote.addr - start)
                    .checked_add(len)
                    .is_some_and(|end| end <= r.data.len() as u64)
        });
        if !remote_ok && self.tamper.is_some() {
            return Err(ExsError::Transfer);
        }
        if !remote_ok {
            self.violations
                .push(format!("side {s}: remote access {:?} invalid", rma.remote));
            return Err(ExsError::Transfer);
        }
        if !self.check_local(s, &rma.local, rma.local_offset, len) {
            return Err(ExsError::Transfer);
        }
        let r_at = (rma.remote.addr - base(rma.remote.key)) as usize;
        let l_at = rma.local_offset as usize;
        let n = len as usize;
        let (src_key, src_at, dst_key, dst_at) = match rma.kind {
            Rma::Read => (rma.remote.key, r_at, rma.local.key, l_at),
            Rma::Write => (rma.local.key, l_at, rma.remote.key, r_at),
        };
        let bytes = self.mem(src_key)[src_at..src_at + n].to_vec();
        self.mem_mut(dst_key)[dst_at..dst_at + n].copy_from_slice(&bytes);
        Ok(())
    }

    fn record(&mut self, s: usize, e: Event<SimBuf>) {
        let data = e.buf.as_ref().map(|b| self.mem(b.key).to_vec());
        if e.kind == EventKind::Close {
            self.sides[s].down = true;
        }
        let outstanding = match e.kind {
            EventKind::Send => Some(&mut self.sides[s].sends_out),
            EventKind::Recv => Some(&mut self.sides[s].recvs_out),
            _ => None,
        };
        if let Some(out) = outstanding {
            match out.remove(&e.ctx) {
                // The buffer goes back to the user: the fabric may no longer touch it.
                Some(key) => {
                    self.regions.remove(&key);
                }
                None => self
                    .violations
                    .push(format!("side {s}: second or unknown completion {e:?}")),
            }
        }
        self.sides[s].events.push(Rec {
            kind: e.kind,
            ctx: e.ctx,
            len: e.len,
            result: e.result,
            data,
        });
    }

    /// Events of one kind at `side`, by ctx.
    pub fn completions(&self, side: usize, kind: EventKind) -> HashMap<u64, Rec> {
        self.sides[side]
            .events
            .iter()
            .filter(|r| r.kind == kind)
            .map(|r| (r.ctx, r.clone()))
            .collect()
    }

    /// Every posted operation completed, nothing is pending anywhere, no rule was broken.
    pub fn assert_quiescent(&self) {
        assert!(
            self.violations.is_empty(),
            "violations: {:#?}",
            self.violations
        );
        for (s, side) in self.sides.iter().enumerate() {
            assert!(side.link_in.is_empty() && side.sent_pending.is_empty());
            assert!(side.rma_pending.is_empty());
            assert!(
                side.sends_out.is_empty(),
                "side {s} sends left: {:?}",
                side.sends_out
            );
            assert!(
                side.recvs_out.is_empty(),
                "side {s} recvs left: {:?}",
                side.recvs_out
            );
            assert!(side.conn.is_idle(), "side {s} not idle");
        }
    }

    /// Both sides hold all their credits again.
    pub fn assert_credits_restored(&self) {
        for (s, side) in self.sides.iter().enumerate() {
            let c = side.conn.credits();
            assert_eq!(c.available, u32::from(c.send_window), "side {s}: {c:?}");
            assert_eq!((c.held, c.owed), (0, 0), "side {s}: {c:?}");
            assert_eq!(side.unsolicited_out, 0, "side {s} wire count");
        }
    }
}

/// A recognisable message body: `len` bytes derived from `tag`.
pub fn pattern(tag: u64, len: usize) -> Vec<u8> {
    let mut x = tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
