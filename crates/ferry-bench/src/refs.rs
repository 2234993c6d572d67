//! Reference measurements run alongside ferry: iperf3 single-stream TCP over loopback (what a
//! user has today) and single-thread memcpy (what the memory system allows).

use ferry_fabric::Buffer;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::report::median;
use super::session::Sample;

/// Bytes per memcpy buffer.
pub const MEMCPY_BYTES: usize = 64 << 20;
/// iperf3's default TCP write size, reported as the size of its row.
pub const IPERF3_WRITE: usize = 128 << 10;

/// Kills and reaps the iperf3 server if it is still running.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `iperf3 -c` against a one-off `iperf3 -s` on loopback for `secs` seconds: GB/s
/// received and the CPU both iperf3 processes report.
pub fn iperf3(secs: u32) -> Result<Sample> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free port for iperf3")?
        .port()
        .to_string();
    let server = Command::new("iperf3")
        .args(["-s", "-1", "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let _server = match server {
        Ok(c) => Reap(c),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("iperf3 not installed (apt-get install iperf3)")
        }
        Err(e) => return Err(e).context("starting iperf3 -s"),
    };
    let args = [
        "-c",
        "127.0.0.1",
        "-p",
        &port,
        "-t",
        &secs.to_string(),
        "-J",
    ];
    // The server may not be listening yet, and iperf3 exits 0 with an "error" in its JSON.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = Command::new("iperf3")
            .args(args)
            .stderr(Stdio::null())
            .output()
            .context("running iperf3 -c")?;
        match parse_iperf3(&out.stdout) {
            Err(e) if Instant::now() < deadline => tracing::debug!("iperf3 retry: {e:#}"),
            r => return r,
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Extracts GB/s and CPU seconds from `iperf3 -J` output.
pub fn parse_iperf3(json: &[u8]) -> Result<Sample> {
    let v: serde_json::Value = serde_json::from_slice(json).context("iperf3 JSON")?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    let end = &v["end"];
    let field = |p: &str| end.pointer(p).and_then(|x| x.as_f64());
    let bps = field("/sum_received/bits_per_second").context("no end.sum_received in iperf3")?;
    let secs = field("/sum_received/seconds").unwrap_or(0.0);
    let cpu_pct = field("/cpu_utilization_percent/host_total").unwrap_or(0.0)
        + field("/cpu_utilization_percent/remote_total").unwrap_or(0.0);
    Ok(Sample {
        value: bps / 8e9,
        secs,
        cpu_s: (cpu_pct > 0.0).then_some(cpu_pct / 100.0 * secs),
        peer_cpu_s: None,
    })
}

/// Two buffers for the memcpy reference, allocated and touched once. They come from the same
/// allocator as the fabric's registered buffers (huge pages when large), so the reference and
/// the drivers stand on the same memory.
pub struct Memcpy {
    src: Buffer,
    dst: Buffer,
}

impl Memcpy {
    /// Allocates and faults in both buffers.
    pub fn new() -> Self {
        let (src, dst) = (Buffer::new(MEMCPY_BYTES), Buffer::new(MEMCPY_BYTES));
        src.fill(0x5a);
        dst.fill(0);
        Self { src, dst }
    }

    /// Median GB/s of `reps` single-threaded copies (bytes copied per second).
    pub fn measure(&mut self, reps: usize) -> Sample {
        let mut secs: Vec<f64> = (0..reps.max(1))
            .map(|_| {
                let (Some(src), Some(dst)) = (self.src.as_slice(), self.dst.as_mut_slice()) else {
                    unreachable!("the reference owns both buffers alone")
                };
                let t = Instant::now();
                dst.copy_from_slice(std::hint::black_box(src));
                std::hint::black_box(dst);
                t.elapsed().as_secs_f64()
            })
            .collect();
        let secs = median(&mut secs).unwrap_or(f64::NAN);
        Sample {
            value: MEMCPY_BYTES as f64 / secs / 1e9,
            secs,
            cpu_s: Some(secs),
            peer_cpu_s: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_iperf3_json() {
        let j = br#"{"end":{"sum_received":{"seconds":2.0,"bits_per_second":32e9},
            "cpu_utilization_percent":{"host_total":50.0,"remote_total":25.0}}}"#;
        let s = parse_iperf3(j).unwrap();
        assert_eq!((s.value, s.cpu_s), (4.0, Some(1.5)));
        assert!(parse_iperf3(br#"{"error":"unable to connect"}"#).is_err());
        assert!(parse_iperf3(b"garbage").is_err());
    }
}
