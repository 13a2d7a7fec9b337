//! Errors of the CUDA forward: device, kernels, cuBLAS, and bad batches; never a panic.

use attn_kernels::cuda::CudaError;
use cudarc::cublas::result::CublasError;
use cudarc::driver::DriverError;
use kv_cache::cuda::CudaCacheError;

/// Everything the CUDA forward can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CudaModelError {
    #[error("the cuBLAS library (libcublas) could not be loaded; put it on LD_LIBRARY_PATH")]
    CublasMissing,
    #[error("cuBLAS error: {0}")]
    Cublas(#[from] CublasError),
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
