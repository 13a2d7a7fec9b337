//! [`CudaModel`]: a decoder on one GPU (weights, kernels, cuBLAS handle, activation buffers),
//! and one step of the one forward (`crate::forward::run`, its ops in `ops.rs`) from the same
//! [`ModelInput`] the CPU takes (prefill chunks and decodes mixed in one flat batch), over a
//! [`CudaKvCache`] (the profiling forward that vLLM-style KV sizing measures is `profile`'s).
//! After the step, one copy of the sampled rows' f32 logits into page-locked host memory
//! ([`CudaModel::forward`]), or of their greedy tokens, picked on the device
//! ([`CudaModel::forward_greedy`]).

use std::sync::Arc;

use attn_kernels::cuda::DeviceAttnMetadata;
use attn_kernels::cuda::kernels::{
    ARGMAX_ENTRY, ARGMAX_THREADS, SOFTCAP_ENTRY, cast_entry, model_entry, model_program,
};
use attn_kernels::cuda::ops::{AttnWorkspace, DeviceSlotMapping};
use attn_kernels::cuda::{CudaDevice, CudaKernels, Program};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PinnedHostSlice, PushKernelArg};
use kv_cache::DType;
use kv_cache::cuda::CudaKvCache;

use super::batch::{BatchLimits, check_batch};
use super::error::CudaModelError;
use super::ops::CudaStep;
use super::rope_table::cos_sin_table;
use super::weights::DeviceWeights;
use crate::arch::{LayerAttention, RopeKind};
use crate::config::ModelConfig;
use crate::decoder::Model;
use crate::forward::{self, StepShape};
use crate::input::ModelInput;

/// Threads per block of the row kernels (a multiple of 32, as `block_sum` needs).
pub(super) const ROW_THREADS: u32 = 256;

/// Keeps cuBLAS from reducing split-K partial sums in the half output type: the GEMMs that
/// write bf16/f16 must round once, at the end, as the tolerance model (`tolerance.rs`) assumes.
fn disallow_reduced_precision_reduction(blas: &CudaBlas) -> Result<(), CudaModelError> {
    use cudarc::cublas::sys::{cublasMath_t, cublasSetMathMode};
    // `CUBLAS_DEFAULT_MATH` (0) with the flag set: the flag's value is the whole mode.
    // SAFETY: the handle is live for `blas`'s lifetime and the call only sets a mode on it.
    unsafe {
        cublasSetMathMode(*blas.handle(), cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)
    }
    .result()?;
    Ok(())
}

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
    fn load(kernels: &CudaKernels, dtype: DType) -> Result<Self, CudaModelError> {
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

/// The first `n` elements of `device` in `host`, once the stream has run all the step's work
/// (the step's one synchronization): what a forward returns to the host.
fn read_back<'h, T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    device: &CudaSlice<T>,
    host: &'h mut PinnedHostSlice<T>,
    n: usize,
) -> Result<&'h [T], CudaModelError> {
    if n > 0 {
        stream.memcpy_dtoh(&device.slice(..n), host)?;
    }
    stream.synchronize()?;
    Ok(&host.as_slice()?[..n])
}

/// Activation buffers for the largest step, allocated once: the [`crate::forward::Buf`]s in the
/// element types this device computes them in.
#[derive(Debug)]
pub(super) struct Activations {
    pub ids: CudaSlice<u32>,
    pub positions: CudaSlice<i64>,
    pub sample_rows: CudaSlice<i32>,
    /// f32 residual stream `[tokens, hidden]`.
    pub hidden: CudaSlice<f32>,
    /// Half `[tokens, hidden]` (normed input of a GEMM).
    pub normed: CudaSlice<u16>,
    pub q: CudaSlice<f32>,
    pub k: CudaSlice<f32>,
    pub v: CudaSlice<f32>,
    pub attn: CudaSlice<f32>,
    pub attn_half: CudaSlice<u16>,
    pub gate_up: CudaSlice<u16>,
    pub act: CudaSlice<u16>,
    pub sampled: CudaSlice<u16>,
    pub logits: CudaSlice<f32>,
    /// f32 `[tokens, hidden]`: a block's output before its sandwich norm (one element when the
    /// architecture has none).
    pub branch: CudaSlice<f32>,
    /// The greedy token of each sampled row (`forward_greedy`).
    pub greedy: CudaSlice<u32>,
    pub attn_ws: AttnWorkspace,
}

impl Activations {
    fn new(stream: &Arc<CudaStream>, c: &ModelConfig, limits: &BatchLimits) -> Result<Self, CudaModelError> {
        let t = limits.max_tokens.max(1);
        let s = limits.max_samples.max(1);
        let (h, q_w, kv_w, inter) = (
            c.hidden_size,
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
            c.intermediate_size,
        );
        Ok(Activations {
            ids: stream.alloc_zeros(t)?,
            positions: stream.alloc_zeros(t)?,
            sample_rows: stream.alloc_zeros(s)?,
            hidden: stream.alloc_zeros(t * h)?,
            normed: stream.alloc_zeros(t * h)?,
            q: stream.alloc_zeros(t * q_w)?,
            k: stream.alloc_zeros(t * kv_w)?,
            v: stream.alloc_zeros(t * kv_w)?,
            attn: stream.alloc_zeros(t * q_w)?,
            attn_half: stream.alloc_zeros(t * q_w)?,
            gate_up: stream.alloc_zeros(t * 2 * inter)?,
            act: stream.alloc_zeros(t * inter)?,
            sampled: stream.alloc_zeros(s * h)?,
            logits: stream.alloc_zeros(s * c.vocab_size)?,
            branch: stream.alloc_zeros(if c.arch.sandwich_norms { t * h } else { 1 })?,
            greedy: stream.alloc_zeros(s)?,
            attn_ws: AttnWorkspace::new(
                stream,
                t,
                c.num_attention_heads,
                c.head_dim,
                limits.max_model_len.max(limits.max_tokens),
            )?,
        })
    }
}

/// A decoder on one GPU: weights, kernels, cuBLAS handle and activation buffers.
#[derive(Debug)]
pub struct CudaModel {
    pub(super) config: ModelConfig,
    layer_attention: Arc<[LayerAttention]>,
    pub(super) kernels: Arc<CudaKernels>,
    pub(super) blas: CudaBlas,
    pub(super) weights: DeviceWeights,
    /// `[positions, head_dim]` cos then sin per position, one table per [`RopeKind`].
    pub(super) cos_sin: [CudaSlice<f32>; RopeKind::COUNT],
    limits: BatchLimits,
    pub(super) functions: Functions,
    pub(super) act: Activations,
    host_rows: Vec<i32>,
    host_positions: Vec<i64>,
    /// The sampled rows' logits on the host: page-locked (a copy at the bus's speed, no staging
    /// through a driver buffer), cached (not write-combined: the sampler reads it), sized for
    /// the largest step.
    host_logits: PinnedHostSlice<f32>,
    /// The sampled rows' greedy tokens on the host (page-locked too).
    host_tokens: PinnedHostSlice<u32>,
    /// Slot mapping and attention metadata of the last step: refilled in place every step
    /// (grown only when a batch outgrows them), so a warmed-up step allocates no device memory.
    slots: Option<DeviceSlotMapping>,
    meta: Option<DeviceAttnMetadata>,
}

pub(super) fn int(v: usize) -> Result<i32, CudaModelError> {
    i32::try_from(v).map_err(|_| CudaModelError::InvalidInput(format!("{v} exceeds i32")))
}

pub(super) fn rows_launch(rows: usize, threads: u32) -> Result<LaunchConfig, CudaModelError> {
    let grid = u32::try_from(rows).map_err(|_| CudaModelError::InvalidInput(format!("{rows} rows")))?;
    Ok(LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 })
}

impl CudaModel {
    /// Uploads `model` in `dtype` (bf16 or f16) to the device of `kernels` and allocates the
    /// activation buffers for `limits`. The host model can be dropped afterwards.
    pub fn new(
        model: &Model,
        kernels: Arc<CudaKernels>,
        dtype: DType,
        limits: BatchLimits,
    ) -> Result<Self, CudaModelError> {
        if dtype == DType::F32 {
            return Err(CudaModelError::Unsupported("f32 weights on the GPU (use bf16 or f16)".into()));
        }
        let c = model.config.clone();
        if !c.head_dim.is_multiple_of(2) || c.num_key_value_heads == 0 {
            return Err(CudaModelError::Unsupported(format!("head_dim {} / kv heads", c.head_dim)));
        }
        // SAFETY: only tries to dlopen libcublas by its candidate names.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(CudaModelError::CublasMissing);
        }
        let device: Arc<CudaDevice> = kernels.device().clone();
        let stream = device.stream().clone();
        device.context().bind_to_thread()?;
        let blas = CudaBlas::new(stream.clone())?;
        disallow_reduced_precision_reduction(&blas)?;
        let weights = DeviceWeights::upload(model, &stream, dtype)?;
        let positions = limits.max_model_len.max(1);
        let table = |kind| stream.clone_htod(&cos_sin_table(model.rope(kind), positions));
        let cos_sin = [table(RopeKind::Global)?, table(RopeKind::Local)?];
        let functions = Functions::load(&kernels, dtype)?;
        let act = Activations::new(&stream, &c, &limits)?;
        let logits_len = limits.max_samples.max(1).checked_mul(c.vocab_size).ok_or_else(|| {
            CudaModelError::InvalidInput(format!(
                "{} samples × {} logits overflow",
                limits.max_samples, c.vocab_size
            ))
        })?;
        // SAFETY: plain page-locked memory (flags 0: cached, readable at full speed by the host);
        // every element read is first written by a device copy in `forward`.
        let host_logits = unsafe { device.context().alloc_pinned_with_flags::<f32>(logits_len, 0) }?;
        // SAFETY: as above; every token read is first written by a device copy.
        let host_tokens =
            unsafe { device.context().alloc_pinned_with_flags::<u32>(limits.max_samples.max(1), 0) }?;
        Ok(CudaModel {
            layer_attention: c.layer_attention.clone().into(),
            config: c,
            kernels,
            blas,
            weights,
            cos_sin,
            limits,
            functions,
            act,
            host_rows: Vec::new(),
            host_positions: Vec::new(),
            host_logits,
            host_tokens,
            slots: None,
            meta: None,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
    pub fn limits(&self) -> &BatchLimits {
        &self.limits
    }
    pub fn kernels(&self) -> &Arc<CudaKernels> {
        &self.kernels
    }
    /// Device bytes of the weights.
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes()
    }

    pub(super) fn stream(&self) -> Arc<CudaStream> {
        self.kernels.device().stream().clone()
    }

    fn check_cache(&self, cache: &CudaKvCache) -> Result<(), CudaModelError> {
        let g = cache.config();
        let have = (cache.num_layers(), g.num_kv_heads, g.head_size);
        let want = (self.weights.layers.len(), self.config.num_key_value_heads, self.config.head_dim);
        if have != want {
            let ((l, k, d), (wl, wk, wd)) = (have, want);
            return Err(CudaModelError::InvalidInput(format!(
                "cache of {l} layers x {k} kv heads x {d} does not fit the model ({wl} x {wk} x {wd})"
            )));
        }
        if !Arc::ptr_eq(cache.stream(), self.kernels.device().stream()) {
            return Err(CudaModelError::InvalidInput("the cache lives on another device".into()));
        }
        Ok(())
    }

    /// One step: writes this step's K/V into `cache` and returns the logits
    /// `[sample_indices.len(), vocab]` as f32 on the host (the stream is synchronized).
    pub fn forward(
        &mut self,
        input: &ModelInput<'_>,
        cache: &mut CudaKvCache,
    ) -> Result<&[f32], CudaModelError> {
        let s = self.step(input, cache)?;
        // `check_batch` keeps `s` within `max_samples`, so the rows fit the buffer.
        read_back(&self.stream(), &self.act.logits, &mut self.host_logits, s * self.config.vocab_size)
    }

    /// One step like [`CudaModel::forward`], sampled greedily on the device: the greedy token of
    /// each sampled row (the first largest logit; `u32::MAX` for a row with nothing above -inf),
    /// so only `sample_indices.len()` ids cross the bus instead of their logits.
    pub fn forward_greedy(
        &mut self,
        input: &ModelInput<'_>,
        cache: &mut CudaKvCache,
    ) -> Result<&[u32], CudaModelError> {
        let s = self.step(input, cache)?;
        let stream = self.stream();
        if s > 0 {
            let vocab = i64::try_from(self.config.vocab_size)
                .map_err(|_| CudaModelError::InvalidInput("vocabulary size".into()))?;
            let mut b = stream.launch_builder(&self.functions.argmax);
            b.arg(&mut self.act.greedy).arg(&self.act.logits).arg(&vocab);
            // SAFETY: argmax_rows_f32(out[s], logits[s, vocab], vocab): both buffers hold
            // max_samples >= s rows; ARGMAX_THREADS is the kernel's shared-array size.
            unsafe { b.launch(rows_launch(s, ARGMAX_THREADS)?) }?;
        }
        read_back(&stream, &self.act.greedy, &mut self.host_tokens, s)
    }

    /// The step up to the sampled rows' logits on the device; returns their number.
    fn step(&mut self, input: &ModelInput<'_>, cache: &mut CudaKvCache) -> Result<usize, CudaModelError> {
        check_batch(input, &self.limits, &self.config)?;
        self.check_cache(cache)?;
        let stream = self.stream();
        self.kernels.device().context().bind_to_thread()?;
        if input.num_tokens() == 0 {
            return Ok(0);
        }
        let cc = *cache.config();
        let slots = match self.slots.take() {
            Some(mut s) => s.reupload(&stream, input.slot_mapping, cc.num_slots()).map(|()| s),
            None => DeviceSlotMapping::upload(&stream, input.slot_mapping, cc.num_slots()),
        }?;
        // The block table persists on the device too: only the rows written since the last
        // step go up (a decode step writes one id per sequence that opened a block).
        let meta = match self.meta.take() {
            Some(mut m) => m
                .reupload(&stream, &input.attn, input.changed_rows.clone(), cc.block_size, cc.num_blocks)
                .map(|()| m),
            None => DeviceAttnMetadata::upload(&stream, &input.attn, cc.block_size, cc.num_blocks),
        }?;
        let result = self.run_layers(input, &slots, &meta, cache);
        self.slots = Some(slots);
        self.meta = Some(meta);
        result?;
        Ok(input.sample_indices.len())
    }

    /// Uploads ids, positions and sampled rows, then runs the one forward over this device's ops.
    fn run_layers(
        &mut self,
        input: &ModelInput<'_>,
        slots: &DeviceSlotMapping,
        meta: &DeviceAttnMetadata,
        cache: &mut CudaKvCache,
    ) -> Result<(), CudaModelError> {
        let stream = self.stream();
        let t = input.num_tokens();
        let s = input.sample_indices.len();
        stream.memcpy_htod(input.token_ids, &mut self.act.ids.slice_mut(..t))?;
        self.host_positions.clear();
        self.host_positions.extend(input.positions.iter().map(|&p| i64::from(p)));
        stream.memcpy_htod(&self.host_positions[..], &mut self.act.positions.slice_mut(..t))?;
        self.host_rows.clear();
        for &i in input.sample_indices {
            self.host_rows.push(int(i)?);
        }
        if s > 0 {
            stream.memcpy_htod(&self.host_rows[..], &mut self.act.sample_rows.slice_mut(..s))?;
        }
        let arch = self.config.arch;
        // Shared, not borrowed: the step borrows the model mutably.
        let layers = Arc::clone(&self.layer_attention);
        let shape = StepShape { arch: &arch, layers: &layers, samples: s > 0 };
        forward::run(&mut CudaStep { model: self, cache, slots, meta, tokens: t, samples: s }, shape)
    }
}
