//! The AVX-512 VNNI kernels of `lanes16`: tokens rounded into the panel layout, and the
//! micro-tiles (6 weight rows × 32 tokens, `vpdpwssd` into int32 lanes, scaled into f32 lanes
//! once per group).

use std::arch::x86_64::*;

use super::{TM, Tile, group_len, has_offset};

/// `acc + Σ pairs a·b` with `b` the dword at `b` in every lane, as one instruction: `vpdpwssd`
/// with an embedded broadcast. Written in `asm!` because LLVM splits the intrinsic into
/// `vpmaddwd` + `vpaddd` (two µops, the f32 FMA's rate) when it sits on a dependency chain, and
/// because a broadcast as an operand rides on the load, where a `vpbroadcastd` of its own takes
/// a vector pipe on Zen 4 (a 16-token tile has one per `vpdpwssd`).
///
/// # Safety
/// AVX-512F/VNNI; `b` is readable for 4 bytes.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
unsafe fn dpwssd_bcst(acc: __m512i, a: __m512i, b: *const i32) -> __m512i {
    let mut acc = acc;
    // SAFETY: a 4-byte read at `b` (the contract), on a CPU with AVX-512 VNNI.
    unsafe {
        std::arch::asm!(
            "vpdpwssd {acc}, {a}, dword ptr [{b}]{{1to16}}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(reg) b,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    acc
}

/// One group of 32 activations at `x` rounded as [`super::quantize_group`] rounds it (the sum
/// added in another order): its scale, its f32 sum and its 32 codes as words.
///
/// # Safety
/// AVX-512F/BW; `x` holds 32 floats.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn group_codes(x: *const f32) -> (f32, f32, __m512i) {
    // SAFETY: per the contract.
    let v = unsafe { [_mm512_loadu_ps(x), _mm512_loadu_ps(x.add(16))] };
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
    let sum = _mm512_reduce_add_ps(_mm512_add_ps(v[0], v[1]));
    if !sum.is_finite() || amax < 1e-30 {
        return (if sum.is_finite() { 0.0 } else { f32::NAN }, sum, _mm512_setzero_si512());
    }
    let inv = _mm512_set1_ps(32767.0 / amax);
    let [lo, hi] = v.map(|h| _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(h, inv))));
    (amax / 32767.0, sum, _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi))
}

/// `rows` transposed as a 16 × 16 matrix of dwords: dword `t` of output `j` is dword `j` of
/// `rows[t]` (interleaves of dwords, then of qwords, then two rounds of 128-bit lanes).
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16(rows: &[__m512i; 16]) -> [__m512i; 16] {
    let mut a = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        a[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
    }
    // b[4i + m], in each 128-bit lane `l`: dword 4l + m of rows 4i..4i + 4.
    let mut b = [_mm512_setzero_si512(); 16];
    for i in 0..4 {
        b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    let mut out = [_mm512_setzero_si512(); 16];
    for m in 0..4 {
        let (c_low, c_high) =
            (_mm512_shuffle_i32x4::<0x44>(b[m], b[4 + m]), _mm512_shuffle_i32x4::<0xee>(b[m], b[4 + m]));
        let (d_low, d_high) = (
            _mm512_shuffle_i32x4::<0x44>(b[8 + m], b[12 + m]),
            _mm512_shuffle_i32x4::<0xee>(b[8 + m], b[12 + m]),
        );
        out[m] = _mm512_shuffle_i32x4::<0x88>(c_low, d_low);
        out[4 + m] = _mm512_shuffle_i32x4::<0xdd>(c_low, d_low);
        out[8 + m] = _mm512_shuffle_i32x4::<0x88>(c_high, d_high);
        out[12 + m] = _mm512_shuffle_i32x4::<0xdd>(c_high, d_high);
    }
    out
}

/// Weight rows per micro-tile: 6 rows × 32 tokens are 12 int32 and 12 f32 accumulators.
const NB: usize = 6;

/// Tokens `t0..t0 + n` of a panel (`n ≤ 16`; token `t0 + t`'s `k` activations at `x[t·k..]`)
/// rounded as [`super::quantize_group`] rounds each group: their words into lanes
/// `t0..t0 + 16` of `words` (`[k/2][TM]` pairs: a group's codes of sixteen tokens transposed in
/// registers, a store per pair; lanes past `n` take zeros), their scales and sums into lanes
/// `t0..t0 + n` of `dx` and `sums` (`[k/32][TM]`).
///
/// # Safety
/// AVX-512F/BW; `x` holds `n·k` floats (`k % 32 == 0`); `words` `k·TM` words; `dx`, `sums`
/// `k/32·TM` floats; `t0 + 16 ≤ TM`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn quantize_tokens(
    x: &[f32],
    n: usize,
    k: usize,
    t0: usize,
    words: &mut [i16],
    dx: &mut [f32],
    sums: &mut [f32],
) {
    debug_assert!(n <= 16 && t0 + 16 <= TM && x.len() >= n * k);
    for g in 0..k / 32 {
        let mut codes = [_mm512_setzero_si512(); 16];
        for (t, c) in codes.iter_mut().enumerate().take(n) {
            // SAFETY: token t's group g is in x; (g, t0 + t) is in dx and sums.
            unsafe {
                let (d, sum, words) = group_codes(x.as_ptr().add(t * k + 32 * g));
                *c = words;
                *dx.get_unchecked_mut(g * TM + t0 + t) = d;
                *sums.get_unchecked_mut(g * TM + t0 + t) = sum;
            }
        }
        for (j, pairs) in transpose16(&codes).iter().enumerate() {
            // SAFETY: pair 16g + j (< k/2) of lanes t0..t0 + 16 is in words.
            unsafe {
                _mm512_storeu_si512(words.as_mut_ptr().add(((16 * g + j) * TM + t0) * 2).cast(), *pairs)
            };
        }
    }
}

impl Tile<'_> {
    /// The first `nb` decoded rows: micro-tiles of [`NB`] rows, the rest one at a time.
    ///
    /// # Safety
    /// AVX-512F/BW/VNNI; `nb` rows are decoded; `out` addresses the tile's tokens' rows of `nb`
    /// columns, which nothing else writes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn run512(&self, nb: usize) {
        macro_rules! by_format {
            ($R:expr, $V:expr, $row0:expr) => {
                // SAFETY: forwarded contract.
                unsafe {
                    match (group_len(self.ty), has_offset(self.ty)) {
                        (16, _) => self.micro::<$R, $V, 16, false>($row0),
                        (_, false) => self.micro::<$R, $V, 32, false>($row0),
                        (_, true) => self.micro::<$R, $V, 32, true>($row0),
                    }
                }
            };
        }
        let wide = self.out.tokens > 16;
        let mut c = 0;
        while c + NB <= nb {
            if wide {
                by_format!(NB, 2, c)
            } else {
                by_format!(NB, 1, c)
            }
            c += NB;
        }
        for c in c..nb {
            if wide { by_format!(1, 2, c) } else { by_format!(1, 1, c) }
        }
    }

    /// Rows `row0..row0 + R` × `V·16` tokens: per pair of codes, `V` panel loads and `R`
    /// broadcasts feeding `R·V` `vpdpwssd`; per group of `G`, the int32 sums converted and
    /// multiply-added by `d·dx` (and, with `OFF`, the offsets by the activation sums).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn micro<const R: usize, const V: usize, const G: usize, const OFF: bool>(&self, row0: usize) {
        let k = self.k;
        let (words, dx, sums) = self.acts;
        let xw = words.as_ptr().cast::<i32>();
        let rows = self.rows;
        let mut accf = [[_mm512_setzero_ps(); V]; R];
        // SAFETY (whole body): pairs p < k/2 keep panel reads inside its k·TM words and code
        // reads inside the R rows of k codes; groups g < k/G index the scales, g·G/32 < k/32
        // the offsets, activation scales and sums; output writes stay in the tile.
        unsafe {
            let codes = rows.codes.as_ptr().add(row0 * k);
            for g in 0..k / G {
                let mut acci = [[_mm512_setzero_si512(); V]; R];
                for p in g * G / 2..(g + 1) * G / 2 {
                    let xv: [__m512i; V] =
                        std::array::from_fn(|v| _mm512_loadu_si512(xw.add(p * TM + 16 * v).cast()));
                    for (c, a) in acci.iter_mut().enumerate() {
                        for (s, &x) in a.iter_mut().zip(&xv) {
                            *s = dpwssd_bcst(*s, x, codes.add(c * k + 2 * p).cast::<i32>());
                        }
                    }
                }
                let g32 = g * G / 32;
                let dxv: [__m512; V] =
                    std::array::from_fn(|v| _mm512_loadu_ps(dx.as_ptr().add(g32 * TM + 16 * v)));
                for (c, (f, i)) in accf.iter_mut().zip(&acci).enumerate() {
                    let dc = _mm512_set1_ps(*rows.d.get_unchecked((row0 + c) * (k / G) + g));
                    for ((f, &i), &dxv) in f.iter_mut().zip(i).zip(&dxv) {
                        *f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dxv, dc), *f);
                    }
                }
                if OFF {
                    let sv: [__m512; V] =
                        std::array::from_fn(|v| _mm512_loadu_ps(sums.as_ptr().add(g32 * TM + 16 * v)));
                    for (c, f) in accf.iter_mut().enumerate() {
                        let mc = _mm512_set1_ps(*rows.m.get_unchecked((row0 + c) * (k / 32) + g32));
                        for (f, &s) in f.iter_mut().zip(&sv) {
                            *f = _mm512_fmadd_ps(s, mc, *f);
                        }
                    }
                }
            }
            let mut lanes = [[0.0f32; TM]; R];
            for (l, a) in lanes.iter_mut().zip(&accf) {
                for (v, &s) in a.iter().enumerate() {
                    _mm512_storeu_ps(l.as_mut_ptr().add(v * 16), s);
                }
            }
            self.out.column(row0).write(&lanes);
        }
    }
}
