//! [`CudaLlama`]: the forward pass of one step on the GPU, from the same [`ModelInput`] the CPU
//! forward takes (prefill chunks and decodes mixed in one flat batch), over a
//! [`CudaKvCache`] (the profiling forward that vLLM-style KV sizing measures is `profile`'s).
//!
//! Per layer: RMSNorm (f32 residual → half) · Q, K, V GEMMs (f32 out) · rotary (f32) ·
//! `reshape_and_cache` · paged attention (f32) · cast · O GEMM adding into the residual · RMSNorm ·
//! gate/up GEMM · SiLU·mul · down GEMM adding into the residual. Then the final norm of the
//! sampled rows only, the LM head for them only, and one copy of their f32 logits into
//! page-locked host memory ([`CudaLlama::forward`]), or of their greedy tokens, picked on the
//! device ([`CudaLlama::forward_greedy`]).

use std::sync::Arc;

use attn_kernels::backend::KernelBackend;
use attn_kernels::cuda::DeviceAttnMetadata;
use attn_kernels::cuda::kernels::{ARGMAX_ENTRY, ARGMAX_THREADS, cast_entry, model_entry, model_program};
use attn_kernels::cuda::ops::{AttnWorkspace, DeviceSlotMapping};
use attn_kernels::cuda::{CudaDevice, CudaKernels, Program};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use kv_cache::DType;
use kv_cache::cuda::CudaKvCache;

use super::batch::{BatchLimits, check_batch};
use super::error::CudaModelError;
use super::gemm::{LinearCall, linear};
use super::rope_table::cos_sin_table;
use super::weights::DeviceWeights;
use crate::config::LlamaConfig;
use crate::input::ModelInput;
use crate::llama::Llama;
use crate::rope::Rope;

/// Threads per block of the row kernels (a multiple of 32, as `block_sum` needs).
const ROW_THREADS: u32 = 256;

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
struct Functions {
    embedding: CudaFunction,
    rms_norm: CudaFunction,
    rotary: CudaFunction,
    silu_mul: CudaFunction,
    cast_attn: CudaFunction,
    argmax: CudaFunction,
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
            cast_attn: f(cast_entry(DType::F32, dtype))?,
            argmax: f(ARGMAX_ENTRY.to_owned())?,
        })
    }
}

/// Activation buffers for the largest step, allocated once.
#[derive(Debug)]
struct Activations {
    ids: CudaSlice<u32>,
    positions: CudaSlice<i64>,
    sample_rows: CudaSlice<i32>,
    /// f32 residual stream `[tokens, hidden]`.
    hidden: CudaSlice<f32>,
    /// Half `[tokens, hidden]` (normed input of a GEMM).
    normed: CudaSlice<u16>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    attn: CudaSlice<f32>,
    attn_half: CudaSlice<u16>,
    gate_up: CudaSlice<u16>,
    act: CudaSlice<u16>,
    sampled: CudaSlice<u16>,
    logits: CudaSlice<f32>,
    /// The greedy token of each sampled row (`forward_greedy`).
    greedy: CudaSlice<u32>,
    attn_ws: AttnWorkspace,
}

impl Activations {
    fn new(stream: &Arc<CudaStream>, c: &LlamaConfig, limits: &BatchLimits) -> Result<Self, CudaModelError> {
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

/// What a GEMM writes: f32 (overwriting, or adding into the residual stream) or the half type.
#[derive(Debug, Clone, Copy)]
enum Out {
    F32,
    AddF32,
    Half,
}

/// A Llama on one GPU: weights, kernels, cuBLAS handle and activation buffers.
#[derive(Debug)]
pub struct CudaLlama {
    config: LlamaConfig,
    kernels: Arc<CudaKernels>,
    blas: CudaBlas,
    weights: DeviceWeights,
    cos_sin: CudaSlice<f32>,
    limits: BatchLimits,
    functions: Functions,
    act: Activations,
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

fn addr<T>(s: &CudaSlice<T>, stream: &Arc<CudaStream>) -> u64 {
    s.device_ptr(stream).0
}

fn int(v: usize) -> Result<i32, CudaModelError> {
    i32::try_from(v).map_err(|_| CudaModelError::InvalidInput(format!("{v} exceeds i32")))
}

fn rows_launch(rows: usize, threads: u32) -> Result<LaunchConfig, CudaModelError> {
    let grid = u32::try_from(rows).map_err(|_| CudaModelError::InvalidInput(format!("{rows} rows")))?;
    Ok(LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 })
}

impl CudaLlama {
    /// Uploads `model` in `dtype` (bf16 or f16) to the device of `kernels` and allocates the
    /// activation buffers for `limits`. The host model can be dropped afterwards.
    pub fn new(
        model: &Llama,
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
        let cos_sin = stream.clone_htod(&cos_sin_table(&Rope::new(&c), positions))?;
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
        Ok(CudaLlama {
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

    pub fn config(&self) -> &LlamaConfig {
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

    fn stream(&self) -> Arc<CudaStream> {
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
        let vocab = self.config.vocab_size;
        let stream = self.stream();
        if s > 0 {
            stream.memcpy_dtoh(&self.act.logits.slice(..s * vocab), &mut self.host_logits)?;
        }
        stream.synchronize()?;
        // `check_batch` keeps `s` within `max_samples`, so the rows fit the buffer.
        Ok(&self.host_logits.as_slice()?[..s * vocab])
    }

    /// One step like [`CudaLlama::forward`], sampled greedily on the device: the greedy token of
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
            stream.memcpy_dtoh(&self.act.greedy.slice(..s), &mut self.host_tokens)?;
        }
        stream.synchronize()?;
        Ok(&self.host_tokens.as_slice()?[..s])
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

    /// Uploads ids, positions and sampled rows, then embedding, every layer and the LM head.
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

        self.embed(t)?;
        for l in 0..self.weights.layers.len() {
            self.layer(l, t, slots, meta, cache)?;
        }
        if s > 0 {
            self.lm_head(s)?;
        }
        Ok(())
    }

    fn embed(&mut self, t: usize) -> Result<(), CudaModelError> {
        let stream = self.stream();
        let h = int(self.config.hidden_size)?;
        let mut b = stream.launch_builder(&self.functions.embedding);
        b.arg(&mut self.act.hidden).arg(&self.weights.embed).arg(&self.act.ids).arg(&h);
        // SAFETY: embedding_f32out(out f32[t,h], table[vocab,h], ids[t], hidden); ids were
        // checked against the vocabulary, buffers hold max_tokens >= t rows.
        unsafe { b.launch(rows_launch(t, ROW_THREADS)?) }?;
        Ok(())
    }

    /// `out[rows] (half) = rms_norm(hidden[rows]) * weight`: a layer's input or post-attention
    /// norm into `normed`, or (`layer` None) the final norm of the sampled rows into `sampled`.
    fn rms_norm(&mut self, layer: Option<(usize, bool)>, rows: usize) -> Result<(), CudaModelError> {
        let stream = self.stream();
        let eps = self.config.rms_norm_eps as f32;
        let h = int(self.config.hidden_size)?;
        let weight = match layer {
            Some((l, false)) => &self.weights.layers[l].input_norm,
            Some((l, true)) => &self.weights.layers[l].post_attn_norm,
            None => &self.weights.final_norm,
        };
        let gather = layer.is_none();
        let null: u64 = 0;
        let out = if gather { &mut self.act.sampled } else { &mut self.act.normed };
        let mut b = stream.launch_builder(&self.functions.rms_norm);
        b.arg(out).arg(&self.act.hidden).arg(weight);
        if gather {
            b.arg(&self.act.sample_rows);
        } else {
            b.arg(&null);
        }
        b.arg(&eps).arg(&h);
        // SAFETY: rms_norm_f32in(out[rows,h], x f32[.,h], weight[h], rows|null, eps, hidden);
        // gathered row indices were checked to be below the batch's token count.
        unsafe { b.launch(rows_launch(rows, ROW_THREADS)?) }?;
        Ok(())
    }

    /// `output[rows, out_dim] (+)= input[rows, in_dim] · weight[out_dim, in_dim]ᵀ` on device
    /// addresses; weight and input are of the model's half type.
    fn gemm(
        &self,
        weight: u64,
        input: u64,
        output: u64,
        [rows, out_dim, in_dim]: [usize; 3],
        out: Out,
    ) -> Result<(), CudaModelError> {
        let half = self.weights.dtype;
        let (out_dtype, accumulate) = match out {
            Out::F32 => (DType::F32, false),
            Out::AddF32 => (DType::F32, true),
            Out::Half => (half, false),
        };
        let call = LinearCall { weight, input, output, half, out_dtype, rows, out_dim, in_dim, accumulate };
        // SAFETY: every caller passes buffers sized for the batch (allocated for max_tokens /
        // max_samples rows) and weights of exactly out_dim x in_dim elements.
        unsafe { linear(&self.blas, &call) }
    }

    fn layer(
        &mut self,
        l: usize,
        t: usize,
        slots: &DeviceSlotMapping,
        meta: &DeviceAttnMetadata,
        cache: &mut CudaKvCache,
    ) -> Result<(), CudaModelError> {
        let stream = self.stream();
        let c = &self.config;
        let (h, d, nh, nkv, inter) =
            (c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size);
        let (q_w, kv_w) = (nh * d, nkv * d);
        let w = &self.weights.layers[l];
        let [qkv, o_proj, gate_up, down] = [&w.qkv, &w.o_proj, &w.gate_up, &w.down].map(|w| addr(w, &stream));
        // The fused weight holds Q's rows, then K's, then V's (2 bytes a half element).
        let (k_rows, v_rows) = (qkv + (q_w * h * 2) as u64, qkv + ((q_w + kv_w) * h * 2) as u64);

        self.rms_norm(Some((l, false)), t)?;
        let normed = addr(&self.act.normed, &stream);
        self.gemm(qkv, normed, addr(&self.act.q, &stream), [t, q_w, h], Out::F32)?;
        self.gemm(k_rows, normed, addr(&self.act.k, &stream), [t, kv_w, h], Out::F32)?;
        self.gemm(v_rows, normed, addr(&self.act.v, &stream), [t, kv_w, h], Out::F32)?;

        let (nh_i, nkv_i, d_i) = (int(nh)?, int(nkv)?, int(d)?);
        let (q_stride, k_stride) = (q_w as i64, kv_w as i64);
        let mut b = stream.launch_builder(&self.functions.rotary);
        b.arg(&mut self.act.q)
            .arg(&mut self.act.k)
            .arg(&self.cos_sin)
            .arg(&self.act.positions)
            .arg(&nh_i)
            .arg(&nkv_i)
            .arg(&d_i)
            .arg(&q_stride)
            .arg(&k_stride);
        // SAFETY: rotary_f32(q[t,nh,d], k[t,nkv,d], cos_sin[max_pos,d], positions[t], ...);
        // positions were checked to be below the table's length.
        unsafe { b.launch(rows_launch(t, 128)?) }?;

        self.kernels.reshape_and_cache(&self.act.k, &self.act.v, slots, cache.layer_mut(l)?)?;
        let scale = 1.0 / (d as f32).sqrt();
        self.kernels.paged_attention(
            &mut self.act.attn,
            &self.act.q,
            cache.layer(l)?,
            meta,
            nh,
            scale,
            &mut self.act.attn_ws,
        )?;

        let n = (t * q_w) as i64;
        let mut b = stream.launch_builder(&self.functions.cast_attn);
        b.arg(&mut self.act.attn_half).arg(&self.act.attn).arg(&n);
        let blocks = (t * q_w).div_ceil(ROW_THREADS as usize).min(65_535);
        // SAFETY: cast_f32_to_half(out[n], in[n], n), grid-stride over n elements of both.
        unsafe { b.launch(rows_launch(blocks, ROW_THREADS)?) }?;

        let hidden = addr(&self.act.hidden, &stream);
        self.gemm(o_proj, addr(&self.act.attn_half, &stream), hidden, [t, h, q_w], Out::AddF32)?;

        self.rms_norm(Some((l, true)), t)?;
        self.gemm(gate_up, normed, addr(&self.act.gate_up, &stream), [t, 2 * inter, h], Out::Half)?;
        let (inter_i, stride) = (int(inter)?, (2 * inter) as i64);
        let gate = self.act.gate_up.slice(..);
        let up = self.act.gate_up.slice(inter..);
        let mut b = stream.launch_builder(&self.functions.silu_mul);
        b.arg(&mut self.act.act).arg(&gate).arg(&up).arg(&inter_i).arg(&stride);
        // SAFETY: silu_mul(out[t,inter], gate, up, inter, in_stride = 2·inter): row r reads
        // gate_up[r, 0..inter] and gate_up[r, inter..2·inter], inside the t rows written above.
        unsafe { b.launch(rows_launch(t, ROW_THREADS)?) }?;

        self.gemm(down, addr(&self.act.act, &stream), hidden, [t, h, inter], Out::AddF32)
    }

    fn lm_head(&mut self, s: usize) -> Result<(), CudaModelError> {
        self.rms_norm(None, s)?;
        let stream = self.stream();
        let (weight, input) = (addr(self.weights.lm_head(), &stream), addr(&self.act.sampled, &stream));
        let dims = [s, self.config.vocab_size, self.config.hidden_size];
        self.gemm(weight, input, addr(&self.act.logits, &stream), dims, Out::F32)
    }
}
