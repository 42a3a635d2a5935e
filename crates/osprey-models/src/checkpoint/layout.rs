//! The files of a sharded checkpoint and their JSON schemas.
//!
//! ```text
//! OUT/config.json                          CheckpointConfig: the model's shape, k3 plan
//! OUT/model.safetensors.index.json         Index: tensor → shard, sizes, SHA-256s, formats
//! OUT/model-00001-of-00096.safetensors     the shards
//! OUT/tokenizer.gguf                       tokenizer and chat template (GGUF metadata only)
//! ```
//!
//! Tensor encodings inside the shards:
//! - `F32`, `F16`, `BF16` tensors are stored as themselves;
//! - an MXFP4 matrix `W` of `[rows, cols]` is two tensors: `W.blocks` (`F4`, `[rows, cols]`,
//!   OCP nibble order: element `2i` in the low nibble of byte `i`) and `W.scales` (`F8_E8M0`,
//!   `[rows, cols / 32]`);
//! - another GGML block type (`Q4_1`, `Q8_0`, ...) kept as it came is a `U8` tensor
//!   `[rows, row bytes]` in ggml's block layout, its type named in the index's `formats`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::ModelConfig;
use crate::k3::K3Config;

/// Name of the index file.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Name of the config file.
pub const CONFIG_FILE: &str = "config.json";
/// Name of the tokenizer file.
pub const TOKENIZER_FILE: &str = "tokenizer.gguf";

/// Suffix of an MXFP4 matrix's codes.
pub const BLOCKS_SUFFIX: &str = ".blocks";
/// Suffix of an MXFP4 matrix's scales.
pub const SCALES_SUFFIX: &str = ".scales";

/// `model-00001-of-00096.safetensors` for shard 0 of 96.
pub fn shard_file(index: usize, count: usize) -> String {
    format!("model-{:05}-of-{count:05}.safetensors", index + 1)
}

/// `config.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointConfig {
    /// `"llama"` or `"k3"`.
    pub model_type: String,
    /// The transformer's shape.
    pub model: ModelConfig,
    /// The k3 layer plan (`model_type = "k3"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k3: Option<K3Config>,
}

/// `model.safetensors.index.json`, Hugging Face's layout with Osprey's fields in `metadata`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Index {
    /// Totals, checksums and what each tensor is stored as.
    pub metadata: IndexMetadata,
    /// Stored tensor name → shard file.
    pub weight_map: BTreeMap<String, String>,
}

/// The index's `metadata`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IndexMetadata {
    /// Bytes of tensor data in all shards (Hugging Face's field).
    pub total_size: u64,
    /// The format most matrices were written in (`mxfp4`, `f16`, ...).
    pub format: String,
    /// Every shard with its size and SHA-256, in order.
    pub shards: Vec<ShardRecord>,
    /// Logical tensors stored as a GGML block type in a `U8` tensor: name → type (`Q4_1`).
    #[serde(default)]
    pub formats: BTreeMap<String, String>,
    /// Tensors not written in `format`, and why (norms, embeddings kept, odd widths).
    #[serde(default)]
    pub kept: BTreeMap<String, String>,
}

/// One shard file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardRecord {
    /// File name inside the checkpoint directory.
    pub file: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Hex SHA-256 of its contents.
    pub sha256: String,
}
