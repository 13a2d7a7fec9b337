//! [`BlockTable`]: one sequence's logical → physical block mapping, its token count, and the
//! chained hashes of its full blocks.

use std::ops::Range;

use crate::hash::BlockHash;
use crate::pool::PoolId;
use crate::{AllocError, BlockId, BlockPool};

/// A copy the caller must perform before writing: the table's last block was shared, so the
/// table now owns `dst` instead of `src`; copy `src`'s KV slots (the tokens written so far
/// in that block) into `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CopyOnWrite {
    pub src: BlockId,
    pub dst: BlockId,
}

/// Logical block `i` of a sequence lives in physical block `blocks()[i]`; token `t` in slot
/// `blocks()[t / block_size] * block_size + t % block_size`.
///
/// A table holds one reference on each of its blocks, in the pool it was filled from (it
/// remembers which, and refuses others with [`AllocError::WrongPool`]); dropping a table
/// without [`free`](Self::free) leaks those references. Not `Clone`: share with
/// [`fork`](Self::fork), which takes references.
#[derive(Debug)]
pub struct BlockTable {
    pub(crate) block_size: usize,
    /// Pool whose blocks this table holds; 0 while it holds none.
    pub(crate) pool_id: PoolId,
    pub(crate) blocks: Vec<BlockId>,
    pub(crate) num_tokens: usize,
    /// Chained hashes of the leading full blocks of the sequence's tokens computed so far
    /// (`len() >= num_registered`; may run ahead of `num_tokens` after a lookup).
    pub(crate) hashes: Vec<BlockHash>,
    /// Leading full blocks already offered to the current pool's prefix cache.
    pub(crate) num_registered: usize,
    /// Sliding-window attention: a query at position `p` sees keys in `(p - window, p]`; 0 for
    /// full attention. (32 bits, like `first_live`: the scheduler's per-step walk over tables
    /// is memory-bound.)
    pub(crate) window: u32,
    /// Leading entries released because no query still to come can see them (`window.rs`):
    /// they hold no reference and their ids are stale (the kernels never read them).
    pub(crate) first_live: u32,
}

impl BlockTable {
    /// An empty table for a pool with `block_size` tokens per block (see also
    /// [`BlockPool::new_table`]).
    ///
    /// Errors: [`AllocError::ZeroBlockSize`].
    pub fn new(block_size: usize) -> Result<Self, AllocError> {
        if block_size == 0 {
            return Err(AllocError::ZeroBlockSize);
        }
        Ok(Self::with_block_size(block_size))
    }

    /// `block_size` must be non-zero (the pool guarantees it).
    pub(crate) fn with_block_size(block_size: usize) -> Self {
        Self {
            block_size,
            pool_id: 0,
            blocks: Vec::new(),
            num_tokens: 0,
            hashes: Vec::new(),
            num_registered: 0,
            window: 0,
            first_live: 0,
        }
    }

    /// Physical blocks, logical order. With a sliding window the first
    /// [`first_live`](Self::first_live) entries are released and stale (see
    /// [`live_blocks`](Self::live_blocks)).
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// The blocks the table holds a reference on: all but the released leading entries.
    pub fn live_blocks(&self) -> &[BlockId] {
        &self.blocks[self.first_live as usize..]
    }

    /// Leading entries released out of the sliding window (0 for full attention).
    pub fn first_live(&self) -> usize {
        self.first_live as usize
    }

    /// The sliding window the table was made for (`None`: full attention).
    pub fn window(&self) -> Option<usize> {
        (self.window > 0).then_some(self.window as usize)
    }

    /// Token slots in use.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Whether the table holds no block.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Blocks completely filled with tokens.
    pub fn num_full_blocks(&self) -> usize {
        self.num_tokens / self.block_size
    }

    /// Chained hashes of the leading full blocks computed so far: by a prefix lookup (all full
    /// blocks of its query, hit or not) or by [`BlockPool::cache_full_blocks`]. May be longer
    /// than the table's full blocks.
    pub fn block_hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    /// New blocks an append of `extra_tokens` takes, not counting a copy-on-write block
    /// (see [`num_blocks_to_allocate`](Self::num_blocks_to_allocate)).
    pub fn blocks_needed_for(&self, extra_tokens: usize) -> usize {
        self.num_tokens
            .saturating_add(extra_tokens)
            .div_ceil(self.block_size)
            .saturating_sub(self.blocks.len())
    }

    /// Whether appending now would copy the last block first (it is partly filled and shared).
    pub fn needs_copy_on_write(&self, pool: &BlockPool) -> bool {
        !self.num_tokens.is_multiple_of(self.block_size)
            && self.blocks.last().is_some_and(|&b| pool.ref_count(b).is_ok_and(|rc| rc > 1))
    }

    /// Blocks [`allocate_slots`](Self::allocate_slots)`(pool, n)` would take from `pool`,
    /// including the copy-on-write block. 0 for `n == 0`.
    pub fn num_blocks_to_allocate(&self, pool: &BlockPool, n: usize) -> usize {
        if n == 0 { 0 } else { self.blocks_needed_for(n) + usize::from(self.needs_copy_on_write(pool)) }
    }

    /// Makes room for `n` more tokens, allocating blocks as needed (they come from the free
    /// queue head, evicting cached content). If the last block is partly filled and shared
    /// with another table, it is replaced by a fresh block first and the copy is returned.
    ///
    /// Errors (nothing changed): [`AllocError::OutOfBlocks`] (appending past what the pool
    /// can give; the watermark is not applied here), [`AllocError::BlockSizeMismatch`],
    /// [`AllocError::WrongPool`], [`AllocError::UnknownBlock`] / [`AllocError::NotAllocated`]
    /// (the last block was freed behind the table's back).
    #[inline]
    pub fn allocate_slots(
        &mut self,
        pool: &mut BlockPool,
        n: usize,
    ) -> Result<Option<CopyOnWrite>, AllocError> {
        // Fast path (most decode steps), inlined into callers: the tokens fit in the last block,
        // which this table owns alone. `room > 0` means the table holds blocks, so it was filled
        // from `pool` exactly when the pool ids agree (which also implies equal block sizes).
        let room = self.blocks.len() * self.block_size - self.num_tokens;
        if n != 0
            && n <= room
            && self.pool_id == pool.id
            && let Some(&last) = self.blocks.last()
            && pool.ref_counts.get(last as usize) == Some(&1)
        {
            self.num_tokens += n;
            return Ok(None);
        }
        self.append_tokens_slow(pool, n)
    }

    /// Everything `allocate_slots`' fast path does not cover: new blocks, copy-on-write, errors.
    #[inline(never)]
    fn append_tokens_slow(
        &mut self,
        pool: &mut BlockPool,
        n: usize,
    ) -> Result<Option<CopyOnWrite>, AllocError> {
        self.check_pool(pool)?;
        if n == 0 {
            return Ok(None);
        }
        let bs = self.block_size;
        let room = self.blocks.len() * bs - self.num_tokens;
        if n <= room {
            let last = self.blocks[self.blocks.len() - 1];
            match pool.ref_count(last)? {
                0 => return Err(AllocError::NotAllocated(last)),
                1 => {
                    self.num_tokens += n;
                    return Ok(None);
                }
                _ => {} // shared: copy-on-write below
            }
        }
        let free = pool.num_free();
        let Some(new_total) = self.num_tokens.checked_add(n) else {
            return Err(AllocError::OutOfBlocks { needed: usize::MAX, free });
        };
        let new_blocks = new_total.div_ceil(bs) - self.blocks.len();
        let mut cow_src = None;
        if !self.num_tokens.is_multiple_of(bs) {
            // The last block is partly filled: we write into it, so it must be ours alone.
            let last = self.blocks[self.blocks.len() - 1];
            match pool.ref_count(last)? {
                0 => return Err(AllocError::NotAllocated(last)),
                1 => {}
                _ => cow_src = Some(last),
            }
        }
        let needed = new_blocks + usize::from(cow_src.is_some());
        if needed > free {
            return Err(AllocError::OutOfBlocks { needed, free });
        }
        let cow = cow_src.map(|src| {
            let dst = pool.take_free();
            pool.release(src); // ref count > 1: stays held by the other tables
            let last = self.blocks.len() - 1;
            self.blocks[last] = dst;
            CopyOnWrite { src, dst }
        });
        self.blocks.reserve(new_blocks);
        for _ in 0..new_blocks {
            let b = pool.take_free();
            self.blocks.push(b);
        }
        self.num_tokens = new_total;
        self.pool_id = pool.id;
        Ok(cow)
    }

    /// A new table sharing every block of this one (one more reference each), with the same
    /// token count and hashes. Appending to either copies a shared partly-filled last block.
    ///
    /// Errors (nothing changed): [`AllocError::UnknownBlock`], [`AllocError::NotAllocated`]
    /// (a block was freed behind the table's back), [`AllocError::RefCountOverflow`],
    /// [`AllocError::BlockSizeMismatch`], [`AllocError::WrongPool`].
    pub fn fork(&self, pool: &mut BlockPool) -> Result<BlockTable, AllocError> {
        self.check_pool(pool)?;
        let live = self.live_blocks();
        for (i, &b) in live.iter().enumerate() {
            let err = match pool.ref_counts.get_mut(b as usize) {
                None => AllocError::UnknownBlock(b),
                Some(0) => AllocError::NotAllocated(b),
                Some(&mut u32::MAX) => AllocError::RefCountOverflow(b),
                Some(rc) => {
                    *rc += 1;
                    continue;
                }
            };
            for &taken in &live[..i] {
                pool.ref_counts[taken as usize] -= 1;
            }
            return Err(err);
        }
        Ok(BlockTable {
            block_size: self.block_size,
            pool_id: self.pool_id,
            blocks: self.blocks.clone(),
            num_tokens: self.num_tokens,
            hashes: self.hashes.clone(),
            num_registered: self.num_registered,
            window: self.window,
            first_live: self.first_live,
        })
    }

    /// Drops the table's reference on every (live) block, last block first, so that a sequence's
    /// chain ends reach the free queue (and get evicted) before its shared beginnings. Cached
    /// blocks stay findable until evicted. The table is left empty and reusable.
    ///
    /// Errors (nothing changed): [`AllocError::DoubleFree`] (a block already free),
    /// [`AllocError::UnknownBlock`], [`AllocError::BlockSizeMismatch`], [`AllocError::WrongPool`].
    pub fn free(&mut self, pool: &mut BlockPool) -> Result<(), AllocError> {
        self.check_pool(pool)?;
        release_last_first(pool, &self.blocks[self.first_live as usize..])?;
        self.clear();
        Ok(())
    }

    /// Gives back the slots past the first `num_tokens` (a speculative step's rejected tokens):
    /// blocks no longer holding a token are released, last first, as [`free`](Self::free)
    /// releases them. Only slots past the registered (prefix-cached) blocks can go.
    ///
    /// Errors (nothing changed): [`AllocError::TruncatePastEnd`] (more tokens than the table
    /// holds, or into its registered blocks), [`AllocError::DoubleFree`],
    /// [`AllocError::UnknownBlock`], [`AllocError::BlockSizeMismatch`], [`AllocError::WrongPool`].
    pub fn truncate(&mut self, pool: &mut BlockPool, num_tokens: usize) -> Result<(), AllocError> {
        let floor = self.num_registered * self.block_size;
        if num_tokens > self.num_tokens || num_tokens < floor {
            return Err(AllocError::TruncatePastEnd {
                to: num_tokens,
                held: self.num_tokens,
                registered: floor,
            });
        }
        if num_tokens == self.num_tokens {
            return Ok(());
        }
        self.check_pool(pool)?;
        let keep = num_tokens.div_ceil(self.block_size).max(self.first_live as usize);
        release_last_first(pool, &self.blocks[keep..])?;
        self.blocks.truncate(keep);
        self.num_tokens = num_tokens;
        self.hashes.truncate(self.hashes.len().min(num_tokens / self.block_size).max(self.num_registered));
        Ok(())
    }

    /// Slot of token `i` (`block * block_size + offset`), `None` past `num_tokens`.
    #[inline]
    pub fn slot(&self, i: usize) -> Option<i64> {
        (i < self.num_tokens).then(|| {
            self.blocks[i / self.block_size] as i64 * self.block_size as i64 + (i % self.block_size) as i64
        })
    }

    /// Appends the slots of tokens `range` to `out`; tokens past `num_tokens` get `-1`
    /// (a padding slot, which kernels skip).
    pub fn slot_mapping(&self, range: Range<usize>, out: &mut Vec<i64>) {
        out.reserve(range.len());
        let bs = self.block_size;
        let valid_end = range.end.min(self.num_tokens).max(range.start);
        let mut i = range.start;
        while i < valid_end {
            let block = self.blocks[i / bs] as i64 * bs as i64;
            let chunk_end = valid_end.min((i / bs + 1) * bs);
            out.extend((i % bs..i % bs + (chunk_end - i)).map(|off| block + off as i64));
            i = chunk_end;
        }
        out.extend(std::iter::repeat_n(-1, range.end.saturating_sub(valid_end)));
    }

    pub(crate) fn clear(&mut self) {
        self.blocks.clear();
        self.num_tokens = 0;
        self.hashes.clear();
        self.num_registered = 0;
        self.pool_id = 0;
        self.first_live = 0;
    }

    pub(crate) fn check_block_size(&self, pool: &BlockPool) -> Result<(), AllocError> {
        if self.block_size == pool.block_size {
            Ok(())
        } else {
            Err(AllocError::BlockSizeMismatch { table: self.block_size, pool: pool.block_size })
        }
    }

    /// Block size matches and the table's blocks (if any) are `pool`'s.
    pub(crate) fn check_pool(&self, pool: &BlockPool) -> Result<(), AllocError> {
        self.check_block_size(pool)?;
        if self.pool_id != 0 && self.pool_id != pool.id { Err(AllocError::WrongPool) } else { Ok(()) }
    }
}

/// Drops one reference on each of `blocks`, last first; all or nothing (a block already free or
/// unknown undoes the releases before it, in reverse, so the free queue is restored exactly).
fn release_last_first(pool: &mut BlockPool, blocks: &[BlockId]) -> Result<(), AllocError> {
    for (i, &b) in blocks.iter().enumerate().rev() {
        let err = match pool.ref_counts.get(b as usize) {
            None => AllocError::UnknownBlock(b),
            Some(0) => AllocError::DoubleFree(b),
            Some(_) => {
                pool.release(b);
                continue;
            }
        };
        for &done in &blocks[i + 1..] {
            pool.unrelease(done);
        }
        return Err(err);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PoolConfig;

    #[test]
    fn blocks_needed_counts_partial_blocks() {
        let mut p = BlockPool::new(PoolConfig::new(8, 4)).unwrap();
        let mut t = p.new_table();
        assert_eq!((t.blocks_needed_for(0), t.blocks_needed_for(1), t.blocks_needed_for(4)), (0, 1, 1));
        assert_eq!(t.blocks_needed_for(5), 2);
        t.allocate_slots(&mut p, 3).unwrap();
        assert_eq!((t.blocks_needed_for(1), t.blocks_needed_for(2)), (0, 1));
        assert_eq!(t.blocks_needed_for(usize::MAX), usize::MAX.div_ceil(4) - 1, "saturates");
        assert_eq!(t.allocate_slots(&mut p, 0), Ok(None));
        assert_eq!(t.num_full_blocks(), 0);
        t.free(&mut p).unwrap();
    }

    #[test]
    fn slot_mapping_spans_blocks_and_pads() {
        let mut p = BlockPool::new(PoolConfig::new(8, 2)).unwrap();
        let mut t = p.new_table();
        t.allocate_slots(&mut p, 5).unwrap(); // blocks 0, 1, 2
        let mut out = Vec::new();
        t.slot_mapping(0..5, &mut out);
        assert_eq!(out, [0, 1, 2, 3, 4]);
        out.clear();
        t.slot_mapping(3..3, &mut out);
        assert!(out.is_empty());
        t.slot_mapping(4..7, &mut out);
        assert_eq!(out, [4, -1, -1]);
        let expected: Vec<i64> = (0..5).map(|i| t.slot(i).unwrap()).collect();
        out.clear();
        t.slot_mapping(0..5, &mut out);
        assert_eq!(out, expected);
        t.free(&mut p).unwrap();
    }

    /// A speculative step's rejected slots go back: whole blocks past the kept tokens return to
    /// the pool, a shared block is only released by this table, and cached blocks cannot go.
    #[test]
    fn truncate_releases_the_blocks_past_the_kept_tokens() {
        let mut p = BlockPool::new(PoolConfig::new(8, 4)).unwrap();
        let mut t = p.new_table();
        t.allocate_slots(&mut p, 5).unwrap();
        let first_two = t.blocks().to_vec();
        t.allocate_slots(&mut p, 6).unwrap(); // 11 tokens, 3 blocks
        assert_eq!((t.blocks().len(), p.num_free()), (3, 5));
        t.truncate(&mut p, 7).unwrap();
        assert_eq!((t.num_tokens(), t.blocks(), p.num_free()), (7, &first_two[..], 6));
        p.assert_consistent();
        // The kept partial block is reused by the next append.
        t.allocate_slots(&mut p, 1).unwrap();
        assert_eq!((t.num_tokens(), t.blocks().len()), (8, 2));
        let shared = t.fork(&mut p).unwrap();
        t.truncate(&mut p, 3).unwrap();
        assert_eq!(p.ref_count(first_two[1]), Ok(1), "the fork still holds the dropped block");
        assert_eq!(t.truncate(&mut p, 4), Err(AllocError::TruncatePastEnd { to: 4, held: 3, registered: 0 }));
        assert_eq!(t.truncate(&mut p, 3), Ok(()));
        let mut shared = shared;
        shared.free(&mut p).unwrap();
        t.free(&mut p).unwrap();
        p.assert_consistent();
        assert_eq!(p.num_free(), 8);
    }
}
