//! The hidden `ferry bench exs-peer` process: the sending side of every `bench exs`
//! measurement (EXS sender, pong side, owner of the persistent block, TCP blast writer),
//! driven by command lines on stdin (see [`super::cmd`]). It exits when stdin closes.

use std::io::{BufRead, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ferry_exs::proto::{EventKind, Flags};
use ferry_exs::runtime::{EventQueue, ExsBuf, ExsListener};
use ferry_fabric::Address;

use super::cmd::Cmd;
use super::conn::{Conn, Mode};
use crate::cpu;

/// Longest wait for the client to connect.
const ACCEPT: Duration = Duration::from_secs(30);
/// Largest region a client may ask for.
const MAX_REGION: u64 = 1 << 30;
/// Context of the persistent block's send.
const CTX_BLOCK: u64 = u64::MAX;

/// Runs the peer until stdin closes. `listen` is the driver's address; each EXS connection
/// listens on it afresh (port 0, or the shm name with a `-N` suffix).
pub fn run(listen: &str) -> Result<()> {
    let mut peer = Peer {
        base: listen.to_string(),
        n: 0,
        conn: None,
        listener: None,
    };
    match listen.parse::<Address>() {
        Ok(_) => say("ready")?,
        Err(e) => {
            say(&format!("error {e}"))?;
            std::process::exit(2);
        }
    }
    for line in std::io::stdin().lock().lines() {
        let line = line.context("reading commands")?;
        let reply = Cmd::parse(&line).and_then(|c| peer.serve(c));
        match reply {
            Ok(r) => say(&r)?,
            Err(e) => say(&format!("error {}", format!("{e:#}").replace('\n', " ")))?,
        }
    }
    Ok(())
}

/// Prints one reply line.
fn say(line: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .context("writing to the client")
}

struct Peer {
    base: String,
    n: usize,
    conn: Option<Conn>,
    listener: Option<ExsListener>,
}

impl Peer {
    fn serve(&mut self, cmd: Cmd) -> Result<String> {
        match cmd {
            Cmd::Open { mode, bytes } => self.open(mode, bytes),
            Cmd::Send {
                size,
                count,
                window,
            } => self.send(size, count, window),
            Cmd::Pong { size, count } => self.pong(size, count),
            Cmd::Close => {
                if let Some(c) = self.conn.take() {
                    c.close()?;
                }
                self.listener = None;
                Ok("ok".into())
            }
            Cmd::Usage => Ok(format!("usage {}", cpu::self_usage().cpu_us)),
            Cmd::Blast { size, total } => blast(size, total),
        }
    }

    fn open(&mut self, mode: Mode, bytes: u64) -> Result<String> {
        ensure!(self.conn.is_none(), "a connection is already open");
        ensure!(
            bytes > 0 && bytes <= MAX_REGION,
            "region of {bytes} B refused"
        );
        self.n += 1;
        let url = match self.base.starts_with("ofi+shm://") {
            true => format!("{}-{}", self.base, self.n),
            false => self.base.clone(),
        };
        let listener = ExsListener::bind(&url, mode.config())
            .with_context(|| format!("listening on {url}"))?;
        say(&format!("addr {}", listener.local_addr()))?;
        let queue = EventQueue::new().context("creating an event queue")?;
        let sock = listener
            .accept(&queue, ACCEPT)
            .context("accepting the bench client")?;
        let conn = Conn::new(sock, queue, bytes as usize)?;
        if mode == Mode::Persistent {
            let block = conn.slot(0, bytes as usize)?;
            conn.sock.send(block, Flags::PERSISTENT, CTX_BLOCK);
        }
        self.conn = Some(conn);
        self.listener = Some(listener);
        Ok("ok".into())
    }

    fn conn(&self, size: u64, slots: u64) -> Result<(&Conn, usize)> {
        let c = self.conn.as_ref().context("no connection open")?;
        let fits = size.checked_mul(slots).is_some_and(|b| b <= c.len() as u64);
        ensure!(
            size > 0 && slots > 0 && fits,
            "{slots} × {size} B do not fit"
        );
        Ok((c, size as usize))
    }

    /// `count` sends of `size` bytes with `window` in flight.
    fn send(&mut self, size: u64, count: u64, window: u64) -> Result<String> {
        let (c, sz) = self.conn(size, window)?;
        let mut free: Vec<ExsBuf> = (0..window as usize)
            .map(|i| c.slot(i, sz))
            .collect::<Result<_>>()?;
        let (mut sent, mut done) = (0u64, 0u64);
        while done < count {
            while sent < count {
                let Some(b) = free.pop() else { break };
                c.sock.send(b, Flags::NONE, sent);
                sent += 1;
            }
            let ev = c.next()?;
            ensure!(ev.kind == EventKind::Send, "a {:?} while sending", ev.kind);
            ensure!(ev.len == size, "sent {} B of {size}", ev.len);
            free.push(ev.buf.context("send event without its buffer")?);
            done += 1;
        }
        ferry_fabric::timeline::flush();
        Ok("done".into())
    }

    /// Answers `count` messages of `size` bytes with one message of `size` bytes each.
    fn pong(&mut self, size: u64, count: u64) -> Result<String> {
        const SENDS: usize = 4;
        let (c, sz) = self.conn(size, 1 + SENDS as u64)?;
        let mut free: Vec<ExsBuf> = (1..=SENDS).map(|i| c.slot(i, sz)).collect::<Result<_>>()?;
        c.sock.recv(c.slot(0, sz)?, Flags::NONE, 0);
        let (mut got, mut owed, mut sent) = (0u64, 0u64, 0u64);
        let started = Instant::now();
        while sent < count {
            ensure!(
                started.elapsed() < Duration::from_secs(600),
                "ping-pong too long"
            );
            let ev = c.next()?;
            let buf = ev.buf.context("event without its buffer")?;
            match ev.kind {
                EventKind::Recv => {
                    ensure!(ev.len == size, "ping of {} B, expected {size}", ev.len);
                    got += 1;
                    owed += 1;
                    if got < count {
                        c.sock.recv(buf, Flags::NONE, got);
                    }
                }
                _ => {
                    sent += 1;
                    free.push(buf);
                }
            }
            while owed > 0 {
                let Some(b) = free.pop() else { break };
                c.sock.send(b, Flags::NONE, got);
                owed -= 1;
            }
        }
        Ok("done".into())
    }
}

/// Accepts one TCP connection and writes `total` bytes as `size`-byte messages, taking
/// them in turn from as many buffers as EXS keeps in flight at that size (the same memory
/// footprint as the EXS run it is compared with, so neither side gains from the cache).
fn blast(size: u64, total: u64) -> Result<String> {
    ensure!(size > 0 && size <= MAX_REGION, "write size {size} refused");
    let bufs: Vec<Vec<u8>> = (0..super::grid::window(size as usize))
        .map(|i| vec![0x5a ^ i as u8; size as usize])
        .collect();
    let l = TcpListener::bind("127.0.0.1:0").context("binding the blast listener")?;
    say(&format!("port {}", l.local_addr()?.port()))?;
    l.set_nonblocking(true)?;
    let deadline = Instant::now() + ACCEPT;
    let mut s = loop {
        match l.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    bail!("no blast connection within {ACCEPT:?}");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e).context("accepting the blast connection"),
        }
    };
    s.set_nonblocking(false)?;
    let mut left = total;
    for buf in bufs.iter().cycle() {
        if left == 0 {
            break;
        }
        let n = left.min(size) as usize;
        s.write_all(&buf[..n]).context("blast write")?;
        left -= n as u64;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    Ok("done".into())
}
