//! One direction of the delay line: read packets from one TUN queue, pass them through a
//! bottleneck (rate, drop-tail queue), random loss and reordering, hold each until its
//! release time, and write it to the other TUN queue.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;
use rustix::time::Timespec;

use crate::gso::TcpGso;
use crate::sys::{TunMode, VNET_HDR_LEN};

/// Largest packet a TUN read returns: a 64 KiB GSO packet plus its virtio header.
const MAX_PACKET: usize = 65_536 + VNET_HDR_LEN + 64;
/// Packets read in one go before due packets are released again, so a busy input cannot
/// delay releases by more than a few reads.
const READ_BATCH: usize = 32;
/// Longest sleep when nothing is due, which bounds how long a stop request waits.
const IDLE_WAIT: Duration = Duration::from_millis(20);
/// Most a timed wake-up is advanced by (the time the loop may spin before a release).
const MAX_WAKE_ADVANCE: Duration = Duration::from_micros(200);
/// Held packets up to which wake-ups are advanced (see `wait_for_input`).
const SPARSE: usize = 8;
/// SCHED_FIFO priority of the line threads: above every normal task, below the kernel's
/// own real-time threads (which use 50 and up).
const RT_PRIORITY: i32 = 10;
/// Per-segment IPv4 + TCP header bytes assumed when a GSO packet's headers cannot be
/// parsed (20 + 20 + 12 bytes of timestamps).
const FALLBACK_HEADERS: usize = 52;

/// What one direction does to the packets that cross it.
#[derive(Clone, Debug)]
pub(crate) struct LineConfig {
    /// One-way propagation delay, added after the bottleneck.
    pub delay: Duration,
    /// Bottleneck rate in bits per second of IP packets; `None`: no bottleneck.
    pub rate_bps: Option<u64>,
    /// Drop-tail limit of the bottleneck queue, in bytes.
    pub queue_bytes: u64,
    /// Probability that a packet is dropped (after the queue, like a lossy link).
    pub loss: f64,
    /// Probability that a packet is held `reorder_delay` longer, so later ones pass it.
    pub reorder: f64,
    pub reorder_delay: Duration,
    pub seed: u64,
    pub mode: TunMode,
    /// Run the direction's thread at real-time priority.
    pub realtime: bool,
}

/// Switches shared by both directions and the owner of the line.
#[derive(Debug, Default)]
pub(crate) struct Controls {
    /// Set to end the threads.
    pub stop: AtomicBool,
    /// Set while the link is cut: every packet is dropped.
    pub cut: AtomicBool,
}

/// Counters of one direction, readable while it runs.
#[derive(Debug, Default)]
pub struct LineStats {
    /// Packets (GSO packets count once) and IP bytes written to the far side.
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    /// Segments (1500-byte packets; a GSO packet counts the ones it stands for) dropped
    /// because the bottleneck queue was full.
    pub queue_drops: AtomicU64,
    /// Segments dropped by the random loss.
    pub random_drops: AtomicU64,
    /// Segments dropped because the link was cut (see `Wan::set_cut`).
    pub cut_drops: AtomicU64,
    /// Segments held back to be reordered.
    pub reordered: AtomicU64,
    /// Longest time a held packet was written after its release time, in microseconds:
    /// the line's own lateness (reading and the far stack's processing not included).
    pub max_release_lateness_us: AtomicU64,
    /// Held packets written more than 1 ms after their release time.
    pub late_releases: AtomicU64,
    /// Writes the far side refused (device going away at teardown, for instance).
    pub write_errors: AtomicU64,
    /// Whether the thread got real-time priority (see `Config::realtime`).
    pub realtime: AtomicBool,
}

/// What the loss and the reordering do to one segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Sent,
    Lost,
    /// Held `reorder_delay` longer, so the segments behind it overtake it.
    HeldBack,
}

/// A packet waiting for its release time; ordered by time, then arrival, so packets with
/// the same release time leave in order.
struct Held {
    release: Instant,
    seq: u64,
    data: Vec<u8>,
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        (self.release, self.seq) == (other.release, other.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.release, self.seq).cmp(&(other.release, other.seq))
    }
}

/// The bottleneck: a link of `rate_bps` fed by a drop-tail queue of `limit` bytes. It is
/// kept as the time the link finishes sending what it already accepted, which is all a
/// FIFO needs: the backlog in bytes is that time's distance from now, times the rate.
struct Bottleneck {
    rate_bps: u64,
    limit: u64,
    busy_until: Instant,
}

impl Bottleneck {
    /// Bytes the queue can still take at `now`.
    fn room(&self, now: Instant) -> f64 {
        let backlog = self.busy_until.saturating_duration_since(now).as_secs_f64();
        self.limit as f64 - backlog * self.rate_bps as f64 / 8.0
    }

    /// When a packet of `wire_bytes` arriving `now` leaves the link, or `None` when the
    /// queue has no room for it.
    fn admit(&mut self, now: Instant, wire_bytes: usize) -> Option<Instant> {
        if wire_bytes as f64 > self.room(now) {
            return None;
        }
        let start = self.busy_until.max(now);
        let send = Duration::from_secs_f64(wire_bytes as f64 * 8.0 / self.rate_bps as f64);
        self.busy_until = start + send;
        Some(self.busy_until)
    }
}

/// One direction's state while it runs.
struct Line {
    cfg: LineConfig,
    controls: Arc<Controls>,
    input: OwnedFd,
    output: OwnedFd,
    stats: Arc<LineStats>,
    bottleneck: Option<Bottleneck>,
    rng: SmallRng,
    held: BinaryHeap<Reverse<Held>>,
    seq: u64,
    /// Scratch space for the pieces of a GSO packet.
    piece: Vec<u8>,
    /// How late timed wake-ups have been (moving average): the timer is set this early.
    wake_lateness: Duration,
}

/// Runs one direction until `stop` is set. Returns the error that ended it early, if any
/// (the input going away other than at teardown).
pub(crate) fn run(
    cfg: LineConfig,
    input: OwnedFd,
    output: OwnedFd,
    stats: Arc<LineStats>,
    controls: Arc<Controls>,
) -> io::Result<()> {
    // Release times are honoured to the timer's precision: ask for 1 us of slack instead
    // of the default 50 us. Best effort: a kernel that refuses still works, less exactly.
    let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1_000));
    if cfg.realtime && crate::sys::make_realtime(RT_PRIORITY).is_ok() {
        stats.realtime.store(true, Ordering::Relaxed);
    }
    let bottleneck = cfg.rate_bps.map(|rate_bps| Bottleneck {
        rate_bps,
        limit: cfg.queue_bytes,
        busy_until: Instant::now(),
    });
    let mut line = Line {
        rng: SmallRng::seed_from_u64(cfg.seed),
        controls,
        cfg,
        input,
        output,
        stats,
        bottleneck,
        held: BinaryHeap::new(),
        seq: 0,
        piece: Vec::with_capacity(MAX_PACKET),
        wake_lateness: Duration::ZERO,
    };
    let mut scratch = vec![0u8; MAX_PACKET];
    while !line.controls.stop.load(Ordering::Relaxed) {
        let drained = line.read_batch(&mut scratch)?;
        line.release_due(Instant::now());
        if drained {
            line.wait_for_input()?;
        }
    }
    Ok(())
}

impl Line {
    /// Reads up to READ_BATCH packets; true when the input ran dry.
    fn read_batch(&mut self, scratch: &mut [u8]) -> io::Result<bool> {
        for _ in 0..READ_BATCH {
            match rustix::io::read(&self.input, &mut *scratch) {
                Ok(0) => return Ok(true),
                Ok(n) => self.admit(&scratch[..n]),
                Err(Errno::AGAIN) => return Ok(true),
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(false)
    }

    /// Puts one packet through the bottleneck, loss and the delay; a TCP GSO packet
    /// segment by segment.
    fn admit(&mut self, packet: &[u8]) {
        let now = Instant::now();
        if self.is_cut(packet) {
            return;
        }
        match TcpGso::parse(packet) {
            Some(gso) if self.cfg.mode == TunMode::Offload => self.admit_gso(now, packet, gso),
            _ => self.admit_one(now, packet),
        }
    }

    fn admit_one(&mut self, now: Instant, packet: &[u8]) {
        let wire = wire_bytes(packet, self.cfg.mode);
        let leaves = match self.bottleneck.as_mut() {
            Some(link) => match link.admit(now, wire) {
                Some(t) => t,
                None => {
                    self.stats.queue_drops.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            },
            None => now,
        };
        match self.fate() {
            Fate::Lost => {}
            fate => self.hold(now, leaves, packet, fate == Fate::HeldBack),
        }
    }

    /// A GSO packet meets the queue, the loss and the reordering as the 1500-byte
    /// segments it stands for: the queue takes the segments that fit and drops the tail;
    /// the loss removes single segments; a reordered segment goes alone, held back; the
    /// runs in between go on as shorter GSO packets.
    fn admit_gso(&mut self, now: Instant, packet: &[u8], gso: TcpGso) {
        let segments = gso.segments();
        let (fit, leaves) = match self.bottleneck.as_mut() {
            Some(link) => {
                let room = link.room(now);
                let fit = (0..=segments)
                    .rev()
                    .find(|&k| gso.wire_bytes(0, k) as f64 <= room)
                    .unwrap_or(0);
                if fit == 0 {
                    self.stats
                        .queue_drops
                        .fetch_add(segments as u64, Ordering::Relaxed);
                    return;
                }
                let leaves = link.admit(now, gso.wire_bytes(0, fit)).unwrap_or(now);
                (fit, leaves)
            }
            None => (segments, now),
        };
        let dropped = (segments - fit) as u64;
        self.stats.queue_drops.fetch_add(dropped, Ordering::Relaxed);
        if fit == segments && self.cfg.loss == 0.0 && self.cfg.reorder == 0.0 {
            self.hold(now, leaves, packet, false);
            return;
        }
        let mut run_start = 0;
        for seg in 0..=fit {
            let fate = if seg < fit { self.fate() } else { Fate::Sent };
            if fate == Fate::Sent && seg < fit {
                continue;
            }
            // The run before this segment ends here.
            self.hold_piece(now, leaves, packet, &gso, run_start..seg, false);
            if fate == Fate::HeldBack {
                self.hold_piece(now, leaves, packet, &gso, seg..seg + 1, true);
            }
            run_start = seg + 1;
        }
    }

    /// Holds segments `range` of a GSO packet as one piece (nothing if empty).
    fn hold_piece(
        &mut self,
        now: Instant,
        leaves: Instant,
        packet: &[u8],
        gso: &TcpGso,
        range: std::ops::Range<usize>,
        held_back: bool,
    ) {
        if range.is_empty() {
            return;
        }
        let mut piece = std::mem::take(&mut self.piece);
        gso.piece(packet, range.start, range.len(), &mut piece);
        self.hold(now, leaves, &piece, held_back);
        self.piece = piece;
    }

    /// Draws what happens to one segment after the queue, and counts it.
    fn fate(&mut self) -> Fate {
        if self.cfg.loss > 0.0 && self.rng.random::<f64>() < self.cfg.loss {
            self.stats.random_drops.fetch_add(1, Ordering::Relaxed);
            return Fate::Lost;
        }
        if self.cfg.reorder > 0.0 && self.rng.random::<f64>() < self.cfg.reorder {
            self.stats.reordered.fetch_add(1, Ordering::Relaxed);
            return Fate::HeldBack;
        }
        Fate::Sent
    }

    /// Schedules the packet for `leaves` + the delay (+ the reorder delay when held
    /// back).
    fn hold(&mut self, now: Instant, leaves: Instant, packet: &[u8], held_back: bool) {
        let mut release = leaves + self.cfg.delay;
        if held_back {
            release += self.cfg.reorder_delay;
        }
        if release <= now && self.held.is_empty() {
            // Zero delay and nothing ahead of it: straight through, no copy.
            self.write(packet);
            return;
        }
        self.seq += 1;
        self.held.push(Reverse(Held {
            release,
            seq: self.seq,
            data: packet.to_vec(),
        }));
    }

    /// Writes every held packet whose time has come.
    fn release_due(&mut self, now: Instant) {
        while self.held.peek().is_some_and(|p| p.0.release <= now) {
            if let Some(Reverse(p)) = self.held.pop() {
                let late = now.saturating_duration_since(p.release).as_micros() as u64;
                self.stats
                    .max_release_lateness_us
                    .fetch_max(late, Ordering::Relaxed);
                if late > 1_000 {
                    self.stats.late_releases.fetch_add(1, Ordering::Relaxed);
                }
                // What would reach the far end while the link is cut is lost too.
                if !self.is_cut(&p.data) {
                    self.write(&p.data);
                }
            }
        }
    }

    /// True (and counted) when the link is cut: the packet goes nowhere.
    fn is_cut(&self, packet: &[u8]) -> bool {
        if !self.controls.cut.load(Ordering::Relaxed) {
            return false;
        }
        let segments = match self.cfg.mode {
            TunMode::Offload => TcpGso::parse(packet).map_or(1, |g| g.segments()),
            TunMode::Plain => 1,
        };
        self.stats
            .cut_drops
            .fetch_add(segments as u64, Ordering::Relaxed);
        true
    }

    fn write(&self, packet: &[u8]) {
        // A TUN write hands the packet to the far stack at once; it does not block.
        match rustix::io::write(&self.output, packet) {
            Ok(_) => {
                let ip_len = packet.len().saturating_sub(self.header_len());
                self.stats.packets.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes.fetch_add(ip_len as u64, Ordering::Relaxed);
            }
            Err(_) => {
                self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn header_len(&self) -> usize {
        match self.cfg.mode {
            TunMode::Offload => VNET_HDR_LEN,
            TunMode::Plain => 0,
        }
    }

    /// Sleeps until the input is readable or the next held packet is due. When few
    /// packets are held, the timer is set early by how late its wake-ups have been
    /// coming (the rest is spun away by the caller's loop), so a release is late by the
    /// wake-up's jitter only, not by its average; a packet is still never released
    /// before its time. With many held (a bulk transfer) the spinning would take the
    /// CPU the endpoints need, and the releases come close together anyway.
    fn wait_for_input(&mut self) -> io::Result<()> {
        let now = Instant::now();
        let (wait, timed) = match self.held.peek() {
            Some(p) => {
                let until = p.0.release.saturating_duration_since(now);
                let advance = if self.held.len() <= SPARSE {
                    self.wake_lateness
                } else {
                    Duration::ZERO
                };
                (until.saturating_sub(advance), true)
            }
            None => (IDLE_WAIT, false),
        };
        let wait = wait.min(IDLE_WAIT);
        if wait.is_zero() {
            return Ok(());
        }
        let timeout = Timespec {
            tv_sec: wait.as_secs() as _,
            tv_nsec: wait.subsec_nanos() as _,
        };
        let mut fds = [PollFd::new(&self.input, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) if timed => {
                let late = now.elapsed().saturating_sub(wait).min(MAX_WAKE_ADVANCE);
                // Moving average over about eight wake-ups.
                self.wake_lateness = (self.wake_lateness * 7 + late) / 8;
                Ok(())
            }
            Ok(_) | Err(Errno::INTR) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Bytes the packet takes on a 1500-byte-MTU wire: a GSO packet counts the headers of
/// every segment it will be cut into, so a rate cap means the same with or without
/// offloads.
fn wire_bytes(packet: &[u8], mode: TunMode) -> usize {
    if mode == TunMode::Plain || packet.len() < VNET_HDR_LEN {
        return packet.len();
    }
    let (hdr, ip) = packet.split_at(VNET_HDR_LEN);
    let gso_type = hdr[1] & !0x80; // the top bit is ECN, not a type
    let gso_size = u16::from_ne_bytes([hdr[4], hdr[5]]) as usize;
    if gso_type == 0 || gso_size == 0 {
        return ip.len();
    }
    let headers = ip_and_l4_header_len(ip).unwrap_or(FALLBACK_HEADERS);
    let payload = ip.len().saturating_sub(headers);
    let segments = payload.div_ceil(gso_size).max(1);
    payload + segments * headers
}

/// Length of the IP and TCP/UDP headers at the front of `ip`, if it parses.
fn ip_and_l4_header_len(ip: &[u8]) -> Option<usize> {
    let (l3, proto) = match ip.first()? >> 4 {
        4 => (((ip[0] & 0x0f) as usize) * 4, *ip.get(9)?),
        6 => (40, *ip.get(6)?),
        _ => return None,
    };
    let l4 = match proto {
        6 => ((*ip.get(l3 + 12)? >> 4) as usize) * 4,
        17 => 8,
        _ => return None,
    };
    Some(l3 + l4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bottleneck_paces_and_drops_at_the_tail() {
        let t0 = Instant::now();
        // 8 Mbit/s: one byte per microsecond; room for 3000 bytes.
        let mut link = Bottleneck {
            rate_bps: 8_000_000,
            limit: 3000,
            busy_until: t0,
        };
        let first = link.admit(t0, 1000).unwrap();
        assert_eq!(first - t0, Duration::from_micros(1000));
        let second = link.admit(t0, 1000).unwrap();
        assert_eq!(second - t0, Duration::from_micros(2000));
        assert!(link.admit(t0, 1500).is_none(), "2000 queued + 1500 > 3000");
        assert!(link.admit(t0, 1000).is_some(), "2000 queued + 1000 fits");
        // Once the link has drained, the queue is empty again.
        let later = t0 + Duration::from_millis(10);
        assert_eq!(
            link.admit(later, 1000).unwrap() - later,
            Duration::from_micros(1000)
        );
    }

    #[test]
    fn gso_packets_count_every_segment_header() {
        // A TCP/IPv4 GSO packet: 20 + 32 header bytes, 3 × 1448 payload bytes.
        let mut packet = vec![0u8; VNET_HDR_LEN + 52 + 3 * 1448];
        packet[1] = 1; // VIRTIO_NET_HDR_GSO_TCPV4
        packet[4..6].copy_from_slice(&1448u16.to_ne_bytes());
        let ip = VNET_HDR_LEN;
        packet[ip] = 0x45;
        packet[ip + 9] = 6;
        packet[ip + 20 + 12] = 8 << 4;
        assert_eq!(wire_bytes(&packet, TunMode::Offload), 3 * 1500);
        // Not GSO: the IP packet as it is.
        packet[1] = 0;
        assert_eq!(wire_bytes(&packet, TunMode::Offload), 52 + 3 * 1448);
    }
}
