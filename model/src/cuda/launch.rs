//! How the forward launches its kernels: the model kernels, loaded once per model
//! ([`Functions`]), and the launch shape of the row kernels (one block a row, [`ROW_THREADS`]
//! threads), with the `i32` their lengths travel as.

use attn_kernels::cuda::kernels::{ARGMAX_ENTRY, SOFTCAP_ENTRY, cast_entry, model_entry, model_program};
use attn_kernels::cuda::{CudaKernels, Program};
use cudarc::driver::{CudaFunction, LaunchConfig};
use kv_cache::DType;

use super::error::CudaModelError;

/// Threads per block of the row kernels (a multiple of 32, as `block_sum` needs).
pub(super) const ROW_THREADS: u32 = 256;

/// The model kernels one forward launches, loaded once.
#[derive(Debug)]
pub(super) struct Functions {
    pub embedding: CudaFunction,
    pub rms_norm: CudaFunction,
    pub rotary: CudaFunction,
    pub silu_mul: CudaFunction,
    pub gelu_tanh_mul: CudaFunction,
    pub add_bias: CudaFunction,
    pub add_into: CudaFunction,
    pub head_norm: CudaFunction,
    pub cast_attn: CudaFunction,
    pub softcap: CudaFunction,
    pub argmax: CudaFunction,
}

impl Functions {
    pub(super) fn load(kernels: &CudaKernels, dtype: DType) -> Result<Self, CudaModelError> {
        let program: Program = model_program();
        let f = |name: String| kernels.function(&program, &name);
        Ok(Functions {
            embedding: f(model_entry("embedding_f32out", dtype))?,
            rms_norm: f(model_entry("rms_norm_f32in", dtype))?,
            rotary: f(model_entry("rotary", DType::F32))?,
            silu_mul: f(model_entry("silu_mul", dtype))?,
            gelu_tanh_mul: f(model_entry("gelu_tanh_mul", dtype))?,
            add_bias: f(model_entry("add_bias_f32out", dtype))?,
            add_into: f(model_entry("add_into_f32", dtype))?,
            head_norm: f(model_entry("rms_norm_heads_f32", dtype))?,
            cast_attn: f(cast_entry(DType::F32, dtype))?,
            softcap: f(SOFTCAP_ENTRY.to_owned())?,
            argmax: f(ARGMAX_ENTRY.to_owned())?,
        })
    }
}

/// `v` as the `i32` a kernel takes its lengths in.
pub(super) fn int(v: usize) -> Result<i32, CudaModelError> {
    i32::try_from(v).map_err(|_| CudaModelError::InvalidInput(format!("{v} exceeds i32")))
}

/// One block of `threads` per row, `rows` of them.
pub(super) fn rows_launch(rows: usize, threads: u32) -> Result<LaunchConfig, CudaModelError> {
    let grid = u32::try_from(rows).map_err(|_| CudaModelError::InvalidInput(format!("{rows} rows")))?;
    Ok(LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 })
}
