//! `osprey bench guards`: what the safety layer costs. The input pipeline (rules, classifier,
//! PII) on prompts of `--chars` characters made from the held-out split, timed one by one; and
//! the output filter's hold-back on a streamed answer, token by token: the time per token and
//! how far behind the model the client is.

use std::time::Instant;

use clap::Args;
use osprey_policy::Action;
use osprey_policy::pipeline::Pipeline;
use osprey_policy::stream::{OutputFilter, OutputRules};

#[derive(Args, Debug)]
pub struct GuardsBenchArgs {
    /// Prompts timed.
    #[arg(long, default_value_t = 2000)]
    prompts: usize,
    /// Characters per prompt.
    #[arg(long, default_value_t = 2000)]
    chars: usize,
    /// Characters per streamed token.
    #[arg(long, default_value_t = 4)]
    token_chars: usize,
}

pub fn run(args: GuardsBenchArgs) -> anyhow::Result<()> {
    let texts: Vec<String> = include_str!("../../../osprey-policy/data/injection-heldout.jsonl")
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["text"].as_str().map(str::to_owned))
        .collect();
    anyhow::ensure!(!texts.is_empty(), "no held-out texts");
    let pipeline = Pipeline::default();
    let start = Instant::now();
    pipeline.check(
        "warm up: trains the classifier",
        osprey_policy::Source::User,
    );
    println!(
        "classifier trained in {:.0} ms",
        start.elapsed().as_secs_f64() * 1e3
    );

    // Prompts of exactly `chars` characters: held-out texts joined, cut at different places.
    let joined: Vec<char> = texts.join("\n\n").chars().collect();
    let mut times = Vec::with_capacity(args.prompts);
    for i in 0..args.prompts {
        let at = (i * 7919) % joined.len().saturating_sub(args.chars).max(1);
        let prompt: String = joined.iter().cycle().skip(at).take(args.chars).collect();
        let t = Instant::now();
        std::hint::black_box(pipeline.check(&prompt, osprey_policy::Source::User));
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (p50, p99, max) = percentiles(&mut times);
    println!(
        "input pipeline, {} prompts of {} chars: p50 {p50:.0} us, p99 {p99:.0} us, max {max:.0} us",
        args.prompts, args.chars
    );

    let rules = OutputRules {
        deny: vec!["internal codename".into(), "do not share this".into()],
        pii: Some(Action::Redact),
    };
    let answer: String = joined.iter().take(20_000).collect();
    let mut filter = OutputFilter::new(&rules, None);
    let (mut per_token, mut behind, mut sent, mut taken) = (Vec::new(), Vec::new(), 0usize, 0usize);
    let chars: Vec<char> = answer.chars().collect();
    for token in chars.chunks(args.token_chars.max(1)) {
        let token: String = token.iter().collect();
        taken += token.chars().count();
        let t = Instant::now();
        match filter.push(&token) {
            Ok(out) => sent += out.chars().count(),
            Err(_) => break,
        }
        per_token.push(t.elapsed().as_secs_f64() * 1e6);
        behind.push((taken - sent) as f64);
    }
    let (p50, p99, max) = percentiles(&mut per_token);
    let (b50, _, bmax) = percentiles(&mut behind);
    println!(
        "output filter, {} tokens of {} chars: p50 {p50:.1} us, p99 {p99:.1} us, max {max:.0} us per token; \
         held back {b50:.0} chars typically, {bmax:.0} at most (window {})",
        per_token.len(),
        args.token_chars,
        filter.window()
    );
    Ok(())
}

/// p50, p99 and max of `values` (sorted in place).
fn percentiles(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), at(1.0))
}
