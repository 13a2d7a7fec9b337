//! Pool configuration and the three-way answer of admission checks.

/// How a [`BlockPool`](crate::BlockPool) is laid out. Plain data; validated by
/// [`BlockPool::new`](crate::BlockPool::new).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolConfig {
    /// Number of physical blocks (fixed for the pool's life).
    pub num_blocks: usize,
    /// Tokens per block (8, 16 or 32 in practice; must be at least 1).
    pub block_size: usize,
    /// Fraction of the blocks [`can_allocate`](crate::BlockPool::can_allocate) keeps free so
    /// running sequences can still grow; vLLM's default is 1 %. Must be in `[0, 1)`.
    pub watermark: f64,
    /// Keep full blocks findable by content (prefix caching). A host swap pool turns it off.
    pub enable_prefix_caching: bool,
}

impl PoolConfig {
    /// Default watermark: 1 % of the blocks kept free.
    pub const DEFAULT_WATERMARK: f64 = 0.01;

    /// A device pool: default watermark, prefix caching on.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self { num_blocks, block_size, watermark: Self::DEFAULT_WATERMARK, enable_prefix_caching: true }
    }

    /// A host swap pool: no watermark, no prefix caching.
    pub fn host(num_blocks: usize, block_size: usize) -> Self {
        Self { num_blocks, block_size, watermark: 0.0, enable_prefix_caching: false }
    }
}

/// Whether an allocation of some number of blocks can be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllocStatus {
    /// Enough free blocks now, with the watermark left free.
    Now,
    /// Not now, but it would fit once other sequences free their blocks.
    Later,
    /// Never: more blocks than the pool could ever give (total minus watermark).
    Never,
}
