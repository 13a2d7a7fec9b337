//! The inner loops of attention over one (block, kv head) tile, per instruction set.
//!
//! Two micro-kernels carry all the work: `qk_tile` (scores of one query row against the
//! `block_size` keys of a tile, in the key layout `[head_size/x, block_size, x]`) and `pv_tile`
//! (`acc += p · V` over a value tile `[head_size, block_size]`), plus a vectorized `exp`. The
//! AVX2/FMA/F16C versions are chosen at run time; the portable ones are plain loops.

mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

use half::{bf16, f16};
use kv_cache::CacheElem;

/// Instruction set the CPU kernels run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Plain Rust loops (whatever the compiler vectorizes for the baseline target).
    Portable,
    /// AVX2 + FMA + F16C intrinsics (x86-64 only, checked at run time).
    Avx2,
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub fn detect() -> Isa {
        if Isa::Avx2.is_available() { Isa::Avx2 } else { Isa::Portable }
    }

    /// Whether this CPU can run `self`.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Portable => true,
            Isa::Avx2 => avx2_available(),
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_available() -> bool {
    false
}

/// Cache element types the micro-kernels can load as 8 `f32` lanes.
pub(crate) trait KernelElem: CacheElem {
    /// Loads 8 consecutive elements widened to `f32`.
    ///
    /// # Safety
    /// `p .. p + 8` must be readable and the CPU must support AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl KernelElem for f32 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller guarantees 8 readable elements and AVX support.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
}

impl KernelElem for f16 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: 8 readable f16 = 16 bytes; F16C is guaranteed by the caller.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
}

impl KernelElem for bf16 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: 8 readable bf16 = 16 bytes; AVX2 is guaranteed by the caller.
        // bf16 is the top half of an f32: widen to 32 bits and shift into place.
        unsafe {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()))))
        }
    }
}

/// Length of the prepared query row for `qk_tile`: `head_size / x` chunks of 8 lanes.
pub(crate) fn qrep_len(head_size: usize, x: usize) -> usize {
    head_size / x * 8
}

/// Prepares one query row for `qk_tile`: scaled, each `x`-chunk repeated to fill 8 lanes
/// (for `x = 4` one 8-lane key load holds two tokens' chunks; for `x = 8`, one token's).
pub(crate) fn prepare_query(q: &[f32], scale: f32, x: usize, qrep: &mut [f32]) {
    for (c, chunk) in q.chunks_exact(x).enumerate() {
        for (lane, dst) in qrep[c * 8..c * 8 + 8].iter_mut().enumerate() {
            *dst = chunk[lane % x] * scale;
        }
    }
}

/// `scores[t] = q · key_t` for the `block_size` tokens of one key tile `[head_size/x, block_size, x]`.
#[inline]
pub(crate) fn qk_tile<T: KernelElem>(
    isa: Isa,
    tile: &[T],
    qrep: &[f32],
    head_size: usize,
    bs: usize,
    scores: &mut [f32],
) {
    let x = T::DTYPE.x();
    assert!(tile.len() >= head_size * bs && qrep.len() >= qrep_len(head_size, x) && scores.len() >= bs);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only used after `is_available` said yes; lengths checked above.
        Isa::Avx2 => unsafe { x86::qk_tile(tile, qrep, head_size, bs, scores) },
        _ => portable::qk_tile(tile, qrep, head_size, bs, scores),
    }
}

/// `acc[d] += Σ_t p[t] · value[d][t]` over one value tile `[head_size, block_size]`.
#[inline]
pub(crate) fn pv_tile<T: KernelElem>(
    isa: Isa,
    tile: &[T],
    p: &[f32],
    head_size: usize,
    bs: usize,
    acc: &mut [f32],
) {
    assert!(tile.len() >= head_size * bs && p.len() >= bs && acc.len() >= head_size);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only used after `is_available` said yes; lengths checked above.
        Isa::Avx2 => unsafe { x86::pv_tile(tile, p, head_size, bs, acc) },
        _ => portable::pv_tile(tile, p, head_size, bs, acc),
    }
}

/// `v[i] = exp(v[i] - max)` in place; returns the sum.
#[inline]
pub(crate) fn exp_sub_sum(isa: Isa, v: &mut [f32], max: f32) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only used after `is_available` said yes.
        Isa::Avx2 => unsafe { x86::exp_sub_sum(v, max) },
        _ => portable::exp_sub_sum(v, max),
    }
}

/// Largest element (`-inf` for an empty slice); NaN-free input assumed.
#[inline]
pub(crate) fn max_of(v: &[f32]) -> f32 {
    // Eight running maxima so the compiler can keep them in one vector register.
    let mut m = [f32::NEG_INFINITY; 8];
    let chunks = v.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &b) in m.iter_mut().zip(c) {
            *a = a.max(b);
        }
    }
    tail.iter().chain(m.iter()).copied().fold(f32::NEG_INFINITY, f32::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn naive_qk(tile: &[f32], q: &[f32], d: usize, bs: usize, x: usize) -> Vec<f32> {
        (0..bs).map(|t| (0..d).map(|i| tile[(i / x) * bs * x + t * x + i % x] * q[i]).sum()).collect()
    }

    fn check_isa<T: KernelElem>(isa: Isa) {
        let x = T::DTYPE.x();
        let mut seed = 7;
        for d in [64, 80, 96, 112, 128, 256] {
            for bs in [8, 16, 32] {
                let tile: Vec<T> = (0..d * bs).map(|_| T::from_f32(lcg(&mut seed))).collect();
                let wide: Vec<f32> = tile.iter().map(|v| v.to_f32()).collect();
                let q: Vec<f32> = (0..d).map(|_| lcg(&mut seed)).collect();
                let mut qrep = vec![0.0; qrep_len(d, x)];
                prepare_query(&q, 1.0, x, &mut qrep);
                let mut scores = vec![0.0; bs];
                qk_tile(isa, &tile, &qrep, d, bs, &mut scores);
                for (a, b) in scores.iter().zip(naive_qk(&wide, &q, d, bs, x)) {
                    assert!((a - b).abs() < 1e-4, "{isa:?} {} d{d} bs{bs}: {a} vs {b}", T::DTYPE);
                }
                let p: Vec<f32> = (0..bs).map(|_| lcg(&mut seed).abs()).collect();
                let mut acc: Vec<f32> = (0..d).map(|i| i as f32).collect();
                pv_tile(isa, &tile, &p, d, bs, &mut acc);
                for (i, a) in acc.iter().enumerate() {
                    let want = i as f32 + (0..bs).map(|t| p[t] * wide[i * bs + t]).sum::<f32>();
                    assert!((a - want).abs() < 1e-4, "{isa:?} pv d{d} bs{bs}: {a} vs {want}");
                }
            }
        }
    }

    #[test]
    fn micro_kernels_match_naive_loops_on_every_isa_and_dtype() {
        for isa in [Isa::Portable, Isa::Avx2].into_iter().filter(|i| i.is_available()) {
            check_isa::<f32>(isa);
            check_isa::<f16>(isa);
            check_isa::<bf16>(isa);
        }
    }

    #[test]
    fn exp_matches_std_and_sums() {
        for isa in [Isa::Portable, Isa::Avx2].into_iter().filter(|i| i.is_available()) {
            let src: Vec<f32> = (0..203).map(|i| (i as f32 - 150.0) * 0.7).collect();
            let mut v = src.clone();
            let max = max_of(&v);
            let sum = exp_sub_sum(isa, &mut v, max);
            let mut want_sum = 0.0;
            for (a, s) in v.iter().zip(&src) {
                let want = (s - max).exp();
                want_sum += want;
                assert!(
                    (a - want).abs() <= 2e-7 * want.max(1e-30) + 1e-37,
                    "{isa:?}: exp({}) = {a} vs {want}",
                    s - max
                );
            }
            assert!((sum - want_sum).abs() < 1e-5 * want_sum);
        }
    }

    #[test]
    fn max_of_handles_tails_and_empty() {
        assert_eq!(max_of(&[]), f32::NEG_INFINITY);
        assert_eq!(max_of(&[1.0, 5.0, -2.0]), 5.0);
        let v: Vec<f32> = (0..37).map(|i| (i * 7 % 37) as f32).collect();
        assert_eq!(max_of(&v), 36.0);
    }
}
