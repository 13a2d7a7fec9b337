//! `gpu-check`: what a lent GPU runs, kept out of the library crates. The binaries:
//! `cuda_check` (compile every kernel with NVRTC; CI, no GPU), `gpu_check` (every kernel against
//! the CPU reference, bandwidth figures) and `gpu_model_check` (the CUDA forward against the CPU
//! forward, the e2e figure). The host side of the kernel check lives in [`attn_cases`] so it is
//! unit-tested without a GPU; [`figures`] is how both GPU programs record and write their
//! figures. Everything is behind the `cuda` feature.

#[cfg(feature = "cuda")]
pub mod attn_cases;
#[cfg(feature = "cuda")]
pub mod figures;
