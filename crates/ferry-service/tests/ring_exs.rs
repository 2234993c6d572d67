//! The staging ring's sending runtime and the EXS message channel together, with no face
//! above them: ranges of a real file (and a zero source) go out as block frames under a
//! header this test defines, over EXS on loopback, through a ring smaller than the range;
//! the receiving channel looks at each in place, and every byte arrives exactly once, in
//! order, under its CRC-32C, while at most `ring` blocks exist on the sending side.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferry_exs::runtime::{default_config, EventQueue, ExsListener};
use ferry_service::channel::{Channel, FRAME_HEAD};
use ferry_service::ring::{Piece, Sender, Source};
use ferry_service::Result;

const T: Duration = Duration::from_secs(10);
const BLOCK: u32 = 64 << 10;
const RING: usize = 3;

/// This test's block header: transfer, offset, length, CRC-32C (little-endian), zero pad.
fn head(p: &Piece, crc: u32) -> Result<[u8; FRAME_HEAD]> {
    let mut h = [0u8; FRAME_HEAD];
    h[..4].copy_from_slice(&p.transfer.to_le_bytes());
    h[4..12].copy_from_slice(&p.offset.to_le_bytes());
    h[12..20].copy_from_slice(&p.len.to_le_bytes());
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    Ok(h)
}

fn field(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// A connected pair of channels listening at `url`: (client, server).
fn pair(url: &str) -> (Channel, Channel) {
    let fabric: ferry_fabric::Address = url.parse().expect("address");
    let listener = ExsListener::bind(url, default_config(&fabric)).expect("bind");
    let addr = listener.local_addr();
    std::thread::scope(|s| {
        let acc = s.spawn(|| {
            let q = EventQueue::new().expect("queue");
            let sock = listener.accept(&q, T).expect("accept");
            Channel::new(sock, q)
        });
        let client = Channel::connect(&addr, T).expect("connect");
        (client, acc.join().expect("accept thread"))
    })
}

/// The file's bytes: a pattern that differs at every offset of a block.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ (i >> 16) as u8)
        .collect()
}

/// Receives block frames until `piece` is covered, checking each against `want` (the
/// whole file's bytes, or `None` for zeros): in order, exactly once, CRC good.
fn receive(rx: &mut Channel, piece: Piece, want: Option<&[u8]>) {
    let mut next = piece.offset;
    while next < piece.end() {
        rx.recv_with(|b| {
            assert!(b.len() >= FRAME_HEAD, "a frame of {} bytes", b.len());
            let (transfer, offset, len) = (field(b, 0) as u32, field(b, 4), field(b, 12));
            let crc = u32::from_le_bytes(b[20..24].try_into().expect("4 bytes"));
            let payload = &b[FRAME_HEAD..];
            assert_eq!((transfer, offset), (piece.transfer, next), "in order, once");
            assert_eq!(len as usize, payload.len());
            assert!(len <= u64::from(BLOCK) && len > 0);
            assert_eq!(crc, crc32c::crc32c(payload), "CRC of the block at {offset}");
            match want {
                Some(w) => assert!(payload == &w[offset as usize..(offset + len) as usize]),
                None => assert!(payload.iter().all(|&x| x == 0)),
            }
            next += len;
        })
        .expect("receive");
    }
    assert_eq!(next, piece.end(), "no byte beyond the range");
}

fn ranges_arrive_whole(url: &str) {
    let (tx, mut rx) = pair(url);
    rx.timeout = T;
    rx.post_ring(RING + 1, FRAME_HEAD + BLOCK as usize)
        .expect("post");
    let size = 5 * BLOCK as usize + 1234;
    let data = pattern(size);
    let path = std::env::temp_dir().join(format!("ferry-ring-exs-{}", std::process::id()));
    std::fs::write(&path, &data).expect("write the source");
    let file = std::fs::File::open(&path).expect("open the source");
    let _ = std::fs::remove_file(&path);
    // From an unaligned offset to the end, then a range of zeros.
    let range = Piece {
        transfer: 7,
        offset: 1000,
        len: (size - 1000) as u64,
    };
    let zeros = Piece {
        transfer: 8,
        offset: 0,
        len: 2 * u64::from(BLOCK) + 5,
    };
    let sent = AtomicU64::new(0);
    std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let mut ring = Sender::new(BLOCK, RING, T).expect("sender");
            let mut hasher = blake3::Hasher::new();
            let count = |n| {
                sent.fetch_add(n, Ordering::Relaxed);
            };
            let sock = tx.socket();
            ring.send_range(
                sock,
                Source::File(&file),
                range,
                Some(&mut hasher),
                &count,
                &head,
            )
            .expect("send the file range");
            ring.send_range(sock, Source::Zero, zeros, None, &count, &head)
                .expect("send zeros");
            // A block the caller fills itself goes through the same ring.
            let staged = ring.claim(sock).expect("claim");
            staged.buf.write_at(0, b"the end").expect("fill");
            ring.send(sock, staged, 0..7).expect("send a claimed block");
            ring.flush().expect("every send completes");
            hasher.finalize()
        });
        receive(&mut rx, range, Some(&data));
        receive(&mut rx, zeros, None);
        let tail = rx.recv_with(|b| b.to_vec()).expect("the claimed block");
        assert_eq!(tail, b"the end");
        let hash = sender.join().expect("sender thread");
        assert_eq!(
            hash,
            blake3::hash(&data[1000..]),
            "the hasher saw every byte in order"
        );
    });
    assert_eq!(sent.load(Ordering::Relaxed), range.len + zeros.len);
}

#[test]
fn ranges_arrive_whole_over_tcp() {
    ranges_arrive_whole("tcp://127.0.0.1:0");
}

#[test]
fn ranges_arrive_whole_over_ofi_tcp() {
    ranges_arrive_whole("ofi+tcp://127.0.0.1:0");
}

#[test]
fn ranges_arrive_whole_over_ofi_shm() {
    ranges_arrive_whole(&format!("ofi+shm://ferry-ring-exs-{}", std::process::id()));
}
