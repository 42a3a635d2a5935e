//! Agent runs (the Responses API) in the gateway: `osprey-agent`'s runtime
//! ([`osprey_agent::responses`]: wire shapes, the store sink, tools and grants) given what only
//! the gateway has: the model a request names, its caller, the caller's collections, and HTTP.
//!
//! - [`model`]: the [`osprey_agent::Model`] that asks a served model (local, upstream or
//!   workers) for each decision, through the same chat path as any request, so its calls are
//!   generated under the tools' grammar;
//! - [`runner`]: starting, resuming (after approval) and showing runs;
//! - [`file_search`]: retrieval over the caller's collections as a tool.

pub mod file_search;
pub mod model;
pub mod runner;

use std::sync::Arc;

use osprey_agent::responses::{Agents, RunCaller};
use osprey_agent::{Scopes, Tool, ToolSet};
use osprey_core::Error;
use serde_json::Value;

use crate::edge::Caller;
use crate::state::Services;

/// The caller a run acts for, as handlers see one.
pub fn caller_of(state: &Services, run: &RunCaller) -> Caller {
    Caller {
        tenant: state.edge().tenant(&run.tenant),
        key_id: run.key_id.clone(),
        user: Some(run.user.clone()),
        groups: run.groups.clone(),
        tool_scopes: None,
        record: Default::default(),
    }
}

/// The tool scopes `caller` holds.
pub fn grant(agents: &Agents, caller: &Caller) -> Result<Scopes, Error> {
    agents.grant(
        caller.tenant.tool_scopes.as_deref(),
        caller.tool_scopes.as_deref(),
    )
}

/// The tools of a request made by `caller` (its `file_search` over the caller's collections).
pub async fn toolset(
    agents: &Agents,
    state: &Services,
    caller: &Caller,
    tools: &[Value],
) -> Result<ToolSet, Error> {
    let file_search = |collections, top_k| -> Arc<dyn Tool> {
        Arc::new(file_search::FileSearch::new(
            state.clone(),
            caller.clone(),
            collections,
            top_k,
        ))
    };
    agents.toolset(tools, &file_search).await
}
