//! Upstream failures: a request the upstream fails before answering is retried within the
//! retry budget, and an upstream that keeps failing has its circuit breaker opened, so it is
//! refused at once instead of being hit with every request and every retry. The metrics it
//! reads are the process's: they are labelled with a model name of the test's own, or read as
//! the change the test made.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Json;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{Value, json};

use crate::common::*;

/// What an upstream received: how many requests, and their `x-request-id`s.
#[derive(Default)]
struct Seen {
    count: AtomicUsize,
    request_ids: std::sync::Mutex<Vec<String>>,
}

/// An upstream that answers 503 to its first `fail_first` requests, then succeeds; returns its
/// base URL and what it received.
async fn flaky_upstream(fail_first: usize) -> (String, Arc<Seen>) {
    scripted_upstream(move |n| n < fail_first).await
}

/// An upstream that answers its `n`th request (from 0) with 503 when `fails(n)`, else with a
/// completion; returns its base URL and what it received.
async fn scripted_upstream(
    fails: impl Fn(usize) -> bool + Clone + Send + Sync + 'static,
) -> (String, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let counter = seen.clone();
    let chat = move |headers: axum::http::HeaderMap| {
        let counter = counter.clone();
        let fails = fails.clone();
        async move {
            let id = headers.get("x-request-id").and_then(|v| v.to_str().ok());
            (counter.request_ids.lock().unwrap()).push(id.unwrap_or_default().to_owned());
            if fails(counter.count.fetch_add(1, Ordering::SeqCst)) {
                let e = json!({"error": {"message": "overloaded", "type": "server_error"}});
                return (StatusCode::SERVICE_UNAVAILABLE, Json(e)).into_response();
            }
            Json(json!({
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
            }))
            .into_response()
        }
    };
    let app = axum::Router::new().route("/v1/chat/completions", post(chat));
    (serve_upstream(app).await, seen)
}

async fn gateway_for(model: &str, url: String) -> String {
    let (_, store_url) = store().await;
    gateway(Setup {
        store_url,
        upstreams: vec![(model.into(), url)],
        ..Setup::default()
    })
    .await
}

async fn error_code(r: reqwest::Response) -> (u16, String) {
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    (
        status,
        body["error"]["code"].as_str().unwrap_or("").to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_before_the_answer_is_retried() {
    let (url, seen) = flaky_upstream(1).await;
    let model = unique("flaky");
    let base = gateway_for(&model, url).await;
    let r = chat(&base, None, hello(&model)).await;
    assert_eq!(r.status(), 200, "the retry succeeded");
    assert_eq!(
        seen.count.load(Ordering::SeqCst),
        2,
        "one failure, one retry"
    );
    let ids = seen.request_ids.lock().unwrap().clone();
    assert!(
        !ids[0].is_empty() && ids[0] == ids[1],
        "a retry is the same request: {ids:?}"
    );
    assert_eq!(r.headers()["x-request-id"].to_str().unwrap(), ids[0]);
    let retries = format!("osprey_upstream_retries_total{{model=\"{model}\"}}");
    assert_eq!(metric(&base, &retries).await, Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_upstream_gets_a_budget_of_retries_then_an_open_breaker() {
    let (url, seen) = flaky_upstream(usize::MAX).await;
    let model = unique("down");
    let base = gateway_for(&model, url).await;
    let mut outcomes = Vec::new();
    for _ in 0..30 {
        outcomes.push(error_code(chat(&base, None, hello(&model)).await).await);
    }
    // The first requests reach the upstream (502, its failure passed on); once five fail in
    // a row the breaker opens and the rest are refused here (503) without reaching it.
    assert_eq!(outcomes[0], (502, "upstream_error".to_owned()));
    let open = outcomes
        .iter()
        .position(|o| o.1 == "upstream_circuit_open")
        .expect("the breaker opened");
    assert!(
        outcomes[open..]
            .iter()
            .all(|o| *o == (503, "upstream_circuit_open".to_owned()))
    );
    // Without a budget 30 requests with 2 retries each would have been 90 attempts.
    let attempts = seen.count.load(Ordering::SeqCst);
    assert_eq!(
        attempts, 5,
        "the breaker's threshold, retries included: {outcomes:?}"
    );
    let refused = format!("osprey_upstream_retries_refused_total{{model=\"{model}\"}}");
    assert!(
        metric(&base, &refused).await.unwrap_or(0.0) >= 1.0,
        "the budget ran out"
    );
    let state = format!("osprey_upstream_breaker_state{{model=\"{model}\"}}");
    assert_eq!(metric(&base, &state).await, Some(2.0), "open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_model_falls_back_in_order_and_says_so() {
    use osprey_limits::RateLimiter;
    use osprey_router::upstream::{Upstream, check_fallbacks, http_client};
    use osprey_services::auth::Authenticator;
    use osprey_services::config::{EdgeConfig, UpstreamConfig};
    use osprey_services::edge::Edge;

    let (down, down_seen) = flaky_upstream(usize::MAX).await;
    let (up, up_seen) = flaky_upstream(0).await;
    let model = |url: &str, fallbacks: &[&str]| UpstreamConfig {
        url: url.to_owned(),
        api_key_env: None,
        model: None,
        timeout_secs: Some(5.0),
        max_retries: Some(0),
        fallbacks: Some(fallbacks.iter().map(|f| f.to_string()).collect()),
    };
    let upstreams = vec![
        Upstream::new("large", &model(&down, &["medium", "small"]), http_client()).unwrap(),
        Upstream::new("medium", &model(&down, &[]), http_client()).unwrap(),
        Upstream::new("small", &model(&up, &[]), http_client()).unwrap(),
    ];
    check_fallbacks(&upstreams, None::<&str>).unwrap();
    let (store, _) = store().await;
    let auth = Authenticator::new(store).await.unwrap();
    let edge = Edge::new(EdgeConfig::default(), auth, RateLimiter::local());
    let base = serve(osprey_gateway::Services::new(osprey_gateway::Wiring::new(
        None, upstreams, edge,
    )))
    .await;

    let r = chat(&base, None, hello("large")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-osprey-model"], "small");
    assert_eq!(
        r.headers()["x-osprey-route-reason"],
        "fallback from large: upstream_error"
    );
    // large and medium each failed once (no retries configured); small answered.
    assert_eq!(down_seen.count.load(Ordering::SeqCst), 2);
    assert_eq!(up_seen.count.load(Ordering::SeqCst), 1);
    // A model without fallbacks fails as it is.
    let (status, code) = error_code(chat(&base, None, hello("medium")).await).await;
    assert_eq!((status, code.as_str()), (502, "upstream_error"));
    // A healthy model is served by itself, and says so.
    let r = chat(&base, None, hello("small")).await;
    assert_eq!(r.headers()["x-osprey-model"], "small");
    assert!(r.headers().get("x-osprey-route-reason").is_none());
}

/// The last step of a fallback chain: when the backend fails, a request answered before is
/// given that answer again (and says so); one never answered gets the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_answered_before_gets_that_answer() {
    let (url, seen) = scripted_upstream(|n| n >= 1).await;
    let base = gateway_for("fading", url).await;
    // The counter is the process's: what this test adds to it.
    let served = r#"osprey_cached_answers_served_total{why="fallback"}"#;
    let served_before = metric(&base, served).await.unwrap_or(0.0);
    let first = chat(&base, None, hello("fading")).await;
    assert_eq!(first.status(), 200);
    assert!(first.headers().get("x-osprey-cache").is_none());
    let first: Value = first.json().await.unwrap();
    let again = chat(&base, None, hello("fading")).await;
    assert_eq!(again.status(), 200, "served from the recent answers");
    assert_eq!(again.headers()["x-osprey-cache"], "hit");
    assert_eq!(
        again.headers()["x-osprey-route-reason"],
        "cached answer: upstream_error"
    );
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    let mut other = hello("fading");
    other["messages"][0]["content"] = "Something else".into();
    let r = chat(&base, None, other).await;
    assert!(r.headers().get("x-osprey-cache").is_none());
    let (status, code) = error_code(r).await;
    // Its own failure, or the breaker the failures before it opened.
    assert!(status >= 502, "{status} {code}");
    assert!(code.starts_with("upstream_"), "{code}");
    assert!(seen.count.load(Ordering::SeqCst) >= 2);
    let served_now = metric(&base, served).await.unwrap_or(0.0);
    assert_eq!(served_now - served_before, 1.0);
}

#[test]
fn a_fallback_must_be_another_served_model() {
    use osprey_router::upstream::{Upstream, check_fallbacks, http_client};
    use osprey_services::config::UpstreamConfig;
    let config = |fallbacks: &[&str]| UpstreamConfig {
        url: "http://127.0.0.1:1/v1".into(),
        api_key_env: None,
        model: None,
        timeout_secs: None,
        max_retries: None,
        fallbacks: Some(fallbacks.iter().map(|f| f.to_string()).collect()),
    };
    let a = Upstream::new("a", &config(&["nope"]), http_client()).unwrap();
    assert!(
        check_fallbacks(std::slice::from_ref(&a), Some("nope")).is_ok(),
        "the local model"
    );
    let err = check_fallbacks(&[a], None::<&str>).unwrap_err();
    assert_eq!(err.0, "a");
    assert!(err.1.contains("fallback `nope`"), "{}", err.1);
    let a = Upstream::new("a", &config(&["a"]), http_client()).unwrap();
    assert!(check_fallbacks(&[a], Some("a")).is_err(), "not itself");
}

/// An upstream answering 200 with a body that is not JSON: a plain answer and a stream.
async fn garbage_upstream() -> String {
    let chat = |body: Json<Value>| async move {
        if body["stream"] == true {
            let events = "data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"Hel\"}}]}\n\ndata: {not json\n\ndata: [DONE]\n\n";
            ([("content-type", "text/event-stream")], events).into_response()
        } else {
            (
                [("content-type", "application/json")],
                "{\"choices\": [{\"message\": ",
            )
                .into_response()
        }
    };
    let app = axum::Router::new().route("/v1/chat/completions", post(chat));
    serve_upstream(app).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_answering_garbage_gets_the_client_a_clean_error() {
    let base = gateway_for("junk", garbage_upstream().await).await;
    let client = reqwest::Client::new();
    let ask = |stream: bool| {
        client
            .post(format!("{base}/v1/chat/completions"))
            .json(&json!({"model": "junk", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    let (status, code) = error_code(ask(false).await.unwrap()).await;
    assert_eq!((status, code.as_str()), (502, "upstream_invalid_response"));
    let events = ask(true).await.unwrap().text().await.unwrap();
    let datas: Vec<&str> = (events.lines())
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert!(
        datas.iter().any(|d| d.contains("Hel")),
        "the good event goes through: {events}"
    );
    let last: Value = serde_json::from_str(datas.last().unwrap()).unwrap();
    assert_eq!(
        last["error"]["code"], "upstream_invalid_response",
        "the stream ends with an error event in the envelope: {events}"
    );
    assert!(
        !events.contains("{not json"),
        "the garbage is not relayed: {events}"
    );
}

/// A reasoning model's upstream (vLLM's `reasoning_content`): its deltas' own fields.
async fn reasoning_upstream() -> String {
    let chat = |body: Json<Value>| async move {
        if body["stream"] == true {
            assert!(body.get("stream_options").is_none(), "sent as it came");
            let chunks = [
                json!({"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "6 times 7"}}]}),
                json!({"choices": [{"index": 0, "delta": {"content": "42"}, "finish_reason": "stop"}]}),
                json!({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}),
            ];
            let events: String = (chunks.iter().map(|c| format!("data: {c}\n\n")))
                .chain(["data: [DONE]\n\n".to_owned()])
                .collect();
            return ([("content-type", "text/event-stream")], events).into_response();
        }
        Json(
            json!({"id": "up-1", "object": "chat.completion", "created": 1, "model": "r",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "42",
                "reasoning_content": "6 times 7"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}),
        )
        .into_response()
    };
    let app = axum::Router::new().route("/v1/chat/completions", post(chat));
    serve_upstream(app).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstreams_answer_is_read_once_and_keeps_the_fields_osprey_does_not_know() {
    let base = gateway_for("thinker", reasoning_upstream().await).await;
    let client = reqwest::Client::new();
    let ask = |stream: bool| {
        client
            .post(format!("{base}/v1/chat/completions"))
            .json(&json!({"model": "thinker", "stream": stream,
                "messages": [{"role": "user", "content": "6 x 7?"}]}))
            .send()
    };
    let r = ask(false).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-osprey-model"], "thinker");
    let answer: Value = r.json().await.unwrap();
    let message = &answer["choices"][0]["message"];
    assert_eq!(
        (
            message["content"].as_str(),
            message["reasoning_content"].as_str()
        ),
        (Some("42"), Some("6 times 7"))
    );
    assert_eq!(answer["usage"]["total_tokens"], 9);
    assert_eq!(answer["model"], "thinker", "named as served here");

    let events = ask(true).await.unwrap().text().await.unwrap();
    let chunks: Vec<Value> = (events.lines())
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let thought: Vec<_> = (chunks.iter())
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str())
        .collect();
    assert_eq!(thought, ["6 times 7"]);
    assert!(events.ends_with("data: [DONE]\n\n"), "{events}");
    assert!(
        chunks
            .iter()
            .all(|c| c.get("usage").is_none_or(Value::is_null)),
        "usage only when the client asks for it: {events}"
    );
}
