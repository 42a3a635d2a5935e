//! Liveness, readiness and Prometheus metrics.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

use crate::state::AppState;

/// Liveness: the process answers.
pub async fn health() -> impl IntoResponse {
    (
        StatusCode::OK,
        axum::Json(serde_json::json!({"status": "ok"})),
    )
}

/// Readiness: 200 once the local model is loaded (at once without one), 503 before.
pub async fn ready(State(state): State<AppState>) -> impl IntoResponse {
    if state.model_name().is_none() {
        let upstreams: Vec<&str> = state.upstreams().map(|u| u.name.as_str()).collect();
        return (
            StatusCode::OK,
            axum::Json(serde_json::json!({"status": "ready", "upstreams": upstreams})),
        );
    }
    match state.engine() {
        Some(engine) => (
            StatusCode::OK,
            axum::Json(serde_json::json!({
                "status": "ready",
                "model": state.model_name(),
                "max_model_len": engine.info().max_model_len,
            })),
        ),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"status": "loading", "model": state.model_name()})),
        ),
    }
}

/// Prometheus text exposition.
pub async fn metrics() -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::prometheus().render(),
    )
}
