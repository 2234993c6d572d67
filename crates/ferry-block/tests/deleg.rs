//! The block face's RMA path over real fabric connections on loopback (native tcp, ofi+tcp,
//! ofi+shm), hosted by the service floor in this process: every scheme writes and reads
//! back the same bytes, FLUSH/TRIM/WRITE_ZEROES work, a key rotated after every I/O keeps
//! working, a session shared by threads keeps many writes in flight (run at once by the
//! server) with reads and FLUSHes between them, adjacent writes merge into fewer requests,
//! and a client naming a chunk that is not its own loses its session while another
//! client's goes on.

#[path = "common/mod.rs"]
mod common;

use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ferry_block::backend::file::FileBackend;
use ferry_block::backend::memory::MemoryBackend;
use ferry_block::backend::Backend;
use ferry_block::deleg::attach::RemoteBackend;
use ferry_block::deleg::client::{Client, Options};
use ferry_block::deleg::proto::{self, Cmd, Data, Msg, ReadMode, Scheme};
use ferry_block::deleg::server::{FabricService, PoolConfig};
use ferry_block::deleg::SERVICE;
use ferry_block::{BlockServer, Export, ExportConfig};
use ferry_service::admit::{Admission, LimitsConfig};
use ferry_service::auth::AuthConfig;
use ferry_service::channel::Channel;
use ferry_service::registry::{Registry, Service};
use ferry_service::secure::{ClientSecurity, ServerSecurity};
use ferry_service::serve::{bind_all, serve_until};

const T: Duration = Duration::from_secs(10);
const SIZE: u64 = 64 << 20;

fn security() -> &'static (ServerSecurity, ClientSecurity) {
    static SEC: OnceLock<(ServerSecurity, ClientSecurity)> = OnceLock::new();
    SEC.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ferry-block-deleg-{}", std::process::id()));
        let server = ServerSecurity::from_state_dir(&dir, true).unwrap();
        let client = ClientSecurity {
            fingerprint: server.fingerprint().map(String::from),
            ..ClientSecurity::default()
        };
        (server, client)
    })
}

fn export(name: &str, backend: Arc<dyn Backend>) -> Export {
    let c = ExportConfig {
        name: name.into(),
        path: None,
        memory: Some(backend.size()),
        readonly: false,
        direct: false,
        description: String::new(),
        tls: Default::default(),
    };
    Export::new(&c, backend)
}

/// A floor hosting the block face over a memory export `mem` and a file export `file`
/// (backed by `path`), on native tcp, ofi+tcp and ofi+shm; returns their addresses.
fn server(tag: &str, path: &std::path::Path, pool: PoolConfig) -> Vec<String> {
    let file = FileBackend::open(path, false, false).unwrap();
    let exports = vec![
        export("mem", Arc::new(MemoryBackend::new(SIZE))),
        export("file", Arc::new(file)),
    ];
    server_with(tag, exports, pool)
}

/// A floor hosting the block face over `exports`, as [`server`].
fn server_with(tag: &str, exports: Vec<Export>, pool: PoolConfig) -> Vec<String> {
    server_and_face(tag, exports, pool).0
}

/// [`server_with`], also handing back the face (for its drain).
fn server_and_face(
    tag: &str,
    exports: Vec<Export>,
    pool: PoolConfig,
) -> (Vec<String>, Arc<FabricService>) {
    let auth = AuthConfig {
        tokens: vec!["tok".into()],
        anonymous: false,
        ..AuthConfig::default()
    };
    let admission = Admission::new(&LimitsConfig::default(), |_, _| 0);
    let face = Arc::new(FabricService::new(
        exports,
        auth.clone(),
        admission.clone(),
        pool,
    ));
    let mut reg = Registry::new(auth, security().0.clone());
    reg.add(SERVICE, face.clone()).unwrap();
    let shm = format!("ofi+shm://ferry-block-{tag}-{}", std::process::id());
    let listeners = bind_all(&[
        "tcp://127.0.0.1:0".into(),
        "ofi+tcp://127.0.0.1:0".into(),
        shm,
    ])
    .unwrap();
    let addrs = listeners.iter().map(|l| l.local_addr()).collect();
    let quit = Arc::new(AtomicBool::new(false));
    let reg = Arc::new(reg);
    std::thread::spawn(move || serve_until(&reg, &admission, &listeners, &quit));
    (addrs, face)
}

fn opts(export: &str, scheme: Scheme, read: ReadMode) -> Options {
    Options {
        token: "tok".into(),
        scheme,
        read,
        security: security().1.clone(),
        timeout: T,
        ..Options::new(export)
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn backing(tag: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("ferry-block-deleg-{tag}-{}", std::process::id()));
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(SIZE).unwrap();
    p
}

#[test]
fn every_scheme_round_trips_on_every_driver() {
    let path = backing("schemes");
    let pool = PoolConfig {
        chunks: 4,
        chunk_size: 256 << 10,
    };
    let addrs = server("schemes", &path, pool);
    let schemes = [
        (Scheme::Delegated, ReadMode::ServerFill),
        (Scheme::Delegated, ReadMode::ServerWrite),
        (Scheme::Copy, ReadMode::ServerFill),
    ];
    for addr in &addrs {
        for (i, (scheme, read)) in schemes.into_iter().enumerate() {
            for name in ["mem", "file"] {
                let what = format!("{addr} {name} {scheme:?} {read:?}");
                let c = Client::connect(addr, &opts(name, scheme, read)).expect(&what);
                assert_eq!(c.size(), SIZE);
                // More than the pool holds, not chunk-aligned: pipelined and split.
                let data = pattern(3 << 20 | 123, i as u8);
                let at = (i as u64) << 22 | 7;
                c.write_at(at, &data, false).expect(&what);
                c.flush().expect(&what);
                let mut back = vec![0; data.len()];
                c.read_at(at, &mut back).expect(&what);
                assert!(back == data, "{what}: read back differs");
                c.write_zeroes(at, 4096, false).expect(&what);
                c.trim(at + 8192, 4096).expect(&what);
                let mut z = vec![1; 4096];
                c.read_at(at, &mut z).expect(&what);
                assert!(z.iter().all(|b| *b == 0), "{what}: zeroes");
                // A range past the end is an error of that call, not of the session.
                assert!(c.write_at(SIZE - 1, &[1, 2], false).is_err());
                c.read_at(at + 4096, &mut z).expect(&what);
                assert_eq!(z, data[4096..8192], "{what}");
                c.close();
            }
        }
    }
    let _ = std::fs::remove_file(path);
}

/// A file backend that counts the writes, and the reads, under way at once (each held a
/// moment, so those that may overlap do).
struct Overlap {
    file: FileBackend,
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    reads_now: std::sync::atomic::AtomicUsize,
    reads_most: std::sync::atomic::AtomicUsize,
}

impl Overlap {
    fn new(path: &std::path::Path) -> Overlap {
        Overlap {
            file: FileBackend::open(path, false, false).unwrap(),
            now: Default::default(),
            most: Default::default(),
            reads_now: Default::default(),
            reads_most: Default::default(),
        }
    }
}

impl Backend for Overlap {
    fn size(&self) -> u64 {
        self.file.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.reads_now.fetch_add(1, SeqCst) + 1;
        self.reads_most.fetch_max(n, SeqCst);
        std::thread::sleep(Duration::from_millis(2));
        let r = self.file.read_at(buf, offset);
        self.reads_now.fetch_sub(1, SeqCst);
        r
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(n, SeqCst);
        std::thread::sleep(Duration::from_millis(2));
        let r = self.file.write_at(buf, offset, fua);
        self.now.fetch_sub(1, SeqCst);
        r
    }
    fn flush(&self) -> std::io::Result<()> {
        self.file.flush()
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> std::io::Result<()> {
        self.file.trim(offset, len, fua)
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        how: ferry_block::backend::Zeroing,
    ) -> std::io::Result<()> {
        self.file.write_zeroes(offset, len, how)
    }
    fn extents(&self, offset: u64, len: u64) -> std::io::Result<Vec<ferry_block::backend::Extent>> {
        self.file.extents(offset, len)
    }
}

/// One session shared by threads keeps many writes in flight: the server runs them at
/// once (not one after another), reads and FLUSHes interleaved with them see every byte
/// written before, and after a FLUSH's reply the backing file holds them.
#[test]
fn many_writes_in_flight_with_reads_and_flushes() {
    let path = backing("inflight");
    let overlap = Arc::new(Overlap::new(&path));
    let pool = PoolConfig {
        chunks: 8,
        chunk_size: 64 << 10,
    };
    let addrs = server_with("inflight", vec![export("file", overlap.clone())], pool);
    const THREADS: usize = 6;
    const REGION: usize = 1 << 20;
    for (k, addr) in addrs.iter().enumerate() {
        let o = opts("file", Scheme::Delegated, ReadMode::ServerWrite);
        let c = Client::connect(addr, &o).expect(addr);
        overlap.most.store(0, std::sync::atomic::Ordering::SeqCst);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (c, path) = (&c, &path);
                s.spawn(move || {
                    let base = ((k * THREADS + t) * REGION) as u64;
                    let data = pattern(REGION, (k * THREADS + t) as u8);
                    // Pieces of uneven sizes, each a few chunks: requests of several
                    // threads in flight together.
                    let mut at = 0;
                    let mut round = 0;
                    while at < REGION {
                        let n = (100_000 + 37_000 * round).min(REGION - at);
                        c.write_at(base + at as u64, &data[at..at + n], false)
                            .expect(addr);
                        at += n;
                        round += 1;
                        let mut back = vec![0; at];
                        c.read_at(base, &mut back).expect(addr);
                        assert!(back == data[..at], "{addr} thread {t}: read back differs");
                        if round % 2 == 0 {
                            c.flush().expect(addr);
                            let mut f = std::fs::File::open(path).unwrap();
                            let mut disk = vec![0; at];
                            use std::io::{Read, Seek};
                            f.seek(std::io::SeekFrom::Start(base)).unwrap();
                            f.read_exact(&mut disk).unwrap();
                            assert!(disk == data[..at], "{addr} thread {t}: not in the file");
                        }
                    }
                });
            }
        });
        c.flush().expect(addr);
        let most = overlap.most.load(std::sync::atomic::Ordering::SeqCst);
        assert!(most > 1, "{addr}: the server ran one write at a time");
        c.close();
    }
    let _ = std::fs::remove_file(path);
}

/// Writes handed over together that follow one another on the export (here given in a
/// reversed order) travel as fewer requests, their data gathered into one chunk, on every
/// driver, with and without key rotation; the bytes land where they belong, a gap splits
/// a run, and with merging off every write is a request of its own.
#[test]
fn adjacent_writes_merge_into_fewer_requests() {
    let path = backing("merge");
    let pool = PoolConfig {
        chunks: 8,
        chunk_size: 64 << 10,
    };
    let addrs = server("merge", &path, pool);
    const PIECE: usize = 4096;
    const PIECES: usize = 48;
    // Every piece but the 20th, each eight in reverse order, from 8 KiB into the export.
    let order: Vec<usize> = (0..PIECES).map(|i| i ^ 7).filter(|&k| k != 20).collect();
    let data = pattern(PIECES * PIECE, 9);
    let at = |k: usize| 8192 + (k * PIECE) as u64;
    for addr in &addrs {
        for (merge, invalidate) in [(true, false), (true, true), (false, false)] {
            let mut o = opts("file", Scheme::Delegated, ReadMode::ServerWrite);
            (o.merge, o.always_invalidate) = (merge, invalidate);
            let c = Client::connect(addr, &o).expect(addr);
            c.write_at(0, &vec![0xee; PIECES * PIECE + 16384], false)
                .expect(addr);
            let before = c.stats();
            let ranges: Vec<(u64, &[u8])> = order
                .iter()
                .map(|&k| (at(k), &data[k * PIECE..(k + 1) * PIECE]))
                .collect();
            c.write_many(&ranges, true).expect(addr);
            let s = c.stats();
            let (sent, merged) = (s.requests - before.requests, s.merged_writes);
            assert_eq!(sent + merged, order.len() as u64, "{addr}");
            if merge {
                // 8 slots at a time, and at least 4 gathered by one RMA on every driver.
                assert!(
                    sent <= 2 * (order.len() as u64).div_ceil(4),
                    "{addr}: {sent} requests"
                );
            } else {
                assert_eq!(merged, 0, "{addr}");
            }
            let mut back = vec![0; PIECES * PIECE + 16384];
            c.read_at(0, &mut back).expect(addr);
            for k in 0..PIECES {
                let got = &back[at(k) as usize..at(k) as usize + PIECE];
                let want: &[u8] = if k == 20 {
                    &[0xee; PIECE]
                } else {
                    &data[k * PIECE..(k + 1) * PIECE]
                };
                assert!(got == want, "{addr} merge {merge}: piece {k} differs");
            }
            assert!(
                back[..8192].iter().all(|b| *b == 0xee),
                "{addr}: before the pieces"
            );
            c.close();
        }
    }
    let _ = std::fs::remove_file(path);
}

/// A long READ on a session is served by several of the server's workers at once (its
/// requests in flight together), in every read scheme, and reads back what was written.
#[test]
fn reads_in_flight_run_at_once_in_every_scheme() {
    use std::sync::atomic::Ordering::SeqCst;
    let path = backing("reads");
    let overlap = Arc::new(Overlap::new(&path));
    let pool = PoolConfig {
        chunks: 8,
        chunk_size: 64 << 10,
    };
    let addrs = server_with("reads", vec![export("file", overlap.clone())], pool);
    let data = pattern(1 << 20, 9);
    std::fs::write(&path, &data).unwrap();
    let schemes = [
        (Scheme::Copy, ReadMode::ServerWrite),
        (Scheme::Delegated, ReadMode::ServerFill),
        (Scheme::Delegated, ReadMode::ServerWrite),
    ];
    for addr in &addrs {
        for (scheme, read) in schemes {
            let c = Client::connect(addr, &opts("file", scheme, read)).expect(addr);
            overlap.reads_most.store(0, SeqCst);
            let mut back = vec![0; data.len()];
            c.read_at(0, &mut back).expect(addr);
            assert!(
                back == data,
                "{addr} {scheme:?} {read:?}: read back differs"
            );
            let most = overlap.reads_most.load(SeqCst);
            assert!(most > 1, "{addr} {scheme:?} {read:?}: one read at a time");
            c.close();
        }
    }
    let _ = std::fs::remove_file(path);
}

/// A copy-scheme session whose first request is a whole-chunk READ: its reply is the
/// largest message, and must not land in the buffer DELEGATE came in.
#[test]
fn a_first_read_of_a_whole_chunk_fits() {
    let path = backing("first-read");
    let addrs = server("first-read", &path, PoolConfig::default());
    for addr in &addrs {
        for scheme in [Scheme::Copy, Scheme::Delegated] {
            let c = Client::connect(addr, &opts("mem", scheme, ReadMode::ServerWrite)).unwrap();
            let mut buf = vec![1u8; 4 << 20];
            c.read_at(0, &mut buf).expect(addr);
            assert!(buf.iter().all(|b| *b == 0), "{addr}");
        }
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn always_invalidate_rotates_keys_and_keeps_working() {
    let path = backing("rotate");
    let addrs = server(
        "rotate",
        &path,
        PoolConfig {
            chunks: 2,
            chunk_size: 64 << 10,
        },
    );
    for addr in &addrs {
        for read in [ReadMode::ServerFill, ReadMode::ServerWrite] {
            let mut o = opts("mem", Scheme::Delegated, read);
            o.always_invalidate = true;
            let c = Client::connect(addr, &o).expect(addr);
            let data = pattern(1 << 20, 3);
            c.write_at(0, &data, true).expect(addr);
            let mut back = vec![0; data.len()];
            c.read_at(0, &mut back).expect(addr);
            assert!(back == data, "{addr}");
        }
    }
    let _ = std::fs::remove_file(path);
}

/// A raw session: SELECT, HELLO, DELEGATE; returns the channel and the delegation.
fn raw_session(addr: &str) -> (Channel, Msg) {
    let mut ch = Channel::connect_with(addr, T, &security().1).unwrap();
    ch.timeout = T;
    ch.select(addr, SERVICE, "tok").unwrap();
    ch.post_ring(2, 16 << 10).unwrap();
    ch.send_frame(&proto::encode(&Msg::Hello {
        major: proto::VERSION_MAJOR,
        minor: proto::VERSION_MINOR,
        scheme: Scheme::Delegated,
        read: ReadMode::ServerFill,
        always_invalidate: false,
        export: "mem".into(),
        token: String::new(),
    }))
    .unwrap();
    let mut f = Vec::new();
    ch.recv_into(&mut f).unwrap();
    (ch, proto::decode(&f).unwrap())
}

#[test]
fn a_forged_chunk_ends_that_session_only() {
    let path = backing("forged");
    let addrs = server(
        "forged",
        &path,
        PoolConfig {
            chunks: 2,
            chunk_size: 64 << 10,
        },
    );
    for addr in &addrs {
        let good =
            Client::connect(addr, &opts("mem", Scheme::Delegated, ReadMode::ServerFill)).unwrap();
        good.write_at(0, &pattern(100_000, 9), false).unwrap();
        let forgeries = [
            Data::Chunk { chunk: 2, at: 0 },
            Data::Chunk {
                chunk: 0,
                at: 60 << 10,
            },
            Data::Chunk {
                chunk: u16::MAX,
                at: u32::MAX,
            },
        ];
        for data in forgeries {
            let (mut ch, delegate) = raw_session(addr);
            assert!(matches!(delegate, Msg::Delegate { .. }), "{delegate:?}");
            ch.send_frame(&proto::encode(&Msg::Request {
                handle: 1,
                cmd: Cmd::Write,
                flags: 0,
                offset: 0,
                len: 8192,
                data: data.clone(),
            }))
            .unwrap();
            let mut f = Vec::new();
            ch.recv_into(&mut f).unwrap();
            let answer = proto::decode(&f).unwrap();
            assert!(
                matches!(&answer, Msg::Error { message } if message.contains("outside")),
                "{addr} {data:?}: {answer:?}"
            );
            // The server closed the session.
            assert!(ch.recv_into(&mut f).is_err(), "{addr} {data:?}");
            // The other client goes on, its data intact.
            let mut back = vec![0; 100_000];
            good.read_at(0, &mut back).unwrap();
            assert!(back == pattern(100_000, 9), "{addr}");
        }
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_wrong_token_or_export_is_refused() {
    let path = backing("refused");
    let addrs = server("refused", &path, PoolConfig::default());
    let addr = &addrs[0];
    let mut o = opts("mem", Scheme::Delegated, ReadMode::ServerFill);
    o.token = "nope".into();
    assert!(Client::connect(addr, &o).is_err());
    let o = opts("nosuch", Scheme::Delegated, ReadMode::ServerFill);
    let e = Client::connect(addr, &o).err().unwrap();
    assert!(e.to_string().contains("no export"), "{e}");
    let _ = std::fs::remove_file(path);
}

/// `ferry block attach`'s backend served by the NBD server on a Unix socket: nbdcopy up
/// and down and fio with verification, through the RMA path on every driver.
#[test]
fn standard_clients_through_attach_on_every_driver() {
    common::need("nbdcopy", "libnbd-bin");
    common::need("fio", "fio");
    let path = backing("attach");
    let addrs = server("attach", &path, PoolConfig::default());
    let dir = common::scratch("deleg-attach");
    let src = dir.join("src.img");
    std::fs::write(&src, common::pattern(0, 8 << 20)).unwrap();
    for (i, addr) in addrs.iter().enumerate() {
        let remote = RemoteBackend::connect(
            addr,
            &opts("file", Scheme::Delegated, ReadMode::ServerWrite),
            4,
        )
        .expect(addr);
        let sock = dir.join(format!("nbd{i}.sock"));
        let cfg = ExportConfig {
            name: "disk".into(),
            path: None,
            memory: Some(SIZE),
            readonly: false,
            direct: false,
            description: String::new(),
            tls: Default::default(),
        };
        let nbd = Arc::new(
            BlockServer::with_exports(
                &[format!("unix:{}", sock.display())],
                vec![Export::new(&cfg, Arc::new(remote))],
            )
            .unwrap(),
        );
        let quit = Arc::new(AtomicBool::new(false));
        let (n2, q2) = (nbd.clone(), quit.clone());
        let t = std::thread::spawn(move || n2.serve_until(&q2));
        let uri = format!("nbd+unix:///disk?socket={}", sock.display());
        common::run(Command::new("nbdcopy").args(["--connections=4", src.to_str().unwrap(), &uri]));
        // What went up is on the server's file (flushed by nbdcopy).
        let on_server = std::fs::read(&path).unwrap();
        assert!(
            on_server[..8 << 20] == std::fs::read(&src).unwrap()[..],
            "{addr}"
        );
        let back = dir.join(format!("back{i}.img"));
        common::run(Command::new("nbdcopy").args([&uri, back.to_str().unwrap()]));
        assert!(
            std::fs::read(&back).unwrap()[..8 << 20] == std::fs::read(&src).unwrap()[..],
            "{addr}"
        );
        common::run(Command::new("fio").args([
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=64k",
            "--size=8m",
            "--offset=16m",
            "--iodepth=8",
            "--verify=crc32c",
            "--do_verify=1",
            // No verify state file left in the crate's directory.
            "--verify_state_save=0",
            "--output-format=terse",
        ]));
        quit.store(true, std::sync::atomic::Ordering::SeqCst);
        t.join().unwrap();
        nbd.drain(Duration::from_millis(100));
    }
    let _ = std::fs::remove_file(path);
}

/// The face's drain waits for its sessions: one still attached is reported abandoned (and
/// keeps working: a session ends when its client goes), a new session is refused once the
/// drain began, and when the client detaches the drain finds nothing left.
#[test]
fn a_drain_waits_for_attached_sessions_and_refuses_new_ones() {
    let exports = vec![export("mem", Arc::new(MemoryBackend::new(SIZE)))];
    let (addrs, face) = server_and_face("drain", exports, PoolConfig::default());
    let shm = &addrs[2];
    let o = opts("mem", Scheme::Delegated, ReadMode::ServerWrite);
    let c = Client::connect(shm, &o).unwrap();
    c.write_at(0, &pattern(4096, 7), false).unwrap();
    let r = face.drain(Duration::from_millis(100));
    assert_eq!((r.in_flight, r.abandoned), (1, 1));
    let mut back = vec![0u8; 4096];
    c.read_at(0, &mut back).unwrap();
    assert_eq!(back, pattern(4096, 7));
    let refused = Client::connect(shm, &o)
        .err()
        .expect("a session after the drain began");
    assert!(
        refused.to_string().contains("shutting down"),
        "refused with: {refused}"
    );
    drop(c);
    assert_eq!(face.drain(T).abandoned, 0);
}
