//! [`SeqTables`]: one sequence's block tables, one per KV cache group (vLLM's hybrid KV cache
//! manager). Layers with the same attention kind share a group; every group's table holds the
//! same tokens, takes its blocks from the one device pool and hashes its blocks under its own
//! salt (equal tokens in two groups are different KV). A sliding-window group releases the
//! blocks no query still to come can see. One full-attention group — every model without
//! windows — is exactly one `BlockTable`.
//!
//! All groups' tables grow together, so their lengths are equal and one `sent` count and one
//! row of the worker's tables per group serve them all (`rows.rs`).

use block_alloc::{AllocError, BlockPool, BlockTable, CopyOnWrite, TokenId};

/// The KV cache groups of a model: the sliding window of each (`None`: full attention).
/// Group 0 comes first in every per-group list of a step.
pub type GroupWindows = [Option<usize>];

/// The salt group `g` hashes its blocks under (group 0 keeps the request's).
pub fn group_salt(salt: u64, group: usize) -> u64 {
    if group == 0 { salt } else { salt ^ (group as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17) }
}

/// The most blocks a sliding group of `window` tokens holds for one sequence prefilled in chunks
/// of at most `chunk`: the window and a chunk, plus a partial block at each end.
pub fn sliding_group_bound(window: usize, chunk: usize, block_size: usize) -> usize {
    window.saturating_add(chunk).div_ceil(block_size.max(1)).saturating_add(2)
}

/// One table per KV cache group; `first` is group 0.
#[derive(Debug)]
pub struct SeqTables {
    first: BlockTable,
    rest: Vec<BlockTable>,
}

impl SeqTables {
    /// Empty tables for `windows` (at least one group).
    pub fn new(pool: &BlockPool, windows: &GroupWindows) -> Self {
        let mut groups = windows.iter().map(|&w| pool.new_table_for(w));
        let first = groups.next().unwrap_or_else(|| pool.new_table());
        Self { first, rest: groups.collect() }
    }

    pub fn num_groups(&self) -> usize {
        1 + self.rest.len()
    }

    /// Group 0's table (its token count and length are every group's).
    pub fn first(&self) -> &BlockTable {
        &self.first
    }

    pub fn iter(&self) -> impl Iterator<Item = &BlockTable> {
        std::iter::once(&self.first).chain(&self.rest)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut BlockTable> {
        std::iter::once(&mut self.first).chain(&mut self.rest)
    }

    pub fn is_empty(&self) -> bool {
        self.first.is_empty()
    }

    pub fn num_tokens(&self) -> usize {
        self.first.num_tokens()
    }

    /// Group 0's blocks.
    pub fn blocks(&self) -> &[block_alloc::BlockId] {
        self.first.blocks()
    }

    /// Blocks held now (live entries of every group).
    pub fn num_live_blocks(&self) -> usize {
        self.iter().map(|t| t.live_blocks().len()).sum()
    }

    /// Blocks one append of `n` tokens takes, every group together (copy-on-write included).
    #[inline]
    pub fn num_blocks_to_allocate(&self, pool: &BlockPool, n: usize) -> usize {
        let first = self.first.num_blocks_to_allocate(pool, n);
        if self.rest.is_empty() {
            return first;
        }
        first + self.rest.iter().map(|t| t.num_blocks_to_allocate(pool, n)).sum::<usize>()
    }

    /// The most blocks computing `remaining` more tokens in chunks of at most `chunk` adds at
    /// once: all of them for full attention; a sliding group never holds more than its window
    /// and a chunk (plus a block on each side).
    pub fn blocks_to_finish(&self, pool: &BlockPool, remaining: usize, chunk: usize) -> usize {
        self.iter()
            .map(|t| {
                let all = t.num_blocks_to_allocate(pool, remaining);
                match t.window() {
                    None => all,
                    Some(w) => all.min(sliding_group_bound(w, chunk, t.block_size())),
                }
            })
            .sum()
    }

    /// Releases every sliding group's blocks outside its window (see
    /// `BlockTable::release_outside_window`); the worker's rows stay valid.
    #[inline]
    pub fn release_outside_window(&mut self, pool: &mut BlockPool) -> Result<usize, AllocError> {
        let mut n = self.first.release_outside_window(pool)?;
        for t in &mut self.rest {
            n += t.release_outside_window(pool)?;
        }
        Ok(n)
    }

    /// Appends `n` slots to every group; the copies-on-write go to `cows`. One group (the decode
    /// hot path of most models) is `BlockTable::allocate_slots` inlined.
    #[inline(always)]
    pub fn allocate_slots(
        &mut self,
        pool: &mut BlockPool,
        n: usize,
        cows: &mut impl FnMut(CopyOnWrite),
    ) -> Result<(), AllocError> {
        if self.rest.is_empty() {
            if let Some(cow) = self.first.allocate_slots(pool, n)? {
                cows(cow);
            }
            return Ok(());
        }
        self.append_to_every_group(pool, n, cows)
    }

    #[inline(never)]
    fn append_to_every_group(
        &mut self,
        pool: &mut BlockPool,
        n: usize,
        cows: &mut impl FnMut(CopyOnWrite),
    ) -> Result<(), AllocError> {
        // All or nothing across the groups.
        let need = self.num_blocks_to_allocate(pool, n);
        if need > pool.num_free() {
            return Err(AllocError::OutOfBlocks { needed: need, free: pool.num_free() });
        }
        for t in self.iter_mut() {
            if let Some(cow) = t.allocate_slots(pool, n)? {
                cows(cow);
            }
        }
        Ok(())
    }

    /// Shares every group's blocks (see `BlockTable::fork`); all or nothing.
    pub fn fork(&self, pool: &mut BlockPool) -> Result<SeqTables, AllocError> {
        let first = self.first.fork(pool)?;
        let mut rest = Vec::with_capacity(self.rest.len());
        for t in &self.rest {
            match t.fork(pool) {
                Ok(child) => rest.push(child),
                Err(e) => {
                    for mut child in std::iter::once(first).chain(rest) {
                        child.free(pool)?;
                    }
                    return Err(e);
                }
            }
        }
        Ok(SeqTables { first, rest })
    }

    /// Frees every group's table (see `BlockTable::free`).
    pub fn free(&mut self, pool: &mut BlockPool) -> Result<(), AllocError> {
        for t in self.rest.iter_mut().rev() {
            t.free(pool)?;
        }
        self.first.free(pool)
    }

    /// Truncates every group's table to `num_tokens` tokens (see `BlockTable::truncate`).
    pub fn truncate(&mut self, pool: &mut BlockPool, num_tokens: usize) -> Result<(), AllocError> {
        for t in self.rest.iter_mut().rev() {
            t.truncate(pool, num_tokens)?;
        }
        self.first.truncate(pool, num_tokens)
    }

    /// Offers every group's newly full blocks of `tokens` to the prefix cache.
    pub fn cache_full_blocks(
        &mut self,
        pool: &mut BlockPool,
        tokens: &[TokenId],
        salt: u64,
    ) -> Result<(), AllocError> {
        pool.cache_full_blocks(&mut self.first, tokens, salt)?;
        for (g, t) in self.rest.iter_mut().enumerate() {
            pool.cache_full_blocks(t, tokens, group_salt(salt, g + 1))?;
        }
        Ok(())
    }

    /// Fills the empty tables with the longest prefix of `tokens` every group can serve from
    /// the cache; returns its length in tokens.
    pub fn lookup_prefix(
        &mut self,
        pool: &mut BlockPool,
        tokens: &[TokenId],
        salt: u64,
    ) -> Result<usize, AllocError> {
        if self.rest.is_empty() && self.first.window().is_none() {
            return pool.lookup_prefix(tokens, salt, &mut self.first);
        }
        let salts: Vec<u64> = (0..self.num_groups()).map(|g| group_salt(salt, g)).collect();
        let mut tables: Vec<&mut BlockTable> = self.iter_mut().collect();
        pool.lookup_prefix_groups(tokens, &salts, &mut tables)
    }

    /// Slots of tokens `range`: group 0's into `first`, group `g ≥ 1`'s into `rest[g - 1]`.
    #[inline]
    pub fn slot_mapping(&self, range: std::ops::Range<usize>, first: &mut Vec<i64>, rest: &mut [Vec<i64>]) {
        self.first.slot_mapping(range.clone(), first);
        for (t, out) in self.rest.iter().zip(rest) {
            t.slot_mapping(range.clone(), out);
        }
    }

    /// Every group's new entries from `from` on, group after group (equal lengths), into `out`.
    #[inline]
    pub fn push_blocks_from(&self, from: usize, out: &mut Vec<block_alloc::BlockId>) {
        if self.rest.is_empty() {
            out.extend_from_slice(&self.first.blocks()[from..]);
            return;
        }
        for t in self.iter() {
            out.extend_from_slice(&t.blocks()[from..]);
        }
    }
}
