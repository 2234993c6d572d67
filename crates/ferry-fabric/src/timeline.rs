//! A per-process timeline of transfer events, for finding the moments where no copy runs.
//!
//! Off unless `FERRY_TIMELINE=PREFIX` is set when the first mark is made; then every
//! [`mark`] records (system-wide monotonic nanoseconds, thread, what, a number) in memory and
//! [`flush`] appends the records to `PREFIX.<pid>` as text lines
//! `ns thread what number`. Both processes of a run share the clock, so their files merge
//! into one timeline (`sort -n PREFIX.*`). Off, a mark costs one atomic load.
//!
//! The drivers and EXS mark frames, grants, RMA pieces, gate queueing and progress-thread
//! naps; `ferry bench exs` flushes after each measurement.

use std::io::Write;
use std::sync::{Mutex, OnceLock};

/// One record.
struct Mark {
    ns: u64,
    thread: u32,
    what: &'static str,
    arg: u64,
}

struct Recorder {
    prefix: String,
    marks: Mutex<Vec<Mark>>,
    threads: Mutex<Vec<String>>,
}

static RECORDER: OnceLock<Option<Recorder>> = OnceLock::new();

thread_local! {
    /// This thread's index in `Recorder::threads`, once it marked something.
    static THREAD: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

fn recorder() -> Option<&'static Recorder> {
    RECORDER
        .get_or_init(|| {
            let prefix = std::env::var("FERRY_TIMELINE").ok()?;
            (!prefix.is_empty()).then(|| Recorder {
                prefix,
                marks: Mutex::new(Vec::with_capacity(1 << 16)),
                threads: Mutex::new(Vec::new()),
            })
        })
        .as_ref()
}

/// True if marks are recorded.
pub fn enabled() -> bool {
    recorder().is_some()
}

/// Records `what` happening now, with a number (an id, a length, a frame type).
pub fn mark(what: &'static str, arg: u64) {
    let Some(r) = recorder() else {
        return;
    };
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let ns = (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64);
    let thread = THREAD.with(|t| match t.get() {
        Some(i) => i,
        None => {
            let mut names = r.threads.lock().unwrap_or_else(|p| p.into_inner());
            let name = std::thread::current()
                .name()
                .unwrap_or("unnamed")
                .replace(' ', "_");
            names.push(name);
            let i = (names.len() - 1) as u32;
            t.set(Some(i));
            i
        }
    });
    let mut marks = r.marks.lock().unwrap_or_else(|p| p.into_inner());
    marks.push(Mark {
        ns,
        thread,
        what,
        arg,
    });
}

/// Appends the records made so far to `PREFIX.<pid>` and forgets them. A file that cannot
/// be written is reported as a warning; the records are dropped either way.
pub fn flush() {
    let Some(r) = recorder() else {
        return;
    };
    let marks = std::mem::take(&mut *r.marks.lock().unwrap_or_else(|p| p.into_inner()));
    let names = r.threads.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let path = format!("{}.{}", r.prefix, std::process::id());
    let mut text = String::with_capacity(marks.len() * 48);
    for m in &marks {
        let name = names.get(m.thread as usize).map_or("?", String::as_str);
        text.push_str(&format!("{} {} {} {}\n", m.ns, name, m.what, m.arg));
    }
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()));
    if let Err(e) = written {
        tracing::warn!("cannot write the timeline to {path}: {e}");
    }
}
