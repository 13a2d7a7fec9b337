//! The AVX-512 path: each format's 32-value groups dequantized into two zmm registers
//! ([`Group`]), the decode dot products over them for up to four tokens at once, and row
//! dequantization. The byte shuffling that feeds them stays in xmm/ymm (AVX2), so the path
//! needs AVX-512F besides AVX2, FMA and F16C, chosen at run time by [`super::Isa::Avx512`].

use std::arch::x86_64::*;

use super::avx2::{PREFETCH_AHEAD, f16_at, scale_min_k4};
use super::{Activations, GgmlType, Out, PartRef};

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

/// The dequantized values of group `g`.
///
/// # Safety
/// As [`Group::codes`].
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn group<F: Group>(row: *const u8, g: usize) -> [__m512; 2] {
    // SAFETY: forwarded contract.
    let (q, scale, offset) = unsafe { F::codes(row, g) };
    affine(q, scale, offset)
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

/// `q·scale + offset` for each vector.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn affine<const N: usize>(q: [__m512; N], scale: f32, offset: f32) -> [__m512; N] {
    let (s, o) = (_mm512_set1_ps(scale), _mm512_set1_ps(offset));
    q.map(|v| _mm512_fmadd_ps(v, s, o))
}

pub(super) struct Q8_0;
impl Group for Q8_0 {
    const BYTES: usize = 34;
    const OFFSET: bool = false;

    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn codes(row: *const u8, g: usize) -> ([__m512; 2], f32, f32) {
        // SAFETY: block g (34 bytes: f16 d, 32 i8) lies inside the row.
        unsafe {
            let b = row.add(g * 34);
            let f =
                |p: *const u8| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)));
            ([f(b.add(2)), f(b.add(18))], f16_at(b), 0.0)
        }
    }
}

pub(super) struct Q4_0;
impl Group for Q4_0 {
    const BYTES: usize = 18;
    const OFFSET: bool = true;

    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn codes(row: *const u8, g: usize) -> ([__m512; 2], f32, f32) {
        // SAFETY: block g (18 bytes: f16 d, 16 bytes of nibbles) lies inside the row.
        unsafe {
            let b = row.add(g * 18);
            let d = f16_at(b);
            (nibbles_low_then_high(_mm_loadu_si128(b.add(2) as *const __m128i)), d, -8.0 * d)
        }
    }
}

pub(super) struct Q4_1;
impl Group for Q4_1 {
    const BYTES: usize = 20;
    const OFFSET: bool = true;

    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn codes(row: *const u8, g: usize) -> ([__m512; 2], f32, f32) {
        // SAFETY: block g (20 bytes: f16 d, f16 m, 16 bytes of nibbles) lies inside the row.
        unsafe {
            let b = row.add(g * 20);
            // d and m side by side: one load and one conversion for both.
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((b as *const i32).read_unaligned()));
            let (d, m) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
            (nibbles_low_then_high(_mm_loadu_si128(b.add(4) as *const __m128i)), d, m)
        }
    }
}

pub(super) struct F16;
impl Group for F16 {
    const BYTES: usize = 64;
    const OFFSET: bool = false;

    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn codes(row: *const u8, g: usize) -> ([__m512; 2], f32, f32) {
        // SAFETY: 32 halves (64 bytes) at 64·g lie inside the row.
        unsafe {
            let b = row.add(g * 64);
            ([0, 32].map(|o| _mm512_cvtph_ps(_mm256_loadu_si256(b.add(o) as *const __m256i))), 1.0, 0.0)
        }
    }
}

pub(super) struct Bf16;
impl Group for Bf16 {
    const BYTES: usize = 64;
    const OFFSET: bool = false;

    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn codes(row: *const u8, g: usize) -> ([__m512; 2], f32, f32) {
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
}

/// 32 bytes as two vectors of sixteen f32 (zero-extended).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn u8x32_to_f32(v: __m256i) -> [__m512; 2] {
    [u8x16_to_f32(_mm256_castsi256_si128(v)), u8x16_to_f32(_mm256_extracti128_si256::<1>(v))]
}

pub(super) struct Q4K;
impl Group for Q4K {
    const BYTES: usize = 18;
    const OFFSET: bool = true;

    /// As [`super::avx2::Q4K`]: sub-block `g % 8` of super-block `g / 8`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn codes(row: *const u8, g: usize) -> ([__m512; 2], f32, f32) {
        // SAFETY: super-block g/8 (144 bytes) lies inside the row.
        unsafe {
            let b = row.add(g / 8 * 144);
            let s = g % 8;
            let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
            let (sc, m) = scale_min_k4(s, &*(b.add(4) as *const [u8; 12]));
            let bytes = _mm256_loadu_si256(b.add(16 + 32 * (s / 2)) as *const __m256i);
            let nib = if s.is_multiple_of(2) { bytes } else { _mm256_srli_epi16::<4>(bytes) };
            let q = _mm256_and_si256(nib, _mm256_set1_epi8(0x0f));
            (u8x32_to_f32(q), d * f32::from(sc), -dmin * f32::from(m))
        }
    }
}

pub(super) struct Q6K;
impl Group for Q6K {
    const BYTES: usize = 26;
    const OFFSET: bool = false;

    /// As [`super::avx2::Q6K`]: quarter `g % 4` of half `g % 8 / 4` of super-block `g / 8`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn codes(row: *const u8, g: usize) -> ([__m512; 2], f32, f32) {
        // SAFETY: super-block g/8 (210 bytes) lies inside the row.
        unsafe {
            let b = row.add(g / 8 * 210);
            let (half, quarter) = (g % 8 / 4, g % 4);
            let q = super::avx2::q6k_codes(b, half, quarter);
            let d = f16_at(b.add(208));
            let scales = b.add(192 + 8 * half + 2 * quarter) as *const i8;
            let (s0, s1) = (d * f32::from(*scales), d * f32::from(*scales.add(1)));
            let [lo, hi] = u8x32_to_f32(q);
            // Two scales per group: the values themselves.
            let [a] = affine([lo], s0, -32.0 * s0);
            let [c] = affine([hi], s1, -32.0 * s1);
            ([a, c], 1.0, 0.0)
        }
    }
}

/// Rows `rows` of `part` times tokens `t0..t0+M` of `x`, into `out`: per group, the codes
/// are multiplied into each token's 32 activations, the sum scaled once, and the offset added
/// through the activations' group sum (computed once per call, [`Activations`]).
///
/// # Safety
/// AVX-512F, AVX2, FMA, F16C; the rows and tokens lie inside `part` and `x`; only this task
/// writes columns `rows` of `out`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn dot_rows<F: Group, const M: usize>(
    part: &PartRef<'_>,
    rows: std::ops::Range<usize>,
    acts: Activations<'_>,
    t0: usize,
    out: Out,
    accumulate: bool,
) {
    let k = part.cols;
    let groups = k / 32;
    let xs = acts.x[t0 * k..(t0 + M) * k].as_ptr();
    let group_sums = &acts.group_sums[t0 * groups..];
    for r in rows {
        let row = part.row(r).as_ptr();
        let mut acc = [_mm512_setzero_ps(); M];
        let mut offsets = [0.0f32; M];
        for g in 0..groups {
            // SAFETY: g < groups, so the group lies in the row; x holds M rows of k. The
            // prefetch is a hint (it may point past the part and never faults).
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(g * F::BYTES + PREFETCH_AHEAD) as *const i8);
                let (q, scale, offset) = F::codes(row, g);
                let scale = _mm512_set1_ps(scale);
                for (t, a) in acc.iter_mut().enumerate() {
                    let xp = xs.add(t * k + 32 * g);
                    let dot = _mm512_fmadd_ps(
                        q[1],
                        _mm512_loadu_ps(xp.add(16)),
                        _mm512_mul_ps(q[0], _mm512_loadu_ps(xp)),
                    );
                    *a = _mm512_fmadd_ps(dot, scale, *a);
                    if F::OFFSET {
                        offsets[t] = offset.mul_add(*group_sums.get_unchecked(t * groups + g), offsets[t]);
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

dot_rows_dyn!(avx512);

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn dequantize_row_as<G: Group>(row: &[u8], out: &mut [f32]) {
    for (g, chunk) in out.chunks_exact_mut(32).enumerate() {
        // SAFETY: the row holds out.len() values, so group g exists; chunk has 32 floats.
        unsafe {
            let [a, b] = group::<G>(row.as_ptr(), g);
            _mm512_storeu_ps(chunk.as_mut_ptr(), a);
            _mm512_storeu_ps(chunk.as_mut_ptr().add(16), b);
        }
    }
}

/// One row of format `ty` (`out.len()` values, a multiple of 32) into `out`.
///
/// # Safety
/// AVX-512F, AVX2, FMA and F16C are available; `row` holds exactly one row of `out.len()`
/// values.
pub(super) unsafe fn dequantize_row(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    // SAFETY: forwarded contract.
    unsafe { with_group!(avx512, ty, G => dequantize_row_as::<G>(row, out)) }
}
