//! The Conversations API, in the shape of OpenAI's: `POST /v1/conversations`, `GET`, `POST`
//! (metadata) and `DELETE /v1/conversations/{id}`, and its items: `GET` and `POST
//! /v1/conversations/{id}/items`, `GET` and `DELETE /v1/conversations/{id}/items/{item}`.
//!
//! A conversation belongs to the caller's tenant and user (`x-osprey-user`); anyone else is
//! told it does not exist. A chat request naming one (`"osprey": {"conversation": ID}`) is
//! answered with its history ([`osprey_context::conversation`]).

use axum::Router;
use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Extension, Path, Query, State};
use axum::routing::get;
use osprey_core::{Error, ErrorKind};
use osprey_store::{ConversationRecord, ItemPage, ItemRecord, NewItem, Owner, Store};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use osprey_services::edge::Caller;
use osprey_services::error::ApiError;
use osprey_services::state::Services;

/// Items one request may add (OpenAI's limit).
pub const MAX_ITEMS_PER_REQUEST: usize = 20;
/// Metadata pairs a conversation may hold (OpenAI's limit).
const MAX_METADATA_PAIRS: usize = 16;

/// The routes (behind authentication).
pub fn routes() -> Router<Services> {
    Router::new()
        .route("/v1/conversations", axum::routing::post(create))
        .route(
            "/v1/conversations/{id}",
            get(retrieve).post(update).delete(delete),
        )
        .route(
            "/v1/conversations/{id}/items",
            get(list_items).post(add_items),
        )
        .route(
            "/v1/conversations/{id}/items/{item}",
            get(retrieve_item).delete(delete_item),
        )
}

pub(crate) fn store(state: &Services) -> Result<&Store, Error> {
    state.store().ok_or_else(|| {
        Error::new(
            ErrorKind::Unavailable,
            "This server has no store for conversations.",
        )
    })
}

/// A new conversation.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct Create {
    /// Its first messages (`{"type": "message", "role", "content"}`), at most 20.
    #[serde(default)]
    #[schema(max_items = 20)]
    items: Vec<Value>,
    /// At most 16 string values.
    #[serde(default)]
    metadata: Option<Value>,
}

/// Starts a conversation for the caller (its tenant and `x-osprey-user`).
#[utoipa::path(
    post,
    path = "/v1/conversations",
    tag = "conversations",
    operation_id = "createConversation",
    request_body = Create,
    responses(
        (status = 200, description = "The conversation", body = Object),
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
) -> Result<axum::Json<Value>, ApiError> {
    let body: Create = parse(&body)?;
    let items = parse_items(&body.items, "items")?;
    let metadata = metadata_text(body.metadata.as_ref())?;
    let owner = caller.owner(None);
    let (record, _) = (store(&state)?
        .create_conversation(&owner, &metadata, &items)
        .await)
        .map_err(osprey_core::Error::from)?;
    Ok(axum::Json(conversation_json(&record)))
}

/// A conversation of the caller's.
#[utoipa::path(
    get,
    path = "/v1/conversations/{id}",
    tag = "conversations",
    operation_id = "getConversation",
    params(("id" = String, Path, description = "The conversation's id")),
    responses(
        (status = 200, description = "The conversation", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn retrieve(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let record = (store(&state)?.conversation(&caller.owner(None), &id).await)
        .map_err(osprey_core::Error::from)?;
    Ok(axum::Json(conversation_json(&record)))
}

/// A conversation's new metadata.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct Update {
    /// At most 16 string values.
    metadata: Value,
}

/// Replaces a conversation's metadata.
#[utoipa::path(
    post,
    path = "/v1/conversations/{id}",
    tag = "conversations",
    operation_id = "updateConversation",
    params(("id" = String, Path, description = "The conversation's id")),
    request_body = Update,
    responses(
        (status = 200, description = "The conversation", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn update(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<axum::Json<Value>, ApiError> {
    let body: Update = parse(&body)?;
    let metadata = metadata_text(Some(&body.metadata))?;
    let record = (store(&state)?
        .update_conversation(&caller.owner(None), &id, &metadata)
        .await)
        .map_err(osprey_core::Error::from)?;
    Ok(axum::Json(conversation_json(&record)))
}

/// Deletes a conversation and its items.
#[utoipa::path(
    delete,
    path = "/v1/conversations/{id}",
    tag = "conversations",
    operation_id = "deleteConversation",
    params(("id" = String, Path, description = "The conversation's id")),
    responses(
        (status = 200, description = "`{\"id\", \"object\": \"conversation.deleted\", \"deleted\": true}`", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn delete(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    (store(&state)?
        .delete_conversation(&caller.owner(None), &id)
        .await)
        .map_err(osprey_core::Error::from)?;
    Ok(axum::Json(
        json!({"id": id, "object": "conversation.deleted", "deleted": true}),
    ))
}

/// A page of a conversation's items.
#[utoipa::path(
    get,
    path = "/v1/conversations/{id}/items",
    tag = "conversations",
    operation_id = "listConversationItems",
    params(
        ("id" = String, Path, description = "The conversation's id"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Items a page (default 20)"),
        ("order" = Option<String>, Query, description = "`desc` (default, newest first) or `asc`"),
        ("after" = Option<String>, Query, description = "The item to list after"),
    ),
    responses(
        (status = 200, description = "A page of items (`data`, `first_id`, `last_id`, `has_more`)", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn list_items(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<axum::Json<Value>, ApiError> {
    let limit = match q.get("limit").map(|l| l.parse::<i64>()) {
        None => 20,
        Some(Ok(l)) if (1..=100).contains(&l) => l,
        Some(_) => {
            return Err(Error::invalid("limit", "limit must be between 1 and 100").into());
        }
    };
    let newest_first = match q.get("order").map(String::as_str) {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(other) => {
            return Err(Error::invalid(
                "order",
                format!("order must be `asc` or `desc`, got `{other}`"),
            )
            .into());
        }
    };
    let page = ItemPage {
        after: q.get("after").map(String::as_str),
        limit: limit + 1,
        newest_first,
    };
    let mut items = (store(&state)?.items(&caller.owner(None), &id, page).await)
        .map_err(osprey_core::Error::from)?;
    let has_more = items.len() as i64 > limit;
    items.truncate(limit as usize);
    Ok(axum::Json(list_json(&items, has_more)))
}

/// Messages to add.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct AddItems {
    /// 1 to 20 messages (`{"type": "message", "role", "content"}`).
    #[schema(min_items = 1, max_items = 20)]
    items: Vec<Value>,
}

/// Adds messages to a conversation.
#[utoipa::path(
    post,
    path = "/v1/conversations/{id}/items",
    tag = "conversations",
    operation_id = "addConversationItems",
    params(("id" = String, Path, description = "The conversation's id")),
    request_body = AddItems,
    responses(
        (status = 200, description = "The items added", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn add_items(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<axum::Json<Value>, ApiError> {
    let body: AddItems = parse(&body)?;
    let items = parse_items(&body.items, "items")?;
    if items.is_empty() {
        return Err(Error::invalid("items", "items must hold at least one item").into());
    }
    let added = (store(&state)?
        .append_items(&caller.owner(None), &id, &items)
        .await)
        .map_err(osprey_core::Error::from)?;
    Ok(axum::Json(list_json(&added, false)))
}

/// One item of a conversation.
#[utoipa::path(
    get,
    path = "/v1/conversations/{id}/items/{item}",
    tag = "conversations",
    operation_id = "getConversationItem",
    params(
        ("id" = String, Path, description = "The conversation's id"),
        ("item" = String, Path, description = "The item's id"),
    ),
    responses(
        (status = 200, description = "The item", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn retrieve_item(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path((id, item)): Path<(String, String)>,
) -> Result<axum::Json<Value>, ApiError> {
    let record = (store(&state)?.item(&caller.owner(None), &id, &item).await)
        .map_err(osprey_core::Error::from)?;
    Ok(axum::Json(item_json(&record)))
}

/// Deletes one item of a conversation.
#[utoipa::path(
    delete,
    path = "/v1/conversations/{id}/items/{item}",
    tag = "conversations",
    operation_id = "deleteConversationItem",
    params(
        ("id" = String, Path, description = "The conversation's id"),
        ("item" = String, Path, description = "The item's id"),
    ),
    responses(
        (status = 200, description = "The conversation", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn delete_item(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path((id, item)): Path<(String, String)>,
) -> Result<axum::Json<Value>, ApiError> {
    let owner: Owner = caller.owner(None);
    let store = store(&state)?;
    (store.delete_item(&owner, &id, &item).await).map_err(osprey_core::Error::from)?;
    let record = (store.conversation(&owner, &id).await).map_err(osprey_core::Error::from)?;
    Ok(axum::Json(conversation_json(&record)))
}

/// A JSON body, or a 400 naming what is wrong with it.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(body)
        .map_err(|e| Error::invalid("body", format!("Invalid request body: {e}")))
}

/// Messages of a request: `{"type": "message", "role", "content"}` with the content a string
/// or a list of text parts (`input_text`, `output_text`, `text`).
pub fn parse_items(items: &[Value], param: &str) -> Result<Vec<NewItem>, Error> {
    if items.len() > MAX_ITEMS_PER_REQUEST {
        return Err(Error::invalid(
            param,
            format!("at most {MAX_ITEMS_PER_REQUEST} items can be added at a time"),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let param = format!("{param}[{i}]");
            if !matches!(item["type"].as_str(), None | Some("message")) {
                return Err(Error::invalid(
                    &param,
                    "only items of type `message` are supported",
                ));
            }
            let role = match item["role"].as_str() {
                Some(r @ ("user" | "assistant" | "system" | "developer")) => r,
                _ => {
                    return Err(Error::invalid(
                        format!("{param}.role"),
                        "role must be `user`, `assistant`, `system` or `developer`",
                    ));
                }
            };
            let content = osprey_core::api::content_text(&item["content"]).ok_or_else(|| {
                Error::invalid(
                    format!("{param}.content"),
                    "content must be a string or a list of text parts",
                )
            })?;
            Ok(NewItem {
                role: role.to_owned(),
                content,
            })
        })
        .collect()
}

/// Metadata as stored: a JSON object of at most 16 string values.
fn metadata_text(metadata: Option<&Value>) -> Result<String, Error> {
    let empty = Value::Object(Map::new());
    let metadata = metadata.unwrap_or(&empty);
    let ok = metadata
        .as_object()
        .is_some_and(|m| m.len() <= MAX_METADATA_PAIRS && m.values().all(Value::is_string));
    if !ok {
        return Err(Error::invalid(
            "metadata",
            format!("metadata must be an object of at most {MAX_METADATA_PAIRS} string values"),
        ));
    }
    Ok(metadata.to_string())
}

fn conversation_json(c: &ConversationRecord) -> Value {
    json!({
        "id": c.id,
        "object": "conversation",
        "created_at": c.created_at / 1000,
        "metadata": serde_json::from_str::<Value>(&c.metadata).unwrap_or_else(|_| json!({})),
    })
}

fn item_json(i: &ItemRecord) -> Value {
    let part = match i.role.as_str() {
        "assistant" => "output_text",
        _ => "input_text",
    };
    json!({
        "type": "message",
        "id": i.id,
        "status": "completed",
        "role": i.role,
        "content": [{"type": part, "text": i.content}],
    })
}

fn list_json(items: &[ItemRecord], has_more: bool) -> Value {
    json!({
        "object": "list",
        "data": items.iter().map(item_json).collect::<Vec<_>>(),
        "first_id": items.first().map(|i| i.id.clone()),
        "last_id": items.last().map(|i| i.id.clone()),
        "has_more": has_more,
    })
}
