//! The CPU compute kernels beside attention, the ones a decoder layer runs on the host:
//! - [`ggml`]: ggml's block formats (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, F16, BF16, F32),
//!   dequantization and reference quantizers.

pub mod ggml;
