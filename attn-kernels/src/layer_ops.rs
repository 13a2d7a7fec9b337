//! [`LayerOps`]: every op of a decoder step beside attention, one method each, over one
//! device's buffers and weights — what a forward calls so that it holds buffers and never
//! launches a kernel or loops over elements itself. [`crate::cpu::ops::CpuOps`] is the host;
//! with `cuda`, [`crate::cuda::layer_ops::CudaLayerOps`] is the GPU.
//!
//! A step's activations are f32 rows ([`KernelBackend::Act`]: the residual stream, Q/K/V, the
//! attention output, logits) and the rows a GEMM reads ([`LayerOps::Gemm`]): the same f32 on the
//! CPU, the model's half type on CUDA, where the norms write and the gated activation reads and
//! writes them. Lengths are given in rows and widths; a buffer shorter than that is an error, not
//! an out-of-bounds access.

use crate::backend::KernelBackend;
use crate::cpu::act::Activation;

/// RMSNorm's constants: `y = x / rms(x) · (offset + w)` over rows of `width`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsNorm {
    pub width: usize,
    /// 0 for most models, 1 for Gemma's `1 + w`.
    pub offset: f32,
    pub eps: f64,
}

/// A linear layer's shape: `out[rows, out_dim] (+)= x[rows, in_dim] · w[out_dim, in_dim]ᵀ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearShape {
    pub rows: usize,
    pub out_dim: usize,
    pub in_dim: usize,
    /// Adds into `out` (the residual add fused into the GEMM) instead of overwriting it.
    pub accumulate: bool,
}

/// The heads rotary embedding turns: `tokens` rows of Q (`heads` heads) and K (`kv_heads`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotaryShape {
    pub tokens: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Which elements of a head rotary embedding pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopePairs {
    /// Hugging Face's `(i, i + d/2)`.
    RotateHalf,
    /// llama.cpp's `(2i, 2i + 1)` (the row order of a GGUF's Q/K).
    Interleaved,
}

/// The layer ops of one device. Attention and the cache writes are [`KernelBackend`]'s.
pub trait LayerOps: KernelBackend {
    /// Rows a GEMM reads (and the gated activation writes).
    type Gemm: ?Sized;
    /// A weight matrix `[out_dim, in_dim]` in the device's storage format.
    type Matrix<'a>;
    /// A norm's weights or a bias row.
    type Vector<'a>;
    /// A step's token ids.
    type Ids: ?Sized;
    /// Row indices (the sampled rows a norm gathers).
    type Indices: ?Sized;
    /// The rotation of this step's tokens (cos/sin at their positions).
    type Rotation<'a>: Copy;

    /// `out[t] = table[ids[t]] · scale` for `rows` tokens of `width`.
    fn embed(
        &self,
        out: &mut Self::Act,
        table: Self::Matrix<'_>,
        ids: &Self::Ids,
        rows: usize,
        scale: f32,
    ) -> Result<(), Self::Error>;

    /// RMSNorm of `rows` rows of `x` into `out`; with `gather`, row `r` of `out` is the norm of
    /// row `gather[r]` of `x`.
    fn rms_norm(
        &self,
        out: &mut Self::Gemm,
        x: &Self::Act,
        weight: Self::Vector<'_>,
        gather: Option<&Self::Indices>,
        rows: usize,
        norm: RmsNorm,
    ) -> Result<(), Self::Error>;

    /// RMSNorm in place of `rows` rows of `norm.width` (every head of Q or K, one row each).
    fn rms_norm_in_place(
        &self,
        x: &mut Self::Act,
        weight: Self::Vector<'_>,
        rows: usize,
        norm: RmsNorm,
    ) -> Result<(), Self::Error>;

    /// `out (+)= x · wᵀ` into f32 rows.
    fn linear(
        &self,
        out: &mut Self::Act,
        x: &Self::Gemm,
        weight: Self::Matrix<'_>,
        shape: LinearShape,
    ) -> Result<(), Self::Error>;

    /// `out = x · wᵀ` into rows another GEMM-side op reads (the gate/up projection).
    fn linear_to_gemm(
        &self,
        out: &mut Self::Gemm,
        x: &Self::Gemm,
        weight: Self::Matrix<'_>,
        shape: LinearShape,
    ) -> Result<(), Self::Error>;

    /// `out[r] += bias` for `rows` rows of `bias`'s width.
    fn add_bias(
        &self,
        out: &mut Self::Act,
        bias: Self::Vector<'_>,
        rows: usize,
        width: usize,
    ) -> Result<(), Self::Error>;

    /// Rotates every head of Q and K in place by this step's rotation.
    fn rotary(
        &self,
        q: &mut Self::Act,
        k: &mut Self::Act,
        rotation: Self::Rotation<'_>,
        shape: RotaryShape,
    ) -> Result<(), Self::Error>;

    /// `out[t, i] = act(gate_up[t, i]) · gate_up[t, inter + i]` for `rows` rows.
    fn gated_act(
        &self,
        out: &mut Self::Gemm,
        gate_up: &Self::Gemm,
        rows: usize,
        inter: usize,
        act: Activation,
    ) -> Result<(), Self::Error>;

    /// `out[..len] += x[..len]` (a sandwich-normed branch joining the residual stream).
    fn add(&self, out: &mut Self::Act, x: &Self::Gemm, len: usize) -> Result<(), Self::Error>;

    /// `x[..len] = cap · tanh(x / cap)` (logit soft-capping).
    fn softcap(&self, x: &mut Self::Act, cap: f32, len: usize) -> Result<(), Self::Error>;
}
