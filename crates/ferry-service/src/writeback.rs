//! Checkpoints off the network thread: a thread per part file (started at its first
//! checkpoint, so small files never pay for one) that `fdatasync`s the part and then records
//! the verified ranges in the journal ([`crate::journal`], [`crate::landing`]). The receiving thread (with
//! parallel streams, the writer of whichever stream reports a block,
//! [`crate::landing::SharedProgress`]) only hands it ranges written before asking, so the
//! journal never claims bytes that are not on disk. One checkpoint runs while the next interval's data arrives; handing over the
//! next one waits for it, so the part is never more than two intervals ahead of its journal
//! (a killed receiver loses at most that) and a disk slower than the network slows the
//! transfer to the disk's pace instead of piling up dirty pages.

use std::fs::File;
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::journal::{Journal, RangeSet};

/// What the checkpoint thread reports back.
#[derive(Debug, Default)]
struct State {
    /// The prefix the journal holds.
    done: u64,
    /// The first error (fdatasync or journal write); later requests are ignored.
    error: Option<std::io::Error>,
}

/// A running checkpoint thread that owns a part file's journal.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    tx: Option<SyncSender<RangeSet>>,
    state: Arc<Mutex<State>>,
    handle: Option<JoinHandle<Journal>>,
}

impl Checkpointer {
    /// Starts the thread for `part` (a duplicate handle is kept), taking over `journal`.
    pub(crate) fn start(part: &File, journal: Journal) -> std::io::Result<Checkpointer> {
        let part = part.try_clone()?;
        let state = Arc::new(Mutex::new(State {
            done: journal.done(),
            error: None,
        }));
        // A rendezvous: a request is taken only when the previous checkpoint is done.
        let (tx, rx) = mpsc::sync_channel::<RangeSet>(0);
        let st = state.clone();
        let handle = std::thread::Builder::new()
            .name("ferry-checkpoint".into())
            .spawn(move || {
                let mut journal = journal;
                for ranges in rx {
                    if lock(&st).error.is_some() {
                        continue;
                    }
                    let res = part.sync_data().and_then(|()| journal.record(&ranges));
                    let mut s = lock(&st);
                    match res {
                        Ok(()) => s.done = journal.done(),
                        Err(e) => s.error = Some(e),
                    }
                }
                journal
            })?;
        Ok(Checkpointer {
            tx: Some(tx),
            state,
            handle: Some(handle),
        })
    }

    /// Asks for a checkpoint of `ranges` (already written), after waiting for the previous
    /// one to finish; `Err` with the thread's first failure.
    pub(crate) fn request(&mut self, ranges: RangeSet) -> std::io::Result<()> {
        let stopped = || std::io::Error::other("the checkpoint thread stopped");
        let tx = self.tx.as_ref().ok_or_else(stopped)?;
        let sent = tx.send(ranges);
        if let Some(e) = lock(&self.state).error.take() {
            return Err(e);
        }
        sent.map_err(|_| stopped())
    }

    /// The prefix the journal holds so far.
    pub(crate) fn journaled(&self) -> u64 {
        lock(&self.state).done
    }

    /// Waits for the checkpoints asked for, stops the thread and gives the journal back,
    /// with the first error the thread met.
    pub(crate) fn stop(mut self) -> (Option<Journal>, std::io::Result<()>) {
        let journal = self.join();
        let res = match lock(&self.state).error.take() {
            Some(e) => Err(e),
            None if journal.is_none() => Err(std::io::Error::other("the checkpoint thread failed")),
            None => Ok(()),
        };
        (journal, res)
    }

    fn join(&mut self) -> Option<Journal> {
        drop(self.tx.take());
        self.handle.take().and_then(|h| h.join().ok())
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.join();
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
