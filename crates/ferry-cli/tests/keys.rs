//! Client keys and per-credential rights end to end (protocol 1.9, docs/security.md), with
//! real `ferry` processes on loopback: `ferry keygen` makes a key pair; a server with an
//! authorized-keys file lets its keys in with the rights their lines give (roots, read
//! only), refuses other keys; a token-file line limits its token; anonymous clients only
//! read unless the server lets them write; the default key file is used without a token.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::*;

/// `ferry ARGS` with `env`, no token.
fn ferry_as(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = ferry();
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    run(c)
}

#[test]
fn keys_and_rights() {
    let dir = scratch("keys");
    let (alice, alice_pub) = keygen(&dir, "alice");
    let (bob, bob_pub) = keygen(&dir, "bob");
    let (mallory, _) = keygen(&dir, "mallory");
    let mode = std::fs::metadata(&alice).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the private key is private");
    assert!(alice_pub.starts_with("ferry-ed25519 ") && alice_pub.ends_with(" alice"));
    // A key is never written over.
    let again = ferry_as(&["keygen", "-f", alice.to_str().unwrap()], &[]);
    fails(&again, 1, "exists");

    // alice reads root d only; bob reads and writes everything.
    let keys = dir.join("authorized_keys");
    std::fs::write(&keys, format!("# who\nroots=d,ro {alice_pub}\n{bob_pub}\n")).unwrap();
    let other = scratch("keys-other");
    std::fs::write(other.join("o.txt"), b"other root").unwrap();
    let tokens = dir.join("tokens");
    private(&tokens, "ro read-only-token-0123456789\n");
    let s = serve_as(
        ferry(),
        "tcp",
        &[],
        &[
            "--authorized-keys",
            keys.to_str().unwrap(),
            "--token-file",
            tokens.to_str().unwrap(),
            "--root",
            &format!("e={}", other.display()),
        ],
    );
    std::fs::write(s.root.join("f.txt"), b"in d").unwrap();
    let local = dir.join("up.txt");
    std::fs::write(&local, b"upload me").unwrap();
    let id = |k: &Path| k.to_str().unwrap().to_string();

    // alice downloads from d ...
    let got = dir.join("got.txt");
    let o = ferry_as(
        &[
            "cp",
            "--json",
            "-i",
            &id(&alice),
            &s.url("f.txt"),
            got.to_str().unwrap(),
        ],
        &[],
    );
    ok(&o);
    assert_eq!(std::fs::read(&got).unwrap(), b"in d");
    // ... cannot upload (permission, exit 7), nor remove ...
    let o = ferry_as(
        &[
            "cp",
            "-i",
            &id(&alice),
            local.to_str().unwrap(),
            &s.url("up.txt"),
        ],
        &[],
    );
    fails(&o, 7, "read-only");
    assert!(!s.root.join("up.txt").exists());
    // ... and root e does not exist for her (exit 3), nor in her list of roots.
    let o = ferry_as(
        &[
            "cp",
            "-i",
            &id(&alice),
            &s.at("e/o.txt"),
            got.to_str().unwrap(),
        ],
        &[],
    );
    fails(&o, 3, "no root named \"e\" (exported: d)");
    let o = ferry_as(&["ls", "-i", &id(&alice), &s.addr], &[]);
    let listing = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success() && listing.contains('d') && !listing.contains('e'),
        "{listing}"
    );

    // bob writes anywhere.
    let o = ferry_as(
        &[
            "cp",
            "--json",
            "-i",
            &id(&bob),
            local.to_str().unwrap(),
            &s.at("e/up.txt"),
        ],
        &[],
    );
    ok(&o);
    assert_eq!(std::fs::read(other.join("up.txt")).unwrap(), b"upload me");

    // A key not in the file is refused as a wrong token is (exit 2).
    let o = ferry_as(&["ls", "-i", &id(&mallory), &s.addr], &[]);
    fails(&o, 2, "key was not accepted");

    // A token limited by its token-file line reads but does not write.
    let o = ferry_as(
        &[
            "cp",
            "--token",
            "read-only-token-0123456789",
            local.to_str().unwrap(),
            &s.url("t.txt"),
        ],
        &[],
    );
    fails(&o, 7, "read-only");
    let o = ferry_as(
        &[
            "cp",
            "--json",
            "--token",
            TOKEN,
            local.to_str().unwrap(),
            &s.url("t.txt"),
        ],
        &[],
    );
    ok(&o);

    // Without a token, the default key file (~/.config/ferry/id_ed25519) is used.
    let config = dir.join("config");
    std::fs::create_dir_all(config.join("ferry")).unwrap();
    std::fs::copy(&bob, config.join("ferry/id_ed25519")).unwrap();
    std::fs::set_permissions(
        config.join("ferry/id_ed25519"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let o = ferry_as(
        &[
            "cp",
            "--json",
            local.to_str().unwrap(),
            &s.url("default.txt"),
        ],
        &[("XDG_CONFIG_HOME", config.to_str().unwrap())],
    );
    ok(&o);
    assert!(s.root.join("default.txt").exists());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&other);
}

#[test]
fn anonymous_clients_read_unless_the_server_lets_them_write() {
    let dir = scratch("anon");
    let local = dir.join("up.txt");
    std::fs::write(&local, b"anonymous upload").unwrap();
    let reader = serve_as(ferry(), "tcp", &[], &["--anonymous"]);
    std::fs::write(reader.root.join("r.txt"), b"readable").unwrap();
    let got = dir.join("r.txt");
    ok(&ferry_as(
        &["cp", "--json", &reader.url("r.txt"), got.to_str().unwrap()],
        &[],
    ));
    let o = ferry_as(&["cp", local.to_str().unwrap(), &reader.url("up.txt")], &[]);
    fails(&o, 7, "read-only");
    // The token still writes.
    ok(&ferry_as(
        &[
            "cp",
            "--json",
            "--token",
            TOKEN,
            local.to_str().unwrap(),
            &reader.url("up.txt"),
        ],
        &[],
    ));
    let writer = serve_as(ferry(), "tcp", &[], &["--anonymous", "--anonymous-write"]);
    ok(&ferry_as(
        &[
            "cp",
            "--json",
            local.to_str().unwrap(),
            &writer.url("up.txt"),
        ],
        &[],
    ));
    assert_eq!(
        std::fs::read(writer.root.join("up.txt")).unwrap(),
        b"anonymous upload"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ferry serve --user nobody` (as root only; skipped otherwise): the server runs as
/// nobody once it listens, and still serves what nobody may read; what nobody may not
/// write is refused by the system.
#[test]
fn serve_drops_to_an_unprivileged_user() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: --user needs root");
        return;
    }
    let s = serve_as(ferry(), "tcp", &[], &["--user", "nobody"]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.child.id())).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid.split_whitespace().skip(1).all(|id| id == "65534"),
        "still privileged: {uid}"
    );
    std::fs::write(s.root.join("r.txt"), b"for everyone").unwrap();
    let dir = scratch("user");
    let got = dir.join("r.txt");
    ok(&cp(&[&s.url("r.txt"), got.to_str().unwrap()], &[]));
    assert_eq!(std::fs::read(&got).unwrap(), b"for everyone");
    // The root directory belongs to root (mode 755): nobody cannot write there.
    let o = cp(&[got.to_str().unwrap(), &s.url("w.txt")], &[]);
    assert!(!o.status.success() && !s.root.join("w.txt").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
