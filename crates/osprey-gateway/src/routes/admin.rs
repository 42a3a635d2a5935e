//! The admin API, behind the admin key: `POST /admin/keys`, `GET /admin/keys`,
//! `DELETE /admin/keys/{id}` (revocation, seen by every replica), and `GET /admin/audit`
//! (`?tenant=NAME&limit=N`): the safety audit log, newest first; per-tenant feature flags:
//! `GET /admin/flags` (`?tenant=NAME`), `PUT /admin/flags/{tenant}/{flag}` with `{"value":
//! ...}` and `DELETE /admin/flags/{tenant}/{flag}`; the prompt registry's routes
//! (`admin_prompts.rs`); users (`admin_users.rs`); the request log (`admin_requests.rs`); agent runs, their
//! approvals and the tool-call audit (`admin_runs.rs`); the engine's scheduling policy
//! (`admin_engine.rs`).

use axum::Json;
use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, put};
use osprey_core::{Error, ErrorKind};
use osprey_store::{KeyRecord, NewKey};
use serde::Deserialize;

use osprey_services::error::ApiError;
use osprey_services::state::Services;

/// The admin routes, each behind [`admin_only`]; with `faults`, the fault-injection route too.
pub fn router(state: Services, faults: bool) -> Router<Services> {
    let routes = match faults {
        true => super::faults::routes(),
        false => Router::new(),
    };
    routes
        .route("/admin/keys", get(list_keys).post(create_key))
        .route("/admin/keys/{id}", delete(revoke_key))
        .route("/admin/audit", get(audit_log))
        .route("/admin/flags", get(list_flags))
        .route(
            "/admin/flags/{tenant}/{flag}",
            put(set_flag).delete(unset_flag),
        )
        .merge(super::admin_prompts::routes())
        .merge(super::admin_users::routes())
        .merge(super::admin_runs::routes())
        .merge(super::admin_engine::routes())
        .merge(super::admin_requests::routes())
        .merge(super::dashboard::admin_routes())
        .route_layer(axum::middleware::from_fn_with_state(state, admin_only))
}

async fn admin_only(State(state): State<Services>, req: Request, next: Next) -> Response {
    let Some(admin_key) = state.edge().config().admin_key.as_deref() else {
        let e = Error::new(
            ErrorKind::Forbidden,
            "The admin API is closed: start the server with --admin-key to open it.",
        );
        return ApiError(e).into_response();
    };
    match osprey_services::auth::presented_key(req.headers()) {
        Some(k) if constant_time_eq(k.as_bytes(), admin_key.as_bytes()) => next.run(req).await,
        _ => ApiError(
            Error::new(
                ErrorKind::Unauthorized,
                "The admin API needs the admin key.",
            )
            .with_code("invalid_api_key"),
        )
        .into_response(),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A key as the admin API shows it (times in Unix seconds; never the secret after creation).
pub fn key_json(k: &KeyRecord) -> serde_json::Value {
    let secs = |ms: Option<i64>| ms.map(|ms| ms / 1000);
    serde_json::json!({
        "id": k.id,
        "object": "api_key",
        "prefix": k.prefix,
        "tenant": k.tenant,
        "name": k.name,
        "rpm": k.rpm,
        "tpm": k.tpm,
        "created_at": k.created_at / 1000,
        "expires_at": secs(k.expires_at),
        "last_used_at": secs(k.last_used_at),
        "revoked_at": secs(k.revoked_at),
        "groups": k.groups(),
        "tool_scopes": k.tool_scopes.as_deref().map(|s| s.split(',').collect::<Vec<_>>()),
    })
}

fn store(state: &Services) -> Result<osprey_store::Store, ApiError> {
    state.edge().auth().store().cloned().ok_or_else(|| {
        ApiError(Error::new(
            ErrorKind::Unavailable,
            "This server has no key store.",
        ))
    })
}

/// A new key.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateKey {
    /// The tenant it belongs to.
    tenant: String,
    /// A name, for people.
    name: Option<String>,
    /// Unix seconds.
    expires_at: Option<i64>,
    /// Requests a minute it may make, at least 1 (default: its tenant's).
    #[schema(minimum = 1)]
    rpm: Option<i64>,
    /// Tokens a minute it may use, at least 1 (default: its tenant's).
    #[schema(minimum = 1)]
    tpm: Option<i64>,
    /// ACL groups the key's requests belong to.
    #[serde(default)]
    groups: Vec<String>,
    /// Tool scopes the key is granted, within its tenant's (default: the tenant's).
    tool_scopes: Option<Vec<String>>,
}

/// Creates an API key for a tenant; the secret is shown this once.
#[utoipa::path(
    post,
    path = "/admin/keys",
    tag = "admin",
    operation_id = "createKey",
    request_body = CreateKey,
    responses(
        (status = 201, description = "The key, with its secret in `key`", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn create_key(
    State(state): State<Services>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let req: CreateKey = serde_json::from_slice(&body)
        .map_err(|e| Error::invalid("body", format!("Invalid key request: {e}")))?;
    if req.tenant.trim().is_empty() {
        return Err(Error::invalid("tenant", "`tenant` must not be empty.").into());
    }
    crate::routes::collections::check_groups(&req.groups, "groups")?;
    if let Some(scopes) = &req.tool_scopes {
        osprey_agent::Scopes::parse(scopes.iter().map(String::as_str))
            .map_err(|e| Error::invalid("tool_scopes", e))?;
    }
    for (field, v) in [("rpm", req.rpm), ("tpm", req.tpm)] {
        if v.is_some_and(|v| v < 1) {
            return Err(Error::invalid(field, format!("`{field}` must be at least 1.")).into());
        }
    }
    let store = store(&state)?;
    let created = store
        .create_key(NewKey {
            tenant: req.tenant,
            name: req.name,
            expires_at: req.expires_at.map(|s| s.saturating_mul(1000)),
            rpm: req.rpm,
            tpm: req.tpm,
            groups: req.groups,
            tool_scopes: req.tool_scopes,
        })
        .await
        .map_err(osprey_core::Error::from)?;
    state
        .edge()
        .auth()
        .refresh()
        .await
        .map_err(osprey_core::Error::from)?;
    let mut body = key_json(&created.record);
    body["key"] = created.secret.into();
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// Every key (never their secrets).
#[utoipa::path(
    get,
    path = "/admin/keys",
    tag = "admin",
    operation_id = "listKeys",
    responses(
        (status = 200, description = "A list of keys", body = Object),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn list_keys(State(state): State<Services>) -> Result<Json<serde_json::Value>, ApiError> {
    let keys = store(&state)?
        .list_keys()
        .await
        .map_err(osprey_core::Error::from)?;
    let data: Vec<_> = keys.iter().map(key_json).collect();
    Ok(Json(serde_json::json!({"object": "list", "data": data})))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct AuditQuery {
    /// Only this tenant's entries.
    tenant: Option<String>,
    /// Entries to list, 1 to 10000 (default 100).
    limit: Option<i64>,
}

/// The safety audit log, newest first.
#[utoipa::path(
    get,
    path = "/admin/audit",
    tag = "admin",
    operation_id = "auditLog",
    params(AuditQuery),
    responses(
        (status = 200, description = "A list of audit entries", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn audit_log(
    State(state): State<Services>,
    axum::extract::Query(q): axum::extract::Query<AuditQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let limit = q.limit.unwrap_or(100).clamp(1, 10_000);
    let entries = store(&state)?
        .audit_log(q.tenant.as_deref(), limit)
        .await
        .map_err(osprey_core::Error::from)?;
    let data: Vec<_> = entries
        .iter()
        .map(|e| {
            serde_json::json!({"at": e.at / 1000, "tenant": e.tenant, "key_id": e.key_id,
                "source": e.source, "category": e.category, "rule": e.rule,
                "action": e.action, "score": e.score})
        })
        .collect();
    Ok(Json(serde_json::json!({"object": "list", "data": data})))
}

/// Revokes a key, for every replica.
#[utoipa::path(
    delete,
    path = "/admin/keys/{id}",
    tag = "admin",
    operation_id = "revokeKey",
    params(("id" = String, Path, description = "The key's id")),
    responses(
        (status = 200, description = "The key, revoked", body = Object),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn revoke_key(
    State(state): State<Services>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let record = store(&state)?
        .revoke_key(&id)
        .await
        .map_err(osprey_core::Error::from)?;
    state.edge().auth().forget(&id);
    if let Some(redis) = state.edge().limiter().redis()
        && let Err(e) = redis.revoke(&id).await
    {
        tracing::warn!(error = %e, key = %id, "could not tell Redis of the revocation; other replicas see it within a second through the store");
    }
    Ok(Json(key_json(&record)))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct FlagQuery {
    /// Only this tenant's flags.
    tenant: Option<String>,
}

/// The feature flags set, per tenant.
#[utoipa::path(
    get,
    path = "/admin/flags",
    tag = "admin",
    operation_id = "listFlags",
    params(FlagQuery),
    responses(
        (status = 200, description = "A list of flags (`tenant`, `flag`, `value`, `updated_at`)", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn list_flags(
    State(state): State<Services>,
    axum::extract::Query(q): axum::extract::Query<FlagQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let flags = store(&state)?
        .flags()
        .await
        .map_err(osprey_core::Error::from)?;
    let data: Vec<_> = (flags.iter())
        .filter(|f| q.tenant.as_deref().is_none_or(|t| t == f.tenant))
        .map(|f| {
            let value: serde_json::Value = serde_json::from_str(&f.value).unwrap_or_default();
            serde_json::json!({"tenant": f.tenant, "flag": f.flag, "value": value,
                "updated_at": f.updated_at / 1000})
        })
        .collect();
    Ok(Json(serde_json::json!({"object": "list", "data": data})))
}

/// Sets a tenant's feature flag.
#[utoipa::path(
    put,
    path = "/admin/flags/{tenant}/{flag}",
    tag = "admin",
    operation_id = "setFlag",
    params(
        ("tenant" = String, Path, description = "The tenant"),
        ("flag" = String, Path, description = "The flag"),
    ),
    request_body(content = Object, description = "`value`: any JSON but null",
        example = json!({"value": true})),
    responses(
        (status = 200, description = "`{\"tenant\", \"flag\", \"value\"}`", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn set_flag(
    State(state): State<Services>,
    Path((tenant, flag)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<serde_json::Value>, ApiError> {
    let v: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| Error::invalid("body", format!("Invalid flag request: {e}")))?;
    let Some(value) = v.get("value").filter(|v| !v.is_null()) else {
        return Err(Error::invalid("value", "give the flag's `value` (any JSON but null)").into());
    };
    store(&state)?
        .set_flag(&tenant, &flag, &value.to_string())
        .await
        .map_err(osprey_core::Error::from)?;
    Ok(Json(
        serde_json::json!({"tenant": tenant, "flag": flag, "value": value}),
    ))
}

/// Removes a tenant's feature flag.
#[utoipa::path(
    delete,
    path = "/admin/flags/{tenant}/{flag}",
    tag = "admin",
    operation_id = "unsetFlag",
    params(
        ("tenant" = String, Path, description = "The tenant"),
        ("flag" = String, Path, description = "The flag"),
    ),
    responses(
        (status = 200, description = "`{\"tenant\", \"flag\", \"deleted\": true}`", body = Object),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn unset_flag(
    State(state): State<Services>,
    Path((tenant, flag)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    (store(&state)?.unset_flag(&tenant, &flag).await).map_err(osprey_core::Error::from)?;
    Ok(Json(
        serde_json::json!({"tenant": tenant, "flag": flag, "deleted": true}),
    ))
}
