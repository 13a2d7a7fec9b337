//! The int16-activation decode path ([`super::ActivationPrecision::Int16`], and `Auto`'s choice
//! where the CPU has AVX-512 VNNI) for the formats whose codes are small integers under
//! per-group scales (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q4_K, Q5_K, Q6_K): each
//! token's activations are rounded once per call to int16 with one scale per group of 32
//! (`dx = max|x| / 32767`), so a group's dot product is an exact integer sum (`vpdpwssd` on
//! AVX-512 VNNI, `vpmaddwd` on AVX2) scaled once by `d·dx` (Q6_K: each 16 by its own `d`); the
//! offsets (`m`, the K-quants' `−dmin·m`) go through the exact f32 group sums. The rounding
//! error is 2⁻¹⁶ of each group's largest activation (the tests bound it per product; the model
//! crate's golden tests measure it on the real models).
//!
//! The activations are laid out in pairs of groups, `[g0 0..16, g1 0..16, g0 16..32,
//! g1 16..32]`, the order in which one zmm load of two groups' codes arrives (AVX2 reads the
//! same layout a quarter at a time). An odd last group is paired with a zero group.

/// Whether this path runs format `ty`.
pub(super) fn supports(ty: super::GgmlType) -> bool {
    use super::GgmlType::*;
    matches!(ty, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | Q6_K)
}

/// The activations of one decode call in int16: per token and pair of groups, 64 words in the
/// pair layout (module doc); `dx[m][pairs·2]` (a zero group's scale is 0), and the f32 group
/// sums `sums[m][groups]` for the offsets.
pub(super) struct X16 {
    pub q: Vec<i16>,
    pub dx: Vec<f32>,
    pub sums: Vec<f32>,
    pub groups: usize,
}

impl X16 {
    /// Pairs of groups per token.
    pub fn pairs(&self) -> usize {
        self.groups.div_ceil(2)
    }

    /// `m` tokens of `k` activations (`k` a multiple of 32) as `x ≈ dx·hi` with
    /// `dx = max|x|/32767` per group. A group holding a NaN or an infinity gets a NaN scale, so
    /// its products come out NaN as the f32 path's would.
    #[cfg(target_arch = "x86_64")]
    pub fn quantize(x: &[f32], m: usize, k: usize) -> X16 {
        assert!(k.is_multiple_of(32) && x.len() >= m * k, "X16::quantize: {m} tokens of {k}");
        let groups = k / 32;
        let pairs = groups.div_ceil(2);
        let mut xq = X16 {
            q: vec![0i16; m * pairs * 64],
            dx: vec![0.0f32; m * pairs * 2],
            sums: vec![0.0f32; m * groups],
            groups,
        };
        for t in 0..m {
            for g in 0..groups {
                let (p, half) = (g / 2, g % 2);
                let words = (t * pairs + p) * 64 + 16 * half;
                // SAFETY: the integer kernels, this function's only callers outside tests, run
                // on an Isa that detected AVX2 + FMA + F16C; the tests run it where they did.
                // The group's 32 values lie in x (asserted); its words, its halves at `words`
                // and `words + 32`, lie in q.
                let (sum, dx) = unsafe {
                    x86::quantize_group(x.as_ptr().add(t * k + 32 * g), xq.q.as_mut_ptr().add(words))
                };
                xq.sums[t * groups + g] = sum;
                xq.dx[t * pairs * 2 + g] = dx;
            }
        }
        xq
    }

    /// Token `t`'s 64 words of pair `p`.
    pub fn pair(&self, t: usize, p: usize) -> &[i16] {
        let base = (t * self.pairs() + p) * 64;
        &self.q[base..base + 64]
    }

    /// The value of token `t`'s activation `i` as this path sees it: the tests' reference
    /// for the SIMD kernels.
    #[cfg(test)]
    pub fn value(&self, t: usize, i: usize) -> f64 {
        let (g, j) = (i / 32, i % 32);
        let (p, half) = (g / 2, g % 2);
        let word = if j < 16 { 16 * half + j } else { 32 + 16 * half + j - 16 };
        f64::from(self.pair(t, p)[word]) * f64::from(self.dx[t * self.pairs() * 2 + g])
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use x86::{
    Codes, Layout, Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0, dot_rows_avx2, dot_rows_avx512,
};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::X16;
    use crate::cpu::quant::avx2::{
        PREFETCH_AHEAD, f16_at, hsum, k_nibbles, k_scale_offset, q5_codes, q5k_codes, q6k_group,
    };
    use crate::cpu::quant::{GgmlType, RowTask};

    /// One group of 32 activations at `x` into int16 words: values 0..16 at `words`, 16..32 at
    /// `words + 32`; returns the group's f32 sum and scale (see [`X16::quantize`]).
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available; `x` holds 32 floats; `words` holds 48 words.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_group(x: *const f32, words: *mut i16) -> (f32, f32) {
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

    /// How a format's [`Codes::halves`] hold its codes.
    #[derive(PartialEq, Eq)]
    pub(in crate::cpu::quant) enum Layout {
        /// Sixteen bytes of nibbles, twice: the low nibbles are the first half.
        Nibbles,
        /// Sixteen signed bytes per half.
        Signed,
        /// Sixteen unsigned bytes per half.
        Unsigned,
    }

    /// One format's groups as integer codes for this path: `value = code·d + m`, `d` one scale
    /// for the group or, with [`Codes::SPLIT`], one for each 16.
    pub(in crate::cpu::quant) trait Codes {
        /// Bytes per group (the K-quants': a super-block's over its eight groups, rounded down
        /// for Q6K, as far as the prefetch moves per group).
        const BYTES: usize;
        /// How [`Codes::halves`] holds the codes.
        const LAYOUT: Layout = Layout::Nibbles;
        /// Whether `m` can be non-zero.
        const OFFSET: bool;
        /// Whether the two 16s of a group have scales of their own (Q6K).
        const SPLIT: bool = false;
        /// Where a group's codes start, after its scales (for the default [`Codes::halves`]).
        const CODES_AT: usize = 0;
        /// The 32 codes of group `g` as sixteen words of its first half and sixteen of its
        /// second (zero- or sign-extended), in a 128-bit pair each. Here: the sixteen nibble
        /// bytes twice, the low nibbles being the first half and the high the second (the
        /// kernels split them after widening).
        ///
        /// # Safety
        /// AVX2 is available; group `g` lies inside the row at `row`.
        #[inline(always)]
        unsafe fn halves(row: *const u8, g: usize) -> [__m128i; 2] {
            // SAFETY: block g (its scales, then 16 bytes of nibbles) is in the row.
            let v = unsafe { _mm_loadu_si128(row.add(g * Self::BYTES + Self::CODES_AT) as *const __m128i) };
            [v, v]
        }
        /// Group `g`'s scales of its first and second 16 (equal unless [`Codes::SPLIT`]) and
        /// its offset `m`.
        ///
        /// # Safety
        /// As [`Codes::halves`].
        unsafe fn scale(row: *const u8, g: usize) -> ([f32; 2], f32);
    }

    /// Q4_1 (f16 d, f16 m, sixteen bytes of nibbles) and Q4_0 (f16 d, nibbles, offset -8d):
    /// nibbles, as [`Codes::halves`] reads them.
    pub(in crate::cpu::quant) struct Q4_1;
    pub(in crate::cpu::quant) struct Q4_0;
    /// Q8_0 (f16 d, 32 signed bytes): `halves` returns bytes 0..16 and 16..32.
    pub(in crate::cpu::quant) struct Q8_0;
    /// Q5_0 (f16 d, four bytes of fifth bits, sixteen bytes of nibbles; offset -16d): `halves`
    /// returns the five-bit codes of values 0..16 and 16..32, one per byte.
    pub(in crate::cpu::quant) struct Q5_0;
    /// Q5_1 (f16 d, f16 m, then Q5_0's fifth bits and nibbles): the same five-bit codes.
    pub(in crate::cpu::quant) struct Q5_1;
    /// Q4_K (super-blocks of 256, eight groups of 32 under 6-bit scales and mins): group `g` is
    /// sub-block `g % 8` of super-block `g / 8`, its codes 0..16 one per byte, `d·sc` and
    /// `−dmin·m` its scale and offset.
    pub(in crate::cpu::quant) struct Q4K;
    /// Q5_K: Q4_K with a fifth bit per code (codes 0..32).
    pub(in crate::cpu::quant) struct Q5K;
    /// Q6_K (super-blocks of 256, an i8 scale per 16 values): the codes less 32 as signed
    /// bytes, each 16 with its own scale ([`Codes::SPLIT`]).
    pub(in crate::cpu::quant) struct Q6K;

    impl Codes for Q4_1 {
        const BYTES: usize = 20;
        const OFFSET: bool = true;
        const CODES_AT: usize = 4;
        #[inline(always)]
        unsafe fn scale(row: *const u8, g: usize) -> ([f32; 2], f32) {
            // SAFETY: block g (20 bytes: f16 d, f16 m, 16 bytes of nibbles) is in the row.
            let (d, m) = unsafe { (f16_at(row.add(g * 20)), f16_at(row.add(g * 20 + 2))) };
            ([d; 2], m)
        }
    }

    impl Codes for Q4_0 {
        const BYTES: usize = 18;
        const OFFSET: bool = true;
        const CODES_AT: usize = 2;
        #[inline(always)]
        unsafe fn scale(row: *const u8, g: usize) -> ([f32; 2], f32) {
            // SAFETY: block g (18 bytes: f16 d, 16 bytes of nibbles) is in the row. Codes are
            // 0..16 with value (q - 8)·d.
            let d = unsafe { f16_at(row.add(g * 18)) };
            ([d; 2], -8.0 * d)
        }
    }

    impl Codes for Q8_0 {
        const BYTES: usize = 34;
        const LAYOUT: Layout = Layout::Signed;
        const OFFSET: bool = false;
        const CODES_AT: usize = 2;
        #[inline(always)]
        unsafe fn halves(row: *const u8, g: usize) -> [__m128i; 2] {
            // SAFETY: block g (34 bytes: f16 d, 32 i8) is in the row.
            unsafe {
                let b = row.add(g * 34 + Self::CODES_AT);
                [_mm_loadu_si128(b as *const __m128i), _mm_loadu_si128(b.add(16) as *const __m128i)]
            }
        }
        #[inline(always)]
        unsafe fn scale(row: *const u8, g: usize) -> ([f32; 2], f32) {
            // SAFETY: as above.
            ([unsafe { f16_at(row.add(g * 34)) }; 2], 0.0)
        }
    }

    /// Group `g` of a five-bit format (Q5_0, Q5_1: four bytes of fifth bits at `F::CODES_AT`,
    /// then sixteen of nibbles) as [`Codes::halves`] returns it.
    ///
    /// # Safety
    /// AVX2 is available; group `g` lies inside the row at `row`.
    #[inline(always)]
    unsafe fn five_bit_halves<F: Codes>(row: *const u8, g: usize) -> [__m128i; 2] {
        // SAFETY: per the contract.
        unsafe {
            let b = row.add(g * F::BYTES + F::CODES_AT);
            split(q5_codes(b, b.add(4)))
        }
    }

    impl Codes for Q5_0 {
        const BYTES: usize = 22;
        const LAYOUT: Layout = Layout::Unsigned;
        const OFFSET: bool = true;
        const CODES_AT: usize = 2;
        #[inline(always)]
        unsafe fn halves(row: *const u8, g: usize) -> [__m128i; 2] {
            // SAFETY: block g (22 bytes: f16 d, 4 bytes of fifth bits, 16 bytes of nibbles)
            // is in the row; the callers are AVX2 functions.
            unsafe { five_bit_halves::<Self>(row, g) }
        }
        #[inline(always)]
        unsafe fn scale(row: *const u8, g: usize) -> ([f32; 2], f32) {
            // SAFETY: as above. Codes are 0..32 with value (q - 16)·d.
            let d = unsafe { f16_at(row.add(g * 22)) };
            ([d; 2], -16.0 * d)
        }
    }

    impl Codes for Q5_1 {
        const BYTES: usize = 24;
        const LAYOUT: Layout = Layout::Unsigned;
        const OFFSET: bool = true;
        const CODES_AT: usize = 4;
        #[inline(always)]
        unsafe fn halves(row: *const u8, g: usize) -> [__m128i; 2] {
            // SAFETY: block g (24 bytes: f16 d, f16 m, 4 bytes of fifth bits, 16 bytes of
            // nibbles) is in the row; the callers are AVX2 functions.
            unsafe { five_bit_halves::<Self>(row, g) }
        }
        #[inline(always)]
        unsafe fn scale(row: *const u8, g: usize) -> ([f32; 2], f32) {
            // SAFETY: as above.
            let (d, m) = unsafe { (f16_at(row.add(g * 24)), f16_at(row.add(g * 24 + 2))) };
            ([d; 2], m)
        }
    }

    /// 32 byte codes as [`Codes::halves`] returns them.
    #[inline(always)]
    unsafe fn split(codes: __m256i) -> [__m128i; 2] {
        // SAFETY: the callers are AVX2 functions.
        unsafe { [_mm256_castsi256_si128(codes), _mm256_extracti128_si256::<1>(codes)] }
    }

    impl Codes for Q4K {
        const BYTES: usize = 144 / 8;
        const LAYOUT: Layout = Layout::Unsigned;
        const OFFSET: bool = true;
        #[inline(always)]
        unsafe fn halves(row: *const u8, g: usize) -> [__m128i; 2] {
            // SAFETY: super-block g / 8 (144 bytes: the 16-byte header, then 128 of nibbles) is
            // in the row; the callers are AVX2 functions.
            unsafe { split(k_nibbles(row.add(g / 8 * 144 + 16), g % 8)) }
        }
        #[inline(always)]
        unsafe fn scale(row: *const u8, g: usize) -> ([f32; 2], f32) {
            // SAFETY: as above.
            let (d, m) = unsafe { k_scale_offset(row.add(g / 8 * 144), g % 8) };
            ([d; 2], m)
        }
    }

    impl Codes for Q5K {
        const BYTES: usize = 176 / 8;
        const LAYOUT: Layout = Layout::Unsigned;
        const OFFSET: bool = true;
        #[inline(always)]
        unsafe fn halves(row: *const u8, g: usize) -> [__m128i; 2] {
            // SAFETY: super-block g / 8 (176 bytes) is in the row; the callers are AVX2 functions.
            unsafe { split(q5k_codes(row.add(g / 8 * 176), g % 8)) }
        }
        #[inline(always)]
        unsafe fn scale(row: *const u8, g: usize) -> ([f32; 2], f32) {
            // SAFETY: as above.
            let (d, m) = unsafe { k_scale_offset(row.add(g / 8 * 176), g % 8) };
            ([d; 2], m)
        }
    }

    impl Codes for Q6K {
        const BYTES: usize = 210 / 8;
        const LAYOUT: Layout = Layout::Signed;
        const OFFSET: bool = false;
        const SPLIT: bool = true;
        #[inline(always)]
        unsafe fn halves(row: *const u8, g: usize) -> [__m128i; 2] {
            // SAFETY: super-block g / 8 (210 bytes) is in the row; the callers are AVX2
            // functions. Codes 0..64 less 32 fit a signed byte.
            unsafe { split(_mm256_sub_epi8(q6k_group(row, g).0, _mm256_set1_epi8(32))) }
        }
        #[inline(always)]
        unsafe fn scale(row: *const u8, g: usize) -> ([f32; 2], f32) {
            // SAFETY: as above (the codes' loads are dead here, and dropped).
            let (_, first, second) = unsafe { q6k_group(row, g) };
            ([first, second], 0.0)
        }
    }

    /// Whether the format's codes are nibbles (split after widening) rather than bytes.
    const fn nibbles<F: Codes>() -> bool {
        matches!(F::LAYOUT, Layout::Nibbles)
    }

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

    /// Rows `rows` of `part` times tokens `t0..t0+M` of `xq`, two groups per zmm: for each
    /// token, `vpdpwssd` of the pair's codes with its words (lanes 0..8 sum group `2p`, 8..16
    /// group `2p+1`), converted and scaled by `d·dx` per lane; the offsets as `m·Σx`.
    ///
    /// # Safety
    /// AVX-512F/BW/VNNI, AVX2, FMA, F16C; the rows and tokens lie inside `part` and `xq`; only
    /// this task writes columns `rows` of `out`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn rows512<F: Codes, const M: usize>(task: RowTask<'_>, xq: &X16) {
        let RowTask { part, rows, t0, out, accumulate, .. } = task;
        let groups = xq.groups;
        let pairs = xq.pairs();
        let full = groups / 2;
        // Lanes 0..8 take element 0 of a two-float vector, lanes 8..16 element 1.
        let halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        let low4 = _mm512_set1_epi16(0x0f);
        for r in rows {
            let row = part.row(r).as_ptr();
            let mut acc = [_mm512_setzero_ps(); M];
            let mut offsets = [0.0f32; M];
            for p in 0..pairs {
                let (g0, g1) = (2 * p, 2 * p + 1);
                // SAFETY: group g0 is in the row, g1 too when p < full; the prefetch is a hint.
                unsafe {
                    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(g0 * F::BYTES + PREFETCH_AHEAD) as *const i8);
                    let [a0, a1] = F::halves(row, g0);
                    let [b0, b1] = if p < full { F::halves(row, g1) } else { [_mm_setzero_si128(); 2] };
                    let (d0, m0) = F::scale(row, g0);
                    let (d1, m1) = if p < full { F::scale(row, g1) } else { ([0.0; 2], 0.0) };
                    let (first, second) = if nibbles::<F>() {
                        let w = widen512::<F>(a0, b0);
                        (_mm512_and_si512(w, low4), _mm512_srli_epi16::<4>(w))
                    } else {
                        (widen512::<F>(a0, b0), widen512::<F>(a1, b1))
                    };
                    // The scales of the pair's first 16s and second 16s (equal unless SPLIT).
                    let d = [_mm_setr_ps(d0[0], d1[0], 0.0, 0.0), _mm_setr_ps(d0[1], d1[1], 0.0, 0.0)];
                    for (t, a) in acc.iter_mut().enumerate() {
                        let w = xq.pair(t0 + t, p).as_ptr();
                        let dx = xq.dx.as_ptr().add(((t0 + t) * pairs + p) * 2);
                        let dx = _mm_castpd_ps(_mm_load_sd(dx as *const f64));
                        let lanes = |d: __m128| pair_scales(halves, d, dx);
                        let first_half = _mm512_dpwssd_epi32(
                            _mm512_setzero_si512(),
                            first,
                            _mm512_loadu_si512(w as *const _),
                        );
                        let w_second = _mm512_loadu_si512(w.add(32) as *const _);
                        if F::SPLIT {
                            let second_half = _mm512_dpwssd_epi32(_mm512_setzero_si512(), second, w_second);
                            *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(first_half), lanes(d[0]), *a);
                            *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(second_half), lanes(d[1]), *a);
                        } else {
                            let dot = _mm512_cvtepi32_ps(_mm512_dpwssd_epi32(first_half, second, w_second));
                            *a = _mm512_fmadd_ps(dot, lanes(d[0]), *a);
                        }
                        if F::OFFSET {
                            let sums = xq.sums.as_ptr().add((t0 + t) * groups + g0);
                            offsets[t] = m0.mul_add(*sums, offsets[t]);
                            if p < full {
                                offsets[t] = m1.mul_add(*sums.add(1), offsets[t]);
                            }
                        }
                    }
                }
            }
            for (t, a) in acc.iter().enumerate() {
                // SAFETY: (t0 + t, r) is this task's entry.
                unsafe { out.put(t0 + t, r, _mm512_reduce_add_ps(*a) + offsets[t], accumulate) };
            }
        }
    }

    /// [`rows512`]'s eight-lane twin: one group at a time, a quarter of a pair's words per
    /// `vpmaddwd`.
    ///
    /// # Safety
    /// AVX2, FMA, F16C; otherwise as [`rows512`].
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows256<F: Codes, const M: usize>(task: RowTask<'_>, xq: &X16) {
        let RowTask { part, rows, t0, out, accumulate, .. } = task;
        let groups = xq.groups;
        let pairs = xq.pairs();
        let low4 = _mm256_set1_epi16(0x0f);
        for r in rows {
            let row = part.row(r).as_ptr();
            let mut acc = [_mm256_setzero_ps(); M];
            let mut offsets = [0.0f32; M];
            for g in 0..groups {
                // SAFETY: group g is in the row; the prefetch is a hint.
                unsafe {
                    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(g * F::BYTES + PREFETCH_AHEAD) as *const i8);
                    let [a0, a1] = F::halves(row, g);
                    let (d, m) = F::scale(row, g);
                    let (first, second) = if nibbles::<F>() {
                        let w = _mm256_cvtepu8_epi16(a0);
                        (_mm256_and_si256(w, low4), _mm256_srli_epi16::<4>(w))
                    } else if F::LAYOUT == Layout::Signed {
                        (_mm256_cvtepi8_epi16(a0), _mm256_cvtepi8_epi16(a1))
                    } else {
                        (_mm256_cvtepu8_epi16(a0), _mm256_cvtepu8_epi16(a1))
                    };
                    let (p, half) = (g / 2, g % 2);
                    for (t, a) in acc.iter_mut().enumerate() {
                        let words = xq.pair(t0 + t, p).as_ptr().add(16 * half);
                        let dx = *xq.dx.get_unchecked(((t0 + t) * pairs + p) * 2 + half);
                        let first_half =
                            _mm256_madd_epi16(first, _mm256_loadu_si256(words as *const __m256i));
                        let second_half =
                            _mm256_madd_epi16(second, _mm256_loadu_si256(words.add(32) as *const __m256i));
                        if F::SPLIT {
                            *a = _mm256_fmadd_ps(
                                _mm256_cvtepi32_ps(first_half),
                                _mm256_set1_ps(d[0] * dx),
                                *a,
                            );
                            *a = _mm256_fmadd_ps(
                                _mm256_cvtepi32_ps(second_half),
                                _mm256_set1_ps(d[1] * dx),
                                *a,
                            );
                        } else {
                            let dot = _mm256_cvtepi32_ps(_mm256_add_epi32(first_half, second_half));
                            *a = _mm256_fmadd_ps(dot, _mm256_set1_ps(d[0] * dx), *a);
                        }
                        if F::OFFSET {
                            offsets[t] = m.mul_add(*xq.sums.get_unchecked((t0 + t) * groups + g), offsets[t]);
                        }
                    }
                }
            }
            for (t, a) in acc.iter().enumerate() {
                // SAFETY: (t0 + t, r) is this task's entry.
                unsafe { out.put(t0 + t, r, hsum(*a) + offsets[t], accumulate) };
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
            pub(in crate::cpu::quant) unsafe fn $name(task: RowTask<'_>, xq: &X16) {
                macro_rules! by_m {
                    ($F:ty) => {
                        // SAFETY: forwarded contract.
                        unsafe { with_tokens!(task.mr, |M| $kernel::<$F, M>(task, xq)) }
                    };
                }
                match task.part.ty {
                    GgmlType::Q4_1 => by_m!(Q4_1),
                    GgmlType::Q4_0 => by_m!(Q4_0),
                    GgmlType::Q8_0 => by_m!(Q8_0),
                    GgmlType::Q5_0 => by_m!(Q5_0),
                    GgmlType::Q5_1 => by_m!(Q5_1),
                    GgmlType::Q4_K => by_m!(Q4K),
                    GgmlType::Q5_K => by_m!(Q5K),
                    GgmlType::Q6_K => by_m!(Q6K),
                    other => unreachable!("no int16 kernel for {other:?}"),
                }
            }
        };
    }

    dispatch!(dot_rows_avx512, rows512);
    dispatch!(dot_rows_avx2, rows256);
}
