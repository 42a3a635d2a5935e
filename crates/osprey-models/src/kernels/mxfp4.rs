//! MXFP4 (OCP Microscaling, FP4 elements): blocks of 32 `e2m1` values sharing one `E8M0`
//! power-of-two scale, and the kernel that multiplies them without dequantizing to memory.
//!
//! An element is a 4-bit float: sign, two exponent bits, one mantissa bit, so its magnitudes are
//! `0, 0.5, 1, 1.5, 2, 3, 4, 6`. A block stores 16 bytes of nibbles and one scale byte `e`
//! meaning `2^(e - 127)`: 17 bytes for 32 weights (4.25 bits each).
//!
//! The kernel uses that twice an `e2m1` magnitude is an integer (`0, 1, 2, 3, 4, 6, 8, 12`): a
//! byte shuffle turns 32 nibbles into 32 signed 8-bit integers at once (the lookup of the 16
//! `e2m1` values), which then multiply the 8-bit activations exactly like `Q8_0` weights; the
//! block's float result is scaled by `2^(e - 128)`. Weights are repacked into the same 8-row
//! tiles as `Q4_1` ([`super::tiles`]), so batches decode each tile once for several rows.

use super::blocks::{QK, QuantizedRow};
use super::tiles::{TILE_ROWS, Tile, interleave_nibbles, nibble};

/// The 16 `e2m1` codes as floats: bit 3 is the sign.
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Twice each `e2m1` code, as the integers the kernel multiplies.
const E2M1_X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Largest `e2m1` magnitude.
const E2M1_MAX: f32 = 6.0;

/// One MXFP4 block in ggml's layout: byte `j` of `qs` holds element `j` in its low nibble and
/// element `j + 16` in its high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockMxfp4 {
    /// Shared scale, `2^(e - 127)` (E8M0).
    pub e: u8,
    /// Packed `e2m1` codes.
    pub qs: [u8; QK / 2],
}

const _: () = assert!(std::mem::size_of::<BlockMxfp4>() == 17);

/// The value of an E8M0 scale byte (`e = 255`, NaN in the format, is never written).
pub fn e8m0_to_f32(e: u8) -> f32 {
    (f32::from(e) - 127.0).exp2()
}

/// The `e2m1` code nearest to `v` (a value already divided by the block scale), saturating at 6.
fn nearest_code(v: f32) -> u8 {
    let m = v.abs();
    // Midpoints between consecutive magnitudes; a tie goes to the even code (lower mantissa).
    let code = match m {
        m if m <= 0.25 => 0,
        m if m < 0.75 => 1,
        m if m <= 1.25 => 2,
        m if m < 1.75 => 3,
        m if m <= 2.5 => 4,
        m if m < 3.5 => 5,
        m if m <= 5.0 => 6,
        _ => 7,
    };
    if v.is_sign_negative() && code != 0 {
        code | 8
    } else {
        code
    }
}

impl BlockMxfp4 {
    /// Quantizes 32 floats. The scale is the smallest power of two that puts the largest
    /// magnitude within `e2m1`'s range (`amax / scale <= 6`): nothing saturates and every
    /// element is off by at most half the gap between its neighbouring codes. (OCP's rule,
    /// half that scale, saturates the largest elements; on SmolLM2 it and a per-block
    /// least-squares choice between the two both gave a higher perplexity.)
    pub fn quantize(x: &[f32]) -> Self {
        assert_eq!(x.len(), QK, "an MXFP4 block has 32 elements");
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        if !(amax > 0.0 && amax.is_finite()) {
            return Self::with_exponent(x, -127.0);
        }
        Self::with_exponent(x, (amax / E2M1_MAX).log2().ceil().clamp(-126.0, 127.0))
    }

    /// The block of `x` at scale `2^exp`, each element rounded to the nearest code.
    pub fn with_exponent(x: &[f32], exp: f32) -> Self {
        let inv = (-exp).exp2();
        let mut qs = [0u8; QK / 2];
        for (j, q) in qs.iter_mut().enumerate() {
            *q = nearest_code(x[j] * inv) | (nearest_code(x[j + QK / 2] * inv) << 4);
        }
        Self {
            e: (exp + 127.0) as u8,
            qs,
        }
    }

    /// Sum of squared differences between this block's values and `x`.
    pub fn squared_error(&self, x: &[f32]) -> f32 {
        let mut y = [0f32; QK];
        self.to_f32(&mut y);
        x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum()
    }

    /// Dequantizes into 32 floats.
    pub fn to_f32(&self, out: &mut [f32]) {
        let d = e8m0_to_f32(self.e);
        for (j, &b) in self.qs.iter().enumerate() {
            out[j] = E2M1[(b & 0x0f) as usize] * d;
            out[j + QK / 2] = E2M1[(b >> 4) as usize] * d;
        }
    }

    /// The block from the OCP byte order of safetensors checkpoints (element `2i` in the low
    /// nibble of byte `i`, `2i + 1` in the high nibble).
    pub fn from_ocp(e: u8, packed: &[u8]) -> Self {
        let code = |k: usize| (packed[k / 2] >> (4 * (k % 2))) & 0x0f;
        Self {
            e,
            qs: std::array::from_fn(|j| code(j) | (code(j + QK / 2) << 4)),
        }
    }

    /// This block's codes in the OCP byte order (see [`Self::from_ocp`]).
    pub fn to_ocp(&self) -> [u8; QK / 2] {
        let code = |k: usize| {
            let b = self.qs[k % (QK / 2)];
            if k < QK / 2 { b & 0x0f } else { b >> 4 }
        };
        std::array::from_fn(|i| code(2 * i) | (code(2 * i + 1) << 4))
    }
}

/// Eight rows' MXFP4 blocks, nibbles interleaved as in [`super::tiles::TileQ4_1`]: chunk `p`
/// (32 bytes) holds bytes `4p..4p+4` of each row's `qs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TileMxfp4 {
    /// Per-row scale bytes.
    pub e: [u8; TILE_ROWS],
    /// Interleaved nibbles: `[chunk p][row r][byte j]`.
    pub qs: [u8; 16 * TILE_ROWS],
}

const _: () = assert!(std::mem::size_of::<TileMxfp4>() == 8 * std::mem::size_of::<BlockMxfp4>());

impl Tile for TileMxfp4 {
    type Block = BlockMxfp4;

    fn pack(rows: [&BlockMxfp4; TILE_ROWS]) -> Self {
        TileMxfp4 {
            e: rows.map(|b| b.e),
            qs: interleave_nibbles(rows.map(|b| &b.qs)),
        }
    }

    fn value(&self, r: usize, k: usize) -> f32 {
        E2M1[nibble(&self.qs, r, k) as usize] * e8m0_to_f32(self.e[r])
    }

    #[inline]
    fn dot<const R: usize>(tiles: &[Self], acts: &[QuantizedRow; R]) -> [[f32; TILE_ROWS]; R] {
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        // SAFETY: the features are enabled at compile time; `matmul` passes activation rows
        // of `tiles.len()` blocks.
        unsafe {
            avx2::dot(tiles, acts)
        }
        #[cfg(not(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        )))]
        portable_dot(tiles, acts)
    }
}

/// `2^(e - 128)`: the block scale times the ½ that undoes [`E2M1_X2`]'s doubling.
fn half_scale(e: u8) -> f32 {
    e8m0_to_f32(e) * 0.5
}

/// The scalar kernel (CPUs without AVX2), summing in the same order as the SIMD one.
#[cfg_attr(
    all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ),
    allow(dead_code)
)]
fn portable_dot<const R: usize>(
    tiles: &[TileMxfp4],
    acts: &[QuantizedRow; R],
) -> [[f32; TILE_ROWS]; R] {
    std::array::from_fn(|i| {
        let a = &acts[i];
        std::array::from_fn(|r| {
            let mut acc = 0f32;
            for (b, t) in tiles.iter().enumerate() {
                let mut isum = 0i32;
                for p in 0..4 {
                    for j in 0..4 {
                        let byte = t.qs[p * 32 + r * 4 + j];
                        let (lo, hi) = (
                            E2M1_X2[(byte & 0x0f) as usize],
                            E2M1_X2[(byte >> 4) as usize],
                        );
                        isum += lo as i32 * a.qs[b * QK + 4 * p + j] as i32;
                        isum += hi as i32 * a.qs[b * QK + 16 + 4 * p + j] as i32;
                    }
                }
                acc = (half_scale(t.e[r]) * a.d[b]).mul_add(isum as f32, acc);
            }
            acc
        })
    })
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod avx2 {
    use std::arch::x86_64::*;

    use super::*;

    /// Activation bytes `at..at+4` broadcast to every 32-bit lane.
    #[inline(always)]
    unsafe fn group(a: *const i8, at: usize) -> __m256i {
        // SAFETY: callers pass `at + 4 <= 32` within a block of the activation row.
        unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(a.add(at).cast::<i32>())) }
    }

    /// `Σ w·a` over byte pairs into 16-bit lanes, for signed `w` and `a` (`maddubs` wants an
    /// unsigned left operand: `|w|`, with `w`'s sign moved onto `a`).
    #[inline(always)]
    unsafe fn signed_maddubs(w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: AVX2 is enabled at compile time (this module's cfg).
        unsafe { _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w)) }
    }

    #[inline(always)]
    pub unsafe fn dot<const R: usize>(
        tiles: &[TileMxfp4],
        acts: &[QuantizedRow; R],
    ) -> [[f32; TILE_ROWS]; R] {
        unsafe {
            for a in acts {
                debug_assert!(a.qs.len() >= tiles.len() * QK && a.d.len() >= tiles.len());
            }
            let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(E2M1_X2.as_ptr().cast()));
            let low = _mm256_set1_epi8(0x0f);
            let ones = _mm256_set1_epi16(1);
            let half = _mm256_set1_ps(0.5);
            let mut acc = [_mm256_setzero_ps(); R];
            for (b, t) in tiles.iter().enumerate() {
                // E8M0 → f32: the byte is the float's exponent field (e = 0 reads as 0).
                let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(t.e.as_ptr().cast()));
                let d = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(e, 23)), half);
                // Sums of 8 maddubs pairs stay within i16: 8 * 2 * 12 * 127 = 24384.
                let mut sum16 = [_mm256_setzero_si256(); R];
                for p in 0..4 {
                    let raw = _mm256_loadu_si256(t.qs.as_ptr().add(32 * p).cast());
                    let lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(raw, low));
                    let hi =
                        _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(raw, 4), low));
                    for r in 0..R {
                        let a = acts[r].qs.as_ptr().add(b * QK);
                        let s = _mm256_add_epi16(
                            signed_maddubs(lo, group(a, 4 * p)),
                            signed_maddubs(hi, group(a, 16 + 4 * p)),
                        );
                        sum16[r] = _mm256_add_epi16(sum16[r], s);
                    }
                }
                for r in 0..R {
                    let isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(sum16[r], ones));
                    let dd = _mm256_mul_ps(d, _mm256_set1_ps(*acts[r].d.get_unchecked(b)));
                    acc[r] = _mm256_fmadd_ps(dd, isum, acc[r]);
                }
            }
            acc.map(|v| std::mem::transmute::<__m256, [f32; TILE_ROWS]>(v))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Half the gap between the two codes around magnitude `m` (in units of the scale).
    fn half_gap(m: f32) -> f32 {
        match m {
            m if m <= 2.0 => 0.25,
            m if m <= 4.0 => 0.5,
            _ => 1.0,
        }
    }

    fn block(seed: u32, spread: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..QK)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * spread
            })
            .collect()
    }

    #[test]
    fn round_trip_error_is_bounded_per_block() {
        for seed in 0..2000 {
            let spread = [1e-6, 0.02, 1.0, 300.0][seed as usize % 4];
            let x = block(seed, spread);
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            // The non-saturating scale: every element within half a code gap.
            let exp = (amax / 6.0).log2().ceil();
            let wide = BlockMxfp4::with_exponent(&x, exp);
            let scale = e8m0_to_f32(wide.e);
            assert!(
                amax / scale <= 6.0 && amax / scale > 3.0,
                "scale {scale} for amax {amax}"
            );
            let mut y = [0f32; QK];
            wide.to_f32(&mut y);
            for (a, b) in x.iter().zip(&y) {
                let bound = half_gap(a.abs() / scale) * scale;
                assert!(
                    (a - b).abs() <= bound * 1.0001,
                    "{a} -> {b} (bound {bound})"
                );
            }
            assert_eq!(BlockMxfp4::quantize(&x), wide);
            assert!(wide.squared_error(&x).sqrt() <= amax / 3.0 * (QK as f32).sqrt());
        }
    }

    #[test]
    fn the_fused_kernel_matches_dequantized_weights() {
        use crate::kernels::matmul::{QMatrix, WeightFormat};
        let (rows, cols) = (21, 96);
        let w: Vec<f32> = (0..rows * cols / QK)
            .flat_map(|b| block(b as u32, 2.0))
            .collect();
        let bytes: Vec<u8> = w
            .chunks_exact(QK)
            .flat_map(|b| {
                let q = BlockMxfp4::quantize(b);
                std::iter::once(q.e).chain(q.qs)
            })
            .collect();
        let m = QMatrix::from_bytes(WeightFormat::Mxfp4, rows, cols, &bytes).unwrap();
        let x: Vec<f32> = (0..5 * cols)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.1)
            .collect();
        let mut out = vec![0f32; 5 * rows];
        m.matmul(&x, &mut out);
        let mut row = vec![0f32; cols];
        for j in 0..rows {
            m.row_to_f32(j, &mut row);
            for t in 0..5 {
                let xt = &x[t * cols..(t + 1) * cols];
                let want: f32 = row.iter().zip(xt).map(|(a, b)| a * b).sum();
                let norm: f32 = row.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
                // Only the activations' 8-bit quantization separates the two.
                assert!((out[t * rows + j] - want).abs() <= 0.01 * norm, "{j},{t}");
            }
        }
        // A row alone gives the same bits as in the batch.
        let mut one = vec![0f32; rows];
        m.matmul(&x[2 * cols..3 * cols], &mut one);
        assert_eq!(one, out[2 * rows..3 * rows]);
    }

    #[test]
    fn exact_codes_survive_and_zero_blocks_stay_zero() {
        let x: Vec<f32> = (0..QK).map(|k| E2M1[k % 16] * 0.25).collect();
        let mut y = [1f32; QK];
        BlockMxfp4::quantize(&x).to_f32(&mut y);
        assert_eq!(x, y);
        BlockMxfp4::quantize(&[0.0; QK]).to_f32(&mut y);
        assert!(y.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn ocp_byte_order_round_trips() {
        let b = BlockMxfp4::quantize(&block(7, 2.0));
        assert_eq!(BlockMxfp4::from_ocp(b.e, &b.to_ocp()), b);
        // OCP order: element 0 low nibble, element 1 high nibble of byte 0.
        let ocp = b.to_ocp();
        assert_eq!(ocp[0] & 0x0f, b.qs[0] & 0x0f);
        assert_eq!(ocp[0] >> 4, b.qs[1] & 0x0f);
    }
}
