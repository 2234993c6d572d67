//! Verifying a server by a site's CA instead of pinning (`--ca-file`, docs/security.md),
//! with real `ferry` processes: a server whose certificate a CA made by rcgen signed for
//! 127.0.0.1 is accepted by a client trusting that CA, without touching known hosts; a
//! client trusting another CA refuses it (exit 2).

mod common;

use std::os::unix::fs::PermissionsExt;

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};

use common::*;

/// A CA: its certificate and key.
fn ca() -> (rcgen::Certificate, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (p.self_signed(&key).unwrap(), key)
}

#[test]
fn a_server_signed_by_the_given_ca_is_accepted_another_refused() {
    let dir = scratch("ca");
    let (ca_cert, ca_key) = ca();
    let (other, _) = ca();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca_cert, &ca_key)
        .unwrap();
    // The site puts its certificate, the chain and the key in the server's identity file.
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let identity = state.join("server.pem");
    std::fs::write(
        &identity,
        format!(
            "{}{}{}",
            leaf.pem(),
            ca_cert.pem(),
            leaf_key.serialize_pem()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&identity, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (ca_file, other_file) = (dir.join("ca.pem"), dir.join("other.pem"));
    std::fs::write(&ca_file, ca_cert.pem()).unwrap();
    std::fs::write(&other_file, other.pem()).unwrap();
    let s = serve_as(
        ferry(),
        "tcp",
        &[],
        &["--state-dir", state.to_str().unwrap()],
    );
    std::fs::write(s.root.join("f.txt"), b"verified").unwrap();

    let known = dir.join("known_hosts");
    let ls = |ca: &std::path::Path| {
        let mut c = ferry();
        c.env("FERRY_KNOWN_HOSTS", &known)
            .args(["ls", "--token", TOKEN, "--ca-file"])
            .arg(ca)
            .arg(s.url(""));
        run(c)
    };
    let o = ls(&ca_file);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("f.txt"));
    assert!(
        !known.exists(),
        "--ca-file neither reads nor writes known hosts"
    );
    fails(&ls(&other_file), 2, "do not vouch");
    let _ = std::fs::remove_dir_all(&dir);
}
