//! `osprey bench kv`: the KV tiers (docs/kv-tiers.md), on the default model, in process.
//!
//! - `quality`: perplexity on the golden and a held-out text when every block of the past is
//!   stored and read back through each codec (f16: lossless; int8), and the bytes per token of
//!   each tier.
//! - `d` (workload D): a 2,000-token context, then enough other contexts to push it out of a
//!   small pool, then the same context again with a new question: its TTFT when it is
//!   recomputed, and when it comes back from the warm, cold and Redis tiers; configurations
//!   interleaved, medians of the repetitions.
//! - `e` (workload E): a fixed pool, and 4 → 64 clients each holding a conversation over its own
//!   2,000-token context, turn after turn: output tokens/s and TTFT p99 against clients, tiers
//!   off and on, as a table and a chart.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use osprey_core::SamplingParams;
use osprey_engine::{
    Codec, Engine, EngineConfig, GenerateRequest, SchedulerConfig, SharedConfig, Tier, TierConfig,
};
use osprey_models::eval::perplexity_blockwise;
use osprey_models::{BLOCK_SIZE, Transformer};
use plotters::prelude::*;

use super::serve::workload::PromptMaker;

/// Which part to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Part {
    /// Perplexity through each codec, and bytes per token per tier.
    Quality,
    /// Workload D: TTFT of a returning 2,000-token context from each tier.
    D,
    /// Workload E: throughput and TTFT against clients at a fixed pool, tiers off and on.
    E,
}

/// Options of `osprey bench kv`.
#[derive(Args, Debug)]
pub struct KvBenchArgs {
    /// What to measure (repeat for several).
    #[arg(long, value_enum, default_values = ["quality", "d", "e"])]
    pub part: Vec<Part>,
    /// Repetitions; medians are reported.
    #[arg(long, short = 'r', default_value_t = 3)]
    pub repetitions: usize,
    /// Compute threads.
    #[arg(long, short = 't', default_value_t = 2)]
    pub threads: usize,
    /// Tokens of each context.
    #[arg(long, default_value_t = 2000)]
    pub context: usize,
    /// Redis for the shared tier (default: `OSPREY_TEST_REDIS_URL`; without one, D skips it).
    #[arg(long, env = "OSPREY_TEST_REDIS_URL")]
    pub redis: Option<String>,
    /// E: clients at each level.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,32,64")]
    pub clients: Vec<usize>,
    /// E: seconds each level measures.
    #[arg(long, default_value_t = 45.0)]
    pub window: f64,
    /// E: the hot pool, e.g. `384MiB` (about 8 contexts of 2,000 tokens).
    #[arg(long, value_parser = crate::cli::parse_bytes, default_value = "384MiB")]
    pub pool: usize,
    /// E: the warm tier of the tiered engine.
    #[arg(long, value_parser = crate::cli::parse_bytes, default_value = "4GiB")]
    pub warm: usize,
    /// E: draw output tokens/s and TTFT p99 against clients here (SVG).
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// Seed of the generated contexts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub fn run(args: KvBenchArgs) -> anyhow::Result<()> {
    let model = crate::models::fetch_default()?;
    for part in &args.part {
        match part {
            Part::Quality => quality(&args, &model)?,
            Part::D => workload_d(&args, &model)?,
            Part::E => workload_e(&args, &model)?,
        }
    }
    Ok(())
}

fn quality(args: &KvBenchArgs, model_path: &std::path::Path) -> anyhow::Result<()> {
    let model = Transformer::open(model_path)?;
    let prompter = osprey_engine::Prompter::load(model_path)?;
    let texts = [
        ("golden", super::k3::golden_ppl_ids()?),
        (
            "held-out",
            prompter.tokenizer().encode(super::k3::HELD_OUT, false),
        ),
    ];
    let c = model.config();
    let len = 2 * c.n_layers * c.n_kv_heads * BLOCK_SIZE * c.head_dim;
    let group = BLOCK_SIZE * c.head_dim;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()?;
    println!("\n### Attending over stored blocks: perplexity, SmolLM2-135M Q4_1\n");
    println!("| codec | bytes/token | vs f16 | PPL golden | PPL held-out |");
    println!("|---|---:|---:|---:|---:|");
    for codec in [Codec::F16, Codec::Int8] {
        let mut ppl = Vec::new();
        for (_, ids) in &texts {
            let mut roundtrip = |kv: &mut osprey_models::KvCache, block: u32| {
                let mut data = Vec::with_capacity(len);
                kv.read_block(block, &mut data);
                let back = codec.decode(&codec.encode(&data, group), len, group);
                kv.write_block(block, &back.expect("the codec reads what it wrote"));
            };
            ppl.push(
                pool.install(|| perplexity_blockwise(&model, ids, &mut roundtrip))
                    .1,
            );
        }
        let bytes = codec.encoded_len(len, group) as f64 / BLOCK_SIZE as f64;
        let f16 = Codec::F16.encoded_len(len, group) as f64 / BLOCK_SIZE as f64;
        println!(
            "| {} | {bytes:.0} | {:.3} | {:.3} | {:.3} |",
            codec.as_str(),
            bytes / f16,
            ppl[0],
            ppl[1]
        );
    }
    Ok(())
}

/// Contexts of `n` tokens for `count` users, and the questions they ask.
struct Conversations {
    contexts: Vec<String>,
}

impl Conversations {
    fn new(model: &std::path::Path, count: usize, n: usize, seed: u64) -> anyhow::Result<Self> {
        let prompter = osprey_engine::Prompter::load(model)?;
        let mut maker = PromptMaker::new(prompter.tokenizer(), seed);
        Ok(Self {
            contexts: (0..count).map(|_| maker.text(n)).collect(),
        })
    }

    /// Turn `turn` of user `user`: their context, then a question of its own.
    fn prompt(&self, engine: &Engine, user: usize, turn: usize) -> Vec<u32> {
        let text = format!(
            "{}\n\nQuestion {turn}: what does the passage above say about item {}?",
            self.contexts[user],
            turn * 7 + user
        );
        engine.tokenizer().encode(&text, true)
    }
}

/// Sends `prompt` and waits for its end: (seconds to the first token, tokens generated).
async fn timed(
    engine: &Engine,
    prompt: Vec<u32>,
    max_tokens: usize,
) -> anyhow::Result<(f64, usize)> {
    timed_noting(engine, prompt, max_tokens, &AtomicU64::new(0)).await
}

/// [`timed`], also writing the time to the first token into `first` (as `f64` bits) when it
/// comes, for a caller that may stop waiting before the end.
async fn timed_noting(
    engine: &Engine,
    prompt: Vec<u32>,
    max_tokens: usize,
    first: &AtomicU64,
) -> anyhow::Result<(f64, usize)> {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let start = Instant::now();
    let mut g = engine.generate(engine.validate(GenerateRequest::new(prompt, params))?)?;
    let (mut ttft, mut n) = (None, 0);
    while let Some(d) = g.next().await {
        if d?.token.is_some() {
            let t = *ttft.get_or_insert(start.elapsed().as_secs_f64());
            first.store(t.to_bits(), Ordering::Relaxed);
            n += 1;
        }
    }
    Ok((ttft.unwrap_or(f64::NAN), n))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?)
}

fn engine_with(
    model: &std::path::Path,
    threads: usize,
    pool: usize,
    tiers: TierConfig,
) -> anyhow::Result<Engine> {
    let config = EngineConfig {
        kv_cache_bytes: pool,
        threads,
        tiers,
        scheduler: SchedulerConfig::default(),
        ..EngineConfig::default()
    };
    Engine::load(model, config).context("loading the model")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn workload_d(args: &KvBenchArgs, model: &std::path::Path) -> anyhow::Result<()> {
    let dir = osprey_models::osprey_home().join("bench-kv");
    let _ = std::fs::remove_dir_all(dir.join("cold"));
    let conv = Conversations::new(model, 4, args.context, args.seed)?;
    // A pool for about two and a half contexts: the three others push the first out.
    let per_token = {
        let probe = engine_with(model, args.threads, 64 << 20, TierConfig::default())?;
        probe.info().kv_bytes_per_token
    };
    let pool = per_token * (args.context + 64) * 5 / 2;
    let mut configs: Vec<(&str, TierConfig)> = vec![
        ("recompute", TierConfig::default()),
        (
            "warm (int8)",
            TierConfig {
                warm_bytes: 1 << 30,
                ..TierConfig::default()
            },
        ),
        (
            "warm (f16)",
            TierConfig {
                warm_bytes: 1 << 30,
                codec: Codec::F16,
                ..TierConfig::default()
            },
        ),
        (
            "cold (int8)",
            TierConfig {
                cold: Some((dir.join("cold"), 4 << 30)),
                ..TierConfig::default()
            },
        ),
    ];
    if let Some(url) = &args.redis {
        let shared = SharedConfig {
            url: url.clone(),
            ttl: Duration::from_secs(600),
            max_bytes: 1 << 30,
        };
        configs.push((
            "redis (int8)",
            TierConfig {
                shared: Some(shared),
                ..TierConfig::default()
            },
        ));
    } else {
        eprintln!("no Redis (--redis or OSPREY_TEST_REDIS_URL): the shared tier is not measured");
    }
    let rt = runtime()?;
    let mut ttft: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut tiers_hit: Vec<u64> = vec![0; configs.len()];
    for rep in 0..args.repetitions {
        for (i, (name, tiers)) in configs.iter().enumerate() {
            eprintln!("D: repetition {} {name}", rep + 1);
            let e = engine_with(model, args.threads, pool, tiers.clone())?;
            rt.block_on(async {
                timed(&e, conv.prompt(&e, 0, 2 * rep), 8).await?;
                for user in 1..conv.contexts.len() {
                    timed(&e, conv.prompt(&e, user, 0), 8).await?;
                }
                if name.starts_with("redis") {
                    // Another worker of the same model, with nothing of its own.
                    drop(e);
                    let other = engine_with(model, args.threads, pool, tiers.clone())?;
                    let (t, _) = timed(&other, conv.prompt(&other, 0, 2 * rep + 1), 8).await?;
                    ttft[i].push(t);
                    tiers_hit[i] += other.stats().tier_hits(Tier::Shared);
                    return anyhow::Ok(());
                }
                let (t, _) = timed(&e, conv.prompt(&e, 0, 2 * rep + 1), 8).await?;
                ttft[i].push(t);
                tiers_hit[i] += [Tier::Warm, Tier::Cold]
                    .iter()
                    .map(|&t| e.stats().tier_hits(t))
                    .sum::<u64>();
                anyhow::Ok(())
            })?;
        }
    }
    println!(
        "\n### Workload D: a {}-token context returns after being pushed out of the pool (medians of {})\n",
        args.context, args.repetitions
    );
    println!("| prefix from | TTFT | speed-up vs recompute | blocks from the tier (all reps) |");
    println!("|---|---:|---:|---:|");
    let base = median(ttft[0].clone());
    for (i, (name, _)) in configs.iter().enumerate() {
        let t = median(ttft[i].clone());
        println!(
            "| {name} | {:.0} ms | {:.2}× | {} |",
            t * 1e3,
            base / t,
            tiers_hit[i]
        );
    }
    Ok(())
}

/// One level of E on one engine: (output tokens/s, TTFT p99 s, turns completed).
fn e_level(
    rt: &tokio::runtime::Runtime,
    e: &Engine,
    conv: &Arc<Conversations>,
    clients: usize,
    window: Duration,
) -> anyhow::Result<(f64, f64, usize)> {
    rt.block_on(async {
        let deadline = Instant::now() + window;
        let tasks: Vec<_> = (0..clients)
            .map(|user| {
                let (e, conv) = (e.clone(), conv.clone());
                tokio::spawn(async move {
                    let mut out = Vec::new();
                    for turn in 1.. {
                        let prompt = conv.prompt(&e, user, turn);
                        let (first, start) = (AtomicU64::new(0), Instant::now());
                        let turn = timed_noting(&e, prompt, 32, &first);
                        match tokio::time::timeout_at(deadline.into(), turn).await {
                            Ok(Ok(x)) => out.push(x),
                            _ => {
                                // Cut by the window: its TTFT counts, or while still waiting its
                                // wait so far (a lower bound); its tokens do not.
                                let t = match first.load(Ordering::Relaxed) {
                                    0 => start.elapsed().as_secs_f64(),
                                    bits => f64::from_bits(bits),
                                };
                                out.push((t, 0));
                                break;
                            }
                        }
                    }
                    out
                })
            })
            .collect();
        let (mut ttfts, mut tokens, mut turns) = (Vec::new(), 0, 0);
        for t in tasks {
            for (ttft, n) in t.await? {
                ttfts.push(ttft);
                tokens += n;
                turns += usize::from(n > 0);
            }
        }
        let p99 = {
            ttfts.sort_by(f64::total_cmp);
            ttfts
                .get(((ttfts.len() as f64 * 0.99).ceil() as usize).clamp(1, ttfts.len().max(1)) - 1)
                .copied()
                .unwrap_or(f64::NAN)
        };
        Ok((tokens as f64 / window.as_secs_f64(), p99, turns))
    })
}

fn workload_e(args: &KvBenchArgs, model: &std::path::Path) -> anyhow::Result<()> {
    let max_clients = args.clients.iter().copied().max().unwrap_or(4);
    let conv = Arc::new(Conversations::new(
        model,
        max_clients,
        args.context,
        args.seed + 1,
    )?);
    let configs = [
        ("tiers off", TierConfig::default()),
        (
            "warm tier",
            TierConfig {
                warm_bytes: args.warm,
                ..TierConfig::default()
            },
        ),
    ];
    let engines = configs
        .iter()
        .map(|(_, t)| engine_with(model, args.threads, args.pool, t.clone()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let rt = runtime()?;
    let window = Duration::from_secs_f64(args.window);
    // results[config][level] = runs
    let mut results = vec![vec![Vec::new(); args.clients.len()]; configs.len()];
    for rep in 0..args.repetitions {
        for (l, &clients) in args.clients.iter().enumerate() {
            for (c, e) in engines.iter().enumerate() {
                eprintln!(
                    "E: repetition {} clients {clients} {}",
                    rep + 1,
                    configs[c].0
                );
                // Each conversation's opening turn, unmeasured: the contexts have been seen.
                if rep == 0 {
                    let first = if l == 0 { 0 } else { args.clients[l - 1] };
                    rt.block_on(async {
                        let opening: Vec<_> = (first..clients)
                            .map(|u| {
                                let (e, conv) = (e.clone(), conv.clone());
                                tokio::spawn(
                                    async move { timed(&e, conv.prompt(&e, u, 0), 1).await },
                                )
                            })
                            .collect();
                        for o in opening {
                            o.await??;
                        }
                        anyhow::Ok(())
                    })?;
                }
                results[c][l].push(e_level(&rt, e, &conv, clients, window)?);
            }
        }
    }
    println!(
        "\n### Workload E: {}-token contexts, a {} MiB pool, {} s windows (medians of {})\n",
        args.context,
        args.pool >> 20,
        args.window,
        args.repetitions
    );
    println!(
        "| clients | tiers off tok/s | warm tier tok/s | ratio | tiers off TTFT p99 | warm tier TTFT p99 | turns off / on |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut series: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); configs.len()];
    for (l, &clients) in args.clients.iter().enumerate() {
        let m = |c: usize, f: fn(&(f64, f64, usize)) -> f64| {
            median(results[c][l].iter().map(f).collect())
        };
        let (off, on) = (m(0, |r| r.0), m(1, |r| r.0));
        let (p_off, p_on) = (m(0, |r| r.1), m(1, |r| r.1));
        let (t_off, t_on) = (m(0, |r| r.2 as f64), m(1, |r| r.2 as f64));
        println!(
            "| {clients} | {off:.1} | {on:.1} | {:.2}× | {p_off:.2} s | {p_on:.2} s | {t_off:.0} / {t_on:.0} |",
            on / off
        );
        series[0].push((clients as f64, off, p_off));
        series[1].push((clients as f64, on, p_on));
    }
    if let Some(path) = &args.chart {
        chart(path, &configs.map(|c| c.0), &series)?;
    }
    Ok(())
}

/// Output tokens/s and TTFT p99 against clients, one line per configuration.
fn chart(
    path: &std::path::Path,
    names: &[&str],
    series: &[Vec<(f64, f64, f64)>],
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (960, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(480);
    let max_x = series.iter().flatten().map(|p| p.0).fold(1.0, f64::max);
    let colors = [RED, BLUE];
    for (area, title, pick) in [
        (
            &left,
            "output tokens/s",
            (|p: &(f64, f64, f64)| p.1) as fn(&(f64, f64, f64)) -> f64,
        ),
        (&right, "TTFT p99 (s)", |p: &(f64, f64, f64)| p.2),
    ] {
        let max_y = series
            .iter()
            .flatten()
            .map(pick)
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max)
            * 1.1;
        let mut c = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(32)
            .y_label_area_size(48)
            .build_cartesian_2d((2f64..max_x * 1.2).log_scale(), 0f64..max_y.max(1e-3))?;
        c.configure_mesh().x_desc("concurrent clients").draw()?;
        for (s, (name, color)) in series.iter().zip(names.iter().zip(colors)) {
            let points: Vec<(f64, f64)> = s.iter().map(|p| (p.0, pick(p))).collect();
            c.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(*name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
            c.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
        c.configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
