//! `linear` on cuBLAS: row-major `y[rows, out] (+)= x[rows, in] · w[out, in]ᵀ` as one
//! `cublasGemmEx` with f32 accumulation (`CUBLAS_COMPUTE_32F`), half inputs and a half or f32
//! output.
//!
//! cuBLAS is column-major: a row-major `[r, c]` matrix is a column-major `[c, r]` one, so
//! `yᵀ[out, rows] = w[out, in] · xᵀ[in, rows]` is `C = op(A)·B` with `A` = the weight read
//! transposed. [`linear_shape`] holds that index math (host-tested); the call itself needs a GPU.

use std::ffi::c_void;

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use kv_cache::DType;

use super::error::CudaError;

/// The `cublasGemmEx` dimensions of one row-major linear layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GemmShape {
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub lda: i32,
    pub ldb: i32,
    pub ldc: i32,
}

/// Dimensions of `y[rows, out] = x[rows, in] · w[out, in]ᵀ` (A = w transposed, B = x, C = y).
pub fn linear_shape(rows: usize, out_dim: usize, in_dim: usize) -> Result<GemmShape, CudaError> {
    let int = |v: usize| {
        i32::try_from(v).map_err(|_| CudaError::InvalidArgument(format!("GEMM dimension {v} exceeds i32")))
    };
    if rows == 0 || out_dim == 0 || in_dim == 0 {
        return Err(CudaError::InvalidArgument(format!("empty GEMM {rows} x {out_dim} x {in_dim}")));
    }
    Ok(GemmShape {
        m: int(out_dim)?,
        n: int(rows)?,
        k: int(in_dim)?,
        lda: int(in_dim)?,
        ldb: int(in_dim)?,
        ldc: int(out_dim)?,
    })
}

/// cuBLAS' name of a storage type.
pub fn data_type(dtype: DType) -> cudaDataType {
    match dtype {
        DType::F32 => cudaDataType::CUDA_R_32F,
        DType::F16 => cudaDataType::CUDA_R_16F,
        DType::BF16 => cudaDataType::CUDA_R_16BF,
        DType::Int8 => cudaDataType::CUDA_R_8I,
        DType::Fp8E4M3 => cudaDataType::CUDA_R_8F_E4M3,
        DType::Fp8E5M2 => cudaDataType::CUDA_R_8F_E5M2,
    }
}

/// One GEMM's raw operands: device addresses (the caller keeps the buffers alive and sized).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LinearCall {
    pub weight: u64,
    pub input: u64,
    pub output: u64,
    pub half: DType,
    pub out_dtype: DType,
    pub rows: usize,
    pub out_dim: usize,
    pub in_dim: usize,
    /// Add into the output (the residual add fused into the GEMM) instead of overwriting it.
    pub accumulate: bool,
}

/// Runs one linear layer on `blas`' stream.
///
/// # Safety
/// `weight` must hold `out_dim·in_dim`, `input` `rows·in_dim` elements of `half`, `output`
/// `rows·out_dim` elements of `out_dtype`, all on the device of `blas` and alive until the
/// stream has run the call.
pub(crate) unsafe fn linear(blas: &CudaBlas, call: &LinearCall) -> Result<(), CudaError> {
    let s = linear_shape(call.rows, call.out_dim, call.in_dim)?;
    let alpha = 1.0f32;
    let beta = if call.accumulate { 1.0f32 } else { 0.0 };
    // SAFETY: the caller guarantees the operand sizes; scalars are host f32 as COMPUTE_32F wants.
    unsafe {
        cudarc::cublas::result::gemm_ex(
            *blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            s.m,
            s.n,
            s.k,
            (&alpha as *const f32).cast::<c_void>(),
            call.weight as *const c_void,
            data_type(call.half),
            s.lda,
            call.input as *const c_void,
            data_type(call.half),
            s.ldb,
            (&beta as *const f32).cast::<c_void>(),
            call.output as *mut c_void,
            data_type(call.out_dtype),
            s.ldc,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Column-major GEMM `C[m,n] = Aᵀ·B` with A stored `[k, m]` (lda) and B `[k, n]` (ldb),
    /// exactly as cuBLAS reads the operands of [`linear_shape`].
    fn cublas_like(s: &GemmShape, a: &[f32], b: &[f32]) -> Vec<f32> {
        let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
        let mut c = vec![0.0; s.ldc as usize * n];
        for j in 0..n {
            for i in 0..m {
                let mut acc = 0.0;
                for p in 0..k {
                    acc += a[i * s.lda as usize + p] * b[j * s.ldb as usize + p];
                }
                c[j * s.ldc as usize + i] = acc;
            }
        }
        c
    }

    #[test]
    fn column_major_call_computes_the_row_major_linear() {
        let (rows, out_dim, in_dim) = (3, 5, 4);
        let w: Vec<f32> = (0..out_dim * in_dim).map(|i| (i as f32 * 0.37).sin()).collect();
        let x: Vec<f32> = (0..rows * in_dim).map(|i| (i as f32 * 0.91).cos()).collect();
        let s = linear_shape(rows, out_dim, in_dim).unwrap_or_default();
        let got = cublas_like(&s, &w, &x);
        for r in 0..rows {
            for o in 0..out_dim {
                let want: f32 = (0..in_dim).map(|i| x[r * in_dim + i] * w[o * in_dim + i]).sum();
                assert!((got[r * out_dim + o] - want).abs() < 1e-5, "row {r} col {o}");
            }
        }
    }

    #[test]
    fn empty_or_huge_shapes_are_errors() {
        assert!(linear_shape(0, 4, 4).is_err());
        assert!(linear_shape(1, 1 << 31, 4).is_err());
        assert_eq!(data_type(DType::BF16), cudaDataType::CUDA_R_16BF);
    }
}
