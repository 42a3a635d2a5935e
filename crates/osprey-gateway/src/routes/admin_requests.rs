//! The request log through the admin API: for any request, where its time went and why it
//! went where it did.
//! - `GET /admin/requests`: rows newest first, filtered by `tenant`, `user`, `prompt`, `model`,
//!   `status`, `since` (Unix seconds); `limit` rows a page (default 100), and `before=SEQ` for
//!   the next page (each page says its `next`).
//! - `GET /admin/requests/{id}`: one request's row.

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::routing::get;
use osprey_core::{Error, ErrorKind};
use osprey_store::{RequestLogEntry, RequestLogQuery};
use serde::Deserialize;
use serde_json::{Value, json};

use osprey_services::error::ApiError;
use osprey_services::state::Services;

/// The routes (behind the admin key).
pub fn routes() -> Router<Services> {
    Router::new()
        .route("/admin/requests", get(list))
        .route("/admin/requests/{id}", get(one))
}

fn store(state: &Services) -> Result<&osprey_store::Store, Error> {
    (state.store()).ok_or_else(|| Error::new(ErrorKind::Unavailable, "This server has no store."))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// Only this tenant's requests.
    tenant: Option<String>,
    /// Only this user's.
    user: Option<String>,
    /// Only those that used this prompt.
    prompt: Option<String>,
    /// Only those for this model.
    model: Option<String>,
    /// Only those answered with this HTTP status.
    status: Option<i64>,
    /// Only those since, Unix seconds.
    since: Option<i64>,
    /// Only those before this `seq` (the previous page's `next`).
    before: Option<i64>,
    /// Rows a page, 1 to 1000 (default 100).
    limit: Option<i64>,
}

/// The request log, newest first.
#[utoipa::path(
    get,
    path = "/admin/requests",
    tag = "admin",
    operation_id = "listRequests",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of rows (`data`, and `next`: the `before` of \
            the next page)", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn list(
    State(state): State<Services>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let query = RequestLogQuery {
        tenant: q.tenant.as_deref(),
        user: q.user.as_deref(),
        prompt: q.prompt.as_deref(),
        model: q.model.as_deref(),
        status: q.status,
        since: q.since.map(|s| s.saturating_mul(1000)),
        before: q.before,
        limit: q.limit.unwrap_or(100).clamp(1, 1000),
    };
    let rows = (store(&state)?.request_log(&query).await).map_err(osprey_core::Error::from)?;
    let next = (rows.len() as i64 == query.limit)
        .then(|| rows.last().map(|r| r.seq))
        .flatten();
    let data: Vec<Value> = rows.iter().map(row_json).collect();
    Ok(Json(json!({"object": "list", "data": data, "next": next})))
}

/// One request's row of the request log.
#[utoipa::path(
    get,
    path = "/admin/requests/{id}",
    tag = "admin",
    operation_id = "getRequest",
    params(("id" = String, Path, description = "The request's id")),
    responses(
        (status = 200, description = "The row", body = Object),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn one(
    State(state): State<Services>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let row =
        (store(&state)?.request_log_entry(&id, None).await).map_err(osprey_core::Error::from)?;
    let row = row.ok_or_else(|| {
        Error::new(
            ErrorKind::NotFound,
            format!("No request `{id}` in the request log."),
        )
        .with_code("request_not_found")
    })?;
    Ok(Json(row_json(&row)))
}

/// A row as the admin API shows it.
pub fn row_json(r: &RequestLogEntry) -> Value {
    let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap_or(Value::Null);
    json!({
        "id": r.id, "object": "request", "seq": r.seq, "created_at": r.created_at / 1000,
        "tenant": r.tenant, "user": r.user_id, "key_id": r.key_id,
        "route": r.route, "model": r.model, "tier": r.tier, "route_reason": r.route_reason,
        "status": r.status, "error": r.error, "cache": r.cache,
        "prompt": r.prompt_name.as_ref().map(|n| json!({"name": n, "version": r.prompt_version})),
        "conversation": r.conversation_id, "injected": parse(&r.injected),
        "tokens": {"prompt": r.prompt_tokens, "completion": r.completion_tokens},
        "timings": {
            "headers_ms": r.latency_ms, "ttft_ms": r.ttft_ms,
            "tpot_ms": r.tpot_us.map(|us| us as f64 / 1000.0), "total_ms": r.total_ms,
        },
        "latency_ms": r.latency_ms,
        "trace_id": r.trace_id,
        "detail": parse(&r.detail),
        "text": {"prompt": r.prompt_text, "response": r.response_text},
    })
}
