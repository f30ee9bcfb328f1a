//! PNG plots with plotters' bitmap backend; text through ab_glyph with a font shipped in a crate,
//! so no system font library is needed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::report::Point;
use crate::workload::format_size;
use crate::BenchError;

const SIZE: (u32, u32) = (900, 540);
const FONT: &str = "sans-serif";
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

static FONTS: Once = Once::new();

fn register_fonts() {
    FONTS.call_once(|| {
        if register_font(FONT, FontStyle::Normal, epaint_default_fonts::UBUNTU_LIGHT).is_err() {
            tracing::warn!("the bundled font did not load: plots will have no text");
        }
    });
}

type Series = BTreeMap<String, Vec<(f64, f64)>>;

/// Draws every plot the points allow; returns the files written.
pub fn draw_all(dir: &Path, prefix: &str, points: &[Point]) -> Result<Vec<PathBuf>, BenchError> {
    register_fonts();
    let mut files = Vec::new();
    let serial: Vec<&Point> =
        points.iter().filter(|p| p.workload == "echo" && p.concurrency.in_flight() == 1).collect();
    let p50 = series(&serial, |p| (p.size as f64, p.latency_us.p50));
    let p99 = series(&serial, |p| (p.size as f64, p.latency_us.p99));
    if p50.values().any(|v| v.len() >= 2) {
        let path = dir.join(format!("{prefix}-latency-vs-size.png"));
        latency_vs_size(&path, &p50, &p99)?;
        files.push(path);
    }
    let cdfs = smallest_size_cdfs(&serial);
    if !cdfs.is_empty() {
        let path = dir.join(format!("{prefix}-latency-cdf.png"));
        latency_cdf(&path, &cdfs)?;
        files.push(path);
    }
    let tput = throughput_series(points);
    if !tput.is_empty() {
        let path = dir.join(format!("{prefix}-throughput-vs-outstanding.png"));
        throughput(&path, &tput)?;
        files.push(path);
    }
    Ok(files)
}

fn series(points: &[&Point], xy: impl Fn(&Point) -> (f64, f64)) -> Series {
    let mut out = Series::new();
    for p in points {
        out.entry(p.series()).or_default().push(xy(p));
    }
    for v in out.values_mut() {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v.dedup_by(|a, b| a.0 == b.0);
    }
    out
}

/// Per series, the CDF of its smallest echo size: `[(latency_us, percent)]`.
fn smallest_size_cdfs(serial: &[&Point]) -> Series {
    let mut best: BTreeMap<String, &Point> = BTreeMap::new();
    for p in serial {
        let e = best.entry(p.series()).or_insert(p);
        if p.size < e.size {
            *e = p;
        }
    }
    best.into_iter()
        .map(|(name, p)| {
            let label = format!("{name} {}B", format_size(p.size));
            (label, p.cdf.iter().map(|[us, q]| (us.max(0.01), q * 100.0)).collect())
        })
        .collect()
}

/// Per series, calls/s against calls in flight, for the first (workload, size) measured at
/// two or more concurrencies.
fn throughput_series(points: &[Point]) -> Series {
    let mut groups: BTreeMap<(String, String, usize), Vec<(f64, f64)>> = BTreeMap::new();
    for p in points {
        let key = (p.series(), p.workload.clone(), p.size);
        groups.entry(key).or_default().push((p.concurrency.in_flight() as f64, p.calls_per_sec));
    }
    let mut out = Series::new();
    for ((series, workload, size), mut v) in groups {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v.dedup_by(|a, b| a.0 == b.0);
        if v.len() >= 2 && !out.keys().any(|k| k.starts_with(&format!("{series} "))) {
            out.insert(format!("{series} {workload} {}B", format_size(size)), v);
        }
    }
    out
}

/// A tick label: no decimals from 10 up.
fn short(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn bounds(s: &Series, pick: impl Fn(&(f64, f64)) -> f64) -> (f64, f64) {
    let vals = s.values().flatten().map(pick).filter(|v| v.is_finite() && *v > 0.0);
    let (lo, hi) = vals.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        (1.0, 10.0)
    } else {
        (lo, hi.max(lo * 1.01))
    }
}

fn err_area<E: std::error::Error + Send + Sync>(
    path: &Path,
) -> impl Fn(DrawingAreaErrorKind<E>) -> BenchError + '_ {
    move |e| BenchError::output(path, e)
}

fn root(path: &Path) -> Result<DrawingArea<BitMapBackend<'_>, Shift>, BenchError> {
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err_area(path))?;
    Ok(root)
}

fn legend_entry(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
}

fn latency_vs_size(path: &Path, p50: &Series, p99: &Series) -> Result<(), BenchError> {
    let area = root(path)?;
    let (x0, x1) = bounds(p50, |p| p.0);
    let (y0, y1) = bounds(&p50.iter().chain(p99).map(|(k, v)| (k.clone(), v.clone())).collect(), |p| p.1);
    let mut chart = ChartBuilder::on(&area)
        .caption("Echo latency vs message size (1 call in flight)", (FONT, 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((x0 * 0.8..x1 * 1.25).log_scale(), (y0 * 0.8..y1 * 1.25).log_scale())
        .map_err(err_area(path))?;
    chart
        .configure_mesh()
        .x_desc("message size [bytes]")
        .y_desc("latency [us]")
        .x_label_formatter(&|v| format_size(*v as usize))
        .y_label_formatter(&|v| short(*v))
        .label_style((FONT, 14))
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(err_area(path))?;
    for (i, (name, pts)) in p50.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err_area(path))?
            .label(format!("{name} p50"))
            .legend(legend_entry(color));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(err_area(path))?;
        if let Some(tail) = p99.get(name) {
            let light = color.mix(0.5);
            chart
                .draw_series(DashedLineSeries::new(tail.iter().copied(), 6, 4, light.stroke_width(2)))
                .map_err(err_area(path))?
                .label(format!("{name} p99 (dashed)"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], light.stroke_width(2)));
        }
    }
    legend(&mut chart, path, SeriesLabelPosition::UpperLeft)?;
    area.present().map_err(err_area(path))
}

fn latency_cdf(path: &Path, cdfs: &Series) -> Result<(), BenchError> {
    let area = root(path)?;
    let (x0, x1) = bounds(cdfs, |p| p.0);
    let mut chart = ChartBuilder::on(&area)
        .caption("Latency CDF (smallest echo, 1 call in flight)", (FONT, 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((x0 * 0.9..x1 * 1.1).log_scale(), 0.0..100.0)
        .map_err(err_area(path))?;
    chart
        .configure_mesh()
        .x_desc("latency [us]")
        .y_desc("calls at or below [%]")
        .x_label_formatter(&|v| short(*v))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FONT, 14))
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(err_area(path))?;
    for (i, (name, pts)) in cdfs.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err_area(path))?
            .label(name.clone())
            .legend(legend_entry(color));
    }
    legend(&mut chart, path, SeriesLabelPosition::LowerRight)?;
    area.present().map_err(err_area(path))
}

fn throughput(path: &Path, tput: &Series) -> Result<(), BenchError> {
    let area = root(path)?;
    let (x0, x1) = bounds(tput, |p| p.0);
    let (_, y1) = bounds(tput, |p| p.1);
    let mut chart = ChartBuilder::on(&area)
        .caption("Throughput vs calls in flight", (FONT, 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d((x0 * 0.8..x1 * 1.25).log_scale(), 0.0..y1 * 1.1)
        .map_err(err_area(path))?;
    chart
        .configure_mesh()
        .x_desc("calls in flight")
        .y_desc("calls/s")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{:.0}k", v / 1000.0))
        .label_style((FONT, 14))
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(err_area(path))?;
    for (i, (name, pts)) in tput.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err_area(path))?
            .label(name.clone())
            .legend(legend_entry(color));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(err_area(path))?;
    }
    legend(&mut chart, path, SeriesLabelPosition::UpperLeft)?;
    area.present().map_err(err_area(path))
}

fn legend<'a, X, Y>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, Y>>,
    path: &Path,
    position: SeriesLabelPosition,
) -> Result<(), BenchError>
where
    X: Ranged,
    Y: Ranged,
{
    chart
        .configure_series_labels()
        .position(position)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err_area(path))
}
