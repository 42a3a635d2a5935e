//! The evaluation loop end to end against a scripted OpenAI-compatible server (its answers are
//! fixed per model, so the verdicts are known): running a suite, the gate failing on a worse
//! candidate and passing an equal one, replay reading a request log, and the HTML report.

use std::net::SocketAddr;

use axum::extract::Query;
use axum::routing::{get, post};
use axum::{Json, Router};
use osprey_eval::replay::{self, ReplaySource};
use osprey_eval::{Comparison, RunConfig, Suite, Target, report, run_suite};
use serde_json::{Value, json};

/// Model `good` answers the capital and the sum; model `bad` gets both wrong. Both answer the
/// JSON case, call tools, cite, and score text.
async fn chat(Json(body): Json<Value>) -> Json<Value> {
    let model = body["model"].as_str().unwrap_or_default().to_owned();
    let question = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .map(|m| m["content"].to_string())
        .unwrap_or_default();
    let good = model == "good";
    if body["tools"].is_array() {
        return Json(
            json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 9}}),
        );
    }
    let text = if question.contains("Rubric:") {
        // The judge: a polite answer passes.
        if question.contains("Hello there") {
            "PASS. It greets."
        } else {
            "FAIL: no greeting."
        }
    } else if question.contains("capital") {
        if good { "Paris." } else { "Lyon." }
    } else if question.contains("2 + 3") {
        if good { "It is 5." } else { "It is 6." }
    } else if question.contains("JSON") {
        "{\"age\": 31}"
    } else if question.contains("Block me") {
        return Json(
            json!({"error": {"message": "blocked", "type": "invalid_request_error", "code": "content_policy_violation"}}),
        );
    } else {
        "Hello there"
    };
    Json(json!({
        "choices": [{"message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": if good { 3 } else { 5 }},
        "osprey": {"citations": [{"marker": "[1]", "document_id": "doc-7"}]},
    }))
}

async fn completions(Json(body): Json<Value>) -> Json<Value> {
    // Echo scoring: four tokens of log-probability -1 (perplexity e).
    assert_eq!(body["echo"], true);
    Json(
        json!({"choices": [{"text": body["prompt"], "logprobs": {"token_logprobs": [null, -1.0, -1.0, -1.0]}}],
                "usage": {"prompt_tokens": 4, "completion_tokens": 0}}),
    )
}

/// Bag-of-letters embeddings: similar texts, similar vectors.
async fn embeddings(Json(body): Json<Value>) -> Json<Value> {
    let data: Vec<Value> = (body["input"].as_array().unwrap().iter())
        .map(|t| {
            let mut v = vec![0.0f64; 26];
            for c in t
                .as_str()
                .unwrap()
                .to_lowercase()
                .chars()
                .filter(char::is_ascii_lowercase)
            {
                v[(c as u8 - b'a') as usize] += 1.0;
            }
            json!({"embedding": v})
        })
        .collect();
    Json(json!({"data": data}))
}

/// Two pages of log: one row with text, one without (not replayable), one embeddings row.
async fn request_log(Query(q): Query<Vec<(String, String)>>) -> Json<Value> {
    let before = q.iter().any(|(k, _)| k == "before");
    let row = |id: &str, route: &str, prompt: Option<&str>| {
        json!({
        "id": id, "route": route, "model": "good", "status": 200,
        "text": {"prompt": prompt, "response": prompt.map(|_| "Paris.")},
        "timings": {"total_ms": 250}, "tokens": {"prompt": 10, "completion": 3}})
    };
    Json(match before {
        false => {
            json!({"data": [row("r3", "chat/completions", Some("system: Be brief.\nuser: What is the capital of France?")),
                                 row("r2", "chat/completions", None)], "next": 2})
        }
        true => json!({"data": [row("r1", "embeddings", Some("user: x"))], "next": null}),
    })
}

async fn scripted() -> String {
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/admin/requests", get(request_log));
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn suite() -> Suite {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scripted.jsonl");
    // Ten of each question the bad model gets wrong: enough cases for the gate to be sure.
    let mut cases: Vec<Value> = (0..10)
        .flat_map(|i| [
            json!({"id": format!("capital-{i}"), "messages": [{"role": "user", "content": format!("The capital of France? ({i})")}], "checks": [{"type": "contains", "value": "Paris"}]}),
            json!({"id": format!("sum-{i}"), "messages": [{"role": "user", "content": format!("2 + 3? ({i})")}], "checks": [{"type": "numeric", "value": 5}]}),
        ])
        .collect();
    cases.extend([
        json!({"id": "json", "messages": [{"role": "user", "content": "Age as JSON"}], "checks": [{"type": "json_schema", "schema": {"type": "object", "required": ["age"]}}]}),
        json!({"id": "tool", "messages": [{"role": "user", "content": "Weather?"}], "params": {"tools": [{"type": "function", "function": {"name": "get_weather"}}]},
               "checks": [{"type": "tool_call", "name": "get_weather", "arguments": {"city": "oslo"}}]}),
        json!({"id": "cite", "messages": [{"role": "user", "content": "Hi"}], "checks": [{"type": "retrieval_hit", "document": "doc-7"}, {"type": "similar", "value": "Hello there!", "min": 0.95}]}),
        json!({"id": "greet", "messages": [{"role": "user", "content": "Greet me"}], "checks": [{"type": "judge", "rubric": "The answer greets the user."}, {"type": "contains", "value": "Hello"}]}),
        json!({"id": "greet-judged-only", "messages": [{"role": "user", "content": "2 + 3? (judged)"}], "checks": [{"type": "judge", "rubric": "The answer greets the user."}]}),
        json!({"id": "refuse", "messages": [{"role": "user", "content": "Block me"}], "checks": [{"type": "error", "code": "content_policy_violation"}]}),
        json!({"id": "ppl", "checks": [{"type": "perplexity", "text": "four tokens of text", "max": 3.0}]}),
    ]);
    let text: Vec<String> = cases.iter().map(Value::to_string).collect();
    std::fs::write(&path, text.join("\n")).unwrap();
    Suite::load(&path).unwrap()
}

#[tokio::test]
async fn runs_compare_and_gate_on_scripted_answers() {
    let url = scripted().await;
    let suite = suite();
    let seen = std::sync::atomic::AtomicUsize::new(0);
    let count = |_: &osprey_eval::CaseResult| {
        seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    };
    let good = run_suite(
        &suite,
        &Target::new(&url, "good"),
        RunConfig::default(),
        &count,
    )
    .await;
    assert_eq!(
        seen.load(std::sync::atomic::Ordering::Relaxed),
        suite.cases.len()
    );
    let failing: Vec<(&str, &Vec<osprey_eval::CheckOutcome>)> = good
        .cases
        .iter()
        .filter(|c| !c.pass)
        .map(|c| (c.id.as_str(), &c.checks))
        .collect();
    // Only the case the judge fails (its answer greets no one).
    assert_eq!(failing.len(), 1, "{failing:?}");
    assert_eq!(failing[0].0, "greet-judged-only");
    assert!(failing[0].1[0].detail.starts_with("FAIL"), "{failing:?}");
    let s = good.summary();
    assert_eq!((s.cases, s.passed, s.errors), (27, 26, 0));
    assert_eq!(s.by_checker["perplexity"], (1, 1));
    assert_eq!(s.by_checker["judge"], (1, 2));
    assert_eq!(
        s.judge_agreement,
        Some((1, 1)),
        "the judge agreed with `contains`"
    );

    let bad = run_suite(
        &suite,
        &Target::new(&url, "bad"),
        RunConfig::default(),
        &|_| {},
    )
    .await;
    let failed = bad.cases.iter().filter(|c| !c.pass);
    assert!(failed.clone().all(|c| c.id.starts_with("capital-")
        || c.id.starts_with("sum-")
        || c.id == "greet-judged-only"));
    assert_eq!(failed.count(), 21);

    let worse = Comparison::new(&good, &bad, 0.95);
    assert_eq!(worse.flips.len(), 20);
    // 20 of 27 flipped: the pass rate fell by 0.74, certainly by more than 0.4.
    assert!(worse.gate("pass", 0.05).is_err());
    assert!(worse.gate("pass", 0.4).is_err());
    assert!(worse.gate("pass", 0.95).is_ok());
    assert!(
        worse.gate("completion_tokens", 0.05).is_err(),
        "5 tokens instead of 3"
    );

    let again = run_suite(
        &suite,
        &Target::new(&url, "good"),
        RunConfig::default(),
        &|_| {},
    )
    .await;
    let equal = Comparison::new(&good, &again, 0.95);
    assert!(equal.flips.is_empty());
    assert!(equal.gate("pass", 0.0).is_ok());
    assert!(equal.gate("completion_tokens", 0.0).is_ok());

    // The reports render, with their plots.
    let html = report::run_html(&bad);
    assert!(html.contains("<svg") && html.contains("capital-3") && html.contains("fail"));
    let html = report::compare_html(&worse);
    assert!(html.contains("<svg") && html.contains("pass → fail"));
    assert!(report::compare_table(&worse).contains("WORSE"));
    let back: osprey_eval::RunReport =
        serde_json::from_str(&serde_json::to_string(&bad).unwrap()).unwrap();
    assert_eq!(back.cases.len(), bad.cases.len());
}

#[tokio::test]
async fn replay_reads_the_log_and_compares_with_the_originals() {
    let url = scripted().await;
    let source = ReplaySource {
        url: url.clone(),
        admin_key: None,
        since: None,
        tenant: None,
        sample: 10,
        seed: 1,
        min_similarity: 0.9,
    };
    let logged = replay::fetch(&source).await.unwrap();
    assert_eq!(logged.len(), 1, "only the chat row with text is replayable");
    assert_eq!(logged[0].messages.len(), 2);

    let suite = replay::suite(&logged, source.min_similarity);
    let same = run_suite(
        &suite,
        &Target::new(&url, "good"),
        RunConfig::default(),
        &|_| {},
    )
    .await;
    assert!(same.cases[0].pass, "{:?}", same.cases[0].checks);
    let other = run_suite(
        &suite,
        &Target::new(&url, "bad"),
        RunConfig::default(),
        &|_| {},
    )
    .await;
    let kinds: Vec<(&str, bool)> = other.cases[0]
        .checks
        .iter()
        .map(|c| (c.kind.as_str(), c.pass))
        .collect();
    assert_eq!(kinds, [("exact", false), ("similar", false)]);

    let originals = replay::originals(&logged, &source, Default::default());
    let cmp = Comparison::new(&originals, &other, 0.95);
    let tokens = cmp.metric("completion_tokens").unwrap();
    assert_eq!((tokens.baseline, tokens.candidate), (3.0, 5.0));
    assert!(cmp.metric("latency_ms").is_some());
}
