//! Liveness, readiness and Prometheus metrics.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

use osprey_services::state::Services;

/// Liveness: the process answers.
#[utoipa::path(
    get,
    path = "/health",
    tag = "operations",
    operation_id = "health",
    responses((status = 200, description = "`{\"status\": \"ok\"}`", body = Object))
)]
pub async fn health() -> impl IntoResponse {
    (
        StatusCode::OK,
        axum::Json(serde_json::json!({"status": "ok"})),
    )
}

/// Readiness: 200 once every local model is loaded, or one of its workers is live (at once
/// without either), 503 before.
#[utoipa::path(
    get,
    path = "/ready",
    tag = "operations",
    operation_id = "ready",
    responses(
        (status = 200, description = "Ready (`status`, the model, its workers or upstreams)", body = Object),
        (status = 503, description = "Not yet: the model loading, or no worker live", body = Object),
    )
)]
pub async fn ready(State(state): State<Services>) -> impl IntoResponse {
    if let Some(pool) = state.pool() {
        let workers = pool.workers();
        let live = workers.iter().filter(|(_, live)| *live).count();
        let status = if live > 0 {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        let workers: Vec<_> = (workers.iter())
            .map(|(url, live)| serde_json::json!({"url": url, "live": live}))
            .collect();
        let body = serde_json::json!({
            "status": if live > 0 { "ready" } else { "no_live_worker" },
            "model": pool.name(),
            "workers": workers,
        });
        return (status, axum::Json(body));
    }
    if state.model_name().is_none() {
        let upstreams: Vec<&str> = state.upstreams().map(|u| u.name.as_str()).collect();
        return (
            StatusCode::OK,
            axum::Json(serde_json::json!({"status": "ready", "upstreams": upstreams})),
        );
    }
    // Ready once every local model has loaded; `model` names the first (the default).
    let models: Vec<serde_json::Value> = (state.local_models())
        .map(|m| match (m.engine, m.load_error) {
            (Some(engine), _) => serde_json::json!({"model": m.name, "status": "ready",
                "max_model_len": engine.info().max_model_len}),
            (None, Some(e)) => serde_json::json!({"model": m.name, "status": "failed", "error": e}),
            (None, None) => serde_json::json!({"model": m.name, "status": "loading"}),
        })
        .collect();
    let status_of = |m: &serde_json::Value| m["status"].as_str().unwrap_or_default().to_owned();
    let status = (models.iter().map(status_of))
        .find(|s| s != "ready")
        .unwrap_or_else(|| "ready".to_owned());
    let mut body = models[0].clone();
    body["status"] = status.clone().into();
    if models.len() > 1 {
        body["models"] = models.into();
    }
    let code = match status.as_str() {
        "ready" => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    (code, axum::Json(body))
}

/// Prometheus text exposition (404 with metrics off).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    operation_id = "metrics",
    responses(
        (status = 200, description = "Prometheus text exposition", body = String,
            content_type = "text/plain"),
        (status = 404, response = crate::openapi::NotFound),
    )
)]
pub async fn metrics(State(state): State<Services>) -> axum::response::Response {
    let Some(handle) = osprey_services::metrics::install() else {
        let off = osprey_core::Error::new(
            osprey_core::ErrorKind::NotFound,
            "Metrics are off (--no-metrics).",
        );
        return osprey_services::error::ApiError(off).into_response();
    };
    // Staleness is read when scraped: it grows with time, not with events.
    let library = state.library().clone();
    if let Ok(stale) = tokio::task::spawn_blocking(move || library.stale()).await {
        metrics::gauge!(osprey_core::metrics::RAG_STALE_COLLECTIONS).set(stale.len() as f64);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        handle.render(),
    )
        .into_response()
}
