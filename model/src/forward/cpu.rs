//! [`DecoderOps`] on the CPU: f32 buffers in a reusable [`Workspace`], the host [`Model`]'s
//! weights in their storage formats, and the host's op API ([`CpuOps`]: norms, matmuls per
//! weight format, rotary embedding, activations, adds, paged attention over a host
//! [`KvCache`]); and the CPU entry of the one forward, [`Model::forward`].

use attn_kernels::AttnScores;
use attn_kernels::backend::KernelBackend;
use attn_kernels::cpu::act::Activation;
use attn_kernels::cpu::ops::{CosSin, CpuOps};
use attn_kernels::layer_ops::{LayerOps, LinearShape, RmsNorm, RopePairs, RotaryShape};
use kv_cache::KvCache;
use quant_kernels::quant::Weight;
use rayon::prelude::*;

use super::timed::{StepProfile, Timed};
use super::{Buf, DecoderOps, LinearOut, MatrixId, NormId, StepShape};
use crate::arch::{RopeKind, RopeStyle};
use crate::decoder::Model;
use crate::error::{ModelError, Result};
use crate::input::ModelInput;
use crate::lora;
use crate::lora::apply::{Place, add_deltas};

impl Model {
    /// One step on the CPU: writes this step's K/V into `cache`, and returns the logits
    /// `[sample_indices.len(), vocab]` (borrowed from `ws`).
    pub fn forward<'w>(
        &self,
        input: &ModelInput<'_>,
        cache: &mut KvCache,
        ws: &'w mut Workspace,
    ) -> Result<&'w [f32]> {
        self.forward_inner(input, cache, ws, None)
    }

    fn forward_inner<'w>(
        &self,
        input: &ModelInput<'_>,
        cache: &mut KvCache,
        ws: &'w mut Workspace,
        mut profile: Option<&mut StepProfile>,
    ) -> Result<&'w [f32]> {
        self.check_input(input, cache)?;
        // Every op fans out through rayon, ~10 times per layer. Issued from a thread outside
        // the pool, each fan-out is a cross-thread injection, a wake-up and a blocking wait
        // (tens of µs, a tenth of a batch-1 decode step); issued from a pool thread it is a
        // push onto the local deque. So the whole pass runs on the pool, entered once.
        let step = StepShape {
            arch: &self.config.arch,
            layers: &self.config.layer_attention,
            samples: !input.sample_indices.is_empty(),
            pools: !input.pool_indices.is_empty(),
        };
        let mut run = || match profile.as_deref_mut() {
            Some(profile) => {
                super::run(&mut Timed { inner: CpuStep::new(self, input, cache, ws), profile }, step)
            }
            None => super::run(&mut CpuStep::new(self, input, cache, ws), step),
        };
        if rayon::current_thread_index().is_some() { run() } else { rayon::scope(|_| run()) }?;
        Ok(ws.logits(input.sample_indices.len() * self.config.vocab_size))
    }

    /// [`Self::forward`] with the time of each phase added to `profile` (the bench report's
    /// breakdown of a step).
    pub fn forward_profiled<'w>(
        &self,
        input: &ModelInput<'_>,
        cache: &mut KvCache,
        ws: &'w mut Workspace,
        profile: &mut StepProfile,
    ) -> Result<&'w [f32]> {
        self.forward_inner(input, cache, ws, Some(profile))
    }
}

/// Reusable activation buffers: they grow to the largest batch seen and are then reused, so a
/// step allocates nothing once warmed up.
#[derive(Debug, Default)]
pub struct Workspace {
    bufs: [Vec<f32>; Buf::COUNT],
    /// The fused Q/K/V projection before it is split.
    qkv: Vec<f32>,
    /// cos/sin of every token's position per [`RopeKind`], shared by the layers of that kind.
    cos: [Vec<f32>; RopeKind::COUNT],
    sin: [Vec<f32>; RopeKind::COUNT],
    /// The LoRA deltas' gathered, shrunk and expanded rows.
    lora: crate::lora::apply::Scratch,
}

impl Workspace {
    /// The last step's logits (`len` of them).
    pub(crate) fn logits(&self, len: usize) -> &[f32] {
        &self.bufs[Buf::Logits as usize][..len]
    }

    /// The last step's pooled rows (`len` values: rows × hidden).
    pub(crate) fn pooled(&self, len: usize) -> &[f32] {
        self.bufs[Buf::Pooled as usize].get(..len).unwrap_or_default()
    }
}

fn ensure(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

/// One CPU step: the model, its input, the cache and the workspace, borrowed for the step.
pub(crate) struct CpuStep<'a, 'i> {
    model: &'a Model,
    input: &'a ModelInput<'i>,
    cache: &'a mut KvCache,
    ws: &'a mut Workspace,
    ops: CpuOps,
    /// Whether this step's cos/sin of each kind are in the workspace yet.
    rope_ready: [bool; RopeKind::COUNT],
}

impl<'a, 'i> CpuStep<'a, 'i> {
    pub(crate) fn new(
        model: &'a Model,
        input: &'a ModelInput<'i>,
        cache: &'a mut KvCache,
        ws: &'a mut Workspace,
    ) -> Self {
        Self {
            model,
            input,
            cache,
            ws,
            ops: CpuOps::new(model.activations),
            rope_ready: [false; RopeKind::COUNT],
        }
    }

    fn rows(&self, b: Buf) -> usize {
        match b {
            Buf::Sampled | Buf::Logits => self.input.sample_indices.len(),
            Buf::Pooled => self.input.pool_indices.len(),
            _ => self.input.num_tokens(),
        }
    }

    fn width(&self, b: Buf) -> usize {
        let c = &self.model.config;
        match b {
            Buf::Hidden | Buf::Normed | Buf::Branch | Buf::Sampled | Buf::Pooled => c.hidden_size,
            Buf::Q | Buf::Attn => c.num_attention_heads * c.head_dim,
            Buf::K | Buf::V => c.num_key_value_heads * c.head_dim,
            Buf::GateUp => 2 * c.intermediate_size,
            Buf::Act => c.intermediate_size,
            Buf::Logits => c.vocab_size,
        }
    }

    fn len(&self, b: Buf) -> usize {
        self.rows(b) * self.width(b)
    }

    /// Distinct buffers, each sized for this step: the first to write, the rest to read.
    fn bufs<const N: usize>(&mut self, which: [Buf; N]) -> Result<[&mut [f32]; N]> {
        let lens = which.map(|b| self.len(b));
        take(&mut self.ws.bufs, which, lens)
    }

    fn norm(&self, norm: NormId, width: usize) -> Result<(&'a [f32], RmsNorm)> {
        let model: &'a Model = self.model;
        let w = match norm {
            NormId::Final => Some(&model.final_norm),
            NormId::Layer(l, n) => model.layers.get(l).and_then(|layer| layer.norm(n)),
        };
        let w = w
            .and_then(Weight::as_f32)
            .ok_or_else(|| ModelError::InvalidInput(format!("no f32 norm {norm:?}")))?;
        let c = &model.config;
        Ok((w, RmsNorm { width, offset: c.arch.norm_weight_offset, eps: c.rms_norm_eps }))
    }

    fn matrix(&self, m: MatrixId) -> Result<(&'a Weight, Option<&'a [f32]>)> {
        let model: &'a Model = self.model;
        match m {
            MatrixId::LmHead => Ok((model.lm_head(), None)),
            MatrixId::Layer(l, m) => {
                let layer =
                    model.layers.get(l).ok_or_else(|| ModelError::InvalidInput(format!("layer {l}")))?;
                Ok((layer.matrix(m), layer.bias(m).and_then(Weight::as_f32)))
            }
        }
    }

    /// This step's cos/sin of `kind`, once per step.
    fn rope_tables(&mut self, kind: RopeKind) {
        let t = self.input.num_tokens();
        let half = self.model.config.head_dim / 2;
        let cos = ensure(&mut self.ws.cos[kind as usize], t * half);
        let sin = ensure(&mut self.ws.sin[kind as usize], t * half);
        let rope = self.model.rope(kind);
        cos.par_chunks_mut(half.max(1))
            .zip(sin.par_chunks_mut(half.max(1)))
            .zip(self.input.positions.par_iter())
            .for_each(|((cr, sr), &p)| rope.fill(p, cr, sr));
        self.rope_ready[kind as usize] = true;
    }
}

/// Distinct buffers of `bufs`, sized `lens`.
fn take<const N: usize>(
    bufs: &mut [Vec<f32>; Buf::COUNT],
    which: [Buf; N],
    lens: [usize; N],
) -> Result<[&mut [f32]; N]> {
    let vecs = bufs
        .get_disjoint_mut(which.map(|b| b as usize))
        .map_err(|e| ModelError::InvalidInput(format!("buffers {which:?}: {e}")))?;
    let mut lens = lens.into_iter();
    Ok(vecs.map(|v| ensure(v, lens.next().unwrap_or(0))))
}

impl DecoderOps for CpuStep<'_, '_> {
    type Error = ModelError;

    fn embed(&mut self, scale: Option<f32>) -> Result<()> {
        let (ops, table, ids) = (self.ops, &self.model.embed, self.input.token_ids);
        let [hidden] = self.bufs([Buf::Hidden])?;
        ops.embed(hidden, table, ids, ids.len(), scale.unwrap_or(1.0))?;
        Ok(())
    }

    fn rms_norm(&mut self, out: Buf, input: Buf, norm: NormId) -> Result<()> {
        let (w, norm) = self.norm(norm, self.model.config.hidden_size)?;
        let (ops, rows) = (self.ops, self.rows(out));
        // Into the sampled (pooled) rows, only those rows of the input are normed.
        let gather = match out {
            Buf::Sampled => Some(self.input.sample_indices),
            Buf::Pooled => Some(self.input.pool_indices),
            _ => None,
        };
        let [o, x] = self.bufs([out, input])?;
        ops.rms_norm(o, x, w, gather, rows, norm)?;
        Ok(())
    }

    fn head_norm(&mut self, buf: Buf, norm: NormId) -> Result<()> {
        let d = self.model.config.head_dim;
        let (w, norm) = self.norm(norm, d)?;
        let (ops, heads) = (self.ops, self.len(buf) / d.max(1));
        let [x] = self.bufs([buf])?;
        ops.rms_norm_in_place(x, w, heads, norm)?;
        Ok(())
    }

    fn linear(&mut self, out: LinearOut, input: Buf, matrix: MatrixId) -> Result<()> {
        let (w, bias) = self.matrix(matrix)?;
        let (ops, rows) = (self.ops, self.rows(input));
        let shape = |accumulate| LinearShape { rows, out_dim: w.rows(), in_dim: w.cols(), accumulate };
        let (out, accumulate) = match out {
            LinearOut::Write(b) => (b, false),
            LinearOut::Add(b) => (b, true),
            LinearOut::Split(parts) => {
                // One matmul over the fused weight, then its columns split into Q, K and V.
                let lens = parts.map(|b| self.len(b));
                let x = &self.ws.bufs[input as usize][..self.len(input)];
                let fused = ensure(&mut self.ws.qkv, rows * w.rows());
                ops.linear(fused, x, w, shape(false))?;
                let fused = &self.ws.qkv[..rows * w.rows()];
                ops.split_columns(take(&mut self.ws.bufs, parts, lens)?, fused, bias, rows)?;
                return Ok(());
            }
        };
        let [o, x] = self.bufs([out, input])?;
        ops.linear(o, x, w, shape(accumulate))?;
        if let Some(bias) = bias {
            ops.add_bias(o, bias, rows, bias.len())?;
        }
        Ok(())
    }

    fn lora(&mut self, out: LinearOut, input: Buf, matrix: MatrixId) -> Result<()> {
        let (Some(batch), MatrixId::Layer(layer, m)) = (self.input.lora, matrix) else { return Ok(()) };
        if batch.is_empty() {
            return Ok(());
        }
        let (in_dim, rows) = (self.width(input), self.rows(input));
        // Where each part's delta goes: its own buffer (Q, K, V), or its columns of one buffer
        // (`Model::check_input` checked every adapter's shapes against the model's).
        let config = &self.model.config;
        let parts = lora::parts_of(m);
        let mut places = [Place { buf: 0, width: 0, column: 0 }; 3];
        let bufs: &[Buf] = match &out {
            LinearOut::Split(split) => {
                for (p, &b) in split.iter().enumerate() {
                    places[p] = Place { buf: p, width: self.width(b), column: 0 };
                }
                split
            }
            LinearOut::Write(b) | LinearOut::Add(b) => {
                let mut column = 0;
                for (p, place) in places.iter_mut().enumerate().take(parts) {
                    *place = Place { buf: 0, width: self.width(*b), column };
                    column += lora::part_dims(config, m, p).1;
                }
                std::slice::from_ref(b)
            }
        };
        let places = &places[..parts];
        // The input leaves the buffer array while the outputs are borrowed from it.
        let x = std::mem::take(&mut self.ws.bufs[input as usize]);
        let mut scratch = std::mem::take(&mut self.ws.lora);
        let result = match *bufs {
            [a, b, c] => {
                let lens = [a, b, c].map(|b| self.len(b));
                take(&mut self.ws.bufs, [a, b, c], lens).map(|[q, k, v]| {
                    let outs = &mut [q, k, v];
                    add_deltas(batch, (layer, m), &x[..rows * in_dim], in_dim, (outs, places), &mut scratch);
                })
            }
            [b] => {
                let len = self.len(b);
                take(&mut self.ws.bufs, [b], [len]).map(|[o]| {
                    let outs = &mut [o];
                    add_deltas(batch, (layer, m), &x[..rows * in_dim], in_dim, (outs, places), &mut scratch);
                })
            }
            _ => Err(ModelError::InvalidInput(format!("LoRA into {} buffers", bufs.len()))),
        };
        self.ws.bufs[input as usize] = x;
        self.ws.lora = scratch;
        result
    }

    fn rope(&mut self, kind: RopeKind) -> Result<()> {
        if !self.rope_ready[kind as usize] {
            self.rope_tables(kind);
        }
        let c = &self.model.config;
        let shape = RotaryShape {
            tokens: self.input.num_tokens(),
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
        };
        let pairs = match c.arch.rope_style {
            RopeStyle::RotateHalf => RopePairs::RotateHalf,
            RopeStyle::Interleaved => RopePairs::Interleaved,
        };
        let ops = self.ops;
        let lens = [self.len(Buf::Q), self.len(Buf::K)];
        let [q, k] = take(&mut self.ws.bufs, [Buf::Q, Buf::K], lens)?;
        let (cos, sin) = (&self.ws.cos[kind as usize], &self.ws.sin[kind as usize]);
        ops.rotary(q, k, CosSin { cos, sin, pairs }, shape)?;
        Ok(())
    }

    fn attention(&mut self, layer: usize, scores: AttnScores) -> Result<()> {
        let (ops, input, heads) = (self.ops, self.input, self.model.config.num_attention_heads);
        let which = [Buf::Attn, Buf::Q, Buf::K, Buf::V];
        let lens = which.map(|b| self.len(b));
        let place = self.model.kv_layout().place(layer);
        let (slots, meta) = input
            .group(place.group)
            .ok_or_else(|| ModelError::InvalidInput(format!("no KV cache group {}", place.group)))?;
        let cache = self.cache.layer_mut(place.slot);
        let [attn, q, k, v] = take(&mut self.ws.bufs, which, lens)?;
        ops.reshape_and_cache(k, v, slots, cache)?;
        ops.paged_attention(attn, q, cache, &meta, heads, scores, &mut ())?;
        Ok(())
    }

    fn gated_act(&mut self, act: Activation) -> Result<()> {
        let (ops, rows, inter) = (self.ops, self.rows(Buf::Act), self.model.config.intermediate_size);
        let [out, gate_up] = self.bufs([Buf::Act, Buf::GateUp])?;
        ops.gated_act(out, gate_up, rows, inter, act)?;
        Ok(())
    }

    fn add(&mut self, out: Buf, input: Buf) -> Result<()> {
        let (ops, len) = (self.ops, self.len(out));
        let [o, x] = self.bufs([out, input])?;
        ops.add(o, x, len)?;
        Ok(())
    }

    fn softcap(&mut self, buf: Buf, cap: f32) -> Result<()> {
        let (ops, len) = (self.ops, self.len(buf));
        let [x] = self.bufs([buf])?;
        ops.softcap(x, cap, len)?;
        Ok(())
    }
}
