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

use crate::state::AppState;

const PAGE: &str = include_str!("../../assets/dashboard.html");

/// The page (public).
pub fn page() -> Router<AppState> {
    Router::new().route("/", get(show))
}

/// Its admin routes (behind the admin key).
pub fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/admin/models", get(super::models::list))
        .route("/admin/playground", post(playground))
}

async fn show() -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-cache")], Html(PAGE))
}

async fn playground(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let mut admitted = state.edge().unguarded();
    admitted.model = (serde_json::from_slice::<serde_json::Value>(&body).ok())
        .and_then(|v| v["model"].as_str().map(str::to_owned));
    let admitted = axum::Extension(admitted);
    super::generate_for("/v1/chat/completions", state, admitted, &headers, body).await
}
