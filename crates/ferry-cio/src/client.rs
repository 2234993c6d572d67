//! The Rust API: one rank's handle of a file on a ferry server, in MPI-IO's shape.
//!
//! Every rank of a job opens the file with the same job key, path and access mode, each
//! on a connection of its own ([`File::open`]); collective calls (`set_view`,
//! `write_at_all`, `read_at_all`, `set_size`, `preallocate`, `sync`, `close`) return once
//! every rank made them. A rank packs its memory buffer by its memory type and sends the
//! data stream; the server places it by the rank's view. In this slice the data moves in
//! EXS messages of the chunk the server chose (4 MiB by default), not yet by RMA from the
//! caller's memory. The MPI-IO interposer `libferry-mpiio.so` (crate ferry-mpiio and
//! `c/mpiio/`) wraps this API.
//!
//! ```no_run
//! use ferry_cio::{amode, Comm, File};
//! use ferry_dtype::Datatype;
//!
//! // Rank `rank` of 2 writes every other 4-byte int of a shared file.
//! # fn run(rank: u32) -> ferry_cio::Result<()> {
//! let comm = Comm { job: 42, rank, size: 2 };
//! let mut f = File::open("tcp://server:7370", "data/out.bin", comm, amode::CREATE | amode::WRONLY, "tok")?;
//! let int = Datatype::primitive(4)?;
//! let every_other = Datatype::resized(&int, 0, 8)?;
//! f.set_view(4 * i64::from(rank), &int, &every_other)?;
//! let mine: Vec<u8> = vec![rank as u8; 4 * 1000];
//! f.write_at_all(0, &mine, 1000, &int)?;
//! f.close()?;
//! # Ok(()) }
//! ```

use std::collections::HashSet;
use std::time::Duration;

use ferry_dtype::{Datatype, Packer, Unpacker};
use ferry_service::channel::Channel;
use ferry_service::secure::ClientSecurity;
use ferry_service::select::{self, Floor};

use crate::error::{CioError, ErrorClass, Result};
use crate::proto::{self, Desc, Msg, HEADER_LEN, MAX_CACHED_TYPES, MAX_CHUNK};

/// A rank's place in its job: the communicator of an MPI-IO open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Comm {
    /// The job key: the same on every rank of one open (rank 0 draws it and broadcasts
    /// it), different from other jobs opening the same path at the same time.
    pub job: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks in the communicator.
    pub size: u32,
}

/// How long a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a call may wait for its answer: a collective call waits for the slowest rank,
/// and the server bounds that wait itself (`[cio] collective_timeout`).
const CALL_TIMEOUT: Duration = Duration::from_secs(3600);

/// Receive buffers kept posted.
const RING: usize = 3;

/// One rank's open file.
pub struct File {
    ch: Channel,
    chunk: usize,
    /// Hashes of the datatype descriptions the server keeps for this connection.
    types: HashSet<[u8; 32]>,
    /// The file's size when it was opened.
    size_at_open: u64,
    /// The DATA frame a write packs into, kept from call to call (a fresh one of
    /// megabytes would be faulted in page by page on every call).
    frame: Vec<u8>,
    closed: bool,
}

impl File {
    /// Opens `path` (`root/relative/path`) on the `ferry serve` at `addr` (`tcp://h:p`,
    /// `ofi+tcp://h:p`, `ofi+shm://name`) as rank `comm.rank` of `comm.size`, with access
    /// mode `mode` ([`crate::amode`] bits) and `token`. Collective: returns once every
    /// rank opened the file.
    /// The server's identity is checked against the known-hosts file
    /// (`FERRY_KNOWN_HOSTS`, or `~/.config/ferry/known_hosts`), pinned on first use.
    pub fn open(addr: &str, path: &str, comm: Comm, mode: u32, token: &str) -> Result<File> {
        Self::open_with(addr, path, comm, mode, token, &ClientSecurity::default())
    }

    /// [`File::open`], with the server's identity checked as `sec` says (a pinned
    /// fingerprint, a CA file, another known-hosts file, or a clear connection).
    pub fn open_with(
        addr: &str,
        path: &str,
        comm: Comm,
        mode: u32,
        token: &str,
        sec: &ClientSecurity,
    ) -> Result<File> {
        let mut ch = Channel::connect_with(addr, CONNECT_TIMEOUT, sec)?;
        ch.post_ring(RING, HEADER_LEN + MAX_CHUNK as usize)?;
        ch.timeout = CALL_TIMEOUT;
        let selected = select::encode(&Floor::Select {
            service: crate::server::SERVICE.into(),
            token: None,
            proof: None,
            key: None,
        })
        .map_err(|e| CioError::conn(format!("encode SELECT: {e}")))?;
        ch.send_frame(&selected)?;
        send(
            &ch,
            &Msg::Open {
                major: proto::VERSION_MAJOR,
                minor: proto::VERSION_MINOR,
                job: comm.job,
                rank: comm.rank,
                size: comm.size,
                amode: mode,
                path: path.to_string(),
                token: token.to_string(),
            },
        )?;
        let mut answer = Vec::new();
        ch.recv_into(&mut answer)?;
        match select::decode(&answer) {
            Ok(Floor::Selected) => {}
            Ok(Floor::Services { hosted, .. }) => {
                return Err(CioError::new(
                    ErrorClass::Unsupported,
                    format!(
                    "the server at {addr} does not run collective I/O (service cio); it runs: {}",
                    hosted.join(", ")
                ),
                ))
            }
            Ok(Floor::Refused { message }) => {
                return Err(CioError::new(
                    ErrorClass::Access,
                    format!("{addr}: {message}"),
                ))
            }
            Ok(f) => return Err(CioError::conn(format!("{addr} answered {f:?} to SELECT"))),
            Err(e) => return Err(CioError::conn(format!("{addr} sent {e}"))),
        }
        match recv(&mut ch)? {
            Msg::Opened {
                major, chunk, size, ..
            } if major == proto::VERSION_MAJOR
                && (proto::MIN_CHUNK..=MAX_CHUNK).contains(&chunk) =>
            {
                Ok(File {
                    ch,
                    chunk: chunk as usize,
                    types: HashSet::new(),
                    size_at_open: size,
                    frame: Vec::new(),
                    closed: false,
                })
            }
            Msg::Error { class, message } => Err(CioError::new(class, message)),
            m => Err(CioError::conn(format!("expected OPENED, got {m:?}"))),
        }
    }

    /// The file's size when it was opened.
    pub fn size_at_open(&self) -> u64 {
        self.size_at_open
    }

    /// Collective: sets this rank's view: `disp` bytes into the file, offsets counting
    /// `etype`s, the data placed by `filetype` tiled from `disp`. A type sent before on
    /// this file travels as its hash.
    pub fn set_view(&mut self, disp: i64, etype: &Datatype, filetype: &Datatype) -> Result<()> {
        let etype = self.describe(etype);
        let filetype = self.describe(filetype);
        send(
            &self.ch,
            &Msg::SetView {
                disp,
                etype,
                filetype,
            },
        )?;
        self.done().map(|_| ())
    }

    /// Collective: writes `count` instances of `memtype` from `buf` (displacement 0 at
    /// `buf[0]`) at `offset` etypes of the view. Returns the bytes written.
    pub fn write_at_all(
        &mut self,
        offset: u64,
        buf: &[u8],
        count: u64,
        memtype: &Datatype,
    ) -> Result<u64> {
        self.write_at_all_origin(offset, buf, 0, count, memtype)
    }

    /// [`File::write_at_all`] with displacement 0 at `buf[origin]` (a memory type with a
    /// negative lower bound needs `origin > 0`).
    pub fn write_at_all_origin(
        &mut self,
        offset: u64,
        buf: &[u8],
        origin: usize,
        count: u64,
        memtype: &Datatype,
    ) -> Result<u64> {
        self.write(true, offset, buf, origin, count, memtype)
    }

    /// Independent: writes like [`File::write_at_all`], without waiting for other ranks.
    pub fn write_at(
        &mut self,
        offset: u64,
        buf: &[u8],
        count: u64,
        memtype: &Datatype,
    ) -> Result<u64> {
        self.write(false, offset, buf, 0, count, memtype)
    }

    /// [`File::write_at`] with displacement 0 at `buf[origin]`.
    pub fn write_at_origin(
        &mut self,
        offset: u64,
        buf: &[u8],
        origin: usize,
        count: u64,
        memtype: &Datatype,
    ) -> Result<u64> {
        self.write(false, offset, buf, origin, count, memtype)
    }

    /// Collective: reads `count` instances of `memtype` into `buf` (displacement 0 at
    /// `buf[0]`) from `offset` etypes of the view. Returns the bytes read: fewer than
    /// asked when the view reaches past the end of the file.
    pub fn read_at_all(
        &mut self,
        offset: u64,
        buf: &mut [u8],
        count: u64,
        memtype: &Datatype,
    ) -> Result<u64> {
        self.read(true, offset, buf, 0, count, memtype)
    }

    /// [`File::read_at_all`] with displacement 0 at `buf[origin]`.
    pub fn read_at_all_origin(
        &mut self,
        offset: u64,
        buf: &mut [u8],
        origin: usize,
        count: u64,
        memtype: &Datatype,
    ) -> Result<u64> {
        self.read(true, offset, buf, origin, count, memtype)
    }

    /// Independent: reads like [`File::read_at_all`], without waiting for other ranks.
    pub fn read_at(
        &mut self,
        offset: u64,
        buf: &mut [u8],
        count: u64,
        memtype: &Datatype,
    ) -> Result<u64> {
        self.read(false, offset, buf, 0, count, memtype)
    }

    /// [`File::read_at`] with displacement 0 at `buf[origin]`.
    pub fn read_at_origin(
        &mut self,
        offset: u64,
        buf: &mut [u8],
        origin: usize,
        count: u64,
        memtype: &Datatype,
    ) -> Result<u64> {
        self.read(false, offset, buf, origin, count, memtype)
    }

    /// Independent: the file's size now.
    pub fn size(&mut self) -> Result<u64> {
        send(&self.ch, &Msg::GetSize)?;
        match recv(&mut self.ch)? {
            Msg::Size(n) => Ok(n),
            Msg::Error { class, message } => Err(CioError::new(class, message)),
            m => Err(CioError::conn(format!("expected SIZE, got {m:?}"))),
        }
    }

    /// Collective: truncates or extends the file to `size` bytes (the same on every rank).
    pub fn set_size(&mut self, size: u64) -> Result<()> {
        send(&self.ch, &Msg::SetSize(size))?;
        self.done().map(|_| ())
    }

    /// Collective: allocates the first `size` bytes; the file grows to at least `size`.
    pub fn preallocate(&mut self, size: u64) -> Result<()> {
        send(&self.ch, &Msg::Preallocate(size))?;
        self.done().map(|_| ())
    }

    /// Collective: every rank's writes are durable and visible to every rank once it
    /// returns.
    pub fn sync(&mut self) -> Result<()> {
        send(&self.ch, &Msg::Sync)?;
        self.done().map(|_| ())
    }

    /// Collective: closes the file (durable, as after [`File::sync`]).
    pub fn close(mut self) -> Result<()> {
        self.closed = true;
        send(&self.ch, &Msg::Close)?;
        let r = self.done().map(|_| ());
        self.ch.close();
        r
    }

    /// A datatype for SET_VIEW: its hash if the server keeps it, else its description
    /// (which the server then keeps; both sides forget all when the cache would overflow).
    fn describe(&mut self, t: &Datatype) -> Desc {
        let bytes = t.encode();
        let h = *blake3::hash(&bytes).as_bytes();
        if self.types.contains(&h) {
            return Desc::Hash(h);
        }
        if self.types.len() >= MAX_CACHED_TYPES {
            self.types.clear();
        }
        self.types.insert(h);
        Desc::Inline(bytes)
    }

    fn write(
        &mut self,
        collective: bool,
        offset: u64,
        buf: &[u8],
        origin: usize,
        count: u64,
        memtype: &Datatype,
    ) -> Result<u64> {
        let mut p = Packer::new(memtype, count)?;
        // The layout is checked against the buffer before anything is sent.
        p.pack(buf, origin, 0, &mut [])?;
        let len = p.packed_size();
        let head = if collective {
            Msg::WriteAtAll { offset, len }
        } else {
            Msg::WriteAt { offset, len }
        };
        send(&self.ch, &head)?;
        let mut frame = std::mem::take(&mut self.frame);
        let mut pos = 0u64;
        while pos < len {
            let n = (len - pos).min(self.chunk as u64) as usize;
            frame.clear();
            frame.extend_from_slice(&data_header(n)?);
            frame.resize(HEADER_LEN + n, 0);
            p.pack(buf, origin, pos, &mut frame[HEADER_LEN..])?;
            self.ch.send_frame(&frame)?;
            pos += n as u64;
        }
        self.frame = frame;
        self.done()
    }

    fn read(
        &mut self,
        collective: bool,
        offset: u64,
        buf: &mut [u8],
        origin: usize,
        count: u64,
        memtype: &Datatype,
    ) -> Result<u64> {
        let mut u = Unpacker::new(memtype, count)?;
        u.unpack(buf, origin, 0, &[])?;
        let len = u.packed_size();
        let head = if collective {
            Msg::ReadAtAll { offset, len }
        } else {
            Msg::ReadAt { offset, len }
        };
        send(&self.ch, &head)?;
        let mut pos = 0u64;
        loop {
            let step = self.ch.recv_with(|bytes| -> Result<Step> {
                let (msg, payload) = decode(bytes)?;
                match msg {
                    Msg::Data { .. } => {
                        if payload.len() as u64 > len - pos {
                            return Err(CioError::conn("the server sent more data than asked"));
                        }
                        u.unpack(buf, origin, pos, payload)?;
                        Ok(Step::Data(payload.len() as u64))
                    }
                    Msg::Done(n) => Ok(Step::Done(n)),
                    Msg::Error { class, message } => Err(CioError::new(class, message)),
                    m => Err(CioError::conn(format!("expected DATA or DONE, got {m:?}"))),
                }
            })??;
            match step {
                Step::Data(n) => pos += n,
                Step::Done(n) if n == pos => return Ok(n),
                Step::Done(n) => {
                    return Err(CioError::conn(format!(
                        "the server said {n} bytes but sent {pos}"
                    )))
                }
            }
        }
    }

    /// The answer to a request answered DONE.
    fn done(&mut self) -> Result<u64> {
        match recv(&mut self.ch)? {
            Msg::Done(n) => Ok(n),
            Msg::Error { class, message } => Err(CioError::new(class, message)),
            m => Err(CioError::conn(format!("expected DONE, got {m:?}"))),
        }
    }
}

impl Drop for File {
    /// A file dropped without [`File::close`] ends its connection: the server counts the
    /// rank gone, and the other ranks' collective calls fail.
    fn drop(&mut self) {
        if !self.closed {
            self.ch.close();
        }
    }
}

/// One message of a read's answer.
enum Step {
    Data(u64),
    Done(u64),
}

fn data_header(n: usize) -> Result<[u8; HEADER_LEN]> {
    proto::data_header(n as u32).map_err(|e| CioError::conn(format!("encode DATA: {e}")))
}

fn decode(bytes: &[u8]) -> Result<(Msg, &[u8])> {
    proto::decode(bytes).map_err(|e| CioError::conn(format!("the server sent a bad frame: {e}")))
}

fn send(ch: &Channel, msg: &Msg) -> Result<()> {
    let bytes =
        proto::to_vec(msg).map_err(|e| CioError::new(ErrorClass::Arg, format!("encode: {e}")))?;
    Ok(ch.send_frame(&bytes)?)
}

fn recv(ch: &mut Channel) -> Result<Msg> {
    let mut v = Vec::new();
    ch.recv_into(&mut v)?;
    Ok(decode(&v)?.0)
}
