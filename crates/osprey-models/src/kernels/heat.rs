//! Attention heat: how much attention a query puts on each KV block of its sequence.
//!
//! The fast attention kernel never materialises softmax weights (it keeps an online softmax),
//! so heat is measured by a separate, plain pass run on sampled steps for one query row per
//! sequence and a few layers: scores against every cached key, softmax per head, weights
//! summed per block and averaged over heads. At 2 layers, a 1,000-token context and 9 heads
//! that is about 1.2 M multiply-adds per sequence.

use crate::kernels::attention::AttentionShape;
use crate::kv_cache::{BLOCK_SIZE, KvCache, NO_BLOCK};

/// The attention mass query `q` (heads first, RoPE applied) at position `pos` puts on each
/// logical block of `block_table` in layer `layer`: `ceil((pos + 1) / 16)` values summing to 1.
/// A block the table has given back ([`NO_BLOCK`], behind a window) draws none.
pub fn block_mass(
    shape: AttentionShape,
    q: &[f32],
    kv: &KvCache,
    layer: usize,
    block_table: &[u32],
    pos: usize,
) -> Vec<f32> {
    let AttentionShape {
        n_heads,
        n_kv_heads,
        head_dim: hd,
        // Heat is read over the whole context, also on a sliding-window layer.
        window: _,
    } = shape;
    let n_blocks = (pos + 1).div_ceil(BLOCK_SIZE);
    let scale = 1.0 / (hd as f32).sqrt();
    let mut mass = vec![0f32; n_blocks];
    let mut scores = vec![0f32; pos + 1];
    for h in 0..n_heads {
        let kv_head = h / (n_heads / n_kv_heads);
        let qh = &q[h * hd..(h + 1) * hd];
        scores.fill(f32::NEG_INFINITY);
        for (b, &block) in block_table[..n_blocks].iter().enumerate() {
            if block == NO_BLOCK {
                continue;
            }
            let (keys_t, _) = kv.block(layer, block, kv_head);
            let slots = BLOCK_SIZE.min(pos + 1 - b * BLOCK_SIZE);
            for s in 0..slots {
                let dot: f32 = (0..hd)
                    .map(|d| qh[d] * keys_t[d * BLOCK_SIZE + s].to_f32())
                    .sum();
                scores[b * BLOCK_SIZE + s] = dot * scale;
            }
        }
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for v in scores.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        for (b, chunk) in scores.chunks(BLOCK_SIZE).enumerate() {
            mass[b] += chunk.iter().sum::<f32>() / sum / n_heads as f32;
        }
    }
    mass
}
