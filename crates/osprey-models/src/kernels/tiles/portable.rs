//! Scalar kernels computing the same sums as the SIMD ones (for CPUs without AVX2).

use super::*;

pub fn q4<T: FourBit, const R: usize>(
    tiles: &[T],
    acts: &[QuantizedRow; R],
) -> [[f32; TILE_ROWS]; R] {
    std::array::from_fn(|i| {
        let a = &acts[i];
        std::array::from_fn(|r| {
            let mut acc = 0f32;
            for (b, t) in tiles.iter().enumerate() {
                let (qs, (d, m)) = (t.nibbles(), t.scales());
                let mut isum = 0i32;
                for p in 0..4 {
                    for j in 0..4 {
                        let byte = qs[p * 32 + r * 4 + j];
                        isum += (byte & 0x0f) as i32 * a.qs[b * QK + 4 * p + j] as i32;
                        isum += (byte >> 4) as i32 * a.qs[b * QK + 16 + 4 * p + j] as i32;
                    }
                }
                acc = (d[r] * a.d[b]).mul_add(isum as f32, acc);
                acc = m[r].mul_add(a.s[b], acc);
            }
            acc
        })
    })
}

pub fn q8_0<const R: usize>(tiles: &[TileQ8_0], acts: &[QuantizedRow; R]) -> [[f32; TILE_ROWS]; R] {
    std::array::from_fn(|i| {
        let a = &acts[i];
        std::array::from_fn(|r| {
            let mut acc = 0f32;
            for (b, t) in tiles.iter().enumerate() {
                let mut isum = 0i32;
                for k in 0..QK {
                    isum += t.qs[(k / 4) * 32 + r * 4 + k % 4] as i32 * a.qs[b * QK + k] as i32;
                }
                acc = (t.d[r].to_f32() * a.d[b]).mul_add(isum as f32, acc);
            }
            acc
        })
    })
}

pub fn q6<const R: usize>(tiles: &[TileQ6F], acts: &[QuantizedRow; R]) -> [[f32; TILE_ROWS]; R] {
    std::array::from_fn(|i| {
        let a = &acts[i];
        std::array::from_fn(|r| {
            let mut acc = 0f32;
            for (b, t) in tiles.iter().enumerate() {
                for h in 0..2 {
                    let mut isum = 0i32;
                    for k in 16 * h..16 * h + 16 {
                        let w = t.qs[(k / 4) * 32 + r * 4 + k % 4] as i32;
                        isum += w * a.qs[b * QK + k] as i32;
                    }
                    acc = (t.d[h][r] * a.d[b]).mul_add(isum as f32, acc);
                }
            }
            acc
        })
    })
}
