//! The admin API's view of users and their requests:
//! - `DELETE /admin/tenants/{tenant}/users/{user}` forgets a user: their conversations,
//!   memory and request-log rows in the store ([`osprey_store::users`]), and the answers kept
//!   for them in the response cache; it says how many of each went.
//!
//! The request log's routes are in `admin_requests.rs`.

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::routing::delete;
use osprey_core::{Error, ErrorKind};
use osprey_store::Owner;
use serde_json::{Value, json};

use osprey_services::error::ApiError;
use osprey_services::state::Services;

/// The routes (behind the admin key).
pub fn routes() -> Router<Services> {
    Router::new().route("/admin/tenants/{tenant}/users/{user}", delete(delete_user))
}

fn store(state: &Services) -> Result<&osprey_store::Store, Error> {
    (state.store()).ok_or_else(|| Error::new(ErrorKind::Unavailable, "This server has no store."))
}

/// Forgets a user: their conversations, memory, request-log rows and cached answers.
#[utoipa::path(
    delete,
    path = "/admin/tenants/{tenant}/users/{user}",
    tag = "admin",
    operation_id = "deleteUser",
    params(
        ("tenant" = String, Path, description = "The tenant"),
        ("user" = String, Path, description = "The user (`x-osprey-user`)"),
    ),
    responses(
        (status = 200, description = "How many of each went (`deleted`)", body = Object),
        (status = 503, response = crate::openapi::Unavailable),
        crate::openapi::AdminErrors,
    ),
    security(("admin_key" = []))
)]
async fn delete_user(
    State(state): State<Services>,
    Path((tenant, user)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let owner = Owner { tenant, user };
    let deleted = (store(&state)?.delete_user(&owner).await).map_err(osprey_core::Error::from)?;
    let cached = match state.response_cache() {
        Some(cache) => cache.forget(&owner).await.map_err(|e| {
            Error::new(
                ErrorKind::Unavailable,
                format!("The store forgot the user, but the response cache failed: {e}"),
            )
        })?,
        None => 0,
    };
    tracing::info!(tenant = %owner.tenant, user = %owner.user, ?deleted, cached, "user deleted");
    Ok(Json(json!({
        "object": "user.deleted",
        "tenant": owner.tenant,
        "user": owner.user,
        "deleted": {
            "conversations": deleted.conversations,
            "items": deleted.items,
            "facts": deleted.facts,
            "working": deleted.working,
            "requests": deleted.requests,
            "cached_answers": cached,
        },
    })))
}
