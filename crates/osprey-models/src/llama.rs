//! The Llama-family transformer: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP.
//!
//! One forward pass computes any mix of sequences at different positions (prefill chunks and
//! single decode tokens together): matmuls see all tokens as one matrix, attention runs per
//! sequence over its own paged KV.

use candle_core::quantized::GgmlDType;
use rayon::prelude::*;

use crate::batch::{ForwardBatch, LogitsWanted};
use crate::config::{Arch, ModelConfig};
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, TensorView};
use crate::kernels::attention::{AttentionSeq, AttentionShape, attention};
use crate::kernels::matmul::QMatrix;
use crate::kernels::ops::{RopeTable, add_assign, add_bias, rms_norm, swiglu};
use crate::kv_cache::KvCache;

/// A loaded Llama-family model.
pub struct LlamaModel {
    config: ModelConfig,
    embed: QMatrix,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    /// `None` when the output projection is tied to the embedding.
    output: Option<QMatrix>,
}

struct Layer {
    attn_norm: Vec<f32>,
    /// Q, K and V projections, outputs side by side.
    qkv: Projection,
    qkv_bias: Option<Vec<f32>>,
    wo: QMatrix,
    ffn_norm: Vec<f32>,
    /// Gate and up projections, outputs side by side.
    gate_up: Projection,
    down: QMatrix,
}

/// Several projections of the same input whose outputs are concatenated: one matrix when the
/// parts share a storage type (one pass over the input), else one matmul each.
enum Projection {
    Fused(QMatrix),
    Split(Vec<QMatrix>),
}

impl Projection {
    fn load(gguf: &GgufFile, names: &[String], rows: &[usize], cols: usize) -> Result<Self> {
        let views = names
            .iter()
            .zip(rows)
            .map(|(n, &r)| tensor(gguf, n, r, cols))
            .collect::<Result<Vec<_>>>()?;
        if views.iter().all(|v| v.dtype == views[0].dtype) {
            let bytes = views.iter().map(|v| v.bytes).collect::<Vec<_>>().concat();
            let total = rows.iter().sum();
            return Ok(Self::Fused(matrix(
                &names[0],
                views[0].dtype,
                total,
                cols,
                &bytes,
            )?));
        }
        let parts = views
            .iter()
            .zip(names)
            .zip(rows)
            .map(|((v, n), &r)| matrix(n, v.dtype, r, cols, v.bytes))
            .collect::<Result<_>>()?;
        Ok(Self::Split(parts))
    }

    fn matmul(&self, x: &[f32], out: &mut [f32], tmp: &mut Vec<f32>) {
        match self {
            Self::Fused(m) => m.matmul(x, out),
            Self::Split(parts) => {
                let t = x.len() / parts[0].cols();
                let width: usize = parts.iter().map(QMatrix::rows).sum();
                let mut offset = 0;
                for p in parts {
                    tmp.resize(t * p.rows(), 0.0);
                    p.matmul(x, tmp);
                    for (i, row) in tmp.chunks_exact(p.rows()).enumerate() {
                        out[i * width + offset..i * width + offset + p.rows()].copy_from_slice(row);
                    }
                    offset += p.rows();
                }
            }
        }
    }
}

/// Reusable buffers of the forward pass, sized on demand.
#[derive(Default)]
pub struct ForwardScratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    gate_up: Vec<f32>,
    ffn: Vec<f32>,
    tmp: Vec<f32>,
    split_tmp: Vec<f32>,
    last: Vec<f32>,
    logits: Vec<f32>,
}

impl LlamaModel {
    /// Loads the weights of a Llama-family model from an open GGUF file.
    pub fn load(gguf: &GgufFile) -> Result<Self> {
        let mut config = ModelConfig::from_gguf(gguf)?;
        if gguf.tensor("rope_freqs.weight").is_some() {
            config.rope.freq_factors =
                Some(vector(gguf, "rope_freqs.weight", config.rope.dims / 2)?);
        }
        let c = &config;
        let (d, hd) = (c.d_model, c.head_dim);
        let embed_view = tensor(gguf, "token_embd.weight", c.vocab_size, d)?;
        let embed = matrix(
            "token_embd.weight",
            embed_view.dtype,
            c.vocab_size,
            d,
            embed_view.bytes,
        )?;
        let output = match gguf.tensor("output.weight") {
            Some(_) => {
                let v = tensor(gguf, "output.weight", c.vocab_size, d)?;
                Some(matrix("output.weight", v.dtype, c.vocab_size, d, v.bytes)?)
            }
            None => None,
        };
        let layers = (0..c.n_layers)
            .into_par_iter()
            .map(|l| {
                let n = |s: &str| format!("blk.{l}.{s}");
                let qkv_rows = [c.n_heads * hd, c.n_kv_heads * hd, c.n_kv_heads * hd];
                let qkv_names = [n("attn_q.weight"), n("attn_k.weight"), n("attn_v.weight")];
                let qkv_bias = if c.arch == Arch::Qwen2 {
                    let parts = [n("attn_q.bias"), n("attn_k.bias"), n("attn_v.bias")]
                        .iter()
                        .zip(qkv_rows)
                        .map(|(b, len)| vector(gguf, b, len))
                        .collect::<Result<Vec<_>>>()?;
                    Some(parts.concat())
                } else {
                    None
                };
                let wo_view = tensor(gguf, &n("attn_output.weight"), d, c.n_heads * hd)?;
                let down_view = tensor(gguf, &n("ffn_down.weight"), d, c.ffn_dim)?;
                Ok(Layer {
                    attn_norm: vector(gguf, &n("attn_norm.weight"), d)?,
                    qkv: Projection::load(gguf, &qkv_names, &qkv_rows, d)?,
                    qkv_bias,
                    wo: matrix(
                        &n("attn_output.weight"),
                        wo_view.dtype,
                        d,
                        c.n_heads * hd,
                        wo_view.bytes,
                    )?,
                    ffn_norm: vector(gguf, &n("ffn_norm.weight"), d)?,
                    gate_up: Projection::load(
                        gguf,
                        &[n("ffn_gate.weight"), n("ffn_up.weight")],
                        &[c.ffn_dim, c.ffn_dim],
                        d,
                    )?,
                    down: matrix(
                        &n("ffn_down.weight"),
                        down_view.dtype,
                        d,
                        c.ffn_dim,
                        down_view.bytes,
                    )?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            output_norm: vector(gguf, "output_norm.weight", d)?,
            config,
            embed,
            layers,
            output,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Bytes of weights read per forward pass (what bounds single-stream decode speed).
    pub fn weight_bytes(&self) -> usize {
        let m = |q: &QMatrix| q.rows() * q.cols() / q.dtype().block_size() * q.dtype().type_size();
        let p = |p: &Projection| match p {
            Projection::Fused(q) => m(q),
            Projection::Split(v) => v.iter().map(m).sum(),
        };
        let layers: usize = self
            .layers
            .iter()
            .map(|l| p(&l.qkv) + m(&l.wo) + p(&l.gate_up) + m(&l.down))
            .sum();
        layers + m(self.output.as_ref().unwrap_or(&self.embed))
    }

    /// Runs the batch through the model, storing its keys and values in `kv`, and returns
    /// the requested logits: `batch.logit_rows()` rows of `vocab_size`, in batch order.
    ///
    /// Token ids must be below `vocab_size` and block tables long enough for every position;
    /// the engine guarantees both.
    pub fn forward<'s>(
        &self,
        batch: &ForwardBatch,
        kv: &mut KvCache,
        s: &'s mut ForwardScratch,
    ) -> &'s mut [f32] {
        let c = &self.config;
        let (t, d, hd) = (batch.tokens.len(), c.d_model, c.head_dim);
        let (q_dim, kv_dim, qkv_dim) = (c.n_heads * hd, c.n_kv_heads * hd, c.qkv_dim());
        s.x.resize(t * d, 0.0);
        for (i, &tok) in batch.tokens.iter().enumerate() {
            self.embed
                .row_to_f32(tok as usize, &mut s.x[i * d..(i + 1) * d]);
        }

        let mut attn_seqs = Vec::with_capacity(batch.seqs.len());
        let mut row_seq = Vec::with_capacity(t);
        let mut first_row = 0;
        for (idx, seq) in batch.seqs.iter().enumerate() {
            attn_seqs.push(AttentionSeq {
                first_row,
                n_new: seq.n_tokens,
                start_pos: seq.start_pos,
                block_table: seq.block_table,
            });
            row_seq.extend((0..seq.n_tokens).map(|i| (idx, seq.start_pos + i)));
            first_row += seq.n_tokens;
        }
        assert_eq!(first_row, t, "sequence lengths do not add up to the batch");
        let rope = RopeTable::new(&c.rope, row_seq.iter().map(|&(_, pos)| pos));
        let shape = AttentionShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
        };

        s.xn.resize(t * d, 0.0);
        s.qkv.resize(t * qkv_dim, 0.0);
        s.attn.resize(t * q_dim, 0.0);
        s.tmp.resize(t * d, 0.0);
        s.gate_up.resize(t * 2 * c.ffn_dim, 0.0);
        s.ffn.resize(t * c.ffn_dim, 0.0);
        for (l, layer) in self.layers.iter().enumerate() {
            rms_norm(&s.x, &layer.attn_norm, c.rms_eps, &mut s.xn);
            layer.qkv.matmul(&s.xn, &mut s.qkv, &mut s.split_tmp);
            if let Some(bias) = &layer.qkv_bias {
                add_bias(&mut s.qkv, bias);
            }
            for (i, row) in s.qkv.chunks_exact_mut(qkv_dim).enumerate() {
                let (q, rest) = row.split_at_mut(q_dim);
                let (k, v) = rest.split_at_mut(kv_dim);
                rope.apply(c.rope.style, i, hd, q);
                rope.apply(c.rope.style, i, hd, k);
                let (seq, pos) = row_seq[i];
                kv.write(l, batch.seqs[seq].block_table, pos, k, v);
            }
            attention(shape, &s.qkv, qkv_dim, kv, l, &attn_seqs, &mut s.attn);
            layer.wo.matmul(&s.attn, &mut s.tmp);
            add_assign(&mut s.x, &s.tmp);

            rms_norm(&s.x, &layer.ffn_norm, c.rms_eps, &mut s.xn);
            layer
                .gate_up
                .matmul(&s.xn, &mut s.gate_up, &mut s.split_tmp);
            swiglu(&s.gate_up, c.ffn_dim, &mut s.ffn);
            layer.down.matmul(&s.ffn, &mut s.tmp);
            add_assign(&mut s.x, &s.tmp);
        }

        // Only the rows whose logits are wanted go through the (large) output projection.
        s.last.clear();
        let mut row = 0;
        for seq in batch.seqs {
            let rows = match seq.logits {
                LogitsWanted::None => row..row,
                LogitsWanted::Last => row + seq.n_tokens - 1..row + seq.n_tokens,
                LogitsWanted::All => row..row + seq.n_tokens,
            };
            s.last.extend_from_slice(&s.x[rows.start * d..rows.end * d]);
            row += seq.n_tokens;
        }
        let n = s.last.len() / d;
        s.xn.resize(n * d, 0.0);
        rms_norm(&s.last, &self.output_norm, c.rms_eps, &mut s.xn[..n * d]);
        s.logits.resize(n * c.vocab_size, 0.0);
        let lm_head = self.output.as_ref().unwrap_or(&self.embed);
        lm_head.matmul(&s.xn[..n * d], &mut s.logits);
        &mut s.logits
    }
}

/// A matrix tensor, checked to be `[rows, cols]`.
fn tensor<'g>(gguf: &'g GgufFile, name: &str, rows: usize, cols: usize) -> Result<TensorView<'g>> {
    let view = gguf.require(name)?;
    if view.dims != [rows, cols] {
        return Err(ModelError::Shape {
            tensor: name.to_owned(),
            actual: view.dims.to_vec(),
            expected: vec![rows, cols],
        });
    }
    Ok(view)
}

fn matrix(name: &str, dtype: GgmlDType, rows: usize, cols: usize, bytes: &[u8]) -> Result<QMatrix> {
    let unsupported = || ModelError::UnsupportedTensorType {
        tensor: name.to_owned(),
        dtype,
    };
    if !cols.is_multiple_of(dtype.block_size()) {
        return Err(unsupported());
    }
    QMatrix::from_bytes(dtype, rows, cols, bytes).ok_or_else(unsupported)
}

/// A 1-D tensor of `len` floats (norm weights, biases), stored as F32 or F16.
fn vector(gguf: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let view = gguf.require(name)?;
    if view.dims != [len] {
        return Err(ModelError::Shape {
            tensor: name.to_owned(),
            actual: view.dims.to_vec(),
            expected: vec![len],
        });
    }
    let m = matrix(name, view.dtype, 1, len, view.bytes)?;
    let mut out = vec![0.0; len];
    m.row_to_f32(0, &mut out);
    Ok(out)
}
