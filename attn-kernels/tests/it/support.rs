//! Builds paged test batches: shuffled physical blocks, NaN-poisoned unused slots, random K/V.

use attn_kernels::testing::{OwnedMetadata, query_start_loc};
use attn_kernels::{PagedAttnMetadata, reshape_and_cache};
use kv_cache::{CacheGeometry, DType, LayerCache};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Shape of one test batch: per sequence `(context_len, query_len)`.
#[derive(Debug, Clone)]
pub struct Batch {
    pub num_kv_heads: usize,
    pub group: usize,
    pub head_size: usize,
    pub block_size: usize,
    pub seqs: Vec<(usize, usize)>,
    pub seed: u64,
}

/// Owned metadata plus the data that went into the cache.
#[derive(Debug)]
pub struct Built {
    /// Sequence `s` reads row `s` of the table.
    pub metadata: OwnedMetadata,
    pub query: Vec<f32>,
    /// Per sequence: `[ctx, kv_heads, head_size]` keys and values (f32, before narrowing).
    pub keys: Vec<Vec<f32>>,
    pub values: Vec<Vec<f32>>,
    pub num_blocks: usize,
}

impl Built {
    pub fn meta(&self) -> PagedAttnMetadata<'_> {
        self.metadata.as_meta()
    }
}

impl Batch {
    pub fn num_heads(&self) -> usize {
        self.num_kv_heads * self.group
    }

    pub fn scale(&self) -> f32 {
        1.0 / (self.head_size as f32).sqrt()
    }

    /// Random data and a shuffled block assignment (the same for every dtype with one seed).
    pub fn build(&self) -> Built {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let bs = self.block_size;
        let needed: Vec<usize> = self.seqs.iter().map(|&(ctx, _)| ctx.div_ceil(bs)).collect();
        let total: usize = needed.iter().sum();
        let num_blocks = total + 3; // a few blocks nobody owns
        let mut pool: Vec<u32> = (0..num_blocks as u32).collect();
        pool.shuffle(&mut rng);
        let max_blocks_per_seq = needed.iter().copied().max().unwrap_or(0) + 1;
        // Entries past a sequence's blocks are out of range: reading one would be an error/panic.
        let mut block_tables = vec![u32::MAX; self.seqs.len() * max_blocks_per_seq];
        let mut next = 0;
        for (s, &n) in needed.iter().enumerate() {
            block_tables[s * max_blocks_per_seq..s * max_blocks_per_seq + n]
                .copy_from_slice(&pool[next..next + n]);
            next += n;
        }
        let row = self.num_kv_heads * self.head_size;
        let mut keys = Vec::new();
        let mut values = Vec::new();
        for &(ctx, _) in &self.seqs {
            keys.push((0..ctx * row).map(|_| rng.random_range(-1.0f32..1.0)).collect());
            values.push((0..ctx * row).map(|_| rng.random_range(-1.0f32..1.0)).collect());
        }
        let query_start_loc = query_start_loc(self.seqs.iter().map(|&(_, q)| q));
        let num_tokens = query_start_loc.last().copied().unwrap_or(0);
        // Queries larger than keys make the softmax peaky, so it is really exercised.
        let query = (0..num_tokens * self.num_heads() * self.head_size)
            .map(|_| rng.random_range(-3.0f32..3.0))
            .collect();
        Built {
            metadata: OwnedMetadata {
                query_start_loc,
                seq_lens: self.seqs.iter().map(|&(ctx, _)| ctx).collect(),
                block_tables,
                max_blocks_per_seq,
                seq_rows: None,
            },
            query,
            keys,
            values,
            num_blocks,
        }
    }

    /// A NaN-poisoned cache of `dtype` holding every sequence's context.
    pub fn cache(&self, built: &Built, dtype: DType) -> LayerCache {
        let geometry = CacheGeometry {
            num_blocks: built.num_blocks,
            num_kv_heads: self.num_kv_heads,
            head_size: self.head_size,
            block_size: self.block_size,
            dtype,
        };
        let mut cache = LayerCache::new(geometry).expect("test cache");
        cache.fill(f32::NAN);
        for s in 0..self.seqs.len() {
            let slots = slots_of(built, s, self.block_size, 0..self.seqs[s].0);
            reshape_and_cache(&built.keys[s], &built.values[s], &slots, &mut cache).expect("write");
        }
        cache
    }
}

/// Slots of tokens `range` of sequence `s` through its block table.
pub fn slots_of(built: &Built, s: usize, bs: usize, range: std::ops::Range<usize>) -> Vec<i64> {
    range.map(|i| built.metadata.slot(s, i, bs) as i64).collect()
}

/// Largest `|a - b| - rel·|b|`; fails on any non-finite output.
pub fn assert_close(got: &[f32], want: &[f32], abs: f32, rel: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        assert!(a.is_finite(), "{what}: element {i} is {a}");
        assert!(
            (a - b).abs() <= abs + rel * b.abs(),
            "{what}: element {i}: {a} vs {b} (abs {abs}, rel {rel})"
        );
    }
}
