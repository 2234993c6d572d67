//! Checkpoints off the network thread: a thread per part file (started at its first
//! checkpoint, so small files never pay for one) that `fdatasync`s the part and then records
//! the verified prefix in the journal ([`crate::journal`]). The receiving thread only hands
//! it the prefix it had written before asking, so the journal never claims bytes that are
//! not on disk, and the network is never stalled behind the disk.

use std::fs::File;
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::journal::Journal;

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
    tx: Option<SyncSender<u64>>,
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
        // One request waiting while one runs: a newer prefix replaces nothing, it waits.
        let (tx, rx) = mpsc::sync_channel::<u64>(1);
        let st = state.clone();
        let handle = std::thread::Builder::new()
            .name("ferry-checkpoint".into())
            .spawn(move || {
                let mut journal = journal;
                for prefix in rx {
                    if lock(&st).error.is_some() {
                        continue;
                    }
                    let res = part.sync_data().and_then(|()| journal.record(prefix));
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

    /// Asks for a checkpoint of `prefix` (already written); `Ok(false)` if one is already
    /// waiting (ask again later), `Err` with the thread's first failure.
    pub(crate) fn request(&mut self, prefix: u64) -> std::io::Result<bool> {
        if let Some(e) = lock(&self.state).error.take() {
            return Err(e);
        }
        let Some(tx) = &self.tx else {
            return Ok(false);
        };
        match tx.try_send(prefix) {
            Ok(()) => Ok(true),
            Err(TrySendError::Full(_)) => Ok(false),
            Err(TrySendError::Disconnected(_)) => {
                Err(std::io::Error::other("the checkpoint thread stopped"))
            }
        }
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
