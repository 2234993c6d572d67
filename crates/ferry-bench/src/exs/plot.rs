//! `exs.png`: one column per driver; rows: throughput against payload per mode (with the
//! socket blast and the driver's fabric read as references), throughput against transfers in
//! flight, and latency per mode.

use std::path::Path;

use anyhow::Result;

use super::report::{ExsRow, ExsSummary};
use crate::plot::{self, Axis, Corner, Panel, RefLine, Series};
use crate::report::{human_size, Report};

impl Report<ExsRow, ExsSummary> {
    /// Draws the figure; false if the font is missing.
    pub fn png(&self, path: &Path) -> Result<bool> {
        let drivers: Vec<&str> = self.drivers.iter().map(|d| d.driver.as_str()).collect();
        let mut panels = Vec::new();
        for d in &drivers {
            panels.push(self.throughput_panel(d));
        }
        for d in &drivers {
            panels.push(self.inflight_panel(d));
        }
        for d in &drivers {
            panels.push(self.latency_panel(d));
        }
        let title = format!(
            "ferry bench exs{} — loopback, {} cores, EXS peer in its own process",
            if self.quick { " --quick" } else { "" },
            self.machine.cores
        );
        plot::write_png(path, &title, &panels, drivers.len(), (640, 440))
    }

    /// Lines of (x, value) over the rows `keep` selects, grouped by `name`.
    fn series(
        &self,
        keep: impl Fn(&ExsRow) -> bool,
        name: impl Fn(&ExsRow) -> String,
        x: impl Fn(&ExsRow) -> f64,
    ) -> Vec<Series> {
        let mut out: Vec<Series> = Vec::new();
        for r in self.rows.iter().filter(|r| keep(r)) {
            let Some(v) = r.gbps.or(r.usec) else { continue };
            let n = name(r);
            match out.iter_mut().find(|s| s.name == n) {
                Some(s) => s.points.push((x(r), v)),
                None => out.push(Series {
                    name: n,
                    points: vec![(x(r), v)],
                }),
            }
        }
        out
    }

    fn throughput_panel(&self, d: &str) -> Panel {
        let exs = ["normal", "immediate", "persistent"];
        let series = self.series(
            |r| r.driver == d && r.op == "stream" && exs.contains(&r.mode.as_str()),
            |r| r.mode.clone(),
            |r| r.size as f64,
        );
        let find = |drv: &str, mode: &str| {
            let r = self.rows.iter().find(|r| r.driver == drv && r.mode == mode);
            r.and_then(|r| Some((r, r.gbps?)))
        };
        let mut refs = Vec::new();
        if let Some((r, y)) = find("socket", "blast") {
            let name = format!("TCP socket blast ({})", human_size(r.size));
            refs.push(RefLine {
                name,
                y,
                unit: "GB/s",
            });
        }
        if let Some((r, y)) = find(d, "fabric-read") {
            let name = format!("fabric RMA read ({})", human_size(r.size));
            refs.push(RefLine {
                name,
                y,
                unit: "GB/s",
            });
        }
        Panel {
            title: format!("{d}: throughput by payload"),
            x_desc: "payload".into(),
            y_desc: "GB/s (log)".into(),
            x: Axis::Log2Bytes,
            log_y: true,
            series,
            refs,
            legend: Corner::LowerRight,
        }
    }

    fn inflight_panel(&self, d: &str) -> Panel {
        let series = self.series(
            |r| r.driver == d && r.op == "inflight",
            |r| format!("{} {}", r.mode, human_size(r.size)),
            |r| r.inflight.unwrap_or(0) as f64,
        );
        Panel {
            title: format!("{d}: throughput by transfers in flight"),
            x_desc: "transfers in flight".into(),
            y_desc: "GB/s".into(),
            x: Axis::Linear,
            log_y: false,
            series,
            refs: vec![],
            legend: Corner::LowerRight,
        }
    }

    fn latency_panel(&self, d: &str) -> Panel {
        let series = self.series(
            |r| r.driver == d && r.op == "latency",
            |r| match r.mode.as_str() {
                "persistent" => "persistent (half a pull)".into(),
                m => format!("{m} (one-way)"),
            },
            |r| r.size as f64,
        );
        Panel {
            title: format!("{d}: latency"),
            x_desc: "payload".into(),
            y_desc: "µs".into(),
            x: Axis::Log10Bytes,
            log_y: false,
            series,
            refs: vec![],
            legend: Corner::UpperRight,
        }
    }
}
