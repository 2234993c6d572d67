//! Data protection levels end to end (protocol 1.9, docs/security.md), with real `ferry`
//! processes on loopback: the level is agreed on the sealed channel and fails closed (a
//! client that requires more than the server allows, or less, is refused and nothing
//! lands); and a man in the middle that changes a byte of a data block and fixes its
//! CRC-32C, as an active attacker can, never gets a wrong file committed: at `integrity`
//! (the default) the block's tag fails and the block is fetched again.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

/// Both outputs of a command, for the messages a test looks for (`--json` puts the error
/// on stdout).
fn said(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A client that requires `private` from a server that allows only `clear` or only
/// `integrity` (a downgrade), one that requires `integrity` from a `clear` server, and one
/// that requires `clear` from a default server are all refused, saying why, and nothing
/// lands; the levels both allow work.
#[test]
fn a_downgrade_fails_closed() {
    let dir = scratch("downgrade");
    let src = dir.join("f");
    std::fs::write(&src, pattern(300_000, 5)).unwrap();
    let clear = serve_as(ferry(), "tcp", &[], &["--protection", "clear"]);
    for level in ["private", "integrity"] {
        let o = cp(
            &["--protect", level, src.to_str().unwrap(), &clear.url(level)],
            &[],
        );
        assert_eq!(o.status.code(), Some(2), "{level}: {}", said(&o));
        let text = said(&o);
        assert!(
            text.contains(&format!("requires data protection {level}"))
                && text.contains("allows only clear"),
            "{level}: {text}"
        );
        assert!(!clear.root.join(level).exists(), "{level} landed");
    }
    // The default (integrity) is refused there too: no silent downgrade.
    let o = cp(&[src.to_str().unwrap(), &clear.url("default")], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    ok(&cp(
        &["--protect", "clear", src.to_str().unwrap(), &clear.url("c")],
        &[],
    ));
    same_file(&src, &clear.root.join("c"));

    let strict = serve_as(ferry(), "tcp", &[], &[]);
    let o = cp(
        &[
            "--protect",
            "clear",
            src.to_str().unwrap(),
            &strict.url("c"),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    assert!(said(&o).contains("allows only integrity"), "{}", said(&o));
    assert!(!strict.root.join("c").exists());
    ok(&cp(&[src.to_str().unwrap(), &strict.url("i")], &[]));
    same_file(&src, &strict.root.join("i"));

    // A client that requires private from a server that allows only integrity: refused.
    let o = cp(
        &[
            "--protect",
            "private",
            src.to_str().unwrap(),
            &strict.url("p"),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    let text = said(&o);
    assert!(
        text.contains("requires data protection private") && text.contains("allows only integrity"),
        "{text}"
    );
    assert!(!strict.root.join("p").exists());

    // A level a clear connection cannot carry.
    let o = cp(
        &[
            "--insecure-clear",
            "--protect",
            "integrity",
            src.to_str().unwrap(),
            &strict.url("x"),
        ],
        &[],
    );
    assert!(!o.status.success());
    assert!(said(&o).contains("needs TLS"), "{}", said(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Marks the file's block to tamper with: 16 bytes found nowhere else in the stream.
const MARK: &[u8; 16] = b"<tamper-here-42>";

/// A TCP proxy in front of a server that, in what either side sends, finds [`MARK`] at the
/// start of a block payload of `block` bytes, flips its first byte, and fixes the CRC-32C
/// in the BLOCK header just before it (CRC-32C is linear: the change of the CRC follows
/// from the change of the bytes alone), `budget` times in all. Everything else crosses as
/// it is.
struct Mitm {
    addr: String,
    tampered: Arc<AtomicUsize>,
}

/// What a [`mitm`] changes.
#[derive(Clone, Copy)]
enum Change {
    /// A block payload that starts with [`MARK`]: its first byte flipped, its CRC fixed.
    Mark,
    /// A sealed BLOCK of `block` bytes (its header found by its length, type and flag): a
    /// byte of its ciphertext flipped.
    Sealed,
}

fn mitm(to: &str, block: usize, budget: usize) -> Mitm {
    mitm_changing(to, block, budget, Change::Mark)
}

fn mitm_changing(to: &str, block: usize, budget: usize, change: Change) -> Mitm {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let tampered = Arc::new(AtomicUsize::new(0));
    let (t, to) = (Arc::clone(&tampered), to.to_string());
    std::thread::spawn(move || {
        for client in l.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(&to) else {
                return;
            };
            let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (up, down) = (Arc::clone(&t), Arc::clone(&t));
            std::thread::spawn(move || forward(client, server, Some((block, budget, up)), change));
            std::thread::spawn(move || forward(s2, c2, Some((block, budget, down)), change));
        }
    });
    Mitm { addr, tampered }
}

/// The CRC-32C change that flipping `0x40` into the first of `n` bytes makes.
fn crc_delta(n: usize) -> u32 {
    let mut d = vec![0u8; n];
    d[0] = 0x40;
    crc32c::crc32c(&d) ^ crc32c::crc32c(&vec![0u8; n])
}

/// Copies `from` to `to`; with `tamper`, as [`mitm`] says. Bytes that may begin a mark
/// (and the 4 before them) are held back until more come (or the stream pauses), so the
/// header before a mark is still here when the mark is seen whole.
fn forward(
    mut from: TcpStream,
    mut to: TcpStream,
    tamper: Option<(usize, usize, Arc<AtomicUsize>)>,
    change: Change,
) {
    if let (Change::Sealed, Some(t)) = (change, tamper.clone()) {
        return forward_sealed(from, to, t);
    }
    let _ = from.set_read_timeout(Some(Duration::from_millis(5)));
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let (n, paused) = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => (n, false),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                (0, true)
            }
            Err(_) => break,
        };
        pending.extend_from_slice(&buf[..n]);
        if let Some((block, budget, done)) = &tamper {
            while done.load(Ordering::SeqCst) < *budget {
                let Some(at) = pending.windows(MARK.len()).position(|w| w == MARK) else {
                    break;
                };
                if at < 4 {
                    break;
                }
                pending[at] ^= 0x40;
                let crc =
                    u32::from_le_bytes(pending[at - 4..at].try_into().unwrap()) ^ crc_delta(*block);
                pending[at - 4..at].copy_from_slice(&crc.to_le_bytes());
                done.fetch_add(1, Ordering::SeqCst);
            }
        }
        // Held back: a start of the mark at the end, and the CRC field before it.
        let partial = (1..MARK.len())
            .rev()
            .find(|&k| pending.ends_with(&MARK[..k]));
        let keep = match (paused, partial) {
            (false, Some(k)) => (k + 4).min(pending.len()),
            _ => 0,
        };
        let out = pending.len() - keep;
        if out > 0 && to.write_all(&pending[..out]).is_err() {
            break;
        }
        pending.drain(..out);
    }
    let _ = to.write_all(&pending);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

const BLOCK: usize = 256 << 10;

/// A file of 8 blocks whose blocks 2 and 5 start with [`MARK`].
fn marked_file(dir: &std::path::Path) -> std::path::PathBuf {
    let mut data = pattern(8 * BLOCK, 9);
    for b in [2, 5] {
        data[b * BLOCK..b * BLOCK + MARK.len()].copy_from_slice(MARK);
    }
    let src = dir.join("marked");
    std::fs::write(&src, &data).unwrap();
    src
}

/// A download and an upload through [`mitm`] on `driver` at the default level: the
/// changed blocks fail their tags and are sent again, and every copy lands byte-identical.
fn tampered_blocks_are_fetched_again(driver: &str) {
    let dir = scratch("mitm");
    let src = marked_file(&dir);
    let s = serve_as(ferry(), driver, &[], &[]);
    std::fs::copy(&src, s.root.join("marked")).unwrap();
    let hostport = s.addr.split_once("://").unwrap().1.to_string();
    let m = mitm(&hostport, BLOCK, 2);
    let url = format!("{driver}://{}/d/marked", m.addr);
    let back = dir.join("back");
    let bs = BLOCK.to_string();
    let o = cp(&["--block-size", &bs, &url, back.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(
        m.tampered.load(Ordering::SeqCst),
        2,
        "the proxy found the blocks"
    );
    assert!(said(&o).contains("integrity tag mismatch"), "{}", said(&o));
    same_file(&src, &back);
    // And the other way: the server finds the changed blocks and asks for them again.
    let m = mitm(&hostport, BLOCK, 2);
    let up = format!("{driver}://{}/d/up", m.addr);
    ok(&cp(&["--block-size", &bs, src.to_str().unwrap(), &up], &[]));
    assert_eq!(
        m.tampered.load(Ordering::SeqCst),
        2,
        "the proxy found the blocks"
    );
    same_file(&src, &s.root.join("up"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tampered_blocks_are_fetched_again_tcp() {
    tampered_blocks_are_fetched_again("tcp");
}

#[test]
fn tampered_blocks_are_fetched_again_ofi_tcp() {
    tampered_blocks_are_fetched_again("ofi+tcp");
}

/// At `clear` the same tampering passes the blocks' CRC-32C, yet the file's BLAKE3 (sealed
/// in FILE_DONE) still keeps the wrong bytes from being committed: the copy fails or lands
/// the right file.
#[test]
fn at_clear_the_sealed_file_hash_still_refuses_a_wrong_file() {
    let dir = scratch("mitm-clear");
    let src = marked_file(&dir);
    let s = serve_as(ferry(), "tcp", &[], &["--protection", "clear,integrity"]);
    std::fs::copy(&src, s.root.join("marked")).unwrap();
    let hostport = s.addr.split_once("://").unwrap().1.to_string();
    let m = mitm(&hostport, BLOCK, 2);
    let url = format!("tcp://{}/d/marked", m.addr);
    let back = dir.join("back");
    let bs = BLOCK.to_string();
    let o = cp(
        &[
            "--protect",
            "clear",
            "--block-size",
            &bs,
            &url,
            back.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        m.tampered.load(Ordering::SeqCst) > 0,
        "the proxy found a block"
    );
    assert!(!said(&o).contains("integrity tag mismatch"), "{}", said(&o));
    if o.status.success() {
        same_file(&src, &back);
    } else {
        assert!(!back.exists(), "a wrong file was committed: {}", said(&o));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// [`forward`] for [`Change::Sealed`]: finds the headers of sealed BLOCKs of `block` bytes
/// (`len u32` = 32 + block + 24, type 11, flag 1, two zero bytes) and flips a byte 1000
/// bytes into the ciphertext after each, `budget` times in all. The bytes from a header on
/// are held back until that byte is here (or the stream pauses).
fn forward_sealed(
    mut from: TcpStream,
    mut to: TcpStream,
    (block, budget, done): (usize, usize, Arc<AtomicUsize>),
) {
    const INTO: usize = 32 + 1000;
    let mut head = ((32 + block + 24) as u32).to_le_bytes().to_vec();
    head.extend_from_slice(&[11, 1, 0, 0]);
    let _ = from.set_read_timeout(Some(Duration::from_millis(5)));
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    // Stream offsets: bytes already forwarded, and where the last header changed was.
    let (mut base, mut changed_to) = (0usize, 0usize);
    loop {
        let (n, paused) = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => (n, false),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                (0, true)
            }
            Err(_) => break,
        };
        pending.extend_from_slice(&buf[..n]);
        let mut hold = None;
        let mut from_i = changed_to.saturating_sub(base);
        while done.load(Ordering::SeqCst) < budget {
            let Some(at) = pending[from_i.min(pending.len())..]
                .windows(head.len())
                .position(|w| w == head)
                .map(|p| p + from_i)
            else {
                break;
            };
            if at + INTO >= pending.len() {
                hold = Some(at);
                break;
            }
            pending[at + INTO] ^= 0x40;
            done.fetch_add(1, Ordering::SeqCst);
            changed_to = base + at + 1;
            from_i = at + 1;
        }
        let partial = (1..head.len())
            .rev()
            .find(|&k| pending.ends_with(&head[..k]));
        let keep = match (paused, hold, partial) {
            (true, _, _) => 0,
            (false, Some(at), _) => pending.len() - at,
            (false, None, Some(k)) => k,
            (false, None, None) => 0,
        };
        let out = pending.len() - keep;
        if out > 0 && to.write_all(&pending[..out]).is_err() {
            break;
        }
        pending.drain(..out);
        base += out;
    }
    let _ = to.write_all(&pending);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// At `private`, a download and an upload through a proxy that flips a byte inside the
/// ciphertext of two sealed blocks on `driver`: those blocks fail to open and are sent
/// again (the download's by a ranged GET), and both copies land byte-identical.
fn sealed_blocks_changed_are_fetched_again(driver: &str) {
    let dir = scratch("mitm-private");
    let src = marked_file(&dir);
    let s = serve_as(ferry(), driver, &[], &["--protection", "private"]);
    std::fs::copy(&src, s.root.join("marked")).unwrap();
    let hostport = s.addr.split_once("://").unwrap().1.to_string();
    let bs = BLOCK.to_string();
    let m = mitm_changing(&hostport, BLOCK, 2, Change::Sealed);
    let url = format!("{driver}://{}/d/marked", m.addr);
    let back = dir.join("back");
    let args = ["--protect", "private", "--block-size", &bs];
    let o = cp(&[&args[..], &[&url, back.to_str().unwrap()]].concat(), &[]);
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(
        m.tampered.load(Ordering::SeqCst),
        2,
        "the proxy found the blocks"
    );
    assert!(
        said(&o).contains("private block failed to open"),
        "{}",
        said(&o)
    );
    same_file(&src, &back);
    let m = mitm_changing(&hostport, BLOCK, 2, Change::Sealed);
    let up = format!("{driver}://{}/d/up", m.addr);
    let v = ok(&cp(
        &[&args[..], &[src.to_str().unwrap(), &up]].concat(),
        &[],
    ));
    assert_eq!(
        m.tampered.load(Ordering::SeqCst),
        2,
        "the proxy found the blocks"
    );
    assert_eq!(v["blocks_resent"].as_u64(), Some(2), "{v}");
    same_file(&src, &s.root.join("up"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sealed_blocks_changed_are_fetched_again_tcp() {
    sealed_blocks_changed_are_fetched_again("tcp");
}

#[test]
fn sealed_blocks_changed_are_fetched_again_ofi_tcp() {
    sealed_blocks_changed_are_fetched_again("ofi+tcp");
}
