//! A BERT encoder (the sentence-transformers family: all-MiniLM-L6-v2 and its kin) from an HF
//! `model.safetensors`, in fp32 on candle's CPU tensors: token, position and segment
//! embeddings, post-norm layers of self-attention and a GELU MLP, then mean pooling over the
//! tokens and L2 normalisation, as sentence-transformers' `Pooling` + `Normalize` do.

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};

/// The shape of a BERT checkpoint (its `config.json`; MiniLM-L6's by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BertConfig {
    /// Width of the hidden state.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Encoder layers.
    pub layers: usize,
    /// Longest input, tokens.
    pub max_positions: usize,
}

impl BertConfig {
    /// all-MiniLM-L6-v2: 384 wide, 12 heads, 6 layers, 512 positions.
    pub const MINILM_L6: Self = Self {
        hidden: 384,
        heads: 12,
        layers: 6,
        max_positions: 512,
    };
}

/// BERT's LayerNorm epsilon.
const EPS: f64 = 1e-12;

struct Linear {
    weight_t: Tensor,
    bias: Tensor,
}

impl Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.matmul(&self.weight_t)?.broadcast_add(&self.bias)?)
    }
}

struct Norm {
    weight: Tensor,
    bias: Tensor,
}

impl Norm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::layer_norm(
            x,
            &self.weight,
            &self.bias,
            EPS as f32,
        )?)
    }
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    attn_norm: Norm,
    up: Linear,
    down: Linear,
    out_norm: Norm,
}

/// A loaded BERT encoder.
pub struct BertModel {
    config: BertConfig,
    words: Tensor,
    positions: Tensor,
    segment: Tensor,
    embed_norm: Norm,
    layers: Vec<Layer>,
}

impl BertModel {
    /// Loads the encoder of shape `config` from `path` (HF tensor names, optionally under
    /// `bert.`).
    pub fn load(path: &Path, config: BertConfig) -> Result<Self> {
        let mut tensors = candle_core::safetensors::load(path, &Device::Cpu)?;
        let mut take = |name: &str| -> Result<Tensor> {
            let t = (tensors.remove(name))
                .or_else(|| tensors.remove(&format!("bert.{name}")))
                .ok_or_else(|| ModelError::MissingTensor(format!("{name} ({})", path.display())))?;
            Ok(t.to_dtype(DType::F32)?)
        };
        let linear = |take: &mut dyn FnMut(&str) -> Result<Tensor>, name: &str| {
            Ok::<_, ModelError>(Linear {
                weight_t: take(&format!("{name}.weight"))?.t()?.contiguous()?,
                bias: take(&format!("{name}.bias"))?,
            })
        };
        let norm = |take: &mut dyn FnMut(&str) -> Result<Tensor>, name: &str| {
            Ok::<_, ModelError>(Norm {
                weight: take(&format!("{name}.weight"))?,
                bias: take(&format!("{name}.bias"))?,
            })
        };
        let mut layers = Vec::with_capacity(config.layers);
        for i in 0..config.layers {
            let p = format!("encoder.layer.{i}");
            layers.push(Layer {
                query: linear(&mut take, &format!("{p}.attention.self.query"))?,
                key: linear(&mut take, &format!("{p}.attention.self.key"))?,
                value: linear(&mut take, &format!("{p}.attention.self.value"))?,
                attn_out: linear(&mut take, &format!("{p}.attention.output.dense"))?,
                attn_norm: norm(&mut take, &format!("{p}.attention.output.LayerNorm"))?,
                up: linear(&mut take, &format!("{p}.intermediate.dense"))?,
                down: linear(&mut take, &format!("{p}.output.dense"))?,
                out_norm: norm(&mut take, &format!("{p}.output.LayerNorm"))?,
            });
        }
        let segments = take("embeddings.token_type_embeddings.weight")?;
        Ok(Self {
            config,
            words: take("embeddings.word_embeddings.weight")?,
            positions: take("embeddings.position_embeddings.weight")?,
            segment: segments.get(0)?,
            embed_norm: norm(&mut take, "embeddings.LayerNorm")?,
            layers,
        })
    }

    /// The longest input it takes, tokens.
    pub fn max_positions(&self) -> usize {
        self.config.max_positions
    }

    /// The pooled, unit-length embedding of one sequence of token ids (at most
    /// [`Self::max_positions`]).
    pub fn embed(&self, ids: &[u32]) -> Result<Vec<f32>> {
        Ok(self.embed_batch(&[ids])?.remove(0))
    }

    /// The embeddings of several sequences in one forward pass: shorter ones are padded and
    /// their padding masked out of attention and pooling, so each embedding is the one
    /// [`Self::embed`] gives alone. One pass over a batch makes the matmuls big enough to
    /// keep every core busy.
    pub fn embed_batch(&self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let max = self.config.max_positions;
        if let Some(bad) = batch.iter().find(|ids| ids.is_empty() || ids.len() > max) {
            let n = bad.len();
            return Err(ModelError::Input(format!(
                "an input of {n} tokens (1 to {max} are embedded)"
            )));
        }
        let (b, n) = (
            batch.len(),
            batch.iter().map(|ids| ids.len()).max().unwrap_or(0),
        );
        if b == 0 {
            return Ok(Vec::new());
        }
        let mut padded = vec![0u32; b * n];
        let mut valid = vec![0f32; b * n];
        for (row, ids) in batch.iter().enumerate() {
            padded[row * n..row * n + ids.len()].copy_from_slice(ids);
            valid[row * n..row * n + ids.len()].fill(1.0);
        }
        let valid = Tensor::from_vec(valid, (b, n), &Device::Cpu)?;
        // Added to attention scores: 0 for a real key, a large negative for padding.
        let key_mask = ((valid.clone() - 1.0)? * 1e9)?.reshape((b, 1, 1, n))?;
        let ids = Tensor::from_vec(padded, b * n, &Device::Cpu)?;
        let x = self
            .words
            .index_select(&ids, 0)?
            .reshape((b, n, self.config.hidden))?;
        let x = x.broadcast_add(&self.positions.narrow(0, 0, n)?)?;
        let mut x = self.embed_norm.forward(&x.broadcast_add(&self.segment)?)?;
        for layer in &self.layers {
            x = self.layer(layer, &x, &key_mask)?;
        }
        // Mean over each sequence's own tokens.
        let weights = valid.unsqueeze(2)?;
        let summed = x.broadcast_mul(&weights)?.sum(1)?;
        let pooled = summed.broadcast_div(&weights.sum(1)?)?;
        let norms = pooled
            .sqr()?
            .sum_keepdim(1)?
            .sqrt()?
            .clamp(1e-12, f64::MAX)?;
        Ok(pooled.broadcast_div(&norms)?.to_vec2()?)
    }

    /// One encoder layer over `x` (`[batch, tokens, hidden]`), keys masked by `key_mask`.
    fn layer(&self, l: &Layer, x: &Tensor, key_mask: &Tensor) -> Result<Tensor> {
        let (b, n, hidden) = x.dims3()?;
        let heads = self.config.heads;
        let d = hidden / heads;
        let x = x.reshape((b * n, hidden))?;
        // [b·n, hidden] -> [b, heads, n, d]
        let split = |t: Tensor| -> Result<Tensor> {
            Ok(t.reshape((b, n, heads, d))?.transpose(1, 2)?.contiguous()?)
        };
        // Scaled before the product: the smaller tensor.
        let q = split((l.query.forward(&x)? / (d as f64).sqrt())?)?;
        let k = split(l.key.forward(&x)?)?;
        let v = split(l.value.forward(&x)?)?;
        let scores = q.matmul(&k.t()?)?.broadcast_add(key_mask)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let ctx = (probs.matmul(&v)?.transpose(1, 2)?).reshape((b * n, hidden))?;
        let x = l.attn_norm.forward(&(&x + l.attn_out.forward(&ctx)?)?)?;
        let h = l.up.forward(&x)?.gelu_erf()?;
        Ok(l.out_norm
            .forward(&(&x + l.down.forward(&h)?)?)?
            .reshape((b, n, hidden))?)
    }
}
