//! The edge on one gateway, in front of a test upstream: keys, tenants, limits and their
//! headers, shaping, admission control, upstream streaming and errors.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use osprey_core::Priority;
use osprey_services::config::{AdmissionConfig, TenantConfig};
use osprey_store::NewKey;
use osprey_testkit::eventually;
use reqwest::Method;
use serde_json::{Value, json};

use crate::common::*;

#[tokio::test]
async fn keys_are_required_once_one_exists() {
    let (store, store_url) = store().await;
    let upstream = upstream().await;
    let setup = Setup {
        store_url,
        upstreams: vec![("mock".into(), upstream)],
        ..Setup::default()
    };
    let base = gateway(setup).await;
    // No keys yet: open, and the rate-limit headers are there all the same.
    let r = chat(&base, None, hello("mock")).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("x-ratelimit-remaining-requests"));

    let key = store.create_key(NewKey::for_tenant("acme")).await.unwrap();
    // Another process created it: the gateway notices within a second (the store's change
    // counter is polled), or at once when the key is used.
    eventually(
        || async { (chat(&base, None, hello("mock")).await.status() == 401).then_some(()) },
        Duration::from_secs(30),
    )
    .await;
    for (key, why) in [(None, "missing"), (Some("osk-not-a-key"), "wrong")] {
        let r = chat(&base, key, hello("mock")).await;
        assert_eq!(r.status(), 401, "{why} key");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_api_key");
        assert_eq!(body["error"]["type"], "authentication_error");
    }
    assert_eq!(
        chat(&base, Some(&key.secret), hello("mock")).await.status(),
        200
    );
    let via_api_key_header = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .header("api-key", &key.secret)
        .json(&hello("mock"))
        .send()
        .await
        .unwrap();
    assert_eq!(via_api_key_header.status(), 200);
    let models = reqwest::get(format!("{base}/v1/models")).await.unwrap();
    assert_eq!(models.status(), 401, "listing models needs a key too");

    store.revoke_key(&key.record.id).await.unwrap();
    // The store's change counter is polled each second.
    eventually(
        || async {
            let r = chat(&base, Some(&key.secret), hello("mock")).await;
            (r.status() == 401).then_some(())
        },
        Duration::from_secs(30),
    )
    .await;
}

#[tokio::test]
async fn limits_are_per_tenant_with_headers_on_200_and_429() {
    let (store, store_url) = store().await;
    let (a, b) = (unique("a"), unique("b"));
    let tenants = BTreeMap::from([
        (a.clone(), tenant(5, 100_000)),
        (b.clone(), tenant(5, 100_000)),
    ]);
    let setup = Setup {
        store_url,
        tenants,
        upstreams: vec![("mock".into(), upstream().await)],
        ..Setup::default()
    };
    let base = gateway(setup).await;
    let ka = new_key(&store, &a).await;
    let kb = new_key(&store, &b).await;
    for i in 0..5 {
        let r = chat(&base, Some(&ka), hello("mock")).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header_num(&r, "x-ratelimit-limit-requests"), 5);
        assert_eq!(header_num(&r, "x-ratelimit-remaining-requests"), 4 - i);
        assert!(header_num(&r, "x-ratelimit-remaining-tokens") < 100_000);
        assert!(r.headers().contains_key("x-ratelimit-reset-tokens"));
    }
    let refused = chat(&base, Some(&ka), hello("mock")).await;
    assert_eq!(refused.status(), 429);
    let retry: u64 = header_num(&refused, "retry-after");
    assert!((1..=12).contains(&retry), "one request per 12 s: {retry}");
    assert_eq!(header_num(&refused, "x-ratelimit-remaining-requests"), 0);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    // Tenant A's traffic took nothing from tenant B.
    let r = chat(&base, Some(&kb), hello("mock")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header_num(&r, "x-ratelimit-remaining-requests"), 4);
}

#[tokio::test]
async fn tokens_are_charged_up_front_and_corrected_to_usage() {
    let (store, store_url) = store().await;
    let t = unique("tok");
    let setup = Setup {
        store_url,
        tenants: BTreeMap::from([(t.clone(), tenant(1000, 2000))]),
        upstreams: vec![("mock".into(), upstream().await)],
        ..Setup::default()
    };
    let base = gateway(setup).await;
    let key = new_key(&store, &t).await;
    let mut body = hello("mock");
    body["max_tokens"] = json!(1500);
    let r = chat(&base, Some(&key), body.clone()).await;
    assert_eq!(r.status(), 200);
    let charged = 2000 - header_num(&r, "x-ratelimit-remaining-tokens");
    assert!(charged >= 1500, "prompt + max_tokens charged: {charged}");
    r.bytes().await.unwrap();
    // The upstream reported 10 tokens: the rest comes back once the response has ended. (Not
    // longer than 10 s: the bucket refills by itself at 2000 a minute, and 1400 of it would
    // have come back without any refund in ~40 s.)
    body["max_tokens"] = json!(1);
    eventually(
        || async {
            let r = chat(&base, Some(&key), body.clone()).await;
            let remaining = header_num(&r, "x-ratelimit-remaining-tokens");
            (remaining > 1900).then_some(())
        },
        Duration::from_secs(10),
    )
    .await;

    // A request that can never fit is refused, and says why.
    let mut huge = hello("mock");
    huge["max_tokens"] = json!(5000);
    let r = chat(&base, Some(&key), huge).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header_num(&r, "retry-after"), 60);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("too large")
    );
}

#[tokio::test]
async fn tenants_are_shaped_models_allowed_and_max_tokens_clamped() {
    let (store, store_url) = store().await;
    let t = unique("shaped");
    let shaped = TenantConfig {
        models: Some(vec!["mock".into()]),
        default_model: Some("mock".into()),
        max_tokens: Some(5),
        ..TenantConfig::default()
    };
    let setup = Setup {
        store_url,
        tenants: BTreeMap::from([(t.clone(), shaped)]),
        upstreams: vec![
            ("mock".into(), upstream().await),
            ("other".into(), upstream().await),
        ],
        ..Setup::default()
    };
    let base = gateway(setup).await;
    let key = new_key(&store, &t).await;
    let mut body = hello("mock");
    body["max_tokens"] = json!(500);
    let r: Value = chat(&base, Some(&key), body).await.json().await.unwrap();
    assert_eq!(
        r["choices"][0]["message"]["content"], "max_tokens=5",
        "clamped to the cap"
    );
    let mut unnamed = hello("mock");
    unnamed.as_object_mut().unwrap().remove("model");
    let r = chat(&base, Some(&key), unnamed).await;
    assert_eq!(r.status(), 200, "the tenant's default model");
    assert_eq!(r.headers()["x-osprey-model"], "mock");
    let r = chat(&base, Some(&key), hello("other")).await;
    assert_eq!(r.status(), 403);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "model_not_allowed");
    let r = chat(&base, Some(&key), hello("nonexistent")).await;
    assert_eq!(
        r.status(),
        403,
        "a model outside the list is refused before lookup"
    );
    let oversized = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(&key)
        .body(vec![b' '; 5 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(oversized.status(), 413);
}

/// An upstream that counts the requests that reached it and answers them only once released:
/// its base URL, the count, and the release.
async fn held_upstream() -> (String, Arc<AtomicUsize>, tokio::sync::watch::Sender<bool>) {
    let arrived = Arc::new(AtomicUsize::new(0));
    let (release, released) = tokio::sync::watch::channel(false);
    let counter = arrived.clone();
    let chat = move || {
        let (counter, mut released) = (counter.clone(), released.clone());
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = released.wait_for(|&r| r).await;
            axum::Json(json!({"object": "chat.completion", "model": "held",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "done"}}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}}))
        }
    };
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(chat));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, arrived, release)
}

#[tokio::test]
async fn batch_work_is_shed_first_when_hot() {
    let (_, store_url) = store().await;
    let (held_url, arrived, release) = held_upstream().await;
    let setup = Setup {
        store_url,
        admission: AdmissionConfig {
            max_in_flight: 4,
            max_queued_tokens: 1_000_000,
            batch_share: 0.5,
        },
        upstreams: vec![("held".into(), held_url), ("mock".into(), upstream().await)],
        ..Setup::default()
    };
    let base = gateway(setup).await;
    let with_priority = |model: &str, p: Priority| {
        let mut b = hello(model);
        b["osprey"] = json!({"priority": p});
        b
    };
    // Two batch requests, held at the upstream until released, fill the batch share.
    let held: Vec<_> = (0..2)
        .map(|_| {
            let (base, body) = (base.clone(), with_priority("held", Priority::Batch));
            tokio::spawn(async move { chat(&base, None, body).await.status() })
        })
        .collect();
    eventually(
        || async { (arrived.load(Ordering::SeqCst) == 2).then_some(()) },
        Duration::from_secs(30),
    )
    .await;
    let shed = chat(&base, None, with_priority("mock", Priority::Batch)).await;
    assert_eq!(shed.status(), 503);
    assert_eq!(header_num(&shed, "retry-after"), 1);
    let e: Value = shed.json().await.unwrap();
    assert_eq!(e["error"]["code"], "server_overloaded");
    // Interactive work still gets in.
    let r = chat(&base, None, with_priority("mock", Priority::Interactive)).await;
    assert_eq!(r.status(), 200);
    release.send(true).unwrap();
    for h in held {
        assert_eq!(h.await.unwrap(), 200);
    }
}

#[tokio::test]
async fn upstreams_stream_every_token_and_fail_clearly() {
    let (_, store_url) = store().await;
    let setup = Setup {
        store_url,
        upstreams: vec![
            ("mock".into(), upstream().await),
            ("broken".into(), upstream().await),
            ("gone".into(), "http://127.0.0.1:9/v1".into()),
        ],
        ..Setup::default()
    };
    let base = gateway(setup).await;
    let mut body = hello("mock");
    body["stream"] = json!(true);
    let r = chat(&base, None, body).await;
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = r.text().await.unwrap();
    let content = streamed_content(&text);
    let expected: String = (0..STREAM_CHUNKS).map(|i| format!("t{i} ")).collect();
    assert_eq!(content, expected, "every token, in order");
    assert!(text.trim_end().ends_with("data: [DONE]"));

    let r = chat(&base, None, hello("broken")).await;
    assert_eq!(r.status(), 502);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "upstream_error");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("engine crashed")
    );
    let r = chat(&base, None, hello("gone")).await;
    assert_eq!(r.status(), 502);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "upstream_unavailable");
    let r = chat(&base, None, hello("nonexistent")).await;
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn the_admin_api_needs_the_admin_key() {
    let (_, store_url) = store().await;
    let setup = Setup {
        store_url,
        admin_key: Some("admin-secret".into()),
        upstreams: vec![("mock".into(), upstream().await)],
        ..Setup::default()
    };
    let base = gateway(setup).await;
    let key = json!({"tenant": "acme", "name": "ci", "rpm": 2});
    let create = |admin_key| {
        admin(
            &base,
            admin_key,
            Method::POST,
            "/admin/keys",
            Some(key.clone()),
        )
    };
    assert_eq!(create("wrong").await.status(), 401);
    let created: Value = create("admin-secret").await.json().await.unwrap();
    let secret = created["key"].as_str().unwrap().to_owned();
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["rpm"], 2);
    let r = chat(&base, Some(&secret), hello("mock")).await;
    assert_eq!(
        header_num(&r, "x-ratelimit-limit-requests"),
        2,
        "the key's own limit"
    );
    let list: Value = admin(&base, "admin-secret", Method::GET, "/admin/keys", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(list["data"][0]["id"], id);
    assert!(
        list["data"][0].get("key").is_none(),
        "secrets are never listed"
    );
    let path = format!("/admin/keys/{id}");
    let revoked = admin(&base, "admin-secret", Method::DELETE, &path, None).await;
    assert_eq!(revoked.status(), 200);
    assert_eq!(
        chat(&base, Some(&secret), hello("mock")).await.status(),
        401
    );
}

#[tokio::test]
async fn a_stopping_gateway_finishes_the_answer_in_flight_and_logs_it() {
    use osprey_router::upstream::{Upstream, http_client};
    use tokio::sync::{Notify, mpsc, oneshot};

    // An upstream that says when a request arrived and answers when released.
    let (arrived_tx, mut arrived) = mpsc::channel::<()>(1);
    let release = Arc::new(Notify::new());
    let held = release.clone();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let (arrived_tx, held) = (arrived_tx.clone(), held.clone());
            async move {
                let _ = arrived_tx.send(()).await;
                held.notified().await;
                axum::Json(json!({"object": "chat.completion", "model": "held",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "done"}}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let (store, _) = store().await;
    let key = new_key(&store, "acme").await;
    let config = osprey_services::config::UpstreamConfig {
        url: upstream_url,
        api_key_env: None,
        model: None,
        timeout_secs: Some(30.0),
        max_retries: None,
        fallbacks: None,
    };
    let held = Upstream::new("held", &config, http_client()).unwrap();
    let auth = osprey_services::auth::Authenticator::new(store.clone())
        .await
        .unwrap();
    let edge = osprey_services::edge::Edge::new(
        osprey_services::config::EdgeConfig::default(),
        auth,
        osprey_limits::RateLimiter::local(),
    );
    let state = osprey_gateway::Services::new(osprey_gateway::Wiring {
        store: Some(store.clone()),
        ..osprey_gateway::Wiring::new(None, vec![held], edge)
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let http = osprey_gateway::HttpConfig::default();
        let stopped = async {
            let _ = stopped.await;
        };
        osprey_gateway::serve(listener, state, &http, stopped).await
    });

    let answer = tokio::spawn(async move { chat(&base, Some(&key), hello("held")).await });
    arrived.recv().await.unwrap();
    stop.send(()).unwrap();
    release.notify_one();
    let answer = answer.await.unwrap();
    assert_eq!(answer.status(), 200);
    let id = answer.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        answer.json::<Value>().await.unwrap()["choices"][0]["message"]["content"],
        "done"
    );
    server.await.unwrap().unwrap();

    // Once `serve` has returned, the row is in the store: nothing waits in the writer.
    let query = osprey_store::RequestLogQuery {
        limit: 10,
        ..Default::default()
    };
    let rows = store.request_log(&query).await.unwrap();
    let ids: Vec<_> = rows.iter().map(|r| (r.id.as_str(), r.status)).collect();
    assert_eq!(ids, [(id.as_str(), 200)]);
}

/// An upstream that keeps the bytes of every request body it is sent, and answers each.
async fn recording_upstream() -> (String, Arc<std::sync::Mutex<Vec<axum::body::Bytes>>>) {
    let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = bodies.clone();
    let chat = move |body: axum::body::Bytes| async move {
        kept.lock().unwrap().push(body);
        axum::Json(json!({
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }))
    };
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(chat));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), bodies)
}

#[tokio::test]
async fn a_body_reaches_the_upstream_as_it_came_unless_the_edge_changed_it() {
    let (store, store_url) = store().await;
    let (upstream, bodies) = recording_upstream().await;
    let shaped = unique("shaped");
    let config = TenantConfig {
        default_model: Some("mock".into()),
        max_tokens: Some(16),
        ..tenant(1_000, 1_000_000)
    };
    let setup = Setup {
        store_url,
        upstreams: vec![("mock".into(), upstream)],
        tenants: BTreeMap::from([(shaped.clone(), config)]),
        ..Setup::default()
    };
    let base = gateway(setup).await;
    let post = |body: &'static str, key: Option<String>| {
        let mut req = reqwest::Client::new()
            .post(format!("{base}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body);
        if let Some(key) = key {
            req = req.bearer_auth(key);
        }
        req.send()
    };
    // Spacing, key order and a field Osprey does not know: all passed on as they came.
    let raw = "{ \"messages\" : [{\"role\":\"user\", \"content\":\"hi\"}],\n \"model\":\"mock\",\
               \"vendor_extension\": {\"x\": [1, 2.50]} }";
    assert_eq!(post(raw, None).await.unwrap().status(), 200);
    assert_eq!(bodies.lock().unwrap()[0], raw.as_bytes());

    // The tenant's default model and its max_tokens cap: the body is written anew, with both,
    // and keeps what Osprey does not know.
    let key = new_key(&store, &shaped).await;
    let asked = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 500,
                    "vendor_extension": {"x": [1, 2.5]}}"#;
    assert_eq!(post(asked, Some(key)).await.unwrap().status(), 200);
    let sent: Value = serde_json::from_slice(&bodies.lock().unwrap()[1]).unwrap();
    assert_eq!(sent["model"], "mock");
    assert_eq!(sent["max_tokens"], 16);
    assert_eq!(sent["vendor_extension"], json!({"x": [1, 2.5]}));
}
