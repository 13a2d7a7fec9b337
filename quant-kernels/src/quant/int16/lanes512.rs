//! The int16 decode kernel on AVX-512 VNNI with sixteen rows in the lanes ([`rows_in_lanes`]),
//! for every format of the int16 path.
//!
//! [`super::rows512`] puts a row's codes in the lanes: per token and pair of groups it needs
//! two `vpdpwssd`, a conversion, a scale permute and multiply and an FMA, then a horizontal
//! sum per row and token; past one token its scale handling, not the bytes it reads, bounds it.
//! Here a zmm holds two codes of each of sixteen rows, so one `vpdpwssd` with the token's two
//! activations broadcast advances sixteen rows' dot products, a group's sixteen of them make
//! each row's exact integer sum, and that sum is scaled once per group and token for all
//! sixteen rows (one conversion, one multiply, one FMA, and one more FMA for an offset
//! format). No horizontal sums at all.
//!
//! The rows' sixteen code bytes of a group (a nibble format's sixteen, a byte format's two
//! sixteens) are read as four zmm of four rows each and transposed in 128-bit lanes
//! ([`transpose`]): dword `q` of every row, lane `j` holding row `4·(j % 4) + j / 4`. Each such
//! dword splits into two words of codes per lane in one or two instructions; the code pairs
//! come out in one order for every format ([`pair_codes`]), and [`LaneActs`] lays each
//! token's activations out in that order once per call. The centred formats' `−CENTRE·Σx̃`
//! starts each integer sum, so the codes are used as stored.
//!
//! Rounding: each group's integer sum is exact (as in `rows512`) and converted once; the f32
//! sums over groups differ from `rows512`'s only in their order.

use std::arch::x86_64::*;

use super::X16;
use super::codes::{Codes, Layout};
use crate::quant::RowTask;

/// Most tokens one pass serves (eight sums and eight accumulators beside a quarter's operands
/// still fit the registers).
pub(in crate::quant) const TOKENS_PER_PASS: usize = 8;

/// Rows per block of the kernel: the lanes of a zmm of dwords.
pub(in crate::quant) const ROWS: usize = 16;

/// The two codes of a group that operand `o` (0..16) of [`rows_in_lanes`] holds in each lane's
/// words: for `o = 4q + s`, codes `4q + c` and `4q + c + 2` with `c` = 0, 16, 1, 17 for `s` = 0..4,
/// that is bytes 0 and 2 (`s` < 2) or 1 and 3 of dword `q` of the group's first half of codes
/// (`s` even) or of its second half (`s` odd: a byte format's second sixteen bytes, a nibble
/// format's high nibbles).
pub(in crate::quant) fn pair_codes(o: usize) -> (usize, usize) {
    let (q, s) = (o / 4, o % 4);
    let first = 4 * q + [0, 16, 1, 17][s];
    (first, first + 2)
}

/// One call's activations for [`rows_in_lanes`]: per token and group, sixteen dwords of two
/// int16 activations each in [`pair_codes`]' order (the scales and sums stay in [`X16`]).
pub(in crate::quant) struct LaneActs {
    pairs: Vec<i32>,
}

impl LaneActs {
    /// The pairs of `xq`'s first `m` tokens.
    pub fn new(xq: &X16, m: usize) -> Self {
        let groups = xq.groups;
        let mut pairs = vec![0i32; m * groups * 16];
        for t in 0..m {
            for g in 0..groups {
                let (p, half) = (g / 2, g % 2);
                let words = xq.pair(t, p);
                // The pair layout: the group's codes 0..16 at 16·half, 16..32 at 32 + 16·half.
                let x = |j: usize| words[if j < 16 { 16 * half + j } else { 32 + 16 * half + j - 16 }];
                for o in 0..16 {
                    let (a, b) = pair_codes(o);
                    pairs[(t * groups + g) * 16 + o] = i32::from(x(a) as u16) | i32::from(x(b)) << 16;
                }
            }
        }
        Self { pairs }
    }
}

/// The 4×4 transpose of dwords inside each 128-bit lane of `r`: where lane `l` of `r[a]` holds
/// row `4a + l`'s sixteen bytes, lane `j` of result `q` holds dword `q` of row `4·(j % 4) + j / 4`.
#[inline(always)]
unsafe fn transpose(r: [__m512i; 4]) -> [__m512i; 4] {
    // SAFETY: the callers are AVX-512F functions.
    unsafe {
        let (t0, t1) = (_mm512_unpacklo_epi32(r[0], r[1]), _mm512_unpacklo_epi32(r[2], r[3]));
        let (t2, t3) = (_mm512_unpackhi_epi32(r[0], r[1]), _mm512_unpackhi_epi32(r[2], r[3]));
        [
            _mm512_unpacklo_epi64(t0, t1),
            _mm512_unpackhi_epi64(t0, t1),
            _mm512_unpacklo_epi64(t2, t3),
            _mm512_unpackhi_epi64(t2, t3),
        ]
    }
}

/// Rows `4a..4a + 4`'s 128-bit halves `h` (one per row) in the lanes of one zmm.
#[inline(always)]
unsafe fn four_rows(h: [__m128i; 4]) -> __m512i {
    // SAFETY: the callers are AVX-512F functions.
    unsafe {
        let v = _mm512_inserti32x4::<1>(_mm512_castsi128_si512(h[0]), h[1]);
        _mm512_inserti32x4::<3>(_mm512_inserti32x4::<2>(v, h[2]), h[3])
    }
}

/// Operands `4q..4q + 4` of a group ([`pair_codes`]) from dword `q` of its first sixteen bytes
/// (`lo`) and, for a byte format, of its second (`hi`).
#[inline(always)]
unsafe fn operands<F: Codes>(lo: __m512i, hi: __m512i) -> [__m512i; 4] {
    // SAFETY: the callers are AVX-512F/BW functions.
    unsafe {
        match F::LAYOUT {
            Layout::Nibbles => {
                let mask = _mm512_set1_epi32(0x000f_000f);
                [
                    _mm512_and_si512(lo, mask),
                    _mm512_and_si512(_mm512_srli_epi32::<4>(lo), mask),
                    _mm512_and_si512(_mm512_srli_epi32::<8>(lo), mask),
                    _mm512_and_si512(_mm512_srli_epi32::<12>(lo), mask),
                ]
            }
            Layout::Unsigned => {
                let mask = _mm512_set1_epi32(0x00ff_00ff);
                [
                    _mm512_and_si512(lo, mask),
                    _mm512_and_si512(hi, mask),
                    _mm512_srli_epi16::<8>(lo),
                    _mm512_srli_epi16::<8>(hi),
                ]
            }
            Layout::Signed => [
                _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(lo)),
                _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(hi)),
                _mm512_srai_epi16::<8>(lo),
                _mm512_srai_epi16::<8>(hi),
            ],
        }
    }
}

/// `acc + Σ` of `a`'s word pairs times the pair at `x + 4·I` broadcast: one `vpdpwssd` (its
/// memory operand addressed from `x` as it is). Written as assembly because LLVM splits the
/// intrinsic's chains into `vpmaddwd` + `vpaddd`, twice the instructions of a loop bound by
/// them.
///
/// # Safety
/// AVX-512F/VNNI; `x + 4·I` points at an i32.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpwssd_bcst<const I: usize>(acc: __m512i, a: __m512i, x: *const i32) -> __m512i {
    let mut acc = acc;
    // SAFETY: per the contract; reads four bytes at `x + 4·I`, writes only `acc`.
    unsafe {
        std::arch::asm!(
            "vpdpwssd {acc}, {a}, dword ptr [{x} + {at}]{{1to16}}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            x = in(reg) x,
            at = const 4 * I,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    acc
}

/// Four operands times their four activation pairs at `x` (broadcast) into a token's sums: the
/// first sixteen codes' into `sum[0]`, the second's into `sum[1]` where a pass has one or two
/// tokens (two chains) or the format scales each sixteen ([`Codes::SPLIT`]), else all into
/// `sum[0]`.
///
/// # Safety
/// AVX-512F/VNNI (the callers' features); `x` holds four i32s.
#[inline(always)]
unsafe fn multiply<F: Codes, const M: usize>(sum: &mut [__m512i; 2], ops: &[__m512i; 4], x: *const i32) {
    let odd = usize::from(M <= 2 || F::SPLIT);
    // SAFETY: per the contract.
    unsafe {
        sum[0] = dpwssd_bcst::<0>(sum[0], ops[0], x);
        sum[odd] = dpwssd_bcst::<1>(sum[odd], ops[1], x);
        sum[0] = dpwssd_bcst::<2>(sum[0], ops[2], x);
        sum[odd] = dpwssd_bcst::<3>(sum[odd], ops[3], x);
    }
}

/// Blocks of [`ROWS`] rows of the task (from its first row; the caller takes the rows past the
/// last whole block) times tokens `t0..t0 + M`: per group, the sixteen rows' codes transposed
/// into sixteen operands, sixteen `vpdpwssd` per token with its activation pairs broadcast
/// into an exact integer sum per row, then `acc += sum·d·dx (+ m·Σx)` lane-wise. Returns the
/// first row it left.
///
/// # Safety
/// AVX-512F/BW/VNNI, AVX2, FMA, F16C; `F` is the part's format; the
/// rows and tokens lie inside `part`, `xq` and `acts` (made from `xq` for at least
/// `t0 + M` tokens); only this task writes columns `rows` of `out`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn rows_in_lanes<F: Codes, const M: usize>(task: &RowTask<'_>, xq: &X16, acts: &LaneActs) -> usize {
    let RowTask { part, rows, t0, out, accumulate, .. } = task;
    let (t0, accumulate) = (*t0, *accumulate);
    let groups = xq.groups;
    let row_bytes = part.row_bytes();
    // Lane j's row within the block, and its byte offset from the block's first row.
    let lane_row: [usize; ROWS] = std::array::from_fn(|j| 4 * (j % 4) + j / 4);
    // The gather's offsets are i32s: rows too wide for them (none of a real model's) are left
    // to the caller's kernel.
    if i32::try_from((ROWS - 1) * row_bytes).is_err() {
        return rows.start;
    }
    let offsets = lane_row.map(|r| (r * row_bytes) as i32);
    // SAFETY: sixteen i32s.
    let offsets = unsafe { _mm512_loadu_si512(offsets.as_ptr() as *const _) };
    let centre = i32::from(F::CENTRE);
    let mut r0 = rows.start;
    while r0 + ROWS <= rows.end {
        // The block's bytes (bounds-checked here), every row's pointer derived from them.
        let base = part.bytes[r0 * row_bytes..(r0 + ROWS) * row_bytes].as_ptr();
        let row_at: [*const u8; ROWS] = std::array::from_fn(|r| base.wrapping_add(r * row_bytes));
        let mut acc = [_mm512_setzero_ps(); M];
        // A K-quant super-block's scales (and offsets) for the lanes, read at its first group:
        // `block[i][j]` is [`Codes::block_scales`]' entry `i` of lane `j`'s row.
        let mut block = [[0.0f32; ROWS]; 16];
        for g in 0..groups {
            // SAFETY (the group's body): group g lies in each of the block's rows (whole
            // groups per row); tokens t0..t0 + M's group g lies in `acts` and `xq`; the
            // prefetches are hints.
            unsafe {
                // The block's rows are contiguous and read a group of each at a time: the next
                // block comes in at the same pace, its sixteen groups' worth of lines per group.
                let ahead = base.wrapping_add(ROWS * row_bytes + g * ROWS * F::BYTES);
                for line in (0..ROWS * F::BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
                }
                let halves: [[__m128i; 2]; ROWS] = std::array::from_fn(|r| F::halves(row_at[r], g));
                let rows4 = |h: usize, a: usize| {
                    four_rows([
                        halves[4 * a][h],
                        halves[4 * a + 1][h],
                        halves[4 * a + 2][h],
                        halves[4 * a + 3][h],
                    ])
                };
                let lo = transpose(std::array::from_fn(|a| rows4(0, a)));
                let hi = if F::LAYOUT == Layout::Nibbles {
                    lo
                } else {
                    transpose(std::array::from_fn(|a| rows4(1, a)))
                };
                // Every integer sum starts from the centre's share, −CENTRE·Σx̃. With one or two
                // tokens, each sums in two chains ([`multiply`]): one chain of sixteen
                // dependent `vpdpwssd` would be the group's critical path.
                let mut sums: [[__m512i; 2]; M] = std::array::from_fn(|t| {
                    [_mm512_set1_epi32(-centre * xq.word_sums[(t0 + t) * groups + g]), _mm512_setzero_si512()]
                });
                // Written out per quarter (a loop over them kept the sums on the stack).
                macro_rules! quarter {
                    ($q:literal) => {
                        let ops = operands::<F>(lo[$q], hi[$q]);
                        for (t, sum) in sums.iter_mut().enumerate() {
                            let x = acts.pairs.as_ptr().add(((t0 + t) * groups + g) * 16 + 4 * $q);
                            multiply::<F, M>(sum, &ops, x);
                        }
                    };
                }
                quarter!(0);
                quarter!(1);
                quarter!(2);
                quarter!(3);
                let (d, m) = if F::BLOCK_SCALES {
                    if g % 8 == 0 {
                        for (j, &r) in lane_row.iter().enumerate() {
                            for (i, v) in F::block_scales(row_at[r], g / 8).into_iter().enumerate() {
                                block[i][j] = v;
                            }
                        }
                    }
                    let at = |i: usize| _mm512_loadu_ps(block[i].as_ptr());
                    let j = g % 8;
                    if F::SPLIT {
                        ([at(2 * j), at(2 * j + 1)], _mm512_setzero_ps())
                    } else {
                        ([at(j); 2], at(8 + j))
                    }
                } else {
                    // The rows' f16 scale (and offset: the next two bytes) at the group's start.
                    let header = _mm512_i32gather_epi32::<1>(offsets, base.add(g * F::BYTES) as *const i32);
                    let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(header));
                    ([d; 2], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(header))))
                };
                for (t, (a, sum)) in acc.iter_mut().zip(&sums).enumerate() {
                    let dx = _mm512_set1_ps(xq.dx[(t0 + t) * xq.pairs() * 2 + g]);
                    if F::SPLIT {
                        *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[0]), _mm512_mul_ps(d[0], dx), *a);
                        *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[1]), _mm512_mul_ps(d[1], dx), *a);
                    } else {
                        let sum = _mm512_add_epi32(sum[0], sum[1]);
                        *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d[0], dx), *a);
                    }
                    if F::OFFSET {
                        *a = _mm512_fmadd_ps(m, _mm512_set1_ps(xq.sums[(t0 + t) * groups + g]), *a);
                    }
                }
            }
        }
        for (t, a) in acc.iter().enumerate() {
            let mut lanes = [0.0f32; ROWS];
            // SAFETY: sixteen floats; (t0 + t, r0 + lane_row[j]) are this task's entries.
            unsafe {
                _mm512_storeu_ps(lanes.as_mut_ptr(), *a);
                for (j, v) in lanes.into_iter().enumerate() {
                    out.put(t0 + t, r0 + lane_row[j], v, accumulate);
                }
            }
        }
        r0 += ROWS;
    }
    r0
}

/// [`rows_in_lanes`] for the task's `mr` (1..=[`TOKENS_PER_PASS`]) tokens.
///
/// # Safety
/// As [`rows_in_lanes`]'.
pub(in crate::quant) unsafe fn dot_rows_lanes<F: Codes>(
    task: &RowTask<'_>,
    xq: &X16,
    acts: &LaneActs,
) -> usize {
    // SAFETY: forwarded contract.
    unsafe {
        match task.mr {
            1 => rows_in_lanes::<F, 1>(task, xq, acts),
            2 => rows_in_lanes::<F, 2>(task, xq, acts),
            3 => rows_in_lanes::<F, 3>(task, xq, acts),
            4 => rows_in_lanes::<F, 4>(task, xq, acts),
            5 => rows_in_lanes::<F, 5>(task, xq, acts),
            6 => rows_in_lanes::<F, 6>(task, xq, acts),
            7 => rows_in_lanes::<F, 7>(task, xq, acts),
            _ => rows_in_lanes::<F, 8>(task, xq, acts),
        }
    }
}
