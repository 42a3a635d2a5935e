//! The HTTP API against the real model, in process: OpenAI shapes, exact usage, streaming,
//! perplexity through `echo` + `logprobs`, and every kind of bad input.

use osprey_gateway::{HttpConfig, Services, Wiring};
use serde_json::{Value, json};

pub(crate) const MODEL: &str = "smollm2-135m-instruct";

/// Starts a server over the shared engine and returns its base URL.
pub(crate) async fn server() -> String {
    let state = Services::serving(MODEL);
    state.set_engine(osprey_testkit::shared_engine());
    serve(state).await
}

/// Serves `state` on a free local port (1 MiB body limit); returns its base URL.
async fn serve(state: Services) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = HttpConfig {
        max_body_bytes: 1 << 20,
        ..HttpConfig::default()
    };
    tokio::spawn(async move {
        osprey_gateway::serve(listener, state, &config, std::future::pending()).await
    });
    format!("http://{addr}")
}

/// POSTs `body` as JSON to `path`.
pub(crate) async fn send(base: &str, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn post(base: &str, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
    )
}

/// Posts a streaming request and returns the `data:` payloads.
async fn post_stream(base: &str, path: &str, body: Value) -> Vec<String> {
    let text = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

/// A large tier served upstream that is down, falling back to the local engine's small model:
/// the request is answered by the engine, and the response says so.
#[tokio::test]
async fn a_failing_upstream_falls_back_to_the_local_engine() {
    use osprey_router::upstream::{Upstream, check_fallbacks, http_client};
    use osprey_services::config::UpstreamConfig;
    use osprey_services::edge::Edge;
    // A port nothing listens on: bound, then dropped.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let config = UpstreamConfig {
        url: format!("http://{dead}/v1"),
        api_key_env: None,
        model: None,
        timeout_secs: Some(5.0),
        max_retries: Some(0),
        fallbacks: Some(vec![MODEL.to_owned()]),
    };
    let upstreams = vec![Upstream::new("large", &config, http_client()).unwrap()];
    check_fallbacks(&upstreams, Some(MODEL)).unwrap();
    let state = Services::new(Wiring::new(Some(MODEL.into()), upstreams, Edge::open()));
    state.set_engine(osprey_testkit::shared_engine());
    let base = serve(state).await;
    let body =
        json!({"model": "large", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3});
    let r = send(&base, "/v1/chat/completions", &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-osprey-model"], MODEL);
    assert_eq!(
        r.headers()["x-osprey-route-reason"],
        "fallback from large: upstream_unavailable"
    );
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["model"], MODEL, "{answer}");
    let generated = answer["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=3).contains(&generated), "{answer}");
}

/// `"model": "auto"` over two tiers: the local engine (small) and another Osprey serving the
/// same engine as `large` upstream. The classifier sends easy work small and code or reasoning
/// large; premium goes large; the response names tier, model and reason.
/// A server with two `auto` tiers: `small` on the local engine and `big`, the model `large`
/// served by the Osprey at `large_url`, made by `tiers` from the two.
async fn two_tiers(
    large_url: &str,
    tiers: impl FnOnce(Vec<osprey_router::tiers::Tier>) -> osprey_router::tiers::Tiers,
) -> String {
    use osprey_router::tiers::Tier;
    use osprey_router::upstream::{Upstream, http_client};
    use osprey_services::config::UpstreamConfig;
    use osprey_services::edge::Edge;
    let config = UpstreamConfig {
        url: format!("{large_url}/v1"),
        api_key_env: None,
        model: None,
        timeout_secs: None,
        max_retries: None,
        fallbacks: None,
    };
    let upstreams = vec![Upstream::new("large", &config, http_client()).unwrap()];
    let tier = |name: &str, model: &str| Tier {
        name: name.into(),
        model: model.into(),
    };
    let tiers = tiers(vec![tier("small", MODEL), tier("big", "large")]);
    let state = Services::new(Wiring {
        tiers: Some(tiers),
        ..Wiring::new(Some(MODEL.into()), upstreams, Edge::open())
    });
    state.set_engine(osprey_testkit::shared_engine());
    serve(state).await
}

/// The model `large`, served by another Osprey over the shared engine; its base URL.
async fn large() -> String {
    let large = Services::serving("large");
    large.set_engine(osprey_testkit::shared_engine());
    serve(large).await
}

#[tokio::test]
async fn auto_picks_the_tier_by_task_and_says_why() {
    use osprey_router::tiers::Tiers;
    let large_url = large().await;
    let base = two_tiers(&large_url, |t| Tiers::new(t, 0.6).unwrap()).await;
    let ask = async |text: &str, extra: Value| {
        let mut body = json!({"model": "auto", "messages": [{"role": "user", "content": text}], "max_tokens": 2});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        let r = send(&base, "/v1/chat/completions", &body).await;
        assert_eq!(r.status(), 200);
        let h = |n: &str| r.headers()[n].to_str().unwrap().to_owned();
        (
            h("x-osprey-tier"),
            h("x-osprey-model"),
            h("x-osprey-route-reason"),
        )
    };
    let (tier, model, reason) = ask("What is the capital of Peru?", json!({})).await;
    assert_eq!((tier.as_str(), model.as_str()), ("small", MODEL));
    assert!(reason.starts_with("auto: simple_qa"), "{reason}");
    let (tier, model, reason) = ask(
        "Write a Go function that merges two sorted slices.",
        json!({}),
    )
    .await;
    assert_eq!(
        (tier.as_str(), model.as_str()),
        ("big", "large"),
        "{reason}"
    );
    assert!(reason.starts_with("auto: code"), "{reason}");
    let premium = json!({"osprey": {"quality": "premium"}});
    let (tier, _, reason) = ask("What is the capital of Peru?", premium).await;
    assert_eq!(tier, "big");
    assert!(reason.ends_with("premium"), "{reason}");
    let models: Value = reqwest::get(format!("{base}/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        models["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == "auto"),
        "{models}"
    );
}

/// Answer-level escalation: with a floor no answer reaches, a small-tier answer is dropped and
/// the request asked of the tier above (which says why); with a floor every answer reaches, the
/// small tier answers, and the logprobs asked for the check are gone unless the client asked.
#[tokio::test]
async fn a_doubtful_answer_is_asked_of_the_tier_above() {
    use osprey_router::tiers::Tiers;
    let large_url = large().await;
    let gateway = async |floor: f64| {
        let tiers = |t| {
            Tiers::new(t, 0.0)
                .unwrap()
                .with_answer_floor(floor)
                .unwrap()
        };
        two_tiers(&large_url, tiers).await
    };
    let ask = async |base: &str, extra: Value| {
        let mut body = json!({"model": "auto", "max_tokens": 6, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of Peru?"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = send(base, "/v1/chat/completions", &body).await;
        assert_eq!(r.status(), 200);
        let h = |n: &str| r.headers()[n].to_str().unwrap().to_owned();
        let (tier, reason) = (h("x-osprey-tier"), h("x-osprey-route-reason"));
        (tier, reason, r.json::<Value>().await.unwrap())
    };
    let strict = gateway(-1e-9).await;
    let (tier, reason, answer) = ask(&strict, json!({})).await;
    assert_eq!(tier, "big", "{reason}");
    assert!(reason.contains("escalated"), "{reason}");
    assert_eq!(answer["model"], "large");
    let lenient = gateway(-50.0).await;
    let (tier, reason, answer) = ask(&lenient, json!({})).await;
    assert_eq!(tier, "small", "{reason}");
    assert_eq!(answer["choices"][0]["logprobs"], Value::Null, "not asked");
    let (_, _, answer) = ask(&lenient, json!({"logprobs": true})).await;
    let tokens = answer["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(
        tokens.len() as u64,
        answer["usage"]["completion_tokens"].as_u64().unwrap()
    );
    // Streams are not checked: their first tokens are already on their way.
    let r = send(
        &strict,
        "/v1/chat/completions",
        &json!({"model": "auto", "max_tokens": 3,
        "stream": true, "messages": [{"role": "user", "content": "What is the capital of Peru?"}]}),
    )
    .await;
    assert_eq!(r.headers()["x-osprey-tier"], "small");
}

/// Under load the ladder degrades: at level 4 batch work is turned away, interactive requests
/// keep at most 256 tokens and say they were degraded; once load falls, nothing is.
#[tokio::test]
async fn degradation_levels_trigger_and_clear() {
    let state = Services::serving(MODEL);
    state.set_engine(osprey_testkit::shared_engine());
    let ladder = state.clone();
    // Without the load sampler (`serve_router`): the test is the only one moving the ladder.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = osprey_gateway::router(state, &HttpConfig::default());
    tokio::spawn(osprey_gateway::serve_router(
        listener,
        app,
        None,
        std::future::pending(),
    ));
    let spike = ladder.degradation().observe(0.92);
    assert_eq!(spike, 4);
    let ask = async |extra: Value| {
        let mut body = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 300,
                              "ignore_eos": true, "temperature": 0});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = send(&base, "/v1/completions", &body).await;
        let degraded = r
            .headers()
            .get("x-osprey-degraded")
            .map(|v| v.to_str().unwrap().to_owned());
        (
            r.status().as_u16(),
            degraded,
            r.json::<Value>().await.unwrap(),
        )
    };
    let (status, _, body) = ask(json!({"osprey": {"priority": "batch"}})).await;
    assert_envelope(status, &body, 503, None);
    assert_eq!(body["error"]["code"], "degraded_batch_deferred");
    let (status, degraded, body) = ask(json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(degraded.as_deref(), Some("4"));
    assert_eq!(body["usage"]["completion_tokens"], 256, "max_tokens capped");
    // Level 5: the request answered before gets that answer again; a new one a partial answer.
    assert_eq!(ladder.degradation().observe(0.97), 5);
    let (status, degraded, again) = ask(json!({})).await;
    assert_eq!((status, degraded.as_deref()), (200, Some("5")));
    assert_eq!(again, body, "the same answer");
    let (status, degraded, partial) = ask(json!({"prompt": "The weather today"})).await;
    assert_eq!((status, degraded.as_deref()), (200, Some("5")));
    assert_eq!(
        partial["usage"]["completion_tokens"], 64,
        "a partial answer"
    );
    // Load falls: every level clears.
    assert_eq!(ladder.degradation().observe(0.1), 0);
    let (status, degraded, body) = ask(json!({"max_tokens": 260})).await;
    assert_eq!(status, 200);
    assert_eq!(degraded, None);
    assert_eq!(body["usage"]["completion_tokens"], 260);
}

/// A request sent twice with one `Idempotency-Key` (a client's retry) is generated once: the
/// repeat, even while the first is still generating, gets the same answer, marked replayed.
#[tokio::test]
async fn a_named_request_is_generated_once() {
    let base = server().await;
    let body = json!({"model": MODEL, "prompt": "My favourite colour is", "max_tokens": 24,
                      "temperature": 1.0, "ignore_eos": true});
    let ask = async |key: &str, body: &Value| {
        let r = reqwest::Client::new()
            .post(format!("{base}/v1/completions"))
            .header("idempotency-key", key)
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let replayed = r.headers().contains_key("x-osprey-replayed");
        (r.json::<Value>().await.unwrap(), replayed)
    };
    let (a, b) = tokio::join!(ask("order-7", &body), ask("order-7", &body));
    assert_eq!(a.0, b.0, "one generation, sampled once");
    assert!(a.1 != b.1, "exactly one is the replay");
    let (later, replayed) = ask("order-7", &body).await;
    assert_eq!((later, replayed), (a.0.clone(), true));
    // Another key, or another body under the same key, is another request.
    let (other, replayed) = ask("order-8", &body).await;
    assert!(!replayed);
    assert_ne!(other["id"], a.0["id"]);
    let mut changed = body.clone();
    changed["max_tokens"] = 5.into();
    let (other, replayed) = ask("order-7", &changed).await;
    assert!(!replayed);
    assert_eq!(other["usage"]["completion_tokens"], 5);
}

/// The ladder follows the real load: with 3 of 4 seats in flight (75%), a request is served at
/// level 2.
#[tokio::test]
async fn the_ladder_follows_the_requests_in_flight() {
    use osprey_limits::RateLimiter;
    use osprey_services::auth::Authenticator;
    use osprey_services::config::{AdmissionConfig, EdgeConfig};
    use osprey_services::edge::Edge;
    let config = EdgeConfig {
        admission: AdmissionConfig {
            max_in_flight: 4,
            ..AdmissionConfig::default()
        },
        ..EdgeConfig::default()
    };
    let edge = Edge::new(config, Authenticator::open(), RateLimiter::local());
    let state = Services::new(Wiring::new(Some(MODEL.into()), Vec::new(), edge));
    state.set_engine(osprey_testkit::shared_engine());
    let ladder = state.clone();
    let base = serve(state).await;
    let long = json!({"model": MODEL, "prompt": "Hello", "max_tokens": 400, "ignore_eos": true,
                      "stream": true});
    let mut streams = Vec::new();
    for _ in 0..3 {
        let r = send(&base, "/v1/completions", &long).await;
        assert_eq!(r.status(), 200);
        assert!(r.headers().get("x-osprey-degraded").is_none());
        streams.push(r);
    }
    // The load is sampled every 250 ms.
    osprey_testkit::eventually(
        || async { (ladder.degradation().level() == 2).then_some(()) },
        std::time::Duration::from_secs(30),
    )
    .await;
    let short = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 1});
    let r = send(&base, "/v1/completions", &short).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-osprey-degraded"], "2");
    drop(streams);
}

/// A batch over a file with a bad line is refused with the line named; a good one runs to
/// completion and its output answers every line.
#[tokio::test]
async fn batches_check_their_input_and_run_it() {
    let dir = std::env::temp_dir().join(format!("osprey-api-batches-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = osprey_store::Store::open(&osprey_store::Store::default_url(&dir))
        .await
        .unwrap();
    let state = Services::new(Wiring {
        store: Some(store),
        ..Wiring::serving(MODEL)
    });
    state.set_engine(osprey_testkit::shared_engine());
    let base = serve(state).await;
    let client = reqwest::Client::new();
    let upload = async |content: &str| -> Value {
        let boundary = "osprey-boundary";
        let body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
             Content-Type: application/jsonl\r\n\r\n{content}\r\n--{boundary}--\r\n"
        );
        let r = client
            .post(format!("{base}/v1/files"))
            .header(
                "content-type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.json().await.unwrap()
    };
    let line = |id: &str| {
        json!({"custom_id": id, "method": "POST", "url": "/v1/completions",
               "body": {"model": MODEL, "prompt": "Hello", "max_tokens": 3}})
        .to_string()
    };
    let bad = upload(&format!("{}\n{{\"custom_id\": \"x\"}}", line("a"))).await;
    let create = |file: &Value| {
        json!({"input_file_id": file["id"], "endpoint": "/v1/completions",
                                       "completion_window": "24h"})
    };
    let (status, body) = post(&base, "/v1/batches", create(&bad).to_string()).await;
    assert_envelope(status, &body, 400, Some("input_file_id"));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("line 2"),
        "{body}"
    );
    let good = upload(&format!("{}\n{}", line("a"), line("b"))).await;
    let (status, batch) = post(&base, "/v1/batches", create(&good).to_string()).await;
    assert_eq!(status, 200, "{batch}");
    let url = format!("{base}/v1/batches/{}", batch["id"].as_str().unwrap());
    let done: Value = osprey_testkit::eventually(
        || async {
            let batch: Value = client.get(&url).send().await.unwrap().json().await.unwrap();
            assert_ne!(batch["status"], "failed", "{batch}");
            (batch["status"] == "completed").then_some(batch)
        },
        std::time::Duration::from_secs(60),
    )
    .await;
    assert_eq!(done["request_counts"]["completed"], 2);
    let output_url = format!(
        "{base}/v1/files/{}/content",
        done["output_file_id"].as_str().unwrap()
    );
    let output = client
        .get(output_url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let answers: Vec<Value> = output
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 2);
    for (answer, id) in answers.iter().zip(["a", "b"]) {
        assert_eq!(answer["custom_id"], id);
        assert_eq!(answer["response"]["status_code"], 200);
        assert_eq!(answer["response"]["body"]["usage"]["completion_tokens"], 3);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn assert_envelope(status: u16, body: &Value, want_status: u16, want_param: Option<&str>) {
    assert_eq!(status, want_status, "{body}");
    let e = &body["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(e["type"].is_string(), "{body}");
    assert!(
        e.get("param").is_some() && e.get("code").is_some(),
        "{body}"
    );
    if let Some(p) = want_param {
        assert_eq!(e["param"], p, "{body}");
    }
}

#[tokio::test]
async fn perplexity_through_the_api_matches_llama_cpp() {
    let base = server().await;
    let case = &osprey_testkit::golden().perplexity;
    let (status, body) = post(
        &base,
        "/v1/completions",
        json!({"model": MODEL, "prompt": case.ids, "max_tokens": 0, "echo": true, "logprobs": 0})
            .to_string(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let lps = body["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(lps.len(), case.ids.len());
    assert!(lps[0].is_null());
    let nll: f64 = lps[1..].iter().map(|v| -v.as_f64().unwrap()).sum();
    let ppl = (nll / (lps.len() - 1) as f64).exp();
    eprintln!(
        "API perplexity {ppl:.4} vs llama.cpp {:.4}",
        case.perplexity
    );
    assert!(
        (ppl / case.perplexity - 1.0).abs() < 0.01,
        "perplexity {ppl} vs {}",
        case.perplexity
    );
    assert_eq!(body["usage"]["prompt_tokens"], case.ids.len());
    assert_eq!(body["usage"]["completion_tokens"], 0);
}

#[tokio::test]
async fn chat_usage_is_exact_and_streaming_matches() {
    let base = server().await;
    let req = json!({"model": MODEL, "messages": [{"role": "user", "content": "Write a haiku about rivers."}],
                     "max_tokens": 20, "temperature": 0, "ignore_eos": true, "some_unknown_field": {"x": 1}});
    let (status, body) = post(&base, "/v1/chat/completions", req.to_string()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(
        body["usage"]["completion_tokens"], 20,
        "ignore_eos generates exactly max_tokens"
    );
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    let engine = osprey_testkit::shared_engine();
    let rendered = engine
        .render_chat(&[osprey_engine::TemplateMessage {
            role: "user".into(),
            content: "Write a haiku about rivers.".into(),
        }])
        .unwrap();
    assert_eq!(
        body["usage"]["prompt_tokens"],
        engine.tokenizer().encode(&rendered, true).len()
    );

    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = post_stream(&base, "/v1/chat/completions", streamed).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .flat_map(|c| {
            c["choices"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|ch| ch["delta"]["content"].as_str())
        })
        .collect();
    assert_eq!(
        text,
        body["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 20);
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
}

#[tokio::test]
async fn stop_strings_end_the_text_and_never_leak() {
    let base = server().await;
    let prompt = "Count: one, two, three, four, five, six,";
    let req = json!({"model": MODEL, "prompt": prompt, "max_tokens": 30, "temperature": 0});
    let (_, free) = post(&base, "/v1/completions", req.to_string()).await;
    let full = free["choices"][0]["text"].as_str().unwrap().to_owned();
    // Stop on a piece of text the free run produced, starting after its first few characters.
    let stop: String = full.chars().skip(5).take(4).collect();
    let mut stopped = req.clone();
    stopped["stop"] = json!([stop]);
    let (status, body) = post(&base, "/v1/completions", stopped.to_string()).await;
    assert_eq!(status, 200);
    let text = body["choices"][0]["text"].as_str().unwrap();
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(
        full.starts_with(text) && !text.contains(&stop),
        "{text:?} / {stop:?} / {full:?}"
    );
    stopped["stream"] = json!(true);
    let events = post_stream(&base, "/v1/completions", stopped).await;
    let streamed: String = events
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(streamed, text);
}

#[tokio::test]
async fn bad_input_gets_a_clear_error_and_the_server_keeps_serving() {
    let base = server().await;
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("/v1/chat/completions", "{not json".into(), 400, Some("body")),
        ("/v1/chat/completions", json!({"model": MODEL}).to_string(), 400, None),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": "hi"}).to_string(), 400, Some("messages")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": []}).to_string(), 400, Some("messages")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}).to_string(), 400, Some("messages[0].role")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).to_string(), 400, Some("temperature")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_p": 0}).to_string(), 400, Some("top_p")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 0}).to_string(), 400, Some("n")),
        ("/v1/chat/completions", json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).to_string(), 404, Some("model")),
        ("/v1/completions", json!({"model": MODEL, "prompt": "x", "max_tokens": 100_000}).to_string(), 400, Some("max_tokens")),
        ("/v1/completions", json!({"model": MODEL, "prompt": "word ".repeat(9000)}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"model": MODEL, "prompt": [1, 2, 999_999]}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"model": MODEL, "prompt": []}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"model": MODEL, "prompt": "x", "logit_bias": {"abc": 1}}).to_string(), 400, Some("logit_bias")),
        ("/v1/completions", json!({"model": MODEL, "prompt": "x", "max_tokens": 0}).to_string(), 400, Some("max_tokens")),
        ("/v1/completions", format!("{{\"model\":\"{MODEL}\",\"prompt\":\"{}\"}}", "a".repeat(2 << 20)), 413, None),
        ("/v1/nothing-here", "{}".into(), 404, None),
    ];
    for (path, body, status, param) in cases {
        let (got, json) = post(&base, path, body.clone()).await;
        assert_envelope(got, &json, status, param);
        if status == 404 && path.contains("chat") {
            assert_eq!(json["error"]["code"], "model_not_found");
        }
    }
    // Invalid UTF-8 in the body.
    let (got, json) = post(
        &base,
        "/v1/completions",
        b"{\"model\":\"x\",\"prompt\":\"\xff\xfe\"}".to_vec(),
    )
    .await;
    assert_envelope(got, &json, 400, None);
    let (status, body) = post(
        &base,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "Still", "max_tokens": 2}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn models_health_ready_and_metrics() {
    let base = server().await;
    let client = reqwest::Client::new();
    let models: Value = client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(
        client
            .get(format!("{base}/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        client
            .get(format!("{base}/ready"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let one = client
        .get(format!("{base}/v1/models/{MODEL}"))
        .send()
        .await
        .unwrap();
    assert_eq!(one.status(), 200);
    let chat = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 200);
    assert_eq!(
        chat.headers()["x-osprey-model"],
        MODEL,
        "the model that served it"
    );
    let (status, _) = post(
        &base,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "Hi", "max_tokens": 3}).to_string(),
    )
    .await;
    assert_eq!(status, 200);
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "osprey_http_requests_total",
        "osprey_time_to_first_token_seconds_bucket",
        "osprey_time_per_output_token_seconds_bucket",
        "osprey_generation_tokens_total",
    ] {
        assert!(
            metrics.contains(name),
            "{name} missing from /metrics:\n{metrics}"
        );
    }
}

#[tokio::test]
async fn requests_wait_with_503_until_the_model_is_loaded() {
    let state = Services::serving(MODEL);
    let base = serve(state.clone()).await;
    let ready = reqwest::get(format!("{base}/ready")).await.unwrap();
    assert_eq!(ready.status(), 503);
    let (status, body) = post(
        &base,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "x"}).to_string(),
    )
    .await;
    assert_envelope(status, &body, 503, None);
    state.set_engine(osprey_testkit::shared_engine());
    assert_eq!(
        reqwest::get(format!("{base}/ready"))
            .await
            .unwrap()
            .status(),
        200
    );
}
