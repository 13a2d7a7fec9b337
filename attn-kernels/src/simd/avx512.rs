//! AVX-512F micro-kernels of the decode hot loops: `q·k` over a key tile and `p · V` over
//! runs of value tiles. Callers check the CPU features and slice lengths.
//!
//! Why a second x86 path: with 16 lanes per instruction and 32 registers, each key/value load
//! feeds 16 accumulators (4 query heads × 4 vectors) instead of 8, so widening a bf16/f16 cache
//! to f32 and the FMAs cost half the instructions they cost with AVX2. The other kernels
//! (`finish_rows`, `exp`) stay on their AVX2 versions, which every AVX-512 CPU runs.

use std::arch::x86_64::*;

use super::{Ahead, Heads, KernelElem, PvBlocks, QkRows};

/// Lanes per vector.
const L: usize = 16;

/// The 8 floats at `p` in both halves of a vector (`vbroadcastf64x4`: AVX-512F; DQ's
/// `vbroadcastf32x8` moves the same bits).
///
/// # Safety
/// `p .. p + 8` is readable; AVX-512F is enabled by the calling function.
#[inline(always)]
unsafe fn broadcast8(p: *const f32) -> __m512 {
    // SAFETY: per the contract.
    unsafe { _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p)))) }
}

/// The upper 8 floats of `v` (`vextractf64x4`: AVX-512F; DQ's `vextractf32x8` moves the same
/// bits).
#[inline(always)]
unsafe fn upper8(v: __m512) -> __m256 {
    // SAFETY: pure register arithmetic; AVX-512F is enabled by the calling function.
    unsafe { _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))) }
}

/// Lane `4k + m` of the result is the sum of the four lanes of quarter (128-bit lane) `k` of
/// `e[m]`: a 4×4 transpose-and-add inside each quarter.
#[inline(always)]
unsafe fn sum_quarters4(e0: __m512, e1: __m512, e2: __m512, e3: __m512) -> __m512 {
    // SAFETY: pure register arithmetic; AVX-512F is enabled by the calling function.
    unsafe {
        // Per quarter: [e0a, e1a, e0b, e1b] and [e0c, e1c, e0d, e1d] …
        let u0 = _mm512_add_ps(_mm512_unpacklo_ps(e0, e1), _mm512_unpackhi_ps(e0, e1));
        let u1 = _mm512_add_ps(_mm512_unpacklo_ps(e2, e3), _mm512_unpackhi_ps(e2, e3));
        // … then [u0[0], u0[1], u1[0], u1[1]] + [u0[2], u0[3], u1[2], u1[3]].
        _mm512_add_ps(_mm512_shuffle_ps::<0x44>(u0, u1), _mm512_shuffle_ps::<0xEE>(u0, u1))
    }
}

/// Two vectors of two 8-lane tokens each (`x = 8`) → one vector of four 4-lane partial sums:
/// quarters `[a0 + a1, a2 + a3, b0 + b1, b2 + b3]`.
#[inline(always)]
unsafe fn fold_pairs(a: __m512, b: __m512) -> __m512 {
    // SAFETY: pure register arithmetic; AVX-512F is enabled by the calling function.
    unsafe { _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0xDD>(a, b)) }
}

/// Undoes the transpose of [`sum_quarters4`]: output lane `4m + k` takes input lane `4k + m`.
#[inline(always)]
unsafe fn untranspose4(v: __m512) -> __m512 {
    // SAFETY: pure register arithmetic; AVX-512F is enabled by the calling function.
    unsafe {
        let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_permutexvar_ps(idx, v)
    }
}

/// Scores of `H` query rows against one key tile, `V` 16-lane key vectors (per row of the
/// tile) at a time, so each key load feeds `H` accumulators and each query load `V`.
///
/// A vector holds `16 / x` tokens × `x` lanes; after the row loop, each token's lanes are
/// summed by a shuffle tree into vectors of four tokens (`W = 4V / x` per head) and stored.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn qk_heads<T: KernelElem, const H: usize, const V: usize>(
    tile: *const T,
    qrep: *const f32,
    ql: usize,
    rows: usize,
    row_len: usize,
    scores: *mut f32,
    stride: usize,
    mut ahead: Ahead<'_, T>,
) {
    // SAFETY: the caller guarantees `rows` rows of `row_len` (a multiple of `16 · V`) elements
    // at `tile`, `H` prepared rows of `ql = rows · 8` lanes at `qrep`, and `H` score rows
    // `stride` apart with room for `row_len / x` tokens each.
    unsafe {
        let x = T::DTYPE.x();
        let zero = _mm512_setzero_ps();
        // The prefetches, spread evenly over the row loops.
        let per_row = ahead.lines().div_ceil(row_len / (V * L) * rows);
        for e0 in (0..row_len).step_by(V * L) {
            let mut acc = [[zero; V]; H];
            let kp = tile.add(e0);
            for c in 0..rows {
                ahead.next(per_row);
                let mut k = [zero; V];
                for (v, kv) in k.iter_mut().enumerate() {
                    *kv = T::load16(kp.add(c * row_len + v * L));
                }
                for (h, a) in acc.iter_mut().enumerate() {
                    // The 8 prepared lanes (x dims, repeated) in both halves match 16 / x tokens.
                    let q = broadcast8(qrep.add(h * ql + c * 8));
                    for (av, &kv) in a.iter_mut().zip(&k) {
                        *av = _mm512_fmadd_ps(kv, q, *av);
                    }
                }
            }
            // Vectors of four tokens × four lanes: W = 4V / x of them per head.
            let mut quads = [[zero; V]; H];
            for (qh, a) in quads.iter_mut().zip(&acc) {
                if x == 8 {
                    for w in 0..V / 2 {
                        qh[w] = fold_pairs(a[2 * w], a[2 * w + 1]);
                    }
                } else {
                    *qh = *a;
                }
            }
            let w_per_head = 4 * V / x;
            debug_assert!(w_per_head == 2 || w_per_head == 4, "x = {x}, V = {V}");
            let out = scores.add(e0 / x);
            if w_per_head == 4 {
                for (h, qh) in quads.iter().enumerate() {
                    let s = untranspose4(sum_quarters4(qh[0], qh[1], qh[2], qh[3]));
                    _mm512_storeu_ps(out.add(h * stride), s);
                }
            } else {
                // Two tokens' quads per head: heads in pairs fill one transpose.
                for h in (0..H).step_by(2) {
                    let (a, b) = if h + 1 < H { (quads[h + 1][0], quads[h + 1][1]) } else { (zero, zero) };
                    let s = untranspose4(sum_quarters4(quads[h][0], quads[h][1], a, b));
                    _mm256_storeu_ps(out.add(h * stride), _mm512_castps512_ps256(s));
                    if h + 1 < H {
                        _mm256_storeu_ps(out.add((h + 1) * stride), upper8(s));
                    }
                }
            }
        }
    }
}

/// # Safety
/// AVX-512F, AVX2, FMA and F16C available; `tile.len() >= d * bs`, `q_stride >= d / x * 8`,
/// `qrep.len() >= (nh - 1) * q_stride + d / x * 8`, `scores.len() >= (nh - 1) * stride + bs`;
/// `bs` in {8, 16, 32}, `d` a multiple of `x`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn qk_rows<T: KernelElem>(op: QkRows<'_, T>, ahead: Ahead<'_, T>) {
    let QkRows { heads: Heads { nh, d, bs, stride }, tile, qrep, q_stride: ql, scores } = op;
    let x = T::DTYPE.x();
    let (rows, row_len) = (d / x, bs * x);
    let (t, q, out) = (tile.as_ptr(), qrep.as_ptr(), scores.as_mut_ptr());
    // SAFETY: per the contract above (row_len = bs · x is 32, 64, 128 or 256: a multiple of 64,
    // four vectors per step, unless it is 32 — f32, block size 8 — which takes two); each call
    // covers heads h0 .. h0 + H.
    unsafe {
        for_head_groups!(nh, ahead, |h0, H| {
            let (qh, sh) = (q.add(h0 * ql), out.add(h0 * stride));
            if row_len.is_multiple_of(4 * L) {
                qk_heads::<T, H, 4>(t, qh, ql, rows, row_len, sh, stride, ahead)
            } else {
                qk_heads::<T, H, 2>(t, qh, ql, rows, row_len, sh, stride, ahead)
            }
        })
    }
}

/// Lane-wise `p · V` for `H` heads over a run of value tiles `[d, BS]`, 64 consecutive tile
/// elements (`64 / BS` rows) at a time; the `4·H` accumulators stay in registers across all
/// tiles of the run and are folded into the 8-lane `acc8` rows once per run.
#[inline(always)]
unsafe fn pv_heads<T: KernelElem, const H: usize, const BS: usize>(
    tiles: &[&[T]],
    probs: *const f32,
    stride: usize,
    d: usize,
    acc8: *mut f32,
    mut ahead: Ahead<'_, T>,
) {
    // SAFETY: the caller guarantees tiles of `d · BS` elements (a multiple of 64), `H`
    // probability rows `stride` apart covering `tiles.len() · BS` tokens, and `H` accumulators
    // of `d · 8` lanes.
    unsafe {
        let zero = _mm512_setzero_ps();
        // The prefetches, spread evenly over the (step, tile) loop.
        let per_tile = ahead.lines().div_ceil(d * BS / (4 * L) * tiles.len().max(1));
        for e0 in (0..d * BS).step_by(4 * L) {
            let mut acc = [[zero; 4]; H];
            for (j, tile) in tiles.iter().enumerate() {
                ahead.next(per_tile);
                let t = tile.as_ptr().add(e0);
                let v = [T::load16(t), T::load16(t.add(L)), T::load16(t.add(2 * L)), T::load16(t.add(3 * L))];
                let p = probs.add(j * BS);
                for (h, a) in acc.iter_mut().enumerate() {
                    let ph = p.add(h * stride);
                    // Vector u covers tokens (16u mod BS) .. + 16 of its row(s).
                    let w = match BS {
                        8 => {
                            let w = broadcast8(ph);
                            [w, w]
                        }
                        16 => {
                            let w = _mm512_loadu_ps(ph);
                            [w, w]
                        }
                        _ => [_mm512_loadu_ps(ph), _mm512_loadu_ps(ph.add(L))],
                    };
                    for (u, au) in a.iter_mut().enumerate() {
                        *au = _mm512_fmadd_ps(v[u], w[u % 2], *au);
                    }
                }
            }
            for (h, a) in acc.iter().enumerate() {
                let dst = acc8.add(h * d * 8);
                for (u, &au) in a.iter().enumerate() {
                    let e = e0 + u * L;
                    if BS == 8 {
                        // Two rows of 8 tokens: exactly the acc8 lanes of those rows.
                        let p = dst.add(e);
                        _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), au));
                    } else {
                        // 16 tokens of one row: fold onto that row's 8 lanes.
                        let p = dst.add(e / BS * 8);
                        let folded = _mm256_add_ps(_mm512_castps512_ps256(au), upper8(au));
                        _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), folded));
                    }
                }
            }
        }
    }
}

/// # Safety
/// AVX-512F, AVX2, FMA and F16C available; every tile `>= d * bs` elements, `probs.len() >= (nh - 1) * stride +
/// tiles.len() * bs`, `acc8.len() >= nh * d * 8`; `bs` in {8, 16, 32}, `d` a multiple of 8.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn pv_blocks<T: KernelElem>(op: PvBlocks<'_, T>, ahead: Ahead<'_, T>) {
    let PvBlocks { heads: Heads { nh, d, bs, stride }, tiles, probs, acc8 } = op;
    let (p, a) = (probs.as_ptr(), acc8.as_mut_ptr());
    // SAFETY: per the contract above (d · bs is a multiple of 64); each call covers heads
    // h0 .. h0 + H.
    unsafe {
        for_head_groups!(nh, ahead, |h0, H| {
            let (ph, ah) = (p.add(h0 * stride), a.add(h0 * d * 8));
            with_block_size!(bs, |BS| pv_heads::<T, H, BS>(tiles, ph, stride, d, ah, ahead))
        })
    }
}
