//! The AVX2 + FMA + F16C path: each format's 32-value groups dequantized into four ymm
//! registers ([`Group`]), the decode dot products over them for up to four tokens at once, and
//! row dequantization for the prefill panels and embedding lookups.
//!
//! Every function here requires those three CPU features: callers reach them only through
//! [`super::Isa::Avx2`], which is chosen after run-time detection.

use std::arch::x86_64::*;

use super::{Activations, GgmlType, RowTask};
use crate::ggml::scale_min_k4;

/// One format's groups of 32 consecutive values of a row, factored as `codes·scale + offset`
/// (see [`super::avx512::Group`], of which this is the eight-lane twin). The formats and
/// kernels both paths share are in [`super::x86_path`].
pub(super) trait Group {
    /// Bytes of a row per group of 32 values (rounded down for Q6_K's 26.25): how far the
    /// prefetch moves per group.
    const BYTES: usize;
    /// Whether `offset` can be non-zero.
    const OFFSET: bool;

    /// Values `32·g .. 32·g + 32` of the row at `row` as `(codes, scale, offset)`: four vectors
    /// of eight codes, value = code·scale + offset (scale 1 for formats without one scale per
    /// 32 values, whose "codes" are the values).
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available; `row` points at a whole row of this format holding
    /// more than `32·g` values.
    unsafe fn codes(row: *const u8, g: usize) -> ([__m256; 4], f32, f32);
}

/// An f16 stored at `p` (unaligned), as f32 (the AVX-512 path uses it too).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller's block holds two bytes at p.
    let bits = unsafe { (p as *const u16).read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// Sixteen bytes as two vectors of eight f32 (zero-extended).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn u8x16_to_f32(v: __m128i) -> [__m256; 2] {
    [
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v))),
    ]
}

/// Sixteen bytes of packed nibbles as 32 values: the low nibbles (values 0..16), then the
/// high nibbles (16..32): ggml's order for Q4_0 and Q4_1.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles_low_then_high(v: __m128i) -> [__m256; 4] {
    let mask = _mm_set1_epi8(0x0f);
    let [a, b] = u8x16_to_f32(_mm_and_si128(v, mask));
    let [c, d] = u8x16_to_f32(_mm_and_si128(_mm_srli_epi16::<4>(v), mask));
    [a, b, c, d]
}

groups! {
    features: "avx2,fma,f16c", vectors: [__m256; 4];

    Q8_0 { bytes: 34, offset: false } => |row, g| {
        // SAFETY: block g (34 bytes: f16 d, 32 i8) lies inside the row.
        unsafe {
            let b = row.add(g * 34);
            let lo = _mm_loadu_si128(b.add(2) as *const __m128i);
            let hi = _mm_loadu_si128(b.add(18) as *const __m128i);
            let f = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
            ([f(lo), f(_mm_srli_si128::<8>(lo)), f(hi), f(_mm_srli_si128::<8>(hi))], f16_at(b), 0.0)
        }
    }

    F16 { bytes: 64, offset: false } => |row, g| {
        // SAFETY: 32 halves (64 bytes) at 64·g lie inside the row.
        unsafe {
            let b = row.add(g * 64);
            ([0, 16, 32, 48].map(|o| _mm256_cvtph_ps(_mm_loadu_si128(b.add(o) as *const __m128i))), 1.0, 0.0)
        }
    }

    Bf16 { bytes: 64, offset: false } => |row, g| {
        // SAFETY: 32 bf16 (64 bytes) at 64·g lie inside the row.
        unsafe {
            let b = row.add(g * 64);
            // A bf16 is the top half of an f32.
            let values = [0, 16, 32, 48].map(|o| {
                let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(b.add(o) as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v))
            });
            (values, 1.0, 0.0)
        }
    }

    /// Super-block of 256 (210 bytes: 128 bytes of low nibbles `ql`, 64 of high bit pairs
    /// `qh`, 16 i8 scales, f16 d) in two halves of 128; group `s` is quarter `s%4` of half
    /// `s/4`: value `l` of it is `(ql[l (+32)] nibble | qh[l] bits 2·quarter.. << 4) − 32`,
    /// scaled by `d·scales[8·half + 2·quarter + l/16]`.
    Q6K { bytes: 26, offset: false } => |row, g| {
        // SAFETY: super-block g/8 (210 bytes) lies inside the row.
        unsafe {
            let (codes, s0, s1) = q6k_group(row, g);
            let q = u8x32_to_f32(codes);
            // Two scales per group: the values themselves.
            let [a, b2] = affine([q[0], q[1]], s0, -32.0 * s0);
            let [c, e] = affine([q[2], q[3]], s1, -32.0 * s1);
            ([a, b2, c, e], 1.0, 0.0)
        }
    }
}

/// Two f16 side by side at `p` (Q4_1 / Q5_1's `d` and `m`) as f32: one load and one
/// conversion for both.
///
/// # Safety
/// F16C is available; four bytes at `p` are readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_pair_at(p: *const u8) -> (f32, f32) {
    // SAFETY: the caller's block holds four bytes at p.
    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(unsafe { (p as *const i32).read_unaligned() }));
    (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)))
}

/// `0x10` in each byte where `bytes` has every bit of `select`'s byte set, else 0: a code's
/// fifth bit moved into place from a bit-per-byte mask (AVX2 shifts no single bytes, but it
/// compares them).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn fifth_bits(bytes: __m256i, select: __m256i) -> __m256i {
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, select), select);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The 32 five-bit codes (0..32) of a Q5_0 / Q5_1 block in value order, one per byte: the low
/// nibbles of the 16 bytes at `qs`, then their high nibbles, value `i` with bit `i` of the
/// little-endian `u32` at `qh` as its fifth bit.
///
/// # Safety
/// AVX2 is available; 4 bytes at `qh` and 16 at `qs` are readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_codes(qh: *const u8, qs: *const u8) -> __m256i {
    // SAFETY: per the contract.
    let (bits, nib) = unsafe { ((qh as *const i32).read_unaligned(), _mm_loadu_si128(qs as *const __m128i)) };
    let low = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(nib), nib), _mm256_set1_epi8(0x0f));
    // Byte i gets byte i/8 of qh (the shuffle stays in each 128-bit half, and both hold all
    // four bytes), then keeps bit i % 8 of it.
    #[rustfmt::skip]
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits), spread);
    let one_bit_each = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    _mm256_or_si256(low, fifth_bits(bytes, one_bit_each))
}

/// The scale and offset of sub-block `s` of the Q4_K / Q5_K super-block at `b`:
/// `d·sc` and `−dmin·m` from the f16 header and the packed 6-bit scales and mins.
///
/// # Safety
/// F16C is available; `b` points at a whole super-block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k_scale_offset(b: *const u8, s: usize) -> (f32, f32) {
    // SAFETY: the header (16 bytes) lies at the start of the super-block.
    unsafe {
        let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
        let (sc, m) = scale_min_k4(s, &*(b.add(4) as *const [u8; 12]));
        (d * f32::from(sc), -dmin * f32::from(m))
    }
}

/// The low four bits of sub-block `s`'s 32 codes in a Q4_K / Q5_K super-block whose 128
/// bytes of nibbles start at `qs`: the low nibbles of bytes `32·(s/2)..` for even `s`, the
/// high nibbles for odd `s`.
///
/// # Safety
/// AVX2 is available; `qs` points at the super-block's 128 bytes of nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k_nibbles(qs: *const u8, s: usize) -> __m256i {
    // SAFETY: s < 8, so the 32 bytes lie among the 128.
    let bytes = unsafe { _mm256_loadu_si256(qs.add(32 * (s / 2)) as *const __m256i) };
    let nib = if s.is_multiple_of(2) { bytes } else { _mm256_srli_epi16::<4>(bytes) };
    _mm256_and_si256(nib, _mm256_set1_epi8(0x0f))
}

/// The 32 five-bit codes (0..32) of sub-block `s` of the Q5_K super-block at `b` (176 bytes:
/// Q4_K's 16-byte header, 32 bytes of fifth bits, 128 bytes of nibbles): Q4_K's nibbles with
/// bit `s` of fifth-bit byte `l` worth 16 in value `l`.
///
/// # Safety
/// AVX2 is available; `b` points at a whole super-block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5k_codes(b: *const u8, s: usize) -> __m256i {
    // SAFETY: the fifth bits (32 bytes at 16) and the nibbles (128 at 48) lie in the block.
    let (qh, nibbles) = unsafe { (_mm256_loadu_si256(b.add(16) as *const __m256i), k_nibbles(b.add(48), s)) };
    _mm256_or_si256(nibbles, fifth_bits(qh, _mm256_set1_epi8((1u8 << s) as i8)))
}

/// 32 bytes as four vectors of eight f32 (zero-extended).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn u8x32_to_f32(v: __m256i) -> [__m256; 4] {
    let [a, b] = u8x16_to_f32(_mm256_castsi256_si128(v));
    let [c, d] = u8x16_to_f32(_mm256_extracti128_si256::<1>(v));
    [a, b, c, d]
}

/// Q6_K group `g` of the row at `row` (see [`Q6K`]): its 32 six-bit codes (0..64, before the
/// −32), one per byte, and the scales `d·scale` of its first and second 16.
///
/// # Safety
/// AVX2 is available; super-block `g / 8` (210 bytes) lies inside the row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6k_group(row: *const u8, g: usize) -> (__m256i, f32, f32) {
    let (half, quarter) = (g % 8 / 4, g % 4);
    // SAFETY: per the contract: ql (128 bytes), qh (64), the 16 scales and d lie in the
    // super-block at b.
    let (b, scales) = unsafe {
        let b = row.add(g / 8 * 210);
        let d = f16_at(b.add(208));
        let s = b.add(192 + 8 * half + 2 * quarter) as *const i8;
        (b, (d * f32::from(*s), d * f32::from(*s.add(1))))
    };
    // SAFETY: as above.
    let (ql, qh) = unsafe {
        (
            _mm256_loadu_si256(b.add(64 * half + 32 * (quarter % 2)) as *const __m256i),
            _mm256_loadu_si256(b.add(128 + 32 * half) as *const __m256i),
        )
    };
    let nib = if quarter < 2 { ql } else { _mm256_srli_epi16::<4>(ql) };
    let high2 = match quarter {
        0 => qh,
        1 => _mm256_srli_epi16::<2>(qh),
        2 => _mm256_srli_epi16::<4>(qh),
        _ => _mm256_srli_epi16::<6>(qh),
    };
    // Masking each byte before the left shift keeps bits inside their byte.
    let high = _mm256_slli_epi16::<4>(_mm256_and_si256(high2, _mm256_set1_epi8(3)));
    (_mm256_or_si256(_mm256_and_si256(nib, _mm256_set1_epi8(0x0f)), high), scales.0, scales.1)
}

/// Horizontal sum of eight lanes (the int16 path uses it too).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Bytes ahead of the group being read that the decode loops prefetch: the hardware
/// prefetchers stop at every 4 KiB page, and a quantized row is only a few hundred bytes, so
/// without this each page starts with a stall on memory. A page ahead, because one core
/// streams from memory at only ~13 GB/s (its misses in flight over the latency): Q4_1 decode
/// over a 110 MB set of SmolLM2-sized matrices on two threads measured 10.3 GB/s without
/// prefetches, 12.0–13.7 with 1 KiB, 14.2–17.4 with 4 KiB and no better further ahead
/// (`model` crate, AVX-512, 2-core Xeon).
pub(super) const PREFETCH_AHEAD: usize = 4096;

x86_path! {
    isa: avx2, features: "avx2,fma,f16c", vector: __m256, lanes: 8, hsum: hsum,
    intrinsics: _mm256_setzero_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_storeu_ps,
    dot: |q, xp| {
        let mut dot = _mm256_mul_ps(q[0], _mm256_loadu_ps(xp));
        for (j, &qj) in q.iter().enumerate().skip(1) {
            dot = _mm256_fmadd_ps(qj, _mm256_loadu_ps(xp.add(8 * j)), dot);
        }
        dot
    },
}
