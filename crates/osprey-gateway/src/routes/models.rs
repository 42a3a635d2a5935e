//! `GET /v1/models` and `GET /v1/models/{id}`.

use axum::Json;
use axum::extract::{Path, State};
use osprey_core::Error;
use osprey_core::api::{ModelCard, ModelList};

use osprey_services::error::ApiError;
use osprey_services::state::Services;

fn cards(state: &Services) -> Vec<ModelCard> {
    let local = state.local_models().map(|m| ModelCard {
        id: m.name.to_owned(),
        object: "model".into(),
        created: state.created(),
        owned_by: "osprey".into(),
        max_model_len: m.engine.map(|e| e.info().max_model_len),
    });
    let pool = state.pool().map(|p| ModelCard {
        id: p.name().to_owned(),
        object: "model".into(),
        created: state.created(),
        owned_by: "osprey".into(),
        max_model_len: None,
    });
    let upstreams = state.upstreams().map(|u| ModelCard {
        id: u.name.clone(),
        object: "model".into(),
        created: state.created(),
        owned_by: "upstream".into(),
        max_model_len: None,
    });
    let auto = state.tiers().map(|_| ModelCard {
        id: osprey_router::auto::AUTO.to_owned(),
        object: "model".into(),
        created: state.created(),
        owned_by: "osprey-router".into(),
        max_model_len: None,
    });
    // `/v1/embeddings` answers for it, wherever the chat models come from.
    let embedder = ModelCard {
        id: osprey_engine::embedder::MODEL_ID.to_owned(),
        object: "model".into(),
        created: state.created(),
        owned_by: "osprey".into(),
        max_model_len: Some(osprey_engine::embedder::MAX_TOKENS),
    };
    local
        .chain(pool)
        .chain(upstreams)
        .chain(auto)
        .chain([embedder])
        .collect()
}

/// The served models: the local ones (or the workers'), every upstream, `auto` with tiers, and
/// the embedding model.
#[utoipa::path(
    get,
    path = "/v1/models",
    tag = "models",
    operation_id = "listModels",
    responses(
        (status = 200, description = "The served models", body = ModelList),
        (status = 401, response = crate::openapi::Unauthorized),
    ),
    security(("api_key" = []))
)]
pub async fn list(State(state): State<Services>) -> Json<ModelList> {
    Json(ModelList {
        object: "list".into(),
        data: cards(&state),
    })
}

/// One model, or 404.
#[utoipa::path(
    get,
    path = "/v1/models/{id}",
    tag = "models",
    operation_id = "getModel",
    params(("id" = String, Path, description = "The model's name (it may contain `/`)")),
    responses(
        (status = 200, description = "The model", body = ModelCard),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
    ),
    security(("api_key" = []))
)]
pub async fn get(
    State(state): State<Services>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    let id = match osprey_engine::embedder::is_model_id(&id) {
        true => osprey_engine::embedder::MODEL_ID.to_owned(),
        false => id,
    };
    cards(&state)
        .into_iter()
        .find(|c| c.id == id)
        .map(Json)
        .ok_or_else(|| Error::model_not_found(&id).into())
}
