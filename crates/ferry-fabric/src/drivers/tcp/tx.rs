//! The writer thread: drains the connection's job queue with writev, headers and payloads in
//! one call, payloads straight from registered memory (inline sends excepted).

use std::io::{self, IoSlice};

use rustix::net::{sendmsg, SendAncillaryBuffer, SendFlags};
use std::sync::Arc;

use super::conn::{Close, Conn, Job, Payload, State};
use super::io::IOV_MAX;
use crate::cq::{Completion, OpKind};

/// Most jobs gathered into one batch of writev calls: enough to coalesce bursts of small
/// frames into few syscalls, few enough that send completions are not held back long.
const MAX_BATCH: usize = 64;

/// Runs until the connection closes, then fails every send still queued.
pub(super) fn run(conn: Arc<Conn>) {
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    loop {
        {
            let mut st = conn.lock();
            while (st.jobs.is_empty() || st.direct) && st.closed.is_none() {
                st.writer_idle = true;
                st = conn.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            st.writer_idle = false;
            if st.closed.is_some() {
                return finish(&conn, &mut st, &[]);
            }
            let n = st.jobs.len().min(MAX_BATCH);
            batch.extend(st.jobs.drain(..n));
        }
        if let Err((e, written)) = write_batch(&conn, &batch) {
            let mut st = conn.lock();
            conn.close(&mut st, Close::Lost(e.to_string()));
            return finish(&conn, &mut st, &batch[written..]);
        }
        batch.clear();
    }
}

/// Marks the writer gone and fails the sends of `unwritten` and of the queue, in order.
fn finish(conn: &Conn, st: &mut State, unwritten: &[Job]) {
    st.tx_done = true;
    let why = st.closed.clone().unwrap_or(Close::Cancelled);
    let queued = std::mem::take(&mut st.jobs);
    for (context, _) in unwritten.iter().chain(&queued).filter_map(|j| j.done) {
        conn.cq
            .push(Completion::err(context, OpKind::Send, why.error()));
    }
    st.unfinished_sends = 0;
}

/// Completes the sends among `jobs`, whose bytes are now all in the socket.
fn sends_written(conn: &Conn, jobs: &[Job]) {
    if jobs.iter().all(|j| j.done.is_none()) {
        return;
    }
    let mut st = conn.lock();
    for (context, len) in jobs.iter().filter_map(|j| j.done) {
        conn.cq.push(Completion::ok(context, OpKind::Send, len));
        st.unfinished_sends -= 1;
    }
}

/// The job's bytes as I/O slices (empty ones left out), appended to `iov`; returns their total.
fn slices<'a>(job: &'a Job, iov: &mut Vec<IoSlice<'a>>) -> usize {
    let header = std::iter::once(IoSlice::new(job.header.as_bytes()));
    let payload: Vec<IoSlice<'a>> = match &job.payload {
        Payload::None => Vec::new(),
        Payload::Inline(v) => vec![IoSlice::new(v)],
        Payload::Spans(spans) => spans.iter().map(|s| s.io_slice()).collect(),
    };
    let mut total = 0;
    for s in header.chain(payload) {
        total += s.len();
        if !s.is_empty() {
            iov.push(s);
        }
    }
    total
}

/// One `sendmsg`: MSG_NOSIGNAL so a vanished peer is an EPIPE error, never a SIGPIPE that
/// would kill a C program hosting ferry.
fn send(conn: &Conn, bufs: &[IoSlice<'_>], flags: SendFlags) -> io::Result<usize> {
    let bufs = &bufs[..bufs.len().min(IOV_MAX)];
    let flags = flags | SendFlags::NOSIGNAL;
    Ok(sendmsg(
        &conn.stream,
        bufs,
        &mut SendAncillaryBuffer::default(),
        flags,
    )?)
}

/// Writes as much of `job` as the socket takes right now, without blocking: the bytes
/// written (WouldBlock counts as none).
pub(super) fn write_now(conn: &Conn, job: &Job) -> io::Result<usize> {
    let mut iov = Vec::with_capacity(4);
    let total = slices(job, &mut iov);
    let (mut bufs, mut written) = (&mut iov[..], 0);
    while written < total {
        match send(conn, bufs, SendFlags::DONTWAIT) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                written += n;
                IoSlice::advance_slices(&mut bufs, n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

/// Writes every job of `batch`, completing sends as soon as their bytes are out. On failure
/// returns the error and how many jobs were fully written.
fn write_batch(conn: &Conn, batch: &[Job]) -> Result<(), (io::Error, usize)> {
    let mut iov = Vec::with_capacity(batch.len() * 2);
    let mut ends = Vec::with_capacity(batch.len());
    let mut total = 0;
    for job in batch {
        total += slices(job, &mut iov);
        ends.push(total);
    }
    let (mut bufs, mut written, mut done) = (&mut iov[..], 0, 0);
    while written < total {
        let n = match send(conn, bufs, SendFlags::empty()) {
            Ok(0) => return Err((io::ErrorKind::WriteZero.into(), done)),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err((e, done)),
        };
        written += n;
        IoSlice::advance_slices(&mut bufs, n);
        let upto = ends.partition_point(|&end| end <= written);
        sends_written(conn, &batch[done..upto]);
        done = upto;
    }
    Ok(())
}
