//! The exact response cache on the real model: a deterministic request is answered once and
//! then from the cache, streamed or not; a sampled one never is; and with Redis, a second
//! gateway answers from what the first one kept.

use osprey_gateway::{Services, Wiring};
use osprey_services::cache::ResponseCache;
use osprey_store::SharedRedis;
use serde_json::{Value, json};

use crate::common;

const MODEL: &str = "smollm2-135m-instruct";

async fn gateway(cache: ResponseCache) -> String {
    let state = Services::new(Wiring {
        response_cache: Some(cache),
        ..Wiring::serving(MODEL)
    });
    state.set_engine(osprey_testkit::shared_engine());
    common::serve(state).await
}

/// The cache header and the body (JSON, or the SSE text).
async fn ask(base: &str, body: &Value) -> (Option<String>, String) {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["x-osprey-model"],
        MODEL,
        "hit or miss, the model is named"
    );
    let cache = (r.headers().get("x-osprey-cache")).map(|v| v.to_str().unwrap().to_owned());
    (cache, r.text().await.unwrap())
}

fn question(text: &str, extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "max_tokens": 12, "temperature": 0,
                          "messages": [{"role": "user", "content": text}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The text of an answer, streamed or not.
fn text(body: &str) -> String {
    match serde_json::from_str::<Value>(body) {
        Ok(v) => v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned(),
        Err(_) => (body.lines())
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|v| {
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect(),
    }
}

#[tokio::test]
async fn a_deterministic_answer_is_generated_once() {
    let base = gateway(ResponseCache::memory()).await;
    let q = question("Name a colour.", json!({}));
    let (first, answer) = ask(&base, &q).await;
    assert_eq!(first.as_deref(), Some("miss"));
    let (again, same) = ask(&base, &q).await;
    assert_eq!(again.as_deref(), Some("hit"));
    let json = |s: &str| serde_json::from_str::<Value>(s).unwrap();
    assert_eq!(json(&same), json(&answer), "the very answer, id and all");

    // Streamed, it is replayed as a stream, with the usage it asked for.
    let streamed = question(
        "Name a colour.",
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let (hit, sse) = ask(&base, &streamed).await;
    assert_eq!(hit.as_deref(), Some("hit"));
    assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");
    assert_eq!(text(&sse), text(&answer));
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert!(
        sse.contains(&format!(
            "\"completion_tokens\":{}",
            answer["usage"]["completion_tokens"]
        )),
        "{sse}"
    );

    // A streamed miss is kept too, and answers the same request unstreamed.
    let (miss, sse) = ask(
        &base,
        &question(
            "Name a fruit.",
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    assert_eq!(miss.as_deref(), Some("miss"));
    let (hit, json) = ask(&base, &question("Name a fruit.", json!({}))).await;
    assert_eq!(hit.as_deref(), Some("hit"));
    assert_eq!(text(&json), text(&sse));

    // Sampled requests are not cached; other settings are another question.
    let (none, _) = ask(
        &base,
        &question("Name a colour.", json!({"temperature": 0.9})),
    )
    .await;
    assert_eq!(none, None);
    let (other, _) = ask(&base, &question("Name a colour.", json!({"max_tokens": 5}))).await;
    assert_eq!(other.as_deref(), Some("miss"));

    // A request that asks for a fresh answer is neither served from the cache nor kept.
    let fresh = question("Name a colour.", json!({"osprey": {"cache": false}}));
    let (skipped, again) = ask(&base, &fresh).await;
    assert_eq!(skipped, None);
    assert_eq!(text(&again), text(&serde_json::to_string(&answer).unwrap()));
    let (still, _) = ask(
        &base,
        &question("Name a sport.", json!({"osprey": {"cache": false}})),
    )
    .await;
    assert_eq!(still, None);
    let (never_kept, _) = ask(&base, &question("Name a sport.", json!({}))).await;
    assert_eq!(never_kept.as_deref(), Some("miss"));
}

#[tokio::test]
async fn replicas_share_the_cache_through_redis() {
    let Some(url) = common::redis_url("replicas_share_the_cache_through_redis") else {
        return;
    };
    let a = gateway(ResponseCache::redis(SharedRedis::open(&url).unwrap())).await;
    let b = gateway(ResponseCache::redis(SharedRedis::open(&url).unwrap())).await;
    // A question no earlier run asked.
    let q = question(
        &format!("Spell the word {}.", common::unique("w")),
        json!({}),
    );
    let (first, answer) = ask(&a, &q).await;
    assert_eq!(first.as_deref(), Some("miss"));
    let (other, same) = ask(&b, &q).await;
    assert_eq!(other.as_deref(), Some("hit"), "the other replica sees it");
    let json = |s: &str| serde_json::from_str::<Value>(s).unwrap();
    assert_eq!(json(&same), json(&answer));
}
