//! What an Osprey server's engine did during one run, from its `/metrics` page read before and
//! after: prefix-cache hits, and for an MoE model the expert load of its steps, the scheduler's
//! deferrals and the time it took to plan.

use std::collections::HashMap;

use osprey_core::metrics as names;
use serde::{Deserialize, Serialize};

/// Every sample of a Prometheus text page, by series (name and labels as written).
#[derive(Clone, Debug, Default)]
pub struct Scrape(HashMap<String, f64>);

impl Scrape {
    /// Reads `url`'s `/metrics`; `None` when the server has none.
    pub async fn of(client: &reqwest::Client, url: &str) -> Option<Self> {
        let resp = client.get(format!("{url}/metrics")).send().await.ok()?;
        let text = resp.error_for_status().ok()?.text().await.ok()?;
        Some(Self::parse(&text))
    }

    fn parse(text: &str) -> Self {
        let samples = (text.lines())
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.trim().to_owned(), value.trim().parse().ok()?))
            })
            .collect();
        Self(samples)
    }

    /// The sum of every series of `name` (over its labels) whose labels contain `filter`.
    fn total(&self, name: &str, filter: &str) -> f64 {
        (self.0.iter())
            .filter(|(k, _)| {
                let labels = k.strip_prefix(name).unwrap_or("-");
                (labels.is_empty() || labels.starts_with('{')) && labels.contains(filter)
            })
            .map(|(_, v)| v)
            .sum()
    }

    /// Cumulative bucket counts of histogram `name`, by upper bound, ascending.
    fn buckets(&self, name: &str) -> Vec<(f64, f64)> {
        let prefix = format!("{name}_bucket{{le=\"");
        let mut b: Vec<(f64, f64)> = (self.0.iter())
            .filter_map(|(k, &v)| {
                let le = k.strip_prefix(&prefix)?.strip_suffix("\"}")?;
                Some((
                    if le == "+Inf" {
                        f64::INFINITY
                    } else {
                        le.parse().ok()?
                    },
                    v,
                ))
            })
            .collect();
        b.sort_by(|x, y| x.0.total_cmp(&y.0));
        b
    }
}

/// What the engine did between two scrapes.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct EngineRun {
    /// Prompt tokens served from the prefix cache, as a share of those looked up.
    pub prefix_hit_rate: Option<f64>,
    /// Forward passes.
    pub steps: f64,
    /// Mean wall time of a step, seconds.
    pub step_s: Option<f64>,
    /// Mean time the scheduler took to plan a step, seconds.
    pub plan_s: Option<f64>,
    /// Steps of an MoE model whose routing was measured.
    pub moe_steps: f64,
    /// Mean over steps of the busiest expert's tokens over the mean's (per MoE layer).
    pub imbalance_mean: Option<f64>,
    /// The bucket bound under which 99% of steps' imbalance fell.
    pub imbalance_p99: Option<f64>,
    /// Mean experts run per MoE layer in a step.
    pub experts_active_mean: Option<f64>,
    /// Steps sequences were held back to keep an expert under capacity.
    pub deferrals: f64,
    pub preemptions: f64,
    /// Tokens drafted by speculative decoding.
    #[serde(default)]
    pub drafted: f64,
    /// Of those, accepted.
    #[serde(default)]
    pub accepted: f64,
    /// Drafts verified.
    #[serde(default)]
    pub verified: Option<f64>,
}

impl EngineRun {
    /// The difference between two scrapes of the same server.
    pub fn between(before: &Scrape, after: &Scrape) -> Self {
        let d = |name: &str| after.total(name, "") - before.total(name, "");
        let mean = |name: &str| {
            let n = d(&format!("{name}_count"));
            (n > 0.0).then(|| d(&format!("{name}_sum")) / n)
        };
        let queried = d(names::PREFIX_CACHE_QUERIED_TOKENS);
        let moe_steps = d(&format!("{}_count", names::EXPERT_LOAD_IMBALANCE));
        Self {
            prefix_hit_rate: (queried > 0.0).then(|| d(names::PREFIX_CACHE_HIT_TOKENS) / queried),
            steps: d(&format!("{}_count", names::STEP_DURATION)),
            step_s: mean(names::STEP_DURATION),
            plan_s: mean(names::SCHEDULE_DURATION),
            moe_steps,
            imbalance_mean: mean(names::EXPERT_LOAD_IMBALANCE),
            imbalance_p99: quantile_bound(
                &before.buckets(names::EXPERT_LOAD_IMBALANCE),
                &after.buckets(names::EXPERT_LOAD_IMBALANCE),
                0.99,
            ),
            experts_active_mean: mean(names::EXPERTS_ACTIVE),
            deferrals: d(names::SCHEDULER_DEFERRALS),
            preemptions: d(names::PREEMPTIONS),
            drafted: d(names::SPEC_DRAFT_TOKENS),
            accepted: d(names::SPEC_ACCEPTED_TOKENS),
            verified: Some(d(&format!("{}_count", names::SPEC_ACCEPTED_LENGTH)))
                .filter(|&v| v > 0.0),
        }
    }

    /// Medians across runs, figure by figure.
    pub fn median_of(runs: &[EngineRun]) -> Self {
        let m = |f: fn(&EngineRun) -> Option<f64>| {
            let mut v: Vec<f64> = runs.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| super::report::percentile(&mut v, 50.0))
        };
        Self {
            prefix_hit_rate: m(|r| r.prefix_hit_rate),
            steps: m(|r| Some(r.steps)).unwrap_or(0.0),
            step_s: m(|r| r.step_s),
            plan_s: m(|r| r.plan_s),
            moe_steps: m(|r| Some(r.moe_steps)).unwrap_or(0.0),
            imbalance_mean: m(|r| r.imbalance_mean),
            imbalance_p99: m(|r| r.imbalance_p99),
            experts_active_mean: m(|r| r.experts_active_mean),
            deferrals: m(|r| Some(r.deferrals)).unwrap_or(0.0),
            preemptions: m(|r| Some(r.preemptions)).unwrap_or(0.0),
            drafted: m(|r| Some(r.drafted)).unwrap_or(0.0),
            accepted: m(|r| Some(r.accepted)).unwrap_or(0.0),
            verified: m(|r| r.verified),
        }
    }
}

/// The smallest bucket bound below which a `q` share of the observations between two
/// cumulative bucket lists fell.
fn quantile_bound(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let counts: Vec<(f64, f64)> = (after.iter())
        .map(|&(le, n)| {
            let was = before.iter().find(|b| b.0 == le).map_or(0.0, |b| b.1);
            (le, n - was)
        })
        .collect();
    let total = counts.last()?.1;
    (total > 0.0).then(|| {
        counts
            .iter()
            .find(|(_, n)| *n >= q * total)
            .map_or(f64::INFINITY, |b| b.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_the_difference_of_two_scrapes() {
        let page = |steps: f64, sum: f64, b15: f64, b2: f64| {
            format!(
                "# TYPE x histogram\n\
                 osprey_expert_load_imbalance_ratio_bucket{{le=\"1.5\"}} {b15}\n\
                 osprey_expert_load_imbalance_ratio_bucket{{le=\"2\"}} {b2}\n\
                 osprey_expert_load_imbalance_ratio_bucket{{le=\"+Inf\"}} {steps}\n\
                 osprey_expert_load_imbalance_ratio_sum {sum}\n\
                 osprey_expert_load_imbalance_ratio_count {steps}\n\
                 osprey_scheduler_deferrals_total 7\n\
                 osprey_prefix_cache_queried_tokens_total{{model=\"m\"}} {}\n\
                 osprey_prefix_cache_hit_tokens_total {}\n",
                steps * 10.0,
                steps * 5.0
            )
        };
        let before = Scrape::parse(&page(10.0, 15.0, 10.0, 10.0));
        // 100 more steps: 98 at most 1.5, 2 between 1.5 and 2, summing to 160.
        let after = Scrape::parse(&page(110.0, 175.0, 108.0, 110.0));
        let run = EngineRun::between(&before, &after);
        assert_eq!(run.moe_steps, 100.0);
        assert_eq!(run.imbalance_mean, Some(1.6));
        assert_eq!(run.imbalance_p99, Some(2.0));
        assert_eq!(run.deferrals, 0.0);
        assert_eq!(run.prefix_hit_rate, Some(0.5));
        assert_eq!(run.plan_s, None, "no such histogram on the page");
    }
}
