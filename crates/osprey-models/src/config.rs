//! The shape of a Llama-family model, read from GGUF metadata.

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

/// Which Llama-family layout the file uses; they differ only in details.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// Llama 1–3, SmolLM, and most fine-tunes.
    Llama,
    /// Mistral 7B and relatives (Llama layout).
    Mistral,
    /// Qwen2 and Qwen2.5: biases on Q/K/V, NeoX-style rotary embedding.
    Qwen2,
}

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])`: GGUF's Llama layout (Q/K rows permuted at conversion).
    Interleaved,
    /// Halves `(x[i], x[i + d/2])`: GPT-NeoX layout, used by Qwen2.
    Neox,
}

/// Rotary position embedding parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeConfig {
    /// Base of the geometric frequency series (`rope.freq_base`).
    pub base: f32,
    /// Number of dimensions of each head that are rotated.
    pub dims: usize,
    /// Pairing of dimensions.
    pub style: RopeStyle,
    /// Positions are divided by this (linear scaling); 1.0 when unscaled.
    pub linear_factor: f32,
    /// Per-frequency divisors (Llama 3's `rope_freqs.weight`), `dims / 2` of them.
    pub freq_factors: Option<Vec<f32>>,
}

/// Everything the forward pass needs to know about the model's shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Layout family.
    pub arch: Arch,
    /// Human-readable name from the file, if any.
    pub name: Option<String>,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (fewer than `n_heads` with grouped-query attention).
    pub n_kv_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Hidden width of the MLP.
    pub ffn_dim: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Context length the model was trained for.
    pub context_length: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Rotary embedding.
    pub rope: RopeConfig,
}

impl ModelConfig {
    /// Reads the configuration of a Llama-family model from GGUF metadata.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let arch_name = gguf.str("general.architecture")?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "mistral" => Arch::Mistral,
            "qwen2" => Arch::Qwen2,
            other => return Err(ModelError::UnsupportedArchitecture(other.to_owned())),
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let usize_key = |k: &str| gguf.uint(&key(k)).map(|v| v as usize);
        let n_heads = usize_key("attention.head_count")?;
        let d_model = usize_key("embedding_length")?;
        let n_kv_heads = gguf
            .opt_uint(&key("attention.head_count_kv"))?
            .map_or(n_heads, |v| v as usize);
        let head_dim = match gguf.opt_uint(&key("attention.key_length"))? {
            Some(v) => v as usize,
            None if n_heads > 0 => d_model / n_heads,
            None => 0,
        };
        let vocab_size = match gguf.opt_uint(&key("vocab_size"))? {
            Some(v) => v as usize,
            None => gguf
                .opt_array("tokenizer.ggml.tokens")?
                .map(<[_]>::len)
                .ok_or_else(|| ModelError::Metadata {
                    key: key("vocab_size"),
                })?,
        };
        let linear_factor = match gguf.str(&key("rope.scaling.type")).ok() {
            Some("linear") => gguf.opt_f32(&key("rope.scaling.factor"))?.unwrap_or(1.0),
            None | Some("none") => 1.0,
            Some(other) => {
                tracing::warn!(
                    scaling = other,
                    "unsupported RoPE scaling; positions beyond the original context will be off"
                );
                1.0
            }
        };
        let config = Self {
            arch,
            name: gguf.str("general.name").ok().map(str::to_owned),
            n_layers: usize_key("block_count")?,
            d_model,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim: usize_key("feed_forward_length")?,
            vocab_size,
            context_length: usize_key("context_length")?,
            rms_eps: gguf
                .opt_f32(&key("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-5),
            rope: RopeConfig {
                base: gguf.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0),
                dims: gguf
                    .opt_uint(&key("rope.dimension_count"))?
                    .map_or(head_dim, |v| v as usize),
                style: match arch {
                    Arch::Qwen2 => RopeStyle::Neox,
                    Arch::Llama | Arch::Mistral => RopeStyle::Interleaved,
                },
                linear_factor,
                freq_factors: None,
            },
        };
        config.validate()?;
        Ok(config)
    }

    /// Rejects shapes the forward pass cannot run, naming the offending key.
    fn validate(&self) -> Result<()> {
        let bad = |k: &str| {
            Err(ModelError::Metadata {
                key: format!("{}: {k}", self.arch_key()),
            })
        };
        if self.n_layers == 0 || self.d_model == 0 || self.ffn_dim == 0 || self.vocab_size == 0 {
            return bad("block_count/embedding_length/feed_forward_length/vocab_size must be > 0");
        }
        if self.n_heads == 0
            || self.n_kv_heads == 0
            || !self.n_heads.is_multiple_of(self.n_kv_heads)
        {
            return bad("attention.head_count must be a positive multiple of head_count_kv");
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) || self.rope.dims > self.head_dim
        {
            return bad("attention.key_length must be even and >= rope.dimension_count");
        }
        if !self.rope.dims.is_multiple_of(2) || self.context_length == 0 {
            return bad("rope.dimension_count must be even and context_length > 0");
        }
        Ok(())
    }

    fn arch_key(&self) -> &'static str {
        match self.arch {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
        }
    }

    /// Width of the fused Q, K and V projection output.
    pub fn qkv_dim(&self) -> usize {
        (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
    }

    /// Bytes of KV cache one token takes (f16 keys and values, every layer).
    pub fn kv_bytes_per_token(&self) -> usize {
        self.n_layers * 2 * self.n_kv_heads * self.head_dim * 2
    }
}
