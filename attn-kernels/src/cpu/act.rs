//! Gated activations over the rows of a batch: SwiGLU (`silu(gate) · up`), through a
//! branch-free `exp` that vectorizes ([`exp_fast`]).

use rayon::prelude::*;

use super::TOKENS_PER_TASK;
#[cfg(target_arch = "x86_64")]
use crate::Isa;

/// SwiGLU: `out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i]`.
pub fn silu_mul(out: &mut [f32], gate_up: &[f32], inter: usize) {
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
                    unsafe { silu_mul_row_avx512(orow, g, u) };
                    continue;
                }
                silu_mul_row(orow, g, u);
            }
        });
}

/// One row of [`silu_mul`]; inlined into each ISA's copy so the loop vectorizes for it (the
/// point of [`exp_fast`]: `f32::exp` is a scalar libm call per element).
#[inline(always)]
fn silu_mul_row(out: &mut [f32], g: &[f32], u: &[f32]) {
    for ((ov, &gv), &uv) in out.iter_mut().zip(g).zip(u) {
        *ov = gv / (1.0 + exp_fast(-gv)) * uv;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn silu_mul_row_avx512(out: &mut [f32], g: &[f32], u: &[f32]) {
    silu_mul_row(out, g, u);
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
    fn silu_mul_matches_the_formula_at_every_width() {
        for inter in [1, 15, 16, 17, 100] {
            let tokens = 3;
            let gate_up: Vec<f32> =
                (0..tokens * 2 * inter).map(|i| ((i * 37 % 101) as f32 - 50.0) / 4.0).collect();
            let mut out = vec![0.0; tokens * inter];
            silu_mul(&mut out, &gate_up, inter);
            for t in 0..tokens {
                for i in 0..inter {
                    let (g, u) = (
                        f64::from(gate_up[t * 2 * inter + i]),
                        f64::from(gate_up[t * 2 * inter + inter + i]),
                    );
                    let want = g / (1.0 + (-g).exp()) * u;
                    let got = f64::from(out[t * inter + i]);
                    assert!(
                        (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                        "inter {inter}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
