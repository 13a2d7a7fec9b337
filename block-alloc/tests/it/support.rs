//! Shared helpers: pool constructors, cached tables, and a full observable snapshot of a pool,
//! used to check that failed operations leave the pool exactly as it was.

use block_alloc::{BlockId, BlockPool, BlockTable, PoolConfig, PrefixStats, TokenId};

/// A device pool with no watermark (so exact counts are easy to reason about).
pub fn pool(num_blocks: usize, block_size: usize) -> BlockPool {
    let cfg = PoolConfig { watermark: 0.0, ..PoolConfig::new(num_blocks, block_size) };
    BlockPool::new(cfg).expect("valid test config")
}

/// Everything a caller can observe of a pool.
#[derive(Debug, PartialEq)]
pub struct Snapshot {
    refs: Vec<u32>,
    free_order: Vec<BlockId>,
    cached: Vec<Option<Vec<TokenId>>>,
    num_free: usize,
    num_cached: usize,
    stats: PrefixStats,
}

impl Snapshot {
    /// Whether `b` had ref count 0.
    pub fn is_free(&self, b: BlockId) -> bool {
        self.refs[b as usize] == 0
    }
}

pub fn snapshot(pool: &BlockPool) -> Snapshot {
    let n = pool.num_blocks() as BlockId;
    Snapshot {
        refs: (0..n).map(|b| pool.ref_count(b).expect("in range")).collect(),
        free_order: pool.free_blocks().collect(),
        cached: (0..n).map(|b| pool.cached_tokens(b).map(<[TokenId]>::to_vec)).collect(),
        num_free: pool.num_free(),
        num_cached: pool.num_cached_blocks(),
        stats: pool.prefix_stats(),
    }
}

/// `n` tokens `start, start + 1, ...`.
pub fn tokens(start: TokenId, n: usize) -> Vec<TokenId> {
    (start..start + n as TokenId).collect()
}

/// A new table holding `prompt`, its full blocks registered in the prefix cache under `salt`.
pub fn cached_table(pool: &mut BlockPool, prompt: &[TokenId], salt: u64) -> BlockTable {
    let mut t = pool.new_table();
    t.allocate_slots(pool, prompt.len()).unwrap();
    pool.cache_full_blocks(&mut t, prompt, salt).unwrap();
    t
}

/// Frees every table; then no block of the pool may be held any more.
pub fn free_all(pool: &mut BlockPool, tables: impl IntoIterator<Item = BlockTable>) {
    for mut t in tables {
        t.free(pool).unwrap();
    }
    assert_eq!(pool.num_free(), pool.num_blocks());
}
