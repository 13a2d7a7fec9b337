//! `block-alloc`: physical KV blocks — pool, free queue, ref counts, block tables, copy-on-write, prefix cache.
//!
//! What vLLM's `BlockPool` / block manager does, as plain single-owner host code: no device,
//! no threads, no locks (`BlockPool` is `Send`; share it by `&mut`).
//!
//! # Pieces
//! - [`BlockPool`]: a fixed number of blocks of `block_size` token slots with all metadata
//!   preallocated: a ref count per block and a free queue (intrusive doubly-linked list,
//!   O(1) pop-front / remove-from-middle / push-back) that is also the LRU order for evicting
//!   cached blocks. [`BlockPool::can_allocate`] answers [`AllocStatus::Now`] / `Later` /
//!   `Never` keeping a watermark of blocks free.
//! - [`BlockTable`]: one sequence's blocks and token count. [`BlockTable::allocate_slots`]
//!   allocates as needed and reports a [`CopyOnWrite`] when its partly-filled last block is
//!   shared; [`BlockTable::fork`] shares all blocks; [`BlockTable::free`] returns them tail
//!   first; [`BlockTable::slot`] / [`BlockTable::slot_mapping`] give
//!   `block * block_size + offset`.
//! - Prefix caching ([`BlockPool::lookup_prefix`], [`BlockPool::probe_prefix`],
//!   [`BlockPool::cache_full_blocks`]): each full
//!   block is keyed by a chained, per-pool-seeded 128-bit hash of (parent hash, salt, token
//!   ids); the cached block's salt and token ids are stored and compared on every hit, so
//!   different tokens can never hit. Freed blocks stay findable until an allocation evicts
//!   them (least recently freed first). Counters: [`PrefixStats`].
//! - Swap ([`swap_out`], [`swap_in`], [`can_swap_in`], [`can_swap_out`]): a host swap pool is
//!   just another [`BlockPool`] (see [`PoolConfig::host`]); a swap moves a whole group of tables
//!   and returns the `(from, to)` block copies to perform.
//! - Sliding windows and KV cache groups (`window.rs`): a table made by
//!   [`BlockPool::new_table_for`] a window releases the leading blocks no later query sees
//!   ([`BlockTable::release_outside_window`]); [`BlockPool::lookup_prefix_groups`] finds the
//!   longest prefix a set of tables (one per group of layers) can all serve.
//! - Events ([`BlockPool::enable_cache_events`], [`BlockPool::take_cache_events`]): every
//!   change of the set of cached hashes as a [`CacheEvent`] (vLLM's `BlockStored` /
//!   `BlockRemoved` / `AllBlocksCleared`), so a router can mirror the cache.
//! - Live view ([`BlockPool::block_states_into`]): one [`BlockState`] byte per block (free,
//!   cached, owned, shared), O(blocks), into a reusable buffer.
//!
//! # Typical step (what the scheduler does)
//! ```
//! use block_alloc::{AllocStatus, BlockPool, PoolConfig};
//! # fn main() -> Result<(), block_alloc::AllocError> {
//! let mut pool = BlockPool::new(PoolConfig::new(64, 4))?;
//! let prompt: Vec<u32> = (0..10).collect();
//! let mut table = pool.new_table();
//! // Reuse cached full blocks (keep one token to compute), then add room for the rest.
//! let cached = pool.lookup_prefix(&prompt[..prompt.len() - 1], 0, &mut table)?;
//! assert_eq!(pool.can_allocate(table.num_blocks_to_allocate(&pool, prompt.len() - cached)), AllocStatus::Now);
//! assert_eq!(table.allocate_slots(&mut pool, prompt.len() - cached)?, None);
//! let mut slots = Vec::new();
//! table.slot_mapping(cached..prompt.len(), &mut slots);
//! // ... the model writes K/V into `slots` ...
//! pool.cache_full_blocks(&mut table, &prompt, 0)?;
//! table.free(&mut pool)?;
//! let mut again = pool.new_table();
//! assert_eq!(pool.lookup_prefix(&prompt[..9], 0, &mut again)?, 8); // two full blocks hit
//! again.free(&mut pool)?;
//! # Ok(()) }
//! ```
//!
//! # Invariants (checked by the model-based tests in `tests/it`)
//! - `num_free() + num_used() == num_blocks()` at all times.
//! - A block's ref count is the number of live table entries holding it (entries before a
//!   table's `first_live` were released out of its window), plus raw [`BlockPool::allocate`]
//!   results not yet [`BlockPool::free`]d; no table holds a block of ref count 0.
//! - A block is in the free queue if and only if its ref count is 0; the free queue holds each
//!   block at most once, ordered from least to most recently freed (new pools: ascending ids).
//! - A block is registered in the prefix cache under at most one hash, and a hash names at
//!   most one block; a cached block may be held or free. Allocation evicts exactly the block it
//!   takes; nothing else leaves the cache (besides [`BlockPool::reset_prefix_cache`]).
//! - A prefix hit returns only blocks whose stored tokens and salt equal the query's, in
//!   chain order, and takes one reference per returned block.
//! - Every fallible operation is all-or-nothing: on `Err` the pool, the tables and the prefix
//!   cache are exactly as before (free-queue order included).
//! - A table holds blocks of one pool only, and says which; operations with another pool fail
//!   with [`AllocError::WrongPool`].
//! - Determinism: results depend only on the sequence of calls (hash seeds are random per
//!   pool, but a hit needs equal tokens, so a seed can only matter through a 128-bit collision
//!   of the parent chain).

mod config;
mod error;
mod events;
mod free_queue;
mod hash;
mod pool;
mod prefix;
mod snapshot;
mod swap;
mod table;
mod window;

pub use config::{AllocStatus, PoolConfig};
pub use error::AllocError;
pub use events::{CacheEvent, ExternalBlockHash, external_block_hash};
pub use free_queue::FreeQueueIter;
pub use hash::BlockHash;
pub use pool::BlockPool;
pub use prefix::{PrefixProbe, PrefixStats};
pub use snapshot::BlockState;
pub use swap::{can_swap_in, can_swap_out, num_distinct_blocks, swap_in, swap_out};
pub use table::{BlockTable, CopyOnWrite};
pub use window::{NULL_BLOCK, blocks_outside_window};

/// Index of a physical block in its pool (`0..num_blocks`).
pub type BlockId = u32;
/// A token id, as the tokenizer gives it.
pub type TokenId = u32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_and_table_are_send() {
        fn assert_send<T: Send>() {}
        assert_send::<BlockPool>();
        assert_send::<BlockTable>();
    }
}
