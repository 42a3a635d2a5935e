//! `osprey bench serve --sweep SUITE`: an eval suite's pass rate and its latency together, at
//! each concurrency × context length, so a degradation under load (quality or latency, past a
//! memory wall) shows in one table and one chart.
//!
//! Context length is filler: `N` tokens of unrelated prose put before each case's input (a
//! system message for chat cases, a paragraph before a completions prompt), so the question
//! is the same and only the load around it grows.

use std::path::Path;

use anyhow::Context;
use osprey_engine::Tokenizer;
use osprey_eval::{RunConfig, Suite, Target, run_suite};
use plotters::prelude::*;
use serde::Serialize;
use serde_json::json;

use super::ServeBenchArgs;
use super::workload::PromptMaker;

/// One point of the sweep.
#[derive(Debug, Serialize)]
struct Point {
    concurrency: usize,
    context: usize,
    cases: usize,
    pass_rate: f64,
    request_errors: usize,
    latency_p50_ms: f64,
    latency_p95_ms: f64,
    output_tokens_per_s: f64,
}

/// Runs the sweep.
pub fn run(args: &ServeBenchArgs, suite: &Path, tokenizer: &Tokenizer) -> anyhow::Result<()> {
    let suite = Suite::load(suite)?;
    let concurrency = match args.concurrency.is_empty() {
        true => vec![1, 4, 16],
        false => args.concurrency.clone(),
    };
    let url = args.url.trim_end_matches('/');
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => runtime.block_on(osprey_eval::run::first_model(url))?,
    };
    let target = Target {
        name: args.label.clone(),
        ..Target::new(url, &model)
    };
    let mut maker = PromptMaker::new(tokenizer, args.seed);
    let mut points = Vec::new();
    println!(
        "{:>11} {:>8} {:>6} {:>9} {:>7} {:>10} {:>10} {:>10}",
        "concurrency", "context", "cases", "pass", "errors", "p50 ms", "p95 ms", "out tok/s"
    );
    for &context in &args.context {
        let padded = with_context(&suite, context, &mut maker);
        for &c in &concurrency {
            // Enough repetitions of the suite to keep `c` requests in flight.
            let mut cases = Vec::new();
            for r in 0..(args.runs.max(1)).max(c.div_ceil(padded.cases.len())) {
                cases.extend(padded.cases.iter().map(|case| {
                    let mut case = case.clone();
                    case.id = format!("{}#{r}", case.id);
                    case
                }));
            }
            let round = Suite {
                name: suite.name.clone(),
                cases,
            };
            let config = RunConfig {
                concurrency: c,
                ..RunConfig::default()
            };
            let report = runtime.block_on(run_suite(&round, &target, config, &|_| {}));
            let s = report.summary();
            let point = Point {
                concurrency: c,
                context,
                cases: s.cases,
                pass_rate: s.pass_rate,
                request_errors: s.errors,
                latency_p50_ms: s.latency_p50_ms,
                latency_p95_ms: s.latency_p95_ms,
                output_tokens_per_s: s.completion_tokens as f64 / report.duration_s.max(1e-9),
            };
            println!(
                "{:>11} {:>8} {:>6} {:>8.1}% {:>7} {:>10.0} {:>10.0} {:>10.1}",
                c,
                context,
                point.cases,
                point.pass_rate * 100.0,
                point.request_errors,
                point.latency_p50_ms,
                point.latency_p95_ms,
                point.output_tokens_per_s
            );
            points.push(point);
        }
    }
    if let Some(path) = &args.json {
        let value = json!({"suite": suite.name, "server": url, "model": model, "points": points});
        std::fs::write(path, serde_json::to_string_pretty(&value)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.chart {
        chart(&points, &args.context, path)?;
    }
    Ok(())
}

/// `suite` with `tokens` tokens of filler before each case's input.
fn with_context(suite: &Suite, tokens: usize, maker: &mut PromptMaker) -> Suite {
    let mut padded = suite.clone();
    if tokens == 0 {
        return padded;
    }
    for case in &mut padded.cases {
        let filler = maker.text(tokens);
        match (&mut case.prompt, case.messages.is_empty()) {
            (Some(prompt), _) => *prompt = format!("{filler}\n\n{prompt}"),
            (None, false) => case.messages.insert(
                0,
                json!({"role": "system", "content": format!("Background notes, unrelated to the question:\n{filler}")}),
            ),
            (None, true) => {}
        }
    }
    padded
}

fn chart(points: &[Point], contexts: &[usize], path: &Path) -> anyhow::Result<()> {
    const COLORS: [RGBColor; 4] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
    ];
    let root = SVGBackend::new(path, (960, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(480);
    let max_c = points
        .iter()
        .map(|p| p.concurrency as f64)
        .fold(1.0, f64::max)
        * 1.05;
    let max_ms = points.iter().map(|p| p.latency_p95_ms).fold(1.0, f64::max) * 1.1;
    let mut pass = ChartBuilder::on(&left)
        .caption("suite pass rate", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0.0..max_c, 0.0..1.05)?;
    pass.configure_mesh()
        .x_desc("concurrent requests")
        .y_desc("pass rate")
        .draw()?;
    let mut latency = ChartBuilder::on(&right)
        .caption("latency p95, ms", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0.0..max_c, 0.0..max_ms)?;
    latency
        .configure_mesh()
        .x_desc("concurrent requests")
        .y_desc("ms")
        .draw()?;
    for (i, &context) in contexts.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mine: Vec<&Point> = points.iter().filter(|p| p.context == context).collect();
        pass.draw_series(LineSeries::new(
            mine.iter().map(|p| (p.concurrency as f64, p.pass_rate)),
            color.stroke_width(2),
        ))?
        .label(format!("{context} tokens of context"))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
        latency.draw_series(LineSeries::new(
            mine.iter()
                .map(|p| (p.concurrency as f64, p.latency_p95_ms)),
            color.stroke_width(2),
        ))?;
    }
    pass.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .position(SeriesLabelPosition::LowerLeft)
        .draw()?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
