//! The hidden `ferry bench exs-pingpong`: the Rust twin of the C conformance suite's
//! `tests/c/latency.c`, the reference the C-API and polling rows are paired with.
//!
//! Same roles, arguments, buffers, order of calls and output line as the C program, through
//! the Rust runtime instead of libferry, so that the two differ only in the API:
//!
//! ```text
//! ferry bench exs-pingpong server LISTEN_URL ADDR_FILE ROUNDS WARM SMALL_MAX POLL_FIRST
//! ferry bench exs-pingpong client ADDR ROUNDS WARM SMALL_MAX POLL_FIRST
//! ```
//!
//! ROUNDS recorded round trips of a 10-byte message after WARM unrecorded ones, once with
//! blocking dequeues and once polling (zero-timeout dequeues in a loop), the polling phase
//! first when POLL_FIRST is 1; SMALL_MAX is the client's small packet size (0: normal mode,
//! every message read by RMA). The client prints the median one-way latency (half the round
//! trip) of each phase.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use ferry_exs::proto::{Config, Flags};
use ferry_exs::runtime::{EventQueue, ExsBuf, ExsListener, ExsSocket};

use super::conn::{Conn, Wait, OP_TIMEOUT};
use crate::report::median;

/// Bytes per message (as `tests/c/latency.c`).
pub const LEN: usize = 10;
/// Bytes of each of the two buffers (a page each, as the C program allocates them).
const BUF: usize = 4096;
/// Contexts of the recv and the send (as the C program's `ctx_of(1)`, `ctx_of(2)`).
const CTX_RECV: u64 = 1;
const CTX_SEND: u64 = 2;

/// What both roles take after their own arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opts {
    /// Recorded round trips per phase.
    pub rounds: usize,
    /// Unrecorded round trips before them.
    pub warm: usize,
    /// The client's `small_packet_max_size`.
    pub small: u32,
    /// Whether the polling phase comes first.
    pub poll_first: bool,
}

impl Opts {
    /// The arguments, in the order both programs take them.
    pub fn args(&self) -> [String; 4] {
        [
            self.rounds.to_string(),
            self.warm.to_string(),
            self.small.to_string(),
            u8::from(self.poll_first).to_string(),
        ]
    }

    fn parse(a: &[String]) -> Result<Opts> {
        ensure!(a.len() == 4, "expected ROUNDS WARM SMALL_MAX POLL_FIRST");
        let n = |i: usize| -> Result<u64> {
            a[i].parse()
                .with_context(|| format!("bad number {:?}", a[i]))
        };
        let rounds = n(0)?;
        ensure!((1..=10_000_000).contains(&rounds), "rounds {rounds}");
        let warm = n(1)?;
        ensure!(warm <= 10_000_000, "warm-up {warm}");
        let small = u32::try_from(n(2)?).context("small packet size")?;
        let poll_first = match n(3)? {
            0 => false,
            1 => true,
            v => bail!("POLL_FIRST is 0 or 1, not {v}"),
        };
        Ok(Opts {
            rounds: rounds as usize,
            warm: warm as usize,
            small,
            poll_first,
        })
    }

    /// The two phases, in the order they run.
    fn phases(&self) -> [Wait; 2] {
        match self.poll_first {
            true => [Wait::Poll, Wait::Block],
            false => [Wait::Block, Wait::Poll],
        }
    }
}

/// Runs one role; `args` are the words after `exs-pingpong`.
pub fn run(args: &[String]) -> Result<()> {
    let role = args.first().map(String::as_str);
    match role {
        Some("server") if args.len() == 7 => {
            let o = Opts::parse(&args[3..])?;
            server(&args[1], Path::new(&args[2]), o)
        }
        Some("client") if args.len() == 6 => client(&args[1], Opts::parse(&args[2..])?),
        _ => bail!(
            "usage: exs-pingpong server LISTEN_URL ADDR_FILE ROUNDS WARM SMALL_MAX POLL_FIRST \
             | client ADDR ROUNDS WARM SMALL_MAX POLL_FIRST"
        ),
    }
}

/// The configuration of a side: pull rendezvous (the C API's default on every driver),
/// `small` as the small packet size.
fn config(small: u32) -> Config {
    Config {
        small_packet_max_size: small,
        push: false,
        ..Config::default()
    }
}

/// Accepts one connection, answers every ping in both phases, waits for the client to close.
fn server(listen: &str, addr_file: &Path, o: Opts) -> Result<()> {
    let listener = ExsListener::bind(listen, config(Config::default().small_packet_max_size))
        .with_context(|| format!("listening on {listen}"))?;
    publish(addr_file, &listener.local_addr())?;
    let queue = EventQueue::new().context("creating an event queue")?;
    let sock = listener
        .accept(&queue, OP_TIMEOUT)
        .context("accepting the client")?;
    let c = Conn::new(sock, queue, 2 * BUF)?;
    let total = o.warm + o.rounds;
    for wait in o.phases() {
        serve_phase(&c, wait, total)?;
    }
    c.wait_closed()
}

/// Writes the address to a temporary file renamed into place (the reader never sees half).
fn publish(file: &Path, addr: &str) -> Result<()> {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, addr).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, file).with_context(|| format!("renaming to {}", file.display()))
}

/// The server's side of one phase: a recv kept posted for the next ping, re-posted as soon
/// as a ping is in and before the answer goes out (as the C server and `bench exs`'s peer).
fn serve_phase(c: &Conn, wait: Wait, total: usize) -> Result<()> {
    let (mut rbuf, mut sbuf) = buffers(c)?;
    c.sock.recv(take(&mut rbuf)?, Flags::NONE, CTX_RECV);
    let mut ping_in = false;
    for r in 0..total {
        let seed = 2 * r as u64 + 1;
        fill(sbuf.as_ref().context("send buffer out")?, seed)?;
        if !ping_in {
            let ev = c.next_with(wait)?;
            ensure!(ev.ctx == CTX_RECV, "expected the recv");
            rbuf = ev.buf;
        }
        ping_in = false;
        check(rbuf.as_ref().context("recv buffer out")?, seed - 1)?;
        if r + 1 < total {
            c.sock.recv(take(&mut rbuf)?, Flags::NONE, CTX_RECV);
        }
        c.sock.send(take(&mut sbuf)?, Flags::NONE, CTX_SEND);
        loop {
            let ev = c.next_with(wait)?;
            if ev.ctx == CTX_SEND {
                sbuf = ev.buf;
                break;
            }
            ensure!(ev.ctx == CTX_RECV && !ping_in, "unexpected event");
            rbuf = ev.buf;
            ping_in = true;
        }
    }
    Ok(())
}

/// Connects, pings in both phases, prints the medians, closes.
fn client(addr: &str, o: Opts) -> Result<()> {
    let queue = EventQueue::new().context("creating an event queue")?;
    let sock = ExsSocket::connect(addr, config(o.small), &queue, OP_TIMEOUT)
        .with_context(|| format!("connecting to {addr}"))?;
    let c = Conn::new(sock, queue, 2 * BUF)?;
    let mut block = f64::NAN;
    let mut poll = f64::NAN;
    for wait in o.phases() {
        let m = ping_phase(&c, wait, o)?;
        match wait {
            Wait::Block => block = m,
            Wait::Poll => poll = m,
        }
    }
    println!(
        "latency client: one-way latency, {LEN} B, median of {}: blocking {block:.2} us, \
         polling {poll:.2} us",
        o.rounds
    );
    c.close()
}

/// The client's side of one phase: the median one-way latency, µs. A round trip runs from
/// posting the recv and the ping to the recv's event (the send's event and the check of the
/// bytes are outside it, as in the C client).
fn ping_phase(c: &Conn, wait: Wait, o: Opts) -> Result<f64> {
    let (mut rbuf, mut sbuf) = buffers(c)?;
    let mut us = Vec::with_capacity(o.rounds);
    for r in 0..o.warm + o.rounds {
        let seed = 2 * r as u64;
        fill(sbuf.as_ref().context("send buffer out")?, seed)?;
        let t0 = Instant::now();
        c.sock.recv(take(&mut rbuf)?, Flags::NONE, CTX_RECV);
        c.sock.send(take(&mut sbuf)?, Flags::NONE, CTX_SEND);
        let mut recv_at = None;
        while rbuf.is_none() || sbuf.is_none() {
            let ev = c.next_with(wait)?;
            if ev.ctx == CTX_RECV {
                recv_at = Some(t0.elapsed());
                rbuf = ev.buf;
            } else {
                sbuf = ev.buf;
            }
        }
        let rtt = recv_at.context("no recv event")?;
        check(rbuf.as_ref().context("recv buffer out")?, seed + 1)?;
        if r >= o.warm {
            us.push(rtt.as_secs_f64() * 1e6 / 2.0);
        }
    }
    median(&mut us).context("no round recorded")
}

/// The recv and send buffers: [`LEN`] bytes at the start of a page each.
fn buffers(c: &Conn) -> Result<(Option<ExsBuf>, Option<ExsBuf>)> {
    let page = |i| -> Result<ExsBuf> { Ok(c.slot(i, BUF)?.slice(..LEN)?) };
    Ok((Some(page(0)?), Some(page(1)?)))
}

fn take(b: &mut Option<ExsBuf>) -> Result<ExsBuf> {
    b.take().context("buffer still out")
}

/// The bytes of message `seed`.
fn pattern(seed: u64) -> [u8; LEN] {
    std::array::from_fn(|i| (seed.wrapping_mul(31).wrapping_add(i as u64) % 251) as u8)
}

fn fill(b: &ExsBuf, seed: u64) -> Result<()> {
    Ok(b.write_at(0, &pattern(seed))?)
}

fn check(b: &ExsBuf, seed: u64) -> Result<()> {
    ensure!(b.to_vec() == pattern(seed), "message {seed}: bytes differ");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_round_trip_and_bad_ones_are_refused() {
        let o = Opts {
            rounds: 400,
            warm: 100,
            small: 0,
            poll_first: true,
        };
        assert_eq!(Opts::parse(&o.args()).unwrap(), o);
        assert_eq!(o.phases(), [Wait::Poll, Wait::Block]);
        let words = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        for bad in ["0 1 0 0", "1 1 0 2", "1 1 0", "1 x 0 0", "1 1 -1 0"] {
            assert!(Opts::parse(&words(bad)).is_err(), "{bad}");
        }
        assert!(run(&words("server x")).is_err());
    }

    #[test]
    fn messages_differ_by_seed() {
        assert_ne!(pattern(0), pattern(1));
        assert_eq!(pattern(7), pattern(7));
    }
}
