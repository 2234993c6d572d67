//! The staging ring: its bookkeeping, with no I/O: which slot is free, being filled, in flight
//! or being written; the credits that bound what is in flight; when the data landed is due
//! for an fsync. Runtimes ([`sender`], [`crate::writer`]) do the reads, sends, writes
//! and fsyncs these cores ask for and report back what completed; the cores are tested
//! alone (property tests below), with no files and no network.
//!
//! Two cores, one per direction:
//!
//! - [`SendRing`]: ranges in; [`Action::ReadInto`] a free slot, [`Action::Send`] it, wait
//!   for the send's completion to free it. At most `slots` are in flight, and a range is
//!   cut into pieces of at most one block, each read and sent exactly once, in order.
//! - [`LandRing`]: received slots in; [`Action::Write`] them in arrival order,
//!   [`Action::Repost`] each once written, and [`Action::Fsync`] when [`Cadence`] says the
//!   bytes written since the last one are due (a byte water mark, or a time interval).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub mod sender;

pub use sender::{staging_threads, Digest, Sender, Source, Staged};

/// A slot's index in its ring.
pub type SlotId = usize;

/// A byte range of one transfer (the face's file id), at most one block long when it is
/// read into, sent from or written out of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The transfer the bytes belong to.
    pub transfer: u32,
    /// First byte in the transfer's file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Piece {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}

/// What a slot is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Not in use (sending: may be read into; receiving: posted, the network may fill it).
    Free,
    /// Being filled by the runtime (a read, or frames written into it).
    Filling,
    /// Handed to the network; comes back with the send's completion.
    InFlight,
    /// Holds received bytes being written to disk.
    Writing,
}

/// What a core asks its runtime to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Read `piece` into `slot` (then [`SendRing::filled`]).
    ReadInto {
        /// The slot to read into.
        slot: SlotId,
        /// The bytes to read.
        piece: Piece,
    },
    /// Send the first `len` bytes of `slot` (then [`SendRing::sent`] when it completes).
    Send {
        /// The slot to send.
        slot: SlotId,
        /// Bytes of it to send.
        len: usize,
    },
    /// Write `slot`'s payload at `piece` (then [`LandRing::written`]).
    Write {
        /// The slot holding the bytes.
        slot: SlotId,
        /// Where they go.
        piece: Piece,
    },
    /// Give `slot` back to the network to receive into.
    Repost {
        /// The slot, written and free again.
        slot: SlotId,
    },
    /// Make what was written durable (then [`LandRing::synced`]).
    Fsync,
    /// Nothing to do until a completion comes back (a send's, or a write's).
    Wait,
}

/// The sending half: slots of one block, at most all of them in flight, ranges cut into
/// block-sized pieces read and sent in order.
#[derive(Debug, Clone)]
pub struct SendRing {
    state: Vec<SlotState>,
    /// Slots handed out so far (a runtime allocates a slot's memory on its first use).
    used: usize,
    /// Free slots, most recently freed last (reused first: its memory is warm).
    free: Vec<SlotId>,
    /// Slots filled and not yet sent, in fill order.
    ready: VecDeque<(SlotId, usize)>,
    /// Sends that may still start: slots minus those in flight. Never negative.
    credits: usize,
    block: u64,
    /// What is left to read of the queued ranges, in order.
    pending: VecDeque<Piece>,
}

impl SendRing {
    /// A ring of `slots` slots (at least one) of `block` bytes (at least one).
    pub fn new(slots: usize, block: u64) -> SendRing {
        let slots = slots.max(1);
        SendRing {
            state: vec![SlotState::Free; slots],
            used: 0,
            free: Vec::new(),
            ready: VecDeque::new(),
            credits: slots,
            block: block.max(1),
            pending: VecDeque::new(),
        }
    }

    /// The slots the ring has.
    pub fn slots(&self) -> usize {
        self.state.len()
    }

    /// The slot size.
    pub fn block(&self) -> u64 {
        self.block
    }

    /// What `slot` is doing.
    pub fn state(&self, slot: SlotId) -> SlotState {
        self.state[slot]
    }

    /// Sends not yet completed.
    pub fn in_flight(&self) -> usize {
        self.slots() - self.credits
    }

    /// Sends that may still start before one completes.
    pub fn credits(&self) -> usize {
        self.credits
    }

    /// Queues `piece` (any length) to be read and sent after what is queued.
    pub fn queue(&mut self, piece: Piece) {
        if piece.len > 0 {
            self.pending.push_back(piece);
        }
    }

    /// Whether queued bytes are still to be read.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Drops what is queued and not yet read (the rest of a range given up).
    pub fn cancel_pending(&mut self) {
        self.pending.clear();
    }

    /// Gives up the filled slots not yet sent (the rest of a range that failed): free
    /// again, returned so the runtime takes their contents back.
    pub fn cancel_ready(&mut self) -> Vec<SlotId> {
        let slots: Vec<SlotId> = self.ready.drain(..).map(|(slot, _)| slot).collect();
        for &slot in &slots {
            self.state[slot] = SlotState::Free;
            self.free.push(slot);
        }
        slots
    }

    /// A free slot for the runtime to fill itself (frames it builds), or `None` while every
    /// slot is busy: wait for a send to complete.
    pub fn claim(&mut self) -> Option<SlotId> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None if self.used < self.slots() => {
                self.used += 1;
                self.used - 1
            }
            None => return None,
        };
        self.state[slot] = SlotState::Filling;
        Some(slot)
    }

    /// A claimed slot not sent after all (its fill failed): free again.
    pub fn release(&mut self, slot: SlotId) {
        if self.state[slot] == SlotState::Filling {
            self.state[slot] = SlotState::Free;
            self.free.push(slot);
        }
    }

    /// `slot` holds `len` bytes to send.
    pub fn filled(&mut self, slot: SlotId, len: usize) {
        if self.state[slot] == SlotState::Filling && !self.ready.iter().any(|&(s, _)| s == slot) {
            self.ready.push_back((slot, len));
        }
    }

    /// The send of `slot` completed: its credit comes back and the slot is free.
    pub fn sent(&mut self, slot: SlotId) {
        if self.state.get(slot) == Some(&SlotState::InFlight) {
            self.state[slot] = SlotState::Free;
            self.free.push(slot);
            self.credits += 1;
        }
    }

    /// What to do next: send a filled slot, read the next piece into a free one, wait for a
    /// completion, or `None` when nothing is queued, filled or in flight.
    pub fn step(&mut self) -> Option<Action> {
        if self.credits > 0 {
            if let Some((slot, len)) = self.ready.pop_front() {
                self.state[slot] = SlotState::InFlight;
                self.credits -= 1;
                return Some(Action::Send { slot, len });
            }
        }
        if let Some(&head) = self.pending.front() {
            if let Some(slot) = self.claim() {
                let len = head.len.min(self.block);
                let piece = Piece { len, ..head };
                if len == head.len {
                    self.pending.pop_front();
                } else if let Some(rest) = self.pending.front_mut() {
                    rest.offset += len;
                    rest.len -= len;
                }
                return Some(Action::ReadInto { slot, piece });
            }
        }
        if self.in_flight() > 0 || !self.ready.is_empty() || self.has_pending() {
            return Some(Action::Wait);
        }
        None
    }
}

/// When the bytes written since the last fsync are due for one: at a byte water mark, or
/// once an interval has passed with anything written. The clock is the caller's.
#[derive(Debug, Clone, Copy)]
pub struct Cadence {
    /// Bytes written since the last fsync that make one due.
    pub bytes: u64,
    /// Time since the last fsync that makes one due (if anything was written).
    pub every: Duration,
    written: u64,
    last: Instant,
}

impl Cadence {
    /// A cadence of `bytes` or `every`, counted from `now`.
    pub fn new(bytes: u64, every: Duration, now: Instant) -> Cadence {
        Cadence {
            bytes,
            every,
            written: 0,
            last: now,
        }
    }

    /// A cadence that never comes due: for a receiver with nothing to make durable before
    /// its end (no journal to checkpoint).
    pub fn never(now: Instant) -> Cadence {
        Cadence::new(u64::MAX, Duration::MAX, now)
    }

    /// `len` more bytes were written.
    pub fn wrote(&mut self, len: u64) {
        self.written = self.written.saturating_add(len);
    }

    /// Bytes written since the last fsync.
    pub fn unsynced(&self) -> u64 {
        self.written
    }

    /// Whether an fsync is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.written > 0
            && (self.written >= self.bytes
                || now.saturating_duration_since(self.last) >= self.every)
    }

    /// An fsync started at `now` covering `len` of the bytes written (those written while it
    /// ran count toward the next one).
    pub fn synced(&mut self, len: u64, now: Instant) {
        self.written = self.written.saturating_sub(len);
        self.last = now;
    }
}

/// The receiving half: slots the network fills, written out in arrival order by at most
/// `writers` writes at a time, then reposted; fsyncs at the [`Cadence`].
#[derive(Debug, Clone)]
pub struct LandRing {
    state: Vec<SlotState>,
    /// Received slots waiting for a writer, in arrival order.
    landed: VecDeque<(SlotId, Piece)>,
    /// Writes that may still start.
    writers: usize,
    cadence: Cadence,
    /// Whether an fsync was asked for and has not finished.
    syncing: bool,
    /// Bytes the running fsync covers.
    sync_len: u64,
}

impl LandRing {
    /// `slots` posted slots (at least one), `writers` concurrent writes (at least one).
    pub fn new(slots: usize, writers: usize, cadence: Cadence) -> LandRing {
        LandRing {
            state: vec![SlotState::Free; slots.max(1)],
            landed: VecDeque::new(),
            writers: writers.max(1),
            cadence,
            syncing: false,
            sync_len: 0,
        }
    }

    /// What `slot` is doing.
    pub fn state(&self, slot: SlotId) -> SlotState {
        self.state[slot]
    }

    /// Slots posted for the network to fill: the credits the peer may use.
    pub fn credits(&self) -> usize {
        self.state.iter().filter(|&&s| s == SlotState::Free).count()
    }

    /// The slots the ring has.
    pub fn slots(&self) -> usize {
        self.state.len()
    }

    /// A posted slot for the next arrival (the lowest), or `None` while every slot holds a
    /// block not yet written.
    pub fn free_slot(&self) -> Option<SlotId> {
        self.state.iter().position(|&s| s == SlotState::Free)
    }

    /// `slot` received `piece` (an out-of-range slot or one not posted is ignored: the
    /// runtime's bug, not the peer's).
    pub fn arrived(&mut self, slot: SlotId, piece: Piece) {
        if self.state.get(slot) == Some(&SlotState::Free) {
            self.state[slot] = SlotState::InFlight;
            self.landed.push_back((slot, piece));
        }
    }

    /// The write of `slot` finished (`len` bytes on disk): the slot is free to repost.
    pub fn written(&mut self, slot: SlotId, len: u64) -> Action {
        if self.state.get(slot) == Some(&SlotState::Writing) {
            self.state[slot] = SlotState::Free;
            self.writers += 1;
            self.cadence.wrote(len);
        }
        Action::Repost { slot }
    }

    /// The fsync asked for finished at `now`.
    pub fn synced(&mut self, now: Instant) {
        if self.syncing {
            self.syncing = false;
            self.cadence.synced(self.sync_len, now);
        }
    }

    /// What to do at `now`: an fsync if one is due (and none runs), else the oldest landed
    /// slot's write if a writer is free, else wait (`None` when nothing is landed or
    /// being written and no fsync is due).
    pub fn due(&mut self, now: Instant) -> Option<Action> {
        if !self.syncing && self.cadence.due(now) {
            self.syncing = true;
            self.sync_len = self.cadence.unsynced();
            return Some(Action::Fsync);
        }
        if self.writers > 0 {
            if let Some((slot, piece)) = self.landed.pop_front() {
                self.state[slot] = SlotState::Writing;
                self.writers -= 1;
                return Some(Action::Write { slot, piece });
            }
        }
        let busy = self.state.iter().any(|&s| s != SlotState::Free);
        (busy || self.syncing).then_some(Action::Wait)
    }

    /// Bytes written since the last fsync finished.
    pub fn unsynced(&self) -> u64 {
        self.cadence.unsynced()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Drives a SendRing over `ranges`, completing sends in the order `picks` chooses, and
    /// checks the invariants at every step. Returns the pieces sent, in send order.
    fn drive_send(slots: usize, block: u64, ranges: &[Piece], picks: &[usize]) -> Vec<Piece> {
        let mut ring = SendRing::new(slots, block);
        for r in ranges {
            ring.queue(*r);
        }
        let mut read: Vec<Option<Piece>> = vec![None; slots.max(1)];
        let mut flight: Vec<SlotId> = Vec::new();
        let mut sent = Vec::new();
        let mut pick = picks.iter().cycle();
        let mut steps = 0;
        while let Some(a) = ring.step() {
            steps += 1;
            assert!(steps < 100_000, "the ring makes progress");
            match a {
                Action::ReadInto { slot, piece } => {
                    assert!(read[slot].is_none(), "slot {slot} read into while in use");
                    assert!(piece.len >= 1 && piece.len <= block.max(1));
                    read[slot] = Some(piece);
                    ring.filled(slot, piece.len as usize);
                }
                Action::Send { slot, len } => {
                    let piece = read[slot].expect("only a filled slot is sent");
                    assert_eq!(len as u64, piece.len);
                    assert!(!flight.contains(&slot), "slot {slot} sent twice at once");
                    flight.push(slot);
                    sent.push(piece);
                }
                Action::Wait => {
                    assert!(!flight.is_empty(), "waits only with sends to complete");
                    let i = pick.next().copied().unwrap_or(0) % flight.len();
                    let slot = flight.swap_remove(i);
                    read[slot] = None;
                    ring.sent(slot);
                }
                other => panic!("a send ring never asks {other:?}"),
            }
            assert!(ring.in_flight() <= ring.slots(), "bounded in flight");
            assert_eq!(
                ring.in_flight(),
                flight.len(),
                "credits match what is in flight"
            );
        }
        assert!(flight.is_empty() && ring.credits() == ring.slots());
        sent
    }

    fn ranges() -> impl Strategy<Value = Vec<Piece>> {
        proptest::collection::vec((0u32..4, 0u64..1000, 0u64..300), 0..12).prop_map(|v| {
            v.into_iter()
                .map(|(transfer, offset, len)| Piece {
                    transfer,
                    offset,
                    len,
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn every_range_is_sent_once_in_order_with_bounded_slots(
            slots in 1usize..6,
            block in 1u64..80,
            ranges in ranges(),
            picks in proptest::collection::vec(0usize..8, 1..16),
        ) {
            let sent = drive_send(slots, block, &ranges, &picks);
            // Pieces are consecutive cuts of each range, in queue order: every byte once.
            let mut want = ranges.iter().filter(|r| r.len > 0);
            let mut cur: Option<Piece> = None;
            for p in &sent {
                if cur.is_none_or(|c| c.end() == c.offset) {
                    cur = want.next().copied();
                }
                let c = cur.as_mut().expect("no piece beyond the ranges");
                prop_assert_eq!((p.transfer, p.offset), (c.transfer, c.offset));
                prop_assert!(p.len <= c.len);
                c.offset += p.len;
                c.len -= p.len;
            }
            prop_assert!(cur.is_none_or(|c| c.len == 0));
            prop_assert!(want.next().is_none(), "a range was never sent");
        }

        #[test]
        fn landed_slots_are_written_once_then_reposted_and_fsync_keeps_cadence(
            slots in 1usize..6,
            writers in 1usize..3,
            arrivals in proptest::collection::vec((0u64..100, 1u64..50, 0u64..400), 1..40),
        ) {
            let t0 = Instant::now();
            let (mark, every) = (120, Duration::from_millis(1000));
            let mut ring = LandRing::new(slots, writers, Cadence::new(mark, every, t0));
            let mut posted: Vec<SlotId> = (0..slots).collect();
            let mut writing: Vec<(SlotId, Piece)> = Vec::new();
            let (mut arrived, mut written) = (Vec::new(), Vec::new());
            // The model of the cadence: bytes written since the last fsync began, and when
            // the last one ended.
            let (mut unsynced, mut covered, mut last) = (0u64, 0u64, t0);
            let mut syncing = false;
            let mut now = t0;
            let mut arrivals = arrivals.into_iter().enumerate();
            loop {
                let was_due = !syncing && unsynced > 0 && (unsynced >= mark || now - last >= every);
                let step = ring.due(now);
                prop_assert!(!was_due || step == Some(Action::Fsync), "a due fsync was skipped");
                match step {
                    Some(Action::Fsync) => {
                        prop_assert!(was_due, "an fsync before it was due");
                        (syncing, covered) = (true, unsynced);
                    }
                    Some(Action::Write { slot, piece }) => {
                        prop_assert!(!writing.iter().any(|&(s, _)| s == slot), "slot written twice at once");
                        prop_assert!(writing.len() < writers, "bounded writes");
                        prop_assert_eq!(ring.state(slot), SlotState::Writing);
                        writing.push((slot, piece));
                    }
                    Some(Action::Wait) | None => {
                        // Complete an fsync or a write, or let a block arrive after a while.
                        if syncing {
                            ring.synced(now);
                            (syncing, unsynced, last) = (false, unsynced - covered, now);
                        } else if let Some((slot, piece)) = writing.pop() {
                            prop_assert_eq!(ring.written(slot, piece.len), Action::Repost { slot });
                            unsynced += piece.len;
                            written.push(piece);
                            posted.push(slot);
                        } else if let Some(slot) = posted.pop() {
                            let Some((i, (offset, len, wait_ms))) = arrivals.next() else {
                                posted.push(slot);
                                prop_assert_eq!(step, None, "a wait with nothing to complete");
                                break;
                            };
                            now += Duration::from_millis(wait_ms);
                            let piece = Piece { transfer: i as u32, offset, len };
                            ring.arrived(slot, piece);
                            arrived.push(piece);
                        } else {
                            prop_assert!(false, "every slot is busy with nothing to complete");
                        }
                    }
                    Some(other) => prop_assert!(false, "a landing ring never asks {:?}", other),
                }
                prop_assert_eq!(ring.credits(), posted.len(), "credits are the posted slots");
            }
            written.sort_by_key(|p| p.transfer);
            prop_assert_eq!(written, arrived, "every block written exactly once");
            prop_assert_eq!(ring.credits(), slots, "every slot reposted");
        }
    }

    #[test]
    fn filled_slots_given_up_are_free_and_never_sent() {
        let mut ring = SendRing::new(2, 10);
        ring.queue(Piece {
            transfer: 1,
            offset: 0,
            len: 40,
        });
        let Some(Action::ReadInto { slot, .. }) = ring.step() else {
            panic!("a read first");
        };
        ring.filled(slot, 10);
        // Filled, not yet sent: given up with the rest of the range.
        assert_eq!(ring.cancel_ready(), [slot]);
        ring.cancel_pending();
        assert_eq!(ring.credits(), 2);
        assert_eq!(ring.step(), None, "nothing left to send");
        assert!(ring.claim().is_some() && ring.claim().is_some());
    }

    #[test]
    fn a_claimed_slot_released_is_free_again_and_credits_come_back() {
        let mut ring = SendRing::new(2, 10);
        let a = ring.claim().expect("a free slot");
        let b = ring.claim().expect("another");
        assert_eq!(ring.claim(), None, "two slots");
        ring.release(a);
        ring.filled(b, 7);
        assert_eq!(ring.step(), Some(Action::Send { slot: b, len: 7 }));
        assert_eq!(ring.credits(), 1);
        ring.sent(b);
        ring.sent(b); // a duplicate completion does not mint a credit
        assert_eq!(ring.credits(), 2);
        assert_eq!(ring.step(), None);
    }

    #[test]
    fn cadence_is_due_at_the_byte_mark_or_the_interval() {
        let t0 = Instant::now();
        let mut c = Cadence::new(100, Duration::from_secs(1), t0);
        assert!(
            !c.due(t0 + Duration::from_secs(5)),
            "nothing written, nothing due"
        );
        c.wrote(10);
        assert!(!c.due(t0));
        assert!(c.due(t0 + Duration::from_secs(1)));
        c.wrote(90);
        assert!(c.due(t0));
        c.synced(60, t0);
        assert_eq!(c.unsynced(), 40, "bytes written during the fsync stay due");
    }
}
