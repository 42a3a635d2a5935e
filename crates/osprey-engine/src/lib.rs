//! Osprey's inference engine: from token ids in to token ids out, many requests at once.
//!
//! One engine thread runs steps ([`engine`]): the [`scheduler::Scheduler`] picks which
//! [`sequence::Sequence`]s run and how many tokens each (continuous batching, chunked prefill),
//! the model computes them in one forward pass over the paged KV cache (blocks handed out by
//! [`kv::KvCacheManager`], which also finds cached prefixes), and each sequence's [`sampler::Sampler`] picks its next
//! token. Request handlers talk to it through the [`Engine`] handle:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use osprey_engine::{Engine, EngineConfig};
//! let engine = Engine::load("model.gguf".as_ref(), EngineConfig::default())?;
//! let prompt = engine.tokenizer().encode("The capital of France is", true);
//! let params = osprey_core::SamplingParams { temperature: 0.0, max_tokens: 8, ..Default::default() };
//! let request = osprey_engine::GenerateRequest::new(prompt, params);
//! let mut generation = engine.generate(engine.validate(request)?)?;
//! while let Some(delta) = generation.next().await {
//!     print!("{}", delta?.text);
//! }
//! # Ok(()) }
//! ```
//!
//! Text concerns live here too: the [`tokenizer::Tokenizer`] and [`chat_template::ChatTemplate`]
//! built from the model file (together a [`Prompter`], which loads without the weights), and the streaming [`detokenizer`] that never emits half a UTF-8
//! character or part of a stop string ([`output::Generation`]). A request may carry a
//! [`osprey_core::Grammar`] (JSON schema, regex, Lark): [`structured`] compiles it with
//! llguidance and the engine masks each step's logits with it, so the output always parses. The prefix cache's contents are
//! published as [`kv_events`], for routers that send each request where its prefix is cached.
//! The engine is a [`osprey_core::backend::Backend`] ([`backend`]): a typed chat or text
//! completion request in, typed events out.
#![deny(missing_docs)]

pub mod backend;
pub mod chat_template;
pub mod detokenizer;
pub mod embedder;
pub mod engine;
mod engine_loop;
pub mod kda;
pub mod kv;
pub mod kv_events;
pub mod output;
pub mod prompter;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub mod sequence;
pub mod speculative;
pub mod structured;
pub mod tiers;
pub mod tokenizer;
pub mod tools;

pub use chat_template::{ChatTemplate, TemplateMessage};
pub use embedder::Embedder;
pub use engine::{
    Engine, EngineConfig, EngineStats, ModelInfo, RoutingTotals, default_kv_cache_bytes,
};
pub use kda::KdaConfig;
pub use kv_events::{KvEventBatch, KvEventLog, KvSnapshot};
pub use output::{Delta, Generation};
pub use prompter::Prompter;
pub use request::{GenerateRequest, SeqEvent, ValidRequest};
pub use sampler::{Sampled, TokenLogprob};
pub use scheduler::{SchedulerConfig, SchedulingPolicy};
pub use structured::{Constraint, GrammarCompiler};
pub use tiers::{Codec, SharedConfig, Tier, TierConfig};
pub use tokenizer::Tokenizer;
