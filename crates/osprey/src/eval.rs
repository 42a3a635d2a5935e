//! `osprey eval run|compare|gate|replay|list`: offline evaluation from the command line, its
//! runs kept in the store (see docs/eval.md).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use osprey_eval::replay::{self, ReplaySource};
use osprey_eval::{Comparison, RunConfig, RunReport, Suite, Target, report, run_suite};
use osprey_store::{EvalRunRecord, Store};

/// `osprey eval`.
#[derive(Args, Debug)]
pub struct EvalArgs {
    /// The store runs are kept in (default: sqlite://$OSPREY_HOME/osprey.db).
    #[arg(long, env = "OSPREY_STORE", global = true)]
    pub store: Option<String>,
    #[command(subcommand)]
    pub command: EvalCommand,
}

/// Where reports go, besides the terminal.
#[derive(Args, Debug, Clone)]
pub struct Outputs {
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the report as an HTML page (with plots) here.
    #[arg(long)]
    pub html: Option<PathBuf>,
}

/// The route a run goes to.
#[derive(Args, Debug, Clone)]
pub struct TargetArgs {
    /// A target file (TOML: url, model, params, osprey, cost, judge; see docs/eval.md) or a
    /// server's base URL.
    #[arg(long)]
    pub target: String,
    /// The model (with a URL target: default the server's first; with a file: overrides it).
    #[arg(long)]
    pub model: Option<String>,
    /// Requests in flight at once.
    #[arg(long, short = 'c', default_value_t = 4)]
    pub concurrency: usize,
    /// Seconds a request may take.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
}

/// The eval commands.
#[derive(Subcommand, Debug)]
pub enum EvalCommand {
    /// Run a suite (JSONL or TOML cases with checkers) against a target; the run goes to the
    /// store and its id is printed.
    Run {
        /// The suite file.
        suite: PathBuf,
        #[command(flatten)]
        target: TargetArgs,
        #[command(flatten)]
        out: Outputs,
    },
    /// Compare two runs (ids in the store, or JSON reports) case by case, with bootstrap
    /// confidence intervals.
    Compare {
        /// The baseline run.
        baseline: String,
        /// The candidate run.
        candidate: String,
        /// Confidence level of the intervals.
        #[arg(long, default_value_t = 0.95)]
        level: f64,
        #[command(flatten)]
        out: Outputs,
    },
    /// Exit non-zero when the candidate is worse than the baseline by more than
    /// --max-regression, with confidence: for a rollout script or CI.
    Gate {
        /// The baseline run.
        baseline: String,
        /// The candidate run.
        candidate: String,
        /// The largest regression allowed: points of pass rate (0.05 = five), or the relative
        /// increase for latency_ms, completion_tokens and cost.
        #[arg(long)]
        max_regression: f64,
        /// The metric gated: `pass`, `check.KIND`, `latency_ms`, `completion_tokens`, `cost`.
        #[arg(long, default_value = "pass")]
        metric: String,
        /// Confidence level.
        #[arg(long, default_value_t = 0.95)]
        level: f64,
    },
    /// Replay sampled requests from a server's request log against a target and compare the
    /// answers, latency and tokens with the originals.
    Replay {
        /// The server whose request log is read.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        source: String,
        /// Its admin key.
        #[arg(long, env = "OSPREY_ADMIN_KEY", hide_env_values = true)]
        admin_key: Option<String>,
        /// How many requests to replay.
        #[arg(long, default_value_t = 50)]
        sample: usize,
        /// Only requests from this long ago on (`24h`, `30m`, `7d`) or since a Unix second.
        #[arg(long)]
        since: Option<String>,
        /// Only this tenant's requests.
        #[arg(long)]
        tenant: Option<String>,
        /// The sample's seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The embedding similarity an answer needs to count as the same.
        #[arg(long, default_value_t = 0.8)]
        min_similarity: f64,
        #[command(flatten)]
        target: TargetArgs,
        #[command(flatten)]
        out: Outputs,
    },
    /// List the runs in the store, newest first.
    List {
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
}

/// Runs an eval command.
pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    crate::serve::with_store(&args.store.clone(), async move |store| match args.command {
        EvalCommand::Run { suite, target, out } => {
            let suite = Suite::load(&suite)?;
            let (target, config) = resolve(&target).await?;
            let bar = bar(suite.cases.len(), "cases");
            let result = run_suite(&suite, &target, config, &|r| {
                bar.set_message(r.id.clone());
                bar.inc(1);
            })
            .await;
            bar.finish_and_clear();
            save(&store, &result).await?;
            print!("{}", report::run_table(&result));
            write_outputs(&out, &result, report::run_html(&result))?;
            println!("\nstored as {}", result.id);
            Ok(())
        }
        EvalCommand::Compare {
            baseline,
            candidate,
            level,
            out,
        } => {
            let cmp = Comparison::new(
                &load(&store, &baseline).await?,
                &load(&store, &candidate).await?,
                level,
            );
            print!("{}", report::compare_table(&cmp));
            write_outputs(&out, &cmp, report::compare_html(&cmp))
        }
        EvalCommand::Gate {
            baseline,
            candidate,
            max_regression,
            metric,
            level,
        } => {
            let cmp = Comparison::new(
                &load(&store, &baseline).await?,
                &load(&store, &candidate).await?,
                level,
            );
            match cmp.gate(&metric, max_regression) {
                Ok(said) => {
                    println!("no regression: {said}");
                    Ok(())
                }
                Err(said) => bail!("regression: {said}"),
            }
        }
        EvalCommand::Replay {
            source,
            admin_key,
            sample,
            since,
            tenant,
            seed,
            min_similarity,
            target,
            out,
        } => {
            let source = ReplaySource {
                url: source.trim_end_matches('/').to_owned(),
                admin_key,
                since: since.as_deref().map(parse_since).transpose()?,
                tenant,
                sample,
                seed,
                min_similarity,
            };
            let logged = replay::fetch(&source).await?;
            if logged.is_empty() {
                bail!(
                    "no request in {}'s log has its text kept (tenants keep it at their sampling rate; see docs/observability.md)",
                    source.url
                );
            }
            let (target, config) = resolve(&target).await?;
            let suite = replay::suite(&logged, min_similarity);
            let bar = bar(suite.cases.len(), "requests");
            let mut replayed = run_suite(&suite, &target, config, &|_| bar.inc(1)).await;
            bar.finish_and_clear();
            replayed.kind = "replay".into();
            let originals = replay::originals(&logged, &source, target.cost);
            save(&store, &originals).await?;
            save(&store, &replayed).await?;
            print!("{}", report::run_table(&replayed));
            let cmp = Comparison::new(&originals, &replayed, 0.95);
            println!("\nagainst the originals (latency, tokens):");
            print!("{}", report::compare_table(&cmp));
            write_outputs(&out, &replayed, report::run_html(&replayed))?;
            println!("\nstored as {} (originals: {})", replayed.id, originals.id);
            Ok(())
        }
        EvalCommand::List { limit } => {
            println!(
                "{:<48} {:<7} {:<14} {:<18} {:>9}  created",
                "id", "kind", "suite", "target", "pass"
            );
            for r in store.eval_runs(limit).await? {
                let s: serde_json::Value = serde_json::from_str(&r.summary).unwrap_or_default();
                let pass = s["pass_rate"]
                    .as_f64()
                    .map_or("-".into(), |p| format!("{:.1}%", p * 100.0));
                println!(
                    "{:<48} {:<7} {:<14} {:<18} {pass:>9}  {}",
                    r.id,
                    r.kind,
                    r.suite,
                    r.target,
                    crate::keys::iso(r.created_at)
                );
            }
            Ok(())
        }
    })
}

/// The target and run settings from the flags.
async fn resolve(args: &TargetArgs) -> anyhow::Result<(Target, RunConfig)> {
    let mut target = if args.target.starts_with("http://") || args.target.starts_with("https://") {
        let url = args.target.trim_end_matches('/');
        let model = match &args.model {
            Some(m) => m.clone(),
            None => osprey_eval::run::first_model(url).await?,
        };
        Target::new(url, &model)
    } else {
        Target::load(Path::new(&args.target))?
    };
    if let Some(m) = &args.model {
        target.model = m.clone();
    }
    let config = RunConfig {
        concurrency: args.concurrency,
        timeout: Duration::from_secs(args.timeout),
    };
    Ok((target, config))
}

/// A run by id from the store, or from a JSON report file.
async fn load(store: &Store, which: &str) -> anyhow::Result<RunReport> {
    let json = match store.eval_run(which).await? {
        Some(r) => r.report,
        None if Path::new(which).is_file() => {
            std::fs::read_to_string(which).with_context(|| format!("reading {which}"))?
        }
        None => bail!("no run `{which}` in the store (`osprey eval list`), and no such file"),
    };
    serde_json::from_str(&json).with_context(|| format!("run {which} is not a report"))
}

async fn save(store: &Store, r: &RunReport) -> anyhow::Result<()> {
    let record = EvalRunRecord {
        id: r.id.clone(),
        kind: r.kind.clone(),
        suite: r.suite.clone(),
        target: r.target.name.clone(),
        created_at: 0,
        summary: serde_json::to_string(&r.summary())?,
        report: serde_json::to_string(r)?,
    };
    store
        .save_eval_run(&record)
        .await
        .context("storing the run")
}

fn write_outputs(out: &Outputs, value: &impl serde::Serialize, html: String) -> anyhow::Result<()> {
    if let Some(path) = &out.json {
        std::fs::write(path, serde_json::to_string_pretty(value)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &out.html {
        std::fs::write(path, html).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn bar(n: usize, what: &str) -> ProgressBar {
    ProgressBar::new(n as u64).with_style(
        ProgressStyle::with_template(&format!(
            "{{bar:40}} {{pos}}/{{len}} {what} {{elapsed}} {{msg}}"
        ))
        .expect("a progress template"),
    )
}

/// `24h`, `30m`, `7d`, `90s` ago, or a Unix second, as a Unix second.
fn parse_since(s: &str) -> anyhow::Result<i64> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = n
        .parse()
        .with_context(|| format!("--since {s:?}: expected e.g. 24h, 30m, 7d or a Unix second"))?;
    Ok(match unit {
        "" => n,
        "s" => now - n,
        "m" => now - n * 60,
        "h" => now - n * 3600,
        "d" => now - n * 86_400,
        _ => bail!("--since {s:?}: the unit is s, m, h or d"),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn since_takes_durations_and_unix_seconds() {
        let now = super::parse_since("0s").unwrap();
        assert_eq!(super::parse_since("1700000000").unwrap(), 1_700_000_000);
        assert_eq!(now - super::parse_since("2h").unwrap(), 7200);
        assert!(super::parse_since("2w").is_err());
        assert!(super::parse_since("soon").is_err());
    }
}
