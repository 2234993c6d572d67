//! One connection: the state shared by the posting threads, the reader ([`super::rx`]) and the
//! writer ([`super::tx`]), and the endpoint built on it.
//!
//! Who completes what, so that every accepted post completes exactly once and in posting order
//! per kind: the writer completes sends (when their bytes are in the socket, or with the close
//! reason when it shuts down); the reader completes receives, RMA writes (at WRITE_ACK) and
//! RMA reads (at READ_RESP), and on shutdown fails everything still pending. A post that finds
//! its completer already gone completes at once with the close reason.

use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::frame::{Frame, Header};
use super::io::{self, Span};
use super::TcpDomain;
use crate::cq::{Completion, CompletionQueue, OpKind};
use crate::error::{FabricError, Result};
use crate::grants::Grants;
use crate::{
    check_local, check_rma, Capabilities, Domain, Endpoint, LocalSlice, MemoryRegion, RemoteSlice,
};

/// Why a connection ended; every pending operation fails with the matching error.
#[derive(Debug, Clone)]
pub(super) enum Close {
    /// EOF, reset, or an I/O error.
    Lost(String),
    /// The peer broke the protocol.
    Protocol(String),
    /// The peer's HELLO names another major version (its major).
    Version(u16),
    /// The endpoint was dropped.
    Cancelled,
}

impl Close {
    /// The error operations fail with.
    pub(super) fn error(&self) -> FabricError {
        match self {
            Close::Lost(why) => FabricError::ConnectionLost(why.clone()),
            Close::Protocol(why) => FabricError::Protocol(why.clone()),
            Close::Version(major) => FabricError::VersionMismatch {
                peer_major: *major,
                our_major: super::frame::VERSION_MAJOR,
            },
            Close::Cancelled => FabricError::Cancelled,
        }
    }
}

/// What a job sends after its header.
pub(super) enum Payload {
    /// Header only.
    None,
    /// Copied at post time (inline sends).
    Inline(Vec<u8>),
    /// Straight from registered memory.
    Spans(Vec<Span>),
}

/// One frame queued for the writer.
pub(super) struct Job {
    pub(super) header: Header,
    pub(super) payload: Payload,
    /// A send to complete (context, length) once the frame is in the socket.
    pub(super) done: Option<(u64, u64)>,
}

impl Job {
    fn control(frame: Frame, payload: Payload) -> Self {
        Self {
            header: frame.encode(),
            payload,
            done: None,
        }
    }

    /// What is left of this job after its first `n` wire bytes. A payload in registered
    /// memory stays there, never copied in user space: it may be a file's mapping
    /// (`exs_sendfile`, a vouched block), whose pages past a truncated file's end raise
    /// SIGBUS when touched here but fail only the write (`EFAULT`) in the kernel.
    fn tail(&self, n: usize) -> Job {
        let head = self.header.as_bytes().len();
        let mut skip = n.saturating_sub(head);
        let payload = match &self.payload {
            Payload::None => Payload::None,
            Payload::Inline(v) => Payload::Inline(v.get(skip..).unwrap_or(&[]).to_vec()),
            Payload::Spans(spans) => Payload::Spans(
                spans
                    .iter()
                    .filter_map(|s| {
                        let cut = skip.min(s.len());
                        skip -= cut;
                        (cut < s.len()).then(|| s.after(cut))
                    })
                    .collect(),
            ),
        };
        Job {
            header: self.header.after(n),
            payload,
            done: self.done,
        }
    }

    /// Bytes on the wire.
    fn wire_len(&self) -> usize {
        self.header.as_bytes().len()
            + match &self.payload {
                Payload::None => 0,
                Payload::Inline(v) => v.len(),
                Payload::Spans(spans) => spans.iter().map(Span::len).sum(),
            }
    }
}

/// Frames up to this size are written by the posting thread itself when the writer has
/// nothing queued: it saves the writer's wake-up (a third of a small-message round trip on
/// 2 cores), and a socket buffer takes this much without blocking the poster for long.
const DIRECT_MAX: usize = 16 << 10;

/// A posted receive.
pub(super) struct Recv {
    pub(super) context: u64,
    pub(super) spans: Vec<Span>,
}

/// An RMA operation waiting for its answer.
pub(super) struct Pending {
    pub(super) id: u32,
    pub(super) context: u64,
    pub(super) len: u64,
    /// The read's destination (empty for writes).
    pub(super) spans: Vec<Span>,
}

/// Mutable connection state, behind one lock so that posting order is wire order.
pub(super) struct State {
    pub(super) closed: Option<Close>,
    /// The reader has exited and failed everything it owned.
    pub(super) rx_done: bool,
    /// The writer has exited and failed every queued send.
    pub(super) tx_done: bool,
    pub(super) jobs: VecDeque<Job>,
    pub(super) writer_idle: bool,
    /// A posting thread is writing a frame directly; the writer waits until it is done so
    /// frames keep their posting order.
    pub(super) direct: bool,
    /// Sends queued or being written that still owe a completion; an inline send completes
    /// at post time only when this is zero, to keep send completions in order.
    pub(super) unfinished_sends: usize,
    pub(super) recvs: VecDeque<Recv>,
    /// Messages that arrived before a receive was posted.
    pub(super) unexpected: VecDeque<Vec<u8>>,
    pub(super) writes: VecDeque<Pending>,
    pub(super) reads: VecDeque<Pending>,
    next_id: u32,
}

/// The shared part of a connection.
pub(super) struct Conn {
    pub(super) stream: TcpStream,
    pub(super) cq: CompletionQueue,
    /// What the peer may reach by RMA.
    pub(super) grants: Grants,
    /// The peer, as text (for the log line of a connection closed for probing).
    pub(super) peer: String,
    state: Mutex<State>,
    /// The writer sleeps here while it has nothing to write.
    pub(super) wake: Condvar,
}

impl Conn {
    /// A connection to `peer`, serving RMA at once if `remote_access` (see [`Grants`]).
    pub(super) fn new(stream: TcpStream, remote_access: bool, peer: String) -> Result<Self> {
        Ok(Self {
            stream,
            cq: CompletionQueue::new()?,
            grants: Grants::new(remote_access),
            peer,
            state: Mutex::new(State {
                closed: None,
                rx_done: false,
                tx_done: false,
                jobs: VecDeque::new(),
                writer_idle: false,
                direct: false,
                unfinished_sends: 0,
                recvs: VecDeque::new(),
                unexpected: VecDeque::new(),
                writes: VecDeque::new(),
                reads: VecDeque::new(),
                next_id: 0,
            }),
            wake: Condvar::new(),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // Critical sections never leave the state half-updated, so poison carries no risk.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a job for the writer, waking it if it sleeps.
    pub(super) fn enqueue(&self, st: &mut State, job: Job) {
        st.jobs.push_back(job);
        if st.writer_idle {
            st.writer_idle = false;
            self.wake.notify_one();
        }
    }

    /// Writes `job` from the calling thread (a poster, or the reader answering) if it is
    /// small and nothing is queued or being written; whatever the socket does not take at
    /// once, and every other job, goes to the writer. Never blocks.
    pub(super) fn submit(&self, mut st: MutexGuard<'_, State>, job: Job) {
        let direct = st.jobs.is_empty()
            && st.writer_idle
            && !st.direct
            && st.closed.is_none()
            && job.wire_len() <= DIRECT_MAX;
        if !direct {
            return self.enqueue(&mut st, job);
        }
        st.direct = true;
        drop(st);
        let result = super::tx::write_now(self, &job);
        let mut st = self.lock();
        st.direct = false;
        match result {
            Ok(n) if n == job.wire_len() => {
                if let Some((context, len)) = job.done {
                    self.cq.push(Completion::ok(context, OpKind::Send, len));
                    // The writer zeroes the count when it fails everything at close.
                    st.unfinished_sends = st.unfinished_sends.saturating_sub(1);
                }
            }
            // The rest is the writer's, ahead of anything queued meanwhile.
            Ok(n) if !st.tx_done => st.jobs.push_front(job.tail(n)),
            Ok(_) => self.fail_direct(&mut st, &job),
            Err(e) => {
                self.close(&mut st, Close::Lost(e.to_string()));
                self.fail_direct(&mut st, &job);
            }
        }
        if (!st.jobs.is_empty() || st.closed.is_some()) && st.writer_idle {
            st.writer_idle = false;
            self.wake.notify_one();
        }
    }

    /// A direct write that cannot finish: its send (if any) fails.
    fn fail_direct(&self, st: &mut State, job: &Job) {
        if let Some((context, _)) = job.done {
            st.unfinished_sends = st.unfinished_sends.saturating_sub(1);
            self.fail_now(st, context, OpKind::Send);
        }
    }

    /// Sends a control frame from the reader (WRITE_ACK, READ_RESP); dropped once closed.
    pub(super) fn answer(&self, frame: Frame, payload: Payload) {
        let st = self.lock();
        if st.closed.is_none() {
            self.submit(st, Job::control(frame, payload));
        }
    }

    /// Records why the connection ends (the first reason wins) and wakes both threads.
    pub(super) fn close(&self, st: &mut State, why: Close) {
        if st.closed.is_none() {
            tracing::debug!(?why, "tcp connection closing");
            st.closed = Some(why);
        }
        self.wake.notify_one();
        // Unblocks the reader's read and the writer's write; fails only if already shut down.
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    fn fail_now(&self, st: &State, context: u64, op: OpKind) {
        let why = st.closed.clone().unwrap_or(Close::Cancelled);
        self.cq.push(Completion::err(context, op, why.error()));
    }

    fn post_send(&self, spans: Vec<Span>, total: u64, context: u64) {
        let inline = total <= super::INLINE_SIZE as u64;
        let payload = if inline {
            Payload::Inline(io::copy_out(&spans))
        } else {
            Payload::Spans(spans)
        };
        let mut st = self.lock();
        if st.tx_done {
            return self.fail_now(&st, context, OpKind::Send);
        }
        let mut job = Job::control(Frame::Send { len: total }, payload);
        if inline && st.unfinished_sends == 0 && st.closed.is_none() {
            self.cq.push(Completion::ok(context, OpKind::Send, total));
        } else {
            job.done = Some((context, total));
            st.unfinished_sends += 1;
        }
        self.submit(st, job);
    }

    fn post_recv(&self, spans: Vec<Span>, context: u64) {
        let mut st = self.lock();
        if let Some(msg) = st.unexpected.pop_front() {
            return self.cq.push(deliver(&spans, &msg, context));
        }
        if st.rx_done {
            return self.fail_now(&st, context, OpKind::Recv);
        }
        st.recvs.push_back(Recv { context, spans });
    }

    fn post_rma(&self, op: OpKind, spans: Vec<Span>, remote: RemoteSlice, context: u64) {
        let mut st = self.lock();
        if st.rx_done {
            return self.fail_now(&st, context, op);
        }
        let id = st.next_id;
        st.next_id = id.wrapping_add(1);
        let (key, offset, len) = (remote.key, remote.addr, remote.len);
        let mut pending = Pending {
            id,
            context,
            len,
            spans: Vec::new(),
        };
        let job = if op == OpKind::Write {
            st.writes.push_back(pending);
            let frame = Frame::Write {
                id,
                key,
                offset,
                len,
            };
            Job::control(frame, Payload::Spans(spans))
        } else {
            pending.spans = spans;
            st.reads.push_back(pending);
            Job::control(
                Frame::ReadReq {
                    id,
                    key,
                    offset,
                    len,
                },
                Payload::None,
            )
        };
        if st.closed.is_none() {
            self.submit(st, job);
        }
    }
}

/// Copies a buffered message into a receive's segments: the completion of that receive.
pub(super) fn deliver(spans: &[Span], msg: &[u8], context: u64) -> Completion {
    let mut fill = io::Fill::new(spans, msg.len());
    let placed = fill.copy_from(msg) as u64;
    recv_done(context, msg.len() as u64, placed)
}

/// A receive's completion: `Truncated` if the message was longer than what was placed.
pub(super) fn recv_done(context: u64, msg_len: u64, placed: u64) -> Completion {
    if placed == msg_len {
        return Completion::ok(context, OpKind::Recv, msg_len);
    }
    Completion {
        context,
        op: OpKind::Recv,
        len: placed,
        result: Err(FabricError::Truncated {
            msg_len,
            buf_len: placed,
        }),
    }
}

/// An endpoint of the native TCP driver.
pub(super) struct TcpEndpoint {
    pub(super) domain: Arc<TcpDomain>,
    pub(super) conn: Arc<Conn>,
    pub(super) peer: String,
    pub(super) local: String,
    pub(super) threads: Vec<JoinHandle<()>>,
}

impl Endpoint for TcpEndpoint {
    fn domain(&self) -> Arc<dyn Domain> {
        self.domain.clone()
    }

    fn capabilities(&self) -> &Capabilities {
        &self.domain.caps
    }

    fn cq(&self) -> &CompletionQueue {
        &self.conn.cq
    }

    fn peer(&self) -> String {
        self.peer.clone()
    }

    fn local(&self) -> String {
        self.local.clone()
    }

    fn path_rtt(&self) -> Option<std::time::Duration> {
        use std::os::fd::AsFd;
        crate::sys::tcp_min_rtt(self.conn.stream.as_fd())
    }

    fn grant(&self, region: &MemoryRegion) -> Result<()> {
        if region.domain() != self.domain.id {
            return Err(FabricError::InvalidArgument(
                "memory region belongs to another domain".into(),
            ));
        }
        self.conn.grants.grant(region);
        Ok(())
    }

    fn enable_remote_access(&self) {
        self.conn.grants.enable();
    }

    fn post_send(&self, data: &[LocalSlice], context: u64) -> Result<()> {
        let total = check_local(data, self.domain.id, &self.domain.caps)?;
        self.conn.post_send(io::gather(data)?, total, context);
        Ok(())
    }

    fn post_recv(&self, buf: &[LocalSlice], context: u64) -> Result<()> {
        check_local(buf, self.domain.id, &self.domain.caps)?;
        self.conn.post_recv(io::scatter(buf)?, context);
        Ok(())
    }

    fn post_write(&self, local: &[LocalSlice], remote: RemoteSlice, context: u64) -> Result<()> {
        check_rma(local, &remote, self.domain.id, &self.domain.caps)?;
        let spans = io::gather(local)?;
        self.conn.post_rma(OpKind::Write, spans, remote, context);
        Ok(())
    }

    fn post_read(&self, local: &[LocalSlice], remote: RemoteSlice, context: u64) -> Result<()> {
        check_rma(local, &remote, self.domain.id, &self.domain.caps)?;
        let spans = io::scatter(local)?;
        self.conn.post_rma(OpKind::Read, spans, remote, context);
        Ok(())
    }
}

impl Drop for TcpEndpoint {
    fn drop(&mut self) {
        {
            let mut st = self.conn.lock();
            self.conn.close(&mut st, Close::Cancelled);
        }
        for t in self.threads.drain(..) {
            // A driver thread that panicked has nothing left to clean up.
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::Buffer;

    /// The wire bytes of a job: header, then payload.
    fn wire(job: &Job) -> Vec<u8> {
        let mut v = job.header.as_bytes().to_vec();
        match &job.payload {
            Payload::None => {}
            Payload::Inline(b) => v.extend_from_slice(b),
            Payload::Spans(spans) => v.extend(io::copy_out(spans)),
        }
        v
    }

    /// What is left of a job after any number of its bytes is the rest of its bytes, and a
    /// payload in registered memory stays there (not copied: it may be a file's mapping).
    #[test]
    fn the_tail_of_a_job_keeps_its_spans() {
        let buf = Buffer::from_slice(&(0..200u8).collect::<Vec<_>>());
        let spans = vec![
            Span::new(buf.clone(), 10, 50).unwrap(),
            Span::new(buf.clone(), 100, 0).unwrap(),
            Span::new(buf, 120, 70).unwrap(),
        ];
        let job = Job::control(Frame::Send { len: 120 }, Payload::Spans(spans));
        let all = wire(&job);
        for n in [
            0,
            1,
            7,
            all.len() - 120,
            all.len() - 70,
            all.len() - 1,
            all.len(),
        ] {
            let rest = job.tail(n);
            assert_eq!(wire(&rest), all[n..], "after {n} bytes");
            assert!(
                matches!(rest.payload, Payload::Spans(_)),
                "copied after {n} bytes"
            );
            assert_eq!(rest.wire_len(), all.len() - n);
        }
        let inline = Job::control(Frame::Send { len: 3 }, Payload::Inline(vec![1, 2, 3]));
        let all = wire(&inline);
        for n in 0..=all.len() {
            assert_eq!(wire(&inline.tail(n)), all[n..]);
        }
    }
}
