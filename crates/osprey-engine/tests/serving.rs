//! The engine under serving conditions, on the real model: prefix-cache hits, preemption and
//! a full batch must never change a sequence's greedy output.

use std::time::Duration;

use osprey_core::SamplingParams;
use osprey_engine::{Engine, EngineConfig, GenerateRequest, TemplateMessage};
use osprey_testkit::{engine, eventually, test_config};

/// A chat prompt: a shared system prompt and a question of its own.
fn chat(engine: &Engine, system: &str, user: &str) -> Vec<u32> {
    let messages = [
        TemplateMessage {
            role: "system".into(),
            content: system.into(),
        },
        TemplateMessage {
            role: "user".into(),
            content: user.into(),
        },
    ];
    engine
        .tokenizer()
        .encode(&engine.render_chat(&messages).unwrap(), true)
}

/// Varied questions, the same for a given `i`.
fn question(i: usize) -> String {
    const TOPICS: [&str; 8] = [
        "rivers",
        "volcanoes",
        "bees",
        "the moon",
        "bread",
        "glaciers",
        "owls",
        "copper",
    ];
    const ASKS: [&str; 4] = [
        "Tell me two facts about",
        "Write a short poem about",
        "Why do people study",
        "Explain to a child what is special about",
    ];
    format!(
        "{} {} (question {i}).",
        ASKS[i % ASKS.len()],
        TOPICS[(i / ASKS.len() + i) % TOPICS.len()]
    )
}

const SYSTEM: &str = "You are a careful assistant for a museum of natural history. Answer \
    briefly and accurately, in plain English, and say so when you are not sure. Never invent \
    sources. Prefer concrete examples over general statements.";

/// Greedy tokens of one request, run to completion.
async fn greedy(engine: &Engine, prompt: Vec<u32>, max_tokens: usize) -> Vec<u32> {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let request = engine
        .validate(GenerateRequest::new(prompt, params))
        .unwrap();
    let mut generation = engine.generate(request).unwrap();
    let mut ids = Vec::new();
    while let Some(delta) = generation.next().await {
        ids.extend(delta.unwrap().token.map(|t| t.id));
    }
    ids
}

/// Runs all prompts at once and returns each one's tokens.
async fn concurrently(engine: &Engine, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Vec<u32>> {
    let runs = prompts.iter().map(|p| {
        let engine = engine.clone();
        let p = p.clone();
        tokio::spawn(async move { greedy(&engine, p, max_tokens).await })
    });
    let mut out = Vec::new();
    for run in runs.collect::<Vec<_>>() {
        out.push(run.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_cache_hit_changes_no_token() {
    let cold = engine(EngineConfig {
        prefix_caching: false,
        ..test_config()
    });
    let warm = engine(test_config());
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| chat(&warm, SYSTEM, &question(i))).collect();
    for prompt in &prompts {
        let expected = greedy(&cold, prompt.clone(), 24).await;
        let before = warm.stats().prefix_hit_tokens();
        assert_eq!(greedy(&warm, prompt.clone(), 24).await, expected);
        // The same prompt again is served almost entirely from the cache.
        let hits = warm.stats().prefix_hit_tokens();
        assert_eq!(greedy(&warm, prompt.clone(), 24).await, expected);
        let rehit = warm.stats().prefix_hit_tokens() - hits;
        assert!(
            rehit as usize >= prompt.len() - 16,
            "re-hit {rehit} of {}",
            prompt.len()
        );
        if before > 0 {
            // Later questions reuse the shared system prompt.
            assert!(
                hits - before >= 32,
                "system prompt not reused: {}",
                hits - before
            );
        }
    }
    assert_eq!(cold.stats().prefix_hit_tokens(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_sequence_resumes_with_identical_output() {
    let reference = engine(test_config());
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|i| chat(&reference, SYSTEM, &question(i)))
        .collect();
    // A pool for about two and a half of these sequences at full length.
    let per_token = reference.info().kv_bytes_per_token;
    let longest = prompts.iter().map(Vec::len).max().unwrap() + 48;
    let tight = engine(EngineConfig {
        kv_cache_bytes: per_token * longest * 5 / 2,
        ..test_config()
    });
    check_preemption(&reference, &tight, &prompts, 48).await;
}

/// Gemma 3: sequences that decode past the 512-token window, in a pool too small for all of them
/// even with their windowed layers' pages given back, are preempted and recomputed, and each
/// still equals its solo run; every page comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemma_sequences_preempted_past_the_window_resume_with_identical_output() {
    let reference = osprey_testkit::gemma_engine();
    let text = &osprey_testkit::gemma_golden().perplexity.ids;
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| text[i * 100..i * 100 + 100].to_vec())
        .collect();
    // At 660 positions a sequence holds 42 pages of the full group and at most 33 of each of
    // the 5 windowed ones: 207. A pool for two and a half of them.
    let page_bytes = reference.info().kv_bytes_per_token * 16 / 6;
    let tight = Engine::load(
        &osprey_testkit::gemma_model(),
        EngineConfig {
            kv_cache_bytes: page_bytes * 207 * 5 / 2,
            ..test_config()
        },
    )
    .unwrap();
    check_preemption(&reference, &tight, &prompts, 560).await;
}

/// `prompts` run together on `tight` (a pool meant to run out) preempt one another, and each
/// still gives the `max_tokens` greedy tokens it gives alone on `reference`; every block comes
/// back.
pub(crate) async fn check_preemption(
    reference: &Engine,
    tight: &Engine,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) {
    let mut solo = Vec::new();
    for p in prompts {
        solo.push(greedy(reference, p.clone(), max_tokens).await);
    }
    let together = concurrently(tight, prompts, max_tokens).await;
    assert!(
        tight.stats().preemptions() > 0,
        "the pool was meant to run out"
    );
    for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
        assert_eq!(a, b, "request {i} changed by preemption");
    }
    // The engine publishes its counters after the step that sent the last token: wait for it.
    let stats = tight.stats();
    eventually(
        || async move { (stats.free_blocks() == stats.total_blocks()).then_some(()) },
        Duration::from_secs(60),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_concurrent_requests_each_equal_their_solo_run() {
    let engine = engine(EngineConfig {
        prefix_caching: false,
        ..test_config()
    });
    let prompts: Vec<Vec<u32>> = (0..32)
        .map(|i| chat(&engine, SYSTEM, &question(i * 7 + 1)))
        .collect();
    let mut solo = Vec::new();
    for p in &prompts {
        solo.push(greedy(&engine, p.clone(), 16).await);
    }
    let together = concurrently(&engine, &prompts, 16).await;
    for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
        assert_eq!(a, b, "request {i} changed by batching");
    }
}
