//! The paired latency rounds behind `capi_vs_rust_latency` and `poll_vs_block_latency`.
//!
//! A round is one run of the Rust ping-pong and one of the C ping-pong on the same driver,
//! seconds apart (the order alternating from round to round), each run measuring a blocking
//! and a polling phase (their order alternating too). A ratio is the median over rounds of
//! that round's ratio: both sides of a round's ratio are measured moments apart, so the
//! machine's load, which drifts over the seconds a bench takes, cancels within the round,
//! and the median over rounds drops a round that a burst of other work hit on one side
//! only. (Medians of each side's rounds divided would compare values taken at different
//! moments again.)

use super::capi::PingPong;
use crate::report::{median, round};

/// The paired rounds of one driver.
#[derive(Debug, Clone, Default)]
pub struct Pairs {
    /// The driver.
    pub driver: String,
    /// Per round: C blocking / Rust blocking.
    capi: Vec<f64>,
    /// Per round: Rust polling / Rust blocking.
    poll: Vec<f64>,
}

impl Pairs {
    /// No rounds yet.
    pub fn new(driver: &str) -> Pairs {
        Pairs {
            driver: driver.into(),
            ..Pairs::default()
        }
    }

    /// Adds one round: the Rust run and, if it ran, the C run.
    pub fn add(&mut self, rust: &PingPong, c: Option<&PingPong>) {
        self.poll.push(rust.poll_us / rust.block_us);
        if let Some(c) = c {
            self.capi.push(c.block_us / rust.block_us);
        }
    }

    /// Rounds with a Rust run so far.
    pub fn rounds(&self) -> usize {
        self.poll.len()
    }

    /// `capi_vs_rust_latency`: the median of the rounds' C / Rust blocking latency.
    pub fn capi_vs_rust(&self) -> Option<f64> {
        ratio(&self.capi)
    }

    /// `poll_vs_block_latency`: the median of the rounds' polling / blocking latency.
    pub fn poll_vs_block(&self) -> Option<f64> {
        ratio(&self.poll)
    }
}

fn ratio(v: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|r| r.is_finite()).collect();
    median(&mut v).map(|m| round(m, 4))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pp(block_us: f64, poll_us: f64) -> PingPong {
        PingPong {
            block_us,
            poll_us,
            send_cpu: 0.0,
            recv_cpu: 0.0,
        }
    }

    #[test]
    fn ratios_are_medians_of_paired_rounds() {
        let mut p = Pairs::new("tcp");
        assert_eq!((p.capi_vs_rust(), p.poll_vs_block()), (None, None));
        // The machine slows down from round to round: the paired ratios stay put, where
        // the medians of each side divided would not (median C 60 / median Rust 40 = 1.5).
        p.add(&pp(20.0, 18.0), Some(&pp(60.0, 50.0)));
        p.add(&pp(40.0, 36.0), Some(&pp(44.0, 40.0)));
        p.add(&pp(80.0, 72.0), Some(&pp(88.0, 80.0)));
        assert_eq!(p.capi_vs_rust(), Some(1.1));
        assert_eq!(p.poll_vs_block(), Some(0.9));
        // A round without the C program still pairs the Rust phases.
        p.add(&pp(50.0, 40.0), None);
        assert_eq!(p.poll_vs_block(), Some(0.9));
        assert_eq!(p.capi_vs_rust(), Some(1.1));
        // An even count takes the mean of the middle two; a broken round is dropped.
        p.add(&pp(50.0, 60.0), Some(&pp(60.0, 1.0)));
        p.add(&pp(0.0, 1.0), Some(&pp(1.0, 1.0)));
        assert_eq!(p.capi_vs_rust(), Some(1.15));
        assert_eq!(p.poll_vs_block(), Some(0.9));
    }
}
