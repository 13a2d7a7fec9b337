//! [`DecoderOps`] on CUDA: the one forward's ops as calls of the GPU's op API
//! ([`CudaLayerOps`]: the model kernels' typed wrappers, cuBLAS GEMMs with f32 accumulation,
//! `reshape_and_cache` and paged attention) over this model's activation buffers and weights.
//!
//! The residual stream ([`Buf::Hidden`]), Q, K, V, the attention output, a block's output before
//! its sandwich norm ([`Buf::Branch`]) and the logits are f32; the GEMM inputs ([`Buf::Normed`],
//! [`Buf::Act`], [`Buf::Sampled`] and a half copy of the attention output) are the model's half
//! type, and so is the gate/up output. The GEMMs that join the residual stream add into it in
//! f32 (`beta = 1`); a sandwich-normed branch joins it through `add`.

use attn_kernels::AttnScores;
use attn_kernels::backend::KernelBackend;
use attn_kernels::cpu::act::Activation;
use attn_kernels::cuda::ops::DeviceSlotMapping;
use attn_kernels::cuda::{CudaLayerOps, DeviceAttnMetadata, DeviceRotation};
use attn_kernels::layer_ops::{LayerOps, LinearShape, RmsNorm, RotaryShape};
use cudarc::driver::{CudaSlice, CudaView};
use kv_cache::cuda::CudaKvCache;

use super::activations::Activations;
use super::error::CudaModelError;
use super::weights::DeviceWeights;
use crate::arch::{LayerMatrix, RopeKind};
use crate::config::ModelConfig;
use crate::forward::{Buf, DecoderOps, LinearOut, MatrixId, NormId};

/// What a step's ops run on, borrowed from the model for the step: its config, op API and
/// weights, and its activation buffers, the only part a step writes.
pub(super) struct StepModel<'a> {
    pub config: &'a ModelConfig,
    pub ops: &'a CudaLayerOps,
    pub weights: &'a DeviceWeights,
    /// `[positions, head_dim]` cos then sin per position, one table per [`RopeKind`].
    pub cos_sin: &'a [CudaSlice<f32>; RopeKind::COUNT],
    pub act: &'a mut Activations,
}

/// One CUDA step: the model's buffers and weights, the cache and this step's uploaded metadata.
pub(super) struct CudaStep<'a> {
    pub model: StepModel<'a>,
    pub cache: &'a mut CudaKvCache,
    pub slots: &'a DeviceSlotMapping,
    pub meta: &'a DeviceAttnMetadata,
    pub tokens: usize,
    pub samples: usize,
}

fn norm_weight(w: &DeviceWeights, norm: NormId) -> Result<CudaView<'_, u16>, CudaModelError> {
    let weight = match norm {
        NormId::Final => Some(&w.final_norm),
        NormId::Layer(l, n) => w.layers.get(l).and_then(|layer| layer.norm(n)),
    };
    weight
        .map(|w| w.slice(..))
        .ok_or_else(|| CudaModelError::InvalidInput(format!("the model has no norm {norm:?}")))
}

fn unsupported<T>(what: String) -> Result<T, CudaModelError> {
    Err(CudaModelError::Unsupported(format!("{what} on CUDA")))
}

/// A matrix of the model: its shape, weight and bias.
struct Matrix<'w> {
    out_dim: usize,
    in_dim: usize,
    weight: &'w CudaSlice<u16>,
    bias: Option<&'w CudaSlice<u16>>,
}

impl CudaStep<'_> {
    fn rms(&self, width: usize) -> RmsNorm {
        let c = self.model.config;
        RmsNorm { width, offset: c.arch.norm_weight_offset, eps: c.rms_norm_eps }
    }

    fn rows(&self, b: Buf) -> usize {
        if matches!(b, Buf::Sampled | Buf::Logits) { self.samples } else { self.tokens }
    }

    /// The fused Q/K/V projection as one GEMM per part, at its rows of the fused weight and bias.
    fn linear_split(&mut self, parts: [Buf; 3], input: Buf, matrix: MatrixId) -> Result<(), CudaModelError> {
        let c = self.model.config;
        let (q_w, kv_w) = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
        if parts != [Buf::Q, Buf::K, Buf::V] || input != Buf::Normed {
            return unsupported(format!("a fused projection of {input:?} into {parts:?}"));
        }
        let (rows, ops) = (self.tokens, self.model.ops);
        let (config, weights) = (self.model.config, self.model.weights);
        let m = matrix_of(config, weights, matrix)?;
        let act = &mut *self.model.act;
        let mut first_row = 0;
        for (out, part_rows) in [&mut act.q, &mut act.k, &mut act.v].into_iter().zip([q_w, kv_w, kv_w]) {
            let rows_range = first_row * m.in_dim..(first_row + part_rows) * m.in_dim;
            let w = m.weight.try_slice(rows_range).ok_or_else(|| short("fused weight"))?;
            let shape = LinearShape { rows, out_dim: part_rows, in_dim: m.in_dim, accumulate: false };
            ops.linear(out, &act.normed, w, shape)?;
            if let Some(bias) = m.bias {
                let b =
                    bias.try_slice(first_row..first_row + part_rows).ok_or_else(|| short("fused bias"))?;
                ops.add_bias(out, b, rows, part_rows)?;
            }
            first_row += part_rows;
        }
        debug_assert_eq!(first_row, m.out_dim);
        Ok(())
    }
}

/// The shape, weight and bias of matrix `m`.
fn matrix_of<'w>(
    config: &ModelConfig,
    weights: &'w DeviceWeights,
    m: MatrixId,
) -> Result<Matrix<'w>, CudaModelError> {
    let (h, q_w) = (config.hidden_size, config.num_attention_heads * config.head_dim);
    Ok(match m {
        MatrixId::LmHead => {
            Matrix { out_dim: config.vocab_size, in_dim: h, weight: weights.lm_head(), bias: None }
        }
        MatrixId::Layer(l, m) => {
            let layer =
                weights.layers.get(l).ok_or_else(|| CudaModelError::InvalidInput(format!("layer {l}")))?;
            let [out_dim, in_dim] = match m {
                LayerMatrix::Qkv => [config.qkv_size(), h],
                LayerMatrix::O => [h, q_w],
                LayerMatrix::GateUp => [2 * config.intermediate_size, h],
                LayerMatrix::Down => [h, config.intermediate_size],
            };
            Matrix { out_dim, in_dim, weight: layer.matrix(m), bias: layer.bias(m) }
        }
    })
}

fn short(what: &str) -> CudaModelError {
    CudaModelError::InvalidInput(format!("the {what} is shorter than the model's shape"))
}

impl DecoderOps for CudaStep<'_> {
    type Error = CudaModelError;

    fn embed(&mut self, scale: Option<f32>) -> Result<(), CudaModelError> {
        let m = &mut self.model;
        m.ops.embed(
            &mut m.act.hidden,
            m.weights.embed.slice(..),
            &m.act.ids,
            self.tokens,
            scale.unwrap_or(1.0),
        )?;
        Ok(())
    }

    fn rms_norm(&mut self, out: Buf, input: Buf, norm: NormId) -> Result<(), CudaModelError> {
        let (rows, rms) = (self.rows(out), self.rms(self.model.config.hidden_size));
        let m = &mut self.model;
        let weight = norm_weight(m.weights, norm)?;
        let act = &mut *m.act;
        match (input, out) {
            (Buf::Hidden, Buf::Sampled) => {
                m.ops.rms_norm(&mut act.sampled, &act.hidden, weight, Some(&act.sample_rows), rows, rms)
            }
            (Buf::Hidden, Buf::Normed) => {
                m.ops.rms_norm(&mut act.normed, &act.hidden, weight, None, rows, rms)
            }
            (Buf::Branch, Buf::Normed) => {
                m.ops.rms_norm(&mut act.normed, &act.branch, weight, None, rows, rms)
            }
            _ => return unsupported(format!("an RMSNorm of {input:?} into {out:?}")),
        }?;
        Ok(())
    }

    fn head_norm(&mut self, buf: Buf, norm: NormId) -> Result<(), CudaModelError> {
        let c = self.model.config;
        let (heads, rms) = match buf {
            Buf::Q => (c.num_attention_heads, self.rms(c.head_dim)),
            Buf::K => (c.num_key_value_heads, self.rms(c.head_dim)),
            other => return unsupported(format!("a per-head norm of {other:?}")),
        };
        let (rows, m) = (self.tokens * heads, &mut self.model);
        let weight = norm_weight(m.weights, norm)?;
        let x = if buf == Buf::Q { &mut m.act.q } else { &mut m.act.k };
        m.ops.rms_norm_in_place(x, weight, rows, rms)?;
        Ok(())
    }

    fn lora(&mut self, _: LinearOut, _: Buf, _: MatrixId) -> Result<(), CudaModelError> {
        // `check_batch` refuses a step with LoRA rows before any op runs.
        Ok(())
    }

    fn linear(&mut self, out: LinearOut, input: Buf, matrix: MatrixId) -> Result<(), CudaModelError> {
        let (target, accumulate) = match out {
            LinearOut::Write(b) => (b, false),
            LinearOut::Add(b) => (b, true),
            LinearOut::Split(parts) => return self.linear_split(parts, input, matrix),
        };
        let rows = self.rows(input);
        let Matrix { out_dim, in_dim, weight, bias } =
            matrix_of(self.model.config, self.model.weights, matrix)?;
        let shape = LinearShape { rows, out_dim, in_dim, accumulate };
        let (ops, w) = (self.model.ops, weight.slice(..));
        let act = &mut *self.model.act;
        let x = match input {
            Buf::Normed => &act.normed,
            Buf::Attn => &act.attn_half,
            Buf::Act => &act.act,
            Buf::Sampled => &act.sampled,
            other => return unsupported(format!("a GEMM reading {other:?}")),
        };
        let out = match (target, accumulate) {
            (Buf::GateUp, false) => return Ok(ops.linear_to_gemm(&mut act.gate_up, x, w, shape)?),
            (Buf::Hidden, true) => &mut act.hidden,
            (Buf::Logits, false) => &mut act.logits,
            (Buf::Branch, false) => &mut act.branch,
            (other, acc) => {
                return unsupported(format!(
                    "a GEMM {} {other:?}",
                    if acc { "adding into" } else { "writing" }
                ));
            }
        };
        ops.linear(out, x, w, shape)?;
        if let Some(bias) = bias {
            ops.add_bias(out, bias.slice(..), rows, out_dim)?;
        }
        Ok(())
    }

    fn rope(&mut self, kind: RopeKind) -> Result<(), CudaModelError> {
        let c = self.model.config;
        let shape = RotaryShape {
            tokens: self.tokens,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
        };
        let m = &mut self.model;
        let rotation = DeviceRotation { cos_sin: &m.cos_sin[kind as usize], positions: &m.act.positions };
        m.ops.rotary(&mut m.act.q, &mut m.act.k, rotation, shape)?;
        Ok(())
    }

    fn attention(&mut self, layer: usize, scores: AttnScores) -> Result<(), CudaModelError> {
        let m = &mut self.model;
        let heads = m.config.num_attention_heads;
        m.ops.reshape_and_cache(&m.act.k, &m.act.v, self.slots, self.cache.layer_mut(layer)?)?;
        m.ops.paged_attention(
            &mut m.act.attn,
            &m.act.q,
            self.cache.layer(layer)?,
            self.meta,
            heads,
            scores,
            &mut m.act.attn_ws,
        )?;
        // The O projection reads the attention output in the half type.
        m.ops.cast_to_half(&mut m.act.attn_half, &m.act.attn, self.tokens * heads * m.config.head_dim)?;
        Ok(())
    }

    fn gated_act(&mut self, kind: Activation) -> Result<(), CudaModelError> {
        let m = &mut self.model;
        m.ops.gated_act(&mut m.act.act, &m.act.gate_up, self.tokens, m.config.intermediate_size, kind)?;
        Ok(())
    }

    fn add(&mut self, out: Buf, input: Buf) -> Result<(), CudaModelError> {
        if (out, input) != (Buf::Hidden, Buf::Normed) {
            return unsupported(format!("adding {input:?} into {out:?}"));
        }
        let m = &mut self.model;
        m.ops.add(&mut m.act.hidden, &m.act.normed, self.tokens * m.config.hidden_size)?;
        Ok(())
    }

    fn softcap(&mut self, buf: Buf, cap: f32) -> Result<(), CudaModelError> {
        if buf != Buf::Logits {
            return unsupported(format!("soft-capping {buf:?}"));
        }
        let m = &mut self.model;
        m.ops.softcap(&mut m.act.logits, cap, self.samples * m.config.vocab_size)?;
        Ok(())
    }
}
