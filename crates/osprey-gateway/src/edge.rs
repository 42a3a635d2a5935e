//! The edge's middleware: every generation request passes [`guard`] before a handler sees it
//! (the parts it uses are [`osprey_services::edge`]'s).
//!
//! In order: authenticate the key and find its tenant; parse the body, once (the
//! [`JsonBody`] is handed on to the handler), and read its model, `max_tokens` and priority;
//! check the tenant may use the model and clamp `max_tokens` to its cap; take a
//! place in the tenant's concurrency and in global admission control (batch work is shed
//! first); charge the rate limits (requests, and prompt + `max_tokens` tokens, per key and per
//! tenant). The response carries OpenAI's `x-ratelimit-*` headers; when its body ends, the
//! places are given back and the token charge is corrected to the actual usage.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use osprey_core::api::JsonBody;
use osprey_core::metrics as names;
use osprey_core::{Error, ErrorKind, Priority, UsageReport};
use serde::Deserialize;
use tracing::Instrument;

use osprey_limits::admission::Place;
use osprey_limits::{Bucket, BucketState, Decision, RateLimiter, Unit, Verdict};
use osprey_services::Services;
use osprey_services::config::Tenant;
use osprey_services::edge::{Admitted, TenantSlot};
use osprey_services::error::ApiError;

/// Completion tokens assumed on admission for a request that sets no `max_tokens` (and has
/// no cap); corrected to the truth when it ends.
const DEFAULT_COMPLETION_ESTIMATE: u64 = 256;

/// The state of [`guard`]: the app and the largest body it reads.
#[derive(Clone)]
pub struct EdgeLayer {
    /// The app.
    pub app: Services,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
}

/// Authentication only, for `/v1` routes that generate nothing (`GET /v1/models`).
pub async fn authenticate(State(state): State<Services>, mut req: Request, next: Next) -> Response {
    match state.edge().caller(req.headers()).await {
        Ok((caller, _)) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(e) => ApiError(e).into_response(),
    }
}

/// The full edge for generation routes (see the module docs).
pub async fn guard(State(layer): State<EdgeLayer>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    match admit(&layer, req).await {
        Ok((req, ticket)) => {
            let response = next.run(req).await;
            ticket.attach(response)
        }
        Err((e, limits)) => {
            let mut response = ApiError(e).into_response();
            if let Some(limits) = limits {
                limits.write(response.headers_mut());
            }
            response
        }
    }
}

type Rejection = (Error, Option<LimitHeaders>);

async fn admit(layer: &EdgeLayer, req: Request) -> Result<(Request, Ticket), Rejection> {
    let edge = layer.app.edge_arc();
    let (caller, key) = (edge.caller(req.headers()))
        .instrument(tracing::info_span!("auth"))
        .await
        .map_err(|e| (e, None))?;
    let (mut parts, body) = req.into_parts();
    let limit = layer.max_body_bytes;
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
        let e = Error::new(
            ErrorKind::PayloadTooLarge,
            "The request body is larger than this server accepts.",
        );
        (e, None)
    })?;
    // The body is parsed here, once, and handed on ([`JsonBody`]); one that is not a JSON
    // object is the handler's to reject, precisely, and the edge charges it as one request.
    let mut body = JsonBody::parse(bytes.clone()).ok();
    let tenant = &caller.tenant;
    let mut model = body.as_ref().map_or("", |b| b.model()).to_owned();
    if model.is_empty()
        && let Some(default) = &tenant.default_model
        && let Some(body) = body.as_mut()
    {
        body.set_model(default);
        model = default.clone();
    }
    if let Some(allowed) = &tenant.models
        && !model.is_empty()
        && !allowed.contains(&model)
    {
        let e = Error::new(
            ErrorKind::Forbidden,
            format!("Tenant `{}` may not use the model `{model}`.", tenant.name),
        )
        .with_param("model")
        .with_code("model_not_allowed");
        return Err((e, None));
    }
    let requested = body.as_ref().and_then(JsonBody::max_tokens);
    if let Some(cap) = tenant.max_tokens
        && let Some(body) = body.as_mut()
    {
        body.cap_max_tokens(cap);
    }
    let max_tokens = match (requested, tenant.max_tokens) {
        (Some(r), Some(cap)) => r.min(cap),
        (Some(r), None) => r,
        (None, Some(cap)) => cap,
        (None, None) => DEFAULT_COMPLETION_ESTIMATE,
    };
    let n = (body.as_ref())
        .and_then(|b| b.get("n").as_u64())
        .unwrap_or(1)
        .clamp(1, 128);
    // Charged now, corrected at the end.
    let prompt_estimate = osprey_core::tokens::estimate_body(bytes.len());
    let charged = prompt_estimate + max_tokens * n;
    let priority = (body.as_ref())
        .and_then(|b| Priority::deserialize(b.osprey("priority")).ok())
        .unwrap_or(tenant.priority);

    let place = edge
        .admission()
        .enter(priority, charged)
        .map_err(|e| (e, None))?;
    let slot = TenantSlot::take(&edge, tenant).map_err(|e| (e, None))?;

    let key_rpm = key.as_ref().and_then(|k| k.rpm).map(|v| v.max(1) as u64);
    let key_tpm = key.as_ref().and_then(|k| k.tpm).map(|v| v.max(1) as u64);
    let mut buckets = vec![
        bucket("tenant", &tenant.name, Unit::Requests, tenant.rpm, 1),
        bucket("tenant", &tenant.name, Unit::Tokens, tenant.tpm, charged),
    ];
    if let Some(k) = &key {
        let (rpm, tpm) = (key_rpm.unwrap_or(tenant.rpm), key_tpm.unwrap_or(tenant.tpm));
        buckets.push(bucket("key", &k.id, Unit::Requests, rpm, 1));
        buckets.push(bucket("key", &k.id, Unit::Tokens, tpm, charged));
    }
    let check = edge.limiter().check(&buckets, caller.key_id.as_deref());
    let decision = match check.instrument(tracing::info_span!("rate_limit")).await {
        Verdict::Revoked => {
            if let Some(id) = &caller.key_id {
                edge.auth().forget(id);
            }
            return Err((
                osprey_services::auth::unauthorized("This API key has been revoked."),
                None,
            ));
        }
        Verdict::Checked(d) => d,
    };
    let headers = LimitHeaders::of(&buckets, &decision);
    if !decision.allowed {
        return Err((refusal(tenant, &buckets, &decision), Some(headers)));
    }

    let usage = Arc::new(UsageReport::default());
    parts.extensions.insert(Admitted {
        caller,
        model: (!model.is_empty()).then_some(model),
        usage: usage.clone(),
    });
    // Handlers that read bytes (`/v1/responses`) see the tenant's edits too.
    let bytes = match body {
        Some(body) => {
            let edited = body.bytes();
            parts.extensions.insert(body);
            edited
        }
        None => bytes,
    };
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    let ticket = Ticket {
        limiter: edge.limiter().clone(),
        token_buckets: buckets
            .into_iter()
            .filter(|b| b.unit == Unit::Tokens)
            .collect(),
        charged,
        prompt_estimate,
        usage,
        headers,
        _place: place,
        _slot: slot,
    };
    Ok((Request::from_parts(parts, Body::from(bytes)), ticket))
}

/// The bucket `scope:id:unit`.
fn bucket(scope: &str, id: &str, unit: Unit, limit: u64, cost: u64) -> Bucket {
    Bucket {
        name: format!("{scope}:{id}:{}", unit.as_str()),
        unit,
        limit,
        cost,
    }
}

/// The 429 for a request the limits refused, saying which limit and when to retry.
fn refusal(tenant: &Tenant, buckets: &[Bucket], decision: &Decision) -> Error {
    let over = |b: &Bucket, s: &BucketState| s.remaining < b.cost;
    let tokens = buckets
        .iter()
        .zip(&decision.states)
        .any(|(b, s)| b.unit == Unit::Tokens && over(b, s));
    let limited = if tokens { Unit::Tokens } else { Unit::Requests }.as_str();
    metrics::counter!(names::RATE_LIMITED, "tenant" => tenant.name.clone(), "limit" => limited)
        .increment(1);
    let e = match decision.retry_after_us {
        None => {
            let (cost, limit) = buckets
                .iter()
                .filter(|b| b.unit == Unit::Tokens)
                .map(|b| (b.cost, b.limit))
                .min_by_key(|&(_, limit)| limit)
                .unwrap_or_default();
            Error::new(
                ErrorKind::RateLimited,
                format!(
                    "Request too large: it needs about {cost} tokens, more than the {limit} \
                     tokens per minute allowed. Lower max_tokens or the prompt."
                ),
            )
            // Waiting will not help, but every 429 says when to come back: a full window.
            .with_retry_after(60)
        }
        Some(us) => Error::new(
            ErrorKind::RateLimited,
            format!(
                "Rate limit reached for {limited} per minute (tenant `{}`). Retry in {}.",
                tenant.name,
                format_duration(us)
            ),
        )
        .with_retry_after(((us + 999_999) / 1_000_000).max(1) as u64),
    };
    e.with_code("rate_limit_exceeded")
}

/// What an admitted request holds until its response body ends.
struct Ticket {
    limiter: RateLimiter,
    token_buckets: Vec<Bucket>,
    charged: u64,
    prompt_estimate: u64,
    usage: Arc<UsageReport>,
    headers: LimitHeaders,
    _place: Place,
    _slot: TenantSlot,
}

impl Ticket {
    /// Adds the rate-limit headers to `response` and keeps the ticket alive until its body has
    /// been sent (or dropped).
    fn attach(self, mut response: Response) -> Response {
        self.headers.write(response.headers_mut());
        let (parts, body) = response.into_parts();
        // The stream owns the ticket: it is dropped, and its places given back, when the body
        // has been sent or the client has gone.
        let mut ticket = Some(self);
        let stream = body.into_data_stream().map(move |chunk| {
            if chunk.is_err() {
                ticket.take();
            }
            chunk
        });
        Response::from_parts(parts, Body::from_stream(stream))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let (prompt, Some(completion)) = self.usage.tokens() else {
            return;
        };
        let actual = prompt.unwrap_or(self.prompt_estimate) + completion;
        let delta = actual as i64 - self.charged as i64;
        let corrections = self.token_buckets.drain(..).map(|b| (b, delta)).collect();
        self.limiter.settle(corrections);
    }
}

/// OpenAI's `x-ratelimit-*` headers: for requests and for tokens, the tightest bucket.
#[derive(Clone, Debug)]
pub struct LimitHeaders {
    requests: BucketState,
    tokens: BucketState,
}

impl LimitHeaders {
    fn of(buckets: &[Bucket], decision: &Decision) -> Self {
        let tightest = |unit: Unit| {
            buckets
                .iter()
                .zip(&decision.states)
                .filter(|(b, _)| b.unit == unit)
                .map(|(_, s)| *s)
                .min_by_key(|s| (s.remaining, std::cmp::Reverse(s.reset_us)))
                .unwrap_or(BucketState {
                    limit: 0,
                    remaining: 0,
                    reset_us: 0,
                })
        };
        Self {
            requests: tightest(Unit::Requests),
            tokens: tightest(Unit::Tokens),
        }
    }

    fn write(&self, headers: &mut HeaderMap) {
        for (kind, s) in [("requests", &self.requests), ("tokens", &self.tokens)] {
            let mut put = |name: String, value: String| {
                if let (Ok(n), Ok(v)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
                    headers.insert(n, v);
                }
            };
            put(format!("x-ratelimit-limit-{kind}"), s.limit.to_string());
            put(
                format!("x-ratelimit-remaining-{kind}"),
                s.remaining.to_string(),
            );
            put(
                format!("x-ratelimit-reset-{kind}"),
                format_duration(s.reset_us),
            );
        }
    }
}

/// A duration as OpenAI writes it in rate-limit headers: `20ms`, `1.5s`, `6m0s`.
pub fn format_duration(us: i64) -> String {
    let ms = (us.max(0) + 999) / 1000;
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (minutes, rest_ms) = (ms / 60_000, ms % 60_000);
    let secs = format!("{:.3}", rest_ms as f64 / 1000.0);
    let secs = secs.trim_end_matches('0').trim_end_matches('.');
    if minutes > 0 {
        format!("{minutes}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_openais() {
        assert_eq!(format_duration(20_000), "20ms");
        assert_eq!(format_duration(1_000_000), "1s");
        assert_eq!(format_duration(1_500_000), "1.5s");
        assert_eq!(format_duration(360_000_000), "6m0s");
        assert_eq!(format_duration(0), "0ms");
    }
}
