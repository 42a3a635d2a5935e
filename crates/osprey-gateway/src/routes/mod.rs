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
pub mod batches;
pub mod collections;
pub mod conversations;
pub(crate) mod embeddings;
mod faults;
pub(crate) mod health;
pub(crate) mod memory;
pub(crate) mod models;
pub(crate) mod moderations;
pub(crate) mod responses;
mod worker;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Extension, Request, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use osprey_core::api::{ChatCompletionRequest, CompletionRequest, JsonBody};
use tower_http::catch_panic::CatchPanicLayer;

use crate::edge::EdgeLayer;
use crate::error::{not_found, panic_response};
use osprey_services::edge::Admitted;
use osprey_services::error::ApiError;
use osprey_services::pipeline::{self, CHAT_PATH, COMPLETIONS_PATH};
use osprey_services::replay;
pub use osprey_services::sse::FINGERPRINT;
use osprey_services::state::Services;

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
pub fn router(state: Services, config: &HttpConfig) -> Router {
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
pub fn worker_router(state: Services, config: &HttpConfig) -> Router {
    finish(worker::routes(), state, config)
}

/// `routes` plus health, readiness, metrics and the layers every server has.
fn finish(routes: Router<Services>, state: Services, config: &HttpConfig) -> Router {
    routes
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/metrics", get(health::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(axum::middleware::from_fn(crate::error::enveloped))
        .layer(axum::middleware::from_fn(osprey_services::telemetry::trace))
        .layer(axum::middleware::from_fn(osprey_services::metrics::track))
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(CatchPanicLayer::custom(panic_response))
}

/// What a generation route takes of its request: the caller the edge admitted, the headers,
/// and the body as the edge parsed it (taken, not copied), or parsed here if the edge could not.
async fn admitted_request(
    state: &Services,
    req: Request,
) -> (Admitted, HeaderMap, Result<JsonBody, osprey_core::Error>) {
    let (mut parts, body) = req.into_parts();
    let admitted =
        (parts.extensions.remove::<Admitted>()).unwrap_or_else(|| state.edge().unguarded());
    let body = match parts.extensions.remove::<JsonBody>() {
        Some(parsed) => Ok(parsed),
        // The edge read the body already (within the size limit), and passed it on as bytes.
        None => match axum::body::to_bytes(body, usize::MAX).await {
            Ok(bytes) => JsonBody::parse(bytes),
            Err(e) => Err(osprey_core::Error::invalid("body", e.to_string())),
        },
    };
    (admitted, parts.headers, body)
}

/// A generation request for `endpoint` (`/v1/chat/completions` or `/v1/completions`), as its
/// route answers it: once, if `headers` name it ([`replay::idempotency_key`]), and logged.
pub(crate) async fn generate_for(
    endpoint: &str,
    state: Services,
    admitted: Extension<Admitted>,
    headers: &HeaderMap,
    body: Result<JsonBody, osprey_core::Error>,
) -> Response {
    let started = std::time::Instant::now();
    let Extension(admitted) = admitted;
    let (caller, model, usage) = (
        admitted.caller.clone(),
        admitted.model.clone(),
        admitted.usage.clone(),
    );
    if let (Some(_), Ok(body)) = (state.request_log(), &body) {
        let rate = caller.tenant.log_text_sample_rate;
        osprey_services::request_log::sample_prompt(rate, body, &caller.record);
    }
    let scope = &caller.tenant.cache_salt;
    let key =
        (body.as_ref().ok()).and_then(|b| replay::idempotency_key(headers, scope, endpoint, b));
    let answer = async {
        let answer = match (body, endpoint) {
            (Err(e), _) => Err(ApiError(e)),
            (Ok(body), "/v1/chat/completions") => {
                pipeline::run::<ChatCompletionRequest>(&state, admitted, body, CHAT_PATH).await
            }
            (Ok(body), _) => {
                pipeline::run::<CompletionRequest>(&state, admitted, body, COMPLETIONS_PATH).await
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
        let id = headers.get(osprey_router::upstream::REQUEST_ID);
        let entry = osprey_services::request_log::entry(
            &caller,
            (endpoint, model),
            id,
            started,
            &mut response,
        );
        let log = log.clone();
        response =
            osprey_services::request_log::attach(log, entry, caller, usage, started, response)
                .await;
    }
    response
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
async fn chat_completions(State(state): State<Services>, req: Request) -> Response {
    let (admitted, headers, body) = admitted_request(&state, req).await;
    let admitted = Extension(admitted);
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
async fn completions(State(state): State<Services>, req: Request) -> Response {
    let (admitted, headers, body) = admitted_request(&state, req).await;
    let admitted = Extension(admitted);
    generate_for("/v1/completions", state, admitted, &headers, body).await
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let e = osprey_core::Error::invalid(
        "method",
        format!("{method} is not allowed on {}.", uri.path()),
    );
    let mut r = osprey_services::error::ApiError(e).into_response();
    *r.status_mut() = axum::http::StatusCode::METHOD_NOT_ALLOWED;
    r
}
