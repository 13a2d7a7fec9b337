//! [`CudaLayerOps`]: the GPU's [`LayerOps`] (and, through [`CudaKernels`], its kernel backend):
//! typed wrappers over the model program's row kernels (`kernels/model.cu`), cuBLAS GEMMs with
//! f32 accumulation (`gemm.rs`), and paged attention and the cache ops of [`CudaKernels`].
//!
//! Each wrapper checks every buffer it hands a kernel against the rows and widths the kernel
//! will touch, and takes device indices only as [`DeviceIndices`] checked against what they
//! index, so no launch can reach past a buffer: the `unsafe` of a launch stays in this file,
//! beside the kernel signature its SAFETY comment cites.
//!
//! f32 buffers hold the residual stream, Q/K/V, the attention output and logits; half buffers
//! ([`LayerOps::Gemm`], raw 16-bit words of the model's bf16 or f16) hold what a GEMM reads and
//! the gate/up output.

use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use kv_cache::DType;

use super::error::CudaError;
use super::gemm::{LinearCall, linear};
use super::indices::DeviceIndices;
use super::kernels::{ARGMAX_ENTRY, ARGMAX_THREADS, SOFTCAP_ENTRY, cast_entry, model_entry, model_program};
use super::runtime::CudaKernels;
use crate::backend::WrapsKernels;
use crate::cpu::act::Activation;
use crate::layer_ops::{LayerOps, LinearShape, RmsNorm, RotaryShape};

/// Threads per block of the row kernels (a multiple of 32, as `block_sum` needs).
const ROW_THREADS: u32 = 256;
/// Threads per block of the rotary kernel (one block a token).
const ROTARY_THREADS: u32 = 128;
/// Most blocks a grid-stride kernel is launched with.
const MAX_STRIDE_BLOCKS: usize = 65_535;

/// The model kernels one forward launches, loaded once for the model's half type.
#[derive(Debug)]
struct Functions {
    embedding: CudaFunction,
    rms_norm: CudaFunction,
    rotary: CudaFunction,
    silu_mul: CudaFunction,
    gelu_tanh_mul: CudaFunction,
    add_bias: CudaFunction,
    add_into: CudaFunction,
    head_norm: CudaFunction,
    cast_to_half: CudaFunction,
    softcap: CudaFunction,
    argmax: CudaFunction,
}

impl Functions {
    fn load(kernels: &CudaKernels, half: DType) -> Result<Self, CudaError> {
        let program = model_program();
        let f = |name: String| kernels.function(&program, &name);
        Ok(Functions {
            embedding: f(model_entry("embedding_f32out", half))?,
            rms_norm: f(model_entry("rms_norm_f32in", half))?,
            rotary: f(model_entry("rotary", DType::F32))?,
            silu_mul: f(model_entry("silu_mul", half))?,
            gelu_tanh_mul: f(model_entry("gelu_tanh_mul", half))?,
            add_bias: f(model_entry("add_bias_f32out", half))?,
            add_into: f(model_entry("add_into_f32", half))?,
            head_norm: f(model_entry("rms_norm_heads_f32", half))?,
            cast_to_half: f(cast_entry(DType::F32, half))?,
            softcap: f(SOFTCAP_ENTRY.to_owned())?,
            argmax: f(ARGMAX_ENTRY.to_owned())?,
        })
    }
}

/// The rotation of this step's tokens on the device: `cos_sin` `[positions, head_dim]` (cos of
/// the `head_dim / 2` frequencies, then their sin) read at each token's position.
#[derive(Debug, Clone, Copy)]
pub struct DeviceRotation<'a> {
    pub cos_sin: &'a CudaSlice<f32>,
    pub positions: &'a DeviceIndices<i64>,
}

/// The GPU's ops for a model of one half type (bf16 or f16): kernels, loaded functions and a
/// cuBLAS handle on the device's stream.
#[derive(Debug)]
pub struct CudaLayerOps {
    kernels: Arc<CudaKernels>,
    blas: CudaBlas,
    half: DType,
    functions: Functions,
}

/// `v` as the `i32` a kernel takes its lengths in.
fn int(v: usize) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| CudaError::InvalidArgument(format!("{v} exceeds i32")))
}

/// `v` as the `i64` a grid-stride kernel takes its length in.
fn long(v: usize) -> Result<i64, CudaError> {
    i64::try_from(v).map_err(|_| CudaError::InvalidArgument(format!("{v} exceeds i64")))
}

/// One block of `threads` per row, `rows` of them.
fn rows_launch(rows: usize, threads: u32) -> Result<LaunchConfig, CudaError> {
    let grid = u32::try_from(rows).map_err(|_| CudaError::InvalidArgument(format!("{rows} rows")))?;
    Ok(LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 })
}

/// A grid-stride launch over `n` elements.
fn stride_launch(n: usize) -> Result<LaunchConfig, CudaError> {
    rows_launch(n.div_ceil(ROW_THREADS as usize).clamp(1, MAX_STRIDE_BLOCKS), ROW_THREADS)
}

/// `what` must hold at least `need` elements.
fn fits(what: &str, len: usize, need: usize) -> Result<(), CudaError> {
    if len >= need {
        Ok(())
    } else {
        Err(CudaError::InvalidArgument(format!("{what} holds {len} elements, the launch needs {need}")))
    }
}

impl CudaLayerOps {
    /// Loads the model kernels for `half` (bf16 or f16) and opens cuBLAS on the device's stream.
    pub fn new(kernels: Arc<CudaKernels>, half: DType) -> Result<Self, CudaError> {
        if half == DType::F32 {
            return Err(CudaError::Unsupported("f32 GEMM inputs on the GPU (use bf16 or f16)".into()));
        }
        // SAFETY: only tries to dlopen libcublas by its candidate names.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(CudaError::CublasMissing);
        }
        let blas = CudaBlas::new(kernels.device().stream().clone())?;
        disallow_reduced_precision_reduction(&blas)?;
        let functions = Functions::load(&kernels, half)?;
        Ok(Self { kernels, blas, half, functions })
    }

    /// The half type of the GEMM inputs and weights.
    pub fn half(&self) -> DType {
        self.half
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.kernels.device().stream()
    }

    /// `out[..n]` (half) = `x[..n]` (f32): the attention output as the O projection reads it.
    pub fn cast_to_half(
        &self,
        out: &mut CudaSlice<u16>,
        x: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        fits("cast output", out.len(), n)?;
        fits("cast input", x.len(), n)?;
        let len = long(n)?;
        let mut b = self.stream().launch_builder(&self.functions.cast_to_half);
        b.arg(out).arg(x).arg(&len);
        // SAFETY: cast_f32_to_half(out[n], in[n], n), grid-stride over n elements of both (checked).
        unsafe { b.launch(stride_launch(n)?) }?;
        Ok(())
    }

    /// `out[r]` = the first index of the largest logit of row `r` of `logits[rows, vocab]`
    /// (`u32::MAX` for a row with nothing above -inf): greedy sampling on the device.
    pub fn argmax(
        &self,
        out: &mut CudaSlice<u32>,
        logits: &CudaSlice<f32>,
        rows: usize,
        vocab: usize,
    ) -> Result<(), CudaError> {
        fits("greedy tokens", out.len(), rows)?;
        fits("logits", logits.len(), rows * vocab)?;
        if rows == 0 {
            return Ok(());
        }
        let vocab = long(vocab)?;
        let mut b = self.stream().launch_builder(&self.functions.argmax);
        b.arg(out).arg(logits).arg(&vocab);
        // SAFETY: argmax_rows_f32(out[rows], logits[rows, vocab], vocab), both checked above;
        // ARGMAX_THREADS is the kernel's shared-array size.
        unsafe { b.launch(rows_launch(rows, ARGMAX_THREADS)?) }?;
        Ok(())
    }

    /// One GEMM over device addresses the caller checked: `out` of `out_dtype`.
    fn gemm(
        &self,
        weight: CudaView<'_, u16>,
        x: &CudaSlice<u16>,
        out: u64,
        out_dtype: DType,
        s: LinearShape,
    ) -> Result<(), CudaError> {
        fits("GEMM weight", weight.len(), s.out_dim * s.in_dim)?;
        fits("GEMM input", x.len(), s.rows * s.in_dim)?;
        if s.rows == 0 {
            return Ok(());
        }
        let stream = self.stream();
        let call = LinearCall {
            weight: weight.device_ptr(stream).0,
            input: x.device_ptr(stream).0,
            output: out,
            half: self.half,
            out_dtype,
            rows: s.rows,
            out_dim: s.out_dim,
            in_dim: s.in_dim,
            accumulate: s.accumulate,
        };
        // SAFETY: the weight holds out_dim·in_dim and the input rows·in_dim half elements
        // (checked above), the output rows·out_dim elements of out_dtype (checked by the caller).
        unsafe { linear(&self.blas, &call) }
    }
}

/// Keeps cuBLAS from reducing split-K partial sums in the half output type: the GEMMs that
/// write bf16/f16 must round once, at the end, as the CUDA forward's tolerance model assumes.
fn disallow_reduced_precision_reduction(blas: &CudaBlas) -> Result<(), CudaError> {
    use cudarc::cublas::sys::{cublasMath_t, cublasSetMathMode};
    // `CUBLAS_DEFAULT_MATH` (0) with the flag set: the flag's value is the whole mode.
    // SAFETY: the handle is live for `blas`'s lifetime and the call only sets a mode on it.
    unsafe {
        cublasSetMathMode(*blas.handle(), cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)
    }
    .result()?;
    Ok(())
}

impl LayerOps for CudaLayerOps {
    type Gemm = CudaSlice<u16>;
    type Matrix<'a> = CudaView<'a, u16>;
    type Vector<'a> = CudaView<'a, u16>;
    type Ids = DeviceIndices<u32>;
    type Indices = DeviceIndices<i32>;
    type Rotation<'a> = DeviceRotation<'a>;

    fn embed(
        &self,
        out: &mut CudaSlice<f32>,
        table: CudaView<'_, u16>,
        ids: &DeviceIndices<u32>,
        rows: usize,
        scale: f32,
    ) -> Result<(), CudaError> {
        let hidden = if ids.bound() == 0 { 0 } else { table.len() / ids.bound() };
        fits("token ids", ids.len(), rows)?;
        fits("embedding table", table.len(), ids.bound() * hidden)?;
        fits("embedding output", out.len(), rows * hidden)?;
        if rows == 0 {
            return Ok(());
        }
        let h = int(hidden)?;
        let mut b = self.stream().launch_builder(&self.functions.embedding);
        b.arg(out).arg(&table).arg(ids.buffer()).arg(&scale).arg(&h);
        // SAFETY: embedding_f32out(out f32[rows, h], table[bound, h], ids[rows], scale, h): every id
        // is below the table's rows (DeviceIndices), the buffers' lengths checked above.
        unsafe { b.launch(rows_launch(rows, ROW_THREADS)?) }?;
        Ok(())
    }

    fn rms_norm(
        &self,
        out: &mut CudaSlice<u16>,
        x: &CudaSlice<f32>,
        weight: CudaView<'_, u16>,
        gather: Option<&DeviceIndices<i32>>,
        rows: usize,
        norm: RmsNorm,
    ) -> Result<(), CudaError> {
        let h = norm.width;
        fits("norm weight", weight.len(), h)?;
        fits("norm output", out.len(), rows * h)?;
        let in_rows = match gather {
            Some(g) => {
                fits("gathered rows", g.len(), rows)?;
                g.bound()
            }
            None => rows,
        };
        fits("norm input", x.len(), in_rows * h)?;
        if rows == 0 {
            return Ok(());
        }
        let (offset, eps, hi) = (norm.offset, norm.eps as f32, int(h)?);
        let null: u64 = 0;
        let mut b = self.stream().launch_builder(&self.functions.rms_norm);
        b.arg(out).arg(x).arg(&weight);
        match gather {
            Some(g) => b.arg(g.buffer()),
            None => b.arg(&null),
        };
        b.arg(&offset).arg(&eps).arg(&hi);
        // SAFETY: rms_norm_f32in(out[rows, h], x f32[in_rows, h], weight[h], rows|null, offset,
        // eps, h): gathered indices are below in_rows (DeviceIndices), lengths checked above.
        unsafe { b.launch(rows_launch(rows, ROW_THREADS)?) }?;
        Ok(())
    }

    fn rms_norm_in_place(
        &self,
        x: &mut CudaSlice<f32>,
        weight: CudaView<'_, u16>,
        rows: usize,
        norm: RmsNorm,
    ) -> Result<(), CudaError> {
        fits("norm weight", weight.len(), norm.width)?;
        fits("normed rows", x.len(), rows * norm.width)?;
        if rows == 0 {
            return Ok(());
        }
        let (offset, eps, d) = (norm.offset, norm.eps as f32, int(norm.width)?);
        let mut b = self.stream().launch_builder(&self.functions.head_norm);
        b.arg(x).arg(&weight).arg(&offset).arg(&eps).arg(&d);
        // SAFETY: rms_norm_heads_f32(x f32[rows, d], weight[d], offset, eps, d), lengths checked.
        unsafe { b.launch(rows_launch(rows, ROW_THREADS)?) }?;
        Ok(())
    }

    fn linear(
        &self,
        out: &mut CudaSlice<f32>,
        x: &CudaSlice<u16>,
        weight: CudaView<'_, u16>,
        s: LinearShape,
    ) -> Result<(), CudaError> {
        fits("GEMM output", out.len(), s.rows * s.out_dim)?;
        let out_ptr = out.device_ptr_mut(self.stream()).0;
        self.gemm(weight, x, out_ptr, DType::F32, s)
    }

    fn linear_to_gemm(
        &self,
        out: &mut CudaSlice<u16>,
        x: &CudaSlice<u16>,
        weight: CudaView<'_, u16>,
        s: LinearShape,
    ) -> Result<(), CudaError> {
        fits("GEMM output", out.len(), s.rows * s.out_dim)?;
        let out_ptr = out.device_ptr_mut(self.stream()).0;
        self.gemm(weight, x, out_ptr, self.half, s)
    }

    fn add_bias(
        &self,
        out: &mut CudaSlice<f32>,
        bias: CudaView<'_, u16>,
        rows: usize,
        width: usize,
    ) -> Result<(), CudaError> {
        fits("bias", bias.len(), width)?;
        fits("biased rows", out.len(), rows * width)?;
        if rows == 0 {
            return Ok(());
        }
        let w = int(width)?;
        let mut b = self.stream().launch_builder(&self.functions.add_bias);
        b.arg(out).arg(&bias).arg(&w);
        // SAFETY: add_bias_f32out(out f32[rows, width], bias[width], width), lengths checked.
        unsafe { b.launch(rows_launch(rows, ROW_THREADS)?) }?;
        Ok(())
    }

    fn rotary(
        &self,
        q: &mut CudaSlice<f32>,
        k: &mut CudaSlice<f32>,
        rotation: DeviceRotation<'_>,
        s: RotaryShape,
    ) -> Result<(), CudaError> {
        let (q_w, k_w) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        if s.head_dim == 0 || !s.head_dim.is_multiple_of(2) {
            return Err(CudaError::InvalidArgument(format!("rotary embedding of head size {}", s.head_dim)));
        }
        fits("rotated queries", q.len(), s.tokens * q_w)?;
        fits("rotated keys", k.len(), s.tokens * k_w)?;
        fits("positions", rotation.positions.len(), s.tokens)?;
        fits("rotation table", rotation.cos_sin.len(), rotation.positions.bound() * s.head_dim)?;
        if s.tokens == 0 {
            return Ok(());
        }
        let (nh, nkv, d) = (int(s.heads)?, int(s.kv_heads)?, int(s.head_dim)?);
        let (q_stride, k_stride) = (long(q_w)?, long(k_w)?);
        let mut b = self.stream().launch_builder(&self.functions.rotary);
        b.arg(q).arg(k).arg(rotation.cos_sin).arg(rotation.positions.buffer());
        b.arg(&nh).arg(&nkv).arg(&d).arg(&q_stride).arg(&k_stride);
        // SAFETY: rotary_f32(q[t, nh, d], k[t, nkv, d], cos_sin[bound, d], positions[t], ...):
        // positions are below the table's rows (DeviceIndices), lengths checked above.
        unsafe { b.launch(rows_launch(s.tokens, ROTARY_THREADS)?) }?;
        Ok(())
    }

    fn gated_act(
        &self,
        out: &mut CudaSlice<u16>,
        gate_up: &CudaSlice<u16>,
        rows: usize,
        inter: usize,
        act: Activation,
    ) -> Result<(), CudaError> {
        fits("activation output", out.len(), rows * inter)?;
        fits("gate/up rows", gate_up.len(), rows * 2 * inter)?;
        if rows == 0 || inter == 0 {
            return Ok(());
        }
        let (inter_i, stride) = (int(inter)?, long(2 * inter)?);
        let (gate, up) = (gate_up.slice(..), gate_up.slice(inter..));
        let mut b = self.stream().launch_builder(match act {
            Activation::Silu => &self.functions.silu_mul,
            Activation::GeluTanh => &self.functions.gelu_tanh_mul,
        });
        b.arg(out).arg(&gate).arg(&up).arg(&inter_i).arg(&stride);
        // SAFETY: gated(out[rows, inter], gate, up, inter, in_stride = 2·inter): row r reads
        // gate_up[r, 0..2·inter], inside the rows·2·inter elements checked above.
        unsafe { b.launch(rows_launch(rows, ROW_THREADS)?) }?;
        Ok(())
    }

    fn add(&self, out: &mut CudaSlice<f32>, x: &CudaSlice<u16>, len: usize) -> Result<(), CudaError> {
        fits("sum", out.len(), len)?;
        fits("addend", x.len(), len)?;
        let n = long(len)?;
        let mut b = self.stream().launch_builder(&self.functions.add_into);
        b.arg(out).arg(x).arg(&n);
        // SAFETY: add_into_f32(out f32[n], x[n], n), grid-stride over n elements of both (checked).
        unsafe { b.launch(stride_launch(len)?) }?;
        Ok(())
    }

    fn softcap(&self, x: &mut CudaSlice<f32>, cap: f32, len: usize) -> Result<(), CudaError> {
        fits("soft-capped values", x.len(), len)?;
        let n = long(len)?;
        let mut b = self.stream().launch_builder(&self.functions.softcap);
        b.arg(x).arg(&cap).arg(&n);
        // SAFETY: softcap_f32(x[n], cap, n), grid-stride over n elements (checked).
        unsafe { b.launch(stride_launch(len)?) }?;
        Ok(())
    }
}

/// Attention and the cache's block moves are [`CudaKernels`]'.
impl WrapsKernels for CudaLayerOps {
    type Kernels = CudaKernels;
    fn kernels(&self) -> &CudaKernels {
        &self.kernels
    }
}
