//! One bench connection: a peer process, an endpoint to it, and the measurements run over it.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use ferry_fabric::{
    Access, Address, Buffer, Capabilities, Completion, Endpoint, MemoryRegion, OpKind, RemoteSlice,
};

use super::child::PeerProcess;
use super::cpu::{self, Usage};
use super::proto::{Msg, CTRL_LEN, PING_LEN};
use super::report::median;

/// Longest wait for any one completion before the driver is declared stuck.
const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// Most operations in flight.
const MAX_WINDOW: usize = 16;

// Control region layout: request frame, reply frame, ping.
const REQ_OFF: usize = 0;
const REPLY_OFF: usize = CTRL_LEN;
const PING_OFF: usize = 2 * CTRL_LEN;
const CTX_REQ: u64 = 1 << 62;
const CTX_REPLY: u64 = (1 << 62) | 1;
const CTX_BULK: u64 = 2 << 62;

/// A bulk operation under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Two-sided send into receives the peer keeps posted.
    Send,
    /// One-sided RMA write into the peer's region.
    Write,
    /// One-sided RMA read from the peer's region.
    Read,
}

impl Op {
    /// Every bulk operation, in table order.
    pub const ALL: [Op; 3] = [Op::Send, Op::Write, Op::Read];

    /// Name as used in rows.
    pub fn name(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::Write => "write",
            Op::Read => "read",
        }
    }
}

/// Outcome of one measurement: a value (GB/s or µs), its duration and the CPU it cost.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// GB/s for bandwidth, µs for latency.
    pub value: f64,
    /// Wall-clock seconds the measurement took.
    pub secs: f64,
    /// User+system seconds of both sides, where known.
    pub cpu_s: Option<f64>,
    /// The part of `cpu_s` the peer process spent, where known separately.
    pub peer_cpu_s: Option<f64>,
}

/// Ops in flight for `size`-byte transfers within `inflight` bytes of buffer.
pub fn window(size: usize, inflight: usize) -> usize {
    (inflight / size).clamp(1, MAX_WINDOW)
}

/// A connected client with its peer process.
pub struct Session {
    ep: Box<dyn Endpoint>,
    ctrl: MemoryRegion,
    bulk: MemoryRegion,
    remote: RemoteSlice,
    _peer: PeerProcess,
}

impl Session {
    /// Spawns a peer listening on `addr`, connects, and sets up `inflight` bytes of buffer on
    /// both sides.
    pub fn open(addr: &Address, inflight: usize) -> Result<Session> {
        let mut peer = PeerProcess::spawn(&["fabric-peer", "--listen", &addr.to_string()])?;
        let line = peer.line(Duration::from_secs(15))?;
        let bound = match line.trim_end().split_once(' ') {
            Some(("addr", a)) => a.parse::<Address>()?,
            Some(("error", e)) => bail!("{e}"),
            _ => bail!("peer said {line:?} instead of its address"),
        };
        let ep = ferry_fabric::connect(&bound, Duration::from_secs(10))
            .with_context(|| format!("connecting to the peer at {bound}"))?;
        let dom = ep.domain();
        let ctrl = dom.register(&Buffer::new(PING_OFF + PING_LEN), Access::LOCAL)?;
        let bulk = dom.register(&Buffer::new(inflight), Access::LOCAL)?;
        bulk.buffer().fill(0xa5);
        let mut s = Session {
            ep,
            ctrl,
            bulk,
            remote: RemoteSlice {
                addr: 0,
                len: 0,
                key: 0,
            },
            _peer: peer,
        };
        match s.request(Msg::Hello {
            bytes: inflight as u64,
        })? {
            Msg::Advert(r) if r.len == inflight as u64 => s.remote = r,
            m => bail!("peer answered Hello with {m:?}"),
        }
        Ok(s)
    }

    /// The driver's capabilities.
    pub fn caps(&self) -> &Capabilities {
        self.ep.capabilities()
    }

    /// Streams `op` in `size`-byte operations, several in flight, until `total` bytes moved or
    /// `cap` elapsed; returns GB/s (timed up to a round trip that follows the last completion).
    pub fn bandwidth(&mut self, op: Op, size: usize, total: u64, cap: Duration) -> Result<Sample> {
        ensure!(
            size > CTRL_LEN && size <= self.bulk.len(),
            "size {size} out of range"
        );
        let win = window(size, self.bulk.len());
        let count = (total / size as u64).max(win as u64);
        let (u0, p0) = (cpu::self_usage(), self.peer_usage()?);
        if op == Op::Send {
            let slots = win as u64;
            match self.request(Msg::SendPhase {
                size: size as u64,
                slots,
            })? {
                Msg::Ready => {}
                m => bail!("peer answered SendPhase with {m:?}"),
            }
        }
        let t0 = Instant::now();
        let deadline = t0 + cap;
        let mut posted = 0u64;
        while posted < count.min(win as u64) {
            self.post_bulk(op, size, posted as usize)?;
            posted += 1;
        }
        let mut done = 0;
        while done < posted {
            let c = self.next()?;
            ensure!(c.context & CTX_BULK != 0, "stray completion {:?}", c.op);
            done += 1;
            if posted < count && Instant::now() < deadline {
                self.post_bulk(op, size, (c.context & !CTX_BULK) as usize)?;
                posted += 1;
            }
        }
        let bytes = posted * size as u64;
        if op == Op::Send {
            self.end_sends(posted, bytes)?;
        }
        let p1 = self.peer_usage()?;
        let secs = t0.elapsed().as_secs_f64();
        let peer = p1.secs_since(p0);
        Ok(Sample {
            value: bytes as f64 / secs / 1e9,
            secs,
            cpu_s: Some(cpu::self_usage().secs_since(u0) + peer),
            peer_cpu_s: Some(peer),
        })
    }

    /// 8-byte ping-pong: median half round trip in µs over up to `count` exchanges or `cap`.
    pub fn latency(&mut self, count: usize, cap: Duration) -> Result<Sample> {
        let (u0, p0) = (cpu::self_usage(), self.peer_usage()?);
        let ping = self.ctrl.slice(PING_OFF..PING_OFF + PING_LEN)?;
        let pong = self.ctrl.slice(REPLY_OFF..REPLY_OFF + CTRL_LEN)?;
        let start = Instant::now();
        let mut half_rtt = Vec::with_capacity(count);
        while half_rtt.len() < count && (half_rtt.len() < 10 || start.elapsed() < cap) {
            self.ep.post_recv(std::slice::from_ref(&pong), CTX_REPLY)?;
            let t = Instant::now();
            self.ep.post_send(std::slice::from_ref(&ping), CTX_REQ)?;
            let got = self.pair()?;
            half_rtt.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
            ensure!(got == PING_LEN as u64, "pong of {got} bytes");
        }
        let peer = self.peer_usage()?.secs_since(p0);
        Ok(Sample {
            value: median(&mut half_rtt).context("no ping-pong completed")?,
            secs: start.elapsed().as_secs_f64(),
            cpu_s: Some(cpu::self_usage().secs_since(u0) + peer),
            peer_cpu_s: Some(peer),
        })
    }

    /// The endpoint to the peer, for benches that post their own operations (each must be
    /// complete before the next request).
    pub fn endpoint(&self) -> &dyn Endpoint {
        self.ep.as_ref()
    }

    /// The peer's target region, as it advertised it.
    pub fn remote(&self) -> RemoteSlice {
        self.remote
    }

    /// The peer's CPU usage so far.
    pub fn peer_cpu(&mut self) -> Result<Usage> {
        self.peer_usage()
    }

    /// Asks the peer to unpack `size` bytes at `stage` of its region into its noncontiguous
    /// layout (see [`Msg::Unpack`]) and waits until it has.
    pub fn unpack(&mut self, size: u64, stride: u64, stage: u64, origin: u64) -> Result<()> {
        match self.request(Msg::Unpack {
            size,
            stride,
            stage,
            origin,
        })? {
            Msg::Done { received } if received == size => Ok(()),
            m => bail!("peer answered Unpack with {m:?}"),
        }
    }

    /// Tells the peer a `bytes`-byte message has landed and waits for its answer.
    pub fn notify(&mut self, bytes: u64) -> Result<()> {
        match self.request(Msg::Notify { bytes })? {
            Msg::Done { received } if received == bytes => Ok(()),
            m => bail!("peer answered Notify with {m:?}"),
        }
    }

    /// Says goodbye so the peer exits on its own.
    pub fn close(mut self) -> Result<()> {
        self.request(Msg::Bye).map(drop)
    }

    fn post_bulk(&self, op: Op, size: usize, slot: usize) -> Result<()> {
        let local = [self.bulk.slice(slot * size..(slot + 1) * size)?];
        let ctx = CTX_BULK | slot as u64;
        let remote = || self.remote.sub((slot * size) as u64, size as u64);
        match op {
            Op::Send => self.ep.post_send(&local, ctx),
            Op::Write => self.ep.post_write(&local, remote()?, ctx),
            Op::Read => self.ep.post_read(&local, remote()?, ctx),
        }
        .with_context(|| format!("posting a {size}-byte {}", op.name()))
    }

    /// Closes a send phase: tells the peer how many messages went out, feeds its leftover
    /// receives, and checks that every byte arrived.
    fn end_sends(&mut self, sent: u64, bytes: u64) -> Result<()> {
        let leftover = match self.request(Msg::End { sent })? {
            Msg::Drain { leftover } if leftover <= MAX_WINDOW as u64 => leftover,
            m => bail!("peer answered End with {m:?}"),
        };
        self.ctrl.buffer().write_at(REQ_OFF, &Msg::Fill.encode());
        let reply = self.ctrl.slice(REPLY_OFF..REPLY_OFF + CTRL_LEN)?;
        self.ep.post_recv(&[reply], CTX_REPLY)?;
        for _ in 0..leftover {
            self.ep
                .post_send(&[self.ctrl.slice(REQ_OFF..REQ_OFF + CTRL_LEN)?], CTX_REQ)?;
        }
        let mut got = None;
        for _ in 0..=leftover {
            let c = self.next()?;
            if c.op == OpKind::Recv {
                got = Some(self.reply_frame(c.len)?);
            }
        }
        match got {
            Some(Msg::Done { received }) if received == bytes => Ok(()),
            m => bail!("send phase ended with {m:?}, expected Done {{ received: {bytes} }}"),
        }
    }

    fn peer_usage(&mut self) -> Result<Usage> {
        match self.request(Msg::Usage)? {
            Msg::UsageReply { cpu_us } => Ok(Usage { cpu_us }),
            m => bail!("peer answered Usage with {m:?}"),
        }
    }

    /// Sends one request frame and returns the reply frame.
    fn request(&mut self, m: Msg) -> Result<Msg> {
        self.ctrl.buffer().write_at(REQ_OFF, &m.encode());
        let reply = self.ctrl.slice(REPLY_OFF..REPLY_OFF + CTRL_LEN)?;
        self.ep.post_recv(&[reply], CTX_REPLY)?;
        let req = self.ctrl.slice(REQ_OFF..REQ_OFF + CTRL_LEN)?;
        self.ep.post_send(&[req], CTX_REQ)?;
        let len = self.pair()?;
        self.reply_frame(len)
    }

    /// Waits for one send and one receive completion (either order); returns the bytes received.
    fn pair(&self) -> Result<u64> {
        let (a, b) = (self.next()?, self.next()?);
        match (a.op, b.op) {
            (OpKind::Recv, OpKind::Send) => Ok(a.len),
            (OpKind::Send, OpKind::Recv) => Ok(b.len),
            ops => bail!("expected a send and a receive completion, got {ops:?}"),
        }
    }

    fn reply_frame(&self, len: u64) -> Result<Msg> {
        let mut frame = vec![0u8; usize::try_from(len)?.min(CTRL_LEN)];
        self.ctrl.buffer().read_at(REPLY_OFF, &mut frame);
        Msg::decode(&frame).context("reading the peer's reply")
    }

    /// The next completion, or the error it carries.
    fn next(&self) -> Result<Completion> {
        let c = self
            .ep
            .cq()
            .wait(OP_TIMEOUT)
            .context("waiting for a completion")?;
        match c.result {
            Ok(()) => Ok(c),
            Err(e) => Err(anyhow!(e).context(format!("{:?} completed with an error", c.op))),
        }
    }
}
