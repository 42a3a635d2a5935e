//! `GET /v1/models` and `GET /v1/models/{id}`.

use axum::Json;
use axum::extract::{Path, State};
use osprey_core::Error;
use osprey_core::api::{ModelCard, ModelList};

use crate::error::ApiError;
use crate::state::AppState;

fn card(state: &AppState) -> ModelCard {
    ModelCard {
        id: state.model_name().to_owned(),
        object: "model".into(),
        created: state.created(),
        owned_by: "osprey".into(),
        max_model_len: state.engine().map(|e| e.info().max_model_len),
    }
}

/// The served models.
pub async fn list(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list".into(),
        data: vec![card(&state)],
    })
}

/// One model, or 404.
pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    if id != state.model_name() {
        return Err(Error::model_not_found(&id).into());
    }
    Ok(Json(card(&state)))
}
