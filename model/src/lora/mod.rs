//! LoRA adapters over a loaded base model: the low-rank pairs of each adapted projection
//! ([`LoraAdapter`], loaded from PEFT's format in `peft.rs`), which rows of a step run under
//! which adapter ([`LoraBatch`]), and the CPU's grouped shrink-then-expand (`apply.rs`).
//!
//! A projection `W` adapted by `(A, B)` computes `y = x·Wᵀ + s · (x·Aᵀ)·Bᵀ` with `A` `[r, in]`,
//! `B` `[out, r]` and PEFT's scale `s = alpha / r` (`alpha / √r` with rsLoRA). `s` is folded into
//! `B` at load, so a step multiplies by nothing else. Every row of a step takes the base
//! projection; only the rows of an adapter's requests add its delta (punica's grouping: the
//! rows of one adapter are gathered, multiplied by `A` then `B`, and scattered back).

pub(crate) mod apply;
mod peft;

use std::sync::Arc;

use crate::arch::LayerMatrix;
use crate::config::ModelConfig;

pub use peft::{ADAPTER_CONFIG, ADAPTER_WEIGHTS};

/// One adapted projection: `a` `[rank, in_dim]`, `b` `[out_dim, rank]` with the scale folded in.
#[derive(Debug, Clone)]
pub struct LoraPair {
    pub rank: usize,
    pub in_dim: usize,
    pub out_dim: usize,
    a: Vec<f32>,
    b: Vec<f32>,
}

impl LoraPair {
    /// `a` `[rank, in_dim]` and `b` `[out_dim, rank]` row-major; `b` is multiplied by `scale`.
    pub fn new(rank: usize, in_dim: usize, out_dim: usize, a: Vec<f32>, mut b: Vec<f32>, scale: f32) -> Self {
        debug_assert_eq!(a.len(), rank * in_dim);
        debug_assert_eq!(b.len(), out_dim * rank);
        b.iter_mut().for_each(|v| *v *= scale);
        Self { rank, in_dim, out_dim, a, b }
    }

    fn bytes(&self) -> usize {
        (self.a.len() + self.b.len()) * size_of::<f32>()
    }
}

/// The HF module names an adapter may target, each a part of one of our fused matrices:
/// (name, matrix, part index in the matrix's row order).
pub const TARGET_MODULES: [(&str, LayerMatrix, usize); 7] = [
    ("q_proj", LayerMatrix::Qkv, 0),
    ("k_proj", LayerMatrix::Qkv, 1),
    ("v_proj", LayerMatrix::Qkv, 2),
    ("o_proj", LayerMatrix::O, 0),
    ("gate_proj", LayerMatrix::GateUp, 0),
    ("up_proj", LayerMatrix::GateUp, 1),
    ("down_proj", LayerMatrix::Down, 0),
];

/// `(in, out)` of part `part` of `matrix` in a base model of `config`.
pub(crate) fn part_dims(config: &ModelConfig, matrix: LayerMatrix, part: usize) -> (usize, usize) {
    let (h, d) = (config.hidden_size, config.head_dim);
    let q = config.num_attention_heads * d;
    let kv = config.num_key_value_heads * d;
    match (matrix, part) {
        (LayerMatrix::Qkv, 0) => (h, q),
        (LayerMatrix::Qkv, _) => (h, kv),
        (LayerMatrix::O, _) => (q, h),
        (LayerMatrix::GateUp, _) => (h, config.intermediate_size),
        (LayerMatrix::Down, _) => (config.intermediate_size, h),
    }
}

/// How many parts each matrix has (Q, K, V; O; gate, up; down).
pub(crate) fn parts_of(m: LayerMatrix) -> usize {
    match m {
        LayerMatrix::Qkv => 3,
        LayerMatrix::GateUp => 2,
        LayerMatrix::O | LayerMatrix::Down => 1,
    }
}

fn matrix_index(m: LayerMatrix) -> usize {
    match m {
        LayerMatrix::Qkv => 0,
        LayerMatrix::O => 1,
        LayerMatrix::GateUp => 2,
        LayerMatrix::Down => 3,
    }
}

/// A loaded adapter: for every layer and matrix, the pair of each adapted part.
#[derive(Debug)]
pub struct LoraAdapter {
    /// The name requests use (`model` on the OpenAI endpoints, `LoRARequest.lora_name`).
    pub name: String,
    /// The largest rank of its pairs.
    pub rank: usize,
    /// `layers[l][matrix_index(m)][part]`.
    layers: Vec<[Vec<Option<LoraPair>>; 4]>,
    bytes: usize,
}

impl LoraAdapter {
    /// An adapter of `num_layers` layers with no pair yet.
    pub fn empty(name: impl Into<String>, num_layers: usize) -> Self {
        let layer = || LayerMatrix::ALL.map(|m| vec![None; parts_of(m)]);
        Self { name: name.into(), rank: 0, layers: (0..num_layers).map(|_| layer()).collect(), bytes: 0 }
    }

    /// Sets the pair of part `part` of layer `layer`'s `matrix` (the loader checked the shapes).
    pub fn set(&mut self, layer: usize, matrix: LayerMatrix, part: usize, pair: LoraPair) {
        if let Some(slot) = self.layers.get_mut(layer).and_then(|l| l[matrix_index(matrix)].get_mut(part)) {
            self.rank = self.rank.max(pair.rank);
            self.bytes += pair.bytes();
            *slot = Some(pair);
        }
    }

    /// The pairs of layer `layer`'s `matrix`, one entry per part (`None`: not adapted).
    pub fn pairs(&self, layer: usize, matrix: LayerMatrix) -> &[Option<LoraPair>] {
        self.layers.get(layer).map_or(&[], |l| &l[matrix_index(matrix)])
    }

    /// Host memory its pairs take.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// How many projections it adapts.
    pub fn num_pairs(&self) -> usize {
        self.layers.iter().flatten().flatten().filter(|p| p.is_some()).count()
    }
}

/// The rows of one step that run under an adapter, grouped by adapter.
#[derive(Debug, Default, Clone)]
pub struct LoraBatch {
    groups: Vec<LoraGroup>,
}

/// One adapter's rows (flat token indices) of a step.
#[derive(Debug, Clone)]
pub struct LoraGroup {
    pub adapter: Arc<LoraAdapter>,
    pub tokens: Vec<usize>,
}

impl LoraBatch {
    pub fn clear(&mut self) {
        self.groups.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.groups.iter().all(|g| g.tokens.is_empty())
    }

    /// Puts flat tokens `tokens` under `adapter` (the group of an adapter already in the step
    /// grows).
    pub fn add(&mut self, adapter: &Arc<LoraAdapter>, tokens: std::ops::Range<usize>) {
        match self.groups.iter_mut().find(|g| Arc::ptr_eq(&g.adapter, adapter)) {
            Some(g) => g.tokens.extend(tokens),
            None => self.groups.push(LoraGroup { adapter: Arc::clone(adapter), tokens: tokens.collect() }),
        }
    }

    pub fn groups(&self) -> &[LoraGroup] {
        &self.groups
    }

    /// The largest token index (+1) any group names; the forward checks it against the batch.
    pub(crate) fn token_end(&self) -> usize {
        self.groups.iter().flat_map(|g| g.tokens.iter()).map(|&t| t + 1).max().unwrap_or(0)
    }
}
