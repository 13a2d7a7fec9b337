//! The per-logit tolerance of the GPU model check (`gpu_model_check`): how far a logit of the
//! CUDA forward may be from the f32 CPU forward's, derived from how the CUDA forward rounds and
//! from the magnitude each logit is made of, not from the row's range.
//!
//! # What the CUDA forward rounds
//! It computes in f32 everywhere (cuBLAS `COMPUTE_32F`, f32 kernels, an f32 residual stream) and
//! *stores* values in its half type, bf16 or f16 (unit roundoff `u` = 2⁻⁸ or 2⁻¹¹: 8 or 11
//! significant bits, round to nearest errs by at most `u` relative, variance at most `u²/3`), at
//! these sites:
//! - in every decoder layer ([`HALF_ROUNDINGS_PER_LAYER`] = 13 for Llama): the input and
//!   post-attention norm weights and the two normed rows (GEMM inputs); the Q/K/V, O, gate/up and
//!   down weights; the keys and the values written to the cache; the attention output (the O
//!   GEMM's input); the gate/up output and the gated activation (the down GEMM's input); and,
//!   where the architecture has them ([`half_roundings_per_layer`]), each bias row, the Q and K
//!   norm weights, and the sandwich norms' weights and normed rows;
//! - outside them ([`HALF_ROUNDINGS_OUTSIDE`] = 4): the embedding table, the final norm weight,
//!   the final normed rows and the LM head.
//!
//! f32 accumulation (about 2⁻²⁴·√n relative over n terms) and the kernels' `__expf` / `rsqrtf`
//! (a few 2⁻²⁴) are far below even f16's `u` and are left out.
//!
//! # The bound
//! Logit `v` is `ℓ_v = W_v · (g ⊙ x̂)`: LM head row `W_v`, final norm weight `g`, `x̂` the final
//! residual row scaled to unit rms. Over unit-rms states, `ℓ_v` has rms `s_v = ‖W_v ⊙ g‖₂`:
//! a perturbation of the final state of relative size ε moves `ℓ_v` by about `ε · s_v`. A site
//! perturbs its tensor by independent relative errors of variance at most `u²/3`; to first
//! order, and if its tensor carries at most the whole final state, that moves `ℓ_v` by a
//! zero-mean error of standard deviation at most `(u/√3) · s_v`. The `N = 13·L + 4` sites of an
//! `L`-layer model round independently, so their variances add:
//!
//! `σ_v = u · √(N/3) · s_v`, and a logit may be off by `τ_v = Z · σ_v` with `Z` =
//! [`TOLERANCE_SIGMAS`] = 5: the largest of the ~10⁵ errors of a check lies near 4.4 standard
//! deviations, and `σ_v` bounds the standard deviation from above.
//!
//! # Calibration
//! `gpu-check`'s host tests run a CPU emulation of exactly these roundings on the model check's
//! two random Llamas (3 layers of 256; 2 layers of 512 with GQA 4 and a tied head), 64 rows of a
//! 600-token sequence, 6·10⁴ and 10⁵ logits: the rounding error has an rms of about 0.37 `σ_v`
//! (a sub-layer's update carries less than the whole state) and stays below 0.36 `τ_v`
//! everywhere, in bf16 and f16 alike (the errors scale with `u` as the bound does). The tests
//! require below 0.5 `τ_v`.
//!
//! # Why it still catches bugs
//! The same emulation with a bug in it lands far outside: RoPE rotating interleaved pairs (GGUF
//! order on HF weights) at ≈ 8–10 `τ_v` in bf16, positions restarting at each 256-token chunk at
//! ≈ 7–10 `τ_v`, v2's partition merge without the max-logit rescale (decode rows past 512
//! tokens) at ≈ 4.5 `τ_v`, each failing 63 or 64 of the 64 rows; in f16, whose tolerance is 8x
//! tighter, 8x as many tolerances. The tests require 3 `τ_v` and half the rows failing in bf16.
//! The range-relative tolerance this replaced (5 % of the row's largest |logit|) missed all
//! three on the tied model, whose logits reach ±430: they moved its logits by 1.5–2.8 % of that
//! range.
//!
//! # Greedy agreement
//! Where the CUDA argmax `c` differs from the CPU argmax `a`, the row is a near tie when the
//! CPU's `ℓ_a − ℓ_c ≤ τ_a + τ_c`: every logit within its tolerance could swap such a pair, and
//! only such a pair (a CUDA `c` above its `a` with both inside their bounds means exactly that).
//! So a disagreement outside a near tie always comes with a logit out of tolerance; it is
//! reported on its own because it is what a user would see.

use kv_cache::DType;

use super::driver::argmax;
use super::error::CudaModelError;
use crate::arch::Architecture;
use crate::decoder::Model;

/// Values the CUDA forward stores in its half type in every decoder layer of a Llama.
pub const HALF_ROUNDINGS_PER_LAYER: usize = 13;

/// Values the CUDA forward stores in its half type in every decoder layer of `arch`.
pub fn half_roundings_per_layer(arch: &Architecture) -> usize {
    HALF_ROUNDINGS_PER_LAYER
        + usize::from(arch.qkv_bias)
        + usize::from(arch.o_bias)
        + 2 * usize::from(arch.qk_norm)
        + 4 * usize::from(arch.sandwich_norms)
}
/// Values it stores in its half type outside the decoder layers.
pub const HALF_ROUNDINGS_OUTSIDE: usize = 4;
/// How many predicted standard deviations `σ_v` a logit may be off.
pub const TOLERANCE_SIGMAS: f32 = 5.0;

/// Unit roundoff of the half type the CUDA forward stores in (the CUDA forward takes no other).
pub fn unit_roundoff(dtype: DType) -> Result<f32, CudaModelError> {
    match dtype {
        DType::BF16 => Ok(2f32.powi(-8)),
        DType::F16 => Ok(2f32.powi(-11)),
        other => Err(CudaModelError::Unsupported(format!("{other} weights on the GPU (use bf16 or f16)"))),
    }
}

/// `τ_v` for every token `v` of one model and half type (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct LogitTolerance {
    per_token: Vec<f32>,
}

/// How a CUDA row's greedy token relates to the CPU's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Greedy {
    Agree,
    /// Different, but the CPU's logits of the two tokens are within their tolerances' sum.
    NearTie,
    /// Different, and not a near tie.
    Disagree,
}

/// One row of CUDA logits against the CPU's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowCheck {
    /// Largest `|cuda − cpu| / τ_v` of the row (infinite for a NaN or a row of the wrong length).
    pub worst: f32,
    pub greedy: Greedy,
}

impl RowCheck {
    /// Every logit within its tolerance and the greedy token the CPU's or a near tie.
    pub fn passed(&self) -> bool {
        self.worst <= 1.0 && self.greedy != Greedy::Disagree
    }
}

impl LogitTolerance {
    /// The tolerances of `model` run in `dtype` (bf16 or f16).
    pub fn new(model: &Model, dtype: DType) -> Result<Self, CudaModelError> {
        let arch = &model.config.arch;
        // What the final norm multiplies by (Gemma's `1 + w`).
        let final_norm: Vec<f32> =
            model.final_norm.to_f32().iter().map(|g| arch.norm_weight_offset + g).collect();
        let sites = half_roundings_per_layer(arch) * model.layers.len();
        Self::from_parts(&model.lm_head().to_f32(), &final_norm, sites, dtype)
    }

    /// The tolerances of a model whose decoder layers round `layer_roundings` values in all
    /// (e.g. [`HALF_ROUNDINGS_PER_LAYER`] × layers), with LM head `lm_head` (`[vocab, hidden]`,
    /// row-major) and final norm weight `final_norm` (`[hidden]`), run in `dtype`.
    pub fn from_parts(
        lm_head: &[f32],
        final_norm: &[f32],
        layer_roundings: usize,
        dtype: DType,
    ) -> Result<Self, CudaModelError> {
        let u = unit_roundoff(dtype)?;
        let hidden = final_norm.len();
        if hidden == 0 || !lm_head.len().is_multiple_of(hidden) {
            return Err(CudaModelError::InvalidInput(format!(
                "an LM head of {} values is not rows of the final norm's {hidden}",
                lm_head.len()
            )));
        }
        let sites = (layer_roundings + HALF_ROUNDINGS_OUTSIDE) as f64;
        let sigma_per_magnitude = f64::from(u) * (sites / 3.0).sqrt();
        let per_token = lm_head
            .chunks_exact(hidden)
            .map(|row| {
                let s: f64 =
                    row.iter().zip(final_norm).map(|(&w, &g)| (f64::from(w) * f64::from(g)).powi(2)).sum();
                (f64::from(TOLERANCE_SIGMAS) * sigma_per_magnitude * s.sqrt()) as f32
            })
            .collect();
        Ok(LogitTolerance { per_token })
    }

    /// `τ_v` of token `token` (0 past the vocabulary).
    pub fn of(&self, token: usize) -> f32 {
        self.per_token.get(token).copied().unwrap_or(0.0)
    }

    /// Tokens covered (the vocabulary).
    pub fn len(&self) -> usize {
        self.per_token.len()
    }

    pub fn is_empty(&self) -> bool {
        self.per_token.is_empty()
    }

    /// One row of CUDA logits `got` against the CPU's `want`.
    pub fn check_row(&self, got: &[f32], want: &[f32]) -> RowCheck {
        if got.len() != want.len() || want.len() != self.per_token.len() {
            return RowCheck { worst: f32::INFINITY, greedy: Greedy::Disagree };
        }
        let mut worst = 0.0f32;
        for ((&g, &w), &tau) in got.iter().zip(want).zip(&self.per_token) {
            let ratio = (g - w).abs() / tau;
            worst = if ratio.is_nan() { f32::INFINITY } else { worst.max(ratio) };
        }
        let (a, c) = (argmax(want) as usize, argmax(got) as usize);
        let greedy = if a == c {
            Greedy::Agree
        } else if want[a] - want[c] <= self.per_token[a] + self.per_token[c] {
            Greedy::NearTie
        } else {
            Greedy::Disagree
        };
        RowCheck { worst, greedy }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tolerance_is_u_times_the_propagated_magnitude_of_each_logit() -> Result<(), CudaModelError> {
        // Hidden 2, vocabulary 2: s_0 = ‖(3, 4) ⊙ (1, 2)‖ = √73, s_1 = ‖(0, 1) ⊙ (1, 2)‖ = 2.
        let (lm, g) = ([3.0f32, 4.0, 0.0, 1.0], [1.0f32, 2.0]);
        let t = LogitTolerance::from_parts(&lm, &g, HALF_ROUNDINGS_PER_LAYER, DType::BF16)?;
        let sigma = 2f64.powi(-8) * (17.0f64 / 3.0).sqrt();
        assert_eq!(t.len(), 2);
        assert!((f64::from(t.of(0)) - 5.0 * sigma * 73f64.sqrt()).abs() < 1e-6, "{}", t.of(0));
        assert!((f64::from(t.of(1)) - 5.0 * sigma * 2.0).abs() < 1e-6, "{}", t.of(1));
        assert_eq!(t.of(2), 0.0);
        // f16 keeps three more bits: 8x tighter. Variances add over layers: √(13·L + 4).
        let f16 = LogitTolerance::from_parts(&lm, &g, HALF_ROUNDINGS_PER_LAYER, DType::F16)?;
        assert!((t.of(0) / f16.of(0) - 8.0).abs() < 1e-5);
        let deep = LogitTolerance::from_parts(&lm, &g, 4 * HALF_ROUNDINGS_PER_LAYER, DType::BF16)?;
        assert!((deep.of(1) / t.of(1) - (56.0f32 / 17.0).sqrt()).abs() < 1e-5);
        // No f32 forward on CUDA; an LM head that is not rows of the hidden size.
        assert!(LogitTolerance::from_parts(&lm, &g, HALF_ROUNDINGS_PER_LAYER, DType::F32).is_err());
        assert!(LogitTolerance::from_parts(&lm[..3], &g, HALF_ROUNDINGS_PER_LAYER, DType::BF16).is_err());
        assert!(LogitTolerance::from_parts(&lm, &[], HALF_ROUNDINGS_PER_LAYER, DType::BF16).is_err());
        Ok(())
    }

    #[test]
    fn rows_fail_past_their_tolerance_and_disagree_only_outside_near_ties() -> Result<(), CudaModelError> {
        // Three tokens with tolerances 1, 2 and 1 (rows scaled to those magnitudes).
        let unit = 1.0 / (5.0 * 2f32.powi(-8) * (17.0f32 / 3.0).sqrt());
        let lm = [unit, 0.0, 2.0 * unit, 0.0, 0.0, unit];
        let t = LogitTolerance::from_parts(&lm, &[1.0, 1.0], HALF_ROUNDINGS_PER_LAYER, DType::BF16)?;
        assert!((t.of(0) - 1.0).abs() < 1e-5 && (t.of(1) - 2.0).abs() < 1e-5);
        let want = [10.0, 8.0, 0.0];
        let ok = t.check_row(&[10.9, 6.2, -0.9], &want);
        assert!(ok.passed() && ok.greedy == Greedy::Agree && ok.worst < 1.0, "{ok:?}");
        let off = t.check_row(&[10.0, 8.0, 1.1], &want);
        assert!(!off.passed() && (off.worst - 1.1).abs() < 1e-4, "{off:?}");
        // Token 1 overtakes token 0: a near tie, since 10 - 8 <= 1 + 2 ...
        let tie = t.check_row(&[9.2, 9.8, 0.0], &want);
        assert_eq!(tie.greedy, Greedy::NearTie);
        assert!(tie.passed(), "{tie:?}");
        // ... token 2 does not (10 - 0 > 1 + 1), and its logit is out of tolerance too.
        let wrong = t.check_row(&[10.0, 8.0, 11.0], &want);
        assert_eq!(wrong.greedy, Greedy::Disagree);
        assert!(!wrong.passed() && wrong.worst > 1.0);
        // NaN, or a row of the wrong length, is infinitely wrong.
        assert!(t.check_row(&[10.0, f32::NAN, 0.0], &want).worst.is_infinite());
        assert!(!t.check_row(&[10.0, 8.0], &want[..2]).passed());
        Ok(())
    }
}
