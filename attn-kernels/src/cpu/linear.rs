//! The dense building blocks of the forward pass: `x·Wᵀ` (through `gemm`, or a
//! bandwidth-bound tiled kernel for a handful of tokens, `small_m`), RMSNorm, SwiGLU, rotary
//! embedding (SiLU through a vectorizable `exp`). All work on caller-provided buffers.

use rayon::prelude::*;

mod small_m;
mod token_lanes;

pub use small_m::small_m_linear;
pub use token_lanes::token_lanes_linear;
pub(crate) use token_lanes::{WeightRows, available as token_lanes_available, token_lanes_rows};

/// Raw output pointer shared by the column-range tasks of the `x·Wᵀ` kernels; each task
/// writes only its own columns.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: tasks write disjoint `(token, column)` entries (their own column range).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// A method, so closures capture the whole (Send) wrapper, not its raw field.
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }

    /// The pointer `n` floats on (for a sub-range of columns); no access happens here.
    pub(crate) fn offset(self, n: usize) -> Self {
        Self(self.0.wrapping_add(n))
    }
}

/// Above this many tokens a projection goes through `gemm`'s packed kernels; at or below it
/// through [`small_m_linear`], which streams each weight row once for all tokens (decode is
/// bound by weight bandwidth, and packing would only add traffic).
pub const SMALL_M: usize = 8;

/// Up to this many tokens (on AVX-512 CPUs) a projection goes through [`token_lanes_linear`],
/// which never repacks the weights; above it `gemm`'s cache blocking wins.
pub const TOKEN_LANES_MAX_M: usize = 128;

/// `dst[m, n] (+)= x[m, k] · w[n, k]ᵀ`. `w` is row-major `[n, k]` (PyTorch `Linear` layout).
/// With `accumulate` the product is added to `dst` (used for the residual stream).
pub fn linear(dst: &mut [f32], x: &[f32], w: &[f32], m: usize, n: usize, k: usize, accumulate: bool) {
    assert!(dst.len() >= m * n && x.len() >= m * k && w.len() >= n * k, "linear: short buffer");
    if m == 0 {
        return;
    }
    if m <= SMALL_M {
        small_m_linear(dst, x, w, m, n, k, accumulate);
        return;
    }
    if m <= TOKEN_LANES_MAX_M && token_lanes_linear(dst, x, w, m, n, k, accumulate) {
        return;
    }
    // SAFETY: the slices hold at least m·n, m·k and n·k elements (asserted above).
    unsafe { gemm_into(OutPtr(dst.as_mut_ptr()), n, x, m, k, w, n, accumulate, gemm::Parallelism::Rayon(0)) };
}

/// `out[m, n] (+)= x[m, k] · w[n, k]ᵀ` through `gemm`, with `out`'s rows `ldo` floats apart.
///
/// # Safety
/// `x` and `w` hold `m·k` and `n·k` floats; `out` addresses `m` rows of `n` writable floats
/// that nothing else touches during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_into(
    out: OutPtr,
    ldo: usize,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    accumulate: bool,
    parallelism: gemm::Parallelism,
) {
    // SAFETY: per the contract; strides describe row-major `out[m, ldo]`, `x[m, k]` and
    // `wᵀ[k, n]` (element (kk, j) at j·k + kk).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.get(),
            1,
            ldo as isize,
            accumulate,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// Dot product with 16 independent accumulators so the compiler vectorises it.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut acc = [0.0f32; L];
    let (ac, ar) = a.split_at(a.len() / L * L);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(L).zip(bc.chunks_exact(L)) {
        for i in 0..L {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

/// Tokens per rayon task for the cheap element-wise ops.
const TOKENS_PER_TASK: usize = 16;

/// `out[t] = x[t] / rms(x[t]) * weight` for every row of width `weight.len()`.
pub fn rms_norm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f64) {
    let h = weight.len();
    #[cfg(target_arch = "x86_64")]
    let (avx512, avx2) = (is_x86_feature_detected!("avx512f"), is_x86_feature_detected!("avx2"));
    out.par_chunks_mut(h * TOKENS_PER_TASK).zip(x.par_chunks(h * TOKENS_PER_TASK)).for_each(|(o, xi)| {
        #[cfg(target_arch = "x86_64")]
        if avx512 {
            // SAFETY: AVX-512F was detected at run time.
            return unsafe { rms_norm_rows_avx512(o, xi, weight, eps) };
        } else if avx2 {
            // SAFETY: AVX2 was detected at run time.
            return unsafe { rms_norm_rows_avx2(o, xi, weight, eps) };
        }
        rms_norm_rows(o, xi, weight, eps);
    });
}

/// [`rms_norm`] over a task's rows. `Σ x²` runs in f64 in eight interleaved partial sums,
/// which vectorize (one running sum does not: it was ~70 % of the op's time).
#[inline(always)]
fn rms_norm_rows(out: &mut [f32], x: &[f32], weight: &[f32], eps: f64) {
    let h = weight.len();
    for (orow, xrow) in out.chunks_exact_mut(h).zip(x.chunks_exact(h)) {
        let mut acc = [0.0f64; 8];
        let chunks = xrow.chunks_exact(8);
        let tail: f64 = chunks.remainder().iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        for c in chunks {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += f64::from(v) * f64::from(v);
            }
        }
        let ss = acc.iter().sum::<f64>() + tail;
        let inv = (1.0 / (ss / h as f64 + eps).sqrt()) as f32;
        for ((ov, &xv), &wv) in orow.iter_mut().zip(xrow).zip(weight) {
            *ov = xv * inv * wv;
        }
    }
}

/// [`rms_norm_rows`] compiled for AVX-512 (the crate's baseline target is SSE2); the same
/// arithmetic in the same order as every other build of it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn rms_norm_rows_avx512(out: &mut [f32], x: &[f32], weight: &[f32], eps: f64) {
    rms_norm_rows(out, x, weight, eps);
}

/// [`rms_norm_rows`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rms_norm_rows_avx2(out: &mut [f32], x: &[f32], weight: &[f32], eps: f64) {
    rms_norm_rows(out, x, weight, eps);
}

/// SwiGLU: `out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i]`.
pub fn silu_mul(out: &mut [f32], gate_up: &[f32], inter: usize) {
    #[cfg(target_arch = "x86_64")]
    let avx512 = is_x86_feature_detected!("avx512f");
    out.par_chunks_mut(inter * TOKENS_PER_TASK)
        .zip(gate_up.par_chunks(2 * inter * TOKENS_PER_TASK))
        .for_each(|(o, gu)| {
            for (orow, gurow) in o.chunks_exact_mut(inter).zip(gu.chunks_exact(2 * inter)) {
                let (g, u) = gurow.split_at(inter);
                #[cfg(target_arch = "x86_64")]
                if avx512 {
                    // SAFETY: AVX-512F was detected at run time.
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

/// HF "rotate half" RoPE applied in place to every head of one token:
/// `(x_i, x_{i+d/2}) ← (x_i·cos − x_{i+d/2}·sin, x_{i+d/2}·cos + x_i·sin)`.
#[inline]
pub fn rope_rotate_half(heads: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    for head in heads.chunks_exact_mut(head_dim) {
        let (a, b) = head.split_at_mut(half);
        for i in 0..half {
            let (x0, x1) = (a[i], b[i]);
            a[i] = x0 * cos[i] - x1 * sin[i];
            b[i] = x1 * cos[i] + x0 * sin[i];
        }
    }
}

/// llama.cpp-order RoPE (Q/K rows of a GGUF, `model`'s `RopeStyle::Interleaved`) applied in
/// place to every head of one token: `(x_2i, x_2i+1) ← (x_2i·cos − x_2i+1·sin, x_2i+1·cos +
/// x_2i·sin)`, with the frequencies of pair `i` as in [`rope_rotate_half`].
#[inline]
pub fn rope_interleaved(heads: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    for head in heads.chunks_exact_mut(head_dim) {
        for (i, pair) in head.chunks_exact_mut(2).enumerate() {
            let (x0, x1) = (pair[0], pair[1]);
            pair[0] = x0 * cos[i] - x1 * sin[i];
            pair[1] = x1 * cos[i] + x0 * sin[i];
        }
    }
}

/// The test oracle of every `x·Wᵀ` kernel here: a plain triple loop accumulating in `f64`.
#[cfg(test)]
pub(crate) fn naive_linear(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] =
                (0..k).map(|kk| f64::from(x[i * k + kk]) * f64::from(w[j * k + kk])).sum::<f64>() as f32;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_matches_naive_for_small_and_large_m() {
        let (n, k) = (70, 37);
        for m in [1, 3, SMALL_M + 1, 40, TOKEN_LANES_MAX_M + 1] {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 11) as f32 - 5.0) / 7.0).collect();
            let want = naive_linear(&x, &w, m, n, k);
            let mut dst = vec![1.0; m * n];
            linear(&mut dst, &x, &w, m, n, k, true);
            for (d, e) in dst.iter().zip(&want) {
                assert!((d - 1.0 - e).abs() < 1e-4, "m={m}: {d} vs {e}");
            }
            linear(&mut dst, &x, &w, m, n, k, false);
            for (d, e) in dst.iter().zip(&want) {
                assert!((d - e).abs() < 1e-4, "m={m}: {d} vs {e}");
            }
        }
    }

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

    #[test]
    fn rms_norm_normalises() {
        let x = [3.0f32, 4.0];
        let mut out = [0.0; 2];
        rms_norm(&mut out, &x, &[1.0, 2.0], 0.0);
        let rms = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / rms).abs() < 1e-6 && (out[1] - 8.0 / rms).abs() < 1e-6);
        // Widths with and without a tail past the eight partial sums, more rows than a task.
        for h in [1, 7, 8, 13, 576] {
            let rows = 40;
            let x: Vec<f32> = (0..rows * h).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let w: Vec<f32> = (0..h).map(|i| 0.5 + (i % 5) as f32 / 4.0).collect();
            let mut out = vec![f32::NAN; rows * h];
            rms_norm(&mut out, &x, &w, 1e-5);
            for (t, row) in x.chunks_exact(h).enumerate() {
                let ms = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / h as f64;
                let inv = 1.0 / (ms + 1e-5).sqrt();
                for i in 0..h {
                    let want = f64::from(row[i]) * inv * f64::from(w[i]);
                    let got = f64::from(out[t * h + i]);
                    assert!(
                        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                        "h={h} ({t},{i}): {got} vs {want}"
                    );
                }
            }
        }
    }
}
