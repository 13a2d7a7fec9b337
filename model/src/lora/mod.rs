//! LoRA adapters over a loaded base model: the low-rank pairs of each adapted projection
//! ([`LoraAdapter`], loaded from PEFT's format in `peft.rs` or llama.cpp's LoRA GGUF in
//! `gguf.rs`), which rows of a step run under which adapter ([`LoraBatch`]), and the CPU's
//! grouped shrink-then-expand (`apply.rs`).
//!
//! A projection `W` adapted by `(A, B)` computes `y = x·Wᵀ + s · (x·Aᵀ)·Bᵀ` with `A` `[r, in]`,
//! `B` `[out, r]` and PEFT's scale `s = alpha / r` (`alpha / √r` with rsLoRA). `s` is folded into
//! `B` at load, so a step multiplies by nothing else. Every row of a step takes the base
//! projection; only the rows of an adapter's requests add its delta, one adapter's rows at a
//! time (punica's grouping, `apply.rs`).

pub(crate) mod apply;
mod gguf;
pub(crate) mod peft;

use std::sync::Arc;

use crate::arch::LayerMatrix;
use crate::config::ModelConfig;

/// One adapted projection as read: `a` `[rank, in_dim]`, `b` `[out_dim, rank]`, PEFT's scale.
#[derive(Debug, Clone)]
pub struct LoraPair {
    pub rank: usize,
    pub in_dim: usize,
    pub out_dim: usize,
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub scale: f32,
}

/// The adapted parts of one of a layer's matrices, as a step uses them: the parts' `A`s stacked
/// (`[rank, in_dim]`, one shrink for every part, which share their input), and each part's `B`.
#[derive(Debug, Clone)]
pub struct LoraMatrix {
    pub in_dim: usize,
    /// Rows of the stacked `A` (the sum of the parts' ranks).
    pub rank: usize,
    a: Vec<f32>,
    /// One entry per part of the matrix (`None`: not adapted).
    parts: Vec<Option<LoraPart>>,
}

/// One adapted part: its rows `first .. first + rank` of the shrunk input, and `b`
/// `[out_dim, rank]` with the scale folded in.
#[derive(Debug, Clone)]
pub struct LoraPart {
    pub first: usize,
    pub rank: usize,
    pub out_dim: usize,
    b: Vec<f32>,
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

/// A loaded adapter: for every layer and matrix, its adapted parts.
#[derive(Debug)]
pub struct LoraAdapter {
    /// The name requests use (`model` on the OpenAI endpoints, `LoRARequest.lora_name`).
    pub name: String,
    /// The largest rank of its pairs.
    pub rank: usize,
    /// `layers[l][matrix_index(m)]`.
    layers: Vec<[Option<LoraMatrix>; 4]>,
}

impl LoraAdapter {
    /// An adapter of `num_layers` layers with no pair yet.
    pub fn empty(name: impl Into<String>, num_layers: usize) -> Self {
        Self { name: name.into(), rank: 0, layers: (0..num_layers).map(|_| Default::default()).collect() }
    }

    /// Adds the pair of part `part` of layer `layer`'s `matrix` (the loader checked the shapes
    /// against the base; every pair of one matrix has its input size).
    pub fn set(&mut self, layer: usize, matrix: LayerMatrix, part: usize, pair: LoraPair) {
        let Some(slot) = self.layers.get_mut(layer).map(|l| &mut l[matrix_index(matrix)]) else { return };
        let m = slot.get_or_insert_with(|| LoraMatrix {
            in_dim: pair.in_dim,
            rank: 0,
            a: Vec::new(),
            parts: vec![None; parts_of(matrix)],
        });
        let Some(entry) = m.parts.get_mut(part) else { return };
        self.rank = self.rank.max(pair.rank);
        let LoraPair { rank, out_dim, a, mut b, scale, .. } = pair;
        b.iter_mut().for_each(|v| *v *= scale);
        *entry = Some(LoraPart { first: m.rank, rank, out_dim, b });
        m.a.extend_from_slice(&a);
        m.rank += rank;
    }

    /// Layer `layer`'s `matrix` as adapted (`None`: no part of it is).
    pub fn matrix(&self, layer: usize, matrix: LayerMatrix) -> Option<&LoraMatrix> {
        self.layers.get(layer)?[matrix_index(matrix)].as_ref()
    }

    /// Whether every matrix it adapts has the shapes of a base model of `config` (what its
    /// loader checked; a forward checks it once, against an adapter read for another model).
    pub fn fits(&self, config: &ModelConfig) -> bool {
        let matrix_fits = |m: LayerMatrix, lm: &LoraMatrix| {
            let part_fits = |(p, part): (usize, &Option<LoraPart>)| {
                part.as_ref().is_none_or(|part| part.out_dim == part_dims(config, m, p).1)
            };
            lm.in_dim == part_dims(config, m, 0).0 && lm.parts.iter().enumerate().all(part_fits)
        };
        self.layers.len() <= config.num_hidden_layers
            && self.layers.iter().all(|layer| {
                LayerMatrix::ALL
                    .iter()
                    .all(|&m| layer[matrix_index(m)].as_ref().is_none_or(|lm| matrix_fits(m, lm)))
            })
    }

    /// How many projections it adapts.
    pub fn num_pairs(&self) -> usize {
        self.layers.iter().flatten().flatten().map(|m| m.parts.iter().flatten().count()).sum()
    }
}

/// The rows of one step that run under an adapter, grouped by adapter.
#[derive(Debug, Default, Clone)]
pub struct LoraBatch {
    groups: Vec<LoraGroup>,
}

/// One adapter's rows of a step: flat token indices, and the same as runs of consecutive rows
/// (a sequence's, or several side by side).
#[derive(Debug, Clone)]
pub struct LoraGroup {
    pub adapter: Arc<LoraAdapter>,
    pub tokens: Vec<usize>,
    pub runs: Vec<std::ops::Range<usize>>,
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
        if tokens.is_empty() {
            return;
        }
        let group = match self.groups.iter().position(|g| Arc::ptr_eq(&g.adapter, adapter)) {
            Some(i) => &mut self.groups[i],
            None => {
                let group = LoraGroup { adapter: Arc::clone(adapter), tokens: Vec::new(), runs: Vec::new() };
                self.groups.push(group);
                self.groups.last_mut().expect("just pushed")
            }
        };
        group.tokens.extend(tokens.clone());
        // Sequences of one adapter side by side in the batch make one run.
        match group.runs.last_mut() {
            Some(last) if last.end == tokens.start => last.end = tokens.end,
            _ => group.runs.push(tokens),
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
