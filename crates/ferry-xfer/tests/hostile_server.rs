//! A hostile server, built from ferry-xfer's own pieces (an EXS listener, a [`Link`], the
//! protocol encoder and the [`BlockSender`]): it answers `ferry cp -r`'s requests with
//! listings of names that are not plain names (`../x`, an absolute path, `a/b`, `..`, `.`,
//! an empty name, a NUL) and serves every file it is asked for. The client must refuse each
//! listing and write nothing, and must not follow a symlink planted inside its destination.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ferry_exs::runtime::{default_config, EventQueue, ExsListener};
use ferry_xfer::client::{copy, Options};
use ferry_xfer::link::{BlockSender, Digest, Link, Source, Span};
use ferry_xfer::proto::{self, Entry, EntryKind, Msg, BLOCK_HEADER_LEN};
use ferry_xfer::url::{Location, Remote};
use ferry_xfer::Kind;

const T: Duration = Duration::from_secs(10);
const BLOCK: u32 = 64 * 1024;
/// What the hostile server serves as the content of every file.
const PAYLOAD: &[u8] = b"written by a hostile server\n";

fn scratch(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("ferry-hostile-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// What the server lists: (directory path, its entries).
type Listing = Vec<(String, Vec<Entry>)>;

fn entry(kind: EntryKind, name: &str) -> Entry {
    Entry {
        kind,
        mode: 0o644,
        size: if kind == EntryKind::File {
            PAYLOAD.len() as u64
        } else {
            0
        },
        mtime: 1_600_000_000,
        name: name.into(),
    }
}

/// Starts a server that says `d` is a directory whose tree `listing` gives (LIST of a path
/// under `d`, by its path), and serves [`PAYLOAD`] for every GET. It speaks protocol 1.1,
/// so the client asks for each file with a plain GET.
fn hostile(listing: Listing) -> String {
    let listener = ExsListener::bind(
        "tcp://127.0.0.1:0",
        default_config(&"tcp://127.0.0.1:0".parse().unwrap()),
    )
    .unwrap();
    let addr = listener.local_addr();
    let content = scratch("content").join("payload");
    std::fs::write(&content, PAYLOAD).unwrap();
    std::thread::spawn(move || loop {
        let Ok(inc) = listener.accept_incoming(T) else {
            continue;
        };
        let q = EventQueue::new().unwrap();
        let Ok(sock) = inc.start(&q, T) else { continue };
        let mut link = Link::new(sock, q);
        // Each connection ends with an error once the client hangs up.
        let _ = answer(&mut link, &listing, &content);
    });
    addr
}

fn answer(link: &mut Link, listing: &Listing, content: &Path) -> ferry_xfer::Result<()> {
    link.post_ring(4, BLOCK_HEADER_LEN + BLOCK as usize)?;
    let Msg::Hello { .. } = link.recv_msg()? else {
        return Ok(());
    };
    link.send(&Msg::Welcome {
        major: proto::VERSION_MAJOR,
        minor: 1,
        block_size: BLOCK,
        session: 1,
    })?;
    let mut tx = BlockSender::new(BLOCK, 2, T)?;
    let file = std::fs::File::open(content).unwrap();
    loop {
        match link.recv_msg()? {
            Msg::Stat { path } => link.send(&Msg::Entry(entry(EntryKind::Dir, &path)))?,
            Msg::List { path } => {
                let entries = listing
                    .iter()
                    .find(|(p, _)| *p == path)
                    .map(|(_, e)| e.clone())
                    .unwrap_or_default();
                link.send(&Msg::Entries {
                    more: false,
                    entries,
                })?
            }
            Msg::Get { file_id, .. } => {
                let size = PAYLOAD.len() as u64;
                link.send(&Msg::Ready {
                    file_id,
                    size,
                    mode: 0o644,
                    offset: 0,
                })?;
                let span = Span {
                    file_id,
                    offset: 0,
                    len: size,
                };
                tx.send_range(link, Source::File(&file), span, Digest::None, &|_| {})?;
                link.send(&Msg::FileDone {
                    file_id,
                    length: size,
                    blake3: Some(*blake3::hash(PAYLOAD).as_bytes()),
                })?
            }
            Msg::Bye => return Ok(()),
            _ => return Ok(()),
        }
    }
}

fn download(addr: &str, to: &Path) -> ferry_xfer::Result<ferry_xfer::client::Stats> {
    let src = Location::Remote(Remote {
        addr: addr.to_string(),
        path: "d".into(),
    });
    // The hostile server speaks protocol 1.1, before TLS: a client reaches it only by
    // asking for a clear connection.
    let opts = Options {
        timeout: T,
        idle_timeout: T,
        security: ferry_service::secure::ClientSecurity {
            clear: true,
            ..Default::default()
        },
        ..Options::default()
    };
    copy(&src, &Location::Local(to.to_path_buf()), true, &opts, &())
}

/// Every file under `dir`, relative, sorted (symlinks listed, not followed).
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            }
            out.push(rel);
        }
    }
    out.sort();
    out
}

#[test]
fn names_that_are_not_plain_are_refused_and_nothing_is_written() {
    let area = scratch("names");
    let victim = area.join("abs").join("victim");
    std::fs::create_dir_all(victim.parent().unwrap()).unwrap();
    std::fs::write(&victim, b"precious").unwrap();
    let absolute = victim.display().to_string();
    let file = |n: &str| entry(EntryKind::File, n);
    let cases: Vec<(&str, Listing)> = vec![
        ("../x", vec![("d".into(), vec![file("ok"), file("../x")])]),
        ("../../x", vec![("d".into(), vec![file("../../x")])]),
        ("absolute", vec![("d".into(), vec![file(&absolute)])]),
        ("a/b", vec![("d".into(), vec![file("a/b")])]),
        ("..", vec![("d".into(), vec![file("..")])]),
        (".", vec![("d".into(), vec![file(".")])]),
        ("empty", vec![("d".into(), vec![file("")])]),
        ("NUL", vec![("d".into(), vec![file("x\0y")])]),
        // A directory named `..` whose listing holds a plain file: the file would land
        // above the destination.
        (
            "dir ..",
            vec![
                ("d".into(), vec![entry(EntryKind::Dir, "..")]),
                ("d/..".into(), vec![file("up")]),
            ],
        ),
        // The bad name one level down.
        (
            "nested",
            vec![
                ("d".into(), vec![entry(EntryKind::Dir, "sub")]),
                ("d/sub".into(), vec![file("../../../x")]),
            ],
        ),
    ];
    for (what, listing) in cases {
        let addr = hostile(listing);
        let to = area.join("dest");
        let e = download(&addr, &to).expect_err(what);
        assert_eq!(e.kind, Kind::Permission, "{what}: {e}");
        assert!(e.msg.contains("not a plain name"), "{what}: {}", e.msg);
        assert!(!to.exists(), "{what}: the destination was created");
        assert_eq!(
            files_under(&area),
            ["abs", "abs/victim"],
            "{what}: something was written"
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "{what}");
    }
    std::fs::remove_dir_all(&area).unwrap();
}

#[test]
fn a_symlink_inside_the_destination_is_not_followed() {
    let area = scratch("symlink");
    let outside = area.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("target"), b"precious").unwrap();
    // The destination exists, so the tree lands in dest/d, where links point outside.
    let dest = area.join("dest");
    std::fs::create_dir_all(dest.join("d")).unwrap();
    std::os::unix::fs::symlink(&outside, dest.join("d/sub")).unwrap();
    std::os::unix::fs::symlink(outside.join("target"), dest.join("d/link")).unwrap();

    // A directory where a symlink to a directory outside stands: refused, not followed.
    let addr = hostile(vec![
        ("d".into(), vec![entry(EntryKind::Dir, "sub")]),
        ("d/sub".into(), vec![entry(EntryKind::File, "f")]),
    ]);
    let e = download(&addr, &dest).expect_err("a directory through a symlink");
    assert!(e.msg.contains("not a directory"), "{}", e.msg);
    assert_eq!(files_under(&outside), ["target"]);

    // A file where a symlink to a file outside stands: the link itself is replaced.
    let addr = hostile(vec![("d".into(), vec![entry(EntryKind::File, "link")])]);
    let stats = download(&addr, &dest).unwrap();
    assert_eq!(stats.files, 1);
    assert_eq!(std::fs::read(outside.join("target")).unwrap(), b"precious");
    let link = dest.join("d/link");
    assert!(link.symlink_metadata().unwrap().is_file());
    assert_eq!(std::fs::read(&link).unwrap(), PAYLOAD);
    assert_eq!(files_under(&outside), ["target"]);
    std::fs::remove_dir_all(&area).unwrap();
}
