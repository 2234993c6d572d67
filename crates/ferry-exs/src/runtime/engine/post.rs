//! Posting what the core asks for: frames from pooled registered send buffers (gathering
//! immediate payloads from the user's buffer when the driver can), and RMAs split into pieces
//! the driver accepts.

use ferry_fabric::{Access, Buffer, LocalSlice, MemoryRegion};
use tracing::debug;

use super::{Engine, Pending};
use crate::error::ExsError;
use crate::proto::{FrameId, OpId};
use crate::runtime::buf::Held;

impl Engine {
    fn send_buf(&mut self) -> Result<MemoryRegion, ferry_fabric::FabricError> {
        match self.send_pool.pop() {
            Some(b) => Ok(b),
            None => {
                self.stats.send_buffers += 1;
                self.ep
                    .domain()
                    .register(&Buffer::new(self.send_size), Access::LOCAL)
            }
        }
    }

    pub(super) fn send_frame(
        &mut self,
        id: FrameId,
        bytes: &[u8],
        payload: Option<Held>,
    ) -> Result<(), ferry_fabric::FabricError> {
        let buf = self.send_buf()?;
        buf.buffer().write_at(0, bytes);
        let plen = payload.as_ref().map_or(0, |p| p.buf().len());
        let mut list: Vec<LocalSlice> = Vec::with_capacity(2);
        match payload {
            Some(p) if plen > 0 && self.gather => {
                list.push(buf.slice(..bytes.len())?);
                list.push(p.buf().local(0, plen as u64));
            }
            Some(p) if plen > 0 => {
                // The driver cannot gather: copy the (small, bounded) immediate data instead.
                buf.buffer().write_at(bytes.len(), &p.buf().to_vec());
                self.stats.payload_copies += 1;
                list.push(buf.slice(..bytes.len() + plen)?);
            }
            _ => list.push(buf.slice(..bytes.len())?),
        }
        let c = self.ctx(Pending::Frame(id, buf));
        super::mark_frame(true, bytes);
        self.ep.post_send(&list, c).inspect_err(|_| {
            if let Some(Pending::Frame(_, b)) = self.pending.remove(&c) {
                self.send_pool.push(b);
            }
        })
    }

    pub(super) fn rma(
        &mut self,
        op: OpId,
        write: bool,
        local: &Held,
        offset: u64,
        remote: ferry_fabric::RemoteSlice,
    ) {
        if remote.len == 0 {
            self.conn.rma_done(op, Ok(()));
            return;
        }
        let local = local.buf();
        if offset
            .checked_add(remote.len)
            .is_none_or(|end| end > local.len() as u64)
        {
            self.conn.rma_done(op, Err(ExsError::Transfer));
            return;
        }
        // The core sizes transfers by messages, the driver by max_msg_size: split to fit.
        let max = self
            .ep
            .capabilities()
            .max_msg_size
            .min(self.rma_chunk)
            .max(1);
        ferry_fabric::timeline::mark("exs.rma", op.0);
        let mut posted = 0;
        let mut failed = Ok(());
        let mut done = 0u64;
        while done < remote.len {
            let n = (remote.len - done).min(max);
            let list = [local.local(offset + done, n)];
            let r = ferry_fabric::RemoteSlice {
                addr: remote.addr.wrapping_add(done),
                len: n,
                ..remote
            };
            let c = self.ctx(Pending::Rma(op));
            let res = if write {
                self.ep.post_write(&list, r, c)
            } else {
                self.ep.post_read(&list, r, c)
            };
            if let Err(e) = res {
                debug!(%e, "EXS RMA post failed");
                self.pending.remove(&c);
                failed = Err(super::rma_failure(&e));
                break;
            }
            posted += 1;
            done += n;
        }
        self.stats.rma_pieces += posted as u64;
        self.stats.rma_split += u64::from(posted > 1);
        if posted == 0 {
            self.conn.rma_done(op, failed);
        } else {
            self.rma_parts.insert(op, (posted, failed));
        }
    }

    /// One piece of `op` ended; the core hears of the whole RMA once every piece has.
    pub(super) fn piece_done(&mut self, op: OpId, result: Result<(), ExsError>) {
        let Some((left, first)) = self.rma_parts.get_mut(&op) else {
            return;
        };
        *left -= 1;
        if first.is_ok() {
            *first = result;
        }
        ferry_fabric::timeline::mark("exs.piece", op.0);
        if *left == 0 {
            let r = *first;
            self.rma_parts.remove(&op);
            self.conn.rma_done(op, r);
        }
    }
}
