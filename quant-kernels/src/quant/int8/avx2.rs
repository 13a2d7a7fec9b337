//! The AVX2 int8 kernel (`vpmaddubsw` + `vpmaddwd`, eight groups' sums gathered by `vphaddd`),
//! and the readers of a step of eight groups that it shares with the AVX-512 kernel: the
//! codes as bytes and the scales as vectors.

use std::arch::x86_64::*;

use super::{STEP, X8};
use crate::quant::RowTask;
use crate::quant::avx2::{PREFETCH_AHEAD, hsum};
use crate::quant::int16::{Codes, Layout};

/// Group `g`'s 32 codes in value order, one per byte: unsigned for [`Layout::Nibbles`] and
/// [`Layout::Unsigned`], signed (`i8`) for [`Layout::Signed`].
///
/// # Safety
/// AVX2 (the callers' features); group `g` lies in the row at `row`.
#[inline(always)]
pub(super) unsafe fn group_bytes<F: Codes>(row: *const u8, g: usize) -> __m256i {
    // SAFETY: per the contract.
    unsafe {
        let [a, b] = F::halves(row, g);
        if F::LAYOUT == Layout::Nibbles {
            // Both halves are the sixteen bytes: the low nibbles are values 0..16.
            let low4 = _mm_set1_epi8(0x0f);
            _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(a), low4), _mm_and_si128(a, low4))
        } else {
            _mm256_set_m128i(b, a)
        }
    }
}

/// The scales of a step: `d` of its eight groups (Q6_K: of its sixteen 16s, in the unit order
/// of [`X8`], `d[0]` for the first eight and `d[1]` for the rest) and their offsets `m`;
/// zero for groups past the row's end.
pub(super) struct StepScales {
    pub d: [__m256; 2],
    pub m: __m256,
}

/// The scales of step `s` of the row at `row`, whose first `n` groups exist.
///
/// # Safety
/// AVX2, F16C (the callers' features); groups `8s..8s + n` lie in the row (all eight for the
/// K-quants, whose rows are whole super-blocks).
#[inline(always)]
pub(super) unsafe fn step_scales<F: Codes>(row: *const u8, s: usize, n: usize) -> StepScales {
    // SAFETY: per the contract.
    unsafe {
        if F::BLOCK_SCALES {
            let block = F::block_scales(row, s);
            let (first, second) = (_mm256_loadu_ps(block.as_ptr()), _mm256_loadu_ps(block.as_ptr().add(8)));
            if F::SPLIT {
                // Units 2j and 2j + 1 (group j's 16s) to lanes j and 4 + j.
                let order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
                let d = [_mm256_permutevar8x32_ps(first, order), _mm256_permutevar8x32_ps(second, order)];
                StepScales { d, m: _mm256_setzero_ps() }
            } else {
                StepScales { d: [first, _mm256_setzero_ps()], m: second }
            }
        } else {
            // One block per group: f16 d at its start, (offset formats) f16 m after it.
            let (mut d, mut m) = (_mm_setzero_si128(), _mm_setzero_si128());
            macro_rules! lane {
                ($($j:literal)*) => {$(
                    if $j < n {
                        let at = row.add((STEP * s + $j) * F::BYTES) as *const u16;
                        d = _mm_insert_epi16::<$j>(d, i32::from(at.read_unaligned()));
                        if F::OFFSET {
                            m = _mm_insert_epi16::<$j>(m, i32::from(at.add(1).read_unaligned()));
                        }
                    }
                )*};
            }
            lane!(0 1 2 3 4 5 6 7);
            StepScales { d: [_mm256_cvtph_ps(d), _mm256_setzero_ps()], m: _mm256_cvtph_ps(m) }
        }
    }
}

/// `x·2^shift` per lane (the centre times the activations' sums).
///
/// # Safety
/// AVX2 (the callers' features).
#[inline(always)]
pub(super) unsafe fn shifted(x: __m256i, shift: u32) -> __m256i {
    // SAFETY: register operands only.
    unsafe { _mm256_sll_epi32(x, _mm_cvtsi32_si128(shift as i32)) }
}

/// Rows `rows` of the part times tokens `t0..t0 + M` of `xq`: per step, each group's codes
/// times each token's bytes by `vpmaddubsw` (the Signed formats' absolute codes times the
/// activations under their signs, so no pair of products passes the i16 range), pairs summed
/// by `vpmaddwd`, the eight groups' lanes by two rounds of `vphaddd` (which leave Q6_K's 16s
/// in the unit order) and one of 128-bit halves; then the f32 order of the module doc.
///
/// # Safety
/// AVX2, FMA, F16C; the rows lie in the part, whose columns are `xq`'s; tokens `t0..t0 + M`
/// are in `xq`; only this task writes its entries of `out`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows256<F: Codes, const M: usize>(task: RowTask<'_>, xq: &X8) {
    let RowTask { part, rows, t0, out, accumulate, .. } = task;
    let (groups, steps) = (xq.groups, xq.steps);
    let signed = F::LAYOUT == Layout::Signed;
    // The Signed formats need no centre: their codes are multiplied as they are.
    let centre_shift = if signed || F::CENTRE == 0 { 0 } else { F::CENTRE.trailing_zeros() };
    let ones = _mm256_set1_epi16(1);
    for r in rows {
        let row = part.row(r).as_ptr();
        let mut acc = [_mm256_setzero_ps(); M];
        let mut off = [_mm256_setzero_ps(); M];
        for s in 0..steps {
            let n = (groups - STEP * s).min(STEP);
            // Codes past the row's end stay zero (their activations are zero too).
            let mut w = [_mm256_setzero_si256(); STEP];
            let mut u = [_mm256_setzero_si256(); STEP];
            // SAFETY: groups 8s..8s + n lie in the row; the prefetch is a hint.
            let scales = unsafe {
                for (j, (w, u)) in w.iter_mut().zip(&mut u).enumerate().take(n) {
                    let g = STEP * s + j;
                    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(g * F::BYTES + PREFETCH_AHEAD) as *const i8);
                    *w = group_bytes::<F>(row, g);
                    *u = if signed { _mm256_abs_epi8(*w) } else { *w };
                }
                step_scales::<F>(row, s, n)
            };
            for (t, (acc, off)) in acc.iter_mut().zip(&mut off).enumerate() {
                let a = xq.codes(t0 + t, s).as_ptr();
                let at = xq.at(t0 + t, s);
                let mut v = [_mm256_setzero_si256(); STEP];
                // SAFETY: the step's 256 bytes of token t0 + t, and its 8 (16) sums and
                // scales, lie in xq.
                unsafe {
                    for (j, v) in v.iter_mut().enumerate() {
                        let x = _mm256_loadu_si256(a.add(32 * j) as *const __m256i);
                        let x = if signed { _mm256_sign_epi8(x, w[j]) } else { x };
                        *v = _mm256_madd_epi16(_mm256_maddubs_epi16(u[j], x), ones);
                    }
                    // Lanes 0..4: groups 0..4's first 16s; 4..8: their second 16s (q1: 4..8).
                    let q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
                    let q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
                    if F::SPLIT {
                        let dx = xq.dx16.as_ptr().add(2 * at);
                        let (s0, s1) = (
                            _mm256_mul_ps(scales.d[0], _mm256_loadu_ps(dx)),
                            _mm256_mul_ps(scales.d[1], _mm256_loadu_ps(dx.add(8))),
                        );
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q0), s0, *acc);
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q1), s1, *acc);
                    } else {
                        let mut i = _mm256_add_epi32(
                            _mm256_permute2x128_si256::<0x20>(q0, q1),
                            _mm256_permute2x128_si256::<0x31>(q0, q1),
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

/// [`rows256`] for the task's format and `mr` (1..=4) tokens.
///
/// # Safety
/// As [`rows256`].
pub(super) unsafe fn dot_rows(task: RowTask<'_>, xq: &X8) {
    macro_rules! by_m {
        ($F:ty) => {
            // SAFETY: forwarded contract.
            unsafe { with_tokens!(task.mr, |M| rows256::<$F, M>(task, xq)) }
        };
    }
    with_codes!(task.part.ty, by_m, "int8")
}
