//! [`BlockPool`]: a fixed set of physical blocks with preallocated metadata (ref counts, free
//! queue links, prefix-cache slots), single-owner (`&mut self`), no locks.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::free_queue::{FreeQueue, FreeQueueIter};
use crate::hash::ChainHasher;
use crate::prefix::{PrefixCache, PrefixStats};
use crate::{AllocError, AllocStatus, BlockId, PoolConfig};

/// Source of pool identities, so a table can tell which pool its blocks belong to.
static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// Identity of a pool; 0 means "no pool" (an empty table).
pub(crate) type PoolId = u64;

/// A fixed number of physical blocks of `block_size` token slots each.
///
/// A block is either *free* (ref count 0, linked into the free queue, possibly still cached and
/// findable by its content hash) or *held* (ref count = number of [`BlockTable`](crate::BlockTable)
/// entries, or raw [`allocate`](Self::allocate) calls, holding it; not in the free queue).
/// All metadata is allocated once in [`new`](Self::new); allocation, freeing, forking and prefix
/// hits never allocate pool memory.
#[derive(Debug)]
pub struct BlockPool {
    pub(crate) id: PoolId,
    pub(crate) block_size: usize,
    pub(crate) ref_counts: Vec<u32>,
    pub(crate) free: FreeQueue,
    watermark_blocks: usize,
    /// `None` when prefix caching is off.
    pub(crate) cache: Option<PrefixCache>,
    pub(crate) stats: PrefixStats,
    pub(crate) hasher: ChainHasher,
    /// Without a prefix cache and with events on: the hashes swaps moved in.
    pub(crate) resident: Option<crate::events::Resident>,
}

impl BlockPool {
    /// A pool with every block free, in ascending id order.
    ///
    /// Errors: [`AllocError::ZeroBlockSize`], [`AllocError::InvalidWatermark`],
    /// [`AllocError::TooManyBlocks`] (more than `u32::MAX - 1` blocks, or a token store that
    /// does not fit in `usize`).
    pub fn new(cfg: PoolConfig) -> Result<Self, AllocError> {
        let PoolConfig { num_blocks, block_size, watermark, enable_prefix_caching } = cfg;
        if block_size == 0 {
            return Err(AllocError::ZeroBlockSize);
        }
        if !(0.0..1.0).contains(&watermark) {
            return Err(AllocError::InvalidWatermark(watermark));
        }
        let too_large = AllocError::TooManyBlocks { num_blocks, block_size };
        if num_blocks >= u32::MAX as usize || num_blocks.checked_mul(block_size).is_none() {
            return Err(too_large);
        }
        // Truncation intended: vLLM's `int(watermark * num_blocks)`.
        let watermark_blocks = (watermark * num_blocks as f64) as usize;
        let cache = enable_prefix_caching.then(|| PrefixCache::new(num_blocks, block_size));
        Ok(Self {
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            block_size,
            ref_counts: vec![0; num_blocks],
            free: FreeQueue::full(num_blocks),
            watermark_blocks,
            cache,
            stats: PrefixStats::default(),
            hasher: ChainHasher::new(),
            resident: None,
        })
    }

    /// A new empty table with this pool's block size.
    pub fn new_table(&self) -> crate::BlockTable {
        crate::BlockTable::with_block_size(self.block_size)
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Total number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks with ref count 0 (including cached ones that an allocation may evict).
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Blocks held by at least one table.
    pub fn num_used(&self) -> usize {
        self.num_blocks() - self.num_free()
    }

    /// `num_used / num_blocks` (0 for an empty pool).
    pub fn usage(&self) -> f64 {
        if self.num_blocks() == 0 { 0.0 } else { self.num_used() as f64 / self.num_blocks() as f64 }
    }

    /// Blocks [`can_allocate`](Self::can_allocate) keeps free: `floor(watermark * num_blocks)`.
    pub fn watermark_blocks(&self) -> usize {
        self.watermark_blocks
    }

    /// Whether `num_new_blocks` more blocks can be taken now while leaving the watermark free
    /// ([`AllocStatus::Now`]), only after others free blocks ([`AllocStatus::Later`]), or never
    /// because it exceeds `num_blocks - watermark_blocks` ([`AllocStatus::Never`]).
    pub fn can_allocate(&self, num_new_blocks: usize) -> AllocStatus {
        if num_new_blocks > self.num_blocks().saturating_sub(self.watermark_blocks) {
            AllocStatus::Never
        } else if self.num_free() >= num_new_blocks + self.watermark_blocks {
            AllocStatus::Now
        } else {
            AllocStatus::Later
        }
    }

    /// Takes the least recently freed block (evicting its cached hash, if any) with ref count 1.
    /// Ignores the watermark (that is [`can_allocate`](Self::can_allocate)'s business).
    ///
    /// Errors: [`AllocError::OutOfBlocks`] when no block is free.
    pub fn allocate(&mut self) -> Result<BlockId, AllocError> {
        if self.num_free() == 0 {
            return Err(AllocError::OutOfBlocks { needed: 1, free: 0 });
        }
        Ok(self.take_free())
    }

    /// Drops one reference to `b`; at zero the block goes to the tail of the free queue
    /// (keeping its cached hash, if any, until it is evicted).
    ///
    /// Errors: [`AllocError::UnknownBlock`], [`AllocError::DoubleFree`] (ref count already 0).
    pub fn free(&mut self, b: BlockId) -> Result<(), AllocError> {
        match self.ref_counts.get(b as usize) {
            None => Err(AllocError::UnknownBlock(b)),
            Some(0) => Err(AllocError::DoubleFree(b)),
            Some(_) => {
                self.release(b);
                Ok(())
            }
        }
    }

    /// Number of holders of `b`.
    ///
    /// Errors: [`AllocError::UnknownBlock`].
    pub fn ref_count(&self, b: BlockId) -> Result<u32, AllocError> {
        self.ref_counts.get(b as usize).copied().ok_or(AllocError::UnknownBlock(b))
    }

    /// Whether `b` is free (ref count 0, in the free queue). `false` for unknown ids.
    pub fn is_free(&self, b: BlockId) -> bool {
        self.ref_counts.get(b as usize) == Some(&0)
    }

    /// The free queue from head (next to be allocated, i.e. evicted) to tail (most recently
    /// freed): the LRU eviction order.
    pub fn free_blocks(&self) -> FreeQueueIter<'_> {
        self.free.iter()
    }

    /// Pops the free-queue head, evicts its cached hash, gives it ref count 1.
    /// Caller guarantees a free block exists.
    #[inline]
    pub(crate) fn take_free(&mut self) -> BlockId {
        let Some(b) = self.free.pop_front() else {
            unreachable!("take_free on an empty free queue: callers check num_free first")
        };
        if let Some(cache) = &mut self.cache {
            cache.evict(b);
        }
        if let Some(resident) = &mut self.resident {
            resident.forget(b);
        }
        self.ref_counts[b as usize] = 1;
        b
    }

    /// Drops one reference; the caller has checked that the ref count is positive.
    #[inline]
    pub(crate) fn release(&mut self, b: BlockId) {
        let rc = &mut self.ref_counts[b as usize];
        *rc -= 1;
        if *rc == 0 {
            self.free.push_back(b);
        }
    }

    /// Undoes [`release`](Self::release) of the most recently released block(s), in reverse
    /// order, restoring the exact free-queue order.
    #[inline]
    pub(crate) fn unrelease(&mut self, b: BlockId) {
        let rc = &mut self.ref_counts[b as usize];
        if *rc == 0 {
            self.free.remove(b);
        }
        *rc += 1;
    }

    /// Checks every internal invariant (tests only): free-queue length and membership agree
    /// with the ref counts, and the prefix index agrees with the per-block cache state.
    #[cfg(test)]
    pub(crate) fn assert_consistent(&self) {
        let queued: Vec<BlockId> = self.free.iter().collect();
        assert_eq!(queued.len(), self.free.len());
        for b in 0..self.num_blocks() as BlockId {
            assert_eq!(self.free.is_queued(b), self.ref_counts[b as usize] == 0, "block {b}");
        }
        if let Some(cache) = &self.cache {
            cache.assert_consistent();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_pool_allocates_nothing_and_answers_never() {
        let mut p = BlockPool::new(PoolConfig::host(0, 16)).unwrap();
        assert_eq!(p.allocate(), Err(AllocError::OutOfBlocks { needed: 1, free: 0 }));
        assert_eq!(p.can_allocate(0), AllocStatus::Now);
        assert_eq!(p.can_allocate(1), AllocStatus::Never);
        assert_eq!(p.usage(), 0.0);
        p.assert_consistent();
    }

    #[test]
    fn watermark_truncates_like_vllm() {
        let p = BlockPool::new(PoolConfig::new(250, 16)).unwrap();
        assert_eq!(p.watermark_blocks(), 2); // int(0.01 * 250)
        assert_eq!(p.can_allocate(248), AllocStatus::Now);
        assert_eq!(p.can_allocate(249), AllocStatus::Never);
    }

    #[test]
    fn raw_allocate_free_roundtrip_keeps_queue_consistent() {
        let mut p = BlockPool::new(PoolConfig::new(4, 2)).unwrap();
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        assert_eq!((a, b, p.num_used(), p.num_free()), (0, 1, 2, 2));
        p.assert_consistent();
        p.free(a).unwrap();
        assert_eq!(p.free(a), Err(AllocError::DoubleFree(a)));
        p.free(b).unwrap();
        assert_eq!(p.free_blocks().collect::<Vec<_>>(), [2, 3, 0, 1]);
        assert!(p.is_free(0) && !p.is_free(9));
        p.assert_consistent();
    }
}
