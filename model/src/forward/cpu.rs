//! [`DecoderOps`] on the CPU: f32 buffers in a reusable [`Workspace`], the host [`Model`]'s
//! weights in their storage formats, the kernels of `attn_kernels::cpu` and the paged
//! attention of [`attn_kernels::backend::Cpu`] over a host [`KvCache`]; and the CPU entry of
//! the one forward, [`Model::forward`].

use attn_kernels::backend::{Cpu, KernelBackend};
use attn_kernels::cpu::act::{Activation, gated_act};
use attn_kernels::cpu::norm::rms_norm;
use attn_kernels::cpu::rope::{rope_interleaved, rope_rotate_half};
use attn_kernels::{AttnScores, Isa};
use kv_cache::KvCache;
use quant_kernels::quant::{ActivationPrecision, Weight};
use rayon::prelude::*;

use super::timed::{StepProfile, Timed};
use super::{Buf, DecoderOps, LinearOut, MatrixId, NormId, StepShape};
use crate::arch::{RopeKind, RopeStyle};
use crate::decoder::Model;
use crate::error::{ModelError, Result};
use crate::input::ModelInput;

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
    /// Gathered sampled rows, and head norms' outputs.
    scratch: Vec<f32>,
    /// cos/sin of every token's position per [`RopeKind`], shared by the layers of that kind.
    cos: [Vec<f32>; RopeKind::COUNT],
    sin: [Vec<f32>; RopeKind::COUNT],
}

impl Workspace {
    /// The last step's logits (`len` of them).
    pub(crate) fn logits(&self, len: usize) -> &[f32] {
        &self.bufs[Buf::Logits as usize][..len]
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
    isa: Isa,
    precision: ActivationPrecision,
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
            isa: Isa::detected(),
            precision: model.activations,
            rope_ready: [false; RopeKind::COUNT],
        }
    }

    fn rows(&self, b: Buf) -> usize {
        match b {
            Buf::Sampled | Buf::Logits => self.input.sample_indices.len(),
            _ => self.input.num_tokens(),
        }
    }

    fn width(&self, b: Buf) -> usize {
        let c = &self.model.config;
        match b {
            Buf::Hidden | Buf::Normed | Buf::Branch | Buf::Sampled => c.hidden_size,
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

    fn norm_weight(&self, norm: NormId) -> Result<&'a [f32]> {
        let model: &'a Model = self.model;
        let w = match norm {
            NormId::Final => Some(&model.final_norm),
            NormId::Layer(l, n) => model.layers.get(l).and_then(|layer| layer.norm(n)),
        };
        w.and_then(Weight::as_f32).ok_or_else(|| ModelError::InvalidInput(format!("no f32 norm {norm:?}")))
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

    /// The fused projection into `ws.qkv`, then its rows split into `parts` (plus the bias).
    fn linear_split(&mut self, parts: [Buf; 3], input: Buf, w: &Weight, bias: Option<&[f32]>) -> Result<()> {
        let (t, width) = (self.rows(input), w.rows());
        let widths = parts.map(|b| self.width(b));
        let lens = parts.map(|b| self.len(b));
        let x = &self.ws.bufs[input as usize][..self.len(input)];
        let qkv = ensure(&mut self.ws.qkv, t * width);
        w.matmul_as(self.isa, self.precision, qkv, x, t, false);
        let qkv = &self.ws.qkv[..t * width];
        let [q, k, v] = take(&mut self.ws.bufs, parts, lens)?;
        q.par_chunks_mut(widths[0])
            .zip(k.par_chunks_mut(widths[1]))
            .zip(v.par_chunks_mut(widths[2]))
            .zip(qkv.par_chunks(width))
            .with_min_len(8)
            .for_each(|(((qr, kr), vr), src)| {
                let (qs, rest) = src.split_at(qr.len());
                let (ks, vs) = rest.split_at(kr.len());
                qr.copy_from_slice(qs);
                kr.copy_from_slice(ks);
                vr.copy_from_slice(vs);
                if let Some(bias) = bias {
                    let (qb, rest) = bias.split_at(qr.len());
                    let (kb, vb) = rest.split_at(kr.len());
                    add_row(qr, qb);
                    add_row(kr, kb);
                    add_row(vr, vb);
                }
            });
        Ok(())
    }

    /// This step's cos/sin of `kind`, once per step.
    fn rope_tables(&mut self, kind: RopeKind) {
        let t = self.input.num_tokens();
        let half = self.model.config.head_dim / 2;
        let cos = ensure(&mut self.ws.cos[kind as usize], t * half);
        let sin = ensure(&mut self.ws.sin[kind as usize], t * half);
        let rope = self.model.rope(kind);
        cos.par_chunks_mut(half)
            .zip(sin.par_chunks_mut(half))
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

fn add_row(out: &mut [f32], add: &[f32]) {
    out.iter_mut().zip(add).for_each(|(o, a)| *o += a);
}

impl DecoderOps for CpuStep<'_, '_> {
    type Error = ModelError;

    fn embed(&mut self, scale: Option<f32>) -> Result<()> {
        let (model, ids) = (self.model, self.input.token_ids);
        let h = model.config.hidden_size;
        let [hidden] = self.bufs([Buf::Hidden])?;
        // Ids were checked against the vocabulary.
        hidden.par_chunks_mut(h).zip(ids.par_iter()).for_each(|(row, &tok)| {
            model.embed.row_to_f32(tok as usize, row);
            if let Some(s) = scale {
                row.iter_mut().for_each(|v| *v *= s);
            }
        });
        Ok(())
    }

    fn rms_norm(&mut self, out: Buf, input: Buf, norm: NormId) -> Result<()> {
        let w = self.norm_weight(norm)?;
        let (offset, eps) = (self.model.config.arch.norm_weight_offset, self.model.config.rms_norm_eps);
        if out != Buf::Sampled {
            let [o, x] = self.bufs([out, input])?;
            rms_norm(o, x, w, offset, eps);
            return Ok(());
        }
        // The sampled rows only: gathered, then normed.
        let (h, out_len) = (w.len(), self.len(out));
        let (rows, x) = (self.input.sample_indices, &self.ws.bufs[input as usize]);
        let gathered = ensure(&mut self.ws.scratch, rows.len() * h);
        for (row, &i) in gathered.chunks_exact_mut(h).zip(rows) {
            row.copy_from_slice(&x[i * h..(i + 1) * h]);
        }
        let [o] = take(&mut self.ws.bufs, [out], [out_len])?;
        rms_norm(o, &self.ws.scratch[..rows.len() * h], w, offset, eps);
        Ok(())
    }

    fn head_norm(&mut self, buf: Buf, norm: NormId) -> Result<()> {
        let w = self.norm_weight(norm)?;
        let (offset, eps) = (self.model.config.arch.norm_weight_offset, self.model.config.rms_norm_eps);
        let len = self.len(buf);
        let [x] = take(&mut self.ws.bufs, [buf], [len])?;
        let normed = ensure(&mut self.ws.scratch, len);
        rms_norm(normed, x, w, offset, eps);
        x.copy_from_slice(normed);
        Ok(())
    }

    fn linear(&mut self, out: LinearOut, input: Buf, matrix: MatrixId) -> Result<()> {
        let (w, bias) = self.matrix(matrix)?;
        let (out, accumulate) = match out {
            LinearOut::Split(parts) => return self.linear_split(parts, input, w, bias),
            LinearOut::Write(b) => (b, false),
            LinearOut::Add(b) => (b, true),
        };
        let (rows, isa, precision) = (self.rows(input), self.isa, self.precision);
        let [o, x] = self.bufs([out, input])?;
        w.matmul_as(isa, precision, o, x, rows, accumulate);
        if let Some(bias) = bias {
            o.par_chunks_mut(bias.len()).for_each(|row| add_row(row, bias));
        }
        Ok(())
    }

    fn rope(&mut self, kind: RopeKind) -> Result<()> {
        if !self.rope_ready[kind as usize] {
            self.rope_tables(kind);
        }
        let d = self.model.config.head_dim;
        let half = d / 2;
        let pairs = match self.model.config.arch.rope_style {
            RopeStyle::RotateHalf => rope_rotate_half,
            RopeStyle::Interleaved => rope_interleaved,
        };
        let (q_w, k_w) = (self.width(Buf::Q), self.width(Buf::K));
        let lens = [self.len(Buf::Q), self.len(Buf::K)];
        let [q, k] = take(&mut self.ws.bufs, [Buf::Q, Buf::K], lens)?;
        let (cos, sin) = (&self.ws.cos[kind as usize], &self.ws.sin[kind as usize]);
        q.par_chunks_mut(q_w).zip(k.par_chunks_mut(k_w)).enumerate().with_min_len(8).for_each(
            |(i, (qr, kr))| {
                let (cr, sr) = (&cos[i * half..(i + 1) * half], &sin[i * half..(i + 1) * half]);
                pairs(qr, d, cr, sr);
                pairs(kr, d, cr, sr);
            },
        );
        Ok(())
    }

    fn attention(&mut self, layer: usize, scores: AttnScores) -> Result<()> {
        let (input, heads) = (self.input, self.model.config.num_attention_heads);
        let which = [Buf::Attn, Buf::Q, Buf::K, Buf::V];
        let lens = which.map(|b| self.len(b));
        let place = self.model.kv_layout().place(layer);
        let (slots, meta) = input
            .group(place.group)
            .ok_or_else(|| ModelError::InvalidInput(format!("no KV cache group {}", place.group)))?;
        let cache = self.cache.layer_mut(place.slot);
        let [attn, q, k, v] = take(&mut self.ws.bufs, which, lens)?;
        Cpu.reshape_and_cache(k, v, slots, cache)?;
        Cpu.paged_attention(attn, q, cache, &meta, heads, scores, &mut ())?;
        Ok(())
    }

    fn gated_act(&mut self, act: Activation) -> Result<()> {
        let inter = self.model.config.intermediate_size;
        let [out, gate_up] = self.bufs([Buf::Act, Buf::GateUp])?;
        gated_act(out, gate_up, inter, act);
        Ok(())
    }

    fn add(&mut self, out: Buf, input: Buf) -> Result<()> {
        let [o, x] = self.bufs([out, input])?;
        o.par_chunks_mut(4096).zip(x.par_chunks(4096)).for_each(|(o, x)| add_row(o, x));
        Ok(())
    }

    fn softcap(&mut self, buf: Buf, cap: f32) -> Result<()> {
        let [x] = self.bufs([buf])?;
        x.par_chunks_mut(4096).for_each(|c| c.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh()));
        Ok(())
    }
}
