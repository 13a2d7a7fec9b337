//! Test (and bench) support: a tiny block manager that turns "these sequences advance by
//! these many tokens" into the flat `ModelInput` a scheduler would produce.

#![allow(dead_code)]

use kv_cache::{CacheConfig, DType, KvCache};
use model::ModelConfig;
use model::input::InputBuffers;

/// One sequence: all its tokens (prompt + whatever was appended), how many are in the
/// cache, and the physical blocks it owns (enough for `capacity` tokens).
#[derive(Debug, Clone)]
pub struct Seq {
    pub tokens: Vec<u32>,
    pub cached: usize,
    pub blocks: Vec<u32>,
}

/// One step's owned buffers.
pub type Batch = InputBuffers;

/// Builds one step: sequence `seqs[i]` advances by `chunks[i]` tokens (0 = not scheduled).
/// With `sample_all` every token's logits are requested, otherwise each scheduled sequence's
/// last one.
pub fn build_batch(seqs: &[Seq], chunks: &[usize], block_size: usize, sample_all: bool) -> Batch {
    let mut b = Batch { query_start_loc: vec![0], ..Default::default() };
    b.max_blocks_per_seq = seqs.iter().map(|s| s.blocks.len()).max().unwrap_or(0);
    for (s, &n) in seqs.iter().zip(chunks) {
        if n == 0 {
            continue;
        }
        for pos in s.cached..s.cached + n {
            b.token_ids.push(s.tokens[pos]);
            b.positions.push(pos as u32);
            let block = s.blocks[pos / block_size] as usize;
            b.slot_mapping.push((block * block_size + pos % block_size) as i64);
            if sample_all {
                b.sample_indices.push(b.token_ids.len() - 1);
            }
        }
        if !sample_all {
            b.sample_indices.push(b.token_ids.len() - 1);
        }
        b.query_start_loc.push(b.token_ids.len());
        b.seq_lens.push(s.cached + n);
        let mut table = s.blocks.clone();
        table.resize(b.max_blocks_per_seq, 0);
        b.block_tables.extend(table);
    }
    b
}

/// An f32 cache with `num_blocks` blocks for `cfg`.
pub fn cache_for(cfg: &ModelConfig, block_size: usize, num_blocks: usize) -> KvCache {
    cache_of(cfg, block_size, num_blocks, DType::F32)
}

/// A cache of `dtype` with `num_blocks` blocks for `cfg`.
pub fn cache_of(cfg: &ModelConfig, block_size: usize, num_blocks: usize, dtype: DType) -> KvCache {
    KvCache::new(CacheConfig::new(cfg.block_shape(block_size, dtype), num_blocks, 0))
        .expect("cache allocation")
}

/// Hands each sequence `ceil(capacity / block_size)` blocks, taken from `pool` in order
/// (shuffle `pool` for scattered physical blocks).
pub fn assign_blocks(prompts: Vec<Vec<u32>>, capacity: usize, block_size: usize, pool: &[u32]) -> Vec<Seq> {
    let per_seq = capacity.div_ceil(block_size);
    prompts
        .into_iter()
        .enumerate()
        .map(|(i, tokens)| Seq { tokens, cached: 0, blocks: pool[i * per_seq..(i + 1) * per_seq].to_vec() })
        .collect()
}

/// Index of the largest logit (the quality tools' argmax: the lowest id of a tie).
pub use model::quality::argmax;

/// Greedy decoding of `prompts` side by side for `steps` steps (the first prefills every prompt),
/// over an f32 cache of 16-token blocks handed out in reverse order (no sequence's blocks are
/// contiguous in memory): `check(step, seq, logits)` sees each sequence's logits row, and each
/// sequence goes on with that row's argmax.
pub fn greedy_batch(
    model: &model::Model,
    prompts: Vec<Vec<u32>>,
    steps: usize,
    check: impl FnMut(usize, usize, &[f32]),
) {
    greedy_batch_with(model, prompts, steps, DType::F32, check)
}

/// [`greedy_batch`] over a KV cache of `dtype`.
pub fn greedy_batch_with(
    model: &model::Model,
    prompts: Vec<Vec<u32>>,
    steps: usize,
    dtype: DType,
    mut check: impl FnMut(usize, usize, &[f32]),
) {
    let block_size = 16;
    let capacity = prompts.iter().map(Vec::len).max().unwrap_or(0) + steps;
    let pool: Vec<u32> = (0..(capacity.div_ceil(block_size) * prompts.len()) as u32).rev().collect();
    let mut seqs = assign_blocks(prompts, capacity, block_size, &pool);
    let mut cache = cache_of(&model.config, block_size, pool.len(), dtype);
    let mut ws = model::Workspace::default();
    let vocab = model.config.vocab_size;
    for step in 0..steps {
        let chunks: Vec<usize> = seqs.iter().map(|s| s.tokens.len() - s.cached).collect();
        let batch = build_batch(&seqs, &chunks, block_size, false);
        let logits = model.forward(&batch.input(), &mut cache, &mut ws).expect("forward");
        for (i, seq) in seqs.iter_mut().enumerate() {
            let row = &logits[i * vocab..(i + 1) * vocab];
            check(step, i, row);
            seq.cached = seq.tokens.len();
            seq.tokens.push(argmax(row));
        }
    }
}
