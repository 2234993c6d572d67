//! `ExsSocket`'s layout operations: noncontiguous sends and receives (see
//! `runtime/layout.rs` for [`Layout`] and `engine/layout.rs` for how the bytes move).

use super::ExsSocket;
use crate::proto::{wire, Flags};
use crate::runtime::buf::{ExsBuf, Held, HeldLayout};
use crate::runtime::engine::{local_layout, Engine, Staged};
use crate::runtime::layout::{Layout, LayoutError, LayoutStats, Refused};
use crate::runtime::EventQueue;

impl ExsSocket {
    /// Sends the bytes `layout` picks out of `buf` as one message (its data stream, in
    /// order); the buffer comes back in the Send event. Zero-copy when the segments are at
    /// least the pack threshold: on pull sockets the ADVERT describes the layout (EXS 1.1)
    /// and the receiver gathers the segments by RMA read; on push sockets this side gathers
    /// them into its RMA writes. Otherwise (tiny segments, a message up to the immediate
    /// size, a layout too long to advertise, a peer older than EXS 1.1) the bytes are packed
    /// into a registered staging buffer and sent from there. [`ExsSocket::layout_stats`]
    /// counts which path ran.
    ///
    /// Refused at once, with the buffer back, if the layout reaches outside `buf`.
    pub fn send_layout(&self, buf: ExsBuf, layout: &Layout, ctx: u64) -> Result<(), Refused> {
        self.send_layout_to(None, buf, layout, ctx)
    }

    /// [`ExsSocket::send_layout`] with its completion going to `queue` (None: the socket's).
    pub fn send_layout_to(
        &self,
        queue: Option<&EventQueue>,
        buf: ExsBuf,
        layout: &Layout,
        ctx: u64,
    ) -> Result<(), Refused> {
        if let Err(error) = layout.check_in(buf.len(), false) {
            return Err(Refused { buf, error });
        }
        self.inner.with(|e| {
            let token = e.route(ctx, queue);
            let held = match send_plan(e, &buf, layout) {
                Plan::Layout(wire) => {
                    e.nc.stats.sends_zero_copy += 1;
                    let l = HeldLayout {
                        layout: layout.clone(),
                        wire,
                        send: true,
                    };
                    Held::with_layout(buf, l)
                }
                Plan::Pack => match pack(e, &buf, layout) {
                    Ok(staged) => {
                        e.nc.stats.sends_packed += 1;
                        e.nc.stage(token, Staged::Send(buf));
                        Held::new(staged)
                    }
                    Err(error) => return Err(Refused { buf, error }),
                },
            };
            e.grant(&held);
            e.conn.send(token, held, Flags::NONE, 0);
            Ok(())
        })
    }

    /// Receives the next message into the bytes `layout` picks out of `buf`, in stream
    /// order; the buffer comes back in the Recv event. A message longer than the layout
    /// fills it and completes with `MessageSize`; nothing outside the layout's segments is
    /// written. The peer's bytes are scattered straight into the segments by RMA read
    /// (gathered from the peer's segments when it sent a layout), or read into a staging
    /// buffer and unpacked when the segments are below the pack threshold; on push sockets
    /// always through staging.
    ///
    /// Refused at once, with the buffer back, if the layout reaches outside `buf` or two of
    /// its segments overlap.
    pub fn recv_layout(&self, buf: ExsBuf, layout: &Layout, ctx: u64) -> Result<(), Refused> {
        self.recv_layout_to(None, buf, layout, ctx)
    }

    /// [`ExsSocket::recv_layout`] with its completion going to `queue` (None: the socket's).
    pub fn recv_layout_to(
        &self,
        queue: Option<&EventQueue>,
        buf: ExsBuf,
        layout: &Layout,
        ctx: u64,
    ) -> Result<(), Refused> {
        if let Err(error) = layout.check_in(buf.len(), true) {
            return Err(Refused { buf, error });
        }
        self.inner.with(|e| {
            let token = e.route(ctx, queue);
            let held = if e.conn.config().push {
                // A grant names one contiguous range: receive into staging, unpack at the end.
                let staged = match staging(e, layout.size()) {
                    Ok(s) => s,
                    Err(error) => return Err(Refused { buf, error }),
                };
                e.nc.stats.recvs_packed += 1;
                e.nc.stage(token, Staged::Recv(buf, layout.clone()));
                Held::new(staged)
            } else {
                let l = HeldLayout {
                    layout: layout.clone(),
                    wire: None,
                    send: false,
                };
                Held::with_layout(buf, l)
            };
            e.grant(&held);
            e.conn.recv(token, held, Flags::NONE, 0);
            Ok(())
        })
    }

    /// Sets the mean segment size below which a layout side is packed (`None`: the
    /// driver's measured value, `ferry_noncontig::Options::measured_threshold`).
    pub fn set_pack_threshold(&self, bytes: Option<u64>) {
        self.inner.lock().nc.threshold = bytes;
    }

    /// What the layout operations did so far: which path ran, and what it cost.
    pub fn layout_stats(&self) -> LayoutStats {
        self.inner.lock().nc.stats
    }
}

enum Plan {
    /// Zero-copy from the user's buffer, advertising this layout (pull) or not (push).
    Layout(Option<crate::proto::WireLayout>),
    Pack,
}

fn send_plan(e: &Engine, buf: &ExsBuf, layout: &Layout) -> Plan {
    let size = layout.size();
    if size <= e.conn.immediate_max() || e.should_pack(layout) {
        return Plan::Pack;
    }
    if e.conn.config().push {
        return Plan::Layout(None);
    }
    if e.conn.peer_minor() < wire::LAYOUT_MINOR {
        return Plan::Pack;
    }
    match layout.wire(buf.len() as u64) {
        Some(w) if w.encoded_len() as u64 <= e.conn.immediate_max() => Plan::Layout(Some(w)),
        _ => Plan::Pack,
    }
}

/// A staging buffer of exactly `len` bytes.
fn staging(e: &mut Engine, len: u64) -> Result<ExsBuf, LayoutError> {
    let n = usize::try_from(len).map_err(|_| LayoutError::Staging("too large".into()))?;
    let region = e
        .take_staging(n)
        .map_err(|err| LayoutError::Staging(err.to_string()))?;
    ExsBuf::new(region)
        .slice(..n)
        .map_err(|err| LayoutError::Staging(err.to_string()))
}

/// The layout's bytes packed into a staging buffer.
fn pack(e: &mut Engine, buf: &ExsBuf, layout: &Layout) -> Result<ExsBuf, LayoutError> {
    let staged = staging(e, layout.size())?;
    let n = staged.len();
    let from = local_layout(buf, layout);
    let done = ferry_noncontig::pack_to_buffer(&from, 0, staged.buffer(), staged.offset(), n);
    if done.as_ref().ok() != Some(&n) {
        e.nc.release(staged.region().clone());
        return Err(LayoutError::Staging(match done {
            Err(err) => err.to_string(),
            Ok(k) => format!("packed {k} of {n} bytes"),
        }));
    }
    e.nc.stats.packed_bytes += n as u64;
    Ok(staged)
}
