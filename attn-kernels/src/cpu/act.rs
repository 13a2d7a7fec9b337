//! Gated activations over the rows of a batch: SwiGLU (`silu(gate) · up`) and GeGLU with
//! tanh-approximated GELU (`gelu_tanh(gate) · up`), through a branch-free `exp` that vectorizes
//! ([`exp_fast`]); and a softmax's exponentials for the sampler ([`exp_sub_sum`]).

use rayon::prelude::*;

use super::TOKENS_PER_TASK;
#[cfg(target_arch = "x86_64")]
use crate::Isa;

/// The gate's activation of a gated MLP: `out = act(gate) · up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (Llama, Qwen, Mistral, Phi-3).
    Silu,
    /// GeGLU with the tanh approximation of GELU (Gemma).
    GeluTanh,
}

/// `out[t, i] = act(gate_up[t, i]) * gate_up[t, inter + i]`.
pub fn gated_act(out: &mut [f32], gate_up: &[f32], inter: usize, act: Activation) {
    #[cfg(target_arch = "x86_64")]
    let avx512 = Isa::detected() == Isa::Avx512;
    out.par_chunks_mut(inter * TOKENS_PER_TASK)
        .zip(gate_up.par_chunks(2 * inter * TOKENS_PER_TASK))
        .for_each(|(o, gu)| {
            for (orow, gurow) in o.chunks_exact_mut(inter).zip(gu.chunks_exact(2 * inter)) {
                let (g, u) = gurow.split_at(inter);
                #[cfg(target_arch = "x86_64")]
                if avx512 {
                    // SAFETY: the AVX-512 tier (AVX-512F) was detected at run time.
                    unsafe { gated_row_avx512(orow, g, u, act) };
                    continue;
                }
                gated_row(orow, g, u, act);
            }
        });
}

/// `sqrt(2 / π)`, GELU's tanh argument scale.
const GELU_SCALE: f32 = 0.797_884_6;

/// One row of [`gated_act`]; inlined into each ISA's copy so the loop vectorizes for it (the
/// point of [`exp_fast`]: `f32::exp` is a scalar libm call per element).
#[inline(always)]
fn gated_row(out: &mut [f32], g: &[f32], u: &[f32], act: Activation) {
    match act {
        Activation::Silu => {
            for ((ov, &gv), &uv) in out.iter_mut().zip(g).zip(u) {
                *ov = gv / (1.0 + exp_fast(-gv)) * uv;
            }
        }
        Activation::GeluTanh => {
            // 0.5·x·(1 + tanh(z)) = x / (1 + e^(-2z)).
            for ((ov, &gv), &uv) in out.iter_mut().zip(g).zip(u) {
                let z = GELU_SCALE * (gv + 0.044_715 * gv * gv * gv);
                *ov = gv / (1.0 + exp_fast(-2.0 * z)) * uv;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gated_row_avx512(out: &mut [f32], g: &[f32], u: &[f32], act: Activation) {
    gated_row(out, g, u, act);
}

/// `v[i] = e^(v[i] − max)` in place, returning their sum: a softmax's numerators and normalizer,
/// vectorized where the CPU allows (the attention kernels' `exp`). A value more than 87.3 below
/// `max`, −∞ included, becomes exactly 0. `max` is the largest value; NaN in `v` are the
/// caller's to remove first (they come out as large finite values on the SIMD paths).
pub fn exp_sub_sum(v: &mut [f32], max: f32) -> f32 {
    crate::simd::exp_sub_sum(crate::Isa::detected(), v, max)
}

/// `e^x` to ~2 ulp in branch-free f32 arithmetic (Cephes' `expf`: `x = n·ln2 + r`, a degree-6
/// polynomial for `e^r` on |r| ≤ ln2/2, `2^n` built in the exponent bits), so that loops over
/// it vectorize. Arguments are clamped to [-87, 88] (`e^88` is finite in f32, `e^-87` still a
/// normal; beyond them SiLU is `0` or `x` to f32 precision anyway).
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so `n·LN2_HI` is exact for |n| ≤ 128.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer without a libm call.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    // The integer n sits in the low mantissa bits of `shifted`: integer arithmetic on the bits
    // (a float-to-int `as` cast would be scalarized for its saturation rules).
    let n_int = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let er = p * r * r + r + 1.0;
    er * f32::from_bits(n_int.wrapping_add(127) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_fast_matches_std() {
        let mut x = -90.0f32;
        while x <= 90.0 {
            let (got, want) = (exp_fast(x), f64::from(x.clamp(-87.0, 88.0)).exp());
            assert!(((f64::from(got) - want) / want).abs() < 3e-7, "exp({x}) = {got} vs {want}");
            x += 0.0137;
        }
        assert_eq!(exp_fast(0.0), 1.0);
    }

    #[test]
    fn gated_activations_match_their_formulas_at_every_width() {
        let gelu = |g: f64| 0.5 * g * (1.0 + (0.797_884_560_802_865_4 * (g + 0.044_715 * g * g * g)).tanh());
        let silu = |g: f64| g / (1.0 + (-g).exp());
        for (act, f) in [(Activation::Silu, &silu as &dyn Fn(f64) -> f64), (Activation::GeluTanh, &gelu)] {
            for inter in [1, 15, 16, 17, 100] {
                let tokens = 3;
                let gate_up: Vec<f32> =
                    (0..tokens * 2 * inter).map(|i| ((i * 37 % 101) as f32 - 50.0) / 4.0).collect();
                let mut out = vec![0.0; tokens * inter];
                gated_act(&mut out, &gate_up, inter, act);
                for t in 0..tokens {
                    for i in 0..inter {
                        let (g, u) = (
                            f64::from(gate_up[t * 2 * inter + i]),
                            f64::from(gate_up[t * 2 * inter + inter + i]),
                        );
                        let want = f(g) * u;
                        let got = f64::from(out[t * inter + i]);
                        assert!(
                            (got - want).abs() <= 2e-6 * (1.0 + want.abs()),
                            "{act:?} inter {inter}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
