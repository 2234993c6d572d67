//! The hidden `ferry bench fabric-peer` process: listens, prints its bound address on stdout,
//! accepts one connection and serves the client's measurements (see [`super::proto`]).

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ferry_fabric::{Access, Address, Buffer, Completion, Endpoint, MemoryRegion, OpKind};

use super::cpu;
use super::proto::{Msg, CTRL_LEN, PING_LEN, UNPACK_BLOCKS};
use ferry_noncontig::{unpack_from_buffer, Datatype, LocalLayout};

/// Longest the peer waits for its client between requests (the client interleaves other work).
const IDLE: Duration = Duration::from_secs(600);
/// Longest the peer waits for any single message inside a phase.
const STEP: Duration = Duration::from_secs(30);
/// Longest a send phase may last, and the peer's whole life.
const PHASE_MAX: Duration = Duration::from_secs(120);
const LIFETIME: Duration = Duration::from_secs(3 * 3600);
/// Largest target region a client may ask for.
const MAX_REGION: u64 = 1 << 30;

// Control region layout: one receive frame, one pong, then a ring of reply frames.
const RECV_OFF: usize = 0;
const PONG_OFF: usize = CTRL_LEN;
const RING_OFF: usize = 2 * CTRL_LEN;
const RING: usize = 4;

const CTX_CTRL: u64 = 1 << 62;
const CTX_BULK: u64 = 2 << 62;

/// Runs the peer until the client says goodbye, disconnects, or the parent goes away.
pub fn run(listen: &str) -> Result<()> {
    // The parent holds our stdin; when it exits (or is killed) the pipe closes and so do we.
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
    let listener = listen
        .parse::<Address>()
        .map_err(anyhow::Error::from)
        .and_then(|a| ferry_fabric::listen(&a).with_context(|| format!("listening on {a}")));
    // First stdout line, for the parent: `addr URL` or `error MESSAGE`.
    let line = match &listener {
        Ok(l) => format!("addr {}", l.local_addr()),
        Err(e) => format!("error {e:#}"),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush())?;
    drop(out);
    let Ok(listener) = listener else {
        std::process::exit(2); // the parent reports the error
    };
    let ep = listener
        .accept(Duration::from_secs(30))
        .context("waiting for the bench client")?;
    tracing::debug!(peer = %ep.peer(), "bench client connected");
    // The bench client is this process's parent: nothing to authenticate.
    ep.enable_remote_access();
    let ctrl = ep
        .domain()
        .register(&Buffer::new(RING_OFF + RING * CTRL_LEN), Access::LOCAL)
        .context("registering control buffers")?;
    let mut peer = Peer {
        ep,
        ctrl,
        bulk: None,
        ring: 0,
    };
    peer.serve()
}

struct Peer {
    ep: Box<dyn Endpoint>,
    ctrl: MemoryRegion,
    bulk: Option<MemoryRegion>,
    ring: usize,
}

impl Peer {
    fn serve(&mut self) -> Result<()> {
        self.post_ctrl_recv()?;
        let born = Instant::now();
        while born.elapsed() < LIFETIME {
            let c = self.next_recv(IDLE)?;
            if c.len == PING_LEN as u64 {
                self.post_ctrl_recv()?;
                let pong = self.ctrl.slice(PONG_OFF..PONG_OFF + PING_LEN)?;
                self.ep.post_send(&[pong], CTX_CTRL)?;
                continue;
            }
            let msg = self.ctrl_frame(&c)?;
            match msg {
                Msg::Hello { bytes } => {
                    ensure!(
                        bytes > 0 && bytes <= MAX_REGION,
                        "region of {bytes} B refused"
                    );
                    let region = self
                        .ep
                        .domain()
                        .register(&Buffer::new(bytes as usize), Access::ALL)
                        .context("registering the target region")?;
                    // Real data, like the memory the measured side moves: never-written
                    // pages are the kernel's shared zero page, which RMA reads (shm's CMA
                    // copy above all) would read from cache instead of memory.
                    region.buffer().fill(0x3c);
                    self.ep.grant(&region)?;
                    let advert = Msg::Advert(region.remote(..)?);
                    self.bulk = Some(region);
                    self.post_ctrl_recv()?;
                    self.reply(advert)?;
                }
                Msg::Usage => {
                    // Between measurements: a good moment to write the timeline
                    // (FERRY_TIMELINE, off by default).
                    ferry_fabric::timeline::flush();
                    self.post_ctrl_recv()?;
                    self.reply(usage())?;
                }
                Msg::SendPhase { size, slots } => self.send_phase(size, slots)?,
                Msg::Unpack {
                    size,
                    stride,
                    stage,
                    origin,
                } => {
                    self.unpack(size, stride, stage, origin)?;
                    self.post_ctrl_recv()?;
                    self.reply(Msg::Done { received: size })?;
                }
                Msg::Notify { bytes } => {
                    self.post_ctrl_recv()?;
                    self.reply(Msg::Done { received: bytes })?;
                }
                Msg::Bye => return self.goodbye(),
                other => bail!("unexpected request {other:?}"),
            }
        }
        bail!("peer lived {LIFETIME:?}; giving up")
    }

    /// Receives a stream of `size`-byte sends into `slots` rotating receives.
    fn send_phase(&mut self, size: u64, slots: u64) -> Result<()> {
        let bulk = self.bulk.clone().context("send phase before Hello")?;
        let fits = size
            .checked_mul(slots)
            .is_some_and(|n| n <= bulk.len() as u64);
        ensure!(
            size > CTRL_LEN as u64 && slots > 0 && fits,
            "bad send phase {size}×{slots}"
        );
        let slot = |i: u64| bulk.slice((i * size) as usize..((i + 1) * size) as usize);
        for i in 0..slots {
            self.ep.post_recv(&[slot(i)?], CTX_BULK | i)?;
        }
        let mut posted = slots;
        self.reply(Msg::Ready)?;
        let (mut received, mut bytes, mut end) = (0u64, 0u64, None);
        let started = Instant::now();
        while end != Some(received) {
            ensure!(
                started.elapsed() < PHASE_MAX,
                "send phase longer than {PHASE_MAX:?}"
            );
            let c = self.next_recv(STEP)?;
            let i = c.context & !CTX_BULK;
            ensure!(
                c.context & CTX_BULK != 0 && i < slots,
                "stray completion in send phase"
            );
            if c.len == CTRL_LEN as u64 {
                let mut frame = [0u8; CTRL_LEN];
                bulk.buffer().read_at((i * size) as usize, &mut frame);
                match Msg::decode(&frame)? {
                    Msg::End { sent } if end.is_none() => end = Some(sent),
                    other => bail!("unexpected {other:?} in send phase"),
                }
                continue;
            }
            received += 1;
            bytes += c.len;
            if end.is_none() {
                self.ep.post_recv(&[slot(i)?], CTX_BULK | i)?;
                posted += 1;
            }
            ensure!(
                !matches!(end, Some(s) if received > s),
                "more messages than announced"
            );
        }
        let leftover = posted - received - 1;
        self.reply(Msg::Drain { leftover })?;
        for _ in 0..leftover {
            let c = self.next_recv(STEP)?;
            ensure!(c.len == CTRL_LEN as u64, "expected a fill frame");
        }
        self.post_ctrl_recv()?;
        self.reply(Msg::Done { received: bytes })
    }

    /// Unpacks `size` bytes at `stage` of the target region into the noncontiguous layout
    /// [`Msg::Unpack`] names; every figure comes from the client and is checked (by the
    /// engine's layout and range checks) before a byte is copied.
    fn unpack(&mut self, size: u64, stride: u64, stage: u64, origin: u64) -> Result<()> {
        let region = self.bulk.clone().context("Unpack before Hello")?;
        ensure!(
            size.is_multiple_of(UNPACK_BLOCKS) && size > 0,
            "unpack size {size} not a multiple of {UNPACK_BLOCKS}"
        );
        let stride = i64::try_from(stride).context("unpack stride")?;
        let dtype = Datatype::hvector(
            UNPACK_BLOCKS,
            size / UNPACK_BLOCKS,
            stride,
            &Datatype::byte(),
        )?;
        let origin = usize::try_from(origin).context("unpack origin")?;
        let layout = LocalLayout::new(region.clone(), origin, dtype, 1);
        let (stage, size) = (usize::try_from(stage)?, usize::try_from(size)?);
        let n = unpack_from_buffer(&layout, 0, region.buffer(), stage, size)?;
        ensure!(n == size, "unpacked {n} of {size} bytes");
        Ok(())
    }

    /// Reports final usage, then waits (bounded) for the client to hang up first.
    fn goodbye(&mut self) -> Result<()> {
        self.post_ctrl_recv()?;
        self.reply(usage())?;
        let _ = self.ep.cq().wait_many(2, Duration::from_secs(5));
        Ok(())
    }

    fn post_ctrl_recv(&self) -> Result<()> {
        let s = self.ctrl.slice(RECV_OFF..RECV_OFF + CTRL_LEN)?;
        Ok(self.ep.post_recv(&[s], CTX_CTRL)?)
    }

    fn ctrl_frame(&self, c: &Completion) -> Result<Msg> {
        ensure!(
            c.context == CTX_CTRL,
            "unexpected completion context {:#x}",
            c.context
        );
        let len = usize::try_from(c.len)?.min(CTRL_LEN);
        let mut frame = vec![0u8; len];
        self.ctrl.buffer().read_at(RECV_OFF, &mut frame);
        Msg::decode(&frame)
    }

    /// Sends a reply from the next ring slot; the client reads each reply before its next
    /// request, so a slot is long free when it comes round again.
    fn reply(&mut self, m: Msg) -> Result<()> {
        let off = RING_OFF + self.ring * CTRL_LEN;
        self.ring = (self.ring + 1) % RING;
        self.ctrl.buffer().write_at(off, &m.encode());
        Ok(self
            .ep
            .post_send(&[self.ctrl.slice(off..off + CTRL_LEN)?], CTX_CTRL)?)
    }

    /// The next receive completion, checking (and dropping) send completions on the way.
    fn next_recv(&self, timeout: Duration) -> Result<Completion> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let c = self.ep.cq().wait(left).context("waiting for the client")?;
            if let Err(e) = &c.result {
                bail!("{:?} failed: {e}", c.op);
            }
            if c.op == OpKind::Recv {
                return Ok(c);
            }
        }
    }
}

fn usage() -> Msg {
    Msg::UsageReply {
        cpu_us: cpu::self_usage().cpu_us,
    }
}
