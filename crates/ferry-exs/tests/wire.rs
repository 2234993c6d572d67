//! Decoder properties: random bytes never panic, valid frames round-trip, the decoder accepts
//! only canonical encodings; and a hostile peer cannot panic a connection.

use ferry_exs::proto::wire::{self, Frame, Hello, Status, F_IMMEDIATE, F_NOTIFY, F_PERSISTENT};
use ferry_exs::proto::{Action, Config, Connection, Flags, LocalBuf, RemoteSlice};
use ferry_exs::ExsError;
use proptest::prelude::*;

fn error() -> impl Strategy<Value = ExsError> {
    prop::sample::select(vec![
        ExsError::InvalidFlags,
        ExsError::OffsetOutOfRange,
        ExsError::NotPersistent,
        ExsError::BothPersistent,
        ExsError::AfterPersistent,
        ExsError::NotRemoteAccessible,
        ExsError::InvalidConfig,
        ExsError::MessageSize,
        ExsError::NotConnected,
        ExsError::ConnectionReset,
        ExsError::Protocol,
        ExsError::Canceled,
        ExsError::Transfer,
        ExsError::PeerClosed,
    ])
}

fn status() -> impl Strategy<Value = Status> {
    prop_oneof![Just(Ok(())), error().prop_map(Err)]
}

fn remote() -> impl Strategy<Value = RemoteSlice> {
    (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(addr, len, key)| RemoteSlice {
        addr: addr % (u64::MAX - len),
        len,
        key,
    })
}

/// Any valid frame, with its header credits and immediate payload.
fn frame() -> impl Strategy<Value = (Frame, u16, Vec<u8>)> {
    let id = any::<u64>();
    prop_oneof![
        (any::<u16>(), any::<u16>(), any::<u32>(), any::<u16>()).prop_map(|(s, r, m, minor)| (
            Frame::Hello(Hello {
                minor,
                send_credits: s,
                recv_credits: r,
                max_imm: m,
            }),
            0,
            vec![]
        )),
        (id, any::<u64>(), remote(), 0u8..3, any::<u16>()).prop_map(
            |(id, offset, remote, kind, c)| {
                let (flags, offset) = match kind {
                    0 => (0, offset),
                    1 => (F_PERSISTENT, 0),
                    _ => (F_PERSISTENT | F_NOTIFY, 0),
                };
                (
                    Frame::Advert {
                        id,
                        flags,
                        offset,
                        remote,
                    },
                    c,
                    vec![],
                )
            }
        ),
        (
            id,
            any::<u64>(),
            prop::collection::vec(any::<u8>(), 0..300),
            any::<u16>()
        )
            .prop_map(|(id, offset, data, c)| {
                let remote = RemoteSlice {
                    addr: 0,
                    len: data.len() as u64,
                    key: 0,
                };
                (
                    Frame::Advert {
                        id,
                        flags: F_IMMEDIATE,
                        offset,
                        remote,
                    },
                    c,
                    data,
                )
            }),
        (id, any::<u64>(), status(), any::<u16>()).prop_map(|(id, len, status, c)| (
            Frame::Ack { id, len, status },
            c,
            vec![]
        )),
        (id, any::<u64>(), status(), any::<u16>()).prop_map(|(id, len, status, c)| (
            Frame::PushDone { id, len, status },
            c,
            vec![]
        )),
        (id, any::<u64>(), any::<u64>(), any::<u16>()).prop_map(|(id, offset, len, c)| (
            Frame::PushReq { id, offset, len },
            c,
            vec![]
        )),
        (id, any::<u64>(), any::<u64>(), any::<u16>()).prop_map(|(id, offset, len, c)| (
            Frame::ReadNotify { id, offset, len },
            c,
            vec![]
        )),
        (id, remote(), any::<u16>()).prop_map(|(id, remote, c)| (
            Frame::PushGrant {
                id,
                status: Ok(()),
                remote
            },
            c,
            vec![]
        )),
        (id, error(), any::<u16>()).prop_map(|(id, e, c)| (
            Frame::PushGrant {
                id,
                status: Err(e),
                remote: wire::NO_REMOTE
            },
            c,
            vec![]
        )),
        (id, remote(), any::<u16>()).prop_map(|(id, remote, c)| (
            Frame::RecvAdvert { id, remote },
            c,
            vec![]
        )),
        (1u16..).prop_map(|c| (Frame::Credit, c, vec![])),
        (0u16..15, any::<u16>(), any::<u16>(), any::<u16>()).prop_map(
            |(reason, major, minor, c)| (
                Frame::Close {
                    reason,
                    major,
                    minor
                },
                c,
                vec![]
            )
        ),
    ]
}

fn encoded(frame: &Frame, credits: u16, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    wire::encode(frame, credits, payload.len(), &mut b);
    b.extend_from_slice(payload);
    b
}

/// Decoding must never panic; whatever it accepts must re-encode to the same bytes.
fn check_canonical(bytes: &[u8]) {
    if let Ok(d) = wire::decode(bytes) {
        let again = encoded(&d.frame, d.credits, d.payload);
        match d.frame {
            // A later minor may append HELLO fields this build skips.
            Frame::Hello(h) if h.minor > wire::VERSION_MINOR => {
                assert!(bytes[4..].starts_with(&again[4..]), "{d:?}")
            }
            _ => assert_eq!(again, bytes, "{d:?}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
        check_canonical(&bytes);
    }

    #[test]
    fn random_bodies_behind_a_valid_header_never_panic(
        ty in 0u8..12,
        flags in 0u8..8,
        credits: u16,
        body in prop::collection::vec(any::<u8>(), 0..80),
    ) {
        let mut bytes = ((8 + body.len()) as u32).to_le_bytes().to_vec();
        bytes.extend_from_slice(&[ty, flags]);
        bytes.extend_from_slice(&credits.to_le_bytes());
        bytes.extend_from_slice(&body);
        check_canonical(&bytes);
    }

    #[test]
    fn frames_round_trip((frame, credits, payload) in frame()) {
        let bytes = encoded(&frame, credits, &payload);
        prop_assert_eq!(wire::frame_len(&bytes), Some(bytes.len()));
        let d = wire::decode(&bytes).expect("valid frame decodes");
        prop_assert_eq!(d.frame, frame);
        prop_assert_eq!(d.credits, credits);
        prop_assert_eq!(d.payload, &payload[..]);
        prop_assert!(bytes.len() <= wire::MAX_FIXED_FRAME + payload.len());
    }

    #[test]
    fn mutated_frames_never_panic(
        (frame, credits, payload) in frame(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
        truncate: bool,
    ) {
        let mut bytes = encoded(&frame, credits, &payload);
        for (at, x) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        check_canonical(&bytes);
    }
}

#[test]
fn specific_malformations_are_refused() {
    let ok = encoded(&Frame::Credit, 1, &[]);
    assert!(wire::decode(&ok).is_ok());
    assert_eq!(
        wire::decode(&encoded(&Frame::Credit, 0, &[])),
        Err(wire::WireError::BadField(9))
    );
    let mut long = ok.clone();
    long.push(0);
    assert_eq!(wire::decode(&long), Err(wire::WireError::BadLength));
    let hello = encoded(
        &Frame::Hello(Hello {
            minor: 0,
            send_credits: 1,
            recv_credits: 1,
            max_imm: 0,
        }),
        0,
        &[],
    );
    let mut other = hello.clone();
    other[12] = 3;
    assert_eq!(
        wire::decode(&other),
        Err(wire::WireError::Version { major: 3, minor: 0 })
    );
    let mut magic = hello.clone();
    magic[8] = b'X';
    assert_eq!(wire::decode(&magic), Err(wire::WireError::BadMagic));
    // A remote range that wraps the address space.
    let wrap = RemoteSlice {
        addr: u64::MAX - 1,
        len: 5,
        key: 1,
    };
    let advert = Frame::Advert {
        id: 1,
        flags: 0,
        offset: 0,
        remote: wrap,
    };
    assert!(wire::decode(&encoded(&advert, 0, &[])).is_err());
    // Immediate payload shorter than announced.
    let imm = Frame::Advert {
        id: 1,
        flags: F_IMMEDIATE,
        offset: 0,
        remote: RemoteSlice {
            addr: 0,
            len: 4,
            key: 0,
        },
    };
    let mut b = Vec::new();
    wire::encode(&imm, 0, 4, &mut b);
    b.extend_from_slice(&[1, 2, 3]);
    assert!(wire::decode(&b).is_err());
}

/// A buffer for the hostile-peer test; nothing is ever really transferred.
#[derive(Debug, Clone)]
struct Dummy(u64);

impl LocalBuf for Dummy {
    fn len(&self) -> u64 {
        self.0
    }
    fn remote(&self) -> Option<RemoteSlice> {
        Some(RemoteSlice {
            addr: 1 << 40,
            len: self.0,
            key: 7,
        })
    }
}

/// One step of a hostile conversation.
#[derive(Debug, Clone)]
enum Input {
    Frame(Frame, u16, Vec<u8>),
    Bytes(Vec<u8>),
    Send(u64, u64),
    Recv(u64, u64),
}

/// Lengths that line up between frames and operations, around the immediate limit (256).
fn len() -> impl Strategy<Value = u64> {
    prop::sample::select(vec![0u64, 1, 100, 256, 257, 3000])
}

/// Frames aimed at the ids and lengths a connection actually uses, so they hit live state
/// rather than bouncing off unknown ids; credits mostly zero, so the peer stays believable
/// for a while.
fn aimed_frame() -> impl Strategy<Value = (Frame, u16, Vec<u8>)> {
    let credits = prop_oneof![8 => Just(0u16), 1 => 1u16..3];
    (frame(), 1u64..10, credits, len(), len()).prop_map(|((f, _, p), id, credits, n, offset)| {
        let f = match f {
            Frame::Advert { flags, remote, .. } if flags & F_IMMEDIATE == 0 => {
                let offset = if flags & F_PERSISTENT != 0 {
                    0
                } else {
                    offset % 2 * 100
                };
                Frame::Advert {
                    id,
                    flags,
                    offset,
                    remote: RemoteSlice { len: n, ..remote },
                }
            }
            Frame::Advert { flags, remote, .. } => Frame::Advert {
                id,
                flags,
                offset: 0,
                remote,
            },
            Frame::Ack { status, .. } => Frame::Ack { id, len: n, status },
            Frame::PushDone { status, .. } => Frame::PushDone { id, len: n, status },
            Frame::PushReq { .. } => Frame::PushReq {
                id,
                offset: offset % 2 * 100,
                len: n,
            },
            Frame::ReadNotify { .. } => Frame::ReadNotify {
                id,
                offset: 0,
                len: n,
            },
            Frame::PushGrant {
                status: Ok(()),
                remote,
                ..
            } => Frame::PushGrant {
                id,
                status: Ok(()),
                remote: RemoteSlice { len: n, ..remote },
            },
            Frame::PushGrant { status, remote, .. } => Frame::PushGrant { id, status, remote },
            Frame::RecvAdvert { remote, .. } => Frame::RecvAdvert {
                id,
                remote: RemoteSlice { len: n, ..remote },
            },
            other => other,
        };
        let credits = match f {
            Frame::Hello(_) => 0,
            Frame::Credit => credits.max(1),
            _ => credits,
        };
        (f, credits, p)
    })
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        12 => aimed_frame().prop_map(|(f, c, p)| Input::Frame(f, c, p)),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Input::Bytes),
        3 => (0u64..4, len()).prop_map(|(f, l)| Input::Send(f, l)),
        3 => (0u64..4, len()).prop_map(|(f, l)| Input::Recv(f, l)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Whatever a peer sends, the connection neither panics nor breaks its own accounting,
    /// and every operation ends up with exactly one completion once closed.
    #[test]
    fn a_hostile_peer_cannot_panic_a_connection(
        inputs in prop::collection::vec(input(), 1..60),
        push: bool,
    ) {
        let cfg = Config { send_credits: 4, recv_credits: 4, small_packet_max_size: 256, push };
        let mut c: Connection<Dummy> = Connection::new(cfg.clone()).unwrap();
        let hello = Frame::Hello(Hello { minor: 0, send_credits: 4, recv_credits: 4, max_imm: 256 });
        c.handle_frame(&encoded(&hello, 0, &[]));
        let mut posted = 0u64;
        let mut completed = 0u64;
        let drain = |c: &mut Connection<Dummy>, completed: &mut u64| {
            let mut rmas = Vec::new();
            let mut frames = Vec::new();
            while let Some(a) = c.poll_action() {
                match a {
                    Action::SendFrame { id, bytes, .. } => {
                        assert!(bytes.len() <= cfg.control_buf_size());
                        frames.push(id);
                    }
                    Action::RmaRead { op, local, local_offset, remote }
                    | Action::RmaWrite { op, local, local_offset, remote } => {
                        assert!(local_offset + remote.len <= local.0, "RMA outside the local buffer");
                        rmas.push(op);
                    }
                    Action::RmaReadLayout { op, local, local_offset, len, layout, remote } => {
                        assert!(local_offset + len <= local.0, "RMA outside the local buffer");
                        assert!(len <= layout.size() && remote.addr.checked_add(remote.len).is_some());
                        rmas.push(op);
                    }
                    Action::CopyIn { buf, offset, data } => {
                        assert!(offset + data.len() as u64 <= buf.0, "copy outside the buffer");
                    }
                    Action::Event(e) => *completed += u64::from(e.buf.is_some()),
                }
            }
            (rmas, frames)
        };
        let mut pending = (Vec::new(), Vec::new());
        for (i, inp) in inputs.into_iter().enumerate() {
            match inp {
                Input::Frame(f, credits, p) => c.handle_frame(&encoded(&f, credits, &p)),
                Input::Bytes(b) => c.handle_frame(&b),
                Input::Send(f, len) => {
                    posted += 1;
                    c.send(i as u64, Dummy(len), Flags(f as u32 & 3), u64::from(f == 3) * 100);
                }
                Input::Recv(f, len) => {
                    posted += 1;
                    c.recv(i as u64, Dummy(len), Flags(f as u32 & 1), u64::from(f == 2) * 100);
                }
            }
            let (r, f) = drain(&mut c, &mut completed);
            pending.0.extend(r);
            pending.1.extend(f);
            // Complete half of what is outstanding, oldest first, to keep state alive.
            for op in pending.0.drain(..pending.0.len() / 2).collect::<Vec<_>>() {
                c.rma_done(op, Ok(()));
            }
            for id in pending.1.drain(..pending.1.len() / 2).collect::<Vec<_>>() {
                c.frame_sent(id, Ok(()));
            }
            let s = c.credits();
            prop_assert!(s.available <= u32::from(s.send_window));
            prop_assert!(s.owed <= s.held && s.held <= u32::from(s.recv_window));
        }
        c.close();
        loop {
            let (r, f) = drain(&mut c, &mut completed);
            pending.0.extend(r);
            pending.1.extend(f);
            if pending.0.is_empty() && pending.1.is_empty() {
                break;
            }
            for op in pending.0.drain(..) {
                c.rma_done(op, Err(ExsError::Transfer));
            }
            for id in pending.1.drain(..) {
                c.frame_sent(id, Ok(()));
            }
        }
        prop_assert!(c.is_idle());
        prop_assert_eq!(completed, posted);
    }
}

/// EXS 1.1's ADVERT with a layout: canonical forms round-trip; a layout combined with
/// IMMEDIATE, PERSISTENT or an offset, or reaching outside the slice, is refused.
#[test]
fn layout_adverts_decode_only_when_canonical() {
    use ferry_exs::proto::WireLayout;
    let remote = RemoteSlice {
        addr: 4096,
        len: 100,
        key: 9,
    };
    let advert = |flags, offset, remote| Frame::Advert {
        id: 3,
        flags,
        offset,
        remote,
    };
    let mut layout = Vec::new();
    WireLayout::new(4, 25, vec![(0, 10), (12, 3)], 100)
        .expect("fits")
        .encode(&mut layout);
    let good = encoded(&advert(wire::F_LAYOUT, 0, remote), 2, &layout);
    let d = wire::decode(&good).expect("canonical layout advert");
    assert_eq!(d.payload, &layout[..]);
    assert_eq!(d.frame, advert(wire::F_LAYOUT, 0, remote));
    check_canonical(&good);
    for bad in [
        encoded(
            &advert(wire::F_LAYOUT | F_PERSISTENT, 0, remote),
            0,
            &layout,
        ),
        encoded(&advert(wire::F_LAYOUT, 8, remote), 0, &layout),
        encoded(
            &advert(wire::F_LAYOUT, 0, RemoteSlice { len: 86, ..remote }),
            0,
            &layout,
        ),
        encoded(
            &advert(wire::F_LAYOUT, 0, remote),
            0,
            &layout[..layout.len() - 1],
        ),
        encoded(&advert(wire::F_LAYOUT, 0, remote), 0, &[]),
    ] {
        assert!(wire::decode(&bad).is_err(), "accepted {bad:?}");
    }
    // IMMEDIATE and LAYOUT together, whatever the payload.
    let imm = RemoteSlice {
        addr: 0,
        len: layout.len() as u64,
        key: 0,
    };
    let both = encoded(&advert(wire::F_LAYOUT | F_IMMEDIATE, 0, imm), 0, &layout);
    assert!(wire::decode(&both).is_err());
}

/// The core advertises a layout only to a peer of minor 1 or later; with an older peer a
/// layout send fails (the runtime packs such sends instead, so this is a safety net).
#[test]
fn layouts_need_a_minor_one_peer() {
    use ferry_exs::proto::{EventKind, WireLayout};
    #[derive(Clone)]
    struct Scattered;
    impl LocalBuf for Scattered {
        fn len(&self) -> u64 {
            4000
        }
        fn remote(&self) -> Option<RemoteSlice> {
            Some(RemoteSlice {
                addr: 1 << 30,
                len: 8000,
                key: 5,
            })
        }
        fn layout(&self) -> Option<WireLayout> {
            WireLayout::new(2, 4000, vec![(0, 2000)], 8000)
        }
    }
    for (minor, advertised) in [(0u16, false), (1, true)] {
        let mut c: Connection<Scattered> = Connection::new(Config::default()).unwrap();
        let hello = Frame::Hello(Hello {
            minor,
            send_credits: 4,
            recv_credits: 4,
            max_imm: 512,
        });
        c.handle_frame(&encoded(&hello, 0, &[]));
        assert_eq!(c.peer_minor(), minor);
        c.send(1, Scattered, Flags::NONE, 0);
        let mut saw_layout = false;
        let mut failed = None;
        while let Some(a) = c.poll_action() {
            match a {
                Action::SendFrame { bytes, .. } => {
                    let d = wire::decode(&bytes).expect("own frame");
                    if let Frame::Advert { flags, remote, .. } = d.frame {
                        assert_eq!(flags, wire::F_LAYOUT);
                        assert_eq!(remote.len, 8000);
                        let l = WireLayout::decode(d.payload, remote.len).expect("layout");
                        assert_eq!(l.size(), 4000);
                        saw_layout = true;
                    }
                }
                Action::Event(e) if e.kind == EventKind::Send => failed = Some(e.result),
                _ => {}
            }
        }
        assert_eq!(saw_layout, advertised);
        if !advertised {
            assert_eq!(failed, Some(Err(ExsError::InvalidFlags)));
        }
    }
}
