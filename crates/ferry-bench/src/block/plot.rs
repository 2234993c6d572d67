//! `block.png`: one bar chart per fio job (GB/s or IOPS per server and export) and one of
//! the QD 1 random read latency.

use std::path::Path;

use anyhow::Result;

use super::report::{BlockReport, BlockRow};
use crate::plot::{self, Bars};

impl BlockReport {
    /// Draws the figure; false if the font is missing.
    pub fn png(&self, path: &Path) -> Result<bool> {
        let rows = &self.report.rows;
        let bars = |w: &str, qd: u32, value: &dyn Fn(&BlockRow) -> Option<f64>| {
            rows.iter()
                .filter(|r| r.workload == w && r.qd == qd)
                .filter_map(|r| Some((r.label(), value(r)?)))
                .collect()
        };
        let panel =
            |title: &str, y: &str, w: &str, qd: u32, v: &dyn Fn(&BlockRow) -> Option<f64>| Bars {
                title: title.into(),
                y_desc: y.into(),
                bars: bars(w, qd, v),
            };
        let gbps = |r: &BlockRow| r.gbps;
        let iops = |r: &BlockRow| r.iops;
        let panels = vec![
            panel(
                "1 MiB sequential write, QD 16",
                "GB/s",
                "seqwrite",
                16,
                &gbps,
            ),
            panel("1 MiB sequential read, QD 16", "GB/s", "seqread", 16, &gbps),
            panel("4 KiB random read, QD 1", "IOPS", "randread", 1, &iops),
            panel("4 KiB random read, QD 32", "IOPS", "randread", 32, &iops),
            panel("4 KiB random write, QD 1", "IOPS", "randwrite", 1, &iops),
            panel("4 KiB random write, QD 32", "IOPS", "randwrite", 32, &iops),
            panel(
                "4 KiB random read, QD 1: mean latency",
                "µs",
                "randread",
                1,
                &|r| r.lat_mean_us,
            ),
            panel(
                "4 KiB random read, QD 1: p99 latency",
                "µs",
                "randread",
                1,
                &|r| r.lat_p99_us,
            ),
        ];
        let title = format!(
            "ferry bench block{} — fio ioengine=nbd, loopback, {} cores, medians",
            if self.report.quick { " --quick" } else { "" },
            self.report.machine.cores
        );
        plot::write_bars_png(path, &title, &panels, 2, (720, 420))
    }
}
