//! The int16 decode kernels: activations rounded into [`X16`] ([`quantize_group`]), and the
//! rows of a part times a few tokens on AVX2 ([`rows256`], a group at a time; AVX-512 VNNI's
//! are in [`super::rows512`]).

use std::arch::x86_64::*;

use super::X16;
use super::codes::{Codes, Layout, nibbles};
use crate::quant::RowTask;
use crate::quant::avx2::{PREFETCH_AHEAD, hsum};

/// One group of 32 activations at `x` into int16 words: values 0..16 at `words`, 16..32 at
/// `words + 32`; returns the group's f32 sum and scale (see [`X16::quantize`]).
///
/// # Safety
/// AVX2, FMA and F16C are available; `x` holds 32 floats; `words` holds 48 words.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::quant) unsafe fn quantize_group(x: *const f32, words: *mut i16) -> (f32, f32) {
    // SAFETY: per the contract.
    unsafe {
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.add(8 * i)));
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let m = v.iter().fold(_mm256_setzero_ps(), |a, &x| _mm256_max_ps(a, _mm256_and_ps(x, abs)));
        let s = v.iter().fold(_mm256_setzero_ps(), |a, &x| _mm256_add_ps(a, x));
        let (amax, sum) = (hmax(m), hsum(s));
        // Below TINY, 32767/amax would overflow: such groups (all zero, or every value under
        // 1e-30, whose products vanish in any f32 output) get no codes.
        const TINY: f32 = 1e-30;
        if !sum.is_finite() || amax < TINY {
            // NaN or ±∞ inside (max ignores NaN; the sum does not), or all tiny: no codes.
            for i in [0, 32] {
                _mm256_storeu_si256(words.add(i) as *mut __m256i, _mm256_setzero_si256());
            }
            return (sum, if sum.is_finite() { 0.0 } else { f32::NAN });
        }
        let inv = _mm256_set1_ps(32767.0 / amax);
        // Values 0..16, then 16..32: sixteen at a time, rounded to nearest (|x·inv| ≤ 32767).
        for h in 0..2 {
            let q = [v[2 * h], v[2 * h + 1]].map(|x| _mm256_cvtps_epi32(_mm256_mul_ps(x, inv)));
            // packs interleaves 128-bit lanes: the permute puts the words back in order.
            let w = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[0], q[1]));
            _mm256_storeu_si256(words.add(32 * h) as *mut __m256i, w);
        }
        (sum, amax / 32767.0)
    }
}

/// The largest of eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hmax(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)))
}

/// [`super::rows512::rows512`]'s eight-lane twin: one group at a time, a quarter of a pair's words per
/// `vpmaddwd`; eight rows in the lanes ([`rows8`], two tokens a pass), the rest in blocks of
/// rows ([`rows256_block`]) whose chains of dependent FMAs interleave; Q6_K, the split format,
/// a super-block at a time in a kernel of its own ([`super::q6k_avx2`]).
///
/// # Safety
/// AVX2, FMA, F16C; otherwise as [`super::rows512::rows512`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows256<F: Codes, const M: usize>(task: RowTask<'_>, xq: &X16) {
    if F::SPLIT {
        // SAFETY: the one split format, Q6_K, has a kernel of its own; forwarded contract.
        return unsafe { super::q6k_avx2::rows::<M>(task, xq) };
    }
    let mut r = task.rows.start;
    // SAFETY (all calls): rows r.. of the block lie in the task's rows; forwarded contract.
    unsafe {
        while r + 8 <= task.rows.end {
            // Two tokens at a time: the eight rows' bytes are in L1 for the next two.
            let mut t = 0;
            while t + 2 <= M {
                rows8::<F, 2>(&task, task.t0 + t, r, xq);
                t += 2;
            }
            if t < M {
                rows8::<F, 1>(&task, task.t0 + t, r, xq);
            }
            r += 8;
        }
        if M == 1 {
            while r + 4 <= task.rows.end {
                rows256_block::<F, M, 4>(&task, r, xq);
                r += 4;
            }
        }
        while r + 2 <= task.rows.end {
            rows256_block::<F, M, 2>(&task, r, xq);
            r += 2;
        }
        if r < task.rows.end {
            rows256_block::<F, M, 1>(&task, r, xq);
        }
    }
}

/// Rows `r0..r0 + 8` of the task's part times tokens `t0..t0 + M`, the rows in the lanes: per group,
/// each row's integer sum over its stored codes (no centring), the eight folded into one vector
/// (`vphaddd`, then the 128-bit halves), less `CENTRE·Σx̃`, converted and scaled by the rows'
/// `d` (gathered) times the token's `dx` in one FMA; so the per-row work is the codes and two
/// `vpmaddwd`, and the scaling is shared by eight rows.
///
/// # Safety
/// As [`rows256`]; rows `r0..r0 + 8` lie in the task's rows, tokens `t0..t0 + M` in its
/// tokens; the format is not [`Codes::SPLIT`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows8<F: Codes, const M: usize>(task: &RowTask<'_>, t0: usize, r0: usize, xq: &X16) {
    let RowTask { part, out, accumulate, .. } = *task;
    let (groups, pairs) = (xq.groups, xq.pairs());
    let low4 = _mm256_set1_epi16(0x0f);
    let rows: [*const u8; 8] = std::array::from_fn(|i| part.row(r0 + i).as_ptr());
    // The same bytes of the next eight rows, read after these: a page ahead (the other
    // kernels' distance) lands inside this block's own rows where rows are short.
    let ahead = 8 * part.row_bytes();
    let (mut acc, mut offsets) = ([_mm256_setzero_ps(); M], [_mm256_setzero_ps(); M]);
    // A K-quant super-block's scales ([`Codes::block_scales`]) for the eight rows, read at its
    // first group: `block[j]` the rows' scales of its group j, `block[8 + j]` their offsets.
    let mut block = [[0.0f32; 8]; 16];
    for g in 0..groups {
        let (p, half) = (g / 2, g % 2);
        // SAFETY (whole loop body): group g is in every row; tokens t0..t0 + M's pair p and
        // group g are in xq; the prefetch is a hint.
        unsafe {
            let words: [*const i16; M] = std::array::from_fn(|t| xq.pair(t0 + t, p).as_ptr().add(16 * half));
            let xa: [__m256i; M] = std::array::from_fn(|t| _mm256_loadu_si256(words[t] as *const __m256i));
            let xb: [__m256i; M] =
                std::array::from_fn(|t| _mm256_loadu_si256(words[t].add(32) as *const __m256i));
            // One prefetch per cache line the groups start in.
            if (g * F::BYTES) % 64 < F::BYTES {
                for row in rows {
                    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(g * F::BYTES + ahead) as *const i8);
                }
            }
            // The rows' scales (and offsets): gathered as eight halves and converted at once
            // where they are f16s ([`Codes::F16_SCALES`]), a super-block's at once where the
            // format has them ([`Codes::BLOCK_SCALES`]), else read row by row.
            let (d, m) = if F::F16_SCALES {
                // Packed four at a time in general registers (shifts and ORs on the integer
                // pipes), not inserted word by word into one vector (a chain of shuffles).
                let halves = |at: usize| {
                    let h =
                        |i: usize| u64::from((rows[i].add(g * F::BYTES + at) as *const u16).read_unaligned());
                    let four = |i: usize| (h(i) | h(i + 1) << 16 | h(i + 2) << 32 | h(i + 3) << 48) as i64;
                    _mm256_cvtph_ps(_mm_set_epi64x(four(4), four(0)))
                };
                (halves(0), if F::OFFSET { halves(2) } else { _mm256_setzero_ps() })
            } else if F::BLOCK_SCALES {
                if g % 8 == 0 {
                    for (i, &row) in rows.iter().enumerate() {
                        for (j, v) in F::block_scales(row, g / 8).into_iter().enumerate() {
                            block[j][i] = v;
                        }
                    }
                }
                (_mm256_loadu_ps(block[g % 8].as_ptr()), _mm256_loadu_ps(block[8 + g % 8].as_ptr()))
            } else {
                let (mut d, mut m) = ([0.0f32; 8], [0.0f32; 8]);
                for (i, &row) in rows.iter().enumerate() {
                    let (scale, offset) = F::scale(row, g);
                    (d[i], m[i]) = (scale[0], offset);
                }
                (_mm256_loadu_ps(d.as_ptr()), _mm256_loadu_ps(m.as_ptr()))
            };
            let dot = |i: usize| row_sums::<F, M>(rows[i], g, &xa, &xb, low4);
            // Lane j of `low`: rows 0..4's sums over lanes 0..4 (j < 4) or rows 4..8's; of
            // `high`, over lanes 4..8.
            let q0 = hadd(hadd(dot(0), dot(1)), hadd(dot(2), dot(3)));
            let q1 = hadd(hadd(dot(4), dot(5)), hadd(dot(6), dot(7)));
            for t in 0..M {
                let low = _mm256_permute2x128_si256::<0x20>(q0[t], q1[t]);
                let high = _mm256_permute2x128_si256::<0x31>(q0[t], q1[t]);
                let mut sums = _mm256_add_epi32(low, high);
                if F::CENTRE != 0 {
                    let centre = i32::from(F::CENTRE) * *xq.word_sums.get_unchecked((t0 + t) * groups + g);
                    sums = _mm256_sub_epi32(sums, _mm256_set1_epi32(centre));
                }
                let dx = _mm256_set1_ps(*xq.dx.get_unchecked(((t0 + t) * pairs + p) * 2 + half));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(d, dx), acc[t]);
                if F::OFFSET {
                    let s = _mm256_set1_ps(*xq.sums.get_unchecked((t0 + t) * groups + g));
                    offsets[t] = _mm256_fmadd_ps(m, s, offsets[t]);
                }
            }
        }
    }
    for (t, (a, o)) in acc.iter().zip(&offsets).enumerate() {
        let mut lanes = [0.0f32; 8];
        // SAFETY: AVX is available (the target features); `lanes` holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(*a, *o)) };
        for (i, v) in lanes.into_iter().enumerate() {
            // SAFETY: (t0 + t, r0 + i) is this task's entry.
            unsafe { out.put(t0 + t, r0 + i, v, accumulate) };
        }
    }
}

/// Group `g` of the row at `row` (its stored codes) times each token's words: eight int32
/// lanes per token whose sum is the group's integer dot product.
///
/// # Safety
/// AVX2 (the caller's features); group `g` lies in the row.
#[inline(always)]
unsafe fn row_sums<F: Codes, const M: usize>(
    row: *const u8,
    g: usize,
    xa: &[__m256i; M],
    xb: &[__m256i; M],
    low4: __m256i,
) -> [__m256i; M] {
    // SAFETY: per the contract.
    unsafe {
        let (first, second) = widen::<F>(row, g, low4);
        std::array::from_fn(|t| {
            _mm256_add_epi32(_mm256_madd_epi16(first, xa[t]), _mm256_madd_epi16(second, xb[t]))
        })
    }
}

/// Group `g`'s stored codes as the words of its first and second 16 (`low4`: sixteen 0x0f
/// words); a [`Layout::Nibbles`] group's sixteen bytes, at `CODES_AT`, zero-extended by one
/// load and split in ymm.
///
/// # Safety
/// AVX2 (the caller's features); group `g` lies in the row at `row`.
#[inline(always)]
pub(in crate::quant) unsafe fn widen<F: Codes>(
    row: *const u8,
    g: usize,
    low4: __m256i,
) -> (__m256i, __m256i) {
    // SAFETY: per the contract.
    unsafe {
        if nibbles::<F>() {
            let w = zero_extend(row.add(g * F::BYTES + F::CODES_AT));
            return (_mm256_and_si256(w, low4), _mm256_srli_epi16::<4>(w));
        }
        let [a0, a1] = F::halves(row, g);
        if F::LAYOUT == Layout::Signed {
            (_mm256_cvtepi8_epi16(a0), _mm256_cvtepi8_epi16(a1))
        } else {
            (_mm256_cvtepu8_epi16(a0), _mm256_cvtepu8_epi16(a1))
        }
    }
}

/// The 16 bytes at `p` zero-extended into words: one `vpmovzxbw` from memory, in `asm!`
/// because LLVM otherwise moves the nibble split that follows ahead of the extension (two
/// 128-bit masks and two extensions where one extension and two ymm operations do).
///
/// # Safety
/// AVX2; `p` is readable for 16 bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn zero_extend(p: *const u8) -> __m256i {
    let w: __m256i;
    // SAFETY: a 16-byte read at `p` (the contract), on a CPU with AVX2.
    unsafe {
        std::arch::asm!(
            "vpmovzxbw {w}, xmmword ptr [{p}]",
            w = lateout(ymm_reg) w,
            p = in(reg) p,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    w
}

/// Lane-wise `vphaddd` of two tokens' lists of vectors.
///
/// # Safety
/// AVX2 (the caller's features).
#[inline(always)]
unsafe fn hadd<const M: usize>(a: [__m256i; M], b: [__m256i; M]) -> [__m256i; M] {
    // SAFETY: per the contract.
    std::array::from_fn(|t| unsafe { _mm256_hadd_epi32(a[t], b[t]) })
}

/// Rows `r0..r0 + R` of the task's part times its `M` tokens, group by group.
///
/// # Safety
/// As [`rows256`]; rows `r0..r0 + R` lie in the task's rows; the format is not
/// [`Codes::SPLIT`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows256_block<F: Codes, const M: usize, const R: usize>(task: &RowTask<'_>, r0: usize, xq: &X16) {
    let RowTask { part, t0, out, accumulate, .. } = *task;
    let groups = xq.groups;
    let pairs = xq.pairs();
    let low4 = _mm256_set1_epi16(0x0f);
    let rows: [*const u8; R] = std::array::from_fn(|i| part.row(r0 + i).as_ptr());
    let mut acc = [[_mm256_setzero_ps(); M]; R];
    let mut offsets = [[0.0f32; M]; R];
    for g in 0..groups {
        let (p, half) = (g / 2, g % 2);
        // Each token's words and scale for this group, shared by the block's rows.
        // SAFETY: tokens t0..t0 + M and their pair p are in xq.
        let (words, dxs): ([*const i16; M], [f32; M]) = unsafe {
            (
                std::array::from_fn(|t| xq.pair(t0 + t, p).as_ptr().add(16 * half)),
                std::array::from_fn(|t| *xq.dx.get_unchecked(((t0 + t) * pairs + p) * 2 + half)),
            )
        };
        for (i, &row) in rows.iter().enumerate() {
            // SAFETY: group g is in the row; the prefetch is a hint; tokens t0..t0 + M are in xq.
            unsafe {
                // One prefetch per cache line the groups start in, not a load µop per group.
                if (g * F::BYTES) % 64 < F::BYTES {
                    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(g * F::BYTES + PREFETCH_AHEAD) as *const i8);
                }
                let (d, m) = F::scale(row, g);
                let (first, second) = widen::<F>(row, g, low4);
                let (first, second) = if F::CENTRE == 0 {
                    (first, second)
                } else {
                    let centre = _mm256_set1_epi16(F::CENTRE);
                    (_mm256_sub_epi16(first, centre), _mm256_sub_epi16(second, centre))
                };
                for (t, (a, o)) in acc[i].iter_mut().zip(&mut offsets[i]).enumerate() {
                    let (words, dx) = (words[t], dxs[t]);
                    let first_half = _mm256_madd_epi16(first, _mm256_loadu_si256(words as *const __m256i));
                    let second_half =
                        _mm256_madd_epi16(second, _mm256_loadu_si256(words.add(32) as *const __m256i));
                    let dot = _mm256_cvtepi32_ps(_mm256_add_epi32(first_half, second_half));
                    *a = _mm256_fmadd_ps(dot, _mm256_set1_ps(d[0] * dx), *a);
                    if F::OFFSET {
                        *o = m.mul_add(*xq.sums.get_unchecked((t0 + t) * groups + g), *o);
                    }
                }
            }
        }
    }
    for (i, (a, o)) in acc.iter().zip(&offsets).enumerate() {
        for (t, (a, o)) in a.iter().zip(o).enumerate() {
            // SAFETY: (t0 + t, r0 + i) is this task's entry.
            unsafe { out.put(t0 + t, r0 + i, hsum(*a) + o, accumulate) };
        }
    }
}

/// One dispatch over format and token count for a row kernel.
macro_rules! dispatch {
    ($name:ident, $kernel:ident) => {
        /// [`$kernel`] for the task's `mr` (1..=4) tokens of a part in a format
        /// [`super::supports`] takes.
        ///
        /// # Safety
        /// As the kernel's.
        pub(in crate::quant) unsafe fn $name(task: RowTask<'_>, xq: &X16) {
            macro_rules! by_m {
                ($F:ty) => {
                    // SAFETY: forwarded contract.
                    unsafe { with_tokens!(task.mr, |M| $kernel::<$F, M>(task, xq)) }
                };
            }
            with_codes!(task.part.ty, by_m, "int16")
        }
    };
}

dispatch!(dot_rows_avx2, rows256);
