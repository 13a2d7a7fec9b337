//! AVX2 + FMA + F16C micro-kernels. Callers check the CPU features and slice lengths.

use std::arch::x86_64::*;

use super::KernelElem;

/// Sums each of 8 vectors horizontally: lane `i` of the result is the sum of `v[i]`'s lanes.
#[inline(always)]
unsafe fn hsum8x8(v: &[__m256; 8]) -> __m256 {
    // SAFETY: pure register arithmetic; AVX is enabled by the calling function.
    unsafe {
        let s01 = _mm256_hadd_ps(v[0], v[1]);
        let s23 = _mm256_hadd_ps(v[2], v[3]);
        let s45 = _mm256_hadd_ps(v[4], v[5]);
        let s67 = _mm256_hadd_ps(v[6], v[7]);
        let s0123 = _mm256_hadd_ps(s01, s23);
        let s4567 = _mm256_hadd_ps(s45, s67);
        let lo = _mm256_permute2f128_ps::<0x20>(s0123, s4567);
        let hi = _mm256_permute2f128_ps::<0x31>(s0123, s4567);
        _mm256_add_ps(lo, hi)
    }
}

/// Four vectors of two tokens each (4 lanes per token, `x = 4`) → the 8 token sums in order.
#[inline(always)]
unsafe fn hsum_pairs4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m256 {
    // SAFETY: pure register arithmetic; AVX2 is enabled by the calling function.
    unsafe {
        // hadd(hadd(a,b), hadd(c,d)) = [t0, t2, t4, t6 | t1, t3, t5, t7].
        let h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
        _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }
}

/// Dot products of one prepared query against `NV` consecutive 8-lane key vectors of every row.
#[inline(always)]
unsafe fn qk_group<T: KernelElem, const NV: usize>(
    base: *const T,
    qrep: *const f32,
    rows: usize,
    row_len: usize,
    out: *mut f32,
) {
    // SAFETY: the caller guarantees `rows` rows of `row_len` elements from `base` (of which we read
    // NV * 8 each), `rows * 8` prepared query lanes, and room for the tokens written to `out`.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); NV];
        for c in 0..rows {
            let qv = _mm256_loadu_ps(qrep.add(c * 8));
            let row = base.add(c * row_len);
            for (v, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(T::load8(row.add(v * 8)), qv, *a);
            }
        }
        if T::DTYPE.x() == 4 {
            for g in 0..NV / 4 {
                let r = hsum_pairs4(acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3]);
                _mm256_storeu_ps(out.add(8 * g), r);
            }
        } else {
            for g in 0..NV / 8 {
                let mut v = [_mm256_setzero_ps(); 8];
                v.copy_from_slice(&acc[8 * g..8 * g + 8]);
                _mm256_storeu_ps(out.add(8 * g), hsum8x8(&v));
            }
        }
    }
}

/// # Safety
/// AVX2/FMA/F16C available; `tile.len() >= d * bs`, `qrep.len() >= d / x * 8`, `scores.len() >= bs`;
/// `bs` a multiple of 8 and `d` a multiple of `x`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn qk_tile<T: KernelElem>(
    tile: &[T],
    qrep: &[f32],
    d: usize,
    bs: usize,
    scores: &mut [f32],
) {
    let x = T::DTYPE.x();
    let (rows, row_len) = (d / x, bs * x);
    let vecs = row_len / 8;
    let (base, q, out) = (tile.as_ptr(), qrep.as_ptr(), scores.as_mut_ptr());
    // SAFETY: per the contract above; each group reads 8 vectors (4 for f32 with bs 8) per row
    // starting at `g * 8` elements and writes `8 * 8 / x` tokens starting at token `g * 8 / x`.
    unsafe {
        if vecs == 4 {
            qk_group::<T, 4>(base, q, rows, row_len, out);
        } else {
            for g in (0..vecs).step_by(8) {
                qk_group::<T, 8>(base.add(g * 8), q, rows, row_len, out.add(g * 8 / x));
            }
        }
    }
}

#[inline(always)]
unsafe fn pv_rows<T: KernelElem, const NK: usize>(tile: *const T, p: *const f32, d: usize, acc: *mut f32) {
    // SAFETY: the caller guarantees `d` rows of `NK * 8` elements, `NK * 8` weights and `d` outputs.
    unsafe {
        let mut pv = [_mm256_setzero_ps(); NK];
        for (k, w) in pv.iter_mut().enumerate() {
            *w = _mm256_loadu_ps(p.add(k * 8));
        }
        let bs = NK * 8;
        for d0 in (0..d).step_by(8) {
            let mut prods = [_mm256_setzero_ps(); 8];
            for (r, prod) in prods.iter_mut().enumerate() {
                let row = tile.add((d0 + r) * bs);
                let mut s = _mm256_mul_ps(T::load8(row), pv[0]);
                for (k, w) in pv.iter().enumerate().skip(1) {
                    s = _mm256_fmadd_ps(T::load8(row.add(k * 8)), *w, s);
                }
                *prod = s;
            }
            let dst = acc.add(d0);
            _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_loadu_ps(dst), hsum8x8(&prods)));
        }
    }
}

/// # Safety
/// AVX2/FMA/F16C available; `tile.len() >= d * bs`, `p.len() >= bs`, `acc.len() >= d`;
/// `bs` in {8, 16, 32} and `d` a multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pv_tile<T: KernelElem>(tile: &[T], p: &[f32], d: usize, bs: usize, acc: &mut [f32]) {
    let (t, w, a) = (tile.as_ptr(), p.as_ptr(), acc.as_mut_ptr());
    // SAFETY: per the contract above.
    unsafe {
        match bs {
            8 => pv_rows::<T, 1>(t, w, d, a),
            16 => pv_rows::<T, 2>(t, w, d, a),
            _ => pv_rows::<T, 4>(t, w, d, a),
        }
    }
}

/// `exp` of 8 lanes: Cephes-style range reduction to `2^n · e^r`, `|r| <= ln2/2`, degree-5
/// polynomial; relative error ~1e-7 over the clamped range [-87.3, 88.0].
#[inline(always)]
unsafe fn exp8(x: __m256) -> __m256 {
    // SAFETY: pure register arithmetic; AVX2/FMA enabled by the calling function.
    unsafe {
        let x = _mm256_min_ps(x, _mm256_set1_ps(88.0));
        let x = _mm256_max_ps(x, _mm256_set1_ps(-87.336_55));
        let fx = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
            x,
            _mm256_set1_ps(std::f32::consts::LOG2_E),
        ));
        // r = x - n·ln2, with ln2 split in two for precision.
        let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut y = _mm256_set1_ps(1.987_569_1e-4);
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.398_199_9e-3));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.333_452e-3));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.166_579_6e-2));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.666_666_5e-1));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(0.5));
        y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0)));
        let n = _mm256_cvtps_epi32(fx);
        let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n, _mm256_set1_epi32(127))));
        _mm256_mul_ps(y, pow2)
    }
}

/// # Safety
/// AVX2/FMA available.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn exp_sub_sum(v: &mut [f32], max: f32) -> f32 {
    let n = v.len();
    let p = v.as_mut_ptr();
    // SAFETY: every access is below `n`; the tail goes through a zero-padded stack buffer.
    unsafe {
        let m = _mm256_set1_ps(max);
        let mut sum = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), m));
            _mm256_storeu_ps(p.add(i), e);
            sum = _mm256_add_ps(sum, e);
            i += 8;
        }
        let mut total = {
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
            lanes.iter().sum::<f32>()
        };
        if i < n {
            let mut buf = [max; 8];
            buf[..n - i].copy_from_slice(&v[i..]);
            let mut e = [0.0f32; 8];
            _mm256_storeu_ps(e.as_mut_ptr(), exp8(_mm256_sub_ps(_mm256_loadu_ps(buf.as_ptr()), m)));
            v[i..].copy_from_slice(&e[..n - i]);
            total += e[..n - i].iter().sum::<f32>();
        }
        total
    }
}
