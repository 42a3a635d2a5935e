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

use super::responses::{decide, list_json, steps_json};
use crate::agent::runner;
use crate::error::{ApiError, store_error};
use crate::state::AppState;

/// The routes (behind the admin key).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin/runs", get(list))
        .route("/admin/runs/{id}", get(read))
        .route("/admin/runs/{id}/approve", post(approve))
        .route("/admin/runs/{id}/reject", post(reject))
        .route("/admin/tool-audit", get(tool_audit))
}

#[derive(Deserialize)]
struct ListQuery {
    tenant: Option<String>,
    user: Option<String>,
    status: Option<String>,
    limit: Option<i64>,
    after: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(20).clamp(1, 100);
    let query = osprey_store::RunQuery {
        tenant: q.tenant,
        user: q.user,
        status: q.status,
        before: q.after,
        limit: Some(limit),
    };
    let store = crate::routes::conversations::store(&state)?;
    let records = store.runs(&query).await.map_err(store_error)?;
    Ok(Json(list_json(&records, limit)))
}

async fn read(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let stored = runner::load(&state, None, &id).await?;
    let mut shown = runner::show(&state, &stored);
    shown["osprey"]["tenant"] = stored.record.tenant.clone().into();
    shown["osprey"]["user"] = stored.record.user_id.clone().into();
    shown["osprey"]["steps_taken"] = steps_json(&state, &id).await?["data"].clone();
    Ok(Json(shown))
}

async fn approve(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    decide(&state, None, &id, &body, true).await
}

async fn reject(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    decide(&state, None, &id, &body, false).await
}

#[derive(Deserialize)]
struct AuditQuery {
    tenant: Option<String>,
    run: Option<String>,
    limit: Option<i64>,
}

async fn tool_audit(
    State(state): State<AppState>,
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
        .map_err(store_error)?;
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
