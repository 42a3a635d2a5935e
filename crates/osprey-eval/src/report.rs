//! Reports: terminal tables and self-contained HTML pages (inline SVG plots, no scripts).

use std::fmt::Write;

use plotters::prelude::*;

use crate::compare::Comparison;
use crate::run::RunReport;

/// A run as a terminal table: the summary, each checker, the failing cases.
pub fn run_table(r: &RunReport) -> String {
    let s = r.summary();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "run {} — suite {} on {} ({} via {})",
        r.id, r.suite, r.target.name, r.target.model, r.target.url
    );
    let _ = writeln!(
        out,
        "passed {}/{} ({:.1}%), request errors {}, tokens {} in / {} out, cost ${:.6}, latency p50 {:.0} ms p95 {:.0} ms, {:.1} s",
        s.passed,
        s.cases,
        s.pass_rate * 100.0,
        s.errors,
        s.prompt_tokens,
        s.completion_tokens,
        s.cost,
        s.latency_p50_ms,
        s.latency_p95_ms,
        r.duration_s
    );
    if let Some((agree, n)) = s.judge_agreement {
        let _ = writeln!(
            out,
            "judge agreed with the rule checkers on {agree}/{n} cases"
        );
    }
    let _ = writeln!(
        out,
        "\n{:<16} {:>7} {:>7} {:>7}",
        "checker", "passed", "run", "rate"
    );
    for (kind, (passed, n)) in &s.by_checker {
        let _ = writeln!(
            out,
            "{kind:<16} {passed:>7} {n:>7} {:>6.1}%",
            100.0 * *passed as f64 / *n as f64
        );
    }
    let failing: Vec<_> = r.cases.iter().filter(|c| !c.pass).collect();
    if !failing.is_empty() {
        let _ = writeln!(out, "\nfailing cases ({}):", failing.len());
        for c in failing.iter().take(25) {
            let why: Vec<String> = (c.checks.iter().filter(|k| !k.pass))
                .map(|k| format!("{}: {}", k.kind, clip(&k.detail, 90)))
                .collect();
            let _ = writeln!(out, "  {:<28} {}", c.id, why.join("; "));
        }
        if failing.len() > 25 {
            let _ = writeln!(out, "  … and {} more", failing.len() - 25);
        }
    }
    out
}

/// A comparison as a terminal table.
pub fn compare_table(c: &Comparison) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "baseline {}  vs  candidate {}  ({:.0}% bootstrap intervals, paired by case)",
        c.baseline,
        c.candidate,
        c.level * 100.0
    );
    let _ = writeln!(
        out,
        "\n{:<22} {:>6} {:>12} {:>12} {:>11} {:>25}",
        "metric", "cases", "baseline", "candidate", "Δ", "interval"
    );
    for m in &c.metrics {
        let mark = match (m.delta.low > 0.0, m.delta.high < 0.0, m.higher_is_better) {
            (true, _, true) | (_, true, false) => " better",
            (true, _, false) | (_, true, true) => " WORSE",
            _ => "",
        };
        let _ = writeln!(
            out,
            "{:<22} {:>6} {:>12.4} {:>12.4} {:>+11.4} {:>25}{mark}",
            m.name,
            m.cases,
            m.baseline,
            m.candidate,
            m.delta.mean,
            format!("[{:+.4}, {:+.4}]", m.delta.low, m.delta.high)
        );
    }
    if !c.flips.is_empty() {
        let _ = writeln!(out, "\nflipped cases ({}):", c.flips.len());
        for f in &c.flips {
            let dir = if f.now_passes {
                "fail → pass"
            } else {
                "pass → fail"
            };
            let _ = writeln!(out, "  {:<28} {dir}  {}", f.id, clip(&f.why, 100));
        }
    }
    if !c.unpaired.is_empty() {
        let _ = writeln!(
            out,
            "\nin one run only (left out): {}",
            c.unpaired.join(", ")
        );
    }
    out
}

/// A run as an HTML page: summary, pass rate per checker and latency plots, every case.
pub fn run_html(r: &RunReport) -> String {
    let s = r.summary();
    let bars: Vec<(String, f64)> = (s.by_checker.iter())
        .map(|(k, (p, n))| (k.clone(), *p as f64 / *n as f64))
        .chain(std::iter::once(("whole case".to_string(), s.pass_rate)))
        .collect();
    let mut latencies: Vec<f64> = r.cases.iter().map(|c| c.latency_ms).collect();
    latencies.sort_by(f64::total_cmp);
    let mut rows = String::new();
    for c in &r.cases {
        let checks: Vec<String> = (c.checks.iter())
            .map(|k| {
                format!(
                    "<span class={}>{}</span> {}",
                    if k.pass { "ok" } else { "bad" },
                    k.kind,
                    esc(&clip(&k.detail, 160))
                )
            })
            .collect();
        let _ = write!(
            rows,
            "<tr><td>{}</td><td class={}>{}</td><td>{}</td><td><pre>{}</pre></td><td>{:.0}</td><td>{}/{}</td></tr>",
            esc(&c.id),
            if c.pass { "ok" } else { "bad" },
            if c.pass { "pass" } else { "fail" },
            checks.join("<br>"),
            esc(&clip(
                c.error.as_ref().map_or(&c.output, |e| &e.message),
                400
            )),
            c.latency_ms,
            c.prompt_tokens,
            c.completion_tokens
        );
    }
    page(
        &format!("eval run {}", r.id),
        &format!(
            "<p>Suite <b>{}</b> on <b>{}</b> ({} at {}), {} cases in {:.1} s: <b>{}/{} passed ({:.1}%)</b>, {} request errors, \
             {} prompt / {} completion tokens, ${:.6}, latency p50 {:.0} ms, p95 {:.0} ms.</p>\
             <div class=plots>{}{}</div>\
             <table><tr><th>case</th><th></th><th>checkers</th><th>answer</th><th>ms</th><th>tokens in/out</th></tr>{rows}</table>",
            esc(&r.suite),
            esc(&r.target.name),
            esc(&r.target.model),
            esc(&r.target.url),
            s.cases,
            r.duration_s,
            s.passed,
            s.cases,
            s.pass_rate * 100.0,
            s.errors,
            s.prompt_tokens,
            s.completion_tokens,
            s.cost,
            s.latency_p50_ms,
            s.latency_p95_ms,
            bar_chart("pass rate by checker", &bars),
            line_chart("latency by case (sorted), ms", &latencies),
        ),
    )
}

/// A comparison as an HTML page: each metric's delta with its interval, the flipped cases.
pub fn compare_html(c: &Comparison) -> String {
    let mut rows = String::new();
    for m in &c.metrics {
        let _ = write!(
            rows,
            "<tr><td>{}</td><td>{}</td><td>{:.4}</td><td>{:.4}</td><td>{:+.4}</td><td>[{:+.4}, {:+.4}]</td></tr>",
            esc(&m.name),
            m.cases,
            m.baseline,
            m.candidate,
            m.delta.mean,
            m.delta.low,
            m.delta.high
        );
    }
    let mut flips = String::new();
    for f in &c.flips {
        let _ = write!(
            flips,
            "<tr><td>{}</td><td class={}>{}</td><td>{}</td></tr>",
            esc(&f.id),
            if f.now_passes { "ok" } else { "bad" },
            if f.now_passes {
                "fail → pass"
            } else {
                "pass → fail"
            },
            esc(&clip(&f.why, 300))
        );
    }
    let rates: Vec<(String, f64, f64, f64)> = (c.metrics.iter())
        .filter(|m| m.higher_is_better)
        .map(|m| (m.name.clone(), m.delta.mean, m.delta.low, m.delta.high))
        .collect();
    page(
        &format!("eval compare {} vs {}", c.baseline, c.candidate),
        &format!(
            "<p>Baseline <b>{}</b>, candidate <b>{}</b>: candidate − baseline per case, {:.0}% paired bootstrap intervals.</p>\
             <div class=plots>{}</div>\
             <table><tr><th>metric</th><th>cases</th><th>baseline</th><th>candidate</th><th>Δ</th><th>interval</th></tr>{rows}</table>\
             <h2>Flipped cases ({})</h2><table>{flips}</table>",
            esc(&c.baseline),
            esc(&c.candidate),
            c.level * 100.0,
            interval_chart("pass-rate deltas", &rates),
            c.flips.len()
        ),
    )
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=utf-8><title>{t}</title><style>\
         body{{font:14px system-ui,sans-serif;margin:24px;color:#222}}table{{border-collapse:collapse;margin-top:16px}}\
         td,th{{border:1px solid #ddd;padding:4px 8px;vertical-align:top;text-align:left}}pre{{margin:0;white-space:pre-wrap;max-width:520px}}\
         .ok{{color:#1a7f37}}.bad{{color:#c62828}}.plots svg{{margin-right:16px}}</style></head>\
         <body><h1>{t}</h1>{body}</body></html>",
        t = esc(title)
    )
}

/// Bars of rates in [0, 1].
fn bar_chart(title: &str, bars: &[(String, f64)]) -> String {
    let mut svg = String::new();
    let (lo, hi) = (0.0, 1.0);
    let drawn = (|| -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::with_string(&mut svg, (480, 300)).into_drawing_area();
        root.fill(&WHITE)?;
        let n = bars.len().max(1);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(60)
            .y_label_area_size(40)
            .build_cartesian_2d(0..n, lo..hi)?;
        let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&|i| names.get(*i).cloned().unwrap_or_default())
            .draw()?;
        chart.draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            Rectangle::new(
                [(i, lo), (i + 1, *v)],
                RGBColor(31, 119, 180).mix(0.7).filled(),
            )
        }))?;
        root.present()?;
        Ok(())
    })();
    drawn.map_or_else(
        |e| format!("<p>(plot failed: {})</p>", esc(&e.to_string())),
        |_| svg,
    )
}

fn line_chart(title: &str, ys: &[f64]) -> String {
    let mut svg = String::new();
    let top = ys.iter().copied().fold(1.0, f64::max) * 1.1;
    let drawn = (|| -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::with_string(&mut svg, (480, 300)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0..ys.len().max(1), 0.0..top)?;
        chart.configure_mesh().draw()?;
        chart.draw_series(LineSeries::new(
            ys.iter().copied().enumerate(),
            RGBColor(214, 39, 40).stroke_width(2),
        ))?;
        root.present()?;
        Ok(())
    })();
    drawn.map_or_else(
        |e| format!("<p>(plot failed: {})</p>", esc(&e.to_string())),
        |_| svg,
    )
}

fn interval_chart(title: &str, rows: &[(String, f64, f64, f64)]) -> String {
    let mut svg = String::new();
    let span = rows
        .iter()
        .map(|r| r.2.abs().max(r.3.abs()))
        .fold(0.05, f64::max)
        * 1.1;
    let drawn = (|| -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::with_string(&mut svg, (560, 60 + 36 * rows.len() as u32))
            .into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(130)
            .build_cartesian_2d(-span..span, 0..rows.len().max(1))?;
        let names: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
        chart
            .configure_mesh()
            .y_labels(rows.len().max(1))
            .y_label_formatter(&|i| names.get(*i).cloned().unwrap_or_default())
            .draw()?;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(0.0, 0), (0.0, rows.len())],
            BLACK,
        )))?;
        for (i, (_, mean, low, high)) in rows.iter().enumerate() {
            let color = if *high < 0.0 {
                RGBColor(198, 40, 40)
            } else if *low > 0.0 {
                RGBColor(26, 127, 55)
            } else {
                RGBColor(90, 90, 90)
            };
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(*low, i), (*high, i)],
                color.stroke_width(3),
            )))?;
            chart.draw_series(std::iter::once(Circle::new((*mean, i), 5, color.filled())))?;
        }
        root.present()?;
        Ok(())
    })();
    drawn.map_or_else(
        |e| format!("<p>(plot failed: {})</p>", esc(&e.to_string())),
        |_| svg,
    )
}

fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
