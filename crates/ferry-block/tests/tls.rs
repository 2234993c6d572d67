//! NBD over TLS against libnbd's clients (Debian package libnbd-bin): a certificate
//! authority and a server certificate made for the test, `nbdcopy` with four TLS
//! connections both ways through `nbds://` and the client's `tls-certificates` directory,
//! and a clear client refused an export that requires TLS while it may use the others.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use ferry_block::config::{BlockConfig, ExportConfig, TlsPolicy};
use ferry_block::nbd::consts::{OPT_REPLY_MAGIC, REP_ERR_TLS_REQD};
use ferry_block::nbd::option::{encode_option, ClientOption, GoRequest};

const MIB: u64 = 1 << 20;

/// Writes a CA (`ca-cert.pem`, the name libnbd's `tls-certificates` directory uses) and a
/// server certificate for `localhost` and 127.0.0.1 it signed (`server-cert.pem`,
/// `server-key.pem`) into `dir`.
fn make_certificates(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "ferry test CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut server =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    server
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let server = server.signed_by(&key, &ca, &ca_key).unwrap();
    std::fs::write(dir.join("ca-cert.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("server-cert.pem"), server.pem()).unwrap();
    std::fs::write(dir.join("server-key.pem"), key.serialize_pem()).unwrap();
}

/// A server with a certificate: export `secret` (memory) requires TLS, `open` does not.
fn start_tls(dir: &Path) -> Running {
    make_certificates(dir);
    let mut secret = ExportConfig::memory("secret", 24 * MIB);
    secret.tls = TlsPolicy::Require;
    start_config(BlockConfig {
        listen: vec!["127.0.0.1:0".into()],
        exports: vec![secret, ExportConfig::memory("open", MIB)],
        tls_certificate: Some(dir.join("server-cert.pem")),
        tls_key: Some(dir.join("server-key.pem")),
        ..BlockConfig::default()
    })
}

/// `nbds://localhost:PORT/NAME` trusting the test's CA.
fn tls_uri(s: &Running, dir: &Path, name: &str) -> String {
    let port = s.addr().rsplit_once(':').unwrap().1.to_string();
    format!(
        "nbds://localhost:{port}/{name}?tls-certificates={}",
        dir.display()
    )
}

/// A clear `NBD_OPT_GO` for `name` from a raw socket: the reply's type and message.
fn raw_go(addr: &str, name: &str) -> (u32, String) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut greeting = [0u8; 18];
    c.read_exact(&mut greeting).unwrap();
    c.write_all(&[0, 0, 0, 3]).unwrap();
    let go = ClientOption::Go(GoRequest {
        name: name.into(),
        info: vec![],
    });
    c.write_all(&encode_option(&go)).unwrap();
    let mut h = [0u8; 20];
    c.read_exact(&mut h).unwrap();
    assert_eq!(&h[..8], &OPT_REPLY_MAGIC.to_be_bytes());
    let be32 = |b: &[u8]| u32::from_be_bytes(b.try_into().unwrap());
    let mut msg = vec![0u8; be32(&h[16..20]) as usize];
    c.read_exact(&mut msg).unwrap();
    (be32(&h[12..16]), String::from_utf8_lossy(&msg).into_owned())
}

#[test]
fn nbdcopy_through_tls_with_four_connections_both_ways() {
    need("nbdcopy", "libnbd-bin");
    let dir = scratch("tls-copy");
    let s = start_tls(&dir);
    let src = dir.join("src.img");
    sparse_file(
        &src,
        24 * MIB,
        &[(0, 3 << 20), (5 * MIB, 7 << 20), (20 * MIB, 4 << 20)],
    );
    let uri = tls_uri(&s, &dir, "secret");
    run(Command::new("nbdcopy").args(["--connections=4", "--flush", src.to_str().unwrap(), &uri]));
    let back = dir.join("back.img");
    run(Command::new("nbdcopy").args(["--connections=4", &uri, back.to_str().unwrap()]));
    assert!(same_bytes(&src, &back), "the copy back through TLS differs");
}

#[test]
fn a_clear_client_is_refused_an_export_that_requires_tls() {
    need("nbdinfo", "libnbd-bin");
    let dir = scratch("tls-refuse");
    let s = start_tls(&dir);
    let clear = Command::new("nbdinfo")
        .arg(s.uri("secret"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&clear.stderr);
    assert!(!clear.status.success(), "a clear client got in: {err}");
    // libnbd reports NBD_REP_ERR_TLS_REQD as ENOTSUP: the reply itself, from a socket.
    let (rtype, msg) = raw_go(&s.addr(), "secret");
    assert_eq!(rtype, REP_ERR_TLS_REQD, "{msg}");
    assert!(msg.contains("TLS"), "{msg}");
    // Selective TLS: the export that allows clear clients serves them, and the one that
    // requires TLS serves a TLS client.
    run(Command::new("nbdinfo").arg(s.uri("open")));
    let out = run(Command::new("nbdinfo").args(["--size", &tls_uri(&s, &dir, "secret")]));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (24 * MIB).to_string()
    );
}
