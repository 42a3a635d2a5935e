//! `POST /v1/embeddings` in OpenAI's shape, served by the retrieval embedder
//! (all-MiniLM-L6-v2, 384 dimensions, unit length): `input` a string or a list of them,
//! `encoding_format` `float` (default) or `base64` (little-endian f32, as OpenAI sends).
//! Inputs longer than 256 tokens are embedded from their first 256, as sentence-transformers
//! does.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use base64::Engine as _;
use osprey_core::{Error, ErrorKind};
use osprey_engine::embedder::{self, DIMENSIONS, MAX_TOKENS};
use serde::Deserialize;
use serde_json::{Value, json};

use osprey_services::error::ApiError;
use osprey_services::state::Services;

/// Inputs one request may embed.
const MAX_INPUTS: usize = 2048;

/// What to embed.
#[derive(Deserialize, utoipa::ToSchema)]
struct EmbeddingRequest {
    /// A string, or a list of 1 to 2048 strings, none empty.
    input: Value,
    /// The embedding model (there is one; any other name is a 404).
    model: Option<String>,
    /// `float` (default) or `base64`.
    encoding_format: Option<String>,
    /// The model's own, 384, if given.
    dimensions: Option<usize>,
    /// The end user (recorded by OpenAI; unused here).
    #[allow(dead_code)]
    user: Option<String>,
}

/// `POST /v1/embeddings`.
#[utoipa::path(
    post,
    path = "/v1/embeddings",
    tag = "embeddings",
    operation_id = "createEmbedding",
    request_body = EmbeddingRequest,
    responses(
        (status = 200, description = "One embedding per input (`data`), the model and the \
            tokens read (`usage`)", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
    security(("api_key" = []))
)]
pub async fn create(State(state): State<Services>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let req: EmbeddingRequest = serde_json::from_slice(&body)
        .map_err(|e| Error::invalid("body", format!("Invalid request body: {e}")))?;
    let model = embedder::MODEL_ID;
    if let Some(asked) = req.model.as_deref().filter(|m| !embedder::is_model_id(m)) {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "The embedding model `{asked}` does not exist; this server embeds with `{model}`."
            ),
        )
        .with_param("model")
        .with_code("model_not_found")
        .into());
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            let why = format!("encoding_format is float or base64, not {other:?}");
            return Err(Error::invalid("encoding_format", why).into());
        }
    };
    if req.dimensions.is_some_and(|d| d != DIMENSIONS) {
        let why = format!("{model} embeds in {DIMENSIONS} dimensions");
        return Err(Error::invalid("dimensions", why).into());
    }
    let inputs: Vec<String> = match req.input {
        Value::String(s) => vec![s],
        Value::Array(items) if !items.is_empty() && items.len() <= MAX_INPUTS => (items.into_iter())
            .map(|i| match i {
                Value::String(s) => Ok(s),
                _ => Err(Error::invalid("input", "input is a string or a list of strings (token arrays are not taken: they would be another model's tokens)")),
            })
            .collect::<Result<_, _>>()?,
        _ => {
            let why = format!("input is a string or a list of 1 to {MAX_INPUTS} strings");
            return Err(Error::invalid("input", why).into());
        }
    };
    if inputs.iter().any(|s| s.is_empty()) {
        return Err(Error::invalid("input", "an input must not be empty").into());
    }
    let embedder = state.embedder().await.ok_or_else(|| {
        Error::new(
            ErrorKind::Unavailable,
            "The embedding model is not available.",
        )
    })?;
    let embedded = tokio::task::spawn_blocking(move || {
        (inputs.iter())
            .map(|text| {
                let tokens = (embedder.count_tokens(text) + 2).min(MAX_TOKENS);
                embedder.embed(text).map(|v| (v, tokens))
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|_| Error::new(ErrorKind::Internal, "embedding failed"))?
    .map_err(|e| Error::new(ErrorKind::Internal, format!("embedding failed: {e}")))?;
    let tokens: usize = embedded.iter().map(|(_, t)| t).sum();
    let data: Vec<Value> = (embedded.into_iter().enumerate())
        .map(|(index, (vector, _))| {
            let embedding = match base64 {
                true => {
                    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                    Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
                false => json!(vector),
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
}
