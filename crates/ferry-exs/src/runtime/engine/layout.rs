//! Layout transfers: the RMAs the core asks for when one side (or both) is noncontiguous.
//!
//! EXIO's zero-copy design on EXS: consecutive contiguous segments of the remote side (each
//! cut at the RMA piece size), up to the driver's `rma_iov_limit` of them and one piece in
//! all, share one operation that gathers (write) or scatters (read) the local segments that
//! fill them, at most the driver's `rma_gather` per operation (a remote segment whose local
//! segments do not fit is cut: split in software); one remote range is a plain RMA, several
//! a `post_write_v` / `post_read_v`. Up to [`WINDOW`] operations are in flight, the rest are
//! posted as completions come back, so a layout of 2^20 segments needs no more memory than a
//! few cursors. The message's ACK (or PUSH_DONE) is the one completion message, as in EXIO.
//!
//! When the local mean segment is below the pack threshold (the driver's value measured by
//! `ferry-noncontig`, or [`ExsSocket::set_pack_threshold`](crate::runtime::ExsSocket)), the
//! local side goes through a registered staging buffer instead: packed before a write,
//! unpacked after a read.

use std::collections::HashMap;

use ferry_dtype::{Cursor, Datatype, Segment};
use ferry_fabric::{Access, Buffer, LocalSlice, MemoryRegion, RemoteSlice};
use ferry_noncontig::{pack_to_buffer, unpack_from_buffer, LocalLayout, Options, Path};

use super::{Engine, Pending};
use crate::error::ExsError;
use crate::proto::{Event, EventKind, OpId, WireLayout};
use crate::runtime::buf::{ExsBuf, Held, HeldLayout};
use crate::runtime::layout::{Layout, LayoutStats};

/// Operations of one layout transfer in flight at once.
const WINDOW: usize = 64;
/// Staging buffers kept for reuse.
const POOL: usize = 4;

/// What the engine keeps for layout operations.
#[derive(Default)]
pub(crate) struct LayoutState {
    xfers: HashMap<OpId, Xfer>,
    pool: Vec<MemoryRegion>,
    /// Operations routed through staging, by their route token.
    staged: HashMap<u64, Staged>,
    /// The socket's pack threshold (`None`: the driver's measured value).
    pub(crate) threshold: Option<u64>,
    pub(crate) stats: LayoutStats,
}

/// A user operation carried out on a staging buffer.
pub(crate) enum Staged {
    /// The user's buffer was packed; it comes back in the event.
    Send(ExsBuf),
    /// The message lands in staging and is unpacked into the user's layout at the event.
    Recv(ExsBuf, Layout),
}

/// What to do once every operation of a transfer has completed.
enum After {
    Nothing,
    /// Return the staging buffer to the pool.
    Release(MemoryRegion),
    /// Unpack `n` staged bytes into the layout at stream position `pos`, then release.
    Unpack {
        staging: MemoryRegion,
        into: LocalLayout,
        pos: u64,
        n: usize,
    },
}

/// The remote side of a layout transfer: `len` stream bytes of `remote` (contiguous), or of
/// the peer's `layout` inside it.
pub(super) struct Far {
    pub(super) remote: RemoteSlice,
    pub(super) layout: Option<WireLayout>,
    pub(super) len: u64,
}

impl Far {
    /// A contiguous remote range.
    pub(super) fn contiguous(remote: RemoteSlice) -> Far {
        Far {
            remote,
            layout: None,
            len: remote.len,
        }
    }
}

/// Per-operation limits of a layout transfer, from the driver's capabilities.
#[derive(Clone, Copy)]
struct Limits {
    /// Local segments per operation.
    gather: usize,
    /// Remote ranges per operation.
    riov: usize,
    /// Bytes per operation (and per remote range).
    piece: u64,
}

/// One layout transfer in flight.
struct Xfer {
    write: bool,
    /// Where local segment offsets point: the region, and the region offset of offset 0.
    lregion: MemoryRegion,
    lbase: i128,
    lc: Cursor,
    /// The remote side: segment offsets are relative to `remote.addr`.
    remote: RemoteSlice,
    rc: Cursor,
    /// The rest of the current remote segment: its offset and length, and operations so far.
    seg: (u64, u64, u32),
    /// Stream bytes not yet posted.
    left: u64,
    inflight: usize,
    result: Result<(), ExsError>,
    zero_copy: bool,
    after: After,
    batch: Vec<Segment>,
}

impl LayoutState {
    /// A registered buffer of at least `n` bytes (remote-readable: staged sends are pulled).
    pub(crate) fn staging(
        &mut self,
        ep: &dyn ferry_fabric::Endpoint,
        n: usize,
    ) -> Result<MemoryRegion, ferry_fabric::FabricError> {
        let best = self
            .pool
            .iter()
            .enumerate()
            .filter(|(_, r)| r.len() >= n)
            .min_by_key(|(_, r)| r.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => Ok(self.pool.swap_remove(i)),
            None => ep.domain().register(&Buffer::new(n.max(4096)), Access::ALL),
        }
    }

    /// Gives a staging buffer back (the largest [`POOL`] are kept).
    pub(crate) fn release(&mut self, region: MemoryRegion) {
        self.pool.push(region);
        if self.pool.len() > POOL {
            self.pool.sort_by_key(|r| std::cmp::Reverse(r.len()));
            self.pool.truncate(POOL);
        }
    }

    /// Remembers that the operation of route `token` runs on staging.
    pub(crate) fn stage(&mut self, token: u64, s: Staged) {
        self.staged.insert(token, s);
    }
}

/// The user's layout over its buffer, as `ferry-noncontig` addresses it.
pub(crate) fn local_layout(buf: &ExsBuf, l: &Layout) -> LocalLayout {
    LocalLayout::new(
        buf.region().clone(),
        buf.offset() + l.origin(),
        l.dtype().clone(),
        l.count(),
    )
}

/// The datatype of a peer's advertised layout (offsets relative to its slice).
fn remote_type(l: &WireLayout) -> Option<Datatype> {
    let segs = l
        .segments()
        .iter()
        .map(|&(off, len)| Some(Segment::new(i64::try_from(off).ok()?, len)))
        .collect::<Option<Vec<_>>>()?;
    let t = Datatype::from_segments(&segs).ok()?;
    if l.reps() == 1 {
        return Some(t);
    }
    Datatype::hvector(l.reps(), 1, i64::try_from(l.stride()).ok()?, &t).ok()
}

impl Engine {
    /// A registered staging buffer of at least `n` bytes, from the pool if one fits.
    pub(crate) fn take_staging(
        &mut self,
        n: usize,
    ) -> Result<MemoryRegion, ferry_fabric::FabricError> {
        self.nc.staging(self.ep.as_ref(), n)
    }

    /// The pack threshold in force.
    fn pack_threshold(&self) -> u64 {
        self.nc
            .threshold
            .unwrap_or_else(|| Options::measured_threshold(self.ep.capabilities()))
    }

    /// True if a layout operation of `l` should go through staging.
    pub(crate) fn should_pack(&self, l: &Layout) -> bool {
        match l.path() {
            Path::Packed => true,
            Path::ZeroCopy => false,
            Path::Auto => l.mean_segment() < self.pack_threshold(),
        }
    }

    /// Starts an RMA of `far.len` stream bytes between `local` (from stream position
    /// `local_offset`) and the remote side.
    pub(super) fn layout_rma(
        &mut self,
        op: OpId,
        write: bool,
        local: &Held,
        local_offset: u64,
        far: Far,
    ) {
        match self.start_xfer(write, local, local_offset, far.remote, far.layout, far.len) {
            Ok(Some(x)) => {
                self.nc.xfers.insert(op, x);
                self.pump(op);
            }
            Ok(None) => self.conn.rma_done(op, Ok(())),
            Err(()) => self.conn.rma_done(op, Err(ExsError::Transfer)),
        }
    }

    fn start_xfer(
        &mut self,
        write: bool,
        local: &Held,
        local_offset: u64,
        remote: RemoteSlice,
        layout: Option<WireLayout>,
        len: u64,
    ) -> Result<Option<Xfer>, ()> {
        if len == 0 {
            return Ok(None);
        }
        let rc = match &layout {
            Some(l) => Cursor::new(&remote_type(l).ok_or(())?, 1).map_err(|_| ())?,
            None if len <= remote.len => Cursor::new(&Datatype::byte(), len).map_err(|_| ())?,
            None => return Err(()),
        };
        let buf = local.buf();
        let byte = Datatype::byte();
        let (lregion, lbase, lc, after, zero_copy) = match local.layout() {
            Some(HeldLayout { layout: l, .. }) if self.should_pack(l) => {
                let n = usize::try_from(len).map_err(|_| ())?;
                let staging = self.nc.staging(self.ep.as_ref(), n).map_err(|_| ())?;
                let into = local_layout(buf, l);
                let after = if write {
                    let done = pack_to_buffer(&into, local_offset, staging.buffer(), 0, n);
                    if done.ok() != Some(n) {
                        self.nc.release(staging);
                        return Err(());
                    }
                    self.nc.stats.packed_bytes += len;
                    After::Release(staging.clone())
                } else {
                    After::Unpack {
                        staging: staging.clone(),
                        into,
                        pos: local_offset,
                        n,
                    }
                };
                let lc = Cursor::new(&byte, len).map_err(|_| ())?;
                (staging, 0, lc, after, false)
            }
            Some(HeldLayout { layout: l, .. }) => {
                let lc = Cursor::at(l.dtype(), l.count(), local_offset).map_err(|_| ())?;
                if lc.remaining() < len {
                    return Err(());
                }
                let base = (buf.offset() + l.origin()) as i128;
                (buf.region().clone(), base, lc, After::Nothing, true)
            }
            None => {
                if local_offset
                    .checked_add(len)
                    .is_none_or(|end| end > buf.len() as u64)
                {
                    return Err(());
                }
                let lc = Cursor::new(&byte, len).map_err(|_| ())?;
                let base = buf.offset() as i128 + i128::from(local_offset);
                (buf.region().clone(), base, lc, After::Nothing, false)
            }
        };
        let s = &mut self.nc.stats;
        if !write {
            if zero_copy {
                s.recvs_zero_copy += 1;
            } else if matches!(after, After::Unpack { .. }) {
                s.recvs_packed += 1;
            }
        }
        Ok(Some(Xfer {
            write,
            lregion,
            lbase,
            lc,
            remote,
            rc,
            seg: (0, 0, 0),
            left: len,
            inflight: 0,
            result: Ok(()),
            zero_copy,
            after,
            batch: Vec::new(),
        }))
    }

    /// Posts what the window allows; finishes the transfer once nothing is left or out.
    fn pump(&mut self, op: OpId) {
        let Some(mut x) = self.nc.xfers.remove(&op) else {
            return;
        };
        let caps = self.ep.capabilities();
        let lim = Limits {
            gather: caps.rma_gather.max(1),
            riov: caps.rma_iov_limit.max(1),
            piece: caps.max_msg_size.min(self.rma_chunk).max(1),
        };
        while x.result.is_ok() && x.left > 0 && x.inflight < WINDOW {
            if let Err(e) = self.post_one(op, &mut x, lim) {
                x.result = Err(e);
            }
        }
        if x.inflight > 0 || (x.left > 0 && x.result.is_ok()) {
            self.nc.xfers.insert(op, x);
            return;
        }
        let mut result = x.result;
        if x.seg.2 > 1 {
            self.nc.stats.splits += 1;
        }
        match x.after {
            After::Nothing => {}
            After::Release(staging) => self.nc.release(staging),
            After::Unpack {
                staging,
                into,
                pos,
                n,
            } => {
                if result.is_ok() {
                    let done = unpack_from_buffer(&into, pos, staging.buffer(), 0, n);
                    if done.ok() == Some(n) {
                        self.nc.stats.packed_bytes += n as u64;
                    } else {
                        result = Err(ExsError::Transfer);
                    }
                }
                self.nc.release(staging);
            }
        }
        self.conn.rma_done(op, result);
    }

    /// Posts one operation: consecutive remote segments (each cut at `piece`), at most
    /// `riov` of them and `piece` bytes in all, with the local segments that fill them, at
    /// most `gather` (a remote segment whose local segments do not fit is cut, and its rest
    /// starts the next operation). One range is a plain RMA, several a gathered one.
    fn post_one(&mut self, op: OpId, x: &mut Xfer, lim: Limits) -> Result<(), ExsError> {
        let mut list: Vec<LocalSlice> = Vec::with_capacity(lim.gather);
        let mut ranges: Vec<RemoteSlice> = Vec::with_capacity(lim.riov);
        let mut bytes = 0u64;
        while x.left > 0 && ranges.len() < lim.riov && list.len() < lim.gather {
            if x.seg.1 == 0 {
                let s =
                    x.rc.next_segment(x.left.min(lim.piece))
                        .ok_or(ExsError::Transfer)?;
                if x.seg.2 > 1 {
                    self.nc.stats.splits += 1;
                }
                x.seg = (
                    u64::try_from(s.offset).map_err(|_| ExsError::Transfer)?,
                    s.len,
                    0,
                );
                self.nc.stats.remote_segments += 1;
            }
            if !ranges.is_empty() && bytes + x.seg.1 > lim.piece {
                break;
            }
            x.batch.clear();
            let n =
                x.lc.next_batch(lim.gather - list.len(), x.seg.1, &mut x.batch);
            if n == 0 {
                return Err(ExsError::Transfer);
            }
            for s in &x.batch {
                let at = usize::try_from(x.lbase + i128::from(s.offset))
                    .map_err(|_| ExsError::Transfer)?;
                list.push(LocalSlice {
                    region: x.lregion.clone(),
                    offset: at,
                    len: s.len as usize,
                });
            }
            ranges.push(x.remote.sub(x.seg.0, n).map_err(|_| ExsError::Transfer)?);
            x.seg = (x.seg.0 + n, x.seg.1 - n, x.seg.2 + 1);
            x.left -= n;
            bytes += n;
            if x.seg.1 > 0 {
                // Its local segments did not fit: the rest starts the next operation.
                break;
            }
        }
        let c = self.ctx(Pending::Layout(op));
        let posted = match (x.write, ranges.as_slice()) {
            (true, [one]) => self.ep.post_write(&list, *one, c),
            (false, [one]) => self.ep.post_read(&list, *one, c),
            (true, _) => self.ep.post_write_v(&list, &ranges, c),
            (false, _) => self.ep.post_read_v(&list, &ranges, c),
        };
        if posted.is_err() {
            self.pending.remove(&c);
            return Err(ExsError::Transfer);
        }
        let s = &mut self.nc.stats;
        s.rma_ops += 1;
        if x.zero_copy {
            s.zero_copy_ops += 1;
            s.local_segments += list.len() as u64;
        }
        x.inflight += 1;
        Ok(())
    }

    /// One operation of layout transfer `op` completed.
    pub(super) fn layout_piece_done(&mut self, op: OpId, result: Result<(), ExsError>) {
        if let Some(x) = self.nc.xfers.get_mut(&op) {
            x.inflight -= 1;
            if x.result.is_ok() {
                x.result = result;
            }
        }
        self.pump(op);
    }

    /// Immediate bytes for a layout receive: unpacked into its segments at `offset`.
    pub(super) fn layout_copy_in(&mut self, buf: &Held, offset: u64, data: &[u8]) -> bool {
        let Some(HeldLayout { layout, .. }) = buf.layout() else {
            return false;
        };
        let into = local_layout(buf.buf(), layout);
        let src = Buffer::from_slice(data);
        let _ = unpack_from_buffer(&into, offset, &src, 0, data.len());
        self.nc.stats.recvs_immediate += 1;
        self.nc.stats.packed_bytes += data.len() as u64;
        true
    }

    /// A completion of a staged operation gets the user's buffer back (a staged receive
    /// unpacks what arrived into the user's layout first).
    pub(super) fn unstage(&mut self, mut ev: Event<Held>) -> Event<Held> {
        if !matches!(ev.kind, EventKind::Send | EventKind::Recv) {
            return ev;
        }
        let Some(st) = self.nc.staged.remove(&ev.ctx) else {
            return ev;
        };
        let staging = ev.buf.take().map(Held::into_buf);
        let user = match st {
            Staged::Send(user) => user,
            Staged::Recv(user, layout) => {
                if let Some(s) = &staging {
                    let into = local_layout(&user, &layout);
                    let n = (ev.len as usize).min(s.len());
                    if unpack_from_buffer(&into, 0, s.buffer(), s.offset(), n).ok() == Some(n) {
                        self.nc.stats.packed_bytes += n as u64;
                    } else if ev.result.is_ok() {
                        ev.result = Err(ExsError::Transfer);
                    }
                }
                user
            }
        };
        if let Some(s) = staging {
            self.nc.release(s.region().clone());
        }
        ev.buf = Some(Held::new(user));
        ev
    }
}
