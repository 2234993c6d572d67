//! `wan.png`: the seed's figures 7–10 as throughput against round trip, one line per file
//! buffer or peer: memory to memory (ferry by buffer; ferry against the peers), disk to
//! disk without and with staging, and the two application traces.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::Result;

use super::report::{WanReport, WanRow};
use crate::plot::{self, Axis, Corner, Panel, RefLine, Series};

impl WanReport {
    /// Draws the figure; false if the font is missing.
    pub fn png(&self, path: &Path) -> Result<bool> {
        let rows = &self.report.rows;
        // One line: the best row per round trip among those `keep` takes.
        let line = |name: &str, keep: &dyn Fn(&WanRow) -> bool| {
            let rtts: BTreeSet<u32> = rows.iter().filter(|r| keep(r)).map(|r| r.rtt_ms).collect();
            let points = rtts
                .into_iter()
                .filter_map(|t| {
                    let best = rows
                        .iter()
                        .filter(|r| r.rtt_ms == t && keep(r))
                        .filter_map(|r| r.gbit_s)
                        .reduce(f64::max)?;
                    Some((f64::from(t), best))
                })
                .collect();
            Series {
                name: name.into(),
                points,
            }
        };
        let variants = |w: &str, tool: &str| -> Vec<String> {
            let mut seen = Vec::new();
            for r in rows.iter().filter(|r| r.workload == w && r.tool == tool) {
                if !seen.contains(&r.variant) {
                    seen.push(r.variant.clone());
                }
            }
            seen
        };
        let by_variant = |w: &'static str, tool: &'static str| -> Vec<Series> {
            variants(w, tool)
                .into_iter()
                .map(|v| {
                    let name = format!("{tool} {v}");
                    line(&name, &move |r: &WanRow| {
                        r.workload == w && r.tool == tool && r.variant == v
                    })
                })
                .collect()
        };
        let gridftp_best = |w: &'static str| {
            line("gridftp (best setting)", &move |r: &WanRow| {
                r.workload == w && r.tool == "gridftp"
            })
        };
        let link = vec![RefLine {
            name: "bottleneck".into(),
            y: self.rate_bps as f64 / 1e9,
            unit: "Gbit/s",
        }];
        let panel = |title: &str, series: Vec<Series>| Panel {
            title: title.into(),
            x_desc: "round trip (ms)".into(),
            y_desc: "Gbit/s".into(),
            x: Axis::Linear,
            log_y: false,
            series: series
                .into_iter()
                .filter(|s| !s.points.is_empty())
                .collect(),
            refs: link.clone(),
            legend: Corner::UpperRight,
        };
        let mut peers: Vec<Series> = by_variant("mem", "ferry")
            .into_iter()
            .filter(|s| !s.name.contains("--"))
            .collect();
        peers.push(line("gridftp -p 1", &|r| {
            r.workload == "mem" && r.tool == "gridftp" && r.variant == "-p 1"
        }));
        peers.push(line("gridftp -p 4", &|r| {
            r.workload == "mem" && r.tool == "gridftp" && r.variant == "-p 4"
        }));
        peers.push(line("gridftp -p 4, best -tcp-bs", &|r| {
            r.workload == "mem" && r.tool == "gridftp" && r.variant.contains("-tcp-bs")
        }));
        peers.extend(by_variant("mem", "iperf3"));
        let mut staged = by_variant("staged", "ferry");
        staged.push(gridftp_best("staged"));
        let mut direct = by_variant("disk", "ferry");
        direct.push(gridftp_best("staged"));
        let mut traces: Vec<Series> = Vec::new();
        for tool in ["ferry", "gridftp"] {
            let mut names = variants("ccsm", tool);
            names.extend(variants("viz", tool));
            names.dedup();
            for v in names {
                let name = format!("{tool} {v}");
                traces.push(line(&name, &|r: &WanRow| {
                    (r.workload == "ccsm" || r.workload == "viz")
                        && r.tool == tool
                        && r.variant == v
                }));
            }
        }
        let mut panels = vec![
            panel(
                "Fig. 7: memory to memory, ferry by file buffer",
                by_variant("mem", "ferry"),
            ),
            panel("Fig. 7: memory to memory, ferry and the peers", peers),
            panel("Fig. 8: disk to disk, no staging (--direct)", direct),
            panel("Fig. 9: disk to disk, staged", staged),
            panel(
                "Fig. 10: traces (CCSM at 30 ms, visualization at 80 ms)",
                traces,
            ),
        ];
        // Workloads left out of the run (`--only`) draw no empty frames.
        panels.retain(|p| !p.series.is_empty());
        if panels.is_empty() {
            return Ok(false);
        }
        let title = format!(
            "ferry bench wan{}: emulated path, bottleneck {:.2} Gbit/s, {} cores, medians",
            if self.report.quick { " --quick" } else { "" },
            self.rate_bps as f64 / 1e9,
            self.report.machine.cores
        );
        plot::write_png(path, &title, &panels, 2, (760, 480))
    }
}
