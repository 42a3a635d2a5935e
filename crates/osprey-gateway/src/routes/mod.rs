//! The HTTP surface: OpenAI-compatible routes plus health, readiness and metrics; each handler
//! documents itself for the OpenAPI document ([`crate::openapi`]).

pub(crate) mod admin;
pub(crate) mod admin_engine;
pub(crate) mod admin_prompts;
pub(crate) mod admin_requests;
pub(crate) mod admin_users;
pub(crate) mod dashboard;
pub use admin_prompts::valid_name as valid_prompt_name;
pub(crate) mod admin_runs;
pub mod auto;
pub mod batches;
mod chat;
pub mod collections;
mod completions;
pub mod conversations;
pub(crate) mod embeddings;
mod faults;
pub(crate) mod health;
pub(crate) mod memory;
pub(crate) mod models;
pub(crate) mod moderations;
pub(crate) mod responses;
mod worker;

use std::convert::Infallible;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Extension, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::{Stream, StreamExt};
use tower_http::catch_panic::CatchPanicLayer;

use tracing::Instrument;

use crate::degrade::{DEGRADED, DEGRADED_MAX_TOKENS, DEGRADED_PARTIAL_MAX_TOKENS};
use crate::edge::{Admitted, Caller, EdgeLayer, UsageReport};
use crate::error::{ApiError, not_found, panic_response};
use crate::replay;
use crate::state::{AppState, Backend};
use crate::upstream::{ROUTE_REASON, SERVED_BY, Upstream, warrants_fallback};
use osprey_engine::Prompter;
use osprey_router::degrade;

/// The path of chat completions below `/v1`, as [`generate`] takes it.
const CHAT_PATH: &str = "chat/completions";

/// Identifies this build in responses' `system_fingerprint`.
pub const FINGERPRINT: &str = concat!("osprey-", env!("CARGO_PKG_VERSION"));

/// Settings of the HTTP layer.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Serve the admin route that injects faults (`POST /admin/faults/panic`), for the
    /// reliability suites; off in production.
    pub fault_injection: bool,
    /// Terminate TLS here ([`crate::tls`]); plain HTTP without.
    pub tls: Option<std::sync::Arc<crate::tls::ServerConfig>>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 << 20,
            fault_injection: false,
            tls: None,
        }
    }
}

/// All routes, with the edge in front of `/v1`, the body limit, panic isolation and request
/// metrics.
pub fn router(state: AppState, config: &HttpConfig) -> Router {
    let edge = EdgeLayer {
        app: state.clone(),
        max_body_bytes: config.max_body_bytes,
    };
    let generation = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(responses::create))
        .route_layer(axum::middleware::from_fn_with_state(
            edge,
            crate::edge::guard,
        ));
    let listing = Router::new()
        .route("/v1/models", get(models::list))
        .route("/v1/models/{*id}", get(models::get))
        .route("/v1/moderations", post(moderations::create))
        .route("/v1/embeddings", post(embeddings::create))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::edge::authenticate,
        ));
    let files = (batches::routes())
        .merge(conversations::routes())
        .merge(memory::routes())
        .merge(collections::routes())
        .merge(responses::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::edge::authenticate,
        ));
    let routes = Router::new()
        .merge(generation)
        .merge(listing)
        .merge(files)
        .merge(dashboard::page())
        .route("/openapi.json", get(crate::openapi::serve))
        .merge(admin::router(state.clone(), config.fault_injection));
    finish(routes, state, config)
}

/// The routes of `osprey worker`: generation without the edge (the gateway in front did that),
/// the worker protocol (`/worker/load`, `/worker/events`), health, readiness and metrics.
pub fn worker_router(state: AppState, config: &HttpConfig) -> Router {
    finish(worker::routes(), state, config)
}

/// `routes` plus health, readiness, metrics and the layers every server has.
fn finish(routes: Router<AppState>, state: AppState, config: &HttpConfig) -> Router {
    routes
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/metrics", get(health::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(axum::middleware::from_fn(crate::error::enveloped))
        .layer(axum::middleware::from_fn(crate::telemetry::trace))
        .layer(axum::middleware::from_fn(crate::metrics::track))
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(CatchPanicLayer::custom(panic_response))
}

/// A generation request, as the router sees it.
pub trait Routed: osprey_core::api::ApiRequest {
    /// The model it names.
    fn model(&self) -> &str;
    /// The token ids of its (first) prompt, as the engine will see them; errors for a request
    /// the engine would refuse (bad messages or sampling parameters).
    fn prompt_tokens(&self, prompter: &Prompter) -> Result<Vec<u32>, osprey_core::Error>;
}

/// Sends a generation request where its model is served (for `auto`, the model of the tier the
/// router picks; the response names the tier in `x-osprey-tier`), degraded as the ladder's
/// level says (`x-osprey-degraded`). A non-streamed request's successful answer is kept among
/// the recent answers: at level 5, and when every backend failed, the same request is given
/// it again ([`crate::replay`]).
async fn generate<R: Routed>(
    state: AppState,
    admitted: Option<Extension<Admitted>>,
    body: Bytes,
    path: &str,
    local: impl AsyncFn(AppState, R, Caller, Arc<UsageReport>) -> Result<Response, ApiError>,
) -> Result<Response, ApiError> {
    let mut admitted = admitted.map_or_else(|| state.edge().unguarded(), |a| a.0);
    let tenant = admitted.caller.tenant.clone();
    let level = degrade::level_for(state.degradation().level(), tenant.premium);
    let flags = state.flags(&tenant.name).await;
    let mut prompt = path == CHAT_PATH && crate::prompts::named(&body);
    let contextual = path == CHAT_PATH && crate::context::wanted(&body, &flags);
    let rag = path == CHAT_PATH && crate::rag::wanted(&body);
    // An answer given with a user's context, a label's prompt version, or passages retrieved
    // now is not an answer to the body alone.
    let recent = (!replay::is_streamed(&body) && !contextual && !prompt && !rag)
        .then(|| replay::key(&tenant.cache_salt, path, "", &body));
    let cached = |why: &'static str| {
        let answer = state.recent().get(recent.as_ref()?)?;
        metrics::counter!(osprey_core::metrics::CACHED_ANSWERS, "why" => why).increment(1);
        let mut response = answer.marked(replay::CACHE, "hit");
        response.headers_mut().remove(DEGRADED);
        Some(response)
    };
    let (mut body, guarded) = match state.policies() {
        Some(p) => {
            let flagged = crate::flags::policy(&flags).filter(|name| p.has(name));
            let pipeline = p.get(flagged.or(tenant.policy.as_deref())).clone();
            let audit = pipeline.config().audit;
            let auditor = crate::safety::Auditor::new(state.audit_store(), audit, &admitted.caller);
            let screened = crate::safety::screen(&state, &pipeline, &auditor, &body)
                .instrument(tracing::info_span!("guard.input"))
                .await?;
            (screened.body, Some((pipeline, screened.restore, auditor)))
        }
        None => (body, None),
    };
    let retrieved = match rag {
        true => {
            let pipeline = guarded.as_ref().map(|g| g.0.as_ref());
            let (with_passages, retrieved) =
                crate::rag::augment(&state, &admitted.caller, pipeline, &body).await?;
            body = with_passages;
            prompt = crate::prompts::named(&body);
            Some(retrieved)
        }
        false => None,
    };
    let applied = match prompt {
        true => {
            let (with_prompt, applied) =
                crate::prompts::apply(&state, &admitted.caller, &flags, &body)
                    .instrument(tracing::info_span!("prompt"))
                    .await?;
            body = with_prompt;
            Some(applied)
        }
        false => None,
    };
    let mut prepared = match contextual {
        true => {
            let prepared = crate::context::prepare(&state, &admitted.caller, &flags, &body)
                .instrument(tracing::info_span!("memory"))
                .await?;
            body = prepared.body.clone();
            Some(prepared)
        }
        false => None,
    };
    // A user's context makes the answer theirs: cached in their scope, and forgotten with them.
    let owner = (prepared.as_ref())
        .filter(|p| p.is_personal())
        .map(|p| p.owner.clone());
    let scope = match &owner {
        Some(o) => format!("{}\u{0}user\u{0}{}", tenant.cache_salt, o.user),
        None => tenant.cache_salt.clone(),
    };
    let cache_key = (state.response_cache()).and_then(|_| crate::cache::key(&scope, path, &body));
    let hit = match (state.response_cache(), &cache_key) {
        (Some(cache), Some(key)) => cache.get(key).await,
        _ => None,
    };
    let similar = match (
        state.response_cache(),
        crate::semantic_cache::threshold(&flags),
    ) {
        (Some(_), Some(t)) if hit.is_none() && cache_key.is_some() && path == CHAT_PATH => {
            crate::semantic_cache::similar(&state, &scope, path, &body, t).await
        }
        _ => None,
    };
    let mut response = 'answer: {
        let (streamed, usage) = (
            replay::is_streamed(&body),
            crate::body::include_usage(&body),
        );
        if let Some(answer) = hit {
            break 'answer crate::cache::replay(&answer, streamed, usage);
        }
        if let (Some(cache), Some(s)) = (state.response_cache(), &similar)
            && let Some(response) = cache.similar(s, streamed, usage)
        {
            break 'answer response;
        }
        if level >= 5
            && let Some(mut response) = cached("degraded")
        {
            degraded(&mut response, level);
            return Ok(response);
        }
        if level >= 4 && crate::degrade::is_batch(&body, tenant.priority) {
            return Err(crate::degrade::deferred().into());
        }
        let cap = match level {
            5.. => DEGRADED_PARTIAL_MAX_TOKENS,
            _ => DEGRADED_MAX_TOKENS,
        };
        if level >= 1
            && let Some(capped) = crate::body::cap_max_tokens(&body, cap)
        {
            body = capped;
        }
        let mut routed =
            match admitted.model.as_deref() {
                Some(auto::AUTO) => Some(tracing::info_span!("route").in_scope(|| {
                    auto::route(state.tiers(), &admitted.caller, &flags, &body, level)
                })?),
                _ => None,
            };
        let span = tracing::info_span!(
            "backend",
            model = tracing::field::Empty,
            tier = tracing::field::Empty
        );
        let dispatched = match routed.as_mut() {
            Some(routed) => {
                admitted.model = Some(routed.model.clone());
                span.record("model", routed.model.as_str());
                span.record("tier", routed.tier.as_str());
                checked(state.clone(), admitted, routed, path, &local)
                    .instrument(span)
                    .await
            }
            None => {
                span.record("model", admitted.model.as_deref().unwrap_or_default());
                dispatch(state.clone(), admitted, body, path, &local)
                    .instrument(span)
                    .await
            }
        };
        let mut response = match dispatched {
            Ok(response) => response,
            // The last step of every fallback chain: the answer given to this request before.
            Err(e) if warrants_fallback(&e.0) => match cached("fallback") {
                Some(mut response) => {
                    let why = format!("cached answer: {}", e.0.code.as_deref().unwrap_or("failed"));
                    if let Ok(why) = HeaderValue::from_str(&why) {
                        response.headers_mut().insert(ROUTE_REASON, why);
                    }
                    degraded(&mut response, level);
                    return Ok(response);
                }
                None => return Err(e),
            },
            Err(e) => return Err(e),
        };
        degraded(&mut response, level);
        let headers = response.headers_mut();
        if let Some(routed) = routed {
            let reason = match headers.get(ROUTE_REASON).and_then(|r| r.to_str().ok()) {
                Some(then) => format!("{}; {then}", routed.reason),
                None => routed.reason,
            };
            tracing::info!(tier = %routed.tier, model = %routed.model, %reason, level, "auto routed");
            if let (Ok(tier), Ok(reason)) = (
                HeaderValue::from_str(&routed.tier),
                HeaderValue::from_str(&reason),
            ) {
                headers.insert(auto::TIER, tier);
                headers.insert(ROUTE_REASON, reason);
            }
        }
        if let Some((pipeline, restore, auditor)) = guarded {
            response = crate::safety::filter_output(response, &pipeline, restore, &auditor);
        }
        // A degraded answer (capped, a smaller tier) is not the answer to the request as asked.
        match (state.response_cache(), cache_key) {
            (Some(cache), Some(key)) if level == 0 => {
                let slot = crate::cache::Slot {
                    key,
                    owner,
                    similar,
                };
                cache.keep(slot, response).await
            }
            _ => response,
        }
    };
    let mut noted = crate::request_log::Noted::default();
    if let Some(prepared) = prepared.as_mut() {
        if let Some(turn) = prepared.turn.take() {
            response = turn.keep(response).await;
        }
        prepared.mark(&mut response);
        noted.conversation = prepared.conversation.clone();
        noted.user = Some(prepared.owner.user.clone());
        noted.injected = std::mem::take(&mut prepared.injected);
    }
    if let Some(retrieved) = retrieved {
        response = retrieved.cite(response).await;
    }
    if let Some(applied) = &applied {
        applied.mark(&mut response);
        noted.prompt = Some(applied.version());
    }
    response.extensions_mut().insert(noted);
    Ok(match recent {
        Some(key) => state.recent().keep(key, response).await,
        None => response,
    })
}

/// Sends an `auto` request to its tier; with an answer check, asks for logprobs and, when the
/// answer's mean token logprob is below the floor, asks the tier above instead (`routed` then
/// names that tier). The logprobs stay only if the client asked for them.
async fn checked<R: Routed>(
    state: AppState,
    mut admitted: Admitted,
    routed: &mut auto::AutoRoute,
    path: &str,
    local: &impl AsyncFn(AppState, R, Caller, Arc<UsageReport>) -> Result<Response, ApiError>,
) -> Result<Response, ApiError> {
    let Some(check) = routed.check.take() else {
        return dispatch(state, admitted, routed.body.clone(), path, local).await;
    };
    let (body, asked) = auto::asking_logprobs(&routed.body)?;
    let first = dispatch(state.clone(), admitted.clone(), body, path, local).await?;
    if !first.status().is_success() {
        return Ok(first);
    }
    let answer = match replay::Answer::read(first).await {
        Ok(answer) => answer,
        Err(response) => return Ok(response),
    };
    let Some(mut json) = answer.json() else {
        return Ok(answer.response());
    };
    match auto::mean_logprob(&json) {
        Some(mean) if mean < check.floor => {
            metrics::counter!(osprey_core::metrics::AUTO_ANSWERS_ESCALATED, "from" => routed.tier.clone(), "to" => check.tier.clone())
                .increment(1);
            routed.reason.push_str(&format!(
                ", answer logprob {mean:.2} < {:.2}, escalated",
                check.floor
            ));
            (routed.tier, routed.model) = (check.tier, check.model.clone());
            admitted.model = Some(check.model);
            dispatch(state, admitted, check.body, path, local).await
        }
        _ => {
            if !asked {
                auto::without_logprobs(&mut json);
            }
            Ok(answer.response_with(&json))
        }
    }
}

/// Marks `response` degraded to `level`, if it was, and counts it.
fn degraded(response: &mut Response, level: u8) {
    if level > 0 {
        metrics::counter!(osprey_core::metrics::DEGRADED, "level" => level.to_string())
            .increment(1);
        (response.headers_mut()).insert(DEGRADED, HeaderValue::from(u16::from(level)));
    }
}

/// Sends a generation request where its model is served: through an upstream as it is (or
/// to its fallbacks), to a worker of the pool, or parsed for the local engine.
async fn dispatch<R: Routed>(
    state: AppState,
    admitted: Admitted,
    body: Bytes,
    path: &str,
    local: impl AsyncFnOnce(AppState, R, Caller, Arc<UsageReport>) -> Result<Response, ApiError>,
) -> Result<Response, ApiError> {
    let Admitted {
        caller,
        model,
        usage,
    } = admitted;
    let mut body = body;
    let mut reason = None;
    if let Some(model) = model
        && let Ok(Backend::Upstream(upstream)) = state.backend(&model)
    {
        match forward(&state, &caller, upstream, path, &body, &usage).await? {
            Forwarded::Answered(response) => return Ok(response),
            Forwarded::ToLocal { name, why } => {
                body = crate::body::set_model(&body, &name)?;
                reason = Some(why);
            }
        }
    }
    // Anything else is parsed in full first, so a malformed body is reported as such even
    // when it also names an unknown model.
    let request: R = osprey_core::api::parse_request(&body)?;
    if let Ok(Backend::Pool(pool)) = state.backend(request.model()) {
        let prompt = request.prompt_tokens(pool.prompter())?;
        let mut response = pool.forward(path, body, &prompt, &caller, usage).await?;
        if let Some(why) = reason.and_then(|r| HeaderValue::from_str(&r).ok()) {
            response.headers_mut().insert(ROUTE_REASON, why);
        }
        return Ok(response);
    }
    let served_by = state
        .model_name()
        .and_then(|m| HeaderValue::from_str(m).ok());
    let mut response = local(state, request, caller, usage).await?;
    if let Some(name) = served_by {
        response.headers_mut().insert(SERVED_BY, name);
    }
    if let Some(why) = reason.and_then(|r| HeaderValue::from_str(&r).ok()) {
        response.headers_mut().insert(ROUTE_REASON, why);
    }
    Ok(response)
}

/// Where a request sent to an upstream ended up.
enum Forwarded {
    /// Answered by the upstream or one of its upstream fallbacks.
    Answered(Response),
    /// To be served by the local engine's model `name`, a fallback, for the reason `why`.
    ToLocal { name: String, why: String },
}

/// Forwards to `upstream`, and on a failure before the answer to its fallbacks in order (those
/// the tenant may use); a response from a fallback says so in `x-osprey-route-reason`.
async fn forward(
    state: &AppState,
    caller: &Caller,
    upstream: Arc<Upstream>,
    path: &str,
    body: &Bytes,
    usage: &Arc<UsageReport>,
) -> Result<Forwarded, osprey_core::Error> {
    let error = match upstream.forward(path, body.clone(), usage.clone()).await {
        Ok(response) => return Ok(Forwarded::Answered(response)),
        Err(e) if warrants_fallback(&e) => e,
        Err(e) => return Err(e),
    };
    let why = format!(
        "fallback from {}: {}",
        upstream.name,
        error.code.as_deref().unwrap_or("failed")
    );
    let allowed =
        |m: &str| (caller.tenant.models.as_ref()).is_none_or(|ms| ms.iter().any(|a| a == m));
    for name in upstream.fallbacks.iter().filter(|m| allowed(m)) {
        let counted = || {
            metrics::counter!(osprey_core::metrics::FALLBACKS, "from" => upstream.name.clone(), "to" => name.clone())
                .increment(1);
        };
        let fallback = match state.backend(name) {
            Ok(Backend::Upstream(fallback)) => fallback,
            Ok(Backend::Local(_) | Backend::Pool(_)) => {
                counted();
                let name = name.clone();
                return Ok(Forwarded::ToLocal { name, why });
            }
            // Not serving (the local engine still loading): the next one.
            Err(_) => continue,
        };
        let renamed = crate::body::set_model(body, name)?;
        match fallback.forward(path, renamed, usage.clone()).await {
            Ok(mut response) => {
                counted();
                if let Ok(v) = HeaderValue::from_str(&why) {
                    response.headers_mut().insert(ROUTE_REASON, v);
                }
                return Ok(Forwarded::Answered(response));
            }
            Err(e) if warrants_fallback(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(error)
}

/// A generation request for `endpoint` (`/v1/chat/completions` or `/v1/completions`), as its
/// route answers it: once, if `headers` name it ([`replay::idempotency_key`]).
pub(crate) async fn generate_for(
    endpoint: &str,
    state: AppState,
    admitted: Extension<Admitted>,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let started = std::time::Instant::now();
    let (caller, model) = (admitted.caller.clone(), admitted.model.clone());
    let usage = admitted.usage.clone();
    if state.request_log().is_some() {
        let rate = caller.tenant.log_text_sample_rate;
        crate::request_log::sample_prompt(rate, &body, &caller.record);
    }
    let scope = admitted.caller.tenant.cache_salt.clone();
    let key = replay::idempotency_key(headers, &scope, endpoint, &body);
    let admitted = Some(admitted);
    let answer = async {
        let answer = match endpoint {
            "/v1/chat/completions" => {
                generate(
                    state.clone(),
                    admitted,
                    body,
                    CHAT_PATH,
                    chat::chat_completions,
                )
                .await
            }
            _ => {
                let path = "completions";
                generate(
                    state.clone(),
                    admitted,
                    body,
                    path,
                    completions::completions,
                )
                .await
            }
        };
        answer.into_response()
    };
    let mut response = match key {
        Some(key) => state.replays().once(key, answer).await,
        None => answer.await,
    };
    if let Some(log) = state.request_log() {
        let model = model.as_deref().unwrap_or_default();
        let id = headers.get(crate::upstream::REQUEST_ID);
        let entry =
            crate::request_log::entry(&caller, (endpoint, model), id, started, &mut response);
        let log = log.clone();
        response = crate::request_log::attach(log, entry, caller, usage, started, response);
    }
    response
}

/// Asks for a chat completion on behalf of `caller` outside a client's request (a summary, a
/// step of the gateway's own): the text of its answer. `body` names the model; the request
/// goes where that model is served, unscreened and uncounted by the edge.
pub(crate) async fn complete_chat(
    state: &AppState,
    caller: &Caller,
    body: serde_json::Value,
) -> Result<String, osprey_core::Error> {
    let answer = chat_answer(state, caller, body).await?;
    Ok((answer["choices"][0]["message"]["content"].as_str())
        .unwrap_or_default()
        .to_owned())
}

/// Like [`complete_chat`], the whole answer (its message with any tool calls, its usage).
pub(crate) async fn chat_answer(
    state: &AppState,
    caller: &Caller,
    body: serde_json::Value,
) -> Result<serde_json::Value, osprey_core::Error> {
    let admitted = Admitted {
        caller: caller.with_fresh_record(),
        model: body["model"].as_str().map(str::to_owned),
        usage: Arc::default(),
    };
    let body = Bytes::from(serde_json::to_vec(&body).expect("JSON serialises"));
    let response = dispatch(
        state.clone(),
        admitted,
        body,
        CHAT_PATH,
        chat::chat_completions,
    )
    .await
    .map_err(|e| e.0)?;
    let status = response.status();
    let answer = match replay::Answer::read(response).await {
        Ok(answer) => answer.json(),
        Err(_) => None,
    };
    let answer = answer.unwrap_or_default();
    if !status.is_success() {
        let why = answer["error"]["message"].as_str().unwrap_or("failed");
        return Err(osprey_core::Error::new(
            osprey_core::ErrorKind::BadGateway,
            format!("the gateway's own request failed ({status}): {why}"),
        ));
    }
    Ok(answer)
}

/// Creates a chat completion: the answer to a conversation, streamed or whole, from the model
/// the body names (served locally, by workers, by an upstream, or by the tier `auto` picks).
#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    tag = "generation",
    operation_id = "createChatCompletion",
    request_body(content = osprey_core::api::ChatCompletionRequest, example = json!({
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8
    })),
    responses(
        (status = 200, description = "The answer; with `\"stream\": true`, server-sent events, \
            each `data:` a `ChatCompletionChunk`, then `data: [DONE]`", content(
            (osprey_core::api::ChatCompletion = "application/json"),
            (crate::openapi::ChatCompletionEvent = "text/event-stream"),
        )),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 404, response = crate::openapi::NotFound),
        (status = 502, response = crate::openapi::BadGateway),
        (status = 504, response = crate::openapi::GatewayTimeout),
        crate::openapi::EdgeErrors,
    ),
    security(("api_key" = []))
)]
async fn chat_completions(
    State(state): State<AppState>,
    admitted: Option<Extension<Admitted>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let admitted = admitted.unwrap_or_else(|| Extension(state.edge().unguarded()));
    generate_for("/v1/chat/completions", state, admitted, &headers, body).await
}

/// Creates a text completion of one or more prompts, streamed or whole.
#[utoipa::path(
    post,
    path = "/v1/completions",
    tag = "generation",
    operation_id = "createCompletion",
    request_body(content = osprey_core::api::CompletionRequest, example = json!({
        "model": "smollm2-135m-instruct",
        "prompt": "Once upon a time",
        "max_tokens": 8
    })),
    responses(
        (status = 200, description = "The completions; with `\"stream\": true`, server-sent \
            events, each `data:` a `Completion` chunk, then `data: [DONE]`", content(
            (osprey_core::api::Completion = "application/json"),
            (crate::openapi::CompletionEvent = "text/event-stream"),
        )),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 404, response = crate::openapi::NotFound),
        (status = 502, response = crate::openapi::BadGateway),
        (status = 504, response = crate::openapi::GatewayTimeout),
        crate::openapi::EdgeErrors,
    ),
    security(("api_key" = []))
)]
async fn completions(
    State(state): State<AppState>,
    admitted: Option<Extension<Admitted>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let admitted = admitted.unwrap_or_else(|| Extension(state.edge().unguarded()));
    generate_for("/v1/completions", state, admitted, &headers, body).await
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let e = osprey_core::Error::invalid(
        "method",
        format!("{method} is not allowed on {}.", uri.path()),
    );
    let mut r = crate::error::ApiError(e).into_response();
    *r.status_mut() = axum::http::StatusCode::METHOD_NOT_ALLOWED;
    r
}

/// A fresh response id with `prefix`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

/// One SSE event carrying `value` as JSON.
pub fn json_event(value: &impl serde::Serialize) -> Event {
    Event::default()
        .data(serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")))
}

/// The `data: [DONE]` event that ends an OpenAI stream.
pub fn done_event() -> Event {
    Event::default().data("[DONE]")
}

/// An SSE response over `events`.
pub fn stream_response(events: impl Stream<Item = Event> + Send + 'static) -> Response {
    Sse::new(events.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Runs `body` as a task feeding a stream of events; the task stops (dropping its generations,
/// which cancels them) when the client's connection goes away.
pub fn async_stream<F, Fut>(body: F) -> impl Stream<Item = Event> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Event>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), tokio::sync::mpsc::error::SendError<Event>>>
        + Send
        + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let _ = body(tx).await;
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
