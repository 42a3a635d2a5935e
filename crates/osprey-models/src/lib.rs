//! Model architectures, weight formats and CPU kernels.
//!
//! `osprey-models` turns a model file into something that computes logits. It owns:
//! - [`gguf::GgufFile`]: a memory-mapped GGUF file with typed metadata accessors;
//! - [`config::ModelConfig`]: the shape of a model, and its [`config::Family`] as data (Llama,
//!   SmolLM, Mistral, Qwen2, Gemma 3);
//! - [`checkpoint::Checkpoint`]: a sharded safetensors checkpoint (MXFP4 or other formats),
//!   validated and mapped in parallel; [`checkpoint::write`] writes one;
//! - [`source::WeightSource`]: the tensors of either, behind one interface;
//! - [`transformer::Transformer`]: the forward pass over a [`batch::ForwardBatch`] of sequences
//!   at different positions, reading and writing the paged [`kv_cache::KvCache`]; Llama-family
//!   layers and the k3 family's LatentMoE and AttnRes ([`k3`]);
//! - [`kernels`]: quantized matmul (Osprey's own AVX2 kernels for `Q4_1`/`Q8_0`/MXFP4, candle's
//!   for the other GGML types), attention and the element-wise ops.
//!
//! It knows nothing of requests, tokens' meaning or scheduling: that is `osprey-engine`.
//!
//! ```no_run
//! use osprey_models::{GgufFile, Transformer, KvCache, ForwardBatch, BatchSeq, LogitsWanted};
//! # fn main() -> Result<(), osprey_models::ModelError> {
//! let gguf = GgufFile::open("model.gguf".as_ref())?;
//! let model = Transformer::load(&gguf)?;
//! let (mut kv, tables) = KvCache::for_sequence(model.config(), 3);
//! let tokens = [1, 2, 3];
//! let seqs = [BatchSeq { n_tokens: 3, start_pos: 0, block_tables: &tables, logits: LogitsWanted::Last }];
//! let mut scratch = Default::default();
//! let logits = model.forward(&ForwardBatch { tokens: &tokens, seqs: &seqs }, &mut kv, &mut scratch);
//! assert_eq!(logits.len(), model.config().vocab_size);
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod batch;
pub mod bert;
pub mod checkpoint;
pub mod config;
pub mod convert;
pub mod error;
pub mod eval;
pub mod fetch;
pub mod gguf;
pub mod k3;
pub mod kernels;
pub mod kv_cache;
pub mod source;
pub mod transformer;

pub use batch::{BatchSeq, ForwardBatch, LogitsWanted};
pub use checkpoint::Checkpoint;
pub use config::{
    Activation, Arch, Family, LayerAttention, ModelConfig, RopeConfig, RopeStyle, SlidingWindow,
};
pub use error::{ModelError, Result};
pub use fetch::{DEFAULT_MODEL, ModelSource, fetch, osprey_home};
pub use gguf::GgufFile;
pub use k3::{K3Config, K3LayerConfig, LatentMoeConfig};
pub use kernels::matmul::{QMatrix, WeightFormat};
pub use kv_cache::{BLOCK_SIZE, KvCache, KvGroup, KvLayout, NO_BLOCK};
pub use source::WeightSource;
pub use transformer::{Calibration, ForwardScratch, Transformer};
