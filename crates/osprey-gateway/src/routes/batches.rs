//! The Batch API in OpenAI's shape, on the store: upload a JSONL of requests
//! (`POST /v1/files`, purpose `batch`), create a batch over it (`POST /v1/batches`), and a
//! background runner sends each line through the same path as a live request, at batch
//! priority (interactive work goes first, and at degradation level 4 the runner waits), then
//! writes the results as an output file (`GET /v1/files/{id}/content`). Batches survive a
//! restart: unfinished ones are run again from the start. Everything is per tenant.

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Extension, Multipart, Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use osprey_core::{Error, ErrorKind};
use osprey_store::{BatchRecord, FileRecord, Store, StoreError};
use serde_json::{Value, json};

use osprey_services::edge::{Admitted, Caller};
use osprey_services::error::ApiError;
use osprey_services::state::Services;

/// The endpoints a batch may target.
const ENDPOINTS: [&str; 2] = ["/v1/chat/completions", "/v1/completions"];
/// Lines of one batch in flight at once.
const LINES_IN_FLIGHT: usize = 4;
/// Times a line waits out a busy server (pauses of up to 10 s) before it counts as failed.
const MAX_WAITS: usize = 60;

/// The routes (authentication is added by the caller).
pub fn routes() -> Router<Services> {
    Router::new()
        .route("/v1/files", post(upload))
        .route("/v1/files/{id}", get(file))
        .route("/v1/files/{id}/content", get(content))
        .route("/v1/batches", post(create).get(list))
        .route("/v1/batches/{id}", get(batch))
        .route("/v1/batches/{id}/cancel", post(cancel))
}

fn store(state: &Services) -> Result<&Store, Error> {
    state.store().ok_or_else(|| {
        Error::new(
            ErrorKind::Unavailable,
            "This server has no store for batches.",
        )
    })
}

fn secs(ms: i64) -> i64 {
    ms / 1000
}

fn file_json(f: &FileRecord) -> Value {
    json!({"id": f.id, "object": "file", "bytes": f.bytes, "created_at": secs(f.created_at),
           "filename": f.filename, "purpose": f.purpose, "status": "processed"})
}

fn batch_json(b: &BatchRecord) -> Value {
    let at = |status: &str| {
        (b.status == status)
            .then(|| b.completed_at.map(secs))
            .flatten()
    };
    json!({
        "id": b.id, "object": "batch", "endpoint": b.endpoint, "errors": null,
        "input_file_id": b.input_file_id, "completion_window": b.completion_window,
        "status": b.status, "output_file_id": b.output_file_id, "error_file_id": null,
        "created_at": secs(b.created_at), "in_progress_at": secs(b.created_at),
        "expires_at": secs(b.created_at) + 24 * 3600,
        "completed_at": at("completed"), "cancelled_at": at("cancelled"), "failed_at": at("failed"),
        "request_counts": {"total": b.total, "completed": b.completed - b.failed, "failed": b.failed},
        "metadata": null,
    })
}

/// The form `POST /v1/files` reads (as [`Multipart`], part by part: this is its shape for the
/// OpenAPI document).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct Upload {
    /// `batch`.
    purpose: String,
    /// The JSONL of requests: `{"custom_id", "method": "POST", "url", "body"}` a line.
    #[schema(value_type = String, format = Binary)]
    file: Vec<u8>,
}

/// `POST /v1/files`: multipart with `purpose` and `file`.
#[utoipa::path(
    post,
    path = "/v1/files",
    tag = "batches",
    operation_id = "uploadFile",
    request_body(content = Upload, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The file (`id`, `bytes`, `filename`, `purpose`…)", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 413, response = crate::openapi::PayloadTooLarge),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn upload(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    mut form: Multipart,
) -> Result<Response, ApiError> {
    let bad = |e| crate::error::form_error("file", e);
    let (mut purpose, mut file) = (None, None);
    while let Some(field) = form.next_field().await.map_err(bad)? {
        match field.name() {
            Some("purpose") => purpose = Some(field.text().await.map_err(bad)?),
            Some("file") => {
                let name = field.file_name().unwrap_or("upload.jsonl").to_owned();
                file = Some((name, field.bytes().await.map_err(bad)?));
            }
            _ => {}
        }
    }
    let purpose = purpose.ok_or_else(|| Error::invalid("purpose", "`purpose` is required"))?;
    if purpose != "batch" {
        let m = format!("purpose `{purpose}` is not supported here (use `batch`)");
        return Err(Error::invalid("purpose", m).into());
    }
    let (name, bytes) = file.ok_or_else(|| Error::invalid("file", "a `file` part is required"))?;
    let f = store(&state)?
        .create_file(&caller.tenant.name, &name, &purpose, &bytes)
        .await
        .map_err(osprey_core::Error::from)?;
    Ok(axum::Json(file_json(&f)).into_response())
}

/// A file of the caller's tenant.
#[utoipa::path(
    get,
    path = "/v1/files/{id}",
    tag = "batches",
    operation_id = "getFile",
    params(("id" = String, Path, description = "The file's id")),
    responses(
        (status = 200, description = "The file", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn file(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let f =
        (store(&state)?.file(&caller.tenant.name, &id).await).map_err(osprey_core::Error::from)?;
    Ok(axum::Json(file_json(&f)).into_response())
}

/// A file's content (an input file, or a batch's output: one JSON result a line).
#[utoipa::path(
    get,
    path = "/v1/files/{id}/content",
    tag = "batches",
    operation_id = "getFileContent",
    params(("id" = String, Path, description = "The file's id")),
    responses(
        (status = 200, description = "The content, as uploaded or written", body = String,
            content_type = "application/jsonl"),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn content(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let bytes = (store(&state)?.file_content(&caller.tenant.name, &id).await)
        .map_err(osprey_core::Error::from)?;
    Ok(([(header::CONTENT_TYPE, "application/jsonl")], bytes).into_response())
}

/// One line of a batch's input.
struct Line {
    custom_id: String,
    body: Value,
}

/// The lines of an input file, checked against `endpoint`.
fn parse_lines(content: &[u8], endpoint: &str) -> Result<Vec<Line>, Error> {
    let text = std::str::from_utf8(content)
        .map_err(|_| Error::invalid("input_file_id", "the input file is not UTF-8"))?;
    let mut lines = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = |m: &str| Error::invalid("input_file_id", format!("line {}: {m}", n + 1));
        let v: Value = serde_json::from_str(line).map_err(|e| at(&e.to_string()))?;
        let custom_id = v["custom_id"]
            .as_str()
            .ok_or_else(|| at("`custom_id` is missing"))?;
        if !seen.insert(custom_id.to_owned()) {
            return Err(at(&format!("`custom_id` {custom_id} is used twice")));
        }
        if v["method"] != "POST" || v["url"] != endpoint {
            return Err(at(&format!("`method` must be POST and `url` {endpoint}")));
        }
        if !v["body"].is_object() {
            return Err(at("`body` must be an object"));
        }
        lines.push(Line {
            custom_id: custom_id.to_owned(),
            body: v["body"].clone(),
        });
    }
    if lines.is_empty() {
        return Err(Error::invalid(
            "input_file_id",
            "the input file has no requests",
        ));
    }
    Ok(lines)
}

/// `POST /v1/batches`.
#[utoipa::path(
    post,
    path = "/v1/batches",
    tag = "batches",
    operation_id = "createBatch",
    request_body(content = Object, description = "`input_file_id`, `endpoint` \
        (`/v1/chat/completions` or `/v1/completions`) and `completion_window` (`24h`)",
        example = json!({"input_file_id": "file-…", "endpoint": "/v1/chat/completions",
            "completion_window": "24h"})),
    responses(
        (status = 200, description = "The batch, queued", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn create(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| Error::invalid("body", format!("The request body is not valid JSON: {e}")))?;
    let field = |name: &str| {
        v[name]
            .as_str()
            .ok_or_else(|| Error::invalid(name, format!("`{name}` is required")))
    };
    let (input, endpoint, window) = (
        field("input_file_id")?,
        field("endpoint")?,
        field("completion_window")?,
    );
    if !ENDPOINTS.contains(&endpoint) {
        let m = format!("endpoint `{endpoint}` is not supported (use one of {ENDPOINTS:?})");
        return Err(Error::invalid("endpoint", m).into());
    }
    if window != "24h" {
        return Err(Error::invalid("completion_window", "completion_window must be `24h`").into());
    }
    let store = store(&state)?;
    let tenant = &caller.tenant.name;
    let content = store
        .file_content(tenant, input)
        .await
        .map_err(|e| match e {
            StoreError::NotFound(_) => {
                Error::invalid("input_file_id", format!("No file {input} exists."))
            }
            e => osprey_core::Error::from(e),
        })?;
    let lines = parse_lines(&content, endpoint)?;
    let b = (store
        .create_batch(tenant, endpoint, input, window, lines.len() as i64)
        .await)
        .map_err(osprey_core::Error::from)?;
    state.batches_changed();
    Ok(axum::Json(batch_json(&b)).into_response())
}

/// A batch of the caller's tenant.
#[utoipa::path(
    get,
    path = "/v1/batches/{id}",
    tag = "batches",
    operation_id = "getBatch",
    params(("id" = String, Path, description = "The batch's id")),
    responses(
        (status = 200, description = "The batch", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn batch(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let b =
        (store(&state)?.batch(&caller.tenant.name, &id).await).map_err(osprey_core::Error::from)?;
    Ok(axum::Json(batch_json(&b)).into_response())
}

/// The batches of the caller's tenant.
#[utoipa::path(
    get,
    path = "/v1/batches",
    tag = "batches",
    operation_id = "listBatches",
    responses(
        (status = 200, description = "A list of batches", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn list(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    let all = (store(&state)?.list_batches(&caller.tenant.name).await)
        .map_err(osprey_core::Error::from)?;
    let data: Vec<Value> = all.iter().map(batch_json).collect();
    let (first, last) = (
        data.first().map(|b| b["id"].clone()),
        data.last().map(|b| b["id"].clone()),
    );
    let page = json!({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": false});
    Ok(axum::Json(page).into_response())
}

/// Cancels a batch: lines not yet run are not.
#[utoipa::path(
    post,
    path = "/v1/batches/{id}/cancel",
    tag = "batches",
    operation_id = "cancelBatch",
    params(("id" = String, Path, description = "The batch's id")),
    responses(
        (status = 200, description = "The batch, cancelling", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn cancel(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let b = (store(&state)?.cancel_batch(&caller.tenant.name, &id).await)
        .map_err(osprey_core::Error::from)?;
    Ok(axum::Json(batch_json(&b)).into_response())
}

/// Runs unfinished batches, oldest first, for as long as the server runs: woken by a new batch,
/// and every few seconds in case another replica sharing the store made one.
pub async fn run_batches(state: Services) {
    let Some(store) = state.store().cloned() else {
        return;
    };
    loop {
        match store.unfinished_batches().await {
            Ok(batches) => {
                for b in batches {
                    if let Err(e) = run_batch(&state, &store, &b).await {
                        tracing::warn!(batch = %b.id, error = %e, "a batch failed to run");
                        let _ = store.finish_batch(&b.id, "failed", None).await;
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing batches failed"),
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), state.batch_added()).await;
    }
}

async fn run_batch(state: &Services, store: &Store, b: &BatchRecord) -> Result<(), StoreError> {
    let content = store.file_content(&b.tenant, &b.input_file_id).await?;
    let Ok(lines) = parse_lines(&content, &b.endpoint) else {
        return store.finish_batch(&b.id, "failed", None).await;
    };
    let tenant = state.edge().tenant(&b.tenant);
    let caller = Caller {
        groups: tenant.groups.clone(),
        tenant,
        key_id: None,
        user: None,
        tool_scopes: None,
        record: Default::default(),
    };
    tracing::info!(batch = %b.id, lines = lines.len(), "running a batch");
    let lines = lines.into_iter().enumerate().map(|(i, line)| {
        let (state, caller) = (state.clone(), caller.clone());
        let (endpoint, id) = (b.endpoint.clone(), b.id.clone());
        async move { run_line(&state, &caller, &endpoint, &id, i, &line).await }
    });
    let mut results = futures_util::stream::iter(lines).buffered(LINES_IN_FLIGHT);
    let (mut output, mut done, mut failed) = (Vec::new(), 0, 0);
    while let Some((ok, line)) = results.next().await {
        done += 1;
        failed += i64::from(!ok);
        output.extend_from_slice(line.as_bytes());
        output.push(b'\n');
        store.batch_progress(&b.id, done, failed).await?;
        if store.batch_status(&b.id).await? == "cancelling" {
            return store.finish_batch(&b.id, "cancelled", None).await;
        }
    }
    let out = store
        .create_file(
            &b.tenant,
            &format!("{}_output.jsonl", b.id),
            "batch_output",
            &output,
        )
        .await?;
    store
        .finish_batch(&b.id, "completed", Some(&out.id))
        .await?;
    tracing::info!(batch = %b.id, done, failed, "batch completed");
    Ok(())
}

/// Sends line `i` through the generation path at batch priority, waiting while the server is
/// too busy for batch work; whether it succeeded, and its output line.
async fn run_line(
    state: &Services,
    caller: &Caller,
    endpoint: &str,
    batch: &str,
    i: usize,
    line: &Line,
) -> (bool, String) {
    let mut body = line.body.clone();
    body["osprey"]["priority"] = "batch".into();
    // Every line's body is an object (checked when the file was read).
    let object = match body {
        Value::Object(object) => object,
        _ => serde_json::Map::new(),
    };
    let body = osprey_core::api::JsonBody::from_object(object);
    let model = line.body["model"].as_str().map(str::to_owned);
    let mut pause = Duration::from_millis(250);
    for attempt in 0.. {
        let admitted = Extension(Admitted {
            caller: caller.clone(),
            model: model.clone(),
            usage: Default::default(),
        });
        let response = super::generate_for(
            endpoint,
            state.clone(),
            admitted,
            &Default::default(),
            Ok(body.clone()),
        )
        .await;
        let status = response.status();
        let deferred = status == StatusCode::SERVICE_UNAVAILABLE;
        let bytes = axum::body::to_bytes(response.into_body(), 64 << 20)
            .await
            .unwrap_or_default();
        if deferred && attempt < MAX_WAITS {
            // Busy (degraded, or the engine's queue full): batch work waits its turn.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(10));
            continue;
        }
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let out = json!({
            "id": format!("batch_req_{}_{i}", batch.trim_start_matches("batch_")),
            "custom_id": line.custom_id,
            "response": {"status_code": status.as_u16(), "request_id": "", "body": body},
            "error": null,
        });
        return (status.is_success(), out.to_string());
    }
    unreachable!("the loop returns")
}
