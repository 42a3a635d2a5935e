//! A BERT encoder (the sentence-transformers family: all-MiniLM-L6-v2 and its kin) from an HF
//! `model.safetensors`, in fp32 on candle's CPU tensors: token, position and segment
//! embeddings, post-norm layers of self-attention and a GELU MLP, then mean pooling over the
//! tokens and L2 normalisation, as sentence-transformers' `Pooling` + `Normalize` do.

use std::path::Path;

use candle_core::{D, DType, Device, Tensor};

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
        let mean = x.mean_keepdim(D::Minus1)?;
        let centred = x.broadcast_sub(&mean)?;
        let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centred.broadcast_div(&(var + EPS)?.sqrt()?)?;
        Ok(normed
            .broadcast_mul(&self.weight)?
            .broadcast_add(&self.bias)?)
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
        let n = ids.len();
        if n == 0 || n > self.config.max_positions {
            return Err(ModelError::Input(format!(
                "an input of {n} tokens (1 to {} are embedded)",
                self.config.max_positions
            )));
        }
        let ids = Tensor::new(ids, &Device::Cpu)?;
        let x = self.words.index_select(&ids, 0)?;
        let x = x.broadcast_add(&self.positions.narrow(0, 0, n)?)?;
        let mut x = self.embed_norm.forward(&x.broadcast_add(&self.segment)?)?;
        for layer in &self.layers {
            x = self.layer(layer, &x)?;
        }
        let pooled = x.mean(0)?;
        let norm = pooled
            .sqr()?
            .sum_all()?
            .sqrt()?
            .to_scalar::<f32>()?
            .max(1e-12);
        Ok((pooled / f64::from(norm))?.to_vec1()?)
    }

    fn layer(&self, l: &Layer, x: &Tensor) -> Result<Tensor> {
        let (n, heads) = (x.dim(0)?, self.config.heads);
        let d = self.config.hidden / heads;
        // [n, hidden] -> [heads, n, d]
        let split = |t: Tensor| -> Result<Tensor> {
            Ok(t.reshape((n, heads, d))?.transpose(0, 1)?.contiguous()?)
        };
        let q = split(l.query.forward(x)?)?;
        let k = split(l.key.forward(x)?)?;
        let v = split(l.value.forward(x)?)?;
        let scores = (q.matmul(&k.t()?)? / (d as f64).sqrt())?;
        let max = scores.max_keepdim(D::Minus1)?;
        let e = scores.broadcast_sub(&max)?.exp()?;
        let probs = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        let ctx = probs
            .matmul(&v)?
            .transpose(0, 1)?
            .reshape((n, self.config.hidden))?;
        let x = l.attn_norm.forward(&(x + l.attn_out.forward(&ctx)?)?)?;
        let h = l.up.forward(&x)?.gelu_erf()?;
        l.out_norm.forward(&(&x + l.down.forward(&h)?)?)
    }
}
