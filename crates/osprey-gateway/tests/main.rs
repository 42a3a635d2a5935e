//! The gateway's integration tests, as one test binary (`cargo test --release -p osprey-gateway
//! --test gateway`): one link of the workspace instead of one per file. Each file beside this
//! one is a module and one area (the API on the real model, the edge, limits, caches, memory,
//! RAG, agents, safety, isolation, TLS, …); [`common`] holds the gateways, upstreams and helpers
//! they share.
//!
//! All their tests run as threads of this one process, over one shared engine. What is
//! process-wide is handled where a test depends on it: the Prometheus registry (tests read
//! deltas, or metrics labelled by a model of their own; those that need its values alone take a
//! lock, or run in a child process of this binary, [`common::run_alone`]), and the tracing
//! subscriber (set only in such a child).

mod common;

mod agents;
mod api;
mod backpressure;
mod cache;
mod conversations;
mod edge;
mod embeddings;
mod flags;
mod isolation;
mod llama_server_upstream;
mod memory;
mod openapi;
mod prompts;
mod rag;
mod redis_outage;
mod safety;
mod secrets;
mod semantic_cache;
mod shared_limits;
mod structured;
mod tls;
mod two_models;
mod upstream_reliability;
