//! `GET /v1/models`.

use serde::{Deserialize, Serialize};

/// The list of served models.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    /// The models.
    pub data: Vec<ModelCard>,
}

/// One served model.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelCard {
    /// The name to put in requests' `model`.
    pub id: String,
    /// Always `model`.
    pub object: String,
    /// Unix time the model was loaded.
    pub created: u64,
    /// Who serves it.
    pub owned_by: String,
    /// Context window in tokens (an extension, as vLLM's `max_model_len`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<usize>,
}
