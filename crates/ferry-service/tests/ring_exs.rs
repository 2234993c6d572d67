//! The staging ring's sending runtime and the EXS message channel together, with no face
//! above them: ranges of a real file (and a zero source) go out as block frames under a
//! header this test defines, over EXS on loopback, through a ring smaller than the range;
//! the receiving channel looks at each in place, and every byte arrives exactly once, in
//! order, under its CRC-32C, while at most `ring` blocks exist on the sending side. Held
//! received buffers land in a file through a disk writer thread with no copy.
//!
//! Every test here runs with the staging threads on (the hashing thread on the sending
//! side, the writer thread on the receiving side), whatever the host's CPUs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferry_exs::runtime::{default_config, EventQueue, ExsListener};
use ferry_service::channel::{ring_bytes, Channel, FRAME_HEAD};
use ferry_service::ring::{staging_threads, Digest, Piece, Sender, Source};
use ferry_service::sink::{Block, BlockSink};
use ferry_service::writer::BlockWriter;
use ferry_service::Result;

const T: Duration = Duration::from_secs(10);
const BLOCK: u32 = 64 << 10;
const RING: usize = 3;

/// This test's block header: transfer, offset, length, CRC-32C (little-endian), zero pad.
fn head(p: &Piece, crc: u32, _spans: bool) -> Result<[u8; FRAME_HEAD]> {
    let mut h = [0u8; FRAME_HEAD];
    h[..4].copy_from_slice(&p.transfer.to_le_bytes());
    h[4..12].copy_from_slice(&p.offset.to_le_bytes());
    h[12..20].copy_from_slice(&p.len.to_le_bytes());
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    Ok(h)
}

/// Sends `piece` of `file` on `tx` through a ring of [`RING`] blocks, waits for every send
/// to complete, and returns the ring.
fn send_file(tx: &Channel, file: &std::fs::File, piece: Piece) -> Sender {
    let mut ring = Sender::new(BLOCK, RING, T).expect("sender");
    ring.send_range(
        tx.socket(),
        Source::File(file),
        piece,
        Digest::None,
        &|_| {},
        &head,
    )
    .expect("send");
    ring.flush().expect("every send completes");
    ring
}

fn field(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// A connected pair of channels listening at `url`: (client, server).
fn pair(url: &str) -> (Channel, Channel) {
    threads_on();
    let fabric: ferry_fabric::Address = url.parse().expect("address");
    let listener = ExsListener::bind(url, default_config(&fabric)).expect("bind");
    let addr = listener.local_addr();
    std::thread::scope(|s| {
        let acc = s.spawn(|| {
            let q = EventQueue::new().expect("queue");
            let sock = listener.accept(&q, T).expect("accept");
            Channel::new(sock, q)
        });
        // A bare listener, no server floor: no TLS to speak with.
        let clear = ferry_service::secure::ClientSecurity {
            clear: true,
            ..Default::default()
        };
        let client = Channel::connect_with(&addr, T, &clear).expect("connect");
        (client, acc.join().expect("accept thread"))
    })
}

/// Turns the staging threads on for this process, before anything asks.
fn threads_on() {
    static ON: std::sync::Once = std::sync::Once::new();
    ON.call_once(|| std::env::set_var("FERRY_STAGING_THREADS", "on"));
    assert!(staging_threads());
}

/// A path in the temporary directory no other test of this process uses: tests run in
/// parallel, and two drivers' runs of one test name their files alike.
fn scratch_path(name: &str) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("ferry-ring-{name}-{}-{n}", std::process::id()))
}

/// A source file of `len` pattern bytes (already unlinked) and its bytes.
fn source(len: usize, name: &str) -> (std::fs::File, Vec<u8>) {
    let data = pattern(len);
    let path = scratch_path(name);
    std::fs::write(&path, &data).expect("write the source");
    let file = std::fs::File::open(&path).expect("open the source");
    let _ = std::fs::remove_file(&path);
    (file, data)
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
    let (file, data) = source(size, "exs");
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
                Digest::Stream(&mut hasher),
                &count,
                &head,
            )
            .expect("send the file range");
            ring.send_range(sock, Source::Zero, zeros, Digest::None, &count, &head)
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

/// Receives every block of a file held in its receive buffer and hands it to a threaded
/// writer (no copy); the file written is the file sent.
fn held_blocks_land(url: &str) {
    let (tx, mut rx) = pair(url);
    rx.timeout = T;
    rx.post_ring(RING + 1, FRAME_HEAD + BLOCK as usize)
        .expect("post");
    // Past the size from which a writer gets a thread of its own (8 MiB).
    let size = (9 << 20) + 77;
    let (file, data) = source(size, "held");
    let piece = Piece {
        transfer: 3,
        offset: 0,
        len: size as u64,
    };
    let out = tempfile_in_tmp("held-out");
    let mut writer =
        BlockWriter::with_sink(BlockSink::new(3, size as u64), &out, RING).expect("writer");
    std::thread::scope(|s| {
        s.spawn(|| send_file(&tx, &file, piece));
        let mut got = 0;
        while got < piece.len {
            let held = rx.recv_held().expect("receive");
            let block = held.with_bytes(|b| Block {
                transfer: field(b, 0) as u32,
                offset: field(b, 4),
                len: field(b, 12) as u32,
                crc32c: u32::from_le_bytes(b[20..24].try_into().expect("4 bytes")),
                check: Default::default(),
                spans: false,
            });
            got += u64::from(block.len);
            writer
                .push_held(block, held, FRAME_HEAD)
                .expect("hand over");
        }
    });
    assert_eq!(
        writer.sync().expect("sync"),
        vec![],
        "no block failed its CRC"
    );
    let sink = writer.finish().expect("finish");
    assert!(sink.io_error.is_none(), "{:?}", sink.io_error);
    let mut written = Vec::new();
    std::io::Read::read_to_end(&mut &out, &mut written).expect("read back");
    assert!(written == data, "the file written is the file sent");
}

/// A new empty file under the temporary directory, already unlinked, open read-write.
fn tempfile_in_tmp(name: &str) -> std::fs::File {
    let path = scratch_path(name);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("create the destination");
    let _ = std::fs::remove_file(&path);
    f
}

#[test]
fn held_blocks_land_over_tcp() {
    held_blocks_land("tcp://127.0.0.1:0");
}

#[test]
fn held_blocks_land_over_ofi_shm() {
    held_blocks_land(&format!("ofi+shm://ferry-ring-held-{}", std::process::id()));
}

/// What a face budgets for a connection's rings ([`ring_bytes`]) is what the channel and the
/// sender really allocate: the receive ring once posted, and after taking more blocks than
/// it has (its buffers reposted, nothing new allocated); the send ring once every slot was
/// used. Either side changing its buffers' layout without the other fails here.
fn ring_costs_what_it_allocates(url: &str) {
    let (tx, mut rx) = pair(url);
    rx.timeout = T;
    rx.post_ring(RING, FRAME_HEAD + BLOCK as usize)
        .expect("post");
    let want = ring_bytes(RING, BLOCK);
    assert_eq!(rx.recv_ring_bytes(), want, "the receive ring as posted");
    let (file, _) = source(3 * RING * BLOCK as usize + 5, "cost");
    let piece = Piece {
        transfer: 1,
        offset: 0,
        len: 3 * (RING as u64) * u64::from(BLOCK) + 5,
    };
    std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let ring = send_file(&tx, &file, piece);
            ring.staged_bytes()
        });
        let mut got = 0;
        while got < piece.len {
            got += rx.recv_with(|b| field(b, 12)).expect("receive");
        }
        assert_eq!(sender.join().expect("sender thread"), want, "the send ring");
    });
    assert_eq!(rx.recv_ring_bytes(), want, "the receive ring after reposts");
}

#[test]
fn ring_costs_what_it_allocates_over_tcp() {
    ring_costs_what_it_allocates("tcp://127.0.0.1:0");
}

#[test]
fn ring_costs_what_it_allocates_over_ofi_shm() {
    ring_costs_what_it_allocates(&format!("ofi+shm://ferry-ring-cost-{}", std::process::id()));
}
