//! A server's work in flight and its drain: once a drain begins the server takes no new
//! work; after the grace period, what still runs is told to stop. Each face keeps one
//! [`Drain`] and reports a [`DrainReport`], which a daemon sums over its faces.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A server's transfers in flight and its drain: once a drain begins, new requests are
/// refused; after the grace period, the transfers still running are told to stop.
#[derive(Debug)]
pub struct Drain {
    /// Set once a drain starts: new requests are refused.
    draining: AtomicBool,
    /// Set when the drain's grace period is over: transfers in flight journal and stop.
    stop: AtomicBool,
    /// Transfers being served.
    in_flight: AtomicUsize,
    /// Transfers stopped by the drain.
    interrupted: AtomicUsize,
    /// Transfers in flight when the drain began (`usize::MAX` before).
    at_drain: AtomicUsize,
}

/// What [`Drain::run`] did (summed over a daemon's faces with `+`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Transfers in flight when the drain began.
    pub in_flight: usize,
    /// Transfers stopped after the grace period (uploads journaled here; downloads are
    /// journaled by their clients).
    pub interrupted: usize,
    /// Transfers that neither finished nor stopped in time (their journals hold their last
    /// checkpoint).
    pub abandoned: usize,
}

impl std::ops::Add for DrainReport {
    type Output = DrainReport;

    fn add(self, o: DrainReport) -> DrainReport {
        DrainReport {
            in_flight: self.in_flight + o.in_flight,
            interrupted: self.interrupted + o.interrupted,
            abandoned: self.abandoned + o.abandoned,
        }
    }
}

/// Counts a transfer in flight while it lives ([`Drain::count`]).
#[derive(Debug)]
pub struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            draining: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            interrupted: AtomicUsize::new(0),
            at_drain: AtomicUsize::new(usize::MAX),
        }
    }
}

impl Drain {
    /// Nothing in flight, no drain.
    pub fn new() -> Drain {
        Drain::default()
    }

    /// Counts one transfer in flight until the guard drops.
    pub fn count(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(&self.in_flight)
    }

    /// Whether a drain began (new requests are refused).
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Whether the grace period is over (transfers in flight stop).
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Notes one transfer stopped by the drain.
    pub fn interrupted(&self) {
        self.interrupted.fetch_add(1, Ordering::SeqCst);
    }

    /// Starts refusing new requests and notes how many transfers are in flight; cheap and
    /// callable from any thread (e.g. a signal-watching one) before [`Drain::run`].
    /// Idempotent.
    pub fn begin(&self) {
        self.draining.store(true, Ordering::SeqCst);
        let n = self.in_flight.load(Ordering::SeqCst);
        let _ = self
            .at_drain
            .compare_exchange(usize::MAX, n, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Drains: begins (if not yet), lets the transfers in flight run for up to `grace`,
    /// then tells the rest to stop and waits a little (5 s) for them.
    pub fn run(&self, grace: Duration) -> DrainReport {
        self.begin();
        self.wait_idle(grace);
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            self.stop.store(true, Ordering::SeqCst);
            self.wait_idle(Duration::from_secs(5));
        }
        self.report()
    }

    /// Drains work that cannot be told to stop (it ends when its peer goes): begins (if
    /// not yet) and waits up to `grace`; what still runs is reported abandoned.
    pub fn wait(&self, grace: Duration) -> DrainReport {
        self.begin();
        self.wait_idle(grace);
        self.report()
    }

    /// Waits up to `limit` for nothing to be in flight.
    fn wait_idle(&self, limit: Duration) {
        let end = Instant::now() + limit;
        while self.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn report(&self) -> DrainReport {
        DrainReport {
            in_flight: self.at_drain.load(Ordering::SeqCst),
            interrupted: self.interrupted.load(Ordering::SeqCst),
            abandoned: self.in_flight.load(Ordering::SeqCst),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// `wait` never tells anything to stop: what ends within the grace period is not
    /// counted, what outlives it is reported abandoned and keeps running.
    #[test]
    fn a_wait_reports_what_outlives_it_without_stopping_it() {
        let d = Arc::new(Drain::new());
        let (d2, release) = (d.clone(), Arc::new(AtomicBool::new(false)));
        let r2 = release.clone();
        let held = std::thread::spawn(move || {
            let _c = d2.count();
            while !r2.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        while d.in_flight.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let r = d.wait(Duration::from_millis(50));
        assert!(d.draining() && !d.stopping());
        assert_eq!((r.in_flight, r.abandoned), (1, 1));
        release.store(true, Ordering::SeqCst);
        held.join().unwrap();
        assert_eq!(d.wait(Duration::from_secs(5)).abandoned, 0);
    }

    /// A transfer that ends within the grace period is not stopped; one that outlives it
    /// sees `stopping()` and is counted as interrupted once it stops.
    #[test]
    fn a_drain_waits_then_stops_what_is_left() {
        let d = Arc::new(Drain::new());
        let quick = d.count();
        drop(quick);
        let d2 = d.clone();
        let slow = std::thread::spawn(move || {
            let _c = d2.count();
            while !d2.stopping() {
                std::thread::sleep(Duration::from_millis(5));
            }
            d2.interrupted();
        });
        while d.in_flight.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let r = d.run(Duration::from_millis(50));
        slow.join().unwrap();
        assert!(d.draining());
        assert_eq!(
            r,
            DrainReport {
                in_flight: 1,
                interrupted: 1,
                abandoned: 0
            }
        );
    }
}
