//! GGML block formats with Osprey's own kernels, and the 8-bit activation rows they multiply.
//!
//! The layouts are ggml's, byte for byte, so GGUF tensor data is used as stored.

use half::f16;

/// Elements per quantization block for the 32-element formats.
pub const QK: usize = 32;

/// ggml `Q4_1`: 32 weights as `d * q + m`, `q` in 0..16. Byte `j` of `qs` holds element `j`
/// in its low nibble and element `j + 16` in its high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Offset (the block minimum).
    pub m: f16,
    /// Packed nibbles.
    pub qs: [u8; QK / 2],
}

/// A 32-element sub-block of ggml `Q4_K` as `d * q + m`, `q` in 0..16, nibbles laid out as in
/// [`BlockQ4_1`]: `d` is the super-block's scale times the sub-block's 6-bit scale, `m` minus
/// its minimum times the 6-bit minimum, both exact in `f32`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ4F {
    /// Scale.
    pub d: f32,
    /// Offset.
    pub m: f32,
    /// Packed nibbles.
    pub qs: [u8; QK / 2],
}

/// Bytes of a ggml `Q4_K` super-block (256 elements).
const Q4_K_BYTES: usize = 2 + 2 + 12 + 128;

impl BlockQ4F {
    /// ggml `Q4_K` tensor bytes as sub-blocks, 8 per super-block, in order.
    pub fn from_q4_k(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(bytes.len() / Q4_K_BYTES * 8 * 24);
        for sb in bytes.chunks_exact(Q4_K_BYTES) {
            let d = f16::from_le_bytes([sb[0], sb[1]]).to_f32();
            let dmin = f16::from_le_bytes([sb[2], sb[3]]).to_f32();
            let (scales, qs) = (&sb[4..16], &sb[16..]);
            for j in 0..8 {
                // ggml's `get_scale_min_k4`.
                let (sc, m) = if j < 4 {
                    (scales[j] & 63, scales[j + 4] & 63)
                } else {
                    (
                        (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4),
                        (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
                    )
                };
                // Sub-block j is the low (even j) or high (odd j) nibbles of bytes
                // 32·(j/2)..+32, element k in byte k.
                let chunk = &qs[32 * (j / 2)..32 * (j / 2) + 32];
                let nib = |k: usize| match j % 2 {
                    0 => chunk[k] & 0x0f,
                    _ => chunk[k] >> 4,
                };
                out.extend_from_slice(&(d * sc as f32).to_le_bytes());
                out.extend_from_slice(&(-(dmin * m as f32)).to_le_bytes());
                out.extend((0..QK / 2).map(|k| nib(k) | (nib(k + QK / 2) << 4)));
            }
        }
        out
    }
}

/// A 32-element sub-block of ggml `Q6_K` as `d[h] * q`, `q` in -32..32 for element `k` of half
/// `h = k / 16`: the super-block's scale times each 16-element group's 8-bit scale, exact in
/// `f32`, and the 6-bit values widened to bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ6F {
    /// Scales of elements 0..16 and 16..32.
    pub d: [f32; 2],
    /// Values.
    pub qs: [i8; QK],
}

/// Bytes of a ggml `Q6_K` super-block (256 elements): `ql`, `qh`, `scales`, `d`.
const Q6_K_BYTES: usize = 128 + 64 + 16 + 2;

impl BlockQ6F {
    /// ggml `Q6_K` tensor bytes as sub-blocks, 8 per super-block, in order.
    pub fn from_q6_k(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(bytes.len() / Q6_K_BYTES * 8 * 40);
        for sb in bytes.chunks_exact(Q6_K_BYTES) {
            let (ql, rest) = sb.split_at(128);
            let (qh, rest) = rest.split_at(64);
            let (scales, d) = rest.split_at(16);
            let d = f16::from_le_bytes([d[0], d[1]]).to_f32();
            // ggml's `dequantize_row_q6_K`: each half of 128 takes 64 bytes of low nibbles and
            // 32 of high bits; element 32i + l of a half is nibble (i / 2) of ql[l + 32(i % 2)]
            // with bits 2i..2i+2 of qh[l] above it.
            let mut q = [0i8; 256];
            for half in 0..2 {
                let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
                for l in 0..32 {
                    for i in 0..4 {
                        let low = (ql[l + 32 * (i % 2)] >> (4 * (i / 2))) & 0x0f;
                        let high = (qh[l] >> (2 * i)) & 3;
                        q[128 * half + 32 * i + l] = (low | (high << 4)) as i8 - 32;
                    }
                }
            }
            for (j, values) in q.chunks_exact(QK).enumerate() {
                for h in 0..2 {
                    let scale = d * scales[2 * j + h] as i8 as f32;
                    out.extend_from_slice(&scale.to_le_bytes());
                }
                out.extend(values.iter().map(|&v| v as u8));
            }
        }
        out
    }
}

/// ggml `Q8_0`: 32 weights as `d * q`, `q` in -127..=127.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quantized values.
    pub qs: [i8; QK],
}

impl Default for BlockQ8_0 {
    fn default() -> Self {
        Self {
            d: f16::ZERO,
            qs: [0; QK],
        }
    }
}

const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ4F>() == 24);

impl BlockQ4_1 {
    /// Dequantizes into 32 floats.
    pub fn to_f32(&self, out: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (j, &b) in self.qs.iter().enumerate() {
            out[j] = (b & 0x0f) as f32 * d + m;
            out[j + QK / 2] = (b >> 4) as f32 * d + m;
        }
    }
}

impl BlockQ8_0 {
    /// Dequantizes into 32 floats.
    pub fn to_f32(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }
}

/// Copies GGUF tensor bytes into owned, aligned memory as `B`s.
///
/// `B` must be a `repr(C)` plain-old-data block type for which every bit pattern is valid (the
/// GGML block types are).
pub fn blocks_from_bytes<B>(bytes: &[u8]) -> Vec<B> {
    let size = std::mem::size_of::<B>();
    assert_eq!(bytes.len() % size, 0, "tensor bytes are not whole blocks");
    let n = bytes.len() / size;
    let mut out = Vec::<B>::with_capacity(n);
    // SAFETY: `out` has capacity for `n` blocks, all of whose bytes are written before
    // `set_len`, and every bit pattern is a valid `B` (see above).
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr().cast::<u8>(), bytes.len());
        out.set_len(n);
    }
    out
}

/// Block `index` of GGUF tensor bytes (which need not be aligned for `B`).
pub fn read_block<B: Copy>(bytes: &[u8], index: usize) -> B {
    let size = std::mem::size_of::<B>();
    let at = &bytes[index * size..(index + 1) * size];
    // SAFETY: `at` holds exactly one `B`'s bytes; every bit pattern is a valid block.
    unsafe { std::ptr::read_unaligned(at.as_ptr().cast::<B>()) }
}

/// Rows of activations quantized to 8 bits in blocks of 32 (ggml's `Q8_1`, with the scale
/// and the scaled block sum kept as `f32` in separate arrays for the SIMD kernels).
#[derive(Default)]
pub struct QuantizedRows {
    /// Elements per row (a multiple of 32).
    pub cols: usize,
    /// Quantized values, row-major.
    pub qs: Vec<i8>,
    /// Per-block scale `d`, so an element is `d * q`.
    pub d: Vec<f32>,
    /// Per-block `d * sum(q)`, which `Q4_1`'s offset term needs.
    pub s: Vec<f32>,
}

/// One row of a [`QuantizedRows`].
#[derive(Clone, Copy)]
pub struct QuantizedRow<'a> {
    /// Quantized values.
    pub qs: &'a [i8],
    /// Per-block scales.
    pub d: &'a [f32],
    /// Per-block scaled sums.
    pub s: &'a [f32],
}

impl QuantizedRows {
    /// Quantizes `rows` rows of `cols` floats each (`cols` a multiple of 32), reusing storage;
    /// several rows are split over the thread pool.
    pub fn quantize(&mut self, x: &[f32], cols: usize) {
        use rayon::prelude::*;
        debug_assert_eq!(cols % QK, 0);
        let rows = x.len() / cols;
        let blocks = rows * cols / QK;
        self.cols = cols;
        self.qs.resize(rows * cols, 0);
        self.d.resize(blocks, 0.0);
        self.s.resize(blocks, 0.0);
        let bpr = cols / QK;
        // Rows per task: a few thousand values; a decode step's rows stay on this thread.
        let per_task = 4096usize.div_ceil(cols).max(1);
        if rows <= per_task {
            return quantize_rows(x, &mut self.qs, &mut self.d, &mut self.s);
        }
        (x.par_chunks(per_task * cols))
            .zip(self.qs.par_chunks_mut(per_task * cols))
            .zip(self.d.par_chunks_mut(per_task * bpr))
            .zip(self.s.par_chunks_mut(per_task * bpr))
            .for_each(|(((x, qs), d), s)| quantize_rows(x, qs, d, s));
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.qs.len().checked_div(self.cols).unwrap_or(0)
    }

    /// Row `r`.
    pub fn row(&self, r: usize) -> QuantizedRow<'_> {
        let bpr = self.cols / QK;
        QuantizedRow {
            qs: &self.qs[r * self.cols..(r + 1) * self.cols],
            d: &self.d[r * bpr..(r + 1) * bpr],
            s: &self.s[r * bpr..(r + 1) * bpr],
        }
    }
}

/// Quantizes rows `x` block by block into `qs`, with each block's scale in `d` and scaled sum
/// in `s`.
fn quantize_rows(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let blocks = x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK));
    for ((xb, qb), (d, s)) in blocks.zip(d.iter_mut().zip(s.iter_mut())) {
        let (xb, qb) = (
            xb.try_into().expect("a block"),
            qb.try_into().expect("a block"),
        );
        (*d, *s) = quantize_block(xb, qb);
    }
}

/// Quantizes one block of 32 values to bytes: returns its scale `d = max|x| / 127` and
/// `d · Σq`. Values round half to even, like ggml's AVX2 quantizer; the AVX2 path gives the
/// same bits as the scalar one.
#[inline]
pub fn quantize_block(x: &[f32; QK], q: &mut [i8; QK]) -> (f32, f32) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    {
        use std::arch::x86_64::*;
        // SAFETY: AVX2 is enabled at compile time; the loads and stores stay inside the two
        // 32-element arrays.
        unsafe {
            let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
            let sign = _mm256_set1_ps(-0.0);
            let abs = v.map(|v| _mm256_andnot_ps(sign, v));
            let m = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            // `cvtps` rounds half to even (the default rounding mode).
            let i = v.map(|v| _mm256_cvtps_epi32(_mm256_mul_ps(v, _mm256_set1_ps(id))));
            let sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
            let sum: [i32; 8] = std::mem::transmute(sum);
            let sum: i32 = sum.iter().sum();
            // Pack 32 × i32 to bytes (|q| <= 127, so nothing saturates), then undo the
            // packs' lane interleaving.
            let w01 = _mm256_packs_epi32(i[0], i[1]);
            let w23 = _mm256_packs_epi32(i[2], i[3]);
            let b = _mm256_packs_epi16(w01, w23);
            let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(q.as_mut_ptr().cast(), b);
            (d, d * sum as f32)
        }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
    quantize_block_scalar(x, q)
}

/// [`quantize_block`] one value at a time.
pub fn quantize_block_scalar(x: &[f32; QK], q: &mut [i8; QK]) -> (f32, f32) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
        sum += *q as i32;
    }
    (d, d * sum as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SIMD quantizer gives the scalar one's bits: values at every scale, halves that
    /// round to even, an all-zero block, and rows split over threads like a single row.
    #[test]
    fn quantizing_gives_the_same_bits_everywhere() {
        let mut seed = 0x9e37_79b9_u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as f32 / u32::MAX as f32 - 0.5
        };
        let mut x: Vec<f32> = (0..64 * QK).map(|i| next() * (1 + i % 7) as f32).collect();
        x[..QK].fill(0.0);
        // A block whose values land on halves: 127 / 2.54 = 50 per unit, so ±0.01 is ±0.5.
        for (k, v) in x[QK..2 * QK].iter_mut().enumerate() {
            *v = if k == 0 {
                2.54
            } else {
                0.01 * (k as f32 - 16.0)
            };
        }
        for (xb, _) in x.chunks_exact(QK).zip(0..) {
            let (mut a, mut b) = ([0i8; QK], [0i8; QK]);
            let xb: &[f32; QK] = xb.try_into().unwrap();
            assert_eq!(
                quantize_block(xb, &mut a),
                quantize_block_scalar(xb, &mut b)
            );
            assert_eq!(a, b);
        }
        let cols = 4 * QK;
        let (mut all, mut one) = (QuantizedRows::default(), QuantizedRows::default());
        all.quantize(&x, cols);
        for r in 0..x.len() / cols {
            one.quantize(&x[r * cols..(r + 1) * cols], cols);
            let (a, b) = (all.row(r), one.row(0));
            assert_eq!((a.qs, a.d, a.s), (b.qs, b.d, b.s));
        }
    }
}
