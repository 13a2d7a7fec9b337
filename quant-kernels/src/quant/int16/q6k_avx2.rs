//! Q6_K's int16 decode kernel on AVX2: a super-block's codes built once per row for all
//! eight of its groups, and the sixteen scales of its 16s applied in integers.
//!
//! Through the per-group readers (`Codes::halves`, `Codes::scale`) each group re-reads and
//! re-assembles its super-block's bytes and scales twice; here the `ql` and `qh` vectors are
//! read once per half super-block and split into the four groups they hold.

use std::arch::x86_64::*;

use super::X16;
use crate::quant::RowTask;
use crate::quant::avx2::{PREFETCH_AHEAD, f16_at, hsum};

/// Bytes of a Q6_K super-block: 128 of low nibbles (`ql`), 64 of high bit pairs (`qh`), 16 i8
/// scales, the f16 `d`.
const SUPER_BLOCK: usize = 210;

/// The task's rows (a Q6_K part) times its `M` tokens, one row at a time: per super-block the
/// 6-bit codes of its groups, less 32, as signed bytes, widened to words and multiplied into
/// each token's words (`vpmaddwd`); each 16's eight lane sums times its i8 scale (`vpmulld`:
/// a lane is at most 2·32·32767 in magnitude, times at most 128, two of them fit an i32), the
/// group's two 16s added, converted, and scaled by `d·dx` in one FMA.
///
/// # Safety
/// AVX2, FMA and F16C are available; the task's rows lie in its Q6_K part, whose rows hold
/// `xq.groups` groups (a multiple of 8); tokens `t0..t0 + M` lie in `xq` and the output.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows<const M: usize>(task: RowTask<'_>, xq: &X16) {
    let RowTask { part, rows, t0, out, accumulate, .. } = task;
    let pairs = xq.pairs();
    let low4 = _mm256_set1_epi8(0x0f);
    let high2 = _mm256_set1_epi8(0x30);
    let centre = _mm256_set1_epi8(32);
    for r in rows {
        let row = part.row(r).as_ptr();
        // Two chains of FMAs a token (even and odd groups), so that they overlap.
        let mut acc = [[_mm256_setzero_ps(); 2]; M];
        for b in 0..xq.groups / 8 {
            // SAFETY (whole body): super-block b (SUPER_BLOCK bytes) is in the row; its groups
            // 8b..8b + 8 and tokens t0..t0 + M are in xq; the prefetches are hints.
            unsafe {
                let block = row.add(b * SUPER_BLOCK);
                for line in 0..SUPER_BLOCK.div_ceil(64) {
                    _mm_prefetch::<_MM_HINT_T0>(block.wrapping_add(PREFETCH_AHEAD + 64 * line) as *const i8);
                }
                let d = _mm256_set1_ps(f16_at(block.add(208)));
                let mut scales = [0i32; 16];
                let s = _mm_loadu_si128(block.add(192) as *const __m128i);
                _mm256_storeu_si256(scales.as_mut_ptr() as *mut __m256i, _mm256_cvtepi8_epi32(s));
                _mm256_storeu_si256(
                    scales.as_mut_ptr().add(8) as *mut __m256i,
                    _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(s)),
                );
                for half in 0..2 {
                    // Quarter q of this half: nibbles of ql[64·half + 32·(q % 2)..] (low for
                    // q < 2), and bits 2q.. of qh[32·half..] as bits 4 and 5. The 16-bit
                    // shifts carry bits across bytes only into bits the masks clear.
                    let a = _mm256_loadu_si256(block.add(64 * half) as *const __m256i);
                    let c = _mm256_loadu_si256(block.add(64 * half + 32) as *const __m256i);
                    let h = _mm256_loadu_si256(block.add(128 + 32 * half) as *const __m256i);
                    let quarters = [
                        _mm256_or_si256(
                            _mm256_and_si256(a, low4),
                            _mm256_and_si256(_mm256_slli_epi16::<4>(h), high2),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(c, low4),
                            _mm256_and_si256(_mm256_slli_epi16::<2>(h), high2),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(a), low4),
                            _mm256_and_si256(h, high2),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(c), low4),
                            _mm256_and_si256(_mm256_srli_epi16::<2>(h), high2),
                        ),
                    ];
                    for (q, codes) in quarters.into_iter().enumerate() {
                        let g = 8 * b + 4 * half + q;
                        let codes = _mm256_sub_epi8(codes, centre);
                        let first = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(codes));
                        let second = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(codes));
                        let j = 8 * half + 2 * q;
                        let (s0, s1) = (_mm256_set1_epi32(scales[j]), _mm256_set1_epi32(scales[j + 1]));
                        let (p, in_pair) = (g / 2, g % 2);
                        for (t, acc) in acc.iter_mut().enumerate() {
                            let words = xq.pair(t0 + t, p).as_ptr().add(16 * in_pair);
                            let x0 = _mm256_loadu_si256(words as *const __m256i);
                            let x1 = _mm256_loadu_si256(words.add(32) as *const __m256i);
                            let sum = _mm256_add_epi32(
                                _mm256_mullo_epi32(_mm256_madd_epi16(first, x0), s0),
                                _mm256_mullo_epi32(_mm256_madd_epi16(second, x1), s1),
                            );
                            let dx =
                                _mm256_set1_ps(*xq.dx.get_unchecked(((t0 + t) * pairs + p) * 2 + in_pair));
                            acc[q % 2] =
                                _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, dx), acc[q % 2]);
                        }
                    }
                }
            }
        }
        for (t, [even, odd]) in acc.into_iter().enumerate() {
            // SAFETY: (t0 + t, r) is this task's entry.
            unsafe { out.put(t0 + t, r, hsum(_mm256_add_ps(even, odd)), accumulate) };
        }
    }
}
