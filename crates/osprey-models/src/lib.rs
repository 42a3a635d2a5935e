//! Model architectures, weight formats and CPU kernels.
//!
//! `osprey-models` turns a model file into something that computes logits. It owns:
//! - [`gguf::GgufFile`]: a memory-mapped GGUF file with typed metadata accessors;
//! - [`config::ModelConfig`]: the shape of a Llama-family model (Llama, SmolLM, Mistral, Qwen2);
//! - [`llama::LlamaModel`]: the forward pass over a [`batch::ForwardBatch`] of sequences at
//!   different positions, reading and writing the paged [`kv_cache::KvCache`];
//! - [`kernels`]: quantized matmul (Osprey's own AVX2 kernels for `Q4_1`/`Q8_0`, candle's for
//!   the other GGML types), attention and the element-wise ops.
//!
//! It knows nothing of requests, tokens' meaning or scheduling: that is `osprey-engine`.
//!
//! ```no_run
//! use osprey_models::{GgufFile, LlamaModel, KvCache, ForwardBatch, BatchSeq, LogitsWanted};
//! # fn main() -> Result<(), osprey_models::ModelError> {
//! let gguf = GgufFile::open("model.gguf".as_ref())?;
//! let model = LlamaModel::load(&gguf)?;
//! let mut kv = KvCache::new(model.config(), 64);
//! let tokens = [1, 2, 3];
//! let seqs = [BatchSeq { n_tokens: 3, start_pos: 0, block_table: &[0], logits: LogitsWanted::Last }];
//! let mut scratch = Default::default();
//! let logits = model.forward(&ForwardBatch { tokens: &tokens, seqs: &seqs }, &mut kv, &mut scratch);
//! assert_eq!(logits.len(), model.config().vocab_size);
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod batch;
pub mod bert;
pub mod config;
pub mod error;
pub mod fetch;
pub mod gguf;
pub mod kernels;
pub mod kv_cache;
pub mod llama;

pub use batch::{BatchSeq, ForwardBatch, LogitsWanted};
pub use config::{Arch, ModelConfig, RopeConfig, RopeStyle};
pub use error::{ModelError, Result};
pub use fetch::{DEFAULT_MODEL, ModelSource, fetch, osprey_home};
pub use gguf::GgufFile;
pub use kv_cache::{BLOCK_SIZE, KvCache};
pub use llama::{ForwardScratch, LlamaModel};
