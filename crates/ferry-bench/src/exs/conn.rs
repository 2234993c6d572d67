//! What both processes of `bench exs` share: the transfer modes and their EXS configuration,
//! and one connection with its event queue and registered memory.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ferry_exs::proto::{Config, EventKind, MAX_IMMEDIATE};
use ferry_exs::runtime::{EventQueue, ExsBuf, ExsEvent, ExsSocket};
use ferry_fabric::MemoryRegion;

/// Longest wait for any one EXS event before the run is declared stuck.
pub const OP_TIMEOUT: Duration = Duration::from_secs(20);

/// How a message travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `small_packet_max_size = 0`: every message is ADVERT, RMA read by the receiver, ACK.
    Normal,
    /// `small_packet_max_size = 65536`: messages up to that size ride inside the ADVERT.
    Immediate,
    /// The sender posts one PERSISTENT send of a block; every recv pulls from it by RMA read,
    /// with no work on the sender's side.
    Persistent,
}

impl Mode {
    /// Every mode, in table order.
    pub const ALL: [Mode; 3] = [Mode::Normal, Mode::Immediate, Mode::Persistent];

    /// Name as used in rows and on the peer's command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Normal => "normal",
            Mode::Immediate => "immediate",
            Mode::Persistent => "persistent",
        }
    }

    /// The mode named `s`.
    pub fn parse(s: &str) -> Result<Mode> {
        match Mode::ALL.into_iter().find(|m| m.name() == s) {
            Some(m) => Ok(m),
            None => bail!("unknown mode {s:?}"),
        }
    }

    /// The EXS configuration of both sides (pull rendezvous, default credits).
    pub fn config(self) -> Config {
        let small = match self {
            Mode::Immediate => MAX_IMMEDIATE,
            Mode::Normal | Mode::Persistent => 0,
        };
        Config {
            small_packet_max_size: small,
            push: false,
            ..Config::default()
        }
    }

    /// Largest message this mode measures (immediate stops at the immediate limit).
    pub fn max_size(self) -> u64 {
        match self {
            Mode::Immediate => u64::from(MAX_IMMEDIATE),
            Mode::Normal | Mode::Persistent => u64::MAX,
        }
    }
}

/// How a side waits for its next event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// A blocking dequeue (`exs_qdequeue(q, ev, 1, timeout)`).
    Block,
    /// Polling: zero-timeout dequeues in a loop (`exs_qdequeue(q, ev, 1, 0)`), through the
    /// same runtime calls the C API's zero-timeout dequeue makes.
    Poll,
}

/// One EXS connection, its event queue, and one registered region carved into slots.
pub struct Conn {
    /// The socket.
    pub sock: ExsSocket,
    /// Where its events arrive.
    pub queue: EventQueue,
    region: MemoryRegion,
}

impl Conn {
    /// Registers `bytes` of memory for `sock` and touches every page (so no page fault lands
    /// inside a measurement).
    pub fn new(sock: ExsSocket, queue: EventQueue, bytes: usize) -> Result<Conn> {
        let whole = sock
            .alloc(bytes)
            .with_context(|| format!("registering {bytes} B"))?;
        let region = whole.region().clone();
        region.buffer().fill(0x5a);
        Ok(Conn {
            sock,
            queue,
            region,
        })
    }

    /// Bytes registered.
    pub fn len(&self) -> usize {
        self.region.len()
    }

    /// Slot `i` of `size` bytes: `i * size .. (i + 1) * size` of the region.
    pub fn slot(&self, i: usize, size: usize) -> Result<ExsBuf> {
        let end = (i + 1)
            .checked_mul(size)
            .filter(|&e| e <= self.len())
            .with_context(|| format!("slot {i} of {size} B outside {} B", self.len()))?;
        Ok(ExsBuf::new(self.region.clone()).slice(i * size..end)?)
    }

    /// The next event, which must have succeeded and be a Send or Recv.
    pub fn next(&self) -> Result<ExsEvent> {
        self.next_with(Wait::Block)
    }

    /// The next event, waited for as `wait` says; it must have succeeded and be a Send or
    /// Recv.
    pub fn next_with(&self, wait: Wait) -> Result<ExsEvent> {
        let ev = match wait {
            Wait::Block => self.queue.dequeue(OP_TIMEOUT),
            Wait::Poll => self.poll(),
        };
        let ev = ev.with_context(|| format!("no EXS event within {OP_TIMEOUT:?}"))?;
        if let Err(e) = ev.result {
            bail!("EXS {:?} (ctx {}) failed: {e}", ev.kind, ev.ctx);
        }
        match ev.kind {
            EventKind::Send | EventKind::Recv => Ok(ev),
            k => bail!("unexpected EXS event {k:?}"),
        }
    }

    /// Zero-timeout dequeues until an event comes (None after [`OP_TIMEOUT`]): each one is
    /// what the C API's `exs_qdequeue(q, ev, 1, 0)` does, a look at the queue and, if it is
    /// empty, the completions handled on this thread (`drive_now`) and another look.
    fn poll(&self) -> Option<ExsEvent> {
        let deadline = Instant::now() + OP_TIMEOUT;
        loop {
            if let Some(ev) = self.queue.try_dequeue() {
                return Some(ev);
            }
            self.queue.drive_now();
            if let Some(ev) = self.queue.try_dequeue() {
                return Some(ev);
            }
            if Instant::now() >= deadline {
                return None;
            }
        }
    }

    /// Closes the socket and waits (bounded) for its Close event; operations still posted
    /// (a persistent send) come back cancelled on the way.
    pub fn close(self) -> Result<()> {
        if self.sock.is_connected() {
            let _ = self.sock.close();
        }
        self.wait_closed()
    }

    /// Waits (bounded) for the Close event the peer's close causes.
    pub fn wait_closed(self) -> Result<()> {
        let deadline = Instant::now() + OP_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.queue.dequeue(left) {
                Some(ev) if ev.kind == EventKind::Close => return Ok(()),
                Some(_) => continue,
                None if !self.sock.is_connected() => return Ok(()),
                None => bail!("EXS connection did not close within {OP_TIMEOUT:?}"),
            }
        }
    }
}
