//! The measurements `bench block` makes, all through fio's nbd engine (libnbd, the client
//! every server is reached by alike): what each workload asks of fio and what its JSON
//! report says.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::cpu::children_usage;

/// One fio job shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    /// `seqwrite`, `seqread`, `randwrite`, `randread`.
    pub name: &'static str,
    /// fio's `rw`.
    pub rw: &'static str,
    /// Block size, bytes.
    pub bs: u64,
    /// Requests in flight (fio's `iodepth`).
    pub qd: u32,
}

impl Workload {
    /// Whether the job writes.
    pub fn writes(&self) -> bool {
        self.rw.contains("write")
    }
}

const MIB: u64 = 1 << 20;

/// The workloads of a run, in the order they run: the sequential write first, so every
/// export holds data (not holes) before anything reads it.
pub const WORKLOADS: [Workload; 6] = [
    Workload {
        name: "seqwrite",
        rw: "write",
        bs: MIB,
        qd: 16,
    },
    Workload {
        name: "seqread",
        rw: "read",
        bs: MIB,
        qd: 16,
    },
    Workload {
        name: "randwrite",
        rw: "randwrite",
        bs: 4096,
        qd: 1,
    },
    Workload {
        name: "randread",
        rw: "randread",
        bs: 4096,
        qd: 1,
    },
    Workload {
        name: "randwrite",
        rw: "randwrite",
        bs: 4096,
        qd: 32,
    },
    Workload {
        name: "randread",
        rw: "randread",
        bs: 4096,
        qd: 32,
    },
];

/// What one fio run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// GB/s (10^9 B/s).
    pub gbps: f64,
    /// Requests per second.
    pub iops: f64,
    /// Mean latency from submission to completion, µs.
    pub lat_mean_us: f64,
    /// 99th percentile of that latency, µs.
    pub lat_p99_us: f64,
    /// CPU seconds fio used (user + system).
    pub client_cpu_s: f64,
}

/// Runs `w` against the export at `uri` over its first `region` bytes, writing fio's JSON
/// to `out`: for `secs` seconds (the job wraps around the region), or with `None` once
/// through the region.
pub fn run(
    uri: &str,
    w: &Workload,
    region: u64,
    secs: Option<f64>,
    out: &Path,
) -> Result<Measured> {
    let mut c = Command::new("fio");
    c.args(["--name=bench", "--ioengine=nbd", "--output-format=json"])
        .arg(format!("--uri={uri}"))
        .arg(format!("--rw={}", w.rw))
        .arg(format!("--bs={}", w.bs))
        .arg(format!("--iodepth={}", w.qd))
        .arg(format!("--size={region}"))
        .arg("--lat_percentiles=1")
        .arg(format!("--output={}", out.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(secs) = secs {
        let ms = (secs * 1000.0).round() as u64;
        c.arg(format!("--runtime={ms}ms")).arg("--time_based");
    }
    // Once through the region takes seconds even on a slow, busy machine.
    let limit = secs.unwrap_or(0.0) + 60.0;
    let c0 = children_usage();
    let mut child = c.spawn().context("starting fio")?;
    let deadline = Instant::now() + Duration::from_secs_f64(limit);
    let status = loop {
        if let Some(st) = child.try_wait().context("waiting for fio")? {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("fio did not finish within {limit:.0} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let client_cpu_s = children_usage().secs_since(c0);
    let text = std::fs::read_to_string(out).unwrap_or_default();
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        let last = err.lines().rev().find(|l| !l.trim().is_empty());
        bail!("fio failed ({status}): {}", last.unwrap_or("").trim());
    }
    let mut m = parse(&text, w.writes())?;
    m.client_cpu_s = client_cpu_s;
    Ok(m)
}

/// Reads fio's JSON report (anything fio printed before the object is skipped): the
/// write or read side of its one job.
pub fn parse(text: &str, writes: bool) -> Result<Measured> {
    let start = text.find('{').context("fio wrote no JSON report")?;
    let j: Value = serde_json::from_str(&text[start..]).context("fio's JSON report")?;
    let job = &j["jobs"][0];
    if job["error"].as_i64().unwrap_or(0) != 0 {
        bail!("fio's job failed with error {}", job["error"]);
    }
    let side = &job[if writes { "write" } else { "read" }];
    let num = |v: &Value, what: &str| {
        v.as_f64()
            .with_context(|| format!("fio's report has no {what}"))
    };
    let lat = &side["lat_ns"];
    let m = Measured {
        gbps: num(&side["bw_bytes"], "bw_bytes")? / 1e9,
        iops: num(&side["iops"], "iops")?,
        lat_mean_us: num(&lat["mean"], "lat_ns mean")? / 1e3,
        lat_p99_us: num(&lat["percentile"]["99.000000"], "lat_ns p99")? / 1e3,
        client_cpu_s: 0.0,
    };
    if m.iops <= 0.0 {
        bail!("fio completed no I/O");
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_side_asked_for_after_a_banner() {
        let text = r#"fio: connected to NBD server
{"jobs": [{"error": 0,
  "read": {"bw_bytes": 2000000000, "iops": 1907.3,
           "lat_ns": {"mean": 8000.0, "percentile": {"99.000000": 16384}}},
  "write": {"bw_bytes": 0, "iops": 0.0, "lat_ns": {"mean": 0.0}}}]}"#;
        let m = parse(text, false).unwrap();
        assert_eq!(m.gbps, 2.0);
        assert_eq!(m.iops, 1907.3);
        assert_eq!(m.lat_mean_us, 8.0);
        assert_eq!(m.lat_p99_us, 16.384);
        // The write side did nothing: an error, not a zero.
        assert!(parse(text, true).is_err());
        assert!(parse("no report", false).is_err());
    }
}
