//! The int16-activation decode path ([`super::ActivationPrecision::Int16`], and `Auto`'s choice
//! where the CPU has AVX-512 VNNI) for the formats whose codes are small integers under
//! per-group scales (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q4_K, Q5_K, Q6_K): each
//! token's activations are rounded once per call to int16 with one scale per group of 32
//! (`dx = max|x| / 32767`), so a group's dot product is an exact integer sum (`vpdpwssd` on
//! AVX-512 VNNI, `vpmaddwd` on AVX2) scaled once by `d·dx` (Q6_K: each 16 by its own `d`); the
//! offsets (`m`, the K-quants' `−dmin·m`) go through the exact f32 group sums, and Q4_0's and
//! Q5_0's codes are centred (`q − 8`, `q − 16`: the whole value in the integer sum). The
//! rounding error is 2⁻¹⁶ of each group's largest activation (the tests bound it per product;
//! the model crate's golden tests measure it on the real models).
//!
//! The activations are laid out in pairs of groups, `[g0 0..16, g1 0..16, g0 16..32,
//! g1 16..32]`, the order in which one zmm load of two groups' codes arrives (AVX2 reads the
//! same layout a quarter at a time). An odd last group is paired with a zero group.

/// Whether this path runs format `ty`.
pub(super) fn supports(ty: super::GgmlType) -> bool {
    super::INTEGER_CODE_FORMATS.contains(&ty)
}

/// The activations of one decode call in int16: per token and pair of groups, 64 words in the
/// pair layout (module doc); `dx[m][pairs·2]` (a zero group's scale is 0), the f32 group
/// sums `sums[m][groups]` for the offsets, and the sums of each group's words
/// `word_sums[m][groups]` (a centred format's `CENTRE·Σx̃`, for kernels that multiply the
/// stored codes).
pub(super) struct X16 {
    pub q: Vec<i16>,
    pub dx: Vec<f32>,
    pub sums: Vec<f32>,
    pub word_sums: Vec<i32>,
    pub groups: usize,
}

impl X16 {
    /// Pairs of groups per token.
    pub fn pairs(&self) -> usize {
        self.groups.div_ceil(2)
    }

    /// `m` tokens of `k` activations (`k` a multiple of 32) as `x ≈ dx·hi` with
    /// `dx = max|x|/32767` per group. A group holding a NaN or an infinity gets a NaN scale, so
    /// its products come out NaN as the f32 path's would.
    #[cfg(target_arch = "x86_64")]
    pub fn quantize(x: &[f32], m: usize, k: usize) -> X16 {
        assert!(k.is_multiple_of(32) && x.len() >= m * k, "X16::quantize: {m} tokens of {k}");
        let groups = k / 32;
        let pairs = groups.div_ceil(2);
        let mut xq = X16 {
            q: vec![0i16; m * pairs * 64],
            dx: vec![0.0f32; m * pairs * 2],
            sums: vec![0.0f32; m * groups],
            word_sums: vec![0; m * groups],
            groups,
        };
        for t in 0..m {
            for g in 0..groups {
                let (p, half) = (g / 2, g % 2);
                let words = (t * pairs + p) * 64 + 16 * half;
                // SAFETY: the integer kernels, this function's only callers outside tests, run
                // on an Isa that detected AVX2 + FMA + F16C; the tests run it where they did.
                // The group's 32 values lie in x (asserted); its words, its halves at `words`
                // and `words + 32`, lie in q.
                let (sum, dx) = unsafe {
                    kernels::quantize_group(x.as_ptr().add(t * k + 32 * g), xq.q.as_mut_ptr().add(words))
                };
                xq.sums[t * groups + g] = sum;
                xq.dx[t * pairs * 2 + g] = dx;
                let words = &xq.q[words..];
                xq.word_sums[t * groups + g] =
                    words[..16].iter().chain(&words[32..48]).map(|&w| i32::from(w)).sum();
            }
        }
        xq
    }

    /// Token `t`'s 64 words of pair `p`.
    pub fn pair(&self, t: usize, p: usize) -> &[i16] {
        let base = (t * self.pairs() + p) * 64;
        &self.q[base..base + 64]
    }

    /// The value of token `t`'s activation `i` as this path sees it: the tests' reference
    /// for the SIMD kernels.
    #[cfg(test)]
    pub fn value(&self, t: usize, i: usize) -> f64 {
        let (g, j) = (i / 32, i % 32);
        let (p, half) = (g / 2, g % 2);
        let word = if j < 16 { 16 * half + j } else { 32 + 16 * half + j - 16 };
        f64::from(self.pair(t, p)[word]) * f64::from(self.dx[t * self.pairs() * 2 + g])
    }
}

#[cfg(target_arch = "x86_64")]
mod codes;
#[cfg(target_arch = "x86_64")]
mod kernels;
#[cfg(target_arch = "x86_64")]
mod lanes512;
#[cfg(target_arch = "x86_64")]
mod q6k_avx2;
#[cfg(target_arch = "x86_64")]
mod rows512;

#[cfg(target_arch = "x86_64")]
pub(super) use codes::{Codes, Layout, Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0};
#[cfg(target_arch = "x86_64")]
pub(super) use kernels::{dot_rows_avx2, quantize_group, widen};
#[cfg(target_arch = "x86_64")]
pub(super) use lanes512::{LaneActs, ROWS as LANE_ROWS, TOKENS_PER_PASS as LANE_TOKENS_PER_PASS};
#[cfg(target_arch = "x86_64")]
pub(super) use rows512::{TOKENS_PER_PASS as AVX512_TOKENS_PER_PASS, dot_rows_avx512};
