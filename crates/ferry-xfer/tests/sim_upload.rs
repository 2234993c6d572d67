//! Seeded two-sided simulation of uploads: the client's `Uploader` and the server's
//! `Receiver` (behind the request `Router`) talk through an in-memory wire of encoded
//! frames, over a simulated disk that keeps part files and their journals.
//!
//! What one seed throws at them: several files (empty ones, a block exactly, a block and a
//! byte, a few blocks with a tail), connections cut at a random step (frames in flight are
//! lost) and resumed from what the receiver journaled, payloads corrupted on the wire
//! (caught by the block CRC, sent again), a source corrupted before its CRC was computed
//! (caught only by the whole-file BLAKE3), a disk that is slow (its answers come late, so
//! cuts land while it works), full (a write fails) or failing at commit, a path another
//! connection holds, a source that cannot be read. Faults stop after a few attempts, so
//! every file must end up committed.
//!
//! Invariants: a committed file equals its source (nothing is committed unverified); every
//! file is committed in the end; over a wire that only corrupts, an upload fails only when
//! its blocks kept failing their CRC (bad blocks are sent again); a resumed PUT sends exactly the bytes past the journaled
//! prefix; every attempt ends within a bounded number of steps (no livelock, no deadlock).
//!
//! `FERRY_SIM_SEED=N` replays seed N alone; `FERRY_SIM_SEEDS=K` runs seeds 0..K (2,000 by
//! default).

use std::collections::{HashMap, VecDeque};

use ferry_xfer::conv::serve::{Route, Router};
use ferry_xfer::conv::upload::{Action, Event, PutJob, Receiver, RxAction, RxEvent, Uploader};
use ferry_xfer::journal::RangeSet;
use ferry_xfer::proto::{self, BlockHeader, ErrorCode, Msg};

/// SplitMix64: small, seedable, the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// True `per_mille` times in a thousand.
    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// Attempts (connections) with faults; later ones are clean.
const FAULTY_ATTEMPTS: u32 = 6;
/// Attempts after which a file that is still not committed is a failure.
const MAX_ATTEMPTS: u32 = FAULTY_ATTEMPTS + 8;
/// Steps one attempt may take.
const MAX_STEPS: u64 = 100_000;

/// What can go wrong during one attempt.
#[derive(Debug, Default)]
struct Faults {
    /// The connection is cut at this step.
    cut_at: Option<u64>,
    /// Per mille of BLOCK payloads corrupted on the wire.
    corrupt: u64,
    /// Per mille of blocks whose source bytes are corrupted before the CRC is computed.
    poisoned: u64,
    /// The n-th block landed fails to write (a full disk).
    write_fails_at: Option<u64>,
    /// Commits fail.
    commit_fails: bool,
    /// Another connection holds the path.
    busy: bool,
    /// The source cannot be read.
    read_fails: bool,
    /// The disk answers this many steps late at most.
    slow: u64,
}

impl Faults {
    /// Whether only the wire misbehaves (cuts, corrupted payloads, late disk answers): then a
    /// file fails only if its blocks kept failing their CRC.
    fn only_wire(&self) -> bool {
        self.poisoned == 0
            && self.write_fails_at.is_none()
            && !self.commit_fails
            && !self.busy
            && !self.read_fails
    }

    fn draw(rng: &mut Rng, attempt: u32) -> Faults {
        if attempt >= FAULTY_ATTEMPTS {
            return Faults::default();
        }
        Faults {
            cut_at: rng.chance(350).then(|| rng.below(400)),
            corrupt: if rng.chance(300) {
                30 + rng.below(200)
            } else {
                0
            },
            poisoned: if rng.chance(100) { 100 } else { 0 },
            write_fails_at: rng.chance(80).then(|| rng.below(20)),
            commit_fails: rng.chance(40),
            busy: rng.chance(40),
            read_fails: rng.chance(40),
            slow: if rng.chance(300) {
                1 + rng.below(30)
            } else {
                0
            },
        }
    }
}

/// A part file on the simulated disk.
struct Part {
    data: Vec<u8>,
    /// What the source was (size, mtime): a part of another is not resumed.
    ident: (u64, i64),
    /// Bytes written from blocks whose CRC was good.
    verified: RangeSet,
    /// The verified prefix as last journaled.
    journal: u64,
}

/// The server's disk: committed files and parts.
#[derive(Default)]
struct Disk {
    committed: HashMap<String, Vec<u8>>,
    parts: HashMap<String, Part>,
}

/// One source file.
struct Source {
    path: String,
    data: Vec<u8>,
    mtime: i64,
}

/// The server's side of one connection.
struct ServerSide {
    rx: Option<Receiver>,
    path: String,
    ident: (u64, i64),
    resume: bool,
    /// The BLOCK waiting to be landed: header, payload.
    block: Option<(BlockHeader, Vec<u8>)>,
    /// Blocks whose CRC failed since the last sync.
    bad: Vec<(u64, u32)>,
    write_error: Option<std::io::Error>,
    landed: u64,
    /// A disk action being worked on, done at this step.
    busy_until: Option<(u64, RxAction)>,
}

/// The client's side of one connection.
struct ClientSide {
    up: Option<Uploader>,
    file: usize,
    hasher: blake3::Hasher,
    /// READY's offset, once seen.
    ready_at: Option<u64>,
    /// Whether the first round's range went.
    first_sent: bool,
}

struct Sim {
    seed: u64,
    rng: Rng,
    block: u64,
    sources: Vec<Source>,
    disk: Disk,
    router: Router,
    /// Frames on the wire, each way.
    c2s: VecDeque<Vec<u8>>,
    s2c: VecDeque<Vec<u8>>,
    next_id: u32,
    /// Totals, for the summary.
    resumed: u64,
    cuts: u64,
    /// RESEND rounds, and refusals by code.
    resends: u64,
    refused: Vec<ErrorCode>,
}

/// How an attempt ended on the client side.
enum End {
    /// Every file is committed.
    AllDone,
    /// The connection ended (cut, or the client gave up after an error).
    Closed,
}

fn encode(m: &Msg) -> Vec<u8> {
    proto::to_vec(m).expect("the machines send encodable frames")
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = Rng(seed);
        let block = 16 + rng.below(240);
        let n = 1 + rng.below(6);
        let sources = (0..n)
            .map(|i| {
                let size = match rng.below(6) {
                    0 => 0,
                    1 => block,
                    2 => block + 1,
                    3 => 1 + rng.below(block),
                    _ => rng.below(8 * block),
                };
                Source {
                    path: format!("r/f{i}"),
                    data: (0..size).map(|_| rng.next() as u8).collect(),
                    mtime: 1_000 + i as i64,
                }
            })
            .collect();
        Sim {
            seed,
            rng,
            block,
            sources,
            disk: Disk::default(),
            router: Router {
                block: block as u32,
                ring: 4,
                mem: false,
            },
            c2s: VecDeque::new(),
            s2c: VecDeque::new(),
            next_id: 1,
            resumed: 0,
            cuts: 0,
            resends: 0,
            refused: Vec::new(),
        }
    }

    fn fail(&self, why: &str) -> ! {
        panic!(
            "seed {}: {why} (replay: FERRY_SIM_SEED={} cargo test -p ferry-xfer --test sim_upload)",
            self.seed, self.seed
        )
    }

    /// Runs attempts until every file is committed.
    fn run(&mut self) {
        for attempt in 0..MAX_ATTEMPTS {
            let faults = Faults::draw(&mut self.rng, attempt);
            if let End::AllDone = self.attempt(&faults, attempt > 0) {
                return self.check_end();
            }
        }
        self.fail("files still not committed after every attempt")
    }

    fn pending(&self) -> Option<usize> {
        self.sources
            .iter()
            .position(|s| self.disk.committed.get(&s.path) != Some(&s.data))
    }

    fn check_end(&self) {
        for s in &self.sources {
            match self.disk.committed.get(&s.path) {
                Some(d) if *d == s.data => {}
                _ => self.fail(&format!("{} not committed as sent", s.path)),
            }
        }
    }

    /// One connection: the client uploads the files not committed yet, in order.
    fn attempt(&mut self, f: &Faults, resume: bool) -> End {
        self.c2s.clear();
        self.s2c.clear();
        let mut server = ServerSide {
            rx: None,
            path: String::new(),
            ident: (0, 0),
            resume: false,
            block: None,
            bad: Vec::new(),
            write_error: None,
            landed: 0,
            busy_until: None,
        };
        let mut client = ClientSide {
            up: None,
            file: 0,
            hasher: blake3::Hasher::new(),
            ready_at: None,
            first_sent: false,
        };
        let mut closing = false;
        for step in 0..MAX_STEPS {
            if f.cut_at == Some(step) {
                self.cuts += 1;
                self.c2s.clear();
                self.s2c.clear();
                self.server_closed(&mut server, "the connection was cut");
                return End::Closed;
            }
            // Either side moves, at random; a closing client only lets its frames drain.
            let client_turn = !closing && self.rng.chance(500);
            if client_turn {
                match self.client_step(&mut client, f, resume) {
                    Some(End::AllDone) => return End::AllDone,
                    Some(End::Closed) => closing = true,
                    None => {}
                }
            } else {
                self.server_step(&mut server, f, step);
            }
            if closing && self.c2s.is_empty() && server.busy_until.is_none() {
                self.server_closed(&mut server, "the client closed the connection");
                return End::Closed;
            }
        }
        self.fail("an attempt did not end within its steps")
    }

    /// The client's next move: an action of its machine, or a frame for it.
    fn client_step(&mut self, c: &mut ClientSide, f: &Faults, resume: bool) -> Option<End> {
        if c.up.is_none() {
            let Some(i) = self.pending() else {
                return Some(End::AllDone);
            };
            let src = &self.sources[i];
            let id = self.next_id;
            self.next_id += 1;
            c.file = i;
            c.hasher = blake3::Hasher::new();
            (c.ready_at, c.first_sent) = (None, false);
            c.up = Some(Uploader::put(PutJob {
                file_id: id,
                flags: if resume { proto::PUT_RESUME } else { 0 },
                mode: 0o644,
                size: src.data.len() as u64,
                mtime: Some(src.mtime),
                path: src.path.clone(),
                hash: true,
                check_source: true,
            }));
        }
        let up = c.up.as_mut()?;
        let Some(action) = up.poll() else {
            let frame = self.s2c.pop_front()?;
            let m = match proto::decode(&frame) {
                Ok((m, _)) => m,
                Err(e) => self.fail(&format!("the server sent a bad frame: {e}")),
            };
            if let Msg::Ready { offset, .. } = m {
                c.ready_at = Some(offset);
            }
            up.handle(Event::Msg(m));
            return None;
        };
        let src = &self.sources[c.file];
        match action {
            Action::Send(m) => self.c2s.push_back(encode(&m)),
            Action::Resumed { offset, hash } => {
                self.resumed += offset;
                if hash {
                    c.hasher.update(&src.data[..offset as usize]);
                }
            }
            Action::SendRange { span, hash, resend } => {
                if !resend {
                    // A resumed PUT sends exactly what lies past the server's prefix.
                    let from = c.ready_at.unwrap_or(u64::MAX);
                    if c.first_sent
                        || span.offset != from
                        || span.offset + span.len != src.data.len() as u64
                    {
                        self.fail(&format!(
                            "{}: first round sends {}+{} after READY at {from} ({} bytes)",
                            src.path,
                            span.offset,
                            span.len,
                            src.data.len()
                        ));
                    }
                    c.first_sent = true;
                }
                if f.read_fails && !resend && span.len > 0 {
                    let e = ferry_xfer::XferError::io(
                        src.path.as_str(),
                        &std::io::Error::from_raw_os_error(5),
                    );
                    up.handle(Event::SendFailed(e));
                    return None;
                }
                let bytes =
                    src.data[span.offset as usize..(span.offset + span.len) as usize].to_vec();
                for (k, chunk) in bytes.chunks(self.block as usize).enumerate() {
                    let offset = span.offset + k as u64 * self.block;
                    let frame = self.block_frame(span.file_id, offset, chunk, f);
                    self.c2s.push_back(frame);
                }
                let digest = hash.then(|| {
                    c.hasher.update(&bytes);
                    *c.hasher.finalize().as_bytes()
                });
                up.handle(Event::Sent { digest });
            }
            Action::CheckSource => up.handle(Event::SourceChecked(Ok(()))),
            Action::Abandon(e) => {
                self.c2s.push_back(encode(&Msg::Error {
                    code: ErrorCode::Io,
                    file_id: up.file_id(),
                    message: e.msg,
                }));
                c.up = None;
                return Some(End::Closed);
            }
            Action::Fail(e) => {
                if f.only_wire() && !e.msg.contains("kept failing their CRC") {
                    self.fail(&format!(
                        "{}: failed over a lossy wire: {}",
                        src.path, e.msg
                    ));
                }
                c.up = None;
                return Some(End::Closed);
            }
            Action::Done => {
                if self.disk.committed.get(&src.path) != Some(&src.data) {
                    self.fail(&format!("{}: OK before the file was committed", src.path));
                }
                c.up = None;
            }
        }
        None
    }

    /// A BLOCK frame of `chunk`, perhaps corrupted before its CRC (poisoned) or after it.
    fn block_frame(&mut self, file_id: u32, offset: u64, chunk: &[u8], f: &Faults) -> Vec<u8> {
        let mut payload = chunk.to_vec();
        if !payload.is_empty() && self.rng.chance(f.poisoned) {
            let i = self.rng.below(payload.len() as u64) as usize;
            payload[i] ^= 0x40;
        }
        let h = BlockHeader {
            file_id,
            stream: 0,
            offset,
            len: payload.len() as u32,
            crc32c: crc32c::crc32c(&payload),
        };
        if !payload.is_empty() && self.rng.chance(f.corrupt) {
            let i = self.rng.below(payload.len() as u64) as usize;
            payload[i] ^= 0x01;
        }
        let mut frame = proto::encode_block_header(&h)
            .expect("a block header encodes")
            .to_vec();
        frame.extend_from_slice(&payload);
        frame
    }

    /// The server's next move: a disk action finishing, an action of its machine, or a frame.
    fn server_step(&mut self, s: &mut ServerSide, f: &Faults, step: u64) {
        if let Some((at, _)) = &s.busy_until {
            if *at > step {
                return;
            }
            if let Some((_, a)) = s.busy_until.take() {
                self.disk_done(s, f, a);
            }
            return;
        }
        let Some(rx) = s.rx.as_mut() else {
            return self.next_request(s);
        };
        let Some(action) = rx.poll() else {
            let Some(frame) = self.c2s.pop_front() else {
                return;
            };
            match proto::decode(&frame) {
                Ok((Msg::Block(h), payload)) => {
                    s.block = Some((h, payload.to_vec()));
                    rx.on_block(&h);
                }
                Ok((m, _)) => rx.handle(RxEvent::Msg(m)),
                Err(e) => self.fail(&format!("the client sent a bad frame: {e}")),
            }
            return;
        };
        match action {
            RxAction::Send(m) => {
                self.resends += u64::from(matches!(m, Msg::Resend { .. }));
                self.s2c.push_back(encode(&m))
            }
            RxAction::Claim => rx.handle(RxEvent::Claimed(!f.busy)),
            RxAction::OpenPart => {
                let prefix = self.open_part(s);
                if let Some(rx) = s.rx.as_mut() {
                    rx.handle(RxEvent::Opened(Ok(prefix)));
                }
            }
            RxAction::StartWriter => {
                s.bad.clear();
                s.write_error = None;
            }
            RxAction::Land => self.land(s, f),
            // The disk's answers may come late: the connection can be cut meanwhile.
            a @ (RxAction::Sync | RxAction::Finish | RxAction::Commit) => {
                let delay = self.rng.below(f.slow + 1);
                s.busy_until = Some((step + delay, a));
            }
            RxAction::Discard => {
                self.disk.parts.remove(&s.path);
            }
            RxAction::Refuse { refusal, abandon } => {
                if abandon {
                    self.disk.parts.remove(&s.path);
                }
                let id = rx.file_id();
                self.refused.push(refusal.code);
                self.s2c.push_back(encode(&Msg::Error {
                    code: refusal.code,
                    file_id: id,
                    message: refusal.message,
                }));
            }
            RxAction::Keep(_) => {
                self.journal(s);
                s.rx = None;
            }
            RxAction::Over => s.rx = None,
        }
    }

    /// A request between conversations: the router sends PUTs to a new receiver.
    fn next_request(&mut self, s: &mut ServerSide) {
        let Some(frame) = self.c2s.pop_front() else {
            return;
        };
        let msg = match proto::decode(&frame) {
            Ok((m, _)) => m,
            Err(e) => self.fail(&format!("the client sent a bad frame: {e}")),
        };
        match self.router.route(msg, false) {
            Route::Put(req, path) => {
                s.rx = Some(Receiver::put(req.file_id, req.size, req.mode, &path));
                s.ident = (req.size, req.mtime.unwrap_or(0));
                s.resume = req.resume;
                s.path = path;
            }
            // What is left of an abandoned conversation.
            Route::Unexpected(Msg::Block(_) | Msg::Error { .. } | Msg::FileDone { .. }) => {}
            r => self.fail(&format!("unexpected route {r:?}")),
        }
    }

    /// Opens the part: a journaled one of the same source is resumed (when asked), else
    /// the file starts over. The verified prefix.
    fn open_part(&mut self, s: &ServerSide) -> u64 {
        let (size, _) = s.ident;
        let keep = s.resume
            && self
                .disk
                .parts
                .get(&s.path)
                .is_some_and(|p| p.ident == s.ident);
        if !keep {
            self.disk.parts.insert(
                s.path.clone(),
                Part {
                    data: vec![0; size as usize],
                    ident: s.ident,
                    verified: RangeSet::new(),
                    journal: 0,
                },
            );
        }
        let part = self.disk.parts.get_mut(&s.path).expect("just opened");
        // What the journal does not vouch for is not trusted.
        let mut verified = RangeSet::new();
        if part.journal > 0 {
            verified.insert(0, part.journal);
        }
        part.verified = verified;
        part.journal
    }

    /// Lands the block fed in last: its CRC checked, written if good.
    fn land(&mut self, s: &mut ServerSide, f: &Faults) {
        let Some((h, payload)) = s.block.take() else {
            self.fail("Land without a block")
        };
        s.landed += 1;
        if crc32c::crc32c(&payload) != h.crc32c {
            s.bad.push((h.offset, h.len));
            return;
        }
        if f.write_fails_at == Some(s.landed) {
            s.write_error
                .get_or_insert(std::io::Error::from_raw_os_error(28));
            return;
        }
        let Some(part) = self.disk.parts.get_mut(&s.path) else {
            self.fail("a block landed without a part")
        };
        let at = h.offset as usize;
        part.data[at..at + payload.len()].copy_from_slice(&payload);
        part.verified.insert(h.offset, h.offset + u64::from(h.len));
    }

    /// A slow disk action is done: its answer.
    fn disk_done(&mut self, s: &mut ServerSide, f: &Faults, a: RxAction) {
        let ev = match a {
            RxAction::Sync => RxEvent::Synced(Ok(std::mem::take(&mut s.bad))),
            RxAction::Finish => {
                let write_error = s.write_error.take();
                let digest = match (&write_error, self.disk.parts.get(&s.path)) {
                    (None, Some(p)) => Some(Ok(*blake3::hash(&p.data).as_bytes())),
                    _ => None,
                };
                RxEvent::Finished {
                    write_error,
                    digest,
                }
            }
            RxAction::Commit => RxEvent::Committed(self.commit(s, f)),
            a => self.fail(&format!("{a:?} is not a disk action")),
        };
        if let Some(rx) = s.rx.as_mut() {
            rx.handle(ev);
        }
    }

    /// Renames the part into place; the simulation's own check that it is the source.
    fn commit(&mut self, s: &ServerSide, f: &Faults) -> std::io::Result<()> {
        let Some(part) = self.disk.parts.remove(&s.path) else {
            self.fail("a commit without a part")
        };
        if f.commit_fails {
            return Err(std::io::Error::from_raw_os_error(5));
        }
        let src = self.sources.iter().find(|x| x.path == s.path);
        if src.map(|x| &x.data) != Some(&part.data) {
            self.fail(&format!(
                "{}: committed bytes differ from the source",
                s.path
            ));
        }
        self.disk.committed.insert(s.path.clone(), part.data);
        Ok(())
    }

    /// Journals the verified prefix of the part being received (a connection that ends
    /// mid-transfer).
    fn journal(&mut self, s: &ServerSide) {
        if let Some(p) = self.disk.parts.get_mut(&s.path) {
            p.journal = p.verified.prefix();
        }
    }

    /// The connection ended under the server: a conversation in progress journals.
    fn server_closed(&mut self, s: &mut ServerSide, why: &str) {
        if let Some((_, a)) = s.busy_until.take() {
            // The disk finishes what it was doing; the answer goes nowhere.
            let f = Faults::default();
            self.disk_done(s, &f, a);
        }
        let Some(mut rx) = s.rx.take() else {
            return;
        };
        rx.handle(RxEvent::Interrupted(ferry_xfer::XferError::conn(why)));
        while let Some(a) = rx.poll() {
            match a {
                RxAction::Keep(_) => self.journal(s),
                RxAction::Discard | RxAction::Refuse { abandon: true, .. } => {
                    self.disk.parts.remove(&s.path);
                }
                _ => {}
            }
        }
    }
}

fn seeds() -> Vec<u64> {
    if let Some(s) = std::env::var("FERRY_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return vec![s];
    }
    let n = std::env::var("FERRY_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    (0..n).collect()
}

#[test]
fn uploads_survive_cuts_corruption_and_failing_disks() {
    let (mut resumed, mut cuts, mut files, mut resends) = (0, 0, 0, 0);
    let mut refused: Vec<ErrorCode> = Vec::new();
    for seed in seeds() {
        let mut sim = Sim::new(seed);
        sim.run();
        resumed += sim.resumed;
        cuts += sim.cuts;
        resends += sim.resends;
        files += sim.sources.len();
        refused.extend(sim.refused);
    }
    eprintln!(
        "{files} files committed through {cuts} cuts, {resends} RESEND rounds, \
         {resumed} bytes resumed, {} refusals",
        refused.len()
    );
    if seeds().len() > 100 {
        // The faults reached the machines: else the simulation proves little.
        assert!(resumed > 0 && cuts > 0 && resends > 0, "faults never hit");
        for code in [
            ErrorCode::Integrity,
            ErrorCode::NoSpace,
            ErrorCode::Io,
            ErrorCode::Unavailable,
        ] {
            assert!(refused.contains(&code), "no refusal with {code:?}");
        }
    }
}
