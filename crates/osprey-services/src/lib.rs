//! What Osprey's HTTP routes (`osprey-gateway`) call: the services a server shares, and the
//! path a generation request takes between the route that received it and the bytes that
//! answer it.
//!
//! - [`state::Services`]: what every handler shares, built once at start from a [`Wiring`]
//!   and never changed after: the served models (the local engine, set once loading
//!   finishes, so the server answers `/health` while the model loads; upstreams; workers),
//!   the edge, the store, the caches and the policies;
//! - [`edge`]: the parts every `/v1` request passes first: [`auth`] (API keys), tenants
//!   ([`config`]), admission control and rate limits ([`osprey_limits`]: GCRA, in memory
//!   or shared through Redis), and the [`edge::Caller`] they resolve;
//! - [`pipeline`]: the stages of a generation request, in order, over its body parsed once
//!   ([`osprey_core::api::JsonBody`]); [`local`] is the engine of this process as its backend;
//!   the other backends are `osprey-router`'s: [`osprey_router::upstream`] (models served by
//!   another OpenAI-compatible server) and [`osprey_router::workers`] (a pool of
//!   `osprey worker`s);
//! - [`outbound`]: the way out, one chain of steps over the answer's typed events in one task,
//!   and [`write`], which writes the answer's JSON or server-sent events once ([`sse`]);
//! - [`error`]: the only place an [`osprey_core::Error`] becomes an HTTP status, always in
//!   OpenAI's envelope `{"error": {"message", "type", "param", "code"}}`;
//! - [`replay`]: idempotent requests answered once, and the recent answers the ladder and
//!   fallback chains serve when generating is not an option;
//! - [`context`] and [`prompts`]: the memory and prompt stages' ties to the server (the work is
//!   `osprey-context`'s): a user's facts, scratchpad and conversation put in within budgets,
//!   summaries written by the smallest tier, a registered prompt applied, and the headers
//!   saying what went in; [`rag`]: passages retrieved into a prompt, and their citations;
//! - [`cache`] and [`semantic_cache`]: answers kept by request, and (opt-in per tenant) by
//!   meaning;
//! - [`record`] and [`request_log`]: what happened to a request, one row per generation
//!   request in the store, written off the request's path;
//! - [`safety`]: each tenant's safety policy ([`osprey_policy`]) screening generation input
//!   and output;
//! - [`agent`]: agent runs (the Responses API): `osprey-agent`'s orchestrator with the
//!   model a request names, its tools under the caller's scopes, runs and audits in the store;
//! - [`metrics`] and [`telemetry`]: Prometheus export and request histograms; trace context.
#![deny(missing_docs)]

pub mod agent;
pub mod auth;
pub mod cache;
pub mod config;
pub mod context;
pub mod edge;
pub mod error;
pub mod local;
pub mod metrics;
pub mod outbound;
pub mod pipeline;
pub mod prompts;
pub mod rag;
pub mod record;
pub mod replay;
pub mod request_log;
pub mod safety;
pub mod semantic_cache;
pub mod sse;
pub mod state;
pub mod telemetry;
pub mod write;

pub use state::{Services, Wiring};
