//! Replays at the TLS level, over real EXS connections on loopback (tcp and ofi+shm): a
//! token proof made on one connection is refused on another (its exporter value differs),
//! and a record sealed by one connection's session, sent on another, ends that connection.
//! A tampered or forged clear control message on a sealed channel ends it too. A key's
//! signature (protocol 1.9) made on one connection is refused on another.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_exs::proto::Flags;
use ferry_fabric::Access;
use ferry_service::admit::{Admission, LimitsConfig};
use ferry_service::auth::AuthConfig;
use ferry_service::channel::Channel;
use ferry_service::keys::{self, ClientKey};
use ferry_service::registry::{Conn, Registry, Service};
use ferry_service::secure::{self, ClientSecurity, ServerSecurity};
use ferry_service::select::{self, Floor};
use ferry_service::serve::{bind_all, serve_until};

const T: Duration = Duration::from_secs(10);
const TOKEN: &str = "a-token-for-replays-0123456789";

/// A face that echoes each message it receives until the connection ends.
struct Echo;

impl Service for Echo {
    fn serve_connection(&self, conn: Conn) {
        let mut ch = Channel::new(conn.sock, conn.queue);
        ch.seal(conn.secure);
        ch.timeout = T;
        let mut msg = Vec::new();
        if ch.post_ring(2, 4096).is_err() {
            return;
        }
        while ch.recv_into(&mut msg).is_ok() {
            if ch.send_frame(&msg).is_err() {
                return;
            }
        }
    }
}

/// A server hosting `echo` on tcp and ofi+shm; its addresses, a client security pinning
/// it, and the flag that stops it.
fn start() -> (Vec<String>, ClientSecurity, Arc<AtomicBool>, ClientKey) {
    let dir = std::env::temp_dir().join(format!("ferry-secure-replay-{}", std::process::id()));
    let security = ServerSecurity::from_state_dir(&dir, false).unwrap();
    let client = ClientSecurity {
        fingerprint: security.fingerprint().map(String::from),
        ..ClientSecurity::default()
    };
    let key_file = dir.join("id_ed25519");
    let _ = std::fs::remove_file(&key_file);
    let _ = std::fs::remove_file(keys::public_path(&key_file));
    let public = keys::generate(&key_file, "replay").unwrap();
    let auth = AuthConfig {
        tokens: vec![TOKEN.into()],
        keys: vec![keys::AuthorizedKey {
            key: public,
            rights: Default::default(),
            comment: String::new(),
        }],
        ..AuthConfig::default()
    };
    let mut reg = Registry::new(auth, security);
    reg.add("echo", Arc::new(Echo)).unwrap();
    let shm = format!("ofi+shm://ferry-secure-replay-{}", std::process::id());
    let listeners = bind_all(&["tcp://127.0.0.1:0".into(), shm]).unwrap();
    let addrs = listeners.iter().map(|l| l.local_addr()).collect();
    let admission = Admission::new(&LimitsConfig::default(), |_, _| 0);
    let quit = Arc::new(AtomicBool::new(false));
    let q = quit.clone();
    let reg = Arc::new(reg);
    std::thread::spawn(move || serve_until(&reg, &admission, &listeners, &q));
    (addrs, client, quit, ClientKey::load(&key_file).unwrap())
}

/// A sealed channel to `addr` with the SELECT `proof` answered.
fn selected(
    addr: &str,
    sec: &ClientSecurity,
    proof: Option<([u8; 8], [u8; 32])>,
) -> (Channel, Floor) {
    selected_with(addr, sec, proof, None)
}

/// [`selected`] with a key proof too.
fn selected_with(
    addr: &str,
    sec: &ClientSecurity,
    proof: Option<([u8; 8], [u8; 32])>,
    key: Option<([u8; 32], [u8; 64])>,
) -> (Channel, Floor) {
    let mut ch = Channel::connect_with(addr, T, sec).unwrap();
    ch.timeout = T;
    ch.post_ring(2, 4096).unwrap();
    let sel = select::encode(&Floor::Select {
        service: "echo".into(),
        token: None,
        proof,
        key,
    })
    .unwrap();
    ch.send_frame(&sel).unwrap();
    let mut answer = Vec::new();
    ch.recv_into(&mut answer).unwrap();
    (ch, select::decode(&answer).unwrap())
}

/// Sends `bytes` on the channel's socket as they are, bypassing its seal.
fn send_raw(ch: &Channel, bytes: &[u8]) {
    let sock = ch.socket();
    let buf = sock.alloc_with(bytes.len(), Access::REMOTE_READ).unwrap();
    buf.write_at(0, bytes).unwrap();
    sock.send(buf, Flags::NONE, 7);
}

#[test]
fn replays_and_forgeries_are_refused() {
    let (addrs, sec, quit, key) = start();
    for addr in &addrs {
        // A proof of the token made for connection A gets A in ...
        let mut a = Channel::connect_with(addr, T, &sec).unwrap();
        a.timeout = T;
        let binding_a = *a.secure().unwrap().binding();
        let proof_a = (secure::token_id(TOKEN), secure::prove(TOKEN, &binding_a));
        a.select(addr, "echo", TOKEN).unwrap();
        // ... and is refused on connection B, whose exporter value differs.
        let (b, answer) = selected(addr, &sec, Some(proof_a));
        assert!(
            matches!(&answer, Floor::Refused { message } if message.contains("not accepted")),
            "{addr}: {answer:?}"
        );
        b.close();

        // A key's signature of A's exporter value gets A in, and is refused on another
        // connection: a captured SELECT cannot be replayed.
        let mut k = Channel::connect_with(addr, T, &sec).unwrap();
        k.timeout = T;
        let key_proof = key.prove(k.secure().unwrap().binding());
        k.select_as(addr, "echo", "", Some(&key)).unwrap();
        let (b, answer) = selected_with(addr, &sec, None, Some(key_proof));
        assert!(
            matches!(&answer, Floor::Refused { message } if message.contains("key was not accepted")),
            "{addr}: {answer:?}"
        );
        b.close();
        k.close();

        // A record sealed by A's session, replayed on C: C's session cannot open it.
        let (mut c, answer) = selected(addr, &sec, None);
        assert_eq!(answer, Floor::Selected, "{addr}");
        let from_a = a
            .secure()
            .unwrap()
            .seal(b"ping", |s| Ok(s.to_vec()))
            .unwrap();
        send_raw(&c, &from_a);
        let mut echo = Vec::new();
        assert!(
            c.recv_into(&mut echo).is_err(),
            "{addr}: the replay was answered"
        );

        // A clear control message on a sealed connection (not a data frame) ends it.
        let (mut d, _) = selected(addr, &sec, None);
        d.send_frame(b"sealed").unwrap();
        d.recv_into(&mut echo).unwrap();
        assert_eq!(echo, b"sealed", "{addr}");
        send_raw(&d, &[12, 0, 0, 0, 3, 0, 0, 0, 1, 2, 3, 4]);
        assert!(
            d.recv_into(&mut echo).is_err(),
            "{addr}: a clear frame was answered"
        );
        a.close();
    }
    quit.store(true, Ordering::SeqCst);
}
