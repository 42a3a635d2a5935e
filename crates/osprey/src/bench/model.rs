//! `osprey bench model`: llama-bench's pp/tg tests on Osprey's forward pass.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use osprey_models::{BatchSeq, ForwardBatch, ForwardScratch, KvCache, LogitsWanted, Transformer};

/// Options of `osprey bench model`.
#[derive(Args, Debug)]
pub struct ModelBenchArgs {
    /// GGUF file or checkpoint directory (default: the default model, fetched if needed).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt tokens processed in one pass (llama-bench `-p`); 0 skips the test.
    #[arg(short = 'p', long, default_value_t = 512)]
    pub n_prompt: usize,
    /// Tokens decoded one at a time (llama-bench `-n`); 0 skips the test.
    #[arg(short = 'n', long, default_value_t = 128)]
    pub n_gen: usize,
    /// Tokens already in the context before each test (llama-bench `-d`): prefilled once,
    /// untimed, so the prompt and decode tests run at positions `depth..`.
    #[arg(short = 'd', long, default_value_t = 0)]
    pub depth: usize,
    /// Compute threads.
    #[arg(short = 't', long, default_value_t = 2)]
    pub threads: usize,
    /// Repetitions; the median is reported with the spread.
    #[arg(short = 'r', long, default_value_t = 3)]
    pub repetitions: usize,
    /// Print one JSON object per test instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Compute the logits of every prompt row, as verifying a draft does (llama-bench only
    /// computes the last row's).
    #[arg(long)]
    pub all_logits: bool,
}

pub fn run(args: ModelBenchArgs) -> anyhow::Result<()> {
    let path = match &args.model {
        Some(p) => p.clone(),
        None => crate::models::fetch_default()?,
    };
    let model = Transformer::open(&path).context("loading the model")?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()?;
    let config = model.config();
    let positions = args.depth + args.n_prompt.max(args.n_gen) + 1;
    let (mut kv, tables) = KvCache::for_sequence(config, positions);
    let mut scratch = ForwardScratch::default();
    // Token ids spread over the vocabulary, fixed so runs are comparable.
    let token = |i: usize| ((i * 7919 + 13) % config.vocab_size) as u32;
    let mut forward = |tokens: &[u32], start: usize| {
        let seqs = [BatchSeq {
            n_tokens: tokens.len(),
            start_pos: start,
            block_tables: &tables,
            logits: match args.all_logits {
                true => LogitsWanted::All,
                false => LogitsWanted::Last,
            },
        }];
        pool.install(|| {
            model.forward(
                &ForwardBatch {
                    tokens,
                    seqs: &seqs,
                },
                &mut kv,
                &mut scratch,
            );
        });
    };
    // Warm-up: one small pass touches the weights and sizes the buffers.
    forward(&[token(0), token(1)], 0);
    if args.depth > 0 {
        let context: Vec<u32> = (0..args.depth).map(token).collect();
        forward(&context, 0);
    }
    let depth = args.depth;
    let suffix = if depth > 0 {
        format!(" @ d{depth}")
    } else {
        String::new()
    };

    let mut results = Vec::new();
    if args.n_prompt > 0 {
        let prompt: Vec<u32> = (0..args.n_prompt).map(token).collect();
        let rates: Vec<f64> = (0..args.repetitions)
            .map(|_| {
                let t = Instant::now();
                forward(&prompt, depth);
                args.n_prompt as f64 / t.elapsed().as_secs_f64()
            })
            .collect();
        results.push((format!("pp{}{suffix}", args.n_prompt), rates));
    }
    if args.n_gen > 0 {
        let rates: Vec<f64> = (0..args.repetitions)
            .map(|_| {
                let t = Instant::now();
                for i in 0..args.n_gen {
                    forward(&[token(depth + i)], depth + i);
                }
                args.n_gen as f64 / t.elapsed().as_secs_f64()
            })
            .collect();
        results.push((format!("tg{}{suffix}", args.n_gen), rates));
    }

    let name = path
        .file_name()
        .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
    if !args.json {
        println!("| model | threads | test | t/s (median) | min | max |");
        println!("|---|---:|---|---:|---:|---:|");
    }
    for (test, mut rates) in results {
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        let (min, max) = (rates[0], rates[rates.len() - 1]);
        if args.json {
            println!(
                "{}",
                serde_json::json!({"model": name, "threads": args.threads, "test": test, "median": median, "min": min, "max": max, "runs": rates})
            );
        } else {
            println!(
                "| {name} | {} | {test} | {median:.2} | {min:.2} | {max:.2} |",
                args.threads
            );
        }
    }
    Ok(())
}
