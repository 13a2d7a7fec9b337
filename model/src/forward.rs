//! The one decoder forward: the layer loop, written once over [`DecoderOps`], the ops a decoder
//! layer needs. The CPU (`cpu.rs`) and, with `cuda`, the GPU (`crate::cuda`) implement them
//! over their own buffers and kernels; what differs between architectures is the
//! [`Architecture`] this loop reads, never a copy of it.
//!
//! Ops name activation buffers ([`Buf`]) and weights ([`NormId`], [`MatrixId`]) rather than
//! holding them, so each backend keeps its buffers in the element type it computes in (the GPU
//! keeps the residual stream in f32 and GEMM inputs in bf16/f16) and its weights where they
//! live. Every buffer has one row per token of the step, except [`Buf::Sampled`] and
//! [`Buf::Logits`], which have one per sampled token, and [`Buf::Pooled`], one per pooled token.

pub mod cpu;
pub mod timed;

use crate::arch::{Activation, Architecture, LayerAttention, LayerMatrix, LayerNorm, RopeKind};
use attn_kernels::AttnScores;

/// An activation buffer of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The residual stream `[tokens, hidden]`.
    Hidden,
    /// A norm's output, the input of the next projection `[tokens, hidden]`.
    Normed,
    /// Queries, keys and values `[tokens, heads · head_dim]` (rotated in place).
    Q,
    K,
    V,
    /// The attention output `[tokens, heads · head_dim]`.
    Attn,
    /// Gate and up projections, side by side `[tokens, 2 · intermediate]`.
    GateUp,
    /// The gated activation `[tokens, intermediate]`.
    Act,
    /// A block's output before its norm joins it to the residual stream `[tokens, hidden]`.
    Branch,
    /// The final norm of the sampled rows `[samples, hidden]`.
    Sampled,
    /// The sampled rows' logits `[samples, vocab]`.
    Logits,
    /// The final norm of the pooled rows `[pooled, hidden]` (an embedding's hidden states).
    Pooled,
}

impl Buf {
    pub const COUNT: usize = 12;
}

/// A norm's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormId {
    Layer(usize, LayerNorm),
    Final,
}

/// A matrix (with its bias, when the architecture has one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixId {
    Layer(usize, LayerMatrix),
    LmHead,
}

/// Where a linear layer's output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearOut {
    /// Overwrites the buffer.
    Write(Buf),
    /// Adds into the buffer (the residual add, fused into the GEMM where a backend can).
    Add(Buf),
    /// A fused matrix's parts (Q, K, V) into one buffer each.
    Split([Buf; 3]),
}

/// The ops of a decoder layer on one device, over one step's buffers, weights and KV cache.
pub trait DecoderOps {
    type Error;
    /// `Hidden[t] = embedding[token t] · scale`.
    fn embed(&mut self, scale: Option<f32>) -> Result<(), Self::Error>;
    /// `out = rms_norm(input) · (offset + weight)` row by row; into [`Buf::Sampled`] and
    /// [`Buf::Pooled`] it gathers the sampled (pooled) rows of `input`.
    fn rms_norm(&mut self, out: Buf, input: Buf, norm: NormId) -> Result<(), Self::Error>;
    /// RMSNorm of every head of `buf` (Q or K) in place, by the head-wide `norm`.
    fn head_norm(&mut self, buf: Buf, norm: NormId) -> Result<(), Self::Error>;
    /// `out (+)= input · matrixᵀ + bias`.
    fn linear(&mut self, out: LinearOut, input: Buf, matrix: MatrixId) -> Result<(), Self::Error>;
    /// After [`Self::linear`] of the same arguments: adds the LoRA delta of each adapted part of
    /// `matrix` into the rows of the step's adapters (`ModelInput::lora`); nothing without one.
    fn lora(&mut self, out: LinearOut, input: Buf, matrix: MatrixId) -> Result<(), Self::Error>;
    /// Rotates Q and K at the step's positions by the rotation of `kind` layers.
    fn rope(&mut self, kind: RopeKind) -> Result<(), Self::Error>;
    /// Writes K and V into layer `layer`'s cache slots, then attends Q over the paged cache
    /// into [`Buf::Attn`].
    fn attention(&mut self, layer: usize, scores: AttnScores) -> Result<(), Self::Error>;
    /// `Act = act(gate) · up` from [`Buf::GateUp`].
    fn gated_act(&mut self, act: Activation) -> Result<(), Self::Error>;
    /// `out += input`.
    fn add(&mut self, out: Buf, input: Buf) -> Result<(), Self::Error>;
    /// `buf = cap · tanh(buf / cap)`.
    fn softcap(&mut self, buf: Buf, cap: f32) -> Result<(), Self::Error>;
}

/// What one step computes: the backend holds its tokens, positions, cache and sampled rows.
#[derive(Debug, Clone, Copy)]
pub struct StepShape<'a> {
    pub arch: &'a Architecture,
    /// How each layer attends (one entry a layer).
    pub layers: &'a [LayerAttention],
    /// Whether any row is sampled (the final norm and LM head run only then).
    pub samples: bool,
    /// Whether any row is pooled (its final norm is the step's other output).
    pub pools: bool,
}

/// One forward step: embedding, every decoder layer, then the final norm and the LM head of the
/// sampled rows only, and the final norm of the pooled rows.
pub fn run<B: DecoderOps>(b: &mut B, step: StepShape<'_>) -> Result<(), B::Error> {
    let arch = step.arch;
    b.embed(arch.embedding_scale)?;
    for (l, attention) in step.layers.iter().enumerate() {
        let norm = |n| NormId::Layer(l, n);
        let matrix = |m| MatrixId::Layer(l, m);
        b.rms_norm(Buf::Normed, Buf::Hidden, norm(LayerNorm::InputLayernorm))?;
        adapted(b, LinearOut::Split([Buf::Q, Buf::K, Buf::V]), Buf::Normed, matrix(LayerMatrix::Qkv))?;
        if arch.qk_norm {
            b.head_norm(Buf::Q, norm(LayerNorm::QNorm))?;
            b.head_norm(Buf::K, norm(LayerNorm::KNorm))?;
        }
        b.rope(attention.rope)?;
        b.attention(l, AttnScores { scale: arch.attention_scale, sliding_window: attention.sliding_window })?;
        join_residual(b, arch, Buf::Attn, matrix(LayerMatrix::O), norm(LayerNorm::PostAttentionLayernorm))?;
        b.rms_norm(Buf::Normed, Buf::Hidden, norm(LayerNorm::PreFeedforwardLayernorm))?;
        adapted(b, LinearOut::Write(Buf::GateUp), Buf::Normed, matrix(LayerMatrix::GateUp))?;
        b.gated_act(arch.activation)?;
        join_residual(
            b,
            arch,
            Buf::Act,
            matrix(LayerMatrix::Down),
            norm(LayerNorm::PostFeedforwardLayernorm),
        )?;
    }
    if step.pools {
        b.rms_norm(Buf::Pooled, Buf::Hidden, NormId::Final)?;
    }
    if step.samples {
        b.rms_norm(Buf::Sampled, Buf::Hidden, NormId::Final)?;
        b.linear(LinearOut::Write(Buf::Logits), Buf::Sampled, MatrixId::LmHead)?;
        if let Some(cap) = arch.final_logit_softcap {
            b.softcap(Buf::Logits, cap)?;
        }
    }
    Ok(())
}

/// A block's output projection joined to the residual stream: added straight in by the GEMM,
/// or, with sandwich norms, projected, normed, then added.
fn join_residual<B: DecoderOps>(
    b: &mut B,
    arch: &Architecture,
    input: Buf,
    matrix: MatrixId,
    out_norm: NormId,
) -> Result<(), B::Error> {
    if !arch.sandwich_norms {
        return adapted(b, LinearOut::Add(Buf::Hidden), input, matrix);
    }
    adapted(b, LinearOut::Write(Buf::Branch), input, matrix)?;
    b.rms_norm(Buf::Normed, Buf::Branch, out_norm)?;
    b.add(Buf::Hidden, Buf::Normed)
}

/// A layer's projection with its LoRA deltas.
fn adapted<B: DecoderOps>(b: &mut B, out: LinearOut, input: Buf, matrix: MatrixId) -> Result<(), B::Error> {
    b.linear(out, input, matrix)?;
    b.lora(out, input, matrix)
}
