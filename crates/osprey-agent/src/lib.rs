//! Osprey's agent runtime: a model that calls tools, held to budgets and permissions.
//!
//! - [`tool`]: a [`Tool`] is a name, a JSON schema for its arguments, the [`Scope`]s it needs
//!   and a call; a [`ToolSet`] is what one run may use (tools run here, and functions the
//!   client runs itself);
//! - [`scope`]: least privilege: `read`, `write`, `network`, `destructive`, granted to a tenant
//!   or key; a call outside the grant is refused and audited;
//! - [`budget`]: per-run limits on steps, tokens, wall time, tool calls, retries and cost;
//! - [`run`]: a [`Run`]'s transcript, in the shape of OpenAI's Responses API items, its status
//!   and its [`Step`]s;
//! - [`orchestrator`]: the state machine (decide → act → observe, with approval and client
//!   pauses) that drives a run with a [`Model`], reporting to a [`RunSink`];
//! - [`audit`]: what every call leaves behind;
//! - [`responses`]: the Responses API over the orchestrator: its wire shapes, a transcript
//!   as a chat request, the store sink and its events, tools and grants per request;
//! - [`builtin`]: the tools Osprey ships (calculator, HTTP fetch, read-only SQL, a WebAssembly
//!   sandbox) and the `[agent]` config; [`mcp`]: MCP servers' tools, over stdio or HTTP.
//!
//! ```no_run
//! # async fn demo(model: std::sync::Arc<dyn osprey_agent::Model>) {
//! use osprey_agent::{Budget, Item, Orchestrator, Run, Scopes, ToolSet};
//! let orchestrator = Orchestrator {
//!     model,
//!     tools: ToolSet::default(),
//!     grant: Scopes::NONE,
//!     policy: None,
//!     sink: std::sync::Arc::new(osprey_agent::orchestrator::NoSink),
//!     price_per_1k_tokens: 0.0,
//! };
//! let input = vec![Item::Message { role: "user".into(), content: "What is 2 + 2?".into() }];
//! let mut run = Run::new("resp_1".into(), input, Budget::default(), osprey_core::api::ToolMode::Auto);
//! orchestrator.advance(&mut run).await;
//! println!("{:?}: {:?}", run.status, run.output_text());
//! # }
//! ```
#![deny(missing_docs)]

pub mod audit;
pub mod budget;
pub mod builtin;
pub mod mcp;
pub mod orchestrator;
pub mod responses;
pub mod run;
pub mod scope;
pub mod tool;

pub use audit::{ToolAudit, Verdict};
pub use budget::{Budget, Spent, StopReason};
pub use builtin::{AgentConfig, Builtins};
pub use orchestrator::{Decision, Model, Orchestrator, RunSink};
pub use run::{Item, Phase, Run, RunStatus, Step};
pub use scope::{Scope, Scopes};
pub use tool::{Tool, ToolError, ToolSet, ToolSpec};
