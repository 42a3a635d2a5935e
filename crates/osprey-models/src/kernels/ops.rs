//! Element-wise and row-wise operations of the transformer block.
//!
//! Written as plain loops over slices that LLVM vectorizes for the target CPU; each row is
//! processed independently, so results never depend on the batch.

use crate::config::{RopeConfig, RopeStyle};

/// `out = x / rms(x) * weight`, row by row (rows of `weight.len()`).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        // Sum of squares in f64, as ggml does: 576+ terms in f32 lose digits.
        let ss: f64 = xr.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let scale = 1.0 / ((ss / d as f64) as f32 + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// RMSNorm of every `weight.len()`-wide piece of `x`, in place: the per-head norm of Q and K.
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let d = weight.len();
    for xr in x.chunks_exact_mut(d) {
        let ss: f64 = xr.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let scale = 1.0 / ((ss / d as f64) as f32 + eps).sqrt();
        for (v, &w) in xr.iter_mut().zip(weight) {
            *v *= scale * w;
        }
    }
}

/// `x += y`.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Adds `bias` to every row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_assign(row, bias);
    }
}

/// SwiGLU: for each row of `gate_up` (`[gate | up]`, each `ffn` wide),
/// `out = silu(gate) * up`.
pub fn swiglu(gate_up: &[f32], ffn: usize, out: &mut [f32]) {
    for (gu, o) in gate_up.chunks_exact(2 * ffn).zip(out.chunks_exact_mut(ffn)) {
        let (g, u) = gu.split_at(ffn);
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + exp(-g)) * u;
        }
    }
}

/// GeGLU: for each row of `gate_up` (`[gate | up]`, each `ffn` wide),
/// `out = gelu(gate) * up`, with GELU's tanh approximation (as Gemma and ggml's `gelu`).
pub fn geglu(gate_up: &[f32], ffn: usize, out: &mut [f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (gu, o) in gate_up.chunks_exact(2 * ffn).zip(out.chunks_exact_mut(ffn)) {
        let (g, u) = gu.split_at(ffn);
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            // 0.5·(1 + tanh(z)) = 1 / (1 + e^(−2z)), with Osprey's `exp` (libm's `tanh` was 8%
            // of a Gemma prompt's time).
            let z = SQRT_2_OVER_PI * g * (1.0 + 0.044_715 * g * g);
            *o = g / (1.0 + exp(-2.0 * z)) * u;
        }
    }
}

/// Squashes every value into `±cap`: `cap · tanh(x / cap)`.
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = cap * (*v / cap).tanh();
    }
}

/// Cosines and sines of the rotary angles for a batch of positions: `[pos][i]` for the
/// `rope.dims / 2` frequency pairs.
pub struct RopeTable {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    /// Angles for each position in `positions`.
    pub fn new(rope: &RopeConfig, positions: impl Iterator<Item = usize>) -> Self {
        let half = rope.dims / 2;
        let inv_freqs: Vec<f64> = (0..half)
            .map(|i| {
                let f = (rope.base as f64).powf(-2.0 * i as f64 / rope.dims as f64);
                f / rope.freq_factors.as_ref().map_or(1.0, |ff| ff[i] as f64)
            })
            .collect();
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for pos in positions {
            let p = pos as f64 / rope.linear_factor as f64;
            for &inv_freq in &inv_freqs {
                let (s, c) = (p * inv_freq).sin_cos();
                cos.push(c as f32);
                sin.push(s as f32);
            }
        }
        Self { half, cos, sin }
    }

    /// Rotates every head in row `t` of `x` (heads of `head_dim`, laid out back to back).
    pub fn apply(&self, style: RopeStyle, t: usize, head_dim: usize, x: &mut [f32]) {
        let cos = &self.cos[t * self.half..(t + 1) * self.half];
        let sin = &self.sin[t * self.half..(t + 1) * self.half];
        for head in x.chunks_exact_mut(head_dim) {
            match style {
                RopeStyle::Interleaved => {
                    for (i, pair) in head[..2 * self.half].chunks_exact_mut(2).enumerate() {
                        let (a, b) = (pair[0], pair[1]);
                        pair[0] = a * cos[i] - b * sin[i];
                        pair[1] = a * sin[i] + b * cos[i];
                    }
                }
                RopeStyle::Neox => {
                    let (lo, hi) = head[..2 * self.half].split_at_mut(self.half);
                    for i in 0..self.half {
                        let (a, b) = (lo[i], hi[i]);
                        lo[i] = a * cos[i] - b * sin[i];
                        hi[i] = a * sin[i] + b * cos[i];
                    }
                }
            }
        }
    }
}

/// `e^x` in f32, branch-free so loops over it vectorize (relative error below 2e-7).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5 * 2^23 rounds to an integer (ties to even) held in the low mantissa bits, so
    // `n` comes out as both a float and an integer without a float-to-int conversion (Rust's
    // saturating `as i32` does not vectorize on AVX2).
    const SHIFTER: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.7);
    let t = x * LOG2E + SHIFTER;
    let n = t - SHIFTER;
    let n_bits = t.to_bits().wrapping_sub(SHIFTER.to_bits());
    let r = x - n * LN2_HI - n * LN2_LO;
    // Minimax polynomial for e^r on [-ln2/2, ln2/2] (Cephes expf).
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    f32::from_bits(e.to_bits().wrapping_add(n_bits << 23))
}

/// In-place softmax of `x`.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = exp(*v - max);
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geglu_matches_the_tanh_definition() {
        let gate_up: Vec<f32> = (-400..400)
            .map(|i| i as f32 / 40.0)
            .chain(std::iter::repeat_n(1.5, 800))
            .collect();
        let mut out = vec![0f32; 800];
        geglu(&gate_up, 800, &mut out);
        for (i, &o) in out.iter().enumerate() {
            let g = gate_up[i] as f64;
            let z = (2.0 / std::f64::consts::PI).sqrt() * g * (1.0 + 0.044_715 * g * g);
            let want = 0.5 * g * (1.0 + z.tanh()) * 1.5;
            assert!(
                (o as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
                "gelu({g}) · 1.5 = {o}, want {want}"
            );
        }
    }

    #[test]
    fn exp_matches_std() {
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x < 88.0 {
            let rel = ((exp(x) - x.exp()) / x.exp()).abs();
            worst = worst.max(rel);
            x += 0.0137;
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
        assert_eq!(exp(-1000.0), exp(-87.3));
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1.0, 2.0, 3.0, -50.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[2] > x[1] && x[1] > x[0]);
    }

    #[test]
    fn rope_rotates_pairs_by_position() {
        let rope = RopeConfig {
            base: 10_000.0,
            dims: 4,
            style: RopeStyle::Interleaved,
            linear_factor: 1.0,
            freq_factors: None,
        };
        let table = RopeTable::new(&rope, [0usize, 1].into_iter());
        let mut x = vec![1.0, 0.0, 1.0, 0.0];
        table.apply(RopeStyle::Interleaved, 0, 4, &mut x);
        assert_eq!(x, vec![1.0, 0.0, 1.0, 0.0], "position 0 is the identity");
        table.apply(RopeStyle::Interleaved, 1, 4, &mut x);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
        let f = 10_000f32.powf(-0.5);
        assert!((x[2] - f.cos()).abs() < 1e-6 && (x[3] - f.sin()).abs() < 1e-6);
    }
}
