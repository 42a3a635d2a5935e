//! The transformer: RMSNorm, RoPE, grouped-query attention, and per layer either the dense
//! gated MLP or a LatentMoE, with an optional attention residual (the k3 family,
//! [`crate::k3`]). What differs between families (QKV biases, normed Q and K, post-norms, the
//! MLP's activation, the embedding scale, sliding windows and their RoPE, a logit cap) is read
//! from the config's [`crate::config::Family`], never from the family's name.
//!
//! One forward pass computes any mix of sequences at different positions (prefill chunks and
//! single decode tokens together): matmuls see all tokens as one matrix, attention runs per
//! sequence over its own paged KV.

use rayon::prelude::*;

use crate::batch::{ForwardBatch, LogitsWanted};
use crate::checkpoint::Checkpoint;
use crate::config::{Activation, ModelConfig};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::k3::{AttnResConfig, K3Config, LatentMoe, MoeScratch};
use crate::kernels::attention::{AttentionSeq, AttentionShape, attention};
use crate::kernels::heat::block_mass;
use crate::kernels::matmul::QMatrix;
use crate::kernels::ops::{
    RopeTable, add_assign, add_bias, geglu, rms_norm, rms_norm_in_place, softcap, swiglu,
};
use crate::kv_cache::KvCache;
use crate::source::{WeightSource, matrix};

/// A loaded model.
pub struct Transformer {
    config: ModelConfig,
    k3: Option<K3Config>,
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
    /// Per-head RMSNorm weights of Q and of K (`head_dim` each), when the family norms them.
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    wo: QMatrix,
    /// RMSNorm of attention's output before the residual, when the family has post-norms.
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    mlp: Mlp,
    /// RMSNorm of the MLP's output before the residual, when the family has post-norms.
    post_ffn_norm: Option<Vec<f32>>,
    attn_res: Option<AttnResConfig>,
}

enum Mlp {
    Dense {
        /// Gate and up projections, outputs side by side.
        gate_up: Projection,
        down: QMatrix,
    },
    LatentMoe(Box<LatentMoe>),
}

/// Several projections of the same input whose outputs are concatenated: one matrix when the
/// parts share a storage type (one pass over the input), else one matmul each.
enum Projection {
    Fused(QMatrix),
    Split(Vec<QMatrix>),
}

impl Projection {
    fn load(src: &dyn WeightSource, names: &[String], rows: &[usize], cols: usize) -> Result<Self> {
        let views = names
            .iter()
            .zip(rows)
            .map(|(n, &r)| src.shaped(n, &[r, cols]))
            .collect::<Result<Vec<_>>>()?;
        if views.iter().all(|v| v.format == views[0].format) {
            let bytes = views
                .iter()
                .map(|v| &v.bytes[..])
                .collect::<Vec<_>>()
                .concat();
            let total = rows.iter().sum();
            return Ok(Self::Fused(matrix(
                &names[0],
                views[0].format,
                total,
                cols,
                &bytes,
            )?));
        }
        let parts = views
            .iter()
            .zip(names)
            .zip(rows)
            .map(|((v, n), &r)| matrix(n, v.format, r, cols, &v.bytes))
            .collect::<Result<_>>()?;
        Ok(Self::Split(parts))
    }

    fn storage_bytes(&self) -> usize {
        match self {
            Self::Fused(q) => q.storage_bytes(),
            Self::Split(v) => v.iter().map(QMatrix::storage_bytes).sum(),
        }
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
    moe: MoeScratch,
    /// Per MoE layer, each token's chosen experts (token-major, `top_k` each).
    routing: Vec<Vec<u32>>,
    /// Per MoE layer, `(experts, top_k)`.
    routing_shape: Vec<(usize, usize)>,
    /// Copies of layers' input residual streams that a later AttnRes reads (by layer).
    residuals: Vec<Vec<f32>>,
    /// Whether the next pass measures attention heat.
    sample_heat: bool,
    /// Per batch sequence, the attention mass of its last token on each of its blocks.
    heat: Vec<Vec<f32>>,
    /// What the last pass recorded for calibrating conversions, when asked to.
    calibration: Option<Calibration>,
}

/// What a forward pass records for calibrating conversions ([`ForwardScratch::set_calibrate`]).
#[derive(Clone, Debug, Default)]
pub struct Calibration {
    /// Per layer, the mean over the pass's tokens of the normed input its MLP (or LatentMoE)
    /// read.
    pub mlp_input_means: Vec<Vec<f32>>,
    /// Per LatentMoE layer, every token's router scores (`[tokens, experts]`, bias included).
    pub router_scores: Vec<Vec<f32>>,
}

impl ForwardScratch {
    /// Makes the next forward passes measure attention heat (see [`Self::heat`]), or stop.
    pub fn set_sample_heat(&mut self, on: bool) {
        self.sample_heat = on;
    }

    /// Makes the next forward passes record what calibration needs ([`Calibration`]), or
    /// stop.
    pub fn set_calibrate(&mut self, on: bool) {
        self.calibration = on.then(Calibration::default);
    }

    /// What the last pass recorded, when calibrating.
    pub fn calibration(&self) -> Option<&Calibration> {
        self.calibration.as_ref()
    }

    /// After a pass with heat sampling on: per batch sequence, the attention mass its last
    /// new token put on each of its KV blocks (logical order, summing to 1), averaged over
    /// the middle and last layers of the first KV group ([`crate::kernels::heat`]). Empty
    /// otherwise.
    pub fn heat(&self) -> &[Vec<f32>] {
        &self.heat
    }

    /// Appends the expert slots (`moe_layer * experts + expert`, MoE layers in order) that
    /// each batch row of `rows` was routed to in the last forward pass: per row, every MoE
    /// layer's `top_k` choices. Appends nothing for a dense model.
    pub fn routed_slots(&self, rows: std::ops::Range<usize>, out: &mut Vec<u32>) {
        for row in rows {
            let mut base = 0;
            for (choices, &(e, k)) in self.routing.iter().zip(&self.routing_shape) {
                out.extend(choices[row * k..(row + 1) * k].iter().map(|&x| base + x));
                base += e as u32;
            }
        }
    }
}

impl Transformer {
    /// Loads the model at `path`: a checkpoint directory or a GGUF file.
    pub fn open(path: &std::path::Path) -> Result<Self> {
        if Checkpoint::is_checkpoint(path) {
            let ckpt = Checkpoint::open(path)?;
            let c = ckpt.config().clone();
            Self::from_source(c.model, c.k3, &ckpt)
        } else {
            Self::load(&GgufFile::open(path)?)
        }
    }

    /// Loads a Llama-family model from an open GGUF file.
    pub fn load(gguf: &GgufFile) -> Result<Self> {
        let mut config = ModelConfig::from_gguf(gguf)?;
        if gguf.tensor("rope_freqs.weight").is_some() {
            config.rope.freq_factors = Some(WeightSource::vector(
                gguf,
                "rope_freqs.weight",
                config.rope.dims / 2,
            )?);
        }
        Self::from_source(config, None, gguf)
    }

    /// Loads a model of shape `config` (a k3 model when `k3` is given) from `src`, whose
    /// tensors have GGUF names (`blk.{l}.attn_q.weight`, ...; k3 layers: [`LatentMoe::load`]).
    pub fn from_source(
        config: ModelConfig,
        k3: Option<K3Config>,
        src: &dyn WeightSource,
    ) -> Result<Self> {
        if let Some(k3) = &k3 {
            k3.validate(config.n_layers)?;
        }
        let c = &config;
        let d = c.d_model;
        let output = match src.contains("output.weight") {
            true => Some(src.matrix("output.weight", c.vocab_size, d)?),
            false => None,
        };
        let layers = (0..c.n_layers)
            .into_par_iter()
            .map(|l| load_layer(src, c, k3.as_ref().map(|k| &k.layers[l]), l))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            embed: src.matrix("token_embd.weight", c.vocab_size, d)?,
            output_norm: src.vector("output_norm.weight", d)?,
            config,
            k3,
            layers,
            output,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The k3 layer plan, for a k3 model.
    pub fn k3(&self) -> Option<&K3Config> {
        self.k3.as_ref()
    }

    /// `(experts, top_k)` of each LatentMoE layer, in order (empty for a dense model): how
    /// [`ForwardScratch::routed_slots`] numbers expert slots.
    pub fn moe_layout(&self) -> Vec<(usize, usize)> {
        (self.layers.iter())
            .filter_map(|l| match &l.mlp {
                Mlp::LatentMoe(m) => Some((m.config().experts, m.config().top_k)),
                Mlp::Dense { .. } => None,
            })
            .collect()
    }

    /// Bytes of weights one token's forward pass reads (what bounds single-stream decode
    /// speed): for MoE layers, only the experts a token is routed to.
    pub fn weight_bytes(&self) -> usize {
        self.bytes(|moe| moe.bytes_per_token())
    }

    /// Bytes of all weights.
    pub fn total_weight_bytes(&self) -> usize {
        self.bytes(LatentMoe::total_bytes) + self.embed.storage_bytes()
    }

    /// Multiply-adds of one token's matmuls, split as (attention projections, MLP or MoE,
    /// output head); attention over the context comes on top.
    pub fn macs_per_token(&self) -> (usize, usize, usize) {
        let m = |q: &QMatrix| q.rows() * q.cols();
        let p = |p: &Projection| match p {
            Projection::Fused(q) => m(q),
            Projection::Split(v) => v.iter().map(m).sum(),
        };
        let (mut attn, mut mlp) = (0, 0);
        for l in &self.layers {
            attn += p(&l.qkv) + m(&l.wo);
            mlp += match &l.mlp {
                Mlp::Dense { gate_up, down } => p(gate_up) + m(down),
                Mlp::LatentMoe(moe) => moe.macs_per_token(),
            };
        }
        (attn, mlp, m(self.output.as_ref().unwrap_or(&self.embed)))
    }

    fn bytes(&self, moe_bytes: impl Fn(&LatentMoe) -> usize) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                let mlp = match &l.mlp {
                    Mlp::Dense { gate_up, down } => gate_up.storage_bytes() + down.storage_bytes(),
                    Mlp::LatentMoe(m) => moe_bytes(m),
                };
                l.qkv.storage_bytes() + l.wo.storage_bytes() + mlp
            })
            .sum();
        layers + self.output.as_ref().unwrap_or(&self.embed).storage_bytes()
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
        self.forward_layers(batch, kv, s, self.layers.len())
    }

    /// [`Self::forward`] through the first `layers` layers only, then the output norm and
    /// head: the model's own cheap guess at its next tokens (a self-draft). Those layers'
    /// keys and values are stored as a full pass would store them (the same bits), so a full
    /// pass over the same positions later rewrites them unchanged.
    pub fn forward_layers<'s>(
        &self,
        batch: &ForwardBatch,
        kv: &mut KvCache,
        s: &'s mut ForwardScratch,
        layers: usize,
    ) -> &'s mut [f32] {
        let c = &self.config;
        let (t, d, hd) = (batch.tokens.len(), c.d_model, c.head_dim);
        let (q_dim, kv_dim, qkv_dim) = (c.n_heads * hd, c.n_kv_heads * hd, c.qkv_dim());
        s.x.resize(t * d, 0.0);
        for (i, &tok) in batch.tokens.iter().enumerate() {
            self.embed
                .row_to_f32(tok as usize, &mut s.x[i * d..(i + 1) * d]);
        }
        if c.family.embed_scale != 1.0 {
            s.x.iter_mut().for_each(|v| *v *= c.family.embed_scale);
        }

        // Per KV group, the sequences as attention reads them (through that group's tables).
        let layout = kv.layout().clone();
        let mut attn_seqs = vec![Vec::with_capacity(batch.seqs.len()); layout.groups().len()];
        let mut row_seq = Vec::with_capacity(t);
        let mut first_row = 0;
        for (idx, seq) in batch.seqs.iter().enumerate() {
            for (group, table) in attn_seqs.iter_mut().zip(seq.block_tables) {
                group.push(AttentionSeq {
                    first_row,
                    n_new: seq.n_tokens,
                    start_pos: seq.start_pos,
                    block_table: table,
                });
            }
            row_seq.extend((0..seq.n_tokens).map(|i| (idx, seq.start_pos + i)));
            first_row += seq.n_tokens;
        }
        assert_eq!(first_row, t, "sequence lengths do not add up to the batch");
        // Heat is sampled on the middle and last layers of the first group (full attention
        // when the model has any).
        let heat_layers = &layout.groups()[0].layers;
        let heat_layers = [
            heat_layers[heat_layers.len() / 2],
            heat_layers[heat_layers.len() - 1],
        ];
        let positions = || row_seq.iter().map(|&(_, pos)| pos);
        let rope = RopeTable::new(&c.rope, positions());
        let local_rope = c.local_rope().map(|r| RopeTable::new(&r, positions()));

        s.xn.resize(t * d, 0.0);
        s.qkv.resize(t * qkv_dim, 0.0);
        s.attn.resize(t * q_dim, 0.0);
        s.tmp.resize(t * d, 0.0);
        s.heat.clear();
        if s.sample_heat {
            s.heat.resize_with(batch.seqs.len(), Vec::new);
        }
        s.routing.resize_with(self.moe_layers(), Vec::new);
        s.routing_shape.clear();
        s.residuals.resize_with(c.n_layers, Vec::new);
        if let Some(c) = &mut s.calibration {
            *c = Calibration::default();
        }
        let mut moe_index = 0;
        for (l, layer) in self.layers.iter().enumerate().take(layers) {
            if self.is_residual_source(l) {
                s.residuals[l].clear();
                s.residuals[l].extend_from_slice(&s.x);
            }
            rms_norm(&s.x, &layer.attn_norm, c.rms_eps, &mut s.xn);
            if let Some(r) = layer.attn_res
                && r.alpha != 0.0
            {
                for (a, &h) in s.xn.iter_mut().zip(&s.residuals[r.source]) {
                    *a = r.alpha.mul_add(h, *a);
                }
            }
            layer.qkv.matmul(&s.xn, &mut s.qkv, &mut s.split_tmp);
            if let Some(bias) = &layer.qkv_bias {
                add_bias(&mut s.qkv, bias);
            }
            let how = c.layer_attention(l);
            let group = layout.group(l);
            let rope = match how.local_rope {
                true => local_rope.as_ref().unwrap_or(&rope),
                false => &rope,
            };
            let shape = AttentionShape {
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: hd,
                window: how.window,
            };
            for (i, row) in s.qkv.chunks_exact_mut(qkv_dim).enumerate() {
                let (q, rest) = row.split_at_mut(q_dim);
                let (k, v) = rest.split_at_mut(kv_dim);
                if let Some((q_norm, k_norm)) = &layer.qk_norm {
                    rms_norm_in_place(q, q_norm, c.rms_eps);
                    rms_norm_in_place(k, k_norm, c.rms_eps);
                }
                rope.apply(c.rope.style, i, hd, q);
                rope.apply(c.rope.style, i, hd, k);
                let (seq, pos) = row_seq[i];
                kv.write(l, &batch.seqs[seq].block_tables[group], pos, k, v);
            }
            let attn_seqs = &attn_seqs[group];
            if s.sample_heat && heat_layers.contains(&l) {
                self.sample_heat(batch, attn_seqs, shape, kv, l, s);
            }
            attention(shape, &s.qkv, qkv_dim, kv, l, attn_seqs, &mut s.attn);
            layer.wo.matmul(&s.attn, &mut s.tmp);
            if let Some(norm) = &layer.post_attn_norm {
                rms_norm_in_place(&mut s.tmp, norm, c.rms_eps);
            }
            add_assign(&mut s.x, &s.tmp);

            rms_norm(&s.x, &layer.ffn_norm, c.rms_eps, &mut s.xn);
            if let Some(c) = &mut s.calibration {
                let mut mean = vec![0f32; d];
                for row in s.xn.chunks_exact(d) {
                    for (m, &v) in mean.iter_mut().zip(row) {
                        *m += v / t as f32;
                    }
                }
                c.mlp_input_means.push(mean);
            }
            match &layer.mlp {
                Mlp::Dense { gate_up, down } => {
                    s.gate_up.resize(t * 2 * c.ffn_dim, 0.0);
                    s.ffn.resize(t * c.ffn_dim, 0.0);
                    gate_up.matmul(&s.xn, &mut s.gate_up, &mut s.split_tmp);
                    match c.family.activation {
                        Activation::Silu => swiglu(&s.gate_up, c.ffn_dim, &mut s.ffn),
                        Activation::GeluTanh => geglu(&s.gate_up, c.ffn_dim, &mut s.ffn),
                    }
                    down.matmul(&s.ffn, &mut s.tmp);
                }
                Mlp::LatentMoe(moe) => {
                    moe.forward(&s.xn, &mut s.tmp, &mut s.routing[moe_index], &mut s.moe);
                    if let Some(c) = &mut s.calibration {
                        c.router_scores.push(s.moe.scores().to_vec());
                    }
                    s.routing_shape
                        .push((moe.config().experts, moe.config().top_k));
                    moe_index += 1;
                }
            }
            if let Some(norm) = &layer.post_ffn_norm {
                rms_norm_in_place(&mut s.tmp, norm, c.rms_eps);
            }
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
        if let Some(cap) = c.family.logit_softcap {
            softcap(&mut s.logits, cap);
        }
        &mut s.logits
    }
}

impl Transformer {
    fn moe_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| matches!(l.mlp, Mlp::LatentMoe(_)))
            .count()
    }

    /// Adds layer `l`'s half of each sequence's heat (the last new token's attention mass).
    fn sample_heat(
        &self,
        batch: &ForwardBatch,
        attn_seqs: &[AttentionSeq],
        shape: AttentionShape,
        kv: &KvCache,
        l: usize,
        s: &mut ForwardScratch,
    ) {
        let (qkv_dim, q_dim) = (self.config.qkv_dim(), shape.n_heads * shape.head_dim);
        for (i, (seq, a)) in batch.seqs.iter().zip(attn_seqs).enumerate() {
            let row = a.first_row + seq.n_tokens - 1;
            let q = &s.qkv[row * qkv_dim..row * qkv_dim + q_dim];
            let pos = seq.start_pos + seq.n_tokens - 1;
            let mass = block_mass(shape, q, kv, l, a.block_table, pos);
            let heat = &mut s.heat[i];
            heat.resize(mass.len(), 0.0);
            for (h, m) in heat.iter_mut().zip(mass) {
                *h += m / 2.0;
            }
        }
    }

    fn is_residual_source(&self, l: usize) -> bool {
        self.layers.iter().any(|layer| {
            layer
                .attn_res
                .is_some_and(|r| r.source == l && r.alpha != 0.0)
        })
    }
}

/// Layer `l`: attention, then the dense MLP or, when `plan` says so, a LatentMoE, with the
/// family's extra tensors (biases, Q/K norms, post-norms).
fn load_layer(
    src: &dyn WeightSource,
    c: &ModelConfig,
    plan: Option<&crate::k3::K3LayerConfig>,
    l: usize,
) -> Result<Layer> {
    let (d, hd) = (c.d_model, c.head_dim);
    let n = |s: &str| format!("blk.{l}.{s}");
    let qkv_rows = [c.n_heads * hd, c.n_kv_heads * hd, c.n_kv_heads * hd];
    let qkv_names = [n("attn_q.weight"), n("attn_k.weight"), n("attn_v.weight")];
    let qkv_bias = if c.family.qkv_bias {
        let parts = [n("attn_q.bias"), n("attn_k.bias"), n("attn_v.bias")]
            .iter()
            .zip(qkv_rows)
            .map(|(b, len)| src.vector(b, len))
            .collect::<Result<Vec<_>>>()?;
        Some(parts.concat())
    } else {
        None
    };
    let mlp = match plan.and_then(|p| p.moe.as_ref()) {
        Some(moe) => Mlp::LatentMoe(Box::new(LatentMoe::load(src, l, d, moe)?)),
        // Gate and up stored as one tensor, gate first (Phi-3).
        None if !src.contains(&n("ffn_gate.weight")) => Mlp::Dense {
            gate_up: Projection::Fused(src.matrix(&n("ffn_up.weight"), 2 * c.ffn_dim, d)?),
            down: src.matrix(&n("ffn_down.weight"), d, c.ffn_dim)?,
        },
        None => Mlp::Dense {
            gate_up: Projection::load(
                src,
                &[n("ffn_gate.weight"), n("ffn_up.weight")],
                &[c.ffn_dim, c.ffn_dim],
                d,
            )?,
            down: src.matrix(&n("ffn_down.weight"), d, c.ffn_dim)?,
        },
    };
    // Q, K and V stored as one tensor (Phi-3).
    let qkv = match src.contains(&n("attn_qkv.weight")) {
        true => Projection::Fused(src.matrix(&n("attn_qkv.weight"), c.qkv_dim(), d)?),
        false => Projection::load(src, &qkv_names, &qkv_rows, d)?,
    };
    let qk_norm = match c.family.qk_norm {
        true => Some((
            src.vector(&n("attn_q_norm.weight"), hd)?,
            src.vector(&n("attn_k_norm.weight"), hd)?,
        )),
        false => None,
    };
    let post_norm = |name: &str| -> Result<Option<Vec<f32>>> {
        c.family
            .post_norms
            .then(|| src.vector(&n(name), d))
            .transpose()
    };
    Ok(Layer {
        attn_norm: src.vector(&n("attn_norm.weight"), d)?,
        qkv,
        qkv_bias,
        qk_norm,
        wo: src.matrix(&n("attn_output.weight"), d, c.n_heads * hd)?,
        post_attn_norm: post_norm("post_attention_norm.weight")?,
        ffn_norm: src.vector(&n("ffn_norm.weight"), d)?,
        mlp,
        post_ffn_norm: post_norm("post_ffw_norm.weight")?,
        attn_res: plan.and_then(|p| p.attn_res),
    })
}
