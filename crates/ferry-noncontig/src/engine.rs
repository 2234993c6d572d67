//! The transfer engine: walks both layouts together and posts RMA operations.

use std::time::Duration;

use ferry_dtype::Segment;
use ferry_fabric::{
    Access, Buffer, Capabilities, Endpoint, LocalSlice, MemoryRegion, OpKind, RemoteSlice,
};

use crate::error::{NoncontigError, Result};
use crate::layout::{pack_to_buffer, unpack_from_buffer, LocalLayout, RemoteLayout};

/// The low bits of a completion context that number the transfer's operations.
const SEQ_MASK: u64 = 0xffff_ffff;

/// Which way a transfer moved its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Path {
    /// Let [`Options::choose`] decide from the mean segment sizes.
    #[default]
    Auto,
    /// Gather/scatter straight between the layouts.
    ZeroCopy,
    /// Through a registered staging buffer on the local side.
    Packed,
}

/// How a transfer runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Force a path, or [`Path::Auto`].
    pub path: Path,
    /// Mean segment size (bytes) below which a side counts as tiny (see [`Options::choose`]);
    /// `None` takes the driver's measured value, [`Options::measured_threshold`].
    pub pack_threshold: Option<u64>,
    /// Most operations in flight (at least 1).
    pub window: usize,
    /// Bytes of staging for the packed path (a chunk is packed, moved, then the next).
    pub staging_bytes: usize,
    /// A registered staging buffer to use instead of registering one per transfer (its
    /// length caps the chunk).
    pub staging: Option<MemoryRegion>,
    /// Gather entries per operation: the driver's `rma_gather` if `None` or larger.
    pub max_gather: Option<usize>,
    /// Remote segments per zero-copy operation: the driver's `rma_iov_limit` if `None` or
    /// larger. Consecutive remote segments share one gathered RMA up to this many.
    pub max_remote_segments: Option<usize>,
    /// Longest wait for any single completion.
    pub timeout: Duration,
    /// High bits of the operations' completion contexts (the low 32 bits count operations
    /// and are ignored here).
    pub context: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            path: Path::Auto,
            pack_threshold: None,
            window: 16,
            staging_bytes: 4 << 20,
            staging: None,
            max_gather: None,
            max_remote_segments: None,
            timeout: Duration::from_secs(30),
            context: 0x4e43 << 48,
        }
    }
}

impl Options {
    /// The pack threshold measured for a driver by `tests/threshold.rs` (4 MiB gathered from
    /// blocks of each size into a contiguous remote range, zero-copy against packed; see
    /// docs/noncontig.md): the smallest mean segment from which zero-copy stays ahead.
    /// Native tcp gathers 64 entries per operation and catches up at 2 KiB (512 B to 2 KiB
    /// across runs); libfabric's shm gathers 3 and pays ~10 µs per operation, so packing wins
    /// up to 32 KiB; libfabric's tcp (rxm) gathers 3 and its small RMA operations are slow
    /// (the target side progresses them), so packing wins up to 64 KiB. Other drivers, not
    /// measured yet, get 8 KiB.
    pub fn measured_threshold(caps: &Capabilities) -> u64 {
        match caps.driver.as_str() {
            "tcp" => 2 << 10,
            "ofi+shm" => 32 << 10,
            "ofi+tcp" => 64 << 10,
            _ => 8 << 10,
        }
    }

    /// The path `Auto` takes: [`Path::Packed`] when the local mean segment is below
    /// `pack_threshold` and the remote mean segment is not (packing the local side then
    /// turns many small gathers into one large operation per remote segment); otherwise
    /// [`Path::ZeroCopy`]. Means come from [`ferry_dtype::Datatype::segment_count_hint`],
    /// an upper bound on the segments, so nothing is walked to decide.
    pub fn choose(&self, caps: &Capabilities, local: &LocalLayout, remote: &RemoteLayout) -> Path {
        let threshold = self
            .pack_threshold
            .unwrap_or_else(|| Self::measured_threshold(caps));
        match self.path {
            Path::Auto => {
                let mean = |size: u64, segs: u64| size / segs.max(1);
                let l = mean(local.size(), local.dtype.segment_count_hint(local.count));
                let r = mean(remote.size(), remote.dtype.segment_count_hint(remote.count));
                if l < threshold && r >= threshold {
                    Path::Packed
                } else {
                    Path::ZeroCopy
                }
            }
            p => p,
        }
    }
}

/// What a transfer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// The path taken ([`Path::ZeroCopy`] or [`Path::Packed`]; `Auto` only for 0 bytes).
    pub path: Path,
    /// Bytes moved.
    pub bytes: u64,
    /// RMA operations posted.
    pub ops: u64,
    /// Operations that gathered or scattered local segments in place (zero-copy path).
    pub zero_copy_ops: u64,
    /// Bytes copied through the staging buffer (packed path).
    pub packed_bytes: u64,
    /// Remote segments that needed more than one operation because their local segments
    /// exceeded the gather limit (software splitting).
    pub splits: u64,
    /// Local segments gathered or scattered (zero-copy path).
    pub local_segments: u64,
    /// Remote contiguous segments addressed.
    pub remote_segments: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Write,
    Read,
}

/// Writes `local`'s data stream into `remote` over `ep`; returns what it did. Fails before
/// posting anything if the layouts differ in size, the remote layout overlaps itself (it is
/// the receive side), either layout leaves its region or slice, or `ep` lacks RMA.
pub fn write(
    ep: &dyn Endpoint,
    local: &LocalLayout,
    remote: &RemoteLayout,
    opts: &Options,
) -> Result<Stats> {
    transfer(ep, local, remote, opts, Dir::Write)
}

/// Reads `remote`'s data stream into `local` over `ep`: the mirror of [`write()`] (the local
/// layout is the receive side and must not overlap itself).
pub fn read(
    ep: &dyn Endpoint,
    local: &LocalLayout,
    remote: &RemoteLayout,
    opts: &Options,
) -> Result<Stats> {
    transfer(ep, local, remote, opts, Dir::Read)
}

fn transfer(
    ep: &dyn Endpoint,
    local: &LocalLayout,
    remote: &RemoteLayout,
    opts: &Options,
    dir: Dir,
) -> Result<Stats> {
    let caps = ep.capabilities();
    if !caps.rma {
        return Err(NoncontigError::Invalid(format!(
            "the {} driver has no RMA",
            caps.driver
        )));
    }
    if opts.window == 0 || (opts.staging_bytes == 0 && opts.staging.is_none()) {
        return Err(NoncontigError::Invalid(
            "window and staging bytes must be at least 1".into(),
        ));
    }
    // The bounds checks also refuse layouts whose arithmetic overflows.
    local.check()?;
    remote.check()?;
    let (ls, rs) = (local.size(), remote.size());
    if ls != rs {
        return Err(NoncontigError::SizeMismatch {
            local: ls,
            remote: rs,
        });
    }
    match dir {
        Dir::Write => remote.dtype.check_receive(remote.count)?,
        Dir::Read => local.dtype.check_receive(local.count)?,
    }
    if local.region.domain() != ep.domain().id() {
        return Err(NoncontigError::Invalid(
            "the local region belongs to another domain".into(),
        ));
    }
    let gather = opts
        .max_gather
        .unwrap_or(caps.rma_gather)
        .clamp(1, caps.rma_gather.max(1));
    let riov = opts
        .max_remote_segments
        .unwrap_or(caps.rma_iov_limit)
        .clamp(1, caps.rma_iov_limit.max(1));
    let mut run = Run {
        ep,
        opts,
        dir,
        inflight: 0,
        seq: 0,
        failed: None,
        foreign: None,
        stats: Stats::default(),
    };
    if ls == 0 {
        return Ok(run.stats);
    }
    let max_op = caps.max_msg_size.max(1);
    let result = match opts.choose(caps, local, remote) {
        Path::Packed => run.packed(local, remote, max_op),
        _ => {
            // The operations posted together share their setup (one checked-RMA grant).
            ep.hold_rma();
            let posted = run.zero_copy(local, remote, gather, riov, max_op);
            posted.and(ep.release_rma().map_err(NoncontigError::from))
        }
    };
    // Whatever happened, nothing may still be in flight when we return.
    let drained = run.drain();
    result?;
    drained?;
    if let Some((op, ctx)) = run.foreign {
        return Err(NoncontigError::Invalid(format!(
            "a foreign {op:?} completion (context {ctx:#x}) arrived during the transfer"
        )));
    }
    match run.failed.take() {
        Some(e) => Err(NoncontigError::Completion(e)),
        None => Ok(run.stats),
    }
}

/// A zero-copy operation being built: local segments, remote ranges, bytes.
struct ZeroCopyOp {
    list: Vec<LocalSlice>,
    ranges: Vec<RemoteSlice>,
    bytes: u64,
}

struct Run<'a> {
    ep: &'a dyn Endpoint,
    opts: &'a Options,
    dir: Dir,
    inflight: usize,
    seq: u64,
    failed: Option<ferry_fabric::FabricError>,
    /// The first completion that was not ours, if any.
    foreign: Option<(OpKind, u64)>,
    stats: Stats,
}

impl Run<'_> {
    /// Posts one operation of `list` against the ranges `remote` (one range: a plain RMA).
    fn post(&mut self, list: &[LocalSlice], remote: &[RemoteSlice]) -> Result<()> {
        while self.inflight >= self.opts.window {
            self.reap()?;
        }
        let ctx = (self.opts.context & !SEQ_MASK) | (self.seq & SEQ_MASK);
        match (self.dir, remote) {
            (Dir::Write, [one]) => self.ep.post_write(list, *one, ctx)?,
            (Dir::Read, [one]) => self.ep.post_read(list, *one, ctx)?,
            (Dir::Write, _) => self.ep.post_write_v(list, remote, ctx)?,
            (Dir::Read, _) => self.ep.post_read_v(list, remote, ctx)?,
        }
        self.seq += 1;
        self.inflight += 1;
        self.stats.ops += 1;
        self.stats.bytes += remote.iter().map(|r| r.len).sum::<u64>();
        Ok(())
    }

    /// Posts the zero-copy operation built so far, if any, and starts the next.
    fn flush(&mut self, op: &mut ZeroCopyOp) -> Result<()> {
        if op.ranges.is_empty() {
            return Ok(());
        }
        self.post(&op.list, &op.ranges)?;
        self.stats.zero_copy_ops += 1;
        op.list.clear();
        op.ranges.clear();
        op.bytes = 0;
        Ok(())
    }

    /// Waits for one completion of ours.
    /// Waits for one completion of ours. A foreign completion (the queue is meant to be ours
    /// alone) is consumed and remembered, so the transfer still drains and then fails.
    fn reap(&mut self) -> Result<()> {
        // What was held must leave before we wait for it.
        self.ep.release_rma()?;
        let c = loop {
            let c = self.ep.cq().wait(self.opts.timeout)?;
            let ours = c.context & !SEQ_MASK == self.opts.context & !SEQ_MASK
                && matches!(c.op, OpKind::Write | OpKind::Read);
            if ours {
                break c;
            }
            self.foreign.get_or_insert((c.op, c.context));
        };
        self.inflight -= 1;
        if let Err(e) = c.result {
            self.failed.get_or_insert(e);
        }
        Ok(())
    }

    /// Posts one operation per remote segment (cut at `max_op`) of the next `n` bytes of the
    /// remote stream, from (or into) `staging[at..at + n]`.
    fn post_chunk(
        &mut self,
        rc: &mut ferry_dtype::Cursor,
        staging: &MemoryRegion,
        at: usize,
        n: usize,
        remote: &RemoteLayout,
        max_op: u64,
    ) -> Result<()> {
        let mut off = 0usize;
        while off < n {
            let Some(rseg) = rc.next_segment(((n - off) as u64).min(max_op)) else {
                return Err(NoncontigError::Invalid(
                    "remote layout ended before the local one (a bug)".into(),
                ));
            };
            self.stats.remote_segments += 1;
            let len = rseg.len as usize;
            let piece = staging.slice(at + off..at + off + len)?;
            self.post(
                &[piece],
                &[remote.slice.sub(remote.at(rseg.offset), rseg.len)?],
            )?;
            off += len;
        }
        Ok(())
    }

    /// Drains, then fails if any operation did (a staging half is reused only after its
    /// chunk landed).
    fn settle(&mut self) -> Result<()> {
        self.drain()?;
        match self.failed.take() {
            Some(e) => Err(NoncontigError::Completion(e)),
            None => Ok(()),
        }
    }

    fn drain(&mut self) -> Result<()> {
        while self.inflight > 0 {
            self.reap()?;
        }
        Ok(())
    }

    /// Operations over consecutive remote segments (each cut at `max_op`), `riov` at most
    /// per operation, gathering the local segments that fill them, `gather` at most per
    /// operation (a remote segment whose local segments do not fit is cut, and its rest
    /// starts the next operation), and `max_op` bytes at most. With `riov == 1`: one
    /// operation per remote segment, more where its local segments exceed `gather`.
    fn zero_copy(
        &mut self,
        local: &LocalLayout,
        remote: &RemoteLayout,
        gather: usize,
        riov: usize,
        max_op: u64,
    ) -> Result<()> {
        self.stats.path = Path::ZeroCopy;
        let mut lc = local.cursor()?;
        let mut rc = remote.cursor()?;
        let mut batch: Vec<Segment> = Vec::with_capacity(gather);
        let mut op = ZeroCopyOp {
            list: Vec::with_capacity(gather),
            ranges: Vec::with_capacity(riov),
            bytes: 0,
        };
        while let Some(rseg) = rc.next_segment(max_op) {
            self.stats.remote_segments += 1;
            if op.bytes.saturating_add(rseg.len) > max_op {
                self.flush(&mut op)?;
            }
            let fresh = op.ranges.is_empty();
            let mut at = remote.at(rseg.offset);
            let mut left = rseg.len;
            let mut pieces = 0;
            while left > 0 {
                batch.clear();
                // Flushed whenever full, so at least one entry is free.
                let n = lc.next_batch(gather - op.list.len(), left, &mut batch);
                if n == 0 {
                    return Err(NoncontigError::Invalid(
                        "local layout ended before the remote one (a bug)".into(),
                    ));
                }
                op.list.extend(batch.iter().map(|s| LocalSlice {
                    region: local.region.clone(),
                    offset: local.at(s.offset),
                    len: s.len as usize,
                }));
                op.ranges.push(remote.slice.sub(at, n)?);
                op.bytes += n;
                self.stats.local_segments += batch.len() as u64;
                at += n;
                left -= n;
                pieces += 1;
                if left > 0 || op.list.len() >= gather || op.ranges.len() >= riov {
                    self.flush(&mut op)?;
                }
            }
            if pieces > 1 && fresh {
                self.stats.splits += 1;
            }
        }
        self.flush(&mut op)
    }

    /// Chunks of the stream through a staging buffer: pack, then one operation per remote
    /// segment of the chunk (writes); or one operation per remote segment, then unpack
    /// (reads). With two halves, copying one chunk overlaps moving the other.
    fn packed(&mut self, local: &LocalLayout, remote: &RemoteLayout, max_op: u64) -> Result<()> {
        self.stats.path = Path::Packed;
        let total = local.size();
        let staging = match &self.opts.staging {
            Some(s) if s.domain() == self.ep.domain().id() && !s.is_empty() => s.clone(),
            Some(_) => {
                return Err(NoncontigError::Invalid(
                    "the staging buffer is empty or belongs to another domain".into(),
                ))
            }
            None => {
                let len = usize::try_from(total)
                    .unwrap_or(usize::MAX)
                    .min(self.opts.staging_bytes);
                self.ep
                    .domain()
                    .register(&Buffer::new(len), Access::LOCAL)?
            }
        };
        // Two halves when there is room: the next chunk is packed (or the last one
        // unpacked) while the other half's operations are in flight.
        let two = staging.len() >= 2;
        let half = if two {
            staging.len() / 2
        } else {
            staging.len()
        };
        let base = |which: usize| if two { which * half } else { 0 };
        let mut rc = remote.cursor()?;
        let size_of = |pos: u64| (half as u64).min(total - pos) as usize;
        let (mut pos, mut which) = (0u64, 0usize);
        let mut n = size_of(0);
        match self.dir {
            Dir::Write => {
                pack_to_buffer(local, 0, staging.buffer(), base(0), n)?;
                loop {
                    self.post_chunk(&mut rc, &staging, base(which), n, remote, max_op)?;
                    let next = pos + n as u64;
                    let m = size_of(next);
                    if !two {
                        self.settle()?;
                    }
                    if m > 0 {
                        pack_to_buffer(local, next, staging.buffer(), base(which ^ 1), m)?;
                    }
                    self.settle()?;
                    self.stats.packed_bytes += n as u64;
                    (pos, n, which) = (next, m, which ^ 1);
                    if n == 0 {
                        break;
                    }
                }
            }
            Dir::Read => {
                self.post_chunk(&mut rc, &staging, base(0), n, remote, max_op)?;
                loop {
                    self.settle()?;
                    let next = pos + n as u64;
                    let m = size_of(next);
                    if m > 0 && two {
                        self.post_chunk(&mut rc, &staging, base(which ^ 1), m, remote, max_op)?;
                    }
                    unpack_from_buffer(local, pos, staging.buffer(), base(which), n)?;
                    self.stats.packed_bytes += n as u64;
                    if m == 0 {
                        break;
                    }
                    if !two {
                        self.post_chunk(&mut rc, &staging, base(which), m, remote, max_op)?;
                    }
                    (pos, n, which) = (next, m, which ^ 1);
                }
            }
        }
        Ok(())
    }
}
