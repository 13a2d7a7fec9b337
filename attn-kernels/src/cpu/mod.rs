//! The CPU compute kernels beside attention, the ones a decoder layer runs on the host:
//! - [`quant`]: `Weight`, a matrix kept in its storage format (f32, f16, bf16, ggml blocks),
//!   and `x·Wᵀ` over it: decode kernels per instruction set, batched-decode and prefill paths.
//! - [`linear`]: `x·Wᵀ` over f32 weights (`gemm`, `small_m`, `token_lanes`).
//! - [`norm`]: RMSNorm (plain and `1 + w`). [`act`]: gated activations (SwiGLU, GeGLU).
//!   [`rope`]: rotary embedding of one token's heads.
//! - [`ggml`]: ggml's block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16,
//!   F32), dequantization and reference quantizers.
//!
//! The instruction set is the crate's one run-time choice, [`crate::Isa`], shared with the
//! attention kernels; every kernel has a portable fallback.

pub mod act;
pub mod ggml;
pub mod linear;
pub mod norm;
pub mod quant;
pub mod rope;

/// Tokens per rayon task for the cheap element-wise ops ([`norm`], [`act`]).
const TOKENS_PER_TASK: usize = 16;
