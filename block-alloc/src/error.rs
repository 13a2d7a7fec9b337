//! The one error type of the crate: every way a caller can misuse the pool or a table.
//!
//! Every fallible operation is all-or-nothing: when it returns one of these errors the pool,
//! the tables and the prefix cache are exactly as they were before the call.

use crate::BlockId;

/// What went wrong; see the operation that returned it for the exact meaning.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllocError {
    /// A pool or table was configured with blocks of zero tokens.
    #[error("block size must be at least one token")]
    ZeroBlockSize,
    /// The pool would have more blocks than a `BlockId` can name (or its token store would
    /// not fit in memory).
    #[error("a pool of {num_blocks} blocks of {block_size} tokens is too large")]
    TooManyBlocks { num_blocks: usize, block_size: usize },
    /// The watermark is not a finite fraction in `[0, 1)`.
    #[error("watermark {0} is not a fraction in [0, 1)")]
    InvalidWatermark(f64),
    /// Not enough free blocks for the operation (including blocks that would have to be
    /// evicted from the prefix cache).
    #[error("out of blocks: {needed} needed, {free} free")]
    OutOfBlocks { needed: usize, free: usize },
    /// The block is already free (its reference count is zero).
    #[error("block {0} freed twice (it is already free)")]
    DoubleFree(BlockId),
    /// The block is free, so it cannot be shared (forked) or swapped.
    #[error("block {0} is not allocated")]
    NotAllocated(BlockId),
    /// The block id is not a block of this pool.
    #[error("block {0} is not a block of this pool")]
    UnknownBlock(BlockId),
    /// A block would be held by more than `u32::MAX` tables.
    #[error("reference count of block {0} would overflow")]
    RefCountOverflow(BlockId),
    /// The table and the pool disagree on the number of tokens per block.
    #[error("table has blocks of {table} tokens, pool has blocks of {pool}")]
    BlockSizeMismatch { table: usize, pool: usize },
    /// The table holds blocks of a different pool (e.g. it was swapped out to the host pool).
    #[error("table holds blocks of another pool")]
    WrongPool,
    /// A prefix lookup needs an empty table to fill.
    #[error("prefix lookup needs an empty table, this one holds {0} blocks")]
    TableNotEmpty(usize),
    /// A truncation past the table's tokens, or into blocks already offered to the prefix cache.
    #[error("cannot truncate to {to} tokens: the table holds {held}, {registered} of them cached")]
    TruncatePastEnd { to: usize, held: usize, registered: usize },
    /// More tables hold a block than its reference count says: the caller freed a block that a
    /// table still holds.
    #[error("block {0} is held by more tables than its reference count")]
    RefCountMismatch(BlockId),
}
