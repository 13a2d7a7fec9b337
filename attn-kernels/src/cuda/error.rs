//! Errors of the CUDA backend: missing libraries, no device, compile failures, driver errors,
//! and the device cache's own errors.

/// Everything the CUDA backend can fail with; never a panic.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no CUDA driver (libcuda) on this machine: the CUDA device is unavailable; use the CPU")]
    DriverMissing,
    #[error("the NVRTC library (libnvrtc) could not be loaded; put it on LD_LIBRARY_PATH")]
    NvrtcMissing,
    #[error("the cuBLAS library (libcublas) could not be loaded; put it on LD_LIBRARY_PATH")]
    CublasMissing,
    #[error("cuBLAS error: {0}")]
    Cublas(#[from] cudarc::cublas::result::CublasError),
    #[error("CUDA driver error: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("NVRTC failed on program {program}: {code}")]
    Nvrtc { program: String, code: String },
    #[error("CUDA program {program} does not compile for {arch}:\n{log}")]
    Compile { program: String, arch: String, log: String },
    #[error("kernel source of {0} contains a NUL byte")]
    SourceHasNul(String),
    #[error("kernel {0} is missing from its compiled program")]
    MissingKernel(String),
    #[error("no CUDA kernels for {0}")]
    Unsupported(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("cubin cache I/O at {path}: {source}")]
    CacheIo { path: String, source: std::io::Error },
    #[error(transparent)]
    Cache(#[from] kv_cache::cuda::CudaCacheError),
}
