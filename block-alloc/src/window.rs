//! Sliding windows and KV cache groups: a table made for a window releases the leading blocks
//! no query still to come can see, and a prefix lookup over several tables that hold the same
//! tokens (one per group of layers, vLLM's hybrid KV cache) finds the longest prefix every
//! table can serve: all of it for full attention, only the window's blocks for a sliding one.
//!
//! A query at position `p` sees keys in `(p - window, p]`, so block `j` (positions
//! `j·bs .. (j+1)·bs`) is invisible to every query at `p ≥ next` once `(j+1)·bs ≤ next + 1 -
//! window`. Released entries keep their (stale) ids: the attention kernels start reading at
//! the window, so a row of the worker's table never needs rewriting for a release.

use crate::hash::ROOT_HASH;
use crate::{AllocError, BlockId, BlockPool, BlockTable, TokenId};

/// What a lookup writes into the entries before a window it did not fill: never read.
pub const NULL_BLOCK: BlockId = 0;

/// Leading blocks of `block_size` tokens that no query at position `next` or later sees
/// through `window` (`None`: full attention, none).
pub fn blocks_outside_window(window: Option<usize>, block_size: usize, next: usize) -> usize {
    window.map_or(0, |w| (next + 1).saturating_sub(w) / block_size.max(1))
}

impl BlockPool {
    /// An empty table for a sliding window of `window` tokens (`None`: full attention).
    pub fn new_table_for(&self, window: Option<usize>) -> BlockTable {
        let mut table = self.new_table();
        table.window = window.map_or(0, |w| u32::try_from(w.max(1)).unwrap_or(u32::MAX));
        table
    }
}

impl BlockTable {
    /// Releases the leading blocks no query at `num_tokens()` or later can see (their
    /// references go back to `pool`; cached ones stay findable until evicted). Returns how many
    /// it released; 0 for full attention.
    ///
    /// Errors (nothing changed): [`AllocError::WrongPool`], [`AllocError::BlockSizeMismatch`],
    /// [`AllocError::DoubleFree`] / [`AllocError::UnknownBlock`] (a block freed behind the
    /// table's back).
    #[inline]
    pub fn release_outside_window(&mut self, pool: &mut BlockPool) -> Result<usize, AllocError> {
        let Some(window) = self.window() else { return Ok(0) };
        // Only full blocks can fall out of a window (`window ≥ 1`), and never the last one
        // still being written.
        let end = blocks_outside_window(Some(window), self.block_size, self.num_tokens)
            .min(self.num_tokens / self.block_size);
        let first_live = self.first_live();
        if end <= first_live {
            return Ok(0);
        }
        self.check_pool(pool)?;
        let released = &self.blocks[first_live..end];
        for &b in released {
            match pool.ref_counts.get(b as usize) {
                None => return Err(AllocError::UnknownBlock(b)),
                Some(0) => return Err(AllocError::DoubleFree(b)),
                Some(_) => {}
            }
        }
        // Newest first, as `free` does, so the oldest of them is evicted first.
        for &b in released.iter().rev() {
            pool.release(b);
        }
        self.first_live = end as u32; // a table holds fewer than 2^32 blocks
        Ok(end - first_live)
    }
}

impl BlockPool {
    /// Fills empty `tables` that are to hold the same `tokens` — one per KV cache group, each
    /// with its own salt (`salts[g]`, so equal tokens in two groups are different blocks) and
    /// window — with the longest prefix all of them can serve from the cache, and returns its
    /// length in tokens (a multiple of the block size). A full-attention table needs every
    /// block of the prefix cached; a sliding one only the blocks the first query after it can
    /// see (its earlier entries are [`NULL_BLOCK`], released). One reference per block taken.
    /// With one full-attention table this is [`lookup_prefix`](Self::lookup_prefix).
    ///
    /// Errors (nothing changed): [`AllocError::TableNotEmpty`],
    /// [`AllocError::BlockSizeMismatch`].
    pub fn lookup_prefix_groups(
        &mut self,
        tokens: &[TokenId],
        salts: &[u64],
        tables: &mut [&mut BlockTable],
    ) -> Result<usize, AllocError> {
        if let [table] = tables
            && table.window == 0
        {
            return self.lookup_prefix(tokens, salts.first().copied().unwrap_or(0), table);
        }
        for t in tables.iter() {
            t.check_block_size(self)?;
            if !t.blocks.is_empty() || t.num_tokens != 0 {
                return Err(AllocError::TableNotEmpty(t.blocks.len()));
            }
        }
        if self.cache.is_none() || tables.is_empty() {
            return Ok(0);
        }
        let bs = self.block_size;
        let n = tokens.len() / bs;
        // Every full block's verified hit (or miss), per table.
        let mut hits: Vec<Vec<Option<BlockId>>> = Vec::with_capacity(tables.len());
        for (g, t) in tables.iter_mut().enumerate() {
            let salt = salts.get(g).copied().unwrap_or(0);
            t.hashes.clear();
            let mut parent = ROOT_HASH;
            let mut row = Vec::with_capacity(n);
            for chunk in tokens.chunks_exact(bs) {
                parent = self.hasher.chain(parent, salt, chunk);
                t.hashes.push(parent);
                let hit = self
                    .cache
                    .as_ref()
                    .and_then(|c| c.candidate(parent).filter(|&b| c.holds(b, parent, salt, chunk)));
                row.push(hit.filter(|&b| self.ref_counts[b as usize] != u32::MAX));
            }
            hits.push(row);
        }
        let servable = |k: usize| {
            tables.iter().zip(&hits).all(|(t, row)| {
                let from = blocks_outside_window(t.window(), bs, k * bs).min(k);
                row[from..k].iter().all(Option::is_some)
            })
        };
        let full_prefix = tables
            .iter()
            .zip(&hits)
            .filter(|(t, _)| t.window == 0)
            .map(|(_, row)| row.iter().take_while(|h| h.is_some()).count())
            .min()
            .unwrap_or(n);
        let k = (1..=full_prefix).rev().find(|&k| servable(k)).unwrap_or(0);
        for (t, row) in tables.iter_mut().zip(&hits) {
            let from = blocks_outside_window(t.window(), bs, k * bs).min(k);
            t.blocks.extend(std::iter::repeat_n(NULL_BLOCK, from));
            for &b in row[from..k].iter().flatten() {
                let rc = &mut self.ref_counts[b as usize];
                if *rc == 0 {
                    self.free.remove(b);
                }
                *rc += 1;
                t.blocks.push(b);
            }
            t.first_live = from as u32;
            t.num_tokens = k * bs;
            t.num_registered = k;
            if k > 0 {
                t.pool_id = self.id;
            }
        }
        self.stats.record_lookup(tokens.len(), bs, k);
        Ok(k * bs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PoolConfig;

    fn pool(blocks: usize) -> BlockPool {
        BlockPool::new(PoolConfig { watermark: 0.0, ..PoolConfig::new(blocks, 4) }).unwrap()
    }

    #[test]
    fn a_window_releases_exactly_the_blocks_no_later_query_sees() {
        assert_eq!(blocks_outside_window(None, 4, 100), 0);
        // Window 6, blocks of 4: the query at 9 sees 4..=9, so block 0 (0..4) is out.
        assert_eq!(blocks_outside_window(Some(6), 4, 8), 0);
        assert_eq!(blocks_outside_window(Some(6), 4, 9), 1);
        assert_eq!(blocks_outside_window(Some(6), 4, 12), 1);
        assert_eq!(blocks_outside_window(Some(6), 4, 13), 2);
        let mut p = pool(8);
        let mut t = p.new_table_for(Some(6));
        t.allocate_slots(&mut p, 9).unwrap(); // blocks 0, 1, 2
        assert_eq!(t.release_outside_window(&mut p), Ok(1));
        assert_eq!((t.first_live(), t.live_blocks().len(), p.num_free()), (1, 2, 6));
        assert_eq!(t.release_outside_window(&mut p), Ok(0), "idempotent");
        let child = t.fork(&mut p).unwrap();
        assert_eq!(
            (child.first_live(), p.ref_count(t.blocks()[0]), p.ref_count(t.blocks()[1])),
            (1, Ok(0), Ok(2))
        );
        let mut child = child;
        child.free(&mut p).unwrap();
        t.free(&mut p).unwrap();
        assert_eq!((p.num_free(), t.first_live()), (8, 0));
        p.assert_consistent();
    }

    #[test]
    fn a_group_lookup_needs_every_full_block_but_only_the_windows_blocks() {
        let mut p = BlockPool::new(PoolConfig {
            watermark: 0.0,
            enable_prefix_caching: true,
            ..PoolConfig::new(32, 4)
        })
        .unwrap();
        let tokens: Vec<TokenId> = (0..21).collect();
        let (salts, window) = ([0, 7], Some(6));
        let mut full = p.new_table();
        let mut slide = p.new_table_for(window);
        for (t, salt) in [(&mut full, salts[0]), (&mut slide, salts[1])] {
            t.allocate_slots(&mut p, 20).unwrap();
            p.cache_full_blocks(t, &tokens, salt).unwrap();
        }
        slide.release_outside_window(&mut p).unwrap(); // the window at 20 sees 15..: blocks 0..3 out
        assert_eq!(slide.first_live(), 3);
        let (full_ids, slide_ids) = (full.blocks().to_vec(), slide.blocks().to_vec());
        full.free(&mut p).unwrap();
        slide.free(&mut p).unwrap();
        // Released sliding blocks 0..3 are cached but free: still hits. Evict one of the blocks
        // the window of a 16-token prefix needs (block 2: the query at 16 sees 11..=16).
        let mut a = p.new_table();
        let mut b = p.new_table_for(window);
        assert_eq!(p.lookup_prefix_groups(&tokens[..20], &salts, &mut [&mut a, &mut b]), Ok(20));
        assert_eq!((a.blocks(), &b.blocks()[3..]), (&full_ids[..], &slide_ids[3..]));
        assert_eq!((b.first_live(), &b.blocks()[..3]), (3, &[NULL_BLOCK; 3][..]));
        a.free(&mut p).unwrap();
        b.free(&mut p).unwrap();
        let cache = p.cache.as_mut().unwrap();
        cache.evict(slide_ids[4]);
        // 20 tokens would need sliding blocks 3 and 4; 16 needs blocks 2 and 3: served.
        let mut a = p.new_table();
        let mut b = p.new_table_for(window);
        assert_eq!(p.lookup_prefix_groups(&tokens[..20], &salts, &mut [&mut a, &mut b]), Ok(16));
        assert_eq!(
            (a.num_tokens(), b.num_tokens(), b.first_live(), b.live_blocks()),
            (16, 16, 2, &slide_ids[2..4])
        );
        a.free(&mut p).unwrap();
        b.free(&mut p).unwrap();
        assert_eq!(p.num_free(), 32);
        p.assert_consistent();
    }
}
