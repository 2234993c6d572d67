//! NBD over TLS (`NBD_OPT_STARTTLS`): the server's rustls configuration from a certificate
//! chain and key in PEM files, and [`TlsStream`], a TLS session over a connected socket
//! that a connection's workers share the way they share a clear socket (one reads while
//! others write replies).
//!
//! X.509 only: rustls has no TLS 1.3 external pre-shared keys (it uses PSKs for session
//! resumption alone), so nbd's `tls-psk` clients (`--tls-psk-file`) cannot connect; a
//! certificate the client trusts (libnbd's `tls-certificates` directory, its
//! `ca-cert.pem`) is the way in.

use std::io::{self, IoSlice, Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ServerConfig, ServerConnection};

use ferry_service::error::{Error, Kind, Result};

/// Bytes read from the socket at a time (a TLS record and its header fit).
const RECORD_READ: usize = 17 * 1024;

/// The server side of TLS for NBD: TLS 1.2 and 1.3 (gnutls clients speak both), the
/// certificate chain in `cert` (PEM, the server's first) and the key in `key` (PEM).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>> {
    let bad = |p: &Path, what: &str| {
        Error::new(Kind::Usage, format!("[block] TLS: {}: {what}", p.display()))
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad(cert, &e.to_string()))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(cert, &e.to_string()))?;
    if chain.is_empty() {
        return Err(bad(cert, "no certificate in it"));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(key, &e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::new(Kind::Usage, format!("[block] TLS setup: {e}")))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| bad(key, &format!("does not go with the certificate: {e}")))?;
    Ok(Arc::new(cfg))
}

/// A TLS session on a socket `S`, shared by the workers of one connection.
///
/// rustls keeps one state for both directions, so it sits under a lock that is held only
/// to feed it records read from the socket or to seal a reply, never across a socket read
/// or write: the worker whose turn it is to read waits on the socket with no lock held
/// while the others seal and send their replies. A second lock keeps sealed replies in
/// the order they were sealed on the socket.
#[derive(Debug)]
pub struct TlsStream<S> {
    sock: S,
    conn: Mutex<ServerConnection>,
    /// Held from sealing a reply until its records are on the socket.
    send: Mutex<()>,
    /// Records read from the socket, before they are fed to the session (taken by the
    /// one worker whose turn it is to read).
    inbox: Mutex<Inbox>,
}

/// Records read from the socket and not yet fed to the session: `bytes[at..end]`.
#[derive(Debug)]
struct Inbox {
    bytes: Vec<u8>,
    at: usize,
    end: usize,
}

impl<S> TlsStream<S>
where
    for<'a> &'a S: Read + Write,
{
    /// Runs the server side of a TLS handshake on `sock` (blocking, within the socket's
    /// timeouts).
    pub fn accept(sock: S, cfg: Arc<ServerConfig>) -> io::Result<TlsStream<S>> {
        let mut conn = ServerConnection::new(cfg).map_err(io::Error::other)?;
        // A whole reply (up to 32 MiB of read data) is sealed at once.
        conn.set_buffer_limit(None);
        let mut s = &sock;
        while conn.is_handshaking() {
            let (rd, wr) = conn.complete_io(&mut s)?;
            if rd == 0 && wr == 0 && conn.is_handshaking() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        while conn.wants_write() {
            conn.write_tls(&mut s)?;
        }
        Ok(TlsStream {
            sock,
            conn: Mutex::new(conn),
            send: Mutex::new(()),
            inbox: Mutex::new(Inbox {
                bytes: vec![0u8; RECORD_READ],
                at: 0,
                end: 0,
            }),
        })
    }

    /// The socket under the session.
    pub fn socket(&self) -> &S {
        &self.sock
    }

    /// Reads plaintext: what the session holds, or else records from the socket (with
    /// no session lock held while waiting for them). `Ok(0)` after the client's
    /// `close_notify`; an error when it closes without one.
    pub fn read_plain(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match lock(&self.conn).reader().read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return done,
            }
            let mut inbox = lock(&self.inbox);
            if inbox.at == inbox.end {
                let n = (&self.sock).read(&mut inbox.bytes)?;
                (inbox.at, inbox.end) = (0, n);
            }
            let answer = self.feed(&mut inbox)?;
            drop(inbox);
            if answer {
                // Something to answer (an alert, a key update): sent in order.
                self.send_sealed(&[])?;
            }
        }
    }

    /// Feeds the session records from `inbox` until it holds plaintext (a session takes
    /// no more than a record's worth of plaintext at a time: the rest waits in the inbox)
    /// or the inbox is empty (an empty inbox is the end of the socket); whether the
    /// session has something to send back.
    fn feed(&self, inbox: &mut Inbox) -> io::Result<bool> {
        let mut c = lock(&self.conn);
        let mut records = &inbox.bytes[inbox.at..inbox.end];
        loop {
            // Reading nothing tells the session the socket ended.
            c.read_tls(&mut records)?;
            let state = c.process_new_packets().map_err(io::Error::other)?;
            if records.is_empty() || state.plaintext_bytes_to_read() > 0 {
                break;
            }
        }
        inbox.at = inbox.end - records.len();
        Ok(c.wants_write())
    }

    /// Seals `bufs` and writes the records, in order with every other writer; returns the
    /// plaintext bytes taken (all of them).
    pub fn send_sealed(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let _order = lock(&self.send);
        let (records, n) = {
            let mut c = lock(&self.conn);
            let mut n = 0;
            for b in bufs {
                c.writer().write_all(b)?;
                n += b.len();
            }
            let mut records = Vec::with_capacity(n + n / 512 + 64);
            while c.wants_write() {
                c.write_tls(&mut records)?;
            }
            (records, n)
        };
        (&self.sock).write_all(&records)?;
        Ok(n)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
