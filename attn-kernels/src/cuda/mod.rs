//! The CUDA backend (behind the `cuda` feature), the one home of device code: the device itself
//! ([`CudaDevice`]: context and stream, opened without panicking when there is no driver),
//! kernel sources and their instantiation table, NVRTC compilation to cubin for the device's own
//! architecture with an in-memory and on-disk cache, the compile check CI runs without a GPU (its
//! binaries live in the `gpu-check` crate), launch wrappers over the device KV memory of
//! `kv_cache::cuda` (which owns that memory and takes the device's stream), and the decoder
//! layer's ops ([`CudaLayerOps`]: the model kernels' typed wrappers and cuBLAS GEMMs).
//!
//! Nothing here panics on a machine without a GPU or without libcuda/libnvrtc: every entry point
//! checks that the library loads before the first call into it and returns a [`CudaError`].

pub mod check;
pub mod cubin_cache;
mod device;
mod error;
pub mod gemm;
mod indices;
pub mod kernels;
pub mod layer_ops;
pub mod metadata;
pub mod nvrtc;
pub mod ops;
pub mod runtime;
pub mod swap;

pub use device::{CudaDevice, PlainValue, driver_present};
pub use error::CudaError;
pub use indices::DeviceIndices;
pub use kernels::{AttentionConfig, AttentionVariant, KERNEL_SOURCES, Program, all_programs};
pub use layer_ops::{CudaLayerOps, DeviceRotation};
pub use metadata::{DeviceAttnMetadata, HostAttnMetadata};
pub use ops::{AttnWorkspace, choose_variant};
pub use runtime::CudaKernels;

/// Locks `m`, taking over a poisoned lock: that only means another thread panicked while it held
/// it, and the maps and reports guarded here stay valid through any partial update.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
