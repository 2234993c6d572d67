//! `cio.png`: the seed's tables as charts — time per collective call against the bytes of
//! the call, one line per MPI-IO configuration, for write and read at 2 and 4 ranks.

use std::path::Path;

use anyhow::Result;

use super::report::{CioReport, CioRow};
use crate::plot::{self, Axis, Corner, Panel, Series};

impl CioReport {
    /// Draws the figure; false if the font is missing.
    pub fn png(&self, path: &Path) -> Result<bool> {
        let rows = &self.report.rows;
        let mut labels: Vec<String> = rows.iter().map(CioRow::label).collect();
        labels.dedup();
        labels.sort();
        labels.dedup();
        let mut panels = Vec::new();
        for np in [2, 4] {
            for op in ["write", "read"] {
                let series = labels
                    .iter()
                    .map(|l| Series {
                        name: l.clone(),
                        points: rows
                            .iter()
                            .filter(|r| r.np == np && r.op == op && r.label() == *l)
                            .filter_map(|r| Some((r.bytes as f64, r.ms?)))
                            .collect(),
                    })
                    .filter(|s| !s.points.is_empty())
                    .collect();
                panels.push(Panel {
                    title: format!("collective {op}, {np} ranks"),
                    x_desc: "bytes per call".into(),
                    y_desc: "ms per call (median)".into(),
                    x: Axis::Log2Bytes,
                    log_y: true,
                    series,
                    refs: Vec::new(),
                    legend: Corner::UpperLeft,
                });
            }
        }
        let title = format!(
            "ferry bench cio{} — the seed's pattern, {} cores, medians",
            if self.report.quick { " --quick" } else { "" },
            self.report.machine.cores
        );
        plot::write_png(path, &title, &panels, 2, (720, 480))
    }
}
