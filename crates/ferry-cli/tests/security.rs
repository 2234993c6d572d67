//! The secure channel end to end (protocol 1.7, docs/security.md), with real `ferry`
//! processes on loopback: a recording TCP proxy between `ferry cp` and `ferry serve` sees
//! neither the token nor a file name; a replayed connection gets nothing done; a byte
//! flipped in a sealed control record breaks the connection; the client pins the server
//! (first use, changed key, strict mode, an explicit fingerprint); clear connections only
//! when both sides ask.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// What a [`Tap`] does to the bytes it forwards from the client.
#[derive(Clone, Copy)]
enum Tamper {
    /// Nothing.
    None,
    /// Flips a byte inside the ciphertext of the client's `n`-th TLS application-data
    /// record (1: its Finished; 2: its first sealed control frame, the SELECT).
    FlipRecord(usize),
}

/// A TCP proxy in front of a server that records every byte crossing it, both ways, and
/// may tamper with what the client sends.
struct Tap {
    /// `host:port` to connect to instead of the server.
    addr: String,
    /// Bytes from clients to the server, every connection one after the other.
    up: Arc<Mutex<Vec<u8>>>,
    /// Bytes from the server to clients.
    down: Arc<Mutex<Vec<u8>>>,
}

impl Tap {
    fn seen(&self) -> Vec<u8> {
        let mut all = self.up.lock().unwrap().clone();
        all.extend_from_slice(&self.down.lock().unwrap());
        all
    }
}

/// Starts a [`Tap`] in front of the server at `to` (`host:port`).
fn tap(to: &str, tamper: Tamper) -> Tap {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (up, down) = (Arc::default(), Arc::default());
    let (u, d, to) = (Arc::clone(&up), Arc::clone(&down), to.to_string());
    std::thread::spawn(move || {
        for client in l.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(&to) else {
                return;
            };
            let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (u, d) = (Arc::clone(&u), Arc::clone(&d));
            std::thread::spawn(move || pump(client, server, &u, tamper));
            std::thread::spawn(move || pump(s2, c2, &d, Tamper::None));
        }
    });
    Tap { addr, up, down }
}

/// Copies `from` to `to`, recording into `log`, tampering as asked.
fn pump(mut from: TcpStream, mut to: TcpStream, log: &Mutex<Vec<u8>>, tamper: Tamper) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut stream = Vec::new();
    let mut flip_at = None;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let start = stream.len();
        stream.extend_from_slice(&buf[..n]);
        if let (Tamper::FlipRecord(k), None) = (tamper, flip_at) {
            // Record header: content type 23 (application data), legacy version 3.3.
            let heads = stream.windows(3).filter(|w| w == &[23, 3, 3]).count();
            if heads >= k {
                let at = (0..stream.len() - 2)
                    .filter(|&i| stream[i..i + 3] == [23, 3, 3])
                    .nth(k - 1)
                    .unwrap();
                // Past the 5-byte header, inside the ciphertext.
                flip_at = Some(at + 7);
            }
        }
        if let Some(at) = flip_at.filter(|&a| a >= start && a < stream.len()) {
            buf[at - start] ^= 0x40;
            stream[at] ^= 0x40;
        }
        log.lock().unwrap().extend_from_slice(&buf[..n]);
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// Whether `hay` holds `needle` anywhere.
fn holds(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// `host:port` of a server address.
fn hostport(addr: &str) -> &str {
    addr.split_once("://").map_or(addr, |(_, r)| r)
}

/// A token no other test uses, long enough that a match in a capture is no accident.
const SECRET: &str = "capture-me-if-you-can-0123456789abcdef";

/// A file name to look for in a capture.
const NAME: &str = "a-very-recognisable-name.bin";

/// `ferry cp` with the test's token and `args`.
fn cp_secret(args: &[&str]) -> std::process::Output {
    let mut c = ferry();
    c.args(["cp", "--token", SECRET]).args(args);
    run(c)
}

/// A server on `driver` accepting [`SECRET`].
fn secret_server(driver: &str, extra: &[&str]) -> Server {
    let mut args = vec!["--token", SECRET];
    args.extend_from_slice(extra);
    serve_as(ferry(), driver, &[], &args)
}

/// An upload of a file of several blocks and of a small one (which 1.6 sent as one clear
/// PUT_FILE data frame, path included) and downloads of both, on `driver`, through a
/// recording proxy: the capture holds neither the token nor the file's name, yet the copies
/// land; at the default `integrity` level the large file's blocks cross in clear, and since
/// 1.10 so do the small file's bytes in the PACK that brings it back (tagged, not sealed).
fn capture(driver: &str) {
    let s = secret_server(driver, &[]);
    let t = tap(hostport(&s.addr), Tamper::None);
    let via = |path: &str| format!("{driver}://{}/d/{path}", t.addr);
    let dir = scratch("capture");
    let src = dir.join(NAME);
    let big = pattern(9 << 20, 3);
    std::fs::write(&src, &big).unwrap();
    let o = cp_secret(&[src.to_str().unwrap(), &via(NAME)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let small = dir.join("small");
    let tiny = b"a small file's own recognisable bytes";
    std::fs::write(&small, tiny).unwrap();
    let o = cp_secret(&[small.to_str().unwrap(), &via(&format!("{NAME}.2"))]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let back = dir.join("back");
    let o = cp_secret(&[&via(NAME), back.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let back_small = dir.join("back-small");
    let o = cp_secret(&[&via(&format!("{NAME}.2")), back_small.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    same_file(&src, &back);
    same_file(&small, &s.root.join(format!("{NAME}.2")));
    same_file(&small, &back_small);
    let seen = t.seen();
    assert!(
        holds(&seen, &big[..4096]),
        "the proxy saw the blocks (clear in this slice)"
    );
    assert!(
        holds(&seen, tiny),
        "the small file's PACK crossed sealed at integrity"
    );
    assert!(
        !holds(&seen, SECRET.as_bytes()),
        "the token crossed in clear"
    );
    assert!(
        !holds(&seen, NAME.as_bytes()),
        "the file name crossed in clear"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_capture_shows_no_token_and_no_file_name_tcp() {
    capture("tcp");
}

#[test]
fn a_capture_shows_no_token_and_no_file_name_ofi_tcp() {
    capture("ofi+tcp");
}

/// Whether `seen` holds any run of 64 bytes of `data` (then it holds one of its aligned
/// 32-byte chunks, which are all looked up as every 32-byte window of `seen` passes).
fn holds_any_of(seen: &[u8], data: &[u8]) -> bool {
    let chunks: std::collections::HashSet<&[u8]> = data.chunks_exact(32).collect();
    // A bitmap of the chunks' first three bytes rules out almost every window cheaply.
    let key = |w: &[u8]| (w[0] as usize) << 16 | (w[1] as usize) << 8 | w[2] as usize;
    let mut first = vec![0u64; (1 << 24) / 64];
    for c in &chunks {
        first[key(c) / 64] |= 1 << (key(c) % 64);
    }
    seen.windows(32)
        .any(|w| first[key(w) / 64] & (1 << (key(w) % 64)) != 0 && chunks.contains(w))
}

/// At `private` on `driver`, through a recording proxy: an upload of a file of several
/// blocks, its download in one stream and in two (ranged GETs), and a small file's round
/// trip (a PUT_FILE up, a PACK sealed in place down): every copy lands, and the capture
/// holds no 64 bytes of either file (at the default level it holds them all).
fn private_capture(driver: &str) {
    let s = secret_server(driver, &["--protection", "private,integrity"]);
    let t = tap(hostport(&s.addr), Tamper::None);
    let via = |path: &str| format!("{driver}://{}/d/{path}", t.addr);
    let dir = scratch("capture-private");
    let src = dir.join("data");
    let data = pattern(3 << 20, 11);
    std::fs::write(&src, &data).unwrap();
    let private = ["--protect", "private", "--block-size", "1048576"];
    let dest = via("up");
    let o = cp_secret(&[&private[..], &[src.to_str().unwrap(), &dest]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    same_file(&src, &s.root.join("up"));
    for (streams, name) in [("1", "back1"), ("2", "back2")] {
        let back = dir.join(name);
        let from = via("up");
        let args = ["--streams", streams, &from, back.to_str().unwrap()];
        let o = cp_secret(&[&private[..], &args[..]].concat());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        same_file(&src, &back);
    }
    let small = dir.join("small");
    let tiny = pattern(2000, 13);
    std::fs::write(&small, &tiny).unwrap();
    let o = cp_secret(&[&private[..], &[small.to_str().unwrap(), &via("small")]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let back_small = dir.join("back-small");
    let from = via("small");
    let o = cp_secret(&[&private[..], &[from.as_str(), back_small.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    same_file(&small, &back_small);
    assert!(
        !holds_any_of(&t.seen(), &data),
        "file bytes crossed in clear"
    );
    assert!(
        !holds_any_of(&t.seen(), &tiny),
        "a small file's bytes crossed in clear"
    );
    // The check sees them at the default level, which leaves blocks readable.
    let plain = via("plain");
    let o = cp_secret(&[&private[2..], &[src.to_str().unwrap(), &plain]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(holds_any_of(&t.seen(), &data), "the proxy saw no block");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_private_capture_shows_no_file_bytes_tcp() {
    private_capture("tcp");
}

#[test]
fn a_private_capture_shows_no_file_bytes_ofi_tcp() {
    private_capture("ofi+tcp");
}

/// A third-party copy through two recording proxies, one in front of each server: what
/// crosses between the client and A, the client and B, and A and B holds no token and no
/// file name. The source proves B's grant there; the user's token never goes to A.
#[test]
fn a_third_party_capture_shows_no_token() {
    let b = secret_server("tcp", &[]);
    let tb = tap(hostport(&b.addr), Tamper::None);
    let b_via = format!("tcp://{}", tb.addr);
    let a = secret_server("tcp", &["--allow-third-party", &b_via]);
    let ta = tap(hostport(&a.addr), Tamper::None);
    std::fs::write(a.root.join(NAME), pattern(3 << 20, 8)).unwrap();
    let o = cp_secret(&[
        &format!("tcp://{}/d/{NAME}", ta.addr),
        &format!("{b_via}/d/copy-{NAME}"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    same_file(&a.root.join(NAME), &b.root.join(format!("copy-{NAME}")));
    for (who, t) in [("client and A", &ta), ("client or A and B", &tb)] {
        let seen = t.seen();
        assert!(!seen.is_empty(), "nothing crossed between {who}");
        assert!(
            !holds(&seen, SECRET.as_bytes()) && !holds(&seen, TOKEN.as_bytes()),
            "a token crossed between {who} in clear"
        );
        assert!(
            !holds(&seen, NAME.as_bytes()),
            "the file name crossed between {who}"
        );
    }
}

/// A byte flipped in a sealed control record (the client's Finished, then its SELECT)
/// breaks the connection: the copy fails and nothing lands.
#[test]
fn a_flipped_control_byte_breaks_the_connection() {
    let s = secret_server("tcp", &[]);
    let dir = scratch("flip");
    let src = dir.join("f");
    std::fs::write(&src, b"must not land").unwrap();
    for record in [1, 2] {
        let t = tap(hostport(&s.addr), Tamper::FlipRecord(record));
        let to = format!("tcp://{}/d/flipped{record}", t.addr);
        let o = cp_secret(&[src.to_str().unwrap(), &to]);
        assert_eq!(o.status.code(), Some(6), "record {record}: {o:?}");
        assert!(!s.root.join(format!("flipped{record}")).exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The bytes a client sent for an upload, replayed to the server on a new connection, do
/// not upload the file again: the connection's handshake fails (EXS already refuses the
/// replayed connection; the TLS-level replay of a proof or a sealed record is
/// `ferry-service`'s test `secure_replay`).
#[test]
fn a_replayed_connection_does_nothing() {
    let log = scratch("replay-log").join("serve.log");
    let mut cmd = ferry();
    cmd.env("RUST_LOG", "info");
    let s = serve_logging(
        cmd,
        "tcp",
        &[],
        &["--token", SECRET],
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    let t = tap(hostport(&s.addr), Tamper::None);
    let dir = scratch("replay");
    let src = dir.join("f");
    std::fs::write(&src, pattern(10_000, 9)).unwrap();
    let o = cp_secret(&[src.to_str().unwrap(), &format!("tcp://{}/d/f", t.addr)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::remove_file(s.root.join("f")).unwrap();
    let captured = t.up.lock().unwrap().clone();
    let mut replay = TcpStream::connect(hostport(&s.addr)).unwrap();
    replay.write_all(&captured).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    let mut text = String::new();
    while Instant::now() < end && !text.contains("handshake failed") {
        std::thread::sleep(Duration::from_millis(50));
        text = std::fs::read_to_string(&log).unwrap_or_default();
    }
    assert!(text.contains("handshake failed"), "{text}");
    assert!(!s.root.join("f").exists(), "the replay uploaded the file");
    drop(replay);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ferry ls` of a server with `trust` flags (and this process's isolation unless the
/// flags name a known-hosts file).
fn ls(s: &Server, trust: &[&str]) -> std::process::Output {
    let mut c = ferry();
    c.args(["ls", "--token", TOKEN]).args(trust).arg(s.url(""));
    run(c)
}

/// Trust on first use: the first connection pins the server in the known-hosts file, the
/// next ones check it; a server with another key under a pinned name is refused loudly
/// (both fingerprints, the line to remove); strict mode refuses unknown servers; an
/// explicit fingerprint pins without the file.
#[test]
fn the_client_pins_the_server() {
    let s = serve_as(ferry(), "tcp", &[], &[]);
    let dir = scratch("pins");
    let kh = dir.join("known_hosts");
    let khf = ["--known-hosts", kh.to_str().unwrap()];
    let fp = fingerprint();
    assert!(fp.starts_with("SHA256:") && fp.len() == 71, "{fp}");

    // Strict: unknown is refused, nothing written.
    let o = ls(&s, &[&khf[..], &["--strict-host-keys"]].concat());
    fails(&o, 2, "--strict-host-keys refuses");
    fails(&o, 2, &fp);
    assert!(!kh.exists());

    // First use pins, and says so; the next connection is checked against the pin.
    let o = ls(&s, &khf);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("pinned"));
    let line = format!("{} {fp}\n", hostport(&s.addr));
    assert_eq!(std::fs::read_to_string(&kh).unwrap(), line);
    let o = ls(&s, &[&khf[..], &["--strict-host-keys"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Another server (another state directory, so another key) where the file pins ours.
    let other_state = dir.join("other-state");
    let other = serve_as(
        ferry(),
        "tcp",
        &[],
        &["--state-dir", other_state.to_str().unwrap()],
    );
    let mut fpc = ferry();
    fpc.args(["serve", "--fingerprint", "--state-dir"])
        .arg(&other_state);
    let other_fp = String::from_utf8(run(fpc).stdout)
        .unwrap()
        .trim()
        .to_string();
    assert_ne!(other_fp, fp);
    std::fs::write(&kh, format!("{} {fp}\n", hostport(&other.addr))).unwrap();
    let o = ls(&other, &khf);
    fails(&o, 2, "HAS CHANGED");
    fails(&o, 2, &fp);
    fails(&o, 2, &other_fp);
    fails(&o, 2, "sed -i '1d'");

    // An explicit fingerprint: the right one gets in, another is refused; no file used.
    let absent = dir.join("absent");
    let o = ls(
        &other,
        &[
            "--known-hosts",
            absent.to_str().unwrap(),
            "--server-fingerprint",
            &other_fp,
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = ls(&other, &["--server-fingerprint", &fp]);
    fails(&o, 2, "--server-fingerprint");
    assert!(!absent.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A clear connection needs both sides: a client asking for one is refused by a default
/// server with the reason; a server allowing them still serves TLS clients, and clear
/// ones that ask.
#[test]
fn clear_only_when_both_sides_allow_it() {
    let dir = scratch("clear");
    let src = dir.join("f");
    std::fs::write(&src, b"clear or not").unwrap();
    let strict = serve_as(ferry(), "tcp", &[], &[]);
    let o = cp(
        &["--insecure-clear", src.to_str().unwrap(), &strict.url("f")],
        &[],
    );
    assert_eq!(o.status.code(), Some(6), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("requires TLS"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(!strict.root.join("f").exists());

    let open = serve_as(ferry(), "tcp", &[], &["--allow-clear"]);
    ok(&cp(&[src.to_str().unwrap(), &open.url("tls")], &[]));
    ok(&cp(
        &[
            "--insecure-clear",
            src.to_str().unwrap(),
            &open.url("clear"),
        ],
        &[],
    ));
    same_file(&src, &open.root.join("tls"));
    same_file(&src, &open.root.join("clear"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ferry serve --fingerprint` makes the identity once, private, and prints the same
/// fingerprint every time; a key file others may read is refused.
#[test]
fn the_identity_is_made_once_and_kept_private() {
    use std::os::unix::fs::PermissionsExt;
    let state = scratch("identity");
    let print = |dir: &Path| {
        let mut c = ferry();
        c.args(["serve", "--fingerprint", "--state-dir"]).arg(dir);
        run(c)
    };
    let a = print(&state);
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert_eq!(print(&state).stdout, a.stdout);
    let key = state.join("server.pem");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    fails(&print(&state), 7, "chmod 600");
    let _ = std::fs::remove_dir_all(&state);
}
