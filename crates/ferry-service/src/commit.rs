//! A small pool that commits finished files (fsync, rename) while the transfer goes on with
//! the next ones: with many small files the fsyncs overlap instead of running one after the
//! other on the network thread (the disk serves parallel fdatasyncs far faster than serial
//! ones; figures in `docs/xfer.md`, "Tuning"). A commit still happens only to a file that is complete
//! and verified; the directories the files were renamed into are fsynced once each when the
//! pool finishes, and the copy reports success only after all of that.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::error::{Error, Result};

/// Threads committing at once (their time is spent waiting for the disk).
pub const COMMIT_THREADS: usize = 8;
/// Commits waiting for a thread before the submitter waits (bounded memory, open files).
pub const COMMIT_QUEUE: usize = 16;

/// A directory files were renamed into, held open, to fsync once at the end.
pub struct SyncDir {
    /// The directory.
    pub dir: Arc<OwnedFd>,
    /// Its path, for messages (and to fsync each directory once).
    pub shown: PathBuf,
}

/// A commit: the directory to fsync at the end, if any.
type Job = Box<dyn FnOnce() -> Result<Option<SyncDir>> + Send>;

/// The pool; threads start with the first commit handed over.
pub struct CommitPool {
    tx: Option<SyncSender<Job>>,
    rx: Option<Arc<Mutex<Receiver<Job>>>>,
    workers: Vec<JoinHandle<()>>,
    errors: Arc<Mutex<Vec<Error>>>,
    dirs: Arc<Mutex<BTreeMap<PathBuf, Arc<OwnedFd>>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Default for CommitPool {
    fn default() -> Self {
        Self::new()
    }
}

impl CommitPool {
    /// An idle pool.
    pub fn new() -> CommitPool {
        let (tx, rx) = mpsc::sync_channel::<Job>(COMMIT_QUEUE);
        CommitPool {
            tx: Some(tx),
            rx: Some(Arc::new(Mutex::new(rx))),
            workers: Vec::new(),
            errors: Arc::new(Mutex::new(Vec::new())),
            dirs: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    /// Hands a commit over (waiting while the queue is full); it returns the directory to
    /// fsync when the pool finishes. If the threads cannot start, the commit runs here.
    pub fn submit(
        &mut self,
        job: impl FnOnce() -> Result<Option<SyncDir>> + Send + 'static,
    ) -> Result<()> {
        if self.workers.is_empty() {
            self.start();
        }
        match (&self.tx, self.workers.is_empty()) {
            (Some(tx), false) => tx
                .send(Box::new(job))
                .map_err(|_| Error::conn("internal: the commit threads stopped")),
            _ => {
                if let Some(d) = job()? {
                    lock(&self.dirs).insert(d.shown, d.dir);
                }
                Ok(())
            }
        }
    }

    /// Runs a commit on the calling thread (its directory is still fsynced when the pool
    /// finishes): for files on a filesystem where fsync costs nothing (see
    /// [`fsync_is_free`]), where a hand-off to a thread would cost more than the commit.
    pub fn run_here(&mut self, job: impl FnOnce() -> Result<Option<SyncDir>>) -> Result<()> {
        if let Some(d) = job()? {
            lock(&self.dirs).insert(d.shown, d.dir);
        }
        Ok(())
    }

    fn start(&mut self) {
        let Some(rx) = &self.rx else { return };
        for i in 0..COMMIT_THREADS {
            let rx = rx.clone();
            let errors = self.errors.clone();
            let dirs = self.dirs.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("ferry-commit-{i}"))
                .spawn(move || loop {
                    let job = match lock(&rx).recv() {
                        Ok(j) => j,
                        Err(_) => return,
                    };
                    match job() {
                        Ok(Some(d)) => {
                            lock(&dirs).insert(d.shown, d.dir);
                        }
                        Ok(None) => {}
                        Err(e) => {
                            tracing::error!("{}", e.msg);
                            lock(&errors).push(e);
                        }
                    }
                });
            match spawned {
                Ok(h) => self.workers.push(h),
                Err(e) => {
                    tracing::warn!("cannot start a commit thread ({e}); committing inline");
                    break;
                }
            }
        }
    }

    /// Waits for every commit handed over and fsyncs their directories; the first failure
    /// (naming its file, with how many others failed too), if any.
    pub fn finish(mut self) -> Result<()> {
        self.wait()
    }

    fn wait(&mut self) -> Result<()> {
        drop(self.tx.take());
        drop(self.rx.take());
        for w in self.workers.drain(..) {
            if w.join().is_err() {
                lock(&self.errors).push(Error::conn("internal: a commit thread failed"));
            }
        }
        // The renames become durable: each directory once.
        for (shown, dir) in std::mem::take(&mut *lock(&self.dirs)) {
            if let Err(e) = sync_dir(&SyncDir { dir, shown }) {
                lock(&self.errors).push(e);
            }
        }
        let mut errors = std::mem::take(&mut *lock(&self.errors));
        if errors.is_empty() {
            return Ok(());
        }
        let more = errors.len() - 1;
        let mut first = errors.swap_remove(0);
        if more > 0 {
            first.msg = format!(
                "{} (and {more} more files could not be committed)",
                first.msg
            );
        }
        Err(first)
    }
}

/// Whether `file` lives on a memory filesystem (tmpfs, ramfs), where fsync has nothing to
/// make durable and returns at once. An error answers false (treat it as a disk).
pub fn fsync_is_free(file: impl rustix::fd::AsFd) -> bool {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    const RAMFS_MAGIC: u64 = 0x8584_58f6;
    rustix::fs::fstatfs(file).is_ok_and(|s| {
        let t = s.f_type as u64;
        t == TMPFS_MAGIC || t == RAMFS_MAGIC
    })
}

/// fsyncs directory `d`, making the renames into it durable.
pub fn sync_dir(d: &SyncDir) -> Result<()> {
    rustix::fs::fsync(&*d.dir).map_err(|e| Error::io(d.shown.display(), &e.into()))
}

/// The permission bits a received file gets from the `mode` its sender announced: the
/// process umask applied, and the setuid, setgid and sticky bits cleared unless
/// `keep_special` (a peer must not plant a setuid file owned by this process's user).
pub fn file_mode(mode: u32, keep_special: bool) -> u32 {
    let kept = if keep_special { 0o7777 } else { 0o777 };
    mode & kept & !process_umask()
}

/// The process umask, read once (from `/proc/self/status`: `umask(2)` can only be read by
/// setting it, which would race with threads creating files). 0o022 if it cannot be read.
pub fn process_umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("Umask:"))?;
                u32::from_str_radix(line.trim_start_matches("Umask:").trim(), 8).ok()
            })
            .unwrap_or(0o022)
    })
}

impl Drop for CommitPool {
    fn drop(&mut self) {
        let _ = self.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::OFlags;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn received_modes_lose_special_bits_and_get_the_umask() {
        let u = process_umask();
        assert_eq!(file_mode(0o6755, false), 0o755 & !u);
        assert_eq!(file_mode(0o1777, false), 0o777 & !u);
        assert_eq!(file_mode(0o6755, true), 0o6755 & !u);
        assert_eq!(file_mode(0o644, false) & 0o7000, 0);
    }

    fn open_dir(path: &std::path::Path, how: OFlags) -> SyncDir {
        let fd = rustix::fs::open(path, how | OFlags::DIRECTORY, rustix::fs::Mode::empty());
        SyncDir {
            dir: Arc::new(fd.unwrap()),
            shown: path.to_path_buf(),
        }
    }

    #[test]
    fn every_commit_runs_and_the_first_error_is_reported_with_a_count() {
        let ran = Arc::new(AtomicUsize::new(0));
        let mut pool = CommitPool::new();
        for i in 0..100 {
            let ran = ran.clone();
            pool.submit(move || {
                ran.fetch_add(1, Ordering::SeqCst);
                match i % 40 {
                    7 => Err(Error::new(
                        crate::Kind::Io,
                        format!("file {i}: commit failed"),
                    )),
                    _ => Ok(Some(open_dir(&std::env::temp_dir(), OFlags::RDONLY))),
                }
            })
            .unwrap();
        }
        let e = pool.finish().unwrap_err();
        assert_eq!(ran.load(Ordering::SeqCst), 100);
        assert_eq!(e.kind, crate::Kind::Io);
        assert!(e.msg.contains("commit failed"), "{}", e.msg);
        assert!(e.msg.contains("and 2 more files"), "{}", e.msg);
        assert!(CommitPool::new().finish().is_ok(), "an unused pool is fine");
        // A directory that cannot be fsynced (held by a path-only descriptor) is an error
        // of the copy.
        let mut pool = CommitPool::new();
        let dir = open_dir(&std::env::temp_dir(), OFlags::PATH);
        pool.submit(move || Ok(Some(dir))).unwrap();
        assert_eq!(pool.finish().unwrap_err().kind, crate::Kind::Io);
    }
}
