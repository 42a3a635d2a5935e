//! The Responses API (agent runs), for a tenant's user:
//! - `POST /v1/responses`: a run with tools, budgets and approvals (behind the edge, like any
//!   generation request); streamed as events with `"stream": true`;
//! - `GET /v1/responses` (Osprey's: the caller's runs, newest first, `?status=&limit=&after=`)
//!   and `GET /v1/responses/{id}`; `GET /v1/responses/{id}/steps`: what the run did;
//! - `POST /v1/responses/{id}/approve` and `/reject` (`{"approval_request_id", "reason"}`):
//!   answers a call waiting for approval and runs on;
//! - `POST /v1/responses/{id}/cancel` (a paused run), `POST /v1/responses/{id}/replay`: the
//!   same request run again as a new response.

use axum::body::Bytes;
use axum::extract::{Extension, Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use osprey_agent::RunStatus;
use osprey_core::{Error, ErrorKind};
use serde::Deserialize;
use serde_json::{Value, json};

use osprey_agent::responses::ResponsesRequest;
use osprey_agent::responses::runner::Stored;
use osprey_services::agent::runner;
use osprey_services::edge::{Admitted, Caller};
use osprey_services::error::ApiError;
use osprey_services::state::Services;

/// The routes besides `POST /v1/responses` (behind authentication).
pub fn routes() -> Router<Services> {
    Router::new()
        .route("/v1/responses", get(list))
        .route("/v1/responses/{id}", get(read))
        .route("/v1/responses/{id}/steps", get(steps))
        .route("/v1/responses/{id}/approve", post(approve))
        .route("/v1/responses/{id}/reject", post(reject))
        .route("/v1/responses/{id}/cancel", post(cancel))
        .route("/v1/responses/{id}/replay", post(replay))
}

/// `POST /v1/responses`.
#[utoipa::path(
    post,
    path = "/v1/responses",
    tag = "generation",
    operation_id = "createResponse",
    request_body(content = osprey_agent::responses::ResponsesRequest, example = json!({
        "model": "smollm2-135m-instruct",
        "input": "What is 6 times 7?",
        "tools": [{"type": "calculator"}],
        "max_output_tokens": 16
    })),
    responses(
        (status = 200, description = "The run as a response object (finished, failed, or \
            paused for an approval or a client's function call); with `\"stream\": true`, \
            server-sent events of its progress", content(
            (Object = "application/json"),
            (crate::openapi::ResponseEvent = "text/event-stream"),
        )),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 404, response = crate::openapi::NotFound),
        (status = 502, response = crate::openapi::BadGateway),
        (status = 504, response = crate::openapi::GatewayTimeout),
        crate::openapi::EdgeErrors,
    ),
    security(("api_key" = []))
)]
pub async fn create(
    State(state): State<Services>,
    admitted: Option<Extension<Admitted>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let admitted = admitted.map_or_else(|| state.edge().unguarded(), |a| a.0);
    let raw: Value = osprey_core::api::parse_json(&body)?;
    let request: ResponsesRequest = osprey_core::api::parse_json(&body)?;
    let (response, tokens) = runner::start(&state, &admitted.caller, request, raw, None).await?;
    admitted.usage.set(tokens, 0);
    Ok(response)
}

/// A run of the caller's, as a response object.
#[utoipa::path(
    get,
    path = "/v1/responses/{id}",
    tag = "responses",
    operation_id = "getResponse",
    params(("id" = String, Path, description = "The response's id")),
    responses(
        (status = 200, description = "The response object", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn read(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let stored = runner::load(&state, Some(&caller.owner(None)), &id).await?;
    Ok(Json(runner::show(&state, &stored)))
}

/// The steps of a stored run, as the API shows them.
pub async fn steps_json(state: &Services, id: &str) -> Result<Value, Error> {
    let store = crate::routes::conversations::store(state)?;
    let steps = store
        .run_steps(id)
        .await
        .map_err(osprey_core::Error::from)?;
    let data: Vec<Value> = steps
        .iter()
        .map(|s| {
            json!({"n": s.n, "kind": s.kind, "tokens": s.tokens, "duration_ms": s.duration_ms,
                "at": s.at / 1000, "detail": serde_json::from_str::<Value>(&s.detail).unwrap_or_default()})
        })
        .collect();
    Ok(json!({"object": "list", "data": data}))
}

/// What a run of the caller's did, step by step.
#[utoipa::path(
    get,
    path = "/v1/responses/{id}/steps",
    tag = "responses",
    operation_id = "listResponseSteps",
    params(("id" = String, Path, description = "The response's id")),
    responses(
        (status = 200, description = "A list of steps (`n`, `kind`, `tokens`, `duration_ms`, \
            `at`, `detail`)", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn steps(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    runner::load(&state, Some(&caller.owner(None)), &id).await?;
    Ok(Json(steps_json(&state, &id).await?))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only runs in this status.
    status: Option<String>,
    /// Runs a page, 1 to 100 (default 20).
    limit: Option<i64>,
    /// The run to list after.
    after: Option<String>,
}

/// A page of runs, as the API lists them.
pub fn list_json(records: &[osprey_store::RunRecord], limit: i64) -> Value {
    let data: Vec<Value> = records
        .iter()
        .map(|r| {
            json!({"id": r.id, "object": "response", "status": r.status, "model": r.model,
                "tenant": r.tenant, "user": r.user_id, "created_at": r.created_at / 1000,
                "updated_at": r.updated_at / 1000, "previous_response_id": r.previous_id,
                "replay_of": r.replay_of})
        })
        .collect();
    json!({"object": "list", "data": data, "has_more": records.len() as i64 == limit,
        "last_id": records.last().map(|r| r.id.clone())})
}

/// The caller's runs, newest first.
#[utoipa::path(
    get,
    path = "/v1/responses",
    tag = "responses",
    operation_id = "listResponses",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of runs (`data`, `has_more`, `last_id`)", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn list(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let owner = caller.owner(None);
    let limit = q.limit.unwrap_or(20).clamp(1, 100);
    let query = osprey_store::RunQuery {
        tenant: Some(owner.tenant),
        user: Some(owner.user),
        status: q.status.filter(|s| !s.is_empty()),
        before: q.after.filter(|a| !a.is_empty()),
        limit: Some(limit),
    };
    let store = crate::routes::conversations::store(&state)?;
    Ok(Json(list_json(&runs_page(store, &query).await?, limit)))
}

/// The page of runs `query` asks for; an `after` that names no run is a bad request (the
/// store's "not found" is about the cursor, not about what is listed).
pub async fn runs_page(
    store: &osprey_store::Store,
    query: &osprey_store::RunQuery,
) -> Result<Vec<osprey_store::RunRecord>, Error> {
    store
        .runs(query)
        .await
        .map_err(|e| match (e, &query.before) {
            (osprey_store::StoreError::NotFound(_), Some(after)) => {
                Error::invalid("after", format!("No run {after} to list after."))
            }
            (e, _) => osprey_core::Error::from(e),
        })
}

/// An approval or rejection.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Answer {
    /// The request answered (default: the run's only pending one).
    pub approval_request_id: Option<String>,
    /// Why.
    pub reason: Option<String>,
}

/// Parses an optional JSON body as an [`Answer`].
fn answer_of(body: &Bytes) -> Result<Answer, Error> {
    match body.is_empty() {
        true => Ok(Answer::default()),
        false => osprey_core::api::parse_json(body),
    }
}

/// Approves (or rejects) a paused run's call as `body` says and resumes it; `owner` is the
/// caller's (`None`: an operator's, who may answer any run).
pub async fn decide(
    state: &Services,
    owner: Option<&osprey_store::Owner>,
    id: &str,
    body: &Bytes,
    approve: bool,
) -> Result<Response, ApiError> {
    let answer = answer_of(body)?;
    let stored = runner::load(state, owner, id).await?;
    if owner.is_none() {
        tracing::info!(run = %id, approve, "an operator answered an approval request");
    }
    let approval = answer.approval_request_id.as_deref();
    let (response, _) = runner::resume(state, stored, approval, approve, answer.reason).await?;
    Ok(response)
}

/// Approves a call a paused run of the caller's waits on, and runs on.
#[utoipa::path(
    post,
    path = "/v1/responses/{id}/approve",
    tag = "responses",
    operation_id = "approveResponse",
    params(("id" = String, Path, description = "The response's id")),
    request_body(content = Answer, description = "Optional: which request, and why"),
    responses(
        (status = 200, description = "The run, resumed", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn approve(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    decide(&state, Some(&caller.owner(None)), &id, &body, true).await
}

/// Rejects a call a paused run of the caller's waits on, and runs on.
#[utoipa::path(
    post,
    path = "/v1/responses/{id}/reject",
    tag = "responses",
    operation_id = "rejectResponse",
    params(("id" = String, Path, description = "The response's id")),
    request_body(content = Answer, description = "Optional: which request, and why"),
    responses(
        (status = 200, description = "The run, resumed", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn reject(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    decide(&state, Some(&caller.owner(None)), &id, &body, false).await
}

/// Cancels a paused run of the caller's.
#[utoipa::path(
    post,
    path = "/v1/responses/{id}/cancel",
    tag = "responses",
    operation_id = "cancelResponse",
    params(("id" = String, Path, description = "The response's id")),
    responses(
        (status = 200, description = "The run, cancelled", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
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
) -> Result<Json<Value>, ApiError> {
    let mut stored: Stored = runner::load(&state, Some(&caller.owner(None)), &id).await?;
    let status = stored.run.status;
    if !matches!(
        status,
        RunStatus::RequiresApproval | RunStatus::RequiresAction
    ) {
        return Err(Error::new(
            ErrorKind::InvalidRequest,
            format!(
                "response {id} is {}: only a paused response can be cancelled",
                status.as_str()
            ),
        )
        .with_code("not_cancellable")
        .into());
    }
    let store = crate::routes::conversations::store(&state)?;
    if !store
        .claim_run(&id, status.as_str())
        .await
        .map_err(osprey_core::Error::from)?
    {
        return Err(
            Error::new(ErrorKind::InvalidRequest, format!("response {id} moved on")).into(),
        );
    }
    stored.run.status = RunStatus::Cancelled;
    let state_json = serde_json::to_string(&stored.run).unwrap_or_default();
    store
        .save_run_step(&id, RunStatus::Cancelled.as_str(), &state_json, None)
        .await
        .map_err(osprey_core::Error::from)?;
    Ok(Json(runner::show(&state, &stored)))
}

/// Runs a run's request again, as a new response.
#[utoipa::path(
    post,
    path = "/v1/responses/{id}/replay",
    tag = "responses",
    operation_id = "replayResponse",
    params(("id" = String, Path, description = "The response's id")),
    responses(
        (status = 200, description = "The new run", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 502, response = crate::openapi::BadGateway),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn replay(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let stored = runner::load(&state, Some(&caller.owner(None)), &id).await?;
    let body: Value = serde_json::from_str::<Value>(&stored.record.request)
        .map(|v| v["body"].clone())
        .unwrap_or_default();
    let mut request = stored.request;
    request.stream = false;
    let (response, _) = runner::start(&state, &caller, request, body, Some(id)).await?;
    Ok(response.into_response())
}
