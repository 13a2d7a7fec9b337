//! The CUDA backend (behind the `cuda` feature): kernel sources and their instantiation table,
//! NVRTC compilation to cubin for the device's own architecture with an in-memory and on-disk
//! cache, the compile check CI runs without a GPU (its binaries live in the `gpu-check`
//! crate), and launch wrappers over the device cache of
//! `kv_cache::cuda`.
//!
//! Nothing here panics on a machine without a GPU or without libcuda/libnvrtc: every entry point
//! checks that the library loads before the first call into it and returns a [`CudaError`].

pub mod check;
pub mod cubin_cache;
mod error;
pub mod kernels;
pub mod metadata;
pub mod nvrtc;
pub mod ops;
pub mod runtime;
pub mod swap;

pub use error::CudaError;
pub use kernels::{AttentionConfig, AttentionVariant, KERNEL_SOURCES, Program, all_programs};
pub use metadata::{DeviceAttnMetadata, HostAttnMetadata};
pub use ops::{AttnWorkspace, choose_variant};
pub use runtime::CudaKernels;
