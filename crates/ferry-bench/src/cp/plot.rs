//! `cp.png`: one bar chart per workload (GB/s or files/s per tool) and one of the CPU both
//! sides spent moving the large file.

use std::path::Path;

use anyhow::Result;

use super::report::CpReport;
use crate::plot::{self, Bars};

impl CpReport {
    /// Draws the figure; false if the font is missing.
    pub fn png(&self, path: &Path) -> Result<bool> {
        let rows = &self.report.rows;
        let bars = |keep: &dyn Fn(&str) -> bool, value: &dyn Fn(&super::CpRow) -> Option<f64>| {
            rows.iter()
                .filter(|r| keep(&r.workload))
                .filter_map(|r| {
                    let name = match r.workload.as_str() {
                        "mem" if r.tool == "ferry" => format!("{} (mem)", r.label()),
                        _ => r.label(),
                    };
                    Some((name, value(r)?))
                })
                .collect()
        };
        let panels = vec![
            Bars {
                title: "large file: /dev/shm → /dev/null (ferry mem: zero → null)".into(),
                y_desc: "GB/s".into(),
                bars: bars(&|w| w == "mem" || w == "shm", &|r| r.gbps),
            },
            Bars {
                title: "large file: disk → disk, cache dropped, synced".into(),
                y_desc: "GB/s".into(),
                bars: bars(&|w| w == "disk", &|r| r.gbps),
            },
            Bars {
                title: "small files: /dev/shm tree → /dev/shm".into(),
                y_desc: "files/s".into(),
                bars: bars(&|w| w == "small", &|r| r.files_per_s),
            },
            Bars {
                title: "CPU seconds, client + server, large file to /dev/null".into(),
                y_desc: "CPU s".into(),
                bars: bars(&|w| w == "mem" || w == "shm", &|r| r.cpu_s),
            },
        ];
        let title = format!(
            "ferry bench cp{} — loopback, {} cores, medians",
            if self.report.quick { " --quick" } else { "" },
            self.report.machine.cores
        );
        plot::write_bars_png(path, &title, &panels, 2, (720, 480))
    }
}
