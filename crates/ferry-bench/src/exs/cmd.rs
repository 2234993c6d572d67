//! The line protocol on the exs peer's stdin and stdout (the measurements themselves run over
//! EXS or plain TCP, never over these pipes).
//!
//! The peer first prints `ready` (or `error MESSAGE`), then answers each command line:
//! - `open MODE BYTES` → `addr URL` (listening), then `ok` once the EXS connection is up with
//!   BYTES registered; in persistent mode all BYTES are posted as one PERSISTENT send.
//! - `send SIZE COUNT WINDOW` → `done` after COUNT sends of SIZE bytes, WINDOW in flight.
//! - `pong SIZE COUNT` → `done` after answering COUNT messages of SIZE bytes with one each.
//! - `close` → `ok` once the EXS connection is closed.
//! - `usage` → `usage USER_US SYS_US` (getrusage of the peer process so far).
//! - `blast SIZE TOTAL` → `port PORT` (a TCP listener on 127.0.0.1), then `done` after
//!   writing TOTAL bytes in SIZE-byte writes to the one connection it accepts.
//!
//! Any command may be answered with `error MESSAGE` instead.

use anyhow::{bail, Context, Result};

use super::conn::Mode;

/// One command to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmd {
    /// Listen, accept one EXS connection in `mode`, register `bytes`.
    Open { mode: Mode, bytes: u64 },
    /// Send `count` messages of `size` bytes, `window` in flight.
    Send { size: u64, count: u64, window: u64 },
    /// Answer `count` messages of `size` bytes.
    Pong { size: u64, count: u64 },
    /// Close the EXS connection.
    Close,
    /// Report CPU usage.
    Usage,
    /// Write `total` bytes to a TCP connection in `size`-byte writes.
    Blast { size: u64, total: u64 },
}

impl std::fmt::Display for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Cmd::Open { mode, bytes } => write!(f, "open {} {bytes}", mode.name()),
            Cmd::Send {
                size,
                count,
                window,
            } => write!(f, "send {size} {count} {window}"),
            Cmd::Pong { size, count } => write!(f, "pong {size} {count}"),
            Cmd::Close => f.write_str("close"),
            Cmd::Usage => f.write_str("usage"),
            Cmd::Blast { size, total } => write!(f, "blast {size} {total}"),
        }
    }
}

impl Cmd {
    /// Parses a command line.
    pub fn parse(line: &str) -> Result<Cmd> {
        let w: Vec<&str> = line.split_whitespace().collect();
        let verb = w.first().copied().unwrap_or("");
        let args = |k: usize| -> Result<()> {
            match w.len() == k + 1 {
                true => Ok(()),
                false => bail!("{verb}: expected {k} arguments in {line:?}"),
            }
        };
        let n = |i: usize| -> Result<u64> {
            w[i].parse()
                .with_context(|| format!("{verb}: bad number {:?}", w[i]))
        };
        Ok(match verb {
            "open" => {
                args(2)?;
                Cmd::Open {
                    mode: Mode::parse(w[1])?,
                    bytes: n(2)?,
                }
            }
            "send" => {
                args(3)?;
                Cmd::Send {
                    size: n(1)?,
                    count: n(2)?,
                    window: n(3)?,
                }
            }
            "pong" => {
                args(2)?;
                Cmd::Pong {
                    size: n(1)?,
                    count: n(2)?,
                }
            }
            "blast" => {
                args(2)?;
                Cmd::Blast {
                    size: n(1)?,
                    total: n(2)?,
                }
            }
            "close" => Cmd::Close,
            "usage" => Cmd::Usage,
            _ => bail!("unknown command {line:?}"),
        })
    }
}

/// The rest of a peer's reply line after `word`; the peer's own error if it sent one.
pub fn expect<'a>(line: &'a str, word: &str) -> Result<&'a str> {
    let (head, rest) = line.split_once(' ').unwrap_or((line, ""));
    match head {
        "error" => bail!("peer: {rest}"),
        h if h == word => Ok(rest),
        _ => bail!("peer said {line:?}, expected {word:?}"),
    }
}

/// Parses one unsigned number from a reply.
pub fn number(s: &str) -> Result<u64> {
    match s.trim().parse::<u64>() {
        Ok(n) => Ok(n),
        Err(_) => bail!("expected a number, got {s:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_and_garbage_is_an_error() {
        for c in [
            Cmd::Open {
                mode: Mode::Persistent,
                bytes: 16 << 20,
            },
            Cmd::Send {
                size: 1,
                count: 2,
                window: 3,
            },
            Cmd::Pong { size: 10, count: 5 },
            Cmd::Close,
            Cmd::Usage,
            Cmd::Blast {
                size: 4096,
                total: 1 << 30,
            },
        ] {
            assert_eq!(Cmd::parse(&c.to_string()).unwrap(), c);
        }
        for bad in [
            "",
            "open fast 1",
            "send 1 2",
            "send a b c",
            "pong 1 2 poll",
            "jump",
        ] {
            assert!(Cmd::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(expect("addr tcp://x", "addr").unwrap(), "tcp://x");
        assert!(expect("error no", "ok")
            .unwrap_err()
            .to_string()
            .contains("no"));
        assert!(expect("ok", "done").is_err());
        assert_eq!(number("34").unwrap(), 34);
        assert!(number("3 4").is_err() && number("x").is_err() && number("").is_err());
    }
}
