//! `osprey bench k3 --part kda`: the KDA scheduler against FCFS (and the `priority` policy) on
//! the MoEfied model, in one run.
//!
//! 1. **The skew.** The workload's narrow topic is checked to favour the same experts: the
//!    model's routing of topic prompts and of free prompts is measured in process (imbalance of
//!    a prompt's own tokens; similarity of two prompts' expert histograms).
//! 2. **The comparison.** One `osprey serve` per policy is started on the checkpoint (same
//!    threads, KV memory and limits) and `osprey bench serve -w f --hot-topic H` runs against
//!    them interleaved, run by run: interactive TTFT/TPOT percentiles, tokens/s, and from each
//!    server's `/metrics` the expert-load imbalance of its steps, its deferrals and the time
//!    its scheduler took per step.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use osprey_engine::Prompter;
use osprey_engine::kda::{ExpertLayout, RoutedLoad};
use osprey_models::{BatchSeq, ForwardBatch, ForwardScratch, KvCache, LogitsWanted, Transformer};

use crate::bench::serve::ServeBenchArgs;
use crate::bench::serve::workload::{PromptMaker, Topic, WorkloadId};

/// Options of the KDA comparison.
#[derive(Args, Debug)]
pub struct KdaArgs {
    /// Scheduling policies, one server each; the first is compared with each other one.
    /// `kda@C` runs `kda` with an expert capacity of C (default `--expert-capacity`).
    #[arg(long, value_delimiter = ',', default_value = "kda,fcfs,priority")]
    pub policies: Vec<String>,
    /// Seconds each run of the comparison measures.
    #[arg(long, default_value_t = 60.0)]
    pub kda_duration: f64,
    /// Interactive clients of workload F (short prompts, 32 tokens, latency measured).
    #[arg(long, default_value_t = 8)]
    pub kda_interactive: usize,
    /// Batch clients of workload F (600–900-token prompts, 128 tokens, back to back).
    #[arg(long, default_value_t = 24)]
    pub kda_batch: usize,
    /// Share of requests written in the hot topic (code); the rest are prose, figures or lists.
    #[arg(long, default_value_t = 0.75)]
    pub hot_topic: f64,
    /// `--expert-capacity` of the `kda` server.
    #[arg(long, default_value_t = 2.0)]
    pub expert_capacity: f32,
    /// Write the comparison's full report as JSON here.
    #[arg(long)]
    pub kda_json: Option<PathBuf>,
}

pub fn run(args: &super::K3BenchArgs, dir: &Path, model: &Path) -> anyhow::Result<()> {
    let kda = &args.kda;
    let gguf = crate::models::fetch_default()?;
    skew(model, &gguf, args.threads)?;

    let logs = dir.join("kda-logs");
    std::fs::create_dir_all(&logs)?;
    let mut servers = Vec::new();
    for policy in &kda.policies {
        servers.push(Server::start(model, policy, args, &logs)?);
    }
    for s in &servers {
        s.wait_ready(Duration::from_secs(300))?;
    }
    println!(
        "\n### KDA against other policies: workload F, {} interactive + {} batch clients, \
         {:.0}% of requests in code and the rest in prose, figures or lists, {} s runs × {}\n",
        kda.kda_interactive,
        kda.kda_batch,
        kda.hot_topic * 100.0,
        kda.kda_duration,
        args.repetitions
    );
    let serve = ServeBenchArgs {
        url: servers[0].url.clone(),
        label: servers[0].policy.clone(),
        compare: servers[1..].iter().map(|s| s.url.clone()).collect(),
        compare_label: servers[1..].iter().map(|s| s.policy.clone()).collect(),
        workload: WorkloadId::F,
        interactive_clients: kda.kda_interactive,
        batch_clients: kda.kda_batch,
        duration: kda.kda_duration,
        hot_topic: kda.hot_topic,
        runs: args.repetitions,
        pid: Some(servers[0].child.id()),
        compare_pid: servers[1..].iter().map(|s| s.child.id()).collect(),
        json: kda.kda_json.clone(),
        ..ServeBenchArgs::defaults()
    };
    crate::bench::serve::run(serve)
}

/// How the workload's kinds of text are routed: each prompt's own imbalance, how alike the
/// expert histograms of two prompts of the same kind are, and of different kinds.
fn skew(model_path: &Path, gguf: &Path, threads: usize) -> anyhow::Result<()> {
    let model = Transformer::open(model_path)?;
    let layout = ExpertLayout::from_layers(&model.moe_layout())
        .context("the KDA benchmark needs a model with LatentMoE layers")?;
    let prompter = Prompter::load(gguf)?;
    let tokenizer = prompter.tokenizer();
    let mut maker = PromptMaker::new(tokenizer, 11);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let per_topic = 3;
    let histograms: Vec<Vec<(Vec<f32>, f32)>> = Topic::ALL
        .iter()
        .map(|&topic| {
            (0..per_topic)
                .map(|_| {
                    let ids = tokenizer.encode(&maker.prompt_on(256, topic).0, false);
                    pool.install(|| routing_histogram(&model, &layout, &ids))
                })
                .collect()
        })
        .collect();
    println!(
        "\n### The topics' routing: {} experts, top-{}, {} MoE layers ({per_topic} prompts of 256 \
         tokens per topic)\n",
        layout.experts, layout.top_k, layout.layers
    );
    println!(
        "| topic | imbalance of a prompt's tokens | similarity within the topic | similarity to other topics |"
    );
    println!("|---|---:|---:|---:|");
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len().max(1) as f32;
    for (t, topic) in Topic::ALL.iter().enumerate() {
        let own = &histograms[t];
        let imbalance = mean(&own.iter().map(|h| h.1).collect::<Vec<_>>());
        let (mut within, mut across) = (Vec::new(), Vec::new());
        for (i, a) in own.iter().enumerate() {
            within.extend(own[i + 1..].iter().map(|b| cosine(&a.0, &b.0)));
            for (_, other) in histograms.iter().enumerate().filter(|(u, _)| *u != t) {
                across.extend(other.iter().map(|b| cosine(&a.0, &b.0)));
            }
        }
        println!(
            "| {} | {imbalance:.3} | {:.3} | {:.3} |",
            topic.as_str(),
            mean(&within),
            mean(&across)
        );
    }
    Ok(())
}

/// The share of `ids`' routed tokens on each expert slot, and their imbalance.
fn routing_histogram(model: &Transformer, layout: &ExpertLayout, ids: &[u32]) -> (Vec<f32>, f32) {
    let (mut kv, tables) = KvCache::for_sequence(model.config(), ids.len());
    let mut scratch = ForwardScratch::default();
    let seqs = [BatchSeq {
        n_tokens: ids.len(),
        start_pos: 0,
        block_tables: &tables,
        logits: LogitsWanted::Last,
    }];
    let batch = ForwardBatch {
        tokens: ids,
        seqs: &seqs,
    };
    model.forward(&batch, &mut kv, &mut scratch);
    let mut slots = Vec::new();
    scratch.routed_slots(0..ids.len(), &mut slots);
    let mut histogram = vec![0f32; layout.slots()];
    for &s in &slots {
        histogram[s as usize] += 1.0 / ids.len() as f32;
    }
    let imbalance = RoutedLoad::measure(layout, &slots).map_or(1.0, |r| r.imbalance);
    (histogram, imbalance)
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b)).max(f32::MIN_POSITIVE)
}

/// An `osprey serve` of this binary, with one scheduling policy; killed when dropped.
struct Server {
    policy: String,
    url: String,
    child: Child,
}

impl Server {
    fn start(
        model: &Path,
        policy: &str,
        args: &super::K3BenchArgs,
        logs: &Path,
    ) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let (name, capacity) = match policy.split_once('@') {
            Some((name, c)) => (name, c.to_owned()),
            None => (policy, args.kda.expert_capacity.to_string()),
        };
        let log = std::fs::File::create(logs.join(format!("{policy}.log")))?;
        let store = format!("sqlite://{}", logs.join(format!("{policy}.db")).display());
        let child = Command::new(std::env::current_exe()?)
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--port", &port.to_string(), "--store", &store])
            .args(["--scheduling-policy", name, "--served-model-name", "k3"])
            .args(["--threads", &args.threads.to_string()])
            .args(["--expert-capacity", &capacity])
            .args(["--kv-cache-memory", "1GiB", "--max-waiting", "512"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting osprey serve")?;
        Ok(Self {
            policy: policy.to_owned(),
            url: format!("http://127.0.0.1:{port}"),
            child,
        })
    }

    fn wait_ready(&self, limit: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let client = reqwest::Client::new();
        while start.elapsed() < limit {
            let ready = runtime.block_on(client.get(format!("{}/ready", self.url)).send());
            if ready.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        anyhow::bail!(
            "the {} server at {} was not ready within {limit:?}",
            self.policy,
            self.url
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
