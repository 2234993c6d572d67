//! Native tcp driver: refused RMA, vanished peers, garbage and truncated frames, version
//! mismatch. Broken connections fail their own operations; the target and listener go on.

mod tcp_util;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ferry_fabric::drivers::tcp::frame::{self, Frame};
use ferry_fabric::{Access, Buffer, Endpoint, FabricError, Listener, OpKind, RemoteAccessError};
use tcp_util::*;

fn hello(major: u16) -> Vec<u8> {
    Frame::Hello {
        major,
        minor: frame::VERSION_MINOR,
        flags: 0,
    }
    .encode()
    .as_bytes()
    .to_vec()
}

/// A raw socket that completed the handshake with `listener`, and the accepted endpoint.
fn raw_peer(listener: &dyn Listener) -> (TcpStream, Box<dyn Endpoint>) {
    let addr = listener.local_addr();
    let mut raw = TcpStream::connect((addr.host.as_str(), addr.port.unwrap())).unwrap();
    raw.set_read_timeout(Some(T)).unwrap();
    raw.write_all(&hello(frame::VERSION_MAJOR)).unwrap();
    let ep = listener.accept(T).expect("accept raw peer");
    let mut theirs = [0u8; 32];
    raw.read_exact(&mut theirs).unwrap();
    assert!(matches!(
        frame::decode(&theirs),
        Ok(Some((Frame::Hello { .. }, 32)))
    ));
    (raw, ep)
}

/// A fresh connection to `listener` carries a message both ways.
fn still_serves(listener: &dyn Listener) {
    let (server, client) = connect(listener);
    for (from, to) in [(&client, &server), (&server, &client)] {
        let m = register_data(&**from, b"hello", Access::LOCAL);
        let d = register(&**to, 5, Access::LOCAL);
        to.post_recv(&[d.full()], 0).unwrap();
        from.post_send(&[m.full()], 0).unwrap();
        ok(&**from);
        ok(&**to);
        assert_eq!(d.buffer().to_vec(), b"hello");
    }
}

fn remote_error(ep: &dyn Endpoint) -> (OpKind, RemoteAccessError) {
    match failed(ep) {
        (c, FabricError::RemoteAccess(e)) => (c.op, e),
        (_, e) => panic!("expected a remote access error, got {e}"),
    }
}

#[test]
fn refused_rma_fails_at_requester_while_target_serves_on() {
    let p = pair();
    let (server2, client2) = connect(&*p.listener);
    let target = register(&*p.server, 4096, Access::REMOTE_WRITE | Access::REMOTE_READ);
    let remote = advertise(&p, &target);
    let src = register(&*p.client, 8192, Access::LOCAL);
    let s = |r: std::ops::Range<usize>| [src.slice(r).unwrap()];
    use RemoteAccessError::*;

    // Out of bounds, by one byte and by overflow.
    let past = ferry_fabric::RemoteSlice {
        len: 4097,
        ..remote
    };
    p.client.post_write(&s(0..4097), past, 1).unwrap();
    assert_eq!(remote_error(&*p.client), (OpKind::Write, OutOfBounds));
    p.client.post_read(&s(0..4097), past, 2).unwrap();
    assert_eq!(remote_error(&*p.client), (OpKind::Read, OutOfBounds));
    let wrap = ferry_fabric::RemoteSlice {
        addr: u64::MAX - 1,
        len: 4,
        ..remote
    };
    p.client.post_write(&s(0..4), wrap, 3).unwrap();
    assert_eq!(remote_error(&*p.client), (OpKind::Write, OutOfBounds));

    // A foreign key: a region of another domain on the target host.
    let other = listener();
    let foreign = other
        .domain()
        .register(&Buffer::new(4096), Access::ALL)
        .unwrap();
    let foreign = foreign.remote(0..64).unwrap();
    p.client.post_write(&s(0..64), foreign, 4).unwrap();
    assert_eq!(remote_error(&*p.client), (OpKind::Write, UnknownKey));
    p.client.post_read(&s(0..64), foreign, 5).unwrap();
    assert_eq!(remote_error(&*p.client), (OpKind::Read, UnknownKey));

    // A stale key: the region was deregistered.
    let stale = register(&*p.server, 4096, Access::ALL);
    let stale_remote = stale.remote(0..64).unwrap();
    drop(stale);
    p.client.post_write(&s(0..64), stale_remote, 6).unwrap();
    assert_eq!(remote_error(&*p.client), (OpKind::Write, StaleKey));
    p.client.post_read(&s(0..64), stale_remote, 7).unwrap();
    assert_eq!(remote_error(&*p.client), (OpKind::Read, StaleKey));

    // Missing rights: write to a read-only region, read from a write-only one.
    let ro = register(&*p.server, 4096, Access::REMOTE_READ);
    let wo = register(&*p.server, 4096, Access::REMOTE_WRITE);
    src.buffer().fill(0xee);
    p.client
        .post_write(&s(0..4096), ro.remote(..).unwrap(), 8)
        .unwrap();
    assert_eq!(remote_error(&*p.client), (OpKind::Write, NoPermission));
    assert!(
        ro.buffer().to_vec().iter().all(|&b| b == 0),
        "read-only region untouched"
    );
    p.client
        .post_read(&s(0..4096), wo.remote(..).unwrap(), 9)
        .unwrap();
    assert_eq!(remote_error(&*p.client), (OpKind::Read, NoPermission));
    let ls = register(&*p.server, 64, Access::LOCAL);
    p.client
        .post_read(&s(0..64), ls.remote(..).unwrap(), 10)
        .unwrap();
    assert_eq!(remote_error(&*p.client), (OpKind::Read, NoPermission));

    // Refusals in a pipeline with good ops: every op gets its own answer, in order.
    for i in 0..20u64 {
        let r = if i % 3 == 0 {
            past
        } else {
            remote.sub(0, 64).unwrap()
        };
        let l = if i % 3 == 0 { s(0..4097) } else { s(0..64) };
        p.client.post_write(&l, r, i).unwrap();
    }
    for i in 0..20u64 {
        let c = p.client.cq().wait(T).unwrap();
        assert_eq!(c.context, i);
        assert_eq!(c.result.is_err(), i % 3 == 0);
    }

    // The target keeps serving this connection and new ones.
    src.buffer().write_at(0, b"still here");
    p.client
        .post_write(&s(0..10), remote.sub(0, 10).unwrap(), 11)
        .unwrap();
    ok(&*p.client);
    assert_eq!(&target.buffer().to_vec()[..10], b"still here");
    drop((server2, client2));
    still_serves(&*p.listener);
}

/// Sends `f` (a READ_REQ, or a WRITE with `payload`) on the raw socket and returns the
/// answer's header: WRITE_ACK or READ_RESP, with any READ_RESP payload read too.
fn ask(raw: &mut TcpStream, f: Frame, payload: &[u8]) -> std::io::Result<(Frame, Vec<u8>)> {
    raw.write_all(f.encode().as_bytes())?;
    raw.write_all(payload)?;
    let mut head = [0u8; frame::PREFIX_LEN];
    raw.read_exact(&mut head)?;
    let (answer, _) = frame::decode(&head).unwrap().unwrap();
    let mut data = vec![0u8; answer.payload_len() as usize];
    raw.read_exact(&mut data)?;
    Ok((answer, data))
}

fn read_req(key: u64, len: u64) -> Frame {
    Frame::ReadReq {
        id: 0,
        key,
        offset: 0,
        len,
    }
}

/// The uniform refusal: UnknownKey, no payload.
fn refused(answer: (Frame, Vec<u8>)) {
    match answer {
        (Frame::ReadResp { error, len, .. }, data) => {
            assert_eq!(
                (error, len, data.len()),
                (Some(RemoteAccessError::UnknownKey), 0, 0)
            )
        }
        (Frame::WriteAck { error, .. }, _) => {
            assert_eq!(error, Some(RemoteAccessError::UnknownKey))
        }
        (other, _) => panic!("unexpected answer {other:?}"),
    }
}

#[test]
fn an_unauthenticated_peer_reads_and_writes_nothing_and_is_cut_off() {
    // A legitimate, authenticated client of the same listener holds a granted region full
    // of secrets.
    let p = pair();
    let secret = register_data(&*p.server, &[0x5e; 4096], Access::ALL);
    let secret_key = advertise(&p, &secret).key;
    // A prober that speaks the driver HELLO and nothing else: not authenticated.
    let (mut raw, ep) = raw_peer(&*p.listener);
    let own = register(&*ep, 4096, Access::ALL);
    let guesses = [
        secret_key, // valid on another connection
        own.key(),  // granted to this one, but not enabled
        0,
        1,
        0xabcd_ef00_0000_0000, // the old salt << 40 probe
        secret_key ^ 1,
        u64::MAX,
    ];
    let mut answers = 0;
    for (i, &key) in guesses.iter().enumerate() {
        let answer = if i % 2 == 0 {
            ask(&mut raw, read_req(key, 64), &[])
        } else {
            let f = Frame::Write {
                id: 0,
                key,
                offset: 0,
                len: 4,
            };
            ask(&mut raw, f, b"PWND")
        };
        refused(answer.expect("a refusal, not a closed connection yet"));
        answers += 1;
    }
    // Asking again with a key already refused is not a new guess.
    refused(ask(&mut raw, read_req(secret_key, 4096), &[]).expect("still open"));
    // The eighth different key is the last: the connection closes (its answer may or may
    // not arrive first), and nothing ever came back but refusals.
    if let Ok(a) = ask(&mut raw, read_req(2, 4096), &[]) {
        refused(a);
    }
    let mut rest = Vec::new();
    let eof = raw.read_to_end(&mut rest);
    assert!(
        eof.is_err() || rest.is_empty(),
        "closed after {answers}+1 refusals"
    );
    assert!(
        secret.buffer().to_vec().iter().all(|&b| b == 0x5e),
        "secret unchanged"
    );
    assert!(
        own.buffer().to_vec().iter().all(|&b| b == 0),
        "own region unchanged"
    );
    // The closed connection's endpoint sees it; the others are unaffected.
    assert!(matches!(
        ep.post_send(&[own.slice(0..1).unwrap()], 0)
            .map(|()| failed(&*ep).1),
        Ok(FabricError::Protocol(_)) | Ok(FabricError::ConnectionLost(_))
    ));
    let mine = register_data(&*p.client, b"ok", Access::LOCAL);
    p.client
        .post_write(&[mine.full()], secret.remote(0..2).unwrap(), 1)
        .unwrap();
    ok(&*p.client);
    still_serves(&*p.listener);
}

#[test]
fn once_enabled_a_granted_key_is_served_and_exact_errors_are_its_own() {
    let l = listener();
    let (mut raw, ep) = raw_peer(&*l);
    let own = register_data(&*ep, b"granted bytes", Access::REMOTE_READ);
    refused(ask(&mut raw, read_req(own.key(), 13), &[]).unwrap());
    ep.enable_remote_access();
    let (answer, data) = ask(&mut raw, read_req(own.key(), 13), &[]).unwrap();
    assert!(matches!(
        answer,
        Frame::ReadResp {
            error: None,
            len: 13,
            ..
        }
    ));
    assert_eq!(data, b"granted bytes");
    // Its own key gets exact reasons; a write to a read-only region changes nothing.
    let (answer, _) = ask(&mut raw, read_req(own.key(), 14), &[]).unwrap();
    assert!(matches!(
        answer,
        Frame::ReadResp {
            error: Some(RemoteAccessError::OutOfBounds),
            ..
        }
    ));
    let w = Frame::Write {
        id: 0,
        key: own.key(),
        offset: 0,
        len: 4,
    };
    let (answer, _) = ask(&mut raw, w, b"PWND").unwrap();
    assert!(matches!(
        answer,
        Frame::WriteAck {
            error: Some(RemoteAccessError::NoPermission),
            ..
        }
    ));
    assert_eq!(own.buffer().to_vec(), b"granted bytes");
}

#[test]
fn a_key_is_honoured_only_on_the_connection_it_was_granted_to() {
    let p = pair();
    let target = register(&*p.server, 4096, Access::ALL);
    let remote = advertise(&p, &target);
    // A second connection of the same listener, authenticated (remote access on), that was
    // granted a region of its own: the first connection's key is nothing to it.
    let (server2, client2) = connect(&*p.listener);
    server2.enable_remote_access();
    let own = register(&*server2, 64, Access::ALL);
    let r2 = register_data(&*client2, b"second", Access::LOCAL);
    client2
        .post_write(&[r2.full()], remote.sub(100, 6).unwrap(), 1)
        .unwrap();
    assert_eq!(
        remote_error(&*client2),
        (OpKind::Write, RemoteAccessError::UnknownKey)
    );
    client2
        .post_read(&[r2.full()], remote.sub(0, 6).unwrap(), 2)
        .unwrap();
    assert_eq!(
        remote_error(&*client2),
        (OpKind::Read, RemoteAccessError::UnknownKey)
    );
    assert!(
        target.buffer().to_vec().iter().all(|&b| b == 0),
        "untouched"
    );
    // Its own grant works, and the first connection's still does.
    client2
        .post_write(&[r2.full()], own.remote(0..6).unwrap(), 3)
        .unwrap();
    ok(&*client2);
    assert_eq!(&own.buffer().to_vec()[..6], b"second");
    let r1 = register_data(&*p.client, b"first", Access::LOCAL);
    p.client
        .post_write(&[r1.full()], remote.sub(100, 5).unwrap(), 4)
        .unwrap();
    ok(&*p.client);
    assert_eq!(&target.buffer().to_vec()[100..105], b"first");
    assert!(server2.cq().is_empty());
}

#[test]
fn vanished_peer_fails_pending_ops_and_later_posts() {
    let l = listener();
    let (raw, ep) = raw_peer(&*l);
    let big = register(&*ep, 64 << 20, Access::LOCAL);
    let small = register(&*ep, 64, Access::LOCAL);
    let remote = ferry_fabric::RemoteSlice {
        addr: 0,
        len: 64,
        key: 7,
    };
    ep.post_recv(&[small.full()], 1).unwrap();
    ep.post_write(&[small.full()], remote, 2).unwrap();
    ep.post_read(&[small.full()], remote, 3).unwrap();
    // More than the socket buffers hold, so it is still being written when the peer goes.
    ep.post_send(&[big.full()], 4).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    drop(raw);
    let mut done = Vec::new();
    for _ in 0..4 {
        let (c, e) = failed(&*ep);
        assert!(matches!(e, FabricError::ConnectionLost(_)), "{e}");
        done.push(c.context);
    }
    done.sort();
    assert_eq!(done, [1, 2, 3, 4]);
    assert!(start.elapsed() < Duration::from_secs(5), "noticed promptly");
    // Later posts are accepted and fail at once, one completion each.
    ep.post_send(&[small.full()], 5).unwrap();
    ep.post_recv(&[small.full()], 6).unwrap();
    ep.post_write(&[small.full()], remote, 7).unwrap();
    ep.post_read(&[small.full()], remote, 8).unwrap();
    for want in 5..=8 {
        let (c, e) = failed(&*ep);
        assert_eq!(c.context, want);
        assert!(matches!(e, FabricError::ConnectionLost(_)), "{e}");
    }
    assert!(
        ep.cq().wait(Duration::from_millis(100)).is_err(),
        "no extra completions"
    );
    still_serves(&*l);
}

#[test]
fn dropped_endpoint_ends_the_peers_ops() {
    let p = pair();
    let dst = register(&*p.server, 64, Access::LOCAL);
    p.server.post_recv(&[dst.full()], 1).unwrap();
    let target = register(&*p.client, 64, Access::ALL);
    p.server
        .post_read(&[dst.full()], target.remote(..).unwrap(), 2)
        .unwrap();
    ok(&*p.server);
    drop(p.client);
    let (c, e) = failed(&*p.server);
    assert_eq!(c.context, 1);
    assert!(matches!(e, FabricError::ConnectionLost(_)), "{e}");
    still_serves(&*p.listener);
}

#[test]
fn garbage_frames_close_only_that_connection() {
    let l = listener();
    let (keep_server, keep_client) = connect(&*l);
    let cases: [(&str, Vec<u8>); 5] = [
        ("unknown type", {
            let mut b = Frame::Send { len: 0 }.encode().as_bytes().to_vec();
            b[8] = 0xee;
            b
        }),
        ("reserved bits", {
            let mut b = Frame::Send { len: 0 }.encode().as_bytes().to_vec();
            b[11] = 1;
            b
        }),
        ("second HELLO", hello(frame::VERSION_MAJOR)),
        (
            "answer to nothing",
            Frame::WriteAck { id: 9, error: None }
                .encode()
                .as_bytes()
                .to_vec(),
        ),
        (
            "random bytes",
            (0..200u32).map(|i| (i * 7919 % 251) as u8).collect(),
        ),
    ];
    for (what, bytes) in cases {
        let (mut raw, ep) = raw_peer(&*l);
        let dst = register(&*ep, 64, Access::LOCAL);
        ep.post_recv(&[dst.full()], 1).unwrap();
        raw.write_all(&bytes).unwrap();
        let (_, e) = failed(&*ep);
        assert!(matches!(e, FabricError::Protocol(_)), "{what}: {e}");
        // The driver closed the socket: the raw peer reads EOF.
        let mut rest = Vec::new();
        assert!(
            raw.read_to_end(&mut rest).is_ok() && rest.is_empty(),
            "{what}"
        );
        still_serves(&*l);
    }
    // The connection that existed all along is unaffected.
    let m = register_data(&*keep_client, b"ok", Access::LOCAL);
    let d = register(&*keep_server, 2, Access::LOCAL);
    keep_server.post_recv(&[d.full()], 0).unwrap();
    keep_client.post_send(&[m.full()], 0).unwrap();
    ok(&*keep_server);
}

#[test]
fn truncated_frames_close_only_that_connection() {
    let l = listener();
    let write = Frame::Write {
        id: 0,
        key: 1,
        offset: 0,
        len: 100,
    };
    let header = write.encode().as_bytes().to_vec();
    let cases: [(&str, Vec<u8>); 3] = [
        ("half a header", header[..20].to_vec()),
        ("header, half a payload", [&header[..], &[0; 50]].concat()),
        (
            "half a SEND",
            [Frame::Send { len: 10 }.encode().as_bytes(), &[1, 2][..]].concat(),
        ),
    ];
    for (what, bytes) in cases {
        let (mut raw, ep) = raw_peer(&*l);
        let dst = register(&*ep, 64, Access::LOCAL);
        ep.post_recv(&[dst.full()], 1).unwrap();
        raw.write_all(&bytes).unwrap();
        drop(raw);
        let (_, e) = failed(&*ep);
        assert!(matches!(e, FabricError::ConnectionLost(_)), "{what}: {e}");
        if !what.contains("SEND") {
            // (A receive that fails mid-message holds undefined bytes, as on RDMA.)
            assert!(dst.buffer().to_vec().iter().all(|&b| b == 0), "{what}");
        }
        still_serves(&*l);
    }
}

#[test]
fn bad_handshakes_are_refused_and_listener_goes_on() {
    let l = listener();
    let addr = l.local_addr();
    let dial = || TcpStream::connect((addr.host.as_str(), addr.port.unwrap())).unwrap();

    // Another major version: refused with VersionMismatch; the peer still gets our HELLO.
    let mut raw = dial();
    raw.write_all(&hello(frame::VERSION_MAJOR + 1)).unwrap();
    match l.accept(T) {
        Err(FabricError::VersionMismatch {
            peer_major,
            our_major,
        }) => {
            assert_eq!(
                (peer_major, our_major),
                (frame::VERSION_MAJOR + 1, frame::VERSION_MAJOR)
            )
        }
        other => panic!("expected a version mismatch, got {:?}", other.err()),
    }
    let mut theirs = Vec::new();
    raw.read_to_end(&mut theirs).unwrap();
    assert_eq!(
        theirs,
        hello(frame::VERSION_MAJOR),
        "our HELLO, then the connection closes"
    );

    // Not a ferry peer at all.
    let mut raw = dial();
    raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(matches!(l.accept(T), Err(FabricError::Protocol(_))));
    let mut bad_magic = hello(frame::VERSION_MAJOR);
    bad_magic[16] ^= 0xff;
    dial().write_all(&bad_magic).unwrap();
    assert!(matches!(l.accept(T), Err(FabricError::Protocol(_))));

    // Silent peer: the handshake times out instead of hanging.
    let _silent = dial();
    assert!(matches!(
        l.accept(Duration::from_millis(200)),
        Err(FabricError::Timeout(_))
    ));
    still_serves(&*l);

    // The client side refuses a server speaking another major, or not ferry's, as the
    // listener's first frame arrives: the connection fails with the reason (a connector
    // does not wait for the listener's HELLO before its first sends).
    for (theirs, want) in [(hello(7), "version"), (b"SSH-2.0-x\r\n".repeat(4), "HELLO")] {
        let fake = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("tcp://{}", fake.local_addr().unwrap())
            .parse()
            .unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = fake.accept().unwrap();
            let mut ours = [0u8; 32];
            s.read_exact(&mut ours).unwrap();
            s.write_all(&theirs).unwrap();
            // Held open: the client fails on what it read, not on a closed socket.
            let _ = s.read(&mut ours);
        });
        let ep = ferry_fabric::connect(&url, T).expect("connect");
        let dst = register(&*ep, 64, Access::LOCAL);
        ep.post_recv(&[dst.full()], 1).unwrap();
        let (_, e) = failed(&*ep);
        match (want, &e) {
            ("version", FabricError::VersionMismatch { peer_major: 7, .. }) => {}
            ("HELLO", FabricError::Protocol(why)) if why.contains("HELLO") => {}
            _ => panic!("expected {want}, got {e:?}"),
        }
        drop(ep);
        server.join().unwrap();
    }
}

/// The child side of `killed_peer_process`: connect, stream sends, wait to be killed.
#[test]
fn killed_peer_child() {
    let Ok(url) = std::env::var("FERRY_TCP_KILLED_PEER") else {
        return;
    };
    let ep = ferry_fabric::connect(&url.parse().unwrap(), T).unwrap();
    let src = register(&*ep, 1 << 20, Access::LOCAL);
    let dst = register(&*ep, 1 << 20, Access::LOCAL);
    ep.post_recv(&[dst.full()], 0).unwrap();
    for i in 0..4 {
        ep.post_send(&[src.full()], i).unwrap();
    }
    std::thread::sleep(Duration::from_secs(60));
}

/// Kills the child process however the test ends, so a failure cannot leave it stopped.
struct Reaper(std::process::Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Stops `pid` and waits until every one of its threads is stopped.
fn stop(pid: u32) {
    let st = std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let stopped = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .all(|t| {
                let stat =
                    std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap_or_default();
                let state = stat.rsplit(')').next().unwrap_or("").trim_start();
                state.starts_with('T') || state.starts_with('t')
            })
    };
    let start = Instant::now();
    while !stopped() {
        assert!(start.elapsed() < T, "child did not stop");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn killed_peer_process() {
    let l = listener();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "killed_peer_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FERRY_TCP_KILLED_PEER", l.local_addr().to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Reaper(child);
    let ep = l.accept(T).expect("child connects");
    let dst = register(&*ep, 1 << 20, Access::LOCAL);
    ep.post_recv(&[dst.full()], 0).unwrap();
    ok(&*ep);
    // Stopped, the child cannot answer the read: it stays pending until the child dies.
    stop(child.0.id());
    let target = register(&*ep, 64, Access::LOCAL);
    let remote = ferry_fabric::RemoteSlice {
        addr: 0,
        len: 64,
        key: 1,
    };
    ep.post_read(&[target.full()], remote, 1).unwrap();
    if let Ok(c) = ep.cq().wait(Duration::from_millis(200)) {
        panic!("the read should be pending, but completed: {c:?}");
    }
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let start = Instant::now();
    let (c, e) = failed(&*ep);
    assert_eq!(c.op, OpKind::Read);
    assert!(matches!(e, FabricError::ConnectionLost(_)), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5));
    ep.post_send(&[dst.full()], 2).unwrap();
    assert!(failed(&*ep).1.to_string().contains("connection lost"));
    still_serves(&*l);
}
