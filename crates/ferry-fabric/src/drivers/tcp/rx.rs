//! The reader thread: parses frames with blocking reads and moves payloads straight into their
//! destination. It never writes to the socket; answers go to the writer's queue, so two peers
//! serving each other's RMA reads cannot deadlock.

use std::io::{self, Read};
use std::net::TcpStream;
use std::sync::Arc;

use super::conn::{deliver, recv_done, Close, Conn, Payload, Pending};
use super::frame::{self, Frame};
use super::io::{Fill, Span};
use crate::cq::{Completion, OpKind};
use crate::error::{FabricError, RemoteAccessError};
use crate::grants::{Refusal, REFUSALS_BEFORE_CLOSE};
use crate::mem::Access;

/// Staging buffer for headers and small payloads; larger payloads bypass it.
const STAGING: usize = 64 << 10;

/// Buffered reading of the socket.
struct Inbound<'a> {
    stream: &'a TcpStream,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

fn lost(e: io::Error) -> Close {
    Close::Lost(e.to_string())
}

fn eof(inside: bool) -> Close {
    Close::Lost(if inside {
        "peer closed the connection inside a frame".into()
    } else {
        "peer closed the connection".into()
    })
}

impl Inbound<'_> {
    /// Reads more bytes into the staging buffer.
    fn fill(&mut self) -> Result<(), Close> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.buf.len() - self.end < frame::MAX_HEADER_LEN {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        loop {
            match self.stream.read(&mut self.buf[self.end..]) {
                Ok(0) => return Err(eof(self.start != self.end)),
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(lost(e)),
            }
        }
    }

    fn next_frame(&mut self) -> Result<Frame, Close> {
        loop {
            match frame::decode(&self.buf[self.start..self.end]) {
                Ok(Some((f, n))) => {
                    self.start += n;
                    return Ok(f);
                }
                Ok(None) => self.fill()?,
                Err(e) => return Err(Close::Protocol(e.to_string())),
            }
        }
    }

    /// Takes up to `n` staged bytes.
    fn staged(&mut self, n: usize) -> &[u8] {
        let take = n.min(self.end - self.start);
        self.start += take;
        &self.buf[self.start - take..self.start]
    }

    /// Places the payload's first `fill.left()` bytes: staged bytes first, then straight
    /// from the socket.
    fn payload_into(&mut self, fill: &mut Fill<'_>) -> Result<(), Close> {
        let n = fill.left();
        fill.copy_from(self.staged(n));
        while fill.left() > 0 {
            match fill.read_from(self.stream) {
                Ok(0) => return Err(eof(true)),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(lost(e)),
            }
        }
        Ok(())
    }

    /// Reads and drops `n` payload bytes.
    fn discard(&mut self, mut n: u64) -> Result<(), Close> {
        loop {
            n -= self.staged(usize::try_from(n).unwrap_or(usize::MAX)).len() as u64;
            if n == 0 {
                return Ok(());
            }
            self.fill()?;
        }
    }

    /// Reads a payload into memory of its own, growing only as bytes actually arrive.
    fn payload_vec(&mut self, n: usize) -> Result<Vec<u8>, Close> {
        let mut v = self.staged(n).to_vec();
        let rest = (n - v.len()) as u64;
        let got = self.stream.take(rest).read_to_end(&mut v).map_err(lost)?;
        if got as u64 != rest {
            return Err(eof(true));
        }
        Ok(v)
    }
}

/// Runs until the connection ends, then fails everything still pending. A connector's
/// reader first checks the listener's HELLO (`hello_first`).
pub(super) fn run(conn: Arc<Conn>, hello_first: bool) {
    let mut inb = Inbound {
        stream: &conn.stream,
        buf: vec![0; STAGING].into_boxed_slice(),
        start: 0,
        end: 0,
    };
    let hello = if hello_first {
        inb.next_frame()
            .map_err(|c| match c {
                Close::Protocol(why) => Close::Protocol(format!("bad HELLO: {why}")),
                c => c,
            })
            .and_then(peers_hello)
    } else {
        Ok(())
    };
    let why = match hello {
        Err(why) => why,
        Ok(()) => loop {
            if let Err(why) = inb.next_frame().and_then(|f| handle(&conn, &mut inb, f)) {
                break why;
            }
        },
    };
    let mut st = conn.lock();
    conn.close(&mut st, why);
    let err = st.closed.clone().unwrap_or(Close::Cancelled);
    st.rx_done = true;
    for r in std::mem::take(&mut st.recvs) {
        conn.cq
            .push(Completion::err(r.context, OpKind::Recv, err.error()));
    }
    let writes = std::mem::take(&mut st.writes);
    let reads = std::mem::take(&mut st.reads);
    for (ops, op) in [(writes, OpKind::Write), (reads, OpKind::Read)] {
        for p in ops {
            conn.cq.push(Completion::err(p.context, op, err.error()));
        }
    }
}

/// The peer's first frame, which must be a HELLO of our major (a HELLO of any version
/// decodes, so another major is told apart from a peer that is not ferry's).
pub(super) fn peers_hello(f: Frame) -> Result<(), Close> {
    match f {
        Frame::Hello { major, .. } if major == frame::VERSION_MAJOR => Ok(()),
        Frame::Hello { major, .. } => Err(Close::Version(major)),
        _ => Err(Close::Protocol("peer did not start with HELLO".into())),
    }
}

/// Converts a length the decoder bounded by [`frame::MAX_LEN`].
fn size(len: u64) -> usize {
    usize::try_from(len).unwrap_or(usize::MAX)
}

fn handle(conn: &Conn, inb: &mut Inbound<'_>, f: Frame) -> Result<(), Close> {
    match f {
        Frame::Hello { .. } => Err(Close::Protocol("HELLO after the handshake".into())),
        Frame::Send { len } => on_send(conn, inb, len),
        Frame::Write {
            id,
            key,
            offset,
            len,
        } => {
            let (target, last) = target(conn, key, offset, len, Access::REMOTE_WRITE);
            let error = match target {
                Ok(span) => inb
                    .payload_into(&mut Fill::new(std::slice::from_ref(&span), size(len)))
                    .map(|()| None)?,
                Err(e) => inb.discard(len).map(|()| Some(e))?,
            };
            conn.answer(Frame::WriteAck { id, error }, Payload::None);
            last.map_or(Ok(()), Err)
        }
        Frame::ReadReq {
            id,
            key,
            offset,
            len,
        } => {
            let (target, last) = target(conn, key, offset, len, Access::REMOTE_READ);
            let (resp, payload) = match target {
                Ok(span) => (
                    Frame::ReadResp {
                        id,
                        error: None,
                        len,
                    },
                    Payload::Spans(vec![span]),
                ),
                Err(e) => (
                    Frame::ReadResp {
                        id,
                        error: Some(e),
                        len: 0,
                    },
                    Payload::None,
                ),
            };
            conn.answer(resp, payload);
            last.map_or(Ok(()), Err)
        }
        Frame::WriteAck { id, error } => {
            let p = take_pending(conn, id, OpKind::Write, None)?;
            conn.cq.push(rma_done(&p, OpKind::Write, error));
            Ok(())
        }
        Frame::ReadResp { id, error, len } => {
            let p = take_pending(conn, id, OpKind::Read, error.is_none().then_some(len))?;
            if error.is_none() {
                let mut fill = Fill::new(&p.spans, size(len));
                if let Err(why) = inb.payload_into(&mut fill) {
                    conn.cq
                        .push(Completion::err(p.context, OpKind::Read, why.error()));
                    return Err(why);
                }
            }
            conn.cq.push(rma_done(&p, OpKind::Read, error));
            Ok(())
        }
    }
}

/// Checks a peer's RMA request against this connection's grants ([`crate::grants`]): the
/// addressed memory, or why not, and the reason to close the connection once the answer is
/// sent (the peer has had its last uniform refusal). Grant, then bounds, then rights, before
/// any memory is touched.
fn target(
    conn: &Conn,
    key: u64,
    offset: u64,
    len: u64,
    need: Access,
) -> (Result<Span, RemoteAccessError>, Option<Close>) {
    let region = match conn.grants.lookup(key) {
        Ok(region) => region,
        Err(Refusal::Stale) => return (Err(RemoteAccessError::StaleKey), None),
        Err(Refusal::Uniform) => {
            tracing::debug!(peer = %conn.peer, "tcp: refused an RMA on a key this connection was not granted");
            let last = conn.grants.refused(key).then(|| {
                tracing::warn!(
                    "tcp: closing the connection of {}: remote memory accesses with \
                     {REFUSALS_BEFORE_CLOSE} keys it was never granted (or before it was \
                     authenticated)",
                    conn.peer
                );
                Close::Protocol(format!(
                    "remote accesses refused for {REFUSALS_BEFORE_CLOSE} keys never granted on this connection"
                ))
            });
            return (Err(RemoteAccessError::UnknownKey), last);
        }
    };
    let (Ok(off), Ok(len)) = (usize::try_from(offset), usize::try_from(len)) else {
        return (Err(RemoteAccessError::OutOfBounds), None);
    };
    let Some(span) = Span::new(region.buffer().clone(), off, len) else {
        return (Err(RemoteAccessError::OutOfBounds), None);
    };
    if !region.access().contains(need) {
        return (Err(RemoteAccessError::NoPermission), None);
    }
    (Ok(span), None)
}

fn rma_done(p: &Pending, op: OpKind, error: Option<RemoteAccessError>) -> Completion {
    match error {
        None => Completion::ok(p.context, op, p.len),
        Some(e) => Completion::err(p.context, op, FabricError::RemoteAccess(e)),
    }
}

/// Removes the oldest pending operation of `op`'s kind, which the answer `id` must be for
/// (the peer answers in request order); with `len`, the answer's payload must match it.
fn take_pending(conn: &Conn, id: u32, op: OpKind, len: Option<u64>) -> Result<Pending, Close> {
    let mut st = conn.lock();
    let queue = if op == OpKind::Write {
        &mut st.writes
    } else {
        &mut st.reads
    };
    match queue.pop_front() {
        Some(p) if p.id == id && len.is_none_or(|l| l == p.len) => Ok(p),
        Some(p) => {
            let why = if p.id == id {
                format!(
                    "READ_RESP {id} carries {} bytes for a {}-byte read",
                    len.unwrap_or(0),
                    p.len
                )
            } else {
                format!("{op:?} answer {id} but request {} is the oldest", p.id)
            };
            // Put it back so the shutdown path fails it with the others, in order.
            queue.push_front(p);
            Err(Close::Protocol(why))
        }
        None => Err(Close::Protocol(format!(
            "{op:?} answer {id} matches no pending request"
        ))),
    }
}

fn on_send(conn: &Conn, inb: &mut Inbound<'_>, len: u64) -> Result<(), Close> {
    let posted = conn.lock().recvs.pop_front();
    let Some(recv) = posted else {
        // No receive yet: buffer the message rather than stall the reader.
        let msg = inb.payload_vec(size(len))?;
        let mut st = conn.lock();
        match st.recvs.pop_front() {
            Some(r) => conn.cq.push(deliver(&r.spans, &msg, r.context)),
            None => st.unexpected.push_back(msg),
        }
        return Ok(());
    };
    let mut fill = Fill::new(&recv.spans, size(len));
    let placed = fill.left() as u64;
    match inb
        .payload_into(&mut fill)
        .and_then(|()| inb.discard(len - placed))
    {
        Ok(()) => {
            conn.cq.push(recv_done(recv.context, len, placed));
            Ok(())
        }
        Err(why) => {
            conn.cq
                .push(Completion::err(recv.context, OpKind::Recv, why.error()));
            Err(why)
        }
    }
}
