//! A tenant's document collections ([`osprey_rag`]): ingest, search, list and delete.
//!
//! | route | does |
//! |---|---|
//! | `GET /v1/collections` | lists the tenant's collections |
//! | `POST /v1/collections/{name}/documents` | queues an ingest job (JSON or multipart files); 202 |
//! | `GET /v1/collections/{name}/jobs/{id}` | an ingest job's status and report |
//! | `GET /v1/collections/{name}/documents` | the documents the caller may read |
//! | `DELETE /v1/collections/{name}/documents/{id}` | deletes a document the caller may read |
//! | `POST /v1/collections/{name}/search` | `{query, top_k, filter, group_by_document, rerank, method}` |
//! | `DELETE /v1/collections/{name}` | deletes the collection |
//!
//! What a caller may read is decided by its groups (the tenant's and its key's,
//! [`osprey_services::edge::Caller::groups`]), never by the request: a document ingested with `acl`
//! groups is invisible to everyone outside them, in search results, listings and deletes.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Extension, FromRequest, Multipart, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use base64::Engine as _;
use osprey_core::{Error, ErrorKind};
use osprey_rag::{Document, IngestOptions, Method, SearchQuery, Visibility};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::conversations::parse;
use osprey_services::edge::Caller;
use osprey_services::error::ApiError;
use osprey_services::rag::{collection, rag_error, search};
use osprey_services::state::Services;

/// Documents one request may post.
const MAX_DOCUMENTS: usize = 10_000;
/// Results one search may ask for.
const MAX_TOP_K: usize = 100;

/// The routes (behind authentication).
pub fn routes() -> Router<Services> {
    Router::new()
        .route("/v1/collections", get(list_collections))
        .route("/v1/collections/{name}", delete(delete_collection))
        .route(
            "/v1/collections/{name}/documents",
            post(add_documents).get(list_documents),
        )
        .route(
            "/v1/collections/{name}/documents/{*id}",
            delete(delete_document),
        )
        .route("/v1/collections/{name}/jobs/{id}", get(job))
        .route("/v1/collections/{name}/search", post(search_route))
}

/// An error naming (as `param`) the first of `groups` that cannot name an ACL group.
pub fn check_groups(groups: &[String], param: &str) -> Result<(), Error> {
    let valid = |g: &&String| {
        (1..=64).contains(&g.len())
            && g.as_str() != osprey_rag::EVERYONE
            && (g.chars()).all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
    };
    match groups.iter().find(|g| !valid(g)) {
        Some(bad) => Err(Error::invalid(
            param,
            format!("{bad:?} is not a group name (1 to 64 letters, digits, '-', '_', '.' or ':')"),
        )),
        None => Ok(()),
    }
}

/// A document posted as JSON: a record (`id`, `text`) or a file (`filename` with `content`,
/// or `content_base64` for binary formats such as PDF).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct PostedDocument {
    /// The document's id (a record's; a file's defaults to its name).
    id: Option<String>,
    /// Its title (default: its id).
    title: Option<String>,
    /// A record's text.
    text: Option<String>,
    /// Kept with its chunks, returned with hits.
    #[serde(default)]
    metadata: Map<String, Value>,
    /// A file's name, whose extension says its format.
    filename: Option<String>,
    /// A text file's content.
    content: Option<String>,
    /// A binary file's content (PDF…), base64.
    content_base64: Option<String>,
}

/// Documents to ingest.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct PostedDocuments {
    /// 1 to 10000 documents.
    #[schema(min_items = 1, max_items = 10000)]
    documents: Vec<PostedDocument>,
    /// The groups that may read them (none: everyone in the tenant).
    #[serde(default)]
    acl: Vec<String>,
    /// Re-index the collection this often.
    reindex_interval_seconds: Option<u64>,
}

/// Queues an ingest job: documents posted as JSON, or files as multipart (file parts, `acl`,
/// `reindex_interval_seconds`).
#[utoipa::path(
    post,
    path = "/v1/collections/{name}/documents",
    tag = "collections",
    operation_id = "addDocuments",
    params(("name" = String, Path, description = "The collection's name (made if new)")),
    request_body(content(
        (PostedDocuments = "application/json"),
        (Object = "multipart/form-data"),
    )),
    responses(
        (status = 202, description = "The ingest job, queued", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 413, response = crate::openapi::PayloadTooLarge),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn add_documents(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let multipart = (request.headers().get(header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    let (documents, acl, interval) = match multipart {
        true => {
            let form = Multipart::from_request(request, &state)
                .await
                .map_err(|e| Error::invalid("body", format!("Invalid multipart body: {e}")))?;
            from_multipart(form).await?
        }
        false => {
            let body = Bytes::from_request(request, &state)
                .await
                .map_err(crate::error::body_error)?;
            let posted: PostedDocuments = parse(&body)?;
            let documents = from_json(posted.documents)?;
            (documents, posted.acl, posted.reindex_interval_seconds)
        }
    };
    if documents.is_empty() || documents.len() > MAX_DOCUMENTS {
        let why = format!("post 1 to {MAX_DOCUMENTS} documents at a time");
        return Err(Error::invalid("documents", why).into());
    }
    check_groups(&acl, "acl")?;
    let collection = collection(&state, &caller, &name, true).await?;
    if interval.is_some() {
        collection
            .set_reindex_interval(interval)
            .map_err(rag_error)?;
    }
    let embedder = state.embedder().await.ok_or_else(|| {
        Error::new(
            ErrorKind::Unavailable,
            "The embedding model is not available.",
        )
    })?;
    let options = IngestOptions {
        acl,
        writer_groups: Some(caller.groups.clone()),
        ..IngestOptions::default()
    };
    let view = state.ingest_jobs().submit(
        &caller.tenant.name,
        &name,
        collection,
        documents,
        options,
        embedder,
    );
    Ok((StatusCode::ACCEPTED, axum::Json(view)).into_response())
}

fn from_json(posted: Vec<PostedDocument>) -> Result<Vec<Document>, Error> {
    let mut documents = Vec::new();
    for (i, d) in posted.into_iter().enumerate() {
        let param = format!("documents[{i}]");
        let bad = |why: String| Error::invalid(param.clone(), why);
        match (d.text, d.filename) {
            (Some(text), None) => {
                let id = (d.id.filter(|id| !id.trim().is_empty()))
                    .ok_or_else(|| bad("a document with text needs an id".into()))?;
                documents.push(Document {
                    title: d.title.unwrap_or_else(|| id.clone()),
                    id,
                    text: osprey_rag::document::clean(&text),
                    source: "api".into(),
                    format: osprey_rag::Format::Text,
                    metadata: d.metadata,
                });
            }
            (None, Some(filename)) => {
                let bytes = match (d.content, d.content_base64) {
                    (Some(text), None) => text.into_bytes(),
                    (None, Some(b64)) => (base64::engine::general_purpose::STANDARD.decode(b64))
                        .map_err(|e| bad(format!("content_base64 is not base64: {e}")))?,
                    _ => return Err(bad("a file needs content or content_base64".into())),
                };
                let name = d.id.unwrap_or(filename);
                let mut parsed = osprey_rag::document::parse(&name, &name, &bytes)
                    .map_err(|e| bad(e.to_string()))?;
                for doc in &mut parsed {
                    if let Some(title) = &d.title {
                        doc.title = title.clone();
                    }
                    doc.metadata.extend(d.metadata.clone());
                }
                documents.extend(parsed);
            }
            _ => {
                return Err(bad(
                    "give either id and text, or filename and content".into()
                ));
            }
        }
    }
    Ok(documents)
}

async fn from_multipart(
    mut form: Multipart,
) -> Result<(Vec<Document>, Vec<String>, Option<u64>), Error> {
    let (mut documents, mut acl, mut interval) = (Vec::new(), Vec::new(), None);
    let bad = |e| crate::error::form_error("body", e);
    while let Some(field) = form.next_field().await.map_err(bad)? {
        let field_name = field.name().unwrap_or_default().to_owned();
        match (field_name.as_str(), field.file_name().map(str::to_owned)) {
            (_, Some(filename)) => {
                let bytes = field.bytes().await.map_err(bad)?;
                let parsed = osprey_rag::document::parse(&filename, &filename, &bytes)
                    .map_err(|e| Error::invalid("file", e.to_string()))?;
                documents.extend(parsed);
            }
            ("acl", None) => acl.push(field.text().await.map_err(bad)?),
            ("reindex_interval_seconds", None) => {
                let text = field.text().await.map_err(bad)?;
                interval = Some(text.trim().parse().map_err(|_| {
                    Error::invalid("reindex_interval_seconds", "a whole number of seconds")
                })?);
            }
            (other, None) => {
                return Err(Error::invalid(
                    "body",
                    format!(
                        "unknown form field {other:?} (file parts, acl, reindex_interval_seconds)"
                    ),
                ));
            }
        }
    }
    Ok((documents, acl, interval))
}

/// An ingest job's status and report.
#[utoipa::path(
    get,
    path = "/v1/collections/{name}/jobs/{id}",
    tag = "collections",
    operation_id = "getIngestJob",
    params(
        ("name" = String, Path, description = "The collection's name"),
        ("id" = String, Path, description = "The job's id"),
    ),
    responses(
        (status = 200, description = "The job", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
    ),
    security(("api_key" = []))
)]
async fn job(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    match state.ingest_jobs().get(&caller.tenant.name, &id) {
        Some(view) if view.collection == name => Ok(axum::Json(view).into_response()),
        _ => Err(Error::new(
            ErrorKind::NotFound,
            format!("No ingest job {id} for {name}."),
        )
        .into()),
    }
}

/// The tenant's collections, each with the number of chunks the caller may read.
#[utoipa::path(
    get,
    path = "/v1/collections",
    tag = "collections",
    operation_id = "listCollections",
    responses(
        (status = 200, description = "A list of collections (`id`, `chunks`, \
            `last_indexed_at`, `reindex_interval_seconds`, `stale`)", body = Object),
        (status = 401, response = crate::openapi::Unauthorized),
    ),
    security(("api_key" = []))
)]
async fn list_collections(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
) -> Result<axum::Json<Value>, ApiError> {
    let library = state.library().clone();
    let tenant = caller.tenant.name.clone();
    let visibility = Visibility {
        groups: caller.groups.clone(),
        ..Visibility::default()
    };
    let data = tokio::task::spawn_blocking(move || {
        let stale: Vec<String> = (library.stale().into_iter())
            .filter(|s| s.tenant == tenant)
            .map(|s| s.name)
            .collect();
        (library.names(&tenant).into_iter())
            .filter_map(|name| {
                let c = library.get(&tenant, &name, false).ok()??;
                let meta = c.meta().ok()?;
                Some(json!({
                    "id": name,
                    "object": "collection",
                    "chunks": c.visible_chunk_count(&visibility).ok()?,
                    "last_indexed_at": meta.last_indexed_at.map(|ms| ms / 1000),
                    "reindex_interval_seconds": meta.reindex_interval_seconds,
                    "stale": stale.contains(&name),
                }))
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    Ok(axum::Json(json!({"object": "list", "data": data})))
}

/// Deletes a collection.
#[utoipa::path(
    delete,
    path = "/v1/collections/{name}",
    tag = "collections",
    operation_id = "deleteCollection",
    params(("name" = String, Path, description = "The collection's name")),
    responses(
        (status = 200, description = "`{\"id\", \"object\": \"collection.deleted\", \"deleted\": true}`", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
    ),
    security(("api_key" = []))
)]
async fn delete_collection(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let deleted = (state.library().delete(&caller.tenant.name, &name)).map_err(rag_error)?;
    if !deleted {
        return Err(Error::new(ErrorKind::NotFound, format!("No collection {name}.")).into());
    }
    Ok(axum::Json(
        json!({"id": name, "object": "collection.deleted", "deleted": true}),
    ))
}

/// The documents of a collection the caller may read.
#[utoipa::path(
    get,
    path = "/v1/collections/{name}/documents",
    tag = "collections",
    operation_id = "listDocuments",
    params(("name" = String, Path, description = "The collection's name")),
    responses(
        (status = 200, description = "A list of documents (`id`, `source`)", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
    ),
    security(("api_key" = []))
)]
async fn list_documents(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let c = collection(&state, &caller, &name, false).await?;
    let visibility = Visibility {
        groups: caller.groups.clone(),
        ..Visibility::default()
    };
    let documents = tokio::task::spawn_blocking(move || c.documents(Some(&visibility)))
        .await
        .map_err(|_| Error::new(ErrorKind::Internal, "listing failed"))?
        .map_err(rag_error)?;
    let data: Vec<Value> = (documents.into_iter())
        .map(|(id, source)| json!({"id": id, "object": "collection.document", "source": source}))
        .collect();
    Ok(axum::Json(json!({"object": "list", "data": data})))
}

/// Deletes a document the caller may read.
#[utoipa::path(
    delete,
    path = "/v1/collections/{name}/documents/{id}",
    tag = "collections",
    operation_id = "deleteDocument",
    params(
        ("name" = String, Path, description = "The collection's name"),
        ("id" = String, Path, description = "The document's id (it may contain `/`)"),
    ),
    responses(
        (status = 200, description = "`{\"id\", \"object\": \"collection.document.deleted\", \"deleted\": true}`", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
    ),
    security(("api_key" = []))
)]
async fn delete_document(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path((name, id)): Path<(String, String)>,
) -> Result<axum::Json<Value>, ApiError> {
    let c = collection(&state, &caller, &name, false).await?;
    let (groups, doc) = (caller.groups.clone(), id.clone());
    let deleted = tokio::task::spawn_blocking(move || c.delete_document(&doc, Some(&groups)))
        .await
        .map_err(|_| Error::new(ErrorKind::Internal, "delete failed"))?
        .map_err(rag_error)?;
    if !deleted {
        return Err(Error::new(ErrorKind::NotFound, format!("No document {id} in {name}.")).into());
    }
    Ok(axum::Json(
        json!({"id": id, "object": "collection.document.deleted", "deleted": true}),
    ))
}

/// What a search may narrow itself to.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct SearchFilter {
    /// One document id or a list of them.
    document_id: Option<Value>,
    /// Only chunks indexed at or after this time, Unix seconds.
    indexed_after: Option<i64>,
    /// Only chunks indexed in the last this many seconds.
    max_age_seconds: Option<i64>,
}

/// A search.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct SearchRequest {
    /// What to look for (not empty).
    query: String,
    /// Hits to return, 1 to 100 (default 5).
    #[schema(minimum = 1, maximum = 100)]
    top_k: Option<usize>,
    /// What to narrow the search to.
    #[serde(default)]
    filter: SearchFilter,
    /// One hit a document, its best chunk (default true).
    group_by_document: Option<bool>,
    /// Rerank the candidates (default true).
    rerank: Option<bool>,
    /// `bm25`, `vector` or `hybrid` (default).
    #[schema(value_type = Option<String>)]
    method: Option<Method>,
}

/// Searches a collection, among the chunks the caller may read.
#[utoipa::path(
    post,
    path = "/v1/collections/{name}/search",
    tag = "collections",
    operation_id = "searchCollection",
    params(("name" = String, Path, description = "The collection's name")),
    request_body = SearchRequest,
    responses(
        (status = 200, description = "The hits (`data`) and how they were found (`search`)", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
async fn search_route(
    State(state): State<Services>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<axum::Json<Value>, ApiError> {
    let req: SearchRequest = parse(&body)?;
    if req.query.trim().is_empty() {
        return Err(Error::invalid("query", "query must not be empty").into());
    }
    let top_k = req.top_k.unwrap_or(5);
    if !(1..=MAX_TOP_K).contains(&top_k) {
        return Err(Error::invalid("top_k", format!("top_k is 1 to {MAX_TOP_K}")).into());
    }
    let documents = match req.filter.document_id {
        None => None,
        Some(Value::String(id)) => Some(vec![id]),
        Some(Value::Array(ids)) => Some(
            (ids.into_iter())
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    Error::invalid("filter.document_id", "a string or a list of strings")
                })?,
        ),
        Some(_) => {
            return Err(
                Error::invalid("filter.document_id", "a string or a list of strings").into(),
            );
        }
    };
    let since_age = (req.filter.max_age_seconds).map(|s| osprey_rag::now_ms() - s.max(0) * 1000);
    let since = (req.filter.indexed_after.map(|s| s * 1000)).max(since_age);
    let mut query = SearchQuery::new(&req.query, top_k, caller.groups.clone());
    query.visibility.indexed_after = since;
    query.visibility.documents = documents;
    query.group_by_document = req.group_by_document.unwrap_or(true);
    if !req.rerank.unwrap_or(true) {
        query.rerank = None;
    }
    query.method = req.method.unwrap_or_default();
    let took = std::time::Instant::now();
    let hits = search(&state, &caller, &name, query.clone()).await?;
    let data: Vec<Value> = (hits.iter())
        .map(|h| {
            json!({
                "document_id": h.document_id,
                "chunk_id": h.chunk_id,
                "score": h.score,
                "text": h.text,
                "source": h.source,
                "title": h.title,
                "heading": h.heading,
                "indexed_at": h.indexed_at / 1000,
                "metadata": h.metadata,
            })
        })
        .collect();
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "search": {
            "method": query.method,
            "rerank": query.rerank.is_some(),
            "took_ms": took.elapsed().as_secs_f64() * 1000.0,
        },
    })))
}
