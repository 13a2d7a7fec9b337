//! Prefix caching: full blocks are indexed by their chained content hash and stay findable
//! after they are freed, until allocation evicts them (least recently freed first).
//!
//! A hit requires the hash *and* the stored salt and token ids of the cached block to equal
//! the query's, so a hash collision can cost a hit but never return a block whose tokens
//! differ from the query.

use crate::events::EventLog;
use crate::hash::{BlockHash, HashIndex, IndexKey, ROOT_HASH, index_key};
use crate::{AllocError, BlockId, BlockPool, BlockTable, TokenId};

/// Hit/query counters of the prefix cache since the pool was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Calls to [`BlockPool::lookup_prefix`].
    pub lookups: u64,
    /// Tokens passed to lookups.
    pub queried_tokens: u64,
    /// Tokens found cached (always whole blocks).
    pub hit_tokens: u64,
    /// Full blocks passed to lookups.
    pub queried_blocks: u64,
    /// Full blocks found cached.
    pub hit_blocks: u64,
}

impl PrefixStats {
    /// Counts one lookup of `queried` tokens (blocks of `block_size`) that hit `hit_blocks`.
    pub(crate) fn record_lookup(&mut self, queried: usize, block_size: usize, hit_blocks: usize) {
        self.lookups += 1;
        self.queried_tokens += queried as u64;
        self.queried_blocks += (queried / block_size) as u64;
        self.hit_blocks += hit_blocks as u64;
        self.hit_tokens += (hit_blocks * block_size) as u64;
    }

    /// `hit_tokens / queried_tokens` (0 before any query).
    pub fn hit_rate(&self) -> f64 {
        if self.queried_tokens == 0 { 0.0 } else { self.hit_tokens as f64 / self.queried_tokens as f64 }
    }
}

/// What [`BlockPool::lookup_prefix`] would find, found without taking anything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixProbe {
    /// Tokens a lookup would hit (whole blocks).
    pub cached_tokens: usize,
    /// How many of those blocks are free now: a lookup takes them out of the free queue, so
    /// it lowers `num_free` by this much although it allocates nothing.
    pub free_hit_blocks: usize,
}

/// Per-block cache state (preallocated for every block) and the hash index.
#[derive(Debug)]
pub(crate) struct PrefixCache {
    block_size: usize,
    /// Index key of a hash → the one block registered under it.
    index: HashIndex<BlockId>,
    /// Whether each block is registered in `index` (under `hashes[b]`).
    pub(crate) cached: Vec<bool>,
    hashes: Vec<BlockHash>,
    salts: Vec<u64>,
    /// `block_size` token ids per block: what a registered block holds.
    tokens: Vec<TokenId>,
    /// Changes of the index not yet taken, when someone listens (`enable_cache_events`).
    pub(crate) events: Option<EventLog>,
}

impl PrefixCache {
    pub(crate) fn new(num_blocks: usize, block_size: usize) -> Self {
        let mut index = HashIndex::default();
        index.reserve(num_blocks);
        Self {
            block_size,
            index,
            cached: vec![false; num_blocks],
            hashes: vec![0; num_blocks],
            salts: vec![0; num_blocks],
            tokens: vec![0; num_blocks * block_size],
            events: None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    pub(crate) fn index_keys(&self) -> impl Iterator<Item = IndexKey> + '_ {
        self.index.keys().copied()
    }

    fn tokens_of(&self, b: BlockId) -> &[TokenId] {
        let start = b as usize * self.block_size;
        &self.tokens[start..start + self.block_size]
    }

    /// The block registered under `hash`'s index key, if any (not yet verified).
    #[inline]
    pub(crate) fn candidate(&self, hash: BlockHash) -> Option<BlockId> {
        self.index.get(&index_key(hash)).copied()
    }

    /// The tokens of `b` if it is cached under `hash`.
    pub(crate) fn tokens_under(&self, b: BlockId, hash: BlockHash) -> Option<&[TokenId]> {
        let i = b as usize;
        (self.cached[i] && self.hashes[i] == hash).then(|| self.tokens_of(b))
    }

    /// Whether cached block `b` holds exactly `tokens` under `salt`, with chain hash `hash`.
    #[inline]
    pub(crate) fn holds(&self, b: BlockId, hash: BlockHash, salt: u64, tokens: &[TokenId]) -> bool {
        let i = b as usize;
        self.cached[i] && self.hashes[i] == hash && self.salts[i] == salt && self.tokens_of(b) == tokens
    }

    /// Registers `b` under `hash` (whose chain parent is `parent`) unless `b` is already
    /// registered or another block holds the hash (then `b` stays an ordinary block: first
    /// registration wins).
    fn register(
        &mut self,
        b: BlockId,
        hash: BlockHash,
        parent: Option<BlockHash>,
        salt: u64,
        tokens: &[TokenId],
    ) {
        let i = b as usize;
        if self.cached[i] {
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = self.index.entry(index_key(hash)) {
            slot.insert(b);
            self.cached[i] = true;
            self.hashes[i] = hash;
            self.salts[i] = salt;
            let start = i * self.block_size;
            self.tokens[start..start + self.block_size].copy_from_slice(tokens);
            if let Some(log) = &mut self.events {
                log.stored(hash, parent, tokens);
            }
        }
    }

    /// Forgets `b`'s content (it is about to be overwritten).
    #[inline]
    pub(crate) fn evict(&mut self, b: BlockId) {
        let i = b as usize;
        if self.cached[i] {
            self.cached[i] = false;
            self.index.remove(&index_key(self.hashes[i]));
            if let Some(log) = &mut self.events {
                log.removed(self.hashes[i]);
            }
        }
    }

    fn clear(&mut self) {
        self.index.clear();
        self.cached.fill(false);
        if let Some(log) = &mut self.events {
            log.cleared();
        }
    }

    #[cfg(test)]
    pub(crate) fn assert_consistent(&self) {
        assert_eq!(self.index.len(), self.cached.iter().filter(|&&c| c).count());
        for (&k, &b) in &self.index {
            assert!(self.cached[b as usize]);
            assert_eq!(index_key(self.hashes[b as usize]), k);
        }
    }
}

impl BlockPool {
    /// Whether prefix caching is on for this pool.
    pub fn prefix_caching_enabled(&self) -> bool {
        self.cache.is_some()
    }

    /// Number of blocks registered in the prefix cache (held or free).
    pub fn num_cached_blocks(&self) -> usize {
        self.cache.as_ref().map_or(0, PrefixCache::len)
    }

    /// Whether `b` is registered in the prefix cache. `false` for unknown ids.
    pub fn is_cached(&self, b: BlockId) -> bool {
        self.cache.as_ref().is_some_and(|c| c.cached.get(b as usize).copied().unwrap_or(false))
    }

    /// The token ids a cached block holds (`None` when `b` is not cached).
    pub fn cached_tokens(&self, b: BlockId) -> Option<&[TokenId]> {
        let cache = self.cache.as_ref()?;
        cache.cached.get(b as usize).copied().unwrap_or(false).then(|| cache.tokens_of(b))
    }

    /// Hit/query counters.
    pub fn prefix_stats(&self) -> PrefixStats {
        self.stats
    }

    /// What [`lookup_prefix`](Self::lookup_prefix)`(tokens, salt, _)` would return, without
    /// taking references, touching the free queue or counting. For admission: a request whose
    /// lookup would hit `p` needs `can_allocate(new_blocks + p.free_hit_blocks)`.
    pub fn probe_prefix(&mut self, tokens: &[TokenId], salt: u64) -> PrefixProbe {
        let mut probe = PrefixProbe::default();
        let Some(cache) = &self.cache else {
            return probe;
        };
        let bs = self.block_size;
        let mut parent = ROOT_HASH;
        for chunk in tokens.chunks_exact(bs) {
            let hash = self.hasher.chain(parent, salt, chunk);
            let Some(b) = cache.candidate(hash).filter(|&b| cache.holds(b, hash, salt, chunk)) else { break };
            match self.ref_counts[b as usize] {
                u32::MAX => break,
                0 => probe.free_hit_blocks += 1,
                _ => {}
            }
            probe.cached_tokens += bs;
            parent = hash;
        }
        probe
    }

    /// Fills an empty `table` with the longest cached prefix of the full blocks of `tokens`
    /// (under `salt`), taking one reference per block (free ones are pulled out of the free
    /// queue), and returns the number of cached tokens (a multiple of the block size). The
    /// table's `num_tokens` becomes that number; append the rest with
    /// [`BlockTable::allocate_slots`].
    ///
    /// Every full block of `tokens` is looked up; a caller that must compute at least one token
    /// (to get logits) passes `&tokens[..tokens.len() - 1]`. Returns 0 without counting when
    /// prefix caching is off.
    ///
    /// Errors (nothing changed): [`AllocError::TableNotEmpty`],
    /// [`AllocError::BlockSizeMismatch`].
    pub fn lookup_prefix(
        &mut self,
        tokens: &[TokenId],
        salt: u64,
        table: &mut BlockTable,
    ) -> Result<usize, AllocError> {
        table.check_block_size(self)?;
        if !table.blocks.is_empty() || table.num_tokens != 0 {
            return Err(AllocError::TableNotEmpty(table.blocks.len()));
        }
        let Some(cache) = &self.cache else {
            return Ok(0);
        };
        let bs = self.block_size;
        // Three passes, so the CPU can overlap the cache misses of independent probes:
        // 1. hash every full block (the chain is serial but pure computation; the hashes are
        //    kept for `cache_full_blocks`);
        // 2. probe the index for each, collecting candidates up to the first miss;
        // 3. verify each candidate (full hash, salt, tokens) and take its reference, stopping
        //    at the first that fails.
        table.hashes.clear();
        let mut parent = ROOT_HASH;
        for chunk in tokens.chunks_exact(bs) {
            parent = self.hasher.chain(parent, salt, chunk);
            table.hashes.push(parent);
        }
        for &hash in &table.hashes {
            let Some(b) = cache.candidate(hash) else { break };
            table.blocks.push(b);
        }
        let mut hits = 0;
        for ((&b, &hash), chunk) in table.blocks.iter().zip(&table.hashes).zip(tokens.chunks_exact(bs)) {
            let rc = &mut self.ref_counts[b as usize];
            // A block that cannot take another reference counts as a miss.
            if !cache.holds(b, hash, salt, chunk) || *rc == u32::MAX {
                break;
            }
            if *rc == 0 {
                self.free.remove(b);
            }
            *rc += 1;
            hits += 1;
        }
        table.blocks.truncate(hits);
        let hit_blocks = table.blocks.len();
        table.num_tokens = hit_blocks * bs;
        table.num_registered = hit_blocks;
        if hit_blocks > 0 {
            table.pool_id = self.id;
        }
        self.stats.record_lookup(tokens.len(), bs, hit_blocks);
        Ok(table.num_tokens)
    }

    /// Registers the table's full blocks that are not registered yet. `tokens` are the
    /// sequence's token ids so far (at least those in the table's full blocks; only the first
    /// `min(tokens.len(), table.num_tokens())` count). Call it once the blocks' KV content is
    /// (being) computed from those tokens. A block whose hash another block already holds stays
    /// unregistered (first wins). No-op when prefix caching is off.
    ///
    /// Errors (nothing changed): [`AllocError::BlockSizeMismatch`], [`AllocError::WrongPool`].
    pub fn cache_full_blocks(
        &mut self,
        table: &mut BlockTable,
        tokens: &[TokenId],
        salt: u64,
    ) -> Result<(), AllocError> {
        table.check_pool(self)?;
        let Some(cache) = &mut self.cache else {
            return Ok(());
        };
        let bs = self.block_size;
        let full = table.num_tokens.min(tokens.len()) / bs;
        for i in table.num_registered..full {
            let chunk = &tokens[i * bs..(i + 1) * bs];
            let hash = match table.hashes.get(i) {
                Some(&h) => h,
                None => {
                    let parent = if i == 0 { ROOT_HASH } else { table.hashes[i - 1] };
                    let h = self.hasher.chain(parent, salt, chunk);
                    table.hashes.push(h);
                    h
                }
            };
            // A block released out of a sliding window is no longer the table's to offer.
            if i >= table.first_live() {
                let parent = i.checked_sub(1).map(|p| table.hashes[p]);
                cache.register(table.blocks[i], hash, parent, salt, chunk);
            }
        }
        table.num_registered = table.num_registered.max(full);
        Ok(())
    }

    /// Forgets every cached block, if no block is in use (as vLLM's `reset_prefix_cache`);
    /// returns whether it did. Counters are kept.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.num_used() > 0 {
            return false;
        }
        if let Some(cache) = &mut self.cache {
            cache.clear();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PoolConfig;

    fn pool() -> BlockPool {
        BlockPool::new(PoolConfig { watermark: 0.0, ..PoolConfig::new(8, 2) }).unwrap()
    }

    #[test]
    fn a_colliding_hash_with_other_tokens_or_salt_never_hits() {
        let mut p = pool();
        let mut t = p.new_table();
        t.allocate_slots(&mut p, 2).unwrap();
        p.cache_full_blocks(&mut t, &[1, 2], 0).unwrap();
        let b = t.blocks()[0];
        // Forge full 128-bit collisions: re-key block `b` under the hash of other tokens, then
        // under the hash of the same tokens with another salt. Neither may hit.
        let genuine = t.block_hashes()[0];
        let mut q = p.new_table();
        for (forged, query, salt) in [
            (p.hasher.chain(ROOT_HASH, 0, &[3, 4]), [3, 4], 0),
            (p.hasher.chain(ROOT_HASH, 1, &[1, 2]), [1, 2], 1),
        ] {
            let cache = p.cache.as_mut().unwrap();
            cache.index.remove(&index_key(genuine));
            cache.index.insert(index_key(forged), b);
            cache.hashes[b as usize] = forged;
            assert_eq!(p.lookup_prefix(&query, salt, &mut q), Ok(0));
            let cache = p.cache.as_mut().unwrap();
            cache.index.remove(&index_key(forged));
            cache.index.insert(index_key(genuine), b);
            cache.hashes[b as usize] = genuine;
        }
        assert_eq!(p.lookup_prefix(&[1, 2], 0, &mut q), Ok(2), "the genuine entry still hits");
        assert_eq!(p.ref_count(b), Ok(2));
        q.free(&mut p).unwrap();
        t.free(&mut p).unwrap();
        p.assert_consistent();
    }

    #[test]
    fn eviction_keeps_index_and_block_state_in_step() {
        let mut p = pool();
        let mut tables = Vec::new();
        for i in 0..4u32 {
            let mut t = p.new_table();
            t.allocate_slots(&mut p, 4).unwrap();
            p.cache_full_blocks(&mut t, &[i, i, i + 1, i + 1], 0).unwrap();
            tables.push(t);
        }
        p.assert_consistent();
        assert_eq!(p.num_cached_blocks(), 8);
        for mut t in tables {
            t.free(&mut p).unwrap();
        }
        let taken: Vec<BlockId> = (0..5).map(|_| p.allocate().unwrap()).collect();
        p.assert_consistent();
        assert_eq!(p.num_cached_blocks(), 3);
        for b in taken {
            p.free(b).unwrap();
        }
        p.assert_consistent();
        assert!(p.reset_prefix_cache());
        p.assert_consistent();
        assert_eq!(p.num_cached_blocks(), 0);
    }
}
