//! Models served by OpenAI-compatible upstreams (vLLM, SGLang, TGI, llama-server, hosted APIs):
//! the request body goes as it came (model renamed if the upstream knows it by another name,
//! a stream asking for its usage), over one pooled HTTP client, and the answer is read once as
//! typed events ([`crate::events`]) for the gateway to write. Upstream failures become clear
//! errors in OpenAI's envelope.
//!
//! Every attempt of a request carries the same `x-request-id` (also on the response), so an
//! upstream that deduplicates can tell a retry from a new request.
//!
//! Each upstream has a circuit breaker and a retry budget (`osprey-router`): a request that
//! finds the upstream unreachable, or gets 502/503/504 before any byte reached the client, is
//! retried after a jittered backoff while the budget allows (at most 10% of requests plus one a
//! second); an upstream that keeps failing has its breaker opened and is refused at once with
//! 503 until a probe succeeds.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use osprey_core::api::{ErrorResponse, JsonBody};
use osprey_core::backend::GenStream;
use osprey_core::metrics as names;
use osprey_core::{Error, ErrorKind};
use serde::Deserialize;

use crate::events::{self, Source};

use crate::breaker::{BreakerConfig, BreakerState, CircuitBreaker, Outcome};
use crate::retry::{RetryBudget, RetryBudgetConfig, backoff};

/// A model served by an OpenAI-compatible upstream (vLLM, SGLang, TGI, llama-server, a hosted
/// API), as configured (`[models.NAME]` in the config file, or `--upstream`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Base URL including `/v1`, e.g. `http://10.0.0.5:8000/v1`.
    pub url: String,
    /// Environment variable holding the upstream's API key, sent as `Authorization: Bearer`.
    pub api_key_env: Option<String>,
    /// The model name the upstream knows it by (default: the name served here).
    pub model: Option<String>,
    /// Seconds to wait for the upstream's response to start.
    pub timeout_secs: Option<f64>,
    /// Retries of a request the upstream failed before answering (unreachable, 502/503/504),
    /// within the retry budget; default 2.
    pub max_retries: Option<u32>,
    /// Upstream models to try, in order, when this one fails, times out or is cut off by its
    /// circuit breaker before answering.
    pub fallbacks: Option<Vec<String>>,
}

/// One upstream model.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// The name served here.
    pub name: String,
    /// Base URL, without a trailing slash (`http://host:8000/v1`).
    pub url: String,
    /// The name the upstream knows the model by, when it differs.
    pub remote_model: Option<String>,
    api_key: Option<String>,
    timeout: Duration,
    client: reqwest::Client,
    max_retries: u32,
    health: Arc<Health>,
    /// Models to try, in order, when this one fails before answering.
    pub fallbacks: Vec<String>,
    /// Whether a 4xx answer goes to the client as it is (an Osprey worker's errors are already
    /// ours) rather than wrapped as the upstream's.
    relays_client_errors: bool,
}

/// What the upstream's recent answers say: its breaker and its retry budget.
#[derive(Debug)]
struct Health {
    /// The breaker, and the state last exported as a metric.
    breaker: Mutex<(CircuitBreaker, BreakerState)>,
    budget: Mutex<RetryBudget>,
}

/// The first pause between attempts, doubled for each retry (with full jitter).
const BACKOFF_BASE: Duration = Duration::from_millis(25);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// An HTTP client for upstreams: pooled keep-alive connections, no overall timeout (streams
/// can run long).
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .tcp_nodelay(true)
        .build()
        .expect("an HTTP client")
}

impl Upstream {
    /// The upstream `name` as configured; fails when its key's environment variable is unset.
    pub fn new(
        name: &str,
        config: &UpstreamConfig,
        client: reqwest::Client,
    ) -> Result<Self, String> {
        let api_key = match &config.api_key_env {
            Some(var) => Some(std::env::var(var).map_err(|_| {
                format!("model `{name}`: the environment variable {var} (api_key_env) is not set")
            })?),
            None => None,
        };
        let secs = config.timeout_secs.unwrap_or(60.0);
        let timeout = Duration::try_from_secs_f64(secs)
            .ok()
            .filter(|t| !t.is_zero())
            .ok_or_else(|| {
                format!("model `{name}`: timeout_secs must be a positive number of seconds")
            })?;
        if !(config.url.starts_with("http://") || config.url.starts_with("https://")) {
            return Err(format!(
                "model `{name}`: url `{}` is not an http(s) URL",
                config.url
            ));
        }
        let now = Instant::now();
        let health = Health {
            breaker: Mutex::new((
                CircuitBreaker::new(BreakerConfig::default(), now),
                BreakerState::Closed,
            )),
            budget: Mutex::new(RetryBudget::new(RetryBudgetConfig::default(), now)),
        };
        let upstream = Self {
            name: name.to_owned(),
            url: config.url.trim_end_matches('/').to_owned(),
            remote_model: config.model.clone().filter(|m| m != name),
            api_key,
            timeout,
            client,
            max_retries: config.max_retries.unwrap_or(2),
            health: Arc::new(health),
            fallbacks: config.fallbacks.clone().unwrap_or_default(),
            relays_client_errors: false,
        };
        upstream.publish_state(BreakerState::Closed);
        Ok(upstream)
    }

    /// How long it is given to answer.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The same upstream, passing its 4xx answers to the client unchanged (for Osprey workers).
    pub fn relaying_client_errors(mut self) -> Self {
        self.relays_client_errors = true;
        self
    }

    /// Asks `{url}/{path}` for `body`'s answer, sending `headers` too (the request's id, if
    /// they hold one, and its trace context), and reads it once as typed events
    /// ([`events::read_response`]), whether the server streams it or not. A stream the upstream
    /// cuts off, or fills with what is not a chunk, ends with an error
    /// (`upstream_disconnected`, `upstream_invalid_response`).
    pub async fn answer(
        &self,
        path: &str,
        body: &JsonBody,
        headers: HeaderMap,
        source: Source,
    ) -> Result<GenStream, Error> {
        let sent = self.send(path, body, headers).await?;
        Ok(events::read_response(sent.response, source))
    }

    /// The answer `events` read to its end (within `limit`, if given), for a request that is
    /// not streamed: nothing of it has gone out yet, so one that failed or did not end in time
    /// is an error, and another backend may answer instead.
    pub async fn read_to_end(
        &self,
        events: GenStream,
        limit: Option<Duration>,
    ) -> Result<GenStream, Error> {
        let Some(limit) = limit else {
            return events::to_end(events).await;
        };
        match tokio::time::timeout(limit, events::to_end(events)).await {
            Ok(read) => read,
            Err(_) => {
                self.count("timeout");
                let why = format!(
                    "The upstream for `{}` did not finish its answer within {limit:?}.",
                    self.name
                );
                Err(Error::new(ErrorKind::GatewayTimeout, why).with_code("upstream_timeout"))
            }
        }
    }

    /// Sends `body` to `{url}/{path}`, with `headers` and the request's id ([`REQUEST_ID`], the
    /// same on every attempt), retrying as configured: the upstream's successful answer, once
    /// it has started. A failure it answers with is an error of ours ([`Self::relaying_client_errors`]
    /// keeps a 4xx's own).
    pub async fn send(
        &self,
        path: &str,
        body: &JsonBody,
        mut headers: HeaderMap,
    ) -> Result<Sent, Error> {
        // Every attempt carries the same id, so an upstream can tell a retry from a new request.
        let request_id = headers
            .entry(REQUEST_ID)
            .or_insert_with(new_request_id)
            .clone();
        // The body is written once here (or sent as it came), whatever the attempts.
        let body = match &self.remote_model {
            Some(remote) if remote != body.model() => {
                let mut renamed = body.clone();
                renamed.set_model(remote);
                renamed.bytes()
            }
            _ => body.bytes(),
        };
        self.health
            .budget
            .lock()
            .expect("budget lock")
            .on_request(Instant::now());
        let mut retries = 0;
        let response = loop {
            let result = self.attempt(path, &body, &headers).await;
            let retryable = match &result {
                Ok(r) => matches!(r.status().as_u16(), 502..=504),
                Err(e) => e.code.as_deref() == Some("upstream_unavailable"),
            };
            if retryable && retries < self.max_retries && self.may_retry() {
                retries += 1;
                metrics::counter!(names::UPSTREAM_RETRIES, "model" => self.name.clone())
                    .increment(1);
                let pause = backoff(retries, BACKOFF_BASE, BACKOFF_MAX, &mut rand::rng());
                tokio::time::sleep(pause).await;
                continue;
            }
            break result?;
        };
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            let told = serde_json::from_str::<ErrorResponse>(&text);
            return Err(match told {
                Ok(told) if self.relays_client_errors && status.is_client_error() => {
                    Error::told(ErrorKind::of_status(status.as_u16()), told.error)
                }
                _ => upstream_error(&self.name, status, &text),
            });
        }
        Ok(Sent {
            response,
            request_id,
        })
    }

    /// One try: through the breaker, bounded by the timeout; the outcome is recorded.
    async fn attempt(
        &self,
        path: &str,
        body: &Bytes,
        headers: &HeaderMap,
    ) -> Result<reqwest::Response, Error> {
        if !self.breaker(|b, now| b.try_acquire(now)) {
            self.count("circuit_open");
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "The upstream for `{}` is failing; it is not sent requests until a probe succeeds.",
                    self.name
                ),
            )
            .with_code("upstream_circuit_open")
            .with_retry_after(1));
        }
        let mut request = self
            .client
            .post(format!("{}/{path}", self.url))
            .header(header::CONTENT_TYPE, "application/json")
            .headers(headers.clone())
            .body(body.clone());
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let result = match tokio::time::timeout(self.timeout, request.send()).await {
            Err(_) => {
                self.count("timeout");
                Err(Error::new(
                    ErrorKind::GatewayTimeout,
                    format!(
                        "The upstream for `{}` did not answer within {:?}.",
                        self.name, self.timeout
                    ),
                )
                .with_code("upstream_timeout"))
            }
            Ok(Err(e)) => {
                self.count("unreachable");
                Err(Error::new(
                    ErrorKind::BadGateway,
                    format!("The upstream for `{}` could not be reached: {e}", self.name),
                )
                .with_code("upstream_unavailable")
                .with_retry_after(1))
            }
            Ok(Ok(r)) => {
                self.count(if r.status().is_success() {
                    "ok"
                } else {
                    "error"
                });
                Ok(r)
            }
        };
        let failed = match &result {
            Ok(r) => r.status().is_server_error(),
            Err(_) => true,
        };
        let outcome = if failed {
            Outcome::Failure
        } else {
            Outcome::Success
        };
        self.breaker(|b, now| b.record(outcome, now));
        result
    }

    /// Runs `f` on the breaker, and exports its state when it differs from the one last
    /// exported.
    fn breaker<T>(&self, f: impl FnOnce(&mut CircuitBreaker, Instant) -> T) -> T {
        let now = Instant::now();
        let mut guard = self.health.breaker.lock().expect("breaker lock");
        let (breaker, published) = &mut *guard;
        let out = f(breaker, now);
        let state = breaker.state(now);
        if state != *published {
            *published = state;
            self.publish_state(state);
        }
        out
    }

    fn publish_state(&self, state: BreakerState) {
        metrics::gauge!(names::UPSTREAM_BREAKER_STATE, "model" => self.name.clone())
            .set(state.as_gauge());
    }

    /// Whether the retry budget has a retry left (and takes it).
    fn may_retry(&self) -> bool {
        let allowed = self
            .health
            .budget
            .lock()
            .expect("budget lock")
            .try_retry(Instant::now());
        if !allowed {
            metrics::counter!(names::UPSTREAM_RETRIES_REFUSED, "model" => self.name.clone())
                .increment(1);
        }
        allowed
    }

    fn count(&self, outcome: &'static str) {
        metrics::counter!(names::UPSTREAM_REQUESTS, "model" => self.name.clone(), "outcome" => outcome)
            .increment(1);
    }
}

/// An upstream's successful answer, started.
pub struct Sent {
    /// Its head; its body is still to come.
    pub response: reqwest::Response,
    /// The id the request was sent with ([`REQUEST_ID`]).
    pub request_id: HeaderValue,
}

/// The header carrying the id of a forwarded request: the same on every attempt (retries,
/// failover to another worker), and on the response.
pub const REQUEST_ID: &str = "x-request-id";

/// A fresh request id: `req_`, the time in Unix ms (12 hex digits) and 48 random bits (12 more).
/// Time first, so ids of later requests sort later: the request log's index of ids grows at
/// its end instead of touching a random page of it per request.
pub fn new_request_id() -> HeaderValue {
    let since_epoch = std::time::UNIX_EPOCH.elapsed().unwrap_or_default();
    let ms = since_epoch.as_millis() as u64 & 0xffff_ffff_ffff;
    let random = rand::random::<u64>() & 0xffff_ffff_ffff;
    HeaderValue::from_str(&format!("req_{ms:012x}{random:012x}"))
        .expect("hex is a valid header value")
}

/// The header naming the model that served a response.
pub const SERVED_BY: &str = "x-osprey-model";
/// The header saying why a request was served by another model than the one it named.
pub const ROUTE_REASON: &str = "x-osprey-route-reason";

/// Checks that every fallback names another model served here: an upstream among
/// `upstreams`, or one of the `local` engines' models.
pub fn check_fallbacks<S: AsRef<str>>(
    upstreams: &[Upstream],
    local: impl IntoIterator<Item = S>,
) -> Result<(), (String, String)> {
    let local: Vec<S> = local.into_iter().collect();
    for u in upstreams {
        for f in &u.fallbacks {
            let served = local.iter().any(|l| l.as_ref() == f.as_str())
                || upstreams.iter().any(|o| o.name == *f);
            if *f == u.name || !served {
                let why = format!(
                    "model `{}`: fallback `{f}` is not another model served here",
                    u.name
                );
                return Err((u.name.clone(), why));
            }
        }
    }
    Ok(())
}

/// Whether a failure of an upstream is one another model might not have: it failed, timed out
/// or was cut off, rather than refusing the request itself.
pub fn warrants_fallback(e: &Error) -> bool {
    matches!(
        e.kind,
        ErrorKind::BadGateway | ErrorKind::GatewayTimeout | ErrorKind::Unavailable
    )
}

/// The upstream's failure as an error of ours: its message kept, the status mapped so that the
/// client's own mistakes stay 4xx and the upstream's failures become 502.
fn upstream_error(model: &str, status: StatusCode, body: &str) -> Error {
    let message = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| body.chars().take(300).collect());
    let kind = match status.as_u16() {
        400 | 413 | 422 => ErrorKind::InvalidRequest,
        404 => ErrorKind::NotFound,
        429 => ErrorKind::RateLimited,
        _ => ErrorKind::BadGateway,
    };
    let mut e = Error::new(
        kind,
        format!("The upstream for `{model}` answered {status}: {message}"),
    );
    if kind == ErrorKind::RateLimited {
        e = e.with_code("upstream_rate_limited").with_retry_after(1);
    } else if kind == ErrorKind::BadGateway {
        e = e.with_code("upstream_error");
    }
    e
}

#[cfg(test)]
mod tests {
    #[test]
    fn request_ids_of_later_requests_sort_later() {
        let first = super::new_request_id();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let second = super::new_request_id();
        let (first, second) = (first.to_str().unwrap(), second.to_str().unwrap());
        assert_eq!((first.len(), second.len()), (28, 28));
        assert!(first < second, "{first} then {second}");
        assert_ne!(first[16..], second[16..], "the random part differs");
    }
}
