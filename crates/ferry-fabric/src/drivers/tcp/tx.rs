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

/// A stretch of a batch's bytes: memory for `sendmsg`, or a file's range for `sendfile`.
enum Piece<'a> {
    Mem(IoSlice<'a>),
    File {
        file: &'a std::fs::File,
        offset: u64,
        len: usize,
        /// The same bytes through the mapping, for a file system without `sendfile`.
        mapped: IoSlice<'a>,
    },
}

/// The job's bytes as pieces (empty ones left out), appended to `out`; returns their total.
/// With [`super::sendfile_sends`], a payload in a file mapping
/// ([`crate::mem::Buffer::map_file_after`]) goes as the file's range: sent by `sendfile`
/// from the page cache, never read through the mapping.
fn pieces<'a>(job: &'a Job, out: &mut Vec<Piece<'a>>) -> usize {
    let spans = match &job.payload {
        Payload::Spans(spans) if super::sendfile_sends() => spans,
        _ => {
            let mut iov = Vec::with_capacity(2);
            let total = slices(job, &mut iov);
            out.extend(iov.into_iter().map(Piece::Mem));
            return total;
        }
    };
    let mut total = job.header.as_bytes().len();
    if total > 0 {
        out.push(Piece::Mem(IoSlice::new(job.header.as_bytes())));
    }
    for s in spans {
        total += s.len();
        match s.in_file() {
            None if s.len() > 0 => out.push(Piece::Mem(s.io_slice())),
            None => {}
            Some((before, file, offset, len)) => {
                if before > 0 {
                    out.push(Piece::Mem(s.io_part(0, before)));
                }
                if len > 0 {
                    let mapped = s.io_part(before, before + len);
                    out.push(Piece::File {
                        file,
                        offset,
                        len,
                        mapped,
                    });
                }
            }
        }
    }
    total
}

/// Writes every job of `batch`, completing sends as soon as their bytes are out. On failure
/// returns the error and how many jobs were fully written.
fn write_batch(conn: &Conn, batch: &[Job]) -> Result<(), (io::Error, usize)> {
    let mut all = Vec::with_capacity(batch.len() * 2);
    let mut ends = Vec::with_capacity(batch.len());
    let mut total = 0;
    for job in batch {
        total += pieces(job, &mut all);
        ends.push(total);
    }
    let (mut written, mut done) = (0, 0);
    let mut wrote = |n: usize, done: &mut usize| {
        written += n;
        let upto = ends.partition_point(|&end| end <= written);
        sends_written(conn, &batch[*done..upto]);
        *done = upto;
    };
    let mut rest = &all[..];
    while let Some(first) = rest.first() {
        if let Piece::File {
            file,
            offset,
            len,
            mapped,
        } = *first
        {
            send_file(conn, (file, offset, len), mapped, &mut |n| {
                wrote(n, &mut done)
            })
            .map_err(|e| (e, done))?;
            rest = &rest[1..];
            continue;
        }
        let run = rest
            .iter()
            .take_while(|p| matches!(p, Piece::Mem(_)))
            .count();
        let mut iov: Vec<IoSlice<'_>> = rest[..run]
            .iter()
            .filter_map(|p| match p {
                Piece::Mem(s) => Some(*s),
                Piece::File { .. } => None,
            })
            .collect();
        rest = &rest[run..];
        // A file's bytes follow: let the kernel join them to these in one segment.
        let flags = if rest.is_empty() {
            SendFlags::empty()
        } else {
            SendFlags::MORE
        };
        let run_total: usize = iov.iter().map(|s| s.len()).sum();
        let (mut bufs, mut sent) = (&mut iov[..], 0);
        while sent < run_total {
            let n = match send(conn, bufs, flags) {
                Ok(0) => return Err((io::ErrorKind::WriteZero.into(), done)),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err((e, done)),
            };
            sent += n;
            IoSlice::advance_slices(&mut bufs, n);
            wrote(n, &mut done);
        }
    }
    Ok(())
}

/// Sends `len` bytes of `file` from `offset` with `sendfile`, reporting each step's bytes;
/// where the file system has no `sendfile`, the same bytes through their mapping (`mapped`,
/// copied by the kernel). A file that ends before (truncated since the send was posted)
/// fails the connection: the frame cannot be completed.
fn send_file(
    conn: &Conn,
    (file, mut offset, len): (&std::fs::File, u64, usize),
    mapped: IoSlice<'_>,
    wrote: &mut dyn FnMut(usize),
) -> io::Result<()> {
    use rustix::io::Errno;
    let mut left = len;
    while left > 0 {
        match rustix::fs::sendfile(&conn.stream, file, Some(&mut offset), left) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file being sent ended early (truncated while it was sent)",
                ))
            }
            Ok(n) => {
                left -= n;
                wrote(n);
            }
            Err(Errno::INTR) => {}
            Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) if left == len => {
                return send_mapped(conn, mapped, wrote)
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Writes all of `bytes` with `sendmsg`, reporting each step's bytes.
fn send_mapped(conn: &Conn, bytes: IoSlice<'_>, wrote: &mut dyn FnMut(usize)) -> io::Result<()> {
    let mut iov = [bytes];
    let (mut bufs, total, mut sent) = (&mut iov[..], bytes.len(), 0);
    while sent < total {
        match send(conn, bufs, SendFlags::empty()) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                sent += n;
                IoSlice::advance_slices(&mut bufs, n);
                wrote(n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
