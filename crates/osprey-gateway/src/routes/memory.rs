//! A user's memory, read and written by the user (`x-osprey-user`) of a tenant; anyone else is
//! told it does not exist.
//!
//! | route | does |
//! |---|---|
//! | `POST /v1/memory/facts` `{"content"}` | keeps a fact (the same text again is the fact kept before) |
//! | `GET /v1/memory/facts` | lists the user's facts, newest first |
//! | `DELETE /v1/memory/facts/{id}` | forgets one |
//! | `PUT /v1/memory/working/{name}` `{"content", "ttl_seconds"}` | writes a scratchpad, to expire (default an hour) |
//! | `GET /v1/memory/working`, `GET /v1/memory/working/{name}` | reads scratchpads that have not expired |
//! | `DELETE /v1/memory/working/{name}` | deletes one |
//!
//! Chat requests put them in their prompt with `"osprey": {"memory": true}` and
//! `{"working_memory": NAME}` ([`osprey_context::memory`]).

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::routing::{delete, get};
use osprey_core::Error;
use osprey_store::{FactRecord, WorkingRecord};
use serde::Deserialize;
use serde_json::{Value, json};

use super::conversations::{parse, store};
use osprey_services::edge::Caller;
use osprey_services::error::ApiError;
use osprey_services::state::Services;

/// Characters a fact may have.
const MAX_FACT_CHARS: usize = 1000;
/// Bytes a scratchpad may hold.
const MAX_WORKING_BYTES: usize = 64 << 10;
/// A scratchpad's life when the request does not say.
const DEFAULT_TTL_SECONDS: u64 = 3600;
/// The longest life a scratchpad may ask for: a week.
const MAX_TTL_SECONDS: u64 = 7 * 24 * 3600;

/// The routes (behind authentication).
pub fn routes() -> Router<Services> {
    Router::new()
        .route("/v1/memory/facts", get(list_facts).post(add_fact))
        .route("/v1/memory/facts/{id}", delete(delete_fact))
        .route("/v1/memory/working", get(list_working))
        .route(
            "/v1/memory/working/{name}",
            get(read_working).put(write_working).delete(delete_working),
        )
}

/// A fact to keep.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct NewFact {
    /// 1 to 1000 characters.
    content: String,
}

/// Keeps a fact about the caller's user (the same text again is the fact kept before).
#[utoipa::path(
    post,
    path = "/v1/memory/facts",
    tag = "memory",
    operation_id = "addFact",
    request_body = NewFact,
    responses(
        (status = 200, description = "The fact", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn add_fact(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Result<axum::Json<Value>, ApiError> {
    let fact: NewFact = parse(&body)?;
    let content = fact.content.trim();
    if content.is_empty() || content.chars().count() > MAX_FACT_CHARS {
        let why = format!("a fact is 1 to {MAX_FACT_CHARS} characters");
        return Err(Error::invalid("content", why).into());
    }
    let record = (store(&state)?
        .add_fact(&caller.owner(None), content, "api")
        .await)
        .map_err(osprey_core::Error::from)?;
    Ok(axum::Json(fact_json(&record)))
}

/// The user's facts, newest first.
#[utoipa::path(
    get,
    path = "/v1/memory/facts",
    tag = "memory",
    operation_id = "listFacts",
    responses(
        (status = 200, description = "A list of facts", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn list_facts(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
) -> Result<axum::Json<Value>, ApiError> {
    let facts =
        (store(&state)?.facts(&caller.owner(None)).await).map_err(osprey_core::Error::from)?;
    let data: Vec<Value> = facts.iter().map(fact_json).collect();
    Ok(axum::Json(json!({"object": "list", "data": data})))
}

/// Forgets a fact.
#[utoipa::path(
    delete,
    path = "/v1/memory/facts/{id}",
    tag = "memory",
    operation_id = "deleteFact",
    params(("id" = String, Path, description = "The fact's id")),
    responses(
        (status = 200, description = "`{\"id\", \"object\": \"memory.fact.deleted\", \"deleted\": true}`", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn delete_fact(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    (store(&state)?.delete_fact(&caller.owner(None), &id).await)
        .map_err(osprey_core::Error::from)?;
    Ok(axum::Json(
        json!({"id": id, "object": "memory.fact.deleted", "deleted": true}),
    ))
}

/// A scratchpad's content.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct Scratchpad {
    /// At most 64 KiB.
    content: String,
    /// Its life, 1 s to a week (default an hour).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 604800)]
    ttl_seconds: Option<u64>,
}

/// Writes a scratchpad, to expire after `ttl_seconds` (default an hour).
#[utoipa::path(
    put,
    path = "/v1/memory/working/{name}",
    tag = "memory",
    operation_id = "writeScratchpad",
    params(("name" = String, Path, description = "1 to 64 letters, digits, `.`, `_` or `-`")),
    request_body = Scratchpad,
    responses(
        (status = 200, description = "The scratchpad", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn write_working(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<axum::Json<Value>, ApiError> {
    valid_name(&name)?;
    let pad: Scratchpad = parse(&body)?;
    if pad.content.len() > MAX_WORKING_BYTES {
        let why = format!("a scratchpad holds at most {MAX_WORKING_BYTES} bytes");
        return Err(Error::invalid("content", why).into());
    }
    let ttl = pad.ttl_seconds.unwrap_or(DEFAULT_TTL_SECONDS);
    if !(1..=MAX_TTL_SECONDS).contains(&ttl) {
        let why = format!("ttl_seconds is 1 to {MAX_TTL_SECONDS}");
        return Err(Error::invalid("ttl_seconds", why).into());
    }
    let record = (store(&state)?
        .set_working(&caller.owner(None), &name, &pad.content, ttl as i64 * 1000)
        .await)
        .map_err(osprey_core::Error::from)?;
    Ok(axum::Json(working_json(&record)))
}

/// A scratchpad that has not expired.
#[utoipa::path(
    get,
    path = "/v1/memory/working/{name}",
    tag = "memory",
    operation_id = "readScratchpad",
    params(("name" = String, Path, description = "The scratchpad's name")),
    responses(
        (status = 200, description = "The scratchpad", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn read_working(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let record = (store(&state)?.working(&caller.owner(None), &name).await)
        .map_err(osprey_core::Error::from)?;
    Ok(axum::Json(working_json(&record)))
}

/// The user's scratchpads that have not expired.
#[utoipa::path(
    get,
    path = "/v1/memory/working",
    tag = "memory",
    operation_id = "listScratchpads",
    responses(
        (status = 200, description = "A list of scratchpads", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn list_working(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
) -> Result<axum::Json<Value>, ApiError> {
    let pads = (store(&state)?.working_list(&caller.owner(None)).await)
        .map_err(osprey_core::Error::from)?;
    let data: Vec<Value> = pads.iter().map(working_json).collect();
    Ok(axum::Json(json!({"object": "list", "data": data})))
}

/// Deletes a scratchpad.
#[utoipa::path(
    delete,
    path = "/v1/memory/working/{name}",
    tag = "memory",
    operation_id = "deleteScratchpad",
    params(("name" = String, Path, description = "The scratchpad's name")),
    responses(
        (status = 200, description = "`{\"name\", \"object\": \"memory.working.deleted\", \"deleted\": true}`", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn delete_working(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    (store(&state)?
        .delete_working(&caller.owner(None), &name)
        .await)
        .map_err(osprey_core::Error::from)?;
    Ok(axum::Json(
        json!({"name": name, "object": "memory.working.deleted", "deleted": true}),
    ))
}

/// A scratchpad's name: 1 to 64 letters, digits, `.`, `_` or `-`.
fn valid_name(name: &str) -> Result<(), Error> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    match ok {
        true => Ok(()),
        false => Err(Error::invalid(
            "name",
            "a scratchpad's name is 1 to 64 letters, digits, '.', '_' or '-'",
        )),
    }
}

fn fact_json(f: &FactRecord) -> Value {
    json!({"id": f.id, "object": "memory.fact", "content": f.content, "source": f.source,
           "created_at": f.created_at / 1000})
}

fn working_json(w: &WorkingRecord) -> Value {
    json!({"name": w.name, "object": "memory.working", "content": w.content,
           "updated_at": w.updated_at / 1000, "expires_at": w.expires_at / 1000})
}
