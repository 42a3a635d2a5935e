//! Weights repacked into tiles of 8 rows, and the kernels that multiply them.
//!
//! A tile holds one 32-element block of 8 consecutive weight rows, interleaved 4 bytes at a
//! time so that one 256-bit register holds 4 quantized weights of each of the 8 rows. Against
//! a broadcast group of 4 activations, `maddubs` + `madd` then yield the 8 rows' partial dot
//! products in the 8 lanes: a block's dot products for 8 rows come out as one vector, with no
//! horizontal sums, and the 8 rows' scales convert with one instruction.
//!
//! The repacking changes no byte count: a `Q4_1` tile is 8 GGML `Q4_1` blocks (160 bytes), a
//! `Q8_0` tile 8 `Q8_0` blocks (272 bytes). `Q4_K` is the exception: each 32-element sub-block
//! becomes a `Q4_1`-shaped block whose scale and offset are the super-block's `d · sc` and
//! `−dmin · m`, kept exact as `f32` (a [`TileQ4F`] of 192 bytes for 144 bytes of `Q4_K`).
//! `Q6_K` widens too: each 32-element sub-block's 6-bit values become bytes, with the two
//! 16-element groups' scales as `f32` (a [`TileQ6F`] of 320 bytes for 210 of `Q6_K`).
//!
//! Every output element (one weight row against one activation row) sees the same
//! instructions in the same order, whichever other rows share the call, so results are
//! bit-identical alone or in any batch.
//!
//! On a CPU with AVX-512 VNNI (found at run time), every integer kernel but MXFP4's uses
//! `vpdpbusd`, which does `maddubs` + `madd` + the add in one instruction, and with several
//! activation rows the kernels take two tiles at once in 512-bit registers (16 rows). The
//! integer sums are exact either way, so the results are the same bits with or without it.

use half::f16;

use super::blocks::{BlockQ4_1, BlockQ4F, BlockQ6F, BlockQ8_0, QK, QuantizedRow, read_block};

/// Rows per tile.
pub const TILE_ROWS: usize = 8;

/// Eight rows' `Q4_1` blocks. Chunk `p` (32 bytes) holds, for row `r`, bytes `4p..4p+4` of that
/// row's GGML `qs`: low nibbles are elements `4p..4p+4`, high nibbles elements `16+4p..`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TileQ4_1 {
    /// Per-row scale.
    pub d: [f16; TILE_ROWS],
    /// Per-row offset.
    pub m: [f16; TILE_ROWS],
    /// Interleaved nibbles: `[chunk p][row r][byte j]`.
    pub qs: [u8; 16 * TILE_ROWS],
}

/// Eight rows' 4-bit blocks with `f32` scales and offsets ([`BlockQ4F`]: `Q4_K`'s sub-blocks),
/// nibbles as in [`TileQ4_1`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TileQ4F {
    /// Per-row scale.
    pub d: [f32; TILE_ROWS],
    /// Per-row offset.
    pub m: [f32; TILE_ROWS],
    /// Interleaved nibbles: `[chunk p][row r][byte j]`.
    pub qs: [u8; 16 * TILE_ROWS],
}

/// A tile of 4-bit values `d · q + m`, its nibbles laid out by [`interleave_nibbles`]: what the
/// one 4-bit kernel needs of [`TileQ4_1`] and [`TileQ4F`].
pub trait FourBit: Copy {
    /// The rows' scales and offsets.
    fn scales(&self) -> ([f32; TILE_ROWS], [f32; TILE_ROWS]);
    /// The interleaved nibbles.
    fn nibbles(&self) -> &[u8; 16 * TILE_ROWS];
    /// The rows' scales and offsets in two registers.
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    fn scale_vectors(&self) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256);
}

impl FourBit for TileQ4_1 {
    fn scales(&self) -> ([f32; TILE_ROWS], [f32; TILE_ROWS]) {
        (self.d.map(f16::to_f32), self.m.map(f16::to_f32))
    }

    fn nibbles(&self) -> &[u8; 16 * TILE_ROWS] {
        &self.qs
    }

    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    #[inline(always)]
    fn scale_vectors(&self) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
        use std::arch::x86_64::*;
        // SAFETY: AVX2 and F16C come with the target features this is compiled for; each
        // load reads the 16 bytes of 8 f16 values.
        unsafe {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(self.d.as_ptr().cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(self.m.as_ptr().cast())),
            )
        }
    }
}

impl FourBit for TileQ4F {
    fn scales(&self) -> ([f32; TILE_ROWS], [f32; TILE_ROWS]) {
        (self.d, self.m)
    }

    fn nibbles(&self) -> &[u8; 16 * TILE_ROWS] {
        &self.qs
    }

    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    #[inline(always)]
    fn scale_vectors(&self) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
        use std::arch::x86_64::*;
        // SAFETY: AVX is enabled at compile time; each load reads 8 f32 values.
        unsafe {
            (
                _mm256_loadu_ps(self.d.as_ptr()),
                _mm256_loadu_ps(self.m.as_ptr()),
            )
        }
    }
}

/// Eight rows' `Q8_0` blocks; group `g` (32 bytes) holds elements `4g..4g+4` of each row.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TileQ8_0 {
    /// Per-row scale.
    pub d: [f16; TILE_ROWS],
    /// Interleaved values: `[group g][row r][byte j]`.
    pub qs: [i8; QK * TILE_ROWS],
}

const _: () = assert!(std::mem::size_of::<TileQ4_1>() == 8 * std::mem::size_of::<BlockQ4_1>());
const _: () = assert!(std::mem::size_of::<TileQ8_0>() == 8 * std::mem::size_of::<BlockQ8_0>());
const _: () = assert!(std::mem::size_of::<TileQ4F>() == 8 * std::mem::size_of::<BlockQ4F>());
const _: () = assert!(std::mem::size_of::<TileQ6F>() == 8 * std::mem::size_of::<BlockQ6F>());

/// Eight rows' [`BlockQ6F`]s (`Q6_K`'s sub-blocks), values interleaved as in [`TileQ8_0`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TileQ6F {
    /// Per-row scales of elements 0..16, then of 16..32.
    pub d: [[f32; TILE_ROWS]; 2],
    /// Interleaved values: `[group g][row r][byte j]`.
    pub qs: [i8; QK * TILE_ROWS],
}

/// A weight format stored as 8-row tiles.
pub trait Tile: Copy + Send + Sync + 'static {
    /// The GGML block it is made of.
    type Block: Copy + Default;
    /// Interleaves one block of each of 8 rows (missing rows of a last partial tile are zero).
    fn pack(rows: [&Self::Block; TILE_ROWS]) -> Self;
    /// Element `k` (0..32) of row `r` of this tile, dequantized.
    fn value(&self, r: usize, k: usize) -> f32;
    /// Dot products of the tile row-run `tiles` (one tile per block of the input) with each
    /// activation row: `out[i][r]` for row `r` of the tile and activation `i`.
    fn dot<const R: usize>(tiles: &[Self], acts: &[QuantizedRow; R]) -> [[f32; TILE_ROWS]; R];

    /// [`Self::dot`] of two row-runs (`[a, b]`), the same bits as two calls. Where the CPU has
    /// 512-bit VNNI the integer kernels take both in one pass, 16 rows to a register, for
    /// several activation rows (for one, a decode step's, the 256-bit kernels are faster:
    /// measured 12% on Gemma 3's tg128).
    #[inline]
    fn dot_pair<const R: usize>(
        a: &[Self],
        b: &[Self],
        acts: &[QuantizedRow; R],
    ) -> [[[f32; TILE_ROWS]; R]; 2] {
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        if R > 1 && vnni::available() {
            // SAFETY: the CPU has AVX-512 VNNI (checked); `matmul` passes two row-runs of
            // the same length and activation rows of as many blocks.
            if let Some(out) = unsafe { Self::dot_pair_512(a, b, acts) } {
                return out;
            }
        }
        [Self::dot(a, acts), Self::dot(b, acts)]
    }

    /// The 512-bit pair kernel of this format, if it has one.
    ///
    /// # Safety
    /// The CPU must have AVX-512 VNNI, VL and BW (`vnni::available`); `a` and `b` must be
    /// as long as each other, and each activation row must hold as many blocks.
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    unsafe fn dot_pair_512<const R: usize>(
        _a: &[Self],
        _b: &[Self],
        _acts: &[QuantizedRow; R],
    ) -> Option<[[[f32; TILE_ROWS]; R]; 2]> {
        None
    }
}

/// Repacks a `rows × cols` GGML matrix (`bytes`, row-major blocks) into tiles
/// `[row tile][block]`, padding the last row tile with zero rows.
pub fn repack<T: Tile>(bytes: &[u8], rows: usize, cols: usize) -> Vec<T> {
    let bpr = cols / QK;
    let zero = T::Block::default();
    let mut out = Vec::with_capacity(rows.div_ceil(TILE_ROWS) * bpr);
    for t in 0..rows.div_ceil(TILE_ROWS) {
        for b in 0..bpr {
            let blocks: [T::Block; TILE_ROWS] = std::array::from_fn(|r| {
                let row = t * TILE_ROWS + r;
                if row < rows {
                    read_block(bytes, row * bpr + b)
                } else {
                    zero
                }
            });
            out.push(T::pack(std::array::from_fn(|r| &blocks[r])));
        }
    }
    out
}

/// Interleaves 8 rows' 16 bytes of nibbles 4 bytes at a time: chunk `p` (32 bytes) holds bytes
/// `4p..4p+4` of each row (the layout of [`TileQ4_1`] and the MXFP4 tile).
pub fn interleave_nibbles(rows: [&[u8; 16]; TILE_ROWS]) -> [u8; 16 * TILE_ROWS] {
    let mut qs = [0; 16 * TILE_ROWS];
    for p in 0..4 {
        for (r, b) in rows.iter().enumerate() {
            qs[p * 32 + r * 4..p * 32 + r * 4 + 4].copy_from_slice(&b[4 * p..4 * p + 4]);
        }
    }
    qs
}

/// Nibble `k` (0..32) of row `r` in [`interleave_nibbles`]' layout.
pub fn nibble(qs: &[u8; 16 * TILE_ROWS], r: usize, k: usize) -> u8 {
    let byte = qs[((k % 16) / 4) * 32 + r * 4 + k % 4];
    if k < 16 { byte & 0x0f } else { byte >> 4 }
}

/// The `dot` and `dot_pair_512` of a tile format whose kernels are `$dot` (in `vnni`, `avx2`
/// and `portable`) and `$pair` (in `vnni`): VNNI where the CPU has it, else the AVX2 this is
/// compiled for, else portable code.
macro_rules! tile_kernels {
    ($dot:ident, $pair:ident) => {
        #[inline]
        fn dot<const R: usize>(tiles: &[Self], acts: &[QuantizedRow; R]) -> [[f32; TILE_ROWS]; R] {
            #[cfg(all(
                target_arch = "x86_64",
                target_feature = "avx2",
                target_feature = "fma"
            ))]
            // SAFETY: AVX2 and FMA are enabled at compile time and the VNNI kernel runs only
            // where the CPU has it; `matmul` passes activation rows of `tiles.len()` blocks.
            unsafe {
                match vnni::available() {
                    true => vnni::$dot(tiles, acts),
                    false => avx2::$dot(tiles, acts),
                }
            }
            #[cfg(not(all(
                target_arch = "x86_64",
                target_feature = "avx2",
                target_feature = "fma"
            )))]
            portable::$dot(tiles, acts)
        }

        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        unsafe fn dot_pair_512<const R: usize>(
            a: &[Self],
            b: &[Self],
            acts: &[QuantizedRow; R],
        ) -> Option<[[[f32; TILE_ROWS]; R]; 2]> {
            // SAFETY: as the trait's contract says.
            Some(unsafe { vnni::$pair(a, b, acts) })
        }
    };
}

impl Tile for TileQ4_1 {
    type Block = BlockQ4_1;

    fn pack(rows: [&BlockQ4_1; TILE_ROWS]) -> Self {
        TileQ4_1 {
            d: rows.map(|b| b.d),
            m: rows.map(|b| b.m),
            qs: interleave_nibbles(rows.map(|b| &b.qs)),
        }
    }

    fn value(&self, r: usize, k: usize) -> f32 {
        nibble(&self.qs, r, k) as f32 * self.d[r].to_f32() + self.m[r].to_f32()
    }

    tile_kernels!(q4, q4_pair);
}

impl Tile for TileQ4F {
    type Block = BlockQ4F;

    fn pack(rows: [&BlockQ4F; TILE_ROWS]) -> Self {
        TileQ4F {
            d: rows.map(|b| b.d),
            m: rows.map(|b| b.m),
            qs: interleave_nibbles(rows.map(|b| &b.qs)),
        }
    }

    fn value(&self, r: usize, k: usize) -> f32 {
        nibble(&self.qs, r, k) as f32 * self.d[r] + self.m[r]
    }

    tile_kernels!(q4, q4_pair);
}

impl Tile for TileQ8_0 {
    type Block = BlockQ8_0;

    fn pack(rows: [&BlockQ8_0; TILE_ROWS]) -> Self {
        TileQ8_0 {
            d: rows.map(|b| b.d),
            qs: interleave_bytes(rows.map(|b| &b.qs)),
        }
    }

    fn value(&self, r: usize, k: usize) -> f32 {
        self.qs[(k / 4) * 32 + r * 4 + k % 4] as f32 * self.d[r].to_f32()
    }

    tile_kernels!(q8_0, q8_0_pair);
}

impl Tile for TileQ6F {
    type Block = BlockQ6F;

    fn pack(rows: [&BlockQ6F; TILE_ROWS]) -> Self {
        TileQ6F {
            d: [rows.map(|b| b.d[0]), rows.map(|b| b.d[1])],
            qs: interleave_bytes(rows.map(|b| &b.qs)),
        }
    }

    fn value(&self, r: usize, k: usize) -> f32 {
        self.qs[(k / 4) * 32 + r * 4 + k % 4] as f32 * self.d[k / 16][r]
    }

    tile_kernels!(q6, q6_pair);
}

/// Interleaves 8 rows' 32 bytes 4 at a time: group `g` (32 bytes) holds bytes `4g..4g+4` of
/// each row (the layout of [`TileQ8_0`] and [`TileQ6F`]).
fn interleave_bytes(rows: [&[i8; QK]; TILE_ROWS]) -> [i8; QK * TILE_ROWS] {
    let mut qs = [0; QK * TILE_ROWS];
    for g in 0..8 {
        for (r, b) in rows.iter().enumerate() {
            qs[g * 32 + r * 4..g * 32 + r * 4 + 4].copy_from_slice(&b[4 * g..4 * g + 4]);
        }
    }
    qs
}

/// Scalar kernels computing the same sums (for CPUs without AVX2).
#[cfg_attr(
    all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ),
    allow(dead_code)
)]
mod portable;

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod avx2;

/// The integer kernels with AVX-512 VNNI, for CPUs that have it (found at run time).
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod vnni;

#[cfg(all(
    test,
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod tests {
    use super::super::blocks::QuantizedRows;
    use super::*;

    /// Bytes from a fixed xorshift, so every bit pattern comes up.
    fn noise(n: usize, mut seed: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect()
    }

    /// The VNNI kernels give the AVX2 kernels' bits, for 1 to 4 activation rows.
    #[test]
    fn vnni_kernels_give_the_same_bits_as_avx2() {
        if !vnni::available() {
            eprintln!("this CPU has no AVX-512 VNNI: nothing to compare");
            return;
        }
        let blocks = 16;
        let bytes = noise(blocks * TILE_ROWS * 40, 7);
        let q8: Vec<TileQ8_0> = (bytes.chunks_exact(TILE_ROWS * QK).take(blocks))
            .map(|c| {
                let row = |r: usize| BlockQ8_0 {
                    d: f16::from_f32(0.01 * (1 + r) as f32),
                    qs: std::array::from_fn(|k| (c[r * QK + k] as i8).max(-127)),
                };
                let rows: [BlockQ8_0; TILE_ROWS] = std::array::from_fn(row);
                TileQ8_0::pack(std::array::from_fn(|r| &rows[r]))
            })
            .collect();
        let q6: Vec<TileQ6F> = (bytes.chunks_exact(TILE_ROWS * QK).take(blocks))
            .map(|c| {
                let row = |r: usize| BlockQ6F {
                    d: [0.02 * (1 + r) as f32, -0.03],
                    qs: std::array::from_fn(|k| (c[r * QK + k] % 64) as i8 - 32),
                };
                let rows: [BlockQ6F; TILE_ROWS] = std::array::from_fn(row);
                TileQ6F::pack(std::array::from_fn(|r| &rows[r]))
            })
            .collect();
        let q4: Vec<TileQ4F> = (bytes.chunks_exact(TILE_ROWS * 16).take(blocks))
            .map(|c| {
                let row = |r: usize| BlockQ4F {
                    d: 0.05 * (1 + r) as f32,
                    m: -0.4,
                    qs: std::array::from_fn(|k| c[r * 16 + k]),
                };
                let rows: [BlockQ4F; TILE_ROWS] = std::array::from_fn(row);
                TileQ4F::pack(std::array::from_fn(|r| &rows[r]))
            })
            .collect();
        let x: Vec<f32> = (noise(4 * blocks * QK, 11).iter())
            .map(|&b| (b as f32 - 128.0) / 37.0)
            .collect();
        let mut acts = QuantizedRows::default();
        acts.quantize(&x, blocks * QK);
        let rows: [QuantizedRow; 4] = std::array::from_fn(|r| acts.row(r));
        // SAFETY: the CPU has AVX2 (compiled for) and VNNI (checked above); the activation
        // rows hold `blocks` blocks.
        unsafe {
            assert_eq!(avx2::q8_0(&q8, &rows), vnni::q8_0(&q8, &rows));
            assert_eq!(avx2::q6(&q6, &rows), vnni::q6(&q6, &rows));
            assert_eq!(avx2::q4(&q4, &rows), vnni::q4(&q4, &rows));
            let one = [rows[2]];
            assert_eq!(avx2::q8_0(&q8, &one), vnni::q8_0(&q8, &one));
            // Two row-runs in one 512-bit pass: each the same as alone.
            let (q8b, q6b, q4b) = (&q8[blocks / 2..], &q6[blocks / 2..], &q4[blocks / 2..]);
            let half = blocks / 2;
            let (q8a, q6a, q4a) = (&q8[..half], &q6[..half], &q4[..half]);
            assert_eq!(
                vnni::q8_0_pair(q8a, q8b, &rows),
                [avx2::q8_0(q8a, &rows), avx2::q8_0(q8b, &rows)]
            );
            assert_eq!(
                vnni::q6_pair(q6a, q6b, &rows),
                [avx2::q6(q6a, &rows), avx2::q6(q6b, &rows)]
            );
            assert_eq!(
                vnni::q4_pair(q4a, q4b, &one),
                [avx2::q4(q4a, &one), avx2::q4(q4b, &one)]
            );
        }
    }
}
