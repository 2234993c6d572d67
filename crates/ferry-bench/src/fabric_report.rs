//! `ferry bench fabric`'s rows and summary, and their renderings (table, CSV, plot).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use super::plot::{self, Axis, Corner, Panel, RefLine, Series};
use super::report::{human_size, num, Report};

/// One measured point (median over repetitions) or a failed one (values null, `error` set).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
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

impl Report {
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

impl Report {
    /// Draws bandwidth against transfer size, one line per driver and operation, iperf3 and
    /// memcpy as reference lines; false if the font is missing.
    pub fn png(&self, path: &Path) -> Result<bool> {
        let mut series: Vec<Series> = Vec::new();
        for r in self.rows.iter().filter(|r| r.usec.is_none()) {
            let (Some(g), false) = (r.gbps, matches!(r.driver.as_str(), "iperf3" | "memcpy"))
            else {
                continue;
            };
            let name = format!("{} {}", r.driver, r.op);
            let point = (r.size as f64, g);
            match series.iter_mut().find(|s| s.name == name) {
                Some(s) => s.points.push(point),
                None => series.push(Series {
                    name,
                    points: vec![point],
                }),
            }
        }
        let refs = [
            ("iperf3 single stream", self.summary.iperf3_gbps),
            ("memcpy", self.summary.memcpy_gbps),
        ]
        .into_iter()
        .filter_map(|(n, v)| {
            Some(RefLine {
                name: n.into(),
                y: v?,
                unit: "GB/s",
            })
        })
        .collect();
        let title = format!(
            "ferry bench fabric{} — loopback, {} cores",
            if self.quick { " --quick" } else { "" },
            self.machine.cores
        );
        let panel = Panel {
            title: String::new(),
            x_desc: "transfer size".into(),
            y_desc: "GB/s (10^9 B/s)".into(),
            x: Axis::Log2Bytes,
            log_y: false,
            series,
            refs,
            legend: Corner::UpperLeft,
        };
        plot::write_png(path, &title, &[panel], 1, (1100, 660))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{DriverStatus, Machine};

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
                loadavg: None,
            },
            drivers: vec![DriverStatus {
                driver: "tcp".into(),
                provider: Some("tcp".into()),
                error: None,
            }],
            summary: Summary::from_rows(&rows),
            rows,
            targets: vec![],
        }
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
        let csv = crate::report::csv(&report().rows).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(
            lines[0],
            "driver,op,size,gbps,usec,cpu_s,gb_per_cpu_s,reps,error"
        );
        assert_eq!(lines[1], "tcp,write,4194304,3.000000,,0.500000,,1,");
        assert!(lines[2].ends_with(",1,\"fabric driver unavailable: \"\"x\"\"\""));
        // No rows: still the header.
        assert_eq!(
            crate::report::csv::<Row>(&[]).unwrap(),
            lines[0].to_string() + "\n"
        );
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
