//! The admin API's view of users and their requests:
//! - `DELETE /admin/tenants/{tenant}/users/{user}` forgets a user: their conversations,
//!   memory and request-log rows in the store ([`osprey_store::users`]), and the answers kept
//!   for them in the response cache; it says how many of each went;
//! - `GET /admin/requests` (`?tenant=&user=&prompt=&limit=`): the request log, newest first.

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::routing::{delete, get};
use osprey_core::{Error, ErrorKind};
use osprey_store::{Owner, RequestLogEntry, RequestLogQuery};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ApiError, store_error};
use crate::state::AppState;

/// The routes (behind the admin key).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin/tenants/{tenant}/users/{user}", delete(delete_user))
        .route("/admin/requests", get(requests))
}

fn store(state: &AppState) -> Result<&osprey_store::Store, Error> {
    (state.store()).ok_or_else(|| Error::new(ErrorKind::Unavailable, "This server has no store."))
}

async fn delete_user(
    State(state): State<AppState>,
    Path((tenant, user)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let owner = Owner { tenant, user };
    let deleted = (store(&state)?.delete_user(&owner).await).map_err(store_error)?;
    let cached = match state.response_cache() {
        Some(cache) => cache.forget(&owner).await.map_err(|e| {
            Error::new(
                ErrorKind::Unavailable,
                format!("The store forgot the user, but the response cache failed: {e}"),
            )
        })?,
        None => 0,
    };
    tracing::info!(tenant = %owner.tenant, user = %owner.user, ?deleted, cached, "user deleted");
    Ok(Json(json!({
        "object": "user.deleted",
        "tenant": owner.tenant,
        "user": owner.user,
        "deleted": {
            "conversations": deleted.conversations,
            "items": deleted.items,
            "facts": deleted.facts,
            "working": deleted.working,
            "requests": deleted.requests,
            "cached_answers": cached,
        },
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestsQuery {
    tenant: Option<String>,
    user: Option<String>,
    prompt: Option<String>,
    limit: Option<i64>,
}

async fn requests(
    State(state): State<AppState>,
    Query(q): Query<RequestsQuery>,
) -> Result<Json<Value>, ApiError> {
    let query = RequestLogQuery {
        tenant: q.tenant.as_deref(),
        user: q.user.as_deref(),
        prompt: q.prompt.as_deref(),
        limit: q.limit.unwrap_or(100).clamp(1, 10_000),
    };
    let rows = (store(&state)?.request_log(&query).await).map_err(store_error)?;
    let data: Vec<Value> = rows.iter().map(row_json).collect();
    Ok(Json(json!({"object": "list", "data": data})))
}

fn row_json(r: &RequestLogEntry) -> Value {
    let injected: Value = serde_json::from_str(&r.injected).unwrap_or(Value::Null);
    json!({
        "id": r.id, "object": "request", "created_at": r.created_at / 1000,
        "tenant": r.tenant, "user": r.user_id, "route": r.route, "model": r.model,
        "status": r.status, "latency_ms": r.latency_ms, "cache": r.cache,
        "prompt": r.prompt_name.as_ref().map(|n| json!({"name": n, "version": r.prompt_version})),
        "conversation": r.conversation_id, "injected": injected,
    })
}
