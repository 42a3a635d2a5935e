//! The kernels with AVX-512 VNNI (`vpdpbusd`), found at run time: one 8-row tile per 256-bit
//! register, or two (16 rows) per 512-bit register when several activation rows share a pass.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::*;

/// Whether this CPU has AVX-512 VNNI, VL and BW (checked once).
#[inline(always)]
pub fn available() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512bw")
    })
}

/// `Σ a·w` over one 32-byte group for each act row, added to `isum`: `dpbusd` takes an
/// unsigned left operand, so |w| goes left and w's sign moves onto the activations.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn groups<const R: usize>(
    isum: &mut [__m256i; R],
    qs: *const i8,
    groups: std::ops::Range<usize>,
    acts: &[QuantizedRow; R],
    b: usize,
) {
    unsafe {
        for g in groups {
            let w = _mm256_loadu_si256(qs.add(32 * g).cast());
            let aw = _mm256_sign_epi8(w, w);
            for r in 0..R {
                let at = acts[r].qs.as_ptr().add(b * QK + 4 * g);
                let a = _mm256_set1_epi32(std::ptr::read_unaligned(at.cast::<i32>()));
                isum[r] = _mm256_dpbusd_epi32(isum[r], aw, _mm256_sign_epi8(a, w));
            }
        }
    }
}

/// [`super::avx2::q8_0`], the same sums.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn q8_0<const R: usize>(
    tiles: &[TileQ8_0],
    acts: &[QuantizedRow; R],
) -> [[f32; TILE_ROWS]; R] {
    unsafe {
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, t) in tiles.iter().enumerate() {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(t.d.as_ptr().cast()));
            let mut isum = [_mm256_setzero_si256(); R];
            groups(&mut isum, t.qs.as_ptr(), 0..8, acts, b);
            for r in 0..R {
                let dd = _mm256_mul_ps(d, _mm256_set1_ps(*acts[r].d.get_unchecked(b)));
                acc[r] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum[r]), acc[r]);
            }
        }
        acc.map(|v| std::mem::transmute::<__m256, [f32; TILE_ROWS]>(v))
    }
}

/// [`super::avx2::q4`], the same sums (the 16-bit partial sums there never saturate).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn q4<T: FourBit, const R: usize>(
    tiles: &[T],
    acts: &[QuantizedRow; R],
) -> [[f32; TILE_ROWS]; R] {
    unsafe {
        let low = _mm256_set1_epi8(0x0f);
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, t) in tiles.iter().enumerate() {
            let (d, m) = t.scale_vectors();
            let mut isum = [_mm256_setzero_si256(); R];
            for p in 0..4 {
                let raw = _mm256_loadu_si256(t.nibbles().as_ptr().add(32 * p).cast());
                let lo = _mm256_and_si256(raw, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
                for r in 0..R {
                    let a = acts[r].qs.as_ptr().add(b * QK);
                    let (a_lo, a_hi) = (a.add(4 * p), a.add(16 + 4 * p));
                    let a_lo = _mm256_set1_epi32(std::ptr::read_unaligned(a_lo.cast::<i32>()));
                    let a_hi = _mm256_set1_epi32(std::ptr::read_unaligned(a_hi.cast::<i32>()));
                    isum[r] = _mm256_dpbusd_epi32(isum[r], lo, a_lo);
                    isum[r] = _mm256_dpbusd_epi32(isum[r], hi, a_hi);
                }
            }
            for r in 0..R {
                let isum = _mm256_cvtepi32_ps(isum[r]);
                let dd = _mm256_mul_ps(d, _mm256_set1_ps(*acts[r].d.get_unchecked(b)));
                acc[r] = _mm256_fmadd_ps(dd, isum, acc[r]);
                acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(*acts[r].s.get_unchecked(b)), acc[r]);
            }
        }
        acc.map(|v| std::mem::transmute::<__m256, [f32; TILE_ROWS]>(v))
    }
}

/// [`super::avx2::q6`], the same sums.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn q6<const R: usize>(
    tiles: &[TileQ6F],
    acts: &[QuantizedRow; R],
) -> [[f32; TILE_ROWS]; R] {
    unsafe {
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, t) in tiles.iter().enumerate() {
            for h in 0..2 {
                let d = _mm256_loadu_ps(t.d[h].as_ptr());
                let mut isum = [_mm256_setzero_si256(); R];
                groups(&mut isum, t.qs.as_ptr(), 4 * h..4 * h + 4, acts, b);
                for r in 0..R {
                    let dd = _mm256_mul_ps(d, _mm256_set1_ps(*acts[r].d.get_unchecked(b)));
                    acc[r] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum[r]), acc[r]);
                }
            }
        }
        acc.map(|v| std::mem::transmute::<__m256, [f32; TILE_ROWS]>(v))
    }
}

/// Two 256-bit halves as one 512-bit register, `lo` in the low half.
#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    unsafe { _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1) }
}

/// [`join`] for `f32` vectors.
#[inline(always)]
unsafe fn join_ps(lo: __m256, hi: __m256) -> __m512 {
    unsafe {
        let lo = _mm512_castpd256_pd512(_mm256_castps_pd(lo));
        _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(hi), 1))
    }
}

/// Per activation row, the low half's 8 lanes (tile `a`) and the high half's (tile `b`).
#[inline(always)]
unsafe fn split<const R: usize>(acc: [__m512; R]) -> [[[f32; TILE_ROWS]; R]; 2] {
    let halves = acc.map(|v| unsafe { std::mem::transmute::<__m512, [[f32; TILE_ROWS]; 2]>(v) });
    [halves.map(|h| h[0]), halves.map(|h| h[1])]
}

/// [`groups`] for two tiles at once: 16 rows in one 512-bit register (tile `a`'s 8 in the
/// low half). AVX-512 has no `sign`: the activations are negated under the mask of the
/// negative weights instead, which gives the same products.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn groups_pair<const R: usize>(
    isum: &mut [__m512i; R],
    qs: [*const i8; 2],
    groups: std::ops::Range<usize>,
    acts: &[QuantizedRow; R],
    b: usize,
) {
    unsafe {
        for g in groups {
            let load = |q: *const i8| _mm256_loadu_si256(q.add(32 * g).cast());
            let w = join(load(qs[0]), load(qs[1]));
            let (aw, negative) = (_mm512_abs_epi8(w), _mm512_movepi8_mask(w));
            for r in 0..R {
                let at = acts[r].qs.as_ptr().add(b * QK + 4 * g);
                let a = _mm512_set1_epi32(std::ptr::read_unaligned(at.cast::<i32>()));
                let signed = _mm512_mask_sub_epi8(a, negative, _mm512_setzero_si512(), a);
                isum[r] = _mm512_dpbusd_epi32(isum[r], aw, signed);
            }
        }
    }
}

/// [`q8_0`] for the row tiles `a` and `b` at once, the same sums.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn q8_0_pair<const R: usize>(
    a: &[TileQ8_0],
    b: &[TileQ8_0],
    acts: &[QuantizedRow; R],
) -> [[[f32; TILE_ROWS]; R]; 2] {
    unsafe {
        let mut acc = [_mm512_setzero_ps(); R];
        for (blk, (ta, tb)) in a.iter().zip(b).enumerate() {
            let d = _mm256_set_m128i(
                _mm_loadu_si128(tb.d.as_ptr().cast()),
                _mm_loadu_si128(ta.d.as_ptr().cast()),
            );
            let d = _mm512_cvtph_ps(d);
            let mut isum = [_mm512_setzero_si512(); R];
            groups_pair(&mut isum, [ta.qs.as_ptr(), tb.qs.as_ptr()], 0..8, acts, blk);
            for r in 0..R {
                let dd = _mm512_mul_ps(d, _mm512_set1_ps(*acts[r].d.get_unchecked(blk)));
                acc[r] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(isum[r]), acc[r]);
            }
        }
        split(acc)
    }
}

/// [`q6`] for the row tiles `a` and `b` at once, the same sums.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn q6_pair<const R: usize>(
    a: &[TileQ6F],
    b: &[TileQ6F],
    acts: &[QuantizedRow; R],
) -> [[[f32; TILE_ROWS]; R]; 2] {
    unsafe {
        let mut acc = [_mm512_setzero_ps(); R];
        for (blk, (ta, tb)) in a.iter().zip(b).enumerate() {
            for h in 0..2 {
                let d = join_ps(
                    _mm256_loadu_ps(ta.d[h].as_ptr()),
                    _mm256_loadu_ps(tb.d[h].as_ptr()),
                );
                let mut isum = [_mm512_setzero_si512(); R];
                let qs = [ta.qs.as_ptr(), tb.qs.as_ptr()];
                groups_pair(&mut isum, qs, 4 * h..4 * h + 4, acts, blk);
                for r in 0..R {
                    let dd = _mm512_mul_ps(d, _mm512_set1_ps(*acts[r].d.get_unchecked(blk)));
                    acc[r] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(isum[r]), acc[r]);
                }
            }
        }
        split(acc)
    }
}

/// [`q4`] for the row tiles `a` and `b` at once, the same sums.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn q4_pair<T: FourBit, const R: usize>(
    a: &[T],
    b: &[T],
    acts: &[QuantizedRow; R],
) -> [[[f32; TILE_ROWS]; R]; 2] {
    unsafe {
        let low = _mm512_set1_epi8(0x0f);
        let mut acc = [_mm512_setzero_ps(); R];
        for (blk, (ta, tb)) in a.iter().zip(b).enumerate() {
            let ((da, ma), (db, mb)) = (ta.scale_vectors(), tb.scale_vectors());
            let (d, m) = (join_ps(da, db), join_ps(ma, mb));
            let mut isum = [_mm512_setzero_si512(); R];
            for p in 0..4 {
                let load = |t: &T| _mm256_loadu_si256(t.nibbles().as_ptr().add(32 * p).cast());
                let raw = join(load(ta), load(tb));
                let lo = _mm512_and_si512(raw, low);
                let hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
                for r in 0..R {
                    let a = acts[r].qs.as_ptr().add(blk * QK);
                    let (a_lo, a_hi) = (a.add(4 * p), a.add(16 + 4 * p));
                    let a_lo = _mm512_set1_epi32(std::ptr::read_unaligned(a_lo.cast::<i32>()));
                    let a_hi = _mm512_set1_epi32(std::ptr::read_unaligned(a_hi.cast::<i32>()));
                    isum[r] = _mm512_dpbusd_epi32(isum[r], lo, a_lo);
                    isum[r] = _mm512_dpbusd_epi32(isum[r], hi, a_hi);
                }
            }
            for r in 0..R {
                let isum = _mm512_cvtepi32_ps(isum[r]);
                let dd = _mm512_mul_ps(d, _mm512_set1_ps(*acts[r].d.get_unchecked(blk)));
                acc[r] = _mm512_fmadd_ps(dd, isum, acc[r]);
                acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(*acts[r].s.get_unchecked(blk)), acc[r]);
            }
        }
        split(acc)
    }
}
