//! [`CudaModel`]: a decoder on one GPU (weights, kernels, cuBLAS handle, activation buffers),
//! and one step of the one forward (`crate::forward::run`, its ops in `ops.rs`) from the same
//! [`ModelInput`] the CPU takes (prefill chunks and decodes mixed in one flat batch), over a
//! [`CudaKvCache`] (the profiling forward that vLLM-style KV sizing measures is `profile`'s).
//! After the step, one copy of the sampled rows' f32 logits into page-locked host memory
//! ([`CudaModel::forward`]), or of their greedy tokens, picked on the device
//! ([`CudaModel::forward_greedy`]).

use std::sync::Arc;

use attn_kernels::cuda::ops::DeviceSlotMapping;
use attn_kernels::cuda::{CudaDevice, CudaKernels, CudaLayerOps, DeviceAttnMetadata};
use cudarc::driver::{CudaSlice, CudaStream, PinnedHostSlice};
use kv_cache::DType;
use kv_cache::cuda::CudaKvCache;

use super::activations::Activations;
use super::batch::{BatchLimits, check_batch};
use super::error::CudaModelError;
use super::ops::{CudaStep, StepModel};
use super::rope_table::cos_sin_table;
use super::weights::DeviceWeights;
use crate::arch::RopeKind;
use crate::config::ModelConfig;
use crate::decoder::Model;
use crate::forward::{self, StepShape};
use crate::input::ModelInput;

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

/// A decoder on one GPU: weights, kernels, cuBLAS handle and activation buffers.
#[derive(Debug)]
pub struct CudaModel {
    config: ModelConfig,
    kernels: Arc<CudaKernels>,
    /// The op API every step calls (the model kernels, cuBLAS, attention).
    ops: CudaLayerOps,
    weights: DeviceWeights,
    /// `[positions, head_dim]` cos then sin per position, one table per [`RopeKind`].
    cos_sin: [CudaSlice<f32>; RopeKind::COUNT],
    limits: BatchLimits,
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
        let device: Arc<CudaDevice> = kernels.device().clone();
        let stream = device.stream().clone();
        device.context().bind_to_thread()?;
        let ops = CudaLayerOps::new(kernels.clone(), dtype)?;
        let weights = DeviceWeights::upload(model, &stream, dtype)?;
        let positions = limits.max_model_len.max(1);
        let table = |kind| stream.clone_htod(&cos_sin_table(model.rope(kind), positions));
        let cos_sin = [table(RopeKind::Global)?, table(RopeKind::Local)?];
        let act = Activations::new(&stream, &c, &limits)?;
        let logits_len = limits.max_samples.max(1).checked_mul(c.vocab_size).ok_or_else(|| {
            CudaModelError::InvalidInput(format!(
                "{} samples × {} logits overflow",
                limits.max_samples, c.vocab_size
            ))
        })?;
        // Every element read is first written by a device copy in `forward`.
        let host_logits = device.alloc_pinned::<f32>(logits_len)?;
        let host_tokens = device.alloc_pinned::<u32>(limits.max_samples.max(1))?;
        Ok(CudaModel {
            config: c,
            kernels,
            ops,
            weights,
            cos_sin,
            limits,
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
        self.ops.argmax(&mut self.act.greedy, &self.act.logits, s, self.config.vocab_size)?;
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
        let c = &self.config;
        self.act.ids.fill(&stream, input.token_ids, c.vocab_size)?;
        self.host_positions.clear();
        self.host_positions.extend(input.positions.iter().map(|&p| i64::from(p)));
        // Every rotation table holds max_model_len positions.
        self.act.positions.fill(&stream, &self.host_positions, self.limits.max_model_len.max(1))?;
        self.host_rows.clear();
        for &i in input.sample_indices {
            self.host_rows.push(
                i32::try_from(i).map_err(|_| CudaModelError::InvalidInput(format!("sampled row {i}")))?,
            );
        }
        self.act.sample_rows.fill(&stream, &self.host_rows, t)?;
        let shape = StepShape { arch: &c.arch, layers: &c.layer_attention, samples: s > 0, pools: false };
        let model = StepModel {
            config: c,
            ops: &self.ops,
            weights: &self.weights,
            cos_sin: &self.cos_sin,
            act: &mut self.act,
        };
        forward::run(&mut CudaStep { model, cache, slots, meta, tokens: t, samples: s }, shape)
    }
}
