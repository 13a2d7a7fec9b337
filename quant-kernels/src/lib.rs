//! `quant-kernels`: weight matrices in their storage formats and `x·Wᵀ` over them on the CPU —
//! ggml's block formats and their codecs, the quantized and f32 matmul kernels — and [`Isa`],
//! the one run-time choice of instruction set every CPU kernel of the engine makes.
//!
//! - [`ggml`]: ggml's block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16,
//!   F32): their layouts, dequantization and reference quantizers (what GGUF files hold).
//! - [`quant`]: `Weight`, a matrix kept in its storage format (memory-mapped when it comes from a
//!   file), and `x·Wᵀ` over it: decode kernels per instruction set, the integer-activation paths
//!   (int16, int8), batched-decode and prefill paths.
//! - [`linear`]: `x·Wᵀ` over f32 weights (`gemm`, `small_m`, `token_lanes`) and the pieces the
//!   quantized kernels share with it.
//!
//! Nothing here knows of a model, a KV cache or attention: `attn-kernels` (the paged-attention
//! and cache kernels, the backend op API) sits above this crate and re-exports [`Isa`].
//!
//! The kernels use every rayon thread, AVX-512 or AVX2/FMA/F16C inner loops chosen once at run
//! time ([`Isa`]; portable fallback otherwise), and per-thread scratch so the hot loop never
//! allocates.

pub mod ggml;
mod isa;
pub mod linear;
pub mod quant;

pub use isa::Isa;
#[cfg(target_arch = "x86_64")]
pub use isa::avx512_vnni;
