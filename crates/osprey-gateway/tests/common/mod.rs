//! A gateway in front of a test upstream, and a switchable TCP proxy to simulate a Redis
//! outage: the pieces of the edge tests. And what tests sharing one process need: a lock for
//! the tests of Redis-backed limits ([`redis_limits_alone`]), and a child process of this binary
//! for a test that needs the process to itself ([`run_alone`]).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Json;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use osprey_gateway::{HttpConfig, Services, Wiring};
use osprey_limits::RateLimiter;
use osprey_router::upstream::{Upstream, http_client};
use osprey_services::auth::Authenticator;
use osprey_services::config::{AdmissionConfig, EdgeConfig, TenantConfig, UpstreamConfig};
use osprey_services::edge::Edge;
use osprey_store::SharedRedis;
use osprey_store::{NewKey, Store};
use serde_json::{Value, json};

/// Chunks the test upstream streams.
pub const STREAM_CHUNKS: usize = 50;

/// The Redis of the tests, or `None` (and a note saying the test skips).
pub fn redis_url(test: &str) -> Option<String> {
    match std::env::var("OSPREY_TEST_REDIS_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!("SKIPPED {test}: OSPREY_TEST_REDIS_URL is not set (.ci/run sets it)");
            None
        }
    }
}

/// Held for its whole length by each test whose gateways limit through Redis: the
/// `osprey_ratelimit_*` metrics they move (`osprey_ratelimit_redis_up` above all) are the
/// process's, not a gateway's, and some of these tests read them; so these tests run one at a
/// time (other tests, which move none of them, run beside them freely).
pub async fn redis_limits_alone() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// The variable [`run_alone`] sets in the child process: the path of the test it runs there.
const ALONE_VAR: &str = "OSPREY_TEST_ALONE";

/// Runs the ignored test `path` (as this binary names it: `module::test`) in a child process of
/// this binary, alone, with `env` set; asserts that it passed and returns what it printed.
///
/// For a test that needs what is process-wide to itself: a tracing subscriber of its own, or
/// the engine gauges in /metrics moved by its engine alone (every engine of a process sets the
/// same ones), as it had when each file was a test binary of its own.
pub fn run_alone(path: &str, env: &[(&str, &str)]) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            path,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ALONE_VAR, path)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(said.contains("1 passed"), "{said}");
    said
}

/// Whether this is the child process [`run_alone`] started for the test `path`; if not (the
/// ignored tests run by hand), says that the test is skipped.
pub fn alone(path: &str) -> bool {
    let alone = std::env::var(ALONE_VAR).is_ok_and(|p| p == path);
    if !alone {
        eprintln!("SKIPPED {path}: it runs in a process of its own, started by another test");
    }
    alone
}

/// A unique name, so runs sharing one Redis never share buckets.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

/// A fresh store in a temporary folder.
pub async fn store() -> (Store, String) {
    let dir = std::env::temp_dir().join(unique("osprey-edge"));
    std::fs::create_dir_all(&dir).unwrap();
    let url = Store::default_url(&dir);
    (Store::open(&url).await.unwrap(), url)
}

/// A new key of `tenant`, its secret.
pub async fn new_key(store: &Store, tenant: &str) -> String {
    let key = store.create_key(NewKey::for_tenant(tenant)).await.unwrap();
    key.secret
}

/// How to build a gateway.
#[derive(Clone, Default)]
pub struct Setup {
    pub store_url: String,
    pub redis: Option<String>,
    pub replicas: u64,
    pub tenants: BTreeMap<String, TenantConfig>,
    pub admission: AdmissionConfig,
    pub admin_key: Option<String>,
    /// Upstream models: (name, base URL).
    pub upstreams: Vec<(String, String)>,
}

/// Starts a gateway with no local engine; returns its base URL.
pub async fn gateway(setup: Setup) -> String {
    let store = Store::open(&setup.store_url).await.unwrap();
    let auth = Authenticator::new(store).await.unwrap();
    auth.spawn_refresh_task();
    let limiter = match &setup.redis {
        Some(url) => {
            RateLimiter::with_redis(SharedRedis::open(url).unwrap(), setup.replicas.max(1))
        }
        None => RateLimiter::local(),
    };
    let config = EdgeConfig {
        tenants: setup.tenants,
        admission: setup.admission,
        admin_key: setup.admin_key,
        ..EdgeConfig::default()
    };
    let upstreams = setup
        .upstreams
        .iter()
        .map(|(name, url)| {
            let config = UpstreamConfig {
                url: url.clone(),
                api_key_env: None,
                model: None,
                timeout_secs: Some(5.0),
                max_retries: None,
                fallbacks: None,
            };
            Upstream::new(name, &config, http_client()).unwrap()
        })
        .collect();
    let state = Services::new(Wiring::new(
        None,
        upstreams,
        Edge::new(config, auth, limiter),
    ));
    serve(state).await
}

/// Serves `state` on a free local port; returns its base URL.
pub async fn serve(state: Services) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        osprey_gateway::serve(
            listener,
            state,
            &HttpConfig::default(),
            std::future::pending(),
        )
        .await
    });
    format!("http://{addr}")
}

/// An OpenAI-compatible upstream: echoes the `max_tokens` it received, streams
/// [`STREAM_CHUNKS`] chunks (`t0 `, `t1 `, …) then usage, fails on model `broken`.
pub async fn upstream() -> String {
    async fn chat(Json(body): Json<Value>) -> Response {
        let model = body["model"].as_str().unwrap_or("").to_owned();
        if model == "broken" {
            let e = json!({"error": {"message": "engine crashed", "type": "server_error"}});
            return (axum::http::StatusCode::INTERNAL_SERVER_ERROR, Json(e)).into_response();
        }
        if body["stream"] == true {
            let events = futures_util::stream::unfold(0usize, |i| async move {
                let data = match i {
                    i if i < STREAM_CHUNKS => {
                        // Paced like a model's tokens: part of the scenario, not a wait.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": format!("t{i} ")}}]}).to_string()
                    }
                    i if i == STREAM_CHUNKS => json!({"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": STREAM_CHUNKS, "total_tokens": 7 + STREAM_CHUNKS}}).to_string(),
                    i if i == STREAM_CHUNKS + 1 => "[DONE]".to_owned(),
                    _ => return None,
                };
                Some((Ok::<_, Infallible>(Event::default().data(data)), i + 1))
            });
            return Sse::new(events).into_response();
        }
        Json(json!({
            "object": "chat.completion",
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("max_tokens={}", body["max_tokens"])}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        }))
        .into_response()
    }
    let app = axum::Router::new().route("/v1/chat/completions", post(chat));
    serve_upstream(app).await
}

/// Serves `app` as an upstream on a free port: its base URL, with `/v1`.
pub async fn serve_upstream(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/v1")
}

/// A TCP proxy (to Redis, to Postgres) that can be cut: while down it closes every
/// connection, old and new.
pub struct Proxy {
    /// `redis://ADDR` for a proxy to Redis, else `ADDR`.
    pub url: String,
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    up: Arc<AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
}

impl Proxy {
    /// A proxy to the Redis at `redis_url`.
    pub async fn start(redis_url: &str) -> Self {
        let target = redis_url
            .trim_start_matches("redis://")
            .trim_end_matches('/');
        let proxy = Self::tcp(target).await;
        Self {
            url: format!("redis://{}", proxy.addr),
            ..proxy
        }
    }

    /// A proxy to `target` (`HOST:PORT`).
    pub async fn tcp(target: &str) -> Self {
        let target = target.to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let (cut, watch) = tokio::sync::watch::channel(0u64);
        let is_up = up.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if !is_up.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let target = target.clone();
                let mut cut = watch.clone();
                cut.borrow_and_update(); // only cuts after this one count
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Self {
            url: addr.to_string(),
            addr,
            up,
            cut,
        }
    }

    pub fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }

    pub fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

/// A chat request to `model`, with `key` if given.
pub async fn chat(base: &str, key: Option<&str>, body: Value) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&body);
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    req.send().await.unwrap()
}

/// A minimal chat body for `model`.
pub fn hello(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10})
}

/// A header as a number.
pub fn header_num(r: &reqwest::Response, name: &str) -> u64 {
    r.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// A tenant with these request and token limits.
pub fn tenant(rpm: u64, tpm: u64) -> TenantConfig {
    TenantConfig {
        rpm: Some(rpm),
        tpm: Some(tpm),
        ..TenantConfig::default()
    }
}

/// The JSON body of `GET url`.
pub async fn get_json(url: &str) -> Value {
    let r = reqwest::get(url).await.unwrap();
    r.json().await.unwrap()
}

/// A gauge or counter from a gateway's /metrics: one series, or the sum of a metric's.
pub async fn metric(base: &str, name: &str) -> Option<f64> {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    // `name` is one series (`name{labels}`), or a metric whose series are summed.
    let matches = |series: &str| match name.contains('{') {
        true => series == name,
        false => series.split('{').next() == Some(name),
    };
    let series = text.lines().filter_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        matches(series).then(|| value.parse::<f64>().ok())?
    });
    series.reduce(|a, b| a + b)
}

/// The text of an SSE chat stream: its deltas' content, joined.
pub fn streamed_content(sse: &str) -> String {
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

/// A call to the admin API with `admin_key`, with a JSON body if given.
pub async fn admin(
    base: &str,
    admin_key: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(admin_key);
    if let Some(body) = body {
        req = req.json(&body);
    }
    req.send().await.unwrap()
}

/// A caller: a key and a user.
pub struct As<'a> {
    pub base: &'a str,
    pub key: &'a str,
    pub user: &'a str,
}

impl As<'_> {
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = reqwest::Client::new()
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(self.key)
            .header("x-osprey-user", self.user);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::DELETE, path, None).await
    }

    /// The texts of a conversation's items, oldest first.
    pub async fn texts(&self, id: &str) -> Vec<String> {
        let (status, list) = self
            .get(&format!("/v1/conversations/{id}/items?order=asc&limit=100"))
            .await;
        assert_eq!(status, 200, "{list}");
        (list["data"].as_array().unwrap().iter())
            .map(|i| i["content"][0]["text"].as_str().unwrap().to_owned())
            .collect()
    }
}
