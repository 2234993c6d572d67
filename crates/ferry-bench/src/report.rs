//! What every bench report shares: the JSON envelope, the machine, driver status, targets,
//! medians, number formatting, and writing the result files.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde::Serialize;
use serde_json::Value;

use super::fabric_report::{Row, Summary};

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
    /// One-minute load average at the end of the run, the bench's own processes included
    /// (other work competing for the cores shows up as noise).
    pub loadavg: Option<f64>,
}

impl Machine {
    /// This machine, with a memcpy bandwidth measured by the caller.
    pub fn detect(memcpy_gbps: Option<f64>) -> Machine {
        let load = std::fs::read_to_string("/proc/loadavg").ok();
        Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map_or_else(|_| "unknown".into(), |k| k.trim().to_string()),
            memcpy_gbps,
            loadavg: load.and_then(|l| l.split_whitespace().next()?.parse().ok()),
        }
    }
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

impl DriverStatus {
    /// A driver not yet tried.
    pub fn new(driver: &str) -> DriverStatus {
        DriverStatus {
            driver: driver.into(),
            provider: None,
            error: None,
        }
    }
}

/// A goal the issue sets for a summary metric, and whether this run met it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Target {
    /// Summary key.
    pub metric: String,
    /// `<=` or `>=`.
    pub op: &'static str,
    /// The bound.
    pub target: f64,
    /// The measured value (null if missing).
    pub value: Option<f64>,
    /// Met (null if the value is missing).
    pub pass: Option<bool>,
}

impl Target {
    /// Checks `value` against `op target`.
    pub fn check(metric: &str, op: &'static str, target: f64, value: Option<f64>) -> Target {
        let pass = value.map(|v| if op == "<=" { v <= target } else { v >= target });
        Target {
            metric: metric.into(),
            op,
            target,
            value,
            pass,
        }
    }

    /// `pass`, `FAIL` or `missing`.
    pub fn verdict(&self) -> &'static str {
        match self.pass {
            Some(true) => "pass",
            Some(false) => "FAIL",
            None => "missing",
        }
    }
}

/// Everything one bench run found: the JSON envelope of `--json` (see bench/results/README.md).
#[derive(Debug, Clone, Serialize)]
pub struct Report<R = Row, S = Summary> {
    /// The bench's name.
    pub bench: &'static str,
    /// Run with `--quick`.
    pub quick: bool,
    /// Where it ran.
    pub machine: Machine,
    /// Each driver asked for, and whether it worked.
    pub drivers: Vec<DriverStatus>,
    /// Measured points, then the references.
    pub rows: Vec<R>,
    /// Headline numbers.
    pub summary: S,
    /// Goals for summary metrics, where the issue sets them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<Target>,
}

/// `4 KiB`, `16 MiB`, `8 B`.
pub fn human_size(n: u64) -> String {
    match n {
        _ if n >= 1 << 20 && n.trailing_zeros() >= 20 => format!("{} MiB", n >> 20),
        _ if n >= 1 << 10 && n.trailing_zeros() >= 10 => format!("{} KiB", n >> 10),
        _ => format!("{n} B"),
    }
}

/// `v` right-aligned in `width` with `prec` decimals, or `-` if missing.
pub fn num(v: Option<f64>, width: usize, prec: usize) -> String {
    v.map_or_else(
        || format!("{:>width$}", "-"),
        |x| format!("{x:>width$.prec$}"),
    )
}

/// A report's summary as text, one line per metric: its value, the goal and verdict where
/// the issue sets one, and (from `best`) the rows it compared; keys padded to `width`.
pub fn summary_text(
    s: &mut String,
    summary: &[(String, Option<f64>)],
    targets: &[Target],
    best: Option<&std::collections::BTreeMap<String, String>>,
    width: usize,
) {
    use std::fmt::Write as _;
    for (k, v) in summary {
        let t = targets.iter().find(|t| t.metric == *k);
        let goal = t.map_or(String::new(), |t| format!("{} {}", t.op, t.target));
        let verdict = t.map_or("", Target::verdict);
        let names = best.and_then(|b| b.get(k)).map_or("", String::as_str);
        let line = format!(
            "  {k:<width$} {} {goal:<8} {verdict:<7} {names}",
            num(*v, 7, 3)
        );
        let _ = writeln!(s, "{}", line.trim_end());
    }
}

/// The rows as CSV, the one writer of every bench: a header line of the row type's field
/// names, then a line per row with the same cells its JSON has, in field order. Missing
/// values are empty cells, fractions have six decimals, integers none, and text is quoted
/// only when it holds a comma, quote or line break (RFC 4180). `R::default()` names the
/// columns, so a run without rows still writes its header.
pub fn csv<R: Serialize + Default>(rows: &[R]) -> Result<String> {
    let header = fields(&R::default())?;
    let mut out = header
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(",");
    out.push('\n');
    for row in rows {
        let cells: Vec<String> = fields(row)?.iter().map(|(_, v)| csv_cell(v)).collect();
        out += &cells.join(",");
        out.push('\n');
    }
    Ok(out)
}

/// A row's fields (name, JSON value) in declaration order. serde_json's own map would sort
/// them, so the row's JSON text is read back through [`Fields`], which keeps its order.
fn fields<R: Serialize>(row: &R) -> Result<Vec<(String, Value)>> {
    let text = serde_json::to_string(row).context("serializing a row")?;
    let Fields(f) = serde_json::from_str(&text).context("a row must be a struct of fields")?;
    Ok(f)
}

/// A JSON object's entries in the order they come.
struct Fields(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Fields, D::Error> {
        struct InOrder;
        impl<'de> Visitor<'de> for InOrder {
            type Value = Fields;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Fields, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = m.next_entry()? {
                    entries.push(entry);
                }
                Ok(Fields(entries))
            }
        }
        d.deserialize_map(InOrder)
    }
}

/// One CSV cell of a JSON value (see [`csv`]).
fn csv_cell(v: &Value) -> String {
    let text = match v {
        Value::Null => return String::new(),
        Value::Number(n) => match n.as_f64().filter(|_| n.is_f64()) {
            Some(x) => return format!("{x:.6}"),
            None => return n.to_string(),
        },
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match text.contains([',', '"', '\n', '\r']) {
        true => format!("\"{}\"", text.replace('"', "\"\"")),
        false => text,
    }
}

/// `x` rounded to `digits` decimals (what the clocks can tell apart).
pub fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// Draws a PNG to the path given; false when it could not (e.g. the font is missing).
pub type Draw<'a> = &'a dyn Fn(&Path) -> Result<bool>;

/// Where a bench's report goes: `--json` prints exactly one JSON object on stdout (files
/// only with `--out`); otherwise the table is printed and `<name>.csv` (the `rows`, see
/// [`csv`]), `<name>.json` (the whole report) and `<name>.png` are written to `--out`
/// (default `bench/results/<name>`).
pub fn emit<R: Serialize, Row: Serialize + Default>(
    name: &str,
    report: &R,
    rows: &[Row],
    table: &str,
    png: Draw<'_>,
    json: bool,
    out: Option<&Path>,
) -> Result<()> {
    let write = |dir: &Path| {
        let pretty = serde_json::to_string_pretty(report)? + "\n";
        write_files(
            dir,
            &[
                (&format!("{name}.csv"), csv(rows)?),
                (&format!("{name}.json"), pretty),
            ],
            &[(&format!("{name}.png"), png)],
        )
    };
    if json {
        println!("{}", serde_json::to_string(report)?);
        if let Some(dir) = out {
            write(dir)?;
        }
        return Ok(());
    }
    print!("{table}");
    let default = PathBuf::from("bench/results").join(name);
    for f in write(out.unwrap_or(&default))? {
        println!("wrote {}", f.display());
    }
    Ok(())
}

/// Writes `files` (name, contents) under `dir`, then each PNG (name, drawing); returns the
/// paths written.
pub fn write_files(
    dir: &Path,
    files: &[(&str, String)],
    pngs: &[(&str, Draw<'_>)],
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    for (name, body) in files {
        let p = dir.join(name);
        std::fs::write(&p, body).with_context(|| format!("writing {}", p.display()))?;
        written.push(p);
    }
    for (name, draw) in pngs {
        let p = dir.join(name);
        if draw(&p)? {
            written.push(p);
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
    }

    #[test]
    fn targets_and_formatting() {
        assert_eq!(Target::check("a", "<=", 0.6, Some(0.5)).verdict(), "pass");
        assert_eq!(Target::check("a", ">=", 0.95, Some(0.5)).verdict(), "FAIL");
        assert_eq!(Target::check("a", ">=", 0.95, None).verdict(), "missing");
        assert_eq!(human_size(8), "8 B");
        assert_eq!(human_size(16 << 10), "16 KiB");
        assert_eq!(round(1.23456, 2), 1.23);
    }
}
