//! The shape of a model and what sets its family apart, read from GGUF metadata.
//!
//! A family is data: [`Family`] says where the norms are, whether Q and K are normed, the MLP's
//! activation, biases, the embedding scale, a logit cap and which layers attend through a
//! sliding window with which RoPE base. The forward pass reads it and never the family's name,
//! so a new family is a new arm of [`ModelConfig::from_gguf`].

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

/// The GGUF architecture (`general.architecture`) a model was read as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// Llama 1–3, SmolLM, and most fine-tunes.
    Llama,
    /// Mistral 7B and relatives (Llama layout).
    Mistral,
    /// Qwen2 and Qwen2.5: biases on Q/K/V, NeoX-style rotary embedding.
    Qwen2,
    /// Qwen3: Qwen2 without the biases, with Q and K normed per head.
    Qwen3,
    /// Phi-3: Q, K and V in one tensor (`attn_qkv`), gate and up in one (`ffn_up`).
    Phi3,
    /// Gemma 3: pre- and post-norms, normed Q and K, GeGLU, scaled embeddings, five local
    /// (sliding-window) layers to one global.
    Gemma3,
}

impl Arch {
    /// Every architecture Osprey runs, by its GGUF name.
    pub const ALL: [Self; 6] = [
        Self::Llama,
        Self::Mistral,
        Self::Qwen2,
        Self::Qwen3,
        Self::Phi3,
        Self::Gemma3,
    ];

    /// The GGUF name (`general.architecture`).
    pub fn gguf_name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mistral => "mistral",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Phi3 => "phi3",
            Self::Gemma3 => "gemma3",
        }
    }

    /// The architecture called `name` in GGUF metadata.
    pub fn from_gguf_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.gguf_name() == name)
    }

    /// The GGUF names of every architecture, comma-separated, for error messages.
    pub fn names() -> String {
        let names: Vec<&str> = Self::ALL.iter().map(|a| a.gguf_name()).collect();
        names.join(", ")
    }
}

/// The MLP's gate activation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// SwiGLU: `silu(gate) · up` (Llama, Mistral, Qwen).
    #[default]
    Silu,
    /// GeGLU with the tanh approximation of GELU: `gelu_tanh(gate) · up` (Gemma).
    GeluTanh,
}

/// Sliding-window attention on some layers.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlidingWindow {
    /// Positions a local layer's query sees, its own included.
    pub size: usize,
    /// Every `period`-th layer (counting from 1) is global, the others local; 0 makes every
    /// layer local.
    pub period: usize,
    /// RoPE base of the local layers (global layers use [`RopeConfig::base`], scaled).
    pub local_rope_base: f32,
}

/// What sets a family's layers apart from Llama's. The default is Llama.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Family {
    /// Biases on the Q, K and V projections.
    pub qkv_bias: bool,
    /// RMSNorm over each head of Q and of K before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// RMSNorm of attention's and the MLP's outputs before each joins the residual stream
    /// (`post_attention_norm`, `post_ffw_norm`), besides the norms before them.
    pub post_norms: bool,
    /// The MLP's gate activation.
    pub activation: Activation,
    /// Embeddings are multiplied by this as they are read.
    pub embed_scale: f32,
    /// Logits squashed into `±cap` by `cap · tanh(x / cap)`.
    pub logit_softcap: Option<f32>,
    /// Layers that attend through a sliding window.
    pub sliding_window: Option<SlidingWindow>,
}

impl Default for Family {
    fn default() -> Self {
        Self {
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            activation: Activation::Silu,
            embed_scale: 1.0,
            logit_softcap: None,
            sliding_window: None,
        }
    }
}

/// How one layer attends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerAttention {
    /// Positions a query sees, its own included; `None` sees the whole sequence.
    pub window: Option<usize>,
    /// Whether the layer rotates with the local RoPE base.
    pub local_rope: bool,
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
    /// What sets the family apart (Llama's when absent from a checkpoint's config).
    #[serde(default)]
    pub family: Family,
}

impl ModelConfig {
    /// Reads the configuration of a Llama-family model from GGUF metadata.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let arch_name = gguf.str("general.architecture")?;
        let arch = Arch::from_gguf_name(arch_name)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(arch_name.to_owned()))?;
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
                    Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 | Arch::Gemma3 => RopeStyle::Neox,
                    Arch::Llama | Arch::Mistral => RopeStyle::Interleaved,
                },
                linear_factor,
                freq_factors: None,
            },
            family: match arch {
                // Phi-3's fused tensors are a matter of storage, read where the layers load.
                Arch::Llama | Arch::Mistral | Arch::Phi3 => Family::default(),
                Arch::Qwen2 => Family {
                    qkv_bias: true,
                    ..Family::default()
                },
                Arch::Qwen3 => Family {
                    qk_norm: true,
                    ..Family::default()
                },
                // As llama.cpp reads it: five local layers to one global, and local layers
                // rotate with base 10,000 (neither is in the file).
                Arch::Gemma3 => Family {
                    qk_norm: true,
                    post_norms: true,
                    activation: Activation::GeluTanh,
                    embed_scale: (d_model as f32).sqrt(),
                    sliding_window: Some(SlidingWindow {
                        size: usize_key("attention.sliding_window")?,
                        period: 6,
                        local_rope_base: 10_000.0,
                    }),
                    ..Family::default()
                },
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
        if self.family.sliding_window.is_some_and(|w| w.size == 0) {
            return bad("attention.sliding_window must be > 0");
        }
        Ok(())
    }

    fn arch_key(&self) -> &'static str {
        self.arch.gguf_name()
    }

    /// How layer `l` attends: through the window or over everything, and with which RoPE.
    pub fn layer_attention(&self, l: usize) -> LayerAttention {
        match self.family.sliding_window {
            Some(w) if w.period == 0 || !(l + 1).is_multiple_of(w.period) => LayerAttention {
                window: Some(w.size),
                local_rope: true,
            },
            _ => LayerAttention {
                window: None,
                local_rope: false,
            },
        }
    }

    /// The rotary embedding of the local (sliding-window) layers: the local base, unscaled.
    pub fn local_rope(&self) -> Option<RopeConfig> {
        let w = self.family.sliding_window?;
        Some(RopeConfig {
            base: w.local_rope_base,
            linear_factor: 1.0,
            freq_factors: None,
            ..self.rope.clone()
        })
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
