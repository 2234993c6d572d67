//! The download conversation simulated: a [`Downloader`] and a [`Responder`] with in-memory
//! runtimes (sources, part files and their journals as byte vectors) over a [`Wire`].
//!
//! A copy of many files runs in sessions. A session is one connection with a fault plan
//! drawn from the seed; when it ends in an error, the next session resumes the files not
//! yet committed from what the client journaled (a connection failure keeps the verified
//! prefixes, as `ferry cp --retries` does; any other failure discards the parts). Once the
//! fault budget is spent, sessions run clean, so every seed must end with every file
//! committed. Checked throughout: a committed file's bytes equal its source's; no file is
//! committed before its blocks checked good and its whole hash was compared; a session
//! fails only with an error one of its injected faults explains; a session makes progress
//! (a bounded number of steps).

use std::collections::{BTreeMap, VecDeque};

use ferry_xfer::conv::download::{
    Action, Downloader, Job, Landing, Reply, Responder, Settings, Source,
};
use ferry_xfer::proto::{BlockHeader, ErrorCode, Msg, MINOR_FILE, VERSION_MINOR};
use ferry_xfer::server::Refusal;
use ferry_xfer::{Kind, XferError};
use rand::rngs::StdRng;
use rand::Rng;

use crate::sim::{rng, Dir, Faults, Wire};

/// A frame on the simulated wire: a message and the data it carries (BLOCK and FILE).
#[derive(Debug, Clone)]
pub struct Frame {
    pub msg: Msg,
    pub payload: Vec<u8>,
}

impl Frame {
    fn control(msg: Msg) -> Frame {
        Frame {
            msg,
            payload: Vec::new(),
        }
    }
}

/// How a simulated copy is set up.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The sources.
    pub files: Vec<Vec<u8>>,
    /// Which files go to the null sink (memory mode: checked, not written or committed).
    pub null: Vec<bool>,
    /// Files fetched in chunks of this many bytes, as parallel streams share a large file
    /// (ranged GETs, the first after a SUM; the file is checked and committed once all its
    /// chunks are in and the source's hash came).
    pub chunk: Vec<Option<u64>>,
    /// The block size (small, so that files have many blocks).
    pub block: u32,
    /// The server's protocol minor (FILE frames and GETS from 1.3).
    pub minor: u16,
    /// The client's GET window.
    pub window: usize,
    /// Sessions that may have faults; the ones after run clean.
    pub faulty_sessions: u32,
}

impl Setup {
    /// A copy drawn from `rng`: zero-length, one-byte, block-sized and odd-sized files, a
    /// few or many.
    pub fn draw(rng: &mut StdRng) -> Setup {
        let block = *[16u32, 64, 100, 256]
            .get(rng.random_range(0..4))
            .unwrap_or(&64);
        let count = if rng.random_bool(0.2) {
            rng.random_range(40..120)
        } else {
            rng.random_range(1..12)
        };
        let b = block as usize;
        let files = (0..count)
            .map(|_| {
                let size = match rng.random_range(0..6) {
                    0 => 0,
                    1 => 1,
                    2 => b * rng.random_range(1..4),
                    3 => b * rng.random_range(1..4) + if rng.random_bool(0.5) { 1 } else { b - 1 },
                    _ => rng.random_range(0..6 * b),
                };
                (0..size).map(|_| rng.random()).collect()
            })
            .collect::<Vec<Vec<u8>>>();
        let nulls = rng.random_bool(0.3);
        let null: Vec<bool> = files
            .iter()
            .map(|_| nulls && rng.random_bool(0.3))
            .collect();
        let chunks = rng.random_bool(0.3);
        let chunk = files
            .iter()
            .zip(&null)
            .map(|(f, null)| {
                let split = chunks && !null && f.len() > 2 * b && rng.random_bool(0.5);
                split.then(|| rng.random_range(1..=f.len() as u64 / 2))
            })
            .collect();
        Setup {
            files,
            null,
            chunk,
            block,
            minor: if rng.random_bool(0.75) {
                VERSION_MINOR
            } else {
                MINOR_FILE - 1
            },
            window: rng.random_range(1..40),
            faulty_sessions: rng.random_range(0..6),
        }
    }
}

fn path_of(index: usize) -> String {
    format!("root/dir/f{index}")
}

fn index_of(path: &str) -> Option<usize> {
    path.strip_prefix("root/dir/f")?.parse().ok()
}

/// What the client keeps of a file between sessions: its part and the verified prefix its
/// journal records.
#[derive(Debug, Clone)]
struct Journaled {
    data: Vec<u8>,
    held: u64,
}

/// A part file being written in one session.
#[derive(Debug)]
struct Part {
    index: usize,
    /// Lands in the null sink.
    null: bool,
    /// The chunk `lo..hi` of a shared file it is, if one.
    chunk: Option<(u64, u64)>,
    /// Opened at READY.
    data: Option<Vec<u8>>,
    /// Bytes known good, from the start (what the journal would record).
    good: Vec<bool>,
    /// Ranges whose check failed since the last [`Action::Check`].
    bad: Vec<(u64, u32)>,
    io_error: bool,
    /// Its blocks were checked good and its hash reported since the last write.
    checked: bool,
    hashed: bool,
}

impl Part {
    fn prefix(&self) -> u64 {
        self.good.iter().take_while(|g| **g).count() as u64
    }

    /// Writes a block that passed its check (unless the disk fails).
    fn write(&mut self, offset: u64, payload: &[u8], disk_fails: bool) -> Result<(), String> {
        let Some(data) = &mut self.data else {
            return Err("a block before READY reached the writer".into());
        };
        let (at, end) = (offset as usize, offset as usize + payload.len());
        if end > data.len() {
            return Err(format!(
                "a block past the end: {at}..{end} of {}",
                data.len()
            ));
        }
        self.checked = false;
        self.hashed = false;
        if let Some((lo, hi)) = self.chunk {
            if (offset as usize) < lo as usize || end > hi as usize {
                return Err(format!(
                    "a block at {at}..{end} outside the chunk {lo}..{hi}"
                ));
            }
        }
        // The null sink writes nothing, so no write of it fails (nor, here, of a chunk).
        if disk_fails && !self.null && self.chunk.is_none() {
            self.io_error = true;
            return Ok(());
        }
        data[at..end].copy_from_slice(payload);
        self.good[at..end].iter_mut().for_each(|g| *g = true);
        Ok(())
    }
}

/// The outcome of one session.
#[derive(Debug)]
enum Ended {
    /// Every job done.
    Done,
    /// The conversation (or its runtime) failed with this error.
    Failed(XferError),
}

/// The faults that struck in a session, to tell an expected failure from a bug.
#[derive(Debug, Default)]
struct Struck {
    cut: bool,
    corrupted: bool,
    disk: bool,
    read: bool,
}

/// A simulated copy.
pub struct Sim {
    rng: StdRng,
    setup: Setup,
    /// Committed files.
    committed: BTreeMap<usize, Vec<u8>>,
    /// Parts kept for a resume.
    journal: BTreeMap<usize, Journaled>,
    /// Sessions so far.
    pub sessions: u32,
    /// What the copy went through.
    pub seen: Seen,
}

/// What happened over a copy's sessions, to show the faults were met.
#[derive(Debug, Default, Clone, Copy)]
pub struct Seen {
    /// Steps taken.
    pub steps: u64,
    /// Connections cut.
    pub cuts: u64,
    /// Files started from a journaled prefix.
    pub resumed: u64,
    /// Ranges fetched again after a failed check.
    pub refetched: u64,
    /// Files failed by blocks that kept failing (then copied again).
    pub exhausted: u64,
    /// Sessions failed by a disk write or a source read.
    pub io_failures: u64,
    /// Messages delivered before the one ahead of them.
    pub reordered: u64,
    /// Checks and hashes that completed late.
    pub slow: u64,
    /// Chunks of shared files started.
    pub chunks: u64,
}

impl std::ops::AddAssign for Seen {
    fn add_assign(&mut self, o: Seen) {
        self.steps += o.steps;
        self.cuts += o.cuts;
        self.resumed += o.resumed;
        self.refetched += o.refetched;
        self.exhausted += o.exhausted;
        self.io_failures += o.io_failures;
        self.reordered += o.reordered;
        self.slow += o.slow;
        self.chunks += o.chunks;
    }
}

/// Steps one session may take before it counts as stuck.
const MAX_STEPS: u64 = 200_000;
/// Sessions a copy may take (faulty ones, then clean ones, which must finish it).
const MAX_SESSIONS: u32 = 20;

impl Sim {
    /// A copy drawn from `seed`.
    pub fn new(seed: u64) -> Sim {
        let mut rng = rng(seed);
        let setup = Setup::draw(&mut rng);
        Sim::with(rng, setup)
    }

    /// A copy of `setup`, choices from `rng`.
    pub fn with(rng: StdRng, setup: Setup) -> Sim {
        Sim {
            rng,
            setup,
            committed: BTreeMap::new(),
            journal: BTreeMap::new(),
            sessions: 0,
            seen: Seen::default(),
        }
    }

    /// Runs sessions until every file is committed; checks the invariants.
    pub fn run(&mut self) -> Result<(), String> {
        while self.committed.len() < self.setup.files.len() {
            if self.sessions >= MAX_SESSIONS {
                return Err(format!(
                    "{} of {} files committed after {MAX_SESSIONS} sessions",
                    self.committed.len(),
                    self.setup.files.len()
                ));
            }
            let faults = if self.sessions < self.setup.faulty_sessions {
                Faults::draw(&mut self.rng)
            } else {
                Faults::none()
            };
            self.sessions += 1;
            let mut s = Session::new(self, faults);
            let (ended, struck) = s.run()?;
            let parts = std::mem::take(&mut s.parts);
            let (resent, reordered) = (s.conv.resent(), s.wire.reordered);
            self.seen.refetched += resent;
            self.seen.reordered += reordered;
            match ended {
                Ended::Done => {
                    if !parts.is_empty() {
                        return Err(format!(
                            "{} parts left open by a finished session",
                            parts.len()
                        ));
                    }
                }
                Ended::Failed(e) => {
                    explained(&e, &struck)?;
                    match e.kind {
                        Kind::Connection => self.seen.cuts += 1,
                        Kind::Integrity => self.seen.exhausted += 1,
                        _ => self.seen.io_failures += 1,
                    }
                    self.leave(parts, e.kind == Kind::Connection);
                }
            }
        }
        for (i, src) in self.setup.files.iter().enumerate() {
            if self.committed.get(&i) != Some(src) {
                return Err(format!(
                    "file {i} committed with other bytes than its source's"
                ));
            }
        }
        Ok(())
    }

    /// After a failed session: a connection failure journals each part's verified prefix
    /// (perhaps less: checkpoints lag), any other failure discards the parts.
    fn leave(&mut self, parts: BTreeMap<u32, Part>, keep: bool) {
        for part in parts.into_values() {
            let index = part.index;
            let (Some(data), true) = (part.data.clone(), keep) else {
                self.journal.remove(&index);
                continue;
            };
            let prefix = part.prefix();
            let held = if self.rng.random_bool(0.3) {
                self.rng.random_range(0..=prefix)
            } else {
                prefix
            };
            self.journal.insert(index, Journaled { data, held });
        }
    }
}

/// Whether a session's error is one its faults explain.
fn explained(e: &XferError, struck: &Struck) -> Result<(), String> {
    let ok = match e.kind {
        Kind::Connection => struck.cut,
        // Blocks that kept failing their CRC (not a whole-file hash that differs).
        Kind::Integrity => struck.corrupted && e.msg.contains("kept failing their CRC"),
        Kind::Io => struck.disk || struck.read,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the session failed with {e} ({:?}); faults that struck: {struck:?}",
            e.kind
        ))
    }
}

/// One connection's worth of a copy.
struct Session<'a> {
    sim: &'a mut Sim,
    wire: Wire<Frame>,
    conv: Downloader,
    server: Server,
    /// Files and chunks to start, in order.
    todo: VecDeque<Work>,
    /// Files fetched in chunks, by index.
    shared: BTreeMap<usize, Shared>,
    /// Parts in flight, by transfer id.
    parts: BTreeMap<u32, Part>,
    next_id: u32,
    /// Disk work that completes later (a slow disk).
    slow: VecDeque<Action>,
    struck: Struck,
}

impl<'a> Session<'a> {
    fn new(sim: &'a mut Sim, faults: Faults) -> Session<'a> {
        let setup = &sim.setup;
        let conv = Downloader::new(Settings {
            minor: setup.minor,
            window: setup.window,
            refill: setup.window - setup.window / 2,
            frame: ferry_xfer::proto::MAX_CONTROL,
            chunks_ahead: 2,
            retries: ferry_xfer::BLOCK_RETRIES,
        });
        let server = Server::new(setup);
        let todo = (0..setup.files.len())
            .filter(|i| !sim.committed.contains_key(i))
            .flat_map(|i| Work::of(setup, i))
            .collect();
        Session {
            sim,
            wire: Wire::new(faults),
            conv,
            server,
            todo,
            shared: BTreeMap::new(),
            parts: BTreeMap::new(),
            next_id: 1,
            slow: VecDeque::new(),
            struck: Struck::default(),
        }
    }

    fn run(&mut self) -> Result<(Ended, Struck), String> {
        let ended = match self.converse() {
            Ok(ended) => ended,
            Err(Broken::Conv(e)) => Ended::Failed(e),
            Err(Broken::Sim(why)) => return Err(why),
        };
        Ok((ended, std::mem::take(&mut self.struck)))
    }

    fn converse(&mut self) -> Result<Ended, Broken> {
        let mut steps = 0u64;
        loop {
            self.refill();
            self.execute()?;
            if self.conv.is_idle() && self.todo.is_empty() && self.slow.is_empty() {
                return Ok(Ended::Done);
            }
            steps += 1;
            self.sim.seen.steps += 1;
            if steps > MAX_STEPS {
                return Err(Broken::Sim(format!("no end after {MAX_STEPS} steps")));
            }
            let rng = &mut self.sim.rng;
            let up = self.wire.pending(Dir::Up);
            let down = self.wire.pending(Dir::Down);
            let slow = self.slow.len();
            let total = up + down + slow;
            if self.wire.is_cut() {
                self.struck.cut = true;
                return Err(Broken::Conv(XferError::conn("simulated connection cut")));
            }
            if total == 0 {
                return Err(Broken::Sim(format!(
                    "stuck: nothing on the wire or the disk, {} files in flight, {} to start, {:?}",
                    self.conv.in_flight(),
                    self.todo.len(),
                    self.conv
                )));
            }
            let pick = rng.random_range(0..total);
            if pick < up {
                let Some(f) = self.wire.deliver(Dir::Up, rng, |_, _| false) else {
                    continue;
                };
                self.server
                    .request(f.msg, &mut self.wire, rng, &mut self.struck);
            } else if pick < up + down {
                let Some(f) = self.wire.deliver(Dir::Down, rng, same_get_blocks) else {
                    continue;
                };
                self.receive(f)?;
            } else if let Some(a) = self.slow.pop_front() {
                self.sim.seen.slow += 1;
                self.disk(a)?;
            }
            // What the step asked for is done before any refill (as in the runtime).
            self.execute()?;
        }
    }

    /// Starts files while the conversation has room (as the client's runtime does).
    fn refill(&mut self) {
        if self.conv.refill_open() {
            while self.conv.has_room() {
                let Some(work) = self.todo.pop_front() else {
                    break;
                };
                let index = match work {
                    Work::File(index) => index,
                    Work::Chunk { index, lo, hi } => {
                        self.start_chunk(index, lo, hi);
                        continue;
                    }
                };
                let file = self.next_id;
                self.next_id += 1;
                let size = self.sim.setup.files[index].len() as u64;
                let null = self.sim.setup.null[index];
                let kept = self.sim.journal.remove(&index).filter(|_| !null);
                let held = kept.as_ref().map_or(0, |j| j.held);
                self.sim.seen.resumed += u64::from(held > 0);
                let mut part = Part {
                    index,
                    null,
                    chunk: None,
                    data: None,
                    good: vec![false; size as usize],
                    bad: Vec::new(),
                    io_error: false,
                    checked: false,
                    hashed: false,
                };
                if let Some(j) = kept {
                    part.good[..held as usize]
                        .iter_mut()
                        .for_each(|g| *g = true);
                    part.data = Some(j.data);
                }
                self.parts.insert(file, part);
                self.conv.start(Job {
                    file,
                    path: path_of(index),
                    landing: if null {
                        Landing::Null
                    } else {
                        Landing::Part { size, held }
                    },
                });
            }
        }
        self.conv.flush();
    }

    /// Starts the chunk `lo..hi` of file `index` (the first asks for the source's hash).
    fn start_chunk(&mut self, index: usize, lo: u64, hi: u64) {
        let file = self.next_id;
        self.next_id += 1;
        let size = self.sim.setup.files[index].len();
        self.sim.seen.chunks += 1;
        // Complete once all its chunks are in, not just those started so far.
        let chunks = Work::of(&self.sim.setup, index).len();
        self.shared.entry(index).or_insert_with(|| Shared {
            data: vec![0; size],
            left: chunks,
            hash: None,
        });
        self.parts.insert(
            file,
            Part {
                index,
                null: false,
                chunk: Some((lo, hi)),
                data: None,
                good: vec![false; size],
                bad: Vec::new(),
                io_error: false,
                checked: false,
                hashed: false,
            },
        );
        let sum = lo == 0;
        self.conv.start(Job {
            file,
            path: path_of(index),
            landing: Landing::Chunk { lo, hi, sum },
        });
    }

    /// A chunked file whose chunks are all in and whose source hash came: checked whole
    /// against that hash (as the parallel copy does) and committed.
    fn complete_shared(&mut self, index: usize) -> Result<(), Broken> {
        let Some(shared) = self.shared.get(&index) else {
            return Ok(());
        };
        let Some(hash) = shared.hash.filter(|_| shared.left == 0) else {
            return Ok(());
        };
        let data = shared.data.clone();
        self.shared.remove(&index);
        if *blake3::hash(&data).as_bytes() != hash || data != self.sim.setup.files[index] {
            return Err(Broken::Sim(format!(
                "chunked file {index} whole with bytes other than its source's"
            )));
        }
        if self.sim.committed.insert(index, data).is_some() {
            return Err(Broken::Sim(format!("file {index} committed twice")));
        }
        Ok(())
    }

    /// Takes one frame from the server, data written first (as the runtime does in place).
    fn receive(&mut self, f: Frame) -> Result<(), Broken> {
        let Frame { msg, mut payload } = f;
        let rng = &mut self.sim.rng;
        if !payload.is_empty() && Faults::strikes(rng, self.wire.faults.corrupt) {
            let at = rng.random_range(0..payload.len());
            payload[at] ^= 1 << rng.random_range(0..8);
            self.struck.corrupted = true;
        }
        let disk_fails = Faults::strikes(rng, self.wire.faults.disk_fail);
        self.struck.disk |= disk_fails;

        match msg {
            Msg::File {
                file_id,
                mode,
                crc32c: _,
                blake3,
                len,
            } => {
                if let Some((size, _)) = self.conv.ready(file_id, u64::from(len), mode)? {
                    self.open(file_id, size)?;
                }
                let part = self.part(file_id)?;
                if blake3::hash(&payload).as_bytes() == &blake3 {
                    part.write(0, &payload, disk_fails).map_err(Broken::Sim)?;
                } else {
                    part.bad.push((0, len));
                }
                let done = Msg::FileDone {
                    file_id,
                    length: u64::from(len),
                    blake3: Some(blake3),
                };
                Ok(self.conv.on_msg(done)?)
            }
            Msg::Block(h) => {
                let part = self
                    .parts
                    .get_mut(&h.file_id)
                    .filter(|p| p.data.is_some())
                    .ok_or_else(|| XferError::conn("BLOCK of no transfer in progress"))?;
                if crc32c::crc32c(&payload) == h.crc32c {
                    part.write(h.offset, &payload, disk_fails)
                        .map_err(Broken::Sim)?;
                } else {
                    part.bad.push((h.offset, h.len));
                }
                Ok(self.conv.on_msg(Msg::Block(h))?)
            }
            m => Ok(self.conv.on_msg(m)?),
        }
    }

    fn part(&mut self, file: u32) -> Result<&mut Part, Broken> {
        self.parts
            .get_mut(&file)
            .ok_or_else(|| Broken::Sim(format!("an action for transfer {file}, which has no part")))
    }

    /// Opens the writer of `file` at its READY: the journaled part, or a new one.
    fn open(&mut self, file: u32, size: u64) -> Result<(), Broken> {
        let part = self.part(file)?;
        if part.data.as_ref().is_some_and(|d| d.len() as u64 != size) {
            return Err(Broken::Sim("a resumed part of another size".into()));
        }
        part.data.get_or_insert_with(|| vec![0; size as usize]);
        Ok(())
    }

    /// Carries out the conversation's actions; disk work may be left for later.
    fn execute(&mut self) -> Result<(), Broken> {
        while let Some(a) = self.conv.poll() {
            match a {
                Action::Send(msg) => self.wire.send(Dir::Up, Frame::control(msg)),
                Action::Open { file, size, .. } => self.open(file, size)?,
                Action::Check { .. } | Action::Hash { .. }
                    if Faults::strikes(&mut self.sim.rng, self.wire.faults.slow_disk) =>
                {
                    self.slow.push_back(a)
                }
                a => self.disk(a)?,
            }
        }
        Ok(())
    }

    /// Disk work: checks, hashes, commits.
    fn disk(&mut self, a: Action) -> Result<(), Broken> {
        match a {
            Action::Check { file } => {
                let part = self.part(file)?;
                let bad = std::mem::take(&mut part.bad);
                part.checked = bad.is_empty();
                self.conv.checked(file, bad)?;
            }
            Action::Hash { file } => {
                let part = self.part(file)?;
                if !part.checked {
                    return Err(Broken::Sim(format!(
                        "transfer {file} hashed before its blocks checked good"
                    )));
                }
                if part.io_error {
                    return Err(Broken::Conv(XferError::new(
                        Kind::Io,
                        "simulated write error",
                    )));
                }
                let got = *blake3::hash(part.data.as_deref().unwrap_or_default()).as_bytes();
                part.hashed = true;
                self.conv.hashed(file, got)?;
            }
            Action::SourceHash { file, hash } => {
                let index = self.part(file)?.index;
                let shared = self.shared.get_mut(&index).ok_or_else(|| {
                    Broken::Sim(format!("the source hash of file {index}, not chunked"))
                })?;
                shared.hash = Some(hash);
                self.complete_shared(index)?;
            }
            Action::Finish { file, .. }
                if self.parts.get(&file).is_some_and(|p| p.chunk.is_some()) =>
            {
                let Some(Part {
                    index,
                    chunk: Some((lo, hi)),
                    checked,
                    data,
                    ..
                }) = self.parts.remove(&file)
                else {
                    return Err(Broken::Sim("a chunk vanished".into()));
                };
                if !checked {
                    return Err(Broken::Sim(format!(
                        "chunk {lo}..{hi} of file {index} finished unchecked"
                    )));
                }
                let (data, shared) = (data.unwrap_or_default(), self.shared.get_mut(&index));
                let (Some(shared), Some(range)) = (shared, data.get(lo as usize..hi as usize))
                else {
                    return Err(Broken::Sim(format!(
                        "chunk {lo}..{hi} of file {index} out of place"
                    )));
                };
                shared.data[lo as usize..hi as usize].copy_from_slice(range);
                shared.left -= 1;
                self.complete_shared(index)?;
            }
            Action::Commit { file, size, .. } | Action::Finish { file, size } => {
                let part = self
                    .parts
                    .remove(&file)
                    .ok_or_else(|| Broken::Sim(format!("commit of transfer {file}, no part")))?;
                if part.null != matches!(a, Action::Finish { .. }) || part.chunk.is_some() {
                    return Err(Broken::Sim(format!(
                        "{a:?} of file {} (null sink {})",
                        part.index, part.null
                    )));
                }
                // A null-sink file has no whole hash to compare: its blocks' checks are all.
                if !(part.checked && (part.hashed || part.null)) {
                    return Err(Broken::Sim(format!(
                        "file {} committed unverified (checked {}, hashed {})",
                        part.index, part.checked, part.hashed
                    )));
                }
                let data = part.data.unwrap_or_default();
                if data != self.sim.setup.files[part.index] || data.len() as u64 != size {
                    return Err(Broken::Sim(format!(
                        "file {} committed with bytes other than its source's",
                        part.index
                    )));
                }
                if self.sim.committed.insert(part.index, data).is_some() {
                    return Err(Broken::Sim(format!("file {} committed twice", part.index)));
                }
            }
            a => return Err(Broken::Sim(format!("unexpected action {a:?}"))),
        }
        Ok(())
    }
}

/// A file or a chunk of one to start.
#[derive(Debug, Clone, Copy)]
enum Work {
    File(usize),
    Chunk { index: usize, lo: u64, hi: u64 },
}

impl Work {
    /// What fetching file `index` takes: the file, or its chunks.
    fn of(setup: &Setup, index: usize) -> Vec<Work> {
        let Some(step) = setup.chunk[index] else {
            return vec![Work::File(index)];
        };
        let size = setup.files[index].len() as u64;
        (0..size)
            .step_by(step as usize)
            .map(|lo| Work::Chunk {
                index,
                lo,
                hi: (lo + step).min(size),
            })
            .collect()
    }
}

/// A file fetched in chunks: what landed of it, the chunks still out, the source's hash.
#[derive(Debug)]
struct Shared {
    data: Vec<u8>,
    left: usize,
    hash: Option<[u8; 32]>,
}

/// Why a session stopped early.
enum Broken {
    /// The conversation failed (an expected end if a fault explains it).
    Conv(XferError),
    /// The simulation caught the machine breaking a rule.
    Sim(String),
}

impl From<XferError> for Broken {
    fn from(e: XferError) -> Broken {
        Broken::Conv(e)
    }
}

/// The reordering the protocol allows: BLOCKs of one GET among themselves.
fn same_get_blocks(ahead: &Frame, it: &Frame) -> bool {
    matches!((&ahead.msg, &it.msg), (Msg::Block(a), Msg::Block(b)) if a.file_id == b.file_id)
}

/// The server's side: a [`Responder`] and a runtime reading the sources from memory.
struct Server {
    files: Vec<Vec<u8>>,
    block: u32,
    inline: bool,
}

impl Server {
    fn new(setup: &Setup) -> Server {
        Server {
            files: setup.files.clone(),
            block: setup.block,
            inline: setup.minor >= MINOR_FILE,
        }
    }

    fn source(&self, path: &str) -> Result<&[u8], Refusal> {
        index_of(path)
            .and_then(|i| self.files.get(i))
            .map(|f| f.as_slice())
            .ok_or_else(|| Refusal {
                code: ErrorCode::NotFound,
                message: format!("{path}: no such file"),
            })
    }

    /// Answers one request, whole (the server answers in order).
    fn request(&mut self, msg: Msg, wire: &mut Wire<Frame>, rng: &mut StdRng, struck: &mut Struck) {
        match msg {
            Msg::Gets { files } => {
                for (file_id, path) in files {
                    self.get(file_id, 0, u64::MAX, &path, wire, rng, struck);
                }
            }
            Msg::Get {
                file_id,
                offset,
                length,
                path,
            } => self.get(file_id, offset, length, &path, wire, rng, struck),
            Msg::Sum { path } => {
                let found = self
                    .source(&path)
                    .map(|d| (d.len() as u64, *blake3::hash(d).as_bytes()));
                let mut conv = Responder::new(self.inline, u64::from(self.block));
                conv.sum(found);
                while let Some(reply) = conv.poll() {
                    let Reply::Send(msg) = reply else {
                        panic!("a SUM answered by {reply:?}");
                    };
                    wire.send(Dir::Down, Frame::control(msg));
                }
            }
            m => panic!("the client sent an unexpected request {m:?}"),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn get(
        &mut self,
        file_id: u32,
        offset: u64,
        length: u64,
        path: &str,
        wire: &mut Wire<Frame>,
        rng: &mut StdRng,
        struck: &mut Struck,
    ) {
        let mut conv = Responder::new(self.inline, 3 * u64::from(self.block) + 1);
        let (source, data) = match self.source(path) {
            Ok(d) => {
                let size = d.len() as u64;
                let fits = size <= u64::from(self.block);
                let (mode, hash) = (0o644, true);
                (
                    Ok(Source {
                        size,
                        mode,
                        fits,
                        hash,
                        known: None,
                    }),
                    d.to_vec(),
                )
            }
            Err(r) => (Err(r), Vec::new()),
        };
        conv.get((file_id, offset, length), path, source);
        while let Some(reply) = conv.poll() {
            let read_fails = Faults::strikes(rng, wire.faults.read_fail);
            let sent = match reply {
                Reply::Send(msg) => {
                    wire.send(Dir::Down, Frame::control(msg));
                    continue;
                }
                _ if read_fails => {
                    struck.read = true;
                    Err(XferError::new(Kind::Io, "simulated read error"))
                }
                Reply::SendFile {
                    file_id,
                    size,
                    mode,
                    known,
                } => {
                    let payload = data[..size as usize].to_vec();
                    let msg = Msg::File {
                        file_id,
                        mode,
                        crc32c: crc32c::crc32c(&payload),
                        blake3: known.unwrap_or_else(|| *blake3::hash(&payload).as_bytes()),
                        len: size as u32,
                    };
                    wire.send(Dir::Down, Frame { msg, payload });
                    Ok(())
                }
                Reply::Read {
                    file_id,
                    offset,
                    len,
                } => {
                    let piece = &data[offset as usize..(offset + len) as usize];
                    for (i, chunk) in piece.chunks(self.block as usize).enumerate() {
                        if let Some(h) = conv.hasher() {
                            h.update(chunk);
                        }
                        let h = BlockHeader {
                            file_id,
                            stream: 0,
                            offset: offset + (i * self.block as usize) as u64,
                            len: chunk.len() as u32,
                            crc32c: crc32c::crc32c(chunk),
                            spans: false,
                        };
                        wire.send(
                            Dir::Down,
                            Frame {
                                msg: Msg::Block(h),
                                payload: chunk.to_vec(),
                            },
                        );
                    }
                    Ok(())
                }
            };
            match sent {
                Ok(()) => conv.sent(),
                Err(e) => conv.failed(e),
            }
        }
    }
}
