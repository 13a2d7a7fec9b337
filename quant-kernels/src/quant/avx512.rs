//! The AVX-512 path: each format's 32-value groups dequantized into two zmm registers
//! ([`Group`]), the decode dot products over them for up to four tokens at once, and row
//! dequantization. The byte shuffling that feeds them stays in xmm/ymm (AVX2), so the path
//! needs AVX-512F besides AVX2, FMA and F16C, chosen at run time by [`super::Isa::Avx512`].

use std::arch::x86_64::*;

use super::avx2::{PREFETCH_AHEAD, f16_at, f16_pair_at, k_nibbles, k_scale_offset, q5_codes, q5k_codes};
use super::{Activations, GgmlType, RowTask};

/// One format's groups of 32 consecutive values of a row, factored as `codes·scale + offset`
/// with one scale and offset per group: the decode loop multiplies the codes into the
/// activations and applies the scale once per group, and the offset through the group's sum
/// of activations, instead of dequantizing every value first.
pub(super) trait Group {
    /// Bytes of a row per group of 32 values (rounded down for Q6_K): the prefetch stride.
    const BYTES: usize;
    /// Whether `offset` can be non-zero.
    const OFFSET: bool;

    /// Values `32·g .. 32·g + 32` of the row at `row` as `(codes, scale, offset)`: two
    /// vectors of sixteen codes, value = code·scale + offset. Formats without one scale per
    /// 32 values return the values themselves with scale 1.
    ///
    /// # Safety
    /// AVX-512F, AVX2, FMA and F16C are available; `row` points at a whole row of this format
    /// holding more than `32·g` values.
    unsafe fn codes(row: *const u8, g: usize) -> ([__m512; 2], f32, f32);
}

/// Sixteen bytes as sixteen f32 (zero-extended).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn u8x16_to_f32(v: __m128i) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v))
}

/// Sixteen bytes of packed nibbles as 32 values: low nibbles (0..16), then high (16..32).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn nibbles_low_then_high(v: __m128i) -> [__m512; 2] {
    let mask = _mm_set1_epi8(0x0f);
    [u8x16_to_f32(_mm_and_si128(v, mask)), u8x16_to_f32(_mm_and_si128(_mm_srli_epi16::<4>(v), mask))]
}

groups! {
    features: "avx512f,avx2,fma,f16c", vectors: [__m512; 2];

    Q8_0 { bytes: 34, offset: false } => |row, g| {
        // SAFETY: block g (34 bytes: f16 d, 32 i8) lies inside the row.
        unsafe {
            let b = row.add(g * 34);
            let f =
                |p: *const u8| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)));
            ([f(b.add(2)), f(b.add(18))], f16_at(b), 0.0)
        }
    }

    F16 { bytes: 64, offset: false } => |row, g| {
        // SAFETY: 32 halves (64 bytes) at 64·g lie inside the row.
        unsafe {
            let b = row.add(g * 64);
            ([0, 32].map(|o| _mm512_cvtph_ps(_mm256_loadu_si256(b.add(o) as *const __m256i))), 1.0, 0.0)
        }
    }

    Bf16 { bytes: 64, offset: false } => |row, g| {
        // SAFETY: 32 bf16 (64 bytes) at 64·g lie inside the row.
        unsafe {
            let b = row.add(g * 64);
            // A bf16 is the top half of an f32.
            let values = [0, 32].map(|o| {
                let v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(b.add(o) as *const __m256i));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v))
            });
            (values, 1.0, 0.0)
        }
    }

    /// As [`super::avx2::Q6K`]: quarter `g % 4` of half `g % 8 / 4` of super-block `g / 8`.
    Q6K { bytes: 26, offset: false } => |row, g| {
        // SAFETY: super-block g/8 (210 bytes) lies inside the row.
        unsafe {
            let (codes, s0, s1) = super::avx2::q6k_group(row, g);
            let [lo, hi] = u8x32_to_f32(codes);
            // Two scales per group: the values themselves.
            let [a] = affine([lo], s0, -32.0 * s0);
            let [c] = affine([hi], s1, -32.0 * s1);
            ([a, c], 1.0, 0.0)
        }
    }
}

/// 32 bytes as two vectors of sixteen f32 (zero-extended).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn u8x32_to_f32(v: __m256i) -> [__m512; 2] {
    [u8x16_to_f32(_mm256_castsi256_si128(v)), u8x16_to_f32(_mm256_extracti128_si256::<1>(v))]
}

x86_path! {
    isa: avx512, features: "avx512f,avx2,fma,f16c", vector: __m512, lanes: 16, hsum: _mm512_reduce_add_ps,
    intrinsics: _mm512_setzero_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_storeu_ps,
    dot: |q, xp| _mm512_fmadd_ps(q[1], _mm512_loadu_ps(xp.add(16)), _mm512_mul_ps(q[0], _mm512_loadu_ps(xp))),
}
