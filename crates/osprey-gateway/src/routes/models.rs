//! `GET /v1/models` and `GET /v1/models/{id}`.

use axum::Json;
use axum::extract::{Path, State};
use osprey_core::Error;
use osprey_core::api::{ModelCard, ModelList};

use crate::error::ApiError;
use crate::state::AppState;

fn cards(state: &AppState) -> Vec<ModelCard> {
    let local = state.model_name().map(|name| ModelCard {
        id: name.to_owned(),
        object: "model".into(),
        created: state.created(),
        owned_by: "osprey".into(),
        max_model_len: state.engine().map(|e| e.info().max_model_len),
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
        id: super::auto::AUTO.to_owned(),
        object: "model".into(),
        created: state.created(),
        owned_by: "osprey-router".into(),
        max_model_len: None,
    });
    local
        .into_iter()
        .chain(pool)
        .chain(upstreams)
        .chain(auto)
        .collect()
}

/// The served models: the local one (or the workers'), and every upstream.
pub async fn list(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list".into(),
        data: cards(&state),
    })
}

/// One model, or 404.
pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    cards(&state)
        .into_iter()
        .find(|c| c.id == id)
        .map(Json)
        .ok_or_else(|| Error::model_not_found(&id).into())
}
