//! The AVX2 kernels of `lanes16` (and the row decoding both x86 paths share): tokens rounded
//! into the panel layout, a row's bytes into its integer codes, and the micro-tiles (4 weight
//! rows × 16 tokens, `vpmaddwd` + `vpaddd` into int32 lanes, scaled into f32 lanes once per
//! group).

use std::arch::x86_64::*;

use super::{TM, Tile, group_len, has_offset};
use crate::quant::int16::{Codes, quantize_group, widen};

/// Weight rows per micro-tile: 4 rows × 16 tokens are 8 int32 accumulators, beside the two
/// panel vectors and a broadcast code pair (the f32 accumulators are touched once per group).
pub(super) const NB: usize = 4;

/// Tokens `t0..t0 + n` of a panel (`n ≤ 16`; token `t0 + t`'s `k` activations at `x[t·k..]`)
/// rounded as [`super::quantize_group`] rounds each group (the decode path's own rounding,
/// `int16::quantize_group`): their words into lanes `t0..t0 + n` of `words` (`[k/2][TM]`
/// pairs), their scales and sums into lanes `t0..t0 + n` of `dx` and `sums` (`[k/32][TM]`).
///
/// # Safety
/// AVX2, FMA, F16C; `x` holds `n·k` floats (`k % 32 == 0`); `words` `k·TM` words; `dx`, `sums`
/// `k/32·TM` floats; `t0 + n ≤ TM`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_tokens(
    x: &[f32],
    n: usize,
    k: usize,
    t0: usize,
    words: &mut [i16],
    dx: &mut [f32],
    sums: &mut [f32],
) {
    debug_assert!(t0 + n <= TM && x.len() >= n * k && words.len() >= k * TM);
    // The decode path's layout of one group: values 0..16 at 0, 16..32 at 32.
    let mut group = [0i16; 64];
    for g in 0..k / 32 {
        for t in 0..n {
            // SAFETY: token t's group g is in x; `group` holds the 48 words written.
            let (sum, d) = unsafe { quantize_group(x.as_ptr().add(t * k + 32 * g), group.as_mut_ptr()) };
            dx[g * TM + t0 + t] = d;
            sums[g * TM + t0 + t] = sum;
            for j in 0..16 {
                // Pair j of the group: values 2j and 2j + 1.
                let (a, b) = if j < 8 {
                    (group[2 * j], group[2 * j + 1])
                } else {
                    (group[2 * j + 16], group[2 * j + 17])
                };
                let at = ((16 * g + j) * TM + t0 + t) * 2;
                words[at] = a;
                words[at + 1] = b;
            }
        }
    }
}

/// A row of an integer-code format (`int16::Codes`) straight into int16 codes less the
/// format's [`Codes::CENTRE`], with its scales (Q6_K: one per 16) and offsets: no f32 round
/// trip.
///
/// # Safety
/// AVX2, FMA, F16C; `row` holds `k / 32` groups of `F`; `codes` has `k` entries, `m` `k/32` and
/// `d` `k/32` (`k/16` for a [`Codes::SPLIT`] format).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn direct_codes<F: Codes>(row: *const u8, d: &mut [f32], m: &mut [f32], codes: &mut [i16]) {
    let per_group = if F::SPLIT { 2 } else { 1 };
    debug_assert!(codes.len() == 32 * m.len() && d.len() == per_group * m.len());
    let (low4, centre_w) = (_mm256_set1_epi16(0x0f), _mm256_set1_epi16(F::CENTRE));
    // A K-quant super-block's scales, read at its first group.
    let mut block = [0.0f32; 16];
    for (g, mg) in m.iter_mut().enumerate() {
        // SAFETY: group g lies in the row; its 32 codes at 32·g are in `codes`, its scales at
        // per_group·g in `d`.
        unsafe {
            let (lo, hi) = widen::<F>(row, g, low4);
            let out = codes.as_mut_ptr().add(32 * g).cast::<__m256i>();
            _mm256_storeu_si256(out, _mm256_sub_epi16(lo, centre_w));
            _mm256_storeu_si256(out.add(1), _mm256_sub_epi16(hi, centre_w));
            let (scales, offset) = if F::BLOCK_SCALES {
                if g % 8 == 0 {
                    block = F::block_scales(row, g / 8);
                }
                F::of_block(&block, g % 8)
            } else {
                F::scale(row, g)
            };
            d.get_unchecked_mut(per_group * g..per_group * (g + 1)).copy_from_slice(&scales[..per_group]);
            *mg = offset;
        }
    }
}

impl Tile<'_> {
    /// The first `nb` decoded rows, sixteen tokens at a time: micro-tiles of [`NB`] rows, the
    /// rest one at a time.
    ///
    /// # Safety
    /// AVX2, FMA, F16C; `nb` rows are decoded; `out` addresses the tile's tokens' rows of `nb`
    /// columns, which nothing else writes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn run256(&self, nb: usize) {
        macro_rules! by_format {
            ($R:expr, $V:expr, $row0:expr, $v0:expr) => {
                // SAFETY: forwarded contract.
                unsafe {
                    match (group_len(self.ty), has_offset(self.ty)) {
                        (16, _) => self.micro256::<$R, $V, 16, false>($row0, $v0),
                        (_, false) => self.micro256::<$R, $V, 32, false>($row0, $v0),
                        (_, true) => self.micro256::<$R, $V, 32, true>($row0, $v0),
                    }
                }
            };
        }
        for v0 in (0..self.out.tokens.div_ceil(8)).step_by(2) {
            let two = self.out.tokens > 8 * (v0 + 1);
            let mut c = 0;
            while c + NB <= nb {
                if two {
                    by_format!(NB, 2, c, v0)
                } else {
                    by_format!(NB, 1, c, v0)
                }
                c += NB;
            }
            for c in c..nb {
                if two { by_format!(1, 2, c, v0) } else { by_format!(1, 1, c, v0) }
            }
        }
    }

    /// Rows `row0..row0 + R` × tokens `8·v0 .. 8·(v0 + V)`: per pair of codes, `V` panel loads
    /// and `R` broadcasts feeding `R·V` `vpmaddwd` + `vpaddd`; per group of `G`, the int32 sums
    /// converted and multiply-added by `d·dx` (and, with `OFF`, the offsets by the activation
    /// sums).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn micro256<const R: usize, const V: usize, const G: usize, const OFF: bool>(
        &self,
        row0: usize,
        v0: usize,
    ) {
        let k = self.k;
        let (words, dx, sums) = self.acts;
        let xw = words.as_ptr().cast::<i32>();
        let rows = self.rows;
        let lane0 = 8 * v0;
        let mut accf = [[_mm256_setzero_ps(); V]; R];
        // SAFETY (whole body): pairs p < k/2 keep panel reads inside its k·TM words (lanes
        // lane0 + 8V ≤ TM) and code reads inside the R rows of k codes; groups g < k/G index
        // the scales, g·G/32 < k/32 the offsets, activation scales and sums; output writes
        // stay in the tile.
        unsafe {
            let codes = rows.codes.as_ptr().add(row0 * k);
            for g in 0..k / G {
                let mut acci = [[_mm256_setzero_si256(); V]; R];
                for p in g * G / 2..(g + 1) * G / 2 {
                    let xv: [__m256i; V] =
                        std::array::from_fn(|v| _mm256_loadu_si256(xw.add(p * TM + lane0 + 8 * v).cast()));
                    for (c, a) in acci.iter_mut().enumerate() {
                        let pair = _mm256_set1_epi32(*codes.add(c * k + 2 * p).cast::<i32>());
                        for (s, &x) in a.iter_mut().zip(&xv) {
                            *s = _mm256_add_epi32(*s, _mm256_madd_epi16(x, pair));
                        }
                    }
                }
                let g32 = g * G / 32;
                let dxv: [__m256; V] =
                    std::array::from_fn(|v| _mm256_loadu_ps(dx.as_ptr().add(g32 * TM + lane0 + 8 * v)));
                for (c, (f, i)) in accf.iter_mut().zip(&acci).enumerate() {
                    let dc = _mm256_set1_ps(*rows.d.get_unchecked((row0 + c) * (k / G) + g));
                    for ((f, &i), &dxv) in f.iter_mut().zip(i).zip(&dxv) {
                        *f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(dxv, dc), *f);
                    }
                }
                if OFF {
                    let sv: [__m256; V] =
                        std::array::from_fn(|v| _mm256_loadu_ps(sums.as_ptr().add(g32 * TM + lane0 + 8 * v)));
                    for (c, f) in accf.iter_mut().enumerate() {
                        let mc = _mm256_set1_ps(*rows.m.get_unchecked((row0 + c) * (k / 32) + g32));
                        for (f, &s) in f.iter_mut().zip(&sv) {
                            *f = _mm256_fmadd_ps(s, mc, *f);
                        }
                    }
                }
            }
            let mut lanes = [[0.0f32; 16]; R];
            for (l, a) in lanes.iter_mut().zip(&accf) {
                for (v, &s) in a.iter().enumerate() {
                    _mm256_storeu_ps(l.as_mut_ptr().add(v * 8), s);
                }
            }
            self.out.rows_from(lane0, 8 * V).column(row0).write(&lanes);
        }
    }
}
