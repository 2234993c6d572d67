//! The measuring side of `bench exs`: spawns the peer, connects in one mode at a time, and
//! times what arrives. Every time is taken here, on the receiving side; the peer (the
//! sender) reports its CPU through the `usage` command.

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ferry_exs::proto::{EventKind, Flags};
use ferry_exs::runtime::{EventQueue, ExsBuf, ExsSocket};
use ferry_fabric::Address;

use super::cmd::{expect, number, Cmd};
use super::conn::{Conn, Mode, OP_TIMEOUT};
use crate::child::PeerProcess;
use crate::cpu::{self, Usage};
use crate::report::median;

/// Longest wait for a peer reply (a send phase's `done` follows the last recv closely).
const REPLY: Duration = Duration::from_secs(60);

/// One measurement.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    /// GB/s (10^9 B/s) for throughput, µs for latency.
    pub value: f64,
    /// Bytes received (0 for latency).
    pub bytes: u64,
    /// User+system CPU seconds of the sending process (the peer).
    pub send_cpu: f64,
    /// User+system CPU seconds of the receiving process (this one).
    pub recv_cpu: f64,
}

/// A peer process and, while one is open, an EXS connection to it.
pub struct Client {
    peer: PeerProcess,
    conn: Option<(Mode, Conn)>,
    /// The provider the EXS driver reported, once connected.
    pub provider: Option<String>,
}

impl Client {
    /// Spawns a peer that listens on `listen` (the driver's address).
    pub fn spawn(listen: &Address) -> Result<Client> {
        let mut peer = PeerProcess::spawn(&["exs-peer", "--listen", &listen.to_string()])?;
        expect(&peer.line(Duration::from_secs(15))?, "ready")?;
        Ok(Client {
            peer,
            conn: None,
            provider: None,
        })
    }

    /// Opens an EXS connection in `mode`, with `bytes` registered on each side (in
    /// persistent mode the peer exposes all of its `bytes` as the block).
    pub fn open(&mut self, mode: Mode, bytes: usize) -> Result<()> {
        self.close()?;
        let addr = call(
            &mut self.peer,
            Cmd::Open {
                mode,
                bytes: bytes as u64,
            },
            "addr",
        )?;
        let queue = EventQueue::new().context("creating an event queue")?;
        let sock = ExsSocket::connect(&addr, mode.config(), &queue, OP_TIMEOUT)
            .with_context(|| format!("connecting to the peer at {addr}"))?;
        expect(&self.peer.line(REPLY)?, "ok")?;
        self.provider = Some(sock.driver());
        self.conn = Some((mode, Conn::new(sock, queue, bytes)?));
        Ok(())
    }

    /// Closes the EXS connection, if one is open.
    pub fn close(&mut self) -> Result<()> {
        if let Some((_, c)) = self.conn.take() {
            c.close()?;
            call(&mut self.peer, Cmd::Close, "ok")?;
        }
        Ok(())
    }

    /// Receives `count` messages of `size` bytes, keeping `window` recvs posted. Normal and
    /// immediate: the peer sends them (`window` in flight), timed from the command until the
    /// last recv completes. Persistent: each recv pulls `size` bytes from offset 0 of the
    /// peer's block by RMA read, the peer doing nothing, timed from the first recv posted.
    /// GB/s = bytes received / that time.
    pub fn stream(&mut self, size: usize, count: u64, window: usize) -> Result<Measured> {
        let (mode, c) = self.conn.as_ref().context("no connection open")?;
        let peer = &mut self.peer;
        ensure!(size * window <= c.len(), "{window} × {size} B do not fit");
        let (u0, p0) = (cpu::self_usage(), peer_usage(peer)?);
        let first = (window as u64).min(count);
        let mut t0 = Instant::now();
        for i in 0..first {
            c.sock.recv(c.slot(i as usize, size)?, Flags::NONE, i);
        }
        if *mode != Mode::Persistent {
            let cmd = Cmd::Send {
                size: size as u64,
                count,
                window: window as u64,
            };
            peer.send(&cmd.to_string())?;
            t0 = Instant::now();
        }
        let (mut posted, mut done, mut bytes) = (first, 0u64, 0u64);
        while done < count {
            let ev = c.next()?;
            ensure!(
                ev.kind == EventKind::Recv,
                "a {:?} while receiving",
                ev.kind
            );
            ensure!(ev.len == size as u64, "received {} B of {size}", ev.len);
            bytes += ev.len;
            done += 1;
            if posted < count {
                let buf = ev.buf.context("recv event without its buffer")?;
                c.sock.recv(buf, Flags::NONE, posted);
                posted += 1;
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        if *mode != Mode::Persistent {
            expect(&peer.line(REPLY)?, "done")?;
        }
        ferry_fabric::timeline::flush();
        let (u1, p1) = (cpu::self_usage(), peer_usage(peer)?);
        Ok(Measured {
            value: bytes as f64 / secs / 1e9,
            bytes,
            send_cpu: p1.secs_since(p0),
            recv_cpu: u1.secs_since(u0),
        })
    }

    /// Median one-way latency in µs over `count` rounds after `warm` unrecorded ones, as
    /// the UNH-EXS paper measures it (its figure 10: a "ping" round trip divided by two).
    /// Normal and immediate: the round trip is a recv posted, a ping sent, and the peer's
    /// `size`-byte answer received. Persistent: the round trip is a `size`-byte recv against
    /// the peer's exposed block, from posting to completion: the RMA read's request and
    /// response, with the sender uninvolved (no advertisement, no acknowledgment, which is
    /// where the paper's 30-45 % of normal latency comes from). Both sides block in their
    /// dequeues.
    pub fn latency(&mut self, size: usize, warm: usize, count: usize) -> Result<Measured> {
        let (mode, c) = self.conn.as_ref().context("no connection open")?;
        let peer = &mut self.peer;
        let (u0, p0) = (cpu::self_usage(), peer_usage(peer)?);
        let rounds = warm + count;
        let mut rbuf = Some(c.slot(0, size)?);
        let mut sbuf = Some(c.slot(1, size)?);
        let mut us = Vec::with_capacity(count);
        if *mode != Mode::Persistent {
            let cmd = Cmd::Pong {
                size: size as u64,
                count: rounds as u64,
            };
            peer.send(&cmd.to_string())?;
        }
        for i in 0..rounds {
            let r = rbuf.take().context("recv buffer still out")?;
            let t = Instant::now();
            c.sock.recv(r, Flags::NONE, i as u64);
            let ping = *mode != Mode::Persistent;
            if ping {
                c.sock.send(take(&mut sbuf)?, Flags::NONE, i as u64);
            }
            let mut elapsed = None;
            while rbuf.is_none() || (ping && sbuf.is_none()) {
                let ev = c.next()?;
                ensure!(ev.len == size as u64, "{:?} of {} B", ev.kind, ev.len);
                let buf = Some(ev.buf.context("event without its buffer")?);
                if ev.kind == EventKind::Recv {
                    elapsed = Some(t.elapsed().as_secs_f64() * 1e6);
                    rbuf = buf;
                } else {
                    sbuf = buf;
                }
            }
            let e = elapsed.context("no recv completed")?;
            if i >= warm {
                us.push(e / 2.0);
            }
        }
        if *mode != Mode::Persistent {
            expect(&peer.line(REPLY)?, "done")?;
        }
        let (u1, p1) = (cpu::self_usage(), peer_usage(peer)?);
        Ok(Measured {
            value: median(&mut us).context("no round completed")?,
            bytes: 0,
            send_cpu: p1.secs_since(p0),
            recv_cpu: u1.secs_since(u0),
        })
    }

    /// The reference: the peer writes `total` bytes as `size`-byte messages to a blocking
    /// `std::net::TcpStream` over loopback, this process reads each whole message
    /// (`read_exact`); both sides take their buffers in turn from as many as EXS keeps in
    /// flight at that size. GB/s = bytes read / time from connecting until the last byte.
    pub fn blast(&mut self, size: usize, total: u64) -> Result<Measured> {
        let peer = &mut self.peer;
        // Whole messages into buffers taken in turn, as many as EXS keeps in flight (see
        // the peer's `blast`).
        let mut bufs: Vec<Vec<u8>> = (0..super::grid::window(size))
            .map(|_| vec![1u8; size])
            .collect();
        let (u0, p0) = (cpu::self_usage(), peer_usage(peer)?);
        let blast = Cmd::Blast {
            size: size as u64,
            total,
        };
        let port: u16 = call(peer, blast, "port")?
            .parse()
            .context("peer's blast port")?;
        let t0 = Instant::now();
        let mut s = TcpStream::connect(("127.0.0.1", port)).context("connecting the blast")?;
        let mut bytes = 0u64;
        for i in (0..bufs.len()).cycle() {
            if bytes >= total {
                break;
            }
            let n = (total - bytes).min(size as u64) as usize;
            s.read_exact(&mut bufs[i][..n])
                .with_context(|| format!("blast ended after {bytes} of {total} B"))?;
            bytes += n as u64;
        }
        let secs = t0.elapsed().as_secs_f64();
        expect(&peer.line(REPLY)?, "done")?;
        let (u1, p1) = (cpu::self_usage(), peer_usage(peer)?);
        Ok(Measured {
            value: bytes as f64 / secs / 1e9,
            bytes,
            send_cpu: p1.secs_since(p0),
            recv_cpu: u1.secs_since(u0),
        })
    }
}

fn take(b: &mut Option<ExsBuf>) -> Result<ExsBuf> {
    b.take().context("send buffer still out")
}

/// Sends `cmd` and returns the rest of the reply after `word`.
fn call(peer: &mut PeerProcess, cmd: Cmd, word: &str) -> Result<String> {
    peer.send(&cmd.to_string())?;
    Ok(expect(&peer.line(REPLY)?, word)?.to_string())
}

fn peer_usage(peer: &mut PeerProcess) -> Result<Usage> {
    let cpu_us = number(&call(peer, Cmd::Usage, "usage")?)?;
    Ok(Usage { cpu_us })
}
