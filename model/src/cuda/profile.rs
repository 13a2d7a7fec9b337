//! The profiling forward of vLLM-style KV sizing: [`CudaModel::profile`] runs [`profile_batch`],
//! a dummy batch of the largest step, on a scratch cache, so that what stays in use afterwards
//! is the weights plus the activation peak.

use kv_cache::cuda::CudaKvCache;
use kv_cache::{CacheConfig, DType};

use super::batch::BatchLimits;
use super::error::CudaModelError;
use super::forward::CudaModel;
use crate::input::InputBuffers;

/// Token id of the profiling batch (any id in the vocabulary costs the same).
pub const PROFILE_SEED_TOKEN: u32 = 0;

impl CudaModel {
    /// vLLM's profiling run: one forward of `limits.max_tokens` dummy tokens (sequences of at
    /// most `max_model_len`, `max_samples` sampled rows) on a scratch cache that is freed
    /// afterwards, so that the device memory still in use afterwards is the weights plus the
    /// activation peak, the part the KV cache must leave alone.
    pub fn profile(&mut self, block_size: usize, cache_dtype: DType) -> Result<(), CudaModelError> {
        let batch = profile_batch(self.limits(), block_size);
        let shape = self.config().block_shape(block_size, cache_dtype);
        let num_blocks = batch.block_tables.len();
        let stream = self.kernels().device().stream().clone();
        let mut cache = CudaKvCache::new(CacheConfig::new(shape, num_blocks, 0), stream)?;
        self.forward(&batch.input(), &mut cache)?;
        drop(cache);
        self.kernels().device().synchronize()?;
        Ok(())
    }
}

/// The dummy batch of the profiling run: `max_tokens` tokens in sequences of at most
/// `max_model_len`, each on its own blocks (blocks `0..block_tables.len()`, each used once), the
/// last `max_samples` tokens sampled.
pub(crate) fn profile_batch(limits: &BatchLimits, block_size: usize) -> InputBuffers {
    let tokens = limits.max_tokens.max(1);
    let len = limits.max_model_len.clamp(1, tokens);
    let seqs = tokens.div_ceil(len);
    let bps = len.div_ceil(block_size);
    let mut p = InputBuffers {
        token_ids: vec![PROFILE_SEED_TOKEN; tokens],
        positions: Vec::with_capacity(tokens),
        slot_mapping: Vec::with_capacity(tokens),
        query_start_loc: vec![0],
        seq_lens: Vec::with_capacity(seqs),
        block_tables: Vec::with_capacity(seqs * bps),
        max_blocks_per_seq: bps,
        sample_indices: (tokens - limits.max_samples.clamp(1, tokens)..tokens).collect(),
    };
    for s in 0..seqs {
        let n = len.min(tokens - s * len);
        let first_block = s * bps;
        p.block_tables.extend((first_block..first_block + bps).map(|b| b as u32));
        for i in 0..n {
            p.positions.push(i as u32);
            p.slot_mapping.push(((first_block + i / block_size) * block_size + i % block_size) as i64);
        }
        p.seq_lens.push(n);
        p.query_start_loc.push(s * len + n);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::batch::check_batch;
    use crate::cuda::test_config;

    #[test]
    fn profile_batch_fills_the_token_budget_within_the_model_length() {
        let limits = BatchLimits { max_tokens: 2048, max_samples: 256, max_model_len: 640 };
        let p = profile_batch(&limits, 16);
        assert_eq!(p.token_ids.len(), 2048);
        assert_eq!(p.seq_lens, vec![640, 640, 640, 128]);
        assert_eq!(p.query_start_loc, vec![0, 640, 1280, 1920, 2048]);
        assert_eq!(p.max_blocks_per_seq, 40);
        assert_eq!(p.block_tables.len(), 160);
        assert_eq!(p.sample_indices.len(), 256);
        assert_eq!(p.sample_indices.last(), Some(&2047));
        // Every slot is distinct and inside the scratch cache.
        let mut slots = p.slot_mapping.clone();
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), 2048);
        assert!(slots.iter().all(|&s| (s as usize) < p.block_tables.len() * 16));
        assert_eq!(p.positions[640], 0);
        // The batch passes the forward's own checks.
        assert!(check_batch(&p.input(), &limits, &test_config()).is_ok());
    }

    #[test]
    fn short_budgets_make_one_sequence() {
        let p = profile_batch(&BatchLimits { max_tokens: 5, max_samples: 10, max_model_len: 4096 }, 8);
        assert_eq!(p.seq_lens, vec![5]);
        assert_eq!(p.sample_indices, vec![0, 1, 2, 3, 4]);
        assert_eq!(p.block_tables.len(), 1);
    }
}
