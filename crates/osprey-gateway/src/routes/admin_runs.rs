//! The admin API's view of agent runs (behind the admin key):
//! - `GET /admin/runs` (`?tenant=&user=&status=&limit=&after=`) and `GET /admin/runs/{id}`
//!   (the response object with its steps): every tenant's runs;
//! - `POST /admin/runs/{id}/approve` and `/reject` (`{"approval_request_id", "reason"}`): an
//!   operator answers a call waiting for approval (`osprey runs approve|reject`);
//! - `GET /admin/tool-audit` (`?tenant=&run=&limit=`): every audited tool call, newest first.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::responses::{decide, list_json, runs_page, steps_json};
use osprey_services::agent::runner;
use osprey_services::error::ApiError;
use osprey_services::state::Services;

/// The routes (behind the admin key).
pub fn routes() -> Router<Services> {
    Router::new()
        .route("/admin/runs", get(list))
        .route("/admin/runs/{id}", get(read))
        .route("/admin/runs/{id}/approve", post(approve))
        .route("/admin/runs/{id}/reject", post(reject))
        .route("/admin/tool-audit", get(tool_audit))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only this tenant's runs.
    tenant: Option<String>,
    /// Only this user's.
    user: Option<String>,
    /// Only runs in this status.
    status: Option<String>,
    /// Runs a page, 1 to 100 (default 20).
    limit: Option<i64>,
    /// The run to list after.
    after: Option<String>,
}

/// Every tenant's agent runs, newest first.
#[utoipa::path(
    get,
    path = "/admin/runs",
    tag = "admin",
    operation_id = "listRuns",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of runs", body = Object),
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
    let limit = q.limit.unwrap_or(20).clamp(1, 100);
    let query = osprey_store::RunQuery {
        tenant: q.tenant,
        user: q.user,
        status: q.status.filter(|s| !s.is_empty()),
        before: q.after.filter(|a| !a.is_empty()),
        limit: Some(limit),
    };
    let store = crate::routes::conversations::store(&state)?;
    Ok(Json(list_json(&runs_page(store, &query).await?, limit)))
}

/// A run, with its tenant, user and steps.
#[utoipa::path(
    get,
    path = "/admin/runs/{id}",
    tag = "admin",
    operation_id = "getRun",
    params(("id" = String, Path, description = "The run's (response's) id")),
    responses(
        (status = 200, description = "The response object", body = Object),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn read(
    State(state): State<Services>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let stored = runner::load(&state, None, &id).await?;
    let mut shown = runner::show(&state, &stored);
    shown["osprey"]["tenant"] = stored.record.tenant.clone().into();
    shown["osprey"]["user"] = stored.record.user_id.clone().into();
    shown["osprey"]["steps_taken"] = steps_json(&state, &id).await?["data"].clone();
    Ok(Json(shown))
}

/// An operator approves a call a paused run waits on.
#[utoipa::path(
    post,
    path = "/admin/runs/{id}/approve",
    tag = "admin",
    operation_id = "approveRun",
    params(("id" = String, Path, description = "The run's (response's) id")),
    request_body(content = super::responses::Answer, description = "Optional: which request, and why"),
    responses(
        (status = 200, description = "The run, resumed", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn approve(
    State(state): State<Services>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    decide(&state, None, &id, &body, true).await
}

/// An operator rejects a call a paused run waits on.
#[utoipa::path(
    post,
    path = "/admin/runs/{id}/reject",
    tag = "admin",
    operation_id = "rejectRun",
    params(("id" = String, Path, description = "The run's (response's) id")),
    request_body(content = super::responses::Answer, description = "Optional: which request, and why"),
    responses(
        (status = 200, description = "The run, resumed", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn reject(
    State(state): State<Services>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    decide(&state, None, &id, &body, false).await
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct AuditQuery {
    /// Only this tenant's calls.
    tenant: Option<String>,
    /// Only this run's.
    run: Option<String>,
    /// Calls to list (default 100).
    limit: Option<i64>,
}

/// Every audited tool call, newest first.
#[utoipa::path(
    get,
    path = "/admin/tool-audit",
    tag = "admin",
    operation_id = "toolAudit",
    params(AuditQuery),
    responses(
        (status = 200, description = "A list of tool calls", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn tool_audit(
    State(state): State<Services>,
    Query(q): Query<AuditQuery>,
) -> Result<Json<Value>, ApiError> {
    let store = crate::routes::conversations::store(&state)?;
    let rows = store
        .tool_audit_log(
            q.tenant.as_deref(),
            q.run.as_deref(),
            q.limit.unwrap_or(100),
        )
        .await
        .map_err(osprey_core::Error::from)?;
    let data: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"at": r.at / 1000, "tenant": r.tenant, "key_id": r.key_id, "run_id": r.run_id,
                "call_id": r.call_id, "tool": r.tool, "arguments": r.arguments,
                "result_bytes": r.result_bytes, "duration_ms": r.duration_ms,
                "verdict": r.verdict, "detail": r.detail})
        })
        .collect();
    Ok(Json(json!({"object": "list", "data": data})))
}
