//! A value tile widened to f32 with its slots past the context zeroed: decode's last, partly
//! filled block, whose `p = 0` slots would still turn a NaN (stale or poisoned) into NaN.

use super::KernelElem;
#[cfg(target_arch = "x86_64")]
use super::lanes::{Avx2, Avx512};
use super::lanes::{Lanes, Plain};
use crate::Isa;

/// `dst[dim·bs + t]` = `v[dim·bs + t]` as f32 for `t < valid`, +0 for `valid ≤ t < bs`, over
/// the `d` dims of a value tile `[d, bs]`. Vectorized: as a scalar loop (one conversion and
/// branch per slot) it took ~6 % of a batch-64 decode step at short contexts.
///
/// # Panics
/// If `bs` is not 8, 16 or 32, `valid > bs`, or a buffer holds fewer than `d·bs` values.
pub(crate) fn widen_masked<T: KernelElem>(
    isa: Isa,
    v: &[T],
    d: usize,
    bs: usize,
    valid: usize,
    dst: &mut [f32],
) {
    assert!(matches!(bs, 8 | 16 | 32) && valid <= bs, "widen_masked: bs {bs}, valid {valid}");
    assert!(v.len() >= d * bs && dst.len() >= d * bs, "widen_masked: short buffer");
    // Whole 16-lane vectors (every head size the kernels take); anything else goes portable.
    let isa = if isa.is_available() && (d * bs).is_multiple_of(16) { isa } else { Isa::Portable };
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512 (with AVX2/FMA/F16C) is available; lengths checked above.
        Isa::Avx512 => unsafe { widen_avx512(v, d, bs, valid, dst) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2/FMA/F16C are available; lengths checked above.
        Isa::Avx2 => unsafe { widen_avx2(v, d, bs, valid, dst) },
        // SAFETY: plain Rust; lengths checked above (d·bs is a multiple of bs, hence of 8).
        _ => unsafe { widen_with::<Plain, T>(v, d, bs, valid, dst) },
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn widen_avx512<T: KernelElem>(v: &[T], d: usize, bs: usize, valid: usize, dst: &mut [f32]) {
    // SAFETY: forwarded contract.
    unsafe { widen_with::<Avx512, T>(v, d, bs, valid, dst) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_avx2<T: KernelElem>(v: &[T], d: usize, bs: usize, valid: usize, dst: &mut [f32]) {
    // SAFETY: forwarded contract.
    unsafe { widen_with::<Avx2, T>(v, d, bs, valid, dst) }
}

/// # Safety
/// `V`'s ISA is enabled; `v` and `dst` hold `d·bs` values, a multiple of `V::L`.
#[inline(always)]
unsafe fn widen_with<V: Lanes, T: KernelElem>(v: &[T], d: usize, bs: usize, valid: usize, dst: &mut [f32]) {
    // Lane i of the vector at element e is token (e + i) % bs. bs and L are powers of two, so
    // the mask repeats every max(bs, L) ≤ 32 elements.
    let period = bs.max(V::L);
    let mut keep = [0.0f32; 32];
    for (i, m) in keep[..period].iter_mut().enumerate() {
        *m = f32::from_bits(if i % bs < valid { u32::MAX } else { 0 });
    }
    for e in (0..d * bs).step_by(V::L) {
        // SAFETY: e + L ≤ d·bs (a multiple of L); e % period + L ≤ period ≤ 32.
        unsafe {
            let mask = V::load(keep.as_ptr().add(e % period));
            V::widen(v.as_ptr().add(e)).and_bits(mask).store(dst.as_mut_ptr().add(e));
        }
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::*;

    /// Every ISA this machine runs, every block size and every `valid`, on each element type:
    /// the kept slots exactly the scalar conversion (NaN stays NaN), the rest +0 even where
    /// the tile holds NaN or infinity.
    fn check<T: KernelElem>(from: impl Fn(f32) -> T) {
        for isa in Isa::available() {
            for bs in [8, 16, 32] {
                for d in [2, 16, 64] {
                    let v: Vec<T> = (0..d * bs)
                        .map(|i| match i % 7 {
                            0 => from(f32::NAN),
                            1 => from(f32::INFINITY),
                            _ => from(i as f32 * 0.25 - 3.0),
                        })
                        .collect();
                    for valid in 0..=bs {
                        let mut dst = vec![7.0; d * bs + 3];
                        widen_masked(isa, &v, d, bs, valid, &mut dst);
                        for (i, (&got, src)) in dst.iter().zip(&v).enumerate() {
                            let want = if i % bs < valid { src.to_f32() } else { 0.0 };
                            assert!(
                                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                                "{isa:?} {} bs {bs} d {d} valid {valid} slot {i}: {got} vs {want}",
                                std::any::type_name::<T>()
                            );
                        }
                        assert!(dst[d * bs..].iter().all(|&x| x == 7.0), "wrote past d·bs");
                    }
                }
            }
        }
    }

    #[test]
    fn widened_slots_past_valid_are_zero_on_every_isa() {
        check::<f32>(|x| x);
        check::<f16>(f16::from_f32);
        check::<bf16>(bf16::from_f32);
        check::<i8>(<i8 as kv_cache::CacheElem>::from_f32);
    }
}
