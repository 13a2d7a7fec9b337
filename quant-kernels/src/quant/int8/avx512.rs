//! The AVX-512 VNNI int8 kernel: two groups' codes per zmm times a token's bytes by
//! `vpdpbusd` (unsigned codes × signed activations; the signed formats' codes offset by 128
//! and the centre taken back out of the sums), the eight groups' lanes gathered by two rounds
//! of interleaves and one permute, then the f32 order of the module doc.

use std::arch::x86_64::*;

use super::avx2::{group_bytes, shifted, step_scales};
use super::{STEP, X8};
use crate::quant::RowTask;
use crate::quant::avx2::{PREFETCH_AHEAD, hsum};
use crate::quant::int16::{Codes, Layout};

/// The two 256-bit halves of `v`.
///
/// # Safety
/// AVX-512F (the callers' features).
#[inline(always)]
unsafe fn halves(v: __m512) -> [__m256; 2] {
    // SAFETY: the callers are AVX-512F functions.
    unsafe { [_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))] }
}

/// The sums of a step's 16-value halves from the four `vpdpbusd` results `d` (`d[i]`: lanes
/// 0..8 group `2i`'s eight sums of four, 8..16 group `2i + 1`'s): lane `4c + i` of the result
/// is the sum of 128-bit chunk `c` of `d[i]`, so chunk 0 holds the first 16s of groups 0, 2,
/// 4, 6, chunk 1 their second 16s, chunks 2 and 3 those of groups 1, 3, 5, 7.
///
/// # Safety
/// AVX-512F (the callers' features).
#[inline(always)]
unsafe fn sixteens(d: [__m512i; 4]) -> __m512i {
    // SAFETY: register operands only.
    unsafe {
        // Per chunk: [d0₀+d0₂, d1₀+d1₂, d0₁+d0₃, d1₁+d1₃], and the same of d2, d3.
        let a = _mm512_add_epi32(_mm512_unpacklo_epi32(d[0], d[1]), _mm512_unpackhi_epi32(d[0], d[1]));
        let b = _mm512_add_epi32(_mm512_unpacklo_epi32(d[2], d[3]), _mm512_unpackhi_epi32(d[2], d[3]));
        // Per chunk: each d[i]'s whole chunk.
        _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
    }
}

/// Rows `rows` of the part times tokens `t0..t0 + M` of `xq` (see the module doc).
///
/// # Safety
/// AVX-512F/BW/VNNI, AVX2, FMA, F16C; the rows lie in the part, whose columns are `xq`'s;
/// tokens `t0..t0 + M` are in `xq`; only this task writes its entries of `out`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn rows512<F: Codes, const M: usize>(task: RowTask<'_>, xq: &X8) {
    let RowTask { part, rows, t0, out, accumulate, .. } = task;
    let (groups, steps) = (xq.groups, xq.steps);
    let signed = F::LAYOUT == Layout::Signed;
    // Signed codes go in offset by 128 (`vpdpbusd` takes unsigned ones): 128 is their centre.
    let centre_shift = if signed {
        7
    } else if F::CENTRE == 0 {
        0
    } else {
        F::CENTRE.trailing_zeros()
    };
    // From `sixteens`' lanes: the eight groups' two 16s (to be added: the first eight lanes
    // and the last eight), or Q6_K's units in `X8`'s order.
    let (groups_order, units_order) = (
        _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15),
        _mm512_setr_epi32(0, 8, 1, 9, 4, 12, 5, 13, 2, 10, 3, 11, 6, 14, 7, 15),
    );
    for r in rows {
        let row = part.row(r).as_ptr();
        let mut acc = [_mm256_setzero_ps(); M];
        let mut off = [_mm256_setzero_ps(); M];
        for s in 0..steps {
            let n = (groups - STEP * s).min(STEP);
            // Codes past the row's end stay zero (their activations are zero too).
            let mut w = [_mm256_setzero_si256(); STEP];
            // SAFETY: groups 8s..8s + n lie in the row; the prefetch is a hint.
            let scales = unsafe {
                for (j, w) in w.iter_mut().enumerate().take(n) {
                    let g = STEP * s + j;
                    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(g * F::BYTES + PREFETCH_AHEAD) as *const i8);
                    *w = group_bytes::<F>(row, g);
                }
                step_scales::<F>(row, s, n)
            };
            let mut z = [_mm512_setzero_si512(); 4];
            for (i, z) in z.iter_mut().enumerate() {
                let pair = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(w[2 * i]), w[2 * i + 1]);
                *z = if signed { _mm512_xor_si512(pair, _mm512_set1_epi8(-128)) } else { pair };
            }
            // SAFETY: register operands only.
            let d16 = unsafe { join(scales.d) };
            for (t, (acc, off)) in acc.iter_mut().zip(&mut off).enumerate() {
                let a = xq.codes(t0 + t, s).as_ptr();
                let at = xq.at(t0 + t, s);
                // SAFETY: the step's 256 bytes of token t0 + t, and its 8 (16) sums and
                // scales, lie in xq.
                unsafe {
                    let mut d = [_mm512_setzero_si512(); 4];
                    for (i, d) in d.iter_mut().enumerate() {
                        *d = _mm512_dpbusd_epi32(
                            _mm512_setzero_si512(),
                            z[i],
                            _mm512_loadu_si512(a.add(64 * i).cast()),
                        );
                    }
                    let sums = sixteens(d);
                    if F::SPLIT {
                        let units = _mm512_permutexvar_epi32(units_order, sums);
                        let correction = _mm512_loadu_si512(xq.sums16.as_ptr().add(2 * at).cast());
                        let units = _mm512_sub_epi32(units, _mm512_slli_epi32::<7>(correction));
                        let sc = _mm512_mul_ps(d16, _mm512_loadu_ps(xq.dx16.as_ptr().add(2 * at)));
                        let ([u0, u1], [s0, s1]) = (halves(_mm512_cvtepi32_ps(units)), halves(sc));
                        *acc = _mm256_fmadd_ps(u0, s0, *acc);
                        *acc = _mm256_fmadd_ps(u1, s1, *acc);
                    } else {
                        let both = _mm512_permutexvar_epi32(groups_order, sums);
                        let mut i = _mm256_add_epi32(
                            _mm512_castsi512_si256(both),
                            _mm512_extracti64x4_epi64::<1>(both),
                        );
                        if centre_shift != 0 {
                            let sums = _mm256_loadu_si256(xq.sums.as_ptr().add(at) as *const __m256i);
                            i = _mm256_sub_epi32(i, shifted(sums, centre_shift));
                        }
                        let sc = _mm256_mul_ps(scales.d[0], _mm256_loadu_ps(xq.dx.as_ptr().add(at)));
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), sc, *acc);
                    }
                    if F::OFFSET {
                        *off = _mm256_fmadd_ps(scales.m, _mm256_loadu_ps(xq.sx.as_ptr().add(at)), *off);
                    }
                }
            }
        }
        for (t, (acc, off)) in acc.iter().zip(&off).enumerate() {
            let v = if F::OFFSET { hsum(*acc) + hsum(*off) } else { hsum(*acc) };
            // SAFETY: (t0 + t, r) is this task's entry.
            unsafe { out.put(t0 + t, r, v, accumulate) };
        }
    }
}

/// `[a | b]` as one zmm.
///
/// # Safety
/// AVX-512F (the callers' features).
#[inline(always)]
unsafe fn join([a, b]: [__m256; 2]) -> __m512 {
    // SAFETY: register operands only.
    unsafe {
        let a = _mm512_castpd256_pd512(_mm256_castps_pd(a));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(a, _mm256_castps_pd(b)))
    }
}

/// [`rows512`] for the task's format and `mr` (1..=4) tokens.
///
/// # Safety
/// As [`rows512`].
pub(super) unsafe fn dot_rows(task: RowTask<'_>, xq: &X8) {
    macro_rules! by_m {
        ($F:ty) => {
            // SAFETY: forwarded contract.
            unsafe { with_tokens!(task.mr, |M| rows512::<$F, M>(task, xq)) }
        };
    }
    with_codes!(task.part.ty, by_m, "int8")
}
