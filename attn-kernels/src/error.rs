//! Typed errors of the kernels: every one is raised before anything is written.

use kv_cache::CacheError;

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum AttnError {
    #[error("head_size {0} unsupported; supported: 64, 80, 96, 112, 128, 256")]
    UnsupportedHeadSize(usize),
    #[error("block_size {0} unsupported; supported: 8, 16, 32")]
    UnsupportedBlockSize(usize),
    #[error("num_heads {num_heads} is not a positive multiple of num_kv_heads {num_kv_heads}")]
    HeadsNotDivisible { num_heads: usize, num_kv_heads: usize },
    #[error("{what}: expected {expected} elements, got {got}")]
    ShapeMismatch { what: &'static str, expected: usize, got: usize },
    #[error("query_start_loc invalid: {0}")]
    InvalidQueryStartLoc(String),
    #[error("sequence {seq}: {query_len} query tokens but a context of only {seq_len}")]
    QueryLongerThanContext { seq: usize, query_len: usize, seq_len: usize },
    #[error(
        "sequence {seq}: context {seq_len} needs {needed} blocks but the block table holds {max_blocks_per_seq}"
    )]
    ContextExceedsBlockTable { seq: usize, seq_len: usize, needed: usize, max_blocks_per_seq: usize },
    #[error("sequence {seq} reads block-table row {row}, but the table has {num_rows} rows")]
    RowOutOfRange { seq: usize, row: usize, num_rows: usize },
    #[error("block id {block} out of range: the cache has {num_blocks} blocks")]
    BlockOutOfRange { block: u64, num_blocks: usize },
    #[error("token {token}: slot {slot} out of range: the cache has {num_slots} slots")]
    SlotOutOfRange { token: usize, slot: i64, num_slots: usize },
    #[error("source and destination caches differ in block layout: {src} vs {dst}")]
    LayoutMismatch { src: String, dst: String },
    #[error("scale {0} is not finite")]
    NonFiniteScale(f32),
    #[error("a sliding window must hold at least one key")]
    ZeroWindow,
    #[error("split partition of {0} tokens must be a positive multiple of the block size {1}")]
    InvalidPartition(usize, usize),
    #[error("{what} {index} out of range: there are {len}")]
    IndexOutOfRange { what: &'static str, index: usize, len: usize },
    #[error("rotary embedding needs an even, non-zero head size, not {0}")]
    OddHeadSize(usize),
    #[error("this cache's storage has no CPU kernel")]
    UnsupportedStorage,
    #[error(transparent)]
    Cache(#[from] CacheError),
}
