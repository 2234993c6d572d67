//! Grants for third-party copies (issue 16 item 5, docs/security.md "Third-party copies"),
//! with real `ferry serve` processes on loopback: a user who has only a key copies from A
//! to B (A proves a grant B minted, never the user's credential); a grant writes its one
//! path or tree, once, before it expires, and reads nothing; a read-only credential gets
//! none; a grant opens no other face; B's audit names the grant and who granted it.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ferry_service::channel::Channel;
use ferry_service::keys::ClientKey;
use ferry_service::secure::ClientSecurity;
use ferry_xfer::client::{Client, Options};
use ferry_xfer::Kind;
use serde_json::Value;

use common::*;

/// The JSON records of an audit file, waiting up to 5 s for one that `wanted` picks.
fn audit_until(path: &Path, wanted: impl Fn(&Value) -> bool) -> (String, Vec<Value>) {
    let t = std::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let recs: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("every audit line is one JSON object"))
            .collect();
        if recs.iter().any(&wanted) || t.elapsed() > Duration::from_secs(5) {
            return (text, recs);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A key-only user (no token anywhere) copies a file and a tree from A to B on `driver`:
/// the destination's grant is what A proves; B's audit names it and alice's key.
fn a_key_only_user_copies_between_servers(driver: &str) {
    let dir = scratch("grants-key");
    let (alice, alice_pub) = keygen(&dir, "alice");
    let keys = dir.join("authorized_keys");
    std::fs::write(&keys, format!("{alice_pub}\n")).unwrap();
    let audit = dir.join("b-audit.jsonl");
    let keyed = ["--authorized-keys", keys.to_str().unwrap()];
    let b = serve_as(
        ferry(),
        driver,
        &[],
        &[keyed[0], keyed[1], "--audit-log", audit.to_str().unwrap()],
    );
    let a = serve_as(
        ferry(),
        driver,
        &[],
        &[keyed[0], keyed[1], "--allow-third-party", &b.addr],
    );
    let data = pattern((1 << 20) + 7, 5);
    std::fs::write(a.root.join("f"), &data).unwrap();
    std::fs::create_dir_all(a.root.join("t/sub")).unwrap();
    std::fs::write(a.root.join("t/one"), b"one").unwrap();
    std::fs::write(a.root.join("t/sub/two"), pattern(5000, 2)).unwrap();
    let cp_as_alice = |args: &[&str]| {
        let mut c = ferry();
        c.args(["cp", "--json", "-i", alice.to_str().unwrap()])
            .args(args);
        run(c)
    };
    let v = ok(&cp_as_alice(&[&a.url("f"), &b.url("")]));
    assert_eq!(v["bytes"].as_u64(), Some(data.len() as u64), "{v}");
    same_file(&a.root.join("f"), &b.root.join("f"));
    let v = ok(&cp_as_alice(&["-r", &a.url("t/"), &b.url("copy")]));
    assert_eq!(v["files"].as_u64(), Some(2), "{v}");
    same_file(&a.root.join("t/sub/two"), &b.root.join("copy/sub/two"));
    same_file(&a.root.join("t/one"), &b.root.join("copy/one"));

    let by_grant = |r: &Value| {
        r["credential"]
            .as_str()
            .is_some_and(|c| c.starts_with("grant "))
    };
    let (text, recs) = audit_until(&audit, |r| by_grant(r) && r["path"] == "d/copy/sub/two");
    let fp = |r: &Value| r["credential"].as_str().unwrap_or("").to_string();
    let grants: Vec<&Value> = recs.iter().filter(|r| r["op"] == "grant").collect();
    assert_eq!(grants.len(), 2, "one grant per copy: {text}");
    assert!(
        grants.iter().all(|r| fp(r).starts_with("key SHA256:")),
        "{text}"
    );
    let put = recs
        .iter()
        .find(|r| by_grant(r) && r["path"] == "d/f")
        .unwrap_or_else(|| panic!("no write of d/f by a grant: {text}"));
    assert!(
        fp(put).ends_with(&format!("of {}", fp(grants[0]))),
        "the write names the granting key: {text}"
    );
    assert_eq!(put["result"], "ok", "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

macro_rules! on_all_drivers {
    ($($name:ident),*) => {
        mod tcp { $( #[test] fn $name() { super::$name("tcp") } )* }
        mod ofi_tcp { $( #[test] fn $name() { super::$name("ofi+tcp") } )* }
        mod ofi_shm { $( #[test] fn $name() { super::$name("ofi+shm") } )* }
    };
}

on_all_drivers!(a_key_only_user_copies_between_servers);

/// Client options for this test process's servers (pinned by fingerprint), with `token`.
fn options(token: &str, sec: &ClientSecurity) -> Options {
    Options {
        token: token.into(),
        security: sec.clone(),
        timeout: Duration::from_secs(5),
        ..Options::default()
    }
}

/// What a grant's holder (the source server of a copy) connects with.
fn holder(seed: &[u8; 32], sec: &ClientSecurity) -> Options {
    Options {
        key: Some(Arc::new(ClientKey::from_seed(seed).unwrap())),
        ..options("", sec)
    }
}

/// The error a connection to `addr` with `opts` fails with.
fn refused(addr: &str, opts: &Options) -> ferry_xfer::XferError {
    match Client::connect(addr, opts) {
        Ok(_) => panic!("{addr} let the connection in"),
        Err(e) => e,
    }
}

/// A grant, used as its holder would use it: one session, its one path (or tree), writing
/// only, before it expires; a read-only credential gets none.
#[test]
fn a_grant_writes_its_path_once_before_it_expires() {
    let dir = scratch("grants");
    let tokens = dir.join("tokens");
    let reader = "read-only-grants-token-0123456789";
    private(&tokens, &format!("ro {reader}\n"));
    let audit = dir.join("audit.jsonl");
    let b = serve_as(
        ferry(),
        "tcp",
        &[],
        &[
            "--token-file",
            tokens.to_str().unwrap(),
            "--audit-log",
            audit.to_str().unwrap(),
        ],
    );
    let sec = ClientSecurity {
        fingerprint: Some(fingerprint()),
        ..ClientSecurity::default()
    };
    let local = dir.join("up");
    std::fs::write(&local, pattern(100_000, 4)).unwrap();
    std::fs::write(b.root.join("old"), b"what a grant may not read").unwrap();

    let mut user = Client::connect(&b.addr, &options(TOKEN, &sec)).unwrap();
    let (id, seed) = user.grant("d/x", false, 0).unwrap();
    let (_, tree) = user.grant("d/t/", true, 0).unwrap();
    let (_, short) = user.grant("d/late", false, 1).unwrap();
    user.bye();

    // A grant opens file transfer only: the collective I/O face refuses it at SELECT.
    let mut ch = Channel::connect_with(&b.addr, Duration::from_secs(5), &sec).unwrap();
    let key = ClientKey::from_seed(&seed).unwrap();
    let e = ch.select_as(&b.addr, "cio", "", Some(&key)).unwrap_err();
    assert!(e.msg.contains("file transfer only"), "{e}");
    ch.close();

    // Its one session writes d/x, and nothing else, and reads nothing.
    let mut g = Client::connect(&b.addr, &holder(&seed, &sec)).unwrap();
    g.upload_file(&local, "d/x", &()).unwrap();
    same_file(&local, &b.root.join("x"));
    let e = g.upload_file(&local, "d/y", &()).unwrap_err();
    assert_eq!(e.kind, Kind::Permission, "{e}");
    assert!(e.msg.contains("grant"), "{e}");
    assert!(!b.root.join("y").exists());
    for read in [g.stat("d/old").err(), g.list("d").err(), g.sum("d/x").err()] {
        assert_eq!(read.map(|e| e.kind), Some(Kind::Permission));
    }
    assert!(g.grant("d/x", false, 0).is_err(), "a grant cannot grant");
    g.bye();
    // Used once: a second session is refused.
    let again = refused(&b.addr, &holder(&seed, &sec));
    assert_eq!(again.kind, Kind::Auth, "{again}");
    assert!(again.msg.contains("already used"), "{again}");

    // A tree grant writes beneath its path, never beside it through `..`.
    let mut g = Client::connect(&b.addr, &holder(&tree, &sec)).unwrap();
    g.mkdir("d/t", 0o755).unwrap();
    g.mkdir("d/t/sub", 0o755).unwrap();
    g.upload_file(&local, "d/t/sub/f", &()).unwrap();
    same_file(&local, &b.root.join("t/sub/f"));
    assert!(g.upload_file(&local, "d/t/../escaped", &()).is_err());
    assert!(!b.root.join("escaped").exists());
    g.bye();

    // Expired: refused.
    std::thread::sleep(Duration::from_millis(1200));
    let late = refused(&b.addr, &holder(&short, &sec));
    assert_eq!(late.kind, Kind::Auth, "{late}");
    assert!(!b.root.join("late").exists());

    // A read-only credential gets no grant.
    let mut ro = Client::connect(&b.addr, &options(reader, &sec)).unwrap();
    let e = ro.grant("d/z", false, 0).unwrap_err();
    assert_eq!(e.kind, Kind::Permission, "{e}");
    assert!(e.msg.contains("read-only"), "{e}");
    ro.bye();

    // The audit names each grant's id and who granted it; no secret is in it.
    let label = format!("grant {id:016x} of token ");
    let (text, recs) = audit_until(&audit, |r| r["path"] == "d/t/sub/f");
    let x = recs
        .iter()
        .find(|r| r["path"] == "d/x" && r["op"] == "put")
        .unwrap_or_else(|| panic!("no put of d/x: {text}"));
    assert!(
        x["credential"].as_str().unwrap().starts_with(&label),
        "{text}"
    );
    assert!(!text.contains(TOKEN) && !text.contains(reader), "{text}");
    let hex: String = seed.iter().map(|b| format!("{b:02x}")).collect();
    assert!(!text.contains(&hex), "a grant's secret in the audit");
    let _ = std::fs::remove_dir_all(&dir);
}
