//! Write-behind: a collective write answered before it reaches the file.
//!
//! Once every rank's data of a collective write is in, the ranks are answered and the
//! placement and the writes happen behind, on the thread of the rank that completed the
//! call, after it sent its own answer. At most one write is behind per session: every
//! later file action of the session (a collective call of any kind, an independent read or
//! write, a size query) first waits for it, or runs it itself if nobody has started it, so
//! each rank reads its own writes and every rank reads the others' as soon as the write's
//! call returned. A write that fails behind keeps its error until the session's next
//! collective call, which reports it to every rank (at the latest its SYNC or CLOSE):
//! MPI-IO promises durability and visibility to other handles only after those.

use std::fs::File;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::files;
use super::pool::Pool;
use crate::error::{CioError, Result};
use crate::session::Action;

/// A session's write behind, if any, and the error of the last one that failed.
pub struct Behind {
    slot: Mutex<Slot>,
    idle: Condvar,
    /// The most data bytes one write behind holds; a larger call is written before it is
    /// answered.
    cap: u64,
}

#[derive(Default)]
struct Slot {
    /// A write answered and not yet started: the file and the placement.
    queued: Option<(Arc<File>, Action)>,
    /// A thread is writing the one that was queued.
    running: bool,
    /// The first error of a write behind, not yet reported.
    error: Option<CioError>,
}

impl Behind {
    /// Write-behind of calls of at most `cap` data bytes (0: none goes behind).
    pub fn new(cap: u64) -> Behind {
        Behind {
            slot: Mutex::new(Slot::default()),
            idle: Condvar::new(),
            cap,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a collective write of `bytes` data bytes may be answered before it is
    /// written.
    pub fn takes(&self, bytes: u64) -> bool {
        bytes > 0 && bytes <= self.cap
    }

    /// Queues a write whose ranks are answered now. The caller settled the slot first
    /// ([`Behind::settle`]: file actions run one at a time), so it is empty.
    pub fn queue(&self, file: Arc<File>, action: Action, pool: &Pool) {
        let mut slot = self.lock();
        if let Some((f, earlier)) = slot.queued.take() {
            // Not reached (the caller settled), but never drop a write answered as done.
            drop(slot);
            self.write(&f, earlier, pool);
            slot = self.lock();
        }
        slot.queued = Some((file, action));
    }

    /// Runs the queued write on this thread, if there is one nobody started.
    pub fn flush(&self, pool: &Pool) {
        let queued = {
            let mut slot = self.lock();
            let q = slot.queued.take();
            slot.running |= q.is_some();
            q
        };
        if let Some((file, action)) = queued {
            self.write(&file, action, pool);
        }
    }

    /// Waits until no write is behind: runs a queued one itself, else waits for the one
    /// running.
    pub fn settle(&self, pool: &Pool) {
        loop {
            self.flush(pool);
            let mut slot = self.lock();
            while slot.running {
                slot = self.idle.wait(slot).unwrap_or_else(|p| p.into_inner());
            }
            if slot.queued.is_none() {
                return;
            }
        }
    }

    /// The error of a write behind not yet reported (the slot settled), which the caller
    /// now reports.
    pub fn take_error(&self) -> Option<CioError> {
        self.lock().error.take()
    }

    /// Writes `action` (the caller marked the slot running), keeps its error, gives its
    /// buffers back and wakes whoever waits.
    fn write(&self, file: &File, action: Action, pool: &Pool) {
        let written: Result<()> = files::write(file, &action, pool);
        super::recycle(pool, action);
        let mut slot = self.lock();
        if let Err(e) = written {
            tracing::warn!("a collective write behind failed: {e}");
            slot.error.get_or_insert(CioError::new(
                e.class,
                format!(
                    "an earlier collective write, answered before it reached the file, failed: {}",
                    e.message
                ),
            ));
        }
        slot.running = false;
        self.idle.notify_all();
    }
}
