//! The CPU compute kernels of a decoder layer beside attention and the matmuls (those are
//! `quant-kernels`'):
//! - [`norm`]: RMSNorm (plain and `1 + w`). [`act`]: gated activations (SwiGLU, GeGLU) and the
//!   vectorized `exp` of a softmax. [`rope`]: rotary embedding of one token's heads.
//! - [`ops`]: all of them, the matmuls and attention as the host's
//!   [`LayerOps`](crate::layer_ops::LayerOps), what the forward calls.
//!
//! The instruction set is the engine's one run-time choice, [`crate::Isa`], shared with the
//! attention kernels; every kernel has a portable fallback.

pub mod act;
pub mod norm;
pub mod ops;
pub mod rope;

/// Tokens per rayon task for the cheap element-wise ops ([`norm`], [`act`]).
const TOKENS_PER_TASK: usize = 16;
