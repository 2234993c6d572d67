//! Property tests of the transfer protocol codec: every frame round-trips, and the decoder
//! (the fuzz target body) never panics on arbitrary or mutated bytes.

#[path = "../fuzz_targets_src/xfer_frame.rs"]
mod xfer_frame;

use ferry_wire::Code16;
use ferry_xfer::proto::{self, BlockHeader, Entry, EntryKind, ErrorCode, Msg};
use proptest::prelude::*;

fn s(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<char>(), 0..max.min(40))
        .prop_map(|v| v.into_iter().collect::<String>())
        .prop_filter("fits", move |x| x.len() <= max)
}

fn entry() -> impl Strategy<Value = Entry> {
    (0u8..4, any::<u32>(), any::<u64>(), any::<i64>(), s(200)).prop_map(
        |(k, mode, size, mtime, name)| Entry {
            kind: [
                EntryKind::File,
                EntryKind::Dir,
                EntryKind::Symlink,
                EntryKind::Other,
            ][k as usize],
            mode,
            size,
            mtime,
            name,
        },
    )
}

fn code() -> impl Strategy<Value = ErrorCode> {
    any::<u16>().prop_map(ErrorCode::from_u16)
}

fn msg() -> impl Strategy<Value = Msg> {
    prop_oneof![
        (
            any::<u16>(),
            any::<u16>(),
            any::<u32>(),
            any::<u64>(),
            any::<u16>(),
            s(100)
        )
            .prop_map(
                |(major, minor, block_size, session, stream, token)| Msg::Hello {
                    major,
                    minor,
                    block_size,
                    session,
                    stream,
                    token
                }
            ),
        (any::<u16>(), any::<u16>(), any::<u32>(), any::<u64>()).prop_map(
            |(major, minor, block_size, session)| Msg::Welcome {
                major,
                minor,
                block_size,
                session
            }
        ),
        (code(), any::<u32>(), s(300)).prop_map(|(code, file_id, message)| Msg::Error {
            code,
            file_id,
            message
        }),
        s(300).prop_map(|path| Msg::Stat { path }),
        entry().prop_map(Msg::Entry),
        s(300).prop_map(|path| Msg::List { path }),
        (any::<bool>(), proptest::collection::vec(entry(), 0..20))
            .prop_map(|(more, entries)| Msg::Entries { more, entries }),
        proptest::collection::vec((any::<u32>(), s(300)), 0..=proto::MAX_GETS)
            .prop_filter("fits a control frame", |f| f
                .iter()
                .map(|(_, p)| p.len() + 6)
                .sum::<usize>()
                < proto::MAX_CONTROL - 16)
            .prop_map(|files| Msg::Gets { files }),
        (any::<u32>(), any::<u64>(), any::<u64>(), s(300)).prop_map(
            |(file_id, offset, length, path)| Msg::Get {
                file_id,
                offset,
                length,
                path
            }
        ),
        (
            any::<u32>(),
            prop_oneof![
                Just(0u8),
                Just(proto::PUT_RESUME),
                Just(proto::PUT_FORCE),
                Just(proto::PUT_RESUME | proto::PUT_FORCE)
            ],
            any::<u32>(),
            any::<u64>(),
            proptest::option::of(any::<i64>()),
            s(300)
        )
            .prop_map(|(file_id, flags, mode, size, mtime, path)| Msg::Put {
                file_id,
                flags,
                mode,
                size,
                mtime,
                path
            }),
        (any::<u32>(), any::<u64>(), any::<u32>(), any::<u64>()).prop_map(
            |(file_id, size, mode, offset)| Msg::Ready {
                file_id,
                size,
                mode,
                offset
            }
        ),
        (
            any::<u32>(),
            any::<u64>(),
            proptest::option::of(any::<[u8; 32]>())
        )
            .prop_map(|(file_id, length, blake3)| Msg::FileDone {
                file_id,
                length,
                blake3
            }),
        (
            any::<u32>(),
            proptest::collection::vec((any::<u64>(), any::<u32>()), 0..50)
        )
            .prop_map(|(file_id, ranges)| Msg::Resend { file_id, ranges }),
        any::<u32>().prop_map(|file_id| Msg::Ok { file_id }),
        (any::<u32>(), s(300)).prop_map(|(mode, path)| Msg::Mkdir { mode, path }),
        s(300).prop_map(|path| Msg::Sum { path }),
        (any::<u64>(), any::<[u8; 32]>()).prop_map(|(size, blake3)| Msg::SumReply { size, blake3 }),
        Just(Msg::Bye),
        Just(Msg::Copies),
        any::<u64>().prop_map(|id| Msg::AbortCopy { id }),
        (
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>()),
            (s(300), s(100), s(300))
        )
            .prop_map(
                |((id, done, total, secs), (path, dest, dest_path))| Msg::Copy {
                    id,
                    done,
                    total,
                    secs,
                    path,
                    dest,
                    dest_path
                }
            ),
        (
            0u8..2,
            any::<u32>(),
            s(300),
            s(100),
            s(300),
            s(100),
            1u16..=16,
            any::<bool>(),
            proptest::option::of((
                proptest::collection::vec(s(50), 0..4),
                proptest::collection::vec(s(50), 0..4)
            )),
            proptest::option::of(proptest::collection::vec(s(300), 0..20)),
            proptest::option::of(any::<[u8; 32]>()),
        )
            .prop_map(
                |(
                    flags,
                    file_id,
                    path,
                    dest,
                    dest_path,
                    token,
                    streams,
                    follow,
                    patterns,
                    only,
                    grant,
                )| {
                    Msg::SendTo {
                        flags,
                        file_id,
                        path,
                        dest,
                        dest_path,
                        token,
                        streams,
                        follow,
                        patterns,
                        only,
                        grant,
                    }
                }
            ),
        (0u8..2, any::<u32>(), s(300)).prop_map(|(flags, ttl_secs, path)| Msg::Grant {
            flags,
            ttl_secs,
            path,
        }),
        (any::<u64>(), any::<[u8; 32]>(), any::<u32>()).prop_map(|(id, secret, ttl_secs)| {
            Msg::Granted {
                id,
                secret,
                ttl_secs,
            }
        }),
        (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(file_id, done, total)| {
            Msg::Progress {
                file_id,
                done,
                total,
            }
        }),
        (
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>()
        )
            .prop_map(
                |(file_id, files, bytes, blocks_resent, skipped)| Msg::Copied {
                    file_id,
                    files,
                    bytes,
                    blocks_resent,
                    skipped,
                }
            ),
        (
            0u8..4,
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<i64>(),
            s(300)
        )
            .prop_map(|(flags, file_id, mode, size, mtime, path)| Msg::Open {
                flags,
                file_id,
                mode,
                size,
                mtime,
                path
            }),
        (
            any::<u32>(),
            proptest::collection::vec((any::<u64>(), any::<u64>()), 0..100)
        )
            .prop_map(|(file_id, ranges)| Msg::Have { file_id, ranges }),
        (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(file_id, offset, length)| {
            Msg::PutRange {
                file_id,
                offset,
                length,
            }
        }),
        (
            any::<u32>(),
            any::<u64>(),
            proptest::option::of(any::<[u8; 32]>())
        )
            .prop_map(|(file_id, length, blake3)| Msg::Close {
                file_id,
                length,
                blake3
            }),
    ]
}

/// `bytes` with the byte at `at` (modulo its length) set to `byte`, then cut there: the
/// fuzz body refuses it or reads some other canonical frame, never panics.
fn changed_and_cut(bytes: &[u8], at: usize, byte: u8) {
    let mut bad = bytes.to_vec();
    let i = at % bad.len();
    bad[i] = byte;
    xfer_frame::xfer_frame(&bad);
    bad.truncate(at % (bad.len() + 1));
    xfer_frame::xfer_frame(&bad);
}

proptest! {
    #[test]
    fn control_frames_round_trip(m in msg()) {
        let bytes = proto::to_vec(&m).unwrap();
        prop_assert!(bytes.len() <= proto::MAX_CONTROL);
        let (back, payload) = proto::decode(&bytes).unwrap();
        prop_assert_eq!(back, m);
        prop_assert!(payload.is_empty());
        xfer_frame::xfer_frame(&bytes);
    }

    #[test]
    fn files_round_trip(file_id in any::<u32>(), mode in any::<u32>(), blake3 in any::<[u8; 32]>(), data in proptest::collection::vec(any::<u8>(), 0..5000)) {
        let crc = crc32c_of(&data);
        let mut bytes = proto::encode_file_header(file_id, mode, crc, blake3, data.len() as u32).unwrap().to_vec();
        prop_assert_eq!(bytes.len(), proto::FILE_HEADER_LEN);
        bytes.extend_from_slice(&data);
        let (back, payload) = proto::decode(&bytes).unwrap();
        prop_assert_eq!(back, Msg::File { file_id, mode, crc32c: crc, blake3, len: data.len() as u32 });
        prop_assert_eq!(payload, &data[..]);
        xfer_frame::xfer_frame(&bytes);
        // A FILE frame cut inside its header is refused, never misread.
        for cut in [proto::HEADER_LEN, proto::FILE_HEADER_LEN - 1] {
            let mut short = bytes[..cut].to_vec();
            short[..4].copy_from_slice(&(cut as u32).to_le_bytes());
            prop_assert!(proto::decode(&short).is_err());
        }
    }

    #[test]
    fn packs_round_trip(files in proptest::collection::vec((any::<u32>(), proptest::collection::vec(any::<u8>(), 0..700)), 1..12), tag in proptest::option::of(any::<[u8; 32]>()), at in any::<usize>(), byte in any::<u8>()) {
        let mut frames = Vec::new();
        for (id, data) in &files {
            let head = proto::encode_file_header(*id, 0o644, crc32c_of(data), [7; 32], data.len() as u32).unwrap();
            frames.extend_from_slice(&head);
            frames.extend_from_slice(data);
        }
        let mut bytes = proto::encode_pack_header(files.len() as u16, tag, false, frames.len() as u32).unwrap();
        let head = if tag.is_some() { proto::TAGGED_PACK_HEADER_LEN } else { proto::PACK_HEADER_LEN };
        prop_assert_eq!(bytes.len(), head);
        bytes.extend_from_slice(&frames);
        let (back, payload) = proto::decode(&bytes).unwrap();
        prop_assert_eq!(&back, &Msg::Pack { count: files.len() as u16, tag, sealed: false, len: frames.len() as u32 });
        let got = proto::decode_pack(files.len() as u16, payload).unwrap();
        prop_assert_eq!(got.len(), files.len());
        for ((msg, data), (id, want)) in got.iter().zip(&files) {
            let same = matches!(msg, Msg::File { file_id, .. } if file_id == id);
            prop_assert!(same);
            prop_assert_eq!(*data, &want[..]);
        }
        xfer_frame::xfer_frame(&bytes);
        // A count that disagrees with the frames is refused, either way.
        prop_assert!(proto::decode_pack(files.len() as u16 + 1, payload).is_err());
        if files.len() > 1 {
            prop_assert!(proto::decode_pack(files.len() as u16 - 1, payload).is_err());
        }
        // The tag covers every frame header and the pack's place in its connection; a
        // payload is covered through the BLAKE3 in its header (checked per file).
        let key = [9; 32];
        let count = files.len() as u16;
        let t = proto::pack_tag(&key, 5, count, payload).unwrap();
        prop_assert_ne!(t, proto::pack_tag(&key, 6, count, payload).unwrap());
        prop_assert_ne!(t, proto::pack_tag(&[8; 32], 5, count, payload).unwrap());
        let mut other = payload.to_vec();
        let i = at % proto::FILE_HEADER_LEN;
        if i >= 8 {
            // a header field of the first frame (not its length or type, which decode checks)
            other[i] ^= 1;
            prop_assert_ne!(t, proto::pack_tag(&key, 5, count, &other).unwrap());
        }
        // Any byte changed or any cut: refused or read as some other canonical pack, never
        // a panic (the fuzz body checks the rest).
        changed_and_cut(&bytes, at, byte);
    }

    #[test]
    fn put_files_round_trip(flags in 0u8..2, file_id in any::<u32>(), mode in any::<u32>(), mtime in any::<i64>(), blake3 in any::<[u8; 32]>(), path in s(300), data in proptest::collection::vec(any::<u8>(), 0..5000)) {
        let m = Msg::PutFile { flags, file_id, mode, mtime, blake3, path: path.clone(), len: data.len() as u32 };
        let mut bytes = proto::to_vec(&m).unwrap();
        prop_assert_eq!(bytes.len(), proto::put_file_header_len(&path));
        // `to_vec` wrote the length of the whole frame; the payload follows the path.
        bytes.extend_from_slice(&data);
        let (back, payload) = proto::decode(&bytes).unwrap();
        prop_assert_eq!(back, m);
        prop_assert_eq!(payload, &data[..]);
        xfer_frame::xfer_frame(&bytes);
        // Cut inside the path: refused, never misread.
        let cut = proto::put_file_header_len(&path) - 1;
        let mut short = bytes[..cut].to_vec();
        short[..4].copy_from_slice(&(cut as u32).to_le_bytes());
        prop_assert!(proto::decode(&short).is_err());
    }

    #[test]
    fn a_pack_carries_only_file_frames(m in msg()) {
        let inner = proto::to_vec(&m).unwrap();
        prop_assert!(proto::decode_pack(1, &inner).is_err());
        prop_assert!(proto::decode_pack(0, &[]).is_ok_and(|v| v.is_empty()));
        if !matches!(m, Msg::PutFile { .. }) {
            prop_assert!(proto::decode_put_pack(1, &inner).is_err());
        }
    }

    /// An upload's PACK (1.11): PUT_FILE frames back to back, each with its path and
    /// payload, taken apart exactly; a count that disagrees, or a FILE frame among them,
    /// is refused; any change or cut is refused or read canonically, never a panic.
    #[test]
    fn put_packs_round_trip(files in proptest::collection::vec((any::<u32>(), s(40), proptest::collection::vec(any::<u8>(), 0..700)), 1..12), at in any::<usize>(), byte in any::<u8>()) {
        let mut frames = Vec::new();
        for (id, path, data) in &files {
            let m = Msg::PutFile { flags: 0, file_id: *id, mode: 0o644, mtime: 7, blake3: [3; 32], path: path.clone(), len: data.len() as u32 };
            frames.extend_from_slice(&proto::to_vec(&m).unwrap());
            frames.extend_from_slice(data);
        }
        let count = files.len() as u16;
        let mut bytes = proto::encode_pack_header(count, None, false, frames.len() as u32).unwrap();
        bytes.extend_from_slice(&frames);
        let (_, payload) = proto::decode(&bytes).unwrap();
        let got = proto::decode_put_pack(count, payload).unwrap();
        for ((msg, data), (id, want_path, want)) in got.iter().zip(&files) {
            let same = matches!(msg, Msg::PutFile { file_id, path, .. } if file_id == id && path == want_path);
            prop_assert!(same);
            prop_assert_eq!(*data, &want[..]);
        }
        prop_assert!(proto::decode_pack(count, payload).is_err());
        prop_assert!(proto::decode_put_pack(count + 1, payload).is_err());
        if count > 1 {
            prop_assert!(proto::decode_put_pack(count - 1, payload).is_err());
        }
        let file = proto::encode_file_header(1, 0o644, 0, [7; 32], 0).unwrap();
        let mixed = [payload, &file[..]].concat();
        prop_assert!(proto::decode_put_pack(count + 1, &mixed).is_err());
        xfer_frame::xfer_frame(&bytes);
        changed_and_cut(&bytes, at, byte);
    }

    #[test]
    fn blocks_round_trip(file_id in any::<u32>(), offset in 0u64..(1 << 50), data in proptest::collection::vec(any::<u8>(), 0..5000)) {
        let h = BlockHeader { file_id, stream: 0, offset, len: data.len() as u32, crc32c: crc32c_of(&data), spans: false };
        let mut bytes = proto::encode_block_header(&h).unwrap().to_vec();
        bytes.extend_from_slice(&data);
        let (back, payload) = proto::decode(&bytes).unwrap();
        prop_assert_eq!(back, Msg::Block(h));
        prop_assert_eq!(payload, &data[..]);
        xfer_frame::xfer_frame(&bytes);
    }

    #[test]
    fn decoder_never_panics(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        xfer_frame::xfer_frame(&data);
    }

    #[test]
    fn mutated_frames_never_panic(m in msg(), at in any::<usize>(), byte in any::<u8>(), cut in any::<usize>()) {
        let mut bytes = proto::to_vec(&m).unwrap();
        let i = at % bytes.len();
        bytes[i] = byte;
        xfer_frame::xfer_frame(&bytes);
        bytes.truncate(cut % (bytes.len() + 1));
        xfer_frame::xfer_frame(&bytes);
    }
}

fn crc32c_of(d: &[u8]) -> u32 {
    // The same polynomial the protocol names (Castagnoli), computed bitwise.
    let mut crc = !0u32;
    for &b in d {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn crc_is_castagnoli() {
    // RFC 3720 test vector: 32 zero bytes.
    assert_eq!(crc32c_of(&[0u8; 32]), 0x8A91_36AA);
}

/// A sealed BLOCK is its header, `len` ciphertext bytes and the seal trailer; its check value
/// field is 0 and nothing else decodes. (The first input is one the fuzzer found when the
/// fuzz target still expected `len` payload bytes of every block.)
#[test]
fn sealed_blocks_decode_canonically() {
    let h = BlockHeader {
        file_id: 0,
        stream: 0,
        offset: 0xff04_0000_0000_001a,
        len: 11,
        crc32c: 0,
        spans: false,
    };
    let mut bytes = proto::encode_sealed_block_header(&h).unwrap().to_vec();
    bytes.extend_from_slice(&[0u8; 11 + proto::BLOCK_SEAL_TRAILER]);
    let (back, payload) = proto::decode(&bytes).unwrap();
    assert_eq!(back, Msg::Block(h));
    assert_eq!(payload.len(), 11 + proto::BLOCK_SEAL_TRAILER);
    xfer_frame::xfer_frame(&bytes);
    // The same block with a nonzero check value field.
    bytes[28] = 1;
    assert!(proto::decode(&bytes).is_err());
    xfer_frame::xfer_frame(&bytes);
}

#[test]
fn seed_corpus() {
    for m in [Msg::Bye, Msg::Ok { file_id: 1 }] {
        xfer_frame::xfer_frame(&proto::to_vec(&m).unwrap());
    }
    for junk in [
        &[][..],
        &[0xff][..],
        &[8, 0, 0, 0, 99, 0, 0, 0][..],
        &[8, 0, 0, 0, 18, 1, 0, 0][..],
        // PUT with an unknown flag (8), and PUT claiming an mtime (flag 2) it lacks.
        &[
            27, 0, 0, 0, 9, 8, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, b'x',
        ][..],
        &[
            27, 0, 0, 0, 9, 2, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, b'x',
        ][..],
    ] {
        xfer_frame::xfer_frame(junk);
        assert!(proto::decode(junk).is_err());
    }
    // A version-mismatch refusal is a plain ERROR frame every version decodes.
    let e = Msg::Error {
        code: ErrorCode::VersionMismatch,
        file_id: 0,
        message: "upgrade".into(),
    };
    assert_eq!(proto::decode(&proto::to_vec(&e).unwrap()).unwrap().0, e);
    // 1.1: Unavailable is a known code; a PUT with an mtime round-trips and sets its flag.
    assert_eq!(
        <ErrorCode as ferry_wire::Code16>::from_u16(12),
        ErrorCode::Unavailable
    );
    let put = Msg::Put {
        file_id: 1,
        flags: proto::PUT_RESUME,
        mode: 0o644,
        size: 10,
        mtime: Some(-5),
        path: "d/x".into(),
    };
    let bytes = proto::to_vec(&put).unwrap();
    assert_eq!(bytes[5], proto::PUT_RESUME | proto::PUT_MTIME);
    assert_eq!(proto::decode(&bytes).unwrap().0, put);
    xfer_frame::xfer_frame(&bytes);
}
