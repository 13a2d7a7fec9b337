//! `Lanes`: one `f32` vector type per instruction set (8 plain floats, AVX2 `__m256`, AVX-512
//! `__m512`), so a micro-kernel is written once, generic over it, and compiled per ISA; and the
//! vector `exp` of both x86 widths (`exp8` also serves decode's softmax).
//!
//! Every method is `#[inline(always)]` and `unsafe`: it is only sound inside a function compiled
//! with the ISA's target features (the kernel entry points), where it inlines to one or a few
//! instructions. Pointers must be valid for `L` floats (or elements) — the callers' contract.

use super::KernelElem;

/// An `f32` vector of `L` lanes and the operations the tiled attention needs.
pub(crate) trait Lanes: Copy {
    /// Lanes per vector.
    const L: usize;

    /// # Safety (every method)
    /// The CPU supports the type's ISA and the caller runs with it enabled; pointers are valid
    /// for `L` lanes.
    unsafe fn splat(v: f32) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// `L` consecutive cache elements widened to `f32`.
    unsafe fn widen<T: KernelElem>(p: *const T) -> Self;
    /// `a · b + c`, fused.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    unsafe fn mul(self, o: Self) -> Self;
    unsafe fn add(self, o: Self) -> Self;
    unsafe fn sub(self, o: Self) -> Self;
    unsafe fn max(self, o: Self) -> Self;
    /// `e^x` lane-wise, exactly 0 below -87.3 (so `-inf`, a masked score, gives 0): never NaN,
    /// and never the ~1e-38 a clamped input would give, whose products with values are
    /// subnormal — each one a microcode assist of ~100 cycles on x86 (measured: a 4 096-token
    /// causal prefill ran at half speed with them).
    unsafe fn exp(self) -> Self;
    /// `self` where `key <= row`, `-inf` where `key > row` (a causal mask; NaN in `self` on a
    /// masked lane is replaced too).
    unsafe fn mask_later(self, key: Self, row: Self) -> Self;
    /// Bitwise `self & mask`: lanes whose mask is all ones kept, those whose mask is 0 made
    /// +0 (NaN included).
    unsafe fn and_bits(self, mask: Self) -> Self;
}

/// The portable vector: 8 floats in plain loops (what the compiler vectorizes by itself).
#[derive(Clone, Copy)]
pub(crate) struct Plain([f32; 8]);

impl Plain {
    #[inline(always)]
    fn map2(self, o: Self, f: impl Fn(f32, f32) -> f32) -> Self {
        Plain(std::array::from_fn(|i| f(self.0[i], o.0[i])))
    }
}

impl Lanes for Plain {
    const L: usize = 8;

    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        Plain([v; 8])
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: 8 readable floats (contract).
        Plain(unsafe { p.cast::<[f32; 8]>().read_unaligned() })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: 8 writable floats (contract).
        unsafe { p.cast::<[f32; 8]>().write_unaligned(self.0) }
    }
    #[inline(always)]
    unsafe fn widen<T: KernelElem>(p: *const T) -> Self {
        // SAFETY: 8 readable elements (contract).
        Plain(std::array::from_fn(|i| unsafe { p.add(i).read() }.to_f32()))
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        Plain(std::array::from_fn(|i| a.0[i].mul_add(b.0[i], c.0[i])))
    }
    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        self.map2(o, |a, b| a * b)
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        self.map2(o, |a, b| a + b)
    }
    #[inline(always)]
    unsafe fn sub(self, o: Self) -> Self {
        self.map2(o, |a, b| a - b)
    }
    #[inline(always)]
    unsafe fn max(self, o: Self) -> Self {
        self.map2(o, f32::max)
    }
    #[inline(always)]
    unsafe fn exp(self) -> Self {
        Plain(self.0.map(|v| if v < -87.336_55 { 0.0 } else { v.exp() }))
    }
    #[inline(always)]
    unsafe fn mask_later(self, key: Self, row: Self) -> Self {
        Plain(std::array::from_fn(|i| if key.0[i] > row.0[i] { f32::NEG_INFINITY } else { self.0[i] }))
    }
    #[inline(always)]
    unsafe fn and_bits(self, mask: Self) -> Self {
        Plain(std::array::from_fn(|i| f32::from_bits(self.0[i].to_bits() & mask.0[i].to_bits())))
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{Avx2, Avx512, exp8};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Lanes;
    use crate::simd::KernelElem;

    /// AVX2 + FMA (+ F16C for widening f16): 8 lanes.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx2(__m256);

    /// AVX-512F: 16 lanes.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx512(__m512);

    /// The [`Lanes`] methods that are one intrinsic each, for the wrapper `$W` (same text for
    /// both widths, with that width's intrinsics and `KernelElem` widening `$widen`).
    macro_rules! one_intrinsic_methods {
        ($W:ident, $widen:ident: $set1:ident, $loadu:ident, $storeu:ident, $fmadd:ident, $mul:ident,
         $add:ident, $sub:ident, $max:ident) => {
            #[inline(always)]
            unsafe fn splat(v: f32) -> Self {
                unsafe { $W($set1(v)) }
            }
            #[inline(always)]
            unsafe fn load(p: *const f32) -> Self {
                unsafe { $W($loadu(p)) }
            }
            #[inline(always)]
            unsafe fn store(self, p: *mut f32) {
                unsafe { $storeu(p, self.0) }
            }
            #[inline(always)]
            unsafe fn widen<T: KernelElem>(p: *const T) -> Self {
                unsafe { $W(T::$widen(p)) }
            }
            #[inline(always)]
            unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
                unsafe { $W($fmadd(a.0, b.0, c.0)) }
            }
            #[inline(always)]
            unsafe fn mul(self, o: Self) -> Self {
                unsafe { $W($mul(self.0, o.0)) }
            }
            #[inline(always)]
            unsafe fn add(self, o: Self) -> Self {
                unsafe { $W($add(self.0, o.0)) }
            }
            #[inline(always)]
            unsafe fn sub(self, o: Self) -> Self {
                unsafe { $W($sub(self.0, o.0)) }
            }
            #[inline(always)]
            unsafe fn max(self, o: Self) -> Self {
                unsafe { $W($max(self.0, o.0)) }
            }
        };
    }

    // SAFETY (all methods below): register arithmetic or loads/stores of `L` lanes the caller
    // vouches for, with the ISA enabled by the calling function.
    impl Lanes for Avx2 {
        const L: usize = 8;

        one_intrinsic_methods! {
            Avx2, load8: _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_fmadd_ps, _mm256_mul_ps,
            _mm256_add_ps, _mm256_sub_ps, _mm256_max_ps
        }

        #[inline(always)]
        unsafe fn exp(self) -> Self {
            unsafe { Avx2(exp8(self.0)) }
        }
        #[inline(always)]
        unsafe fn mask_later(self, key: Self, row: Self) -> Self {
            unsafe {
                let later = _mm256_cmp_ps::<_CMP_GT_OQ>(key.0, row.0);
                Avx2(_mm256_blendv_ps(self.0, _mm256_set1_ps(f32::NEG_INFINITY), later))
            }
        }
        #[inline(always)]
        unsafe fn and_bits(self, mask: Self) -> Self {
            unsafe { Avx2(_mm256_and_ps(self.0, mask.0)) }
        }
    }

    impl Lanes for Avx512 {
        const L: usize = 16;

        one_intrinsic_methods! {
            Avx512, load16: _mm512_set1_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_fmadd_ps, _mm512_mul_ps,
            _mm512_add_ps, _mm512_sub_ps, _mm512_max_ps
        }

        #[inline(always)]
        unsafe fn exp(self) -> Self {
            unsafe { Avx512(exp16(self.0)) }
        }
        #[inline(always)]
        unsafe fn mask_later(self, key: Self, row: Self) -> Self {
            unsafe {
                let later = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(key.0, row.0);
                Avx512(_mm512_mask_blend_ps(later, self.0, _mm512_set1_ps(f32::NEG_INFINITY)))
            }
        }
        #[inline(always)]
        unsafe fn and_bits(self, mask: Self) -> Self {
            unsafe {
                Avx512(_mm512_castsi512_ps(_mm512_and_si512(
                    _mm512_castps_si512(self.0),
                    _mm512_castps_si512(mask.0),
                )))
            }
        }
    }

    /// Coefficients of `exp`'s polynomial on the reduced range (Cephes `expf`), highest degree
    /// first, down to the ½ of `r²/2`.
    const EXP_POLY: [f32; 6] =
        [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

    /// `e^r` for `r = x − n·ln2`, `fx` holding `n` (`|r| <= ln2/2`): ln2 split in two for
    /// precision, then the degree-5 polynomial `1 + r + r²·P(r)`. What [`exp8`] and `exp16`
    /// share but the vector width.
    #[inline(always)]
    unsafe fn exp_reduced<V: Lanes>(x: V, fx: V) -> V {
        // SAFETY: register arithmetic; the callers run with the vector's ISA enabled.
        unsafe {
            let r = V::fma(fx, V::splat(-0.693_359_4), x);
            let r = V::fma(fx, V::splat(2.121_944_4e-4), r);
            let mut y = V::splat(EXP_POLY[0]);
            for c in &EXP_POLY[1..] {
                y = V::fma(y, r, V::splat(*c));
            }
            V::fma(y, r.mul(r), r.add(V::splat(1.0)))
        }
    }

    /// `exp` of 8 lanes: Cephes-style range reduction to `2^n · e^r`, `|r| <= ln2/2`, degree-5
    /// polynomial; relative error ~1e-7 over the clamped range [-87.3, 88.0], and exactly 0 below
    /// it: the clamped ~1e-38 times a value is subnormal, a ~100-cycle microcode assist per FMA.
    #[inline(always)]
    pub(crate) unsafe fn exp8(x: __m256) -> __m256 {
        // SAFETY: pure register arithmetic; AVX2/FMA enabled by the calling function.
        unsafe {
            let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.336_55));
            let x = _mm256_min_ps(x, _mm256_set1_ps(88.0));
            let x = _mm256_max_ps(x, _mm256_set1_ps(-87.336_55));
            let fx = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
                x,
                _mm256_set1_ps(std::f32::consts::LOG2_E),
            ));
            let y = exp_reduced(Avx2(x), Avx2(fx)).0;
            let n = _mm256_cvtps_epi32(fx);
            let pow2 =
                _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n, _mm256_set1_epi32(127))));
            _mm256_andnot_ps(tiny, _mm256_mul_ps(y, pow2))
        }
    }

    /// `exp` of 16 lanes: the same range reduction and polynomial as [`exp8`], and the same
    /// exact 0 below -87.3.
    #[inline(always)]
    unsafe fn exp16(x: __m512) -> __m512 {
        // SAFETY: pure register arithmetic; AVX-512F enabled by the calling function.
        unsafe {
            let tiny = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-87.336_55));
            let x = _mm512_min_ps(x, _mm512_set1_ps(88.0));
            let x = _mm512_max_ps(x, _mm512_set1_ps(-87.336_55));
            let fx = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
            );
            let y = exp_reduced(Avx512(x), Avx512(fx)).0;
            let n = _mm512_cvtps_epi32(fx);
            let pow2 =
                _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(n, _mm512_set1_epi32(127))));
            _mm512_mask_mov_ps(_mm512_mul_ps(y, pow2), tiny, _mm512_setzero_ps())
        }
    }
}
