//! `osprey upcycle`: a dense Llama-family model → a k3 checkpoint.
//!
//! - [`UpcycleMode::Identity`]: every layer's MLP becomes a LatentMoE with identity latent
//!   projections, a zero router (so the top-k is the first k experts, each weighted 1/k) and
//!   every expert a copy of the dense MLP in its own format; every layer after the first gets
//!   an AttnRes from the layer before with `α = 0`. The model computes the dense model's
//!   logits: the test of the k3 forward pass on real weights.
//! - [`UpcycleMode::Moefy`]: the MLP's neurons are split into experts ([`super::moefy`]) with a
//!   centroid router and `Select` gating: a real sparse model, exact at `top_k = experts` and
//!   full latent width. Given calibration tokens, each router gets a bias (`router.bias`) that
//!   spreads the calibration tokens evenly over its experts ([`super::calibrate`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use candle_core::quantized::GgmlDType;
use rayon::prelude::*;

use super::calibrate;
use super::moefy::{DenseMlp, moefy};
use super::{Input, dequantize, values_for};
use crate::checkpoint::layout::{CheckpointConfig, Index};
use crate::checkpoint::{PlannedTensor, TensorValues, WriteOptions, write};
use crate::error::{ModelError, Result};
use crate::k3::{AttnResConfig, Gating, K3Config, K3LayerConfig, LatentMoeConfig};
use crate::kernels::matmul::WeightFormat;

/// How the dense MLPs become LatentMoE layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpcycleMode {
    /// Experts are copies of the MLP; reproduces the dense model.
    Identity,
    /// Experts partition the MLP's neurons, in a latent space of this width.
    Moefy {
        /// Latent width (the model width for exact projections).
        latent_dim: usize,
    },
}

/// What `osprey upcycle` writes.
pub struct UpcycleOptions {
    /// How experts are made.
    pub mode: UpcycleMode,
    /// Experts per layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Number of shards.
    pub shards: usize,
    /// Format of MoEfied experts (identity experts keep the dense MLP's format).
    pub expert_format: WeightFormat,
    /// Token ids of calibration text for MoEfication's router bias (none: no bias).
    pub calibration: Vec<u32>,
}

/// Where a planned tensor's values come from.
enum Origin {
    /// A source tensor, copied (in its format when that stays).
    Copy(String),
    /// The identity matrix of this size.
    Identity(usize),
    /// Zeros.
    Zeros,
    /// Computed by MoEfication, taken from the table once written.
    Computed,
}

/// Upcycles `input` into a k3 checkpoint in `out`.
pub fn upcycle(
    input: &Input,
    out: &Path,
    o: &UpcycleOptions,
    on_plan: &dyn Fn(usize),
    on_tensor: &(dyn Fn(&str) + Sync),
) -> Result<Index> {
    if input.k3().is_some() {
        return Err(ModelError::Input("the input is already a k3 model".into()));
    }
    let model = input.config()?;
    let (d, f) = (model.d_model, model.ffn_dim);
    if o.experts == 0 || o.top_k == 0 || o.top_k > o.experts {
        return Err(ModelError::Input("need 1 <= --top-k <= --experts".into()));
    }
    let (latent, expert_dim, gating) = match o.mode {
        UpcycleMode::Identity => (d, f, Gating::Softmax),
        UpcycleMode::Moefy { latent_dim } => {
            if !f.is_multiple_of(o.experts) {
                return Err(ModelError::Input(format!(
                    "the MLP's {f} neurons do not split into {} equal experts",
                    o.experts
                )));
            }
            if latent_dim == 0 || latent_dim > d {
                return Err(ModelError::Input(format!("--latent-dim must be 1..={d}")));
            }
            (latent_dim, f / o.experts, Gating::Select)
        }
    };
    let moe = LatentMoeConfig {
        experts: o.experts,
        top_k: o.top_k,
        latent_dim: latent,
        expert_dim,
        shared_expert_dim: 0,
        gating,
    };
    let k3 = K3Config {
        layers: (0..model.n_layers)
            .map(|l| K3LayerConfig {
                moe: Some(moe.clone()),
                attn_res: (l > 0).then(|| AttnResConfig {
                    alpha: 0.0,
                    source: l - 1,
                }),
            })
            .collect(),
    };

    let f32_format = WeightFormat::Ggml(GgmlDType::F32);
    let mut plan = Vec::new();
    let mut origin = HashMap::new();
    let mut add = |name: String, format, dims: Vec<usize>, from: Origin| {
        origin.insert(name.clone(), from);
        plan.push(PlannedTensor {
            name,
            format,
            dims,
            kept: None,
        });
    };
    for (name, dims, format) in input.tensors()? {
        let mlp_part = ["ffn_gate", "ffn_up", "ffn_down"]
            .iter()
            .any(|p| name.ends_with(&format!(".{p}.weight")));
        if !mlp_part {
            add(name.clone(), format, dims, Origin::Copy(name));
        }
    }
    for l in 0..model.n_layers {
        let n = |s: &str| format!("blk.{l}.{s}");
        let m = |s: &str| format!("blk.{l}.moe.{s}");
        let computed = matches!(o.mode, UpcycleMode::Moefy { .. });
        let proj = |size| {
            if computed {
                Origin::Computed
            } else {
                Origin::Identity(size)
            }
        };
        add(m("down.weight"), f32_format, vec![latent, d], proj(d));
        add(m("up.weight"), f32_format, vec![d, latent], proj(d));
        let router = if computed {
            Origin::Computed
        } else {
            Origin::Zeros
        };
        add(
            m("router.weight"),
            f32_format,
            vec![o.experts, latent],
            router,
        );
        if computed && !o.calibration.is_empty() {
            add(
                m("router.bias"),
                f32_format,
                vec![o.experts],
                Origin::Computed,
            );
        }
        for e in 0..o.experts {
            for (part, dense, dims) in [
                ("gate", "ffn_gate", vec![expert_dim, latent]),
                ("up", "ffn_up", vec![expert_dim, latent]),
                ("down", "ffn_down", vec![latent, expert_dim]),
            ] {
                let name = m(&format!("exp.{e}.{part}.weight"));
                if computed {
                    add(name, o.expert_format, dims, Origin::Computed);
                } else {
                    let dense = n(&format!("{dense}.weight"));
                    let format = input.source().require(&dense)?.format;
                    add(name, format, dims, Origin::Copy(dense));
                }
            }
        }
    }
    on_plan(plan.len());

    let src = input.source();
    let table = Mutex::new(match o.mode {
        UpcycleMode::Identity => HashMap::new(),
        UpcycleMode::Moefy { latent_dim } => {
            let means = calibrate::mlp_input_means(input, &o.calibration)?;
            let mut table = moefy_all(input, o.experts, latent_dim, &means)?;
            if !o.calibration.is_empty() {
                let dims = (plan.iter())
                    .filter(|t| table.contains_key(&t.name))
                    .map(|t| (t.name.clone(), t.dims.clone()))
                    .collect();
                calibrate::balance_routers(input, &k3, &mut table, &dims, &o.calibration)?;
            }
            table
        }
    });
    let produce = |t: &PlannedTensor| -> Result<TensorValues> {
        match &origin[&t.name] {
            Origin::Copy(from) => values_for(src, from, t.format),
            Origin::Identity(size) => {
                let mut m = vec![0f32; size * size];
                for i in 0..*size {
                    m[i * size + i] = 1.0;
                }
                Ok(TensorValues::F32(m))
            }
            Origin::Zeros => Ok(TensorValues::F32(vec![0.0; t.dims.iter().product()])),
            Origin::Computed => {
                let values = table.lock().expect("not poisoned").remove(&t.name);
                values
                    .map(TensorValues::F32)
                    .ok_or_else(|| ModelError::Input(format!("no values for `{}`", t.name)))
            }
        }
    };
    let config = CheckpointConfig {
        model_type: "k3".into(),
        model,
        k3: Some(k3),
    };
    write(
        out,
        &config,
        input.tokenizer(),
        &plan,
        &produce,
        &WriteOptions {
            shards: o.shards,
            format_label: match o.mode {
                UpcycleMode::Identity => "k3 identity upcycle (dense formats kept)".into(),
                UpcycleMode::Moefy { .. } => {
                    format!("k3 moefy ({} experts)", o.expert_format).to_ascii_lowercase()
                }
            },
            on_tensor,
        },
    )
}

/// MoEfies every layer (in parallel), keyed by output tensor name; `means` (per layer, may be
/// empty) centre the routers.
fn moefy_all(
    input: &Input,
    experts: usize,
    latent: usize,
    means: &[Vec<f32>],
) -> Result<HashMap<String, Vec<f32>>> {
    let c = input.config()?;
    let src = input.source();
    let layers = (0..c.n_layers)
        .into_par_iter()
        .map(|l| {
            let w = |s: &str| dequantize(src, &format!("blk.{l}.{s}.weight"));
            let (gate, up, down) = (w("ffn_gate")?, w("ffn_up")?, w("ffn_down")?);
            let dense = DenseMlp {
                gate: &gate,
                up: &up,
                down: &down,
                width: c.d_model,
                hidden: c.ffn_dim,
            };
            let mean = means.get(l).map(Vec::as_slice);
            let moe = moefy(&dense, experts, latent, mean);
            let m = |s: &str| format!("blk.{l}.moe.{s}");
            let mut out = vec![
                (m("down.weight"), moe.down),
                (m("up.weight"), moe.up),
                (m("router.weight"), moe.router),
            ];
            if mean.is_some() {
                out.push((m("router.bias"), moe.router_bias));
            }
            for (e, x) in moe.experts.into_iter().enumerate() {
                out.push((m(&format!("exp.{e}.gate.weight")), x.gate));
                out.push((m(&format!("exp.{e}.up.weight")), x.up));
                out.push((m(&format!("exp.{e}.down.weight")), x.down));
            }
            Ok(out)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(layers.into_iter().flatten().collect())
}
