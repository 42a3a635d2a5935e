//! Calibration of MoEfied routers on text, so that the experts share the tokens.
//!
//! A centroid router alone sends nearly every token to the same few experts. Two steps fix
//! that, both from passes over calibration tokens:
//! 1. **Centring** ([`mlp_input_means`]): the dense model's mean MLP input per layer gives each
//!    router a bias that scores a token's departure from the typical input ([`super::moefy`]).
//! 2. **Balancing** ([`balance_routers`]): the MoEfied model itself runs over the tokens, and
//!    each layer's bias is nudged until its experts take about equal shares of them: DeepSeek-V3's
//!    auxiliary-loss-free balancing, done once on calibration text instead of during training.
//!    Later layers see the earlier layers' new routing, so a few passes are made.

use std::borrow::Cow;
use std::collections::HashMap;

use super::Input;
use crate::error::{ModelError, Result};
use crate::k3::K3Config;
use crate::kernels::matmul::WeightFormat;
use crate::source::{TensorData, WeightSource};
use crate::{BatchSeq, ForwardBatch, ForwardScratch, KvCache, LogitsWanted, Transformer};
use candle_core::quantized::GgmlDType;

/// Most passes of the MoEfied model over the calibration tokens (a layer's routing settles
/// once the layers before it have, so deep models take more).
const MAX_PASSES: usize = 48;
/// Balancing stops for a layer once its busiest expert takes at most this much more than the
/// mean.
const TOLERANCE: f32 = 1.15;

/// Each layer's mean MLP input when the dense model reads `tokens` (none without tokens).
pub fn mlp_input_means(input: &Input, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
    if tokens.is_empty() {
        return Ok(Vec::new());
    }
    let model = Transformer::from_source(input.config()?, None, input.source())?;
    Ok(calibration_pass(&model, tokens)?.mlp_input_means)
}

/// Sets every `blk.{l}.moe.router.bias` of `table` (the MoEfied tensors, in F32, of shapes
/// `dims`) so that the model it makes with `input`'s other tensors spreads `tokens` evenly over
/// each layer's experts.
pub fn balance_routers(
    input: &Input,
    k3: &K3Config,
    table: &mut HashMap<String, Vec<f32>>,
    dims: &HashMap<String, Vec<usize>>,
    tokens: &[u32],
) -> Result<()> {
    for _ in 0..MAX_PASSES {
        let model = {
            let overlay = Overlay {
                base: input.source(),
                table,
                dims,
            };
            Transformer::from_source(input.config()?, Some(k3.clone()), &overlay)?
        };
        let scores = calibration_pass(&model, tokens)?.router_scores;
        let moe_layers = (k3.layers.iter().enumerate())
            .filter_map(|(l, p)| p.moe.as_ref().map(|m| (l, m.experts, m.top_k)));
        let mut settled = true;
        for ((l, experts, top_k), scores) in moe_layers.zip(scores) {
            if worst_load(&scores, &vec![0.0; experts], experts, top_k) <= TOLERANCE * 1.1 {
                continue;
            }
            settled = false;
            let bias = table
                .get_mut(&format!("blk.{l}.moe.router.bias"))
                .ok_or_else(|| ModelError::Input(format!("layer {l} has no router bias")))?;
            let delta = balancing_bias(&scores, experts, top_k);
            bias.iter_mut().zip(delta).for_each(|(b, d)| *b += d);
        }
        if settled {
            break;
        }
    }
    Ok(())
}

/// One pass over `tokens`, recording what calibration needs.
fn calibration_pass(model: &Transformer, tokens: &[u32]) -> Result<crate::Calibration> {
    let c = model.config();
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
        return Err(ModelError::Input(format!(
            "calibration token {bad} is outside the vocabulary"
        )));
    }
    let tokens = &tokens[..tokens.len().min(c.context_length)];
    let (mut kv, tables) = KvCache::for_sequence(c, tokens.len());
    let seqs = [BatchSeq {
        n_tokens: tokens.len(),
        start_pos: 0,
        block_tables: &tables,
        logits: LogitsWanted::Last,
    }];
    let mut scratch = ForwardScratch::default();
    scratch.set_calibrate(true);
    model.forward(
        &ForwardBatch {
            tokens,
            seqs: &seqs,
        },
        &mut kv,
        &mut scratch,
    );
    Ok(scratch.calibration().cloned().unwrap_or_default())
}

/// A bias to add to `scores` (`[tokens, experts]`) so that each expert is among about as many
/// tokens' `top_k` as any other.
pub fn balancing_bias(scores: &[f32], experts: usize, top_k: usize) -> Vec<f32> {
    let tokens = scores.len() / experts;
    let mut bias = vec![0f32; experts];
    if tokens == 0 {
        return bias;
    }
    let mean_score = scores.iter().sum::<f32>() / scores.len() as f32;
    let spread = (scores.iter().map(|s| (s - mean_score).powi(2)).sum::<f32>()
        / scores.len() as f32)
        .sqrt()
        .max(1e-6);
    let fair = (tokens * top_k) as f32 / experts as f32;
    let mut step = 0.1 * spread;
    let mut best = (f32::MAX, bias.clone());
    for _ in 0..300 {
        let loads = loads(scores, &bias, experts, top_k);
        let worst = loads.iter().fold(0f32, |m, &l| m.max(l)) / fair;
        debug_assert_eq!(worst, worst_load(scores, &bias, experts, top_k));
        if worst < best.0 {
            best = (worst, bias.clone());
        }
        if worst <= TOLERANCE {
            break;
        }
        for (b, l) in bias.iter_mut().zip(&loads) {
            *b += step * (fair - l) / fair;
        }
        step *= 0.99;
    }
    best.1
}

/// The busiest expert's tokens over the fair share, with `bias` added to the scores.
fn worst_load(scores: &[f32], bias: &[f32], experts: usize, top_k: usize) -> f32 {
    let fair = (scores.len() / experts * top_k) as f32 / experts as f32;
    let loads = loads(scores, bias, experts, top_k);
    loads.iter().fold(0f32, |m, &l| m.max(l)) / fair.max(1.0)
}

/// Tokens whose `top_k` includes each expert, with `bias` added to the scores.
fn loads(scores: &[f32], bias: &[f32], experts: usize, top_k: usize) -> Vec<f32> {
    let mut loads = vec![0f32; experts];
    let mut row = vec![0f32; experts];
    for s in scores.chunks_exact(experts) {
        row.iter_mut()
            .zip(s.iter().zip(bias))
            .for_each(|(r, (s, b))| *r = s + b);
        for _ in 0..top_k {
            let (e, _) = row
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |m, (i, &v)| if v > m.1 { (i, v) } else { m },
                );
            loads[e] += 1.0;
            row[e] = f32::NEG_INFINITY;
        }
    }
    loads
}

/// `base`'s tensors, with `table`'s F32 values (of shapes `dims`) in place of or beside them.
struct Overlay<'a> {
    base: &'a dyn WeightSource,
    table: &'a HashMap<String, Vec<f32>>,
    dims: &'a HashMap<String, Vec<usize>>,
}

impl WeightSource for Overlay<'_> {
    fn tensor(&self, name: &str) -> Result<Option<TensorData<'_>>> {
        let Some(values) = self.table.get(name) else {
            return self.base.tensor(name);
        };
        let dims = (self.dims.get(name).cloned())
            .ok_or_else(|| ModelError::Input(format!("no shape planned for `{name}`")))?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(Some(TensorData {
            format: WeightFormat::Ggml(GgmlDType::F32),
            dims,
            bytes: Cow::Owned(bytes),
        }))
    }

    fn contains(&self, name: &str) -> bool {
        self.table.contains_key(name) || self.base.contains(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balancing_spreads_tokens_that_all_prefer_one_expert() {
        // 64 tokens, 4 experts, top-1: expert 0 wins every token by a margin, and the
        // runner-up varies.
        let scores: Vec<f32> = (0..64)
            .flat_map(|t| {
                let mut row = vec![0f32; 4];
                row[0] = 2.0;
                row[1 + t % 3] = 1.0 + (t as f32) / 64.0;
                row
            })
            .collect();
        assert_eq!(loads(&scores, &[0.0; 4], 4, 1), [64.0, 0.0, 0.0, 0.0]);
        let bias = balancing_bias(&scores, 4, 1);
        let after = loads(&scores, &bias, 4, 1);
        let max = after.iter().fold(0f32, |m, &l| m.max(l));
        assert!(max <= 16.0 * TOLERANCE + 1.0, "{after:?}");
    }
}
