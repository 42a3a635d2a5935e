//! The prompt registry's admin API (behind the admin key), the same operations as `osprey
//! prompts`: `GET /admin/prompts`; `POST /admin/prompts/{name}` pushes a new version (the body
//! is the definition, JSON); `GET /admin/prompts/{name}` lists its versions and labels;
//! `GET /admin/prompts/{name}/versions/{version}`; `GET /admin/prompts/{name}/diff?from=V&to=W`;
//! `PUT /admin/prompts/{name}/labels/{label}` with `{"version": 3}` or `{"split": "3:90,4:10"}`;
//! `POST /admin/prompts/{name}/labels/{label}/rollback`.

use std::collections::HashMap;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use osprey_context::prompt::{PromptDef, diff, parse_split};
use osprey_core::{Error, ErrorKind};
use osprey_store::{Split, Store};
use serde_json::{Value, json};

use osprey_services::error::ApiError;
use osprey_services::state::Services;

/// The routes (the caller puts them behind the admin key).
pub fn routes() -> Router<Services> {
    Router::new()
        .route("/admin/prompts", get(list))
        .route("/admin/prompts/{name}", get(show).post(push))
        .route("/admin/prompts/{name}/versions/{version}", get(version))
        .route("/admin/prompts/{name}/diff", get(diff_versions))
        .route("/admin/prompts/{name}/labels/{label}", put(set_label))
        .route(
            "/admin/prompts/{name}/labels/{label}/rollback",
            post(rollback),
        )
}

fn store(state: &Services) -> Result<Store, Error> {
    state.audit_store().ok_or_else(|| {
        Error::new(
            ErrorKind::Unavailable,
            "This server has no store for prompts.",
        )
    })
}

fn split_json(split: &Split) -> Value {
    json!(
        split
            .iter()
            .map(|(v, w)| json!({"version": v, "weight": w}))
            .collect::<Vec<_>>()
    )
}

/// Every prompt, its latest version and its labels.
#[utoipa::path(
    get,
    path = "/admin/prompts",
    tag = "admin",
    operation_id = "listPrompts",
    responses(
        (status = 200, description = "A list of prompts", body = Object),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn list(State(state): State<Services>) -> Result<Json<Value>, ApiError> {
    let prompts = store(&state)?
        .list_prompts()
        .await
        .map_err(osprey_core::Error::from)?;
    let data: Vec<Value> = (prompts.iter())
        .map(|p| {
            let labels: serde_json::Map<String, Value> = (p.labels.iter())
                .map(|(l, s)| (l.clone(), split_json(s)))
                .collect();
            json!({"name": p.name, "latest_version": p.latest, "labels": labels})
        })
        .collect();
    Ok(Json(json!({"object": "list", "data": data})))
}

/// Pushes a new version of a prompt.
#[utoipa::path(
    post,
    path = "/admin/prompts/{name}",
    tag = "admin",
    operation_id = "pushPrompt",
    params(("name" = String, Path, description = "1 to 128 letters, digits, `-`, `_`, `.` or `/`")),
    request_body(description = "The prompt's definition, JSON or TOML (as `osprey prompts push` reads it)",
        content(
            (Object = "application/json"),
            (String = "application/toml"),
        )),
    responses(
        (status = 201, description = "`{\"name\", \"version\", \"created_at\"}`", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn push(
    State(state): State<Services>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let text = std::str::from_utf8(&body)
        .map_err(|_| Error::invalid("body", "the prompt definition must be UTF-8"))?;
    let def = PromptDef::parse(text).map_err(|e| Error::invalid("body", e.to_string()))?;
    valid_name(&name)?;
    let v = (store(&state)?.push_prompt(&name, &def.to_json()).await)
        .map_err(osprey_core::Error::from)?;
    let body = json!({"name": v.name, "version": v.version, "created_at": v.created_at / 1000});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// Names are what requests and the CLI write: letters, digits, `-`, `_`, `.`, `/`.
pub fn valid_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && (name.chars()).all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    match ok {
        true => Ok(()),
        false => Err(Error::invalid(
            "name",
            "a prompt's name is 1 to 128 letters, digits, `-`, `_`, `.` or `/`",
        )),
    }
}

/// A prompt's versions and labels.
#[utoipa::path(
    get,
    path = "/admin/prompts/{name}",
    tag = "admin",
    operation_id = "getPrompt",
    params(("name" = String, Path, description = "The prompt's name")),
    responses(
        (status = 200, description = "`{\"name\", \"versions\", \"labels\"}`", body = Object),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn show(
    State(state): State<Services>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let store = store(&state)?;
    let versions = store
        .prompt_versions(&name)
        .await
        .map_err(osprey_core::Error::from)?;
    if versions.is_empty() {
        return Err(
            osprey_core::Error::from(osprey_store::StoreError::NotFound(format!("prompt {name}")))
                .into(),
        );
    }
    let labels = store
        .labels(&name)
        .await
        .map_err(osprey_core::Error::from)?;
    let labels: serde_json::Map<String, Value> = (labels.iter())
        .map(|(l, s)| (l.clone(), split_json(s)))
        .collect();
    let versions: Vec<Value> = (versions.iter())
        .map(|v| json!({"version": v.version, "created_at": v.created_at / 1000}))
        .collect();
    Ok(Json(
        json!({"name": name, "versions": versions, "labels": labels}),
    ))
}

/// One version of a prompt, with its definition.
#[utoipa::path(
    get,
    path = "/admin/prompts/{name}/versions/{version}",
    tag = "admin",
    operation_id = "getPromptVersion",
    params(
        ("name" = String, Path, description = "The prompt's name"),
        ("version" = i64, Path, description = "The version's number"),
    ),
    responses(
        (status = 200, description = "`{\"name\", \"version\", \"created_at\", \"definition\"}`", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn version(
    State(state): State<Services>,
    Path((name, version)): Path<(String, i64)>,
) -> Result<Json<Value>, ApiError> {
    let v =
        (store(&state)?.prompt_version(&name, version).await).map_err(osprey_core::Error::from)?;
    let definition: Value = serde_json::from_str(&v.body).unwrap_or(Value::Null);
    Ok(Json(
        json!({"name": v.name, "version": v.version, "created_at": v.created_at / 1000, "definition": definition}),
    ))
}

/// The difference between two versions of a prompt.
#[utoipa::path(
    get,
    path = "/admin/prompts/{name}/diff",
    tag = "admin",
    operation_id = "diffPromptVersions",
    params(
        ("name" = String, Path, description = "The prompt's name"),
        ("from" = i64, Query, description = "The version diffed from"),
        ("to" = i64, Query, description = "The version diffed to"),
    ),
    responses(
        (status = 200, description = "`{\"name\", \"from\", \"to\", \"diff\"}`", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn diff_versions(
    State(state): State<Services>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let number = |key: &str| {
        (q.get(key).and_then(|v| v.parse::<i64>().ok()))
            .ok_or_else(|| Error::invalid(key, format!("`{key}` must be a version number")))
    };
    let (from, to) = (number("from")?, number("to")?);
    let store = store(&state)?;
    let def = |body: &str| PromptDef::parse(body).map_err(|e| Error::internal(e.to_string()));
    let a = (store.prompt_version(&name, from).await).map_err(osprey_core::Error::from)?;
    let b = (store.prompt_version(&name, to).await).map_err(osprey_core::Error::from)?;
    let text = diff(
        &def(&a.body)?,
        &def(&b.body)?,
        &format!("{name}@{from}"),
        &format!("{name}@{to}"),
    );
    Ok(Json(
        json!({"name": name, "from": from, "to": to, "diff": text}),
    ))
}

/// Points a label at a version, or splits it between versions.
#[utoipa::path(
    put,
    path = "/admin/prompts/{name}/labels/{label}",
    tag = "admin",
    operation_id = "setPromptLabel",
    params(
        ("name" = String, Path, description = "The prompt's name"),
        ("label" = String, Path, description = "The label"),
    ),
    request_body(content = Object, description = "`version` (3) or `split` (\"3:90,4:10\")",
        example = json!({"split": "1:90,2:10"})),
    responses(
        (status = 200, description = "`{\"name\", \"label\", \"split\"}`", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn set_label(
    State(state): State<Services>,
    Path((name, label)): Path<(String, String)>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| Error::invalid("body", format!("Invalid request body: {e}")))?;
    let split = match (&v["version"], &v["split"]) {
        (Value::Number(n), Value::Null) => parse_split(&n.to_string()),
        (Value::Null, Value::String(s)) => parse_split(s),
        _ => {
            return Err(
                Error::invalid("body", "give `version` (3) or `split` (\"3:90,4:10\")").into(),
            );
        }
    }
    .map_err(|e| Error::invalid("split", e.to_string()))?;
    valid_name(&label)?;
    (store(&state)?.set_label(&name, &label, &split).await).map_err(osprey_core::Error::from)?;
    Ok(Json(
        json!({"name": name, "label": label, "split": split_json(&split)}),
    ))
}

/// Points a label back where it pointed before.
#[utoipa::path(
    post,
    path = "/admin/prompts/{name}/labels/{label}/rollback",
    tag = "admin",
    operation_id = "rollbackPromptLabel",
    params(
        ("name" = String, Path, description = "The prompt's name"),
        ("label" = String, Path, description = "The label"),
    ),
    responses(
        (status = 200, description = "`{\"name\", \"label\", \"split\"}`", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn rollback(
    State(state): State<Services>,
    Path((name, label)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let split =
        (store(&state)?.rollback_label(&name, &label).await).map_err(osprey_core::Error::from)?;
    Ok(Json(
        json!({"name": name, "label": label, "split": split_json(&split)}),
    ))
}
