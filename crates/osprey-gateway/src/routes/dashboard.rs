//! Osprey's own page, `GET /`: live charts from `/metrics`, the request log with a detail view
//! of each request, and a playground. The page (one file, no CDN) is built into the binary and
//! loads without a key; what it shows beyond the public metrics comes from admin routes, so it
//! asks for the admin key once keys exist:
//! - `GET /admin/models`: the models served, for the playground;
//! - `POST /admin/playground`: a chat completion as the open tenant (`default`), as a client
//!   would send it, past the rate limits.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};

use osprey_services::state::Services;

const PAGE: &str = include_str!("../../assets/dashboard.html");

/// The page (public).
pub fn page() -> Router<Services> {
    Router::new().route("/", get(show))
}

/// Its admin routes (behind the admin key).
pub fn admin_routes() -> Router<Services> {
    Router::new()
        .route("/admin/models", get(models))
        .route("/admin/playground", post(playground))
}

/// Osprey's page: live charts, the request log, a playground.
#[utoipa::path(
    get,
    path = "/",
    tag = "operations",
    operation_id = "dashboard",
    responses((status = 200, description = "The page", body = String, content_type = "text/html"))
)]
async fn show() -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-cache")], Html(PAGE))
}

/// The models served, for the playground: `GET /v1/models` behind the admin key.
#[utoipa::path(
    get,
    path = "/admin/models",
    tag = "admin",
    operation_id = "adminListModels",
    responses(
        (status = 200, description = "The served models", body = osprey_core::api::ModelList),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn models(state: State<Services>) -> axum::Json<osprey_core::api::ModelList> {
    super::models::list(state).await
}

/// A chat completion as the open tenant, past the rate limits, for the dashboard's playground.
#[utoipa::path(
    post,
    path = "/admin/playground",
    tag = "admin",
    operation_id = "playground",
    request_body(content = osprey_core::api::ChatCompletionRequest, example = json!({
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8
    })),
    responses(
        (status = 200, description = "The answer, as `POST /v1/chat/completions` gives it", content(
            (osprey_core::api::ChatCompletion = "application/json"),
            (crate::openapi::ChatCompletionEvent = "text/event-stream"),
        )),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 404, response = crate::openapi::NotFound),
        (status = 429, response = crate::openapi::RateLimited),
        (status = 502, response = crate::openapi::BadGateway),
        (status = 503, response = crate::openapi::Unavailable),
        (status = 504, response = crate::openapi::GatewayTimeout),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn playground(State(state): State<Services>, headers: HeaderMap, body: Bytes) -> Response {
    let mut admitted = state.edge().unguarded();
    let body = osprey_core::api::JsonBody::parse(body);
    admitted.model = (body.as_ref().ok())
        .map(|b| b.model().to_owned())
        .filter(|m| !m.is_empty());
    let admitted = axum::Extension(admitted);
    super::generate_for("/v1/chat/completions", state, admitted, &headers, body).await
}
