//! Admission: who gets in and what they may hold ([`crate::config::LimitsConfig`]).
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

use crate::config::LimitsConfig;
use crate::proto::ErrorCode;

use crate::export::{refuse, Refusal};

/// The smallest ring a connection is given when memory is short.
const MIN_RING: usize = 2;
/// The smallest block a connection is given when memory is short.
const MIN_BLOCK: u32 = 256 << 10;
/// Addresses whose failed tokens are remembered at most (a table an attacker with many
/// addresses cannot grow without bound).
const MAX_TRACKED: usize = 65_536;
/// At most one line a second per kind of refusal, so the log is no lever for a flood.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// The address a peer's limits are counted under: its IP for IP drivers
/// (`tcp://10.0.0.7:40112` → `10.0.0.7`); the driver name for local-only ones (every
/// `ofi+shm` peer is this host).
pub(crate) fn peer_key(peer: &str) -> String {
    match peer.parse::<ferry_fabric::Address>() {
        Ok(a) if a.port.is_some() => a.host,
        Ok(_) => peer.split("://").next().unwrap_or(peer).to_string(),
        Err(_) => peer.to_string(),
    }
}

/// A log line that goes out at most once per [`LOG_EVERY`]; lines held back meanwhile are
/// counted, and the next one that goes out says how many.
#[derive(Default)]
pub(crate) struct LogGate(Mutex<(Option<Instant>, u64)>);

impl LogGate {
    /// `Some(held back since the last line)` if a line may go out now.
    pub(crate) fn pass(&self) -> Option<u64> {
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
pub(crate) fn more(held: u64) -> String {
    if held == 0 {
        String::new()
    } else {
        format!(" ({held} more like it since the last such line)")
    }
}

/// How far a handshake got: the further, the later it is called off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stage {
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
pub(crate) struct Admission {
    limits: LimitsConfig,
    budget: u64,
    state: Mutex<State>,
    /// Signalled when a handshake thread ends.
    ended: Condvar,
    pub(crate) log_evicted: LogGate,
    pub(crate) log_refused: LogGate,
    pub(crate) log_full: LogGate,
    pub(crate) log_locked: LogGate,
    pub(crate) log_accept: LogGate,
    pub(crate) log_handshake: LogGate,
}

/// Why a connection was turned away at the door.
#[derive(Debug)]
pub(crate) struct Turned(pub String);

impl Admission {
    pub(crate) fn new(limits: &LimitsConfig) -> Arc<Admission> {
        Arc::new(Admission {
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
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a newly accepted connection from `addr` to the handshake pool, calling off
    /// an older handshake if the pool or the address is full, and waiting (briefly) for a
    /// called-off one's thread to end so the threads stay bounded. `Err` says why it is
    /// turned away instead.
    pub(crate) fn arrive(self: &Arc<Self>, addr: &str) -> Result<Handshake, Turned> {
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

    /// Whether `addr` is locked out for failed tokens now.
    pub(crate) fn locked_out(&self, addr: &str) -> bool {
        let now = Instant::now();
        self.lock()
            .failures
            .get(addr)
            .and_then(|f| f.locked_until)
            .is_some_and(|t| now < t)
    }

    /// Counts a failed token from `addr`; logs (rate-limited) when that locks it out.
    pub(crate) fn auth_failed(&self, addr: &str) {
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
            let cost = staging_cost(ring, block).saturating_mul(n as u64);
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
    pub(crate) fn reserve(
        self: &Arc<Self>,
        streams: usize,
        ring: usize,
        block: u32,
    ) -> Result<Grant, Refusal> {
        let mut st = self.lock();
        let Some((ring, block, memory)) = self.fit(st.memory, streams.max(1), ring, block) else {
            return Err(refuse(
                ErrorCode::Unavailable,
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

/// Staging memory reserved by [`Admission::reserve`]; given back when dropped.
pub(crate) struct Grant {
    admission: Arc<Admission>,
    memory: u64,
    /// Staging blocks in flight per connection and direction.
    pub(crate) ring: usize,
    /// The block size to ask for.
    pub(crate) block: u32,
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.admission.lock().memory -= self.memory;
    }
}

/// Bytes of staging memory a connection with `ring` blocks of `block` bytes may hold at
/// once: its receive ring and its send ring (registered buffers), the copies of one request
/// and one received block, and with staging threads the blocks queued to the writer or
/// hasher thread.
pub(crate) fn staging_cost(ring: usize, block: u32) -> u64 {
    let threads = if crate::link::staging_threads() {
        ring
    } else {
        0
    };
    let buffers = 2 * ring + 2 + threads;
    buffers as u64 * crate::link::buffer_bytes(block)
}

/// A connection in the handshake pool; leaves it when dropped or [`Handshake::admit`]ted.
pub(crate) struct Handshake {
    admission: Arc<Admission>,
    id: u64,
    /// The peer's address key ([`peer_key`]).
    pub(crate) addr: String,
    /// Set when a newer connection took this one's place.
    pub(crate) cancel: Arc<AtomicBool>,
    /// When the handshake must be over.
    pub(crate) deadline: Instant,
    done: bool,
}

impl Handshake {
    /// Time left until the deadline.
    pub(crate) fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Whether this handshake was called off.
    pub(crate) fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    pub(crate) fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Notes that the handshake got to `stage`; false if it was called off meanwhile.
    pub(crate) fn reached(&self, stage: Stage) -> bool {
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
    pub(crate) fn admit(mut self, ring: usize, block: u32) -> Result<Slot, Refusal> {
        let adm = self.admission.clone();
        let limits = &adm.limits;
        let mut st = adm.lock();
        if self.cancelled() {
            return Err(refuse(
                ErrorCode::Unavailable,
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
                ErrorCode::Unavailable,
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
                ErrorCode::Unavailable,
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
                ErrorCode::Unavailable,
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
pub(crate) struct Slot {
    admission: Arc<Admission>,
    addr: String,
    memory: u64,
    /// Staging blocks in flight per direction this connection may use.
    pub(crate) ring: usize,
    /// The largest block this connection may use.
    pub(crate) block: u32,
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
    fn addresses_are_ips_or_the_local_driver() {
        assert_eq!(peer_key("tcp://10.0.0.7:40112"), "10.0.0.7");
        assert_eq!(peer_key("ofi+tcp://[::1]:7370"), "::1");
        assert_eq!(peer_key("ofi+shm://ferry-42"), "ofi+shm");
    }

    #[test]
    fn a_full_pool_calls_off_the_oldest_of_the_busiest_address() {
        let a = Admission::new(&limits(3, 10));
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
        let a = Admission::new(&limits(2, 10));
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
        let a = Admission::new(&limits(8, 2));
        let s1 = a.arrive("x").unwrap().admit(8, 1 << 20).unwrap();
        let s2 = a.arrive("y").unwrap().admit(8, 1 << 20).unwrap();
        let r = a.arrive("z").unwrap().admit(8, 1 << 20).err().unwrap();
        assert_eq!(r.code, ErrorCode::Unavailable);
        assert!(r.message.contains("max_connections"), "{}", r.message);
        let x2 = a.arrive("x").unwrap();
        // x holds an authenticated connection and a handshake: a third replaces the latter.
        let x3 = a.arrive("x").unwrap();
        assert!(x2.cancelled() && !x3.cancelled());
        drop((s1, s2, x2));
        assert!(x3.admit(8, 1 << 20).is_ok());
        // An address with max_per_address authenticated connections: a third is refused
        // at its HELLO, with a message.
        let b = Admission::new(&LimitsConfig {
            max_connections: 10,
            ..limits(8, 2)
        });
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
        let a = Admission::new(&l);
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
        let a = Admission::new(&l);
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
