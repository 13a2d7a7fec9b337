//! Errors of the CUDA forward: device, kernels, cuBLAS, and bad batches; never a panic.

use attn_kernels::cuda::CudaError;
use cudarc::driver::DriverError;
use kv_cache::cuda::CudaCacheError;

/// Everything the CUDA forward can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CudaModelError {
    #[error(transparent)]
    Kernels(#[from] CudaError),
    #[error(transparent)]
    Cache(#[from] CudaCacheError),
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),
    #[error("unsupported on CUDA: {0}")]
    Unsupported(String),
    #[error("invalid model input: {0}")]
    InvalidInput(String),
}
