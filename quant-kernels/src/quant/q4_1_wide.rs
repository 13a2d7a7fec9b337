//! Q4_1 decode on AVX-512 with four groups across the lanes: the batch-1 decode's hottest
//! loop (SmolLM2's per-layer weights), where the per-group kernel of [`super::avx512`] is
//! bound by its instructions rather than by the bytes it reads (8.7 GB/s per core with the
//! weights in L2; this one 12–14).
//!
//! A Q4_1 group is 20 bytes, a whole number of dwords (`[d, m]` as two f16, then sixteen bytes
//! of nibbles), so a block of four groups is 20 dwords that two loads and one two-source
//! dword permute turn into sixteen lanes of eight nibbles each, lane `j` holding dword `j % 4`
//! of group `j / 4`. Each of the eight nibble positions is then one rotate and one ternary
//! logic op away from sixteen f32 values: the nibble `c` placed in the top mantissa bits of
//! 16.0 is the float `16 + c`, exactly. The activations are permuted once per call into the
//! same lane order ([`Permuted`]), so the block's dot product is
//! `Σ (16 + c)·x − 16·X = Σ c·x` (`X` the lane's sum of activations: the chain starts at
//! `−16·X`), scaled lane-wise by the group scales `d`. The offsets `m·Σx` take one FMA of the
//! converted `[d₀, m₀, d₁, m₁, …]` headers with the group sums placed beside the `m` lanes,
//! and a pair of blocks shares one header permute and conversion. Per four groups that is
//! eight rotates, eight ternlogs and eight FMAs per token instead of the per-group kernel's
//! zero-extensions, conversions and scalar scale handling.
//!
//! Rounding: the terms summed are `(16 + c)·x` rather than `c·x`, up to ~3× the size, so the
//! f32 sums round ~3× coarser than the per-group kernel's (still ~1e-7 of Σ|w·x|; the
//! kernel tests hold it to the same 1e-5 bound against the f64 reference).

use std::arch::x86_64::*;

use super::RowTask;
use super::avx2::PREFETCH_AHEAD;

/// Groups of 32 values per block (one zmm of sixteen dwords of nibbles).
const GROUPS: usize = 4;
/// Bytes of a Q4_1 group.
const GROUP_BYTES: usize = 20;
/// Vectors of sixteen floats per (token, block) in [`Permuted`]: the eight nibble positions'
/// activations, then `−16·X`, then the group sums beside the scales' lanes (see there).
const VECTORS: usize = 10;
const BLOCK_FLOATS: usize = VECTORS * 16;

/// The activations of a call in the kernel's lane order: for token `t` and block `b`, ten
/// vectors of sixteen floats at `((t·blocks + b)·10 + v)·16`: for `v < 8` the activations
/// lane `j` multiplies at nibble position `v`, `v = 8` is `−16·X` (`X` = each lane's sum of
/// those eight), and `v = 9` is `[0, s₀, 0, s₁, 0, s₂, 0, s₃]` (`sᵢ` = group `i`'s sum) for
/// this block and the same for the next in lanes 8..16, to multiply the converted
/// `[d₀, m₀, d₁, m₁, …]` headers of one block or a pair into the offsets with one FMA. Lanes
/// of groups past the row's end are zero.
pub(super) struct Permuted {
    data: Vec<f32>,
    blocks: usize,
}

impl Permuted {
    /// `x[m, k]` (`k` a multiple of 32) in lane order.
    pub(super) fn new(x: &[f32], m: usize, k: usize) -> Self {
        let groups = k / 32;
        let blocks = groups.div_ceil(GROUPS);
        let mut data = vec![0.0f32; m * blocks * BLOCK_FLOATS];
        for t in 0..m {
            let xt = &x[t * k..(t + 1) * k];
            let sums: Vec<f32> = xt.chunks_exact(32).map(|c| c.iter().sum()).collect();
            for b in 0..blocks {
                let out = &mut data[(t * blocks + b) * BLOCK_FLOATS..][..BLOCK_FLOATS];
                for lane in 0..16 {
                    let group = GROUPS * b + lane / 4;
                    if group >= groups {
                        continue;
                    }
                    let mut sum = 0.0f32;
                    for n in 0..8 {
                        // Nibble n of dword lane % 4: byte 4·(lane % 4) + n/2, low nibble
                        // (value i) for even n, high (value i + 16) for odd.
                        let i = 4 * (lane % 4) + n / 2 + 16 * (n % 2);
                        let v = xt[32 * group + i];
                        out[n * 16 + lane] = v;
                        sum += v;
                    }
                    out[8 * 16 + lane] = -16.0 * sum;
                }
                // Group sums at the m lanes, this block's then the next's.
                for (slot, &sum) in sums.iter().skip(GROUPS * b).take(2 * GROUPS).enumerate() {
                    out[9 * 16 + 2 * slot + 1] = sum;
                }
            }
        }
        Self { data, blocks }
    }
}

/// The nibble of every dword of `nib` that a left rotation by `ROT` brings to bits 19..23, as
/// the float `16 + nibble`: rotated, masked, and or-ed into 16.0's bits in one ternary op
/// (`(a & b) | c`).
#[inline]
#[target_feature(enable = "avx512f")]
fn sixteen_plus<const ROT: i32>(nib: __m512i) -> __m512 {
    let r = _mm512_rol_epi32::<ROT>(nib);
    let v =
        _mm512_ternarylogic_epi32::<0xEA>(r, _mm512_set1_epi32(0x0078_0000), _mm512_set1_epi32(0x4180_0000));
    _mm512_castsi512_ps(v)
}

/// A block's sixteen dwords of nibbles in lane order, from its 20 dwords as `lo` (dwords
/// 0..16) and `hi` (16..20 in its low lanes).
#[inline]
#[target_feature(enable = "avx512f")]
fn nibbles(lo: __m512i, hi: __m512i) -> __m512i {
    let index = _mm512_setr_epi32(1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14, 16, 17, 18, 19);
    _mm512_permutex2var_epi32(lo, index, hi)
}

/// Lane-wise group scales `d` of the block whose converted headers `[d₀, m₀, d₁, m₁, …]` start
/// at lane `FIRST` of `dm`.
#[inline]
#[target_feature(enable = "avx512f")]
fn scales<const FIRST: i32>(dm: __m512) -> __m512 {
    let f = FIRST;
    let index = _mm512_setr_epi32(
        f,
        f,
        f,
        f,
        f + 2,
        f + 2,
        f + 2,
        f + 2,
        f + 4,
        f + 4,
        f + 4,
        f + 4,
        f + 6,
        f + 6,
        f + 6,
        f + 6,
    );
    _mm512_permutexvar_ps(index, dm)
}

/// One block's nibbles times `M` tokens' permuted activations (`xs[t]` at the block's ten
/// vectors), scaled lane-wise by `d` into `acc`.
///
/// # Safety
/// AVX-512F, FMA; each `xs[t]` points at ten readable vectors.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn block<const M: usize>(nib: __m512i, d: __m512, xs: [*const f32; M], acc: &mut [__m512; M]) {
    // SAFETY: each xs[t] holds ten vectors (the caller's contract).
    unsafe {
        let x = |t: usize, v: usize| _mm512_loadu_ps(xs[t].add(16 * v));
        // Two chains per token (even and odd nibbles) halve the FMA latency chain.
        let mut even: [__m512; M] = std::array::from_fn(|t| x(t, 8));
        let mut odd: [__m512; M] = [_mm512_setzero_ps(); M];
        macro_rules! nibble {
            ($n:literal, $rot:literal, $chain:ident) => {{
                let f = sixteen_plus::<$rot>(nib);
                for t in 0..M {
                    $chain[t] = _mm512_fmadd_ps(f, x(t, $n), $chain[t]);
                }
            }};
        }
        // Nibble n sits at bits 4n..4n+4; rotating left by (19 − 4n) mod 32 puts it at 19.
        nibble!(0, 19, even);
        nibble!(1, 15, odd);
        nibble!(2, 11, even);
        nibble!(3, 7, odd);
        nibble!(4, 3, even);
        nibble!(5, 31, odd);
        nibble!(6, 27, even);
        nibble!(7, 23, odd);
        for t in 0..M {
            acc[t] = _mm512_fmadd_ps(_mm512_add_ps(even[t], odd[t]), d, acc[t]);
        }
    }
}

/// The task's rows of its Q4_1 part times its `M` tokens of `x` (as [`Permuted`]).
/// Whole pairs of blocks share one header conversion; an odd whole block and a short last
/// block (masked loads: nothing read past the row) take one each.
///
/// # Safety
/// AVX-512F, AVX2, FMA, F16C; `part` is Q4_1 with `cols` a multiple of 32 and `x` was
/// permuted from activations of that width holding tokens `t0..t0+M`; only this task writes
/// columns `rows` of `out`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn dot_rows<const M: usize>(task: RowTask<'_>, x: &Permuted) {
    let RowTask { part, rows, t0, out, accumulate, .. } = task;
    let groups = part.cols / 32;
    let whole = groups / GROUPS;
    // Each token's blocks lie one after another in x (checked once here, not per block).
    assert!(
        (t0 + M) * x.blocks * BLOCK_FLOATS <= x.data.len(),
        "q4_1_wide: tokens past the permuted activations"
    );
    let first: [*const f32; M] =
        std::array::from_fn(|t| x.data.as_ptr().wrapping_add((t0 + t) * x.blocks * BLOCK_FLOATS));
    // SAFETY (callers): b < x.blocks, so each token's block b lies in x.
    let xs_of = |b: usize| -> [*const f32; M] { first.map(|p| p.wrapping_add(b * BLOCK_FLOATS)) };
    let block_bytes = GROUPS * GROUP_BYTES;
    // Header dwords 0, 5, 10, 15 of `lo` and of `lo2` (a pair's second block).
    let header_index = _mm512_setr_epi32(0, 5, 10, 15, 16, 21, 26, 31, 0, 0, 0, 0, 0, 0, 0, 0);
    for r in rows {
        let row = part.row(r).as_ptr();
        let mut acc = [_mm512_setzero_ps(); M];
        let mut off = [_mm512_setzero_ps(); M];
        // `dm` holds the [d, m] pairs of block `b` (and of b + 1 in lanes 8..16 for a pair):
        // offsets through the group sums in x's vector 9.
        let offsets = |dm: __m512, xs: [*const f32; M], off: &mut [__m512; M]| {
            for t in 0..M {
                // SAFETY: vector 9 of the block lies in x.
                off[t] = _mm512_fmadd_ps(dm, unsafe { _mm512_loadu_ps(xs[t].add(16 * 9)) }, off[t]);
            }
        };
        // A block with its own header conversion: an odd whole block or the short last one.
        let lone = |lo: __m512i, hi: __m512i, b: usize, acc: &mut [__m512; M], off: &mut [__m512; M]| {
            let headers = _mm512_permutexvar_epi32(header_index, lo);
            let dm = _mm512_zextps256_ps512(_mm256_cvtph_ps(_mm512_castsi512_si128(headers)));
            let xs = xs_of(b);
            offsets(dm, xs, off);
            // SAFETY: the block's ten vectors lie in x.
            unsafe { block::<M>(nibbles(lo, hi), scales::<0>(dm), xs, acc) };
        };
        let mut b = 0;
        while b < whole {
            // SAFETY: blocks b (and b + 1 when paired) lie in the row; the prefetches are
            // hints (never fault).
            unsafe {
                let p = row.add(b * block_bytes);
                let pair = b + 1 < whole;
                let span = if pair { 2 * block_bytes } else { block_bytes };
                for o in (0..span).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + o) as *const i8);
                }
                let lo = _mm512_loadu_si512(p as *const __m512i);
                let hi = _mm512_castsi128_si512(_mm_loadu_si128(p.add(64) as *const __m128i));
                if pair {
                    let p2 = p.add(block_bytes);
                    let lo2 = _mm512_loadu_si512(p2 as *const __m512i);
                    let hi2 = _mm512_castsi128_si512(_mm_loadu_si128(p2.add(64) as *const __m128i));
                    let headers = _mm512_permutex2var_epi32(lo, header_index, lo2);
                    let dm = _mm512_cvtph_ps(_mm512_castsi512_si256(headers));
                    let xs = xs_of(b);
                    offsets(dm, xs, &mut off);
                    block::<M>(nibbles(lo, hi), scales::<0>(dm), xs, &mut acc);
                    block::<M>(nibbles(lo2, hi2), scales::<8>(dm), xs_of(b + 1), &mut acc);
                    b += 2;
                } else {
                    lone(lo, hi, b, &mut acc, &mut off);
                    b += 1;
                }
            }
        }
        let rest = groups % GROUPS;
        if rest > 0 {
            // SAFETY: the last `rest` groups (5·rest ≤ 15 dwords) lie in the row; the masked
            // load reads nothing past them, and the lanes of absent groups see zero nibbles,
            // zero headers and zero activations.
            let lo = unsafe {
                _mm512_maskz_loadu_epi32((1u16 << (5 * rest)) - 1, row.add(whole * block_bytes) as *const i32)
            };
            lone(lo, _mm512_setzero_si512(), whole, &mut acc, &mut off);
        }
        for t in 0..M {
            // SAFETY: (t0 + t, r) is this task's entry.
            unsafe { out.put(t0 + t, r, _mm512_reduce_add_ps(_mm512_add_ps(acc[t], off[t])), accumulate) };
        }
    }
}

/// [`dot_rows`] for the task's `mr` (1..=4) tokens.
///
/// # Safety
/// As [`dot_rows`].
pub(super) unsafe fn dot_rows_dyn(task: RowTask<'_>, x: &Permuted) {
    // SAFETY: forwarded contract.
    unsafe { with_tokens!(task.mr, |M| dot_rows::<M>(task, x)) }
}
