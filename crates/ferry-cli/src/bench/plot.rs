//! The PNG plot: bandwidth against transfer size (log2 axis), one line per driver and
//! operation, iperf3 and memcpy as horizontal reference lines.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use super::report::{human_size, Report};

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// Tableau 10 without grey: distinct on white, no pale yellow.
const COLORS: [(u8, u8, u8); 9] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (23, 190, 207),
    (188, 189, 34),
];

/// Registers DejaVuSans as plotters' `sans-serif`, once; false if the font is missing.
fn font_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| match std::fs::read(FONT) {
        Ok(bytes) => {
            register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into())).is_ok()
        }
        Err(_) => false,
    })
}

/// Draws the plot to `path`. Returns false (and draws nothing) when the font is missing.
pub fn write_png(report: &Report, path: &Path) -> Result<bool> {
    if !font_ready() {
        tracing::warn!("{FONT} not found (apt-get install fonts-dejavu-core): skipping the PNG");
        return Ok(false);
    }
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in report.rows.iter().filter(|r| r.usec.is_none()) {
        let (Some(g), false) = (r.gbps, matches!(r.driver.as_str(), "iperf3" | "memcpy")) else {
            continue;
        };
        let name = format!("{} {}", r.driver, r.op);
        let point = ((r.size as f64).log2(), g);
        match lines.iter_mut().find(|(n, _)| *n == name) {
            Some((_, pts)) => pts.push(point),
            None => lines.push((name, vec![point])),
        }
    }
    let refs: Vec<(&str, f64)> = [
        ("iperf3 single stream", report.summary.iperf3_gbps),
        ("memcpy", report.summary.memcpy_gbps),
    ]
    .into_iter()
    .filter_map(|(n, v)| Some((n, v?)))
    .collect();
    let xs = lines.iter().flat_map(|(_, p)| p.iter().map(|p| p.0));
    let (x0, x1) = xs.fold((12.0f64, 24.0f64), |(a, b), x| (a.min(x), b.max(x)));
    let ys = lines.iter().flat_map(|(_, p)| p.iter().map(|p| p.1));
    let ymax = ys.chain(refs.iter().map(|r| r.1)).fold(1.0f64, f64::max) * 1.1;

    let root = BitMapBackend::new(path, (1100, 700)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let title = format!(
        "ferry bench fabric{} — loopback, {} cores",
        if report.quick { " --quick" } else { "" },
        report.machine.cores
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x0 - 0.3..x1 + 0.3, 0.0..ymax)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("transfer size")
        .y_desc("GB/s (10^9 B/s)")
        .x_labels(((x1 - x0) as usize + 1).min(16))
        .x_label_formatter(&|x| {
            let r = x.round();
            if (x - r).abs() < 0.05 && (0.0..63.0).contains(&r) {
                human_size(1u64 << r as u32)
            } else {
                String::new()
            }
        })
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (name, pts)) in lines.into_iter().enumerate() {
        let (r, g, b) = COLORS[i % COLORS.len()];
        let color = RGBColor(r, g, b);
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)).point_size(3))
            .map_err(|e| err(&e))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    for (i, (name, y)) in refs.into_iter().enumerate() {
        let color = if i == 0 {
            BLACK
        } else {
            RGBColor(128, 128, 128)
        };
        let pts = [(x0 - 0.3, y), (x1 + 0.3, y)];
        chart
            .draw_series(DashedLineSeries::new(pts, 8, 5, color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(format!("{name} {y:.2} GB/s"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(true)
}
