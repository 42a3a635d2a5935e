//! The k3 family's layers: LatentMoE and AttnRes (`../shared/ARCHITECTURE.md` §3).
//!
//! A k3 model is a Llama-family transformer (GQA attention over the paged cache, RMSNorm,
//! RoPE) whose layers may each replace the dense MLP with a [`LatentMoe`] and mix a residual
//! kept from an earlier layer into the attention input ([`AttnResConfig`]). [`K3Config`] says
//! which layer does what; it lives in the checkpoint's `config.json`.
//!
//! LatentMoE, for a normed hidden state `x` (width `d`):
//! ```text
//! z      = W_down · x                       latent, width L
//! scores = W_router · z + b_router          one per expert (b optional)
//! S      = top_k(scores)                    ties to the lower index
//! g_e    = softmax(scores[S])_e  (Softmax)  or 1 (Select)
//! y      = W_up · (Σ_{e∈S} g_e · E_e(z) + shared(z))
//! ```
//! where each expert `E_e` is a SwiGLU MLP from `L` to `L`. With `W_down = W_up = I` and every
//! expert equal to the dense MLP, `Softmax` gating reproduces the dense layer exactly (the
//! weights sum to one); with experts that partition the dense MLP's neurons, `Select` gating at
//! `k = E` does (their outputs sum to it).

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::kernels::matmul::QMatrix;
use crate::kernels::ops::{add_bias, swiglu};
use crate::source::WeightSource;

/// Which layers of a k3 model are LatentMoE and which use AttnRes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct K3Config {
    /// One entry per layer.
    pub layers: Vec<K3LayerConfig>,
}

/// One layer of a k3 model.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct K3LayerConfig {
    /// A LatentMoE in place of the dense MLP; `None` keeps the dense MLP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<LatentMoeConfig>,
    /// An attention residual; `None` is a plain Llama layer input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_res: Option<AttnResConfig>,
}

/// Shape of a LatentMoE layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatentMoeConfig {
    /// Routed experts.
    pub experts: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
    /// Width of the latent space the router and experts work in.
    pub latent_dim: usize,
    /// Hidden width of each routed expert.
    pub expert_dim: usize,
    /// Hidden width of the shared expert every token goes through; 0 for none.
    #[serde(default)]
    pub shared_expert_dim: usize,
    /// How the chosen experts' outputs are weighted.
    pub gating: Gating,
}

/// Weights of the chosen experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gating {
    /// Softmax over the chosen experts' scores (they sum to one).
    Softmax,
    /// Weight one for each chosen expert: the router only selects.
    Select,
}

/// `x' = norm(h_l) + alpha · h_source` before attention in this layer.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttnResConfig {
    /// Mixing weight.
    pub alpha: f32,
    /// Earlier layer whose input residual stream is mixed in (`source < l`).
    pub source: usize,
}

impl K3Config {
    /// Checks the config against the model's depth and width.
    pub fn validate(&self, n_layers: usize) -> Result<()> {
        let bad = |m: String| Err(ModelError::Input(format!("k3 config: {m}")));
        if self.layers.len() != n_layers {
            return bad(format!(
                "{} layers, the model has {n_layers}",
                self.layers.len()
            ));
        }
        for (l, layer) in self.layers.iter().enumerate() {
            if let Some(m) = &layer.moe
                && (m.top_k == 0 || m.top_k > m.experts || m.latent_dim == 0 || m.expert_dim == 0)
            {
                return bad(format!(
                    "layer {l}: top_k must be 1..=experts, dims positive"
                ));
            }
            if let Some(r) = &layer.attn_res
                && r.source >= l
            {
                return bad(format!(
                    "layer {l}: attn_res source {} is not earlier",
                    r.source
                ));
            }
        }
        Ok(())
    }

    /// The experts per MoE layer if the model has any MoE layer (all share one count).
    pub fn n_experts(&self) -> Option<usize> {
        self.layers
            .iter()
            .find_map(|l| l.moe.as_ref().map(|m| m.experts))
    }
}

/// A SwiGLU MLP: gate and up projections side by side, then down.
pub(crate) struct SwiGlu {
    pub gate_up: QMatrix,
    pub down: QMatrix,
    pub hidden: usize,
}

impl SwiGlu {
    /// Loads `{prefix}.gate.weight`, `{prefix}.up.weight` (`[hidden, width]`) and
    /// `{prefix}.down.weight` (`[width, hidden]`).
    fn load(src: &dyn WeightSource, prefix: &str, width: usize, hidden: usize) -> Result<Self> {
        let gate = src.shaped(&format!("{prefix}.gate.weight"), &[hidden, width])?;
        let up = src.shaped(&format!("{prefix}.up.weight"), &[hidden, width])?;
        if gate.format != up.format {
            return Err(ModelError::Input(format!(
                "{prefix}: gate and up must share a format ({} vs {})",
                gate.format, up.format
            )));
        }
        let bytes = [&gate.bytes[..], &up.bytes[..]].concat();
        Ok(Self {
            gate_up: crate::source::matrix(prefix, gate.format, 2 * hidden, width, &bytes)?,
            down: src.matrix(&format!("{prefix}.down.weight"), width, hidden)?,
            hidden,
        })
    }

    /// `out = down(silu(gate·x) ⊙ up·x)` for the rows of `x`.
    fn forward(&self, x: &[f32], out: &mut [f32], s: &mut MlpScratch) {
        let t = x.len() / self.gate_up.cols();
        s.gate_up.resize(t * 2 * self.hidden, 0.0);
        s.hidden.resize(t * self.hidden, 0.0);
        self.gate_up.matmul(x, &mut s.gate_up);
        swiglu(&s.gate_up, self.hidden, &mut s.hidden);
        self.down.matmul(&s.hidden, out);
    }
}

/// `W_down` or `W_up` of a LatentMoE. At full latent width they are often the identity
/// (identity upcycles, MoEfication at the model's width): then nothing is multiplied.
enum LatentProjection {
    Identity,
    Matrix(QMatrix),
}

impl LatentProjection {
    fn load(src: &dyn WeightSource, name: &str, rows: usize, cols: usize) -> Result<Self> {
        let m = src.matrix(name, rows, cols)?;
        Ok(if is_identity(&m) {
            Self::Identity
        } else {
            Self::Matrix(m)
        })
    }

    fn matmul(&self, x: &[f32], out: &mut [f32]) {
        match self {
            Self::Identity => out.copy_from_slice(x),
            Self::Matrix(m) => m.matmul(x, out),
        }
    }

    fn storage_bytes(&self) -> usize {
        match self {
            Self::Identity => 0,
            Self::Matrix(m) => m.storage_bytes(),
        }
    }

    fn macs(&self) -> usize {
        match self {
            Self::Identity => 0,
            Self::Matrix(m) => m.rows() * m.cols(),
        }
    }
}

/// Whether `m` is a square identity matrix.
fn is_identity(m: &QMatrix) -> bool {
    if m.rows() != m.cols() {
        return false;
    }
    let mut row = vec![0f32; m.cols()];
    (0..m.rows()).all(|i| {
        m.row_to_f32(i, &mut row);
        row.iter()
            .enumerate()
            .all(|(j, &v)| v == if i == j { 1.0 } else { 0.0 })
    })
}

/// A loaded LatentMoE layer.
pub struct LatentMoe {
    config: LatentMoeConfig,
    /// Model width.
    width: usize,
    down: LatentProjection,
    up: LatentProjection,
    router: QMatrix,
    /// Added to the router's scores, when the checkpoint has one (`router.bias`): MoEfication
    /// centres the scores on typical inputs with it, so that no expert wins every token.
    router_bias: Option<Vec<f32>>,
    experts: Vec<SwiGlu>,
    shared: Option<SwiGlu>,
}

/// Buffers of one SwiGLU pass.
#[derive(Default)]
pub(crate) struct MlpScratch {
    gate_up: Vec<f32>,
    hidden: Vec<f32>,
}

/// Buffers of the LatentMoE forward pass.
#[derive(Default)]
pub struct MoeScratch {
    z: Vec<f32>,
    scores: Vec<f32>,
    acc: Vec<f32>,
    rows: Vec<f32>,
    out_rows: Vec<f32>,
    mlp: MlpScratch,
    /// `(expert, token, weight)` for every routed pair of the pass.
    pairs: Vec<(u32, u32, f32)>,
}

impl MoeScratch {
    /// The last pass's router scores, `[tokens, experts]`.
    pub(crate) fn scores(&self) -> &[f32] {
        &self.scores
    }
}

impl LatentMoe {
    /// Loads layer `l`'s tensors (`blk.{l}.moe.*`) for a model of width `d`.
    pub fn load(
        src: &dyn WeightSource,
        l: usize,
        d: usize,
        config: &LatentMoeConfig,
    ) -> Result<Self> {
        let (lat, e) = (config.latent_dim, config.experts);
        let n = |s: &str| format!("blk.{l}.moe.{s}");
        let experts = (0..e)
            .map(|i| SwiGlu::load(src, &n(&format!("exp.{i}")), lat, config.expert_dim))
            .collect::<Result<_>>()?;
        let shared = match config.shared_expert_dim {
            0 => None,
            h => Some(SwiGlu::load(src, &n("shared"), lat, h)?),
        };
        Ok(Self {
            config: config.clone(),
            width: d,
            down: LatentProjection::load(src, &n("down.weight"), lat, d)?,
            up: LatentProjection::load(src, &n("up.weight"), d, lat)?,
            router: src.matrix(&n("router.weight"), e, lat)?,
            router_bias: match src.contains(&n("router.bias")) {
                true => Some(src.vector(&n("router.bias"), e)?),
                false => None,
            },
            experts,
            shared,
        })
    }

    /// The layer's shape.
    pub fn config(&self) -> &LatentMoeConfig {
        &self.config
    }

    /// Bytes of weights one token reads through this layer (projections, router, its `top_k`
    /// experts, the shared expert).
    pub fn bytes_per_token(&self) -> usize {
        let mlp = |m: &SwiGlu| m.gate_up.storage_bytes() + m.down.storage_bytes();
        let expert = self.experts.first().map_or(0, mlp);
        self.down.storage_bytes()
            + self.up.storage_bytes()
            + self.router.storage_bytes()
            + self.config.top_k * expert
            + self.shared.as_ref().map_or(0, mlp)
    }

    /// Multiply-adds one token costs in this layer: projections, router, `top_k` experts and
    /// the shared expert.
    pub fn macs_per_token(&self) -> usize {
        let c = &self.config;
        let lat = c.latent_dim;
        self.down.macs()
            + self.up.macs()
            + c.experts * lat
            + 3 * lat * (c.top_k * c.expert_dim + c.shared_expert_dim)
    }

    /// Bytes of all the layer's weights.
    pub fn total_bytes(&self) -> usize {
        let mlp = |m: &SwiGlu| m.gate_up.storage_bytes() + m.down.storage_bytes();
        self.down.storage_bytes()
            + self.up.storage_bytes()
            + self.router.storage_bytes()
            + self.experts.iter().map(mlp).sum::<usize>()
            + self.shared.as_ref().map_or(0, mlp)
    }

    /// `out = LatentMoE(x)` for the `t` rows of `x`; `choices` receives each token's `top_k`
    /// experts, token-major.
    pub fn forward(&self, x: &[f32], out: &mut [f32], choices: &mut Vec<u32>, s: &mut MoeScratch) {
        let c = &self.config;
        let (lat, k) = (c.latent_dim, c.top_k);
        let t = x.len() / self.width;
        s.z.resize(t * lat, 0.0);
        self.down.matmul(x, &mut s.z);
        s.scores.resize(t * c.experts, 0.0);
        self.router.matmul(&s.z, &mut s.scores);
        if let Some(bias) = &self.router_bias {
            add_bias(&mut s.scores, bias);
        }

        choices.clear();
        s.pairs.clear();
        for (tok, scores) in s.scores.chunks_exact(c.experts).enumerate() {
            let chosen = top_k(scores, k);
            let weights = gate_weights(c.gating, scores, &chosen);
            for (&e, w) in chosen.iter().zip(weights) {
                choices.push(e as u32);
                s.pairs.push((e as u32, tok as u32, w));
            }
        }
        // Expert-major, tokens ascending: each expert runs once on all of its tokens.
        s.pairs.sort_unstable_by_key(|&(e, tok, _)| (e, tok));

        s.acc.clear();
        s.acc.resize(t * lat, 0.0);
        if let Some(shared) = &self.shared {
            let mut y = std::mem::take(&mut s.out_rows);
            y.resize(t * lat, 0.0);
            shared.forward(&s.z, &mut y, &mut s.mlp);
            s.acc.copy_from_slice(&y);
            s.out_rows = y;
        }
        let mut start = 0;
        while start < s.pairs.len() {
            let e = s.pairs[start].0;
            let end = start + s.pairs[start..].partition_point(|p| p.0 == e);
            self.run_expert(e as usize, start..end, s);
            start = end;
        }
        self.up.matmul(&s.acc, out);
    }

    /// Runs expert `e` on the tokens of `s.pairs[range]` and adds its weighted outputs to
    /// `s.acc`.
    fn run_expert(&self, e: usize, range: std::ops::Range<usize>, s: &mut MoeScratch) {
        let lat = self.config.latent_dim;
        let n = range.len();
        let mut rows = std::mem::take(&mut s.rows);
        let mut y = std::mem::take(&mut s.out_rows);
        rows.clear();
        for &(_, tok, _) in &s.pairs[range.clone()] {
            let tok = tok as usize;
            rows.extend_from_slice(&s.z[tok * lat..(tok + 1) * lat]);
        }
        y.resize(n * lat, 0.0);
        self.experts[e].forward(&rows, &mut y, &mut s.mlp);
        for (i, &(_, tok, w)) in s.pairs[range].iter().enumerate() {
            let acc = &mut s.acc[tok as usize * lat..(tok as usize + 1) * lat];
            for (a, &v) in acc.iter_mut().zip(&y[i * lat..(i + 1) * lat]) {
                *a = w.mul_add(v, *a);
            }
        }
        s.rows = rows;
        s.out_rows = y;
    }
}

/// Indexes of the `k` largest scores, best first; ties go to the lower index.
fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

fn gate_weights(gating: Gating, scores: &[f32], chosen: &[usize]) -> Vec<f32> {
    match gating {
        Gating::Select => vec![1.0; chosen.len()],
        Gating::Softmax => {
            let max = chosen.iter().map(|&e| scores[e]).fold(f32::MIN, f32::max);
            let exp: Vec<f32> = chosen.iter().map(|&e| (scores[e] - max).exp()).collect();
            let sum: f32 = exp.iter().sum();
            exp.into_iter().map(|v| v / sum).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_breaks_ties_to_the_lower_index() {
        assert_eq!(top_k(&[0.0, 0.0, 0.0, 0.0], 2), vec![0, 1]);
        assert_eq!(top_k(&[0.1, 0.9, 0.5, 0.9], 3), vec![1, 3, 2]);
    }

    #[test]
    fn softmax_gates_sum_to_one_and_select_gates_are_one() {
        let s = [2.0, -1.0, 0.5];
        let w = gate_weights(Gating::Softmax, &s, &[0, 2]);
        assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(w[0] > w[1]);
        assert_eq!(gate_weights(Gating::Select, &s, &[0, 2]), vec![1.0, 1.0]);
        // Equal scores (an identity upcycle's zero router) give equal, exact halves.
        assert_eq!(
            gate_weights(Gating::Softmax, &[0.0; 4], &[0, 1]),
            vec![0.5, 0.5]
        );
    }

    #[test]
    fn config_rejects_a_later_residual_source_and_a_wrong_depth() {
        let layer = |src| K3LayerConfig {
            moe: None,
            attn_res: Some(AttnResConfig {
                alpha: 0.0,
                source: src,
            }),
        };
        let c = K3Config {
            layers: vec![K3LayerConfig::default(), layer(0)],
        };
        assert!(c.validate(2).is_ok());
        assert!(c.validate(3).is_err());
        let c = K3Config {
            layers: vec![K3LayerConfig::default(), layer(1)],
        };
        assert!(c.validate(2).is_err());
    }
}
