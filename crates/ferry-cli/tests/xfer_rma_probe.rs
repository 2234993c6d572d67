//! A peer that reaches a `ferry serve` tcp port but holds no token gets at no memory: the
//! native tcp driver refuses its RMA requests alike, closes its connection after a few, and
//! the server logs it; real clients go on being served.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use ferry_fabric::drivers::tcp::frame::{self, Frame};
use ferry_fabric::RemoteAccessError;

/// Reads the next answer header (WRITE_ACK or READ_RESP) and its payload, if any, skipping
/// the messages (SEND: the server's EXS HELLO) in between.
fn answer(raw: &mut TcpStream) -> std::io::Result<(Frame, Vec<u8>)> {
    loop {
        let mut head = [0u8; frame::PREFIX_LEN];
        raw.read_exact(&mut head)?;
        let (f, _) = frame::decode(&head)
            .ok()
            .flatten()
            .ok_or_else(|| std::io::Error::other("not an answer frame"))?;
        let mut data = vec![0u8; f.payload_len() as usize];
        raw.read_exact(&mut data)?;
        if !matches!(f, Frame::Send { .. }) {
            return Ok((f, data));
        }
    }
}

#[test]
fn an_unauthenticated_peer_reads_no_server_memory_and_is_cut_off() {
    let server = serve_logging(ferry(), "tcp", &[], &[], Stdio::piped());
    std::fs::write(server.root.join("secret.txt"), [b'S'; 1 << 20]).unwrap();
    let addr = server.addr.clone();

    // A real client downloads the file, so the server has had file data in registered memory.
    let dst = scratch("probe-dst");
    ok(&cp(
        &[&server.url("secret.txt"), dst.join("got").to_str().unwrap()],
        &[],
    ));

    // The prober: the driver HELLO, then the old attack's READ_REQs (salt << 40, slot 0) and
    // a few WRITEs.
    let hostport = addr.strip_prefix("tcp://").unwrap();
    let mut raw = TcpStream::connect(hostport).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let hello = Frame::Hello {
        major: frame::VERSION_MAJOR,
        minor: 0,
        flags: 0,
    };
    raw.write_all(hello.encode().as_bytes()).unwrap();
    let mut theirs = [0u8; 32];
    raw.read_exact(&mut theirs).unwrap();
    let me = raw.local_addr().unwrap();
    let mut refusals = 0;
    let mut closed = false;
    for salt in 0u64..64 {
        let probe = if salt % 4 == 3 {
            Frame::Write {
                id: salt as u32,
                key: salt << 40,
                offset: 0,
                len: 4,
            }
        } else {
            Frame::ReadReq {
                id: salt as u32,
                key: salt << 40,
                offset: 0,
                len: 1 << 16,
            }
        };
        let sent = raw
            .write_all(probe.encode().as_bytes())
            .and_then(|()| match probe {
                Frame::Write { .. } => raw.write_all(b"PWND"),
                _ => Ok(()),
            });
        match sent.and_then(|()| answer(&mut raw)) {
            Ok((Frame::ReadResp { error, len, .. }, data)) => {
                assert_eq!(error, Some(RemoteAccessError::UnknownKey));
                assert_eq!((len, data.len()), (0, 0), "no byte of memory");
            }
            Ok((Frame::WriteAck { error, .. }, _)) => {
                assert_eq!(error, Some(RemoteAccessError::UnknownKey));
            }
            Ok((other, _)) => panic!("unexpected answer {other:?}"),
            Err(_) => {
                closed = true;
                break;
            }
        }
        refusals += 1;
    }
    assert!(
        closed,
        "the connection stayed open after {refusals} refusals"
    );
    assert!(refusals <= 8, "{refusals} refusals before the close");

    // The server goes on serving real clients.
    let again = scratch("probe-again");
    ok(&cp(
        &[
            &server.url("secret.txt"),
            again.join("got").to_str().unwrap(),
        ],
        &[],
    ));

    // It said who probed it.
    let mut server = server;
    let _ = server.child.kill();
    let _ = server.child.wait();
    let mut log = String::new();
    server
        .child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains(&format!("tcp://{me}"))),
        "no warning naming {me} in the server log:\n{log}"
    );
    let _ = std::fs::remove_dir_all(dst);
    let _ = std::fs::remove_dir_all(again);
}
