//! AVX2 + FMA + F16C micro-kernels. Callers check the CPU features and slice lengths.

use std::arch::x86_64::*;

use super::lanes::exp8;
use super::{Ahead, Heads, KernelElem, PvBlocks, QkRows};

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

/// Scores of `H` query rows against one key tile, two 8-lane key vectors (per row of the tile)
/// at a time, so each key load feeds `2·H` accumulators.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn qk_heads<T: KernelElem, const H: usize>(
    tile: *const T,
    qrep: *const f32,
    ql: usize,
    rows: usize,
    row_len: usize,
    vecs: usize,
    scores: *mut f32,
    stride: usize,
    mut ahead: Ahead<'_, T>,
) {
    // SAFETY: the caller guarantees `rows` rows of `row_len = 8 · vecs` elements at `tile`,
    // `H` prepared rows of `ql = rows · 8` lanes at `qrep`, and `H` score rows `stride` apart
    // with room for `row_len / x` tokens each.
    unsafe {
        let x = T::DTYPE.x();
        let zero = _mm256_setzero_ps();
        // The prefetches, spread evenly over the row loops.
        let per_row = ahead.lines().div_ceil(vecs.div_ceil(2) * rows);
        for vp in (0..vecs).step_by(2) {
            let mut acc = [[zero; 2]; H];
            let kp = tile.add(vp * 8);
            for c in 0..rows {
                ahead.next(per_row);
                let k0 = T::load8(kp.add(c * row_len));
                let k1 = T::load8(kp.add(c * row_len + 8));
                for (h, a) in acc.iter_mut().enumerate() {
                    let q = _mm256_loadu_ps(qrep.add(h * ql + c * 8));
                    a[0] = _mm256_fmadd_ps(k0, q, a[0]);
                    a[1] = _mm256_fmadd_ps(k1, q, a[1]);
                }
            }
            let mut v = [zero; 8];
            for (h, a) in acc.iter().enumerate() {
                v[2 * h] = a[0];
                v[2 * h + 1] = a[1];
            }
            if x == 4 {
                // Two tokens per vector: vectors vp, vp+1 hold tokens 2vp .. 2vp+4 of each head.
                let r01 = hsum_pairs4(v[0], v[1], v[2], v[3]);
                let r23 = hsum_pairs4(v[4], v[5], v[6], v[7]);
                let halves = [
                    _mm256_castps256_ps128(r01),
                    _mm256_extractf128_ps::<1>(r01),
                    _mm256_castps256_ps128(r23),
                    _mm256_extractf128_ps::<1>(r23),
                ];
                for (h, half) in halves.iter().enumerate().take(H) {
                    _mm_storeu_ps(scores.add(h * stride + 2 * vp), *half);
                }
            } else {
                // One token per vector: lanes [h0t0, h0t1, h1t0, h1t1, ...].
                let mut lanes = [0.0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), hsum8x8(&v));
                for h in 0..H {
                    *scores.add(h * stride + vp) = lanes[2 * h];
                    *scores.add(h * stride + vp + 1) = lanes[2 * h + 1];
                }
            }
        }
    }
}

/// # Safety
/// AVX2/FMA/F16C available; `tile.len() >= d * bs`, `q_stride >= d / x * 8`,
/// `qrep.len() >= (nh - 1) * q_stride + d / x * 8`, `scores.len() >= (nh - 1) * stride + bs`;
/// `bs` in {8, 16, 32}, `d` a multiple of `x`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn qk_rows<T: KernelElem>(op: QkRows<'_, T>, ahead: Ahead<'_, T>) {
    let QkRows { heads: Heads { nh, d, bs, stride }, tile, qrep, q_stride: ql, scores } = op;
    let x = T::DTYPE.x();
    let (rows, row_len) = (d / x, bs * x);
    let vecs = row_len / 8;
    let (t, q, out) = (tile.as_ptr(), qrep.as_ptr(), scores.as_mut_ptr());
    // SAFETY: per the contract above; each call covers heads h0 .. h0 + H.
    unsafe {
        for_head_groups!(nh, ahead, |h0, H| {
            let (qh, sh) = (q.add(h0 * ql), out.add(h0 * stride));
            qk_heads::<T, H>(t, qh, ql, rows, row_len, vecs, sh, stride, ahead)
        })
    }
}

/// Lane-wise `p · V` for `H` heads over a run of value tiles, two rows of `d` at a time; the
/// `2·H` accumulators stay in registers across all tiles of the run.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_heads<T: KernelElem, const H: usize, const NK: usize>(
    tiles: &[&[T]],
    probs: *const f32,
    stride: usize,
    d: usize,
    acc8: *mut f32,
    mut ahead: Ahead<'_, T>,
) {
    // SAFETY: the caller guarantees tiles of `d` rows × `NK · 8` tokens, `H` probability rows
    // `stride` apart covering `tiles.len() · NK · 8` tokens, and `H` accumulators of `d · 8` lanes.
    unsafe {
        let bs = NK * 8;
        // The prefetches, spread evenly over the (row pair, tile) loop.
        let per_tile = ahead.lines().div_ceil(d.div_ceil(2) * tiles.len().max(1));
        for r in (0..d).step_by(2) {
            let mut acc = [[_mm256_setzero_ps(); 2]; H];
            for (h, a) in acc.iter_mut().enumerate() {
                a[0] = _mm256_loadu_ps(acc8.add(h * d * 8 + r * 8));
                a[1] = _mm256_loadu_ps(acc8.add(h * d * 8 + r * 8 + 8));
            }
            for (j, tile) in tiles.iter().enumerate() {
                ahead.next(per_tile);
                let row = tile.as_ptr().add(r * bs);
                let p = probs.add(j * bs);
                for k in 0..NK {
                    let v0 = T::load8(row.add(k * 8));
                    let v1 = T::load8(row.add(bs + k * 8));
                    for (h, a) in acc.iter_mut().enumerate() {
                        let w = _mm256_loadu_ps(p.add(h * stride + k * 8));
                        a[0] = _mm256_fmadd_ps(v0, w, a[0]);
                        a[1] = _mm256_fmadd_ps(v1, w, a[1]);
                    }
                }
            }
            for (h, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(acc8.add(h * d * 8 + r * 8), a[0]);
                _mm256_storeu_ps(acc8.add(h * d * 8 + r * 8 + 8), a[1]);
            }
        }
    }
}

/// # Safety
/// AVX2/FMA/F16C available; every tile `>= d * bs` elements, `probs.len() >= (nh - 1) * stride +
/// tiles.len() * bs`, `acc8.len() >= nh * d * 8`; `bs` in {8, 16, 32}, `d` even.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pv_blocks<T: KernelElem>(op: PvBlocks<'_, T>, ahead: Ahead<'_, T>) {
    let PvBlocks { heads: Heads { nh, d, bs, stride }, tiles, probs, acc8 } = op;
    let (p, a) = (probs.as_ptr(), acc8.as_mut_ptr());
    // SAFETY: per the contract above; each call covers heads h0 .. h0 + H.
    unsafe {
        for_head_groups!(nh, ahead, |h0, H| {
            let (ph, ah) = (p.add(h0 * stride), a.add(h0 * d * 8));
            with_block_size!(bs, |BS| pv_heads::<T, H, { BS / 8 }>(tiles, ph, stride, d, ah, ahead))
        })
    }
}

/// # Safety
/// AVX2 available; `out.len()` a multiple of 8 and `acc8.len() >= out.len() * 8`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn finish_rows(acc8: &[f32], scale: f32, out: &mut [f32]) {
    let (a, o) = (acc8.as_ptr(), out.as_mut_ptr());
    // SAFETY: per the contract above.
    unsafe {
        let s = _mm256_set1_ps(scale);
        for r in (0..out.len()).step_by(8) {
            let mut v = [_mm256_setzero_ps(); 8];
            for (i, vi) in v.iter_mut().enumerate() {
                *vi = _mm256_loadu_ps(a.add((r + i) * 8));
            }
            _mm256_storeu_ps(o.add(r), _mm256_mul_ps(hsum8x8(&v), s));
        }
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
