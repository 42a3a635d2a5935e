//! Agent runs (the Responses API) in the gateway: `osprey-agent`'s runtime
//! ([`osprey_agent::responses`]: wire shapes, the store sink, tools and grants) given what only
//! the gateway has: the model a request names, its caller, the caller's collections, and HTTP.
//!
//! - [`model`]: the [`osprey_agent::Model`] that asks a served model (local, upstream or
//!   workers) for each decision, through the same chat path as any request, so its calls are
//!   generated under the tools' grammar;
//! - [`runner`]: runs started, resumed (after approval) and shown as HTTP answers, with this
//!   server as the runner's host ([`Served`]);
//! - [`file_search`]: retrieval over the caller's collections as a tool.

pub mod file_search;
pub mod model;
pub mod runner;

use std::sync::Arc;

use futures_util::future::BoxFuture;
use osprey_agent::responses::runner::Host;
use osprey_agent::responses::{Agents, RunCaller};
use osprey_agent::{Model, Scopes, Tool, ToolSet};
use osprey_core::{Error, ErrorKind};
use osprey_policy::pipeline::Pipeline;
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

/// This server, as the host of agent runs: its store, its served models (asked through the
/// gateway's own chat path), the caller's collections and the tenant's safety policy.
pub struct Served(pub Services);

/// Where agent runs are kept: the store, which they need.
pub fn run_store(state: &Services) -> Result<&osprey_store::Store, Error> {
    (state.store())
        .ok_or_else(|| Error::new(ErrorKind::Unavailable, "Agent runs need a store (--store)."))
}

impl Host for Served {
    fn store(&self) -> Result<&osprey_store::Store, Error> {
        run_store(&self.0)
    }

    fn serves(&self, model: &str) -> Result<(), Error> {
        self.0.served_by(model).map(|_| ())
    }

    fn model(
        &self,
        caller: &RunCaller,
        model: &str,
        temperature: f32,
        max_tokens: u32,
    ) -> Arc<dyn Model> {
        Arc::new(model::ServedModel {
            state: self.0.clone(),
            caller: caller_of(&self.0, caller),
            model: model.to_owned(),
            temperature,
            max_tokens,
        })
    }

    fn toolset<'a>(
        &'a self,
        agents: &'a Agents,
        caller: &'a RunCaller,
        tools: &'a [Value],
    ) -> BoxFuture<'a, Result<ToolSet, Error>> {
        Box::pin(async move { toolset(agents, &self.0, &caller_of(&self.0, caller), tools).await })
    }

    fn policy(&self, caller: &RunCaller) -> Option<Arc<Pipeline>> {
        let policies = self.0.policies()?;
        let tenant = self.0.edge().tenant(&caller.tenant);
        Some(policies.get(tenant.policy.as_deref()).clone())
    }
}
