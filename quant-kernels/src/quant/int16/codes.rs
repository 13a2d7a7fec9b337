//! How each integer-code format's groups reach the int16 kernels: [`Codes`], one reader per
//! format (its codes as words, its scales and offsets), shared by the decode kernels here and
//! `lanes16`, with faster readings where a format has them: a pair of groups' words for the
//! AVX-512 decode kernel, a K-quant super-block's scales at once for both.

use std::arch::x86_64::*;

use crate::quant::avx2::{f16_at, f16_pair_at, k_nibbles, k_scale_offset, q5_codes, q5k_codes, q6k_group};

/// How a format's [`Codes::halves`] hold its codes.
#[derive(PartialEq, Eq)]
pub(in crate::quant) enum Layout {
    /// Sixteen bytes of nibbles, twice: the low nibbles are the first half.
    Nibbles,
    /// Sixteen signed bytes per half.
    Signed,
    /// Sixteen unsigned bytes per half.
    Unsigned,
}

/// One format's groups as integer codes for this path: `value = code·d + m`, `d` one scale
/// for the group or, with [`Codes::SPLIT`], one for each 16.
pub(in crate::quant) trait Codes {
    /// Bytes per group (the K-quants': a super-block's over its eight groups, rounded down
    /// for Q6_K, as far as the prefetch moves per group).
    const BYTES: usize;
    /// How [`Codes::halves`] holds the codes.
    const LAYOUT: Layout;
    /// Whether `m` can be non-zero.
    const OFFSET: bool;
    /// What the kernels subtract from every code read (Q4_0's 8, Q5_0's 16), so that the
    /// value is `d·(code − CENTRE)`: an exact integer, where `m = −CENTRE·d` would be an
    /// offset through the f32 group sums. The readers return the codes as stored.
    const CENTRE: i16 = 0;
    /// Whether the two 16s of a group have scales of their own (Q6_K).
    const SPLIT: bool = false;
    /// Where a group's codes start, after its scales (formats of one block per group).
    const CODES_AT: usize = 0;
    /// The 32 codes of group `g` as sixteen words of its first half and sixteen of its
    /// second (zero- or sign-extended), in a 128-bit pair each; for [`Layout::Nibbles`] the
    /// sixteen nibble bytes twice, the low nibbles being the first half and the high the
    /// second (the kernels split them after widening).
    ///
    /// # Safety
    /// AVX2 is available; group `g` lies inside the row at `row`.
    unsafe fn halves(row: *const u8, g: usize) -> [__m128i; 2];
    /// Pair `p`'s codes as the AVX-512 decode kernel takes them, the words of the first
    /// 16s of groups `2p` and `2p + 1` (`2p + 1`'s zero where `p == full`, the odd last
    /// group) and of their second 16s, for the formats that read them in fewer instructions
    /// than through two [`Codes::halves`]; `None` for the others.
    ///
    /// # Safety
    /// AVX-512F/BW, AVX2 (the callers' features); group `2p` lies in the row, `2p + 1` too
    /// when `p < full`.
    #[inline(always)]
    unsafe fn pair_words(row: *const u8, p: usize, full: usize) -> Option<[__m512i; 2]> {
        let _ = (row, p, full);
        None
    }
    /// Whether each group's block starts with its scale `d` as an f16 (and, where
    /// [`Codes::OFFSET`], its offset `m` as an f16 at byte 2): the one-block-per-group formats,
    /// whose scales a kernel can gather from several rows as halves and convert at once.
    const F16_SCALES: bool = false;
    /// Whether [`Codes::block_scales`] reads the scales of a super-block of 8 groups at once
    /// (the K-quants': fewer instructions than eight [`Codes::scale`]).
    const BLOCK_SCALES: bool = false;
    /// The scales of groups `8b..8b + 8` (super-block `b`), then their offsets (a
    /// [`Codes::SPLIT`] format: the scales of its sixteen 16s), where [`Codes::BLOCK_SCALES`].
    ///
    /// # Safety
    /// AVX2, F16C; super-block `b` lies in the row.
    #[inline(always)]
    unsafe fn block_scales(row: *const u8, b: usize) -> [f32; 16] {
        unreachable!("{row:?} {b}: no block scales")
    }
    /// Group `j` of a super-block's [`Codes::block_scales`] as [`Codes::scale`] gives it.
    #[inline(always)]
    fn of_block(block: &[f32; 16], j: usize) -> ([f32; 2], f32) {
        if Self::SPLIT { ([block[2 * j], block[2 * j + 1]], 0.0) } else { ([block[j]; 2], block[8 + j]) }
    }
    /// Group `g`'s scales of its first and second 16 (equal unless [`Codes::SPLIT`]) and
    /// its offset `m`.
    ///
    /// # Safety
    /// As [`Codes::halves`].
    unsafe fn scale(row: *const u8, g: usize) -> ([f32; 2], f32);
}

/// The 32-value formats with one f16 scale, `Legacy<FIVE_BIT, MIN>`: Q4_0 (f16 d, sixteen
/// bytes of nibbles; centre 8), Q4_1 (f16 d, f16 m, nibbles), Q5_0 (f16 d, four bytes of fifth
/// bits, nibbles; centre 16) and Q5_1 (f16 d, f16 m, fifth bits, nibbles). `halves` returns
/// Q4's nibble bytes twice ([`Layout::Nibbles`]) and Q5's five-bit codes of values 0..16 and
/// 16..32, one per byte.
pub(in crate::quant) struct Legacy<const FIVE_BIT: bool, const MIN: bool>;
pub(in crate::quant) type Q4_0 = Legacy<false, false>;
pub(in crate::quant) type Q4_1 = Legacy<false, true>;
pub(in crate::quant) type Q5_0 = Legacy<true, false>;
pub(in crate::quant) type Q5_1 = Legacy<true, true>;
/// Q8_0 (f16 d, 32 signed bytes): `halves` returns bytes 0..16 and 16..32.
pub(in crate::quant) struct Q8_0;
/// The K-quants with 6-bit scales and mins, Q4_K (`KQuant<false>`) and Q5_K (`KQuant<true>`,
/// a fifth bit per code): super-blocks of 256, eight groups of 32; group `g` is sub-block
/// `g % 8` of super-block `g / 8`, its codes one per byte, `d·sc` and `−dmin·m` its scale and
/// offset.
pub(in crate::quant) struct KQuant<const FIFTH_BIT: bool>;
pub(in crate::quant) type Q4K = KQuant<false>;
pub(in crate::quant) type Q5K = KQuant<true>;
/// Q6_K (super-blocks of 256, an i8 scale per 16 values): the codes less 32 as signed
/// bytes, each 16 with its own scale ([`Codes::SPLIT`]).
pub(in crate::quant) struct Q6K;

impl Codes for Q8_0 {
    const BYTES: usize = 34;
    const LAYOUT: Layout = Layout::Signed;
    const OFFSET: bool = false;
    const CODES_AT: usize = 2;
    const F16_SCALES: bool = true;
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

impl<const FIVE_BIT: bool, const MIN: bool> Codes for Legacy<FIVE_BIT, MIN> {
    const BYTES: usize = 18 + if MIN { 2 } else { 0 } + if FIVE_BIT { 4 } else { 0 };
    const LAYOUT: Layout = if FIVE_BIT { Layout::Unsigned } else { Layout::Nibbles };
    const OFFSET: bool = MIN;
    const CENTRE: i16 = if MIN {
        0
    } else if FIVE_BIT {
        16
    } else {
        8
    };
    const CODES_AT: usize = if MIN { 4 } else { 2 };
    const F16_SCALES: bool = true;
    #[inline(always)]
    unsafe fn pair_words(row: *const u8, p: usize, full: usize) -> Option<[__m512i; 2]> {
        // SAFETY: forwarded contract. (An `if`, not `bool::then`: the closure would be a
        // function of its own, without the caller's target features, its intrinsics calls.)
        if FIVE_BIT { Some(unsafe { five_bit_pair::<Self>(row, p, full) }) } else { None }
    }
    #[inline(always)]
    unsafe fn halves(row: *const u8, g: usize) -> [__m128i; 2] {
        // SAFETY: block g (its scales, (Q5) 4 bytes of fifth bits, 16 bytes of nibbles) is in
        // the row; the callers are AVX2 functions.
        unsafe {
            if FIVE_BIT {
                five_bit_halves::<Self>(row, g)
            } else {
                let v = _mm_loadu_si128(row.add(g * Self::BYTES + Self::CODES_AT) as *const __m128i);
                [v, v]
            }
        }
    }
    #[inline(always)]
    unsafe fn scale(row: *const u8, g: usize) -> ([f32; 2], f32) {
        // SAFETY: as above. Without a stored minimum the codes are centred (`CENTRE`).
        unsafe {
            let b = row.add(g * Self::BYTES);
            ([f16_at(b); 2], if MIN { f16_at(b.add(2)) } else { 0.0 })
        }
    }
}

/// 32 byte codes as [`Codes::halves`] returns them.
#[inline(always)]
unsafe fn split(codes: __m256i) -> [__m128i; 2] {
    // SAFETY: the callers are AVX2 functions.
    unsafe { [_mm256_castsi256_si128(codes), _mm256_extracti128_si256::<1>(codes)] }
}

impl<const FIFTH_BIT: bool> KQuant<FIFTH_BIT> {
    /// Bytes of a super-block: f16 d, f16 dmin, 12 bytes of scales and mins, (Q5_K) 32 bytes
    /// of fifth bits, 128 bytes of nibbles.
    const BLOCK: usize = if FIFTH_BIT { 176 } else { 144 };
    /// Where the nibbles start.
    const NIBBLES_AT: usize = Self::BLOCK - 128;
}

impl<const FIFTH_BIT: bool> Codes for KQuant<FIFTH_BIT> {
    const BYTES: usize = Self::BLOCK / 8;
    const LAYOUT: Layout = Layout::Unsigned;
    const OFFSET: bool = true;
    const BLOCK_SCALES: bool = true;
    #[inline(always)]
    unsafe fn block_scales(row: *const u8, b: usize) -> [f32; 16] {
        // SAFETY: super-block b is in the row.
        unsafe { k_block_scales(row.add(b * Self::BLOCK)) }
    }
    #[inline(always)]
    unsafe fn pair_words(row: *const u8, p: usize, _: usize) -> Option<[__m512i; 2]> {
        let s = 2 * p % 8;
        // SAFETY: super-block 2p / 8 is in the row (K-quant rows hold whole pairs).
        unsafe {
            let b = row.add(2 * p / 8 * Self::BLOCK);
            let nibbles = k_nibble_pair(b.add(Self::NIBBLES_AT), s);
            if !FIFTH_BIT {
                return Some(nibbles);
            }
            let qh = _mm256_loadu_si256(b.add(16) as *const __m256i);
            // Bit s of every byte to its top, then one bit per byte into a mask.
            let (low, high) = (
                _mm256_movemask_epi8(_mm256_sll_epi16(qh, _mm_cvtsi32_si128(7 - s as i32))) as u32,
                _mm256_movemask_epi8(_mm256_sll_epi16(qh, _mm_cvtsi32_si128(6 - s as i32))) as u32,
            );
            Some(with_fifth_bits(nibbles, low, high))
        }
    }
    #[inline(always)]
    unsafe fn halves(row: *const u8, g: usize) -> [__m128i; 2] {
        // SAFETY: super-block g / 8 is in the row; the callers are AVX2 functions.
        unsafe {
            let b = row.add(g / 8 * Self::BLOCK);
            split(if FIFTH_BIT { q5k_codes(b, g % 8) } else { k_nibbles(b.add(Self::NIBBLES_AT), g % 8) })
        }
    }
    #[inline(always)]
    unsafe fn scale(row: *const u8, g: usize) -> ([f32; 2], f32) {
        // SAFETY: as above.
        let (d, m) = unsafe { k_scale_offset(row.add(g / 8 * Self::BLOCK), g % 8) };
        ([d; 2], m)
    }
}

impl Codes for Q6K {
    const BYTES: usize = 210 / 8;
    const LAYOUT: Layout = Layout::Signed;
    const OFFSET: bool = false;
    const SPLIT: bool = true;
    const BLOCK_SCALES: bool = true;
    #[inline(always)]
    unsafe fn block_scales(row: *const u8, b: usize) -> [f32; 16] {
        // SAFETY: super-block b (210 bytes: 16 i8 scales at 192, f16 d at 208) is in the row.
        unsafe {
            let block = row.add(b * 210);
            let d = _mm256_set1_ps(f16_at(block.add(208)));
            let scales = _mm_loadu_si128(block.add(192) as *const __m128i);
            let (first, second) =
                (_mm256_cvtepi8_epi32(scales), _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(scales)));
            let mut out = [0.0f32; 16];
            _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(_mm256_cvtepi32_ps(first), d));
            _mm256_storeu_ps(out.as_mut_ptr().add(8), _mm256_mul_ps(_mm256_cvtepi32_ps(second), d));
            out
        }
    }
    #[inline(always)]
    unsafe fn pair_words(row: *const u8, p: usize, _: usize) -> Option<[__m512i; 2]> {
        // SAFETY: super-block 2p / 8 (210 bytes) is in the row.
        Some(unsafe { q6k_pair(row.add(2 * p / 8 * 210), 2 * p % 8) })
    }
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

/// [`Codes::pair_words`] of groups `g` and `g + 1` (`g` even) of the Q6_K super-block at `b`,
/// the codes less 32: group `g` is quarter `g % 4` of half `g / 4`, its value `l` the nibble of
/// `ql[64·half + 32·(quarter % 2) + l]` (low for quarters 0 and 1, high for 2 and 3) and bits
/// `2·quarter..` of `qh[32·half + l]` above it. A pair's two groups share their half, their
/// nibbles' side and their `qh` bytes.
///
/// # Safety
/// AVX-512F/BW, AVX2; `b` points at a whole super-block; `g < 8`.
#[inline(always)]
unsafe fn q6k_pair(b: *const u8, g: usize) -> [__m512i; 2] {
    let (half, quarter) = (g / 4, g % 4);
    // SAFETY: per the contract: ql (128 bytes), then qh (64).
    unsafe {
        let ql = b.add(64 * half);
        let (a, c) =
            (_mm256_loadu_si256(ql as *const __m256i), _mm256_loadu_si256(ql.add(32) as *const __m256i));
        let qh = _mm256_loadu_si256(b.add(128 + 32 * half) as *const __m256i);
        // Per word: the nibble's shift (the same for both groups), then the two high bits'
        // (group g's at 2·quarter, g + 1's two above).
        let nibble_shift = _mm512_set1_epi16(if quarter < 2 { 0 } else { 4 });
        let high_shift = _mm512_inserti64x4::<1>(
            _mm512_set1_epi16(2 * quarter as i16),
            _mm256_set1_epi16(2 * quarter as i16 + 2),
        );
        // Values 0..16 (first) or 16..32 (second) of both groups: g's nibbles from `a`, g + 1's
        // from `c`, both their high bits from the same 16 bytes of `qh`.
        let shifts = (nibble_shift, high_shift);
        [
            q6k_words(_mm256_permute2x128_si256::<0x20>(a, c), _mm256_castsi256_si128(qh), shifts),
            q6k_words(_mm256_permute2x128_si256::<0x31>(a, c), _mm256_extracti128_si256::<1>(qh), shifts),
        ]
    }
}

/// 32 Q6_K codes less 32 as words: the nibbles of `nibbles`' bytes (each word shifted right by
/// `shifts.0`'s), over two bits of `high`'s bytes (both halves of the words read the same 16
/// bytes, shifted by `shifts.1`'s words).
///
/// # Safety
/// AVX-512F/BW, AVX2 (the callers' features).
#[inline(always)]
unsafe fn q6k_words(nibbles: __m256i, high: __m128i, shifts: (__m512i, __m512i)) -> __m512i {
    // SAFETY: register operands only, under the callers' features.
    unsafe {
        let (low4, low2) = (_mm512_set1_epi16(0x0f), _mm512_set1_epi16(3));
        let n = _mm512_and_si512(_mm512_srlv_epi16(_mm512_cvtepu8_epi16(nibbles), shifts.0), low4);
        let h = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(high));
        let h = _mm512_slli_epi16::<4>(_mm512_and_si512(_mm512_srlv_epi16(h, shifts.1), low2));
        _mm512_sub_epi16(_mm512_or_si512(n, h), _mm512_set1_epi16(32))
    }
}

/// `words` (a pair's first and second 16s, as [`Codes::pair_words`]) with 16 added to
/// each code whose fifth bit is set: bit `i` of `q0` / `q1` is code `i`'s of group `2p` /
/// `2p + 1`.
#[inline(always)]
unsafe fn with_fifth_bits(words: [__m512i; 2], q0: u32, q1: u32) -> [__m512i; 2] {
    // Words 0..16 are group 2p's codes 0..16 (first) or 16..32 (second), words 16..32
    // group 2p + 1's.
    let (first, second) = ((q0 & 0xffff) | (q1 << 16), (q0 >> 16) | (q1 & 0xffff_0000));
    // SAFETY: the callers are AVX-512BW functions.
    unsafe {
        let fifth = _mm512_set1_epi16(0x10);
        let [a, b] = words;
        [_mm512_mask_add_epi16(a, first, a, fifth), _mm512_mask_add_epi16(b, second, b, fifth)]
    }
}

/// [`Codes::pair_words`] of a five-bit format (Q5_0, Q5_1: at `F::CODES_AT` of each group a
/// little-endian `u32` of fifth bits, bit `i` code `i`'s, then sixteen bytes of nibbles,
/// codes 0..16 low and 16..32 high): the nibbles as Q4_0's, the fifth bits from mask
/// registers, a fraction of the instructions of `halves`' byte shuffles.
///
/// # Safety
/// As [`Codes::pair_words`].
#[inline(always)]
unsafe fn five_bit_pair<F: Codes>(row: *const u8, p: usize, full: usize) -> [__m512i; 2] {
    // SAFETY: per the contract.
    unsafe {
        let at = |g: usize| row.add(g * F::BYTES + F::CODES_AT);
        let group = |g: usize| ((at(g) as *const u32).read_unaligned(), _mm_loadu_si128(at(g).add(4).cast()));
        let (q0, n0) = group(2 * p);
        let (q1, n1) = if p < full { group(2 * p + 1) } else { (0, _mm_setzero_si128()) };
        let w = _mm512_cvtepu8_epi16(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(n0), n1));
        let low4 = _mm512_set1_epi16(0x0f);
        with_fifth_bits([_mm512_and_si512(w, low4), _mm512_srli_epi16::<4>(w)], q0, q1)
    }
}

/// `d·sc` of the eight sub-blocks of the Q4_K / Q5_K super-block at `b`, then their
/// `−dmin·m`: ggml's unpacking of the 6-bit scales and mins from their 12 bytes with word
/// masks (its `utmp`), and one conversion for all eight.
///
/// # Safety
/// AVX2, F16C; `b` points at a whole super-block.
#[inline(always)]
unsafe fn k_block_scales(b: *const u8) -> [f32; 16] {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    // SAFETY: the header (f16 d, f16 dmin, 12 bytes of scales and mins) is in the block.
    unsafe {
        let (d, dmin) = f16_pair_at(b);
        let word = |i: usize| (b.add(4 + 4 * i) as *const u32).read_unaligned();
        let (u0, u1, u2) = (word(0), word(1), word(2));
        // Byte j: scale j (sub-blocks 4..8 take their top two bits from the bytes of 0..4).
        let scales = u64::from(u0 & LOW6) | u64::from((u2 & LOW4) | ((u0 >> 6) & LOW2) << 4) << 32;
        let mins = u64::from(u1 & LOW6) | u64::from(((u2 >> 4) & LOW4) | ((u1 >> 6) & LOW2) << 4) << 32;
        let (scales, mins) = (
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(scales as i64))),
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mins as i64))),
        );
        let mut out = [0.0f32; 16];
        _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(scales, _mm256_set1_ps(d)));
        _mm256_storeu_ps(out.as_mut_ptr().add(8), _mm256_mul_ps(mins, _mm256_set1_ps(-dmin)));
        out
    }
}

/// The low four bits of the codes of sub-blocks `s` and `s + 1` (`s` even) of a Q4_K /
/// Q5_K super-block whose 128 bytes of nibbles start at `qs`, as [`Codes::pair_words`]:
/// both are the 32 bytes at `32·(s/2)`, sub-block `s` their low nibbles, `s + 1` their high.
///
/// # Safety
/// AVX-512F/BW, AVX2; `qs` points at the super-block's nibbles; `s < 8`.
#[inline(always)]
unsafe fn k_nibble_pair(qs: *const u8, s: usize) -> [__m512i; 2] {
    // SAFETY: per the contract.
    unsafe {
        let bytes = _mm256_loadu_si256(qs.add(32 * (s / 2)) as *const __m256i);
        // Words 0..16 keep their low nibble, 16..32 shift their high one down.
        let shifts = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4));
        let low4 = _mm512_set1_epi16(0x0f);
        let lo = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm256_castsi256_si128(bytes)));
        let hi = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm256_extracti128_si256::<1>(bytes)));
        [
            _mm512_and_si512(_mm512_srlv_epi16(lo, shifts), low4),
            _mm512_and_si512(_mm512_srlv_epi16(hi, shifts), low4),
        ]
    }
}

/// Whether the format's codes are nibbles (split after widening) rather than bytes.
pub(super) const fn nibbles<F: Codes>() -> bool {
    matches!(F::LAYOUT, Layout::Nibbles)
}
