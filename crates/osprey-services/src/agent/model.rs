//! The model that decides a run's steps: the transcript becomes a chat request (calls as
//! assistant `tool_calls`, results as `tool` messages) with the run's tools, sent where the
//! model is served, on the caller's behalf. On the local engine the calls are generated under
//! the tools' grammar, so their arguments fit the schemas.

use futures_util::future::BoxFuture;
use osprey_agent::responses::chat::{chat_request, decision};
use osprey_agent::{Decision, Item, Model, ToolSpec};
use osprey_core::api::ToolMode;

use crate::edge::Caller;
use crate::state::Services;

/// A served model, asked through the gateway's own chat path.
pub struct ServedModel {
    /// Where requests go.
    pub state: Services,
    /// On whose behalf (its tenant's policy and limits).
    pub caller: Caller,
    /// The model.
    pub model: String,
    /// Sampling temperature.
    pub temperature: f32,
    /// Most output tokens of one decision.
    pub max_tokens: u32,
}

impl Model for ServedModel {
    fn decide<'a>(
        &'a self,
        items: &'a [Item],
        tools: &'a [ToolSpec],
        mode: &'a ToolMode,
    ) -> BoxFuture<'a, Result<Decision, String>> {
        Box::pin(async move {
            let (temperature, max_tokens) = (self.temperature, self.max_tokens);
            let body = chat_request(&self.model, items, tools, mode, temperature, max_tokens);
            let answer = crate::pipeline::chat_answer(&self.state, &self.caller, body)
                .await
                .map_err(|e| e.message)?;
            Ok(decision(&answer))
        })
    }
}
