//! Decode scores over an int8 key tile ([`qk_int8`]): the codes widened to f32 and scaled by
//! their token's scale of their group of dims as they are loaded, once for every query head of
//! the kv head, so each head's score of a token is one running sum (no partial score per group
//! of dims, no pass over the scores to scale them).

use half::bf16;

use super::{Ahead, Heads};
use crate::Isa;

/// Dims per row of an int8 key tile `[d/8, bs, 8]`.
const X: usize = 8;

/// What [`qk_int8`] scores: the heads' prepared query rows (`q_stride` apart; int8's key layout
/// makes a prepared row the scaled query itself) against the `bs` keys of one int8 key tile, whose
/// scales are `scales[j * bs + t]` for group `j` of `group` dims and token `t`; head `i`'s
/// scores go to `scores[i * stride .. i * stride + bs]`.
pub(crate) struct QkInt8<'a> {
    pub heads: Heads,
    pub tile: &'a [i8],
    pub scales: &'a [bf16],
    pub group: usize,
    pub q: &'a [f32],
    pub q_stride: usize,
    pub scores: &'a mut [f32],
}

/// The scores of [`QkInt8`], prefetching `ahead` as it goes.
pub(crate) fn qk_int8<T>(isa: Isa, op: QkInt8<'_>, ahead: Ahead<'_, T>) {
    let Heads { nh, d, bs, stride } = op.heads;
    assert!(nh > 0 && d.is_multiple_of(op.group) && op.group.is_multiple_of(X) && bs.is_multiple_of(2));
    assert!(op.tile.len() >= d * bs && op.scales.len() >= d / op.group * bs);
    assert!(op.q_stride >= d && op.q.len() >= (nh - 1) * op.q_stride + d);
    assert!(stride >= bs && op.scores.len() >= (nh - 1) * stride + bs);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` is only used after `is_available` said yes; lengths checked.
        Isa::Avx512 => unsafe { x86::qk_int8_avx512(op, ahead) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for `Isa::Avx2`.
        Isa::Avx2 => unsafe { x86::qk_int8_avx2(op, ahead) },
        _ => {
            ahead.all();
            portable(op)
        }
    }
}

fn portable(op: QkInt8<'_>) {
    let Heads { nh, d, bs, stride } = op.heads;
    for h in 0..nh {
        let q = &op.q[h * op.q_stride..][..d];
        for t in 0..bs {
            let mut score = 0.0f32;
            for (j, dims) in q.chunks_exact(op.group).enumerate() {
                let sum: f32 = dims
                    .iter()
                    .enumerate()
                    .map(|(i, &qd)| {
                        let dim = j * op.group + i;
                        qd * f32::from(op.tile[(dim / X * bs + t) * X + dim % X])
                    })
                    .sum();
                score += sum * op.scales[j * bs + t].to_f32();
            }
            op.scores[h * stride + t] = score;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Ahead, Heads, QkInt8, X};

    /// Most query heads one pass over a tile serves (their accumulators stay in registers).
    const HEADS: usize = 4;
    /// Most rows of eight dims a key has (head size 256).
    const MAX_ROWS: usize = 32;

    /// A bf16 scale as f32.
    #[inline(always)]
    fn widen(s: half::bf16) -> f32 {
        f32::from_bits(u32::from(s.to_bits()) << 16)
    }

    /// Two tokens at a time, dims in lanes: a zmm holds one row of the tile for tokens `2p` and
    /// `2p + 1` (eight dims each), widened and scaled by each token's scale of the row's group,
    /// then multiplied into every head's accumulator against the row's eight query dims
    /// (duplicated in both halves); each half's eight lanes summed at the end are a token's score.
    ///
    /// # Safety
    /// AVX-512F, AVX2 and FMA are available; the lengths are [`super::qk_int8`]'s.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn qk_int8_avx512<T>(mut op: QkInt8<'_>, ahead: Ahead<'_, T>) {
        let (mut h0, mut first) = (0, Some(ahead));
        while h0 < op.heads.nh {
            let ahead = first.take().unwrap_or_else(Ahead::none);
            // SAFETY: forwarded contract; heads h0 .. h0 + H exist.
            unsafe { match_const!(op.heads.nh - h0, [1, 2, 3], 4, |H| heads512::<T, H>(&mut op, h0, ahead)) };
            h0 += HEADS;
        }
    }

    /// [`qk_int8_avx512`] for heads `h0 .. h0 + H`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn heads512<T, const H: usize>(op: &mut QkInt8<'_>, h0: usize, mut ahead: Ahead<'_, T>) {
        let Heads { d, bs, stride, .. } = op.heads;
        assert!(d / X <= MAX_ROWS, "int8 keys of {d} dims");
        let rows_per_group = op.group / X;
        let per_pair = ahead.lines().div_ceil(bs / 2);
        // SAFETY (all pointer reads and writes): inside the lengths `qk_int8` asserted.
        unsafe {
            let (tile, scales, scores) = (op.tile.as_ptr(), op.scales.as_ptr(), op.scores.as_mut_ptr());
            // Each head's rows of eight query dims, duplicated in both halves (a shuffle of the
            // low 256 bits: AVX-512F, where the 256-bit insert is DQ's), once per tile.
            let mut qd = [[_mm512_setzero_ps(); MAX_ROWS]; H];
            for (h, rows) in qd.iter_mut().enumerate() {
                for (r, v) in rows.iter_mut().enumerate().take(d / X) {
                    let row = _mm512_castps256_ps512(_mm256_loadu_ps(
                        op.q.as_ptr().add((h0 + h) * op.q_stride + r * X),
                    ));
                    *v = _mm512_shuffle_f32x4::<0b01_00_01_00>(row, row);
                }
            }
            for p in 0..bs / 2 {
                ahead.next(per_pair);
                let mut acc = [_mm512_setzero_ps(); H];
                for j in 0..d / op.group {
                    let s = scales.add(j * bs + 2 * p);
                    let both = _mm512_mask_blend_ps(
                        0xff00,
                        _mm512_set1_ps(widen(*s)),
                        _mm512_set1_ps(widen(*s.add(1))),
                    );
                    let group_rows = j * rows_per_group..(j + 1) * rows_per_group;
                    for r in group_rows {
                        let codes = _mm_loadu_si128(tile.add((r * bs + 2 * p) * X).cast());
                        let k = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes)), both);
                        for (a, q) in acc.iter_mut().zip(&qd) {
                            *a = _mm512_fmadd_ps(k, q[r], *a);
                        }
                    }
                }
                for (h, &a) in acc.iter().enumerate() {
                    // Each half's eight lanes into all of its lanes: 128-bit lanes swapped within
                    // the half, then 64-bit and 32-bit neighbours.
                    let a = _mm512_add_ps(a, _mm512_shuffle_f32x4::<0b10_11_00_01>(a, a));
                    let a = _mm512_add_ps(a, _mm512_permute_ps::<0b01_00_11_10>(a));
                    let a = _mm512_add_ps(a, _mm512_permute_ps::<0b10_11_00_01>(a));
                    let out = scores.add((h0 + h) * stride + 2 * p);
                    *out = _mm512_cvtss_f32(a);
                    *out.add(1) = _mm_cvtss_f32(_mm512_extractf32x4_ps::<2>(a));
                }
            }
        }
    }

    /// [`qk_int8_avx512`]'s eight-lane twin: one token at a time, a row's eight dims per ymm.
    ///
    /// # Safety
    /// AVX2 and FMA are available; the lengths are [`super::qk_int8`]'s.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn qk_int8_avx2<T>(mut op: QkInt8<'_>, ahead: Ahead<'_, T>) {
        let (mut h0, mut first) = (0, Some(ahead));
        while h0 < op.heads.nh {
            let ahead = first.take().unwrap_or_else(Ahead::none);
            // SAFETY: forwarded contract; heads h0 .. h0 + H exist.
            unsafe { match_const!(op.heads.nh - h0, [1, 2, 3], 4, |H| heads256::<T, H>(&mut op, h0, ahead)) };
            h0 += HEADS;
        }
    }

    /// [`qk_int8_avx2`] for heads `h0 .. h0 + H`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn heads256<T, const H: usize>(op: &mut QkInt8<'_>, h0: usize, mut ahead: Ahead<'_, T>) {
        let Heads { d, bs, stride, .. } = op.heads;
        let rows_per_group = op.group / X;
        let per_token = ahead.lines().div_ceil(bs);
        // SAFETY (all pointer reads and writes): inside the lengths `qk_int8` asserted.
        unsafe {
            let (tile, scales, scores) = (op.tile.as_ptr(), op.scales.as_ptr(), op.scores.as_mut_ptr());
            let (qp, qs) = (op.q.as_ptr(), op.q_stride);
            for t in 0..bs {
                ahead.next(per_token);
                let mut acc = [_mm256_setzero_ps(); H];
                for j in 0..d / op.group {
                    let s = _mm256_set1_ps(widen(*scales.add(j * bs + t)));
                    for r in j * rows_per_group..(j + 1) * rows_per_group {
                        let codes = _mm_loadl_epi64(tile.add((r * bs + t) * X).cast());
                        let k = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), s);
                        for (h, a) in acc.iter_mut().enumerate() {
                            let q = _mm256_loadu_ps(qp.add((h0 + h) * qs + r * X));
                            *a = _mm256_fmadd_ps(k, q, *a);
                        }
                    }
                }
                for (h, &a) in acc.iter().enumerate() {
                    let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
                    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
                    *scores.add((h0 + h) * stride + t) = _mm_cvtss_f32(s);
                }
            }
        }
    }
}
