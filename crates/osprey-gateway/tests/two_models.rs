//! Two models in one server, each on its own engine and KV pool: SmolLM2 (Llama family) and
//! Gemma 3 (its own family, tokenizer and quant types). Each answers to its name, both meet
//! llama.cpp's greedy goldens through the HTTP path, and requests spread over both at once get
//! what each gets alone.

use osprey_engine::Engine;
use osprey_gateway::{Services, Wiring};
use osprey_limits::RateLimiter;
use osprey_services::auth::Authenticator;
use osprey_services::config::EdgeConfig;
use osprey_services::edge::Edge;
use osprey_testkit::{Golden, gemma_engine, gemma_golden, golden, shared_engine};
use serde_json::{Value, json};

use crate::common::{get_json, metric, serve};

const SMOL: &str = osprey_models::DEFAULT_MODEL.served_name;
const GEMMA: &str = osprey_models::fetch::GEMMA_3_270M.served_name;
const ADMIN: &str = "two-models-admin";

/// A server of both models, SmolLM2 first (the default).
async fn two_model_server() -> (String, Engine, Engine) {
    let (smol, gemma) = (shared_engine(), gemma_engine());
    let config = EdgeConfig {
        admin_key: Some(ADMIN.into()),
        ..EdgeConfig::default()
    };
    let edge = Edge::new(config, Authenticator::open(), RateLimiter::local());
    let state = Services::new(Wiring::new(
        [SMOL.to_owned(), GEMMA.to_owned()],
        Vec::new(),
        edge,
    ));
    state.set_loaded(SMOL, Ok(smol.clone()));
    state.set_loaded(GEMMA, Ok(gemma.clone()));
    (serve(state).await, smol, gemma)
}

async fn post(base: &str, body: &Value) -> Value {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{body}");
    r.json().await.unwrap()
}

/// A greedy completion of `prompt` (token ids) by `model`: its tokens' texts, and for each the
/// gap in logprob between the two best candidates.
async fn greedy(base: &str, model: &str, prompt: &[u32], max_tokens: usize) -> Vec<(String, f64)> {
    let body = json!({"model": model, "prompt": prompt, "max_tokens": max_tokens,
        "temperature": 0, "logprobs": 2});
    let answer = post(base, &body).await;
    let logprobs = &answer["choices"][0]["logprobs"];
    let tokens = logprobs["tokens"].as_array().expect("tokens");
    let tops = logprobs["top_logprobs"].as_array().expect("top_logprobs");
    (tokens.iter().zip(tops))
        .map(|(t, top)| {
            let mut best: Vec<f64> = (top.as_object().unwrap().values())
                .filter_map(Value::as_f64)
                .collect();
            best.sort_by(|a, b| b.total_cmp(a));
            let gap = match best[..] {
                [a, b, ..] => a - b,
                _ => f64::INFINITY,
            };
            (t.as_str().unwrap().to_owned(), gap)
        })
        .collect()
}

/// How many of `golden`'s greedy continuations `model` reproduces through the server, or parts
/// from only where its own two best were within 0.35 nats (the engine tests' criterion).
async fn greedy_agreement(base: &str, model: &str, engine: &Engine, golden: &Golden) -> usize {
    let mut agree = 0;
    for case in &golden.greedy {
        let ours = greedy(base, model, &case.prompt_ids, case.greedy_ids.len()).await;
        let theirs: Vec<String> = (case.greedy_ids.iter())
            .map(|&id| engine.tokenizer().token_text(id))
            .collect();
        let first_diff = (ours.iter().zip(&theirs)).position(|((a, _), b)| a != b);
        let ok = match first_diff {
            None => true,
            Some(i) => ours[i].1 < 0.35,
        };
        eprintln!("{model} {}: first difference at {first_diff:?}", case.kind);
        agree += usize::from(ok);
    }
    agree
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_models_are_listed_routed_by_name_and_meet_their_goldens() {
    let (base, smol, gemma) = two_model_server().await;
    let client = reqwest::Client::new();
    let models: Value = (client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap())
    .json()
    .await
    .unwrap();
    let ids: Vec<&str> = (models["data"].as_array().unwrap().iter())
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, [SMOL, GEMMA, "all-MiniLM-L6-v2"], "{models}");
    let ready = get_json(&format!("{base}/ready")).await;
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(ready["models"].as_array().map(Vec::len), Some(2), "{ready}");

    // Each request reaches the engine its `model` names: the header says so, and the
    // tokenizers differ (Gemma's 262,144-token vocabulary).
    for (model, engine) in [(SMOL, &smol), (GEMMA, &gemma)] {
        let r = (client.post(format!("{base}/v1/completions")))
            .json(
                &json!({"model": model, "prompt": "The capital of France is", "max_tokens": 1,
                "temperature": 0}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["x-osprey-model"], model);
        let body: Value = r.json().await.unwrap();
        let prompt_tokens = body["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
        let own = engine
            .tokenizer()
            .encode("The capital of France is", true)
            .len();
        assert_eq!(prompt_tokens, own, "{model} counted with its own tokenizer");
    }
    let r = (client.post(format!("{base}/v1/completions")))
        .json(&json!({"model": "gemma-3-1b", "prompt": "x", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_not_found", "{body}");

    let smol_agree = greedy_agreement(&base, SMOL, &smol, golden()).await;
    let gemma_agree = greedy_agreement(&base, GEMMA, &gemma, gemma_golden()).await;
    assert!(
        smol_agree >= 6,
        "SmolLM2: {smol_agree} of {}",
        golden().greedy.len()
    );
    let cases = gemma_golden().greedy.len();
    assert!(
        gemma_agree >= cases - 1,
        "Gemma 3: {gemma_agree} of {cases}"
    );

    // Each engine's metrics carry its model's name.
    let running = |model: &str| format!("osprey_kv_blocks_used{{model=\"{model}\"}}");
    let text = (client.get(format!("{base}/metrics")).send().await.unwrap())
        .text()
        .await
        .unwrap();
    for model in [SMOL, GEMMA] {
        assert!(
            text.contains(&running(model)),
            "no {} in /metrics",
            running(model)
        );
    }
    assert!(metric(&base, "osprey_kv_blocks_used").await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_over_two_models_each_equal_their_solo_run() {
    let (base, _, _) = two_model_server().await;
    let prompts = [
        "The osprey is a bird of prey that",
        "def fibonacci(n):",
        "Once upon a time, in a small village,",
        "The three primary colours are",
        "To make a cup of tea, first",
        "Photosynthesis converts",
        "The year 1969 is remembered for",
        "A haiku about the sea:",
    ];
    let requests: Vec<(&str, &str)> = (0..32)
        .map(|i| ([SMOL, GEMMA][i % 2], prompts[(i / 2) % prompts.len()]))
        .collect();
    let complete = |model: &str, prompt: &str| {
        let body = json!({"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0});
        let base = base.clone();
        async move { post(&base, &body).await["choices"][0]["text"].clone() }
    };
    let mut solo = Vec::new();
    for (model, prompt) in &requests[..16] {
        solo.push(complete(model, prompt).await);
    }
    let together =
        futures_util::future::join_all(requests.iter().map(|(m, p)| complete(m, p))).await;
    for (i, (model, prompt)) in requests.iter().enumerate() {
        assert_eq!(
            together[i],
            solo[i % 16],
            "{model} on {prompt:?}: alone and amid 31 others"
        );
    }
}

/// Each engine has its own scheduler: `?model=NAME` shows and switches one, leaving the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_model_has_its_own_scheduler() {
    let (base, _, _) = two_model_server().await;
    let client = reqwest::Client::new();
    let admin = |method: reqwest::Method, query: &str| {
        (client.request(method, format!("{base}/admin/scheduler{query}"))).bearer_auth(ADMIN)
    };
    let policy = |query: &'static str| {
        let get = admin(reqwest::Method::GET, query);
        async move {
            let body: Value = get.send().await.unwrap().json().await.unwrap();
            body["policy"].as_str().unwrap_or_default().to_owned()
        }
    };
    let r = (admin(reqwest::Method::PUT, "?model=gemma-3-270m"))
        .json(&json!({"policy": "fcfs"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(policy("?model=gemma-3-270m").await, "fcfs");
    assert_eq!(policy("?model=smollm2-135m-instruct").await, "priority");
    assert_eq!(
        policy("").await,
        "priority",
        "the first model's, by default"
    );
    let r = admin(reqwest::Method::GET, "?model=gemma-3-1b")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = (admin(reqwest::Method::PUT, "?model=gemma-3-270m"))
        .json(&json!({"policy": "priority"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}
