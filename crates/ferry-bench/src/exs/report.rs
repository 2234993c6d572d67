//! `ferry bench exs`'s rows, summary and targets, and their table and CSV.

use std::fmt::Write as _;

use serde::ser::{Serialize, SerializeMap, Serializer};

use super::grid::{LARGE, PING};
use super::pairs::Pairs;
use crate::report::{human_size, num, round, Report, Target};

/// One measured point (median over repetitions) or a failed one (values null, `error` set).
#[derive(Debug, Clone, Default, serde::Serialize, PartialEq)]
pub struct ExsRow {
    /// Driver, or `socket` for the plain TCP blast.
    pub driver: String,
    /// `normal`, `immediate`, `persistent`, the paired ping-pongs between two fresh
    /// processes in normal mode (`rust`: the Rust runtime, blocking dequeues; `poll`: the
    /// same polling; `capi`: through libferry's C API, blocking; `capi-poll`: the same
    /// polling), `fabric-read` (the driver's raw RMA read) or `blast` (the socket).
    pub mode: String,
    /// `stream` (size sweep), `inflight` (in-flight sweep) or `latency`.
    pub op: String,
    /// Payload bytes per message (write size for the blast).
    pub size: u64,
    /// Transfers in flight (throughput rows).
    pub inflight: Option<usize>,
    /// Throughput: bytes received per second, GB/s (10^9 B/s).
    pub gbps: Option<f64>,
    /// One-way latency, µs: half a round trip (a ping-pong for normal and immediate; one
    /// pull of the peer's block, recv posted → completed, for persistent).
    pub usec: Option<f64>,
    /// User+system CPU seconds of the sending process.
    pub send_cpu_s: Option<f64>,
    /// User+system CPU seconds of the receiving process.
    pub recv_cpu_s: Option<f64>,
    /// GB received per CPU-second of the sender.
    pub send_gb_per_cpu_s: Option<f64>,
    /// GB received per CPU-second of the receiver.
    pub recv_gb_per_cpu_s: Option<f64>,
    /// Repetitions that produced the median.
    pub reps: usize,
    /// Why the point has no value.
    pub error: Option<String>,
}

/// The summary: named numbers in a fixed order (JSON object; null where a side is missing).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExsSummary(pub Vec<(String, Option<f64>)>);

impl Serialize for ExsSummary {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl ExsSummary {
    /// The value of `key` (None if missing or null).
    pub fn get(&self, key: &str) -> Option<f64> {
        self.0.iter().find(|(k, _)| k == key).and_then(|(_, v)| *v)
    }
}

/// Goals per summary metric prefix: (prefix, op, bound). All but `tcp_exs_vs_socket` are
/// also given per driver, in this order (see [`summary`]).
const GOALS: [(&str, &str, f64); 6] = [
    ("immediate_vs_normal_latency", "<=", 0.6),
    ("persistent_vs_normal_latency", "<=", 0.45),
    ("large_vs_fabric", ">=", 0.95),
    ("capi_vs_rust_latency", "<=", 1.1),
    ("poll_vs_block_latency", "<=", 1.0),
    ("tcp_exs_vs_socket", ">=", 0.95),
];
/// How many of [`GOALS`] are per-driver ratios.
const PER_DRIVER: usize = 5;

/// `tcp` → `_tcp`, `ofi+shm` → `_ofi_shm`.
fn suffix(driver: &str) -> String {
    format!("_{}", driver.replace(['+', '-'], "_"))
}

/// Derives the summary: each ratio per driver (suffixed), and unsuffixed for the native tcp
/// driver; `capi_vs_rust_latency` and `poll_vs_block_latency` from the paired rounds, the
/// others from the rows.
pub fn summary(rows: &[ExsRow], drivers: &[String], pairs: &[Pairs]) -> ExsSummary {
    let find = |d: &str, mode: &str, op: &str, size: usize| {
        let r = rows
            .iter()
            .find(|r| r.driver == d && r.mode == mode && r.op == op && r.size == size as u64);
        r.and_then(|r| r.gbps.or(r.usec))
    };
    let ratio = |a: Option<f64>, b: Option<f64>| Some(round(a? / b?, 4)).filter(|r| r.is_finite());
    let lat = |d: &str, mode: &str| find(d, mode, "latency", PING);
    let paired = |d: &str| pairs.iter().find(|p| p.driver == d);
    // In GOALS order.
    let metrics = |d: &str| -> [Option<f64>; PER_DRIVER] {
        [
            ratio(lat(d, "immediate"), lat(d, "normal")),
            ratio(lat(d, "persistent"), lat(d, "normal")),
            ratio(
                find(d, "normal", "stream", LARGE),
                find(d, "fabric-read", "stream", LARGE),
            ),
            paired(d).and_then(Pairs::capi_vs_rust),
            paired(d).and_then(Pairs::poll_vs_block),
        ]
    };
    let socket = find("socket", "blast", "stream", LARGE);
    let tcp = metrics("tcp");
    let mut out: Vec<(String, Option<f64>)> = GOALS[..PER_DRIVER]
        .iter()
        .zip(tcp)
        .map(|((prefix, ..), v)| (prefix.to_string(), v))
        .collect();
    out.push((
        GOALS[PER_DRIVER].0.to_string(),
        ratio(find("tcp", "normal", "stream", LARGE), socket),
    ));
    let mut all: Vec<&str> = vec!["tcp", "ofi+tcp", "ofi+shm"];
    for d in drivers {
        if !all.contains(&d.as_str()) {
            all.push(d);
        }
    }
    for (i, (prefix, ..)) in GOALS[..PER_DRIVER].iter().enumerate() {
        for d in &all {
            out.push((format!("{prefix}{}", suffix(d)), metrics(d)[i]));
        }
    }
    out.push(("socket_gbps".into(), socket));
    ExsSummary(out)
}

/// Each ratio in the summary checked against the goal its name starts with.
pub fn targets(s: &ExsSummary) -> Vec<Target> {
    let goal = |k: &str| GOALS.into_iter().find(|(p, ..)| k.starts_with(p));
    s.0.iter()
        .filter_map(|(k, v)| goal(k).map(|(_, op, t)| Target::check(k, op, t, *v)))
        .collect()
}

/// GB/s with three significant digits (1 B messages move thousandths of a GB/s).
fn gbps(v: Option<f64>, width: usize) -> String {
    let digits = |x: f64| (2 - x.abs().max(1e-12).log10().floor() as i32).clamp(2, 9) as usize;
    v.map_or_else(
        || format!("{:>width$}", "-"),
        |x| format!("{x:>width$.*}", digits(x)),
    )
}

impl Report<ExsRow, ExsSummary> {
    /// The human-readable table.
    pub fn table(&self) -> String {
        let m = &self.machine;
        let mut s = String::new();
        let reps = self.rows.iter().map(|r| r.reps).max().unwrap_or(0);
        let _ = writeln!(
            s,
            "ferry bench exs{}: loopback, {} cores, Linux {}, load {}; median of {reps} after \
             warm-up",
            if self.quick { " --quick" } else { "" },
            m.cores,
            m.kernel,
            num(m.loadavg, 0, 2)
        );
        let _ = writeln!(
            s,
            "EXS peer in its own process: it sends, this process receives and times; \
             CPU is getrusage user+sys of each process"
        );
        let socket = self.summary.get("socket_gbps");
        let blast_err = self.rows.iter().find(|r| r.mode == "blast");
        let blast = match (socket, blast_err.and_then(|r| r.error.as_deref())) {
            (Some(g), _) => format!("{g:.2} GB/s"),
            (None, e) => format!("missing ({})", e.unwrap_or("not run")),
        };
        let _ = writeln!(
            s,
            "references: TCP socket blast ({} writes) {blast}, memcpy {} GB/s",
            human_size(LARGE as u64),
            num(m.memcpy_gbps, 0, 2)
        );
        let providers: Vec<String> = self
            .drivers
            .iter()
            .map(|d| match (&d.provider, &d.error) {
                (_, Some(e)) => format!("{} (FAILED: {e})", d.driver),
                (Some(p), None) if *p != d.driver => format!("{} ({p})", d.driver),
                _ => d.driver.clone(),
            })
            .collect();
        let _ = writeln!(s, "drivers: {}\n", providers.join(", "));
        self.throughput_table(&mut s, socket);
        self.latency_table(&mut s);
        let _ = writeln!(s, "\nsummary:");
        let _ = writeln!(
            s,
            "  {:<36} {:>8}  {:<8} verdict",
            "metric", "value", "target"
        );
        for (k, v) in &self.summary.0 {
            let t = self.targets.iter().find(|t| t.metric == *k);
            let goal = t.map_or(String::new(), |t| format!("{} {}", t.op, t.target));
            let verdict = t.map_or("", Target::verdict);
            let _ = writeln!(s, "  {k:<36} {} {goal:<9} {verdict}", num(*v, 8, 3));
        }
        s
    }

    fn throughput_table(&self, s: &mut String, socket: Option<f64>) {
        let _ = writeln!(
            s,
            "throughput (bytes received / time)\n{:<8} {:<11} {:<8} {:>7} {:>3} {:>11} {:>8} \
             {:>7} {:>7} {:>9} {:>9}",
            "driver",
            "mode",
            "op",
            "size",
            "×N",
            "GB/s",
            "×socket",
            "snd cpu",
            "rcv cpu",
            "snd GB/cs",
            "rcv GB/cs"
        );
        for r in self.rows.iter().filter(|r| r.op != "latency") {
            let _ = write!(
                s,
                "{:<8} {:<11} {:<8} {:>7} {:>3} ",
                r.driver,
                r.mode,
                r.op,
                human_size(r.size),
                r.inflight.map_or(String::new(), |n| n.to_string())
            );
            if let Some(e) = &r.error {
                let _ = writeln!(s, "{:>11} {e}", "failed");
                continue;
            }
            let vs = r.gbps.zip(socket).map(|(g, b)| g / b);
            let _ = writeln!(
                s,
                "{} {} {} {} {} {}",
                gbps(r.gbps, 11),
                num(vs, 8, 3),
                num(r.send_cpu_s, 7, 2),
                num(r.recv_cpu_s, 7, 2),
                num(r.send_gb_per_cpu_s, 9, 2),
                num(r.recv_gb_per_cpu_s, 9, 2)
            );
        }
    }

    fn latency_table(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\nlatency, µs (normal, immediate: one-way = half a ping-pong round trip; \
             persistent: half of one pull, recv posted → completed; rust, poll, capi, \
             capi-poll: normal between two fresh processes, Rust or libferry's C API, \
             blocking or zero-timeout dequeues)\n\
             {:<8} {:<11} {:>7} {:>9} {:>8}",
            "driver", "mode", "size", "µs", "×normal"
        );
        for r in self.rows.iter().filter(|r| r.op == "latency") {
            let _ = write!(
                s,
                "{:<8} {:<11} {:>7} ",
                r.driver,
                r.mode,
                human_size(r.size)
            );
            if let Some(e) = &r.error {
                let _ = writeln!(s, "{:>9} {e}", "failed");
                continue;
            }
            let normal = self.rows.iter().find(|n| {
                n.driver == r.driver && n.mode == "normal" && n.op == r.op && n.size == r.size
            });
            let vs = r.usec.zip(normal.and_then(|n| n.usec)).map(|(a, b)| a / b);
            let _ = writeln!(s, "{} {}", num(r.usec, 9, 1), num(vs, 8, 3));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::capi::PingPong;
    use super::*;

    #[test]
    fn csv_columns_are_the_documented_ones() {
        let csv = crate::report::csv::<ExsRow>(&[]).unwrap();
        assert_eq!(csv, "driver,mode,op,size,inflight,gbps,usec,send_cpu_s,recv_cpu_s,send_gb_per_cpu_s,recv_gb_per_cpu_s,reps,error\n");
    }

    fn row(driver: &str, mode: &str, op: &str, size: usize, v: f64) -> ExsRow {
        let lat = op == "latency";
        ExsRow {
            driver: driver.into(),
            mode: mode.into(),
            op: op.into(),
            size: size as u64,
            inflight: None,
            gbps: (!lat).then_some(v),
            usec: lat.then_some(v),
            send_cpu_s: Some(0.1),
            recv_cpu_s: Some(0.2),
            send_gb_per_cpu_s: None,
            recv_gb_per_cpu_s: None,
            reps: 1,
            error: None,
        }
    }

    #[test]
    fn summary_keys_ratios_and_targets() {
        let rows = vec![
            row("tcp", "normal", "latency", 10, 50.0),
            row("tcp", "immediate", "latency", 10, 20.0),
            row("tcp", "persistent", "latency", 10, 25.0),
            // The latency ratios of the paired rows come from the paired rounds, not these.
            row("tcp", "capi", "latency", 10, 80.0),
            row("tcp", "poll", "latency", 10, 80.0),
            row("ofi+shm", "normal", "latency", 10, 20.0),
            row("tcp", "normal", "stream", LARGE, 1.9),
            row("tcp", "fabric-read", "stream", LARGE, 2.0),
            row("socket", "blast", "stream", LARGE, 1.0),
        ];
        let pp = |block_us, poll_us| PingPong {
            block_us,
            poll_us,
            send_cpu: 0.0,
            recv_cpu: 0.0,
        };
        let mut tcp = Pairs::new("tcp");
        tcp.add(&pp(50.0, 45.0), Some(&pp(52.5, 50.0)));
        let mut shm = Pairs::new("ofi+shm");
        shm.add(&pp(20.0, 22.0), None);
        let s = summary(&rows, &["tcp".into()], &[tcp, shm]);
        assert_eq!(s.get("immediate_vs_normal_latency"), Some(0.4));
        assert_eq!(s.get("immediate_vs_normal_latency_tcp"), Some(0.4));
        assert_eq!(s.get("persistent_vs_normal_latency"), Some(0.5));
        assert_eq!(s.get("large_vs_fabric_tcp"), Some(0.95));
        assert_eq!(s.get("tcp_exs_vs_socket"), Some(1.9));
        assert_eq!(s.get("capi_vs_rust_latency"), Some(1.05));
        assert_eq!(s.get("capi_vs_rust_latency_tcp"), Some(1.05));
        assert_eq!(s.get("poll_vs_block_latency_tcp"), Some(0.9));
        assert_eq!(s.get("poll_vs_block_latency_ofi_shm"), Some(1.1));
        assert!(s
            .0
            .iter()
            .any(|(k, v)| k == "capi_vs_rust_latency_ofi_shm" && v.is_none()));
        assert!(s
            .0
            .iter()
            .any(|(k, v)| k == "large_vs_fabric_ofi_shm" && v.is_none()));
        let t = targets(&s);
        let verdict = |k: &str| t.iter().find(|t| t.metric == k).map(Target::verdict);
        assert_eq!(verdict("immediate_vs_normal_latency"), Some("pass"));
        assert_eq!(verdict("persistent_vs_normal_latency"), Some("FAIL"));
        assert_eq!(verdict("large_vs_fabric_ofi_tcp"), Some("missing"));
        assert_eq!(verdict("socket_gbps"), None);
        assert_eq!(verdict("capi_vs_rust_latency_tcp"), Some("pass"));
        assert_eq!(verdict("poll_vs_block_latency_ofi_shm"), Some("FAIL"));
        assert_eq!(verdict("capi_vs_rust_latency_ofi_shm"), Some("missing"));
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["tcp_exs_vs_socket"], 1.9);
        assert!(json["immediate_vs_normal_latency_ofi_tcp"].is_null());
    }

    #[test]
    fn small_throughputs_keep_their_digits() {
        assert_eq!(gbps(Some(0.0000234), 0), "0.0000234");
        assert_eq!(gbps(Some(2.346), 0), "2.35");
        assert_eq!(gbps(None, 2), " -");
    }
}
