//! Candidate against baseline: paired per-case differences of every metric with bootstrap
//! confidence intervals, the cases that flipped, and the gate's verdict.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::run::RunReport;
use crate::stats::{Interval, paired_bootstrap};

/// How one metric moved.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MetricDelta {
    /// `pass`, `check.KIND`, `latency_ms`, `completion_tokens`, `cost`.
    pub name: String,
    /// Whether up is good (pass rates) or bad (latency, tokens, cost).
    pub higher_is_better: bool,
    /// Cases the metric was measured on in both runs.
    pub cases: usize,
    /// Baseline mean over those cases.
    pub baseline: f64,
    /// Candidate mean over those cases.
    pub candidate: f64,
    /// Candidate − baseline, with its interval.
    pub delta: Interval,
}

/// A case whose pass/fail changed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Flip {
    /// The case.
    pub id: String,
    /// Whether the candidate passes it (the baseline did the opposite).
    pub now_passes: bool,
    /// The candidate's failing checkers' details, when it now fails.
    pub why: String,
}

/// Two runs compared.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Comparison {
    /// The baseline run's id.
    pub baseline: String,
    /// The candidate run's id.
    pub candidate: String,
    /// Confidence level of the intervals.
    pub level: f64,
    /// Per metric.
    pub metrics: Vec<MetricDelta>,
    /// Cases that flipped.
    pub flips: Vec<Flip>,
    /// Case ids in only one of the runs (left out of every metric).
    pub unpaired: Vec<String>,
}

impl Comparison {
    /// Compares `candidate` with `baseline`, case by case.
    pub fn new(baseline: &RunReport, candidate: &RunReport, level: f64) -> Comparison {
        let (b, c) = (baseline.metrics(), candidate.metrics());
        let paired: BTreeSet<&str> = b.keys().filter(|id| c.contains_key(*id)).copied().collect();
        let unpaired = (b.keys().chain(c.keys()))
            .filter(|id| !paired.contains(*id))
            .map(|id| id.to_string())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let names: BTreeSet<&String> = paired.iter().flat_map(|id| b[id].keys()).collect();
        let mut metrics = Vec::new();
        for name in names {
            let pairs: Vec<(f64, f64)> = (paired.iter())
                .filter_map(|id| Some((*b[id].get(name)?, *c[id].get(name)?)))
                .collect();
            if pairs.is_empty() {
                continue;
            }
            let n = pairs.len() as f64;
            let diffs: Vec<f64> = pairs.iter().map(|(x, y)| y - x).collect();
            metrics.push(MetricDelta {
                name: name.clone(),
                higher_is_better: name == "pass" || name.starts_with("check."),
                cases: pairs.len(),
                baseline: pairs.iter().map(|p| p.0).sum::<f64>() / n,
                candidate: pairs.iter().map(|p| p.1).sum::<f64>() / n,
                delta: paired_bootstrap(&diffs, level, 4000),
            });
        }
        let base_pass = |id: &str| baseline.cases.iter().find(|r| r.id == id).map(|r| r.pass);
        let flips = (candidate.cases.iter())
            .filter(|r| base_pass(&r.id).is_some_and(|p| p != r.pass))
            .map(|r| Flip {
                id: r.id.clone(),
                now_passes: r.pass,
                why: (r.checks.iter().filter(|k| !k.pass))
                    .map(|k| format!("{}: {}", k.kind, k.detail))
                    .collect::<Vec<_>>()
                    .join("; "),
            })
            .collect();
        Comparison {
            baseline: baseline.id.clone(),
            candidate: candidate.id.clone(),
            level,
            metrics,
            flips,
            unpaired,
        }
    }

    /// The named metric's delta.
    pub fn metric(&self, name: &str) -> Option<&MetricDelta> {
        self.metrics.iter().find(|m| m.name == name)
    }

    /// The gate: `Err` when `metric` got worse by more than `max_regression` with confidence,
    /// that is, when even the favourable end of its interval is a regression that large.
    /// For pass rates the regression is absolute (0.05 = five points); for latency, tokens
    /// and cost it is relative to the baseline (0.05 = 5% more).
    pub fn gate(&self, metric: &str, max_regression: f64) -> Result<String, String> {
        let m = self.metric(metric).ok_or_else(|| {
            let names: Vec<&str> = self.metrics.iter().map(|m| m.name.as_str()).collect();
            format!("no metric `{metric}` in both runs (have: {names:?})")
        })?;
        let (worse_by, unit) = match m.higher_is_better {
            true => (-m.delta.high, "points"),
            false => (m.delta.low / m.baseline.abs().max(f64::EPSILON), "relative"),
        };
        let said = format!(
            "{metric}: {:.4} → {:.4}, Δ {:+.4} [{:+.4}, {:+.4}] at {:.0}%; at least {:.4} worse ({unit}), limit {max_regression}",
            m.baseline,
            m.candidate,
            m.delta.mean,
            m.delta.low,
            m.delta.high,
            self.level * 100.0,
            worse_by.max(0.0),
        );
        if worse_by > max_regression {
            Err(said)
        } else {
            Ok(said)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::CheckOutcome;
    use crate::run::CaseResult;
    use crate::target::Target;

    fn report(id: &str, passes: &[bool], latency: f64) -> RunReport {
        let cases = (passes.iter().enumerate())
            .map(|(i, &pass)| CaseResult {
                id: format!("c{i}"),
                tags: vec![],
                pass,
                checks: vec![CheckOutcome {
                    kind: "contains".into(),
                    pass,
                    detail: String::new(),
                }],
                output: String::new(),
                error: None,
                prompt_tokens: 10,
                completion_tokens: 5,
                latency_ms: latency + i as f64,
                cost: 0.0,
            })
            .collect();
        RunReport {
            id: id.into(),
            kind: "run".into(),
            suite: "s".into(),
            target: Target::new("http://x", "m"),
            started_at: 0,
            duration_s: 0.0,
            cases,
        }
    }

    #[test]
    fn the_gate_blocks_a_clear_regression_and_passes_an_equal_candidate() {
        let base = report("base", &[true; 20], 100.0);
        let mut worse_passes = [true; 20];
        worse_passes[..12].fill(false);
        let worse = report("worse", &worse_passes, 100.0);
        let cmp = Comparison::new(&base, &worse, 0.95);
        assert_eq!(cmp.flips.len(), 12);
        assert!(cmp.flips.iter().all(|f| !f.now_passes));
        let m = cmp.metric("pass").unwrap();
        assert_eq!((m.baseline, m.candidate), (1.0, 0.4));
        assert!(cmp.gate("pass", 0.05).is_err());
        assert!(cmp.gate("check.contains", 0.05).is_err());

        let same = report("same", &[true; 20], 100.0);
        let cmp = Comparison::new(&base, &same, 0.95);
        assert!(cmp.flips.is_empty());
        assert!(
            cmp.gate("pass", 0.05).is_ok(),
            "{:?}",
            cmp.gate("pass", 0.05)
        );
        assert!(cmp.gate("latency_ms", 0.05).is_ok());
        assert!(cmp.gate("nope", 0.05).is_err());
    }

    #[test]
    fn latency_regressions_are_relative() {
        let base = report("base", &[true; 10], 100.0);
        let slow = report("slow", &[true; 10], 150.0);
        let cmp = Comparison::new(&base, &slow, 0.95);
        assert!(cmp.gate("latency_ms", 0.2).is_err());
        assert!(cmp.gate("latency_ms", 0.6).is_ok());
    }

    #[test]
    fn unpaired_cases_are_named_and_left_out() {
        let base = report("base", &[true, true, false], 100.0);
        let cand = report("cand", &[true, true], 100.0);
        let cmp = Comparison::new(&base, &cand, 0.95);
        assert_eq!(cmp.unpaired, vec!["c2".to_string()]);
        assert_eq!(cmp.metric("pass").unwrap().cases, 2);
    }
}
