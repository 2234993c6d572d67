//! The bench report: rows, summary, and its renderings (table, CSV, JSON).

use std::fmt::Write as _;

use serde::Serialize;

/// Median of `v` (mean of the middle two for an even count); `None` if empty.
pub fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The machine the bench ran on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// CPUs available to this process.
    pub cores: usize,
    /// Kernel release.
    pub kernel: String,
    /// Single-thread memcpy bandwidth, GB/s.
    pub memcpy_gbps: Option<f64>,
}

/// One driver's status in the run.
#[derive(Debug, Clone, Serialize)]
pub struct DriverStatus {
    /// `tcp`, `ofi+tcp`, `ofi+shm`, ...
    pub driver: String,
    /// The provider the driver reported (libfabric may layer one, e.g. `tcp;ofi_rxm`).
    pub provider: Option<String>,
    /// Why the driver failed, if it did.
    pub error: Option<String>,
}

/// One measured point (median over repetitions) or a failed one (values null, `error` set).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    /// Driver, or `iperf3` / `memcpy` for the references.
    pub driver: String,
    /// `send`, `write`, `read`, `latency`, `stream` (iperf3) or `copy` (memcpy).
    pub op: String,
    /// Bytes per operation.
    pub size: u64,
    /// Bandwidth, GB/s (10^9 bytes/s).
    pub gbps: Option<f64>,
    /// Latency, µs (half round trip).
    pub usec: Option<f64>,
    /// User+system CPU seconds of both sides for the point.
    pub cpu_s: Option<f64>,
    /// GB moved per CPU-second.
    pub gb_per_cpu_s: Option<f64>,
    /// Repetitions that produced the median.
    pub reps: usize,
    /// Why the point has no value.
    pub error: Option<String>,
}

/// The ratios and raw numbers a reader looks at first; null where a side is missing.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    /// iperf3 single-stream loopback, GB/s.
    pub iperf3_gbps: Option<f64>,
    /// Single-thread memcpy, GB/s.
    pub memcpy_gbps: Option<f64>,
    /// Native tcp RMA write at 4 MiB ÷ iperf3.
    pub tcp_write_vs_iperf3: Option<f64>,
    /// Native tcp RMA read at 4 MiB ÷ iperf3.
    pub tcp_read_vs_iperf3: Option<f64>,
    /// Native tcp send at 4 MiB ÷ iperf3.
    pub tcp_send_vs_iperf3: Option<f64>,
    /// libfabric tcp RMA write at 4 MiB ÷ iperf3.
    pub ofi_tcp_write_vs_iperf3: Option<f64>,
    /// libfabric shm RMA read at 4 MiB ÷ memcpy.
    pub shm_read_vs_memcpy: Option<f64>,
    /// Native tcp 8-byte latency, µs.
    pub tcp_latency_usec: Option<f64>,
    /// libfabric tcp 8-byte latency, µs.
    pub ofi_tcp_latency_usec: Option<f64>,
    /// libfabric shm 8-byte latency, µs.
    pub ofi_shm_latency_usec: Option<f64>,
}

/// Size at which the summary ratios are taken.
pub const SUMMARY_SIZE: u64 = 4 << 20;

impl Summary {
    /// Derives the summary from the rows.
    pub fn from_rows(rows: &[Row]) -> Summary {
        let get = |driver: &str, op: &str, size: u64| {
            rows.iter()
                .find(|r| r.driver == driver && r.op == op && (size == 0 || r.size == size))
                .and_then(|r| r.gbps.or(r.usec))
        };
        let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?).filter(|r| r.is_finite());
        let iperf3 = get("iperf3", "stream", 0);
        let memcpy = get("memcpy", "copy", 0);
        Summary {
            iperf3_gbps: iperf3,
            memcpy_gbps: memcpy,
            tcp_write_vs_iperf3: ratio(get("tcp", "write", SUMMARY_SIZE), iperf3),
            tcp_read_vs_iperf3: ratio(get("tcp", "read", SUMMARY_SIZE), iperf3),
            tcp_send_vs_iperf3: ratio(get("tcp", "send", SUMMARY_SIZE), iperf3),
            ofi_tcp_write_vs_iperf3: ratio(get("ofi+tcp", "write", SUMMARY_SIZE), iperf3),
            shm_read_vs_memcpy: ratio(get("ofi+shm", "read", SUMMARY_SIZE), memcpy),
            tcp_latency_usec: get("tcp", "latency", 8),
            ofi_tcp_latency_usec: get("ofi+tcp", "latency", 8),
            ofi_shm_latency_usec: get("ofi+shm", "latency", 8),
        }
    }
}

impl Summary {
    /// The fields in declaration order, for the table.
    pub fn entries(&self) -> [(&'static str, Option<f64>); 10] {
        [
            ("iperf3_gbps", self.iperf3_gbps),
            ("memcpy_gbps", self.memcpy_gbps),
            ("tcp_write_vs_iperf3", self.tcp_write_vs_iperf3),
            ("tcp_read_vs_iperf3", self.tcp_read_vs_iperf3),
            ("tcp_send_vs_iperf3", self.tcp_send_vs_iperf3),
            ("ofi_tcp_write_vs_iperf3", self.ofi_tcp_write_vs_iperf3),
            ("shm_read_vs_memcpy", self.shm_read_vs_memcpy),
            ("tcp_latency_usec", self.tcp_latency_usec),
            ("ofi_tcp_latency_usec", self.ofi_tcp_latency_usec),
            ("ofi_shm_latency_usec", self.ofi_shm_latency_usec),
        ]
    }
}

/// Everything one `ferry bench fabric` run found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Always `fabric`.
    pub bench: &'static str,
    /// Run with `--quick`.
    pub quick: bool,
    /// Where it ran.
    pub machine: Machine,
    /// Each driver asked for, and whether it worked.
    pub drivers: Vec<DriverStatus>,
    /// Measured points, then the references.
    pub rows: Vec<Row>,
    /// Headline numbers.
    pub summary: Summary,
}

/// `4 KiB`, `16 MiB`, `8 B`.
pub fn human_size(n: u64) -> String {
    match n {
        _ if n >= 1 << 20 && n.trailing_zeros() >= 20 => format!("{} MiB", n >> 20),
        _ if n >= 1 << 10 && n.trailing_zeros() >= 10 => format!("{} KiB", n >> 10),
        _ => format!("{n} B"),
    }
}

fn num(v: Option<f64>, width: usize, prec: usize) -> String {
    v.map_or_else(
        || format!("{:>width$}", "-"),
        |x| format!("{x:>width$.prec$}"),
    )
}

impl Report {
    /// CSV of the rows, one header line.
    pub fn csv(&self) -> String {
        let mut s = String::from("driver,op,size,gbps,usec,cpu_s,gb_per_cpu_s,reps,error\n");
        let f = |v: Option<f64>| v.map(|x| format!("{x:.6}")).unwrap_or_default();
        for r in &self.rows {
            let err = r.error.as_deref().unwrap_or("").replace('"', "\"\"");
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},\"{err}\"",
                r.driver,
                r.op,
                r.size,
                f(r.gbps),
                f(r.usec),
                f(r.cpu_s),
                f(r.gb_per_cpu_s),
                r.reps
            );
        }
        s
    }

    /// The human-readable table.
    pub fn table(&self) -> String {
        let m = &self.machine;
        let sm = &self.summary;
        let mut s = String::new();
        let reps = self.rows.iter().map(|r| r.reps).max().unwrap_or(0);
        let _ = writeln!(
            s,
            "ferry bench fabric{}: loopback, {} cores, Linux {}; median of {reps} after warm-up",
            if self.quick { " --quick" } else { "" },
            m.cores,
            m.kernel
        );
        let refs = |v: Option<f64>, what: &str| match v {
            Some(x) => format!("{x:.2} GB/s"),
            None => format!("missing ({what})"),
        };
        let err_of = |d: &str| {
            let r = self.rows.iter().find(|r| r.driver == d);
            r.and_then(|r| r.error.clone()).unwrap_or_default()
        };
        let _ = writeln!(
            s,
            "references: iperf3 single stream {}, memcpy {}",
            refs(sm.iperf3_gbps, &err_of("iperf3")),
            refs(sm.memcpy_gbps, &err_of("memcpy"))
        );
        let providers: Vec<String> = self
            .drivers
            .iter()
            .map(|d| match &d.provider {
                Some(p) if *p != d.driver => format!("{} ({p})", d.driver),
                _ => d.driver.clone(),
            })
            .collect();
        let _ = writeln!(s, "drivers: {}\n", providers.join(", "));
        let _ = write!(
            s,
            "{:<9} {:<8} {:>7} {:>10} {:>8} {:>8} {:>7} {:>9}",
            "driver", "op", "size", "GB/s", "×iperf3", "×memcpy", "cpu s", "GB/cpu·s"
        );
        for d in &self.drivers {
            s.push('\n');
            let rows: Vec<&Row> = self.rows.iter().filter(|r| r.driver == d.driver).collect();
            if rows.iter().all(|r| r.error.is_some()) {
                let why = d
                    .error
                    .as_deref()
                    .or(rows.first().and_then(|r| r.error.as_deref()));
                let _ = writeln!(s, "{:<9} FAILED: {}", d.driver, why.unwrap_or("no result"));
                continue;
            }
            for r in rows {
                let _ = write!(s, "{:<9} {:<8} {:>7} ", r.driver, r.op, human_size(r.size));
                if let Some(e) = &r.error {
                    let _ = writeln!(s, "{:>10} {e}", "failed");
                } else if let Some(us) = r.usec {
                    let _ = writeln!(
                        s,
                        "{:>7.1} µs {:>8} {:>8} {}",
                        us,
                        "",
                        "",
                        num(r.cpu_s, 7, 2)
                    );
                } else {
                    let vs = |b: Option<f64>| num(r.gbps.zip(b).map(|(g, b)| g / b), 8, 2);
                    let _ = writeln!(
                        s,
                        "{} {} {} {} {}",
                        num(r.gbps, 10, 2),
                        vs(sm.iperf3_gbps),
                        vs(sm.memcpy_gbps),
                        num(r.cpu_s, 7, 2),
                        num(r.gb_per_cpu_s, 9, 2)
                    );
                }
            }
        }
        let _ = writeln!(s, "\nsummary (ratios at {}):", human_size(SUMMARY_SIZE));
        for (k, v) in sm.entries() {
            let v = v.map_or("null".into(), |x| format!("{x:.3}"));
            let _ = writeln!(s, "  {k:<26} {v}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(driver: &str, op: &str, size: u64, gbps: Option<f64>) -> Row {
        Row {
            driver: driver.into(),
            op: op.into(),
            size,
            gbps,
            usec: None,
            cpu_s: Some(0.5),
            gb_per_cpu_s: None,
            reps: 1,
            error: gbps
                .is_none()
                .then(|| "fabric driver unavailable: \"x\"".into()),
        }
    }

    fn report() -> Report {
        let rows = vec![
            row("tcp", "write", SUMMARY_SIZE, Some(3.0)),
            row("tcp", "read", SUMMARY_SIZE, None),
            row("iperf3", "stream", 131072, Some(6.0)),
            row("memcpy", "copy", 64 << 20, Some(10.0)),
        ];
        Report {
            bench: "fabric",
            quick: true,
            machine: Machine {
                cores: 2,
                kernel: "6.1".into(),
                memcpy_gbps: Some(10.0),
            },
            drivers: vec![DriverStatus {
                driver: "tcp".into(),
                provider: Some("tcp".into()),
                error: None,
            }],
            summary: Summary::from_rows(&rows),
            rows,
        }
    }

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
    }

    #[test]
    fn summary_ratios_and_nulls() {
        let s = report().summary;
        assert_eq!(s.tcp_write_vs_iperf3, Some(0.5));
        assert_eq!(s.tcp_read_vs_iperf3, None);
        assert_eq!(s.shm_read_vs_memcpy, None);
        assert_eq!((s.iperf3_gbps, s.memcpy_gbps), (Some(6.0), Some(10.0)));
    }

    #[test]
    fn json_shape() {
        let v = serde_json::to_value(report()).unwrap();
        assert_eq!(v["bench"], "fabric");
        assert_eq!(v["machine"]["cores"], 2);
        assert_eq!(v["rows"][0]["gbps"], 3.0);
        assert!(v["rows"][1]["gbps"].is_null());
        for k in [
            "tcp_write_vs_iperf3",
            "ofi_tcp_write_vs_iperf3",
            "shm_read_vs_memcpy",
        ] {
            assert!(v["summary"].get(k).is_some(), "{k} missing");
        }
        assert!(v["summary"]["ofi_shm_latency_usec"].is_null());
    }

    #[test]
    fn csv_shape() {
        let csv = report().csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[0].split(',').count(), 9);
        assert_eq!(lines[1], "tcp,write,4194304,3.000000,,0.500000,,1,\"\"");
        assert!(lines[2].ends_with(",1,\"fabric driver unavailable: \"\"x\"\"\""));
    }

    #[test]
    fn table_reads() {
        let t = report().table();
        assert!(t.contains("iperf3 single stream 6.00 GB/s"), "{t}");
        assert!(t.contains("4 MiB"));
        assert!(t.contains("tcp_write_vs_iperf3"));
        assert_eq!(human_size(8), "8 B");
        assert_eq!(human_size(16 << 10), "16 KiB");
    }
}
