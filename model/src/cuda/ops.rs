//! [`DecoderOps`] on CUDA: the one forward's ops as launches of `attn-kernels`' model kernels,
//! cuBLAS GEMMs with f32 accumulation, `reshape_and_cache` and paged attention.
//!
//! The residual stream ([`Buf::Hidden`]), Q, K, V, the attention output, a block's output before
//! its sandwich norm ([`Buf::Branch`]) and the logits are f32; the GEMM inputs ([`Buf::Normed`],
//! [`Buf::Act`], [`Buf::Sampled`] and a half copy of the attention output) are the model's half
//! type, and so is the gate/up output. The GEMMs that join the residual stream add into it in
//! f32 (`beta = 1`); a sandwich-normed branch joins it through `add_into_f32`.

use std::sync::Arc;

use attn_kernels::AttnScores;
use attn_kernels::backend::KernelBackend;
use attn_kernels::cpu::act::Activation;
use attn_kernels::cuda::ops::DeviceSlotMapping;
use attn_kernels::cuda::{CudaKernels, DeviceAttnMetadata};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, PushKernelArg};
use kv_cache::DType;
use kv_cache::cuda::CudaKvCache;

use super::activations::Activations;
use super::error::CudaModelError;
use super::gemm::{LinearCall, linear};
use super::launch::{Functions, ROW_THREADS, int, rows_launch};
use super::weights::DeviceWeights;
use crate::arch::{LayerMatrix, RopeKind};
use crate::config::ModelConfig;
use crate::forward::{Buf, DecoderOps, LinearOut, MatrixId, NormId};

/// What a step's ops launch on, borrowed from the model for the step: its config, kernels,
/// cuBLAS handle and weights, and its activation buffers, the only part a step writes.
pub(super) struct StepModel<'a> {
    pub config: &'a ModelConfig,
    pub kernels: &'a CudaKernels,
    pub blas: &'a CudaBlas,
    pub weights: &'a DeviceWeights,
    /// `[positions, head_dim]` cos then sin per position, one table per [`RopeKind`].
    pub cos_sin: &'a [CudaSlice<f32>; RopeKind::COUNT],
    pub functions: &'a Functions,
    pub act: &'a mut Activations,
}

impl StepModel<'_> {
    fn stream(&self) -> Arc<CudaStream> {
        self.kernels.device().stream().clone()
    }
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

fn norm_weight(w: &DeviceWeights, norm: NormId) -> Result<&CudaSlice<u16>, CudaModelError> {
    let weight = match norm {
        NormId::Final => Some(&w.final_norm),
        NormId::Layer(l, n) => w.layers.get(l).and_then(|layer| layer.norm(n)),
    };
    weight.ok_or_else(|| CudaModelError::InvalidInput(format!("the model has no norm {norm:?}")))
}

fn unsupported<T>(what: String) -> Result<T, CudaModelError> {
    Err(CudaModelError::Unsupported(format!("{what} on CUDA")))
}

impl CudaStep<'_> {
    fn addr<T>(&self, s: &CudaSlice<T>) -> u64 {
        s.device_ptr(self.model.kernels.device().stream()).0
    }

    /// A GEMM input: its device address (the model's half type).
    fn gemm_input(&self, b: Buf) -> Result<u64, CudaModelError> {
        let a = &self.model.act;
        match b {
            Buf::Normed => Ok(self.addr(&a.normed)),
            Buf::Attn => Ok(self.addr(&a.attn_half)),
            Buf::Act => Ok(self.addr(&a.act)),
            Buf::Sampled => Ok(self.addr(&a.sampled)),
            other => unsupported(format!("a GEMM reading {other:?}")),
        }
    }

    /// A GEMM output: address, element type, whether it adds into it.
    fn gemm_output(&self, b: Buf, accumulate: bool) -> Result<(u64, DType), CudaModelError> {
        let (a, half) = (&self.model.act, self.model.weights.dtype);
        match (b, accumulate) {
            (Buf::Hidden, true) => Ok((self.addr(&a.hidden), DType::F32)),
            (Buf::Q, false) => Ok((self.addr(&a.q), DType::F32)),
            (Buf::K, false) => Ok((self.addr(&a.k), DType::F32)),
            (Buf::V, false) => Ok((self.addr(&a.v), DType::F32)),
            (Buf::GateUp, false) => Ok((self.addr(&a.gate_up), half)),
            (Buf::Logits, false) => Ok((self.addr(&a.logits), DType::F32)),
            (Buf::Branch, false) => Ok((self.addr(&a.branch), DType::F32)),
            (other, acc) => {
                unsupported(format!("a GEMM {} {other:?}", if acc { "adding into" } else { "writing" }))
            }
        }
    }

    /// `[out_dim, in_dim]` of a matrix, its weight and its bias.
    fn matrix(&self, m: MatrixId) -> Result<([usize; 2], u64, Option<u64>), CudaModelError> {
        let (c, w) = (&self.model.config, &self.model.weights);
        let (h, q_w) = (c.hidden_size, c.num_attention_heads * c.head_dim);
        let (dims, weight, bias) = match m {
            MatrixId::LmHead => ([c.vocab_size, h], w.lm_head(), None),
            MatrixId::Layer(l, m) => {
                let layer =
                    w.layers.get(l).ok_or_else(|| CudaModelError::InvalidInput(format!("layer {l}")))?;
                let dims = match m {
                    LayerMatrix::Qkv => [c.qkv_size(), h],
                    LayerMatrix::O => [h, q_w],
                    LayerMatrix::GateUp => [2 * c.intermediate_size, h],
                    LayerMatrix::Down => [h, c.intermediate_size],
                };
                (dims, layer.matrix(m), layer.bias(m))
            }
        };
        Ok((dims, self.addr(weight), bias.map(|b| self.addr(b))))
    }

    /// `output[rows, out_dim] (+)= input[rows, in_dim] · weight[out_dim, in_dim]ᵀ` on device
    /// addresses; weight and input are of the model's half type.
    fn gemm(
        &self,
        weight: u64,
        input: u64,
        (output, out_dtype): (u64, DType),
        dims: [usize; 3],
        accumulate: bool,
    ) -> Result<(), CudaModelError> {
        let [rows, out_dim, in_dim] = dims;
        let half = self.model.weights.dtype;
        let call = LinearCall { weight, input, output, half, out_dtype, rows, out_dim, in_dim, accumulate };
        // SAFETY: every buffer is allocated for max_tokens / max_samples rows (the batch was
        // checked against them) and every weight holds exactly out_dim x in_dim elements.
        unsafe { linear(self.model.blas, &call) }
    }

    /// `out[rows, width] += bias[width]` (f32 out, half bias).
    fn add_bias(&self, out: u64, bias: u64, rows: usize, width: usize) -> Result<(), CudaModelError> {
        let stream = self.model.stream();
        let width = int(width)?;
        let mut b = stream.launch_builder(&self.model.functions.add_bias);
        b.arg(&out).arg(&bias).arg(&width);
        // SAFETY: add_bias_f32out(out f32[rows, width], bias[width], width): `out` holds `rows`
        // rows of `width` (a GEMM just wrote them), `bias` one row of the weights' type.
        unsafe { b.launch(rows_launch(rows, ROW_THREADS)?) }?;
        Ok(())
    }

    fn rows(&self, b: Buf) -> usize {
        if matches!(b, Buf::Sampled | Buf::Logits) { self.samples } else { self.tokens }
    }
}

impl DecoderOps for CudaStep<'_> {
    type Error = CudaModelError;

    fn embed(&mut self, scale: Option<f32>) -> Result<(), CudaModelError> {
        let stream = self.model.stream();
        let (h, scale) = (int(self.model.config.hidden_size)?, scale.unwrap_or(1.0));
        let (act, weights) = (&mut self.model.act, &self.model.weights);
        let mut b = stream.launch_builder(&self.model.functions.embedding);
        b.arg(&mut act.hidden).arg(&weights.embed).arg(&act.ids).arg(&scale).arg(&h);
        // SAFETY: embedding_f32out(out f32[t,h], table[vocab,h], ids[t], scale, hidden); ids were
        // checked against the vocabulary, buffers hold max_tokens >= t rows.
        unsafe { b.launch(rows_launch(self.tokens, ROW_THREADS)?) }?;
        Ok(())
    }

    fn rms_norm(&mut self, out: Buf, input: Buf, norm: NormId) -> Result<(), CudaModelError> {
        if !matches!((input, out), (Buf::Hidden, Buf::Normed | Buf::Sampled) | (Buf::Branch, Buf::Normed)) {
            return unsupported(format!("an RMSNorm of {input:?} into {out:?}"));
        }
        let stream = self.model.stream();
        let c = &self.model.config;
        let (eps, offset, h) = (c.rms_norm_eps as f32, c.arch.norm_weight_offset, int(c.hidden_size)?);
        let weight = norm_weight(self.model.weights, norm)?;
        let (gather, rows) = (out == Buf::Sampled, self.rows(out));
        let null: u64 = 0;
        let act = &mut self.model.act;
        let mut b = stream.launch_builder(&self.model.functions.rms_norm);
        match (gather, input) {
            (true, _) => b.arg(&mut act.sampled).arg(&act.hidden).arg(weight).arg(&act.sample_rows),
            (false, Buf::Branch) => b.arg(&mut act.normed).arg(&act.branch).arg(weight).arg(&null),
            (false, _) => b.arg(&mut act.normed).arg(&act.hidden).arg(weight).arg(&null),
        };
        b.arg(&offset).arg(&eps).arg(&h);
        // SAFETY: rms_norm_f32in(out[rows,h], x f32[.,h], weight[h], rows|null, offset, eps,
        // hidden); gathered row indices were checked to be below the batch's token count.
        unsafe { b.launch(rows_launch(rows, ROW_THREADS)?) }?;
        Ok(())
    }

    fn head_norm(&mut self, buf: Buf, norm: NormId) -> Result<(), CudaModelError> {
        let stream = self.model.stream();
        let c = &self.model.config;
        let heads = match buf {
            Buf::Q => c.num_attention_heads,
            Buf::K => c.num_key_value_heads,
            other => return unsupported(format!("a per-head norm of {other:?}")),
        };
        let (eps, offset, d) = (c.rms_norm_eps as f32, c.arch.norm_weight_offset, int(c.head_dim)?);
        let weight = norm_weight(self.model.weights, norm)?;
        let act = &mut self.model.act;
        let x = if buf == Buf::Q { &mut act.q } else { &mut act.k };
        let mut b = stream.launch_builder(&self.model.functions.head_norm);
        b.arg(x).arg(weight).arg(&offset).arg(&eps).arg(&d);
        // SAFETY: rms_norm_heads_f32(x f32[t·heads, d], weight[d], offset, eps, d): Q and K hold
        // max_tokens >= t rows of `heads` heads of d.
        unsafe { b.launch(rows_launch(self.tokens * heads, ROW_THREADS)?) }?;
        Ok(())
    }

    fn linear(&mut self, out: LinearOut, input: Buf, matrix: MatrixId) -> Result<(), CudaModelError> {
        let ([out_dim, in_dim], weight, bias) = self.matrix(matrix)?;
        let (x, rows) = (self.gemm_input(input)?, self.rows(input));
        let (target, accumulate) = match out {
            LinearOut::Write(b) => (b, false),
            LinearOut::Add(b) => (b, true),
            LinearOut::Split(parts) => {
                // One GEMM per part, at its rows of the fused weight and bias (2 bytes a half element).
                let c = &self.model.config;
                let (q_w, kv_w) = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
                let mut first_row = 0;
                for (part, part_rows) in parts.into_iter().zip([q_w, kv_w, kv_w]) {
                    let out = self.gemm_output(part, false)?;
                    let w = weight + (first_row * in_dim * 2) as u64;
                    self.gemm(w, x, out, [rows, part_rows, in_dim], false)?;
                    if let Some(bias) = bias {
                        self.add_bias(out.0, bias + (first_row * 2) as u64, rows, part_rows)?;
                    }
                    first_row += part_rows;
                }
                debug_assert_eq!(first_row, out_dim);
                return Ok(());
            }
        };
        let out = self.gemm_output(target, accumulate)?;
        self.gemm(weight, x, out, [rows, out_dim, in_dim], accumulate)?;
        if let Some(bias) = bias {
            self.add_bias(out.0, bias, rows, out_dim)?;
        }
        Ok(())
    }

    fn rope(&mut self, kind: RopeKind) -> Result<(), CudaModelError> {
        let stream = self.model.stream();
        let c = &self.model.config;
        let (nh, nkv, d) = (int(c.num_attention_heads)?, int(c.num_key_value_heads)?, int(c.head_dim)?);
        let (q_stride, k_stride) =
            ((c.num_attention_heads * c.head_dim) as i64, (c.num_key_value_heads * c.head_dim) as i64);
        let act = &mut self.model.act;
        let mut b = stream.launch_builder(&self.model.functions.rotary);
        b.arg(&mut act.q)
            .arg(&mut act.k)
            .arg(&self.model.cos_sin[kind as usize])
            .arg(&act.positions)
            .arg(&nh)
            .arg(&nkv)
            .arg(&d)
            .arg(&q_stride)
            .arg(&k_stride);
        // SAFETY: rotary_f32(q[t,nh,d], k[t,nkv,d], cos_sin[max_pos,d], positions[t], ...);
        // positions were checked to be below the table's length.
        unsafe { b.launch(rows_launch(self.tokens, 128)?) }?;
        Ok(())
    }

    fn attention(&mut self, layer: usize, scores: AttnScores) -> Result<(), CudaModelError> {
        let m = &mut self.model;
        let heads = m.config.num_attention_heads;
        m.kernels.reshape_and_cache(&m.act.k, &m.act.v, self.slots, self.cache.layer_mut(layer)?)?;
        m.kernels.paged_attention(
            &mut m.act.attn,
            &m.act.q,
            self.cache.layer(layer)?,
            self.meta,
            heads,
            scores,
            &mut m.act.attn_ws,
        )?;
        // The O projection reads the attention output in the half type.
        let n = self.tokens * heads * m.config.head_dim;
        let stream = m.stream();
        let len = n as i64;
        let mut b = stream.launch_builder(&m.functions.cast_attn);
        b.arg(&mut m.act.attn_half).arg(&m.act.attn).arg(&len);
        let blocks = n.div_ceil(ROW_THREADS as usize).min(65_535);
        // SAFETY: cast_f32_to_half(out[n], in[n], n), grid-stride over n elements of both.
        unsafe { b.launch(rows_launch(blocks, ROW_THREADS)?) }?;
        Ok(())
    }

    fn gated_act(&mut self, kind: Activation) -> Result<(), CudaModelError> {
        let stream = self.model.stream();
        let inter = self.model.config.intermediate_size;
        let (inter_i, stride) = (int(inter)?, (2 * inter) as i64);
        let act = &mut self.model.act;
        let gate = act.gate_up.slice(..);
        let up = act.gate_up.slice(inter..);
        let f = &self.model.functions;
        let mut b = stream.launch_builder(match kind {
            Activation::Silu => &f.silu_mul,
            Activation::GeluTanh => &f.gelu_tanh_mul,
        });
        b.arg(&mut act.act).arg(&gate).arg(&up).arg(&inter_i).arg(&stride);
        // SAFETY: gated(out[t,inter], gate, up, inter, in_stride = 2·inter): row r reads
        // gate_up[r, 0..inter] and gate_up[r, inter..2·inter], inside the t rows written before.
        unsafe { b.launch(rows_launch(self.tokens, ROW_THREADS)?) }?;
        Ok(())
    }

    fn add(&mut self, out: Buf, input: Buf) -> Result<(), CudaModelError> {
        if (out, input) != (Buf::Hidden, Buf::Normed) {
            return unsupported(format!("adding {input:?} into {out:?}"));
        }
        let stream = self.model.stream();
        let n = self.tokens * self.model.config.hidden_size;
        let len = n as i64;
        let act = &mut self.model.act;
        let mut b = stream.launch_builder(&self.model.functions.add_into);
        b.arg(&mut act.hidden).arg(&act.normed).arg(&len);
        let blocks = n.div_ceil(ROW_THREADS as usize).min(65_535);
        // SAFETY: add_into_f32(out f32[n], x[n], n), grid-stride over the t rows of both.
        unsafe { b.launch(rows_launch(blocks, ROW_THREADS)?) }?;
        Ok(())
    }

    fn softcap(&mut self, buf: Buf, cap: f32) -> Result<(), CudaModelError> {
        if buf != Buf::Logits {
            return unsupported(format!("soft-capping {buf:?}"));
        }
        let stream = self.model.stream();
        let n = self.samples * self.model.config.vocab_size;
        let len = n as i64;
        let mut b = stream.launch_builder(&self.model.functions.softcap);
        b.arg(&mut self.model.act.logits).arg(&cap).arg(&len);
        let blocks = n.div_ceil(ROW_THREADS as usize).min(65_535);
        // SAFETY: softcap_f32(x[n], cap, n), grid-stride over the n logits of the sampled rows.
        unsafe { b.launch(rows_launch(blocks, ROW_THREADS)?) }?;
        Ok(())
    }
}
