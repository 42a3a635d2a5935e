//! `osprey bench structured`: what structured output costs and whether it always holds, on a
//! server of its own (the default model, in process) driven over HTTP like any client.
//!
//! 1. **Overhead**: the same prompts streamed free and under a JSON schema, interleaved
//!    (free, constrained, free, …) for `--reps` rounds at each concurrency: time per output
//!    token and output tokens/s, medians, and their ratio.
//! 2. **Mask cost**: each constrained answer's tokens fed again through a fresh grammar,
//!    timing the mask of every step alone (the engine computes it beside the forward pass).
//! 3. **Validity**: every case of `--schemas` (JSONL `{name, prompt, schema, tool}`, made by
//!    `bench/structured/gen-schemas.py`), as `response_format` or (for `tool` cases) as a
//!    named function's parameters: does the answer parse and validate against its schema?

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use futures_util::StreamExt;
use osprey_core::Grammar;
use osprey_engine::Engine;
use serde_json::{Value, json};

/// `osprey bench structured`.
#[derive(Args, Debug)]
pub struct StructuredBenchArgs {
    /// Schema cases (JSONL), repeatable.
    #[arg(long, default_values = ["bench/structured/schemas-dev.jsonl", "bench/structured/schemas-heldout.jsonl"])]
    schemas: Vec<PathBuf>,
    /// Rounds of the overhead measurement.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Prompts per round.
    #[arg(long, default_value_t = 12)]
    prompts: usize,
    /// Concurrent streams of the overhead measurement (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    concurrency: Vec<usize>,
    /// Concurrent requests of the validity run.
    #[arg(long, default_value_t = 4)]
    validity_concurrency: usize,
    /// Most tokens of an answer.
    #[arg(long, default_value_t = 400)]
    max_tokens: u32,
    /// Sampling temperature of the validity run (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Skip the overhead measurement.
    #[arg(long)]
    validity_only: bool,
}

const MODEL: &str = "smollm2-135m-instruct";

struct Case {
    name: String,
    prompt: String,
    schema: Value,
    tool: bool,
}

fn cases(paths: &[PathBuf]) -> anyhow::Result<Vec<Case>> {
    let mut out = Vec::new();
    for path in paths {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(line)?;
            out.push(Case {
                name: v["name"].as_str().unwrap_or_default().to_owned(),
                prompt: v["prompt"].as_str().unwrap_or_default().to_owned(),
                schema: v["schema"].clone(),
                tool: v["tool"].as_bool().unwrap_or(false),
            });
        }
    }
    Ok(out)
}

pub fn run(args: StructuredBenchArgs) -> anyhow::Result<()> {
    let cases = cases(&args.schemas)?;
    anyhow::ensure!(!cases.is_empty(), "no schema cases");
    let model = osprey_models::fetch(
        &osprey_models::DEFAULT_MODEL,
        &osprey_models::osprey_home(),
        &mut |_| {},
    )?;
    let engine = Engine::load(&model, osprey_engine::EngineConfig::default())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let state = osprey_gateway::Services::new(osprey_gateway::Wiring {
            response_cache: None,
            ..osprey_gateway::Wiring::serving(MODEL)
        });
        state.set_engine(engine.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        tokio::spawn(async move {
            osprey_gateway::serve(listener, state, &Default::default(), std::future::pending())
                .await
        });
        let client = reqwest::Client::new();
        if !args.validity_only {
            overhead(&client, &base, &engine, &cases, &args).await?;
        }
        validity(&client, &base, &cases, &args).await
    })
}

/// One streamed request's time per output token after the first, its tokens, and its text.
async fn stream(
    client: &reqwest::Client,
    base: &str,
    body: &Value,
) -> anyhow::Result<(f64, u64, String)> {
    let start = Instant::now();
    let resp = client
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .send()
        .await?;
    let mut chunks = resp.bytes_stream();
    let (mut first, mut last, mut tokens, mut text) = (None, start, 0u64, String::new());
    let mut buf = String::new();
    while let Some(chunk) = chunks.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(data)?;
            if let Some(t) = v["choices"][0]["delta"]["content"]
                .as_str()
                .filter(|t| !t.is_empty())
            {
                first.get_or_insert_with(Instant::now);
                last = Instant::now();
                text.push_str(t);
            }
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                tokens = n;
            }
        }
    }
    let first = first.unwrap_or(last);
    let tpot = (last - first).as_secs_f64() / (tokens.max(2) - 1) as f64;
    Ok((tpot, tokens, text))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

async fn overhead(
    client: &reqwest::Client,
    base: &str,
    engine: &Engine,
    cases: &[Case],
    args: &StructuredBenchArgs,
) -> anyhow::Result<()> {
    let picked: Vec<&Case> = cases
        .iter()
        .filter(|c| !c.tool)
        .take(args.prompts)
        .collect();
    let body = |c: &Case, constrained: bool| {
        let mut b = json!({"model": MODEL, "temperature": 0, "max_tokens": 128, "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": c.prompt}]});
        if constrained {
            b["response_format"] =
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": c.schema}});
        } else {
            b["ignore_eos"] = true.into();
        }
        b
    };
    println!(
        "Overhead: {} prompts x {} rounds, free and constrained interleaved",
        picked.len(),
        args.reps
    );
    println!(
        "{:>11} {:>14} {:>14} {:>14} {:>14} {:>8}",
        "concurrency", "free ms/tok", "json ms/tok", "free tok/s", "json tok/s", "ratio"
    );
    let mut answers = Vec::new();
    for &n in &args.concurrency {
        let (mut free, mut constrained) = (Vec::new(), Vec::new());
        let (mut free_rate, mut json_rate) = (Vec::new(), Vec::new());
        for _ in 0..args.reps {
            for mode in [false, true] {
                let start = Instant::now();
                let runs = futures_util::stream::iter(picked.iter().map(|c| {
                    let b = body(c, mode);
                    async move { stream(client, base, &b).await }
                }))
                .buffer_unordered(n)
                .collect::<Vec<_>>()
                .await;
                let secs = start.elapsed().as_secs_f64();
                let mut tokens = 0;
                for r in runs {
                    let (tpot, t, text) = r?;
                    tokens += t;
                    match mode {
                        false => free.push(tpot),
                        true => {
                            constrained.push(tpot);
                            answers.push(text);
                        }
                    }
                }
                match mode {
                    false => free_rate.push(tokens as f64 / secs),
                    true => json_rate.push(tokens as f64 / secs),
                }
            }
        }
        let (f, c) = (median(free) * 1e3, median(constrained) * 1e3);
        let (fr, cr) = (median(free_rate), median(json_rate));
        println!(
            "{n:>11} {f:>14.2} {c:>14.2} {fr:>14.1} {cr:>14.1} {:>8.3}",
            cr / fr
        );
    }

    // The masks alone, replayed over the constrained answers' tokens.
    let grammars = engine.grammars()?;
    let mut times = Vec::new();
    for (c, text) in picked.iter().cycle().zip(&answers) {
        let grammar = Grammar::JsonSchema {
            schema: c.schema.clone(),
            strict: false,
        };
        let mut constraint = grammars.compile(&grammar)?;
        for id in engine.tokenizer().encode(text, false) {
            let t = Instant::now();
            constraint.allowed()?;
            times.push(t.elapsed().as_secs_f64() * 1e6);
            if constraint.advance(id).is_err() {
                break;
            }
        }
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| {
        times
            .get(((times.len() as f64 * q) as usize).min(times.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    println!(
        "Mask per token, {} tokens: p50 {:.0} us, p90 {:.0} us, p99 {:.0} us (computed beside the forward pass)",
        times.len(),
        at(0.5),
        at(0.9),
        at(0.99)
    );
    Ok(())
}

/// The outcome of one validity case.
enum Verdict {
    Valid,
    Invalid(String),
    Cut,
    Failed(String),
}

async fn validity(
    client: &reqwest::Client,
    base: &str,
    cases: &[Case],
    args: &StructuredBenchArgs,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let bar = indicatif::ProgressBar::new(cases.len() as u64);
    let verdicts = futures_util::stream::iter(cases.iter().map(|c| {
        let (bar, done) = (bar.clone(), done.clone());
        async move {
            let v = check(client, base, c, args).await;
            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            bar.inc(1);
            (c, v)
        }
    }))
    .buffer_unordered(args.validity_concurrency.max(1))
    .collect::<Vec<_>>()
    .await;
    bar.finish_and_clear();
    let mut by_split: std::collections::BTreeMap<(String, bool), [usize; 4]> = Default::default();
    for (c, v) in &verdicts {
        let split = c.name.split('-').next().unwrap_or("").to_owned();
        let slot = by_split.entry((split, c.tool)).or_default();
        let i = match v {
            Verdict::Valid => 0,
            Verdict::Invalid(why) => {
                println!("INVALID {}: {why}", c.name);
                1
            }
            Verdict::Cut => {
                println!("CUT {}: reached max_tokens", c.name);
                2
            }
            Verdict::Failed(why) => {
                println!("FAILED {}: {why}", c.name);
                3
            }
        };
        slot[i] += 1;
    }
    println!(
        "Validity ({} cases, temperature {}, max_tokens {}, {} at a time, {:.0} s):",
        cases.len(),
        args.temperature,
        args.max_tokens,
        args.validity_concurrency,
        started.elapsed().as_secs_f64()
    );
    println!(
        "{:<10} {:<16} {:>6} {:>6} {:>8} {:>4} {:>7} {:>9}",
        "split", "as", "cases", "valid", "invalid", "cut", "failed", "validity"
    );
    let mut total = [0usize; 4];
    for ((split, tool), n) in &by_split {
        let all: usize = n.iter().sum();
        let kind = if *tool {
            "tool call"
        } else {
            "response_format"
        };
        println!(
            "{split:<10} {kind:<16} {all:>6} {:>6} {:>8} {:>4} {:>7} {:>8.1}%",
            n[0],
            n[1],
            n[2],
            n[3],
            100.0 * n[0] as f64 / all as f64
        );
        for i in 0..4 {
            total[i] += n[i];
        }
    }
    let all: usize = total.iter().sum();
    println!(
        "{:<27} {all:>6} {:>6} {:>8} {:>4} {:>7} {:>8.1}%",
        "all",
        total[0],
        total[1],
        total[2],
        total[3],
        100.0 * total[0] as f64 / all as f64
    );
    Ok(())
}

async fn check(
    client: &reqwest::Client,
    base: &str,
    c: &Case,
    args: &StructuredBenchArgs,
) -> Verdict {
    let mut body = json!({"model": MODEL, "temperature": args.temperature, "max_tokens": args.max_tokens,
        "messages": [{"role": "user", "content": c.prompt}]});
    if c.tool {
        body["tools"] = json!([{"type": "function", "function": {"name": "record", "description": "Records the answer", "parameters": c.schema}}]);
        body["tool_choice"] = json!({"type": "function", "function": {"name": "record"}});
        body["parallel_tool_calls"] = false.into();
    } else {
        body["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": c.schema}});
    }
    let answer: Value = match client
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
    {
        Ok(r) => match r.json().await {
            Ok(v) => v,
            Err(e) => return Verdict::Failed(e.to_string()),
        },
        Err(e) => return Verdict::Failed(e.to_string()),
    };
    if let Some(e) = answer["error"]["message"].as_str() {
        return Verdict::Failed(e.to_owned());
    }
    let choice = &answer["choices"][0];
    if choice["finish_reason"] == "length" {
        return Verdict::Cut;
    }
    let text = match c.tool {
        true => choice["message"]["tool_calls"][0]["function"]["arguments"].as_str(),
        false => choice["message"]["content"].as_str(),
    }
    .unwrap_or_default();
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Verdict::Invalid(format!("does not parse ({e}): {text}")),
    };
    let validator = match jsonschema::validator_for(&c.schema) {
        Ok(v) => v,
        Err(e) => return Verdict::Failed(format!("the schema itself is invalid: {e}")),
    };
    match validator.iter_errors(&value).next() {
        None => Verdict::Valid,
        Some(e) => Verdict::Invalid(format!("{e} at `{}`: {text}", e.instance_path())),
    }
}
