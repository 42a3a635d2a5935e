//! `osprey bench serve`: a load generator for OpenAI-compatible servers (Osprey, llama-server,
//! vLLM, ...), running the workloads of `../shared/BENCHMARKS.md` and reporting output tokens/s,
//! TTFT and TPOT percentiles as a table and as JSON.
//!
//! With `--compare URL` it measures two servers in the same run, level by level and run by run
//! interleaved (A B A B ...), and prints how many times better the first one is. Prompts are
//! generated from `--seed` with the model's tokenizer, so every run has the same shape (token
//! counts, shared prefixes) and any seed can be used to re-measure on fresh text.
//!
//! With `--sweep SUITE` it runs an eval suite instead, at each concurrency and context length,
//! and reports its pass rate beside its latency ([`sweep`]).

mod chart;
mod client;
mod copying;
mod engine_stats;
mod report;
mod sweep;
pub(crate) mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use osprey_engine::Tokenizer;
use osprey_models::GgufFile;

use client::{Outcome, Tally};
use report::{LevelReport, LevelRun, Report, ServerInfo, ServerLevel};
use workload::{Class, Level, Shape, WorkloadId};

/// Options of `osprey bench serve`.
#[derive(Args, Debug)]
pub struct ServeBenchArgs {
    /// Base URL of the server to measure.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Name of that server in the report.
    #[arg(long, default_value = "osprey")]
    pub label: String,
    /// Another server, measured interleaved with the first (repeat for more).
    #[arg(long)]
    pub compare: Vec<String>,
    /// Names of the other servers, in order (default `compare-1`, ...).
    #[arg(long)]
    pub compare_label: Vec<String>,
    /// `a` (concurrency sweep), `b` (shared system prompt), `c` (cache-aware routing: compare
    /// gateways in front of the same workers), `f` (interactive + batch) or `s` (speculative
    /// decoding: copy-heavy and open-ended prompts; compare a server speculating with one
    /// that does not).
    #[arg(long, short = 'w', value_enum, default_value = "a")]
    pub workload: WorkloadId,
    /// Concurrent streams: the sweep of A (default 1,8,32), the users of B (default 32) or C
    /// (default 16).
    #[arg(long, short = 'c', value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Requests each client sends (default: A 3, B 1); in F, the distinct requests each
    /// interactive client goes round (default 5).
    #[arg(long)]
    pub requests_per_client: Option<usize>,
    /// F: interactive clients (short prompts, 32 tokens, latency measured).
    #[arg(long, default_value_t = 8)]
    pub interactive_clients: usize,
    /// F: batch clients (600–900-token prompts, 128 tokens, sent back to back as load).
    #[arg(long, default_value_t = 40)]
    pub batch_clients: usize,
    /// F: seconds each run measures; every client goes round its requests until then.
    #[arg(long, default_value_t = 60.0)]
    pub duration: f64,
    /// F: the share of requests (0–1) written on one narrow topic, whose tokens favour the
    /// same experts of an MoE model (the skewed-topic mix of KDA's benchmark).
    #[arg(long, default_value_t = 0.0)]
    pub hot_topic: f64,
    /// A: the longest prompt, in tokens (default 240; each is 2/3 of it or more), for the
    /// memory of long contexts.
    #[arg(long)]
    pub prompt_tokens: Option<usize>,
    /// Repetitions; medians are reported.
    #[arg(long, short = 'r', default_value_t = 3)]
    pub runs: usize,
    /// Seed of the generated prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Model name to send (default: the first each server lists).
    #[arg(long)]
    pub model: Option<String>,
    /// GGUF whose tokenizer sizes the prompts (default: the default model).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Write the full report (every run) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw an SVG chart here: tokens/s and TTFT against concurrency (workload A), or the
    /// speed-up and acceptance per level (workload S).
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// Pid of the first server, to report its peak RSS.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Pids of the other servers, in order.
    #[arg(long)]
    pub compare_pid: Vec<u32>,
    /// Evaluate under load instead: run this eval suite (docs/eval.md) at each --concurrency
    /// and --context, its pass rate and latency reported together (a table, --json, --chart).
    #[arg(long)]
    pub sweep: Option<PathBuf>,
    /// --sweep: context lengths, in tokens of unrelated text put before each case's input.
    #[arg(long, value_delimiter = ',', default_value = "0,1000")]
    pub context: Vec<usize>,
    /// Measure nothing: merge the levels of these earlier `--json` reports (comma-separated),
    /// print them and draw `--chart`.
    #[arg(long, value_delimiter = ',')]
    pub from_json: Vec<PathBuf>,
}

impl ServeBenchArgs {
    /// Every option at its default, as `osprey bench serve` alone would take them.
    pub fn defaults() -> Self {
        use clap::{Args, FromArgMatches};
        let command = Self::augment_args(clap::Command::new("serve"));
        Self::from_arg_matches(&command.get_matches_from(["serve"])).expect("the defaults parse")
    }
}

struct Target {
    label: String,
    url: String,
    model: String,
    pid: Option<u32>,
}

pub fn run(args: ServeBenchArgs) -> anyhow::Result<()> {
    if !args.from_json.is_empty() {
        return merge_reports(&args);
    }
    let path = match &args.tokenizer {
        Some(p) => p.clone(),
        None => crate::models::fetch_default()?,
    };
    let tokenizer =
        Tokenizer::from_gguf(&GgufFile::open(&path)?).context("loading the tokenizer")?;
    if let Some(suite) = &args.sweep {
        return sweep::run(&args, suite, &tokenizer);
    }
    let shape = Shape {
        concurrency: match (args.workload, args.concurrency.is_empty()) {
            (_, false) => args.concurrency.clone(),
            (WorkloadId::B, true) => vec![32],
            (WorkloadId::C, true) => vec![16],
            _ => vec![1, 8, 32],
        },
        requests_per_client: args.requests_per_client.unwrap_or(match args.workload {
            WorkloadId::A => 3,
            WorkloadId::B => 1,
            WorkloadId::C => 4,
            WorkloadId::F => 5,
            WorkloadId::S => 3,
        }),
        seed: args.seed,
        prompt_tokens: args.prompt_tokens,
        interactive_clients: args.interactive_clients,
        batch_clients: args.batch_clients,
        window: Duration::try_from_secs_f64(args.duration)
            .ok()
            .filter(|d| !d.is_zero())
            .context("--duration must be a positive number of seconds")?,
        hot_topic: args.hot_topic,
    };
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.hot_topic),
        "--hot-topic is a share, between 0 and 1"
    );
    // Fresh text each run (seed + run), so no server is served from its cache a repeat of an
    // earlier run's prompts; the shape is the same every run. Servers that share backends get
    // fresh text each (run × server) too.
    let plans = match args.workload.shares_backends() {
        true => args.runs.max(1) * (1 + args.compare.len()),
        false => args.runs.max(1),
    };
    let runs: Vec<Vec<Level>> = (0..plans as u64)
        .map(|r| {
            let shape = Shape {
                seed: args.seed.wrapping_add(r),
                ..shape.clone()
            };
            workload::levels(args.workload, &shape, &tokenizer)
        })
        .collect();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?
        .block_on(measure(&args, runs))
}

async fn measure(args: &ServeBenchArgs, runs: Vec<Vec<Level>>) -> anyhow::Result<()> {
    let levels = &runs[0];
    let http = client::http_client();
    let mut targets = Vec::new();
    let mut servers = vec![(args.label.clone(), &args.url, args.pid)];
    for (i, url) in args.compare.iter().enumerate() {
        let label = args.compare_label.get(i).cloned();
        let label = label.unwrap_or_else(|| format!("compare-{}", i + 1));
        servers.push((label, url, args.compare_pid.get(i).copied()));
    }
    for (label, url, pid) in servers {
        let url = url.trim_end_matches('/').to_owned();
        let model = match &args.model {
            Some(m) => m.clone(),
            None => client::first_model(&http, &url)
                .await
                .with_context(|| format!("asking {url} for its models"))?,
        };
        targets.push(Target {
            label: label.clone(),
            url,
            model,
            pid,
        });
    }

    // Windowed levels advance the bar by the second, the others by the request.
    let (per_level, unit): (fn(&Level) -> u64, _) = match levels[0].window {
        Some(_) => (|l| l.window.map_or(0, |w| w.as_secs()), "s"),
        None => (
            |l| l.clients.iter().map(|c| c.requests.len() as u64).sum(),
            "requests",
        ),
    };
    let total: u64 = levels.iter().map(per_level).sum::<u64>() * (targets.len() * args.runs) as u64;
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{{msg:24}} [{{bar:30}}] {{pos}}/{{len}} {unit} ({{elapsed}})"
        ))
        .expect("valid template")
        .progress_chars("=> "),
    );
    // results[level][target] = runs
    let mut results: Vec<Vec<Vec<LevelRun>>> = vec![vec![Vec::new(); targets.len()]; levels.len()];
    for run in 0..args.runs.max(1) {
        for l in 0..levels.len() {
            for (t, target) in targets.iter().enumerate() {
                let plan = match args.workload.shares_backends() {
                    true => run * targets.len() + t,
                    false => run,
                };
                let level = &runs[plan][l];
                bar.set_message(format!("run {} {} {}", run + 1, level.name, target.label));
                let r = run_level(&http, target, level, &bar).await;
                results[l][t].push(r);
            }
        }
    }
    bar.finish_and_clear();

    let models: Vec<&str> = targets.iter().map(|t| t.model.as_str()).collect();
    let report = Report {
        workload: format!("{:?}", args.workload),
        seed: args.seed,
        runs: args.runs,
        servers: targets
            .iter()
            .map(|t| ServerInfo {
                label: t.label.clone(),
                url: t.url.clone(),
                model: t.model.clone(),
                peak_rss_mib: t.pid.and_then(peak_rss_mib),
            })
            .collect(),
        levels: levels
            .iter()
            .zip(results)
            .map(|(level, per_target)| {
                let servers: Vec<ServerLevel> = targets
                    .iter()
                    .zip(per_target)
                    .map(|(t, runs)| ServerLevel::new(&t.label, runs))
                    .collect();
                let advantage = servers
                    .iter()
                    .skip(1)
                    .map(|other| (other.server.clone(), servers[0].advantage_over(other)))
                    .collect();
                LevelReport {
                    name: level.name.clone(),
                    concurrency: level.concurrency,
                    same_text: (args.workload == WorkloadId::S)
                        .then(|| LevelReport::texts_agree(&servers, &models)),
                    servers,
                    advantage,
                }
            })
            .collect(),
    };
    output(args, &report)
}

/// Prints the table and writes the JSON and chart asked for.
fn output(args: &ServeBenchArgs, report: &Report) -> anyhow::Result<()> {
    print!("{}", report::table(report));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.chart {
        chart::draw(report, path)?;
    }
    Ok(())
}

fn merge_reports(args: &ServeBenchArgs) -> anyhow::Result<()> {
    let mut merged: Option<Report> = None;
    for path in &args.from_json {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let report: Report =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        match &mut merged {
            None => merged = Some(report),
            Some(m) => {
                m.levels.extend(report.levels);
                for s in report.servers {
                    match m.servers.iter_mut().find(|x| x.label == s.label) {
                        Some(x) => {
                            x.peak_rss_mib = match (x.peak_rss_mib, s.peak_rss_mib) {
                                (Some(a), Some(b)) => Some(a.max(b)),
                                (a, b) => a.or(b),
                            }
                        }
                        None => m.servers.push(s),
                    }
                }
            }
        }
    }
    let mut report = merged.expect("at least one file");
    report.levels.sort_by_key(|l| l.concurrency);
    output(args, &report)
}

/// Runs one level against one server: warm-up, then every client at once, until the clients
/// are done or the level's window ends.
async fn run_level(
    http: &reqwest::Client,
    target: &Target,
    level: &Level,
    bar: &ProgressBar,
) -> LevelRun {
    let quiet = Arc::new(Tally::default());
    for spec in &level.warmup {
        client::send(http, &target.url, &target.model, spec, &quiet).await;
    }
    let before = engine_stats::Scrape::of(http, &target.url).await;
    let tally = Arc::new(Tally::default());
    let finished = Arc::new(std::sync::Mutex::new(Vec::<Outcome>::new()));
    let start = Instant::now();
    let tasks: Vec<_> = level
        .clients
        .iter()
        .map(|plan| {
            let (http, url, model) = (http.clone(), target.url.clone(), target.model.clone());
            let (plan, tally, finished, bar) =
                (plan.clone(), tally.clone(), finished.clone(), bar.clone());
            let repeat = level.window.is_some();
            tokio::spawn(async move {
                for round in 0.. {
                    for spec in &plan.requests {
                        let spec = spec.repeated(round);
                        let o = client::send(&http, &url, &model, &spec, &tally).await;
                        let failed = o.error.is_some();
                        finished.lock().expect("not poisoned").push(o);
                        if failed && repeat {
                            // A refusal comes back at once: don't spin on it until the end.
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        if !repeat {
                            bar.inc(1);
                        }
                    }
                    if !repeat {
                        break;
                    }
                }
            })
        })
        .collect();
    let wall = match level.window {
        Some(window) => {
            // Cut everything off at the end of the window: completed requests give the
            // latencies, and the tally counts what the unfinished ones had received.
            let mut ticks = tokio::time::interval(Duration::from_secs(1));
            ticks.tick().await;
            for _ in 0..window.as_secs() {
                ticks.tick().await;
                bar.inc(1);
            }
            tokio::time::sleep_until((start + window).into()).await;
            for task in &tasks {
                task.abort();
            }
            window.as_secs_f64()
        }
        None => {
            for task in tasks {
                task.await.expect("a client task");
            }
            start.elapsed().as_secs_f64()
        }
    };
    let outcomes = std::mem::take(&mut *finished.lock().expect("not poisoned"));
    let mut classes: Vec<Class> = level
        .clients
        .iter()
        .flat_map(|c| c.requests.iter().map(|r| r.class))
        .collect();
    classes.sort();
    classes.dedup();
    let mut run = LevelRun::new(&outcomes, &classes, &tally, wall);
    if level.window.is_some() {
        // Give the server a moment to notice the disconnects before the next level.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    if let (Some(before), Some(after)) = (before, engine_stats::Scrape::of(http, &target.url).await)
    {
        let engine = engine_stats::EngineRun::between(&before, &after);
        run.prefix_hit_rate = engine.prefix_hit_rate;
        run.engine = Some(engine).filter(|e| e.steps > 0.0);
    }
    run
}

/// Peak resident memory of a process in MiB (`VmHWM` of `/proc/PID/status`).
fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}
