//! The Rust API: one rank's handle of a file on a ferry server, in MPI-IO's shape.
//!
//! Every rank of a job opens the file with the same job key, path and access mode, each
//! on a connection of its own ([`File::open`]); collective calls (`set_view`,
//! `write_at_all`, `read_at_all`, `set_size`, `preallocate`, `sync`, `close`) return once
//! every rank made them — but for writes while [`Pipeline`] is on (the default): a write
//! then returns once its data is handed to the connection, and its answer is collected
//! later; and for reads while the read cache is on (off by default, [`File::set_read_cache`]):
//! a read of data this rank read since its last sync point is served locally, and any other
//! read, collective or not, is fetched by this rank alone. A rank
//! packs its memory buffer by its memory type and sends the data stream; the server
//! places it by the rank's view. In this slice the data moves in EXS messages of the
//! chunk the server chose (4 MiB by default), not yet by RMA from the caller's memory.
//! The MPI-IO interposer `libferry-mpiio.so` (crate ferry-mpiio and `c/mpiio/`) wraps
//! this API.
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

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use ferry_dtype::{Datatype, Packer, Unpacker};
use ferry_service::channel::Channel;
use ferry_service::secure::ClientSecurity;
use ferry_service::select::{self, Floor};

use crate::error::{CioError, ErrorClass, Result};
use crate::proto::{self, Desc, Msg, HEADER_LEN, MAX_CACHED_TYPES, MAX_CHUNK, MAX_INLINE};
use crate::readcache::{read_cache_from_env, ReadCache};

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

/// The environment variable that sets [`Pipeline`] for every file a process opens
/// (`off`, `on`, `CALLS` or `CALLS,BYTES`); the interposer's hint `ferry_pipeline` takes
/// the same values for one file.
pub const PIPELINE_ENV: &str = "FERRY_CIO_PIPELINE";

/// The environment variable that sets the largest write sent inline (its data in the
/// request's own frame) for every file a process opens: a byte count, at most
/// [`MAX_INLINE`] (larger values are taken as it), `0` or `off` for never; unset:
/// [`MAX_INLINE`]. See [`File::set_inline`].
pub const INLINE_ENV: &str = "FERRY_CIO_INLINE";

/// The setting of [`INLINE_ENV`] ([`MAX_INLINE`] when unset).
fn inline_from_env() -> Result<usize> {
    match std::env::var(INLINE_ENV) {
        Ok(v) => parse_inline(&v),
        Err(std::env::VarError::NotPresent) => Ok(MAX_INLINE),
        Err(e) => Err(CioError::new(ErrorClass::Arg, format!("{INLINE_ENV}: {e}"))),
    }
}

/// Parses an [`INLINE_ENV`] value: a byte count (capped at [`MAX_INLINE`]), `on` or `off`.
fn parse_inline(v: &str) -> Result<usize> {
    match v.trim() {
        "off" => Ok(0),
        "on" => Ok(MAX_INLINE),
        n => n
            .parse::<u64>()
            .map(|n| n.min(MAX_INLINE as u64) as usize)
            .map_err(|_| {
                CioError::new(
                    ErrorClass::Arg,
                    format!("{INLINE_ENV} {v:?}: a byte count (at most {MAX_INLINE}), on or off"),
                )
            }),
    }
}

/// The largest write sent inline to a server of minor version `server_minor` that chose
/// `chunk`, with the client's setting `wanted`: 0 (never) for a server older than 1.2,
/// which knows only the request-then-DATA form; never more than a chunk, so an inline
/// write is never a larger message than the DATA frames the server expects.
pub(crate) fn inline_limit(server_minor: u16, wanted: usize, chunk: usize) -> usize {
    if server_minor < proto::MINOR_INLINE {
        return 0;
    }
    wanted.min(chunk).min(MAX_INLINE)
}

/// Client-side write pipelining: a write returns once its data is handed to the
/// connection, and its answer is collected later.
///
/// At most `calls` writes and `bytes` bytes of data stream are outstanding (a single write
/// larger than `bytes` goes alone); a call that needs an answer (a read, `size`,
/// `set_view`, `set_size`, `preallocate`, `sync`, `close`) first collects every
/// outstanding answer, in order. The first error of a deferred write is returned by the
/// next call that learns of it, at the latest by the next call that needs an answer;
/// that call still does what it was asked (a collective call must reach the server from
/// every rank, whatever each rank has learned). See `docs/cio.md`, "Write pipelining".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pipeline {
    /// The most writes outstanding (0: none; every write waits for its answer).
    pub calls: usize,
    /// The most data-stream bytes outstanding.
    pub bytes: u64,
}

impl Pipeline {
    /// Every write waits for its answer.
    pub const OFF: Pipeline = Pipeline { calls: 0, bytes: 0 };

    /// What `on` means, and the default: 16 writes and 8 MiB. Sixteen small calls hide
    /// the round trip of each (and the wait for the other ranks), while the server keeps
    /// at most sixteen small answers queued for a rank that is not reading them and an
    /// error surfaces within sixteen calls; beyond a few MiB a write's time is its
    /// bandwidth, not its round trip, so two 4 MiB chunks in flight are enough, and every
    /// byte in flight is a copy the client holds until it is sent.
    pub const ON: Pipeline = Pipeline {
        calls: 16,
        bytes: 8 << 20,
    };

    /// Parses `off` / `0`, `on`, `CALLS` (with [`Pipeline::ON`]'s bytes) or
    /// `CALLS,BYTES`.
    pub fn parse(s: &str) -> Result<Pipeline> {
        let bad = || {
            CioError::new(
                ErrorClass::Arg,
                format!("write pipelining {s:?}: off, on, CALLS or CALLS,BYTES (say 16,8388608)"),
            )
        };
        let s = s.trim();
        match s {
            "off" | "0" => return Ok(Pipeline::OFF),
            "on" => return Ok(Pipeline::ON),
            _ => {}
        }
        let (calls, bytes) = match s.split_once(',') {
            Some((c, b)) => (c.trim(), Some(b.trim())),
            None => (s, None),
        };
        let calls: usize = calls.parse().map_err(|_| bad())?;
        let bytes = match bytes {
            Some(b) => b.parse().map_err(|_| bad())?,
            None => Pipeline::ON.bytes,
        };
        if calls > 0 && bytes == 0 {
            return Err(bad());
        }
        Ok(Pipeline { calls, bytes })
    }

    /// The setting of [`PIPELINE_ENV`] ([`Pipeline::ON`] when unset).
    pub fn from_env() -> Result<Pipeline> {
        match std::env::var(PIPELINE_ENV) {
            Ok(v) => Pipeline::parse(&v)
                .map_err(|e| CioError::new(e.class, format!("{PIPELINE_ENV}: {}", e.message))),
            Err(std::env::VarError::NotPresent) => Ok(Pipeline::ON),
            Err(e) => Err(CioError::new(
                ErrorClass::Arg,
                format!("{PIPELINE_ENV}: {e}"),
            )),
        }
    }

    fn on(&self) -> bool {
        self.calls > 0
    }
}

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
    /// How many writes may be outstanding.
    pipeline: Pipeline,
    /// The data-stream bytes of each write sent and not yet answered, oldest first.
    outstanding: VecDeque<u64>,
    /// The first error of a deferred write not yet returned, and how many deferred writes
    /// failed after it.
    deferred: Option<(CioError, u64)>,
    /// Reads answered since the last sync point.
    cache: ReadCache,
    /// The server's minor version (OPENED's).
    server_minor: u16,
    /// The largest write the caller wants sent inline ([`File::set_inline`]).
    inline: usize,
    /// The current view as the read cache knows it: the hash of its displacement and
    /// type descriptions and its etype's size; None after a failed `set_view` (the
    /// server's view is then not known, and reads bypass the cache).
    view: Option<([u8; 32], u64)>,
}

impl File {
    /// Opens `path` (`root/relative/path`) on the `ferry serve` at `addr` (`tcp://h:p`,
    /// `ofi+tcp://h:p`, `ofi+shm://name`) as rank `comm.rank` of `comm.size`, with access
    /// mode `mode` ([`crate::amode`] bits) and `token`. Collective: returns once every
    /// rank opened the file.
    /// The server's identity is checked against the known-hosts file
    /// (`FERRY_KNOWN_HOSTS`, or `~/.config/ferry/known_hosts`), pinned on first use.
    ///
    /// Writes are pipelined as [`PIPELINE_ENV`] says (on when unset; [`File::set_pipeline`]),
    /// and reads cached as [`crate::READ_CACHE_ENV`] says (off when unset;
    /// [`File::set_read_cache`]).
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
        let pipeline = Pipeline::from_env()?;
        let cache = read_cache_from_env()?;
        let inline = inline_from_env()?;
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
                major,
                minor,
                chunk,
                size,
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
                    pipeline,
                    outstanding: VecDeque::new(),
                    deferred: None,
                    cache: ReadCache::new(cache),
                    server_minor: minor,
                    inline,
                    view: Some(([0; 32], 1)),
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

    /// Sets how many writes may be outstanding from now on, after collecting the answers
    /// of those outstanding (an error among them is returned by the next call, as
    /// always; `Err` here only if the connection broke).
    pub fn set_pipeline(&mut self, pipeline: Pipeline) -> Result<()> {
        let r = self.settle();
        self.pipeline = pipeline;
        r
    }

    /// How many writes may be outstanding.
    pub fn pipeline(&self) -> Pipeline {
        self.pipeline
    }

    /// Sets the largest write (bytes of data stream) sent inline from now on: its data in
    /// the request's own frame, one message instead of two. 0: never; at most
    /// [`MAX_INLINE`] and the server's chunk; a server older than protocol 1.2 never gets
    /// one. The default is [`INLINE_ENV`]'s setting.
    pub fn set_inline(&mut self, bytes: usize) {
        self.inline = bytes;
    }

    /// The largest write this file sends inline (0: none; always 0 on a server older than
    /// protocol 1.2).
    pub fn inline(&self) -> usize {
        inline_limit(self.server_minor, self.inline, self.chunk)
    }

    /// The server's protocol minor version.
    pub fn server_minor(&self) -> u16 {
        self.server_minor
    }

    /// Collective: sets this rank's view: `disp` bytes into the file, offsets counting
    /// `etype`s, the data placed by `filetype` tiled from `disp`. A type sent before on
    /// this file travels as its hash.
    pub fn set_view(&mut self, disp: i64, etype: &Datatype, filetype: &Datatype) -> Result<()> {
        self.settled(|f| f.set_view_now(disp, etype, filetype))
    }

    fn set_view_now(&mut self, disp: i64, etype: &Datatype, filetype: &Datatype) -> Result<()> {
        let esize = etype.size();
        let (etype, eh) = self.describe(etype);
        let (filetype, fh) = self.describe(filetype);
        let mut key = blake3::Hasher::new();
        key.update(&disp.to_le_bytes());
        key.update(&eh);
        key.update(&fh);
        // Unknown until the server answers: a failed SET_VIEW may leave either view.
        self.view = None;
        send(
            &self.ch,
            &Msg::SetView {
                disp,
                etype,
                filetype,
            },
        )?;
        self.done()?;
        self.view = Some((*key.finalize().as_bytes(), esize));
        Ok(())
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

    /// Independent: the file's size now (after this rank's outstanding writes).
    pub fn size(&mut self) -> Result<u64> {
        self.settled(|f| {
            send(&f.ch, &Msg::GetSize)?;
            match recv(&mut f.ch)? {
                Msg::Size(n) => Ok(n),
                Msg::Error { class, message } => Err(CioError::new(class, message)),
                m => Err(CioError::conn(format!("expected SIZE, got {m:?}"))),
            }
        })
    }

    /// Collective: truncates or extends the file to `size` bytes (the same on every rank).
    pub fn set_size(&mut self, size: u64) -> Result<()> {
        self.cache.clear();
        self.answered(&Msg::SetSize(size))
    }

    /// Collective: allocates the first `size` bytes; the file grows to at least `size`.
    pub fn preallocate(&mut self, size: u64) -> Result<()> {
        self.cache.clear();
        self.answered(&Msg::Preallocate(size))
    }

    /// Collective: every rank's writes are durable and visible to every rank once it
    /// returns. With write pipelining, it returns the first error of this rank's
    /// deferred writes not yet returned.
    pub fn sync(&mut self) -> Result<()> {
        self.cache.clear();
        self.answered(&Msg::Sync)
    }

    /// Collective: closes the file (durable, as after [`File::sync`]), returning the
    /// first error of a deferred write not yet returned, if any.
    pub fn close(mut self) -> Result<()> {
        self.cache.clear();
        let r = self.answered(&Msg::Close);
        self.closed = true;
        self.ch.close();
        r
    }

    /// Sends `msg`, a request answered DONE, once every outstanding write is answered.
    fn answered(&mut self, msg: &Msg) -> Result<()> {
        self.settled(|f| {
            send(&f.ch, msg)?;
            f.done().map(|_| ())
        })
    }

    /// Runs `call` once every outstanding write is answered; the first deferred error
    /// wins over the call's own result (which its message then carries), and the call
    /// runs even so: every rank's collective call must reach the server. A broken
    /// connection stops before the call.
    fn settled<T>(&mut self, call: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        if let Err(e) = self.settle() {
            return self.with_deferred(Err(e));
        }
        let r = call(self);
        self.with_deferred(r)
    }

    /// Collects the answers of every outstanding write, oldest first; `Err` only when the
    /// connection broke (a write's failure is kept as deferred).
    fn settle(&mut self) -> Result<()> {
        while !self.outstanding.is_empty() {
            self.collect(true)?;
        }
        Ok(())
    }

    /// Collects the oldest outstanding write's answer, waiting for it if `wait`, else only
    /// if it already arrived. Whether one was collected.
    fn collect(&mut self, wait: bool) -> Result<bool> {
        let Some(&len) = self.outstanding.front() else {
            return Ok(false);
        };
        let mut v = Vec::new();
        if wait {
            self.ch.recv_into(&mut v)?;
        } else if !self.ch.recv_within(&mut v, Duration::ZERO)? {
            return Ok(false);
        }
        self.outstanding.pop_front();
        match decode(&v)?.0 {
            Msg::Done(n) if n == len => {}
            Msg::Done(n) => {
                return Err(CioError::conn(format!(
                    "the server answered {n} bytes to a write of {len}"
                )))
            }
            Msg::Error { class, message } => self.defer(CioError::new(
                class,
                format!("an earlier write, returned before its answer, failed: {message}"),
            )),
            m => return Err(CioError::conn(format!("expected DONE, got {m:?}"))),
        }
        Ok(true)
    }

    /// Keeps a deferred write's error: the first one is returned, later ones counted.
    fn defer(&mut self, e: CioError) {
        match &mut self.deferred {
            Some((_, more)) => *more += 1,
            None => self.deferred = Some((e, 0)),
        }
    }

    /// `r`, unless a deferred error waits: then that error (and `r`'s, if `r` failed too,
    /// in its message).
    fn with_deferred<T>(&mut self, r: Result<T>) -> Result<T> {
        let Some((mut e, more)) = self.deferred.take() else {
            return r;
        };
        if more > 0 {
            e.message += &format!(" ({more} later deferred writes failed too)");
        }
        if let Err(own) = r {
            e.message += &format!("; then this call failed too: {own}");
        }
        Err(e)
    }

    /// A datatype for SET_VIEW: its hash if the server keeps it, else its description
    /// (which the server then keeps; both sides forget all when the cache would overflow).
    /// Also its hash.
    fn describe(&mut self, t: &Datatype) -> (Desc, [u8; 32]) {
        let bytes = t.encode();
        let h = *blake3::hash(&bytes).as_bytes();
        if self.types.contains(&h) {
            return (Desc::Hash(h), h);
        }
        if self.types.len() >= MAX_CACHED_TYPES {
            self.types.clear();
        }
        self.types.insert(h);
        (Desc::Inline(bytes), h)
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
        // A read after this rank's own write must see it: what was read before is
        // forgotten (every rank makes a collective write, so every rank forgets).
        self.cache.clear();
        let len = p.packed_size();
        if self.pipeline.on() {
            self.make_room(len)?;
        }
        let mut frame = std::mem::take(&mut self.frame);
        let sent = match u32::try_from(len) {
            Ok(n) if n as usize <= self.inline() => {
                self.send_inline(collective, offset, &mut p, buf, origin, n, &mut frame)
            }
            _ => self.send_stream(collective, offset, &mut p, buf, origin, len, &mut frame),
        };
        self.frame = frame;
        sent?;
        if !self.pipeline.on() {
            let r = self.done();
            return self.with_deferred(r);
        }
        self.outstanding.push_back(len);
        self.with_deferred(Ok(len))
    }

    /// Sends a write of `len` bytes as one frame: the request with its data.
    #[allow(clippy::too_many_arguments)]
    fn send_inline(
        &self,
        collective: bool,
        offset: u64,
        p: &mut Packer,
        buf: &[u8],
        origin: usize,
        len: u32,
        frame: &mut Vec<u8>,
    ) -> Result<()> {
        let head = if collective {
            Msg::WriteAtAllInline { offset, len }
        } else {
            Msg::WriteAtInline { offset, len }
        };
        frame.clear();
        proto::encode(&head, frame)
            .map_err(|e| CioError::new(ErrorClass::Arg, format!("encode: {e}")))?;
        let at = frame.len();
        frame.resize(at + len as usize, 0);
        p.pack(buf, origin, 0, &mut frame[at..])?;
        Ok(self.ch.send_frame(frame)?)
    }

    /// Sends a write of `len` bytes as its request, then DATA frames of a chunk.
    #[allow(clippy::too_many_arguments)]
    fn send_stream(
        &self,
        collective: bool,
        offset: u64,
        p: &mut Packer,
        buf: &[u8],
        origin: usize,
        len: u64,
        frame: &mut Vec<u8>,
    ) -> Result<()> {
        let head = if collective {
            Msg::WriteAtAll { offset, len }
        } else {
            Msg::WriteAt { offset, len }
        };
        send(&self.ch, &head)?;
        let mut pos = 0u64;
        while pos < len {
            let n = (len - pos).min(self.chunk as u64) as usize;
            frame.clear();
            frame.extend_from_slice(&data_header(n)?);
            frame.resize(HEADER_LEN + n, 0);
            p.pack(buf, origin, pos, &mut frame[HEADER_LEN..])?;
            self.ch.send_frame(frame)?;
            pos += n as u64;
        }
        Ok(())
    }

    /// Before a pipelined write of `len` bytes: collects the answers that already arrived,
    /// then waits for the oldest until the write fits the pipeline's bounds (a write
    /// larger than the byte bound goes alone).
    fn make_room(&mut self, len: u64) -> Result<()> {
        while self.collect(false)? {}
        while !self.outstanding.is_empty()
            && (self.outstanding.len() >= self.pipeline.calls
                || self.outstanding.iter().sum::<u64>().saturating_add(len) > self.pipeline.bytes)
        {
            self.collect(true)?;
        }
        Ok(())
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
        if self.cache.limit() == 0 {
            return self
                .settled(|f| f.read_now(collective, offset, buf, origin, count, memtype, None));
        }
        let mut u = Unpacker::new(memtype, count)?;
        u.unpack(buf, origin, 0, &[])?;
        let len = u.packed_size();
        if len == 0 {
            return self.with_deferred(Ok(0));
        }
        // Where the window starts in the view's data stream (None: bypass the cache; the
        // server judges the call).
        let at = self
            .view
            .and_then(|(key, esize)| Some((key, offset.checked_mul(esize)?)));
        if let Some((key, start)) = at {
            if let Some(bytes) = self.cache.lookup(&key, start, len) {
                u.unpack(buf, origin, 0, bytes)?;
                let n = bytes.len() as u64;
                return self.with_deferred(Ok(n));
            }
        }
        // A miss is fetched on its own, even in a collective read: the other ranks may all
        // hit, and a collective request would wait for them.
        let keep = at.filter(|_| self.cache.keeps(len));
        self.settled(|f| {
            let mut stream = keep.map(|_| Vec::with_capacity(len as usize));
            let n = f.read_now(false, offset, buf, origin, count, memtype, stream.as_mut())?;
            if let (Some((key, start)), Some(data)) = (keep, stream) {
                f.cache.insert(key, start, len, data);
            }
            Ok(n)
        })
    }

    /// Sets the read cache's size for this file (0: off), forgetting what it held; see
    /// `docs/cio.md`, "Read cache". Every rank of the file must use the same setting
    /// (with it on, a collective read's miss is fetched by an independent request).
    pub fn set_read_cache(&mut self, bytes: u64) {
        self.cache.set_limit(bytes);
    }

    /// The read cache's size (0: off).
    pub fn read_cache(&self) -> u64 {
        self.cache.limit()
    }

    /// Reads from the server, appending the data stream to `keep` if given.
    #[allow(clippy::too_many_arguments)]
    fn read_now(
        &mut self,
        collective: bool,
        offset: u64,
        buf: &mut [u8],
        origin: usize,
        count: u64,
        memtype: &Datatype,
        mut keep: Option<&mut Vec<u8>>,
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
                        if let Some(k) = keep.as_deref_mut() {
                            k.extend_from_slice(payload);
                        }
                        Ok(Step::Data(payload.len() as u64))
                    }
                    Msg::Done(n) => Ok(Step::Done(n)),
                    // The whole answer in one frame (a server of 1.2 or later).
                    Msg::DataDone { .. } => {
                        if pos != 0 || payload.len() as u64 > len {
                            return Err(CioError::conn(
                                "the server sent DATA_DONE after DATA, or more data than asked",
                            ));
                        }
                        u.unpack(buf, origin, 0, payload)?;
                        if let Some(k) = keep.as_deref_mut() {
                            k.extend_from_slice(payload);
                        }
                        Ok(Step::Whole(payload.len() as u64))
                    }
                    Msg::Error { class, message } => Err(CioError::new(class, message)),
                    m => Err(CioError::conn(format!("expected DATA or DONE, got {m:?}"))),
                }
            })??;
            match step {
                Step::Data(n) => pos += n,
                Step::Whole(n) => return Ok(n),
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
    /// DATA_DONE: the whole answer, of this many bytes.
    Whole(u64),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A server older than 1.2 never gets an inline write, whatever the setting; a newer
    /// one gets writes up to the setting, the chunk and the protocol's limit.
    #[test]
    fn inline_only_to_a_server_that_takes_it() {
        for minor in [0, 1] {
            assert_eq!(inline_limit(minor, MAX_INLINE, 1 << 20), 0);
            assert_eq!(inline_limit(minor, 100, 1 << 20), 0);
        }
        assert_eq!(inline_limit(2, MAX_INLINE, 1 << 20), MAX_INLINE);
        assert_eq!(inline_limit(3, MAX_INLINE, 1 << 20), MAX_INLINE);
        assert_eq!(inline_limit(2, 0, 1 << 20), 0);
        assert_eq!(inline_limit(2, 100, 1 << 20), 100);
        assert_eq!(inline_limit(2, MAX_INLINE, 4096), 4096);
        assert_eq!(inline_limit(2, usize::MAX, 1 << 20), MAX_INLINE);
    }

    #[test]
    fn the_inline_setting_parses() {
        assert_eq!(parse_inline("off").unwrap(), 0);
        assert_eq!(parse_inline("0").unwrap(), 0);
        assert_eq!(parse_inline("on").unwrap(), MAX_INLINE);
        assert_eq!(parse_inline(" 4096 ").unwrap(), 4096);
        assert_eq!(parse_inline("99999999999").unwrap(), MAX_INLINE);
        for bad in ["", "yes", "-1", "4k"] {
            let e = parse_inline(bad).unwrap_err();
            assert_eq!(e.class, ErrorClass::Arg, "{bad:?}");
            assert!(e.message.contains(INLINE_ENV), "{bad:?}: {e}");
        }
    }
}
