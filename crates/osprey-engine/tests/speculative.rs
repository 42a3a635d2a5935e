//! Speculative decoding on the real model: drafts verified inside the batched step change no
//! token and no log-probability, whatever else happens to the sequence (other sequences in the
//! batch, prefix hits, preemption, stop strings, `max_tokens` or EOS inside a draft, several
//! choices, a grammar, tool calls), and sampling keeps its distribution.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;
use osprey_core::SamplingParams;
use osprey_core::api::Usage;
use osprey_core::backend::{Asked, Backend, GenEvent, GenRequest};
use osprey_engine::speculative::{DraftTally, Drafter, SpeculationConfig};
use osprey_engine::{Engine, EngineConfig, GenerateRequest, SchedulerConfig, TemplateMessage};
use osprey_testkit::{engine, test_config};

use crate::serving::check_preemption;

const PASSAGE: &str = "The harbour master rang the bell at six, as he had done every morning \
    for thirty years. Fishing boats left the quay in pairs, their engines coughing in the cold \
    air, and the gulls followed them out past the lighthouse. By nine the market hall was full: \
    crates of mackerel, baskets of mussels, and a single enormous halibut that nobody could \
    afford.";

/// An engine that never speculates.
fn plain() -> Engine {
    engine(EngineConfig {
        scheduler: SchedulerConfig {
            speculation: SpeculationConfig::OFF,
            ..SchedulerConfig::default()
        },
        ..test_config()
    })
}

fn chat(engine: &Engine, user: &str) -> Vec<u32> {
    let messages = [TemplateMessage {
        role: "user".into(),
        content: user.into(),
    }];
    engine
        .tokenizer()
        .encode(&engine.render_chat(&messages).unwrap(), true)
}

/// Prompts that copy (where drafts are accepted) and one that does not.
fn prompts(engine: &Engine) -> Vec<Vec<u32>> {
    [
        format!("Repeat the following passage exactly.\n\n{PASSAGE}"),
        format!(
            "Correct the typos in this text.\n\n{}",
            PASSAGE.replace("the", "teh")
        ),
        format!("Rewrite this passage as a bulleted list of facts.\n\n{PASSAGE}"),
        "Write a short story about a lighthouse keeper.".to_owned(),
    ]
    .iter()
    .map(|p| chat(engine, p))
    .collect()
}

/// A greedy token with its log-probability and top alternatives.
type Scored = (u32, f32, Vec<(u32, f32)>);

/// Greedy tokens of one request with their log-probabilities, and its drafts' tally.
async fn scored(engine: &Engine, prompt: Vec<u32>, max_tokens: usize) -> (Vec<Scored>, (u64, u64)) {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens,
        logprobs: Some(3),
        ..SamplingParams::default()
    };
    let request = GenerateRequest::new(prompt, params);
    let tally: Arc<DraftTally> = request.drafts.clone();
    let mut generation = engine.generate(engine.validate(request).unwrap()).unwrap();
    let mut out = Vec::new();
    while let Some(delta) = generation.next().await {
        if let Some(t) = delta.unwrap().token {
            let lp = t.logprob.expect("asked for");
            out.push((t.id, lp.logprob, lp.top));
        }
    }
    (out, tally.get())
}

async fn together(engine: &Engine, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Vec<Scored>> {
    let runs = (prompts.iter().cloned()).map(|p| {
        let engine = engine.clone();
        tokio::spawn(async move { scored(&engine, p, max_tokens).await.0 })
    });
    let done = futures_util::future::join_all(runs).await;
    done.into_iter().map(Result::unwrap).collect()
}

/// Each prompt run alone on `on`, and on `off`, which never speculates: asserts that the
/// answers are the same, and returns them with the drafts' tally over all of them.
async fn same_alone(
    off: &Engine,
    on: &Engine,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> (Vec<Vec<Scored>>, (u64, u64)) {
    let (mut expected, mut drafted, mut accepted) = (Vec::new(), 0, 0);
    for (i, p) in prompts.iter().enumerate() {
        let want = scored(off, p.clone(), max_tokens).await.0;
        let (got, (d, a)) = scored(on, p.clone(), max_tokens).await;
        assert_eq!(got, want, "prompt {i} alone");
        expected.push(want);
        (drafted, accepted) = (drafted + d, accepted + a);
    }
    (expected, (drafted, accepted))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafts_change_no_token_or_logprob_alone_in_a_batch_or_from_the_prefix_cache() {
    let (off, on) = (plain(), engine(test_config()));
    let prompts = prompts(&on);
    let (expected, (drafted, accepted)) = same_alone(&off, &on, &prompts, 96).await;
    assert!(
        accepted * 2 > drafted && accepted > 60,
        "the copying prompts are meant to draft well: {accepted} of {drafted} accepted"
    );
    // Twice over at once: a batch of eight, the second of each pair from the prefix cache.
    let doubled: Vec<Vec<u32>> = prompts.iter().chain(&prompts).cloned().collect();
    let hits = on.stats().prefix_hit_tokens();
    for (i, got) in together(&on, &doubled, 96).await.iter().enumerate() {
        assert_eq!(got, &expected[i % prompts.len()], "prompt {i} in a batch");
    }
    assert!(
        on.stats().prefix_hit_tokens() > hits,
        "no prefix was reused"
    );
}

/// The self-draft (`--speculative layers:N`): the model's first layers guess, the full model
/// verifies, and nothing changes either, alone or in a batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_drafts_change_no_token_or_logprob_alone_or_in_a_batch() {
    let off = plain();
    let on = engine(EngineConfig {
        scheduler: SchedulerConfig {
            speculation: SpeculationConfig {
                drafter: Drafter::Layers(26),
                ..SpeculationConfig::default()
            },
            ..SchedulerConfig::default()
        },
        ..test_config()
    });
    let prompts = prompts(&on);
    let (expected, (drafted, accepted)) = same_alone(&off, &on, &prompts, 48).await;
    assert!(
        accepted > 0 && drafted > accepted,
        "{accepted} of {drafted} drafted tokens accepted"
    );
    for (i, got) in together(&on, &prompts, 48).await.iter().enumerate() {
        assert_eq!(got, &expected[i], "prompt {i} in a batch");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_inside_a_draft_ends_the_answer_where_it_would_have_ended() {
    let (off, on) = (plain(), engine(test_config()));
    let prompt = prompts(&on).swap_remove(0);
    let (full, _) = scored(&off, prompt.clone(), 40).await;
    for n in [1, 2, 3, 5, 8, 13, 21, 34] {
        let (got, _) = scored(&on, prompt.clone(), n).await;
        assert_eq!(got, full[..n], "max_tokens {n}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copying_sequences_preempted_while_drafting_resume_with_identical_output() {
    let reference = plain();
    let mut prompts = prompts(&reference);
    prompts.truncate(3);
    prompts.extend(prompts.clone());
    let per_token = reference.info().kv_bytes_per_token;
    let longest = prompts.iter().map(Vec::len).max().unwrap() + 64;
    let tight = engine(EngineConfig {
        kv_cache_bytes: per_token * longest * 5 / 2,
        ..test_config()
    });
    check_preemption(&reference, &tight, &prompts, 64).await;
}

/// The choices' texts, finish reasons and usage of a chat request on `engine`.
async fn answer(engine: &Engine, body: serde_json::Value) -> (Vec<String>, Vec<String>, Usage) {
    let asked = osprey_core::api::parse_request(body.to_string().as_bytes()).unwrap();
    let request = GenRequest {
        asked: Asked::Chat(asked),
        body: Default::default(),
        priority: Default::default(),
        cache_salt: String::new(),
    };
    let mut events = Backend::generate(engine, request).await.unwrap();
    let (mut texts, mut finishes) = (BTreeMap::new(), BTreeMap::new());
    let mut usage = None;
    while let Some(event) = events.next().await {
        match event.unwrap() {
            GenEvent::Delta(d) => {
                let text: &mut String = texts.entry(d.index).or_default();
                text.push_str(&d.text);
                if let Some(call) = d.tool_call {
                    let f = call.function; // not its id, which is random
                    text.push_str(&format!("[{} {:?} {:?}]", call.index, f.name, f.arguments));
                }
                if let Some(f) = d.finish {
                    finishes.insert(d.index, format!("{f:?}"));
                }
            }
            GenEvent::Usage(u) => usage = Some(u),
        }
    }
    (
        texts.into_values().collect(),
        finishes.into_values().collect(),
        usage.expect("a usage at the end"),
    )
}

/// `body` asked with and without speculation gives the same answer; returns it and the
/// speculating run's usage.
async fn same_either_way(engine: &Engine, mut body: serde_json::Value) -> (Vec<String>, Usage) {
    body["osprey"]["speculative"] = false.into();
    let (texts, finishes, usage) = answer(engine, body.clone()).await;
    assert_eq!(
        usage.completion_tokens_details, None,
        "nothing drafted when asked not to"
    );
    body["osprey"]["speculative"] = true.into();
    let (spec_texts, spec_finishes, spec_usage) = answer(engine, body).await;
    assert_eq!(spec_texts, texts);
    assert_eq!(spec_finishes, finishes);
    assert_eq!(spec_usage.completion_tokens, usage.completion_tokens);
    (texts, spec_usage)
}

fn drafted(usage: &Usage) -> (usize, usize) {
    usage.completion_tokens_details.map_or((0, 0), |d| {
        (
            d.accepted_prediction_tokens + d.rejected_prediction_tokens,
            d.accepted_prediction_tokens,
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_several_choices_grammars_and_tool_calls_answer_the_same() {
    let on = engine(test_config());
    let user = |text: String| serde_json::json!([{"role": "user", "content": text}]);
    // A stop string inside the copied passage, and two choices.
    let (texts, usage) = same_either_way(&on, serde_json::json!({
        "model": "m", "messages": user(format!("Repeat the following passage exactly.\n\n{PASSAGE}")),
        "temperature": 0, "n": 2, "stop": ["lighthouse"], "max_tokens": 80,
    }))
    .await;
    assert_eq!(texts.len(), 2);
    assert!(
        texts[0].contains("gulls") && !texts[0].contains("lighthouse"),
        "{texts:?}"
    );
    assert!(drafted(&usage).1 > 10, "{usage:?}");

    // JSON that repeats its keys, under a schema.
    let schema = serde_json::json!({"type": "array", "items": {"type": "object",
        "properties": {"name": {"type": "string"}, "port": {"type": "integer"}},
        "required": ["name", "port"], "additionalProperties": false}});
    let (texts, usage) = same_either_way(&on, serde_json::json!({
        "model": "m", "messages": user("List these services as JSON: web on port 80, mail on port 25, \
            ssh on port 22, dns on port 53, ntp on port 123.".into()),
        "temperature": 0, "max_tokens": 120,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }))
    .await;
    let parsed: serde_json::Value = serde_json::from_str(&texts[0]).expect("the grammar held");
    assert!(parsed.is_array());
    assert!(drafted(&usage).1 > 0, "{usage:?}");

    // Drafts the grammar forbids: the prompt says "mat", the grammar only allows "hat".
    let (texts, usage) = same_either_way(&on, serde_json::json!({
        "model": "m", "messages": user(format!("Say this again: {}", "the cat sat on the mat. ".repeat(6))),
        "temperature": 0, "max_tokens": 40,
        "osprey": {"grammar": {"regex": "(the cat sat on the hat\\. ){1,6}"}},
    }))
    .await;
    assert!(
        texts[0].starts_with("the cat sat on the hat. "),
        "{texts:?}"
    );
    let (d, a) = drafted(&usage);
    assert!(a < d, "a forbidden draft was accepted: {a} of {d}");

    // Tool calls.
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"]}}}]);
    let (texts, _) = same_either_way(&on, serde_json::json!({
        "model": "m", "messages": user("What is the weather in Paris, in Lyon and in Nice?".into()),
        "temperature": 0, "max_tokens": 80, "tools": tools, "tool_choice": "required",
    }))
    .await;
    assert!(texts[0].contains("get_weather"), "{texts:?}");
}

/// Sampling with speculation keeps the distribution of what is sampled: the first three tokens
/// of many seeded runs on a text that repeats itself (so every position drafts), with
/// speculation and without, are two samples of one distribution (a chi-square test of
/// homogeneity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_with_drafts_keeps_the_distribution() {
    let (off, on) = (plain(), engine(test_config()));
    // Colours in a scrambled order that has every pair, so whichever colour comes next, the
    // pair it ends has occurred before and a draft follows it.
    let colours: Vec<&str> = (0..40u32)
        .map(|i| ["red", "green", "blue"][((i * i * 7 + i * 3 + i / 5) % 3) as usize])
        .collect();
    let prompt = on.tokenizer().encode(&colours.join(" "), true);
    let runs = 1000;
    let sample = |engine: Engine| {
        let prompt = prompt.clone();
        async move {
            let mut counts: BTreeMap<Vec<u32>, u64> = BTreeMap::new();
            let mut tallies = Vec::new();
            // Four at a time: a step of more rows would leave no room for drafts.
            for chunk in (0..runs).collect::<Vec<u64>>().chunks(4) {
                let mut generations = Vec::new();
                for &seed in chunk {
                    let params = SamplingParams {
                        temperature: 0.8,
                        max_tokens: 3,
                        ignore_eos: true,
                        ..SamplingParams::default()
                    };
                    let mut request = GenerateRequest::new(prompt.clone(), params);
                    request.seed = seed;
                    tallies.push(request.drafts.clone());
                    generations.push(engine.generate(engine.validate(request).unwrap()).unwrap());
                }
                for mut g in generations {
                    let mut ids = Vec::new();
                    while let Some(d) = g.next().await {
                        ids.extend(d.unwrap().token.map(|t| t.id));
                    }
                    *counts.entry(ids).or_default() += 1;
                }
            }
            let accepted: u64 = tallies.iter().map(|t| t.get().1).sum();
            (counts, accepted)
        }
    };
    let (without, none) = sample(off).await;
    let (with, accepted) = sample(on).await;
    assert_eq!(none, 0);
    assert!(
        accepted >= 100,
        "drafts were meant to be accepted: {accepted}"
    );
    // Outcomes seen fewer than 10 times in both together are pooled.
    let mut table: Vec<(u64, u64)> = Vec::new();
    let mut rare = (0, 0);
    let keys: std::collections::BTreeSet<_> = without.keys().chain(with.keys()).collect();
    for k in keys {
        let cell = (
            without.get(k).copied().unwrap_or(0),
            with.get(k).copied().unwrap_or(0),
        );
        if cell.0 + cell.1 < 10 {
            rare = (rare.0 + cell.0, rare.1 + cell.1);
        } else {
            table.push(cell);
        }
    }
    if rare.0 + rare.1 > 0 {
        table.push(rare);
    }
    assert!(table.len() >= 3, "too few outcomes to compare: {table:?}");
    let chi2: f64 = table
        .iter()
        .map(|&(a, b)| {
            let expected = (a + b) as f64 / 2.0; // both samples have `runs` draws
            ((a as f64 - expected).powi(2) + (b as f64 - expected).powi(2)) / expected
        })
        .sum();
    // The 0.999 quantile of chi-square with df degrees of freedom, by Wilson–Hilferty.
    let df = (table.len() - 1) as f64;
    let z = 3.09;
    let limit = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
    assert!(
        chi2 < limit,
        "chi-square {chi2:.1} over {df} degrees of freedom: {table:?}"
    );
}
