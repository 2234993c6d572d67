//! Fuzz target body for the EXS wire decoder and the connection state machine.
//!
//! Wire it into the cargo-fuzz project as
//! `fuzz_target!(|data: &[u8]| exs_frame::exs_frame(data));`
//! (`tests/fuzz_src.rs` compiles and runs it in the normal test suite).

use ferry_exs::proto::wire::{self, Frame, Hello};
use ferry_exs::proto::{Action, Config, Connection, Flags, LocalBuf, RemoteSlice, WireLayout};

/// A buffer that only has a length; nothing is transferred.
#[derive(Debug, Clone)]
pub struct FuzzBuf(u64);

impl LocalBuf for FuzzBuf {
    fn len(&self) -> u64 {
        self.0
    }
    fn remote(&self) -> Option<RemoteSlice> {
        Some(RemoteSlice {
            addr: 1 << 40,
            len: self.0,
            key: 1,
        })
    }
    /// The largest buffer sends as a noncontiguous layout (EXS 1.1): two runs 2500 apart.
    fn layout(&self) -> Option<WireLayout> {
        (self.0 == 5000).then(|| WireLayout::new(2, 2500, vec![(0, 2500)], 5000))?
    }
}

/// Checks one input: the decoder never panics and accepts only canonical frames; a connected
/// connection fed the input as a stream of frames never panics, keeps every action inside its
/// buffers, and is idle once closed and drained.
pub fn exs_frame(data: &[u8]) {
    if let Ok(d) = wire::decode(data) {
        let mut again = Vec::new();
        wire::encode(&d.frame, d.credits, d.payload.len(), &mut again);
        again.extend_from_slice(d.payload);
        match d.frame {
            // A later minor may append HELLO fields this build skips.
            Frame::Hello(h) if h.minor > wire::VERSION_MINOR => {
                assert!(data[4..].starts_with(&again[4..]))
            }
            _ => assert_eq!(again, data, "decoder accepted a non-canonical frame"),
        }
    }

    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let cfg = Config {
        send_credits: 2,
        recv_credits: 2,
        small_packet_max_size: 64,
        push: mode & 1 != 0,
    };
    let mut c: Connection<FuzzBuf> = Connection::new(cfg.clone()).expect("valid config");
    let hello = Hello {
        minor: wire::VERSION_MINOR,
        send_credits: 2,
        recv_credits: 2,
        max_imm: 64,
    };
    let mut bytes = Vec::new();
    wire::encode(&Frame::Hello(hello), 0, 0, &mut bytes);
    c.handle_frame(&bytes);
    // Give the peer something to talk about: sends and recvs of assorted kinds.
    for (i, len) in [0u64, 10, 100, 5000].into_iter().enumerate() {
        let flags = Flags(u32::from(mode >> (2 * i + 1)) & 3);
        c.send(i as u64, FuzzBuf(len), flags, 0);
        c.recv(i as u64, FuzzBuf(len), Flags(flags.0 & 1), 0);
    }
    let mut pending = Vec::new();
    let answer = |c: &mut Connection<FuzzBuf>, pending: &mut Vec<Action<FuzzBuf>>| {
        while let Some(a) = c.poll_action() {
            match &a {
                Action::SendFrame { bytes, .. } => assert!(bytes.len() <= cfg.control_buf_size()),
                Action::RmaRead {
                    local,
                    local_offset,
                    remote,
                    ..
                }
                | Action::RmaWrite {
                    local,
                    local_offset,
                    remote,
                    ..
                } => {
                    assert!(local_offset + remote.len <= local.0)
                }
                Action::RmaReadLayout {
                    local,
                    local_offset,
                    len,
                    layout,
                    ..
                } => {
                    assert!(local_offset + len <= local.0 && *len <= layout.size())
                }
                Action::CopyIn { buf, offset, data } => {
                    assert!(offset + data.len() as u64 <= buf.0)
                }
                Action::Event(_) => {}
            }
            pending.push(a);
        }
    };
    while !rest.is_empty() {
        let n = wire::frame_len(rest)
            .unwrap_or(rest.len())
            .clamp(1, rest.len());
        let (frame, tail) = rest.split_at(n);
        rest = tail;
        c.handle_frame(frame);
        answer(&mut c, &mut pending);
        // Report everything done: frames sent, RMAs successful.
        for a in pending.drain(..) {
            match a {
                Action::SendFrame { id, .. } => c.frame_sent(id, Ok(())),
                Action::RmaRead { op, .. }
                | Action::RmaReadLayout { op, .. }
                | Action::RmaWrite { op, .. } => c.rma_done(op, Ok(())),
                _ => {}
            }
        }
    }
    c.close();
    loop {
        answer(&mut c, &mut pending);
        if pending.is_empty() {
            break;
        }
        for a in pending.drain(..) {
            match a {
                Action::SendFrame { id, .. } => c.frame_sent(id, Ok(())),
                Action::RmaRead { op, .. }
                | Action::RmaReadLayout { op, .. }
                | Action::RmaWrite { op, .. } => c.rma_done(op, Ok(())),
                _ => {}
            }
        }
    }
    assert!(c.is_idle(), "operations left after close");
}
