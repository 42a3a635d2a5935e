//! The OpenAPI 3.1 document of the gateway's HTTP surface, served at `GET /openapi.json`.
//!
//! It is generated from the code: each handler carries a `#[utoipa::path]` (method, path,
//! body, responses, security) and the wire types of [`osprey_core::api`] derive
//! `utoipa::ToSchema`, so a route or a field cannot change without the document changing too
//! (`tests/openapi.rs` checks both ways: every route is documented, every documented operation
//! is routed).
//!
//! What it covers is [`crate::router`], the gateway: everything a client or an operator calls.
//! The routes only `osprey worker` serves ([`crate::worker_router`]: `/worker/load` and
//! `/worker/events`) are left out: they are a protocol between Osprey's own processes
//! ([`osprey_router::workers::protocol`]), not an API anyone else should build on.
//!
//! Conventions:
//! - every error is OpenAI's envelope `{"error": {"message", "type", "param", "code"}}`
//!   ([`ErrorResponse`]); the statuses a route can answer with are the ones its handler and
//!   the layers in front of it produce, and every operation may answer 500 (a handler that
//!   panics fails its request, not the server);
//! - bodies the handlers build as free-form JSON are documented as JSON objects, not given an
//!   invented shape;
//! - streamed answers (`"stream": true`) are `text/event-stream`, documented event by event
//!   (`ChatCompletionEvent`…: each `data:` one JSON chunk, then `data: [DONE]`), the way
//!   OpenAPI 3.2's `itemSchema` and schemathesis read a stream;
//! - `api_key` is a tenant's key (`Authorization: Bearer osk-…`); a server on which no key was
//!   ever created lets requests in without one. `admin_key` is the server's `--admin-key`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::LazyLock;

use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{Value, json};
use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, Ref, Schema};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, RefOr, Response, ResponseBuilder};
use utoipa::{IntoResponses, Modify, OpenApi, PartialSchema, ToResponse, ToSchema};

use crate::routes;

/// The security scheme of a tenant's API key.
pub const API_KEY: &str = "api_key";
/// The security scheme of the admin key.
pub const ADMIN_KEY: &str = "admin_key";

/// The gateway's document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Osprey",
        description = "An OpenAI-compatible LLM serving stack: generation, the Batch, \
            Conversations and Responses APIs, memory, document collections, and the admin API."
    ),
    paths(
        routes::chat_completions,
        routes::completions,
        routes::responses::create,
        routes::models::list,
        routes::models::get,
        routes::moderations::create,
        routes::embeddings::create,
        routes::batches::upload,
        routes::batches::file,
        routes::batches::content,
        routes::batches::create,
        routes::batches::list,
        routes::batches::batch,
        routes::batches::cancel,
        routes::conversations::create,
        routes::conversations::retrieve,
        routes::conversations::update,
        routes::conversations::delete,
        routes::conversations::list_items,
        routes::conversations::add_items,
        routes::conversations::retrieve_item,
        routes::conversations::delete_item,
        routes::memory::list_facts,
        routes::memory::add_fact,
        routes::memory::delete_fact,
        routes::memory::list_working,
        routes::memory::read_working,
        routes::memory::write_working,
        routes::memory::delete_working,
        routes::collections::list_collections,
        routes::collections::delete_collection,
        routes::collections::add_documents,
        routes::collections::list_documents,
        routes::collections::delete_document,
        routes::collections::job,
        routes::collections::search_route,
        routes::responses::list,
        routes::responses::read,
        routes::responses::steps,
        routes::responses::approve,
        routes::responses::reject,
        routes::responses::cancel,
        routes::responses::replay,
        routes::admin::list_keys,
        routes::admin::create_key,
        routes::admin::revoke_key,
        routes::admin::audit_log,
        routes::admin::list_flags,
        routes::admin::set_flag,
        routes::admin::unset_flag,
        routes::admin_prompts::list,
        routes::admin_prompts::show,
        routes::admin_prompts::push,
        routes::admin_prompts::version,
        routes::admin_prompts::diff_versions,
        routes::admin_prompts::set_label,
        routes::admin_prompts::rollback,
        routes::admin_users::delete_user,
        routes::admin_runs::list,
        routes::admin_runs::read,
        routes::admin_runs::approve,
        routes::admin_runs::reject,
        routes::admin_runs::tool_audit,
        routes::admin_engine::show,
        routes::admin_engine::switch,
        routes::admin_requests::list,
        routes::admin_requests::one,
        routes::dashboard::show,
        routes::dashboard::models,
        routes::dashboard::playground,
        routes::health::health,
        routes::health::ready,
        routes::health::metrics,
        serve,
    ),
    components(
        schemas(
            osprey_core::api::ErrorResponse,
            osprey_core::api::SamplingFields,
            osprey_core::api::ChatCompletionChunk
        ),
        responses(
            InvalidRequest,
            Unauthorized,
            Forbidden,
            NotFound,
            PayloadTooLarge,
            RateLimited,
            ServerError,
            BadGateway,
            Unavailable,
            GatewayTimeout
        )
    ),
    modifiers(&Finish),
    tags(
        (name = "generation", description = "Chat and text completions, agent runs"),
        (name = "models", description = "The models served"),
        (name = "safety", description = "Moderation by the tenant's input guards"),
        (name = "embeddings", description = "Embeddings by the retrieval embedder"),
        (name = "batches", description = "The Batch API: input files, batches, output files"),
        (name = "conversations", description = "The Conversations API"),
        (name = "memory", description = "A user's facts and scratchpads"),
        (name = "collections", description = "Document collections: ingest and search"),
        (name = "responses", description = "Agent runs (the Responses API), once started"),
        (name = "admin", description = "The admin API, behind the admin key"),
        (name = "operations", description = "Health, readiness, metrics, the dashboard, this document"),
    )
)]
pub struct ApiDoc;

/// The document as served, built once.
static DOCUMENT: LazyLock<String> = LazyLock::new(|| document().to_string());

/// The document: what the derive writes, with the stream events' schemas put in (utoipa's
/// schema model has no `if`/`else` or `contentSchema`, so they are written as JSON here).
pub fn document() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serialises");
    let schemas = &mut doc["components"]["schemas"];
    let chunk = |name: &str| json!({"anyOf": [schema_ref(name), schema_ref("ErrorResponse")]});
    schemas[ChatCompletionEvent::NAME] = event(
        ChatCompletionEvent::ABOUT,
        chunk("ChatCompletionChunk"),
        true,
    );
    schemas[CompletionEvent::NAME] = event(CompletionEvent::ABOUT, chunk("Completion"), true);
    schemas[ResponseEvent::NAME] = event(ResponseEvent::ABOUT, json!({"type": "object"}), false);
    doc
}

fn schema_ref(schema: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{schema}")})
}

/// The schema of one server-sent event (as schemathesis and OpenAPI 3.2's `itemSchema` read
/// a stream: `{event, data, id}`), whose `data` is JSON under `payload`; with `done`, the
/// stream ends with `data: [DONE]`, as OpenAI's do.
fn event(about: &str, payload: Value, done: bool) -> Value {
    let json_data = json!({"properties": {"data": {
        "contentMediaType": "application/json",
        "contentSchema": payload,
    }}});
    let mut event = json!({
        "description": about,
        "type": "object",
        "required": ["data"],
        "properties": {
            "event": {"type": "string"},
            "id": {"type": "string"},
            "data": {"type": "string"},
        },
    });
    match done {
        true => {
            event["if"] = json!({"properties": {"data": {"const": "[DONE]"}}});
            event["else"] = json_data;
        }
        false => event["allOf"] = json!([json_data]),
    }
    event
}

/// Declares the schema of a stream's events: a component the derive references by name, whose
/// content [`document`] writes.
macro_rules! stream_event {
    ($name:ident, $about:literal) => {
        #[doc = $about]
        pub struct $name;

        impl $name {
            const NAME: &str = stringify!($name);
            const ABOUT: &str = $about;
        }

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                ObjectBuilder::new().description(Some($about)).into()
            }
        }

        impl ToSchema for $name {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed(Self::NAME)
            }
        }
    };
}

stream_event!(
    ChatCompletionEvent,
    "An event of a streamed chat completion: a `ChatCompletionChunk`, an error in the envelope \
     (the stream then ends), or `[DONE]`."
);
stream_event!(
    CompletionEvent,
    "An event of a streamed completion: a `Completion` chunk, an error in the envelope (the \
     stream then ends), or `[DONE]`."
);
stream_event!(
    ResponseEvent,
    "An event of a streamed agent run, named by its `event` (`response.created`, \
     `response.output_item.done`…), its `data` a JSON object."
);

/// This document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    operation_id = "openapi",
    responses((status = 200, description = "The OpenAPI document of this server", body = Object))
)]
pub async fn serve() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        DOCUMENT.as_str(),
    )
}

/// What the derive cannot say: the security schemes, the sampling fields that share the
/// generation requests' bodies (parsed apart, see [`osprey_core::api::parse_request`], so the
/// derive does not see them), and the 500 every operation may answer.
struct Finish;

impl Modify for Finish {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        let bearer = |what: &str| {
            let http = HttpBuilder::new().scheme(HttpAuthScheme::Bearer);
            SecurityScheme::Http(http.description(Some(what)).build())
        };
        components.add_security_scheme(
            API_KEY,
            bearer(
                "A tenant's API key (`osk-…`), as `Authorization: Bearer KEY` or `api-key: KEY`. \
                 Until the first key is created the server is open and needs none.",
            ),
        );
        components.add_security_scheme(
            ADMIN_KEY,
            bearer("The server's admin key (`--admin-key`); without one the admin API is closed."),
        );
        for name in ["ChatCompletionRequest", "CompletionRequest"] {
            if let Some(own) = components.schemas.remove(name) {
                let joined = AllOfBuilder::new()
                    .item(own)
                    .item(Ref::from_schema_name("SamplingFields"))
                    .build();
                components
                    .schemas
                    .insert(name.to_owned(), RefOr::T(Schema::AllOf(joined)));
            }
        }
        let (status, failed) = reference::<ServerError>(ServerError::STATUS);
        for item in doc.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
            ];
            for operation in operations.into_iter().flatten() {
                (operation.responses.responses)
                    .entry(status.clone())
                    .or_insert_with(|| failed.clone());
            }
        }
    }
}

/// A response in OpenAI's error envelope.
fn envelope(description: &str) -> RefOr<Response> {
    let content = ContentBuilder::new()
        .schema(Some(Ref::from_schema_name("ErrorResponse")))
        .build();
    ResponseBuilder::new()
        .description(description)
        .content("application/json", content)
        .build()
        .into()
}

/// Declares an error response: a component named after the type, with its status.
macro_rules! error_response {
    ($name:ident, $status:literal, $description:literal) => {
        #[doc = $description]
        pub struct $name;

        impl $name {
            /// The HTTP status.
            pub const STATUS: u16 = $status;
        }

        impl<'r> ToResponse<'r> for $name {
            fn response() -> (&'r str, RefOr<Response>) {
                (stringify!($name), envelope($description))
            }
        }
    };
}

error_response!(
    InvalidRequest,
    400,
    "The request is malformed or asks for something invalid; `param` names the field."
);
error_response!(
    Unauthorized,
    401,
    "No key, or an unknown, expired or revoked one (`code`: `invalid_api_key`)."
);
error_response!(
    Forbidden,
    403,
    "The key may not do this (a model its tenant may not use; the admin API closed)."
);
error_response!(
    NotFound,
    404,
    "Nothing by that name or id (for this caller)."
);
error_response!(
    PayloadTooLarge,
    413,
    "The request body is larger than the server accepts."
);
error_response!(
    RateLimited,
    429,
    "Over a rate or concurrency limit; `retry-after` says when to come back."
);
error_response!(
    ServerError,
    500,
    "The server failed while handling the request."
);
error_response!(
    BadGateway,
    502,
    "The upstream or worker serving the model failed."
);
error_response!(
    Unavailable,
    503,
    "Not available now (the model loading, the server too busy, its store unreachable, or \
     a part this server runs without); `retry-after` says when to come back, if it will be."
);
error_response!(
    GatewayTimeout,
    504,
    "The upstream serving the model did not answer in time."
);

/// A `$ref` to error response component `R`, keyed by its status.
fn reference<'r, R: ToResponse<'r>>(status: u16) -> (String, RefOr<Response>) {
    (
        status.to_string(),
        RefOr::Ref(Ref::from_response_name(R::response().0)),
    )
}

/// What the edge in front of the generation routes ([`crate::edge::guard`]) may answer
/// instead of the handler.
pub struct EdgeErrors;

impl IntoResponses for EdgeErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        BTreeMap::from([
            reference::<Unauthorized>(Unauthorized::STATUS),
            reference::<Forbidden>(Forbidden::STATUS),
            reference::<PayloadTooLarge>(PayloadTooLarge::STATUS),
            reference::<RateLimited>(RateLimited::STATUS),
            reference::<Unavailable>(Unavailable::STATUS),
        ])
    }
}

/// What the admin key check in front of every `/admin` route may answer instead of the
/// handler.
pub struct AdminErrors;

impl IntoResponses for AdminErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        BTreeMap::from([
            reference::<Unauthorized>(Unauthorized::STATUS),
            reference::<Forbidden>(Forbidden::STATUS),
        ])
    }
}
