//! The int16 decode kernel on AVX-512 VNNI ([`rows512`]): the rows of a part times up to five
//! tokens, a pair of groups per zmm, each row's codes and scales read once for all the tokens.

use std::arch::x86_64::*;

use super::X16;
use super::codes::{Codes, Layout, nibbles};
use super::lanes512::{self, LaneActs};
use crate::quant::RowTask;
use crate::quant::avx2::PREFETCH_AHEAD;

/// Sixteen-bit words of group halves `a` (low 128 bits) and `b` (high): zero-extended
/// nibble and unsigned bytes, or sign-extended Q8_0 codes.
#[inline(always)]
unsafe fn widen512<F: Codes>(a: __m128i, b: __m128i) -> __m512i {
    // SAFETY: the callers are AVX-512BW functions.
    unsafe {
        let v = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a), b);
        if F::LAYOUT == Layout::Signed { _mm512_cvtepi8_epi16(v) } else { _mm512_cvtepu8_epi16(v) }
    }
}

/// `d·dx` of a pair's group `2p` (element 0 of each) in lanes 0..8, of group `2p + 1` in
/// lanes 8..16 (`halves` picks them).
#[inline(always)]
unsafe fn pair_scales(halves: __m512i, d: __m128, dx: __m128) -> __m512 {
    // SAFETY: the callers are AVX-512F functions.
    unsafe { _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(_mm_mul_ps(d, dx))) }
}

/// One pair of groups of a row in [`rows512`]'s registers: its codes as the pair's first
/// and second 16s of words, the scales of those 16s, and the groups' offsets.
struct Pair {
    first: __m512i,
    second: __m512i,
    d: [__m128; 2],
    m: __m128,
}

/// Pair `p` of the row at `row` (its second group absent, zero, when `p == full`).
///
/// # Safety
/// AVX-512F/BW, AVX2, FMA, F16C (the callers' features); group `2p` lies in the row, and
/// `2p + 1` when `p < full`.
#[inline(always)]
unsafe fn pair<F: Codes>(row: *const u8, p: usize, full: usize, block: &[f32; 16]) -> Pair {
    let (g0, g1) = (2 * p, 2 * p + 1);
    // SAFETY: per the contract; the prefetch is a hint.
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(g0 * F::BYTES + PREFETCH_AHEAD) as *const i8);
        let [first, second] = match F::pair_words(row, p, full) {
            Some(words) => words,
            None => {
                let [a0, a1] = F::halves(row, g0);
                let [b0, b1] = if p < full { F::halves(row, g1) } else { [_mm_setzero_si128(); 2] };
                if nibbles::<F>() {
                    let w = widen512::<F>(a0, b0);
                    [_mm512_and_si512(w, _mm512_set1_epi16(0x0f)), _mm512_srli_epi16::<4>(w)]
                } else {
                    [widen512::<F>(a0, b0), widen512::<F>(a1, b1)]
                }
            }
        };
        let [first, second] = if F::CENTRE == 0 {
            [first, second]
        } else {
            let centre = _mm512_set1_epi16(F::CENTRE);
            [_mm512_sub_epi16(first, centre), _mm512_sub_epi16(second, centre)]
        };
        // The scales of the pair's first 16s and second 16s (equal unless SPLIT).
        let (d, m) = if F::BLOCK_SCALES {
            // Groups g0 and g1 of the super-block whose scales the caller read.
            let pair_of = |at: usize| _mm_castpd_ps(_mm_load_sd(block.as_ptr().add(at) as *const f64));
            if F::SPLIT {
                // Scales per 16: group g's first at 2g, its second at 2g + 1.
                let v = _mm_loadu_ps(block.as_ptr().add(2 * (g0 % 8)));
                ([_mm_shuffle_ps::<0b10_00>(v, v), _mm_shuffle_ps::<0b11_01>(v, v)], _mm_setzero_ps())
            } else {
                ([pair_of(g0 % 8); 2], pair_of(8 + g0 % 8))
            }
        } else {
            let (d0, m0) = F::scale(row, g0);
            let (d1, m1) = if p < full { F::scale(row, g1) } else { ([0.0; 2], 0.0) };
            let d = [_mm_setr_ps(d0[0], d1[0], 0.0, 0.0), _mm_setr_ps(d0[1], d1[1], 0.0, 0.0)];
            (d, _mm_setr_ps(m0, m1, 0.0, 0.0))
        };
        Pair { first, second, d, m }
    }
}

/// Pair `p`'s products with token `t`'s words, scaled by `d·dx`, into `acc`, and its
/// offsets `m·Σx` into `off` (lanes 0 and 1).
///
/// # Safety
/// AVX-512F/BW/VNNI, AVX2, FMA, F16C (the callers' features); token `t`'s pair `p` lies in
/// `xq` (and its group `2p + 1` when `p < full`).
#[inline(always)]
unsafe fn multiply<F: Codes>(
    q: &Pair,
    xq: &X16,
    t: usize,
    p: usize,
    full: usize,
    acc: &mut __m512,
    off: &mut __m128,
) {
    // SAFETY: per the contract.
    unsafe {
        // Lanes 0..8 take element 0 of a two-float vector, lanes 8..16 element 1.
        let halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        let w = xq.pair(t, p).as_ptr();
        let dx = xq.dx.as_ptr().add((t * xq.pairs() + p) * 2);
        let dx = _mm_castpd_ps(_mm_load_sd(dx as *const f64));
        let first_half =
            _mm512_dpwssd_epi32(_mm512_setzero_si512(), q.first, _mm512_loadu_si512(w as *const _));
        let w_second = _mm512_loadu_si512(w.add(32) as *const _);
        if F::SPLIT {
            let second_half = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q.second, w_second);
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(first_half), pair_scales(halves, q.d[0], dx), *acc);
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(second_half), pair_scales(halves, q.d[1], dx), *acc);
        } else {
            let dot = _mm512_cvtepi32_ps(_mm512_dpwssd_epi32(first_half, q.second, w_second));
            *acc = _mm512_fmadd_ps(dot, pair_scales(halves, q.d[0], dx), *acc);
        }
        if F::OFFSET {
            // The group sums of 2p and 2p + 1 (only 2p's where the pair is the odd last
            // group: the next float is another token's).
            let sums = xq.sums.as_ptr().add(t * xq.groups + 2 * p);
            let sums =
                if p < full { _mm_castpd_ps(_mm_load_sd(sums as *const f64)) } else { _mm_load_ss(sums) };
            *off = _mm_fmadd_ps(q.m, sums, *off);
        }
    }
}

/// Rows `rows` of `part` times tokens `t0..t0+M` of `xq`, two groups per zmm: for each
/// token, `vpdpwssd` of the pair's codes with its words (lanes 0..8 sum group `2p`, 8..16
/// group `2p+1`), converted and scaled by `d·dx` per lane; the offsets as `m·Σx`. Even and
/// odd pairs add into accumulators of their own: one chain of dependent FMAs per row and
/// token was the kernel's critical path.
///
/// # Safety
/// AVX-512F/BW/VNNI, AVX2, FMA, F16C; the rows and tokens lie inside `part` and `xq`; only
/// this task writes columns `rows` of `out`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn rows512<F: Codes, const M: usize>(task: RowTask<'_>, xq: &X16) {
    let RowTask { part, rows, t0, out, accumulate, .. } = task;
    let pairs = xq.pairs();
    let full = xq.groups / 2;
    for r in rows {
        let row = part.row(r).as_ptr();
        let mut acc = [[_mm512_setzero_ps(); 2]; M];
        let mut off = [[_mm_setzero_ps(); 2]; M];
        let mut p = 0;
        // SAFETY (both loops): pairs p < pairs lie in the row (group 2p + 1 too when
        // p < full) and in each token's words; tokens t0..t0+M are in xq.
        unsafe {
            // A K-quant super-block's scales (four pairs), read when its first pair comes.
            let mut block = [0.0f32; 16];
            while p + 2 <= pairs {
                if F::BLOCK_SCALES && p % 4 == 0 {
                    block = F::block_scales(row, p / 4);
                }
                let (even, odd) = (pair::<F>(row, p, full, &block), pair::<F>(row, p + 1, full, &block));
                for (t, (a, o)) in acc.iter_mut().zip(&mut off).enumerate() {
                    multiply::<F>(&even, xq, t0 + t, p, full, &mut a[0], &mut o[0]);
                    multiply::<F>(&odd, xq, t0 + t, p + 1, full, &mut a[1], &mut o[1]);
                }
                p += 2;
            }
            if p < pairs {
                // Never a K-quant's: their rows are whole super-blocks, four pairs each.
                let last = pair::<F>(row, p, full, &block);
                for (t, (a, o)) in acc.iter_mut().zip(&mut off).enumerate() {
                    multiply::<F>(&last, xq, t0 + t, p, full, &mut a[0], &mut o[0]);
                }
            }
        }
        for (t, (a, o)) in acc.iter().zip(&off).enumerate() {
            let o = _mm_add_ps(o[0], o[1]);
            let offsets = _mm_cvtss_f32(_mm_add_ss(o, _mm_movehdup_ps(o)));
            let dot = _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1]));
            // SAFETY: (t0 + t, r) is this task's entry.
            unsafe { out.put(t0 + t, r, dot + offsets, accumulate) };
        }
    }
}

/// Most tokens one pass of [`rows512`] serves: each row's codes are decoded once for all of
/// them; past five, the accumulators and the addresses of the tokens' activations no longer
/// fit the registers and the loop spills (a 6-token pass cost about what a 3 + 3 split does, an
/// 8-token pass half as much again as 4 + 4).
pub(in crate::quant) const TOKENS_PER_PASS: usize = 5;

/// The task's `mr` tokens of a part in a format [`super::supports`] takes: whole blocks of
/// sixteen rows through [`lanes512`] where the caller made `acts` for them (at most its
/// `TOKENS_PER_PASS`), the other rows through [`rows512`] in passes of at most
/// [`TOKENS_PER_PASS`].
///
/// # Safety
/// As [`rows512`]'s; `acts`, when given, was made from `xq` for all its tokens.
pub(in crate::quant) unsafe fn dot_rows_avx512(task: RowTask<'_>, xq: &X16, acts: Option<&LaneActs>) {
    macro_rules! by_m {
        ($F:ty) => {
            // SAFETY: forwarded contract.
            unsafe {
                let mut task = task;
                if let Some(acts) = acts {
                    task.rows.start = lanes512::dot_rows_lanes::<$F>(&task, xq, acts);
                }
                // The rest in passes of at most TOKENS_PER_PASS.
                let (t0, mr) = (task.t0, task.mr);
                let per_pass = crate::linear::tokens_per_even_pass(mr, TOKENS_PER_PASS);
                for t in (t0..t0 + mr).step_by(per_pass) {
                    let task = RowTask { t0: t, mr: (t0 + mr - t).min(per_pass), ..task.clone() };
                    match task.mr {
                        1 => rows512::<$F, 1>(task, xq),
                        2 => rows512::<$F, 2>(task, xq),
                        3 => rows512::<$F, 3>(task, xq),
                        4 => rows512::<$F, 4>(task, xq),
                        _ => rows512::<$F, 5>(task, xq),
                    }
                }
            }
        };
    }
    with_codes!(task.part.ty, by_m, "int16")
}
