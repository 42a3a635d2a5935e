//! Secrets and bounds: no key (a tenant's, a wrong one, the admin's, an upstream's) reaches a
//! log or trace field, and request bodies and headers are bounded. Tenant isolation, surface by
//! surface, is `isolation.rs`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use osprey_gateway::{HttpConfig, Services, Wiring};
use osprey_limits::RateLimiter;
use osprey_router::upstream::{Upstream, http_client};
use osprey_services::auth::Authenticator;
use osprey_services::config::{EdgeConfig, UpstreamConfig};
use osprey_services::edge::Edge;
use reqwest::Method;
use serde_json::{Value, json};

use crate::common;

const MODEL: &str = "smollm2-135m-instruct";
const ADMIN: &str = "admin-secret-of-the-operator";
const ACME: &str = "acme";

/// The variable the upstream's key is read from (`api_key_env`), set only for the child process
/// [`secrets_never_reach_the_logs`] runs.
const UPSTREAM_KEY_VAR: &str = "OSPREY_ISOLATION_UPSTREAM_KEY";

#[test]
fn secrets_never_reach_the_logs() {
    // The variable is set from the process's start, in a process whose tracing is ours alone.
    let secret = format!("sk-upstream-{:032x}", rand::random::<u128>());
    let said = common::run_alone(
        "secrets::logged_requests_carry_no_secret",
        &[(UPSTREAM_KEY_VAR, &secret)],
    );
    assert!(!said.contains(&secret), "{said}");
}

/// Every span and event field, at every level, as text.
#[derive(Clone, Default)]
struct Recorder {
    text: Arc<Mutex<String>>,
    next_id: Arc<std::sync::atomic::AtomicU64>,
}

struct Fields<'a>(&'a Mutex<String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        let mut text = self.0.lock().unwrap();
        text.push_str(&format!("{}={value}\n", field.name()));
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let mut text = self.0.lock().unwrap();
        text.push_str(&format!("{}={value:?}\n", field.name()));
    }
}

impl tracing::Subscriber for Recorder {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }

    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        self.text.lock().unwrap().push_str(span.metadata().name());
        span.record(&mut Fields(&self.text));
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::span::Id::from_u64(id + 1)
    }

    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        values.record(&mut Fields(&self.text));
    }

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        event.record(&mut Fields(&self.text));
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// An upstream answering every chat, keeping the `Authorization` headers it was sent.
async fn recording_upstream() -> (String, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    let chat = move |headers: axum::http::HeaderMap| {
        let auth = headers
            .get("authorization")
            .map(|v| v.to_str().unwrap().to_owned());
        kept.lock().unwrap().extend(auth);
        std::future::ready(axum::Json(
            json!({"object": "chat.completion", "model": "up",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
        ))
    };
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(chat));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), seen)
}

#[tokio::test]
#[ignore = "run by secrets_never_reach_the_logs, in a process of its own"]
async fn logged_requests_carry_no_secret() {
    if !common::alone("secrets::logged_requests_carry_no_secret") {
        return;
    }
    let upstream_secret = std::env::var(UPSTREAM_KEY_VAR).unwrap();
    let recorder = Recorder::default();
    tracing::subscriber::set_global_default(recorder.clone()).unwrap();
    let store = osprey_store::testing::sqlite().await;
    let key = common::new_key(&store, ACME).await;
    let (url, seen) = recording_upstream().await;
    let config = UpstreamConfig {
        url,
        api_key_env: Some(UPSTREAM_KEY_VAR.into()),
        model: None,
        timeout_secs: Some(5.0),
        max_retries: None,
        fallbacks: None,
    };
    let upstream = Upstream::new("up", &config, http_client()).unwrap();
    let gone = UpstreamConfig {
        url: "http://127.0.0.1:9/v1".into(),
        ..config
    };
    let gone = Upstream::new("gone", &gone, http_client()).unwrap();
    let auth = Authenticator::new(store.store.clone()).await.unwrap();
    auth.spawn_refresh_task(); // writes keys' last use, as `osprey serve` does
    let edge_config = EdgeConfig {
        admin_key: Some(ADMIN.into()),
        ..EdgeConfig::default()
    };
    let edge = Edge::new(edge_config, auth, RateLimiter::local());
    let state = Services::new(Wiring {
        store: Some(store.store.clone()),
        ..Wiring::new(None, vec![upstream, gone], edge)
    });
    let base = common::serve(state).await;

    let r = common::chat(&base, Some(&key), common::hello("up")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        *seen.lock().unwrap(),
        [format!("Bearer {upstream_secret}")],
        "the key went upstream"
    );
    let r = common::chat(&base, Some(&key), common::hello("gone")).await;
    assert_eq!(r.status(), 502);
    let wrong = format!("osk-{}", "0f".repeat(32));
    assert_eq!(
        common::chat(&base, Some(&wrong), common::hello("up"))
            .await
            .status(),
        401
    );
    let r = common::admin(&base, &key, Method::GET, "/admin/requests", None).await;
    assert_eq!(r.status(), 401);
    let r = common::admin(&base, ADMIN, Method::GET, "/admin/keys", None).await;
    assert_eq!(r.status(), 200);
    // What is written in the background is logged too: the key's last use, the request log.
    let hash = osprey_store::keys::hash_secret(&key);
    osprey_testkit::eventually(
        || async {
            let keys = store.list_keys().await.unwrap();
            let used = keys
                .iter()
                .any(|k| k.hash == hash && k.last_used_at.is_some());
            let query = osprey_store::RequestLogQuery {
                limit: 10,
                ..Default::default()
            };
            let rows = store.request_log(&query).await.unwrap();
            (used && rows.len() >= 2).then_some(())
        },
        Duration::from_secs(30),
    )
    .await;

    let logged = recorder.text.lock().unwrap().clone();
    assert!(
        logged.contains("/v1/chat/completions"),
        "requests were traced: {logged}"
    );
    assert!(
        logged.contains("Incorrect API key provided"),
        "rejections were logged: {logged}"
    );
    for (what, secret) in [
        ("the tenant's key", key.as_str()),
        ("a wrong key", wrong.as_str()),
        ("the admin key", ADMIN),
        ("the upstream's key", upstream_secret.as_str()),
    ] {
        assert!(!logged.contains(secret), "{what} was logged");
    }
}

/// Serves a gateway taking bodies of at most 64 KiB; its base URL and a tenant key.
async fn bounded() -> (String, String) {
    let store = osprey_store::testing::sqlite().await;
    let key = common::new_key(&store, ACME).await;
    let auth = Authenticator::new(store.store.clone()).await.unwrap();
    let edge = Edge::new(EdgeConfig::default(), auth, RateLimiter::local());
    let state = Services::new(Wiring {
        store: Some(store.store.clone()),
        ..Wiring::new(Some(MODEL.into()), vec![], edge)
    });
    state.set_engine(osprey_testkit::shared_engine());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let http = HttpConfig {
        max_body_bytes: 64 << 10,
        ..HttpConfig::default()
    };
    tokio::spawn(async move {
        osprey_gateway::serve(listener, state, &http, std::future::pending()).await
    });
    (format!("http://{addr}"), key)
}

/// The status line of the answer to `head` sent raw (the server may stop reading early).
async fn raw_status(base: &str, head: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stream = tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .unwrap();
    let (mut read, mut write) = stream.into_split();
    tokio::spawn(async move { write.write_all(head.as_bytes()).await });
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), read.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    answer.lines().next().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn bodies_and_headers_are_bounded() {
    let (base, key) = bounded().await;
    let big = "a".repeat(80 << 10);
    let client = reqwest::Client::new();
    let mut wrong = Vec::new();
    // Generation routes refuse at the edge, the others through the body limit every route has:
    // 413 in OpenAI's envelope either way.
    for path in [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/conversations",
        "/v1/memory/facts",
        "/v1/collections/big/search",
        "/v1/embeddings",
        "/v1/moderations",
        "/v1/batches",
    ] {
        let body = json!({"model": MODEL, "content": big, "query": big, "input": big,
            "prompt": big, "messages": [{"role": "user", "content": big}]});
        let r = client
            .post(format!("{base}{path}"))
            .bearer_auth(&key)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        let e: Value = serde_json::from_str(&text).unwrap_or_default();
        if status != 413 || e["error"]["type"] != "invalid_request_error" {
            wrong.push(format!("{path}: {status} {text}"));
        }
    }
    // Uploads too, multipart or JSON.
    let boundary = "b";
    let file_part = |name: &str, content: &str| {
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n\r\n\
             {content}\r\n--{boundary}--\r\n"
        )
    };
    let form = |name: &str, content: &str| {
        let purpose = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
        );
        purpose + &file_part(name, content)
    };
    let upload = async |path: &str, body: String, multipart: bool| {
        let kind = match multipart {
            true => format!("multipart/form-data; boundary={boundary}"),
            false => "application/json".to_owned(),
        };
        let r = (client.post(format!("{base}{path}")).bearer_auth(&key))
            .header("content-type", kind)
            .body(body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    let line = json!({"custom_id": "a", "method": "POST", "url": "/v1/completions",
        "body": {"model": MODEL, "prompt": "Hi", "max_tokens": 1}});
    let (status, _) = upload("/v1/files", form("in.jsonl", &line.to_string()), true).await;
    assert_eq!(status, 200, "a small upload is taken");
    let documents = json!({"documents": [{"id": "big", "text": big}]}).to_string();
    for (path, body, multipart) in [
        ("/v1/files", form("in.jsonl", &big), true),
        (
            "/v1/collections/big/documents",
            file_part("big.md", &big),
            true,
        ),
        ("/v1/collections/big/documents", documents, false),
    ] {
        let (status, text) = upload(path, body, multipart).await;
        let e: Value = serde_json::from_str(&text).unwrap_or_default();
        if status != 413 || e["error"]["type"] != "invalid_request_error" {
            wrong.push(format!("{path}: {status} {text}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");

    // Headers: hyper's bounds (100 headers; ~400 KiB of request head) answer 431.
    let addr = base.trim_start_matches("http://");
    let huge = format!(
        "GET /health HTTP/1.1\r\nhost: {addr}\r\nx-big: {}\r\n\r\n",
        "a".repeat(512 << 10)
    );
    assert_eq!(
        raw_status(&base, huge).await,
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    let many: String = (0..150).map(|i| format!("x-h{i}: v\r\n")).collect();
    let many = format!("GET /health HTTP/1.1\r\nhost: {addr}\r\n{many}\r\n");
    assert_eq!(
        raw_status(&base, many).await,
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    let fine = format!("GET /health HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    assert_eq!(raw_status(&base, fine).await, "HTTP/1.1 200 OK");
}
