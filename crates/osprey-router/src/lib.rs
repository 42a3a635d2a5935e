//! The router decides which backend serves a request and what happens when one fails.
//!
//! It holds the reliability controls every pool needs, as plain state machines with time
//! passed in, so they can be tested without sleeping and shared by every backend kind (local
//! engine, workers, upstreams):
//! - [`breaker::CircuitBreaker`]: stops sending to a backend that keeps failing, probes it
//!   again after a while, and closes once the probes succeed;
//! - [`retry::RetryBudget`]: retries limited to a share of the traffic plus a small floor, so
//!   a failing backend is not hit with a retry storm;
//! - [`retry::backoff`]: exponential backoff with full jitter between attempts.
//!
//! And the choice of worker in a pool of `osprey worker`s:
//! - [`prefix_index::PrefixIndex`]: which worker holds which prompt blocks, from their KV
//!   events and from what was sent where;
//! - [`sent_blocks::SentBlocks`]: for a plain upstream without events, the blocks it was sent
//!   most recently, as what it probably caches;
//! - [`select::choose`]: cache-aware (longest cached prefix weighed against load),
//!   least-loaded or round-robin.
//!
//! And the choice of tier for `"model": "auto"` ([`auto`]):
//! - [`classifier::TaskClassifier`]: which kind of task a request is, and how sure;
//! - [`tiers::Tiers`]: the tier a task starts at, escalated when unsure or asked for quality;
//! - [`auto::AnswerCheck`]: an answer below the floor asked again of the tier above.
//!
//! And under load, [`degrade::Ladder`]: quality given up in steps, premium tenants last, held
//! in service by [`degrade::Degradation`] (the level from the load in flight and the TTFT).
//!
//! And the backends these choose among, as clients of the gateway's:
//! - [`upstream::Upstream`]: an OpenAI-compatible server (vLLM, SGLang, llama-server, a
//!   hosted API), behind its own breaker and retry budget;
//! - [`fallback::RoutePlan`]: an upstream and, when it fails before its answer, its fallbacks
//!   in order (other upstreams, or the model served here);
//! - [`workers::WorkerPool`]: `osprey worker`s serving one model, followed through their event
//!   streams and chosen among by cached prefix and load; a [`osprey_core::backend::Backend`],
//!   whose answers are read once into typed events ([`events`]).

pub mod auto;
pub mod breaker;
pub mod classifier;
pub mod degrade;
pub mod events;
pub mod fallback;
pub mod prefix_index;
pub mod retry;
pub mod select;
pub mod sent_blocks;
pub mod tiers;
pub mod upstream;
pub mod workers;
