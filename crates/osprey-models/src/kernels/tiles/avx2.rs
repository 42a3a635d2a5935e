//! The kernels on AVX2: `maddubs` + `madd` on 256-bit registers, one 8-row tile at a time.

use std::arch::x86_64::*;

use super::*;

/// Activation bytes `at..at+4` broadcast to every 32-bit lane.
#[inline(always)]
unsafe fn group(a: *const i8, at: usize) -> __m256i {
    // SAFETY: callers pass `at + 4 <= 32` within a block of the activation row.
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(a.add(at).cast::<i32>())) }
}

#[inline(always)]
unsafe fn to_array(v: __m256) -> [f32; TILE_ROWS] {
    // SAFETY: `__m256` and `[f32; 8]` have the same size.
    unsafe { std::mem::transmute(v) }
}

#[inline(always)]
pub unsafe fn q4<T: FourBit, const R: usize>(
    tiles: &[T],
    acts: &[QuantizedRow; R],
) -> [[f32; TILE_ROWS]; R] {
    unsafe {
        for a in acts {
            debug_assert!(a.qs.len() >= tiles.len() * QK && a.d.len() >= tiles.len());
        }
        let low = _mm256_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, t) in tiles.iter().enumerate() {
            let (d, m) = t.scale_vectors();
            // Sums of up to 8 maddubs pairs stay within i16: 8 * 2 * 15 * 127 = 30480.
            let mut sum16 = [_mm256_setzero_si256(); R];
            for p in 0..4 {
                let raw = _mm256_loadu_si256(t.nibbles().as_ptr().add(32 * p).cast());
                let lo = _mm256_and_si256(raw, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                for r in 0..R {
                    let a = acts[r].qs.as_ptr().add(b * QK);
                    let s = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, group(a, 4 * p)),
                        _mm256_maddubs_epi16(hi, group(a, 16 + 4 * p)),
                    );
                    sum16[r] = _mm256_add_epi16(sum16[r], s);
                }
            }
            for r in 0..R {
                let isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(sum16[r], ones));
                let dd = _mm256_mul_ps(d, _mm256_set1_ps(*acts[r].d.get_unchecked(b)));
                acc[r] = _mm256_fmadd_ps(dd, isum, acc[r]);
                acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(*acts[r].s.get_unchecked(b)), acc[r]);
            }
        }
        acc.map(|v| to_array(v))
    }
}

#[inline(always)]
pub unsafe fn q8_0<const R: usize>(
    tiles: &[TileQ8_0],
    acts: &[QuantizedRow; R],
) -> [[f32; TILE_ROWS]; R] {
    unsafe {
        for a in acts {
            debug_assert!(a.qs.len() >= tiles.len() * QK && a.d.len() >= tiles.len());
        }
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, t) in tiles.iter().enumerate() {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(t.d.as_ptr().cast()));
            let mut isum = [_mm256_setzero_si256(); R];
            for g in 0..8 {
                let w = _mm256_loadu_si256(t.qs.as_ptr().add(32 * g).cast());
                // maddubs needs an unsigned left operand: |w|, with w's sign moved onto a.
                let aw = _mm256_sign_epi8(w, w);
                for r in 0..R {
                    let a = group(acts[r].qs.as_ptr().add(b * QK), 4 * g);
                    let prod = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w));
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(prod, ones));
                }
            }
            for r in 0..R {
                let dd = _mm256_mul_ps(d, _mm256_set1_ps(*acts[r].d.get_unchecked(b)));
                acc[r] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum[r]), acc[r]);
            }
        }
        acc.map(|v| to_array(v))
    }
}

#[inline(always)]
pub unsafe fn q6<const R: usize>(
    tiles: &[TileQ6F],
    acts: &[QuantizedRow; R],
) -> [[f32; TILE_ROWS]; R] {
    unsafe {
        for a in acts {
            debug_assert!(a.qs.len() >= tiles.len() * QK && a.d.len() >= tiles.len());
        }
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, t) in tiles.iter().enumerate() {
            for h in 0..2 {
                let d = _mm256_loadu_ps(t.d[h].as_ptr());
                let mut isum = [_mm256_setzero_si256(); R];
                // Groups 4h..4h+4 hold the 16 elements under scale h.
                for g in 4 * h..4 * h + 4 {
                    let w = _mm256_loadu_si256(t.qs.as_ptr().add(32 * g).cast());
                    let aw = _mm256_sign_epi8(w, w);
                    for r in 0..R {
                        let a = group(acts[r].qs.as_ptr().add(b * QK), 4 * g);
                        let prod = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w));
                        isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(prod, ones));
                    }
                }
                for r in 0..R {
                    let dd = _mm256_mul_ps(d, _mm256_set1_ps(*acts[r].d.get_unchecked(b)));
                    acc[r] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum[r]), acc[r]);
                }
            }
        }
        acc.map(|v| to_array(v))
    }
}
