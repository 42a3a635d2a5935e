//! Runs as HTTP answers: `osprey-agent`'s runner ([`osprey_agent::responses::runner`]) driven
//! with this server as its [`Host`](super::Served), its response object as JSON, or its
//! events as server-sent events.

use axum::Json;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use osprey_agent::responses::runner::{self, Driven, Stored};
use osprey_agent::responses::{ResponsesRequest, RunCaller};
use osprey_core::Error;
use osprey_store::Owner;
use serde_json::Value;

use super::Served;
use crate::edge::Caller;
use crate::state::Services;

/// Reads run `id` as `owner` sees it (`None`: the admin).
pub async fn load(state: &Services, owner: Option<&Owner>, id: &str) -> Result<Stored, Error> {
    runner::load(super::run_store(state)?, owner, id).await
}

/// The response object of a stored run.
pub fn show(state: &Services, stored: &Stored) -> Value {
    runner::show(state.agents().ok().map(|a| a.as_ref()), stored)
}

/// Starts a run of `request` for `caller` (a replay of `replay_of`, if given): the response
/// once it ends or pauses, or its events as they happen; and the model tokens it spent.
pub async fn start(
    state: &Services,
    caller: &Caller,
    request: ResponsesRequest,
    body: Value,
    replay_of: Option<String>,
) -> Result<(Response, u64), Error> {
    let agents = state.agents()?.clone();
    let owner = caller.owner(None);
    let run_caller = RunCaller {
        tenant: owner.tenant,
        key_id: caller.key_id.clone(),
        user: owner.user,
        groups: caller.groups.clone(),
        grant: super::grant(&agents, caller)?,
    };
    let host = Served(state.clone());
    let driven = runner::start(&host, &agents, run_caller, request, body, replay_of).await?;
    Ok(answer(driven))
}

/// Answers approval request `approval` of a paused run and drives it on.
pub async fn resume(
    state: &Services,
    stored: Stored,
    approval: Option<&str>,
    approve: bool,
    reason: Option<String>,
) -> Result<(Response, u64), Error> {
    let agents = state.agents()?.clone();
    let host = Served(state.clone());
    let driven = runner::resume(&host, &agents, stored, approval, approve, reason).await?;
    Ok(answer(driven))
}

/// A driven run as an HTTP answer, with the tokens it spent (0 for a stream: its record has
/// them).
fn answer(driven: Driven) -> (Response, u64) {
    match driven {
        Driven::Events(rx) => {
            let events = tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
                .map(|e| Event::default().event(e.kind).data(e.data));
            (crate::sse::stream_response(events), 0)
        }
        Driven::Done { response, tokens } => (Json(response).into_response(), tokens),
    }
}
