//! A chart of workload A: output tokens/s and TTFT against concurrency, one line per server.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use super::report::Report;

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// Draws `report` (a concurrency sweep) as an SVG at `path`.
pub fn draw(report: &Report, path: &Path) -> anyhow::Result<()> {
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
