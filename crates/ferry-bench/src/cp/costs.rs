//! What checking a block costs one core here: the rates of the per-block work each
//! protection level adds, measured through the functions the transfer itself calls
//! ([`BlockCheck`]), so a ratio such as `integrity_vs_clear_mem` can be read against what
//! this CPU does per byte.
//!
//! Each rate is of this thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not the wall clock:
//! on a loaded host a pass timed by the wall clock includes the time other processes held
//! the core (one such run read a third of the rate its CPU time gives).

use std::time::Duration;

use rustix::time::{clock_gettime, ClockId};

use ferry_service::secure::protect::BlockCheck;
use serde::Serialize;

/// The block size transfers use by default.
const BLOCK: usize = 4 << 20;

/// How much CPU time each rate is measured over.
const SPAN: Duration = Duration::from_millis(300);

/// One core's rates of the per-block work, GB/s of block bytes.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CheckRates {
    /// `clear`: CRC-32C.
    pub crc32c: f64,
    /// `integrity`: the keyed tag (BLAKE3 of the bytes, then the keyed hash of its place).
    pub integrity_tag: f64,
    /// `private`, sender: AES-256-GCM sealing in place.
    pub private_seal: f64,
    /// `private`, receiver: opening in place.
    pub private_open: f64,
    /// A plain copy of a block (what any level pays at least once per side).
    pub memcpy: f64,
}

impl CheckRates {
    /// Measures each rate on this thread.
    pub fn measure() -> CheckRates {
        let key = [0x5a; 32];
        let mut block = vec![0x3cu8; BLOCK + 64];
        let (crc, tag, seal) = (BlockCheck::Crc, BlockCheck::Tag(key), BlockCheck::Seal(key));
        let data = &mut block[..BLOCK];
        let crc32c = rate(|| {
            std::hint::black_box(crc.compute(1, 0, data));
        });
        let integrity_tag = rate(|| {
            std::hint::black_box(tag.compute(1, 0, data));
        });
        let src = vec![0x7eu8; BLOCK];
        let memcpy = rate(|| {
            data.copy_from_slice(&src);
            std::hint::black_box(&data);
        });
        let sealed = BLOCK + seal.trailer();
        let private_seal = rate(|| {
            let _ = std::hint::black_box(seal.seal(1, 0, &mut block[..sealed]));
        });
        // Opening a block that fails its tag costs the same pass as one that opens; seal a
        // fresh copy each time so every open is a real one.
        let _ = seal.seal(1, 0, &mut block[..sealed]);
        let once = block[..sealed].to_vec();
        let private_open = rate_timed(|| {
            block[..sealed].copy_from_slice(&once);
            let t = cpu_now();
            std::hint::black_box(seal.open(1, 0, BLOCK as u32, &mut block[..sealed]));
            cpu_now().saturating_sub(t)
        });
        CheckRates {
            crc32c,
            integrity_tag,
            private_seal,
            private_open,
            memcpy,
        }
    }
}

/// GB/s of [`BLOCK`]-byte passes of `pass` over [`SPAN`].
fn rate(mut pass: impl FnMut()) -> f64 {
    rate_timed(|| {
        let t = cpu_now();
        pass();
        cpu_now().saturating_sub(t)
    })
}

/// This thread's CPU time so far.
fn cpu_now() -> Duration {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// Like [`rate`], for a `pass` that times its own part (leaving out its set-up).
fn rate_timed(mut pass: impl FnMut() -> Duration) -> f64 {
    pass(); // warm: pages touched, keys expanded
    let (mut spent, mut passes) = (Duration::ZERO, 0u32);
    while spent < SPAN {
        spent += pass();
        passes += 1;
    }
    f64::from(passes) * BLOCK as f64 / spent.as_secs_f64() / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rate_is_measured() {
        let r = CheckRates::measure();
        for v in [
            r.crc32c,
            r.integrity_tag,
            r.private_seal,
            r.private_open,
            r.memcpy,
        ] {
            assert!(v.is_finite() && v > 0.01, "{r:?}");
        }
    }
}
