//! The prompt stage's ties to the server ([`osprey_context::registry`] does the work): the
//! store, the caller, and the `x-osprey-prompt: NAME@VERSION` header naming the version that
//! answered.

use axum::http::HeaderValue;
use axum::response::Response;
use osprey_context::registry::{Applied, Asker};
use osprey_core::api::JsonBody;
use osprey_core::{Error, ErrorKind};
use serde_json::{Map, Value};

use crate::edge::Caller;
use crate::state::Services;

/// The response header naming the prompt version used.
pub const PROMPT_HEADER: &str = "x-osprey-prompt";

/// Applies the prompt the body names to it; which version that was.
pub async fn apply(
    state: &Services,
    caller: &Caller,
    flags: &Map<String, Value>,
    body: &mut JsonBody,
) -> Result<Applied, Error> {
    let store = state.audit_store().ok_or_else(|| {
        Error::new(
            ErrorKind::Unavailable,
            "This server has no store for prompts.",
        )
    })?;
    let asker = Asker {
        tenant: &caller.tenant.name,
        key_id: caller.key_id.as_deref(),
    };
    let owner = |user: Option<&str>| caller.owner(user);
    osprey_context::registry::apply(&store, &asker, owner, flags, body).await
}

/// Marks `response` with the version `applied`.
pub fn mark(applied: &Applied, response: &mut Response) {
    let version = format!("{}@{}", applied.name, applied.version);
    if let Ok(v) = HeaderValue::from_str(&version) {
        response.headers_mut().insert(PROMPT_HEADER, v);
    }
}
