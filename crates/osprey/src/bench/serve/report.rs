//! Figures of a run, medians across runs, ratios between servers: as a table and as JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::client::{Outcome, Tally};
use super::engine_stats::EngineRun;
use super::workload::Class;

/// Figures of one group of requests (a class, or all) in one level of one run. Latencies are
/// NaN (`null` in JSON) when no request of the group completed.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Figures {
    pub requests: usize,
    pub errors: usize,
    /// Output tokens per second of wall time (of this group's tokens).
    pub output_tokens_per_s: f64,
    /// Prompt and output tokens per second: everything the server computed for requests that
    /// got their first token, which is the work a scheduler can trade between classes.
    #[serde(default)]
    pub total_tokens_per_s: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub ttft_p50_s: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub ttft_p99_s: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub tpot_p50_s: f64,
    #[serde(deserialize_with = "null_as_nan")]
    pub tpot_p99_s: f64,
}

fn null_as_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Nearest-rank percentile of `v` (sorted in place); NaN when empty.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn median_value(mut v: Vec<f64>) -> f64 {
    percentile(&mut v, 50.0)
}

impl Figures {
    /// Figures of `outcomes`, whose group was served `(prompt, output)` tokens in `wall`
    /// seconds (including requests still running when the level ended).
    pub fn of(outcomes: &[&Outcome], (prompt, output): (u64, u64), wall: f64) -> Self {
        let ok: Vec<&&Outcome> = outcomes.iter().filter(|o| o.error.is_none()).collect();
        let mut ttft: Vec<f64> = ok.iter().filter_map(|o| o.ttft).collect();
        let mut tpot: Vec<f64> = ok.iter().filter_map(|o| o.tpot()).collect();
        Self {
            requests: outcomes.len(),
            errors: outcomes.len() - ok.len(),
            output_tokens_per_s: output as f64 / wall.max(1e-9),
            total_tokens_per_s: (prompt + output) as f64 / wall.max(1e-9),
            ttft_p50_s: percentile(&mut ttft, 50.0),
            ttft_p99_s: percentile(&mut ttft, 99.0),
            tpot_p50_s: percentile(&mut tpot, 50.0),
            tpot_p99_s: percentile(&mut tpot, 99.0),
        }
    }

    /// Medians, figure by figure, across runs.
    pub fn median_of(runs: &[Figures]) -> Self {
        let m = |f: fn(&Figures) -> f64| median_value(runs.iter().map(f).collect());
        Self {
            requests: runs.iter().map(|r| r.requests).max().unwrap_or(0),
            errors: runs.iter().map(|r| r.errors).max().unwrap_or(0),
            output_tokens_per_s: m(|r| r.output_tokens_per_s),
            total_tokens_per_s: m(|r| r.total_tokens_per_s),
            ttft_p50_s: m(|r| r.ttft_p50_s),
            ttft_p99_s: m(|r| r.ttft_p99_s),
            tpot_p50_s: m(|r| r.tpot_p50_s),
            tpot_p99_s: m(|r| r.tpot_p99_s),
        }
    }

    /// How many times better `self` is than `other`: throughput ratio, and latency ratios
    /// inverted (so above 1 always means `self` is better).
    pub fn advantage_over(&self, other: &Figures) -> Figures {
        Figures {
            requests: self.requests,
            errors: self.errors,
            output_tokens_per_s: self.output_tokens_per_s / other.output_tokens_per_s,
            total_tokens_per_s: self.total_tokens_per_s / other.total_tokens_per_s,
            ttft_p50_s: other.ttft_p50_s / self.ttft_p50_s,
            ttft_p99_s: other.ttft_p99_s / self.ttft_p99_s,
            tpot_p50_s: other.tpot_p50_s / self.tpot_p50_s,
            tpot_p99_s: other.tpot_p99_s / self.tpot_p99_s,
        }
    }
}

/// One level of one run on one server.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LevelRun {
    pub wall_s: f64,
    /// Per group: "all", and each class present.
    pub groups: BTreeMap<String, Figures>,
    /// Prompt tokens served from the prefix cache, as a share of those looked up (servers
    /// that export Osprey's counters only).
    pub prefix_hit_rate: Option<f64>,
    /// What an Osprey server's engine did in the run (from its `/metrics`).
    #[serde(default)]
    pub engine: Option<EngineRun>,
    /// The completed requests' texts, summarized (a sum of their hashes, in whatever order
    /// they finished): equal between servers that wrote the same answers.
    #[serde(default)]
    pub text_digest: u64,
    /// First error messages, for the record.
    pub sample_errors: Vec<String>,
}

impl LevelRun {
    /// Groups the outcomes of a level, whose tokens `tally` counted. `classes` are those the
    /// level's plan sends (each gets a group when there are several).
    pub fn new(outcomes: &[Outcome], classes: &[Class], tally: &Tally, wall_s: f64) -> Self {
        let mut groups = BTreeMap::new();
        let all: Vec<&Outcome> = outcomes.iter().collect();
        let tokens = classes
            .iter()
            .map(|&c| tally.of(c))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        groups.insert("all".to_owned(), Figures::of(&all, tokens, wall_s));
        if classes.len() > 1 {
            for &class in classes {
                let os: Vec<&Outcome> = all.iter().copied().filter(|o| o.class == class).collect();
                let name = serde_json::to_value(class).expect("a string");
                let name = name.as_str().expect("a string").to_owned();
                groups.insert(name, Figures::of(&os, tally.of(class), wall_s));
            }
        }
        Self {
            wall_s,
            groups,
            prefix_hit_rate: None,
            engine: None,
            text_digest: (outcomes.iter())
                .filter(|o| o.error.is_none())
                .fold(0u64, |sum, o| sum.wrapping_add(o.text_hash)),
            sample_errors: outcomes
                .iter()
                .filter_map(|o| o.error.clone())
                .take(3)
                .collect(),
        }
    }
}

/// A server's results for one level across runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServerLevel {
    pub server: String,
    pub runs: Vec<LevelRun>,
    pub median: BTreeMap<String, Figures>,
    pub median_prefix_hit_rate: Option<f64>,
    /// Medians of the engine's figures across runs.
    #[serde(default)]
    pub median_engine: Option<EngineRun>,
}

impl ServerLevel {
    /// How many times better this server is than `other`, group by group.
    pub fn advantage_over(&self, other: &ServerLevel) -> BTreeMap<String, Figures> {
        self.median
            .iter()
            .filter_map(|(g, f)| Some((g.clone(), f.advantage_over(other.median.get(g)?))))
            .collect()
    }

    pub fn new(server: &str, runs: Vec<LevelRun>) -> Self {
        let mut median = BTreeMap::new();
        if let Some(first) = runs.first() {
            for group in first.groups.keys() {
                let figures: Vec<Figures> = runs
                    .iter()
                    .filter_map(|r| r.groups.get(group).copied())
                    .collect();
                median.insert(group.clone(), Figures::median_of(&figures));
            }
        }
        let rates: Vec<f64> = runs.iter().filter_map(|r| r.prefix_hit_rate).collect();
        let engines: Vec<EngineRun> = runs.iter().filter_map(|r| r.engine).collect();
        Self {
            server: server.to_owned(),
            median_prefix_hit_rate: (!rates.is_empty()).then(|| median_value(rates)),
            median_engine: (!engines.is_empty()).then(|| EngineRun::median_of(&engines)),
            runs,
            median,
        }
    }
}

/// Everything one `osprey bench serve` produced.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub workload: String,
    pub seed: u64,
    pub runs: usize,
    pub servers: Vec<ServerInfo>,
    pub levels: Vec<LevelReport>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServerInfo {
    pub label: String,
    pub url: String,
    pub model: String,
    /// Peak resident memory of the server process (`VmHWM`), when its pid was given.
    pub peak_rss_mib: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LevelReport {
    pub name: String,
    pub concurrency: usize,
    pub servers: Vec<ServerLevel>,
    /// The first server's advantage over each other one, per group (above 1 = first is
    /// better).
    pub advantage: Vec<(String, BTreeMap<String, Figures>)>,
    /// Workload S: whether every server wrote, run by run, the same text as the first server
    /// serving the same model id (the same engine with speculation on and off must; another
    /// engine, reporting its own id, is compared with itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_text: Option<bool>,
}

impl LevelReport {
    /// Whether each server's runs wrote what those of the first server with its model id
    /// (`models[i]` is server `i`'s) did, run by run.
    pub fn texts_agree(servers: &[ServerLevel], models: &[&str]) -> bool {
        let digests = |s: &ServerLevel| s.runs.iter().map(|r| r.text_digest).collect::<Vec<_>>();
        servers.iter().zip(models).all(|(server, model)| {
            let first = models.iter().position(|m| m == model).expect("its own");
            digests(server) == digests(&servers[first])
        })
    }
}

fn secs(s: f64) -> String {
    if s.is_nan() {
        "-".into()
    } else if s < 1.0 {
        format!("{:.0} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

fn times(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}×")
    } else {
        "-".into()
    }
}

/// The report as a plain-text table.
pub fn table(report: &Report) -> String {
    let mut out = format!(
        "workload {} · medians of {} interleaved runs · seed {}\n",
        report.workload, report.runs, report.seed
    );
    out += &format!(
        "{:<14} {:<14} {:<12} {:>5} {:>4} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>6}\n",
        "level",
        "server",
        "requests",
        "n",
        "err",
        "out tok/s",
        "all tok/s",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "TPOT p99",
        "hit %"
    );
    for level in &report.levels {
        for s in &level.servers {
            for (group, f) in &s.median {
                let hit = s
                    .median_prefix_hit_rate
                    .filter(|_| group == "all")
                    .map_or("-".into(), |r| format!("{:.0}", r * 100.0));
                out += &format!(
                    "{:<14} {:<14} {:<12} {:>5} {:>4} {:>10.1} {:>10.1} {:>9} {:>9} {:>9} {:>9} {:>6}\n",
                    level.name,
                    s.server,
                    group,
                    f.requests,
                    f.errors,
                    f.output_tokens_per_s,
                    f.total_tokens_per_s,
                    secs(f.ttft_p50_s),
                    secs(f.ttft_p99_s),
                    secs(f.tpot_p50_s),
                    secs(f.tpot_p99_s),
                    hit
                );
            }
        }
        let first = level.servers.first().map_or("", |s| s.server.as_str());
        for (other, adv) in &level.advantage {
            for (group, f) in adv {
                out += &format!(
                    "{:<14} {:<14} {:<12} {:>5} {:>4} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9}\n",
                    level.name,
                    format!("{}÷{}", short(first), short(other)),
                    group,
                    "",
                    "",
                    times(f.output_tokens_per_s),
                    times(f.total_tokens_per_s),
                    times(f.ttft_p50_s),
                    times(f.ttft_p99_s),
                    times(f.tpot_p50_s),
                    times(f.tpot_p99_s),
                );
            }
        }
    }
    out += &engine_table(report);
    out += &speculation_table(report);
    for s in &report.servers {
        if let Some(rss) = s.peak_rss_mib {
            out += &format!("peak RSS of {}: {rss:.0} MiB\n", s.label);
        }
    }
    out += "all tok/s counts prompt and output tokens; ratios (÷ rows): how many times better \
            the first server is (tokens/s: higher; latencies: lower), so above 1 favours it\n";
    out
}

/// The engine's figures, for servers of MoE models (expert load, deferrals, planning time).
fn engine_table(report: &Report) -> String {
    let rows: Vec<(&str, &str, EngineRun)> = (report.levels.iter())
        .flat_map(|l| {
            (l.servers.iter())
                .filter_map(|s| Some((l.name.as_str(), s.server.as_str(), s.median_engine?)))
        })
        .filter(|(_, _, e)| e.moe_steps > 0.0)
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let opt = |v: Option<f64>, scale: f64, digits: usize| {
        v.map_or("-".into(), |v| format!("{:.digits$}", v * scale))
    };
    let mut out = format!(
        "\n{:<14} {:<14} {:>8} {:>9} {:>9} {:>9} {:>8} {:>10} {:>9} {:>7}\n",
        "level",
        "server",
        "steps",
        "imbal",
        "imbal p99",
        "experts",
        "defer",
        "plan µs",
        "step ms",
        "preempt"
    );
    for (level, server, e) in rows {
        out += &format!(
            "{:<14} {:<14} {:>8.0} {:>9} {:>9} {:>9} {:>8.0} {:>10} {:>9} {:>7.0}\n",
            level,
            server,
            e.steps,
            opt(e.imbalance_mean, 1.0, 3),
            opt(e.imbalance_p99, 1.0, 2),
            opt(e.experts_active_mean, 1.0, 2),
            e.deferrals,
            opt(e.plan_s, 1e6, 1),
            opt(e.step_s, 1e3, 2),
            e.preemptions,
        );
    }
    out += "imbal: busiest expert's tokens ÷ the mean expert's, per MoE layer and step (1 = \
            balanced; p99 is a bucket bound); experts: experts run per MoE layer per step\n";
    out
}

/// What speculative decoding did, for levels where a server drafted.
fn speculation_table(report: &Report) -> String {
    let rows: Vec<(&LevelReport, &str, EngineRun)> = (report.levels.iter())
        .flat_map(|l| {
            (l.servers.iter()).filter_map(move |s| Some((l, s.server.as_str(), s.median_engine?)))
        })
        .filter(|(_, _, e)| e.drafted > 0.0)
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\n{:<16} {:<14} {:>9} {:>9} {:>8} {:>11} {:>10}\n",
        "level", "server", "drafted", "accepted", "accept %", "per verify", "same text"
    );
    for (level, server, e) in rows {
        let same = level
            .same_text
            .map_or("-", |s| if s { "yes" } else { "NO" });
        out += &format!(
            "{:<16} {:<14} {:>9.0} {:>9.0} {:>8.1} {:>11} {:>10}\n",
            level.name,
            server,
            e.drafted,
            e.accepted,
            100.0 * e.accepted / e.drafted,
            e.verified
                .map_or("-".into(), |v| format!("{:.2}", e.accepted / v)),
            same,
        );
    }
    out += "accept %: drafted tokens the model accepted; per verify: accepted tokens per verified \
            draft; same text: each server wrote, run by run, the answers of the first server with its model id\n";
    out
}

fn short(label: &str) -> String {
    label.chars().take(6).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(class: Class, ttft: f64, e2e: f64, tokens: u64) -> Outcome {
        Outcome {
            class,
            error: None,
            ttft: Some(ttft),
            e2e,
            output_tokens: tokens,
            text_hash: tokens,
        }
    }

    /// Servers are compared with the first server of their model id: two engines may write
    /// different texts, but one engine must agree with itself.
    #[test]
    fn same_text_compares_each_server_with_the_first_of_its_model() {
        let server = |label: &str, digests: [u64; 2]| {
            let runs = digests.map(|d| {
                let mut run = LevelRun::new(&[], &[Class::Interactive], &Tally::default(), 1.0);
                run.text_digest = d;
                run
            });
            ServerLevel::new(label, runs.to_vec())
        };
        let servers = [
            server("osprey-on", [1, 2]),
            server("osprey-off", [1, 2]),
            server("llama-on", [7, 8]),
            server("llama-off", [7, 8]),
        ];
        let models = ["smollm2", "smollm2", "smollm2.gguf", "smollm2.gguf"];
        assert!(LevelReport::texts_agree(&servers, &models));
        let mut changed = servers.clone();
        changed[3] = server("llama-off", [7, 9]);
        assert!(
            !LevelReport::texts_agree(&changed, &models),
            "llama's second run"
        );
        assert!(
            !LevelReport::texts_agree(&servers, &["m"; 4]),
            "one model id for all"
        );
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&mut v, 50.0), 50.0);
        assert_eq!(percentile(&mut v, 99.0), 99.0);
        assert_eq!(percentile(&mut [3.0], 99.0), 3.0);
        assert!(percentile(&mut [], 50.0).is_nan());
    }

    #[test]
    fn figures_group_by_class_and_count_every_token_served() {
        let mut failed = outcome(Class::Interactive, 0.0, 1.0, 0);
        failed.error = Some("HTTP 503".into());
        let outcomes = [
            outcome(Class::Interactive, 0.1, 1.1, 11),
            outcome(Class::Interactive, 0.3, 2.3, 11),
            failed,
            outcome(Class::Batch, 1.0, 5.0, 5),
        ];
        // What the outcomes got, plus a batch request cut off after 20 tokens of a 700-token
        // prompt.
        let tally = Tally::default();
        tally.add_prompt(Class::Interactive, 2 * 100);
        tally.add_output(Class::Interactive, 22);
        tally.add_prompt(Class::Batch, 300 + 700);
        tally.add_output(Class::Batch, 5 + 20);
        let run = LevelRun::new(&outcomes, &[Class::Interactive, Class::Batch], &tally, 10.0);
        let all = run.groups["all"];
        assert_eq!((all.requests, all.errors), (4, 1));
        assert_eq!(all.output_tokens_per_s, (11.0 + 11.0 + 5.0 + 20.0) / 10.0);
        assert_eq!(
            all.total_tokens_per_s,
            (200.0 + 22.0 + 1000.0 + 25.0) / 10.0
        );
        let i = run.groups["interactive"];
        assert_eq!(i.output_tokens_per_s, 2.2);
        assert_eq!(i.total_tokens_per_s, 22.2);
        assert_eq!((i.ttft_p50_s, i.ttft_p99_s), (0.1, 0.3));
        assert!((i.tpot_p99_s - 0.2).abs() < 1e-12);
        assert_eq!(run.groups["batch"].output_tokens_per_s, 2.5);
    }

    #[test]
    fn advantage_is_above_one_when_the_first_is_better() {
        let a = Figures {
            output_tokens_per_s: 200.0,
            ttft_p50_s: 0.5,
            ..Figures::default()
        };
        let b = Figures {
            output_tokens_per_s: 100.0,
            ttft_p50_s: 2.0,
            ..Figures::default()
        };
        let adv = a.advantage_over(&b);
        assert_eq!((adv.output_tokens_per_s, adv.ttft_p50_s), (2.0, 4.0));
    }
}
