//! PNG plots shared by the benches: one or more panels of lines (value against size or count)
//! with dashed horizontal reference lines, or of bars (one per tool), drawn with plotters.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use super::report::human_size;

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
/// Reference lines: black, grey, then dark red.
const REF_COLORS: [(u8, u8, u8); 3] = [(0, 0, 0), (128, 128, 128), (140, 20, 20)];

/// How x values are laid out and labelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// Bytes on a log2 axis, labelled `4 KiB`, `1 MiB`.
    Log2Bytes,
    /// Bytes on a log10 axis, labelled `1 B`, `10 B`, `100 B`.
    Log10Bytes,
    /// Plain numbers (counts).
    Linear,
}

impl Axis {
    fn place(self, x: f64) -> f64 {
        match self {
            Axis::Log2Bytes => x.log2(),
            Axis::Log10Bytes => x.log10(),
            Axis::Linear => x,
        }
    }

    fn label(self, x: f64) -> String {
        let r = x.round();
        if (x - r).abs() > 0.05 {
            return String::new();
        }
        match self {
            Axis::Linear => format!("{r}"),
            // Exponents: only those a u64 holds.
            _ if !(0.0..63.0).contains(&r) => String::new(),
            Axis::Log2Bytes => human_size(1u64 << r as u32),
            Axis::Log10Bytes => human_size(10u64.pow(r as u32)),
        }
    }
}

/// Where a panel's legend sits (put it where the lines are not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corner {
    /// Top left.
    UpperLeft,
    /// Top right.
    UpperRight,
    /// Bottom right.
    LowerRight,
}

/// One line: (x, y) in data units.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A dashed horizontal line across the panel.
#[derive(Debug, Clone)]
pub struct RefLine {
    /// Legend text (the value is appended).
    pub name: String,
    /// Height in data units.
    pub y: f64,
    /// Unit printed after the value in the legend.
    pub unit: &'static str,
}

/// One chart.
#[derive(Debug, Clone)]
pub struct Panel {
    /// Caption above the chart.
    pub title: String,
    /// X axis description.
    pub x_desc: String,
    /// Y axis description.
    pub y_desc: String,
    /// X layout.
    pub x: Axis,
    /// Log10 y axis (values ≤ 0 are dropped).
    pub log_y: bool,
    /// The lines.
    pub series: Vec<Series>,
    /// The reference lines.
    pub refs: Vec<RefLine>,
    /// Legend position.
    pub legend: Corner,
}

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

/// Draws `panels` row by row, `cols` per row, each `cell` pixels, under `title` to `path`.
/// Returns false (and draws nothing) when the font is missing.
pub fn write_png(
    path: &Path,
    title: &str,
    panels: &[Panel],
    cols: usize,
    cell: (u32, u32),
) -> Result<bool> {
    write_grid(path, title, panels, cols, cell, draw_panel)
}

/// Draws a grid of charts, one `draw` per panel (the frame of [`write_png`] and
/// [`write_bars_png`]).
fn write_grid<T>(
    path: &Path,
    title: &str,
    panels: &[T],
    cols: usize,
    cell: (u32, u32),
    draw: fn(&DrawingArea<BitMapBackend<'_>, Shift>, &T) -> DrawResult<()>,
) -> Result<bool> {
    if !font_ready() {
        tracing::warn!("{FONT} not found (apt-get install fonts-dejavu-core): skipping the PNG");
        return Ok(false);
    }
    let cols = cols.clamp(1, panels.len().max(1));
    let rows = panels.len().div_ceil(cols).max(1);
    let size = (cell.0 * cols as u32, cell.1 * rows as u32 + 40);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let body = root
        .titled(title, ("sans-serif", 24))
        .map_err(|e| err(&e))?;
    for (panel, area) in panels.iter().zip(body.split_evenly((rows, cols))) {
        draw(&area, panel).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(true)
}

type DrawResult<T> =
    Result<T, DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>>;

fn draw_panel(area: &DrawingArea<BitMapBackend<'_>, Shift>, p: &Panel) -> DrawResult<()> {
    let ty = |y: f64| if p.log_y { y.log10() } else { y };
    let lines: Vec<(&str, Vec<(f64, f64)>)> = p
        .series
        .iter()
        .map(|s| {
            let pts = s
                .points
                .iter()
                .filter(|(x, _)| *x > 0.0 || p.x == Axis::Linear);
            let pts = pts.filter(|(_, y)| y.is_finite() && (!p.log_y || *y > 0.0));
            (
                s.name.as_str(),
                pts.map(|&(x, y)| (p.x.place(x), ty(y))).collect(),
            )
        })
        .collect();
    let refs: Vec<&RefLine> = p.refs.iter().filter(|r| !p.log_y || r.y > 0.0).collect();
    let xs = lines.iter().flat_map(|(_, v)| v.iter().map(|q| q.0));
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (x0, x1) = if x0 > x1 {
        (0.0, 1.0)
    } else {
        (x0, x1.max(x0 + 1.0))
    };
    let ys = lines.iter().flat_map(|(_, v)| v.iter().map(|q| q.1));
    let ys: Vec<f64> = ys.chain(refs.iter().map(|r| ty(r.y))).collect();
    let (y0, y1) = match p.log_y {
        true => ys
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &y| (a.min(y), b.max(y))),
        false => (0.0, ys.iter().fold(1e-9f64, |a, &y| a.max(y))),
    };
    let (y0, y1) = match p.log_y {
        true if y0 <= y1 => (y0.floor(), y1.ceil().max(y0.floor() + 1.0)),
        true => (-1.0, 1.0),
        // Head room for a legend at the top.
        false if p.legend == Corner::LowerRight => (0.0, y1 * 1.1),
        false => (0.0, y1 * 1.45),
    };
    let pad = 0.3;
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0 - pad..x1 + pad, y0..y1)?;
    let log_y = p.log_y;
    chart
        .configure_mesh()
        .x_desc(p.x_desc.as_str())
        .y_desc(p.y_desc.as_str())
        .x_labels(((x1 - x0) as usize + 1).min(16))
        .x_label_formatter(&|x| p.x.label(*x))
        .y_label_formatter(&|y| match log_y {
            true => power_of_ten(*y),
            false if y1 >= 20.0 => format!("{y:.0}"),
            false => format!("{y:.2}"),
        })
        .label_style(("sans-serif", 13))
        .draw()?;
    for (i, (name, pts)) in lines.into_iter().enumerate() {
        let (r, g, b) = COLORS[i % COLORS.len()];
        let color = RGBColor(r, g, b);
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)).point_size(3))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    for (i, r) in refs.into_iter().enumerate() {
        let (red, g, b) = REF_COLORS[i % REF_COLORS.len()];
        let color = RGBColor(red, g, b);
        let pts = [(x0 - pad, ty(r.y)), (x1 + pad, ty(r.y))];
        chart
            .draw_series(DashedLineSeries::new(pts, 8, 5, color.stroke_width(2)))?
            .label(format!("{} {:.2} {}", r.name, r.y, r.unit))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(match p.legend {
            Corner::UpperLeft => SeriesLabelPosition::UpperLeft,
            Corner::UpperRight => SeriesLabelPosition::UpperRight,
            Corner::LowerRight => SeriesLabelPosition::LowerRight,
        })
        .draw()
}

/// A bar chart: one bar per named value.
#[derive(Debug, Clone)]
pub struct Bars {
    /// Caption above the chart.
    pub title: String,
    /// Y axis description.
    pub y_desc: String,
    /// (label, value) per bar, in order; missing values are left out.
    pub bars: Vec<(String, f64)>,
}

/// Draws bar charts row by row, `cols` per row, each `cell` pixels, under `title` to `path`.
/// Returns false (and draws nothing) when the font is missing.
pub fn write_bars_png(
    path: &Path,
    title: &str,
    panels: &[Bars],
    cols: usize,
    cell: (u32, u32),
) -> Result<bool> {
    write_grid(path, title, panels, cols, cell, draw_bars)
}

fn draw_bars(area: &DrawingArea<BitMapBackend<'_>, Shift>, p: &Bars) -> DrawResult<()> {
    let n = p.bars.len().max(1);
    // Head room for the rotated value labels above the bars.
    let top = p.bars.iter().fold(1e-9f64, |a, b| a.max(b.1)) * 1.5;
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(20)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..n as f64, 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .disable_x_axis()
        .y_desc(p.y_desc.as_str())
        .y_label_formatter(&|y| match top >= 20.0 {
            true => format!("{y:.0}"),
            false => format!("{y:.2}"),
        })
        .label_style(("sans-serif", 13))
        .draw()?;
    for (i, (name, v)) in p.bars.iter().enumerate() {
        let (r, g, b) = COLORS[i % COLORS.len()];
        let x = i as f64;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x + 0.1, 0.0), (x + 0.9, *v)],
            RGBColor(r, g, b).filled(),
        )))?;
        let label = format!(
            "{name}: {}",
            if *v >= 20.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        );
        chart.draw_series(std::iter::once(Text::new(
            label,
            (x + 0.15, v + top * 0.02),
            ("sans-serif", 12)
                .into_font()
                .transform(FontTransform::Rotate270),
        )))?;
    }
    Ok(())
}

/// `10^y` for an integer `y` (`0.001`, `1`, `100`); empty between powers.
fn power_of_ten(y: f64) -> String {
    let r = y.round();
    if (y - r).abs() > 0.05 {
        return String::new();
    }
    let digits = if r < 0.0 { -r as usize } else { 0 };
    format!("{:.digits$}", 10f64.powi(r as i32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_labels() {
        assert_eq!(
            Axis::Log2Bytes.label(Axis::Log2Bytes.place(4096.0)),
            "4 KiB"
        );
        assert_eq!(
            Axis::Log10Bytes.label(Axis::Log10Bytes.place(100.0)),
            "100 B"
        );
        assert_eq!(Axis::Linear.label(4.0), "4");
        assert_eq!(Axis::Log2Bytes.label(3.5), "");
        assert_eq!(power_of_ten(-3.0), "0.001");
        assert_eq!(power_of_ten(2.0), "100");
        assert_eq!(power_of_ten(0.5), "");
    }
}
