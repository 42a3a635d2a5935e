//! The semantic cache through the API, with the real model and the real embedder: for a tenant
//! that turns it on, a question meaning the same as one answered before gets that answer
//! (streamed too), a different one does not, nor does the same question under another system
//! prompt or for a tenant without the flag.

use osprey_gateway::{Services, Wiring};
use osprey_limits::RateLimiter;
use osprey_services::auth::Authenticator;
use osprey_services::cache::ResponseCache;
use osprey_services::config::EdgeConfig;
use osprey_services::edge::Edge;
use serde_json::{Value, json};

use crate::common;

const MODEL: &str = "smollm2-135m-instruct";

#[tokio::test]
async fn a_question_meaning_the_same_gets_the_kept_answer() {
    let store = osprey_store::testing::sqlite().await;
    let embedder = osprey_engine::Embedder::fetch_default().expect("the embedder loads");
    let asked = "What is the capital of Australia?";
    let (same, other) = (
        "Which city is the capital of Australia?",
        "What is the capital of Austria?",
    );
    let sim = |t: &str| {
        let e = |t: &str| embedder.embed(t).unwrap();
        osprey_engine::embedder::cosine(&e(asked), &e(t))
    };
    let (near, far) = (sim(same), sim(other));
    assert!(near > far, "{near} vs {far}");
    // A threshold between the two, so the test checks the cache, not the model's judgement.
    let threshold = (near + far) / 2.0;
    store
        .set_flag("acme", "cache.semantic", &threshold.to_string())
        .await
        .unwrap();
    let acme = common::new_key(&store, "acme").await;
    let globex = common::new_key(&store, "globex").await;
    let auth = Authenticator::new(store.store.clone()).await.unwrap();
    let edge = Edge::new(EdgeConfig::default(), auth, RateLimiter::local());
    let state = Services::new(Wiring {
        store: Some(store.store.clone()),
        response_cache: Some(ResponseCache::memory()),
        ..Wiring::new(Some(MODEL.into()), vec![], edge)
    });
    state.set_engine(osprey_testkit::shared_engine());
    let base = common::serve(state).await;

    let ask = async |key: &str, system: &str, question: &str, stream: bool| {
        let body = json!({"model": MODEL, "max_tokens": 8, "temperature": 0, "stream": stream,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]});
        let r = reqwest::Client::new()
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap();
        let header = |name: &str| (r.headers().get(name)).map(|v| v.to_str().unwrap().to_owned());
        let (cache, similarity) = (
            header("x-osprey-cache"),
            header("x-osprey-cache-similarity"),
        );
        (cache, similarity, r.text().await.unwrap())
    };
    let (cache, _, first) = ask(&acme, "Be brief.", asked, false).await;
    assert_eq!(cache.as_deref(), Some("miss"));
    let first: Value = serde_json::from_str(&first).unwrap();

    let (cache, similarity, hit) = ask(&acme, "Be brief.", same, false).await;
    assert_eq!(cache.as_deref(), Some("hit"));
    let similarity: f32 = similarity.expect("a similarity").parse().unwrap();
    assert!((similarity - near).abs() < 1e-3, "{similarity} vs {near}");
    let hit: Value = serde_json::from_str(&hit).unwrap();
    assert_eq!(hit["id"], first["id"], "the very answer kept");

    let (cache, _, sse) = ask(&acme, "Be brief.", same, true).await;
    assert_eq!(cache.as_deref(), Some("hit"));
    assert!(sse.contains(first["choices"][0]["message"]["content"].as_str().unwrap()));
    assert!(sse.trim_end().ends_with("data: [DONE]"));

    for (key, system, question, why) in [
        (
            &acme,
            "Be brief.",
            other,
            "a question meaning something else",
        ),
        (&acme, "Answer in French.", same, "another system prompt"),
        (&globex, "Be brief.", same, "a tenant without the flag"),
    ] {
        let (cache, similarity, _) = ask(key, system, question, false).await;
        assert_eq!(
            (cache.as_deref(), similarity),
            (Some("miss"), None),
            "{why}"
        );
    }
}
