//! osprey-engine's integration tests, as one test binary (`cargo test -p osprey-engine --test
//! engine`): the engine on the real default model (llama.cpp's golden outputs, serving under
//! a prefix cache, preemption and full batches, structured output, the KV tiers, the `kda`
//! policy on an upcycled MoE), the block accounting's property test, the SentencePiece
//! tokenizer and the embedder.
//!
//! Each file is a module; all their tests run as threads of this one process, and those that
//! need no engine of their own share one (`osprey_testkit::shared_engine`).

mod embedder;
mod golden;
mod kda;
mod kv_properties;
mod serving;
mod speculative;
mod spm_tokenizer;
mod structured;
mod tiers;
