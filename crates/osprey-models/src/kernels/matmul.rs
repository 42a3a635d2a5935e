//! Quantized weight matrices and the matrix multiply `out = x · Wᵀ`.
//!
//! `Q4_1`, `Q8_0`, `Q5_0`, `Q4_K` and `Q6_K` weights (the default model's and Gemma 3's) are
//! repacked into 8-row tiles ([`super::tiles`]) and run Osprey's own kernels: activations are quantized to 8 bits once,
//! row tiles are split across the pool, and each weight tile is decoded once for up to four
//! activation rows.
//! MXFP4 ([`super::mxfp4`]) uses the same tiles with a lookup of its 16 `e2m1` values.
//! Every other GGML type runs candle's `vec_dot` for its block type, tiled the same way.

use candle_core::quantized::GgmlDType;
use candle_core::quantized::k_quants::{self as kq, GgmlType};
use half::{bf16, f16};
use std::cell::RefCell;

use super::blocks::{BlockQ4F, BlockQ6F, QK, QuantizedRow, QuantizedRows, blocks_from_bytes};
use super::mxfp4::{BlockMxfp4, TileMxfp4};
use super::par::{SharedMut, for_each_range, grain_for};
use super::tiles::{TILE_ROWS, Tile, TileQ4_1, TileQ4F, TileQ6F, TileQ8_0, repack};

/// Activation rows that share one decoded weight tile.
const ROW_TILE: usize = 4;

/// How a weight matrix is stored: a GGML type, or MXFP4 (17-byte [`BlockMxfp4`]s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    /// A GGML tensor type, bytes as in GGUF.
    Ggml(GgmlDType),
    /// OCP MXFP4 in ggml's block layout.
    Mxfp4,
}

impl WeightFormat {
    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            Self::Ggml(d) => d.block_size(),
            Self::Mxfp4 => QK,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            Self::Ggml(d) => d.type_size(),
            Self::Mxfp4 => std::mem::size_of::<BlockMxfp4>(),
        }
    }

    /// Bytes of a `rows × cols` matrix.
    pub fn bytes(self, rows: usize, cols: usize) -> usize {
        rows * cols / self.block_size() * self.type_size()
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ggml(d) => write!(f, "{d:?}"),
            Self::Mxfp4 => f.write_str("MXFP4"),
        }
    }
}

/// A weight matrix of `rows` outputs by `cols` inputs, in its storage format.
pub struct QMatrix {
    rows: usize,
    cols: usize,
    weights: Box<dyn Weights>,
}

impl std::fmt::Debug for QMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QMatrix({}, {}x{})", self.format(), self.rows, self.cols)
    }
}

impl QMatrix {
    /// Builds a matrix from bytes in `format`'s block layout; `None` if it has no kernel here.
    ///
    /// `bytes` must hold exactly `rows * cols` elements, and `cols` must be a multiple of the
    /// format's block size (checked by the loader).
    pub fn from_bytes(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Option<Self> {
        let dtype = match format {
            WeightFormat::Mxfp4 => {
                let weights = Box::new(Tiled::<TileMxfp4>::new(format, bytes, rows, cols));
                return Some(Self {
                    rows,
                    cols,
                    weights,
                });
            }
            WeightFormat::Ggml(dtype) => dtype,
        };
        let weights: Box<dyn Weights> = match dtype {
            GgmlDType::Q4_1 => Box::new(Tiled::<TileQ4_1>::new(format, bytes, rows, cols)),
            GgmlDType::Q8_0 => Box::new(Tiled::<TileQ8_0>::new(format, bytes, rows, cols)),
            GgmlDType::F32 => Box::new(Ggml::<f32>::from_bytes(bytes)),
            GgmlDType::F16 => Box::new(Ggml::<f16>::from_bytes(bytes)),
            GgmlDType::BF16 => Box::new(Ggml::<bf16>::from_bytes(bytes)),
            GgmlDType::Q4_0 => Box::new(Ggml::<kq::BlockQ4_0>::from_bytes(bytes)),
            // Q5_0's values (-16..=15 times the block's scale) are exactly Q8_0's, so its
            // blocks are widened once and run in the Q8_0 tiles: the same sums, Osprey's kernel.
            GgmlDType::Q5_0 => Box::new(Tiled::<TileQ8_0>::new(
                WeightFormat::Ggml(GgmlDType::Q8_0),
                &q5_0_as_q8_0(bytes),
                rows,
                cols,
            )),
            GgmlDType::Q5_1 => Box::new(Ggml::<kq::BlockQ5_1>::from_bytes(bytes)),
            GgmlDType::Q2K => Box::new(Ggml::<kq::BlockQ2K>::from_bytes(bytes)),
            GgmlDType::Q3K => Box::new(Ggml::<kq::BlockQ3K>::from_bytes(bytes)),
            // Each 32-element sub-block as a 4-bit block with exact f32 scale and offset.
            GgmlDType::Q4K => Box::new(Tiled::<TileQ4F>::new(
                format,
                &BlockQ4F::from_q4_k(bytes),
                rows,
                cols,
            )),
            GgmlDType::Q5K => Box::new(Ggml::<kq::BlockQ5K>::from_bytes(bytes)),
            // Each 32-element sub-block with its 6-bit values as bytes, two exact f32 scales.
            GgmlDType::Q6K => Box::new(Tiled::<TileQ6F>::new(
                format,
                &BlockQ6F::from_q6_k(bytes),
                rows,
                cols,
            )),
            GgmlDType::Q8_1 | GgmlDType::Q8K => return None,
        };
        Some(Self {
            rows,
            cols,
            weights,
        })
    }

    /// Output dimension.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input dimension.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Storage format.
    pub fn format(&self) -> WeightFormat {
        self.weights.format()
    }

    /// Bytes of weights (what one pass over the matrix reads).
    pub fn storage_bytes(&self) -> usize {
        self.format().bytes(self.rows, self.cols)
    }

    /// `out[t][j] = Σ_k x[t][k] · W[j][k]` for each of the `x.len() / cols` rows of `x`.
    ///
    /// Each output element is computed by the same instructions whatever the number of rows,
    /// so results are bit-identical between a row computed alone and in a batch.
    pub fn matmul(&self, x: &[f32], out: &mut [f32]) {
        let t = x.len() / self.cols;
        assert_eq!(x.len(), t * self.cols, "input is not whole rows");
        assert_eq!(out.len(), t * self.rows, "output has the wrong size");
        self.weights.matmul(x, self.rows, self.cols, out);
    }

    /// Dequantizes row `row` (an embedding lookup) into `out` (`cols` long).
    pub fn row_to_f32(&self, row: usize, out: &mut [f32]) {
        assert!(row < self.rows && out.len() == self.cols);
        self.weights.row_to_f32(row, self.cols, out);
    }
}

/// GGML `Q5_0` blocks (f16 scale, 32 high bits, 16 bytes of low nibbles) rewritten as `Q8_0`
/// blocks (f16 scale, 32 signed bytes) holding the same values.
fn q5_0_as_q8_0(bytes: &[u8]) -> Vec<u8> {
    const Q5_0_BYTES: usize = 2 + 4 + QK / 2;
    let mut out = Vec::with_capacity(bytes.len() / Q5_0_BYTES * (2 + QK));
    for block in bytes.chunks_exact(Q5_0_BYTES) {
        let (d, rest) = block.split_at(2);
        let (qh, qs) = rest.split_at(4);
        let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        out.extend_from_slice(d);
        let value = |nibble: u8, bit: usize| {
            let high = (((qh >> bit) & 1) as u8) << 4;
            ((nibble | high) as i8 - 16) as u8
        };
        out.extend(qs.iter().enumerate().map(|(j, &q)| value(q & 0x0f, j)));
        out.extend(qs.iter().enumerate().map(|(j, &q)| value(q >> 4, j + 16)));
    }
    out
}

/// A weight storage format and its kernels.
trait Weights: Send + Sync {
    fn format(&self) -> WeightFormat;
    fn matmul(&self, x: &[f32], rows: usize, cols: usize, out: &mut [f32]);
    fn row_to_f32(&self, row: usize, cols: usize, out: &mut [f32]);
}

thread_local! {
    static QUANTIZED_INPUT: RefCell<QuantizedRows> = RefCell::new(QuantizedRows::default());
}

/// A matrix repacked into 8-row tiles (`[row tile][block]`), with Osprey's kernels.
struct Tiled<T> {
    tiles: Vec<T>,
    format: WeightFormat,
}

impl<T: Tile> Tiled<T> {
    fn new(format: WeightFormat, bytes: &[u8], rows: usize, cols: usize) -> Self {
        Self {
            tiles: repack(bytes, rows, cols),
            format,
        }
    }
}

impl<T: Tile> Weights for Tiled<T> {
    fn format(&self) -> WeightFormat {
        self.format
    }

    fn matmul(&self, x: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
        let bpr = cols / QK;
        let row_tiles = rows.div_ceil(TILE_ROWS);
        QUANTIZED_INPUT.with_borrow_mut(|acts| {
            acts.quantize(x, cols);
            let acts = &*acts;
            let t = acts.rows();
            let out = SharedMut::new(out);
            let write = |i: usize, tile: usize, values: [f32; TILE_ROWS]| {
                let first = tile * TILE_ROWS;
                let n = TILE_ROWS.min(rows - first);
                // SAFETY: each task owns the output columns of its row tiles; `i < t`.
                unsafe { out.slice(i * rows + first, n) }.copy_from_slice(&values[..n]);
            };
            let run = |tile: usize| &self.tiles[tile * bpr..(tile + 1) * bpr];
            // Row tiles two at a time (16 rows to a register where the CPU allows); an odd last
            // tile is paired with itself and written once.
            let pairs = row_tiles.div_ceil(2);
            for_each_range(pairs, grain_for(pairs, 1, 4), |range| {
                for pair in range {
                    let tiles = [2 * pair, (2 * pair + 1).min(row_tiles - 1)];
                    let (a, b) = (run(tiles[0]), run(tiles[1]));
                    let write_pair = |i: usize, out: [[f32; TILE_ROWS]; 2]| {
                        write(i, tiles[0], out[0]);
                        if tiles[1] != tiles[0] {
                            write(i, tiles[1], out[1]);
                        }
                    };
                    let mut i = 0;
                    while i + ROW_TILE <= t {
                        let group: [QuantizedRow; ROW_TILE] =
                            std::array::from_fn(|r| acts.row(i + r));
                        let [out_a, out_b] = T::dot_pair(a, b, &group);
                        for r in 0..ROW_TILE {
                            write_pair(i + r, [out_a[r], out_b[r]]);
                        }
                        i += ROW_TILE;
                    }
                    for i in i..t {
                        let [[out_a], [out_b]] = T::dot_pair(a, b, &[acts.row(i)]);
                        write_pair(i, [out_a, out_b]);
                    }
                }
            });
        });
    }

    fn row_to_f32(&self, row: usize, cols: usize, out: &mut [f32]) {
        let bpr = cols / QK;
        let (tile, r) = (row / TILE_ROWS, row % TILE_ROWS);
        for (b, chunk) in out.chunks_exact_mut(QK).enumerate() {
            let t = &self.tiles[tile * bpr + b];
            for (k, o) in chunk.iter_mut().enumerate() {
                *o = t.value(r, k);
            }
        }
    }
}

/// Any other GGML block type, through candle's `GgmlType` kernels.
struct Ggml<T>(Vec<T>);

impl<T: GgmlType> Ggml<T> {
    fn from_bytes(bytes: &[u8]) -> Self {
        // Candle's block types are `repr(C)` plain data in GGML's byte layout.
        Self(blocks_from_bytes(bytes))
    }
}

impl<T: GgmlType + 'static> Weights for Ggml<T> {
    fn format(&self) -> WeightFormat {
        WeightFormat::Ggml(T::DTYPE)
    }

    fn matmul(&self, x: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
        let t = x.len() / cols;
        let wbpr = cols / T::BLCK_SIZE;
        let abpr = cols / T::VecDotType::BLCK_SIZE;
        let mut acts = vec![T::VecDotType::zeros(); t * abpr];
        for (xr, ar) in x.chunks_exact(cols).zip(acts.chunks_exact_mut(abpr)) {
            T::VecDotType::from_float(xr, ar);
        }
        let acts = &acts;
        let out = SharedMut::new(out);
        for_each_range(rows, grain_for(rows, 16, 4), |range| {
            for j in range {
                let w = &self.0[j * wbpr..(j + 1) * wbpr];
                for i in 0..t {
                    let v = T::vec_dot(cols, w, &acts[i * abpr..(i + 1) * abpr]);
                    // SAFETY: each task owns output column `j`; `(i, j)` is in bounds.
                    unsafe { out.write(i * rows + j, v) };
                }
            }
        });
    }

    fn row_to_f32(&self, row: usize, cols: usize, out: &mut [f32]) {
        let bpr = cols / T::BLCK_SIZE;
        T::to_float(&self.0[row * bpr..(row + 1) * bpr], out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::k_quants::BlockQ5_0;

    /// GGML blocks as the bytes a GGUF file holds.
    fn bytes_of<B: GgmlType>(blocks: &[B]) -> &[u8] {
        // SAFETY: GGML block types are plain `repr(C)` structs of bytes and f16s.
        unsafe {
            std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), std::mem::size_of_val(blocks))
        }
    }

    /// A `rows × 512` matrix of K-quant blocks `B` (`dtype`) holds exactly the values ggml
    /// dequantizes it to, and the kernel computes with them: against the dequantized matrix in
    /// f64, within what 8-bit activations cost, for 1 to 3 activation rows.
    fn check_k_quant<B: GgmlType + Clone>(dtype: GgmlDType, rows: usize) {
        let cols = 512;
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1 + i % 7) as f32)
            .collect();
        let mut blocks = vec![B::zeros(); rows * cols / 256];
        B::from_float(&x, &mut blocks);
        let mut want = vec![0f32; rows * cols];
        B::to_float(&blocks, &mut want);
        let m =
            QMatrix::from_bytes(WeightFormat::Ggml(dtype), rows, cols, bytes_of(&blocks)).unwrap();
        let mut got = vec![0f32; cols];
        for r in 0..rows {
            m.row_to_f32(r, &mut got);
            assert_eq!(got, want[r * cols..(r + 1) * cols], "row {r}");
        }
        let input: Vec<f32> = (0..3 * cols)
            .map(|i| ((i * 31 % 17) as f32 - 8.0) / 8.0)
            .collect();
        let mut out = vec![0f32; 3 * rows];
        m.matmul(&input, &mut out);
        for t in 0..3 {
            for r in 0..rows {
                let exact: f64 = (0..cols)
                    .map(|k| input[t * cols + k] as f64 * want[r * cols + k] as f64)
                    .sum();
                let got = out[t * rows + r] as f64;
                assert!(
                    (got - exact).abs() < 0.02 * exact.abs().max(10.0),
                    "{got} vs {exact}"
                );
            }
        }
    }

    /// Q4_K's sub-blocks, repacked with f32 scales and offsets.
    #[test]
    fn q4_k_sub_blocks_keep_every_value() {
        check_k_quant::<candle_core::quantized::k_quants::BlockQ4K>(GgmlDType::Q4K, 9);
    }

    /// Q6_K's sub-blocks, widened to bytes with two f32 scales.
    #[test]
    fn q6_k_sub_blocks_keep_every_value() {
        check_k_quant::<candle_core::quantized::k_quants::BlockQ6K>(GgmlDType::Q6K, 11);
    }

    /// Widened Q5_0 blocks hold exactly the values ggml's Q5_0 dequantizes to (every pattern
    /// of high bits and nibbles comes up over the matrix).
    #[test]
    fn q5_0_widened_to_q8_0_keeps_every_value() {
        let (rows, cols) = (16, 64);
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1 + i % 5) as f32)
            .collect();
        let mut blocks = vec![BlockQ5_0::zeros(); rows * cols / QK];
        BlockQ5_0::from_float(&x, &mut blocks);
        let mut want = vec![0f32; rows * cols];
        BlockQ5_0::to_float(&blocks, &mut want);
        let bytes = bytes_of(&blocks);
        let m =
            QMatrix::from_bytes(WeightFormat::Ggml(GgmlDType::Q5_0), rows, cols, bytes).unwrap();
        let mut got = vec![0f32; cols];
        for r in 0..rows {
            m.row_to_f32(r, &mut got);
            assert_eq!(got, want[r * cols..(r + 1) * cols], "row {r}");
        }
    }
}
