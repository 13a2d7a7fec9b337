//! [`Activations`]: the device buffers of one step, allocated once for the largest step the
//! model serves.

use std::sync::Arc;

use attn_kernels::cuda::DeviceIndices;
use attn_kernels::cuda::ops::AttnWorkspace;
use cudarc::driver::{CudaSlice, CudaStream};

use super::batch::BatchLimits;
use super::error::CudaModelError;
use crate::config::ModelConfig;

/// Activation buffers for the largest step, allocated once: the [`crate::forward::Buf`]s in the
/// element types this device computes them in.
#[derive(Debug)]
pub(super) struct Activations {
    /// Token ids, checked against the vocabulary on upload.
    pub ids: DeviceIndices<u32>,
    /// Positions, checked against the rotation tables' length on upload.
    pub positions: DeviceIndices<i64>,
    /// The sampled rows, checked against the step's tokens on upload.
    pub sample_rows: DeviceIndices<i32>,
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
    pub(super) fn new(
        stream: &Arc<CudaStream>,
        c: &ModelConfig,
        limits: &BatchLimits,
    ) -> Result<Self, CudaModelError> {
        let t = limits.max_tokens.max(1);
        let s = limits.max_samples.max(1);
        let (h, q_w, kv_w, inter) = (
            c.hidden_size,
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
            c.intermediate_size,
        );
        Ok(Activations {
            ids: DeviceIndices::new(stream, t)?,
            positions: DeviceIndices::new(stream, t)?,
            sample_rows: DeviceIndices::new(stream, s)?,
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
