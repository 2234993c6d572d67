//! Admission: who gets in and what they may hold ([`LimitsConfig`]), for every service.
//!
//! A connection passes two gates. Accepted, it enters the handshake pool: at most
//! `max_handshakes` connections (and their threads) wait for their EXS handshake and ferry
//! HELLO at once, each for at most `handshake_timeout`. When the pool is full, a newcomer
//! takes the place of the oldest handshake of the address holding the most, so a flood of
//! connections that never finish their handshake costs a bounded number of threads and
//! cannot lock out a client that completes its handshake in less time than the flood takes
//! to cycle the pool; a newcomer from an address that holds `max_per_address` connections
//! takes the place of that address's oldest handshake. Authenticated, it takes a
//! connection slot (`max_connections` in all, `max_per_address` per address) and reserves
//! its staging memory from `memory_budget`, with a smaller ring or block if the full ones
//! no longer fit; without a slot or memory it is refused with a message.
//!
//! Failed tokens are counted per address: `auth_failures` failures lock the address out
//! for `auth_backoff`, during which its tokens are refused unchecked, with the same
//! answer a wrong token gets.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::auth::Principal;
use crate::error::{refuse, Denial, Error, Kind, Refusal, Result};

/// What a wrong token (and a locked-out address) is told.
const TOKEN_REFUSED: &str =
    "the token was not accepted: check --token / FERRY_TOKEN against the server's [auth] tokens";

/// The smallest ring a connection is given when memory is short.
const MIN_RING: usize = 2;
/// The smallest block a connection is given when memory is short.
const MIN_BLOCK: u32 = 256 << 10;
/// Addresses whose failed tokens are remembered at most (a table an attacker with many
/// addresses cannot grow without bound).
const MAX_TRACKED: usize = 65_536;
/// At most one line a second per kind of refusal, so the log is no lever for a flood.
const LOG_EVERY: Duration = Duration::from_secs(1);
/// At most one line per address this often for its failed authentications (the next says
/// how many were held back), so a thousand wrong tokens make a few lines, not a thousand.
pub const AUTH_LOG_EVERY: Duration = Duration::from_secs(10);

/// What one server lets its clients use (`[limits]`): connections, handshakes, idle time,
/// staging memory, failed token attempts. See `docs/xfer.md`, "Limits".
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Authenticated connections at once (every stream of a `-p N` copy is one).
    pub max_connections: usize,
    /// Authenticated connections at once from one client address (IP; every ofi+shm peer
    /// is one local address); a newcomer from an address that holds this many connections,
    /// handshakes included, takes the place of that address's oldest handshake.
    pub max_per_address: usize,
    /// Connections in their handshake (accepted, not yet authenticated) at once. A newer one
    /// past the limit replaces the oldest of the address that holds the most.
    pub max_handshakes: usize,
    /// Seconds from accepting a connection to its accepted HELLO; a slower one is closed.
    pub handshake_timeout: f64,
    /// Seconds a session may stay silent between requests (while one of its streams works
    /// on a request, the others are not idle), and a transfer may make no progress.
    pub idle_timeout: f64,
    /// Bytes of staging memory (receive rings, send rings, block copies) every connection
    /// together may hold. `None`: a quarter of the host's physical memory.
    pub memory_budget: Option<u64>,
    /// Failed token attempts from one address before its attempts are refused unchecked.
    pub auth_failures: u32,
    /// Seconds a lock-out lasts; failures older than this are forgotten.
    pub auth_backoff: f64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_connections: 256,
            max_per_address: 32,
            max_handshakes: 32,
            handshake_timeout: 5.0,
            idle_timeout: 120.0,
            memory_budget: None,
            auth_failures: 5,
            auth_backoff: 60.0,
        }
    }
}

impl LimitsConfig {
    /// [`LimitsConfig::handshake_timeout`] as a duration.
    pub fn handshake(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.handshake_timeout)
    }

    /// [`LimitsConfig::idle_timeout`] as a duration.
    pub fn idle(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.idle_timeout)
    }

    /// [`LimitsConfig::auth_backoff`] as a duration.
    pub fn backoff(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.auth_backoff)
    }

    /// The memory budget in bytes: the configured one, or a quarter of physical memory
    /// (1 GiB if `/proc/meminfo` cannot say).
    pub fn budget(&self) -> u64 {
        self.memory_budget
            .unwrap_or_else(|| physical_memory().map_or(1 << 30, |m| m / 4))
    }

    /// Checks every limit is in its range; a usage error names the first that is not.
    pub fn validate(&self) -> Result<()> {
        let usage = |m: String| Err(Error::new(Kind::Usage, m));
        for (name, v) in [
            ("max_connections", self.max_connections),
            ("max_per_address", self.max_per_address),
            ("max_handshakes", self.max_handshakes),
        ] {
            if !(1..=1_000_000).contains(&v) {
                return usage(format!("[limits] {name} = {v}: give 1 to 1000000"));
            }
        }
        for (name, v) in [
            ("handshake_timeout", self.handshake_timeout),
            ("idle_timeout", self.idle_timeout),
            ("auth_backoff", self.auth_backoff),
        ] {
            if !(0.01..=1e6).contains(&v) {
                return usage(format!(
                    "[limits] {name} = {v}: give seconds from 0.01 to 1000000"
                ));
            }
        }
        if self.auth_failures == 0 {
            return usage("[limits] auth_failures = 0: give at least 1".into());
        }
        Ok(())
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Bytes of staging memory a connection with `ring` blocks of `block` bytes may hold.
pub type StagingCost = fn(ring: usize, block: u32) -> u64;

/// A log line that goes out at most once per `LOG_EVERY` (a second); lines held back
/// meanwhile are counted, and the next one that goes out says how many.
#[derive(Default)]
pub struct LogGate(Mutex<(Option<Instant>, u64)>);

impl LogGate {
    /// `Some(held back since the last line)` if a line may go out now.
    pub fn pass(&self) -> Option<u64> {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (last, held) = &mut *g;
        if last.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            *held += 1;
            return None;
        }
        *last = Some(Instant::now());
        Some(std::mem::take(held))
    }
}

/// " (N more like it in the last second)" for a gate's count, or nothing.
pub fn more(held: u64) -> String {
    if held == 0 {
        String::new()
    } else {
        format!(" ({held} more like it since the last such line)")
    }
}

/// How far a handshake got: the further, the later it is called off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// The EXS handshake runs (a flood that only opens connections stays here).
    Exs,
    /// EXS is open; the ferry HELLO is awaited.
    Hello,
    /// The HELLO arrived and is being checked: never called off.
    Checking,
}

/// A connection in its handshake.
struct Pending {
    id: u64,
    addr: String,
    stage: Stage,
    cancel: Arc<AtomicBool>,
}

/// Failed token attempts of one address.
struct Failures {
    count: u32,
    since: Instant,
    locked_until: Option<Instant>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// Handshakes still running, oldest first (an evicted one leaves at once).
    pending: Vec<Pending>,
    /// Handshake threads alive, evicted ones included until they end.
    threads: usize,
    /// Authenticated connections.
    authed: usize,
    /// Per address: authenticated connections and handshakes (evicted ones excluded).
    per_addr: HashMap<String, Count>,
    /// Staging memory reserved, bytes.
    memory: u64,
    failures: HashMap<String, Failures>,
}

/// An address's connections.
#[derive(Default, Clone, Copy)]
struct Count {
    authed: usize,
    pending: usize,
}

impl State {
    fn count(&self, addr: &str) -> Count {
        self.per_addr.get(addr).copied().unwrap_or_default()
    }

    /// Applies `f` to `addr`'s count, forgetting the address when nothing is left.
    fn update(&mut self, addr: &str, f: impl FnOnce(&mut Count)) {
        let c = self.per_addr.entry(addr.to_string()).or_default();
        f(c);
        if c.authed == 0 && c.pending == 0 {
            self.per_addr.remove(addr);
        }
    }

    /// Calls off a handshake: of those least far along, the oldest of `addr` (if `None`:
    /// of the address holding the most, the oldest among those on a tie); returns its
    /// address, `None` if none can be.
    fn evict(&mut self, addr: Option<&str>) -> Option<String> {
        let candidate = |p: &Pending| addr.is_none_or(|a| p.addr == a);
        let stage = self
            .pending
            .iter()
            .filter(|p| candidate(p) && p.stage < Stage::Checking)
            .map(|p| p.stage)
            .min()?;
        let victims = || {
            self.pending
                .iter()
                .enumerate()
                .filter(|(_, p)| candidate(p) && p.stage == stage)
        };
        let busiest = victims().map(|(_, p)| self.count(&p.addr).pending).max()?;
        let i = victims()
            .find(|(_, p)| self.count(&p.addr).pending == busiest)
            .map(|(i, _)| i)?;
        let p = self.pending.remove(i);
        p.cancel.store(true, Ordering::Release);
        self.update(&p.addr, |c| c.pending -= 1);
        Some(p.addr)
    }
}

/// The server's admission state (see the module documentation).
pub struct Admission {
    limits: LimitsConfig,
    /// Bytes of staging memory a connection's ring and block cost.
    cost: StagingCost,
    budget: u64,
    state: Mutex<State>,
    /// Signalled when a handshake thread ends.
    ended: Condvar,
    /// Rate limits of the server's log lines, one per kind (a flood must not flood the
    /// log): handshakes called off for a newcomer,
    pub log_evicted: LogGate,
    /// connections turned away at the door,
    pub log_refused: LogGate,
    /// connections refused for a full server,
    pub log_full: LogGate,
    /// locked-out addresses,
    pub log_locked: LogGate,
    /// failed accepts,
    pub log_accept: LogGate,
    /// and failed handshakes.
    pub log_handshake: LogGate,
    /// Failed authentications, per address: when one was last logged, and how many were
    /// held back since.
    auth_log: Mutex<HashMap<String, (Instant, u64)>>,
}

/// Why a connection was turned away at the door.
#[derive(Debug)]
pub struct Turned(pub String);

impl Admission {
    /// Admission under `limits`, where a connection with `ring` blocks of `block` bytes
    /// holds `cost(ring, block)` bytes of the memory budget (the service knows its buffers).
    pub fn new(limits: &LimitsConfig, cost: StagingCost) -> Arc<Admission> {
        Arc::new(Admission {
            cost,
            budget: limits.budget(),
            limits: limits.clone(),
            state: Mutex::new(State::default()),
            ended: Condvar::new(),
            log_evicted: LogGate::default(),
            log_refused: LogGate::default(),
            log_full: LogGate::default(),
            log_locked: LogGate::default(),
            log_accept: LogGate::default(),
            log_handshake: LogGate::default(),
            auth_log: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a newly accepted connection from `addr` to the handshake pool, calling off
    /// an older handshake if the pool or the address is full, and waiting (briefly) for a
    /// called-off one's thread to end so the threads stay bounded. `Err` says why it is
    /// turned away instead.
    pub fn arrive(self: &Arc<Self>, addr: &str) -> Result<Handshake, Turned> {
        let mut st = self.lock();
        let c = st.count(addr);
        // An address at its limit replaces its own oldest handshake; one whose connections
        // are all authenticated gets a handshake, refused with a message at its HELLO.
        if c.authed + c.pending >= self.limits.max_per_address && c.pending > 0 {
            if let Some(a) = st.evict(Some(addr)) {
                self.note_evicted(&a, "its address is at max_per_address");
            }
        }
        if st.pending.len() >= self.limits.max_handshakes {
            if let Some(a) = st.evict(None) {
                self.note_evicted(&a, "the handshake pool (max_handshakes) is full");
            }
        }
        // A called-off handshake's thread ends within a few tens of milliseconds; as many
        // as max_handshakes may be ending at once before the accept loop waits for them.
        let end = Instant::now() + self.limits.handshake();
        while st.threads >= 2 * self.limits.max_handshakes {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Turned(format!(
                    "{} handshakes are still running (max_handshakes)",
                    st.threads
                )));
            }
            st = self
                .ended
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        st.next_id += 1;
        let id = st.next_id;
        let cancel = Arc::new(AtomicBool::new(false));
        st.pending.push(Pending {
            id,
            addr: addr.to_string(),
            stage: Stage::Exs,
            cancel: cancel.clone(),
        });
        st.threads += 1;
        st.update(addr, |c| c.pending += 1);
        Ok(Handshake {
            admission: self.clone(),
            id,
            addr: addr.to_string(),
            cancel,
            deadline: Instant::now() + self.limits.handshake(),
            done: false,
        })
    }

    fn note_evicted(&self, addr: &str, why: &str) {
        if let Some(held) = self.log_evicted.pass() {
            tracing::warn!(
                "closed an unauthenticated connection from {addr}: {why}{}",
                more(held)
            );
        }
    }

    /// The one token check of every service: who `token` from `addr` is under `auth`
    /// ([`crate::auth::AuthConfig::accepts`]). A locked-out address's token is not even
    /// looked at, and gets the answer a wrong token gets, so a guesser learns nothing from
    /// it; a wrong token counts towards the lock-out (`[limits] auth_failures`).
    pub fn authenticate(
        &self,
        addr: &str,
        auth: &crate::auth::AuthConfig,
        token: &str,
    ) -> std::result::Result<Principal, AuthRefused> {
        let refused = AuthRefused {
            message: if token.is_empty() {
                "this server needs a token: pass --token or set FERRY_TOKEN"
            } else {
                TOKEN_REFUSED
            },
        };
        let who = if token.is_empty() {
            "no credential".to_string()
        } else {
            crate::auth::token_label(token)
        };
        self.judge(addr, &who, refused, || auth.accepts(token))
    }

    /// Like [`Admission::authenticate`], for a token proven over a TLS session whose
    /// exporter value is `binding` (protocol 1.7, [`crate::secure::prove`]): its holder,
    /// once one of `auth`'s tokens has the identifier and HMAC of `proof`. The same
    /// lock-out counts the failures.
    pub fn authenticate_proof(
        &self,
        addr: &str,
        auth: &crate::auth::AuthConfig,
        proof: &([u8; 8], [u8; 32]),
        binding: &[u8; 32],
    ) -> std::result::Result<Principal, AuthRefused> {
        let id: String = proof.0.iter().map(|b| format!("{b:02x}")).collect();
        let refused = AuthRefused {
            message: TOKEN_REFUSED,
        };
        self.judge(addr, &format!("token {id}"), refused, || {
            auth.accepts_proof(proof, binding)
                .map(|t| Principal::token(auth, &t))
        })
    }

    /// Like [`Admission::authenticate`], for a key proven over a TLS session whose exporter
    /// value is `binding` (protocol 1.9, [`crate::keys`]): its holder, once the key is in
    /// the authorized keys and the signature is good. The same lock-out counts the failures.
    pub fn authenticate_key(
        &self,
        addr: &str,
        auth: &crate::auth::AuthConfig,
        proof: &([u8; 32], [u8; 64]),
        binding: &[u8; 32],
    ) -> std::result::Result<Principal, AuthRefused> {
        let refused = AuthRefused {
            message: "the key was not accepted: is its public key (ferry keygen's .pub line) in the server's authorized_keys?",
        };
        let who = format!("key {}", crate::keys::fingerprint(&proof.0));
        self.judge(addr, &who, refused, || {
            auth.accepts_key(&proof.0, &proof.1, binding)
        })
    }

    /// The lock-out around a credential check: refused unchecked while `addr` is locked
    /// out; a failed `check` counted and logged ([`Admission::auth_failed`]).
    fn judge(
        &self,
        addr: &str,
        who: &str,
        refused: AuthRefused,
        check: impl FnOnce() -> Option<Principal>,
    ) -> std::result::Result<Principal, AuthRefused> {
        if self.locked_out(addr) {
            self.note_failure(addr, who, "address locked out after failed attempts");
            return Err(refused);
        }
        match check() {
            Some(p) => Ok(p),
            None => {
                self.auth_failed(addr);
                self.note_failure(addr, who, "wrong credential");
                Err(refused)
            }
        }
    }

    /// Logs a failed authentication from `addr` (`who`: the key fingerprint or token
    /// identifier it tried, never a secret; `why`), at most once per address per
    /// [`AUTH_LOG_EVERY`]; the next line says how many were held back meanwhile.
    fn note_failure(&self, addr: &str, who: &str, why: &str) {
        let now = Instant::now();
        let mut log = self.auth_log.lock().unwrap_or_else(|p| p.into_inner());
        if log.len() >= MAX_TRACKED && !log.contains_key(addr) {
            log.retain(|_, (t, _)| now.duration_since(*t) < AUTH_LOG_EVERY);
            if log.len() >= MAX_TRACKED {
                return;
            }
        }
        let held = match log.get_mut(addr) {
            Some((t, held)) if now.duration_since(*t) < AUTH_LOG_EVERY => {
                *held += 1;
                return;
            }
            Some((t, held)) => {
                *t = now;
                std::mem::take(held)
            }
            None => {
                log.insert(addr.to_string(), (now, 0));
                0
            }
        };
        drop(log);
        let more = if held == 0 {
            String::new()
        } else {
            format!(
                " ({held} more from this address in the last {} s)",
                AUTH_LOG_EVERY.as_secs()
            )
        };
        tracing::warn!("{addr}: authentication failed ({who}): {why}{more}");
    }

    /// Whether `addr` is locked out for failed tokens now.
    fn locked_out(&self, addr: &str) -> bool {
        let now = Instant::now();
        self.lock()
            .failures
            .get(addr)
            .and_then(|f| f.locked_until)
            .is_some_and(|t| now < t)
    }

    /// Counts a failed token from `addr`; logs (rate-limited) when that locks it out.
    fn auth_failed(&self, addr: &str) {
        let now = Instant::now();
        let backoff = self.limits.backoff();
        let mut st = self.lock();
        if st.failures.len() >= MAX_TRACKED && !st.failures.contains_key(addr) {
            st.failures.retain(|_, f| {
                f.locked_until.is_some_and(|t| now < t) || now.duration_since(f.since) < backoff
            });
            if st.failures.len() >= MAX_TRACKED {
                return;
            }
        }
        let f = st.failures.entry(addr.to_string()).or_insert(Failures {
            count: 0,
            since: now,
            locked_until: None,
        });
        if now.duration_since(f.since) >= backoff || f.locked_until.is_some_and(|t| now >= t) {
            *f = Failures {
                count: 0,
                since: now,
                locked_until: None,
            };
        }
        f.count += 1;
        if f.count >= self.limits.auth_failures && f.locked_until.is_none() {
            f.locked_until = Some(now + backoff);
            let n = f.count;
            drop(st);
            if let Some(held) = self.log_locked.pass() {
                tracing::warn!(
                    "{addr}: {n} failed token attempts within {:.0} s; refusing tokens from this address unchecked for {:.0} s{}",
                    backoff.as_secs_f64(),
                    backoff.as_secs_f64(),
                    more(held)
                );
            }
        }
    }

    /// The ring and block `n` connections get within what is left of the memory budget
    /// (and what they cost together): `ring` and `block` if they fit, else the ring halved
    /// down to [`MIN_RING`], then the block halved down to [`MIN_BLOCK`]; `None` if not
    /// even those fit.
    fn fit(&self, used: u64, n: usize, ring: usize, block: u32) -> Option<(usize, u32, u64)> {
        let (mut ring, mut block) = (ring.max(1), block);
        loop {
            let cost = (self.cost)(ring, block).saturating_mul(n as u64);
            if used.saturating_add(cost) <= self.budget {
                return Some((ring, block, cost));
            }
            if ring > MIN_RING {
                ring = (ring / 2).max(MIN_RING);
            } else if block > MIN_BLOCK {
                block = (block / 2).max(MIN_BLOCK);
            } else {
                return None;
            }
        }
    }
}

impl Admission {
    /// Reserves staging memory for `streams` connections this server opens itself (the
    /// streams of a third-party copy), each with `ring` blocks of `block` bytes or less when
    /// memory is short, as for [`Handshake::admit`]; refused (Unavailable) when not even
    /// the least fits.
    pub fn reserve(
        self: &Arc<Self>,
        streams: usize,
        ring: usize,
        block: u32,
    ) -> Result<Grant, Refusal> {
        let mut st = self.lock();
        let Some((ring, block, memory)) = self.fit(st.memory, streams.max(1), ring, block) else {
            return Err(refuse(
                Denial::Unavailable,
                "the server's memory budget for connections is spent (memory_budget); try again later",
            ));
        };
        st.memory += memory;
        Ok(Grant {
            admission: self.clone(),
            memory,
            ring,
            block,
        })
    }
}

/// A token [`Admission::authenticate`] refused, with the message for the client (the same
/// whether the token was wrong or its address is locked out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthRefused {
    /// What the client is told.
    pub message: &'static str,
}

/// Staging memory reserved by [`Admission::reserve`]; given back when dropped.
pub struct Grant {
    admission: Arc<Admission>,
    memory: u64,
    /// Staging blocks in flight per connection and direction.
    pub ring: usize,
    /// The block size to ask for.
    pub block: u32,
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.admission.lock().memory -= self.memory;
    }
}

/// A connection in the handshake pool; leaves it when dropped or [`Handshake::admit`]ted.
pub struct Handshake {
    admission: Arc<Admission>,
    id: u64,
    /// The peer's address key ([`crate::serve::peer_key`]).
    pub addr: String,
    /// Set when a newer connection took this one's place.
    pub cancel: Arc<AtomicBool>,
    /// When the handshake must be over.
    pub deadline: Instant,
    done: bool,
}

impl Handshake {
    /// Time left until the deadline.
    pub fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Whether this handshake was called off.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    /// The admission this handshake is counted in.
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Notes that the handshake got to `stage`; false if it was called off meanwhile.
    pub fn reached(&self, stage: Stage) -> bool {
        let mut st = self.admission.lock();
        if self.cancelled() {
            return false;
        }
        if let Some(p) = st.pending.iter_mut().find(|p| p.id == self.id) {
            p.stage = stage;
        }
        true
    }

    /// Turns the authenticated handshake into a connection slot with staging memory for
    /// `ring` blocks of `block` bytes (less if memory is short: see the slot's `ring` and
    /// `block`), or refuses it (Unavailable) when `max_connections` or the memory budget is
    /// reached.
    pub fn admit(mut self, ring: usize, block: u32) -> Result<Slot, Refusal> {
        let adm = self.admission.clone();
        let limits = &adm.limits;
        let mut st = adm.lock();
        if self.cancelled() {
            return Err(refuse(
                Denial::Unavailable,
                "the server is busy with new connections; try again",
            ));
        }
        if st.authed >= limits.max_connections {
            drop(st);
            if let Some(held) = adm.log_full.pass() {
                tracing::warn!(
                    "refused a connection from {}: max_connections = {} reached{}",
                    self.addr,
                    limits.max_connections,
                    more(held)
                );
            }
            return Err(refuse(
                Denial::Unavailable,
                format!(
                    "the server has reached its limit of {} connections (max_connections); try again later",
                    limits.max_connections
                ),
            ));
        }
        let mine = st.count(&self.addr).authed;
        if mine >= limits.max_per_address {
            drop(st);
            if let Some(held) = adm.log_full.pass() {
                tracing::warn!(
                    "refused a connection from {}: it holds max_per_address = {} connections{}",
                    self.addr,
                    limits.max_per_address,
                    more(held)
                );
            }
            return Err(refuse(
                Denial::Unavailable,
                format!(
                    "your address already has {mine} connections to this server, its limit (max_per_address); try again later"
                ),
            ));
        }
        let Some((ring, block, memory)) = adm.fit(st.memory, 1, ring, block) else {
            let (used, budget) = (st.memory, adm.budget);
            drop(st);
            if let Some(held) = adm.log_full.pass() {
                tracing::warn!(
                    "refused a connection from {}: the memory budget is spent ({used} of {budget} bytes reserved){}",
                    self.addr,
                    more(held)
                );
            }
            return Err(refuse(
                Denial::Unavailable,
                "the server's memory budget for connections is spent (memory_budget); try again later",
            ));
        };
        st.memory += memory;
        st.authed += 1;
        if let Some(i) = st.pending.iter().position(|p| p.id == self.id) {
            st.pending.remove(i);
        }
        st.update(&self.addr, |c| {
            c.pending -= 1;
            c.authed += 1;
        });
        st.threads -= 1;
        self.done = true;
        drop(st);
        adm.ended.notify_all();
        Ok(Slot {
            admission: adm.clone(),
            addr: std::mem::take(&mut self.addr),
            memory,
            ring,
            block,
        })
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = self.admission.lock();
        if let Some(i) = st.pending.iter().position(|p| p.id == self.id) {
            st.pending.remove(i);
            st.update(&self.addr, |c| c.pending -= 1);
        }
        st.threads -= 1;
        drop(st);
        self.admission.ended.notify_all();
    }
}

/// An authenticated connection's place and staging memory; given back when dropped.
pub struct Slot {
    admission: Arc<Admission>,
    addr: String,
    memory: u64,
    /// Staging blocks in flight per direction this connection may use.
    pub ring: usize,
    /// The largest block this connection may use.
    pub block: u32,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut st = self.admission.lock();
        st.authed -= 1;
        st.memory -= self.memory;
        st.update(&self.addr, |c| c.authed -= 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two rings of `ring` blocks plus two, each block with a page in front.
    fn staging_cost(ring: usize, block: u32) -> u64 {
        (2 * ring as u64 + 2) * (u64::from(block) + 4096)
    }

    fn limits(handshakes: usize, per_addr: usize) -> LimitsConfig {
        LimitsConfig {
            max_handshakes: handshakes,
            max_per_address: per_addr,
            max_connections: 2,
            memory_budget: Some(1 << 40),
            handshake_timeout: 0.2,
            ..LimitsConfig::default()
        }
    }

    #[test]
    fn a_full_pool_calls_off_the_oldest_of_the_busiest_address() {
        let a = Admission::new(&limits(3, 10), staging_cost);
        let x1 = a.arrive("x").unwrap();
        let y1 = a.arrive("y").unwrap();
        let x2 = a.arrive("x").unwrap();
        // The pool is full: the newcomer takes the place of x's oldest.
        let z = a.arrive("z").unwrap();
        assert!(x1.cancelled() && !y1.cancelled() && !x2.cancelled());
        // x1's thread still ends: with twice the pool's threads alive, a newcomer waits.
        let y2 = a.arrive("y").unwrap();
        let y3 = a.arrive("y").unwrap();
        assert!(x2.cancelled() && y1.cancelled() && !z.cancelled());
        let a2 = a.clone();
        let newcomer = std::thread::spawn(move || a2.arrive("w").map(|h| h.addr.clone()));
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !newcomer.is_finished(),
            "six threads alive: the newcomer must wait"
        );
        drop(x1);
        assert_eq!(newcomer.join().unwrap().unwrap(), "w");
        drop((y2, y3));
    }

    #[test]
    fn handshakes_further_along_are_called_off_last() {
        let a = Admission::new(&limits(2, 10), staging_cost);
        let good = a.arrive("x").unwrap();
        assert!(good.reached(Stage::Hello));
        let flood = a.arrive("x").unwrap();
        let _next = a.arrive("x").unwrap();
        assert!(
            flood.cancelled() && !good.cancelled(),
            "the one still in EXS goes first"
        );
        assert!(good.reached(Stage::Checking));
        let _more = a.arrive("x").unwrap();
        assert!(
            !good.cancelled(),
            "a HELLO being checked is never called off"
        );
    }

    #[test]
    fn connections_and_addresses_are_limited() {
        let a = Admission::new(&limits(8, 2), staging_cost);
        let s1 = a.arrive("x").unwrap().admit(8, 1 << 20).unwrap();
        let s2 = a.arrive("y").unwrap().admit(8, 1 << 20).unwrap();
        let r = a.arrive("z").unwrap().admit(8, 1 << 20).err().unwrap();
        assert_eq!(r.code, Denial::Unavailable);
        assert!(r.message.contains("max_connections"), "{}", r.message);
        let x2 = a.arrive("x").unwrap();
        // x holds an authenticated connection and a handshake: a third replaces the latter.
        let x3 = a.arrive("x").unwrap();
        assert!(x2.cancelled() && !x3.cancelled());
        drop((s1, s2, x2));
        assert!(x3.admit(8, 1 << 20).is_ok());
        // An address with max_per_address authenticated connections: a third is refused
        // at its HELLO, with a message.
        let b = Admission::new(
            &LimitsConfig {
                max_connections: 10,
                ..limits(8, 2)
            },
            staging_cost,
        );
        let held: Vec<Slot> = (0..2)
            .map(|_| b.arrive("x").unwrap().admit(8, 1 << 20).unwrap())
            .collect();
        let r = b.arrive("x").unwrap().admit(8, 1 << 20).err().unwrap();
        assert!(r.message.contains("max_per_address"), "{}", r.message);
        assert!(b.arrive("y").unwrap().admit(8, 1 << 20).is_ok());
        drop(held);
    }

    #[test]
    fn memory_short_shrinks_the_ring_then_refuses() {
        let full = staging_cost(8, 1 << 20);
        let l = LimitsConfig {
            memory_budget: Some(full + staging_cost(2, 1 << 20)),
            max_connections: 10,
            ..limits(8, 8)
        };
        let a = Admission::new(&l, staging_cost);
        let s1 = a.arrive("x").unwrap().admit(8, 1 << 20).unwrap();
        assert_eq!((s1.ring, s1.block), (8, 1 << 20));
        let s2 = a.arrive("x").unwrap().admit(8, 1 << 20).unwrap();
        assert_eq!((s2.ring, s2.block), (2, 1 << 20));
        let r = a.arrive("x").unwrap().admit(8, 1 << 20).err().unwrap();
        assert!(r.message.contains("memory_budget"), "{}", r.message);
        drop(s1);
        assert_eq!(a.arrive("x").unwrap().admit(8, 1 << 20).unwrap().ring, 8);
    }

    #[test]
    fn failed_tokens_lock_an_address_out_for_the_backoff() {
        let l = LimitsConfig {
            auth_failures: 3,
            auth_backoff: 0.3,
            ..LimitsConfig::default()
        };
        let a = Admission::new(&l, staging_cost);
        for _ in 0..2 {
            a.auth_failed("x");
        }
        assert!(!a.locked_out("x"));
        a.auth_failed("x");
        assert!(a.locked_out("x") && !a.locked_out("y"));
        std::thread::sleep(Duration::from_millis(350));
        assert!(!a.locked_out("x"));
    }
}
