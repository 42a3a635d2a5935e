//! Charts of `osprey bench serve`: workload A's output tokens/s and TTFT against concurrency,
//! one line per server; workload S's speed-up (first server over the second) per level and
//! its acceptance per prompt kind.

use std::path::Path;

use anyhow::Context;
use plotters::coord::Shift;
use plotters::coord::ranged1d::SegmentedCoord;
use plotters::coord::types::{RangedCoordf64, RangedCoordusize};
use plotters::prelude::*;

use super::report::Report;

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// Draws `report` as an SVG at `path`: workload S as speed-up and acceptance per level, any
/// other as a concurrency sweep.
pub fn draw(report: &Report, path: &Path) -> anyhow::Result<()> {
    match report.workload.as_str() {
        "S" => draw_speculation(report, path),
        _ => draw_sweep(report, path),
    }
}

/// Workload S: per level, the first server's output tokens/s over the second's (bars, with
/// dashed lines at 1× and at the 2× target), and per level the first server's accepted share
/// of its drafted tokens.
fn draw_speculation(report: &Report, path: &Path) -> anyhow::Result<()> {
    // (level, speed-up, accepted %)
    let bars: Vec<(String, f64, f64)> = (report.levels.iter())
        .map(|l| {
            let speed_up = (l.advantage.first())
                .and_then(|(_, adv)| adv.get("all"))
                .map_or(f64::NAN, |f| f.output_tokens_per_s);
            let accepted = (l.servers.first())
                .and_then(|s| s.median_engine)
                .filter(|e| e.drafted > 0.0)
                .map_or(0.0, |e| 100.0 * e.accepted / e.drafted);
            let name = l.name.trim_start_matches("S ").trim_end_matches(" c=1");
            (name.to_owned(), speed_up, accepted)
        })
        .collect();
    let finite = bars.iter().map(|b| b.1).filter(|v| v.is_finite());
    let top = finite.fold(2.2, f64::max) * 1.1;
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let root = SVGBackend::new(path, (1120, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(560);
    let caption = match report.servers.as_slice() {
        [a, b, ..] => format!("output tokens/s, {} ÷ {}", a.label, b.label),
        _ => "output tokens/s".to_owned(),
    };
    let mut speed = bar_panel(&left, &caption, "speed-up (×)", &names, top)?;
    speed.draw_series(
        Histogram::vertical(&speed)
            .margin(8)
            .style(COLORS[0].mix(0.8).filled())
            .data(
                bars.iter()
                    .enumerate()
                    .filter(|(_, b)| b.1.is_finite())
                    .map(|(i, b)| (i, b.1)),
            ),
    )?;
    for (at, color) in [(1.0, BLACK), (2.0, COLORS[1])] {
        let line = [(SegmentValue::Exact(0), at), (SegmentValue::Last, at)];
        speed.draw_series(DashedLineSeries::new(line, 6, 4, color.stroke_width(1)))?;
    }
    let mut accept = bar_panel(&right, "drafted tokens accepted, %", "%", &names, 100.0)?;
    accept.draw_series(
        Histogram::vertical(&accept)
            .margin(8)
            .style(COLORS[2].mix(0.8).filled())
            .data(bars.iter().enumerate().map(|(i, b)| (i, b.2))),
    )?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Bars on a panel of one segment per name, labelled by name.
type BarChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<SegmentedCoord<RangedCoordusize>, RangedCoordf64>>;

/// A panel for one bar per name, from 0 to `top`.
fn bar_panel<'a, 'b>(
    area: &'a DrawingArea<SVGBackend<'b>, Shift>,
    caption: &str,
    y_desc: &str,
    names: &[String],
    top: f64,
) -> anyhow::Result<BarChart<'a, 'b>> {
    let label = |i: &SegmentValue<usize>| match i {
        SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
        _ => String::new(),
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(52)
        .build_cartesian_2d(
            (0..names.len().saturating_sub(1)).into_segmented(),
            0.0..top,
        )?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(names.len())
        .x_label_formatter(&label)
        .y_desc(y_desc)
        .draw()?;
    Ok(chart)
}

/// A concurrency sweep (workload A): tokens/s and TTFT against concurrency.
fn draw_sweep(report: &Report, path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (960, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(480);
    let servers: Vec<&str> = report.servers.iter().map(|s| s.label.as_str()).collect();
    // series[server] = [(concurrency, tokens/s, ttft p50, ttft p99)]
    let series: Vec<Vec<(f64, f64, f64, f64)>> = servers
        .iter()
        .map(|name| {
            report
                .levels
                .iter()
                .filter_map(|l| {
                    let s = l.servers.iter().find(|s| s.server == *name)?;
                    let f = s.median.get("all")?;
                    Some((
                        l.concurrency as f64,
                        f.output_tokens_per_s,
                        f.ttft_p50_s,
                        f.ttft_p99_s,
                    ))
                })
                .collect()
        })
        .collect();
    let max_c = series.iter().flatten().map(|p| p.0).fold(1.0, f64::max);
    let max_tps = series.iter().flatten().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    let max_ttft = series.iter().flatten().map(|p| p.3).fold(0.1, f64::max) * 1.1;

    let mut tps = ChartBuilder::on(&left)
        .caption("output tokens/s (median)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0.0..max_c * 1.05, 0.0..max_tps)?;
    tps.configure_mesh()
        .x_desc("concurrent streams")
        .y_desc("tokens/s")
        .draw()?;
    let mut ttft = ChartBuilder::on(&right)
        .caption("TTFT p50 (solid) and p99 (dashed), s", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0.0..max_c * 1.05, 0.0..max_ttft)?;
    ttft.configure_mesh()
        .x_desc("concurrent streams")
        .y_desc("seconds")
        .draw()?;
    for (i, (name, points)) in servers.iter().zip(&series).enumerate() {
        let color = COLORS[i % COLORS.len()];
        let style = color.stroke_width(2);
        tps.draw_series(LineSeries::new(points.iter().map(|p| (p.0, p.1)), style))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        tps.draw_series(
            points
                .iter()
                .map(|p| Circle::new((p.0, p.1), 3, color.filled())),
        )?;
        ttft.draw_series(LineSeries::new(points.iter().map(|p| (p.0, p.2)), style))?;
        ttft.draw_series(DashedLineSeries::new(
            points.iter().map(|p| (p.0, p.3)),
            6,
            4,
            color.stroke_width(1),
        ))?;
    }
    tps.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
